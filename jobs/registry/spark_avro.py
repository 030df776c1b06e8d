"""The Avro schema Spark writes a value of a Spark type with, without Spark: a port of
`org.apache.spark.sql.avro.SchemaConverters.toAvroType` as pyspark 4.3.0 ships it (in
spark-sql, where `to_avro` and the Kafka sink's `format: avro` find it: jobs.sinks.kafka.client
`AvroValues.schema_of`), for the types the spec's DDL describes (jobs.spec.ddl), and the JSON
text Avro 1.12's `Schema.toString()` gives that schema (the text the sink registers).

Spark's rules, type by type: boolean; tinyint, smallint, int as `int`; bigint `long`; float;
double; string `string`; binary `bytes`; decimal(p,s) a `fixed` of Spark's
minBytesForPrecision(p) bytes with logicalType decimal, named `<namespace>.<recordName>.fixed`
(or `<recordName>.fixed` when the namespace is empty: the field's name is the record name);
date `int`/date; timestamp `long`/timestamp-micros; timestamp_ntz `long`/local-timestamp-micros;
time(p) `long`/time-micros; year-month and day-time intervals `int` and `long` with the
Catalyst type in the `spark.sql.catalyst.type` property; void `null`; array (items as the
element); map with string keys (values as the value); struct a record named by its field,
whose fields' types are named in the child namespace `<namespace>.<recordName>` (or
`<recordName>` when the namespace is empty); a nullable type a union `[type, "null"]` (void
stays `null`). Anything else (a map whose keys are not plain strings, a collated string, char,
varchar, variant, a calendar interval) Spark refuses with "Unexpected type": so does this, as
it does for a name Avro refuses (Avro 1.12's default validator: a letter or `_`, then letters,
digits or `_`; a type named after a primitive).

Pure: no Spark, no Django. tests/test_spark_avro_port.py compares it with Spark's own."""

from __future__ import annotations

import json
import math
import unicodedata
from dataclasses import dataclass
from typing import Any

from ..spec.ddl import (
    ArrayType,
    DataType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    simple_string,
)

DEFAULT_RECORD = "topLevelRecord"  # Spark's record name when none is given
CATALYST_TYPE_PROP = "spark.sql.catalyst.type"

# Avro's primitive type names, which no named type may have as its full name.
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
# Avro's Schema.Type names: a reference to a named type whose short name is one of them is
# written with its full name.
_TYPE_NAMES = frozenset({"record", "enum", "array", "map", "union", "fixed", *_PRIMITIVES})
_SIMPLE = {
    "boolean": "boolean",
    "tinyint": "int",
    "smallint": "int",
    "int": "int",
    "bigint": "long",
    "float": "float",
    "double": "double",
    "string": "string",
    "binary": "bytes",
}
_LOGICAL = {
    "date": ("int", "date"),
    "timestamp": ("long", "timestamp-micros"),
    "timestamp_ntz": ("long", "local-timestamp-micros"),
}
_YEAR_MONTH_UNITS = ("year", "month")
_DAY_TIME_UNITS = ("day", "hour", "minute", "second")
_LETTERS = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo"})


class NotWritable(ValueError):
    """Spark cannot write a value of this type as Avro (its toAvroType fails); `path` names
    the column (dotted, "[]" for an array's element, "{}" for a map's value)."""

    def __init__(self, path: str, why: str):
        self.path = path
        self.why = why
        super().__init__(f"column {path!r}: {why}" if path else why)


def to_avro_type(
    data_type: DataType,
    nullable: bool = False,
    record_name: str = DEFAULT_RECORD,
    namespace: str = "",
) -> Any:
    """The Avro schema (as parsed JSON, keys in Avro's order) Spark's
    `SchemaConverters.toAvroType(data_type, nullable, record_name, namespace)` gives, as its
    `toString()` writes it. Raises NotWritable where Spark's would fail."""
    return _render(_convert(data_type, nullable, record_name, namespace, ""), set(), None)


