"""Writing to Kafka exactly once (controlplane.spark.KafkaTxWriter in the executors' JVM):
every Spark task writes its partition's records in one Kafka transaction with a commit
marker, a consumer-group offset committed in the same transaction (Kafka's own
consume-transform-produce protocol), under a transactional id that is the same for every
attempt at that partition: a replayed batch skips what was committed, an attempt's open
transaction is aborted by the next one, and a zombie writer is fenced by the broker.

Shared by the kafka sink (jobs.sinks.kafka: records and their dead letters) and by sinks whose
dead letters go to a Kafka topic (jobs.sinks.cassandra)."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from ..failures import MISSING_TOPIC, DefinitionError
from .readers import java_client_options

log = logging.getLogger("jobs.kafka.transactions")

WRITER_CLASS = "controlplane.spark.KafkaTxWriter"
KEY, VALUE, HEADERS = "_cp_key", "_cp_value_out", "_cp_headers"
# Producer settings the writer needs (the connection's own come on top of none of these).
PRODUCER_SETTINGS = {"linger.ms": "5", "batch.size": "262144"}


class KafkaSinkError(DefinitionError, RuntimeError):
    """The Kafka sink cannot write as asked: a definition error, the same on every restart."""


class MissingSinkTopic(KafkaSinkError):
    """The Kafka sink's topic (or its dead-letter topic) does not exist."""

    category = MISSING_TOPIC


def transactional_prefix(pipeline: str, stream_id: str) -> str:
    """What every transactional id and marker group of a pipeline's checkpoint starts with,
    `cp.<pipeline>.<query id's first 12 hex digits>/`: a new checkpoint (a new query id)
    starts its markers anew. A sink of a pipeline with several has a scope of its own (the
    stream id `<query id>/<scope>`: `cp.<pipeline>.<query id>/<scope>/`). Parts follow; `/`
    cannot be in a topic name, so no part of one scope reads as another's."""
    query, _, scope = stream_id.partition("/")
    return f"cp.{pipeline}.{query.replace('-', '')[:12]}/{scope + '/' if scope else ''}"


def producer_config(client: Mapping[str, Any], timeout_seconds: float) -> dict[str, str]:
    """The Java producer's properties for a connection's kafka-python client arguments."""
    return {
        **PRODUCER_SETTINGS,
        **java_client_options(client),
        "transaction.timeout.ms": str(int(timeout_seconds * 1000)),
    }


def check_topics(client: Mapping[str, Any], topics: Sequence[str]) -> None:
    """Raise KafkaSinkError naming a topic that does not exist (the writer never creates one:
    a producer would wait for it a minute per record batch, then fail)."""
    from .source import metadata_consumer

    consumer = metadata_consumer(dict(client))
    try:
        missing = [t for t in topics if not consumer.partitions_for_topic(t)]
    finally:
        consumer.close()
    if missing:
        raise MissingSinkTopic(
            f"the Kafka sink's topic {missing[0]!r} does not exist on the sink's cluster;"
            " create it (the control plane never creates topics)"
        )


class KafkaWriter:
    """Writes frames of records with KafkaTxWriter; one per pipeline run."""

    def __init__(self, spark, *, pipeline: str, sink, client: Mapping[str, Any]):
        self.spark = spark
        self.pipeline = pipeline
        self.sink = sink
        self.producer = producer_config(client, sink.transaction_timeout_seconds)

    def config(self, batch_id: int, stream_id: str, names: Sequence[str], **extra) -> str:
        def at(column: str | None) -> int:
            return names.index(column) if column in names else -1

        dead = extra.get("dead_letter_columns") or ()
        return json.dumps(
            {
                "producer": self.producer,
                "topic": self.sink.topic,
                "dead_letter_topic": self.sink.dead_letter_topic,
                "prefix": transactional_prefix(self.pipeline, stream_id) + extra.get("part", ""),
                "batch_id": batch_id,
                "key_ordinal": at(KEY),
                "value_ordinal": at(VALUE),
                "headers_ordinal": at(HEADERS),
                "bad_ordinal": at(extra.get("bad_column")),
                "dead_ordinals": [names.index(c) for c in dead],
                "parse_error": extra.get("parse_error", ""),
                "empty_value_error": extra.get("empty_value_error", ""),
                "check_scheme": extra.get("check_scheme", False),
                "source_parts": list(extra.get("source_parts", ())),
            }
        )

    def write(self, frame, batch_id: int, stream_id: str, **extra) -> tuple[int, int]:
        """Write every partition of `frame` (columns KEY, VALUE, HEADERS; with `bad_column`,
        rows flagged there go to the dead-letter topic from `dead_letter_columns`), each in a
        transaction with its marker. `part`: a prefix of this write's markers (the dead letters
        of a batch with a transform have markers of their own). (records, dead letters)."""
        config = self.config(batch_id, stream_id, frame.columns, **extra)
        writer = self.spark._jvm.controlplane.spark.KafkaTxWriter
        records, dead = writer.write(frame._jdf, config)
        return int(records), int(dead)

    def committed(self, stream_id: str, parts: Sequence[str]) -> dict[str, int]:
        """The committed marker offset of each of these parts that has one."""
        from py4j.java_collections import ListConverter

        config = self.config(0, stream_id, [])
        jvm = self.spark._jvm
        found = jvm.controlplane.spark.KafkaTxWriter.committed(
            config, ListConverter().convert(list(parts), self.spark._sc._gateway._gateway_client)
        )
        return {str(k): int(found.get(k)) for k in found.keySet()}
