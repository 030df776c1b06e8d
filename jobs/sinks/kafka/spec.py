"""The kafka sink's spec: parsed and checked (each problem naming its field), and what the rest
of the product asks of the kind (jobs.sinks.kind.SinkKind). Plain Python."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...spec import fields
from ...spec.fields import FieldError, Section, check_connection, names, output_columns_of
from ...spec.sql import SQLError, check_expression, expression_columns
from ..kind import DeadLetters, FormField
from .model import AvroOutput, KafkaSink

if TYPE_CHECKING:
    from ...spec.model import KafkaSource, Transform

MAX_TRANSACTION_TIMEOUT_SECONDS = 900  # the broker's default transaction.max.timeout.ms
HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9._-]{1,128}$")
RESERVED_HEADER_PREFIX = "cp-"


def parse(
    errors: list[FieldError],
    data: Mapping[str, Any],
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
    *,
    path: str = "sink",
) -> KafkaSink | None:
    s = Section(errors, path, data, names(KafkaSink))
    connection = s.string("connection")
    check_connection(s, connection, "kafka", connections)
    topic = fields.topic(s, "topic")
    dead_letter_topic = fields.topic(s, "dead_letter_topic", None)
    if topic is not None and dead_letter_topic is None:
        dead_letter_topic = f"{topic}.dead-letters"[:249]
    if topic is not None and topic == dead_letter_topic:
        s.error("dead_letter_topic", "must not be the sink's topic")
    if source is not None and connection == source.connection:
        for name, value in (("topic", topic), ("dead_letter_topic", dead_letter_topic)):
            if value in source.topics:
                s.error(name, f"{value!r} is a source topic: the pipeline would read its output")
    fmt = s.string("format", "json", choices=FORMATS)
    registry = _parse_registry(s, fmt, connections)
    # Over the output columns, where they are known without Spark (else Spark tells).
    output = output_columns_of(source, transform)
    columns = sorted(output) if output is not None else None
    key = fields.expression(s, "key", columns)
    value = fields.expression(s, "value", columns)
    headers = s.get("headers", {})
    if not isinstance(headers, Mapping):
        s.error("headers", "must map header names to SQL expressions")
        headers = {}
    for name, expression in headers.items():
        where = f"headers.{name}"
        if not HEADER_NAME_RE.fullmatch(str(name)):
            s.error(where, "header names are 1-128 letters, digits, '.', '_' or '-'")
        elif str(name).lower().startswith(RESERVED_HEADER_PREFIX):
            s.error(where, "header names starting with cp- are reserved for the control plane")
        elif not isinstance(expression, str):
            s.error(where, "must be a SQL expression (a string)")
        else:
            try:
                check_expression(expression, columns=columns)
            except SQLError as exc:
                s.error(where, str(exc))
    timeout = s.integer(
        "transaction_timeout_seconds",
        KafkaSink.transaction_timeout_seconds,
        minimum=10,
        maximum=MAX_TRANSACTION_TIMEOUT_SECONDS,
    )
    if not s.ok:
        return None
    return KafkaSink(
        connection=connection,
        topic=topic,
        key=key,
        value=value,
        headers={str(k): v.strip() for k, v in headers.items()},
        format=fmt,
        schema_registry=registry,
        dead_letter_topic=dead_letter_topic,
        transaction_timeout_seconds=timeout,
    )


FORMATS = ("json", "avro")


def _parse_registry(
    s: Section, fmt: str | None, connections: Mapping[str, str] | None
) -> AvroOutput | None:
    """sink.schema_registry: where an Avro sink's value schema is registered."""
    data = s.get("schema_registry", None)
    if fmt != "avro":
        if data is not None:
            s.error("schema_registry", "applies to format avro only")
        return None
    if data is None:
        s.error("schema_registry", "is required with format avro (the registry of its schema)")
        return None
    r = Section(s.errors, s.at("schema_registry"), data, names(AvroOutput))
    connection, strategy, record = fields.registry_subject(r, connections)
    if not r.ok:
        return None
    return AvroOutput(connection=connection, strategy=strategy, record=record)


