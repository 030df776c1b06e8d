"""Stateful pipelines: a watermark, deduplication or an aggregation over the stream, with
their state kept across batches in a state store (RocksDB by default), and each batch cached
while its writers write it."""

from __future__ import annotations

from .failures import DefinitionError
from .runconfig import RunConfig
from .source import CORRUPT, DEAD_LETTER_FIELDS, PARSED, unparsed
from .spec import PipelineSpec


class StatefulBatches:
    """The foreachBatch function of a stateful pipeline: the batch is cached while its
    writers write it, so that its stateful operators run once per batch whatever the
    writers do (several sinks, dead letters read again): each run of them commits the
    batch's state version again and adds to its metrics (rows dropped by the watermark...)."""

    def __init__(self, inner):
        self.inner = inner
        self.writers = getattr(inner, "writers", [inner])

    def __call__(self, batch, batch_id: int) -> None:
        batch = batch.persist()
        try:
            self.inner(batch, batch_id)
        finally:
            batch.unpersist()


# Where a stateful pipeline keeps its state (the spec's state_store; None: RocksDB).
STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}


STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"


# RocksDB uploads each batch's changes (a changelog) instead of a snapshot of its files at
# every commit; snapshots are made in the background.
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


class StateStoreError(DefinitionError, RuntimeError):
    """A definition error: the spec asks for another state store than the checkpoint's."""


def state_store(spec: PipelineSpec) -> str:
    return spec.state_store or "rocksdb"


def use_state_store(spark, config: RunConfig) -> None:
    """Set the session's state store for a stateful pipeline. Spark keeps the provider a
    checkpoint was started with in its offset log and goes on with it whatever the session
    says: a spec asking for another one is refused (a definition error) rather than ignored;
    the state can only move to another store with a new checkpoint (a reset)."""
    from .checkpoints import has_state, planned_conf

    wanted = STATE_STORE_PROVIDERS[state_store(config.spec)]
    # (Spark records a provider for stateless queries too: only state is kept in one.)
    store = config.store
    kept = (
        planned_conf(config.checkpoint, store).get(STATE_STORE_CONF)
        if has_state(config.checkpoint, store)
        else None
    )
    if kept and kept != wanted:
        names = {v: k for k, v in STATE_STORE_PROVIDERS.items()}
        raise StateStoreError(
            f"state_store: the checkpoint's state is kept in {names.get(kept, kept)!r} and the "
            f"spec asks for {state_store(config.spec)!r}; a checkpoint keeps the state store "
            "it started with: set state_store back, or reset the pipeline's offsets to start "
            "its state anew in the new store"
        )
    spark.conf.set(STATE_STORE_CONF, wanted)
    spark.conf.set(CHANGELOG_CONF, "true")


def stateful_frame(spark, parsed, spec: PipelineSpec):
    """(frame, output columns): a stateful pipeline's watermark, deduplication and transform
    over the stream, so that Spark keeps their state across batches; what foreachBatch gets
    looks like parsed_frame's (the sinks' paths take it as they are): the transform's output
    rows as the parsed record, and beside them, from the same batch, the records that did
    not parse with their Kafka metadata (the dead letters), as the union of the two. The
    records that parsed go into the stateful part only; each batch's output is what its
    stateful operators emit (finished windows in append mode, changed groups in update)."""
    from pyspark.sql import functions as F

    from .spec.ddl import parse_schema

    columns = [f.name for f in parse_schema(spec.source.schema).fields]
    good = parsed.where(~unparsed()).select(*[F.col(PARSED)[c].alias(c) for c in columns])
    watermark = spec.source.watermark
    if watermark is not None:
        delay = round(watermark.delay_seconds * 1000)
        good = good.withWatermark(watermark.column, f"{delay} milliseconds")
    if spec.source.deduplicate is not None:
        good = good.dropDuplicatesWithinWatermark(list(spec.source.deduplicate.key))
    out = good
    if spec.transform is not None:
        good.createOrReplaceTempView("source")
        out = spark.sql(spec.transform.sql)
    names = list(out.columns)
    record = F.struct(
        *[F.col(f"`{c}`") for c in names], F.lit(None).cast("string").alias(CORRUPT)
    ).alias(PARSED)
    types = {f.name: f.dataType for f in parsed.schema.fields}
    rows = out.select(*[F.lit(None).cast(types[c]).alias(c) for c in DEAD_LETTER_FIELDS], record)
    record_type = rows.schema[PARSED].dataType
    letters = parsed.where(unparsed()).select(
        *DEAD_LETTER_FIELDS, F.lit(None).cast(record_type).alias(PARSED)
    )
    return rows.unionByName(letters), names


def source_reads(spec: PipelineSpec) -> int:
    """How many times each batch reads its Kafka offsets: twice for a stateful pipeline (the
    records into the state, the unparsed ones as dead letters: the two halves of
    stateful_frame's union), which Spark counts twice in the batch's input rows."""
    return 2 if spec.stateful else 1
