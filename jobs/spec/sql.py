"""Checks a pipeline's transform SQL without a JVM.

A transform is ``{"sql": "SELECT ... FROM source ..."}``: the Spark job registers the parsed
Kafka records as the temporary view ``source`` and runs the query over it. A mistake there
would only surface when the job starts (or, worse, restarts), so the web app checks the SQL
when the pipeline is saved, using sqlglot's Spark dialect instead of a Spark session.

The checks, in order, each raising SQLError with a message meant to be shown verbatim:

1. No script transform (``TRANSFORM`` / ``MAP`` / ``REDUCE ... USING '<command>'``, which
   runs a shell command) and no ``IDENTIFIER(...)`` (a table or function named by a string),
   told from the tokens alone, so that even forms sqlglot cannot parse are refused.
2. The SQL parses (sqlglot, Spark dialect): the message carries the line and column.
3. It is exactly one statement, and that statement is a query (SELECT, WITH ... SELECT,
   UNION / EXCEPT / INTERSECT of queries, VALUES), not DDL, DML or a command.
4. Every function it calls is on the allow-list of jobs/spec/functions.py, judged on the
   name as written (case-insensitively, back-quoted or not), wherever the call is (hints
   take no calls at all); qualified names (``system.builtin.reflect``) are refused. A bare
   ``user`` / ``current_user`` / ``session_user`` is Spark's function revealing the OS user
   unless it is a column of the SELECT's own sources, and is refused then.
5. Every table it reads, apart from its own CTEs, is the source view (names compare
   case-insensitively, like Spark's). Table-valued generator functions (``range``,
   ``explode``, ``inline``, ``stack``...) are allowed; other table functions are not.
6. It reads the source view at least once: a query that doesn't produces a batch DataFrame,
   and ``writeStream`` refuses those.
7. Only when ``columns`` is given: column references that certainly cannot resolve.

The column check is deliberately conservative: it must never reject SQL that Spark accepts,
so it only reports a name when it can enumerate everything the name could resolve to. For
each SELECT it collects the columns of its sources (``columns`` for the view; the output
names of a CTE or derived table, named the way Spark names them), the aliases its select
list defines, and, for correlated subqueries, the same of the enclosing queries; a reference
matching none of these is reported, with a suggestion. It understands qualified names
(``s.amount``), struct field access (``payload.id``), lambda variables
(``transform(xs, x -> x + 1)``), lateral column aliases (visible to the projections on their
right), aliases and output names in GROUP BY / HAVING / ORDER BY (not in WHERE or ON, like
Spark), ``GROUP BY window(...)`` and its ``window`` column, ``LATERAL VIEW ... t AS x``,
``*`` and ``t.*``, and unaliased computed columns, which Spark names after their SQL text
(``upper(id)``) and only a back-quoted name can refer to.

It does not catch (it accepts):

* anything in a SELECT whose sources have unknown columns: a table function, a
  ``LATERAL VIEW`` without column aliases, a PIVOT / UNPIVOT, VALUES without column aliases,
  a CTE / derived table whose select list has a generator (``explode(xs)``), ``struct.*``;
  unknown names in GROUP BY / HAVING / ORDER BY... of a SELECT with a generator;
* back-quoted names that could be some computed column's generated name (``upper(id)``);
* struct fields (``payload.nope``), ambiguous names, names in ``* EXCEPT (...)``, the
  number and types of a function's arguments, aggregation rules: whatever needs Spark's
  analyzer and the column types;
* aliases of an enclosing query used in a subquery (accepted although Spark doesn't
  resolve them: more names are accepted than Spark would resolve, never fewer).

Differences that come from sqlglot's parser rather than from these checks:

* sqlglot accepts a few malformed queries that Spark rejects (``SELECT a,, b``).
* It rejects a few unusual forms that Spark accepts: ``TABLE source``; keywords used as
  unquoted column names (``inner``, ``values``, ``for``...; the message suggests back-quotes);
  nested variant paths (``v:a.b``). ``window(...)`` as a function call is handled here.

Stricter than Spark on purpose: rules 1, 3, 4 and 6 (Spark happily runs ``SELECT 1``,
``SHOW TABLES`` or ``reflect(...)``, but none is a streaming transform an editor may write).

Everything here is plain Python plus sqlglot: no Django, no Celery, no PySpark.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from .functions import ALLOWED, GRAMMAR_FUNCTIONS, REFUSED

__all__ = ["SQLError", "check_transform_sql"]


class SQLError(ValueError):
    """Transform SQL that would fail in Spark; ``str(error)`` is written for the user."""


def check_transform_sql(
    sql: str, *, source_view: str = "source", columns: Sequence[str] | None = None
) -> None:
    """Raise SQLError unless ``sql`` is one query reading only ``source_view``.

    ``columns``, the source view's column names, enables the (conservative) check of column
    references described in the module docstring.
    """
    statements = _parse(sql, source_view)
    if not statements:
        raise SQLError(
            "transform SQL is empty: expected a query such as "  # noqa: S608 (a message, not SQL)
            f"SELECT * FROM {source_view}"
        )
    if len(statements) > 1:
        raise SQLError(
            f"transform SQL must be a single query, but it has {len(statements)} statements "
            "separated by ';'"
        )
    statement = statements[0]
    if not isinstance(statement, _QUERY_TYPES):
        raise SQLError(
            f"transform SQL must be a query (SELECT ...), not {_statement_kind(statement)}"
        )
    _check_calls(sql, source_view)
    checker = _Checker(sql, source_view, columns)
    try:
        checker.query(statement, {}, None)
        checker.check_remaining_tables(statement)
        checker.check_remaining_os_user_names(statement)
    except RecursionError:
        raise SQLError("transform SQL is nested too deeply") from None
    if not checker.reads_view:
        raise SQLError(
            f"transform never reads the view '{source_view}'; a streaming transform must select "
            f"FROM {source_view}"
        )


_EXPRESSION_ALIAS = "_cp_expression"
_LINE = re.compile(r"\bline (\d+)")
_TRANSFORM_WORDS = re.compile(r"^transform (SQL )?")


def check_expression(
    text: str, *, source_view: str = "source", columns: Sequence[str] | None = None
) -> None:
    """Raise SQLError unless ``text`` is one Spark SQL expression over the columns of
    ``source_view`` (a sink's key, value or header), under the same rules as a transform:
    every function it calls on the allow-list, no table but the view. Its problems are
    described with the expression's own line numbers."""
    if not text.strip():
        raise SQLError("is empty: expected an expression such as upper(name)")
    # The text on lines of its own, so that a -- comment in it ends with its line.
    sql = f"SELECT (\n{text}\n) AS {_EXPRESSION_ALIAS} FROM {source_view}"  # noqa: S608
    try:
        check_transform_sql(sql, source_view=source_view, columns=columns)
        statement = _parse(sql, source_view)[0]
    except SQLError as exc:
        message = _LINE.sub(lambda m: f"line {max(1, int(m.group(1)) - 1)}", str(exc))
        raise SQLError(_TRANSFORM_WORDS.sub("", message)) from None
    clauses = ("where", "group", "having", "order", "limit", "joins", "qualify", "windows")
    if (
        not isinstance(statement, exp.Select)
        or len(statement.expressions) != 1
        or statement.expressions[0].alias != _EXPRESSION_ALIAS
        or any(statement.args.get(clause) for clause in clauses)
    ):
        raise SQLError("must be one SQL expression, such as concat(a, '-', b)")
    inner = statement.expressions[0].this
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Tuple | exp.Star | exp.Alias):
        raise SQLError("must be one SQL expression (not a list, * or an alias), such as upper(a)")
    if inner.find(exp.Select, exp.Star) is not None:
        raise SQLError("must not contain a subquery or *: one expression over the row's columns")


