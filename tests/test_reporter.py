"""The job's reporter against a real HTTP server (the Django live server) and a dead one."""

from __future__ import annotations

import socket
import time

import pytest

from controlplane.accounts.models import digest
from controlplane.definitions.models import Pipeline, Run, SparkApplication
from jobs.reporting import Reporter, SharedChannel
from tests.clients import PROGRESS
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def test_progress_and_heartbeats_reach_the_control_plane(live_server, pipeline):
    row = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=row.pk).update(generation=1, desired_state="running")
    run = Run.objects.create(
        pipeline=row, generation=1, spec_version=1, state="running", token_digest=digest("t")
    )
    stops: list[str] = []
    reporter = Reporter(live_server.url, run.pk, "t", heartbeat_seconds=0.2, on_stop=stops.append)
    reporter.start()
    try:
        reporter.progress(PROGRESS)
        assert wait_for(lambda: run.batches.exists())
        assert wait_for(lambda: Run.objects.get(pk=run.pk).last_heartbeat_at is not None)
        assert Run.objects.get(pk=run.pk).last_idle_at is None
        reporter.idle()  # Spark's idle event: waiting for data, not stuck
        assert wait_for(lambda: Run.objects.get(pk=run.pk).last_idle_at is not None)
        assert stops == []
        Pipeline.objects.filter(pk=row.pk).update(desired_state="stopped")
        assert wait_for(lambda: stops), "the stop in a heartbeat reply was not passed on"
    finally:
        reporter.close()


def test_a_backlog_is_sent_in_batched_requests_once_the_control_plane_is_back(
    live_server, pipeline
):
    row = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=row.pk).update(generation=1, desired_state="running")
    run = Run.objects.create(
        pipeline=row, generation=1, spec_version=1, state="running", token_digest=digest("t")
    )
    reporter = Reporter(live_server.url, run.pk, "t", heartbeat_seconds=60)
    requests_made: list[int] = []
    send = reporter._send

    def counting(kind, body):
        requests_made.append(len(body) if isinstance(body, list) else 1)
        return send(kind, body)

    reporter._send = counting
    # Queued while the reporter thread was not yet running, as during an outage.
    for i in range(150):
        reporter.progress({**PROGRESS, "batchId": i})
    reporter.start()
    try:
        assert wait_for(lambda: run.batches.count() == 150)
        progress_requests = [n for n in requests_made if n > 1]
        assert progress_requests == [100, 50], requests_made
    finally:
        reporter.close()


def test_a_hung_control_plane_never_blocks_the_job():
    # A control plane that accepts connections and never answers: each send would wait for
    # the read timeout (5 s) if the job's thread made it.
    with socket.socket() as hung:
        hung.bind(("127.0.0.1", 0))
        hung.listen(100)
        port = hung.getsockname()[1]
        reporter = Reporter(f"http://127.0.0.1:{port}", 1, "t", heartbeat_seconds=0.1).start()
        try:
            started = time.monotonic()
            for i in range(1000):
                reporter.progress({**PROGRESS, "batchId": i})
            assert time.monotonic() - started < 2.0
            assert len(reporter.queue) == 200  # bounded: the oldest reports were dropped
            assert reporter.dropped == 800
            assert reporter.sent == 0
        finally:
            reporter.close(timeout=0.5)


class CountingSession:
    """requests.Session's post, answering 200 to everything and counting by kind."""

    def __init__(self):
        self.headers: dict[str, str] = {}
        self.kinds: list[str] = []

    def post(self, url, json=None, timeout=None):
        self.kinds.append(url.rstrip("/").rsplit("/", 1)[-1])

        class Answer:
            status_code = 200

            @staticmethod
            def json():
                return {"stop": False}

        return Answer()


def test_progress_counts_as_a_heartbeat_so_none_is_sent_while_batches_come():
    session = CountingSession()
    reporter = Reporter("http://cp", 1, "t", heartbeat_seconds=1.0, session=session)
    reporter.progress(PROGRESS)
    reporter.start()
    try:
        for _ in range(8):  # a batch every 0.3 s for 2.4 s
            time.sleep(0.3)
            reporter.progress(PROGRESS)
        time.sleep(0.2)
        assert "heartbeat" not in session.kinds
        assert session.kinds.count("progress") >= 3
        time.sleep(1.5)  # no batch for longer than the period: heartbeats again
        assert "heartbeat" in session.kinds
    finally:
        reporter.close()


def _member(pipeline_name: str, app, token: str) -> Run:
    row = Pipeline.objects.get(name=pipeline_name)
    Pipeline.objects.filter(pk=row.pk).update(generation=1, desired_state="running")
    return Run.objects.create(
        pipeline=row, generation=1, spec_version=1, state="running", token_digest=digest(token),
        application=app, application_generation=1,
    )  # fmt: skip


def test_a_shared_application_s_members_report_through_one_channel(live_server, pipeline):
    app = SparkApplication.objects.create(name="shared", token_digest=digest("app"))
    Pipeline.objects.create(name="second", spec=Pipeline.objects.get(name="orders").spec)
    runs = [_member("orders", app, "t1"), _member("second", app, "t2")]
    channel = SharedChannel(f"{live_server.url}/api/applications/shared/reports/", "app")
    bodies: list[int] = []
    post = channel.session.post

    def counting(url, json, **kwargs):
        bodies.append(len(json["reports"]))
        return post(url, json=json, **kwargs)

    channel.session.post = counting
    stops: list[str] = []
    reporters = [
        Reporter(
            live_server.url,
            run.pk,
            token,
            heartbeat_seconds=0.3,
            on_stop=stops.append,
            channel=channel,
        )
        for run, token in zip(runs, ("t1", "t2"), strict=True)
    ]
    for reporter in reporters:
        reporter.session.post = None  # a member never sends on its own here
        reporter.start()
    try:
        for i, reporter in enumerate(reporters):
            reporter.progress({**PROGRESS, "batchId": 10 + i})
        assert wait_for(lambda: all(run.batches.exists() for run in runs))
        assert wait_for(
            lambda: all(Run.objects.get(pk=r.pk).last_heartbeat_at is not None for r in runs)
        )
        assert [r.batches.get().batch_id for r in runs] == [10, 11]
        assert bodies and all(n >= 1 for n in bodies)
        assert sum(bodies) >= 4  # two progress reports and heartbeats, in len(bodies) requests
        # Fenced as its own requests are: a member replaced by a restart is told to stop.
        Pipeline.objects.filter(name="second").update(generation=2)
        assert wait_for(lambda: stops), "the refusal of the stale member was not passed on"
        assert stops == ["the control plane refused this run (409)"]
    finally:
        for reporter in reporters:
            reporter.close()
        channel.close()


def test_members_send_their_own_reports_to_a_control_plane_without_the_channel(
    live_server, pipeline
):
    app = SparkApplication.objects.create(name="shared", token_digest=digest("app"))
    run = _member("orders", app, "t1")
    channel = SharedChannel(f"{live_server.url}/api/no-such-endpoint/", "app")
    reporter = Reporter(live_server.url, run.pk, "t1", heartbeat_seconds=0.3, channel=channel)
    reporter.start()
    try:
        reporter.progress(PROGRESS)
        assert wait_for(lambda: run.batches.exists())
        assert channel.unsupported
    finally:
        reporter.close()
        channel.close()
