"""Unit tests of the JVM-free Spark DDL parser (jobs/spec/ddl.py).

What Spark itself accepts is pinned in test_spec_ddl_matches_spark.py; these tests pin the
parser's behaviour and its error messages, and run without Spark.
"""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jobs.spec.ddl import (
    ArrayType,
    DDLError,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
    parse_schema,
    simple_string,
    to_ddl,
)

DDL_PY = Path(__file__).resolve().parents[1] / "jobs" / "spec" / "ddl.py"


# -- accepted schemas ------------------------------------------------------------------------

ACCEPTED = [
    ("id STRING, amount DOUBLE, ts TIMESTAMP", "struct<id:string,amount:double,ts:timestamp>"),
    ("id string", "struct<id:string>"),
    ("a boolean, b tinyint, c byte", "struct<a:boolean,b:tinyint,c:tinyint>"),
    ("a smallint, b short, c int, d integer", "struct<a:smallint,b:smallint,c:int,d:int>"),
    ("a bigint, b long, c float, d real", "struct<a:bigint,b:bigint,c:float,d:float>"),
    ("a double, b binary, c date, d variant", "struct<a:double,b:binary,c:date,d:variant>"),
    ("a void, b interval", "struct<a:void,b:interval>"),
    ("a decimal", "struct<a:decimal(10,0)>"),
    ("a DEC(5), b NUMERIC(38, 38)", "struct<a:decimal(5,0),b:decimal(38,38)>"),
    ("a decimal( 010 , 02 )", "struct<a:decimal(10,2)>"),
    ("a varchar(10), b char(3), c character(1)", "struct<a:varchar(10),b:char(3),c:char(1)>"),
    ("a timestamp_ltz, b timestamp_ntz", "struct<a:timestamp,b:timestamp_ntz>"),
    ("a timestamp(6), b timestamp_ntz (6)", "struct<a:timestamp,b:timestamp_ntz>"),
    (
        "a timestamp with local time zone, b timestamp without time zone",
        "struct<a:timestamp,b:timestamp_ntz>",
    ),
    ("a time, b time(0), c time(9) without time zone", "struct<a:time(6),b:time(0),c:time(9)>"),
    (
        "a interval year, b interval year to month",
        "struct<a:interval year,b:interval year to month>",
    ),
    ("a interval day to second", "struct<a:interval day to second>"),
    (
        "a interval hour to minute, b interval second",
        "struct<a:interval hour to minute,b:interval second>",
    ),
    ("a string collate utf8_binary", "struct<a:string>"),
    ("a string collate utf8_lcase", "struct<a:string collate UTF8_LCASE>"),
    ("a string collate unicode_ai_ci", "struct<a:string collate UNICODE_CI_AI>"),
    ("a string collate unicode_cs_as", "struct<a:string collate UNICODE>"),
    ("a array<int>", "struct<a:array<int>>"),
    ("a array<array<array<int>>>", "struct<a:array<array<array<int>>>>"),
    ("a map<string, array<bigint>>", "struct<a:map<string,array<bigint>>>"),
    ("a struct<x: int, y string>", "struct<a:struct<x:int,y:string>>"),
    ("a struct<>, b struct< >", "struct<a:struct<>,b:struct<>>"),
    ("a map<array<int>, struct<>>", "struct<a:map<array<int>,struct<>>>"),
    ("a STRUCT<x:INT NOT NULL COMMENT 'y'>", "struct<a:struct<x:int>>"),
    ("id: string, b: int", "struct<id:string,b:int>"),
    ("STRUCT<a: INT, b: STRING>", "struct<a:int,b:string>"),
    ("`a``b` int, `c d` int, `` int", "struct<a`b:int,c d:int,:int>"),
    ("select int, from int, not int", "struct<select:int,from:int,not:int>"),
    ("1a int, _ int, 1e int", "struct<1a:int,_:int,1e:int>"),
    ("a int not null, b int ! null", "struct<a:int,b:int>"),
    ("a int comment 'x', b int not null comment \"y\"", "struct<a:int,b:int>"),
    ("a int comment 'a' 'b' r'\\c'", "struct<a:int>"),
    ("a int -- a comment\n, b int /* and /* a nested */ one */", "struct<a:int,b:int>"),
    ("  a\tint ,\n b\u00a0int  ", "struct<a:int,b:int>"),
    ("A Int, B sTrInG", "struct<A:int,B:string>"),
]


