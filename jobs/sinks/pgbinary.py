"""Arrow record batches as PostgreSQL binary COPY data, encoded with numpy, column by column.

Postgres reads its binary COPY format about 2.4 times as fast as CSV (measured on this
machine: 2.4M against 1.0M rows/s for the demo's six columns), and numpy builds it several
times faster than pyarrow writes CSV, because nothing is formatted as text and parsed again:
a double is its 8 bytes, a timestamp 8 bytes of microseconds, a string its UTF-8 bytes.

The format (https://www.postgresql.org/docs/current/sql-copy.html, "Binary Format"): a
header, then per row an int16 field count and per field an int32 length (-1: NULL) and the
value in the type's binary "send" form, all big-endian; an int16 -1 ends the data. Only
types whose send form is simple are encoded here, and only onto the column types they were
made for (`encoder()` returns None otherwise and the caller uses CSV): text-like, integers,
floats, booleans, dates, timestamps, bytea, json and jsonb.

Plain numpy and pyarrow: no Spark, no Django, no database connection.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

HEADER = b"PGCOPY\n\xff\r\n\x00" + b"\x00\x00\x00\x00" + b"\x00\x00\x00\x00"
TRAILER = b"\xff\xff"

# Postgres type OIDs (pg_type.oid; fixed for built-in types).
BOOL, BYTEA, INT8, INT2, INT4, TEXT, JSON = 16, 17, 20, 21, 23, 25, 114
FLOAT4, FLOAT8, VARCHAR, DATE, TIMESTAMP, TIMESTAMPTZ, JSONB = (
    700,
    701,
    1043,
    1082,
    1114,
    1184,
    3802,
)

_PG_EPOCH_US = 946_684_800_000_000  # 2000-01-01 in Unix microseconds
_PG_EPOCH_DAYS = 10_957

# A column as (lengths, data): lengths int64 per row (-1: NULL); data either an (n, width)
# uint8 array of fixed-width values or (flat uint8 bytes, per-row start offsets into it, a
# prefix of at most one byte that each value's length includes).
Field = tuple[np.ndarray, object]


def _fixed(array: pa.Array, dtype: str) -> Field:
    valid = _valid(array)
    values = array.fill_null(pa.scalar(0).cast(array.type)) if array.null_count else array
    raw = np.asarray(values.to_numpy(zero_copy_only=False)).astype(dtype, copy=False)
    width = np.dtype(dtype).itemsize
    lengths = np.where(valid, width, -1).astype(np.int64)
    return lengths, np.ascontiguousarray(raw).view(np.uint8).reshape(len(array), width)


def _valid(array: pa.Array) -> np.ndarray:
    if not array.null_count:
        return np.ones(len(array), bool)
    return np.asarray(array.is_valid().to_numpy(zero_copy_only=False))


def _variable(array: pa.Array, prefix: bytes = b"") -> Field:
    """Strings and binaries: each row's bytes, found through the Arrow offsets (no copy),
    after an optional one-byte prefix (jsonb's version)."""
    large = pa.types.is_large_string(array.type) or pa.types.is_large_binary(array.type)
    n = len(array)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64 if large else np.int32)
    offsets = offsets[array.offset : array.offset + n + 1].astype(np.int64)
    data = np.zeros(0, np.uint8) if data_buffer is None else np.frombuffer(data_buffer, np.uint8)
    lengths = np.diff(offsets) + len(prefix)
    return np.where(_valid(array), lengths, -1), (data, offsets[:-1], prefix)


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The concatenated index ranges starts[i] .. starts[i] + lengths[i]."""
    lengths = np.maximum(lengths, 0)
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, np.int64)
    begin = np.cumsum(lengths) - lengths
    return np.repeat(starts - begin, lengths) + np.arange(total, dtype=np.int64)


def _timestamp(array: pa.Array) -> Field:
    micros = pc.cast(array, pa.timestamp("us", array.type.tz), safe=False).cast(pa.int64())
    return _fixed(pc.subtract(micros, _PG_EPOCH_US), ">i8")


def _date(array: pa.Array) -> Field:
    days = array.cast(pa.int32())
    return _fixed(pc.subtract(days, _PG_EPOCH_DAYS), ">i4")


def _integer(dtype: str) -> Callable[[pa.Array], Field]:
    arrow = {">i2": pa.int16(), ">i4": pa.int32(), ">i8": pa.int64()}[dtype]
    return lambda array: _fixed(array.cast(arrow), dtype)  # safe: overflow raises


def _column_encoder(arrow_type: pa.DataType, oid: int) -> Callable[[pa.Array], Field] | None:
    t = pa.types
    if t.is_string(arrow_type) or t.is_large_string(arrow_type):
        if oid in (TEXT, VARCHAR, JSON):
            return _variable
        if oid == JSONB:
            return lambda array: _variable(array, b"\x01")
        return None
    if t.is_binary(arrow_type) or t.is_large_binary(arrow_type):
        return _variable if oid == BYTEA else None
    if t.is_boolean(arrow_type):
        return (lambda array: _fixed(array, "u1")) if oid == BOOL else None
    if t.is_integer(arrow_type):
        return {INT2: _integer(">i2"), INT4: _integer(">i4"), INT8: _integer(">i8")}.get(oid)
    if t.is_float64(arrow_type):
        return (lambda array: _fixed(array, ">f8")) if oid == FLOAT8 else None
    if t.is_float32(arrow_type):
        if oid == FLOAT4:
            return lambda array: _fixed(array, ">f4")
        return (lambda array: _fixed(array.cast(pa.float64()), ">f8")) if oid == FLOAT8 else None
    if t.is_timestamp(arrow_type):
        return _timestamp if oid in (TIMESTAMP, TIMESTAMPTZ) else None
    if t.is_date32(arrow_type):
        return _date if oid == DATE else None
    return None


def encoder(schema: pa.Schema, oids: Sequence[int]) -> Callable | None:
    """A function from record batch (of this schema) to binary COPY rows (no header, no
    trailer) for target columns of these type OIDs, or None when a column is not supported."""
    if len(schema) != len(oids):
        return None
    columns = [_column_encoder(field.type, oid) for field, oid in zip(schema, oids, strict=True)]
    if any(c is None for c in columns):
        return None

    def encode(batch) -> bytes:
        return _rows([c(batch.column(i)) for i, c in enumerate(columns)], batch.num_rows)

    return encode


def _rows(fields: list[Field], n: int) -> bytes:
    sizes = np.full(n, 2, np.int64)
    for lengths, _ in fields:
        sizes += 4 + np.maximum(lengths, 0)
    row_start = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), np.uint8)
    count = np.array([len(fields)], ">i2").view(np.uint8)
    out[row_start] = count[0]
    out[row_start + 1] = count[1]
    pos = row_start + 2
    for lengths, data in fields:
        length_bytes = lengths.astype(">i4").view(np.uint8).reshape(n, 4)
        for b in range(4):
            out[pos + b] = length_bytes[:, b]
        pos = pos + 4
        present = np.maximum(lengths, 0)
        if isinstance(data, np.ndarray):  # fixed width
            width = data.shape[1]
            keep = lengths >= 0
            where = pos[keep]
            values = data[keep]
            for b in range(width):
                out[where + b] = values[:, b]
        else:
            flat, starts, prefix = data
            if prefix:
                out[pos[lengths >= 0]] = prefix[0]
                present = np.maximum(present - 1, 0)
                pos = pos + (lengths >= 0)
            out[_ranges(pos, present)] = flat[_ranges(starts, present)]
        pos = pos + present
    return out.tobytes()
