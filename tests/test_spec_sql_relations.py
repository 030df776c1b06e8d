"""Issue #31 item 5: a transform reads the view `source` and nothing else, as Spark reads it.

jobs/spec/sql.py judges a transform on sqlglot's reading of the text; Spark runs the text
through its own lexer and parser. These unit tests (no JVM) pin the refusals: every relation
must be the view or a CTE in scope, and wherever sqlglot and Spark could cut the text
differently (comments, strings, quoted names, hints, ${...} substitution, Unicode spaces) the
query is refused. tests/test_spec_sql_relations_match_spark.py holds the same corpora to
Spark's own parser and lexer.
"""

from __future__ import annotations

import pytest

from jobs.spec.sql import SQLError, _spark_tokens, check_expression, check_transform_sql

COLUMNS = ["id", "amount", "ts", "tags", "payload", "Value"]

# Each attack: what the check says about it (a part of the message). Spark reads each one
# differently from `source` alone, or cannot parse it: the Spark test checks that.
ATTACKS: dict[str, str] = {
    # other tables and views, plainly
    "SELECT * FROM other": "reads table 'other'",
    "SELECT * FROM source JOIN other USING (id)": "reads table 'other'",
    "SELECT * FROM source, other": "reads table 'other'",
    "SELECT * FROM source NATURAL JOIN other": "reads table 'other'",
    "SELECT * FROM source WHERE id IN (SELECT id FROM other)": "reads table 'other'",
    "SELECT * FROM source WHERE EXISTS (SELECT 1 FROM other)": "reads table 'other'",
    "SELECT (SELECT max(id) FROM other) AS m FROM source": "reads table 'other'",
    "SELECT CASE WHEN id IN (SELECT id FROM other) THEN 1 END AS c FROM source": "'other'",
    "SELECT transform(tags, x -> (SELECT max(id) FROM other)) AS t FROM source": "'other'",
    "SELECT * FROM source ORDER BY (SELECT 1 FROM other)": "reads table 'other'",
    "SELECT id FROM source GROUP BY id HAVING count(*) > (SELECT count(*) FROM other)": "'other'",
    "SELECT * FROM source UNION ALL SELECT * FROM other": "reads table 'other'",
    "SELECT * FROM (other)": "reads table 'other'",
    "SELECT * FROM source, LATERAL (SELECT * FROM other)": "reads table 'other'",
    "SELECT * FROM source JOIN LATERAL (SELECT * FROM other) ON true": "reads table 'other'",
    "SELECT * FROM source TIMESTAMP AS OF (SELECT max(ts) FROM other)": "reads table 'other'",
    # qualified names: catalogs, databases, files, and a struct column read as a table
    "SELECT * FROM default.source": "reads table 'default.source'",
    "SELECT * FROM spark_catalog.default.source": "reads table 'spark_catalog.default.source'",
    "SELECT * FROM global_temp.source": "reads table 'global_temp.source'",
    "SELECT * FROM source.other": "reads table 'source.other'",
    "SELECT * FROM source s, s.tags": "reads table 's.tags'",
    "SELECT * FROM parquet.`/etc/passwd`": "reads table 'parquet./etc/passwd'",
    "SELECT * FROM json.`/etc/passwd`": "reads table 'json./etc/passwd'",
    "SELECT * FROM text.`/etc/passwd`": "reads table 'text./etc/passwd'",
    "SELECT * FROM source, csv.`file:///etc/passwd`": "reads table 'csv.file:///etc/passwd'",
    "SELECT * FROM source, file:///etc/passwd": "'file://'",
    # table-valued functions and IDENTIFIER(...)
    "SELECT * FROM read_files('/etc/passwd')": "table function 'read_files'",
    "SELECT * FROM source, read_files('/etc', format => 'text')": "table function 'read_files'",
    "SELECT * FROM source, sql_keywords()": "table function 'sql_keywords'",
    "SELECT * FROM source, builtin.range(3)": "function 'builtin.range'",
    "SELECT * FROM source, spark_catalog.default.explode(tags)": "plain name",
    "SELECT * FROM source, explode((SELECT collect_list(id) FROM other))": "table 'other'",
    "SELECT * FROM source LATERAL VIEW explode((SELECT collect_list(id) FROM other)) t": (
        "table 'other'"
    ),
    "SELECT * FROM `source `": "reads table 'source '",
    "SELECT * FROM source LATERAL VIEW read_files('/etc') t": "table function 'read_files'",
    "SELECT * FROM source, explode(TABLE(other))": "the function 'table'",
    "SELECT * FROM source, explode(TABLE(SELECT * FROM other))": "the function 'table'",
    "SELECT * FROM source, range(TABLE other)": "syntax error",
    "SELECT * FROM IDENTIFIER('other')": "IDENTIFIER(...)",
    "SELECT * FROM source JOIN IDENTIFIER('oth' || 'er') USING (id)": "IDENTIFIER(...)",
    "SELECT IDENTIFIER('id') FROM source": "IDENTIFIER(...)",
    # CTEs that shadow the view, escape their scope, or are used before they are defined
    "WITH source AS (SELECT * FROM other) SELECT * FROM source": "reads table 'other'",
    "WITH t AS (SELECT * FROM other) SELECT * FROM source, t": "reads table 'other'",
    "WITH t AS (FROM other) SELECT * FROM t, source": "reads table 'other'",
    "SELECT * FROM (WITH t AS (SELECT * FROM source) SELECT * FROM t) JOIN t USING (id)": (
        "reads table 't'"
    ),
    "WITH a AS (SELECT * FROM b), b AS (SELECT * FROM source) SELECT * FROM a": ("reads table 'b'"),
    "WITH t AS (SELECT * FROM t) SELECT * FROM t, source": "reads table 't'",
    "SELECT * FROM t UNION ALL (WITH t AS (SELECT * FROM source) SELECT * FROM t)": (
        "reads table 't'"
    ),
    "SELECT * FROM source WHERE id IN (WITH t AS (SELECT id FROM source) SELECT id FROM t) "
    "AND id IN (SELECT id FROM t)": "reads table 't'",
    "WITH RECURSIVE t AS (SELECT * FROM other) SELECT * FROM t, source": "WITH RECURSIVE",
    "(WITH t AS (SELECT * FROM source) SELECT * FROM t) UNION ALL SELECT * FROM t": "table 't'",
    "SELECT * FROM t, (WITH t AS (SELECT * FROM source) SELECT * FROM t) x": "table 't'",
    "WITH a AS (SELECT * FROM source), b AS (WITH c AS (SELECT * FROM a) SELECT * FROM c) "
    "SELECT * FROM b, c": "reads table 'c'",
    "SELECT (WITH t AS (SELECT 1 AS x) SELECT x FROM t) AS y FROM source, t": "table 't'",
    "SELECT * FROM source LATERAL VIEW explode(tags) t AS x UNION ALL SELECT * FROM t": "'t'",
    # TABLE, and Spark's FROM-first form
    "TABLE other": "must be a query",
    "SELECT * FROM source UNION ALL TABLE other": "syntax error",
    "SELECT * FROM source WHERE id IN (TABLE other)": "syntax error",
    "FROM other SELECT *": "reads table 'other'",
    "FROM source, other SELECT *": "reads table 'other'",
    "FROM source SELECT * UNION ALL FROM other SELECT *": "reads table 'other'",
    # pipe syntax: sqlglot rewrites it into CTEs named after |> AS t, or __tmp1, __tmp2...,
    # names Spark reads as tables
    "FROM source |> JOIN other USING (id)": "reads table 'other'",
    "FROM other |> SELECT *": "reads table 'other'",
    "FROM source |> AS t |> JOIN t USING (id)": "reads 't' at line 1, column 29 in a query with |>",
    "FROM source |> AS t |> WHERE true |> UNION ALL (SELECT * FROM t)": "in a query with |>",
    "FROM source |> WHERE true |> UNION ALL (SELECT * FROM __tmp1)": "reads '__tmp1'",
    "FROM source |> WHERE true |> SELECT * |> UNION ALL (SELECT * FROM __tmp2)": "'__tmp2'",
    "FROM source |> UNION ALL (TABLE other)": "syntax error",
    "FROM source |> WHERE id IN (SELECT id FROM other)": "reads table 'other'",
    "WITH t AS (SELECT * FROM other) FROM source |> UNION ALL (SELECT * FROM t)": "'other'",
    # keywords that begin another kind of relation in Spark, read as names by sqlglot
    "WITH stream AS (SELECT * FROM source) SELECT * FROM stream other": (
        "reads a table named 'stream' at line 1, column 53, a word Spark reads as the keyword "
        "STREAM there"
    ),
    "WITH stream AS (SELECT * FROM source) SELECT * FROM source JOIN stream other USING (id)": (
        "the keyword STREAM"
    ),
    "SELECT * FROM STREAM(other)": "table function 'stream'",
    "SELECT * FROM source, STREAM other": "the keyword STREAM",
    "WITH lateral AS (SELECT * FROM source) SELECT * FROM lateral other": "syntax error",
    "SELECT * FROM source JOIN other@v1 USING (id)": "has '@' at line 1, column 32",
    "SELECT * FROM source@v1": "has '@'",  # a version of the view: time travel
    "SELECT $$ FROM other $$ AS x FROM source": "has '$' at line 1, column 8",  # code literal
    # hints: Spark reads what is between /*+ and */ as SQL, with its strings and comments
    "SELECT /*+ REPARTITION((SELECT id FROM other)) */ * FROM source": "query inside a hint",
    "SELECT /*+ COALESCE(1) -- */ * FROM source WHERE id = '\n*/ * FROM other -- '": (
        "at line 1, column 8 (near '/*+ COALESCE(1) -- *') could be read differently by Spark"
    ),
    "SELECT /*+ A('*/ 1 AS x FROM source --') */ * FROM other": "could be read differently",
    "SELECT /*+ A(1) /* x */ * FROM source WHERE id = '*/ * FROM other -- '": "read differently",
    "SELECT * FROM source /*+ , other */": "could be read differently",
    "SELECT /*+ BROADCAST(other) */ * FROM source JOIN other USING (id)": "reads table 'other'",
    # comments: Spark nests /* */ (but /*+ opens no comment) and a backslash continues --
    "SELECT * FROM source /* /*+ */ JOIN other -- */": (
        "at line 1, column 32 (near 'JOIN other -- */') could be read differently"
    ),
    "SELECT * FROM source /* /*+ */ , other */": "could be read differently",
    "WITH x AS (SELECT 1) -- \\\n, other AS (SELECT * FROM source)\nSELECT * FROM other": (
        "a -- comment at line 1 that ends with a backslash"
    ),
    "SELECT * FROM source -- x\rJOIN other USING (id)": "reads table 'other'",
    "SELECT * FROM source /* unclosed": "is never closed",
    # strings and quoted names: raw strings, doubled back-quotes
    "SELECT r'\\' FROM other --' FROM source": "reads table 'other'",
    'SELECT R"\\" FROM other --" FROM source': "reads table 'other'",
    "SELECT * FROM `source``other`": "reads table 'source`other'",
    "SELECT `a\\` FROM other --` FROM source": "reads table 'other'",
    "SELECT * FROM `\u017fource`": "reads table '\u017fource'",
    # variable substitution: Spark replaces ${...} in the text before it parses it
    "SELECT '${env:HOME}' AS home FROM source": "uses '${env:HOME}' at line 1, column 9",
    "SELECT * FROM source WHERE id = '${system:user.name}'": "variable substitution",
    "SELECT '${spark.app.name}' AS app FROM source": "variable substitution",
    "SELECT /* ${env:HOME} */ id FROM source": "variable substitution",
    # characters Spark reads as whitespace and sqlglot as part of a name
    "SELECT * FROM source AS s\u00a0JOIN\u00a0other USING (id)": "the character U+00A0",
    "SELECT * FROM source\u3000JOIN other USING (id)": "the character U+3000",
    "SELECT * FROM source AS s\u2028JOIN other USING (id)": "the character U+2028",
    "SELECT * FROM source AS s\x0bJOIN other USING (id)": "the character U+000B",
    # statements that are not one query
    "SELECT * FROM source; SELECT * FROM other": "a single query",
    "EXECUTE IMMEDIATE 'SELECT * FROM other'": "must be a query",
    "BEGIN SELECT * FROM other; END": "syntax error",
    "CACHE TABLE x AS SELECT * FROM other": "must be a query",
}