@pytest.mark.parametrize(("ddl", "expected"), ACCEPTED)
def test_it_accepts_spark_ddl_and_renders_spark_simple_strings(ddl: str, expected: str) -> None:
    assert simple_string(parse_schema(ddl)) == expected


def test_it_keeps_names_nullability_and_comments() -> None:
    schema = parse_schema("id STRING NOT NULL COMMENT 'the key', `Amount` DOUBLE")
    assert schema == StructType(
        (
            StructField("id", PrimitiveType("string"), nullable=False, comment="the key"),
            StructField("Amount", PrimitiveType("double")),
        )
    )


def test_it_builds_nested_types() -> None:
    schema = parse_schema("m MAP<STRING, ARRAY<STRUCT<x: INT NOT NULL>>>")
    (field,) = schema.fields
    assert field.type == MapType(
        PrimitiveType("string"),
        ArrayType(StructType((StructField("x", PrimitiveType("int"), nullable=False),))),
    )


@pytest.mark.parametrize(
    ("ddl", "comment"),
    [
        ("a int comment 'it''s'", "it's"),
        ("a int comment 'it\\'s'", "it's"),
        ('a int comment "say ""hi"""', 'say "hi"'),
        ("a int comment 'tab\\tand\\u0041'", "tab\tandA"),
        ("a int comment r'C:\\dir'", "C:\\dir"),
        ("a int comment 'a' \"b\"", "ab"),
    ],
)
def test_it_unescapes_comments_like_spark(ddl: str, comment: str) -> None:
    assert parse_schema(ddl).fields[0].comment == comment


# -- rejected schemas ------------------------------------------------------------------------

