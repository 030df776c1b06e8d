"""A cassandra sink's table, exactly once by idempotent upsert.

Every row is an INSERT (an upsert by the table's primary key) stamped `USING TIMESTAMP` with
a position in the source, or with an event time the spec names (`write_time_column`).
Without a transform, a row is its record's and is stamped with the record's own position
(jobs.checkpoints.record_stamps: between the batch before's position and its batch's, from
the offset log); with one, with its batch's (jobs.checkpoints.batch_position: the sum of the
batch's end offsets, which Spark's offset log fixes before the batch runs, plus its id), and
within the batch the last row of a key (by its place in the batch, taken before any shuffle,
so a replay orders the same way) is the one written. A replayed batch, or a write Spark or
the driver retries, writes the same cells with the same stamps: nothing changes. A write of
an older batch that arrives late (a zombie task) carries a lower stamp and loses to the newer
value already there, whatever order the writes land in. There is no marker to keep: a batch
is committed by Spark's own commit log once every write of it is acknowledged at the spec's
consistency level.

Stamps are positions, not clock times: rows deleted or written by anyone else with a normal
(clock) stamp win over the pipeline's writes. A table a sink writes belongs to it: delete with
`USING TIMESTAMP` (or TRUNCATE), or stamp by event time (docs/spec.md).

Counter tables are refused (an increment replayed is counted twice), and so is a column the
output cannot be written into. Collections are written whole (an INSERT replaces the list,
set or map: a replay leaves it the same); nothing is ever appended to one.

The rows are written by the executors' JVM (controlplane.spark.CassandraWriter, the Apache
Cassandra Java driver: asynchronous, a bounded number of requests in flight, token-aware,
UNLOGGED batches per partition key); the table is checked and created from the driver with
the Python driver. Spark-free at import."""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...failures import MISSING_TABLE, TYPE_MISMATCH, UNKNOWN_COLUMN, DefinitionError
from . import types
from .connection import session as open_session
from .model import CassandraSink

log = logging.getLogger("jobs.sinks.cassandra")

WRITER_CLASS = "controlplane.spark.CassandraWriter"
ORDER = "_cp_order"  # a row's place in its batch (the last per primary key is written)
STAMP = "_cp_stamp"  # a row's own stamp, from its record's offset (jobs.checkpoints.record_stamps)
MAX_BATCH_ROWS = 32  # rows of one partition key per UNLOGGED batch
RETRY_SECONDS = 60.0  # how long a task retries what waiting can fix (a node down, timeouts)
STAMP_TYPES = ("timestamp", "timestamp_ntz", "bigint")


class CassandraSinkError(DefinitionError, RuntimeError):
    """The table cannot take the output as the spec asks: the same on every restart."""


class MissingTable(CassandraSinkError):
    category = MISSING_TABLE


class UnknownColumn(CassandraSinkError):
    category = UNKNOWN_COLUMN


class TypeMismatch(CassandraSinkError):
    category = TYPE_MISMATCH


def quote(name: str) -> str:
    """A CQL identifier, quoted (double quotes doubled inside)."""
    return '"' + name.replace('"', '""') + '"'


@dataclass(frozen=True)
class Table:
    """What Cassandra's schema says of a table: its columns' CQL types, its primary key."""

    columns: dict[str, str]
    partition_key: tuple[str, ...]
    clustering: tuple[str, ...]

    @property
    def primary_key(self) -> tuple[str, ...]:
        return (*self.partition_key, *self.clustering)


def read_table(session, keyspace: str, table: str) -> Table | None:
    rows = list(
        session.execute(
            "SELECT column_name, kind, position, type FROM system_schema.columns"
            " WHERE keyspace_name = %s AND table_name = %s",
            [keyspace, table],
        )
    )
    if not rows:
        return None
    keys: dict[str, list[tuple[int, str]]] = {"partition_key": [], "clustering": []}
    for r in rows:
        if r.kind in keys:
            keys[r.kind].append((r.position, r.column_name))
    return Table(
        columns={r.column_name: r.type for r in rows},
        partition_key=tuple(c for _, c in sorted(keys["partition_key"])),
        clustering=tuple(c for _, c in sorted(keys["clustering"])),
    )


def problems(
    table: Table, output: Mapping[str, str | None] | None, sink: CassandraSink
) -> list[tuple[type, str]]:
    """What keeps the table from taking the output (name -> Spark simple type; a type None,
    or no output at all: not known, not checked), each with the error class that says it;
    [] if it can."""
    found: list[tuple[type, str]] = []
    counters = [c for c, t in table.columns.items() if types.is_counter(t)]
    if counters:
        found.append(
            (
                CassandraSinkError,
                f"table {sink.table!r} is a counter table (column {counters[0]!r}): counters take"
                " increments, which a replayed batch would count twice; write to a table of"
                " plain columns (the running count itself, from a stateful transform)",
            )
        )
    if output is None:
        return found
    written = {c: t for c, t in output.items() if c != sink.write_time_column or c in table.columns}
    for column in written:
        if column not in table.columns:
            found.append(
                (
                    UnknownColumn,
                    f"table {sink.table!r} has no column {column!r} for the output's column of that"
                    " name (add it, or leave it out of the transform's output)",
                )
            )
    for column in table.primary_key:
        if column not in output:
            found.append(
                (
                    UnknownColumn,
                    f"the output has no column {column!r} of table {sink.table!r}'s primary key",
                )
            )
    for column, spark_type in written.items():
        cql = table.columns.get(column)
        if spark_type is None or cql is None or types.is_counter(cql):
            continue
        if not types.takes(cql, spark_type):
            found.append(
                (
                    TypeMismatch,
                    f"column {column!r} of table {sink.table!r} is {cql}: it cannot take the"
                    f" output's {spark_type} (only the same type or a safe widening)",
                )
            )
    if sink.write_time_column:
        stamp = output.get(sink.write_time_column)
        if sink.write_time_column not in output:
            found.append(
                (
                    UnknownColumn,
                    f"write_time_column {sink.write_time_column!r} is not an output column",
                )
            )
        elif stamp is not None and stamp not in STAMP_TYPES:
            found.append(
                (
                    TypeMismatch,
                    f"write_time_column {sink.write_time_column!r} is {stamp}: a write time is a"
                    " TIMESTAMP or a BIGINT of microseconds",
                )
            )
    return found