# --------------------------------------------------------------------------------------------
# Parsing

_DIALECT = Dialect.get_or_raise("spark")
_QUERY_TYPES = (exp.Select, exp.SetOperation, exp.Subquery, exp.Values)
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_TOKEN_REPR = re.compile(r"<Token token_type: [\w.]+, text: (.*?), line: .*?>")
_KEYWORDS = frozenset(_DIALECT.tokenizer_class.KEYWORDS)


def _parse(sql: str, source_view: str = "source") -> list[exp.Expr]:
    try:
        tokens = _DIALECT.tokenize(sql)
    except TokenError as e:
        raise SQLError(_token_error_message(sql, e)) from None
    _check_tokens(sql, tokens)
    _treat_keyword_calls_as_functions(tokens)
    try:
        parsed = _DIALECT.parser(error_level=ErrorLevel.RAISE).parse(tokens, sql)
    except ParseError as e:
        # sqlglot also checks the number of arguments of the functions it knows: where that
        # fails, a call that is not allowed at all is the more useful message.
        with contextlib.suppress(_CallSyntaxError):
            _check_calls(sql, source_view)
        raise SQLError(_parse_error_message(e)) from None
    except TokenError as e:  # raised for the contents of /*+ hints */
        raise SQLError(_token_error_message(sql, e)) from None
    except RecursionError:
        raise SQLError("transform SQL is nested too deeply") from None
    except Exception:
        # sqlglot's parser crashes on some malformed input (e.g. a stray backslash in a call);
        # that input is a syntax error for Spark too.
        raise SQLError(
            "syntax error: the transform SQL could not be parsed (check its brackets, quotes "
            "and commas)"
        ) from None
    return [statement for statement in parsed if statement is not None]


def _treat_keyword_calls_as_functions(tokens: list[Token]) -> None:
    """Read ``window(ts, '5 minutes')`` as a function call, as Spark does.

    sqlglot reads WINDOW as the keyword of a named-window clause, so ``GROUP BY window(...)``,
    the usual streaming aggregation, would not parse. A WINDOW directly followed by ``(``
    can only be the function.
    """
    for token, following in itertools.pairwise(tokens):
        if token.token_type == TokenType.WINDOW and following.token_type == TokenType.L_PAREN:
            token.token_type = TokenType.VAR


def _line_and_column(sql: str, offset: int) -> tuple[int, int]:
    line = sql.count("\n", 0, offset) + 1
    return line, offset - (sql.rfind("\n", 0, offset) + 1) + 1


def _token_error_message(sql: str, error: TokenError) -> str:
    """sqlglot's tokenizer errors carry no position; find the unterminated literal ourselves."""
    i, n = 0, len(sql)
    while i < n:
        if sql.startswith("--", i):
            end = sql.find("\n", i)
            i = n if end < 0 else end + 1
            continue
        if sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if end < 0:
                line, column = _line_and_column(sql, i)
                return f"comment opened with '/*' at line {line}, column {column} is never closed"
            i = end + 2
            continue
        quote = sql[i]
        if quote in "'\"`":
            j = i + 1
            while j < n and sql[j] != quote:
                j += 2 if sql[j] == "\\" and quote != "`" else 1
            if j >= n:
                line, column = _line_and_column(sql, i)
                what = "back-quoted name" if quote == "`" else "string"
                return f"unterminated {what} starting at line {line}, column {column}"
            i = j + 1
            continue
        i += 1
    detail = _ANSI.sub("", str(error)).strip()
    return f"transform SQL could not be read: {detail}"


