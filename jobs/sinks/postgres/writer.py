"""The Postgres sink's writer (the foreachBatch function of a postgres sink): every batch is
written in one transaction with its commit marker (jobs.sinks.postgres.store), by the
executors' JVM where it can (jobs.sinks.postgres.jvm) or from Python workers, directly or
through the batch's stage; dead letters into the sink database's table, with their batch."""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any

from ...batch import (
    BAD,
    EMPTY_VALUE,
    ORDER,
    Batch,
    for_copy,
    for_jvm,
    nested,
    observed_count,
    shuffles,
    written,
)
from ...runconfig import RunConfig
from ...source import DEAD_LETTER_FIELDS
from .jvm import JvmWriter
from .kind import KIND
from .model import PostgresSink
from .store import ORDINAL, PART, Column, PostgresStore

log = logging.getLogger("jobs.pipeline")


@dataclass
class Plan:
    """What the observed pass's query is, learnt from the first batch (the same query every
    batch: each fact costs a round trip to the JVM and an analysis)."""

    shuffles: bool  # its partitions are not fixed pieces of the batch: written through a stage
    columns: list[str]  # what is written
    nested: bool  # arrays, maps or structs: sent as JSON text
    schema: Any = None  # the written frame's, once known
    stage_schema: Any = None  # the staged frame's, once known


