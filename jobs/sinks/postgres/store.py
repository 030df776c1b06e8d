"""Exactly-once micro-batch writes into Postgres.

Commit markers `(pipeline, stream_id, batch_id, part)` live in `_cp_commits`, each written in
the same transaction as the rows it stands for. Two ways to write a batch, chosen per batch:

* Direct (append mode, and a plan without a shuffle, so each Spark partition of the batch is
  a fixed piece of the Kafka offset ranges the checkpoint recorded): every executor task
  COPYs its partition straight into the target, in one transaction with the partition's own
  marker (`part` = the Spark partition). A retried or replayed task finds its marker and
  writes nothing. When every task is done, the driver writes the batch's marker (`part` -1)
  and its dead letters. No row passes through the driver, nothing is written twice.
* Staged (upsert mode, or a plan with a shuffle): executors COPY their partitions, in
  parallel, into an unlogged stage table; then one driver transaction claims the batch's
  marker (`part` -1) and moves the staged rows into the target with one INSERT ... SELECT,
  where the last record per key wins. A batch that died mid-way left nothing in the target.

A replayed batch (the query restarted after the sink's transaction but before Spark's own
commit log recorded the batch) finds its `part` -1 marker and skips all work. Two writers
racing for one marker serialise on its primary key: the loser waits, sees the conflict and
skips.

`stream_id` is the streaming query's id, which Spark keeps in the checkpoint: batch ids start
again at 0 in a new checkpoint (or for a pipeline deleted and created again under the same
name), and those batches must not be mistaken for the old ones.

Spark-free and Django-free: it receives Arrow tables, so it runs on the driver or in executors.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass

import psycopg
from psycopg import sql

from ... import dead_letters, pg
from ...failures import DefinitionError

log = logging.getLogger("jobs.sinks.postgres")

COMMITS_TABLE = "_cp_commits"
DEAD_LETTERS_TABLE = dead_letters.TABLE
ORDINAL = "_cp_ordinal"
PART = "_cp_part"

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


BATCH = -1  # the `part` of a whole batch's marker


transient = pg.transient  # (tests and callers read it here)


def _retried(method):
    """Run an idempotent sink operation again when its connection breaks mid-way (a
    database restart, a failover), until `retry_seconds` have passed."""

    @functools.wraps(method)
    def wrapper(self, *args, **kwargs):
        return pg.retried(
            lambda: method(self, *args, **kwargs), f"sink {method.__name__}", self.retry_seconds
        )

    return wrapper


class MixedWritesError(DefinitionError, RuntimeError):
    """A replayed batch was partly written directly and is now to be staged: it cannot be
    completed exactly once, so the job stops instead."""


class PostgresStore:
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
        self._kept: psycopg.Connection | None = None  # the driver's, between batches

    def __getstate__(self) -> dict:
        # Executors get the sink without the driver's connection (they open their own).
        return {**self.__dict__, "_kept": None}

    @contextlib.contextmanager
    def _driver_connection(self):
        """The driver's connection for its per-batch statements, kept open between batches
        (opening one costs more than a small batch's statements), in autocommit: nothing is
        left idle in a transaction. Closed and forgotten when a statement on it fails."""
        conn = self._kept
        if conn is None or conn.closed:
            conn = self._kept = self.connect()
            conn.autocommit = True
        try:
            yield conn
        except BaseException:
            self._kept = None
            conn.close()
            raise

    # How long the sink keeps trying to reach its database before a batch fails: an outage
    # shorter than this costs a pause, not a failure (every write here is idempotent).
    retry_seconds: float = 60.0

    def connect(self) -> psycopg.Connection:
        """A new connection; waits (with backoff, up to `retry_seconds`) while the database
        cannot be reached, but fails at once on what waiting cannot fix (bad credentials, a
        missing database)."""
        return pg.retried(
            lambda: pg.connect(self.conninfo, self.pipeline), "sink connect", self.retry_seconds
        )

    # -- schema ----------------------------------------------------------------------------

    @_retried
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
            conn.execute(dead_letters.CREATE)
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

    # The statements both writers use (this one, and the JVM's, jobs.sinks.jvm_writer), with
    # their parameters in this order.
    CLAIM = sql.SQL(
        "INSERT INTO {} (pipeline, stream_id, batch_id, part, rows)"
        " VALUES (%s, %s, %s, %s, %s) ON CONFLICT DO NOTHING RETURNING 1"
    ).format(sql.Identifier(COMMITS_TABLE))
    PART_ROWS = sql.SQL(
        "UPDATE {} SET rows = %s WHERE pipeline = %s AND stream_id = %s"
        " AND batch_id = %s AND part = %s"
    ).format(sql.Identifier(COMMITS_TABLE))
    DEAD_LETTER = dead_letters.INSERT

    def _claim(self, conn: psycopg.Connection, batch_id: int, rows: int, part: int = BATCH) -> bool:
        """Insert the batch's commit marker; False if it exists (the batch is a replay)."""
        claimed = conn.execute(
            self.CLAIM, (self.pipeline, self.stream_id, batch_id, part, rows)
        ).fetchone()
        if claimed is None:
            log.info(
                "batch %s (part %s) of %s already committed: skipped", batch_id, part, self.pipeline
            )
        return claimed is not None

    @_retried
    def committed(self, batch_id: int) -> bool:
        """Whether the whole batch's marker exists: a replayed batch can skip all its work."""
        with self._driver_connection() as conn:
            return bool(self._parts(conn, batch_id, whole=True))

    def _parts(self, conn: psycopg.Connection, batch_id: int, *, whole: bool) -> list[int]:
        """The batch's marker (whole) or the markers of its partitions written directly."""
        return [
            part
            for (part,) in conn.execute(
                sql.SQL(
                    "SELECT part FROM {} WHERE pipeline = %s AND stream_id = %s AND batch_id = %s"
                    " AND (part = %s) = %s"
                ).format(sql.Identifier(COMMITS_TABLE)),
                (self.pipeline, self.stream_id, batch_id, BATCH, whole),
            ).fetchall()
        ]

    # -- writing: direct, every executor task commits its own partition ----------------------

    def write_part(self, batch_id: int, part: int, chunks) -> tuple[int, int]:
        """Append one Spark partition with its marker, in one transaction, streaming: each
        chunk `(rows, dead_letters or None)` (Arrow tables or record batches) is sent while
        Spark produces the next. A task whose marker exists (a retry, a replay) writes
        nothing. Returns the rows and dead letters the partition holds."""
        rows = dead = 0
        with self.connect() as conn, conn.transaction():
            if not self._claim(conn, batch_id, 0, part):
                for good, letters in chunks:  # Spark still sends them: read them, write none
                    rows += good.num_rows
                    dead += letters.num_rows if letters is not None else 0
                return rows, dead
            dead_letters = []  # few; written once the COPY is done (one statement at a time)
            with _CopyStream(conn, _table_ident(self.table)) as copy:
                for good, letters in chunks:
                    copy.write(good)
                    rows += good.num_rows
                    if letters is not None and letters.num_rows:
                        dead_letters.append(letters)
                        dead += letters.num_rows
            for letters in dead_letters:
                self._dead_letters(conn, batch_id, letters)
            conn.execute(self.PART_ROWS, (rows, self.pipeline, self.stream_id, batch_id, part))
        return rows, dead

    @_retried
    def finish_batch(self, batch_id: int, rows: int, dead_letters=None) -> bool:
        """After every partition was written directly: the batch's marker and dead letters."""
        with self._driver_connection() as conn, conn.transaction():
            done = self._claim(conn, batch_id, rows)
            if done and dead_letters is not None and dead_letters.num_rows:
                self._dead_letters(conn, batch_id, dead_letters)
        return done

    # -- writing: executors stage their partitions in parallel, the driver commits -----------

    def stage_name(self, batch_id: int) -> str:
        key = hashlib.sha1(f"{self.pipeline}/{self.stream_id}".encode()).hexdigest()[:12]  # noqa: S324 - a name, not security
        return f"_cp_stage_{key}_{batch_id}"

    @_retried
    def prepare_stage(self, batch_id: int) -> None:
        """An unlogged table the executors fill in parallel, one slice per Spark partition."""
        with self._driver_connection() as conn:
            self._create_stage(conn, sql.Identifier(self.stage_name(batch_id)))

    @_retried
    def write_stage_part(self, batch_id: int, part: int, table) -> int:
        """Replace this partition's slice of the stage (a retried task replaces, not adds)."""
        stage = self.stage_name(batch_id)
        with self.connect() as conn, conn.transaction():
            for statement in stage_slice_clearing(stage):
                conn.execute(statement, (part,))
            if table.num_rows:
                self._copy(conn, sql.Identifier(stage), _with_order(table, part))
        return table.num_rows

    @_retried
    def commit_stage(self, batch_id: int, dead_letters=None) -> bool:
        """Move the staged batch into the target in one transaction with its marker."""
        stage = sql.Identifier(self.stage_name(batch_id))
        with self._driver_connection() as conn:
            with conn.transaction():
                direct = self._parts(conn, batch_id, whole=False)
                if direct:
                    raise MixedWritesError(
                        f"batch {batch_id} of {self.pipeline} was partly written directly"
                        f" (partitions {sorted(direct)}) before a restart, and the pipeline now"
                        " stages its writes (sink mode or transform changed?): it cannot be"
                        " completed exactly once. Restore the previous sink mode and"
                        " transform until this batch is committed."
                    )
                (rows,) = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(stage)).fetchone()
                done = self._claim(conn, batch_id, rows)
                if done:
                    if rows:
                        self._merge(conn, stage)
                    if dead_letters is not None and dead_letters.num_rows:
                        self._dead_letters(conn, batch_id, dead_letters)
            conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(stage))
        return done

    @_retried
    def drop_stages(self) -> None:
        """Remove stages left by batches that died before committing (called at start-up)."""
        prefix = self.stage_name(0).rsplit("_", 1)[0] + "_"
        with self.connect() as conn:
            names = conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
                " AND starts_with(tablename, %s)",
                (prefix,),
            ).fetchall()
            for (name,) in names:
                conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(sql.Identifier(name)))

    # -- shared pieces ---------------------------------------------------------------------

    def _create_stage(self, conn, stage: sql.Composable) -> None:
        # Unlogged: a stage is rebuilt from Kafka if lost, so it need not pay for the WAL.
        conn.execute(
            sql.SQL(
                "CREATE UNLOGGED TABLE IF NOT EXISTS {} (LIKE {}, {} integer, {} bigint)"
            ).format(stage, _table_ident(self.table), sql.Identifier(PART), sql.Identifier(ORDINAL))
        )

    @staticmethod
    def _copy(conn: psycopg.Connection, target: sql.Composable, table) -> None:
        with _CopyStream(conn, target) as copy:
            copy.write(table)

    def _merge(self, conn: psycopg.Connection, stage: sql.Composable) -> None:
        """INSERT the staged rows into the target; in upsert mode the last record per key
        (by partition, then position: Kafka order within a Kafka partition) wins."""
        columns = [
            name
            for (name,) in conn.execute(
                "SELECT attname FROM pg_attribute WHERE attrelid = %s::regclass AND attnum > 0"
                " AND NOT attisdropped ORDER BY attnum",
                (self.table,),
            ).fetchall()
        ]
        cols = sql.SQL(", ").join(map(sql.Identifier, columns))
        target = _table_ident(self.table)
        if self.mode != "upsert":
            conn.execute(
                sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(target, cols, cols, stage)
            )
            return
        conn.execute(self.upsert_sql(stage, columns, [PART, ORDINAL]))

    def upsert_sql(
        self, source: sql.Composable, columns: list[str], order: list[str]
    ) -> sql.Composable:
        """INSERT `columns` of `source` into the target, the last row per key (by `order`,
        descending) winning, each key's row replacing the one stored."""
        cols = sql.SQL(", ").join(map(sql.Identifier, columns))
        keys = sql.SQL(", ").join(map(sql.Identifier, self.key))
        updates = [
            sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(c))
            for c in columns
            if c not in self.key
        ]
        action = (
            sql.SQL("UPDATE SET ") + sql.SQL(", ").join(updates) if updates else sql.SQL("NOTHING")
        )
        return sql.SQL(
            "INSERT INTO {target} ({cols}) SELECT DISTINCT ON ({keys}) {cols} FROM {source}"
            " ORDER BY {keys}, {order} ON CONFLICT ({keys}) DO {action}"
        ).format(
            target=_table_ident(self.table),
            cols=cols,
            keys=keys,
            source=source,
            order=sql.SQL(", ").join(sql.SQL("{} DESC").format(sql.Identifier(c)) for c in order),
            action=action,
        )

    def _dead_letters(self, conn: psycopg.Connection, batch_id: int, rows) -> None:
        dead_letters.insert(conn, self.pipeline, batch_id, rows)


