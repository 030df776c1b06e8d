"""Pieces of the spec's JSON Schema that its parts share (jobs.spec.schema builds the whole;
each sink kind's spec module builds its fields' from these). Plain data."""

from __future__ import annotations

from typing import Any

from .fields import IDENTIFIER_RE, MAX_DELAY_SECONDS, TOPIC_RE

# Names starting with __ are Kafka's own (jobs.kafka.names): a string of that form, never null.
KAFKA_INTERNAL = {"type": "string", "pattern": "^__"}
TOPIC = {
    "type": "string",
    "pattern": TOPIC_RE.pattern,
    "not": {"anyOf": [{"enum": [".", ".."]}, KAFKA_INTERNAL]},
}
DURATION = {"type": "number", "exclusiveMinimum": 0, "maximum": MAX_DELAY_SECONDS}
SQL = {"type": "string", "minLength": 1}
# String formats (annotations: validators ignore them) that say what a string holds, so that
# client generators and fuzzers can produce values parse_spec accepts (tests/api/test_fuzz.py
# gives schemathesis a strategy for each): a Spark DDL schema, one Spark SQL query, one SQL
# expression, an Avro schema as JSON text, the name of a connection of a kind, an output column,
# a column of the source schema, a TIMESTAMP column of it (event time).
EXPRESSION = {**SQL, "format": "spark-sql-expression"}
# A column of the source schema (its DDL may name columns in any case: matched ignoring it).
SOURCE_COLUMN = {"type": "string", "minLength": 1, "pattern": "\\S", "format": "source-column"}


def connection(kind: str) -> dict[str, Any]:
    return {
        "type": "string",
        "minLength": 1,
        "format": f"{kind}-connection",
        "description": f"the name of a {kind} connection",
    }


COLUMN = {"type": "string", "pattern": IDENTIFIER_RE.pattern, "format": "column-name"}
