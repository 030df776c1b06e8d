"""Avro source schemas: checked without a JVM (fastavro parses them as Avro's own rules say),
turned into the Spark DDL of the columns Spark's `from_avro` gives (the rules of Spark's
SchemaConverters.toSqlType), so that a transform's columns are checked as for JSON.

Plain Python: no Django, no PySpark.
"""

from __future__ import annotations

import json
from typing import Any

# Confluent's wire format: magic byte 0, a 4-byte schema id, then the Avro binary.
CONFLUENT_HEADER_BYTES = 5
FRAMINGS = ("none", "confluent")


class AvroSchemaError(ValueError):
    """An Avro schema that Avro or Spark would refuse; str() says why, for the user."""


def avro_to_ddl(schema: Any) -> tuple[str, str]:
    """(canonical schema JSON, Spark DDL of its columns) for an Avro schema given as JSON
    text or as the parsed object; AvroSchemaError says what is wrong."""
    import fastavro
    from fastavro.schema import SchemaParseException, UnknownType

    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError as exc:
            raise AvroSchemaError(f"is not JSON: {exc}") from None
    if not isinstance(schema, dict) or schema.get("type") != "record":
        raise AvroSchemaError('must be an Avro record schema ({"type": "record", ...})')
    try:
        fastavro.parse_schema(schema)
    except UnknownType as exc:
        raise AvroSchemaError(f"is not a valid Avro schema: unknown type {exc.name!r}") from None
    except (SchemaParseException, ValueError, TypeError, KeyError) as exc:
        raise AvroSchemaError(f"is not a valid Avro schema: {exc}") from None
    from .ddl import parse_schema, to_ddl

    struct = _struct(schema, {}, ())
    text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
    return text, to_ddl(parse_schema(struct[len("STRUCT<") : -1]))


def _named(schema: dict, namespace: str) -> str:
    name = schema["name"]
    if "." in name:
        return name
    ns = schema.get("namespace", namespace)
    return f"{ns}.{name}" if ns else name


def _struct(schema: dict, named: dict[str, Any], path: tuple[str, ...]) -> str:
    full = _named(schema, "")
    if full in path:
        raise AvroSchemaError(
            f"record {full!r} refers to itself: Spark cannot read recursive types"
        )
    named[full] = schema
    fields = []
    for field in schema.get("fields", []):
        name = field["name"]
        fields.append(f"`{name}`: {_type(field['type'], named, (*path, full))}")
    if not fields:
        raise AvroSchemaError(f"record {full!r} has no fields")
    return f"STRUCT<{', '.join(fields)}>"


_PRIMITIVES = {
    "boolean": "BOOLEAN",
    "int": "INT",
    "long": "BIGINT",
    "float": "FLOAT",
    "double": "DOUBLE",
    "bytes": "BINARY",
    "string": "STRING",
}
_LOGICAL = {
    ("int", "date"): "DATE",
    ("long", "timestamp-millis"): "TIMESTAMP",
    ("long", "timestamp-micros"): "TIMESTAMP",
    ("long", "local-timestamp-millis"): "TIMESTAMP_NTZ",
    ("long", "local-timestamp-micros"): "TIMESTAMP_NTZ",
}


def _type(t: Any, named: dict[str, Any], path: tuple[str, ...]) -> str:
    if isinstance(t, list):
        members = [m for m in t if m != "null"]
        if len(members) == 1:
            return _type(members[0], named, path)
        if not members:
            raise AvroSchemaError("a union of null alone has no Spark type")
        # Spark: a union of several types is a struct with one field per member.
        return "STRUCT<{}>".format(
            ", ".join(f"member{i}: {_type(m, named, path)}" for i, m in enumerate(members))
        )
    if isinstance(t, str):
        if t in _PRIMITIVES:
            return _PRIMITIVES[t]
        if t == "null":
            raise AvroSchemaError("a field of type null alone has no Spark type")
        found = named.get(t) or next((s for n, s in named.items() if n.endswith("." + t)), None)
        if found is None:
            raise AvroSchemaError(f"unknown type {t!r}")
        if found["type"] == "record" and _named(found, "") in path:
            raise AvroSchemaError(
                f"record {t!r} refers to itself: Spark cannot read recursive types"
            )
        return _type(found, named, path)
    kind = t.get("type")
    logical = t.get("logicalType")
    if logical == "decimal" and kind in ("bytes", "fixed"):
        if kind == "fixed":
            named[_named(t, "")] = t
        precision, scale = int(t.get("precision", 0)), int(t.get("scale", 0))
        if not 1 <= precision <= 38:
            raise AvroSchemaError(f"decimal precision {precision}: Spark reads 1 to 38")
        return f"DECIMAL({precision}, {scale})"
    if (kind, logical) in _LOGICAL:
        return _LOGICAL[(kind, logical)]
    if kind in _PRIMITIVES:
        return _PRIMITIVES[kind]
    if kind == "record":
        return _struct(t, named, path)
    if kind == "enum":
        named[_named(t, "")] = t
        return "STRING"
    if kind == "fixed":
        named[_named(t, "")] = t
        return "BINARY"
    if kind == "array":
        return f"ARRAY<{_type(t['items'], named, path)}>"
    if kind == "map":
        return f"MAP<STRING, {_type(t['values'], named, path)}>"
    return _type(kind, named, path)
