"""The Kafka sink's writer (the foreachBatch function of a kafka sink): every task writes its
partition's records in a Kafka transaction with its marker (jobs.sinks.kafka.client). Without
a transform, a partition's dead letters go in the same transaction; with one, the records
that did not parse are counted while the transform runs and, when there are some, read again
and written to the dead-letter topic, partition by partition with markers of their own."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ...batch import BAD, EMPTY_VALUE, Batch, observed_count
from ...runconfig import RunConfig
from ...source import DEAD_LETTER_FIELDS, source_partitions
from . import client as kafka
from .kind import KIND
from .model import KafkaSink

log = logging.getLogger("jobs.pipeline")


@dataclass
class Plan:
    """The transform's output columns, learnt from the first batch (its plan checked once)."""

    columns: list[str]


class Writer:
    """The foreachBatch function of a kafka sink."""

    def __init__(self, config: RunConfig, partitions: int = 2, index: int = 0):
        self.batch = Batch(config, index, KIND)
        self.config = config
        self.sink: KafkaSink = self.batch.sink
        self.store: kafka.KafkaWriter | None = None  # the transactional writer, once opened
        self.records: kafka.RecordColumns | None = None
        self.stream = ""
        self.plan: Plan | None = None
        # The first batch of a run may be a replay: its parts are checked against the other
        # naming scheme (KafkaTxWriter.checkScheme).
        self.first_batch: dict | None = None

    def open(self, spark, query_id: str) -> None:
        """Nothing to start beside the query."""

    def _start(self, spark) -> kafka.KafkaWriter:
        sink, client = self.sink, self.batch.client()
        kafka.check_topics(client, [sink.topic, sink.dead_letter_topic])
        self.stream = self.batch.stream_id()
        avro = None
        if sink.format == "avro":
            registry = self.config.sink_config(self.batch.index).get("schema-registry")
            avro = kafka.AvroValues(spark, sink, registry)
        self.records = kafka.RecordColumns(sink, avro)
        self.first_batch = {
            "check_scheme": True,
            "source_parts": [f"{t}-{p}" for t, p in source_partitions(self.config)],
        }
        return kafka.KafkaWriter(spark, pipeline=self.config.pipeline, sink=sink, client=client)

    def _once(self) -> dict:
        """The first batch's extra settings (the naming-scheme check), then none."""
        extra, self.first_batch = self.first_batch or {}, None
        return extra

    def __call__(self, parsed, batch_id: int) -> None:
        if self.store is None:
            self.store = self._start(parsed.sparkSession)
        dead_columns = [f"_cp_{c}" for c in DEAD_LETTER_FIELDS]
        # Rows flagged BAD go to the dead-letter topic, from these columns, with this error.
        letters = {
            "bad_column": BAD,
            "dead_letter_columns": dead_columns,
            "parse_error": self.batch.parse_error,
            "empty_value_error": EMPTY_VALUE,
        }
        if self.batch.transform is None:
            batch = parsed.select(*self.batch.one_pass_columns())
            frame = batch.select(
                BAD, *dead_columns, *self.records.columns(batch, self.batch.columns)
            )
            rows, dead = self.store.write(frame, batch_id, self.stream, **letters, **self._once())
            log.info("batch %s: %s records, %s dead letters (Kafka)", batch_id, rows, dead)
            return
        name, out = self.batch.output(parsed, batch_id)
        if self.plan is None:
            kafka.check_plan(out)
            self.plan = Plan(list(out.columns))
        frame = out.select(*self.records.columns(out, self.plan.columns))
        rows, _ = self.store.write(frame, batch_id, self.stream, **self._once())
        unparsed = observed_count(frame, name)
        dead = 0
        if unparsed != 0:  # None (not reported): read them to be safe
            unparsed_rows = parsed.select(*self.batch.one_pass_columns()).where(BAD)
            _, dead = self.store.write(
                unparsed_rows.select(BAD, *dead_columns),
                batch_id,
                self.stream,
                part="dead/",
                **letters,
            )
        log.info("batch %s: %s records, %s dead letters (Kafka)", batch_id, rows, dead)
