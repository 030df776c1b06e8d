"""The cassandra sink's spec: the `sink` (or one of `sinks`) of kind "cassandra". Plain Python,
no imports beyond the standard library."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Consistency = Literal[
    "ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE"
]


@dataclass(frozen=True)
class DeadLetterTarget:
    """Where a cassandra sink's dead letters go: the records of a Kafka topic (a kafka
    connection and `topic`), or the dead-letter table of a postgres connection (no topic)."""

    connection: str
    topic: str | None = None


@dataclass(frozen=True)
class CassandraSink:
    """Each batch's rows are upserted into a table of the connection's keyspace, every write
    stamped (USING TIMESTAMP) with the batch's position in the source, or with an event time
    the spec names: a replayed batch or a retried write writes the same cells with the same
    stamp, and never wins over a newer one (jobs.sinks.cassandra.store)."""

    connection: str  # a cassandra connection: the cluster and the keyspace
    table: str  # in the connection's keyspace
    # Where the records that do not parse go (required: none is ever dropped).
    dead_letters: DeadLetterTarget
    # The table's primary key when it is created from the output (it must exist otherwise):
    # the partition key's columns, then the clustering columns.
    partition_key: tuple[str, ...] = ()
    clustering_key: tuple[str, ...] = ()
    consistency: Consistency = "LOCAL_QUORUM"
    # Cells expire this long after they are written (USING TTL); None: never.
    ttl_seconds: int | None = None
    # USING TIMESTAMP from this output column (a TIMESTAMP: its microseconds; a BIGINT:
    # microseconds as they are) instead of the batch's position in the source: the newest
    # event time wins, whatever order the records came in.
    write_time_column: str | None = None
    # Writes each Spark task keeps in flight at once.
    max_in_flight: int = 128
    kind: Literal["cassandra"] = "cassandra"

    def connection_names(self) -> tuple[str, ...]:
        """The connections it writes through: its own, and its dead letters'."""
        return (self.connection, self.dead_letters.connection)
