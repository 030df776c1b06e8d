"""The Postgres sink's direct writer in the executors' JVM (controlplane.spark.PgCopyWriter,
jobs/java/src/main/java/controlplane/spark/PgCopyWriter.java; built by jobs.jvm).

Each Spark task COPYs its partition into the target in one transaction with the partition's
commit marker and its dead letters, exactly as PostgresStore.write_part does from a Python
worker, with the same statements (PostgresStore.CLAIM, PART_ROWS, DEAD_LETTER). It skips the
hop from Spark's rows to Arrow and a Python worker: on the 2-core benchmark machine that hop
alone cost about a fifth of the no-op sink's throughput.

Used when the jar is on the driver's classpath (jobs.jvm.spark_jars()), the sink is reachable
over TCP with settings the JDBC driver understands, and every column has an encoding below;
otherwise the caller writes from Python. The Spark conf `spark.controlplane.sink.writer`
(`auto`, the default; `jvm`; `python`) forces a choice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

from psycopg import sql

from . import pgbinary
from .store import ORDINAL, PART, PostgresStore, _table_ident, stage_slice_clearing

log = logging.getLogger("jobs.sinks.jvm_writer")

WRITER_CONF = "spark.controlplane.sink.writer"
WRITER_CLASS = "controlplane.spark.PgCopyWriter"

# Encodings of PgCopyWriter (its constants), by Spark simple type and target column type OID.
TEXT, JSONB, BYTEA, BOOL, INT2_FROM_BYTE, INT2, INT4, INT8 = 1, 2, 3, 4, 5, 6, 7, 8
FLOAT4, FLOAT8, DATE, TIMESTAMP, NUMERIC = 9, 10, 11, 12, 13
NUMERIC_OID, BPCHAR_OID = 1700, 1042
_TEXT_TARGETS = {
    pgbinary.TEXT: TEXT,
    pgbinary.VARCHAR: TEXT,
    BPCHAR_OID: TEXT,
    pgbinary.JSON: TEXT,
    pgbinary.JSONB: JSONB,
}
_BY_TYPE: dict[str, dict[int, int]] = {
    "string": _TEXT_TARGETS,
    "binary": {pgbinary.BYTEA: BYTEA},
    "boolean": {pgbinary.BOOL: BOOL},
    "tinyint": {pgbinary.INT2: INT2_FROM_BYTE},
    "smallint": {pgbinary.INT2: INT2},
    "int": {pgbinary.INT4: INT4},
    "bigint": {pgbinary.INT8: INT8},
    "float": {pgbinary.FLOAT4: FLOAT4},
    "double": {pgbinary.FLOAT8: FLOAT8},
    "date": {pgbinary.DATE: DATE},
    "timestamp": {pgbinary.TIMESTAMPTZ: TIMESTAMP, pgbinary.TIMESTAMP: TIMESTAMP},
    "timestamp_ntz": {pgbinary.TIMESTAMP: TIMESTAMP, pgbinary.TIMESTAMPTZ: TIMESTAMP},
}


def column_encoding(spark_type: str, oid: int) -> int | None:
    """How PgCopyWriter sends a Spark column into a Postgres column, or None if it cannot."""
    if spark_type.startswith(("varchar(", "char(")):
        spark_type = "string"
    if spark_type.startswith("decimal("):
        return NUMERIC if oid == NUMERIC_OID else None
    return _BY_TYPE.get(spark_type, {}).get(oid)


# libpq connection parameters the JDBC driver has an equivalent for.
_JDBC_PROPERTIES = {
    "user": "user",
    "password": "password",
    "sslmode": "sslmode",
    "sslrootcert": "sslrootcert",
    "connect_timeout": "connectTimeout",
    "application_name": "ApplicationName",
    "options": "options",
}
# Parameters that need no JDBC property: the URL carries them, or they only tell libpq what
# not to do (read ~/.pgpass, send a client certificate, try Kerberos), which the JDBC driver
# does not do anyway.
_IGNORED = {
    "host",
    "hostaddr",
    "port",
    "dbname",
    "client_encoding",
    "passfile",
    "sslcertmode",
    "gssencmode",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_count",
}


def jdbc_target(conninfo: dict[str, Any]) -> tuple[str, dict[str, str]] | None:
    """psycopg.connect() arguments as a JDBC URL and properties, or None where libpq would
    connect in a way the JDBC driver cannot (a Unix socket, client certificates, options it
    does not know)."""
    from psycopg.conninfo import conninfo_to_dict

    params = conninfo_to_dict(
        conninfo.get("conninfo", ""), **{k: v for k, v in conninfo.items() if k != "conninfo"}
    )
    hosts = str(params.get("hostaddr") or params.get("host") or "").split(",")
    if not hosts[0] or any(h.startswith("/") or h.startswith("@") for h in hosts):
        return None  # a Unix socket
    unknown = set(params) - set(_JDBC_PROPERTIES) - _IGNORED
    if unknown:
        log.info("JDBC writer not used: connection parameters %s", sorted(unknown))
        return None
    ports = str(params.get("port") or "5432").split(",")
    if len(ports) == 1:
        ports *= len(hosts)
    if len(ports) != len(hosts):
        return None
    if ":" in "".join(hosts):
        hosts = [f"[{h}]" if ":" in h else h for h in hosts]  # IPv6 literals
    # The database name is encoded: raw, a name like "db?socketFactory=..." would add JDBC
    # URL parameters of its own.
    url = "jdbc:postgresql://{}/{}".format(
        ",".join(f"{h}:{p}" for h, p in zip(hosts, ports, strict=True)),
        quote(
            params.get("dbname") or params.get("user") or os.environ.get("PGDATABASE", ""),
            safe="",
        ),
    )
    props = {_JDBC_PROPERTIES[k]: str(v) for k, v in params.items() if k in _JDBC_PROPERTIES and v}
    if str(params.get("keepalives", "")) == "1":
        props["tcpKeepAlive"] = "true"
    if "password" not in props and os.environ.get("PGPASSWORD"):
        props["password"] = os.environ["PGPASSWORD"]
    return url, props


def _jdbc(statement: sql.Composable, conn) -> str:
    """A psycopg statement with JDBC's `?` placeholders."""
    return statement.as_string(conn).replace("%s", "?")


