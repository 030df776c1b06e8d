"""Exactly-once micro-batch writes into Postgres.

Each write is one transaction that first claims a commit marker
`(pipeline, stream_id, batch_id, part)` in `_cp_commits`, then COPYs the rows. A replayed
batch (the query restarted after writing but before Spark's own commit log recorded it) finds
its marker and writes nothing; a batch that died mid-transaction left nothing behind, marker
included. Two writers racing for one marker serialise on its primary key: the loser waits,
then sees the conflict and skips.

`stream_id` is the streaming query's id, which Spark keeps in the checkpoint: batch ids start
again at 0 in a new checkpoint (or for a pipeline deleted and created again under the same
name), and those batches must not be mistaken for the old ones.

Spark-free and Django-free: it receives Arrow tables, so it runs on the driver or in executors.
"""

from __future__ import annotations

import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

log = logging.getLogger("jobs.sinks.postgres")

COMMITS_TABLE = "_cp_commits"
DEAD_LETTERS_TABLE = "_cp_dead_letters"
ORDINAL = "_cp_ordinal"

# Spark simple type names (jobs.spec.ddl.simple_string) -> Postgres column types.
_PG_TYPES = {
    "string": "text",
    "boolean": "boolean",
    "tinyint": "smallint",
    "smallint": "smallint",
    "int": "integer",
    "bigint": "bigint",
    "float": "real",
    "double": "double precision",
    "date": "date",
    "timestamp": "timestamptz",
    "timestamp_ntz": "timestamp",
    "binary": "bytea",
}


def postgres_type(spark_type: str) -> str:
    """The column type for a Spark simple type string; nested types are stored as jsonb."""
    if spark_type in _PG_TYPES:
        return _PG_TYPES[spark_type]
    if spark_type.startswith("decimal("):
        return "numeric" + spark_type[len("decimal") :]
    if spark_type.startswith(("varchar(", "char(")):
        return "text"
    return "jsonb"


@dataclass(frozen=True)
class Column:
    name: str
    spark_type: str


def _table_ident(table: str) -> sql.Composable:
    return sql.Identifier(*table.split("."))


