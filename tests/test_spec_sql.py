"""Unit tests of the JVM-free transform SQL check (jobs/spec/sql.py).

test_spec_ddl_matches_spark.py compares the verdicts with Spark's own; these run without it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from jobs.spec.sql import SQLError, check_transform_sql

SQL_PY = Path(__file__).resolve().parents[1] / "jobs" / "spec" / "sql.py"

# The source view of these tests: parsed Kafka records.
COLUMNS = ["id", "amount", "ts", "payload", "tags", "attrs", "Value"]


def check(sql: str, **kwargs: object) -> None:
    kwargs.setdefault("columns", COLUMNS)
    check_transform_sql(sql, **kwargs)  # type: ignore[arg-type]


def rejection(sql: str, **kwargs: object) -> str:
    with pytest.raises(SQLError) as caught:
        check(sql, **kwargs)
    return str(caught.value)


# -- accepted --------------------------------------------------------------------------------

VALID = [
    "SELECT * FROM source",
    "select id, amount * 2 as doubled from source where amount > 0",
    "SELECT id FROM source;",
    "SELECT ID, VALUE FROM SOURCE",
    "SELECT `id`, `payload`.`id` FROM `source`",
    "/* leading */ SELECT id FROM source -- trailing",
    "SELECT id FROM session.source",
    # CTEs, derived tables, set operations
    "WITH big AS (SELECT id, amount AS amt FROM source WHERE amount > 100) SELECT id, amt FROM big",
    "WITH a AS (SELECT id FROM source), b AS (SELECT a.id FROM a JOIN source USING (id)) "
    "SELECT * FROM b",
    "WITH t(k, v) AS (SELECT id, amount FROM source) SELECT k, v FROM t",
    "WITH source AS (SELECT id FROM source) SELECT id FROM source",
    "SELECT * FROM (SELECT id AS k FROM source) AS t WHERE t.k > 'a'",
    "SELECT z FROM (SELECT id AS k FROM source) AS t(z)",
    "SELECT id FROM source UNION ALL SELECT Value FROM source ORDER BY id",
    "(SELECT id FROM source) EXCEPT (SELECT id FROM source WHERE amount < 0)",
    # aliases where Spark resolves them
    "SELECT amount AS a, a * 2 AS b, b + 1 AS c FROM source",
    "SELECT id, count(*) AS n FROM source GROUP BY id HAVING n > 1 ORDER BY n DESC",
    "SELECT date_trunc('MINUTE', ts) AS minute, count(*) FROM source GROUP BY minute",
    "SELECT payload.id FROM source ORDER BY id",
    "SELECT id FROM source GROUP BY ALL ORDER BY ALL",
    "SELECT upper(id) FROM source ORDER BY `upper(id)`",
    # struct, array and map access
    "SELECT payload.id, payload.inner.x, source.payload.id, s.payload.id FROM source s",
    "SELECT tags[0], attrs['k'], element_at(tags, 1), payload['id'] FROM source",
    "SELECT payload.* FROM source",
    "SELECT s.* FROM source AS s",
    "SELECT from_json(Value, 'a INT').a AS a FROM source",
    # lambdas
    "SELECT transform(tags, t -> upper(t)) AS up, filter(tags, t -> t <> id) FROM source",
    "SELECT aggregate(tags, 0, (acc, t) -> acc + length(t)) FROM source",
    "SELECT transform(tags, (t, i) -> concat(t, i)), exists(tags, x -> x.k = 'a') FROM source",
    "SELECT map_filter(attrs, (k, v) -> v > amount) FROM source",
    # window functions and streaming windows
    "SELECT id, row_number() OVER (PARTITION BY id ORDER BY ts DESC) AS rn FROM source",
    "SELECT id, sum(amount) OVER w AS running FROM source "
    "WINDOW w AS (PARTITION BY id ORDER BY ts)",
    "SELECT window.start, window.end, count(*) AS n FROM source GROUP BY window(ts, '5 minutes')",
    "SELECT id, count(*) FROM source GROUP BY window(ts, '10 minutes', '5 minutes'), id",
    "SELECT session_window.start, count(*) FROM source GROUP BY session_window(ts, '5 minutes')",
    # CASE, casts, literals, functions
    "SELECT CASE WHEN amount > 10 THEN 'big' WHEN amount > 1 THEN 'mid' ELSE 'small' END AS size "
    "FROM source",
    "SELECT CASE id WHEN 'a' THEN 1 ELSE 2 END, CAST(amount AS INT), amount::string, "
    "try_cast(Value AS BIGINT) FROM source",
    "SELECT ts + INTERVAL 1 HOUR, DATE '2020-01-01', x'ab', 1Y, 2L, 3BD FROM source",
    "SELECT timestampadd(HOUR, 1, ts), datediff(DAY, ts, ts), extract(YEAR FROM ts) FROM source",
    "SELECT current_date, current_timestamp, current_user FROM source",
    "SELECT to_json(struct(*)) AS value FROM source",
    "SELECT cast(id AS STRING) AS key, to_json(named_struct('id', id, 'n', amount)) AS value "
    "FROM source",
    # generators
    "SELECT id, explode(tags) AS tag FROM source",
    "SELECT id, tag FROM source LATERAL VIEW explode(tags) t AS tag",
    "SELECT id, t.tag FROM source LATERAL VIEW OUTER explode(tags) t AS tag",
    "SELECT id, col FROM source LATERAL VIEW explode(tags) t",
    "SELECT * FROM source, range(3)",
    # subqueries, correlated or not
    "SELECT id FROM source WHERE id IN (SELECT id FROM source WHERE amount > 1)",
    "SELECT id FROM source s WHERE amount > (SELECT avg(amount) FROM source WHERE id = s.id)",
    "SELECT id FROM source WHERE EXISTS (SELECT 1 FROM source s2 WHERE s2.id = source.id)",
    # joins
    "SELECT a.id, b.amount FROM source a JOIN source b ON a.id = b.id AND b.amount > 0",
    "SELECT a.id FROM source a LEFT ANTI JOIN source b ON a.id = b.id",
    "SELECT /*+ BROADCAST(b) */ a.id FROM source a JOIN source b USING (id)",
    # columns named after their SQL text, and sources whose columns can't be known
    "WITH t AS (SELECT id, upper(Value) FROM source) SELECT `upper(Value)` FROM t",
    "SELECT id, CAST(amount AS INT) FROM source ORDER BY amount",
    "SELECT * FROM (SELECT explode(tags) FROM source) WHERE col > 'a'",
    "SELECT * FROM source PIVOT (sum(amount) FOR id IN ('a', 'b'))",
]


@pytest.mark.parametrize("sql", VALID)
def test_it_accepts_valid_transforms(sql: str) -> None:
    check(sql)


@pytest.mark.parametrize("sql", VALID)
def test_it_accepts_valid_transforms_without_column_names(sql: str) -> None:
    check(sql, columns=None)


def test_it_checks_another_source_view_name() -> None:
    check("SELECT id FROM Events", source_view="events", columns=["id"])
    assert "only the view 'events' is available" in rejection(
        "SELECT id FROM source", source_view="events"
    )


# -- rejected --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("", "transform SQL is empty"),
        ("  ;  ", "transform SQL is empty"),
        ("SELECT id FROM source WHERE", "syntax error at line 1, column 23 near 'WHERE'"),
        ("SELECT id\nFROM source\nWHERE id = = 2", "syntax error at line 3, column 12 near '='"),
        ("SELECT id FROM source WHERE (id = 'a'", "expected ')'"),
        ("SELECT inner FROM source", "back-quote it: `inner`"),
        ("SELECT 'abc FROM source", "unterminated string starting at line 1, column 8"),
        ("SELECT `abc FROM source", "unterminated back-quoted name starting at line 1, column 8"),
        ("SELECT id FROM source /* open", "comment opened with '/*' at line 1, column 23"),
    ],
)
def test_it_rejects_syntax_errors_with_their_position(sql: str, message: str) -> None:
    assert message in rejection(sql)


def test_it_rejects_two_statements() -> None:
    assert rejection("SELECT id FROM source; SELECT amount FROM source") == (
        "transform SQL must be a single query, but it has 2 statements separated by ';'"
    )


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("INSERT INTO source SELECT * FROM source", "an INSERT statement"),
        ("DROP TABLE source", "a DROP statement"),
        ("CREATE TABLE t AS SELECT * FROM source", "a CREATE statement"),
        ("CREATE TEMP VIEW v AS SELECT * FROM source", "a CREATE statement"),
        ("SET spark.sql.shuffle.partitions = 1", "a SET statement"),
        ("DELETE FROM source WHERE id = 'a'", "a DELETE statement"),
        ("CACHE TABLE source", "a CACHE TABLE statement"),
        ("USE default", "a USE statement"),
        ("SHOW TABLES", "a SHOW command"),
    ],
)
def test_it_rejects_statements_that_are_not_queries(sql: str, kind: str) -> None:
    assert rejection(sql) == f"transform SQL must be a query (SELECT ...), not {kind}"


@pytest.mark.parametrize(
    ("sql", "table"),
    [
        ("SELECT * FROM orders", "orders"),
        ("SELECT * FROM source JOIN orders ON source.id = orders.id", "orders"),
        ("SELECT id FROM source WHERE id IN (SELECT id FROM orders)", "orders"),
        ("WITH t AS (SELECT * FROM Orders) SELECT * FROM t, source", "Orders"),
        ("SELECT * FROM default.source", "default.source"),
        ("SELECT * FROM json.`/data/events`", "json./data/events"),
        ("SELECT * FROM source UNION ALL SELECT * FROM archive", "archive"),
    ],
)
def test_it_rejects_reading_other_tables(sql: str, table: str) -> None:
    assert rejection(sql) == (
        f"transform reads table '{table}'; only the view 'source' is available"
    )


def test_it_rejects_a_cte_used_outside_its_scope() -> None:
    sql = "SELECT * FROM (WITH t AS (SELECT * FROM source) SELECT * FROM t) JOIN t USING (id)"
    assert "reads table 't'" in rejection(sql)


def test_it_rejects_table_functions_that_read_data() -> None:
    assert "calls the table function 'read_files'" in rejection(
        "SELECT * FROM source, read_files('/data')"
    )


@pytest.mark.parametrize("sql", ["SELECT 1", "VALUES (1, 2)", "SELECT * FROM range(10)"])
def test_it_rejects_transforms_that_never_read_the_source(sql: str) -> None:
    assert rejection(sql) == (
        "transform never reads the view 'source'; a streaming transform must select FROM source"
    )


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT amout FROM source",
            "unknown column 'amout' at line 1, column 8; did you mean 'amount'?",
        ),
        ("SELECT id FROM source WHERE amout > 1", "unknown column 'amout' at line 1, column 29"),
        ("SELECT id\nFROM source\nORDER BY tss", "unknown column 'tss' at line 3, column 10"),
        ("SELECT s.amout FROM source s", "unknown column 's.amout' at line 1, column 10"),
        ("SELECT nope.id FROM source", "unknown column 'nope' (in 'nope.id')"),
        ("SELECT amount AS x FROM source WHERE x > 1", "unknown column 'x'"),
        ("SELECT x + 1 AS y, amount AS x FROM source", "unknown column 'x'"),
        ("SELECT transform(tags, t -> t || nope) FROM source", "unknown column 'nope'"),
        (
            "WITH t AS (SELECT id, amount AS amt FROM source) SELECT amount FROM t",
            "unknown column 'amount' at line 1, column 57; did you mean 'amt'?",
        ),
        ("SELECT * FROM (SELECT id AS k FROM source) t WHERE t.id > 'a'", "'t' has no column"),
        ("SELECT idd FROM source UNION ALL SELECT id FROM source", "unknown column 'idd'"),
        (
            "SELECT id FROM source s WHERE EXISTS (SELECT 1 FROM source x WHERE x.idd = s.id)",
            "x.idd",
        ),
        ("SELECT a.idd FROM source a JOIN source b ON a.id = b.id", "'a' has no column 'idd'"),
        ("SELECT k FROM source LATERAL VIEW explode(tags) t AS tag", "unknown column 'k'"),
        ("SELECT id, count(*) FROM source GROUP BY idd", "unknown column 'idd'"),
        (
            "WITH t AS (SELECT id, upper(Value) FROM source) SELECT anything FROM t",
            "unknown column 'anything' at line 1, column 56; available: id (computed columns",
        ),
    ],
)
def test_it_rejects_unknown_columns_when_the_columns_are_known(sql: str, message: str) -> None:
    assert message in rejection(sql)


def test_it_does_not_check_columns_when_they_are_not_given() -> None:
    check("SELECT whatever FROM source WHERE nothing > 1", columns=None)


def test_sql_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="transform SQL is empty"):
        check_transform_sql("")


def test_the_module_imports_neither_pyspark_nor_django_nor_celery() -> None:
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('sql_alone', {str(SQL_PY)!r})\n"
        "module = sys.modules['sql_alone'] = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(module)\n"
        "print(sorted(m for m in ('pyspark', 'django', 'celery') if m in sys.modules))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"
