"""Checks a pipeline's transform SQL without a JVM.

A transform is ``{"sql": "SELECT ... FROM source ..."}``: the Spark job registers the parsed
Kafka records as the temporary view ``source`` and runs the query over it. A mistake there
would only surface when the job starts (or, worse, restarts), so the web app checks the SQL
when the pipeline is saved, using sqlglot's Spark dialect instead of a Spark session.

The checks, in order, each raising SQLError with a message meant to be shown verbatim:

0. Spark reads the text as sqlglot does (see "Reading the text as Spark does" below): no
   ``${...}`` (Spark substitutes variables into the text first), and sqlglot's tokens are
   the tokens of a port of Spark's lexer (comments, hints, strings, back-quoted names end in
   the same places), else the query is refused where they differ.
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
5. Every table it reads is the source view or one of its own CTEs in scope there, resolved
   as Spark resolves them (see "Relations" below: pipe syntax, ``stream``, hints). Names
   compare case-insensitively, like Spark's, ASCII names only. Table-valued generator
   functions (``range``, ``explode``, ``inline``, ``stack``...) are allowed; other table
   functions are not. tests/test_spec_sql_relations_match_spark.py holds this to Spark's
   own parser.
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
``SHOW TABLES`` or ``reflect(...)``, but none is a streaming transform an editor may write),
and rules 0 and 5 where the check cannot be sure of Spark's reading: a ``--`` comment ending
in a backslash, a table named ``stream``, ``WITH t AS (...) FROM t |> ...`` are refused although
Spark would read only the view (tests/test_spec_sql_relations.py lists such cases).

Everything here is plain Python plus sqlglot: no Django, no Celery, no PySpark.
"""

from __future__ import annotations

import contextlib
import difflib
import itertools
import re
import string
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import TypeAlias

from sqlglot import exp
from sqlglot.dialects.dialect import Dialect
from sqlglot.errors import ErrorLevel, ParseError, TokenError
from sqlglot.tokens import Token, TokenType

from .functions import ALLOWED, GRAMMAR_FUNCTIONS, REFUSED

__all__ = ["SQLError", "check_transform_sql", "output_columns"]


class SQLError(ValueError):
    """Transform SQL that would fail in Spark; ``str(error)`` is written for the user."""


def check_transform_sql(
    sql: str, *, source_view: str = "source", columns: Sequence[str] | None = None
) -> None:
    """Raise SQLError unless ``sql`` is one query reading only ``source_view``.

    ``columns``, the source view's column names, enables the (conservative) check of column
    references described in the module docstring.
    """
    _check_variable_substitution(sql)
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
    pipes = any(token.token_type == TokenType.PIPE_GT for token in _DIALECT.tokenize(sql))
    checker = _Checker(sql, source_view, columns)
    try:
        reads_view = _Relations(sql, source_view, pipes).check(statement)
        checker.query(statement, {}, None)
        checker.check_remaining_os_user_names(statement)
    except RecursionError:
        raise SQLError("transform SQL is nested too deeply") from None
    if not reads_view:
        raise SQLError(
            f"transform never reads the view '{source_view}'; a streaming transform must select "
            f"FROM {source_view}"
        )


