"""The Kafka sink's spec: the `sink` (or one of `sinks`) of kind "kafka". Plain Python, no
imports beyond the standard library: jobs.spec.model names it in the Sink union."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class AvroOutput:
    """Values in Avro, in Confluent's wire format: the value's schema (from its Spark type)
    registered, or found, in a schema registry under the subject `<topic>-value` (or by the
    record's name), each value framed with its id."""

    connection: str  # a schema-registry connection
    strategy: Literal["topic", "record", "topic-record"] = "topic"
    # The record's full name (namespace.Name): the schema's name, and the record strategies'
    # subject; None: `topLevelRecord`, as Spark names it.
    record: str | None = None


@dataclass(frozen=True)
class KafkaSink:
    """Each Spark task writes its records in one Kafka transaction with its commit marker
    (jobs.sinks.kafka.client): exactly once for `read_committed` consumers."""

    connection: str
    topic: str
    # Spark SQL expressions over the output columns: the record key (none: no key), the value
    # (none: every output column, as a JSON object), and headers by name.
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    # json: a struct value as JSON; avro: the value in Avro through `schema_registry`.
    format: Literal["json", "avro"] = "json"
    schema_registry: AvroOutput | None = None
    # Records that do not parse, as they arrived (the canonical form names the default,
    # "<topic>.dead-letters"); the topic must exist, like `topic`.
    dead_letter_topic: str | None = None
    # How long a partition's transaction may stay open before the broker aborts it (a killed
    # writer's transaction holds `read_committed` readers back until its restart or this).
    transaction_timeout_seconds: int = 120
    kind: Literal["kafka"] = "kafka"

    def value_subject(self) -> str:
        """The subject its Avro values' schema is registered under (format avro): by the
        strategy, from the topic and the record's full name (Spark's default name when none
        is given)."""
        from ...registry.spark_avro import DEFAULT_RECORD
        from ...registry.subjects import subject

        options = self.schema_registry
        if options is None:
            raise ValueError("a sink without schema_registry has no subject")
        return subject(options.strategy, self.topic, options.record or DEFAULT_RECORD)

    def connection_names(self) -> tuple[str, ...]:
        """The connections it writes through."""
        if self.schema_registry is not None:
            return (self.connection, self.schema_registry.connection)
        return (self.connection,)