class PostgresSink:
    def __init__(
        self,
        conninfo: dict,
        *,
        pipeline: str,
        stream_id: str = "",
        table: str,
        mode: str = "append",
        key: Sequence[str] = (),
    ):
        self.conninfo = conninfo
        self.pipeline = pipeline
        self.stream_id = stream_id
        self.table = table
        self.mode = mode
        self.key = list(key)

    def connect(self) -> psycopg.Connection:
        return psycopg.connect(**self.conninfo, application_name=f"cp:{self.pipeline}")

    # -- schema ----------------------------------------------------------------------------

    def ensure_tables(self, columns: Sequence[Column]) -> None:
        """Create the target, marker and dead-letter tables if they do not exist."""
        with self.connect() as conn:
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " pipeline text NOT NULL, stream_id text NOT NULL, batch_id bigint NOT NULL,"
                    " part integer NOT NULL, rows bigint NOT NULL,"
                    " committed_at timestamptz NOT NULL DEFAULT now(),"
                    " PRIMARY KEY (pipeline, stream_id, batch_id, part))"
                ).format(sql.Identifier(COMMITS_TABLE))
            )
            conn.execute(
                sql.SQL(
                    "CREATE TABLE IF NOT EXISTS {} ("
                    " pipeline text NOT NULL, batch_id bigint NOT NULL, topic text NOT NULL,"
                    ' partition integer NOT NULL, "offset" bigint NOT NULL, raw bytea,'
                    " error text NOT NULL, record_time timestamptz,"
                    " received_at timestamptz NOT NULL DEFAULT now(),"
                    ' PRIMARY KEY (pipeline, topic, partition, "offset"))'
                ).format(sql.Identifier(DEAD_LETTERS_TABLE))
            )
            if "." in self.table:
                conn.execute(
                    sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                        sql.Identifier(self.table.split(".")[0])
                    )
                )
            definitions = [
                sql.SQL("{} {}").format(
                    sql.Identifier(c.name), sql.SQL(postgres_type(c.spark_type))
                )
                for c in columns
            ]
            if self.mode == "upsert":
                definitions.append(
                    sql.SQL("PRIMARY KEY ({})").format(
                        sql.SQL(", ").join(map(sql.Identifier, self.key))
                    )
                )
            conn.execute(
                sql.SQL("CREATE TABLE IF NOT EXISTS {} ({})").format(
                    _table_ident(self.table), sql.SQL(", ").join(definitions)
                )
            )

    # -- writing ---------------------------------------------------------------------------

    def write(self, table, batch_id: int, part: int = -1, dead_letters=None) -> bool:
        """Write one Arrow table (and its dead letters) exactly once; False if already done.

        `part` is -1 for a whole batch written from the driver, or an input-partition number
        when executors write their share of a batch in parallel.
        """
        with self.connect() as conn, conn.transaction():
            claimed = conn.execute(
                sql.SQL(
                    "INSERT INTO {} (pipeline, stream_id, batch_id, part, rows)"
                    " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1"
                ).format(sql.Identifier(COMMITS_TABLE)),
                (self.pipeline, self.stream_id, batch_id, part, table.num_rows),
            ).fetchone()
            if claimed is None:
                log.info(
                    "batch %s part %s of %s already committed: skipped",
                    batch_id,
                    part,
                    self.pipeline,
                )
                return False
            if table.num_rows:
                if self.mode == "upsert":
                    self._upsert(conn, table)
                else:
                    self._copy(conn, _table_ident(self.table), table)
            if dead_letters is not None and dead_letters.num_rows:
                self._dead_letters(conn, batch_id, dead_letters)
        return True

    @staticmethod
    def _copy(conn: psycopg.Connection, target: sql.Composable, table) -> None:
        import pyarrow.csv as pacsv

        buffer = io.BytesIO()
        pacsv.write_csv(table, buffer, pacsv.WriteOptions(include_header=False))
        statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT csv)").format(
            target, sql.SQL(", ").join(map(sql.Identifier, table.column_names))
        )
        with conn.cursor().copy(statement) as copy:
            copy.write(buffer.getbuffer())

    def _upsert(self, conn: psycopg.Connection, table) -> None:
        import pyarrow as pa

        staging = sql.Identifier("_cp_staging")
        conn.execute(
            sql.SQL("CREATE TEMP TABLE {} (LIKE {} INCLUDING DEFAULTS) ON COMMIT DROP").format(
                staging, _table_ident(self.table)
            )
        )
        conn.execute(
            sql.SQL("ALTER TABLE {} ADD COLUMN {} bigint").format(staging, sql.Identifier(ORDINAL))
        )
        ordered = table.append_column(ORDINAL, pa.array(range(table.num_rows), pa.int64()))
        self._copy(conn, staging, ordered)
        columns = [sql.Identifier(c) for c in table.column_names]
        keys = [sql.Identifier(k) for k in self.key]
        updates = [
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
            for c in table.column_names
            if c not in self.key
        ]
        # The last record for a key within the batch wins, as it would row by row.
        conn.execute(
            sql.SQL(
                "INSERT INTO {target} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {staging}"
                " ORDER BY {keys}, {ordinal} DESC ON CONFLICT ({keys}) DO {action}"
            ).format(
                target=_table_ident(self.table),
                cols=sql.SQL(", ").join(columns),
                keys=sql.SQL(", ").join(keys),
                staging=staging,
                ordinal=sql.Identifier(ORDINAL),
                action=sql.SQL("UPDATE SET ") + sql.SQL(", ").join(updates)
                if updates
                else sql.SQL("NOTHING"),
            )
        )

    def _dead_letters(self, conn: psycopg.Connection, batch_id: int, rows) -> None:
        with conn.cursor() as cur:
            cur.executemany(
                sql.SQL(
                    'INSERT INTO {} (pipeline, batch_id, topic, partition, "offset", raw, error,'
                    " record_time) VALUES (%s, %s, %s, %s, %s, %s, %s, %s)"
                    " ON CONFLICT DO NOTHING"
                ).format(sql.Identifier(DEAD_LETTERS_TABLE)),
                [
                    (
                        self.pipeline,
                        batch_id,
                        r["topic"],
                        r["partition"],
                        r["offset"],
                        r["value"],
                        r["error"],
                        r["timestamp"],
                    )
                    for r in rows.to_pylist()
                ],
            )
