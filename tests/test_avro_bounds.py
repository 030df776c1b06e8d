"""Avro schemas are bounded (issue #31): a schema that expands exponentially through named
types, nests deeply, declares absurd numbers of fields, symbols or union members, or is simply
huge, is a 400 naming `spec.source.avro_schema` with the limit in words, after work linear in
the document (never in what it would expand to). Pure checks of jobs/spec/avro.py, a fuzz of
it (hypothesis, with a model of what each generated schema expands to), then the API and the
form as an untrusted editor."""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pytest
from django.test import Client
from django.urls import reverse
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from controlplane.accounts.roles import set_role
from controlplane.definitions.models import Pipeline
from jobs.spec import avro
from jobs.spec.avro import AvroSchemaError, avro_to_ddl, check_schema
from jobs.spec.ddl import parse_schema, to_ddl
from tests.factories import valid_spec
from tests.test_editing import field_errors, new_pipeline_post

# -- schemas ------------------------------------------------------------------------------------


def record(name: str, *types: Any) -> dict:
    return {
        "type": "record",
        "name": name,
        "fields": [{"name": f"f{i}", "type": t} for i, t in enumerate(types)],
    }


def doubling(levels: int) -> dict:
    """T0 is one int; each next T refers to the one before twice: 2^levels ints inlined."""
    fields = [{"name": "t0", "type": record("T0", "int")}]
    for i in range(1, levels + 1):
        fields.append({"name": f"t{i}", "type": record(f"T{i}", f"T{i - 1}", f"T{i - 1}")})
    return {"type": "record", "name": "Top", "fields": fields}


def nested(levels: int, kind: str = "record") -> dict:
    """`levels` records (or arrays / maps in a record) inside each other, built without
    recursion (json.dumps cannot write the deepest ones)."""
    t: Any = "int"
    for i in range(levels - 1):
        if kind == "record":
            t = record(f"R{i}", t)
        else:
            t = {"type": kind, "items" if kind == "array" else "values": t}
    return record("Top", t)


def nested_text(levels: int) -> str:
    return (
        '{"type":"record","name":"R","fields":[{"name":"f","type":' * levels
        + '"int"'
        + ("}]}" * levels)
    )


def chained(levels: int) -> dict:
    """Flat as written (each C refers to the one before, defined beside it), but nesting
    `levels` deep once inlined."""
    fields = [{"name": "c0", "type": record("C0", "int")}]
    fields += [{"name": f"c{i}", "type": record(f"C{i}", f"C{i - 1}")} for i in range(1, levels)]
    return {"type": "record", "name": "Top", "fields": fields}


def wide(n: int) -> dict:
    return record("Wide", *["int"] * n)


def realistic() -> dict:
    """A large schema as a schema registry holds them: hundreds of fields, named types reused
    (an address six times), optional records nested ten deep, enums, decimals, timestamps,
    arrays of records, maps, docs and defaults."""
    address = record("Address", *["string"] * 12)
    money = {"type": "bytes", "logicalType": "decimal", "precision": 18, "scale": 2}
    line = {
        "type": "record",
        "name": "Line",
        "fields": [
            {"name": "sku", "type": "string", "doc": "stock keeping unit"},
            {"name": "qty", "type": "int"},
            {"name": "price", "type": money},
            {"name": "attrs", "type": {"type": "map", "values": "string"}},
        ],
    }
    deep: Any = {"type": "enum", "name": "Level", "symbols": [f"L{i}" for i in range(300)]}
    for i in range(10):
        deep = ["null", record(f"Nest{i}", deep, "long")]
    fields = [
        {"name": "billing", "type": address},
        *[{"name": f"addr{i}", "type": ["null", "Address"], "default": None} for i in range(5)],
        {"name": "lines", "type": {"type": "array", "items": line}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "nest", "type": deep, "default": None},
        *[{"name": f"x{i}", "type": ["null", "string"], "default": None} for i in range(300)],
    ]
    return {"type": "record", "name": "Order", "namespace": "com.example", "fields": fields}


