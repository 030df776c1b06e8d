"""A Spark DDL schema parser that needs no JVM.

Pipeline specs carry their source schema as a Spark DDL string (``id STRING, amount DOUBLE``).
The web app has to validate that string when a pipeline is saved, long before a Spark driver
exists, and has to say precisely what is wrong. Starting a JVM per request is out of the
question, so this module re-implements the part of Spark's SQL grammar that schemas use.

Spark is the reference. Where this parser and Spark 4.3 differ, it is on purpose and listed
here (``tests/test_spec_ddl_matches_spark.py`` pins both lists against a real Spark):

* Stricter than Spark:
  - Duplicate column names (compared case-insensitively, like Spark's default
    ``spark.sql.caseSensitive=false``) are rejected, at the top level and inside a STRUCT.
    Spark's parser accepts them, but every query that references such a column then fails
    with an ambiguous-reference error.
  - An empty schema (``""``) is rejected; PySpark turns it into an empty struct.
  - Locale-specific collations (``STRING COLLATE de_CI``) are rejected: only the UTF8_BINARY,
    UTF8_LCASE and UNICODE families are known here. GEOMETRY and GEOGRAPHY are rejected too.
  - Nanosecond timestamps (``TIMESTAMP(9)``) are rejected, like Spark does unless
    ``spark.sql.timestampNanosTypes.enabled`` is set.
* Like PySpark (``DataType.fromDDL``, ``spark.createDataFrame(data, ddl)``), and unlike the
  JVM's ``StructType.fromDDL``, top-level columns may be written ``name: type`` and the whole
  schema may be wrapped in ``STRUCT<...>``.

Note that Spark parses CHAR(n) and VARCHAR(n), so this module accepts them, but ``from_json``
refuses a schema that contains them ("char/varchar type can't be used in the table schema").

Everything here is plain Python: no Django, no Celery, no PySpark.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeAlias

__all__ = [
    "ArrayType",
    "DDLError",
    "DataType",
    "MapType",
    "PrimitiveType",
    "StructField",
    "StructType",
    "parse_schema",
    "simple_string",
    "to_ddl",
]


class DDLError(ValueError):
    """A schema string that Spark would not accept.

    ``str(error)`` is a sentence meant for the person who typed the schema; it includes the
    1-based character ``position`` of the problem whenever there is one.
    """

    def __init__(self, message: str, position: int | None = None) -> None:
        super().__init__(message)
        self.position = position


@dataclass(frozen=True)
class PrimitiveType:
    """A non-nested type, named by Spark's canonical ``DataType.simpleString()``.

    Examples: ``string``, ``bigint``, ``decimal(10,2)``, ``timestamp_ntz``,
    ``interval day to second``, ``string collate UNICODE_CI``.
    """

    name: str


@dataclass(frozen=True)
class ArrayType:
    """``ARRAY<element>``; Spark's DDL cannot say whether elements may be null (they may)."""

    element: DataType


@dataclass(frozen=True)
class MapType:
    """``MAP<key, value>``; values may always be null in DDL-declared maps."""

    key: DataType
    value: DataType


@dataclass(frozen=True)
class StructField:
    """One column of a schema, or one field of a STRUCT."""

    name: str
    type: DataType
    nullable: bool = True
    comment: str | None = None


@dataclass(frozen=True)
class StructType:
    """An ordered list of fields: a whole schema, or a ``STRUCT<...>`` column type."""

    fields: tuple[StructField, ...]


DataType: TypeAlias = PrimitiveType | ArrayType | MapType | StructType


def parse_schema(ddl: str) -> StructType:
    """Parse a Spark DDL schema such as ``id STRING NOT NULL, tags ARRAY<STRING>``.

    Raises DDLError, whose message names the column and the 1-based character position.
    """
    try:
        return _Parser(ddl).schema()
    except RecursionError:
        raise DDLError("schema is nested too deeply") from None