# Refused because the check cannot tell, although Spark reads only `source`: the price of
# refusing at the root what the two readings might not agree on.
REFUSED_THOUGH_HARMLESS: dict[str, str] = {
    "SELECT * FROM source -- \\\nJOIN other USING (id)": "ends with a backslash",
    "WITH t AS (SELECT * FROM source) FROM t |> WHERE true": "in a query with |>",
    "WITH stream AS (SELECT * FROM source) SELECT * FROM stream": "the keyword STREAM",
    "SELECT * FROM source, JSON_TABLE(Value, '$' COLUMNS (a INT))": "syntax error",
}

# Transforms that must stay accepted: Spark reads only the view, and analyses each against a
# view with COLUMNS (the Spark test).
LEGIT = [
    "SELECT * FROM source",
    "SELECT id, amount * 2 AS doubled FROM source WHERE amount >= 75",
    "SELECT window.start AS window_start, window.end AS window_end, id, count(*) AS n "
    "FROM source GROUP BY window(ts, '5 minutes'), id",
    "SELECT * FROM SOURCE",
    "SELECT * FROM `source`",
    "SELECT * FROM session.source",
    "SELECT * FROM system.session.source",
    "SELECT s.id FROM source AS stream JOIN source AS s USING (id)",
    "WITH unnest AS (SELECT * FROM source) SELECT * FROM unnest AS u",
    "WITH big AS (SELECT id, amount FROM source WHERE amount > 100) SELECT * FROM big",
    "WITH source AS (SELECT id FROM source) SELECT id FROM source",
    "WITH a AS (SELECT id FROM source), b AS (SELECT a.id FROM a JOIN source USING (id)) "
    "SELECT * FROM b",
    "SELECT * FROM (WITH t AS (SELECT * FROM source) SELECT * FROM t)",
    "WITH t AS (SELECT * FROM source) SELECT * FROM t WHERE id IN (SELECT id FROM t)",
    "WITH t AS (SELECT * FROM source) "
    "SELECT * FROM t UNION ALL (WITH u AS (SELECT * FROM t) SELECT * FROM u)",
    "WITH `stream` AS (SELECT * FROM source) SELECT * FROM `stream` AS s",
    "WITH t AS (SELECT * FROM source) (SELECT * FROM t) UNION ALL (SELECT * FROM t)",
    "WITH t AS (WITH t AS (SELECT * FROM source) SELECT * FROM t) SELECT * FROM t",
    "WITH t AS (SELECT * FROM source) FROM t SELECT *",
    "SELECT id, tag FROM source LATERAL VIEW explode(tags) t AS tag",
    "SELECT * FROM source WHERE id IN ('a', 'b')",
    "SELECT * FROM source, (VALUES (1)) AS v(x)",
    "SELECT * FROM source, range(2)",
    "FROM source SELECT id",
    "FROM source |> WHERE amount > 1 |> SELECT upper(id) AS u",
    "FROM source |> AS s |> WHERE s.amount > 1",
    "FROM source |> AGGREGATE count(*) AS n GROUP BY id",
    "FROM source |> WHERE id IN (SELECT id FROM source)",
    "SELECT /*+ REPARTITION(3, id) */ id FROM source",
    "SELECT /*+ COALESCE(1) */ id FROM source",
    "SELECT /*+ BROADCAST(b) */ a.id FROM source a JOIN source b USING (id)",
    "SELECT /*+REBALANCE*/ id FROM source",
    "SELECT /* a /* nested */ comment */ id FROM source -- trailing",
    "SELECT id -- FROM other\nFROM source",
    "SELECT id /* FROM other */ FROM source",
    "SELECT 'it''s' AS s, \"say \"\"hi\"\"\" AS t, 'a\\'b' AS u, r'C:\\dir' AS v FROM source",
    "SELECT 'x\\' FROM other --' FROM source",
    "SELECT `we``ird` FROM (SELECT id AS `we``ird` FROM source)",
    "SELECT x'ab' AS b, .5 AS half, 1e3 AS k, 2L AS l, 3BD AS d, 1.5D AS f FROM source",
    "SELECT '\\u0027 FROM other --' AS s FROM source",
    "SELECT 'ünïcödé' AS s, `naïve` FROM (SELECT id AS `naïve` FROM source)",
    "SELECT '$' || '{env:HOME}' AS s, '${ x }' AS t FROM source",
    "SELECT * FROM source TABLESAMPLE (50 PERCENT)",
    "SELECT id FROM source s WHERE amount > (SELECT avg(amount) FROM source WHERE id = s.id)",
    "SELECT * FROM source PIVOT (sum(amount) FOR id IN ('a', 'b'))",
    "SELECT id, row_number() OVER (PARTITION BY id ORDER BY ts) AS rn FROM source",
    "SELECT payload.id, tags[0] AS first_tag FROM source\r\nWHERE\tValue IS NOT NULL;",
]