def json_values(value: Any) -> int:
    """Every value of a JSON document, counted without recursion."""
    count, stack = 0, [value]
    while stack:
        value = stack.pop()
        count += 1
        if isinstance(value, dict):
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return count


def json_depth(value: Any) -> int:
    deepest, stack = 0, [(value, 0)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            deepest = max(deepest, depth + 1)
            items = value.values() if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)
    return deepest


def measured(schema: Any) -> tuple[tuple[str, str] | AvroSchemaError, int]:
    """avro_to_ddl's answer, and how many types and fields its walk visited (its work)."""
    walks = []

    class Counting(avro._Walk):
        def __init__(self) -> None:
            super().__init__()
            walks.append(self)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(avro, "_Walk", Counting)
        try:
            answer: Any = avro_to_ddl(schema)
        except AvroSchemaError as exc:
            answer = exc
    return answer, sum(w.steps for w in walks)


# -- pure: each limit ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schema", "words"),
    [
        (doubling(40), "expands to more than 10,000 fields once named types are inlined"),
        (json.dumps(doubling(40)), "expands to more than 10,000 fields"),
        (doubling(1000), "expands to more than 10,000 fields"),
        (nested(33), "nests more than 32 levels deep"),
        (nested(33, "array"), "nests more than 32 levels deep"),
        (nested(33, "map"), "nests more than 32 levels deep"),
        (chained(1000), "nests more than 32 levels deep"),
        (nested(300), "nests its JSON more than 160 levels deep"),
        (nested(100_000), "nests its JSON more than 160 levels deep"),
        (nested_text(1000), "nests its JSON more than 160 levels deep"),
        (nested_text(100_000), "characters of JSON; at most 500,000 allowed"),
        (wide(5001), "record 'Wide' declares 5,001 fields; at most 5,000 allowed"),
        (wide(100_000), "is more than 500,000 characters of JSON; at most 500,000 allowed"),
        (json.dumps(wide(100_000)), "characters of JSON; at most 500,000 allowed"),
        (
            record(
                "E", {"type": "enum", "name": "Big", "symbols": [f"S{i}" for i in range(10_001)]}
            ),
            "enum 'Big' has 10,001 symbols; at most 10,000 allowed",
        ),
        (
            record("U", [record(f"M{i}", "int") for i in range(101)]),
            "a union of 101 types; at most 100 allowed",
        ),
        (
            # 1,500 fields of 250-character names, inlined twice: within the field limits,
            # but not a DDL anyone would store.
            {
                "type": "record",
                "name": "Top",
                "fields": [
                    {"name": "a", "type": record("L", *["int"] * 1)},
                    {
                        "name": "b",
                        "type": {
                            "type": "record",
                            "name": "Long",
                            "fields": [
                                {"name": f"n{i:04}" + "x" * 250, "type": "int"} for i in range(1500)
                            ],
                        },
                    },
                    {"name": "c", "type": "Long"},
                ],
            },
            "gives a Spark schema (DDL) of more than 500,000 characters",
        ),
    ],
    ids=[
        "2^40-fields",
        "2^40-fields-text",
        "2^1000-fields",
        "33-records-deep",
        "33-arrays-deep",
        "33-maps-deep",
        "1000-deep-once-inlined",
        "300-deep",
        "100000-deep",
        "1000-deep-text",
        "100000-deep-text",
        "5001-fields",
        "100000-fields",
        "100000-fields-text",
        "huge-enum",
        "huge-union",
        "huge-ddl",
    ],
)
def test_a_schema_past_a_limit_is_refused_saying_the_limit_after_linear_work(schema, words):
    answer, steps = measured(schema)
    assert isinstance(answer, AvroSchemaError), answer
    assert words in str(answer)
    assert "at most" in str(answer)
    parsed = schema
    if isinstance(schema, str):
        try:
            parsed = json.loads(schema)
        except RecursionError:  # too deep for Python's own parser too: nothing to count
            return
    if json_depth(parsed) < 500:
        assert steps <= json_values(parsed)  # never the expanded form's size