class JvmWriter:
    """Writes a frame's partitions with PgCopyWriter; one per BatchWriter."""

    def __init__(self, spark, sink: PostgresStore, target: tuple[str, dict[str, str]]):
        self.spark = spark
        self.sink = sink
        self.url, self.properties = target
        self.properties.setdefault("ApplicationName", f"cp:{sink.pipeline}")
        self._targets: dict[tuple, dict | None] = {}

    @classmethod
    def create(cls, spark, sink: PostgresStore) -> JvmWriter | None:
        """A writer if the conf allows and everything it needs is there, else None; raises
        if the conf demands the JVM writer and it cannot be used."""
        choice = (spark.conf.get(WRITER_CONF, "auto") or "auto").lower()
        if choice == "python":
            return None
        problem = None
        target = jdbc_target(sink.conninfo)
        if target is None:
            problem = "the sink's connection is not one the JDBC driver can open"
        elif not _class_loaded(spark):
            problem = f"{WRITER_CLASS} is not on the classpath (jobs.jvm.spark_jars())"
        if problem is None:
            return cls(spark, sink, target)
        if choice == "jvm":
            raise RuntimeError(f"{WRITER_CONF}=jvm, but {problem}")
        log.info("the Postgres sink writes from Python: %s", problem)
        return None

    def write(
        self,
        frame,
        batch_id: int,
        columns: Sequence[str],
        *,
        dead_letter_columns: Sequence[str] | None = None,
        bad_column: str | None = None,
        parse_error: str = "",
        empty_value_error: str = "",
        upsert_order: str | None = None,
        stage: str | None = None,
        schema=None,
    ) -> tuple[int, int] | None:
        """COPY `columns` of every partition of `frame` into the target, each partition with
        its marker, rows where `bad_column` is true into the dead letters instead. With
        `upsert_order` (a bigint column of the frame), each partition is COPYed into a
        temporary table and merged into the target by the sink's key, the row with the
        highest `upsert_order` winning per key: the frame must hold every row of a key in one
        partition. With `stage` (the batch's stage table, made by PostgresStore.prepare_stage),
        each task replaces its partition's slice of the stage instead, without a marker: the
        frame then also holds the stage's PART and ORDINAL columns. None when a column has no
        encoding for its target column (the caller then writes from Python). `schema`: the
        frame's, when the caller knows it (asking the frame costs a round trip to the JVM)."""
        schema = schema or frame.schema
        fields = {f.name: f.dataType for f in schema.fields}
        names = [f.name for f in schema.fields]
        types = tuple(fields[c].simpleString() for c in columns)
        key = (tuple(columns), types, upsert_order, stage is not None)
        if key not in self._targets:
            # The target's column types and the statements, once per frame shape (a batch's
            # driver work stays small); forgotten if a write fails (a changed table).
            self._targets[key] = self._target(columns, types, upsert_order)
        target = self._targets[key]
        if target is None:
            return None
        written = (*columns, *([upsert_order] if upsert_order else []))
        if stage is not None:
            target = {
                **target,
                **_stage_statements(stage, columns),
                "encodings": [*target["encodings"], INT4, INT8],  # the stage is LIKE the target
            }
            written = (*columns, PART, ORDINAL)
        config = {
            **target,
            "url": self.url,
            "properties": self.properties,
            "pipeline": self.sink.pipeline,
            "stream_id": self.sink.stream_id,
            "batch_id": batch_id,
            "ordinals": [names.index(c) for c in written],
            "decimal_precisions": [getattr(fields[c], "precision", 0) for c in written],
            "decimal_scales": [getattr(fields[c], "scale", 0) for c in written],
            "bad_ordinal": names.index(bad_column) if bad_column else -1,
            "dead_ordinals": [names.index(c) for c in dead_letter_columns or ()],
            "parse_error": parse_error,
            "empty_value_error": empty_value_error,
            "connect_retry_seconds": self.sink.retry_seconds,
        }
        writer = self.spark._jvm.controlplane.spark.PgCopyWriter
        try:
            rows, dead = writer.write(frame._jdf, json.dumps(config))
        except Exception:
            self._targets.pop(key, None)
            raise
        return int(rows), int(dead)

    def _target(
        self, columns: Sequence[str], types: Sequence[str], upsert_order: str | None = None
    ) -> dict | None:
        """Encodings and statements for writing `columns` (of these Spark types) into the
        target (merged by key through a temporary table, with `upsert_order`), or None if a
        column has no encoding for its target column."""
        with self.sink.connect() as conn:
            target = _table_ident(self.sink.table)
            cur = conn.execute(
                sql.SQL("SELECT {} FROM {} LIMIT 0").format(
                    sql.SQL(", ").join(map(sql.Identifier, columns)), target
                )
            )
            oids = [d.type_code for d in cur.description]
            encodings = [column_encoding(t, oid) for t, oid in zip(types, oids, strict=True)]
            if None in encodings:
                bad = [c for c, e in zip(columns, encodings, strict=True) if e is None]
                log.info("JVM writer: no binary encoding for columns %s; writing from Python", bad)
                return None
            statements = {
                "claim_sql": _jdbc(PostgresStore.CLAIM, conn),
                "rows_sql": _jdbc(PostgresStore.PART_ROWS, conn),
                "dead_letter_sql": _jdbc(PostgresStore.DEAD_LETTER, conn),
            }
            names = sql.SQL(", ").join(map(sql.Identifier, columns))
            if upsert_order is None:
                copy = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT binary)").format(target, names)
                return {**statements, "encodings": encodings, "copy_sql": copy.as_string(conn)}
            # One temporary table per pooled connection and frame shape, emptied at every
            # commit (not one created and dropped per task: no catalog churn per batch).
            shape = f"{self.sink.table}/{','.join(columns)}/{','.join(types)}"
            temp = sql.Identifier(f"_cp_upsert_{hashlib.sha1(shape.encode()).hexdigest()[:12]}")  # noqa: S324 - a name
            order = sql.Identifier(upsert_order)
            create = sql.SQL(
                "CREATE TEMP TABLE IF NOT EXISTS {temp} ON COMMIT DELETE ROWS AS"
                " SELECT {names}, 0::bigint AS {order} FROM {target} WITH NO DATA"
            ).format(temp=temp, names=names, order=order, target=target)
            copy = sql.SQL("COPY {} ({}, {}) FROM STDIN WITH (FORMAT binary)").format(
                temp, names, order
            )
            merge = self.sink.upsert_sql(temp, list(columns), [upsert_order])
            return {
                **statements,
                "encodings": [*encodings, INT8],
                "copy_sql": copy.as_string(conn),
                "before_copy_sql": [create.as_string(conn)],
                "after_copy_sql": [merge.as_string(conn)],
            }


def _stage_statements(stage: str, columns: Sequence[str]) -> dict:
    """Replacing a task's slice of a batch's stage, as PostgresStore.write_stage_part does.
    No marker: the driver commits the whole stage with the batch's marker."""
    copy = sql.SQL("COPY {} ({}, {}, {}) FROM STDIN WITH (FORMAT binary)").format(
        sql.Identifier(stage),
        sql.SQL(", ").join(map(sql.Identifier, columns)),
        sql.Identifier(PART),
        sql.Identifier(ORDINAL),
    )
    return {
        "claim_sql": None,
        "rows_sql": None,
        "copy_sql": copy.as_string(),
        "before_copy_sql": [_jdbc(statement, None) for statement in stage_slice_clearing(stage)],
        "after_copy_sql": [],
    }


def _class_loaded(spark) -> bool:
    from py4j.java_gateway import JavaClass

    try:
        return isinstance(spark._jvm.controlplane.spark.PgCopyWriter, JavaClass)
    except Exception:
        return False