def output_columns(
    sql: str, *, source_view: str = "source", columns: Sequence[str] | None = None
) -> frozenset[str] | None:
    """The names (lower case) of the columns a transform outputs, as Spark names them, from
    the SQL and the source view's ``columns``: None where they cannot all be known without
    Spark (``*`` over unknown columns, a generator, VALUES...). Every plain name is listed;
    computed columns without an alias are named after their SQL text (``upper(id)``), which
    a marker in the set stands for: pass the set on as ``columns`` of check_expression to
    check an expression over the output. For SQL check_transform_sql accepts."""
    try:
        statements = _parse(sql, source_view)
        if len(statements) != 1:
            return None
        return _Checker(sql, source_view, columns).query(statements[0], {}, None)
    except (SQLError, RecursionError):
        return None


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
    if not _reads_a_command(tokens):  # a command is refused whatever its text says
        _check_same_tokens(sql, tokens)  # what follows judges sqlglot's reading: Spark's too
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
# Reading the text as Spark does
#
# Every check here judges sqlglot's reading of the text, and Spark runs the text through its
# own lexer (ANTLR, SqlBaseLexer.g4). Where the two end a comment, a string, a quoted name or
# a hint in different places, this check sees one query and Spark runs another: a nested
# ``/* /* */ */``, ``'\''``, ``--`` continued by a backslash, a quote inside a hint... could
# turn ``FROM source`` here into ``FROM other`` there. So the text is also cut the way Spark's
# lexer cuts it (_spark_tokens: a port of its rules for whitespace, comments, hints, strings,
# back-quoted names, words and numbers), and the query is refused unless sqlglot's tokens are
# the same tokens (_check_same_tokens); tests/test_spec_sql_relations_match_spark.py compares
# the port with Spark's own lexer. What the port does not model is refused outright: Spark's
# ${...} variable substitution (done on the text before lexing), a -- comment continued onto
# the next line by a trailing backslash, characters outside printable ASCII in the code (Spark
# reads \u00a0 and other Unicode spaces as whitespace, sqlglot as part of a name), URI-like
# names (scheme://...), '@' (a table version) and '$' ($$ opens a code literal that runs to
# the next $$).

# Spark's ConfigReader pattern: ${env:HOME}, ${system:user.name}, ${spark.app.name}...
_SPARK_VARIABLE = re.compile(r"\$\{(?:\w+?:)?\S+?\}")
_CODE_SPACE = frozenset(" \t\r\n")
_WORD_CHARS = frozenset(string.ascii_letters + string.digits + "_")
_DIGIT_CHARS = frozenset(string.digits)


@dataclass(frozen=True)
class _SparkToken:
    """One token as Spark's lexer cuts it; comments and whitespace are not tokens."""

    type: str  # "word" (name, keyword, number), "string", "quoted", "symbol", "hint", "end"
    start: int
    end: int  # exclusive


def _check_variable_substitution(sql: str) -> None:
    match = _SPARK_VARIABLE.search(sql)
    if match:
        line, column = _line_and_column(sql, match.start())
        raise SQLError(
            f"transform uses '{match.group()}' at line {line}, column {column}, which Spark "
            "replaces before it reads the query (variable substitution: it can read the "
            "job's environment variables and settings); write '$' and '{' apart, e.g. "
            "concat('$', '{x}')"
        )


def _spark_tokens(sql: str) -> list[_SparkToken]:
    """The tokens of ``sql`` as Spark's lexer cuts them, or SQLError for what it doesn't model."""
    tokens: list[_SparkToken] = []
    i, n = 0, len(sql)
    while i < n:
        char = sql[i]
        if char in _CODE_SPACE:
            i += 1
        elif sql.startswith("--", i):
            end = i + 2
            while end < n and sql[end] not in "\r\n":
                end += 1
            if end < n and sql[end] == "\n" and end - 1 >= i + 2 and sql[end - 1] == "\\":
                line, _ = _line_and_column(sql, i)
                raise SQLError(
                    f"transform has a -- comment at line {line} that ends with a backslash, "
                    "which makes Spark read the next line as part of the comment; remove the "
                    "backslash"
                )
            i = end
        elif sql.startswith("/*+", i):  # Spark reads what follows as tokens up to */
            tokens.append(_SparkToken("hint", i, i + 3))
            i += 3
        elif sql.startswith("/*", i):
            i = _spark_comment_end(sql, i)
        elif sql.startswith("*/", i):
            tokens.append(_SparkToken("end", i, i + 2))
            i += 2
        elif char in "'\"":
            end = _spark_literal_end(sql, i, "string", backslash=True)
            tokens.append(_SparkToken("string", i, end))
            i = end
        elif char == "`":
            end = _spark_literal_end(sql, i, "back-quoted name", backslash=False)
            tokens.append(_SparkToken("quoted", i, end))
            i = end
        elif char in "rR" and i + 1 < n and sql[i + 1] in "'\"" and sql.find(sql[i + 1], i + 2) > 0:
            end = sql.find(sql[i + 1], i + 2) + 1  # a raw string: no escapes
            tokens.append(_SparkToken("string", i, end))
            i = end
        elif char in _WORD_CHARS or char == ".":
            end = _spark_word_end(sql, i)
            if end == i:  # a '.' that starts no number
                tokens.append(_SparkToken("symbol", i, i + 1))
                i += 1
            else:
                tokens.append(_SparkToken("word", i, end))
                i = end
        elif " " < char < "\x7f" and char not in "@$":
            tokens.append(_SparkToken("symbol", i, i + 1))
            i += 1
        else:
            line, column = _line_and_column(sql, i)
            what = f"'{char}'" if char in "@$" else f"the character U+{ord(char):04X}"
            raise SQLError(
                f"transform has {what} at line {line}, column {column}, outside any string, "
                "back-quoted name or comment, where Spark and this check could read it "
                "differently; outside those only ASCII letters, digits, punctuation, spaces, "
                "tabs and line breaks are allowed"
            )
    return tokens