REJECTED = [
    # (ddl, fragment of the message, 1-based position or None)
    ("", "schema is empty", None),
    ("  -- just a comment", "schema is empty", None),
    ("struct<>", "schema is empty", 1),
    ("id FOOBAR", "unknown type 'FOOBAR' for column 'id' at position 4", 4),
    ("id strng", "unknown type 'strng' for column 'id' at position 4 (did you mean STRING?)", 4),
    ("a", "missing type for column 'a'", 2),
    ("a not null", "missing type for column 'a'", 3),
    ("a int, b", "missing type for column 'b'", 9),
    ("a int,", "expected a column name after the trailing ','", 7),
    ("a int,, b int", "expected a column name after ',', found ','", 7),
    (", a int", "expected a column name, found ','", 1),
    ("a int b", "unexpected 'b' at position 7 after column 'a'", 7),
    ("a int;", "unexpected character ';'", 6),
    ("a-b int", "must be back-quoted", 2),
    ("é int", "must be back-quoted", 1),
    ("123 int", "cannot be just digits", 1),
    ("1e5 int", "'1e5' is read as a number", 1),
    ("1L int", "'1L' is read as a number", 1),
    ('"a" int', 'expected a column name, found the string "a"', 1),
    ("a int, A string", "duplicate column name 'A' at position 8", 8),
    ("a struct<x int, X int>", "duplicate field name 'X' at position 17", 17),
    ("a array<int", "'<' at position 8 for column 'a' is never closed", 8),
    ("a map<string, int", "'<' at position 6 for column 'a' is never closed", 6),
    ("a map<int, boolean>>", "unexpected '>' at position 20 after column 'a'", 20),
    ("a decimal(10, 2", "'(' at position 10 for column 'a' is never closed", 10),
    ("a struct<x int,>", "expected a field name after ',', found '>'", 16),
    ("a struct<x>", "missing type for field 'a.x'", 11),
    ("a array", "ARRAY needs", 3),
    ("a array<int, int>", "ARRAY takes a single element type", 12),
    ("a map<int>", "MAP needs a key and a value type", 10),
    ("a map<int, int, int>", "MAP takes exactly two types", 15),
    ("a decimal(39)", "decimal precision 39 is out of range (at most 38)", 11),
    ("a decimal(5, 6)", "decimal scale 6 is greater than its precision 5", 14),
    ("a decimal(5, -1)", "unexpected character '-'", 14),
    ("a decimal()", "expected a non-negative integer", 11),
    ("a decimal(1, 2, 3)", "DECIMAL takes at most two parameters", 17),
    ("a char", "CHAR needs a length", 3),
    ("a varchar(1, 2)", "VARCHAR takes exactly one length", 14),
    ("a char(2147483648)", "out of range", 8),
    ("a int(10)", "type INT takes no parameters", 6),
    ("a string(10)", "type STRING takes no parameters", 9),
    ("a timestamp(3)", "precision must be 6", 13),
    ("a timestamp(9)", "spark.sql.timestampNanosTypes.enabled", 13),
    ("a timestamp with time zone", "expected WITH LOCAL TIME ZONE", 18),
    ("a time(10)", "TIME precision 10 is out of range", 8),
    ("a interval month to month", "INTERVAL MONTH TO MONTH is not a valid interval type", 12),
    ("a interval year to day", "expected MONTH after INTERVAL YEAR TO", 20),
    ("a string collate en_US", "unsupported collation 'en_US'", 18),
    ("a geometry(4326)", "spatial type GEOMETRY is not supported", 3),
    ("a int not", "expected NULL after NOT", 10),
    ("a int null", "unexpected NULL", 7),
    ("a int not null not null", "NOT NULL is given twice", 16),
    ("a int comment 'x' not null", "NOT NULL must come before COMMENT", 19),
    ("a int comment 'x' comment 'y'", "has a second COMMENT", 19),
    ("a int comment", "expected a quoted comment after COMMENT", 14),
    ("a int default 1", "DEFAULT is not supported", 7),
    ("a int collate unicode", "COLLATE only applies to STRING, CHAR and VARCHAR", 7),
    ("a int comment 'open", "unterminated string starting at position 15", 15),
    ("`a int", "unterminated back-quoted name starting at position 1", 1),
    ("a int /* open", "comment opened with '/*' at position 7 is never closed", 7),
    ("a int /*+ hint */", "hints are not allowed", 7),
    ("struct<a int>, b int", "after the closing '>' of the schema", 14),
]


@pytest.mark.parametrize(("ddl", "fragment", "position"), REJECTED)
def test_it_rejects_what_spark_rejects_with_a_precise_message(
    ddl: str, fragment: str, position: int | None
) -> None:
    with pytest.raises(DDLError) as caught:
        parse_schema(ddl)
    assert fragment in str(caught.value)
    assert caught.value.position == position
    if position is not None:
        assert f"at position {position}" in str(caught.value)


def test_it_rejects_unknown_types_naming_the_column_and_position() -> None:
    with pytest.raises(DDLError, match=r"^unknown type 'FOOBAR' for column 'id' at position 4$"):
        parse_schema("id FOOBAR")


def test_it_names_nested_fields_by_their_path() -> None:
    with pytest.raises(DDLError, match=r"unknown type 'nope' for field 'payload\.inner\.x'"):
        parse_schema("id INT, payload STRUCT<inner: STRUCT<x: nope>>")


def test_it_rejects_duplicate_names_case_insensitively_like_spark() -> None:
    with pytest.raises(DDLError) as caught:
        parse_schema("Id STRING, amount DOUBLE, ID INT")
    message = str(caught.value)
    assert "duplicate column name 'ID' at position 27" in message
    assert "first defined at position 1" in message
    assert "case-insensitive" in message


def test_ddl_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="schema is empty"):
        parse_schema("   ")


# -- simple_string and to_ddl ------------------------------------------------------------------