def _parse_error_message(error: ParseError) -> str:
    if not error.errors:
        return f"syntax error: {_ANSI.sub('', str(error)).strip()}"
    first = error.errors[0]
    description = str(first.get("description") or "invalid syntax")
    highlight = str(first.get("highlight") or "")
    line, column = first.get("line"), first.get("col")
    at_end = not str(first.get("end_context") or "").strip()
    if description.startswith("Required keyword"):  # the parser wanted more
        description = "the statement is incomplete" if at_end else "unexpected token"
    elif description.startswith("Invalid expression"):
        description = "unexpected token"
    elif description.startswith("Expecting "):
        description = f"expected '{description.removeprefix('Expecting ')}'"
    description = re.sub(r"<class '[\w.]+\.(\w+)'>", r"\1", description)
    description = _TOKEN_REPR.sub(lambda m: repr(m.group(1)), description)
    if highlight.upper() in _KEYWORDS and description == "unexpected token":
        description += f" (if '{highlight}' is a column name, back-quote it: `{highlight}`)"
    where = ""
    if isinstance(line, int) and isinstance(column, int):
        # sqlglot reports the column of the highlighted token's last character.
        if highlight and "\n" not in highlight:
            column = max(1, column - len(highlight) + 1)
        where = f" at line {line}, column {column}"
    near = f" near '{highlight}'" if highlight else ""
    return f"syntax error{where}{near}: {description}"


_STATEMENT_KINDS: dict[type[exp.Expr], str] = {
    exp.Insert: "INSERT",
    exp.Update: "UPDATE",
    exp.Delete: "DELETE",
    exp.Merge: "MERGE",
    exp.Create: "CREATE",
    exp.Drop: "DROP",
    exp.Alter: "ALTER",
    exp.Set: "SET",
    exp.Use: "USE",
    exp.Describe: "DESCRIBE",
    exp.Cache: "CACHE TABLE",
    exp.Uncache: "UNCACHE TABLE",
}


def _statement_kind(statement: exp.Expr) -> str:
    for kind, name in _STATEMENT_KINDS.items():
        if isinstance(statement, kind):
            return f"{_article(name)} {name} statement"
    if isinstance(statement, exp.Command):
        name = statement.name.upper()
        return f"{_article(name)} {name} command"
    if isinstance(statement, exp.DDL | exp.DML):
        name = type(statement).__name__.upper()
        return f"{_article(name)} {name} statement"
    return "an expression"


def _article(word: str) -> str:
    return "an" if word[:1] in "AEIO" or word.startswith(("UN", "UP")) else "a"


# --------------------------------------------------------------------------------------------
# Function calls
#
# Spark runs the transform's *text*, so each call is judged on the name written there. sqlglot
# maps written names to typed expressions (``date_add`` may become TsOrDsAdd, ``size``
# ArraySize...) and regenerates other names, so this check parses the SQL a second time with
# _CallParser: Spark's parser with no known functions, so that every ordinary call becomes
# exp.Anonymous, and every call, whatever its form, marked with the token of its name.


@dataclass(frozen=True)
class _Call:
    """What _CallParser records about one call: its name token and any qualifier."""

    token: Token
    qualifier: list[str]  # ["system", "builtin"] in system.builtin.reflect(...)


_CALL = "controlplane_call"  # the key of a _Call in a node's meta

# sqlglot's Spark parser reads these names with a parser of their own rather than as a plain
# call. Each was reviewed (tests/test_spec_sql.py fails when sqlglot adds one): kept where
# Spark's grammar has the same special form, dropped otherwise, so that the call is read as a
# plain call named as written.
_FUNCTION_PARSERS_KEPT = frozenset(
    {
        "CAST",  # CAST(x AS type)
        "TRY_CAST",  # TRY_CAST(x AS type)
        "EXTRACT",  # EXTRACT(field FROM source)
        "POSITION",  # POSITION(substr IN str)
        "SUBSTR",  # SUBSTR(str FROM pos FOR len)
        "SUBSTRING",
        "TRIM",  # TRIM(BOTH 'x' FROM str)
        "OVERLAY",  # OVERLAY(str PLACING s FROM pos FOR len)
    }
)
_FUNCTION_PARSERS_DROPPED = frozenset(
    {
        # Plain calls in Spark (sqlglot's parsers read other dialects' forms of them).
        "AND",
        "APPROX_PERCENTILE",
        "CEIL",
        "CHAR",
        "CHR",
        "DECODE",
        "FLOOR",
        "INITCAP",
        "LISTAGG",
        "MAX_BY",
        "MIN_BY",
        "OR",
        "PERCENTILE",
        "PERCENTILE_APPROX",
        "STRING_AGG",
        # Join hints: inside /*+ ... */, which this check reads on its own terms.
        "BROADCAST",
        "BROADCASTJOIN",
        "MAPJOIN",
        "MERGE",
        "MERGEJOIN",
        "SHUFFLEMERGE",
        "SHUFFLE_HASH",
        "SHUFFLE_REPLICATE_NL",
        # Not Spark functions at all: read as plain calls, refused as unknown names.
        "ARGMAX",
        "ARGMIN",
        "ARG_MAX",
        "ARG_MIN",
        "CONVERT",
        "GAP_FILL",
        "JSON_OBJECT",
        "JSON_OBJECTAGG",
        "JSON_TABLE",
        "MATCH",
        "NORMALIZE",
        "OPENJSON",
        "SAFE_CAST",
        "TRY_CONVERT",
        "WEIGHT_STRING",
        "XMLELEMENT",
        "XMLTABLE",
    }
)
# The same for names read without parentheses, or with a parser of their own.
_NO_PAREN_FUNCTION_PARSERS_KEPT = frozenset(
    {
        "ANY",  # any(expr); x LIKE ANY (...)
        "CASE",  # CASE ... END
        "IF",  # if(cond, a, b): sqlglot needs its parser to read IF as a call
        "TRANSFORM",  # transform(xs, x -> ...), and the script form TRANSFORM(...) USING
    }
)
_NO_PAREN_FUNCTION_PARSERS_DROPPED = frozenset({"CONNECT_BY_ROOT"})  # Oracle's; not Spark
# Nodes sqlglot builds from operators and literals rather than from a named call: the only
# functions (exp.Func) allowed without a recorded name.
_SYNTAX_FUNCTIONS: tuple[type[exp.Expr], ...] = (
    exp.Cast,  # x::type, typed literals (DATE '2020-01-01', 1Y, 3BD); TryCast is a Cast
    exp.Concat,  # adjacent string literals: 'a' 'b'
    exp.If,  # the WHEN branches of CASE
    exp.And,
    exp.Or,
    exp.Xor,
    exp.RegexpLike,  # x RLIKE y, x REGEXP y
    exp.SubqueryPredicate,  # EXISTS (subquery), LIKE ANY / ALL (...)
    exp.Collate,  # x COLLATE name
)
# What _parse_window may wrap a call in.
_CALL_WRAPPERS = (exp.Window, exp.WithinGroup, exp.Filter, exp.IgnoreNulls, exp.RespectNulls)
_STRING_TOKENS = frozenset(t for t in TokenType if t.name.endswith("STRING"))
_SCRIPT_TRANSFORM = (
    "transform uses a script transform (TRANSFORM / MAP / REDUCE ... USING '<command>'){at}, "
    "which is not allowed: it runs a shell command"
)
_OS_USER_NAMES = frozenset({"user", "current_user", "session_user"})