class Writer:
    """The foreachBatch function of a postgres sink: split good rows from dead letters,
    transform, write once."""

    def __init__(self, config: RunConfig, partitions: int = 2, index: int = 0):
        self.batch = Batch(config, index, KIND)
        self.config = config
        self.sink: PostgresSink = self.batch.sink
        # Upserts written by the JVM writer go by key into this many partitions, each its own
        # transaction and marker: the input partitions kept with the checkpoint (readers.Pin),
        # so a replayed batch puts every key where it went the first time.
        self.partitions = partitions
        self.store = PostgresStore(
            self.batch.client(),
            pipeline=config.pipeline,
            table=self.sink.table,
            mode=self.sink.mode,
            key=self.sink.key,
        )
        self.tables_ready = False
        self.jvm: JvmWriter | None = None  # when the executors' JVM can write (set with the tables)
        self.plan: Plan | None = None

    def open(self, spark, query_id: str) -> None:
        """Nothing to start beside the query."""

    def __call__(self, parsed, batch_id: int) -> None:
        if not self.store.stream_id:
            self.store.stream_id = self.batch.stream_id()
        transform = self.batch.transform
        if not self.tables_ready:
            _, out = self.batch.output(parsed, batch_id)
            self.store.ensure_tables(
                [Column(f.name, f.dataType.simpleString()) for f in out.schema if f.name != BAD]
            )
            self.store.drop_stages()  # left by batches that died before committing
            self.jvm = JvmWriter.create(parsed.sparkSession, self.store)
            self.tables_ready = True
        if self.store.committed(batch_id):
            self.batch.skip(parsed, batch_id, "committed")
            return
        # With the JVM writer: the records that parsed, through the transform if any, in one
        # pass, unless the last batch had records that did not: those go on with the paths
        # that write dead letters from the same read of Kafka (one pass without a transform,
        # else a cached batch), rather than read each such batch twice.
        append, done = self.sink.mode == "append", None
        if self.jvm is not None and not self.batch.unparsed_before:
            done = self._observed_pass(parsed, batch_id)
        batch = None if done else parsed.select(*self.batch.one_pass_columns())
        # (Never a stateful batch: its output goes through the stage, whichever path.)
        if done is None and append and transform is None and not self.config.spec.stateful:
            done = self._single_pass(batch, batch_id)
        rows, dead, how = done or self._cached(batch, batch_id)
        self.batch.unparsed_before = dead > 0
        log.info("batch %s: %s rows (%s), %s dead letters", batch_id, rows, how, dead)

    def _single_pass(self, batch, batch_id: int) -> tuple[int, int, str]:
        """No transform, append: each task writes its partition's rows and dead letters with
        its marker; Kafka is read once and nothing is cached."""
        if self.jvm is not None:
            done = self.jvm.write(
                for_jvm(batch, self.batch.columns),
                batch_id,
                self.batch.columns,
                dead_letter_columns=[f"_cp_{c}" for c in DEAD_LETTER_FIELDS],
                bad_column=BAD,
                parse_error=self.batch.parse_error,
                empty_value_error=EMPTY_VALUE,
            )
            if done is not None:
                self.store.finish_batch(batch_id, done[0])
                return done[0], done[1], "direct, one pass with dead letters, JVM"
        written = (
            for_copy(batch, self.batch.columns)
            .mapInArrow(
                functools.partial(
                    _write_partition_and_dead_letters,
                    functools.partial(self.store.write_part, batch_id),
                    self.batch.columns,
                    self.batch.parse_error,
                ),
                "rows LONG, dead LONG",
            )
            .collect()
        )
        rows = sum(r.rows for r in written)
        self.store.finish_batch(batch_id, rows)
        return rows, sum(r.dead for r in written), "direct, one pass with dead letters"

    def _observed_pass(self, parsed, batch_id: int) -> tuple[int, int, str] | None:
        """The JVM writer, a transform without a shuffle (or none): the records that parsed
        (transformed, if asked) are written in one pass, each partition with its marker (an
        upsert by key: see below), while those that did not are counted on the way. Nothing
        is cached and no dead-letter columns are carried; only a batch that had such records
        reads its Kafka offsets a second time, for its dead letters. A transform with a
        shuffle goes through the batch's stage (_staged_by_jvm). None when a column has no
        encoding for the JVM writer: nothing was written then."""
        from pyspark.sql import functions as F

        name, out = self.batch.output(parsed, batch_id)
        if self.plan is None:
            # The same query every batch: whether it shuffles and its columns are learnt
            # once (each costs a round trip to the JVM and an analysis).
            self.plan = Plan(
                # A stateful pipeline's batch is cached (StatefulBatches), which hides the
                # plan's shuffles: its output always goes through the stage.
                shuffles=self.config.spec.stateful or shuffles(out),
                columns=[c for c in out.columns if c != BAD],
                nested=nested(out),
            )
        if self.plan.shuffles:
            return self._staged_by_jvm(parsed, batch_id, name, out)
        if self.sink.mode == "upsert":
            # Every row of a key in one partition (hashed by key); within it, the last record
            # per key (by its position in the batch: Kafka order within a Kafka partition)
            # wins. The order is taken before the shuffle, from the batch's fixed input
            # partitions, so a replay orders the same way.
            out = out.withColumn(ORDER, F.monotonically_increasing_id()).repartition(
                self.partitions, *[F.col(f"`{k}`") for k in self.sink.key]
            )
        frame = for_jvm(out) if self.plan.nested else out
        if self.plan.schema is None:
            self.plan.schema = frame.schema
        done = self.jvm.write(
            frame,
            batch_id,
            self.plan.columns,
            bad_column=None if name else BAD,
            upsert_order=ORDER if self.sink.mode == "upsert" else None,
            schema=self.plan.schema,
        )
        if done is None:
            return None
        dead_rows = self.batch.unparsed_letters(
            parsed, observed_count(frame, name) if name else done[1]
        )
        self.store.finish_batch(batch_id, done[0], dead_letters=dead_rows)
        return written(done[0], dead_rows, "direct, one pass, JVM")

    def _staged_by_jvm(self, parsed, batch_id: int, name, out) -> tuple[int, int, str] | None:
        """A transform with a shuffle: its partitions are not fixed pieces of the batch, so
        each task fills its slice of the batch's stage (its partition and each row's position
        beside the rows) and the driver moves the stage into the target with the batch's
        marker, in one transaction. One pass, no cache; unparsed records as above."""
        from pyspark.sql import functions as F

        frame = out.select(
            "*", F.spark_partition_id().alias(PART), F.monotonically_increasing_id().alias(ORDINAL)
        )
        if self.plan.nested:
            frame = for_jvm(frame)
        if self.plan.stage_schema is None:
            self.plan.stage_schema = frame.schema
        self.store.prepare_stage(batch_id)
        done = self.jvm.write(
            frame,
            batch_id,
            self.plan.columns,
            stage=self.store.stage_name(batch_id),
            schema=self.plan.stage_schema,
        )
        if done is None:
            return None
        dead_rows = self.batch.unparsed_letters(parsed, observed_count(frame, name))
        self.store.commit_stage(batch_id, dead_letters=dead_rows)
        return written(done[0], dead_rows, "staged, one pass, JVM")

    def _cached(self, batch, batch_id: int) -> tuple[int, int, str]:
        """A transform or upsert: the batch is cached, so the transform's output and the dead
        letters come from one read of Kafka."""
        from pyspark.sql import functions as F

        batch = batch.persist()
        try:
            dead = self.batch.dead_letters(batch)
            good = batch.where(~F.col(BAD)).select(*[F.col(f"`{c}`") for c in self.batch.columns])
            good.createOrReplaceTempView("source")
            transform = self.batch.transform
            out = batch.sparkSession.sql(transform.sql) if transform else good
            direct = (
                self.sink.mode == "append" and not self.config.spec.stateful and not shuffles(out)
            )
            done = (
                self.jvm.write(for_jvm(out), batch_id, out.columns) if direct and self.jvm else None
            )
            if done is not None:
                rows, how = done[0], "direct, cached, JVM"
            else:
                rows, how = self._write_from_python(out, batch_id, direct)
            dead_rows = dead.toArrow()
            if direct:
                self.store.finish_batch(batch_id, rows, dead_letters=dead_rows)
            else:
                self.store.commit_stage(batch_id, dead_letters=dead_rows)
            return rows, dead_rows.num_rows, how
        finally:
            batch.unpersist()

    def _write_from_python(self, out, batch_id: int, direct: bool) -> tuple[int, str]:
        """Every task writes its partition from a Python worker: into the target with its
        marker (direct), or into the batch's stage."""
        if direct:
            task, write = _write_partition_directly, self.store.write_part
        else:
            self.store.prepare_stage(batch_id)
            task, write = _write_partition, self.store.write_stage_part
        written = (
            for_copy(out)
            .mapInArrow(functools.partial(task, functools.partial(write, batch_id)), "rows LONG")
            .collect()
        )
        return sum(r.rows for r in written), "direct" if direct else "staged"