def rejection(sql: str) -> str:
    with pytest.raises(SQLError) as caught:
        check_transform_sql(sql, columns=COLUMNS)
    return str(caught.value)


@pytest.mark.parametrize("sql", list(ATTACKS))
def test_each_attack_is_refused(sql: str) -> None:
    assert ATTACKS[sql] in rejection(sql)


@pytest.mark.parametrize("sql", list(REFUSED_THOUGH_HARMLESS))
def test_what_the_check_cannot_tell_is_refused(sql: str) -> None:
    assert REFUSED_THOUGH_HARMLESS[sql] in rejection(sql)


@pytest.mark.parametrize("sql", LEGIT)
def test_legitimate_transforms_stay_accepted(sql: str) -> None:
    check_transform_sql(sql, columns=COLUMNS)


def test_the_messages_name_the_problem_and_its_place() -> None:
    assert rejection("SELECT '${env:HOME}' AS home FROM source") == (
        "transform uses '${env:HOME}' at line 1, column 9, which Spark replaces before it "
        "reads the query (variable substitution: it can read the job's environment variables "
        "and settings); write '$' and '{' apart, e.g. concat('$', '{x}')"
    )
    assert rejection("SELECT id\nFROM source AS s\u00a0WHERE true") == (
        "transform has the character U+00A0 at line 2, column 17, outside any string, "
        "back-quoted name or comment, where Spark and this check could read it differently; "
        "outside those only ASCII letters, digits, punctuation, spaces, tabs and line breaks "
        "are allowed"
    )
    assert rejection("FROM source |> AS t |> JOIN t USING (id)") == (
        "transform reads 't' at line 1, column 29 in a query with |>, where Spark reads it as a "
        "table, not as the query's own name; read the view 'source' itself there"
    )
    assert rejection("SELECT /*+ A(1) -- */ id FROM source\n*/") == (
        "transform SQL at line 1, column 8 (near '/*+ A(1) -- */ id FR') could be read "
        "differently by Spark than by this check: a comment, string, back-quoted name or hint "
        "ends in a different place for each, or a hint is not right after SELECT; write that "
        "part more plainly"
    )


