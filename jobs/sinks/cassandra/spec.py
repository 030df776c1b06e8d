"""The cassandra sink's spec: parsed and checked (each problem naming its field), and what the
rest of the product asks of the kind (jobs.sinks.kind.SinkKind). Plain Python.

What is known only to the cluster (the table's columns and types, a counter table, a column
that is a collection) is checked before a start by the preflight (controlplane.definitions.
preflight) and by the writer when it opens the table (jobs.sinks.cassandra.store)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...spec import fields
from ...spec.ddl import parse_schema
from ...spec.fields import FieldError, Section, check_connection, names
from ..kind import DeadLetters, FormField
from .connection import NAME_RE
from .model import CassandraSink, DeadLetterTarget

if TYPE_CHECKING:
    from ...spec.model import KafkaSource, Transform

CONSISTENCY_LEVELS = (
    "LOCAL_QUORUM",
    "ONE",
    "TWO",
    "THREE",
    "QUORUM",
    "ALL",
    "EACH_QUORUM",
    "LOCAL_ONE",
)
MAX_TTL_SECONDS = 630_720_000  # Cassandra's own limit: 20 years
MAX_IN_FLIGHT = 1024
MAX_KEY_COLUMNS = 16
# The kinds of connection dead letters can go to, and whether a topic is named there.
TOPIC_NEEDED = {"kafka": True, "postgres": False}
DEAD_LETTER_KINDS = tuple(TOPIC_NEEDED)


def parse(
    errors: list[FieldError],
    data: Mapping[str, Any],
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
    *,
    path: str = "sink",
) -> CassandraSink | None:
    s = Section(errors, path, data, names(CassandraSink))
    connection = s.string("connection")
    check_connection(s, connection, "cassandra", connections)
    table = s.string("table")
    if table is not None and not NAME_RE.fullmatch(table):
        s.error(
            "table",
            f"{table!r} is not a table name: 1-48 lower-case letters, digits and underscores,"
            " starting with a letter (the keyspace is the connection's)",
        )
    # Without a transform the output columns are the source schema's (with one, see
    # jobs.spec.validate._check_output_keys).
    known = None
    if source is not None and transform is None:
        known = {f.name.lower() for f in parse_schema(source.schema).fields}
    partition = _columns(s, "partition_key", known)
    clustering = _columns(s, "clustering_key", known)
    if clustering and not partition:
        s.error("clustering_key", "needs a partition_key (the primary key starts with it)")
    both = [*partition, *clustering]
    if len(set(both)) != len(both):
        s.error("clustering_key", "names a column of the partition key again")
    consistency = s.string("consistency", "LOCAL_QUORUM", choices=CONSISTENCY_LEVELS)
    ttl = s.integer("ttl_seconds", None, minimum=1, maximum=MAX_TTL_SECONDS)
    write_time = s.string("write_time_column", None)
    if write_time is not None and not NAME_RE.fullmatch(write_time):
        s.error("write_time_column", f"{write_time!r} is not a column name")
    elif write_time is not None and known is not None and write_time not in known:
        s.error("write_time_column", f"column {write_time!r} is not in the source schema")
    in_flight = s.integer("max_in_flight", 128, minimum=1, maximum=MAX_IN_FLIGHT)
    letters = _dead_letters(s, connections, source)
    if not s.ok:
        return None
    return CassandraSink(
        connection=connection,
        table=table,
        dead_letters=letters,
        partition_key=tuple(partition),
        clustering_key=tuple(clustering),
        consistency=consistency,
        ttl_seconds=ttl,
        write_time_column=write_time,
        max_in_flight=in_flight,
    )


def _columns(s: Section, name: str, known: set[str] | None) -> list[str]:
    value = s.get(name, [])
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list):
        s.error(name, "must be a list of column names")
        return []
    if len(value) > MAX_KEY_COLUMNS:
        s.error(name, f"at most {MAX_KEY_COLUMNS} columns")
    out = []
    for i, column in enumerate(value):
        if not isinstance(column, str) or not NAME_RE.fullmatch(column):
            s.error(f"{name}[{i}]", f"{column!r} is not a column name (lower case)")
        elif known is not None and column not in known:
            s.error(f"{name}[{i}]", f"column {column!r} is not in the source schema")
        else:
            out.append(column)
    if len(set(out)) != len(out):
        s.error(name, "lists a column twice")
    return out


def _dead_letters(
    s: Section, connections: Mapping[str, str] | None, source: KafkaSource | None
) -> DeadLetterTarget | None:
    data = s.get("dead_letters")
    if data is None:
        return None
    d = Section(s.errors, s.at("dead_letters"), data, names(DeadLetterTarget))
    if not d.ok:
        s.ok = False
        return None
    connection = d.string("connection")
    kind = (connections or {}).get(connection) if connection else None
    if connection is not None and connections is not None:
        if connection not in connections:
            known = ", ".join(sorted(connections)) or "none defined"
            d.error("connection", f"no connection named {connection!r} (known: {known})")
        elif kind not in DEAD_LETTER_KINDS:
            d.error(
                "connection",
                f"connection {connection!r} is a {kind} connection: dead letters go to a kafka"
                " connection's topic or a postgres connection's dead-letter table",
            )
    topic = fields.topic(d, "topic", None)
    needs_topic = TOPIC_NEEDED.get(kind) if kind else None
    if needs_topic and topic is None and "topic" not in d.data:
        d.error("topic", "is required with a kafka connection: the topic the letters go to")
    if needs_topic is False and topic is not None:
        d.error("topic", "applies to a kafka connection only (postgres: the dead-letter table)")
    if (
        topic is not None
        and source is not None
        and connection == source.connection
        and topic in source.topics
    ):
        d.error("topic", f"{topic!r} is a source topic: the pipeline would read its own letters")
    if not d.ok:
        s.ok = False
        return None
    return DeadLetterTarget(connection=connection, topic=topic)


def check_update(errors: list[FieldError], sink: CassandraSink, path: str, shape) -> None:
    """Update output is an upsert keyed by the group: the primary key (when the table is
    created from the output; an existing table's is checked by the preflight) is the GROUP
    BY's columns."""
    primary = [*sink.partition_key, *sink.clustering_key]
    if not primary or shape is None or shape.key_columns is None:
        return
    keys = shape.key_columns
    for where, column in _key_fields(sink):
        if column not in keys:
            group = ", ".join(shape.group_items)
            errors.append(
                FieldError(
                    f"{path}.{where}",
                    f"column {column!r} is not a GROUP BY column ({group}): an upsert of update"
                    " output is keyed by the group",
                )
            )
    covered = {keys[c] for c in primary if c in keys}
    for item, text in enumerate(shape.group_items):
        if item not in covered:
            errors.append(
                FieldError(
                    f"{path}.partition_key",
                    f"the primary key misses the GROUP BY item {text}: groups that differ only"
                    " there would overwrite each other",
                )
            )


def _key_fields(sink: CassandraSink) -> list[tuple[str, str]]:
    return [
        *((f"partition_key[{j}]", c) for j, c in enumerate(sink.partition_key)),
        *((f"clustering_key[{j}]", c) for j, c in enumerate(sink.clustering_key)),
    ]


def named_columns(sink: CassandraSink) -> tuple[tuple[str, str], ...]:
    named = _key_fields(sink)
    if sink.write_time_column:
        named.append(("write_time_column", sink.write_time_column))
    return tuple(named)


def target(sink: CassandraSink) -> str:
    return sink.table


def dead_letters(sink: Mapping[str, Any]) -> DeadLetters:
    """A Kafka topic, or the dead-letter table of a postgres connection, as the spec says."""
    letters = sink.get("dead_letters") or {}
    connection = str(letters.get("connection") or "")
    if letters.get("topic"):
        return DeadLetters("topic", connection, str(letters["topic"]))
    return DeadLetters("table", connection)


FORM = (
    FormField("cassandra_table", "table", "Cassandra table", help="in the connection's keyspace"),
    FormField(
        "partition_key",
        "partition_key",
        "Partition key (to create the table)",
        "list",
        "output columns, comma-separated: the table is created from the output with this"
        " primary key when it does not exist; empty: it must exist",
    ),
    FormField(
        "clustering_key",
        "clustering_key",
        "Clustering columns (optional)",
        "list",
        "output columns after the partition key in the primary key",
    ),
    FormField(
        "consistency",
        "consistency",
        "Consistency level",
        "select",
        choices=CONSISTENCY_LEVELS,
    ),
    FormField(
        "ttl_seconds", "ttl_seconds", "TTL (s, optional)", "number", "empty: cells never expire"
    ),
    FormField(
        "write_time_column",
        "write_time_column",
        "Write time column (optional)",
        help="an output TIMESTAMP (or BIGINT microseconds) column: the newest event time wins;"
        " empty: the batch's position in the source",
    ),
    FormField(
        "dead_letters_connection",
        "dead_letters.connection",
        "Dead letters: connection",
        help="a kafka connection (with a topic) or a postgres connection (its dead-letter table)",
    ),
    FormField(
        "dead_letters_topic",
        "dead_letters.topic",
        "Dead letters: topic",
        help="with a kafka connection: the topic the records that do not parse go to",
    ),
)


def schema() -> dict[str, Any]:
    from ...spec.fragments import TOPIC, connection

    column = {"type": "string", "pattern": NAME_RE.pattern, "format": "column-name"}
    columns = {"type": "array", "items": column, "uniqueItems": True, "maxItems": MAX_KEY_COLUMNS}
    return {
        "connection": connection("cassandra"),
        "table": {"type": "string", "pattern": NAME_RE.pattern},
        "partition_key": columns,
        "clustering_key": columns,
        "consistency": {"enum": list(CONSISTENCY_LEVELS)},
        "ttl_seconds": {"type": ["integer", "null"], "minimum": 1, "maximum": MAX_TTL_SECONDS},
        "write_time_column": {"anyOf": [column, {"type": "null"}]},
        "max_in_flight": {"type": "integer", "minimum": 1, "maximum": MAX_IN_FLIGHT},
        "dead_letters": {
            "type": "object",
            "properties": {
                "connection": {
                    "type": "string",
                    "minLength": 1,
                    "format": "dead-letter-connection",
                    "description": "a kafka connection (with topic) or a postgres connection",
                },
                "topic": {"anyOf": [TOPIC, {"type": "null"}]},
            },
            "required": ["connection"],
            "additionalProperties": False,
        },
    }