def _write_partition(write, batches):
    """Runs in an executor: hand this Spark partition's rows to the sink, as one table."""
    import pyarrow as pa
    from pyspark import TaskContext

    part = TaskContext.get().partitionId()
    collected = list(batches)
    rows = write(part, pa.Table.from_batches(collected)) if collected else 0
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _write_partition_directly(write, batches):
    """Runs in an executor: stream this Spark partition's rows to the sink (direct path)."""
    import pyarrow as pa
    from pyspark import TaskContext

    rows, _ = write(TaskContext.get().partitionId(), ((b, None) for b in batches))
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _write_partition_and_dead_letters(write, columns, parse_error, batches):
    """Runs in an executor: stream this Spark partition's good rows and dead letters to the
    sink, in one transaction (the single-pass path)."""
    import pyarrow as pa
    from pyspark import TaskContext

    rows, dead = write(
        TaskContext.get().partitionId(),
        (_split_dead_letters(b, columns, parse_error) for b in batches),
    )
    yield pa.RecordBatch.from_pydict({"rows": [rows], "dead": [dead]})


def _split_dead_letters(batch, columns, parse_error):
    """A record batch of the one-pass frame -> (good rows, dead letters)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = batch.column(BAD)
    good = batch.filter(pc.invert(bad)).select(columns)
    if not pc.any(bad).as_py():
        return good, None
    letters = pa.Table.from_batches([batch.filter(bad)]).select(
        [f"_cp_{c}" for c in DEAD_LETTER_FIELDS]
    )
    letters = letters.rename_columns(list(DEAD_LETTER_FIELDS))
    error = pc.coalesce(
        letters.column("reason"),
        pc.if_else(pc.is_null(letters.column("value")), EMPTY_VALUE, parse_error),
    )
    return good, letters.drop_columns(["reason"]).append_column("error", error)