def to_json(schema: Any) -> str:
    """The schema's text as Avro's `Schema.toString()` writes it (compact JSON, its order)."""
    return json.dumps(schema, separators=(",", ":"), ensure_ascii=False)


def record_name(full_name: str | None) -> tuple[str, str]:
    """(record name, namespace) of a sink's `schema_registry.record` (None: Spark's default),
    split at its last dot, as the sink hands them to Spark."""
    namespace, _, short = (full_name or DEFAULT_RECORD).rpartition(".")
    return short, namespace


def as_nullable(data_type: DataType) -> DataType:
    """Spark's `DataType.asNullable`: every field nullable, at every depth (arrays' elements
    and maps' values may always be null in the DDL's types)."""
    if isinstance(data_type, StructType):
        return StructType(
            tuple(
                StructField(f.name, as_nullable(f.type), True, f.comment) for f in data_type.fields
            )
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(as_nullable(data_type.element))
    if isinstance(data_type, MapType):
        return MapType(as_nullable(data_type.key), as_nullable(data_type.value))
    return data_type


def min_bytes_for_precision(precision: int) -> int:
    """Spark's Decimal.minBytesForPrecision: the fewest bytes whose two's complement holds
    every unscaled value of `precision` digits (computed in doubles, as Spark does)."""
    num_bytes = 1
    while math.pow(2.0, 8 * num_bytes - 1) < math.pow(10.0, precision):
        num_bytes += 1
    return num_bytes


# -- Avro's schema objects, as SchemaBuilder makes them -------------------------------------


@dataclass(frozen=True)
class _Name:
    """Avro's Schema.Name: a full name split at its last dot (an empty space is none)."""

    name: str
    space: str | None

    @property
    def full(self) -> str:
        return f"{self.space}.{self.name}" if self.space else self.name


@dataclass
class _Primitive:
    type: str
    props: tuple[tuple[str, Any], ...] = ()


@dataclass
class _Fixed:
    name: _Name
    size: int
    props: tuple[tuple[str, Any], ...]


@dataclass
class _Record:
    name: _Name
    fields: list[tuple[str, Any]]


@dataclass
class _Array:
    items: Any


@dataclass
class _Map:
    values: Any


@dataclass
class _Union:
    types: tuple[Any, ...]


def _valid_name(name: str) -> str | None:
    """Why Avro 1.12's default name validator (UTF_VALIDATOR) refuses `name`, or None. Java
    reads UTF-16 units: a character beyond the BMP is two surrogates, neither a letter."""
    if not name:
        return "Empty name"
    for i, ch in enumerate(name):
        category = unicodedata.category(ch) if ord(ch) <= 0xFFFF else "Cs"
        letter = category in _LETTERS
        if i == 0 and not (letter or ch == "_"):
            return f"Illegal initial character: {name}"
        if i > 0 and not (letter or category == "Nd" or ch == "_"):
            return f"Illegal character in: {name}"
    return None


def _name(full: str, space: str | None, path: str) -> _Name:
    """Avro's `new Name(name, space)` for a named type (its short name validated), as
    SchemaBuilder makes it."""
    if "." in full:
        space, _, full = full.rpartition(".")
    why = _valid_name(full)
    if why is not None:
        raise NotWritable(path, f"Avro refuses the name {full!r} ({why})")
    made = _Name(full, space or None)
    if made.full in _PRIMITIVES:
        raise NotWritable(path, f"Avro types may not be named after primitives: {made.full}")
    return made


def _field_name(name: str, path: str) -> str:
    why = _valid_name(name)
    if why is not None:
        raise NotWritable(path, f"Avro refuses the field name {name!r} ({why})")
    return name


def _convert(t: DataType, nullable: bool, record: str, namespace: str, path: str) -> Any:
    """toAvroType's match, case by case, over the DDL's types."""
    schema: Any
    void = isinstance(t, PrimitiveType) and t.name == "void"
    if isinstance(t, PrimitiveType):
        schema = _primitive(t.name, record, namespace, path)
    elif isinstance(t, ArrayType):
        schema = _Array(_convert(t.element, True, record, namespace, f"{path}[]"))
    elif isinstance(t, MapType):
        if t.key != PrimitiveType("string"):
            raise NotWritable(
                path,
                f"Spark writes no Avro for a map whose keys are not strings"
                f" (Unexpected type map<{simple_string(t.key)},...>)",
            )
        schema = _Map(_convert(t.value, True, record, namespace, f"{path}{{}}"))
    else:
        child = f"{namespace}.{record}" if namespace != "" else record
        name = _name(record, namespace, path)
        fields = []
        for f in t.fields:
            where = f"{path}.{f.name}" if path else f.name
            inner = _convert(f.type, f.nullable, f.name, child, where)
            fields.append((_field_name(f.name, where), inner))
        schema = _Record(name, fields)
    if nullable and not void:
        return _Union((schema, _Primitive("null")))
    return schema


def _primitive(name: str, record: str, namespace: str, path: str) -> Any:
    if name in _SIMPLE:
        return _Primitive(_SIMPLE[name])
    if name == "void":
        return _Primitive("null")
    if name in _LOGICAL:
        avro, logical = _LOGICAL[name]
        return _Primitive(avro, (("logicalType", logical),))
    if name.startswith("decimal("):
        precision, scale = (int(x) for x in name[len("decimal(") : -1].split(","))
        full = f"{record}.fixed" if namespace == "" else f"{namespace}.{record}.fixed"
        return _Fixed(
            _name(full, None, path),
            min_bytes_for_precision(precision),
            (("logicalType", "decimal"), ("precision", precision), ("scale", scale)),
        )
    if name.startswith("time("):
        return _Primitive("long", (("logicalType", "time-micros"), (CATALYST_TYPE_PROP, name)))
    units = name.split()
    if len(units) in (2, 4) and units[0] == "interval":
        avro = "int" if units[1] in _YEAR_MONTH_UNITS else "long"
        if units[1] in _YEAR_MONTH_UNITS or units[1] in _DAY_TIME_UNITS:
            return _Primitive(avro, ((CATALYST_TYPE_PROP, name),))
    raise NotWritable(path, f"Spark writes no Avro for the type {name} (Unexpected type)")


# -- Avro 1.12's Schema.toJson -----------------------------------------------------------------


def _qualified(name: _Name, space: str | None) -> str:
    """Name.getQualified: the short name within its own namespace, unless it is a type's."""
    if name.space is not None and name.space == space and name.name not in _TYPE_NAMES:
        return name.name
    return name.full


def _write_name(out: dict, name: _Name, space: str | None) -> None:
    """Name.writeName: the short name, and the namespace where it is not the enclosing one."""
    out["name"] = name.name
    if name.space is not None:
        if name.space != space:
            out["namespace"] = name.space
    elif space is not None:
        out["namespace"] = ""


def _render(schema: Any, known: set[str], space: str | None) -> Any:
    if isinstance(schema, _Primitive):
        if not schema.props:
            return schema.type
        return {"type": schema.type, **dict(schema.props)}
    if isinstance(schema, _Union):
        return [_render(member, known, space) for member in schema.types]
    if isinstance(schema, _Array):
        return {"type": "array", "items": _render(schema.items, known, space)}
    if isinstance(schema, _Map):
        return {"type": "map", "values": _render(schema.values, known, space)}
    # A named type: a reference to it once it was written (Avro's knownNames).
    if schema.name.full in known:
        return _qualified(schema.name, space)
    known.add(schema.name.full)
    if isinstance(schema, _Fixed):
        out: dict[str, Any] = {"type": "fixed"}
        _write_name(out, schema.name, space)
        out["size"] = schema.size
        out.update(schema.props)
        return out
    out = {"type": "record"}
    _write_name(out, schema.name, space)
    out["fields"] = [
        {"name": name, "type": _render(inner, known, schema.name.space)}
        for name, inner in schema.fields
    ]
    return out