class _CopyStream:
    """COPY ... FROM STDIN of Arrow tables or record batches, chunk by chunk: the server
    parses one chunk while the caller produces the next. Opened on the first rows. Binary
    COPY (jobs.sinks.pgbinary) where every column's type allows, CSV otherwise."""

    def __init__(self, conn: psycopg.Connection, target: sql.Composable):
        self.conn = conn
        self.target = target
        self._cursor = None
        self._context = None
        self._copy = None
        self._encode = None
        self.format = None

    def __enter__(self) -> _CopyStream:
        return self

    def _open(self, schema) -> None:
        from . import pgbinary

        columns = sql.SQL(", ").join(map(sql.Identifier, schema.names))
        self._cursor = self.conn.cursor()
        self._cursor.execute(sql.SQL("SELECT {} FROM {} LIMIT 0").format(columns, self.target))
        self._encode = pgbinary.encoder(schema, [c.type_code for c in self._cursor.description])
        self.format = "binary" if self._encode else "csv"
        statement = sql.SQL("COPY {} ({}) FROM STDIN WITH (FORMAT {})").format(
            self.target, columns, sql.SQL(self.format)
        )
        self._context = self._cursor.copy(statement)
        self._copy = self._context.__enter__()
        if self._encode:
            self._copy.write(pgbinary.HEADER)

    def write(self, chunk) -> None:
        import pyarrow as pa
        import pyarrow.csv as pacsv

        if not chunk.num_rows:
            return
        if self._copy is None:
            self._open(chunk.schema)
        if self._encode is None:
            buffer = io.BytesIO()
            pacsv.write_csv(chunk, buffer, pacsv.WriteOptions(include_header=False))
            self._copy.write(buffer.getbuffer())
            return
        for batch in chunk.to_batches() if isinstance(chunk, pa.Table) else [chunk]:
            if batch.num_rows:
                self._copy.write(self._encode(batch))

    def __exit__(self, *exc) -> None:
        if self._context is not None:
            try:
                if self._encode is not None and exc[0] is None:
                    from .pgbinary import TRAILER

                    self._copy.write(TRAILER)
                self._context.__exit__(*exc)
            finally:
                self._cursor.close()


def stage_slice_clearing(stage: str) -> list[sql.Composable]:
    """Before a task writes its slice of a stage (its partition: the one parameter): two
    attempts of one task (a retry, speculation) take turns on it, and each removes what the
    other wrote. The Python and the JVM writers run the same statements."""
    return [
        sql.SQL("SELECT pg_advisory_xact_lock(hashtext({}), %s)").format(sql.Literal(stage)),
        sql.SQL("DELETE FROM {} WHERE {} = %s").format(sql.Identifier(stage), sql.Identifier(PART)),
    ]


def _with_order(table, part: int):
    """The table plus the staging columns: its Spark partition and each row's position."""
    import pyarrow as pa

    n = table.num_rows
    return table.append_column(PART, pa.array([part] * n, pa.int32())).append_column(
        ORDINAL, pa.array(range(n), pa.int64())
    )
