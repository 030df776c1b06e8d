"""The postgres sink's spec: parsed and checked (each problem naming its field), and what the
rest of the product asks of the kind (jobs.sinks.kind.SinkKind). Plain Python."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...spec.ddl import parse_schema
from ...spec.fields import (
    IDENTIFIER_RE,
    FieldError,
    Section,
    check_connection,
    names,
)
from ..kind import DeadLetters, FormField
from .model import PostgresSink

if TYPE_CHECKING:
    from ...spec.model import KafkaSource, Transform

# Schemas that belong to Postgres itself: a sink never writes there.
_SYSTEM_SCHEMAS = ("pg_catalog", "information_schema")


def parse(
    errors: list[FieldError],
    data: Mapping[str, Any],
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
    *,
    path: str = "sink",
) -> PostgresSink | None:
    s = Section(errors, path, data, names(PostgresSink))
    connection = s.string("connection")
    check_connection(s, connection, "postgres", connections)
    table = s.string("table")
    if table is not None and not is_table_name(table):
        s.error(
            "table",
            f"{table!r} is not a safe table name: use lower-case letters, digits and "
            "underscores (optionally schema.table), starting with a letter or underscore, "
            "at most 63 characters each",
        )
    elif table is not None and (problem := reserved_table(table)):
        s.error("table", problem)
    mode = s.string("mode", "append", choices=("append", "upsert"))
    key = s.get("key", [])
    if isinstance(key, str):
        key = [key]
    if not isinstance(key, list):
        s.error("key", "must be a list of column names")
        key = []
    for i, column in enumerate(key):
        if not isinstance(column, str) or not IDENTIFIER_RE.fullmatch(column):
            s.error(f"key[{i}]", f"{column!r} is not a safe column name")
    if len(set(key)) != len(key):
        s.error("key", "lists a column twice")
    if mode == "upsert" and not key:
        s.error("key", "is required in upsert mode: the columns that identify a row")
    if mode == "append" and key:
        s.error("key", "applies to upsert mode only")
    if key and source is not None and transform is None:
        # Without a transform the output columns are the source schema's (with one: see
        # _check_output_keys).
        columns = {f.name.lower() for f in parse_schema(source.schema).fields}
        for i, column in enumerate(key):
            if isinstance(column, str) and column.lower() not in columns:
                s.error(f"key[{i}]", f"column {column!r} is not in the source schema")
    if not s.ok:
        return None
    return PostgresSink(connection=connection, table=table, mode=mode, key=tuple(key))


def reserved_table(name: str) -> str | None:
    """Why a sink may not write to `name`, or None. The sink's own bookkeeping (commit
    markers, dead letters, stage tables) lives in tables named _cp_*: a pipeline writing rows
    there could forge another pipeline's commit markers and make it skip batches."""
    schema, _, table = name.rpartition(".")
    if schema in _SYSTEM_SCHEMAS or schema.startswith("pg_"):
        return f"{name!r} is in the system schema {schema!r}; a sink may not write there"
    if table.startswith("_cp_"):
        return (
            f"{name!r}: table names starting with _cp_ are reserved for the sink's own "
            "bookkeeping (commit markers, dead letters)"
        )
    return None


def is_table_name(name: str) -> bool:
    parts = name.split(".")
    return len(parts) <= 2 and all(IDENTIFIER_RE.fullmatch(p) for p in parts)


def check_update(errors: list[FieldError], sink: PostgresSink, path: str, shape) -> None:
    """Update output is an upsert keyed by the group."""
    if sink.mode != "upsert":
        errors.append(
            FieldError(
                f"{path}.mode",
                "must be upsert with update output (each batch rewrites the groups it "
                "changed): key = the group's columns",
            )
        )
    elif shape is not None and shape.key_columns is not None:
        keys = shape.key_columns
        for j, column in enumerate(sink.key):
            if column.lower() not in keys:
                group = ", ".join(shape.group_items)
                errors.append(
                    FieldError(
                        f"{path}.key[{j}]",
                        f"column {column!r} is not a GROUP BY column ({group}): an upsert "
                        "of update output is keyed by the group",
                    )
                )
        covered = {keys[c.lower()] for c in sink.key if c.lower() in keys}
        for item, text in enumerate(shape.group_items):
            if item not in covered:
                named = [c for c, i in keys.items() if i == item]
                hint = f" (output column {named[0]!r})" if named else ""
                errors.append(
                    FieldError(
                        f"{path}.key",
                        f"misses the GROUP BY item {text}{hint}: groups that differ only "
                        "there would overwrite each other",
                    )
                )


def target(sink: PostgresSink) -> str:
    return sink.table


def named_columns(sink: PostgresSink) -> tuple[tuple[str, str], ...]:
    return tuple((f"key[{j}]", column) for j, column in enumerate(sink.key))


def dead_letters(sink: Mapping[str, Any]) -> DeadLetters:
    """In the sink database's dead-letter table, with their batch."""
    return DeadLetters("table", str(sink.get("connection") or ""))


FORM = (
    FormField("table", "table", "Table", help="table or schema.table; created if missing"),
    FormField("mode", "mode", "Mode", "select", choices=("append", "upsert")),
    FormField("key", "key", "Key columns", "list", "upsert only; comma-separated"),
)


def schema() -> dict[str, Any]:
    from ...spec.fragments import COLUMN, connection

    return {
        "connection": connection("postgres"),
        "table": {
            "type": "string",
            "pattern": "^{0}(\\.{0})?$".format(IDENTIFIER_RE.pattern.strip("^$")),
        },
        "mode": {"enum": ["append", "upsert"]},
        "key": {"type": "array", "items": COLUMN, "uniqueItems": True},
    }


def schema_variants() -> dict[str, Any]:
    """Append takes no key columns; upsert needs them."""
    return {
        "append": {"mode": {"const": "append", "default": "append"}, "key": {"maxItems": 0}},
        "append_required": [],
        "upsert": {"mode": {"const": "upsert"}, "key": {"minItems": 1}},
        "upsert_required": ["mode", "key"],
    }