def test_real_schemas_and_the_limits_themselves_are_accepted():
    text, ddl = avro_to_ddl(realistic())
    checked = check_schema(text)
    assert checked.fields == 405 and checked.depth == 11
    assert "`billing` STRUCT<" in ddl and "`price`: DECIMAL(18,2)" in ddl
    assert ddl.count("`f11`: STRING") >= 5  # the address, inlined where it is used
    # T0 is 1 field, each next T 2 * (1 + the one before): Ti is 3 * 2^i - 2 fields; Top's
    # field of each adds 1.
    doubled = sum(1 + 3 * 2**i - 2 for i in range(11))
    for schema, fields, depth in [
        (nested(32), 32, 32),
        (nested(32, "array"), 1, 32),
        (wide(5000), 5000, 1),
        (doubling(10), doubled, 12),
        (chained(31), sum(1 + (i + 1) for i in range(31)), 32),  # Ci: i + 1 fields, i + 1 deep
    ]:
        checked = check_schema(schema)
        assert (checked.fields, checked.depth) == (fields, depth)
        avro_to_ddl(schema)


def test_named_types_resolve_as_avro_resolves_them():
    inner = {
        "type": "record",
        "name": "R",
        "namespace": "a",
        "fields": [{"name": "x", "type": "int"}],
    }
    other = {
        "type": "record",
        "name": "R",
        "namespace": "b",
        "fields": [{"name": "y", "type": "string"}],
    }
    schema = {
        "type": "record",
        "name": "Top",
        "namespace": "b",
        "fields": [
            {"name": "p", "type": inner},
            {"name": "q", "type": other},
            {"name": "r", "type": "R"},  # b.R: the enclosing namespace first
            {"name": "s", "type": "a.R"},
        ],
    }
    _, ddl = avro_to_ddl(schema)
    assert ddl == (
        "`p` STRUCT<`x`: INT>, `q` STRUCT<`y`: STRING>, `r` STRUCT<`y`: STRING>, "
        "`s` STRUCT<`x`: INT>"
    )
    refusals = {
        "redefined named type": record("Top", record("A", "int"), record("A", "long")),
        "refers to itself": record("Top", record("A", ["null", "A"])),
        "unknown type 'Later'": record("Top", "Later", record("Later", "int")),
        "a union cannot hold a union directly": record("Top", ["int", ["string", "long"]]),
        "a type object's \"type\" must be a type's name": record("Top", {"type": {"type": "int"}}),
    }
    for words, schema in refusals.items():
        with pytest.raises(AvroSchemaError) as caught:
            avro_to_ddl(schema)
        assert words in str(caught.value)


# -- fuzz: a model of what each generated schema expands to --------------------------------------


@dataclass(frozen=True)
class Limits:
    chars: int = avro.MAX_SCHEMA_CHARS
    json_depth: int = avro.MAX_JSON_DEPTH
    nesting: int = avro.MAX_NESTING
    fields: int = avro.MAX_EXPANDED_FIELDS
    record_fields: int = avro.MAX_RECORD_FIELDS
    union: int = avro.MAX_UNION_MEMBERS
    enum: int = avro.MAX_ENUM_SYMBOLS
    ddl: int = avro.MAX_DDL_CHARS

    def applied(self, patch: pytest.MonkeyPatch) -> None:
        for name, value in {
            "MAX_SCHEMA_CHARS": self.chars,
            "MAX_JSON_DEPTH": self.json_depth,
            "MAX_NESTING": self.nesting,
            "MAX_EXPANDED_FIELDS": self.fields,
            "MAX_RECORD_FIELDS": self.record_fields,
            "MAX_UNION_MEMBERS": self.union,
            "MAX_ENUM_SYMBOLS": self.enum,
            "MAX_DDL_CHARS": self.ddl,
        }.items():
            patch.setattr(avro, name, value)


