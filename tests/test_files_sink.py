"""Kafka -> Spark -> files, exactly once in finished files (jobs.sinks.files.store,
controlplane.spark.FileSink): real Kafka and Spark. The output is read as downstream readers
would: Spark and pyarrow on the base directory (finished files only), and the manifest."""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from controlplane.supervision.restarts import classify
from jobs.batch import stream_id
from jobs.pipeline import start_query
from jobs.runconfig import RunConfig
from jobs.sinks.files import store as files
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import drain, failure, forget_last_commit
from tests.waiting import wait_for

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

MALFORMED = [b"not json", b'{"id": "m1", "n": ', b'{"id": "m2", "n": "lots"}']
SCHEMA = "id STRING, n INT, day STRING"


def files_config(tmp_path, bootstrap, topic, *, per_batch=250, transform=None, **sink):
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "schema": SCHEMA,
            "starting_offsets": "earliest",
            "max_records_per_batch": per_batch,
        },
        "sink": {"kind": "files", "connection": "lake", "path": "out/orders", **sink},
        "transform": transform,
        "trigger": {"interval_seconds": 0.2},
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    (tmp_path / "lake").mkdir(exist_ok=True)
    return RunConfig(
        pipeline=f"f-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(run_dir),
        sink_configs=({"files": {"root": (tmp_path / "lake").as_uri()}},),
    )


def base(config) -> Path:
    return Path(config.sink_configs[0]["files"]["root"].removeprefix("file://")) / "out/orders"


def file_sink(spark, config) -> files.FilesStore:
    """The sink's directory as a restarted driver sees it."""
    root = config.sink_configs[0]["files"]["root"]
    return files.FilesStore(
        spark,
        files.base_uri(root, config.spec.sink.path),
        config.spec.sink,
        stream_id(config.checkpoint),
    )


def roll_everything(spark, config) -> None:
    file_sink(spark, config).roll(time.time(), flush=True)


def events(start, stop, days=("2026-11-23", "2026-11-24")):
    return [{"id": f"e{i}", "n": i, "day": days[i % len(days)]} for i in range(start, stop)]


def files_under(path: Path, *, hidden: bool = True) -> list[Path]:
    """Every file under `path` (with `hidden` False: none hidden, and no hidden directory
    entered). A directory the sink deletes meanwhile (a rolled batch's) is passed over, as
    os.walk does, where Path.rglob would raise."""
    out: list[Path] = []
    for folder, folders, names in os.walk(path):
        if not hidden:
            folders[:] = [f for f in folders if not f.startswith(("_", "."))]
            names = [n for n in names if not n.startswith(("_", "."))]
        out += [Path(folder) / name for name in names]
    return sorted(out)


def finished(path: Path) -> list[Path]:
    """The files a reader of the base directory sees (none hidden)."""
    return files_under(path, hidden=False)


def read_ids(spark, path: Path, fmt="parquet") -> list[str]:
    rows = spark.read.format(fmt).load(str(path)).select("id").collect()
    return sorted(r.id for r in rows)


def arrow_ids(path: Path, fmt="parquet") -> list[str]:
    return sorted(
        ds.dataset(str(path), format=fmt, partitioning="hive")
        .to_table(use_threads=False)["id"]
        .to_pylist()
    )


def manifest(path: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((path / "_cp_manifest").glob("*.json"))]


def expected(n):
    return sorted(f"e{i}" for i in range(n))


def test_rows_land_once_in_finished_files_with_dead_letters(spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 600))
    produce(kafka_bootstrap, topic, MALFORMED, start=600)
    config = files_config(tmp_path, kafka_bootstrap, topic, partition_by=["day"])
    drain(spark, config)
    out = base(config)
    # Staged only: nothing is visible to readers until a roll.
    assert finished(out) == []
    roll_everything(spark, config)
    assert read_ids(spark, out) == expected(600)
    assert arrow_ids(out) == expected(600)
    days = spark.read.parquet(str(out)).groupBy("day").count().collect()
    assert sorted((str(r.day), r["count"]) for r in days) == [
        ("2026-11-23", 300),
        ("2026-11-24", 300),
    ]
    # One file per partition (all batches rolled together), each in the manifest.
    assert [p.parent.name for p in finished(out)] == ["day=2026-11-23", "day=2026-11-24"]
    entries = manifest(out)
    assert sorted(e["file"] for e in entries) == sorted(
        str(p.relative_to(out)) for p in finished(out)
    )
    assert sum(e["rows"] for e in entries) == 600
    assert all(e["bytes"] == (out / e["file"]).stat().st_size for e in entries)
    # The staging holds no rows any more; the dead letters are JSON lines, once each.
    assert not [p for p in files_under(out / "_cp_staging") if p.suffix == ".parquet"]
    letters = spark.read.json(str(out / "_cp_dead_letters")).collect()
    assert len(letters) == 3
    assert all("does not parse as JSON" in r.error for r in letters)