class _CallParser(_DIALECT.parser_class):  # type: ignore[name-defined,misc]
    """Spark's parser, keeping every function call's name as written (see above)."""

    FUNCTIONS: dict = {}  # every ordinary call becomes exp.Anonymous
    # Not Spark syntax (ARRAY[1, 2]), and it would read array(x)[0], now an Anonymous named
    # "array", as ARRAY[0], dropping the call's arguments.
    ARRAY_CONSTRUCTORS: dict = {}
    FUNCTION_PARSERS = {
        name: parse
        for name, parse in _DIALECT.parser_class.FUNCTION_PARSERS.items()
        if name in _FUNCTION_PARSERS_KEPT
    }
    NO_PAREN_FUNCTION_PARSERS = {
        name: parse
        for name, parse in _DIALECT.parser_class.NO_PAREN_FUNCTION_PARSERS.items()
        if name in _NO_PAREN_FUNCTION_PARSERS_KEPT
    }

    def _parse_function_call(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        index = self._index
        token = self._curr
        node = super()._parse_function_call(*args, **kwargs)
        call = node
        while isinstance(call, _CALL_WRAPPERS):
            call = call.this
        if (
            isinstance(call, exp.Expr)
            and not isinstance(call, exp.SubqueryPredicate)  # syntax: x LIKE ALL ('a', 'b')
            and token is not None
            and _CALL not in call.meta
        ):
            qualifier = self._qualifier(index)
            called = index + 1 < len(self._tokens) and (
                self._tokens[index + 1].token_type == TokenType.L_PAREN
            )
            if called or not qualifier:  # a.current_date is a field, not a call
                call.meta[_CALL] = _Call(token, qualifier)
        return node

    def _parse_hint(self):  # type: ignore[no-untyped-def]
        # sqlglot reads a hint's body with the dialect's own parser: use this one instead.
        if self._match(TokenType.HINT) and self._prev_comments:
            text = self._prev_comments[0]
            parser = _CallParser(error_level=ErrorLevel.IMMEDIATE, dialect=self.dialect)
            return parser.parse_into(exp.Hint, self.dialect.tokenize(text), text)[0]
        return None

    def _qualifier(self, index: int) -> list[str]:
        """The qualifier written before the token at ``index``: a.b in ``a.b.f(...)``."""
        parts: list[str] = []
        while index >= 2 and self._tokens[index - 1].token_type == TokenType.DOT:
            index -= 2
            parts.insert(0, self._tokens[index].text)
        return parts


def _check_tokens(sql: str, tokens: list[Token]) -> None:
    """Refuse, from the tokens alone, the forms that reach a shell or name things by string.

    A backstop that holds even where sqlglot cannot parse what Spark can (``FROM source MAP
    id USING 'cat'``): Spark's script transforms always have ``USING '<command>'``, and only
    they have ``ROW FORMAT``, ``RECORDWRITER`` and ``RECORDREADER``.
    """
    for i, token in enumerate(tokens):
        following = tokens[i + 1] if i + 1 < len(tokens) else None
        word = token.text.upper() if token.token_type != TokenType.IDENTIFIER else ""
        if (
            (
                token.token_type == TokenType.USING
                and following is not None
                and following.token_type in _STRING_TOKENS
            )
            or word in ("RECORDWRITER", "RECORDREADER")
            or (
                word == "ROW"
                and following is not None
                and following.token_type != TokenType.IDENTIFIER
                and following.text.upper() == "FORMAT"
            )
        ):
            raise SQLError(_SCRIPT_TRANSFORM.format(at=_at(sql, token)))
        if (
            word == "IDENTIFIER"
            and following is not None
            and following.token_type == TokenType.L_PAREN
        ):
            raise SQLError(
                f"transform uses IDENTIFIER(...){_at(sql, token)}, which is not allowed: it "
                "names a table or function with a string, which this check cannot follow"
            )


def _at(sql: str, token: Token) -> str:
    if not 0 <= token.start < len(sql):
        return ""
    line, column = _line_and_column(sql, token.start)
    return f" at line {line}, column {column}"


class _CallSyntaxError(SQLError):
    """SQL that _CallParser cannot read (the main parse reports such errors first)."""


def _check_calls(sql: str, source_view: str) -> None:
    """Refuse every function call that is not on the allow-list, judged on its written name."""
    try:
        tokens = _DIALECT.tokenize(sql)
        _treat_keyword_calls_as_functions(tokens)
        statements = _CallParser(error_level=ErrorLevel.RAISE, dialect=_DIALECT).parse(tokens, sql)
    except ParseError as e:
        raise _CallSyntaxError(_parse_error_message(e)) from None
    except TokenError as e:
        raise _CallSyntaxError(_token_error_message(sql, e)) from None
    except RecursionError:
        raise _CallSyntaxError("transform SQL is nested too deeply") from None
    except Exception:
        raise _CallSyntaxError(
            "syntax error: the transform SQL could not be parsed (check its brackets, quotes "
            "and commas)"
        ) from None
    stack: list[exp.Expr] = [s for s in statements if s is not None]
    while stack:
        node = stack.pop()
        if isinstance(node, exp.Hint):
            _check_hint(node)
            continue
        _check_call(sql, node, source_view)
        stack.extend(node.iter_expressions())


def parse_query(sql: str) -> exp.Expr:
    """The one query of SQL that check_transform_sql accepted, each call's name as written
    (see call_name)."""
    tokens = _DIALECT.tokenize(sql)
    _treat_keyword_calls_as_functions(tokens)
    parser = _CallParser(error_level=ErrorLevel.RAISE, dialect=_DIALECT)
    statements = [s for s in parser.parse(tokens, sql) if s is not None]
    if len(statements) != 1:
        raise SQLError("transform SQL must be a single query")
    return statements[0]


def expression_columns(text: str) -> set[str]:
    """The column names (lower case) an expression that check_expression accepted refers to."""
    tokens = _DIALECT.tokenize(text)
    _treat_keyword_calls_as_functions(tokens)
    parsed = _DIALECT.parser(error_level=ErrorLevel.RAISE).parse(tokens, text)
    names = set()
    for statement in parsed:
        for column in statement.find_all(exp.Column) if statement else ():
            names.add(column.name.lower())
            if column.table:
                names.add(column.table.lower())  # window.start: the column window
    return names


def call_name(node: exp.Expr) -> str | None:
    """The name of a call (lower case) as written, in a tree from parse_query; None for
    anything else."""
    call = node.meta.get(_CALL)
    return call.token.text.lower() if isinstance(call, _Call) else None


def _check_call(sql: str, node: exp.Expr, source_view: str) -> None:
    call = node.meta.get(_CALL)
    if isinstance(node, exp.QueryTransform):
        at = _at(sql, call.token) if isinstance(call, _Call) else ""
        raise SQLError(_SCRIPT_TRANSFORM.format(at=at))
    if not isinstance(call, _Call):
        if isinstance(node, exp.Func) and not isinstance(node, _SYNTAX_FUNCTIONS):
            raise SQLError(
                f"transform uses '{node.sql(dialect='spark')}', which this check does not "
                "recognise as one of the allowed Spark functions"
            )
        return
    written = call.token.text
    name = written.lower()
    at = _at(sql, call.token)
    if call.qualifier:
        full = ".".join([*call.qualifier, written])
        raise SQLError(
            f"transform calls the function '{full}'{at}, which is not allowed: call built-in "
            "functions by their plain name"
        )
    in_from = isinstance(node.parent, exp.Table | exp.Lateral) and node.arg_key == "this"
    if in_from and name not in _GENERATOR_FUNCTIONS:
        raise SQLError(
            f"transform calls the table function '{name}'; it may only read the view "
            f"'{source_view}'"
        )
    if name in ALLOWED or name in GRAMMAR_FUNCTIONS:
        return
    reason = REFUSED.get(name)
    if reason is None:
        reason = "it is not one of Spark's built-in functions" + _suggest(
            name, sorted(ALLOWED | GRAMMAR_FUNCTIONS)
        )
    raise SQLError(f"transform calls the function '{name}'{at}, which is not allowed: {reason}")


def _check_hint(hint: exp.Hint) -> None:
    """Hints (``/*+ REPARTITION(3, id) */``) take numbers, names and columns, never calls."""
    for item in hint.expressions:
        if not isinstance(item, exp.Expr):  # sqlglot could not read it
            raise SQLError(
                f"transform has a hint that could not be read: /*+ {item} */; hints take "
                "only names, numbers and column names"
            )
        hint_call = item.meta.get(_CALL)
        hint_name = hint_call.token.text if isinstance(hint_call, _Call) else item.sql("spark")
        for node in item.iter_expressions():
            for inner in node.walk():
                call = inner.meta.get(_CALL)
                if isinstance(call, _Call):
                    name = f"the function '{call.token.text.lower()}'"
                elif isinstance(inner, exp.Func | exp.QueryTransform):
                    name = f"'{inner.sql(dialect='spark')}'"
                else:
                    continue
                raise SQLError(
                    f"transform calls {name} in the hint '{hint_name}', which is not "
                    "allowed: hints take only names, numbers and column names"
                )


# --------------------------------------------------------------------------------------------
# Tables and columns

# Table-valued functions that only generate rows from their arguments: harmless in a transform.
_GENERATOR_FUNCTIONS = frozenset(
    {
        "range",
        "explode",
        "explode_outer",
        "posexplode",
        "posexplode_outer",
        "inline",
        "inline_outer",
        "stack",
        "json_tuple",
        "variant_explode",
        "variant_explode_outer",
    }
)
# How a temporary view may be named: "source", "session.source" or "system.session.source".
_TEMP_VIEW_QUALIFIERS = ([], ["session"], ["system", "session"])
# Unqualified names Spark resolves without a column: niladic functions written without "()".
_BUILTIN_NAMES = frozenset(
    {"current_date", "current_timestamp", "current_user", "current_time", "user", "session_user"}
)
# Units Spark reads as keywords in timestampadd(HOUR, ...), datediff(DAY, ...) and friends.
_DATETIME_UNITS = frozenset(
    {
        "year",
        "years",
        "quarter",
        "quarters",
        "month",
        "months",
        "week",
        "weeks",
        "day",
        "days",
        "dayofyear",
        "hour",
        "hours",
        "minute",
        "minutes",
        "second",
        "seconds",
        "millisecond",
        "milliseconds",
        "microsecond",
        "microseconds",
        "nanosecond",
        "nanoseconds",
    }
)
# Grouping functions whose result Spark names after the function: GROUP BY window(...) makes
# the column "window" (with .start and .end) available to the select list.
_NAMED_GROUPING_FUNCTIONS = frozenset({"window", "session_window"})
# Clauses that may refer to the select list's aliases and output names.
_OUTPUT_CLAUSES = (
    "group",
    "having",
    "qualify",
    "windows",
    "distribute",
    "sort",
    "cluster",
    "order",
)

# Stands for "and names generated from SQL text, e.g. `upper(id)`" in a set of column names.
_SPELLED_OUT = "\x00spelled out"
_PLAIN_NAME = re.compile(r"[A-Za-z0-9_]+")
# The names a query makes available: None when they cannot all be known.
_Names: TypeAlias = frozenset[str] | None


@dataclass
class _Scope:
    """What an unqualified or qualified column name can refer to inside one SELECT."""

    parent: _Scope | None
    sources: dict[str, _Names] = field(default_factory=dict)  # alias -> its column names
    names: _Names = frozenset()  # the union of the sources' columns
    aliases: frozenset[str] = frozenset()  # select-list aliases and output names

    def resolves(self, name: str, visible: frozenset[str]) -> bool:
        """Whether ``name`` can be a column here, given the aliases ``visible`` to the clause.

        Enclosing queries contribute their columns and all their aliases: more than Spark
        allows, which is the safe direction for a check that must not reject valid SQL.
        """
        if self.names is None or _has(self.names, name) or _has(visible, name):
            return True
        scope = self.parent
        while scope is not None:
            if scope.names is None or _has(scope.names, name) or _has(scope.aliases, name):
                return True
            scope = scope.parent
        return False

    def has_own_column(self, name: str) -> bool:
        """Whether ``name`` is certainly a column of this SELECT's own sources.

        Spark resolves a name that is no such column (not even one of an enclosing query, or a
        lateral alias) as a niladic function where one exists: ``user`` is user().
        """
        return self.names is not None and name in self.names

    def source(self, alias: str) -> tuple[bool, _Names]:
        scope: _Scope | None = self
        while scope is not None:
            if alias in scope.sources:
                return True, scope.sources[alias]
            scope = scope.parent
        return False, None

    def candidates(self, visible: frozenset[str]) -> list[str]:
        """The names ``resolves`` accepts, for suggestions."""
        out = set(self.names or ()) | visible
        scope = self.parent
        while scope is not None:
            out |= scope.names or set()
            out |= scope.aliases
            scope = scope.parent
        return sorted(out)


class _Checker:
    """Walks one query, checking the tables it reads and, optionally, its column references."""

    def __init__(self, sql: str, source_view: str, columns: Sequence[str] | None) -> None:
        self.sql = sql
        self.view = source_view
        self.view_key = source_view.lower()
        self.columns: _Names = None if columns is None else frozenset(c.lower() for c in columns)
        self.check_columns = columns is not None
        self.reads_view = False
        self.seen_tables: set[int] = set()
        self.cte_names: set[str] = set()
        self.os_user_checked: set[int] = set()

    # -- queries -----------------------------------------------------------------------------

    def query(self, node: exp.Expr, ctes: dict[str, _Names], outer: _Scope | None) -> _Names:
        """Check a query and return the names of its output columns (None if unknown)."""
        ctes = self.with_clause(node, ctes, outer)
        if isinstance(node, exp.Subquery):
            return self.query(node.this, ctes, outer)
        if isinstance(node, exp.SetOperation):
            left = self.query(node.left, ctes, outer)
            right = self.query(node.right, ctes, outer)
            # ORDER BY / LIMIT after a UNION see the output names (Spark takes the left's).
            both = None if left is None or right is None else left | right
            scope = _Scope(outer, names=both)
            for key in ("order", "limit", "offset"):
                self.expressions(node.args.get(key), scope, ctes, key, frozenset())
            return left
        if isinstance(node, exp.Select):
            return self.select(node, ctes, outer)
        return None  # VALUES, or something sqlglot parsed that this module doesn't model

    def with_clause(
        self, node: exp.Expr, ctes: dict[str, _Names], outer: _Scope | None
    ) -> dict[str, _Names]:
        with_ = node.args.get("with_")
        if not isinstance(with_, exp.With):
            return ctes
        ctes = dict(ctes)
        for cte in with_.expressions:
            name = cte.alias_or_name.lower()
            self.cte_names.add(name)
            if with_.args.get("recursive"):
                ctes[name] = None
            names = self.query(cte.this, ctes, outer)
            ctes[name] = self.aliased(cte.args.get("alias"), names)
        return ctes

    @staticmethod
    def aliased(alias: exp.Expr | None, names: _Names) -> _Names:
        """A ``name(col1, col2)`` alias renames the columns."""
        if isinstance(alias, exp.TableAlias) and alias.columns:
            return frozenset(c.name.lower() for c in alias.columns)
        return names

    def select(self, node: exp.Select, ctes: dict[str, _Names], outer: _Scope | None) -> _Names:
        scope = _Scope(outer)
        from_ = node.args.get("from_")
        items = [from_.this] if isinstance(from_, exp.From) else []
        items += [join.this for join in node.args.get("joins") or []]
        for item in items:
            alias, names = self.source(item, ctes, scope)
            scope.sources[alias.lower()] = names
        union: set[str] = set()
        for names in scope.sources.values():
            if names is None:
                scope.names = None
                break
            union |= names
        else:
            scope.names = frozenset(union)
        for lateral in node.args.get("laterals") or []:  # LATERAL VIEW explode(xs) t AS x
            names = self.aliased(lateral.args.get("alias"), None)
            if lateral.alias:
                scope.sources[lateral.alias.lower()] = names
            scope.names = None if names is None or scope.names is None else scope.names | names

        outputs = self.outputs(node, scope)
        # Lateral column aliases: a projection sees the aliases defined to its left, and the
        # column a window(...) / session_window(...) grouping produces.
        defined = {
            call.name.lower()
            for call in self.walk(node)
            if isinstance(call, exp.Anonymous) and call.name.lower() in _NAMED_GROUPING_FUNCTIONS
        }
        visible_to: list[frozenset[str]] = []
        for projection in node.expressions:
            visible_to.append(frozenset(defined))
            if isinstance(projection, exp.Alias):
                defined.add(projection.alias.lower())
            elif isinstance(projection, exp.Aliases):
                defined |= {e.name.lower() for e in projection.expressions}
        # GROUP BY, HAVING, ORDER BY... also see output names, e.g. "id" for payload.id.
        scope.aliases = frozenset(defined | (outputs or set()))
        output_visible = scope.aliases if outputs is not None else None

        for projection, visible in zip(node.expressions, visible_to, strict=True):
            self.expressions(projection, scope, ctes, "select", visible)
        none: frozenset[str] = frozenset()
        for join in node.args.get("joins") or []:
            self.expressions(join.args.get("on"), scope, ctes, "on", none)
        for lateral in node.args.get("laterals") or []:
            self.expressions(lateral.this, scope, ctes, "lateral", none)
        self.expressions(node.args.get("where"), scope, ctes, "where", none)
        for key in _OUTPUT_CLAUSES:
            if output_visible is None:  # a generator in the select list: unknown output names
                self.expressions(node.args.get(key), _Scope(scope, names=None), ctes, key, none)
            else:
                self.expressions(node.args.get(key), scope, ctes, key, output_visible)
        return outputs

    def source(self, item: exp.Expr, ctes: dict[str, _Names], scope: _Scope) -> tuple[str, _Names]:
        """Check one FROM / JOIN item, returning its alias and column names."""
        alias = item.alias
        names: _Names = None
        if isinstance(item, exp.Table):
            self.seen_tables.add(id(item))
            alias = alias or item.name
            if isinstance(item.this, exp.Func):
                self.table_function(item.this)
            else:
                names = self.table(item, ctes)
        elif isinstance(item, exp.Subquery):
            names = self.query(item, ctes, scope.parent)
        elif isinstance(item, exp.Lateral) and isinstance(item.this, exp.Subquery):
            # A LATERAL subquery sees the preceding FROM items; don't check its columns.
            self.query(item.this, ctes, _Scope(scope, names=None))
        # Anything else (VALUES, UNNEST, LATERAL VIEW-like functions) has unknown columns; the
        # tables inside it, if any, are left to check_remaining_tables.
        if item.args.get("pivots"):
            names = None
        return alias, self.aliased(item.args.get("alias"), names)

    def table(self, table: exp.Table, ctes: dict[str, _Names]) -> _Names:
        name = table.name.lower()
        qualifier = [part.name.lower() for part in table.parts[:-1]]
        if not qualifier and name in ctes:
            return ctes[name]
        if name == self.view_key and qualifier in _TEMP_VIEW_QUALIFIERS:
            self.reads_view = True
            return self.columns
        raise SQLError(
            f"transform reads table '{_table_name(table)}'; only the view '{self.view}' is "
            "available"
        )

    def table_function(self, function: exp.Func) -> None:
        name = function.name if isinstance(function, exp.Anonymous) else function.sql_name()
        if name.lower() not in _GENERATOR_FUNCTIONS:
            raise SQLError(
                f"transform calls the table function '{name.lower()}'; it may only read the "
                f"view '{self.view}'"
            )

    def check_remaining_tables(self, statement: exp.Expr) -> None:
        """Check tables in places this walker doesn't model, by name only."""
        for table in statement.find_all(exp.Table):
            if id(table) in self.seen_tables or table.find_ancestor(exp.Hint):
                continue
            if isinstance(table.this, exp.Func):
                self.table_function(table.this)
                continue
            if len(table.parts) > 1 or table.name.lower() not in self.cte_names:
                self.table(table, {})

    def check_remaining_os_user_names(self, statement: exp.Expr) -> None:
        """Refuse ``user`` (and friends) in places this walker doesn't model."""
        for column in statement.find_all(exp.Column):
            if (
                id(column) not in self.os_user_checked
                and len(column.parts) == 1
                and column.name.lower() in _OS_USER_NAMES
                and not column.find_ancestor(exp.Hint)
            ):
                raise self.os_user_name(column)

    def os_user_name(self, column: exp.Column) -> SQLError:
        """``user`` that may not be a column: Spark then calls the function user()."""
        name = column.name
        return SQLError(
            f"transform calls the function '{name.lower()}' {self.at(column.this)}, which is "
            f"not allowed: {REFUSED[name.lower()]} (Spark reads '{name}' as that function "
            f"unless the source has such a column; to read a column named '{name}', qualify "
            f"it: {self.view}.{name})"
        )

    def outputs(self, node: exp.Select, scope: _Scope) -> _Names:
        """The names of the select list's columns, as Spark names them (None if unknown)."""
        out: set[str] = set()
        for projection in node.expressions:
            if isinstance(projection, exp.Star):
                names = scope.names
            elif isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star):
                found, names = scope.source(projection.table.lower())
                names = names if found else None  # struct_column.*: its fields are unknown
            elif isinstance(projection, exp.Alias):
                names = frozenset({projection.alias.lower()})
            elif isinstance(projection, exp.Aliases):
                names = frozenset(e.name.lower() for e in projection.expressions)
            else:
                names = _generated_name(projection)
            if names is None:
                return None
            out |= names
        return frozenset(out)

    # -- expressions -------------------------------------------------------------------------

    @staticmethod
    def walk(node: exp.Expr) -> Iterator[exp.Expr]:
        """The nodes of one SELECT, without descending into nested queries."""
        stack = [node]
        while stack:
            current = stack.pop()
            yield current
            for child in current.iter_expressions():
                if not isinstance(child, exp.Query | exp.Subquery):
                    stack.append(child)

    def expressions(
        self,
        node: exp.Expr | list | None,
        scope: _Scope,
        ctes: dict[str, _Names],
        clause: str,
        visible: frozenset[str],
    ) -> None:
        """Check the column references in one clause; ``visible``: the aliases it may use."""
        if node is None:
            return
        if isinstance(node, list):
            for item in node:
                self.expressions(item, scope, ctes, clause, visible)
            return
        stack: list[tuple[exp.Expr, frozenset[str]]] = [(node, frozenset())]
        while stack:
            current, bound = stack.pop()
            if isinstance(current, exp.Query | exp.Subquery):
                self.query(current, ctes, scope)  # scalar, IN or EXISTS subquery
                continue
            if isinstance(current, exp.Column):
                self.column(current, scope, clause, bound | visible, bound)
                continue
            if isinstance(current, exp.Hint | exp.DataType | exp.Star):
                continue
            if isinstance(current, exp.Lambda):
                bound = bound | {e.name.lower() for e in current.expressions}
            stack.extend((child, bound) for child in current.iter_expressions())

    def column(
        self,
        column: exp.Column,
        scope: _Scope,
        clause: str,
        visible: frozenset[str],
        lambda_variables: frozenset[str] = frozenset(),
    ) -> None:
        """Check one column reference; ``visible``: the aliases and lambda variables in scope."""
        self.os_user_checked.add(id(column))
        name = column.name.lower()
        if (
            len(column.parts) == 1
            and name in _OS_USER_NAMES
            and name not in lambda_variables
            and not scope.has_own_column(name)
        ):
            raise self.os_user_name(column)
        if not self.check_columns or isinstance(column.this, exp.Star):
            return
        parts = column.parts
        first = parts[0].name.lower()
        if len(parts) > 1:
            found, names = scope.source(first)
            if found:
                field_name = parts[1].name.lower()
                if names is None or _has(names, field_name) or scope.resolves(first, visible):
                    return
                raise SQLError(
                    f"unknown column '{column.sql(dialect='spark')}' {self.at(parts[1])}: "
                    f"'{parts[0].name}' has no column '{parts[1].name}'"
                    + _suggest(field_name, sorted(names))
                )
            if first == self.view_key or (len(parts) > 2 and not scope.resolves(first, visible)):
                return  # maybe a qualified table name (spark_catalog.default.t.c): let Spark say
        if scope.resolves(first, visible) or first in _BUILTIN_NAMES:
            return
        if first in _DATETIME_UNITS and isinstance(column.parent, exp.Func):
            return
        written = parts[0].name
        inside = f" (in '{column.sql(dialect='spark')}')" if len(parts) > 1 else ""
        raise SQLError(
            f"unknown column '{written}'{inside} {self.at(parts[0])}"
            + _suggest(first, scope.candidates(visible))
        )

    def at(self, identifier: exp.Expr) -> str:
        start = identifier.meta.get("start") if identifier.meta else None
        if not isinstance(start, int):
            return "in the transform"
        line, column = _line_and_column(self.sql, start)
        return f"at line {line}, column {column}"