def _spark_comment_end(sql: str, start: int) -> int:
    """The end of the /* comment at ``start``: Spark nests them, and /*+ opens no comment."""
    depth, i, n = 1, start + 2, len(sql)
    while i < n:
        if sql.startswith("*/", i):
            depth -= 1
            i += 2
            if not depth:
                return i
        elif sql.startswith("/*", i) and not sql.startswith("/*+", i):
            depth += 1
            i += 2
        else:
            i += 1
    line, column = _line_and_column(sql, start)
    raise SQLError(f"comment opened with '/*' at line {line}, column {column} is never closed")


def _spark_literal_end(sql: str, start: int, what: str, *, backslash: bool) -> int:
    """The end of the string or back-quoted name at ``start``: a doubled quote stays inside
    (Spark 4 reads 'it''s' as one string), and a backslash escapes in a string."""
    quote, i, n = sql[start], start + 1, len(sql)
    while i < n:
        if backslash and sql[i] == "\\":
            i += 2
        elif sql[i] == quote:
            if sql[i + 1 : i + 2] != quote:
                return i + 1
            i += 2
        else:
            i += 1
    line, column = _line_and_column(sql, start)
    raise SQLError(f"unterminated {what} starting at line {line}, column {column}")


def _spark_word_end(sql: str, start: int) -> int:
    """The end of the name, keyword or number at ``start``: Spark's longest match."""
    n = len(sql)
    end = start
    while end < n and sql[end] in _WORD_CHARS:
        end += 1
    if end > start and sql[start:end].isalpha() and sql.startswith("://", end):
        line, column = _line_and_column(sql, start)
        raise SQLError(
            f"transform has '{sql[start:end]}://' at line {line}, column {column}, which Spark "
            "reads as a path; write paths in strings"
        )
    return max(end, _spark_number_end(sql, start))