def test_a_replayed_batch_is_skipped_by_its_marker(spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 400))
    config = files_config(tmp_path, kafka_bootstrap, topic)
    drain(spark, config)
    forget_last_commit(config.checkpoint)
    drain(spark, config)  # the last batch again: staged before, so skipped
    produce(kafka_bootstrap, topic, events(400, 500))
    drain(spark, config)
    roll_everything(spark, config)
    assert read_ids(spark, base(config)) == expected(500)


@pytest.fixture(scope="module")
def staged_500(spark, kafka_bootstrap, tmp_path_factory):
    """500 rows staged (JSON, not rolled) by a drained query: its config."""
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 500))
    config = files_config(tmp_path_factory.mktemp("staged"), kafka_bootstrap, topic, format="json")
    drain(spark, config)
    return config


@pytest.mark.parametrize(
    "dies_at",
    ["merge", "rename", "manifest", "first delete", "plan delete"],
)
def test_a_roll_killed_at_any_step_is_finished_once_by_the_next_driver(
    spark, staged_500, tmp_path, dies_at
):
    """The driver dies inside a roll (after its plan was written): the next one finishes it
    into the same file, and no row is lost or doubled. (Each case on its own copy of one
    staged directory.)"""
    lake = tmp_path / "lake"
    shutil.copytree(base(staged_500).parent.parent, lake)
    config = RunConfig(
        **{**staged_500.__dict__, "sink_configs": ({"files": {"root": lake.as_uri()}},)}
    )
    sink = file_sink(spark, config)
    sink.jfs = Dies(sink.jfs, dies_at)
    with pytest.raises(Killed):
        sink.roll(time.time(), flush=True)
    out = base(config)
    assert list((out / "_cp_staging/_plans").glob("*.json")), "the plan outlives the driver"
    # What a reader sees meanwhile is whole files only, never a row twice.
    visible = read_lines(out)
    assert visible in ([], expected(500))
    file_sink(spark, config).recover()
    assert read_lines(out) == expected(500)
    assert len(finished(out)) == 1 and [e["file"] for e in manifest(out)] == ["part-00000001.json"]
    # The manifest says the file's size and rows whichever driver wrote the entry.
    (entry,) = manifest(out)
    assert (entry["bytes"], entry["rows"]) == (finished(out)[0].stat().st_size, 500)
    assert not list((out / "_cp_staging/_plans").glob("*.json"))
    staging = files_under(out / "_cp_staging")
    assert not [p for p in staging if p.suffix == ".json" and "_batches" not in str(p)]


class Killed(Exception):
    pass


class Dies:
    """The JVM FilesStore, but the driver 'dies' at one step of a roll."""

    def __init__(self, jfs, at: str):
        self.jfs, self.at = jfs, at

    def __getattr__(self, name):
        real = getattr(self.jfs, name)

        def call(*args):
            if self.at == "merge" and name == "mergeInto":
                raise Killed
            if self.at == "first delete" and name == "delete" and "_plans" not in args[0]:
                raise Killed
            if self.at == "plan delete" and name == "delete" and "_plans" in args[0]:
                raise Killed
            result = real(*args)
            if self.at == "rename" and name == "mergeInto":  # merged and renamed into place
                raise Killed
            if self.at == "manifest" and name == "create" and "_cp_manifest" in args[0]:
                raise Killed
            return result

        return call


def read_lines(path: Path) -> list[str]:
    return sorted(
        json.loads(line)["id"] for f in finished(path) for line in f.read_text().splitlines()
    )