def _table_name(table: exp.Table) -> str:
    return ".".join(part.name for part in table.parts)


def _has(names: frozenset[str], name: str) -> bool:
    """Whether ``names`` (which may include _SPELLED_OUT) contains ``name``."""
    return name in names or (_SPELLED_OUT in names and _PLAIN_NAME.fullmatch(name) is None)


def _generated_name(projection: exp.Expr) -> frozenset[str] | None:
    """The name Spark gives an unaliased select-list expression, or None if unknown.

    Spark names a column reference, a cast of one (Spark 4) and a literal after themselves;
    other expressions after their SQL text, such as ``upper(id)`` or ``(amount + 1)``,
    which only a back-quoted name can match (_SPELLED_OUT). Generators (``explode``...) make
    names of their own.
    """
    while isinstance(projection, exp.Paren | exp.Cast):  # TryCast is a Cast
        projection = projection.this
    if isinstance(projection, exp.Column):
        return frozenset({projection.name.lower()})
    if isinstance(projection, exp.Dot) and isinstance(projection.this, exp.Column):
        return frozenset({projection.name.lower()})
    if isinstance(projection, exp.Literal):
        return frozenset({projection.name.lower(), _SPELLED_OUT})
    if isinstance(projection, exp.Boolean | exp.Null):
        return frozenset({projection.sql().lower()})
    if isinstance(projection, exp.Anonymous):
        name = projection.name.lower()
        if name in _NAMED_GROUPING_FUNCTIONS:
            return frozenset({name})
        if name in _GENERATOR_FUNCTIONS:
            return None
    if isinstance(projection, exp.UDTF | exp.Explode | exp.Inline | exp.Stack):
        return None
    return frozenset({_SPELLED_OUT})


def _suggest(name: str, candidates: list[str]) -> str:
    spelled_out = _SPELLED_OUT in candidates
    candidates = [c for c in candidates if c not in (name, _SPELLED_OUT)]
    close = difflib.get_close_matches(name, candidates, n=1)
    if close:
        return f"; did you mean '{close[0]}'?"
    hint = ""
    if candidates and len(candidates) <= 12:
        hint = f"; available: {', '.join(candidates)}"
    if spelled_out:
        hint += " (computed columns without an alias are named after their SQL text: add AS name)"
    return hint
