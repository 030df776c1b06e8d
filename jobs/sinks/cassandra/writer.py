"""The cassandra sink's writer (the foreachBatch function of a cassandra sink): the records
that parsed, through the transform if any, are upserted into the table by the executors'
JVM in one pass (jobs.sinks.cassandra.store), while those that did not are counted; a batch
that had some reads them again and writes them where the spec says (a Kafka topic, in a
transaction with its marker, or a Postgres connection's dead-letter table, by their
position), so they too are written once, however often the batch runs."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from ... import dead_letters as letter_table
from ...batch import BAD, EMPTY_VALUE, Batch, observed_count
from ...checkpoints import batch_position, record_stamps
from ...runconfig import RunConfig
from ...source import DEAD_LETTER_FIELDS
from .kind import KIND
from .model import CassandraSink
from .store import ORDER, STAMP, CassandraStore

log = logging.getLogger("jobs.pipeline")


@dataclass
class Plan:
    """Learnt from the first batch: the output's columns and the table's partition key."""

    columns: list[str]
    partition_key: tuple[str, ...]


@dataclass(frozen=True)
class _LetterTopic:
    """What the transactional Kafka writer needs of a sink, for a topic of dead letters."""

    topic: str
    dead_letter_topic: str
    transaction_timeout_seconds: int = 120


class Writer:
    """The foreachBatch function of a cassandra sink."""

    def __init__(self, config: RunConfig, partitions: int = 2, index: int = 0):
        self.batch = Batch(config, index, KIND)
        self.config = config
        self.sink: CassandraSink = self.batch.sink
        # Rows go by partition key into this many Spark partitions (each key's rows in one:
        # the last per primary key is kept there, and a key's rows share UNLOGGED batches).
        self.partitions = partitions
        self.store: CassandraStore | None = None
        self.plan: Plan | None = None
        self._letters = None  # the dead letters' Kafka writer, when they go to a topic
        self._stream = ""

    def open(self, spark, query_id: str) -> None:
        """Nothing to start beside the query."""

    def _start(self, out) -> None:
        output = {f.name: f.dataType.simpleString() for f in out.schema.fields}
        self.store = CassandraStore(self.batch.client(), self.sink, self.config.pipeline)
        table = self.store.open(output)
        self.plan = Plan(list(out.columns), table.partition_key)
        self._stream = self.batch.stream_id()
        topic = self.sink.dead_letters.topic
        if topic is not None:
            from ...kafka import transactions

            client = self.config.sink_config(self.batch.index).get("kafka") or {}
            transactions.check_topics(client, [topic])
            self._letters = transactions.KafkaWriter(
                out.sparkSession,
                pipeline=self.config.pipeline,
                sink=_LetterTopic(topic, topic),
                client=client,
            )

    def __call__(self, parsed, batch_id: int) -> None:
        from pyspark.sql import functions as F

        stamps = None
        if self._own_stamps:
            stamps = record_stamps(self.config.checkpoint, batch_id, self.config.store)
        if stamps is not None:
            # Each row its record's own stamp: rows go as they come, no shuffle, nothing held
            # back (the highest stamp of a key wins in Cassandra, whatever order they land in).
            name, frame = self._stamped(parsed, batch_id, stamps)
            if self.plan is None:
                self._start(frame.drop(STAMP))
            started = time.monotonic()
            how = f"stamps {min(stamps.values())}+offset"
            config = self.store.config(frame.columns, order=None, stamp=None, stamps=STAMP)
        else:
            name, out = self.batch.observed_output(parsed, batch_id)
            if self.plan is None:
                self._start(out)
            started = time.monotonic()
            # The order is taken before the shuffle, from the batch's fixed input partitions,
            # so a replay keeps the same last row per key.
            frame = out.withColumn(ORDER, F.monotonically_increasing_id()).repartition(
                self.partitions, *[F.col(f"`{k}`") for k in self.plan.partition_key]
            )
            stamp = None
            if self.sink.write_time_column is None:
                stamp = batch_position(self.config.checkpoint, batch_id, self.config.store)
            how = f"stamp {stamp if stamp is not None else self.sink.write_time_column}"
            config = self.store.config(frame.columns, order=ORDER, stamp=stamp)
        rows, statements = self.store.write(parsed.sparkSession, frame, config)
        written = time.monotonic()
        dead = self._dead_letters(parsed, batch_id, observed_count(frame, name))
        log.info(
            "batch %s: %s rows in %s statements (cassandra, %s) in %.2f s, %s dead letters",
            batch_id,
            rows,
            statements,
            how,
            written - started,
            dead,
        )

    @property
    def _own_stamps(self) -> bool:
        """Whether each row is its record's (no transform or state between them), and is
        stamped by position (not by an event-time column)."""
        return (
            self.sink.write_time_column is None
            and self.batch.transform is None
            and not self.config.spec.stateful
        )

    def _stamped(self, parsed, batch_id: int, stamps: dict[tuple[str, int], int]):
        """(name, frame): the records that parsed with their stamps (STAMP: the record's
        offset plus its partition's number), those that did not counted as `name`."""
        from pyspark.sql import functions as F

        columns, count, good, named = self.batch.observed_parts()
        by_topic: dict[str, dict[int, int]] = {}
        for (topic, partition), add in stamps.items():
            by_topic.setdefault(topic, {})[partition] = add
        added = None
        for topic, numbers in sorted(by_topic.items()):
            # An array indexed by the partition's number (element_at: 1-based).
            array = F.array(*[F.lit(numbers.get(p)).cast("long") for p in range(max(numbers) + 1)])
            value = F.element_at(array, F.col("partition") + 1)
            added = (
                value if added is None else F.when(F.col("topic") == topic, value).otherwise(added)
            )
        stamp = (F.col("offset") + added).alias(STAMP)
        name = f"cp_unparsed_{batch_id}"
        frame = (
            parsed.select(*columns, stamp).observe(name, count).where(good).select(*named, STAMP)
        )
        return name, frame

    def _dead_letters(self, parsed, batch_id: int, unparsed: int | None) -> int:
        """The batch's records that did not parse, read again (when the count taken during
        the write is not 0; None: not reported, read to be safe), written once."""
        if unparsed == 0:
            return 0
        if self._letters is not None:
            columns = [f"_cp_{c}" for c in DEAD_LETTER_FIELDS]
            letters = parsed.select(*self.batch.one_pass_columns()).where(BAD)
            _, dead = self._letters.write(
                letters.select(BAD, *columns),
                batch_id,
                self._stream,
                part="dead/",
                bad_column=BAD,
                dead_letter_columns=columns,
                parse_error=self.batch.parse_error,
                empty_value_error=EMPTY_VALUE,
            )
            return dead
        rows = self.batch.unparsed_letters(parsed, unparsed)
        if rows is None or rows.num_rows == 0:
            return 0
        conninfo = self.config.sink_config(self.batch.index).get("postgres") or {}
        return letter_table.write(conninfo, self.config.pipeline, batch_id, rows)