def test_simple_string_renders_hand_built_types() -> None:
    t = StructType(
        (
            StructField("tags", ArrayType(PrimitiveType("string"))),
            StructField("m", MapType(PrimitiveType("string"), PrimitiveType("bigint"))),
            StructField("s", StructType(())),
        )
    )
    assert simple_string(t) == "struct<tags:array<string>,m:map<string,bigint>,s:struct<>>"
    assert simple_string(ArrayType(PrimitiveType("int"))) == "array<int>"


def test_to_ddl_quotes_names_and_escapes_comments() -> None:
    schema = parse_schema("`we``ird name` INT NOT NULL COMMENT 'it''s \\\\ here', s STRUCT<x: INT>")
    assert to_ddl(schema) == (
        "`we``ird name` INT NOT NULL COMMENT 'it\\'s \\\\ here', `s` STRUCT<`x`: INT>"
    )
    assert parse_schema(to_ddl(schema)) == schema


def test_types_are_frozen_and_hashable() -> None:
    schema = parse_schema("a INT, b ARRAY<MAP<STRING, INT>>")
    with pytest.raises(dataclasses.FrozenInstanceError):
        schema.fields[0].name = "b"  # type: ignore[misc]
    assert hash(schema) == hash(parse_schema("a int, b array<map<string,int>>"))


def test_the_module_imports_neither_pyspark_nor_django_nor_celery() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('ddl_alone', {str(DDL_PY)!r})\n"
        "module = sys.modules['ddl_alone'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(m for m in ('pyspark', 'django', 'celery') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


# -- property: random nested types survive DDL -> parse -> simple_string ------------------------


def _spellings(*words: str) -> st.SearchStrategy[str]:
    """One of ``words``, in a random letter case: Spark's keywords are case-insensitive."""

    def recase(word: str, pattern: list[bool]) -> str:
        return "".join(c.upper() if up else c.lower() for c, up in zip(word, pattern, strict=True))

    return st.sampled_from(words).flatmap(
        lambda w: st.lists(st.booleans(), min_size=len(w), max_size=len(w)).map(
            lambda pattern: recase(w, pattern)
        )
    )


SIMPLE = {
    "boolean": ("boolean",),
    "tinyint": ("tinyint", "byte"),
    "smallint": ("smallint", "short"),
    "int": ("int", "integer"),
    "bigint": ("bigint", "long"),
    "float": ("float", "real"),
    "double": ("double",),
    "string": ("string",),
    "binary": ("binary",),
    "date": ("date",),
    "timestamp": ("timestamp", "timestamp_ltz"),
    "timestamp_ntz": ("timestamp_ntz",),
    "variant": ("variant",),
    "void": ("void",),
    "interval": ("interval",),
}


@st.composite
def decimals(draw: st.DrawFn) -> tuple[str, str]:
    word = draw(_spellings("decimal", "dec", "numeric"))
    precision = draw(st.integers(0, 38))
    form = draw(st.sampled_from(["bare", "p", "ps"]))
    if form == "bare":
        return word, "decimal(10,0)"
    if form == "p":
        return f"{word}({precision})", f"decimal({precision},0)"
    scale = draw(st.integers(0, precision))
    return f"{word}( {precision} ,{scale})", f"decimal({precision},{scale})"


@st.composite
def intervals(draw: st.DrawFn) -> tuple[str, str]:
    units = draw(st.sampled_from([("year", "month"), ("day", "hour", "minute", "second")]))
    start = draw(st.integers(0, len(units) - 1))
    end = draw(st.integers(start, len(units) - 1))
    if start == end:
        return f"INTERVAL {units[start].upper()}", f"interval {units[start]}"
    return (
        f"interval {units[start]} TO {units[end]}",
        f"interval {units[start]} to {units[end]}",
    )