def _spark_number_end(sql: str, start: int) -> int:
    """The end of the longest numeric literal at ``start`` (``start`` if none), after
    SqlBaseLexer.g4: INTEGER_VALUE, BIGINT_LITERAL (1L)... EXPONENT_VALUE (1E3), DECIMAL_VALUE
    (1.5, .5), FLOAT / DOUBLE / BIGDECIMAL_LITERAL (1F, 1.5D, 2BD), where a form with a
    decimal point must not be followed by a letter, digit or '_' (isValidDecimal)."""
    n = len(sql)

    def digits(i: int) -> int:
        while i < n and sql[i] in _DIGIT_CHARS:
            i += 1
        return i

    def exponent(i: int) -> int | None:
        if i < n and sql[i] in "eE":
            j = i + 1 + (sql[i + 1 : i + 2] in ("+", "-"))
            end = digits(j)
            if end > j:
                return end
        return None

    def suffixes(i: int) -> list[int]:
        ends = [i + 1] if sql[i : i + 1] in ("f", "F", "d", "D") else []
        return ends + ([i + 2] if sql[i : i + 2].upper() == "BD" else [])

    def valid(i: int) -> bool:
        return i >= n or sql[i] not in _WORD_CHARS

    best = start
    integer = digits(start)
    if integer > start:
        best = integer + (sql[integer : integer + 1] in ("l", "L", "s", "S", "y", "Y"))
        power = exponent(integer)
        for base in [integer] if power is None else [integer, power]:
            best = max(best, base, *suffixes(base))
    if sql[integer : integer + 1] == ".":
        decimal = digits(integer + 1)
        if decimal > integer + 1 or integer > start:
            power = exponent(decimal)
            ends = [decimal] if power is None else [decimal, power]
            ends += [end for base in list(ends) for end in suffixes(base)]
            best = max([best, *(end for end in ends if valid(end))])
    return best


def _check_same_tokens(sql: str, tokens: list[Token]) -> None:
    """Refuse ``sql`` unless sqlglot's ``tokens`` are the tokens Spark's lexer reads."""
    spark = _spark_tokens(sql)
    _match_tokens(sql, spark, _token_spans(sql, tokens, 0))


def _reads_a_command(tokens: list[Token]) -> bool:
    """Whether sqlglot read a statement as a command (SHOW ..., EXECUTE ...), its text after
    the first word as one string: the statement becomes an exp.Command, which is refused."""
    tokenizer = _DIALECT.tokenizer_class
    return any(
        token.token_type in tokenizer.COMMANDS
        and (i == 0 or tokens[i - 1].token_type in tokenizer.COMMAND_PREFIX_TOKENS)
        for i, token in enumerate(tokens)
    )


def _token_spans(sql: str, tokens: list[Token], offset: int) -> list[tuple[int, int, TokenType]]:
    """(start, end, type) of each of sqlglot's tokens, in ``sql``'s positions."""
    spans: list[tuple[int, int, TokenType]] = []
    for token in tokens:
        span = (token.start + offset, token.end + 1 + offset, token.token_type)
        if spans and spans[-1][:2] == span[:2]:  # 1BD: a number and its type, on one text
            continue
        # sqlglot reads .5 as '.' and 5, Spark as one number (unless it follows a name: t.5).
        if (
            spans
            and span[2] == TokenType.NUMBER
            and spans[-1][2] == TokenType.DOT
            and spans[-1][1] == span[0]
            and sql[spans[-1][0] - 1 : spans[-1][0]] not in _WORD_CHARS | {")", "]", "`"}
        ):
            spans[-1] = (spans[-1][0], span[1], TokenType.NUMBER)
            continue
        spans.append(span)
    return spans


