"""Turning a pipeline spec into a running Structured Streaming query (start_query).

The source (jobs.source) reads Kafka and parses each value; a stateful pipeline's transform
runs over the stream (jobs.stateful); each micro-batch goes to the sink's writer, or to each
sink's in turn (jobs.batch), which the sink's kind provides (jobs.sinks.registry). A record
that does not parse is never dropped and never kills the query: it becomes a dead letter,
written with the batch's good rows, exactly once.
"""

from __future__ import annotations

import logging

from . import failures
from .batch import ARROW_SESSION_CONF
from .runconfig import RunConfig
from .sinks import registry
from .source import choose_reader, parsed_frame, register_sources, source_frame, unparsed
from .stateful import StatefulBatches, stateful_frame, use_state_store

log = logging.getLogger("jobs.pipeline")


class SinksWriter:
    """The foreachBatch function of a pipeline with several sinks: each sink writes the
    batch in turn, exactly once with markers of its own; the first fails the batch (and the
    run) if it fails, the others are not tried, and a replayed batch is skipped by the sinks
    that committed it. Each reads the batch's records from Kafka (not cached: the writers'
    markers follow the Kafka offset ranges, which a cache would hide; a stateful pipeline's
    batch is cached, by StatefulBatches, and staged). The dead letters go with the first
    sink only: the others get the records that parsed."""

    def __init__(self, config: RunConfig, partitions: int = 2):
        self.writers = [
            writer_for(config, i, partitions) for i in range(len(config.spec.all_sinks()))
        ]

    def __call__(self, parsed, batch_id: int) -> None:
        self.writers[0](parsed, batch_id)
        parsed_only = parsed.where(~unparsed())
        for writer in self.writers[1:]:
            writer(parsed_only, batch_id)


def writer_for(config: RunConfig, index: int = 0, partitions: int = 2):
    """The foreachBatch function of the spec's sink `index`: its kind's writer."""
    sink = config.spec.all_sinks()[index]
    return registry.of(sink).writer()(config, partitions=partitions, index=index)


def batch_writer(config: RunConfig, partitions: int):
    """The foreachBatch function for the spec's sink or sinks."""
    if len(config.spec.all_sinks()) > 1:
        writer = SinksWriter(config, partitions)
    else:
        writer = writer_for(config, 0, partitions)
    return StatefulBatches(writer) if config.spec.stateful else writer


def store_names(config: RunConfig) -> dict[str, str]:
    roots = [  # a files sink's root, or a connection of another kind's (no "root")
        (config.sink_config(i).get(registry.of(sink).connection_kind) or {}).get("root")
        for i, sink in enumerate(config.spec.all_sinks())
    ]
    s3 = (config.storage or {}).get("s3") or {}
    return failures.store_names(
        config.checkpoint, [r for r in roots if isinstance(r, str)], s3.get("endpoint")
    )


def start_query(spark, config: RunConfig, *, available_now: bool = False):
    # Which of its stores is which, for the words of a failure of one (jobs.failures): the
    # reads and writes from here on may find HDFS or S3 down.
    failures.name_stores(config.pipeline, store_names(config))
    for key, value in ARROW_SESSION_CONF.items():
        spark.conf.set(key, value)
    register_sources(spark)
    pin = choose_reader(spark, config)
    # Shuffles (a transform's GROUP BY) into as many partitions as the batch's input, not
    # Spark's 200: a small batch then runs a few tasks, not 200. Spark keeps the value a
    # checkpoint was started with in its offset log, so this changes only new checkpoints.
    # A stateful pipeline's state is kept in that many partitions for good: at least the
    # application's cores, so that a member of a shared application (1 input partition by
    # default) does not keep all its state in one store.
    shuffle = pin.min_partitions
    if config.spec.stateful:
        shuffle = max(shuffle, spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
    raw = source_frame(spark, config, pin)
    frame, columns = parsed_frame(raw, config.spec, config.registry), None
    if config.spec.stateful:
        use_state_store(spark, config)
        frame, columns = stateful_frame(spark, frame, config.spec)
    batches = batch_writer(config, pin.min_partitions)
    for each in getattr(batches, "writers", [batches]):
        each.batch.session = spark  # the session the query runs in (foreachBatch gets a clone)
        if columns is not None:
            each.batch.columns = columns  # the stateful transform's output (stateful_frame)
    writer = (
        frame.writeStream.queryName(config.pipeline)
        # Spark passes on only the text of what the function raises: its exception is kept,
        # with its type, for the failure's classification (jobs.failures).
        .foreachBatch(failures.recording(config.pipeline, batches))
        .option("checkpointLocation", config.checkpoint)
    )
    if config.spec.output_mode is not None:
        writer = writer.outputMode(config.spec.output_mode)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.spec.trigger.interval_seconds} seconds")
    query = writer.start()
    for each in getattr(batches, "writers", [batches]):
        each.open(spark, query.id)  # what a sink runs beside its query (files: rolling)
    return query