REAL = Limits()
# Small enough that random schemas of a few dozen types cross each of them.
SMALL = Limits(
    chars=4000, json_depth=40, nesting=8, fields=60, record_fields=6, union=4, enum=5, ddl=700
)
# What each refusal says (statistics: pytest --hypothesis-show-statistics).
REFUSALS = [
    "characters of JSON",
    "nests its JSON",
    "nests more than",
    "expands to more than",
    "fields; at most",
    "symbols; at most",
    "types; at most",
    "Spark schema (DDL)",
]


@dataclass(frozen=True)
class Model:
    """What a type is once inlined, per Spark's rules, tracked while it is generated."""

    fields: int
    height: int


@dataclass
class Generator:
    """Avro schemas in document order, named types defined before use and reused often, with
    their model; `widest` are the largest record, union and enum written."""

    draw: Any
    named: dict[str, Model] = field(default_factory=dict)
    count: int = 0
    widest: dict[str, int] = field(default_factory=lambda: {"record": 0, "union": 0, "enum": 0})

    def name(self) -> str:
        self.count += 1
        return f"T{self.count}"

    def wrote(self, kind: str, size: int) -> None:
        self.widest[kind] = max(self.widest[kind], size)

    def record(self, types: list[tuple[Any, Model]]) -> tuple[dict, Model]:
        name = self.name()
        self.wrote("record", len(types))
        model = Model(
            sum(1 + m.fields for _, m in types), 1 + max((m.height for _, m in types), default=0)
        )
        self.named[name] = model  # defined once its fields are: they may not refer to it
        return {
            "type": "record",
            "name": name,
            "fields": [{"name": f"f{i}", "type": t} for i, (t, _) in enumerate(types)],
        }, model

    def leaf(self) -> tuple[Any, Model]:
        kind = self.draw(st.sampled_from(["primitive", "logical", "decimal", "enum", "fixed"]))
        if kind == "primitive":
            t = self.draw(st.sampled_from(["int", "long", "string", "boolean", "double", "bytes"]))
            return self.draw(st.sampled_from([t, {"type": t}])), Model(0, 0)
        if kind == "logical":
            return {"type": "long", "logicalType": "timestamp-micros"}, Model(0, 0)
        if kind == "decimal":
            return {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2}, Model(
                0, 0
            )
        if kind == "enum":
            n = self.draw(st.integers(1, 8))
            self.wrote("enum", n)
            name = self.name()
            self.named[name] = Model(0, 0)
            return {"type": "enum", "name": name, "symbols": [f"S{i}" for i in range(n)]}, Model(
                0, 0
            )
        name = self.name()
        self.named[name] = Model(0, 0)
        return {"type": "fixed", "name": name, "size": 4}, Model(0, 0)

    def type(self, budget: int, union: bool = True) -> tuple[Any, Model]:
        kinds = ["leaf"] + ["reference"] * 3 * bool(self.named)
        if budget > 0:
            kinds += ["record", "record", "array", "map"] + ["nullable", "union"] * union
        kind = self.draw(st.sampled_from(kinds))
        if kind == "leaf":
            return self.leaf()
        if kind == "reference":
            name = self.draw(st.sampled_from(sorted(self.named)))
            return name, self.named[name]  # ({"type": name}: Avro's, but fastavro refuses it)
        if kind == "record":
            n = self.draw(st.integers(1, 5))
            return self.record([self.type(budget - 1) for _ in range(n)])
        if kind in ("array", "map"):
            t, m = self.type(budget - 1)
            return {"type": kind, "items" if kind == "array" else "values": t}, Model(
                m.fields, m.height + 1
            )
        if kind == "nullable":
            t, m = self.type(budget, union=False)
            self.wrote("union", 2)
            return self.draw(st.sampled_from([["null", t], [t, "null"]])), m
        # Several types: distinct primitives, and a record (Avro: one of each kind at most).
        primitives = self.draw(
            st.lists(
                st.sampled_from(["int", "string", "boolean", "double"]),
                unique=True,
                min_size=1,
                max_size=3,
            )
        )
        members: list[tuple[Any, Model]] = [(p, Model(0, 0)) for p in primitives]
        if len(members) < 2 or self.draw(st.booleans()):
            members.append(self.record([self.type(budget - 1) for _ in range(2)]))
        if self.draw(st.booleans()):
            members.insert(0, ("null", None))
        self.wrote("union", len(members))
        typed = [m for _, m in members if m is not None]
        return [t for t, _ in members], Model(
            sum(1 + m.fields for m in typed), 1 + max(m.height for m in typed)
        )

    def doubling(self, levels: int, fan: int) -> tuple[Any, Model]:
        """Named records each referring `fan` times to the one before."""
        fields = [self.record([(("int"), Model(0, 0))])]
        for _ in range(levels):
            before = fields[-1][0]["name"]
            fields.append(self.record([(before, self.named[before])] * fan))
        return self.record(fields)

    def deep(self, kinds: list[str]) -> tuple[Any, Model]:
        """Types inside each other, built from the inside out (no recursion)."""
        t, m = self.leaf()
        for kind in kinds:
            if kind == "record":
                t, m = self.record([(t, m)])
            elif kind in ("array", "map"):
                t, m = (
                    {"type": kind, "items" if kind == "array" else "values": t},
                    Model(m.fields, m.height + 1),
                )
            elif kind == "nullable" and not isinstance(t, list):
                self.wrote("union", 2)
                t = ["null", t]
            elif not isinstance(t, list):  # union of two: never a union inside a union
                self.wrote("union", 2)
                t, m = ["int", t], Model(2 + m.fields, m.height + 1)
        return t, m


