"""Storage faults under load (#32, item 6): one real driver, one pipeline, its checkpoint on an
HDFS of the test's own (scripts/devstack.py's Hdfs: a NameNode and a DataNode on free ports
under a temporary directory) and its files sink on S3 through a proxy in front of the S3
server that can answer 503 Slow Down (tests/s3_faults.py), while records keep coming.

1. The NameNode stopped: the driver fails as Spark does (its checkpoint cannot be written),
   the control plane says why in words (the driver's verdict, by the exception's type, in the
   failure's decision), its pages and API keep answering (the checkpoint page from the
   drivers' reports, saying the store is unreachable), relaunches fail at once saying so, and
   once the NameNode is back the restart policy brings the pipeline back by itself.
2. S3 answering 503 Slow Down for a few seconds: S3A retries (its throttling policy, up to
   ~30 s), a roll of the files sink that falls in fails and is retried (MAX_FAILURES in a row
   would fail the run); the pipeline stalls, or fails saying S3 answered 503, and goes on
   once S3 answers again.

At the end every record is in the finished files exactly once, read back from S3, and the
checkpoint's committed offsets are the end of the topic.
"""

from __future__ import annotations

import collections
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import pytest
from kafka import KafkaConsumer, TopicPartition

from controlplane.definitions.models import Failure, Run, RunState
from controlplane.supervision import launcher
from jobs import storage
from jobs.storage import storage_for
from tests.kafka_helpers import Load, new_topic
from tests.outage_stack import free_port
from tests.runs import current, reconcile_until
from tests.s3_faults import FaultyS3
from tests.stores import settings_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

ROOT = Path(__file__).resolve().parent.parent
NAME = "faults"
# Requests the proxy answers 503 before S3 answers again: S3A's throttling retries (1 s,
# doubling) and the sink's roll retries (2 s more each time) get there in about 10 s.
REFUSALS = 6


def _devstack():
    """scripts/devstack.py as a module (its Hdfs takes its directory and ports as arguments)."""
    spec = importlib.util.spec_from_file_location(
        "storage_faults_devstack", ROOT / "scripts" / "devstack.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hdfs():
    """An HDFS of this test's own: the shared one must not be stopped under other tests."""
    var = Path(tempfile.mkdtemp(prefix="cp-hdfs-faults-", dir="/tmp"))
    own = _devstack().Hdfs(
        var=var,
        namenode_port=free_port(),
        namenode_http_port=free_port(),
        datanode_port=free_port(),
        datanode_http_port=free_port(),
        datanode_ipc_port=free_port(),
    )
    try:
        try:
            own.start()
        except Exception as exc:
            tails = "\n".join(
                f"--- {log.name}\n{log.read_text(errors='replace')[-3000:]}"
                for log in sorted((var / "log").glob("hdfs-*"))
            )
            pytest.fail(f"the test's HDFS did not start: {exc}\n{tails}", pytrace=False)
        yield own
    finally:
        own.stop()
        shutil.rmtree(var, ignore_errors=True)


@pytest.fixture
def s3():
    """The S3 server behind a proxy that can answer 503 Slow Down; the bucket's prefix of
    this test is removed at the end."""
    real = settings_for("s3")
    proxy = FaultyS3(real.s3_endpoint).start()
    bucket = os.environ.get("CONTROLPLANE_S3_BUCKET") or "controlplane"
    proxy.lake = f"s3a://{bucket}/tests/faults-{uuid.uuid4().hex[:10]}"
    proxy.store = storage_for(proxy.lake, real)  # reads the files back, not through the proxy
    yield proxy
    proxy.close()
    proxy.store.remove_tree(proxy.lake)


@pytest.fixture
def stores(settings, monkeypatch, job_dirs, hdfs, s3):
    """The control plane's checkpoint root on the test's HDFS, its S3 endpoint the proxy."""
    settings.CONTROLPLANE_CHECKPOINT_ROOT = f"{hdfs.url}/controlplane/cp-{uuid.uuid4().hex[:8]}"
    settings.CONTROLPLANE_HDFS_HTTP_ADDRESS = hdfs.http_address
    settings.CONTROLPLANE_HDFS_USER = hdfs.user
    real = settings_for("s3")
    settings.CONTROLPLANE_S3_ENDPOINT = s3.endpoint
    settings.CONTROLPLANE_S3_ACCESS_KEY = real.s3_access_key
    settings.CONTROLPLANE_S3_SECRET_KEY = real.s3_secret_key
    # Each request of the control plane to HDFS or S3, and the drivers' Hadoop clients
    # (storage.timeout_seconds: NameNode connect T, a call 3T), give up after this long.
    settings.CONTROLPLANE_STORAGE_TIMEOUT_SECONDS = 5
    # The control plane asks a store that was down again after 2 s (10 s by default): the
    # relaunch once the NameNode is back is not held up by the pause.
    monkeypatch.setattr(storage, "UNREACHABLE_SECONDS", 2.0)
    yield hdfs, s3
    # The driver goes before the stores it writes to.
    for run in Run.objects.filter(state__in=RunState.active()):
        launcher.kill(run)


def end_offsets(bootstrap: str, topic: str) -> dict[str, int]:
    consumer = KafkaConsumer(bootstrap_servers=bootstrap)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic))]
        return {str(tp.partition): offset for tp, offset in consumer.end_offsets(parts).items()}
    finally:
        consumer.close()


