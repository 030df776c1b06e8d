"""The dead-letter table of a Postgres database: the records that did not parse, as they
arrived, with where they came from and why. Written by the Postgres sink in the transaction of
their batch, and by sinks that keep their letters in a Postgres connection's table (the
cassandra sink's `dead_letters`); read, counted and redriven by the control plane
(controlplane.observability.dead_letters).

A letter's key is its record's position (pipeline, topic, partition, offset) and a write of
one that is there already does nothing: a replayed batch's letters are written once, whoever
writes them. Spark-free and Django-free."""

from __future__ import annotations

import psycopg
from psycopg import sql

from . import pg

TABLE = "_cp_dead_letters"

CREATE = sql.SQL(
    "CREATE TABLE IF NOT EXISTS {} ("
    " pipeline text NOT NULL, batch_id bigint NOT NULL, topic text NOT NULL,"
    ' partition integer NOT NULL, "offset" bigint NOT NULL, raw bytea,'
    " error text NOT NULL, record_time timestamptz,"
    " received_at timestamptz NOT NULL DEFAULT now(),"
    ' PRIMARY KEY (pipeline, topic, partition, "offset"))'
).format(sql.Identifier(TABLE))
INSERT = sql.SQL(
    'INSERT INTO {} (pipeline, batch_id, topic, partition, "offset", raw, error,'
    " record_time) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) ON CONFLICT DO NOTHING"
).format(sql.Identifier(TABLE))


def insert(conn: psycopg.Connection, pipeline: str, batch_id: int, rows) -> int:
    """Write dead-letter rows (an Arrow table with the columns topic, partition, offset,
    value, error, timestamp) in the connection's current transaction; how many there were."""
    letters = rows.to_pylist()
    with conn.cursor() as cur:
        cur.executemany(
            INSERT,
            [
                (
                    pipeline,
                    batch_id,
                    r["topic"],
                    r["partition"],
                    r["offset"],
                    r["value"],
                    r["error"],
                    r["timestamp"],
                )
                for r in letters
            ],
        )
    return len(letters)


def write(
    conninfo: dict, pipeline: str, batch_id: int, rows, retry_seconds: float = pg.RETRY_SECONDS
) -> int:
    """Write a batch's dead letters into the table (created if need be) of the database
    `conninfo` names, in a transaction of their own; waits (with backoff, up to
    `retry_seconds`) while the database is away: written again, they are written once."""

    def attempt() -> int:
        with pg.connect(conninfo, pipeline) as conn:
            conn.execute(CREATE)
            return insert(conn, pipeline, batch_id, rows)

    return pg.retried(attempt, "dead letters", retry_seconds)