def test_sink_expressions_are_held_to_the_same_reading() -> None:
    with pytest.raises(SQLError, match=r"uses '\$\{env:HOME\}' at line 1, column 9"):
        check_expression("concat('${env:HOME}', id)", columns=COLUMNS)
    with pytest.raises(SQLError, match="U\\+3000"):
        check_expression("concat(id,\u3000id)", columns=COLUMNS)
    check_expression("concat(id, 'it''s', '\u3000')", columns=COLUMNS)


@pytest.mark.parametrize(
    ("sql", "tokens"),
    [
        # Spark 4 keeps a doubled quote inside a string or a back-quoted name.
        ("'it''s' `a``b` \"x\"\"y\"", ["'it''s'", "`a``b`", '"x""y"']),
        ("'a\\'b' r'a\\' R\"b\\\"", ["'a\\'b'", "r'a\\'", 'R"b\\"']),
        # Nested comments, but /*+ opens a hint, not a comment, even inside one.
        ("a /* b /* c */ d */ e", ["a", "e"]),
        ("a /* b /*+ c */ d */ e", ["a", "d", "*/", "e"]),
        ("SELECT /*+ A(1) */ x", ["SELECT", "/*+", "A", "(", "1", ")", "*/", "x"]),
        # Numbers: the longest literal, unless a letter follows a decimal point form.
        ("1.5e3 .5 1L 2BD 3e 1.5x 1e3x t.5", ["1.5e3", ".5", "1L", "2BD", "3e", "1", ".", "5x"]),
        ("-- a\r\nb --c", ["b"]),
    ],
)
def test_the_port_of_sparks_lexer(sql: str, tokens: list[str]) -> None:
    cut = [sql[token.start : token.end] for token in _spark_tokens(sql)]
    assert cut[: len(tokens)] == tokens
