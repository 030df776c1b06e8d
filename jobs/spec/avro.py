"""Avro source schemas: checked without a JVM (fastavro parses them as Avro's own rules say),
turned into the Spark DDL of the columns Spark's `from_avro` gives (the rules of Spark's
SchemaConverters.toSqlType), so that a transform's columns are checked as for JSON.

Bounded. An Avro schema is attacker-controlled like every spec field (docs/security.md), and
a small document can describe a huge type: a named record referred to twice by the next one,
forty levels on, is 2^40 fields once inlined, which is what Spark's SchemaConverters (and any
naive DDL derivation) does. So `check_schema` is the one way in: it measures the JSON text
first (size, then depth, without recursion), then walks the Avro types once, in document
order, keeping one entry per named type (its inlined field count, nesting height and DDL)
instead of inlining it, and refuses a schema past any limit below. The DDL is built in that
same walk, each part only once its count and length are known to be within bounds; fastavro
sees the schema only after that, and the pipeline's Spark job only sees a schema that passed.
The work is linear in the document (each JSON value visited at most once), whatever the
schema would expand to.

Plain Python: no Django, no PySpark.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

# Confluent's wire format: magic byte 0, a 4-byte schema id, then the Avro binary.
CONFLUENT_HEADER_BYTES = 5
FRAMINGS = ("none", "confluent")

# Limits. Generous for real schemas (a large Confluent schema has hundreds of fields, nests
# about 10 deep and is tens of kilobytes of JSON), small enough that checking a schema and
# deriving its DDL take milliseconds. Read at call time (tests lower them to explore).
#
# The schema's JSON text, in characters (its canonical form, as stored, and as given).
MAX_SCHEMA_CHARS = 500_000
# Records, arrays, maps and unions of several types inside each other, named types inlined.
# A union of null and one type does not count: Spark makes it a nullable column.
MAX_NESTING = 32
# JSON arrays and objects inside each other: a nullable record nested in another takes 4
# (field, union, record, fields), so 4 * MAX_NESTING, plus room for defaults and properties.
MAX_JSON_DEPTH = 4 * MAX_NESTING + 32
# Fields of the Spark schema, nested ones included, named types inlined (a union of several
# types is a struct with one field per member, so its members count as fields).
MAX_EXPANDED_FIELDS = 10_000
# Fields one record declares.
MAX_RECORD_FIELDS = 5_000
# Types in one union, symbols in one enum.
MAX_UNION_MEMBERS = 100
MAX_ENUM_SYMBOLS = 10_000
# The derived Spark DDL, named types inlined (it is stored in the spec as source.schema).
MAX_DDL_CHARS = 500_000


class AvroSchemaError(ValueError):
    """An Avro schema that Avro or Spark would refuse, or past a limit; str() says why."""


@dataclass(frozen=True)
class CheckedSchema:
    """An Avro record schema within the limits."""

    schema: dict[str, Any]  # the parsed JSON
    text: str  # canonical JSON (sorted keys, no spaces): what the spec stores
    struct: str  # Spark's type of a value, STRUCT<...> (not canonical: see avro_to_ddl)
    fields: int  # Spark fields, nested ones included, named types inlined
    depth: int  # nesting, named types inlined (MAX_NESTING)
    steps: int  # types and fields visited: the walk's work, at most the JSON's values


def check_schema(schema: Any) -> CheckedSchema:
    """The bounded check every Avro schema goes through before anything parses or expands
    it (JSON text or the parsed object); AvroSchemaError says what is wrong or too big."""
    parsed, text = _load(schema)
    if not isinstance(parsed, dict) or parsed.get("type") != "record":
        raise AvroSchemaError('must be an Avro record schema ({"type": "record", ...})')
    walk = _Walk()
    info = walk.type(parsed, "", 0)
    return CheckedSchema(parsed, text, info.ddl, info.fields, info.height, walk.steps)


def avro_to_ddl(schema: Any) -> tuple[str, str]:
    """(canonical schema JSON, Spark DDL of its columns) for an Avro schema given as JSON
    text or as the parsed object; AvroSchemaError says what is wrong."""
    checked = check_schema(schema)  # first: fastavro and the DDL parser get bounded input
    import fastavro
    from fastavro.schema import SchemaParseException, UnknownType

    try:
        fastavro.parse_schema(checked.schema)
    except UnknownType as exc:
        raise AvroSchemaError(f"is not a valid Avro schema: unknown type {exc.name!r}") from None
    except (SchemaParseException, ValueError, TypeError, KeyError, AttributeError) as exc:
        message = str(exc) if len(str(exc)) <= 300 else str(exc)[:297] + "..."  # may quote JSON
        raise AvroSchemaError(f"is not a valid Avro schema: {message}") from None
    from .ddl import DDLError, parse_schema, to_ddl

    try:
        ddl = to_ddl(parse_schema(checked.struct[len("STRUCT<") : -1]))
    except DDLError as exc:  # e.g. fields whose names differ only in case: one Spark column
        raise AvroSchemaError(f"its fields do not make Spark columns: {exc}") from None
    return checked.text, ddl


def _too_big(chars: int | None) -> AvroSchemaError:
    size = f"{chars:,}" if chars is not None else f"more than {MAX_SCHEMA_CHARS:,}"
    return AvroSchemaError(f"is {size} characters of JSON; at most {MAX_SCHEMA_CHARS:,} allowed")


def _too_deep_json() -> AvroSchemaError:
    return AvroSchemaError(
        f"nests its JSON more than {MAX_JSON_DEPTH} levels deep; at most {MAX_JSON_DEPTH} "
        f"allowed (Avro types nest at most {MAX_NESTING} levels: records, arrays, maps and "
        "unions inside each other)"
    )


def _load(schema: Any) -> tuple[Any, str]:
    """The parsed JSON and its canonical text, both within MAX_SCHEMA_CHARS and
    MAX_JSON_DEPTH: after this, recursive code (json.dumps, fastavro) is safe on it."""
    if isinstance(schema, str):
        if len(schema) > MAX_SCHEMA_CHARS:
            raise _too_big(len(schema))
        try:
            schema = json.loads(schema)
        except RecursionError:  # the C decoder's guard: far deeper than MAX_JSON_DEPTH
            raise _too_deep_json() from None
        except ValueError as exc:
            raise AvroSchemaError(f"is not JSON: {exc}") from None
    _json_bounds(schema)
    try:
        text = json.dumps(schema, separators=(",", ":"), sort_keys=True)
    except (TypeError, ValueError) as exc:  # only from Python callers: not JSON data
        raise AvroSchemaError(f"is not JSON: {exc}") from None
    if len(text) > MAX_SCHEMA_CHARS:  # \u escapes can make the canonical form longer
        raise _too_big(len(text))
    return schema, text


def _json_bounds(value: Any) -> None:
    """Refuses JSON nested deeper than MAX_JSON_DEPTH, or whose text would be longer than
    MAX_SCHEMA_CHARS (counting a lower bound of its length: the object form comes from a
    request body), without recursion, one container at a time."""
    size = 0
    stack = [(value, 1)] if isinstance(value, dict | list) else []
    while stack:
        container, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise _too_deep_json()
        size += 1 + len(container)  # brackets and separators
        if isinstance(container, dict):
            size += sum(len(key) + 2 for key in container if isinstance(key, str))
            container = container.values()
        for child in container:
            if isinstance(child, str):
                size += len(child) + 2
            elif isinstance(child, _CONTAINERS):
                stack.append((child, depth + 1))
            else:
                size += 1
        if size + len(stack) > MAX_SCHEMA_CHARS:  # each container left is 2 characters or more
            raise _too_big(None)


_CONTAINERS = (dict, list)


@dataclass(frozen=True)
class _Info:
    """A type as Spark sees it once named types are inlined, measured without inlining."""

    fields: int  # Spark fields inside it, nested ones included
    height: int  # levels of nesting, its own included (0 for a primitive)
    ddl: str  # its Spark type; len() <= MAX_DDL_CHARS


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
_LEAVES = {ddl: _Info(0, 0, ddl) for ddl in (*_PRIMITIVES.values(), *_LOGICAL.values())}
_NULL_ALONE = "a field of type null alone has no Spark type"


def _invalid(why: str) -> AvroSchemaError:
    return AvroSchemaError(f"is not a valid Avro schema: {why}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class _Walk:
    """One pass over the types in document order (Avro's names are defined before use).
    Recursion is bounded: every call that recurses into a type enters a level of nesting
    (checked against MAX_NESTING), but for a union of null and one type, which recurses
    into that one type (never a union: refused, as Avro refuses it)."""

    def __init__(self) -> None:
        # Full name -> its measure; None while its record is being walked (a reference to it
        # then is recursion, which Spark refuses).
        self.named: dict[str, _Info | None] = {}
        self.steps = 0

    def type(self, t: Any, namespace: str, level: int) -> _Info:
        self.steps += 1
        if isinstance(t, list):
            return self.union(t, namespace, level)
        if isinstance(t, str):
            return self.reference(t, namespace, level)
        if not isinstance(t, dict):
            raise _invalid(f"{_short(t)} is not a type")
        kind, logical = t.get("type"), t.get("logicalType")
        if not isinstance(kind, str):
            # Avro's rule ({"type": {...}} is not a type): it keeps the walk's recursion bounded.
            raise _invalid(f"{_short(t)}: a type object's \"type\" must be a type's name")
        if logical == "decimal" and kind in ("bytes", "fixed"):
            precision, scale = t.get("precision", 0), t.get("scale", 0)
            if not _is_int(precision) or not 1 <= precision <= 38:
                raise AvroSchemaError(f"decimal precision {_short(precision)}: Spark reads 1 to 38")
            if not _is_int(scale):
                raise _invalid(f"decimal scale {_short(scale)} is not a whole number")
            info = _Info(0, 0, f"DECIMAL({precision}, {scale})")
            if kind in _NAMED_TYPES:  # a fixed: its name can be referred to
                self.define(t, namespace, info)
            return info
        if (kind, logical) in _LOGICAL:
            return _LEAVES[_LOGICAL[(kind, logical)]]
        if kind in _PRIMITIVES:
            return _LEAVES[_PRIMITIVES[kind]]
        complex_type = _COMPLEX.get(kind)
        if complex_type is not None:
            return complex_type(self, t, namespace, level)
        return self.reference(kind, namespace, level)  # {"type": "SomeNamedType"}

    def enum(self, t: dict, namespace: str, level: int) -> _Info:
        symbols = t.get("symbols")
        if isinstance(symbols, list) and len(symbols) > MAX_ENUM_SYMBOLS:
            raise AvroSchemaError(
                f"enum {_short(t.get('name'))} has {len(symbols):,} symbols; at most "
                f"{MAX_ENUM_SYMBOLS:,} allowed"
            )
        self.define(t, namespace, _LEAVES["STRING"])
        return _LEAVES["STRING"]

    def fixed(self, t: dict, namespace: str, level: int) -> _Info:
        self.define(t, namespace, _LEAVES["BINARY"])
        return _LEAVES["BINARY"]

    def array(self, t: dict, namespace: str, level: int) -> _Info:
        return self.container(t, namespace, level, "items", "an array", "ARRAY<{}>")

    def map(self, t: dict, namespace: str, level: int) -> _Info:
        return self.container(t, namespace, level, "values", "a map", "MAP<STRING, {}>")

    def container(
        self, t: dict, namespace: str, level: int, key: str, what: str, ddl: str
    ) -> _Info:
        """An array's items or a map's values: one type inside, a level deeper."""
        if key not in t:
            raise _invalid(f'{what} needs "{key}"')
        inner = self.type(t[key], namespace, self.enter(level))
        self.bounded_length(len(inner.ddl) + len("MAP<STRING, >"))
        return _Info(inner.fields, inner.height + 1, ddl.format(inner.ddl))

    def reference(self, name: str, namespace: str, level: int) -> _Info:
        if name in _PRIMITIVES:
            return _LEAVES[_PRIMITIVES[name]]
        if name == "null":
            raise AvroSchemaError(_NULL_ALONE)
        # Avro's resolution (Java's Schema.Names.get): a dotted name is a full name; a simple
        # one is looked up in the enclosing namespace, then in the null namespace.
        candidates = [name]
        if "." not in name and namespace:
            candidates.insert(0, f"{namespace}.{name}")
        full = next((c for c in candidates if c in self.named), None)
        if full is None:
            raise _invalid(f"unknown type {_short(name)}")
        info = self.named[full]
        if info is None:
            raise AvroSchemaError(
                f"record {_short(name)} refers to itself: Spark cannot read recursive types"
            )
        if level + info.height > MAX_NESTING:
            raise _too_deep()
        return info

    def define(self, t: dict, namespace: str, info: _Info | None) -> tuple[str, str]:
        """Registers a named type: (its full name, the namespace of the types inside it)."""
        name = t.get("name")
        if not isinstance(name, str) or not name:
            raise _invalid(f'a {t.get("type")} needs a "name"')
        if "." in name:
            full, inner = name, name.rpartition(".")[0]
        else:
            # As Avro's Java parser: a namespace that is not a string (null) is inherited.
            space = t.get("namespace")
            inner = space if isinstance(space, str) else namespace
            full = f"{inner}.{name}" if inner else name
        if full in self.named:
            raise _invalid(f"redefined named type: {_short(full)}")
        self.named[full] = info
        return full, inner

    def record(self, t: dict, namespace: str, level: int) -> _Info:
        full, inner = self.define(t, namespace, None)
        depth = self.enter(level)
        fields = t.get("fields")
        if not isinstance(fields, list):
            raise _invalid(f'record {_short(full)} needs a list of "fields"')
        if len(fields) > MAX_RECORD_FIELDS:
            raise AvroSchemaError(
                f"record {_short(full)} declares {len(fields):,} fields; at most "
                f"{MAX_RECORD_FIELDS:,} allowed"
            )
        if not fields:
            raise AvroSchemaError(f"record {_short(full)} has no fields")
        members = []
        for field in fields:
            self.steps += 1
            if not isinstance(field, dict) or not isinstance(field.get("name"), str):
                raise _invalid(f'record {_short(full)}: each field needs a "name"')
            if "type" not in field:
                raise _invalid(
                    f'record {_short(full)}: field {_short(field["name"])} needs a "type"'
                )
            members.append((field["name"], self.type(field["type"], inner, depth)))
        info = self.struct(members)
        self.named[full] = info
        return info

    def union(self, t: list, namespace: str, level: int) -> _Info:
        if len(t) > MAX_UNION_MEMBERS:
            raise AvroSchemaError(
                f"a union of {len(t):,} types; at most {MAX_UNION_MEMBERS} allowed"
            )
        members = [m for m in t if m != "null"]
        if any(isinstance(m, list) for m in members):
            raise _invalid("a union cannot hold a union directly")
        if len(members) == 1:
            return self.type(members[0], namespace, level)
        if not members:
            raise AvroSchemaError("a union of null alone has no Spark type")
        # Spark: a union of several types is a struct with one field per member.
        depth = self.enter(level)
        return self.struct(
            [(f"member{i}", self.type(m, namespace, depth)) for i, m in enumerate(members)],
            quote=False,
        )

    def struct(self, members: list[tuple[str, _Info]], *, quote: bool = True) -> _Info:
        """STRUCT<...> of the members, counted and measured before its text is built."""
        fields = height = 0
        length = len("STRUCT<>") + 2 * (len(members) - 1)
        for name, info in members:
            fields += 1 + info.fields
            if fields > MAX_EXPANDED_FIELDS:
                raise AvroSchemaError(
                    f"expands to more than {MAX_EXPANDED_FIELDS:,} fields once named types "
                    f"are inlined (Spark's columns, nested ones included); at most "
                    f"{MAX_EXPANDED_FIELDS:,} allowed"
                )
            height = max(height, info.height)
            length += len(name) + len(": ") + 2 * quote + len(info.ddl)
        self.bounded_length(length)
        q = "`" if quote else ""
        ddl = ", ".join(f"{q}{name}{q}: {info.ddl}" for name, info in members)
        return _Info(fields, height + 1, f"STRUCT<{ddl}>")

    def enter(self, level: int) -> int:
        if level + 1 > MAX_NESTING:
            raise _too_deep()
        return level + 1

    @staticmethod
    def bounded_length(length: int) -> None:
        if length > MAX_DDL_CHARS:
            raise AvroSchemaError(
                f"gives a Spark schema (DDL) of more than {MAX_DDL_CHARS:,} characters once "
                f"named types are inlined; at most {MAX_DDL_CHARS:,} allowed"
            )


def _too_deep() -> AvroSchemaError:
    return AvroSchemaError(
        f"nests more than {MAX_NESTING} levels deep (records, arrays, maps and unions inside "
        f"each other, named types inlined); at most {MAX_NESTING} allowed"
    )


def _short(value: Any) -> str:
    """A value for a message: bounded, whatever its size (it is already bounded JSON)."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Avro's complex types, by their "type": how the walk reads each.
_COMPLEX = {
    "record": _Walk.record,
    "enum": _Walk.enum,
    "fixed": _Walk.fixed,
    "array": _Walk.array,
    "map": _Walk.map,
}
_NAMED_TYPES = frozenset({"record", "enum", "fixed"})  # types with a name others refer to