def finished_ids(s3: FaultyS3) -> list[str]:
    """The ids in the sink's finished files (not its staging, manifest or markers: `_*`)."""
    ids = []
    for entry in s3.store.list(f"{s3.lake}/out"):
        if entry.is_dir or entry.name.startswith(("_", ".")):
            continue
        for line in s3.store.read_bytes(entry.path).decode().splitlines():
            if line.strip():
                ids.append(json.loads(line)["id"])
    return ids


def running_run() -> Run | None:
    run = current(NAME)
    return run if run is not None and run.state == RunState.RUNNING else None


def batch(run: Run | None) -> int:
    """The last batch the run reported committed (-1: none yet, or no run)."""
    return -1 if run is None or run.last_batch_id is None else run.last_batch_id


def failures_since(pk: int) -> list[Failure]:
    return list(Failure.objects.filter(pipeline__name=NAME, pk__gt=pk).order_by("pk"))


def last_failure_pk() -> int:
    return (
        Failure.objects.filter(pipeline__name=NAME)
        .order_by("-pk")
        .values_list("pk", flat=True)
        .first()
        or 0
    )


def test_namenode_stopped_and_s3_throttling_under_load(
    api, kafka_connection, kafka_bootstrap, stores, editor
):
    hdfs, s3 = stores
    response = api.post(
        "/api/connections/",
        {"name": "lake", "kind": "files", "settings": {"root": s3.lake}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    topic = new_topic(kafka_bootstrap)
    spec = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {
            "kind": "files",
            "connection": "lake",
            "path": "out",
            "format": "json",
            "target_file_mb": 1,
            "max_file_age_seconds": 5,
            "inactivity_seconds": 1,
        },
        "trigger": {"interval_seconds": 1},
        # Every relaunch while the NameNode is down fails at once: enough attempts, 1 s apart.
        "restart_policy": {"kind": "fixed-delay", "attempts": 100, "delay_seconds": 1},
    }
    response = api.post("/api/pipelines/", {"name": NAME, "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    load = Load(kafka_bootstrap, topic)
    try:
        assert api.post(f"/api/pipelines/{NAME}/start/").status_code == 202
        reconcile_until(
            NAME,
            lambda: batch(running_run()) >= 0,
            240,
            "the pipeline's first batches",
        )

        # -- 1. the NameNode stopped ------------------------------------------------------
        before = last_failure_pk()
        crashed = running_run()
        hdfs.stop_namenode()
        hdfs_at = f"the checkpoint store HDFS at 127.0.0.1:{hdfs.namenode_port}"

        def explained() -> Failure | None:
            return next(
                (
                    f
                    for f in failures_since(before)
                    if f.run_id == crashed.pk
                    and f"after a transient failure: {hdfs_at} " in f.decision
                ),
                None,
            )

        reconcile_until(NAME, explained, 120, "the driver's failure, in words")
        failure = explained()
        assert failure.cause == "crashed" and not failure.permanent
        assert failure.decision.startswith("restart "), failure.decision
        # The NameNode gone (refused, or the connection cut mid-call): it could not be reached.
        assert f"{hdfs_at} could not be reached: " in failure.decision, failure.decision
        # Meanwhile (the NameNode still down) the API and the pages answer, saying why.
        pipeline = api.get(f"/api/pipelines/{NAME}/")
        assert pipeline.status_code == 200
        assert pipeline.json()["status"] in ("backing-off", "starting", "running")
        last = pipeline.json()["last_failure"]  # the driver's failure, or a relaunch's
        assert hdfs_at in last["decision"] or f"HDFS at {hdfs.http_address}" in last["message"]
        shown = api.get(f"/api/pipelines/{NAME}/failures/").json()["results"]
        assert any(hdfs_at in f["decision"] for f in shown), shown
        page = api.get(f"/api/pipelines/{NAME}/checkpoints/")
        assert page.status_code == 200
        body = page.json()
        assert body["source"] == "progress"  # the drivers' reports stand in
        assert body["last_batch_id"] >= 0
        assert f"HDFS at {hdfs.http_address}" in body["unreachable"], body["unreachable"]
        html = editor.get(f"/pipelines/{NAME}/")
        assert html.status_code == 200
        assert f"HDFS at {hdfs.http_address}" in html.content.decode()
        # Relaunches fail at once (the launch cannot reach the checkpoint store), saying so.
        reconcile_until(
            NAME,
            lambda: any(f.cause == "launch-failed" for f in failures_since(before)),
            60,
            "a relaunch that cannot reach HDFS",
        )
        refused = next(f for f in failures_since(before) if f.cause == "launch-failed")
        assert f"HDFS at {hdfs.http_address}" in refused.message, refused.message

        hdfs.start_namenode()
        reconcile_until(
            NAME,
            lambda: (
                (r := running_run()) is not None
                and r.generation > crashed.generation
                and batch(r) > batch(crashed)
            ),
            240,
            "the pipeline back by itself, committing",
        )
        assert api.get(f"/api/pipelines/{NAME}/").json()["status"] == "running"

        # -- 2. S3 answering 503 Slow Down ----------------------------------------------
        before = last_failure_pk()
        throttled = running_run()
        s3.fail()
        try:
            reconcile_until(NAME, lambda: s3.failed >= REFUSALS, 120, "S3 throttling the sink")
            page = api.get(f"/api/pipelines/{NAME}/checkpoints/")
            assert page.status_code == 200 and page.json()["unreachable"] is None
        finally:
            s3.heal()
        reconcile_until(
            NAME,
            lambda: batch(running_run()) > batch(throttled) + 2,
            240,
            "batches again once S3 answers",
        )
        # S3A's retries may carry the batches over it (a stall: the same run goes on); if
        # a batch or the sink's rolling gave up, the failure says S3 answered 503.
        for failure in failures_since(before):
            assert not failure.permanent
            if failure.cause == "crashed":
                assert f"S3 at {s3.endpoint} answered 503" in failure.decision, failure.decision
        if not failures_since(before):
            assert running_run().pk == throttled.pk
    finally:
        produced = load.stop()

    # -- every record once, and the checkpoint at the end of the topic ----------------------
    end = end_offsets(kafka_bootstrap, topic)
    assert sum(end.values()) == produced
    reconcile_until(
        NAME,
        lambda: api.get(f"/api/pipelines/{NAME}/offsets/").json()["committed"] == {topic: end},
        120,
        "the checkpoint at the end of the topic",
    )
    reconcile_until(NAME, lambda: len(finished_ids(s3)) >= produced, 120, "every record rolled")
    ids = collections.Counter(finished_ids(s3))
    twice = sorted(i for i, n in ids.items() if n > 1)
    missing = sorted({f"e{i}" for i in range(produced)} - set(ids))
    assert (len(twice), len(missing), len(ids)) == (0, 0, produced), (twice[:10], missing[:10])