KINDS = ["record", "array", "map", "nullable", "union"]


@st.composite
def generated(draw, limits: Limits) -> tuple[dict, Generator, Model]:
    g = Generator(draw)
    parts = []
    small = limits == SMALL
    for _ in range(draw(st.integers(1, 4))):
        shape = draw(st.sampled_from(["random", "random", "doubling", "deep", "wide", "enum"]))
        if shape == "random":
            parts.append(g.type(draw(st.integers(0, 6 if small else 4))))
        elif shape == "doubling":
            parts.append(
                g.doubling(draw(st.integers(0, 10 if small else 45)), draw(st.integers(1, 3)))
            )
        elif shape == "deep":
            n = draw(st.integers(1, 12) if small else st.sampled_from([5, 30, 31, 32, 33, 40, 400]))
            parts.append(g.deep(draw(st.lists(st.sampled_from(KINDS), min_size=n, max_size=n))))
        elif shape == "wide":
            n = draw(st.integers(1, 9) if small else st.sampled_from([1, 50, 4999, 5001]))
            parts.append(g.record([("int", Model(0, 0))] * n))
        else:
            n = draw(st.integers(1, 9) if small else st.sampled_from([3, 10_000, 10_001]))
            g.wrote("enum", n)
            name = g.name()
            g.named[name] = Model(0, 0)
            parts.append(
                (
                    {"type": "enum", "name": name, "symbols": [f"S{i}" for i in range(n)]},
                    Model(0, 0),
                )
            )
    top, model = g.record(parts)
    return top, g, model