def _match_tokens(
    sql: str, spark: list[_SparkToken], spans: list[tuple[int, int, TokenType]]
) -> None:
    """Each of sqlglot's tokens must be one or more of Spark's whole tokens (several only
    where only spaces or nothing but operator characters separate them: GROUP BY, >=), or
    several of sqlglot's strings one of Spark's ('it''s'), and together they must cover every
    one of Spark's tokens."""
    first_at = {token.start: index for index, token in enumerate(spark)}
    last_at = {token.end: index for index, token in enumerate(spark)}
    covered = [False] * len(spark)
    index = 0
    while index < len(spans):
        start, end, token_type = spans[index]
        index += 1
        first = first_at.get(start)
        # 'it''s': one string for Spark, two adjacent ones for sqlglot.
        while (
            first is not None
            and spark[first].type == "string"
            and end < spark[first].end
            and index < len(spans)
            and spans[index][0] == end
            and spans[index][2] in _STRING_TOKENS
        ):
            end = spans[index][1]
            index += 1
        last = last_at.get(end)
        if first is None or last is None or last < first or any(covered[first : last + 1]):
            raise _read_differently(sql, start)
        covered[first : last + 1] = [True] * (last - first + 1)
        if token_type == TokenType.HINT:
            if spark[first].type != "hint" or spark[last].type != "end" or first == last:
                raise _read_differently(sql, start)
            inner_start, inner_end = spark[first].end, spark[last].start
            try:
                inner = _DIALECT.tokenize(sql[inner_start:inner_end])
            except TokenError:
                raise _read_differently(sql, start) from None
            _match_tokens(sql, spark[first + 1 : last], _token_spans(sql, inner, inner_start))
            continue
        for left, right in itertools.pairwise(spark[first : last + 1]):
            gap = sql[left.end : right.start]
            adjacent_operators = not gap and left.type == right.type == "symbol"
            hex_string = (  # X'01': Spark's X, then a string
                not gap
                and token_type == TokenType.HEX_STRING
                and sql[left.start : left.end] in ("x", "X")
                and right.type == "string"
            )
            if not (adjacent_operators or hex_string or (gap and gap.isspace())):
                raise _read_differently(sql, start)
        if any(token.type in ("hint", "end") for token in spark[first : last + 1]):
            raise _read_differently(sql, start)
    for token, seen in zip(spark, covered, strict=True):
        if not seen:
            raise _read_differently(sql, token.start)


def _read_differently(sql: str, offset: int) -> SQLError:
    line, column = _line_and_column(sql, offset)
    near = sql[offset : offset + 20].split("\n")[0]
    return SQLError(
        f"transform SQL at line {line}, column {column} (near '{near}') could be read "
        "differently by Spark than by this check: a comment, string, back-quoted name or "
        "hint ends in a different place for each, or a hint is not right after SELECT; "
        "write that part more plainly"
    )


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
# Relations
#
# Every relation the query names must be the source view or one of the query's own CTEs in
# scope where it is named, as Spark resolves them (the innermost CTE of that name; a CTE sees
# the CTEs defined before it in its WITH, not itself). Two ways sqlglot's tree can differ from
# Spark's reading are closed here:
#
# * sqlglot rewrites pipe syntax (``FROM source |> WHERE ... |> AS t``) into CTEs with names
#   of its own (__tmp1) or of the user's (t), where Spark has no such names: a table named t
#   or __tmp1 in that query is a real table for Spark. So names sqlglot made up (not written
#   at their place in the text) resolve only to CTEs, and in a query with |> a written name
#   must be the view itself.
# * Spark's grammar reads ``FROM stream other`` as the table other read as a stream, and
#   ``FROM lateral other`` as the table other; sqlglot reads the table (or CTE) "stream" or
#   "lateral" aliased other. An unquoted table name that is such a keyword is refused (the
#   Spark test tries every keyword of Spark's lexer in that place).

_RELATION_KEYWORDS = frozenset({"stream", "lateral"})


def _same_name(a: str, b: str) -> bool:
    """Spark compares names ignoring case (Java's rules); ASCII names only, where Python's
    lower() surely agrees with it: a non-ASCII name never names the view or a CTE here."""
    return a.isascii() and b.isascii() and a.lower() == b.lower()