def create_statement(keyspace: str, sink: CassandraSink, output: Mapping[str, str]) -> str:
    """CREATE TABLE IF NOT EXISTS from the output's columns, with the spec's primary key."""
    columns = [f"{quote(c)} {types.cql_type(t)}" for c, t in output.items()]
    partition = ", ".join(quote(c) for c in sink.partition_key)
    key = f"({partition})" + "".join(f", {quote(c)}" for c in sink.clustering_key)
    return (
        f"CREATE TABLE IF NOT EXISTS {quote(keyspace)}.{quote(sink.table)}"
        f" ({', '.join(columns)}, PRIMARY KEY ({key}))"
    )


class CassandraStore:
    """The sink's table, opened once per run from the driver: checked (created where the
    spec gives a primary key and it does not exist), then written batch by batch by the
    executors (`write`)."""

    def __init__(self, arguments: Mapping[str, Any], sink: CassandraSink, pipeline: str):
        self.arguments = dict(arguments)  # the connection's (jobs.sinks.cassandra.connection)
        self.sink = sink
        self.pipeline = pipeline
        self.table: Table | None = None
        self.output: dict[str, str] = {}

    @property
    def keyspace(self) -> str:
        return self.arguments["keyspace"]

    def open(self, output: Mapping[str, str]) -> Table:
        """Check the table against the output (name -> Spark simple type), creating it first
        when it does not exist and the spec gives its primary key; raises CassandraSinkError
        (a definition error) naming each problem."""
        session = open_session(self.arguments)
        try:
            table = read_table(session, self.keyspace, self.sink.table)
            if table is None and self.sink.partition_key:
                try:
                    statement = create_statement(self.keyspace, self.sink, output)
                except types.NoType as exc:
                    raise TypeMismatch(
                        f"table {self.sink.table!r} cannot be created: {exc}"
                    ) from None
                log.info("creating %s.%s", self.keyspace, self.sink.table)
                session.execute(statement, timeout=60)
                table = read_table(session, self.keyspace, self.sink.table)
            if table is None:
                raise MissingTable(
                    f"table {self.sink.table!r} does not exist in keyspace {self.keyspace!r}:"
                    " create it, or give the sink a partition_key to create it from the output"
                )
        finally:
            session.cluster.shutdown()
        found = problems(table, output, self.sink)
        if found:
            cls = found[0][0]
            raise cls("; ".join(message for _, message in found))
        self.table, self.output = table, dict(output)
        return table

    def config(
        self,
        names: Sequence[str],
        *,
        order: str | None,
        stamp: int | None,
        stamps: str | None = None,
    ) -> dict[str, Any]:
        """The Java writer's configuration for a frame with these columns: every column of
        the table the output has (ORDER and a write-time column not in the table left out),
        the table's keys, the stamp (`stamp` for every row, else each row's own in column
        `stamps`, else the spec's write_time_column)."""
        assert self.table is not None, "open() first"
        columns = [{"name": c, "ordinal": names.index(c)} for c in names if c in self.table.columns]
        if stamp is not None:
            write_time: dict[str, Any] = {"constant": int(stamp)}
        elif stamps is not None:
            write_time = {"ordinal": names.index(stamps), "unit": "micros"}
        else:
            column = self.sink.write_time_column
            unit = "micros" if self.output.get(column) == "bigint" else "timestamp"
            write_time = {"ordinal": names.index(column), "unit": unit}
        return {
            **{k: self.arguments.get(k) for k in _CONNECTION_KEYS},
            "keyspace": self.keyspace,
            "table": self.sink.table,
            "columns": columns,
            "partition_key": list(self.table.partition_key),
            "primary_key": list(self.table.primary_key),
            "order_ordinal": names.index(order) if order else -1,
            "write_time": write_time,
            "ttl_seconds": self.sink.ttl_seconds,
            "consistency": self.sink.consistency,
            "max_in_flight": self.sink.max_in_flight,
            "max_batch_rows": MAX_BATCH_ROWS,
            "retry_seconds": RETRY_SECONDS,
            "request_timeout_ms": 10_000,
            "application_name": f"cp:{self.pipeline}",
        }

    def write(self, spark, frame, config: Mapping[str, Any]) -> tuple[int, int]:
        """Every partition of `frame` written by the executors: (rows, statements)."""
        writer = spark._jvm.controlplane.spark.CassandraWriter
        rows, statements = writer.write(frame._jdf, json.dumps(config))
        return int(rows), int(statements)


_CONNECTION_KEYS = ("contact_points", "local_datacenter", "username", "password", "tls")