def naive_struct(schema: dict) -> str:
    """Spark's type of a value by inlining every named type: the derivation before the
    bounds (unbounded: only for schemas the model says are small)."""
    named: dict[str, Any] = {}

    def of(t: Any) -> str:
        if isinstance(t, list):
            members = [m for m in t if m != "null"]
            if len(members) == 1:
                return of(members[0])
            return "STRUCT<{}>".format(
                ", ".join(f"member{i}: {of(m)}" for i, m in enumerate(members))
            )
        if isinstance(t, str):
            return {
                "int": "INT",
                "long": "BIGINT",
                "string": "STRING",
                "boolean": "BOOLEAN",
                "double": "DOUBLE",
                "bytes": "BINARY",
            }.get(t) or of(named[t])
        kind = t["type"]
        if kind == "record":
            named[t["name"]] = t
            return "STRUCT<{}>".format(
                ", ".join(f"`{f['name']}`: {of(f['type'])}" for f in t["fields"])
            )
        if kind in ("enum", "fixed"):
            named[t["name"]] = t
            return "STRING" if kind == "enum" else "BINARY"
        if t.get("logicalType") == "decimal":
            return f"DECIMAL({t['precision']}, {t['scale']})"
        if t.get("logicalType") == "timestamp-micros":
            return "TIMESTAMP"
        if kind == "array":
            return f"ARRAY<{of(t['items'])}>"
        if kind == "map":
            return f"MAP<STRING, {of(t['values'])}>"
        return of(kind)

    return of(schema)


def check_against_the_model(schema: dict, g: Generator, model: Model, limits: Limits, text: bool):
    depth = json_depth(schema)
    given_form: Any = schema
    canonical = None
    if depth < 500:
        canonical = json.dumps(schema, separators=(",", ":"), sort_keys=True)
        if text:
            given_form = json.dumps(schema)
    within = (
        depth <= limits.json_depth
        and canonical is not None
        and len(canonical) <= limits.chars
        and (not text or len(given_form) <= limits.chars)
        and model.height <= limits.nesting
        and model.fields <= limits.fields
        and g.widest["record"] <= limits.record_fields
        and g.widest["union"] <= limits.union
        and g.widest["enum"] <= limits.enum
    )
    naive = naive_struct(schema) if within else None
    within = within and len(naive) <= limits.ddl
    with pytest.MonkeyPatch.context() as patch:
        limits.applied(patch)
        answer, steps = measured(given_form)
        assert steps <= json_values(schema)  # linear in the document, whatever it expands to
        event("refused" if isinstance(answer, AvroSchemaError) else "accepted")
        if isinstance(answer, AvroSchemaError):
            event(f"refused: {next(w for w in REFUSALS if w in str(answer))}")
        if not within:
            assert isinstance(answer, AvroSchemaError), (model, g.widest)
            assert "at most" in str(answer), answer
            return
        assert not isinstance(answer, AvroSchemaError), (answer, model, g.widest)
        checked = check_schema(given_form)
    assert (checked.fields, checked.depth) == (model.fields, model.height)
    text_out, ddl = answer
    assert json.loads(text_out) == schema
    fastavro.parse_schema(json.loads(text_out))
    assert ddl == to_ddl(parse_schema(naive[len("STRUCT<") : -1]))  # as inlining every type


