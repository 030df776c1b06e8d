"""What a small batch costs: addBatch of 200-row batches on every Postgres write path.

    .venv/bin/python bench/small_batches.py [--rows 200 --batches 15 --rounds 3]
                                             (after ./stack services)

A pipeline at 200 events/s with a 1 s trigger writes batches of ~200 rows; what such a batch
costs is mostly fixed (planning, jobs and tasks, connections, commit markers), not per row.
Each path reads the same topic (--rows x --batches of jobs.loadgen's delivery events, one
partition per core) with `max_records_per_batch` = --rows, through the real pipeline
(jobs.pipeline.start_query, availableNow, Spark's Kafka connector, local[2]):

  noop              the frame the sink's writer gets, into Spark's no-op sink (the baseline:
                    what Spark itself costs per batch)
  append            Postgres, append, no transform
  append_transform  the same with a narrow SQL transform (a filter)
  shuffle_transform a transform with a shuffle (GROUP BY): staged, then committed
  upsert            Postgres, upsert by key

Per path: median and p95 of addBatch (ms) over the batches after the first two of each round
(the first batches build tables and warm the JIT), and their ratio to noop's. The target of
issue #14 is addBatch <= 150 ms on every write path. The last line is one JSON object, also
written to bench/results/small_batches.json.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from throughput import (  # noqa: E402
    SPARK_KAFKA,
    bench_session,
    delete_topics,
    drop_tables,
    machine,
    noop_pipeline,
)
from throughput import config_for as throughput_config  # noqa: E402

from jobs import jvm  # noqa: E402
from jobs.loadgen import produce  # noqa: E402
from jobs.pipeline import start_query  # noqa: E402
from jobs.runconfig import RunConfig  # noqa: E402

TARGET_MS = 150
PATHS = {
    "noop": {},
    "append": {},
    "append_transform": {"transform": "SELECT * FROM source WHERE lat IS NOT NULL"},
    "shuffle_transform": {
        "transform": "SELECT courier_id, status, count(*) AS n, max(event_time) AS last_seen"
        " FROM source GROUP BY courier_id, status"
    },
    "upsert": {"mode": "upsert", "key": ["delivery_id"]},
}
WARM_BATCHES = 2


def config_for(path: str, topic: str, bootstrap: str, sink_dsn: str, rows: int, work: Path):
    options = PATHS[path]
    return throughput_config(
        topic,
        bootstrap,
        sink_dsn,
        work,
        rows,
        SPARK_KAFKA,
        None,
        options.get("transform"),
        table_prefix="small",
        mode=options.get("mode", "append"),
        key=tuple(options.get("key", ())),
    )


def add_batch_ms(progress: list[dict]) -> list[float]:
    batches = [p for p in progress if p["numInputRows"]]
    return [float(p["durationMs"].get("addBatch", 0)) for p in batches[WARM_BATCHES:]]


def drained(query) -> list[float]:
    query.awaitTermination()
    if query.exception():
        raise query.exception()
    return add_batch_ms(query.recentProgress)


def run_path(spark, path: str, config: RunConfig) -> list[float]:
    if path == "noop":
        return noop_pipeline(spark, config, drain=drained)
    return drained(start_query(spark, config, available_now=True))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200, help="records per batch")
    parser.add_argument("--batches", type=int, default=15, help="batches per path and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "small_batches.json"))
    args = parser.parse_args()
    bootstrap = os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")
    sink_dsn = os.environ.get(
        "CONTROLPLANE_SINK_DATABASE_URL",
        "postgresql://controlplane@127.0.0.1:55432/controlplane_sink",
    )
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    jvm.build()
    topic = f"small-{uuid.uuid4().hex[:8]}"
    produce(bootstrap, topic, rate=0, count=args.rows * args.batches, partitions=2)

    logging.getLogger("py4j").setLevel(logging.WARNING)
    spark = bench_session(args.master)
    spark.sparkContext.setLogLevel("ERROR")
    samples: dict[str, list[float]] = {p: [] for p in PATHS}
    tables, pipelines = [], []
    try:
        with tempfile.TemporaryDirectory(prefix="small-batches-") as tmp:
            for round_ in range(args.rounds + 1):  # round 0: unmeasured warm-up
                for path in PATHS:
                    work = Path(tmp) / f"{path}-{round_}"
                    config = config_for(path, topic, bootstrap, sink_dsn, args.rows, work)
                    tables.append(config.spec.sink.table)
                    pipelines.append(config.pipeline)
                    started = time.perf_counter()
                    got = run_path(spark, path, config)
                    if round_:
                        samples[path] += got
                    print(
                        f"round {round_} {path}: addBatch median"
                        f" {statistics.median(got):.0f} ms over {len(got)} batches"
                        f" ({time.perf_counter() - started:.1f} s)",
                        flush=True,
                    )
    finally:
        spark.stop()
        drop_tables(sink_dsn, tables, pipelines)
        delete_topics(bootstrap, [topic])

    noop = statistics.median(samples["noop"])
    figures = {
        path: {
            "add_batch_ms_median": round(statistics.median(values), 1),
            "add_batch_ms_p95": round(percentile(values, 0.95), 1),
            "batches": len(values),
            "to_noop": round(statistics.median(values) / noop, 2) if path != "noop" else 1.0,
        }
        for path, values in samples.items()
    }
    print(f"\naddBatch of {args.rows}-row batches (target <= {TARGET_MS} ms on every write path)")
    print(f"  {'path':<20}{'median ms':>10}{'p95 ms':>10}{'x noop':>9}  target")
    for path, f in figures.items():
        met = (
            "" if path == "noop" else ("met" if f["add_batch_ms_median"] <= TARGET_MS else "missed")
        )
        print(
            f"  {path:<20}{f['add_batch_ms_median']:>10.0f}{f['add_batch_ms_p95']:>10.0f}"
            f"{f['to_noop']:>9.2f}  {met}"
        )
    result = {
        "rows_per_batch": args.rows,
        "batches_per_round": args.batches,
        "rounds": args.rounds,
        "master": args.master,
        "target_add_batch_ms": TARGET_MS,
        "paths": figures,
        "met": all(
            f["add_batch_ms_median"] <= TARGET_MS for p, f in figures.items() if p != "noop"
        ),
        "machine": machine(),
    }
    line = json.dumps(result)
    print(line)
    Path(args.output).write_text(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