def test_files_roll_by_size_not_by_batch(spark, kafka_bootstrap, tmp_path):
    """Twenty small batches make twenty staged files or more; rolled by a 1 MB target,
    they make files of about 1 MB (a file is cut at the staged files' boundary closest to
    the target), and the rest waits for more rows."""
    topic = new_topic(kafka_bootstrap)
    pad = "x" * 200
    produce(
        kafka_bootstrap,
        topic,
        ({"id": f"e{i}", "n": i, "day": pad} for i in range(12_000)),
    )
    config = files_config(tmp_path, kafka_bootstrap, topic, per_batch=600, format="json")
    config = with_sink(config, target_file_mb=1, max_file_age_seconds=3600, inactivity_seconds=3600)
    drain(spark, config)  # the driver's rolling thread rolls meanwhile
    sink = file_sink(spark, config)
    sink.roll(time.time())
    out = base(config)
    markers = list((out / "_cp_staging").glob("*/_batches/*.json"))
    assert len(markers) == 20
    sizes = [p.stat().st_size for p in finished(out)]
    staged = sink.pending()[""]
    left = sum(s.bytes for s in staged)
    target = 1024 * 1024
    assert left < target
    total = sum(sizes) + left
    assert total > 2 * target
    # Each file about the target: within half a batch's rows of it (one batch, as the
    # target is scaled by what merging measured: JSON lines merge byte for byte).
    assert len(sizes) in (total // target - 1, total // target, total // target + 1)
    one_batch = max(s.bytes for s in staged)
    assert all(abs(size - target) <= one_batch for size in sizes), (sizes, one_batch)
    assert {e["reason"] for e in manifest(out)} == {"size"}
    # The rest is still staged: rolled by inactivity, later.
    assert sink.roll(time.time() + 3601) is None
    assert len(read_lines(out)) == 12_000


def with_sink(config, **changes):
    spec = config.spec.to_dict()
    spec["sink"].update(changes)
    return RunConfig(**{**config.__dict__, "spec": parse_spec(spec)})


@pytest.mark.parametrize("fmt", ["avro", "json"])
def test_avro_and_json_files_read_back(spark, kafka_bootstrap, tmp_path, fmt):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 300))
    config = files_config(tmp_path, kafka_bootstrap, topic, format=fmt, partition_by=["day"])
    drain(spark, config)
    roll_everything(spark, config)
    out = base(config)
    assert read_ids(spark, out, fmt) == expected(300)
    assert all(p.suffix == f".{fmt}" for p in finished(out))
    if fmt == "json":
        assert arrow_ids(out, "json") == expected(300)


def test_the_running_query_rolls_by_inactivity(spark, kafka_bootstrap, tmp_path):
    """The driver's rolling thread finishes files while the query runs: after the rows stop
    coming, within the inactivity interval."""
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 300))
    config = files_config(tmp_path, kafka_bootstrap, topic, inactivity_seconds=1)
    query = start_query(spark, config)
    try:
        out = base(config)
        # Every 0.5 s: each poll is a Spark read of the finished files.
        wait_for(lambda: len(finished_ids(spark, out)) >= 300, 60, every=0.5)
        assert read_ids(spark, out) == expected(300)
        assert {e["reason"] for e in manifest(out)} == {"inactivity"}
    finally:
        query.stop()


def finished_ids(spark, out: Path) -> list[str]:
    return read_ids(spark, out) if finished(out) else []


def test_a_partition_column_the_transform_drops_is_a_definition_error(
    spark, kafka_bootstrap, tmp_path
):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 10))
    config = files_config(
        tmp_path,
        kafka_bootstrap,
        topic,
        partition_by=["day"],
        transform={"sql": "SELECT id, n FROM source"},
    )
    message = failure(spark, config)
    assert "sink.partition_by[0]: column 'day' is not in the pipeline's output" in message
    assert classify(message) == "a definition error"  # not restarted again and again
    assert finished(base(config)) == []


def test_rows_left_staged_roll_when_the_next_run_starts_without_new_records(
    spark, kafka_bootstrap, tmp_path
):
    """A run stopped with rows staged: the next run's rolling thread takes them (by
    inactivity) although no record comes, so no batch runs."""
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 200))
    config = files_config(tmp_path, kafka_bootstrap, topic, inactivity_seconds=4)
    drain(spark, config)
    out = base(config)
    assert finished(out) == []
    query = start_query(spark, config)
    try:
        wait_for(lambda: finished(out), 60)
        assert read_ids(spark, out) == expected(200)
        assert query.lastProgress is None or query.lastProgress["numInputRows"] == 0
    finally:
        query.stop()


def test_a_format_change_rolls_each_format_into_files_of_its_own(spark, kafka_bootstrap, tmp_path):
    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, events(0, 100))
    config = files_config(tmp_path, kafka_bootstrap, topic, format="json")
    drain(spark, config)
    produce(kafka_bootstrap, topic, events(100, 300))
    drain(spark, with_sink(config, format="parquet"))
    roll_everything(spark, with_sink(config, format="parquet"))
    out = base(config)
    assert sorted(p.suffix for p in finished(out)) == [".json", ".parquet"]
    (json_file,) = [p for p in finished(out) if p.suffix == ".json"]
    assert len(json_file.read_text().splitlines()) == 100
    parquet_ids = spark.read.parquet(str(next(p for p in finished(out) if p.suffix == ".parquet")))
    assert parquet_ids.count() == 200