class _Relations:
    """Checks every relation a parsed query names (see above)."""

    def __init__(self, sql: str, source_view: str, pipes: bool) -> None:
        self.sql = sql
        self.view = source_view
        self.pipes = pipes
        self.reads_view = False

    def check(self, statement: exp.Expr) -> bool:
        """Raise SQLError for any relation but the view and CTEs; whether the view is read."""
        for with_ in statement.find_all(exp.With):
            if with_.args.get("recursive"):
                raise SQLError("transform uses WITH RECURSIVE, which a streaming query can't run")
        for hint in statement.find_all(exp.Hint):
            if hint.find(exp.Query, exp.Subquery) is not None:
                raise SQLError(
                    "transform has a query inside a hint (/*+ ... */), which is not allowed: "
                    "hints take only names, numbers and column names"
                )
        for node in statement.walk(prune=lambda n: isinstance(n, exp.Hint)):
            if isinstance(node, exp.Table):
                self.table(node)
        return self.reads_view

    def written(self, identifier: exp.Expr) -> bool:
        """Whether ``identifier`` is written at the place sqlglot recorded for it."""
        start, end = identifier.meta.get("start"), identifier.meta.get("end")
        if not isinstance(identifier, exp.Identifier) or not isinstance(start, int):
            return False
        text = self.sql[start : end + 1] if isinstance(end, int) else ""
        name = identifier.this
        return text == ("`" + name.replace("`", "``") + "`" if identifier.quoted else name)

    def table(self, table: exp.Table) -> None:
        if isinstance(table.this, exp.Func):  # FROM range(10): _check_calls judges the call
            function = table.this
            name = function.name if isinstance(function, exp.Anonymous) else function.sql_name()
            qualifier = [table.args.get(key) for key in ("catalog", "db")]
            name = ".".join([*(part.name for part in qualifier if part), name])  # a.f: no built-in
            if name.lower() not in _GENERATOR_FUNCTIONS:
                raise SQLError(
                    f"transform calls the table function '{name.lower()}'; it may only read "
                    f"the view '{self.view}'"
                )
            return
        parts = table.parts
        if not parts or not all(isinstance(part, exp.Identifier) for part in parts):
            raise SQLError(
                f"transform reads the table '{table.sql(dialect='spark')}', named in a way "
                f"this check cannot follow; it may only read the view '{self.view}'"
            )
        first = parts[0]
        if not first.quoted and first.name.lower() in _RELATION_KEYWORDS:
            raise SQLError(
                f"transform reads a table named '{first.name}' {self._at(first)}, a word Spark "
                f"reads as the keyword {first.name.upper()} there; back-quote the name of a "
                f"CTE (`{first.name}`) or read the view '{self.view}'"
            )
        written = self.written(parts[-1])
        if len(parts) == 1:
            cte = self.cte_in_scope(table, parts[0].name)
            if cte is not None and not (written and (self.pipes or not self.written(cte))):
                return
        qualifier = [part.name.lower() if part.name.isascii() else "" for part in parts[:-1]]
        if _same_name(parts[-1].name, self.view) and qualifier in _TEMP_VIEW_QUALIFIERS:
            self.reads_view = True
            return
        if written and self.pipes and len(parts) == 1 and self.cte_in_scope(table, first.name):
            raise SQLError(
                f"transform reads '{first.name}' {self._at(first)} in a query with |>, where "
                f"Spark reads it as a table, not as the query's own name; read the view "
                f"'{self.view}' itself there"
            )
        raise SQLError(
            f"transform reads table '{_table_name(table)}'; only the view '{self.view}' is "
            "available"
        )

    def cte_in_scope(self, node: exp.Expr, name: str) -> exp.Identifier | None:
        """The name of the innermost CTE called ``name`` visible from ``node``, if any."""
        child, parent = node, node.parent
        passed: exp.With | None = None  # the WITH ``node`` is inside a CTE of
        while parent is not None:
            ctes: list[exp.Expr] = []
            if isinstance(parent, exp.With):
                position = next((i for i, c in enumerate(parent.expressions) if c is child), 0)
                ctes, passed = parent.expressions[:position], parent
            elif (
                isinstance(parent.args.get("with_"), exp.With)
                and parent.args["with_"] is not passed
            ):
                ctes = parent.args["with_"].expressions
            for cte in reversed(ctes):
                alias = cte.args.get("alias")
                identifier = alias.this if isinstance(alias, exp.TableAlias) else None
                if isinstance(identifier, exp.Identifier) and _same_name(identifier.name, name):
                    return identifier
            child, parent = parent, parent.parent
        return None

    def _at(self, identifier: exp.Identifier) -> str:
        start = identifier.meta.get("start")
        if not isinstance(start, int) or not self.written(identifier):
            return "in the transform"
        line, column = _line_and_column(self.sql, start)
        return f"at line {line}, column {column}"


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
