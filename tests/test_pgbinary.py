"""Binary COPY from Arrow: what Postgres stores equals what CSV COPY stores, type by type."""

from __future__ import annotations

import datetime as dt
import decimal
import os
import uuid

import psycopg
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jobs.sinks.postgres import pgbinary
from jobs.sinks.postgres.store import _CopyStream

UTC = dt.UTC


@pytest.fixture(scope="module")
def conn():
    with psycopg.connect(os.environ["CONTROLPLANE_SINK_DATABASE_URL"], autocommit=True) as c:
        yield c


def _table(conn, columns: dict[str, str]) -> str:
    name = f"pgb_{uuid.uuid4().hex[:10]}"
    defs = ", ".join(f'"{c}" {t}' for c, t in columns.items())
    conn.execute(f"CREATE TABLE {name} ({defs})")
    return name


def copy(conn, table: str, data, *, binary: bool) -> list[tuple]:
    """COPY the Arrow data into the table with the given format; the rows read back."""
    conn.execute(f"TRUNCATE {table}")
    with conn.transaction(), _CopyStream(conn, psycopg.sql.Identifier(table)) as stream:
        if not binary:
            stream._open = _csv_only(stream)
        stream.write(data)
    assert stream.format == ("binary" if binary else "csv")
    return [tuple(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY ctid").fetchall()]


def _csv_only(stream):
    opened = stream._open

    def open_csv(schema):
        original = pgbinary.encoder
        pgbinary.encoder = lambda *_: None
        try:
            opened(schema)
        finally:
            pgbinary.encoder = original

    return open_csv


COLUMNS = {
    "s": ("text", pa.string()),
    "ls": ("varchar(40)", pa.large_string()),
    "j": ("json", pa.string()),
    "jb": ("jsonb", pa.string()),
    "b": ("boolean", pa.bool_()),
    "i8": ("smallint", pa.int8()),
    "i16": ("smallint", pa.int16()),
    "i32": ("integer", pa.int32()),
    "i32_wide": ("bigint", pa.int32()),
    "i64": ("bigint", pa.int64()),
    "f32": ("real", pa.float32()),
    "f64": ("double precision", pa.float64()),
    "d": ("date", pa.date32()),
    "ts": ("timestamptz", pa.timestamp("us", tz="UTC")),
    "ts_ntz": ("timestamp", pa.timestamp("us")),
    "ts_ns": ("timestamptz", pa.timestamp("ns", tz="UTC")),
    # Compared with the Arrow values: CSV sends bytea as hex text (jobs.pipeline.for_copy),
    # and a float32 as its shortest decimal text, which is not its exact double value.
    "raw": ("bytea", pa.binary()),
    "f32_wide": ("double precision", pa.float32()),
}
EXACT = ["raw", "f32_wide"]

text = st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"))
json_text = st.sampled_from(['{"a": 1}', "[1, 2, 3]", '"x"', "null", '{"nested": {"k": [true]}}'])
VALUES = {
    "s": text,
    "ls": text.map(lambda s: s[:40]),
    "j": json_text,
    "jb": json_text,
    "b": st.booleans(),
    "i8": st.integers(-128, 127),
    "i16": st.integers(-(2**15), 2**15 - 1),
    "i32": st.integers(-(2**31), 2**31 - 1),
    "i32_wide": st.integers(-(2**31), 2**31 - 1),
    "i64": st.integers(-(2**63), 2**63 - 1),
    "f32": st.floats(width=32, allow_nan=False),
    "f32_wide": st.floats(width=32, allow_nan=False),
    "f64": st.floats(allow_nan=False),
    "d": st.dates(dt.date(1, 1, 1), dt.date(9999, 12, 31)),
    "ts": st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30), timezones=st.just(UTC)),
    "ts_ntz": st.datetimes(dt.datetime(1, 1, 2), dt.datetime(9999, 12, 30)),
    "ts_ns": st.datetimes(dt.datetime(1970, 1, 1), dt.datetime(2200, 1, 1), timezones=st.just(UTC)),
    "raw": st.binary(max_size=30),
}