@st.composite
def primitives(draw: st.DrawFn) -> tuple[str, str]:
    kind = draw(st.sampled_from(["simple", "decimal", "char", "interval", "time", "collated"]))
    if kind == "decimal":
        return draw(decimals())
    if kind == "interval":
        return draw(intervals())
    if kind == "char":
        word = draw(_spellings("char", "character", "varchar"))
        length = draw(st.integers(0, 2**31 - 1))
        canonical = "varchar" if word.lower() == "varchar" else "char"
        return f"{word}({length})", f"{canonical}({length})"
    if kind == "time":
        precision = draw(st.integers(0, 9))
        return f"TIME({precision})", f"time({precision})"
    if kind == "collated":
        name = draw(st.sampled_from(["UTF8_LCASE", "UNICODE", "UNICODE_CI", "UNICODE_CI_AI"]))
        return f"STRING COLLATE {name.lower()}", f"string collate {name}"
    canonical = draw(st.sampled_from(sorted(SIMPLE)))
    return draw(_spellings(*SIMPLE[canonical])), canonical


PLAIN_NAMES_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
PLAIN_NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,7}", fullmatch=True)
QUOTED_NAMES = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)
COMMENTS = st.text(st.characters(exclude_categories=("Cs",)), max_size=10)


def _render_name(name: str, plain: bool) -> str:
    return name if plain else "`" + name.replace("`", "``") + "`"


@st.composite
def fields(draw: st.DrawFn, depth: int, count: int) -> tuple[str, str]:
    """``count`` comma-separated fields with distinct names: (DDL, canonical simpleString)."""
    plain = draw(st.lists(st.booleans(), min_size=count, max_size=count))
    names = draw(
        st.lists(
            st.one_of(PLAIN_NAMES, QUOTED_NAMES),
            min_size=count,
            max_size=count,
            unique_by=str.lower,
        )
    )
    ddl_parts, canonical_parts = [], []
    for name, is_plain in zip(names, plain, strict=True):
        is_plain = is_plain and PLAIN_NAMES_RE.fullmatch(name) is not None
        type_ddl, type_canonical = draw(data_types(depth))
        colon = draw(st.sampled_from([" ", ": ", ":", " : "]))
        suffix = draw(st.sampled_from(["", " NOT NULL", " not null", " ! NULL"]))
        if draw(st.booleans()):
            comment = draw(COMMENTS)
            suffix += " COMMENT '" + comment.replace("\\", "\\\\").replace("'", "''") + "'"
        ddl_parts.append(f"{_render_name(name, is_plain)}{colon}{type_ddl}{suffix}")
        canonical_parts.append(f"{name}:{type_canonical}")
    separator = draw(st.sampled_from([",", ", ", " ,\n  "]))
    return separator.join(ddl_parts), ",".join(canonical_parts)


@st.composite
def data_types(draw: st.DrawFn, depth: int) -> tuple[str, str]:
    kind = draw(st.sampled_from(["primitive"] * 3 + (["array", "map", "struct"] if depth else [])))
    if kind == "primitive":
        return draw(primitives())
    if kind == "array":
        element, canonical = draw(data_types(depth - 1))
        return f"{draw(_spellings('array'))}<{element}>", f"array<{canonical}>"
    if kind == "map":
        key, key_canonical = draw(data_types(depth - 1))
        value, value_canonical = draw(data_types(depth - 1))
        return f"MAP<{key} , {value}>", f"map<{key_canonical},{value_canonical}>"
    count = draw(st.integers(0, 3))
    if count == 0:
        return draw(st.sampled_from(["STRUCT<>", "struct< >"])), "struct<>"
    inner, canonical = draw(fields(depth - 1, count))
    return f"{draw(_spellings('struct'))}<{inner}>", f"struct<{canonical}>"


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 4).flatmap(lambda n: fields(2, n)))
def test_random_nested_schemas_parse_to_their_canonical_simple_string(
    rendered: tuple[str, str],
) -> None:
    ddl, canonical = rendered
    schema = parse_schema(ddl)
    assert simple_string(schema) == f"struct<{canonical}>"
    assert parse_schema(to_ddl(schema)) == schema