def simple_string(t: DataType) -> str:
    """Spark's ``DataType.simpleString()``, e.g. ``struct<id:string,tags:array<string>>``.

    Like PySpark's, and unlike the JVM's, the output is never abbreviated for wide structs.
    """
    if isinstance(t, PrimitiveType):
        return t.name
    if isinstance(t, ArrayType):
        return f"array<{simple_string(t.element)}>"
    if isinstance(t, MapType):
        return f"map<{simple_string(t.key)},{simple_string(t.value)}>"
    inner = ",".join(f"{f.name}:{simple_string(f.type)}" for f in t.fields)
    return f"struct<{inner}>"


def to_ddl(schema: StructType) -> str:
    """Render a schema as DDL that every Spark entry point accepts, keeping NOT NULL and comments.

    ``parse_schema`` accepts spellings (``name: type``, a ``STRUCT<...>`` wrapper) that the JVM's
    ``StructType.fromDDL`` and ``from_json(col, ddl)`` reject; handing Spark this canonical form
    instead avoids that trap. ``parse_schema(to_ddl(s)) == s`` for every schema ``s`` it parsed.
    """
    return ", ".join(_field_ddl(f, top_level=True) for f in schema.fields)


# --------------------------------------------------------------------------------------------
# Rendering helpers


def _quote_name(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def _quote_string(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def _field_ddl(f: StructField, *, top_level: bool) -> str:
    sep = " " if top_level else ": "
    out = f"{_quote_name(f.name)}{sep}{_type_ddl(f.type)}"
    if not f.nullable:
        out += " NOT NULL"
    if f.comment is not None:
        out += f" COMMENT {_quote_string(f.comment)}"
    return out


def _type_ddl(t: DataType) -> str:
    if isinstance(t, PrimitiveType):
        return t.name.upper()
    if isinstance(t, ArrayType):
        return f"ARRAY<{_type_ddl(t.element)}>"
    if isinstance(t, MapType):
        return f"MAP<{_type_ddl(t.key)}, {_type_ddl(t.value)}>"
    return "STRUCT<" + ", ".join(_field_ddl(f, top_level=False) for f in t.fields) + ">"


# --------------------------------------------------------------------------------------------
# Lexer: mirrors the relevant tokens of Spark's SqlBaseLexer.g4.

# Spark's WS rule (4.x), which includes a few Unicode spaces.
_WHITESPACE = frozenset(
    " \t\n\f\r\u000b\u00a0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
    "\u2009\u200a\u2028\u202f\u205f\u3000"
)
_WORD_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")
# Words that Spark's lexer reads as numeric literals (1L, 2S, 3Y, 1e5, 1.5D...) rather than
# as identifiers, so they cannot be column names without back-quotes. "1e" or "1a" can.
_NUMERIC_LITERAL = re.compile(r"\d+(?:[lsy]|(?:e\d+)?(?:d|f|bd)|e\d+)?", re.IGNORECASE)
_PUNCTUATION = frozenset("<>(),:!")


@dataclass(frozen=True)
class _Token:
    type: str  # "word", "quoted", "number", "int", "string", "punct" or "eof"
    text: str  # the token as written, e.g. "`a``b`"
    value: str  # the unquoted, unescaped text, e.g. "a`b"
    start: int  # 0-based offset into the DDL

    @property
    def position(self) -> int:
        return self.start + 1

    def is_word(self, *keywords: str) -> bool:
        return self.type == "word" and self.value.lower() in keywords

    def is_punct(self, *chars: str) -> bool:
        return self.type == "punct" and self.value in chars

    def describe(self) -> str:
        if self.type == "eof":
            return "the end of the schema"
        if self.type == "string":
            return f"the string {self.text}"
        return f"'{self.text}'"


_SIMPLE_ESCAPES = {
    "0": "\0",
    "b": "\b",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "Z": "\x1a",
    "%": "\\%",
    "_": "\\_",
}
_UNICODE_ESCAPE = re.compile(r"u[0-9a-fA-F]{4}")
_OCTAL_ESCAPE = re.compile(r"[0-3][0-7][0-7]")


def _escape(ddl: str, i: int) -> tuple[str, int]:
    """Spark's unescapeSQLString for the escape sequence whose backslash is at ``ddl[i]``.

    Returns the unescaped text and the offset just after the sequence.
    """
    if _UNICODE_ESCAPE.match(ddl, i + 1):
        return chr(int(ddl[i + 2 : i + 6], 16)), i + 6
    if _OCTAL_ESCAPE.match(ddl, i + 1):
        return chr(int(ddl[i + 1 : i + 4], 8)), i + 4
    nxt = ddl[i + 1 : i + 2]
    return _SIMPLE_ESCAPES.get(nxt, nxt), i + 2


def _tokenize(ddl: str) -> list[_Token]:
    tokens: list[_Token] = []
    i, n = 0, len(ddl)
    while i < n:
        ch = ddl[i]
        if ch in _WHITESPACE:
            i += 1
        elif ddl.startswith("--", i):
            # Spark's SIMPLE_COMMENT runs to the end of the line; a backslash continues it.
            while i < n and ddl[i] not in "\r\n":
                i += 2 if ddl.startswith("\\\n", i) else 1
        elif ddl.startswith("/*", i):
            i = _skip_block_comment(ddl, i)
        elif ch == "`":
            end = i + 1
            while True:
                end = ddl.find("`", end)
                if end < 0:
                    raise DDLError(
                        f"unterminated back-quoted name starting at position {i + 1}", i + 1
                    )
                if ddl.startswith("``", end):
                    end += 2
                    continue
                break
            text = ddl[i : end + 1]
            tokens.append(_Token("quoted", text, text[1:-1].replace("``", "`"), i))
            i = end + 1
        elif ch in "'\"" or (ch in "rR" and ddl[i + 1 : i + 2] in ("'", '"')):
            i = _read_string(ddl, i, tokens)
        elif ch in _WORD_CHARS:
            end = i
            while end < n and ddl[end] in _WORD_CHARS:
                end += 1
            word = ddl[i:end]
            if word.isdigit():
                kind = "int"
            elif _NUMERIC_LITERAL.fullmatch(word):
                kind = "number"
            else:
                kind = "word"
            tokens.append(_Token(kind, word, word, i))
            i = end
        elif ddl.startswith("<>", i):
            tokens.append(_Token("punct", "<>", "<>", i))
            i += 2
        elif ch in _PUNCTUATION:
            tokens.append(_Token("punct", ch, ch, i))
            i += 1
        else:
            hint = ""
            if ch.isalpha() or (ch in "-.$#@" and i > 0 and ddl[i - 1] in _WORD_CHARS):
                hint = (
                    " (a name with characters other than ASCII letters, digits and '_' "
                    "must be back-quoted, e.g. `my-name`)"
                )
            raise DDLError(f"unexpected character {ch!r} at position {i + 1}{hint}", i + 1)
    tokens.append(_Token("eof", "", "", n))
    return tokens


def _skip_block_comment(ddl: str, start: int) -> int:
    """Skip a (nestable) bracketed comment, returning the offset just after it."""
    if ddl.startswith("/*+", start):
        raise DDLError(
            f"unexpected optimizer hint '/*+' at position {start + 1}: hints are not allowed "
            "in a schema",
            start + 1,
        )
    depth, i = 0, start
    while i < len(ddl):
        if ddl.startswith("/*", i):
            depth += 1
            i += 2
        elif ddl.startswith("*/", i):
            depth -= 1
            i += 2
            if depth == 0:
                return i
        else:
            i += 1
    raise DDLError(f"comment opened with '/*' at position {start + 1} is never closed", start + 1)


def _read_string(ddl: str, start: int, tokens: list[_Token]) -> int:
    """Read a '...', "...", R'...' or R"..." literal; a doubled quote stands for itself."""
    raw = ddl[start] in "rR"
    quote = ddl[start + 1] if raw else ddl[start]
    i = start + (2 if raw else 1)
    value: list[str] = []
    while i < len(ddl):
        ch = ddl[i]
        if ch == "\\" and not raw:
            text, i = _escape(ddl, i)
            value.append(text)
        elif ch == quote and not raw and ddl.startswith(quote, i + 1):
            value.append(quote)
            i += 2
        elif ch == quote:
            tokens.append(_Token("string", ddl[start : i + 1], "".join(value), start))
            return i + 1
        else:
            value.append(ch)
            i += 1
    raise DDLError(f"unterminated string starting at position {start + 1}", start + 1)


# --------------------------------------------------------------------------------------------
# Types

_SIMPLE_TYPES = {
    "boolean": "boolean",
    "tinyint": "tinyint",
    "byte": "tinyint",
    "smallint": "smallint",
    "short": "smallint",
    "int": "int",
    "integer": "int",
    "bigint": "bigint",
    "long": "bigint",
    "float": "float",
    "real": "float",
    "double": "double",
    "date": "date",
    "binary": "binary",
    "variant": "variant",
    "void": "void",
}
_DECIMAL = ("decimal", "dec", "numeric")
_CHAR = ("char", "character", "varchar")
_TIMESTAMPS = {
    "timestamp": "timestamp",
    "timestamp_ltz": "timestamp",
    "timestamp_ntz": "timestamp_ntz",
}
_YEAR_MONTH = ("year", "month")
_DAY_TIME = ("day", "hour", "minute", "second")
_ALL_TYPE_NAMES = sorted(
    [*_SIMPLE_TYPES, *_DECIMAL, *_CHAR, *_TIMESTAMPS, "string", "time", "interval", "array", "map"]
)
_MAX_DECIMAL_PRECISION = 38
_MAX_INT = 2**31 - 1
_DEFAULT_TIMESTAMP_PRECISION = 6
_MAX_TIME_PRECISION = 9
_MAX_TIMESTAMP_NANOS_PRECISION = 9

# Case-sensitivity, accent-sensitivity and trailing-space specifiers of the UNICODE collation.
_UNICODE_SPECIFIERS = {"cs": "case", "ci": "case", "as": "accent", "ai": "accent", "rtrim": "rtrim"}


def _canonical_collation(name: str) -> str | None:
    """Spark's canonical spelling of a collation name, or None if this module doesn't know it."""
    lowered = name.lower()
    for base in ("utf8_binary", "utf8_lcase"):
        if lowered in (base, base + "_rtrim"):
            return lowered.upper()
    parts = lowered.split("_")
    if parts[0] != "unicode":
        return None
    seen: dict[str, str] = {}
    for part in parts[1:]:
        group = _UNICODE_SPECIFIERS.get(part)
        if group is None or group in seen:
            return None
        seen[group] = part
    out = "UNICODE"
    if seen.get("case") == "ci":
        out += "_CI"
    if seen.get("accent") == "ai":
        out += "_AI"
    if "rtrim" in seen:
        out += "_RTRIM"
    return out


# --------------------------------------------------------------------------------------------
# Parser


@dataclass(frozen=True)
class _Where:
    """What is being parsed, for error messages: ``column 'a'`` or ``field 'a.b'``."""

    path: tuple[str, ...]

    def child(self, name: str) -> _Where:
        return _Where((*self.path, name))

    @property
    def is_column(self) -> bool:
        return len(self.path) <= 1

    def __str__(self) -> str:
        if not self.path:
            return "the schema"
        kind = "column" if self.is_column else "field"
        return f"{kind} '{'.'.join(self.path)}'"


class _Parser:
    """Recursive descent over Spark's ``colTypeList`` / ``dataType`` rules."""

    def __init__(self, ddl: str) -> None:
        self.ddl = ddl
        self.tokens = _tokenize(ddl)
        self.i = 0

    # -- token helpers -----------------------------------------------------------------------

    @property
    def tok(self) -> _Token:
        return self.tokens[self.i]

    def peek(self, offset: int = 1) -> _Token:
        return self.tokens[min(self.i + offset, len(self.tokens) - 1)]

    def advance(self) -> _Token:
        tok = self.tok
        if tok.type != "eof":
            self.i += 1
        return tok

    @staticmethod
    def fail(message: str, tok: _Token) -> DDLError:
        """An error at ``tok``; "{at}" in the message marks where "at position N" goes."""
        at = f"at position {tok.position}"
        text = message.replace("{at}", at) if "{at}" in message else f"{message} {at}"
        return DDLError(text, tok.position)

    # -- schema and fields -------------------------------------------------------------------

    def schema(self) -> StructType:
        if self.tok.type == "eof":
            raise DDLError(
                "schema is empty: expected at least one column, e.g. 'id STRING, amount DOUBLE'"
            )
        if self.tok.is_word("struct") and self.peek().is_punct("<", "<>"):
            # PySpark accepts a whole schema written as a single STRUCT<...> type.
            first = self.tok
            t = self.data_type(_Where(()))
            assert isinstance(t, StructType)
            if self.tok.type != "eof":
                raise self.fail(
                    f"unexpected {self.tok.describe()} after the closing '>' of the schema",
                    self.tok,
                )
            if not t.fields:
                raise self.fail("schema is empty: STRUCT<> has no fields", first)
            return t
        fields = self.field_list(top_level=True)
        return StructType(tuple(fields))

    def field_list(self, *, top_level: bool, parent: _Where | None = None) -> list[StructField]:
        """``field (',' field)*`` up to the end of input (top level) or up to a ``>``."""
        fields: list[StructField] = []
        seen: dict[str, tuple[str, int]] = {}
        while True:
            name_tok = self.tok
            f = self.field(top_level=top_level, parent=parent)
            key = f.name.lower()
            if key in seen:
                other, pos = seen[key]
                what = "column" if parent is None or not parent.path else "field"
                same = "" if other == f.name else f" (names are case-insensitive: '{other}')"
                raise self.fail(
                    f"duplicate {what} name '{f.name}' {{at}}{same}: first defined at position "
                    f"{pos}",
                    name_tok,
                )
            seen[key] = (f.name, name_tok.position)
            fields.append(f)
            if self.tok.is_punct(","):
                self.advance()
                continue
            return fields

    def field(self, *, top_level: bool, parent: _Where | None) -> StructField:
        previous = self.tokens[self.i - 1] if self.i > 0 else None
        after_comma = previous is not None and previous.is_punct(",")
        tok = self.advance()
        what = "column" if parent is None or not parent.path else "field"
        if tok.type in ("word", "quoted"):
            name = tok.value
        elif tok.type == "number":
            raise self.fail(
                f"'{tok.text}' is read as a number, not a {what} name; back-quote it "
                f"(`{tok.text}`)",
                tok,
            )
        elif tok.type == "int":
            raise self.fail(
                f"a {what} name cannot be just digits ('{tok.text}'); back-quote it (`{tok.text}`)",
                tok,
            )
        else:
            if after_comma and tok.type == "eof":
                raise self.fail(f"expected a {what} name after the trailing ','", tok)
            after = " after ','" if after_comma else ""
            raise self.fail(f"expected a {what} name{after}, found {tok.describe()}", tok)
        where = _Where((name,)) if parent is None else parent.child(name)
        if self.tok.is_punct(":"):
            self.advance()
        t = self.data_type(where)
        nullable, comment = True, None
        if self.tok.is_word("not") or self.tok.is_punct("!"):
            self.advance()
            if not self.tok.is_word("null"):
                raise self.fail(
                    f"expected NULL after NOT for {where}, found {self.tok.describe()}", self.tok
                )
            self.advance()
            nullable = False
        if self.tok.is_word("comment"):
            self.advance()
            comment = self.comment_text(where)
        self.expect_field_end(where, top_level=top_level, nullable=nullable, comment=comment)
        return StructField(name, t, nullable, comment)

    def comment_text(self, where: _Where) -> str:
        if self.tok.type != "string":
            raise self.fail(
                f"expected a quoted comment after COMMENT for {where}, found {self.tok.describe()}",
                self.tok,
            )
        parts: list[str] = []
        while self.tok.type == "string":  # Spark concatenates adjacent literals: 'a' 'b'
            parts.append(self.advance().value)
        return "".join(parts)

    def expect_field_end(
        self, where: _Where, *, top_level: bool, nullable: bool, comment: str | None
    ) -> None:
        tok = self.tok
        if (
            tok.is_punct(",")
            or (tok.type == "eof" and top_level)
            or (tok.is_punct(">") and not top_level)
        ):
            return
        if tok.is_word("not") or tok.is_punct("!"):
            if not nullable:
                raise self.fail(f"NOT NULL is given twice for {where}", tok)
            raise self.fail(f"NOT NULL must come before COMMENT for {where}", tok)
        if tok.is_word("comment") and comment is not None:
            raise self.fail(f"{where} has a second COMMENT", tok)
        if tok.is_word("null"):
            raise self.fail(
                f"unexpected NULL after the type of {where} (columns are nullable unless "
                "declared NOT NULL)",
                tok,
            )
        if tok.is_word("default", "generated"):
            raise self.fail(f"{tok.text.upper()} is not supported in a schema ({where})", tok)
        if tok.is_word("collate"):
            raise self.fail(
                f"COLLATE only applies to STRING, CHAR and VARCHAR ({where}), and must come "
                "before NOT NULL and COMMENT",
                tok,
            )
        if tok.is_punct(">"):
            raise self.fail(f"unexpected '>' {{at}} after {where}: it closes no '<'", tok)
        if tok.is_punct(")"):
            raise self.fail(f"unexpected ')' {{at}} after {where}: it closes no '('", tok)
        if tok.type == "eof":
            raise self.fail(f"missing '>' to close the STRUCT containing {where}", tok)
        expected = ["','"]
        if nullable and comment is None:
            expected.append("NOT NULL")
        if comment is None:
            expected.append("COMMENT")
        expected.append("the end of the schema" if top_level else "'>'")
        raise self.fail(
            f"unexpected {tok.describe()} {{at}} after {where}: expected {_or(expected)}", tok
        )

    # -- types ---------------------------------------------------------------------------

    def data_type(self, where: _Where) -> DataType:
        tok = self.tok
        if tok.type == "eof" or tok.type == "punct" or tok.is_word("not", "comment", "null"):
            raise self.fail(f"missing type for {where}", tok)
        if tok.type != "word":
            raise self.fail(f"unknown type {tok.describe()} for {where}", tok)
        self.advance()
        name = tok.value.lower()
        parser = _TYPE_PARSERS.get(name)
        if parser is not None:
            return parser(self, tok, where)
        if name in _SIMPLE_TYPES:
            self.no_params(tok, where)
            return PrimitiveType(_SIMPLE_TYPES[name])
        if name in ("geometry", "geography"):
            raise self.fail(f"spatial type {name.upper()} is not supported ({where})", tok)
        hint = difflib.get_close_matches(name, _ALL_TYPE_NAMES, n=1)
        suffix = f" (did you mean {hint[0].upper()}?)" if hint else ""
        raise DDLError(
            f"unknown type '{tok.text}' for {where} at position {tok.position}{suffix}",
            tok.position,
        )

    def params(self, type_tok: _Token, where: _Where) -> list[tuple[int, _Token]] | None:
        """Spark's ``type (LEFT_PAREN INTEGER_VALUE (COMMA INTEGER_VALUE)* RIGHT_PAREN)?``."""
        if not self.tok.is_punct("("):
            return None
        opening = self.advance()
        values: list[tuple[int, _Token]] = []
        while True:
            tok = self.advance()
            if tok.type != "int":
                if tok.type == "eof":
                    raise self.fail(f"'(' {{at}} for {where} is never closed", opening)
                raise self.fail(
                    f"expected a non-negative integer in {type_tok.text.upper()}(...) for "
                    f"{where}, found {tok.describe()}",
                    tok,
                )
            values.append((int(tok.value), tok))
            nxt = self.advance()
            if nxt.is_punct(")"):
                return values
            if nxt.is_punct(","):
                continue
            if nxt.type == "eof":
                raise self.fail(f"'(' {{at}} for {where} is never closed", opening)
            raise self.fail(f"expected ',' or ')' in {type_tok.text.upper()}(...) for {where}", nxt)

    def no_params(self, type_tok: _Token, where: _Where) -> None:
        if self.tok.is_punct("("):
            raise self.fail(f"type {type_tok.text.upper()} takes no parameters ({where})", self.tok)

    def string_type(self, tok: _Token, where: _Where) -> DataType:
        self.no_params(tok, where)
        collation = self.collation(where)
        if collation is None or collation == "UTF8_BINARY":
            return PrimitiveType("string")
        return PrimitiveType(f"string collate {collation}")

    def collation(self, where: _Where) -> str | None:
        if not self.tok.is_word("collate"):
            return None
        self.advance()
        tok = self.advance()
        if tok.type not in ("word", "quoted"):
            raise self.fail(f"expected a collation name after COLLATE for {where}", tok)
        canonical = _canonical_collation(tok.value)
        if canonical is None:
            raise self.fail(
                f"unknown or unsupported collation '{tok.value}' for {where} (supported: "
                "UTF8_BINARY, UTF8_LCASE and UNICODE with optional _CI, _AI and _RTRIM)",
                tok,
            )
        return canonical

    def char_type(self, tok: _Token, where: _Where) -> DataType:
        kind = "varchar" if tok.value.lower() == "varchar" else "char"
        params = self.params(tok, where)
        if params is None:
            raise self.fail(
                f"{kind.upper()} needs a length, e.g. {kind.upper()}(10), for {where}", tok
            )
        if len(params) != 1:
            raise self.fail(f"{kind.upper()} takes exactly one length for {where}", params[1][1])
        length, length_tok = params[0]
        if length > _MAX_INT:
            raise self.fail(
                f"{kind.upper()} length {length} is out of range (at most {_MAX_INT}) for {where}",
                length_tok,
            )
        self.collation(where)  # Spark accepts COLLATE here and ignores it.
        return PrimitiveType(f"{kind}({length})")

    def decimal_type(self, tok: _Token, where: _Where) -> DataType:
        params = self.params(tok, where) or []
        if len(params) > 2:
            raise self.fail(
                f"DECIMAL takes at most two parameters (precision, scale) for {where}",
                params[2][1],
            )
        precision, p_tok = params[0] if params else (10, tok)
        scale, s_tok = params[1] if len(params) > 1 else (0, tok)
        if precision > _MAX_DECIMAL_PRECISION:
            raise self.fail(
                f"decimal precision {precision} is out of range (at most "
                f"{_MAX_DECIMAL_PRECISION}) for {where}",
                p_tok,
            )
        if scale > precision:
            raise self.fail(
                f"decimal scale {scale} is greater than its precision {precision} for {where}",
                s_tok,
            )
        return PrimitiveType(f"decimal({precision},{scale})")

    def timestamp_type(self, tok: _Token, where: _Where) -> DataType:
        name = tok.value.lower()
        canonical = _TIMESTAMPS[name]
        params = self.params(tok, where)
        if params is not None:
            if len(params) != 1:
                raise self.fail(
                    f"{name.upper()} takes at most one parameter (precision) for {where}",
                    params[1][1],
                )
            precision, p_tok = params[0]
            if _DEFAULT_TIMESTAMP_PRECISION < precision <= _MAX_TIMESTAMP_NANOS_PRECISION:
                raise self.fail(
                    f"{name.upper()}({precision}) needs nanosecond timestamps, which Spark only "
                    f"allows with spark.sql.timestampNanosTypes.enabled ({where})",
                    p_tok,
                )
            if precision != _DEFAULT_TIMESTAMP_PRECISION:
                raise self.fail(
                    f"{name.upper()} precision must be 6 (microseconds), not {precision}, "
                    f"for {where}",
                    p_tok,
                )
        if name == "timestamp":
            if self.tok.is_word("with"):
                self.keywords(("with", "local", "time", "zone"), where)
            elif self.tok.is_word("without"):
                self.keywords(("without", "time", "zone"), where)
                canonical = "timestamp_ntz"
        return PrimitiveType(canonical)

    def time_type(self, tok: _Token, where: _Where) -> DataType:
        params = self.params(tok, where)
        precision = _DEFAULT_TIMESTAMP_PRECISION
        if params is not None:
            if len(params) != 1:
                raise self.fail(
                    f"TIME takes at most one parameter (precision) for {where}", params[1][1]
                )
            precision, p_tok = params[0]
            if precision > _MAX_TIME_PRECISION:
                raise self.fail(
                    f"TIME precision {precision} is out of range (0 to {_MAX_TIME_PRECISION}) "
                    f"for {where}",
                    p_tok,
                )
        if self.tok.is_word("without"):
            self.keywords(("without", "time", "zone"), where)
        return PrimitiveType(f"time({precision})")

    def keywords(self, words: tuple[str, ...], where: _Where) -> None:
        for word in words:
            if not self.tok.is_word(word):
                raise self.fail(
                    f"expected {' '.join(words).upper()} for {where}, found {self.tok.describe()}",
                    self.tok,
                )
            self.advance()

    def interval_type(self, tok: _Token, where: _Where) -> DataType:
        self.no_params(tok, where)
        if not self.tok.is_word(*_YEAR_MONTH, *_DAY_TIME):
            return PrimitiveType("interval")  # Spark's CalendarIntervalType
        start_tok = self.advance()
        start = start_tok.value.lower()
        units = _YEAR_MONTH if start in _YEAR_MONTH else _DAY_TIME
        if not self.tok.is_word("to"):
            return PrimitiveType(f"interval {start}")
        self.advance()
        end_tok = self.advance()
        end = end_tok.value.lower()
        allowed = units[1:]
        if end not in allowed:
            raise self.fail(
                f"expected {_or([u.upper() for u in allowed])} after INTERVAL {start.upper()} TO "
                f"for {where}, found {end_tok.describe()}",
                end_tok,
            )
        if units.index(end) <= units.index(start):
            raise self.fail(
                f"INTERVAL {start.upper()} TO {end.upper()} is not a valid interval type for "
                f"{where}: the end unit must be smaller than the start unit",
                start_tok,
            )
        return PrimitiveType(f"interval {start} to {end}")

    def open_angle(self, tok: _Token, where: _Where, example: str) -> _Token:
        if not self.tok.is_punct("<"):
            raise self.fail(
                f"{tok.text.upper()} needs its element types in angle brackets, e.g. {example}, "
                f"for {where}",
                tok,
            )
        return self.advance()

    def close_angle(self, opening: _Token, where: _Where, what: str) -> None:
        tok = self.tok
        if tok.is_punct(">"):
            self.advance()
            return
        if tok.type == "eof":
            raise self.fail(f"'<' {{at}} for {where} is never closed (missing '>')", opening)
        raise self.fail(f"expected '>' to close {what} for {where}, found {tok.describe()}", tok)

    def array_type(self, tok: _Token, where: _Where) -> DataType:
        opening = self.open_angle(tok, where, "ARRAY<INT>")
        element = self.data_type(where)
        if self.tok.is_punct(","):
            raise self.fail(f"ARRAY takes a single element type for {where}", self.tok)
        self.close_angle(opening, where, "ARRAY<...>")
        return ArrayType(element)

    def map_type(self, tok: _Token, where: _Where) -> DataType:
        opening = self.open_angle(tok, where, "MAP<STRING, INT>")
        key = self.data_type(where)
        if self.tok.is_punct(">"):
            raise self.fail(
                f"MAP needs a key and a value type, e.g. MAP<STRING, INT>, for {where}", self.tok
            )
        if not self.tok.is_punct(","):
            self.close_angle(opening, where, "MAP<...>")  # raises: neither ',' nor '>'
        self.advance()
        value = self.data_type(where)
        if self.tok.is_punct(","):
            raise self.fail(f"MAP takes exactly two types (key, value) for {where}", self.tok)
        self.close_angle(opening, where, "MAP<...>")
        return MapType(key, value)

    def struct_type(self, tok: _Token, where: _Where) -> DataType:
        if self.tok.is_punct("<>"):  # Spark's lexer reads "STRUCT<>" as STRUCT followed by "<>"
            self.advance()
            return StructType(())
        opening = self.open_angle(tok, where, "STRUCT<name: STRING>")
        if self.tok.is_punct(">"):
            self.advance()
            return StructType(())
        fields = self.field_list(top_level=False, parent=where)
        self.close_angle(opening, where, "STRUCT<...>")
        return StructType(tuple(fields))


# Types with their own syntax; the others are looked up in _SIMPLE_TYPES.
_TYPE_PARSERS: dict[str, Callable[[_Parser, _Token, _Where], DataType]] = {
    "string": _Parser.string_type,
    **dict.fromkeys(_CHAR, _Parser.char_type),
    **dict.fromkeys(_DECIMAL, _Parser.decimal_type),
    **dict.fromkeys(_TIMESTAMPS, _Parser.timestamp_type),
    "time": _Parser.time_type,
    "interval": _Parser.interval_type,
    "array": _Parser.array_type,
    "map": _Parser.map_type,
    "struct": _Parser.struct_type,
}


def _or(items: list[str]) -> str:
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]