FUZZ = settings(
    max_examples=100,
    deadline=None,
    derandomize=True,  # the same schemas every run: the suite must not turn red at random
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@FUZZ
@given(generated(REAL), st.booleans())
def test_fuzz_generated_schemas_against_the_real_limits(case, text):
    schema, g, model = case
    check_against_the_model(schema, g, model, REAL, text)


@FUZZ
@given(generated(SMALL), st.booleans())
def test_fuzz_generated_schemas_against_small_limits(case, text):
    """The same walk with limits small enough that random schemas cross every one."""
    schema, g, model = case
    check_against_the_model(schema, g, model, SMALL, text)


JUNK = [
    5,
    None,
    True,
    "Nope",
    "null",
    [],
    {},
    ["null"],
    [["int"]],
    {"type": {"type": "int"}},
    {"type": "record", "name": "X"},
    {"type": "record", "fields": []},
    {"type": "record", "name": "T1", "fields": [{"name": "a", "type": "int"}]},
    {"type": "array"},
    {"type": "enum", "name": "E", "symbols": 7},
    {"type": "bytes", "logicalType": "decimal", "precision": "10"},
    {"type": "bytes", "logicalType": "decimal", "precision": 99},
    {"type": "fixed", "name": "F"},
    {"name": "f", "type": "int"},
    [{"name": 5, "type": "int"}],
    "T9999",
]


@settings(
    max_examples=300,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(generated(SMALL), st.data())
def test_fuzz_broken_schemas_are_refused_with_our_error_only(case, data):
    """Generated schemas with a value swapped for junk (forward references, redefinitions,
    malformed types, wrong JSON types): refused with AvroSchemaError, or accepted and then
    fastavro parses them and their DDL is Spark DDL. Never another exception."""
    schema, _, _ = case
    slots = []
    stack: list[Any] = [schema]
    while stack:
        value = stack.pop()
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            slots.append((value, key))
            if isinstance(item, dict | list):
                stack.append(item)
    for _ in range(data.draw(st.integers(1, 3))):
        parent, key = data.draw(st.sampled_from(slots))
        parent[key] = copy.deepcopy(data.draw(st.sampled_from(JUNK)))
    answer, steps = measured(schema)  # the real limits: most junk is then what refuses it
    assert steps <= json_values(schema)
    event("refused" if isinstance(answer, AvroSchemaError) else "accepted")
    if not isinstance(answer, AvroSchemaError):
        text, ddl = answer
        fastavro.parse_schema(json.loads(text))
        parse_schema(ddl)


# -- through the API and the form, as an editor -----------------------------------------------

REFUSED = {
    "2^40-fields": (doubling(40), "expands to more than 10,000 fields"),
    "2^40-fields-text": (json.dumps(doubling(40)), "expands to more than 10,000 fields"),
    "1000-deep-text": (nested_text(1000), "nests its JSON more than 160 levels deep"),
    # 100,100 fields: a record of 1,000 used 100 times (written out, 100,000 fields are a
    # body larger than Django takes: DATA_UPLOAD_MAX_MEMORY_SIZE, 2.5 MB).
    "100000-fields": (
        record("Top", wide(1000), *["Wide"] * 99),
        "expands to more than 10,000 fields",
    ),
    "5001-fields": (wide(5001), "declares 5,001 fields; at most 5,000 allowed"),
    "40-deep": (nested(40), "nests more than 32 levels deep"),
}


@pytest.mark.parametrize("name", REFUSED)
def test_the_api_refuses_an_unbounded_schema_naming_the_field(
    api, kafka_connection, postgres_connection, name
):
    schema, words = REFUSED[name]
    source = {"connection": "events", "topics": ["orders"], "format": "avro", "avro_schema": schema}
    spec = valid_spec(source=source, transform=None)
    response = api.post("/api/pipelines/", {"name": "bounded", "spec": spec}, format="json")
    assert response.status_code == 400, response.content[:500]
    body = response.json()
    assert "spec.source.avro_schema" in body, body
    assert words in body["spec.source.avro_schema"][0]
    assert not Pipeline.objects.filter(name="bounded").exists()


def test_the_api_accepts_a_real_schema_and_stores_its_columns(
    api, kafka_connection, postgres_connection
):
    source = {
        "connection": "events",
        "topics": ["orders"],
        "format": "avro",
        "avro_schema": realistic(),
    }
    sink = {"kind": "postgres", "connection": "warehouse", "table": "orders", "mode": "append"}
    spec = valid_spec(source=source, transform=None, sink=sink)
    response = api.post("/api/pipelines/", {"name": "real", "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    stored = Pipeline.objects.get(name="real").spec["source"]
    assert stored["schema"].startswith("`billing` STRUCT<")
    assert json.loads(stored["avro_schema"]) == realistic()


@pytest.fixture
def editor(db, django_user_model) -> Client:
    user = django_user_model.objects.create_user(username="ed")
    set_role(user, "editor")
    client = Client()
    client.force_login(user)
    return client


def test_the_form_refuses_an_unbounded_schema_at_its_input(
    editor, kafka_connection, postgres_connection
):
    post = new_pipeline_post(format="avro", avro_schema=json.dumps(doubling(40)), schema=None)
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert "expands to more than 10,000 fields" in field_errors(
        response.content.decode(), "avro_schema"
    )
    assert not Pipeline.objects.filter(name="payments").exists()