@pytest.fixture(scope="module")
def every_type(conn):
    return _table(conn, {name: pg for name, (pg, _) in COLUMNS.items()})


@pytest.fixture(scope="module")
def every_type_for_csv(conn):
    return _table(conn, {name: pg for name, (pg, _) in COLUMNS.items() if name not in EXACT})


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(data=st.data(), n=st.integers(1, 40), cut=st.integers(0, 5))
def test_every_supported_type_stores_what_csv_stores(
    conn, every_type, every_type_for_csv, data, n, cut
):
    rows = data.draw(
        st.lists(
            st.fixed_dictionaries({k: st.one_of(st.none(), v) for k, v in VALUES.items()}),
            min_size=n,
            max_size=n,
        )
    )
    arrays = [pa.array([r[name] for r in rows], arrow) for name, (_, arrow) in COLUMNS.items()]
    batch = pa.RecordBatch.from_arrays(arrays, names=list(COLUMNS))
    batch = batch.slice(min(cut, n - 1))  # sliced arrays: offsets into shared buffers
    stored = copy(conn, every_type, batch, binary=True)
    exact = len(EXACT)
    assert [r[-exact:] for r in stored] == list(
        zip(*(batch.column(c).to_pylist() for c in EXACT), strict=True)
    )
    via_csv = copy(conn, every_type_for_csv, batch.drop_columns(EXACT), binary=False)
    assert [r[:-exact] for r in stored] == via_csv


def test_a_table_of_several_record_batches_streams_as_one_copy(conn):
    table = _table(conn, {"n": "bigint", "s": "text"})
    data = pa.Table.from_batches(
        [pa.record_batch({"n": [i, i + 1], "s": [f"x{i}", None]}) for i in range(0, 10, 2)]
    )
    with conn.transaction(), _CopyStream(conn, psycopg.sql.Identifier(table)) as stream:
        stream.write(data)
        stream.write(data.slice(0, 3))
    assert stream.format == "binary"
    stored = conn.execute(f"SELECT n, s FROM {table} ORDER BY ctid").fetchall()
    assert [n for n, _ in stored] == [*range(10), 0, 1, 2]
    assert [s for _, s in stored][:4] == ["x0", None, "x2", None]


@pytest.mark.parametrize(
    ("pg", "arrow", "value"),
    [
        ("numeric(10,2)", pa.decimal128(10, 2), decimal.Decimal("12.34")),
        ("bytea", pa.string(), "\\x0102"),  # for_copy's hex text for CSV
        ("text", pa.int64(), 7),
        ("integer", pa.float64(), 1.0),
        ("uuid", pa.string(), "5f0e1c52-0d2b-4c3a-9f4e-1b2c3d4e5f60"),
    ],
)
def test_types_without_a_binary_encoding_go_through_csv(conn, pg, arrow, value):
    table = _table(conn, {"v": pg})
    with conn.transaction(), _CopyStream(conn, psycopg.sql.Identifier(table)) as stream:
        stream.write(pa.record_batch({"v": pa.array([value, None], arrow)}))
    assert stream.format == "csv"
    assert conn.execute(f"SELECT count(v), count(*) FROM {table}").fetchone() == (1, 2)


def test_an_integer_too_large_for_the_column_is_an_error_not_a_wrapped_value(conn):
    table = _table(conn, {"v": "smallint"})
    with (
        pytest.raises(pa.ArrowInvalid),
        conn.transaction(),
        _CopyStream(conn, psycopg.sql.Identifier(table)) as stream,
    ):
        stream.write(pa.record_batch({"v": pa.array([40_000], pa.int32())}))
    assert conn.execute(f"SELECT count(*) FROM {table}").fetchone() == (0,)