def check_update(errors: list[FieldError], sink: KafkaSink, path: str, shape) -> None:
    """Update output is keyed by the group: a compacted topic then keeps each group's latest."""
    if sink.key is None:
        errors.append(
            FieldError(
                f"{path}.key",
                "is required with update output: each batch writes a group's new value, keyed "
                "by the group (a compacted topic then keeps the latest)",
            )
        )
    elif shape is not None and shape.key_columns is not None:
        keys = shape.key_columns
        used = {keys[c] for c in expression_columns(sink.key) if c in keys}
        missing = [text for i, text in enumerate(shape.group_items) if i not in used]
        if missing:
            errors.append(
                FieldError(
                    f"{path}.key",
                    f"does not use the GROUP BY item {missing[0]}: groups that differ only "
                    "there would share a key (a compacted topic would keep one of them)",
                )
            )


def target(sink: KafkaSink) -> str:
    return sink.topic


def dead_letters(sink: Mapping[str, Any]) -> DeadLetters:
    """Records of the sink's dead-letter topic (as they arrived, with headers), written
    exactly once with their batch."""
    return DeadLetters(
        "topic", str(sink.get("connection") or ""), str(sink.get("dead_letter_topic") or "")
    )


FORM = (
    FormField("sink_topic", "topic", "Topic", help="must exist on the sink's cluster"),
    FormField(
        "record_key",
        "key",
        "Record key (optional)",
        help="a Spark SQL expression over the output columns, e.g. delivery_id; empty: no key",
    ),
    FormField(
        "record_value",
        "value",
        "Record value (optional)",
        help="a Spark SQL expression, e.g. named_struct('id', id, 'n', n), written as JSON;"
        " empty: every output column as a JSON object",
    ),
    FormField(
        "record_format",
        "format",
        "Value format",
        "select",
        "json: the value as JSON; avro: in Avro, Confluent's wire format, its schema registered"
        " in the registry below",
        choices=("json", "avro"),
    ),
    FormField(
        "record_registry",
        "schema_registry.connection",
        "Schema registry (avro)",
        help="a schema-registry connection; the value's schema goes under <topic>-value",
    ),
    FormField(
        "record_headers",
        "headers",
        "Headers (optional)",
        "json",
        '{"header name": "SQL expression"}, e.g. {"origin": "\'orders\'"}',
    ),
    FormField(
        "dead_letter_topic",
        "dead_letter_topic",
        "Dead-letter topic",
        help="records that do not parse, as they arrived; empty: <topic>.dead-letters",
    ),
    FormField(
        "transaction_timeout_seconds",
        "transaction_timeout_seconds",
        "Transaction timeout (s)",
        "number",
        "10 to 900; a killed writer's open transaction holds read_committed readers this long"
        " at most",
    ),
)


def schema() -> dict[str, Any]:
    from ...spec.fields import AVRO_FULL_NAME, TOPIC_RE
    from ...spec.fragments import EXPRESSION, KAFKA_INTERNAL, TOPIC, connection

    return {
        "connection": connection("kafka"),
        "topic": TOPIC,
        "dead_letter_topic": {
            "type": ["string", "null"],
            "pattern": TOPIC_RE.pattern,
            "not": KAFKA_INTERNAL,
        },
        "key": {"anyOf": [EXPRESSION, {"type": "null"}]},
        "value": {"anyOf": [EXPRESSION, {"type": "null"}]},
        "headers": {
            "type": "object",
            "propertyNames": {"pattern": HEADER_NAME_RE.pattern, "not": {"pattern": "^[cC][pP]-"}},
            "additionalProperties": EXPRESSION,
        },
        "transaction_timeout_seconds": {
            "type": "integer",
            "minimum": 10,
            "maximum": MAX_TRANSACTION_TIMEOUT_SECONDS,
        },
        "format": {"enum": list(FORMATS)},
        (AvroOutput, "connection"): connection("schema-registry"),
        (AvroOutput, "record"): {"type": ["string", "null"], "pattern": AVRO_FULL_NAME.pattern},
    }
