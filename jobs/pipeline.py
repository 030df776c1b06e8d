"""Turning a pipeline spec into a running Structured Streaming query.

Kafka records are parsed with the spec's schema; a record that does not parse is never
dropped and never kills the query: it becomes a dead letter, written in the same transaction
as the batch's good rows. The transform runs over a view named `source`; the result goes to
the Postgres sink exactly once (see jobs.sinks.postgres).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import failures
from .failures import DefinitionError
from .files import write_private
from .kafka import readers
from .sinks.jvm_writer import JvmWriter
from .sinks.kafka import PICKS_ROWS
from .sinks.postgres import ORDINAL, PART, Column, PostgresSink
from .spec import PipelineSpec, parse_spec
from .spec.model import starting_timestamp_ms
from .spec.validate import sink_target
from .storage import Storage, StorageSettings, join, storage_for

log = logging.getLogger("jobs.pipeline")

CORRUPT = "_cp_corrupt"
DECODED = "_cp_decoded"  # set by the Avro reader schema for every record that decodes
PARSED = "_cp_record"
BAD = "_cp_bad"
ORDER = "_cp_order"  # an upsert's position of each row in its batch
DEAD_LETTER_FIELDS = ("topic", "partition", "offset", "timestamp", "value")
EMPTY_VALUE = "empty value (null)"


@dataclass(frozen=True)
class RunConfig:
    """Everything a job needs, written by the control plane into the run directory (0600)."""

    pipeline: str
    spec: PipelineSpec
    kafka: dict[str, Any]  # kafka-python client arguments, secrets included
    postgres: dict[str, Any]  # psycopg.connect() arguments, password included
    checkpoint: str
    run_dir: str
    # Where to send heartbeats and progress: url, run_id, token, heartbeat_seconds.
    control_plane: dict[str, Any] | None = None
    # The input partitions of a spec that names none (source.min_partitions). None: the
    # application's parallelism (a dedicated driver's cores, each a task of every batch). A
    # shared application's members take 1, the topic's own partitions: there the many
    # queries are the parallelism, and splitting each small batch into one task per slot
    # multiplies its fixed cost (a task, a Postgres transaction and marker) by the slots.
    default_partitions: int | None = None
    # The sink's Kafka client arguments (a Kafka sink), secrets included.
    sink_kafka: dict[str, Any] | None = None
    # With several sinks: per sink, {"postgres": psycopg arguments} or {"kafka": client
    # arguments}, in the spec's order (empty: the one sink's, in postgres / sink_kafka).
    sink_configs: tuple[dict[str, Any], ...] = ()
    # Where the checkpoint lives and how to reach that store (jobs.storage.StorageSettings.
    # for_driver: keys included); None: a local path.
    storage: dict[str, Any] | None = None

    @property
    def store(self) -> Storage:
        """The store the checkpoint is on, for the driver's own reads and writes of it."""
        return storage_for(self.checkpoint, StorageSettings.from_driver_config(self.storage))

    def sink_config(self, index: int) -> dict[str, Any]:
        if self.sink_configs:
            return self.sink_configs[index]
        return {"postgres": self.postgres, "kafka": self.sink_kafka}

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        data = json.loads(Path(path).read_text())
        return cls(
            pipeline=data["pipeline"],
            spec=parse_spec(data["spec"]),
            kafka=data["kafka"],
            postgres=data["postgres"],
            checkpoint=data["checkpoint"],
            run_dir=data.get("run_dir") or str(Path(path).parent),
            control_plane=data.get("control_plane"),
            sink_kafka=data.get("sink_kafka"),
            sink_configs=tuple(data.get("sink_configs") or ()),
            storage=data.get("storage"),
        )

    def kafka_config_file(self) -> str:
        """The client config for the source, in a file only this user can read."""
        path = Path(self.run_dir) / "kafka-client.json"
        write_private(path, json.dumps(self.kafka))
        return str(path)


def register_sources(spark) -> None:
    from pyspark.errors import AnalysisException

    from .kafka.source import KafkaDataSource

    try:
        spark.dataSource.register(KafkaDataSource)
    except AnalysisException as exc:
        # A session made by newSession() shares its parent's registry of Python data
        # sources, and refuses to register one it already has: it is there to use.
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


def kafka_connector_loaded(spark) -> bool:
    """Whether this Spark application has Spark's Kafka connector (data source `kafka`)."""
    jvm = spark.sparkContext._jvm
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource(
            "kafka", spark._jsparkSession.sessionState().conf()
        )
    except Exception:  # py4j's Py4JJavaError: DATA_SOURCE_NOT_FOUND
        return False
    return True


def min_partitions(spark, config: RunConfig) -> int:
    """The input partitions a batch is split into at least (the topic's, when it has more)."""
    return (
        config.spec.source.min_partitions
        or config.default_partitions
        or spark.sparkContext.defaultParallelism
    )


def choose_reader(spark, config: RunConfig) -> readers.Pin:
    """The reader (and, for Spark's connector, the input partitions) this run uses: the
    checkpoint's when it has one, else the spec's or the default; then kept with it."""
    src = config.spec.source
    store = config.store
    pinned = readers.read_pin(config.checkpoint, store)
    pin = readers.decide(
        src.reader,
        min_partitions(spark, config),
        pinned,
        connector=kafka_connector_loaded(spark),
        replay_pending=readers.replay_pending(config.checkpoint, store),
    )
    if pin != pinned:
        readers.write_pin(config.checkpoint, pin, store)
    return pin


def source_frame(spark, config: RunConfig, pin: readers.Pin | None = None):
    """Raw Kafka rows: key, value, topic, partition, offset, timestamp."""
    src = config.spec.source
    pin = pin or choose_reader(spark, config)
    starting = src.starting_offsets
    since = starting_timestamp_ms(starting)
    log.info("reading %s with the %s reader", ",".join(src.topics), pin.reader)
    if pin.reader == readers.SPARK_KAFKA:
        spark.conf.set("spark.sql.redaction.options.regex", readers.OPTIONS_REDACTION_REGEX)
        if isinstance(starting, dict) and since is None:
            starting = readers.starting_offsets_json(starting, _partitions(config))
        options = readers.spark_kafka_options(
            config.kafka,
            topics=src.topics,
            starting=starting,
            starting_timestamp_ms=since,
            max_records_per_batch=src.max_records_per_batch,
            fail_on_data_loss=src.fail_on_data_loss,
            min_partitions=pin.min_partitions,
        )
        frame = spark.readStream.format("kafka").options(**options).load()
        return frame.select("key", "value", "topic", "partition", "offset", "timestamp")
    reader = (
        spark.readStream.format("cp_kafka")
        .option("topics", ",".join(src.topics))
        .option("config_file", config.kafka_config_file())
        .option("max_records_per_batch", str(src.max_records_per_batch))
        .option("fail_on_data_loss", str(src.fail_on_data_loss).lower())
        .option("min_partitions", str(min_partitions(spark, config)))
    )
    if since is not None:
        reader = reader.option("starting_timestamp", str(since))
    else:
        reader = reader.option(
            "starting_offsets", starting if isinstance(starting, str) else json.dumps(starting)
        )
    return reader.load()


def _partitions(config: RunConfig) -> list[tuple[str, int]]:
    """Every partition of the source's topics, from the broker's metadata."""
    from .kafka.source import metadata_consumer

    consumer = metadata_consumer(config.kafka)
    try:
        found = [
            (t, p)
            for t in config.spec.source.topics
            for p in consumer.partitions_for_topic(t) or ()
        ]
    finally:
        consumer.close()
    return found


def parsed_frame(raw, spec: PipelineSpec):
    """Kafka metadata plus the value parsed with the spec's schema, and a corrupt marker."""
    from pyspark.sql import functions as F

    from .spec.ddl import parse_schema, to_ddl

    if spec.source.format == "avro":
        return raw.select(
            "topic", "partition", "offset", "timestamp", "value", avro_record(spec.source)
        )
    # to_ddl: the canonical form, which from_json's strict JVM parser accepts.
    schema = f"{to_ddl(parse_schema(spec.source.schema))}, `{CORRUPT}` STRING"
    return raw.select(
        "topic",
        "partition",
        "offset",
        "timestamp",
        "value",
        F.from_json(
            F.col("value").cast("string"),
            schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        ).alias(PARSED),
    )


def avro_record(source):
    """The value decoded with the spec's Avro schema (Spark's from_avro, spark-avro), as the
    PARSED column: a record that does not decode (or lacks Confluent's header when the spec
    says values have it) gets CORRUPT set, like JSON that does not parse. In PERMISSIVE mode
    from_avro gives such a record as a row of nulls, which a record whose fields are all
    optional could also be: so it decodes with a reader schema that adds a field with a
    default (Avro's schema resolution), set for every record that decodes and only for those."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    from .spec.avro import CONFLUENT_HEADER_BYTES

    writer = json.loads(source.avro_schema)
    reader = {
        **writer,
        "fields": [*writer["fields"], {"name": DECODED, "type": "boolean", "default": True}],
    }
    value = F.col("value")
    if source.avro_framing == "confluent":
        framed = (F.length(value) > CONFLUENT_HEADER_BYTES) & (
            F.substring(value, 1, 1) == F.lit(b"\x00")
        )
        value = F.when(framed, F.expr(f"substring(value, {CONFLUENT_HEADER_BYTES + 1})"))
    decoded = from_avro(
        value,
        source.avro_schema,
        {"mode": "PERMISSIVE", "avroSchema": json.dumps(reader)},
    )
    names = [f["name"] for f in writer["fields"]]
    return F.struct(
        *[decoded[n].alias(n) for n in names],
        F.when(decoded[DECODED].isNull(), F.lit("not Avro")).alias(CORRUPT),
    ).alias(PARSED)


class BatchWriter:
    """The foreachBatch function: split good rows from dead letters, transform, write once."""

    # The session whose StreamingQueryManager runs the query (set by start_query).
    session = None

    def __init__(self, config: RunConfig, partitions: int = 2, index: int = 0):
        self.config = config
        # Which of the spec's sinks this writes (sinks after the first keep their markers
        # apart: a suffix of their stream id, a prefix of their transactional ids).
        self.index = index
        # Upserts written by the JVM writer go by key into this many partitions, each its own
        # transaction and marker: the input partitions kept with the checkpoint (readers.Pin),
        # so a replayed batch puts every key where it went the first time.
        self.partitions = partitions
        spec = config.spec
        self.sink = self._sink()
        self.tables_ready = False
        self.jvm = None  # a JvmWriter, when the executors' JVM can write (set with the tables)
        self._one_pass = None  # the one-pass frame's columns, built once
        self.unparsed_before = False  # whether the last batch had records that did not parse
        self._observed = None  # the observed pass's columns, built once
        self._plan = None  # what the observed pass's plan is, learnt from the first batch
        self.parse_error = parse_error(spec.source)
        from .spec.ddl import parse_schema

        # The columns of the parsed records, and the transform run over each batch. For a
        # stateful pipeline the transform runs over the stream before the batch (see
        # stateful_frame): there the columns are its output's, and there is none left here.
        self.columns = [f.name for f in parse_schema(spec.source.schema).fields]
        self.transform = None if spec.stateful else spec.transform

    def _sink(self):
        sink = self.config.spec.all_sinks()[self.index]
        return PostgresSink(
            self.config.sink_config(self.index)["postgres"],
            pipeline=self.config.pipeline,
            table=sink.table,
            mode=sink.mode,
            key=sink.key,
        )

    def skip(self, parsed, batch_id: int, done: str) -> None:
        """A replayed batch the sink has: nothing is written. A stateful pipeline's batch still
        runs, its output dropped: its state store versions must be committed (Spark checks
        that every partition of every stateful operator committed the batch)."""
        log.info("batch %s was %s before (a replay): skipped", batch_id, done)
        if self.config.spec.stateful:
            parsed.write.format("noop").mode("overwrite").save()

    def one_pass_columns(self) -> list:
        """A flag, the raw record only where it did not parse (the dead letter), and the
        parsed columns: one frame for both outputs. Built once (each column is a few py4j
        calls) and applied to every batch."""
        if self._one_pass is None:
            from pyspark.sql import functions as F

            bad = _unparsed()
            self._one_pass = [
                bad.alias(BAD),
                *[F.when(bad, F.col(c)).alias(f"_cp_{c}") for c in DEAD_LETTER_FIELDS],
                *self._parsed_columns(),
            ]
        return self._one_pass

    def _parsed_columns(self) -> list:
        from pyspark.sql import functions as F

        return [F.col(PARSED)[c].alias(c) for c in self.columns]

    def __call__(self, parsed, batch_id: int) -> None:
        if not self.sink.stream_id:
            self.sink.stream_id = stream_id(
                self.config.checkpoint, self.config.store
            ) + marker_scope(self.config.spec, self.index)
        transform = self.transform
        if not self.tables_ready:
            _, out = self.output(parsed, batch_id)
            self.sink.ensure_tables(
                [Column(f.name, f.dataType.simpleString()) for f in out.schema if f.name != BAD]
            )
            self.sink.drop_stages()  # left by batches that died before committing
            self.jvm = JvmWriter.create(parsed.sparkSession, self.sink)
            self.tables_ready = True
        if self.sink.committed(batch_id):
            self.skip(parsed, batch_id, "committed")
            return
        # With the JVM writer: the records that parsed, through the transform if any, in one
        # pass, unless the last batch had records that did not: those go on with the paths
        # that write dead letters from the same read of Kafka (one pass without a transform,
        # else a cached batch), rather than read each such batch twice.
        append, done = self.sink.mode == "append", None
        if self.jvm is not None and not self.unparsed_before:
            done = self._observed_pass(parsed, batch_id)
        batch = None if done else parsed.select(*self.one_pass_columns())
        # (Never a stateful batch: its output goes through the stage, whichever path.)
        if done is None and append and transform is None and not self.config.spec.stateful:
            done = self._single_pass(batch, batch_id)
        rows, dead, how = done or self._cached(batch, batch_id)
        self.unparsed_before = dead > 0
        log.info("batch %s: %s rows (%s), %s dead letters", batch_id, rows, how, dead)

    def output(self, parsed, batch_id: int):
        """(name, frame): what the observed pass writes, from the parsed batch. Without a
        transform: the parsed columns and the flag BAD, name None (the JVM writer leaves out
        and counts the rows flagged). With one: the transform over the records that parsed,
        the count of those that did not observed as `name` while it is computed
        (Dataset.observe).

        Each DataFrame step is analysed at once, at a few milliseconds a step, and a batch of
        200 rows takes ~150 ms in all: so as few steps as can be, their columns built once.
        A stateful pipeline's batch (its transform already applied: stateful_frame) is
        written through the stage: as with a transform, the rows that parsed, BAD counted."""
        columns, count, good, named = self._observed_parts()
        stateful = self.config.spec.stateful  # staged: the rows that parsed, BAD counted
        if not self.transform and not stateful:
            return None, parsed.select(*columns)
        name = f"cp_unparsed_{batch_id}"
        out = parsed.select(*columns).observe(name, count).where(good).select(*named)
        if not self.transform:
            return name, out
        out.createOrReplaceTempView("source")
        return name, parsed.sparkSession.sql(self.transform.sql)

    def _observed_parts(self) -> tuple:
        """(columns with the flag BAD, the count of BAD rows, the good-row condition, the
        parsed columns by name): the observed pass's pieces, built once."""
        from pyspark.sql import functions as F

        if self._observed is None:
            self._observed = (
                [_unparsed().alias(BAD), *self._parsed_columns()],
                F.count(F.when(F.col(BAD), 1)).alias("n"),
                ~F.col(BAD),
                [F.col(f"`{c}`") for c in self.columns],
            )
        return self._observed

    def _single_pass(self, batch, batch_id: int) -> tuple[int, int, str]:
        """No transform, append: each task writes its partition's rows and dead letters with
        its marker; Kafka is read once and nothing is cached."""
        if self.jvm is not None:
            done = self.jvm.write(
                for_jvm(batch, self.columns),
                batch_id,
                self.columns,
                dead_letter_columns=[f"_cp_{c}" for c in DEAD_LETTER_FIELDS],
                bad_column=BAD,
                parse_error=self.parse_error,
                empty_value_error=EMPTY_VALUE,
            )
            if done is not None:
                self.sink.finish_batch(batch_id, done[0])
                return done[0], done[1], "direct, one pass with dead letters, JVM"
        written = (
            for_copy(batch, self.columns)
            .mapInArrow(
                functools.partial(
                    _write_partition_and_dead_letters,
                    functools.partial(self.sink.write_part, batch_id),
                    self.columns,
                    self.parse_error,
                ),
                "rows LONG, dead LONG",
            )
            .collect()
        )
        rows = sum(r.rows for r in written)
        self.sink.finish_batch(batch_id, rows)
        return rows, sum(r.dead for r in written), "direct, one pass with dead letters"

    def _dead_letters(self, batch):
        """The batch's records that did not parse, as dead-letter rows."""
        from pyspark.sql import functions as F

        return batch.where(F.col(BAD)).select(
            *[F.col(f"_cp_{c}").alias(c) for c in DEAD_LETTER_FIELDS],
            F.when(F.col("_cp_value").isNull(), F.lit(EMPTY_VALUE))
            .otherwise(F.lit(self.parse_error))
            .alias("error"),
        )

    def _observed_pass(self, parsed, batch_id: int) -> tuple[int, int, str] | None:
        """The JVM writer, a transform without a shuffle (or none): the records that parsed
        (transformed, if asked) are written in one pass, each partition with its marker (an
        upsert by key: see below), while those that did not are counted on the way. Nothing
        is cached and no dead-letter columns are carried; only a batch that had such records
        reads its Kafka offsets a second time, for its dead letters. A transform with a
        shuffle goes through the batch's stage (_staged_by_jvm). None when a column has no
        encoding for the JVM writer: nothing was written then."""
        from pyspark.sql import functions as F

        name, out = self.output(parsed, batch_id)
        if self._plan is None:
            # The same query every batch: whether it shuffles and its columns are learnt
            # once (each costs a round trip to the JVM and an analysis).
            self._plan = {
                # A stateful pipeline's batch is cached (StatefulBatches), which hides the
                # plan's shuffles: its output always goes through the stage.
                "shuffles": self.config.spec.stateful or shuffles(out),
                "columns": [c for c in out.columns if c != BAD],
                "nested": _nested(out),
            }
        if self._plan["shuffles"]:
            return self._staged_by_jvm(parsed, batch_id, name, out)
        if self.sink.mode == "upsert":
            # Every row of a key in one partition (hashed by key); within it, the last record
            # per key (by its position in the batch: Kafka order within a Kafka partition)
            # wins. The order is taken before the shuffle, from the batch's fixed input
            # partitions, so a replay orders the same way.
            out = out.withColumn(ORDER, F.monotonically_increasing_id()).repartition(
                self.partitions, *[F.col(f"`{k}`") for k in self.sink.key]
            )
        frame = for_jvm(out) if self._plan["nested"] else out
        if "schema" not in self._plan:
            self._plan["schema"] = frame.schema
        done = self.jvm.write(
            frame,
            batch_id,
            self._plan["columns"],
            bad_column=None if name else BAD,
            upsert_order=ORDER if self.sink.mode == "upsert" else None,
            schema=self._plan["schema"],
        )
        if done is None:
            return None
        dead_rows = self._unparsed_letters(parsed, observed_count(frame, name) if name else done[1])
        self.sink.finish_batch(batch_id, done[0], dead_letters=dead_rows)
        return _written(done[0], dead_rows, "direct, one pass, JVM")

    def _unparsed_letters(self, parsed, unparsed: int | None):
        """The batch's dead letters, read again from Kafka, when `unparsed` (the count taken
        during the write) is not 0; None (not reported) reads them too, to be safe."""
        if unparsed == 0:
            return None
        return self._dead_letters(parsed.select(*self.one_pass_columns())).toArrow()

    def _staged_by_jvm(self, parsed, batch_id: int, name, out) -> tuple[int, int, str] | None:
        """A transform with a shuffle: its partitions are not fixed pieces of the batch, so
        each task fills its slice of the batch's stage (its partition and each row's position
        beside the rows) and the driver moves the stage into the target with the batch's
        marker, in one transaction. One pass, no cache; unparsed records as above."""
        from pyspark.sql import functions as F

        frame = out.select(
            "*", F.spark_partition_id().alias(PART), F.monotonically_increasing_id().alias(ORDINAL)
        )
        if self._plan["nested"]:
            frame = for_jvm(frame)
        if "stage_schema" not in self._plan:
            self._plan["stage_schema"] = frame.schema
        self.sink.prepare_stage(batch_id)
        done = self.jvm.write(
            frame,
            batch_id,
            self._plan["columns"],
            stage=self.sink.stage_name(batch_id),
            schema=self._plan["stage_schema"],
        )
        if done is None:
            return None
        dead_rows = self._unparsed_letters(parsed, observed_count(frame, name))
        self.sink.commit_stage(batch_id, dead_letters=dead_rows)
        return _written(done[0], dead_rows, "staged, one pass, JVM")

    def _cached(self, batch, batch_id: int) -> tuple[int, int, str]:
        """A transform or upsert: the batch is cached, so the transform's output and the dead
        letters come from one read of Kafka."""
        from pyspark.sql import functions as F

        batch = batch.persist()
        try:
            dead = self._dead_letters(batch)
            good = batch.where(~F.col(BAD)).select(*[F.col(f"`{c}`") for c in self.columns])
            good.createOrReplaceTempView("source")
            transform = self.transform
            out = batch.sparkSession.sql(transform.sql) if transform else good
            direct = (
                self.sink.mode == "append" and not self.config.spec.stateful and not shuffles(out)
            )
            done = (
                self.jvm.write(for_jvm(out), batch_id, out.columns) if direct and self.jvm else None
            )
            if done is not None:
                rows, how = done[0], "direct, cached, JVM"
            else:
                rows, how = self._write_from_python(out, batch_id, direct)
            dead_rows = dead.toArrow()
            if direct:
                self.sink.finish_batch(batch_id, rows, dead_letters=dead_rows)
            else:
                self.sink.commit_stage(batch_id, dead_letters=dead_rows)
            return rows, dead_rows.num_rows, how
        finally:
            batch.unpersist()

    def _write_from_python(self, out, batch_id: int, direct: bool) -> tuple[int, str]:
        """Every task writes its partition from a Python worker: into the target with its
        marker (direct), or into the batch's stage."""
        if direct:
            task, write = _write_partition_directly, self.sink.write_part
        else:
            self.sink.prepare_stage(batch_id)
            task, write = _write_partition, self.sink.write_stage_part
        written = (
            for_copy(out)
            .mapInArrow(functools.partial(task, functools.partial(write, batch_id)), "rows LONG")
            .collect()
        )
        return sum(r.rows for r in written), "direct" if direct else "staged"


class KafkaBatchWriter(BatchWriter):
    """The foreachBatch function of a Kafka sink (jobs.sinks.kafka): every task writes its
    partition's records in a Kafka transaction with its marker. Without a transform, a
    partition's dead letters go in the same transaction; with one, the records that did not
    parse are counted while the transform runs and, when there are some, read again and
    written to the dead-letter topic, partition by partition with markers of their own."""

    first_batch: dict | None = None

    def _once(self) -> dict:
        """The first batch's extra settings (the naming-scheme check), then none."""
        extra, self.first_batch = self.first_batch or {}, None
        return extra

    def _sink(self):
        return self.config.spec.all_sinks()[self.index]

    def __call__(self, parsed, batch_id: int) -> None:
        from .sinks import kafka

        if not self.tables_ready:
            sink = self.sink
            client = self.config.sink_config(self.index)["kafka"] or {}
            kafka.check_topics(client, [sink.topic, sink.dead_letter_topic])
            self.stream = stream_id(self.config.checkpoint, self.config.store) + marker_scope(
                self.config.spec, self.index
            )
            # The first batch of a run may be a replay: its parts are checked against the
            # other naming scheme (KafkaTxWriter.checkScheme).
            self.first_batch = {
                "check_scheme": True,
                "source_parts": [f"{t}-{p}" for t, p in _partitions(self.config)],
            }
            self.kafka = kafka.KafkaWriter(
                parsed.sparkSession,
                pipeline=self.config.pipeline,
                sink=sink,
                client=client,
            )
            self.records = kafka.RecordColumns(sink)
            self.tables_ready = True
        dead_columns = [f"_cp_{c}" for c in DEAD_LETTER_FIELDS]
        # Rows flagged BAD go to the dead-letter topic, from these columns, with this error.
        letters = {
            "bad_column": BAD,
            "dead_letter_columns": dead_columns,
            "parse_error": self.parse_error,
            "empty_value_error": EMPTY_VALUE,
        }
        if self.transform is None:
            batch = parsed.select(*self.one_pass_columns())
            frame = batch.select(BAD, *dead_columns, *self.records.columns(batch, self.columns))
            rows, dead = self.kafka.write(frame, batch_id, self.stream, **letters, **self._once())
            log.info("batch %s: %s records, %s dead letters (Kafka)", batch_id, rows, dead)
            return
        name, out = self.output(parsed, batch_id)
        if self._plan is None:
            kafka.check_plan(out)
            self._plan = {"columns": list(out.columns)}
        frame = out.select(*self.records.columns(out, self._plan["columns"]))
        rows, _ = self.kafka.write(frame, batch_id, self.stream, **self._once())
        unparsed = observed_count(frame, name)
        dead = 0
        if unparsed != 0:  # None (not reported): read them to be safe
            unparsed_rows = parsed.select(*self.one_pass_columns()).where(BAD)
            _, dead = self.kafka.write(
                unparsed_rows.select(BAD, *dead_columns),
                batch_id,
                self.stream,
                part="dead/",
                **letters,
            )
        log.info("batch %s: %s records, %s dead letters (Kafka)", batch_id, rows, dead)


class FilesBatchWriter(BatchWriter):
    """The foreachBatch function of a files sink (jobs.sinks.files): the records that parsed,
    through the transform if any, are staged in one pass while those that did not are
    counted; a batch that had some reads them again for its dead letters; then the batch's
    marker. A thread of the driver rolls staged rows into finished files."""

    def _sink(self):
        return self.config.spec.all_sinks()[self.index]

    files = None  # the sink's directory (jobs.sinks.files.FileSink), once opened

    def open(self, spark, query_id: str) -> None:
        """The sink's directory and its rolling thread (which first finishes what a killed
        driver left): started with the query, so rolling goes on while no batch comes."""
        from .sinks import files

        if self.files is not None:
            return
        root = self.config.sink_config(self.index)["files"]["root"]
        self.files = files.FileSink(
            spark, files.base_uri(root, self.sink.path), self.sink, query_id
        )
        alive = functools.partial(query_active, self.session or spark, query_id)
        self.compactor = files.Compactor(self.files, alive, self.config.pipeline).start()

    def __call__(self, parsed, batch_id: int) -> None:
        from pyspark.sql import Observation

        from .sinks import files

        if self.files is None:
            self.open(parsed.sparkSession, stream_id(self.config.checkpoint, self.config.store))
        self.compactor.check()
        if self.files.committed(batch_id):
            self.skip(parsed, batch_id, "staged")
            return
        columns, count, good, named = self._observed_parts()
        observation = Observation(f"cp_unparsed_{batch_id}")
        out = parsed.select(*columns).observe(observation, count).where(good).select(*named)
        transform = self.transform
        if transform is not None:
            out.createOrReplaceTempView("source")
            out = parsed.sparkSession.sql(transform.sql)
        if self._plan is None:
            files.check_columns(self.sink, out.columns)
            self._plan = {"schema": files.group_key(self.sink, out.schema.json())}
        started = time.monotonic()
        self.files.stage(out, batch_id)
        staged = time.monotonic()
        unparsed = files.observed(observation)
        if unparsed != 0:  # None (not reported): read them to be safe
            letters = self._dead_letters(parsed.select(*self.one_pass_columns()))
            counted = Observation(f"cp_dead_{batch_id}")
            self.files.write_dead_letters(letters.observe(counted, _count_all()), batch_id)
            unparsed = files.observed(counted)
        self.files.commit(batch_id, schema=self._plan["schema"], dead_letters=unparsed)
        self.compactor.poke()
        log.info(
            "batch %s: staged (files) in %.2f s, committed in %.2f s, %s dead letters",
            batch_id,
            staged - started,
            time.monotonic() - staged,
            unparsed,
        )


def _count_all():
    from pyspark.sql import functions as F

    return F.count(F.lit(1)).alias("n")


def _store_names(config: RunConfig) -> dict[str, str]:
    roots = [
        (config.sink_config(i).get("files") or {}).get("root")
        for i in range(len(config.spec.all_sinks()))
    ]
    s3 = (config.storage or {}).get("s3") or {}
    return failures.store_names(
        config.checkpoint, [r for r in roots if isinstance(r, str)], s3.get("endpoint")
    )


def query_active(spark, query_id: str) -> bool:
    """Whether the streaming query with this id runs in the application (one lookup, however
    many queries a shared application runs)."""
    return spark._jsparkSession.streams().get(query_id) is not None


def parse_error(source) -> str:
    """What a dead letter's error says about a value that did not parse."""
    if source.format == "avro":
        framing = (
            " after Confluent's 5-byte header (magic byte 0, schema id)"
            if source.avro_framing == "confluent"
            else ""
        )
        return f"value does not decode as Avro{framing} with the spec's avro_schema"
    return f"value does not parse as JSON with schema: {source.schema}"


def stream_id(checkpoint: str, store: Storage | None = None) -> str:
    """The query id Spark keeps in the checkpoint: the same across restarts of one
    checkpoint, new for a new one. Commit markers are scoped by it."""
    store = store or storage_for(checkpoint)
    return json.loads(store.read_text(join(checkpoint, "metadata")))["id"]


# Physical operators that move rows between partitions or pick some of them (joins,
# aggregations, sorts, limits, samples): partition contents are then not a fixed function of
# the batch's input partitions.
_UNSTABLE_OPERATORS = re.compile(rf"Exchange|{PICKS_ROWS}")


def _written(rows: int, dead_rows, how: str) -> tuple[int, int, str]:
    """(rows, dead letters, how) of a one-pass write, saying when dead letters were read
    again."""
    if dead_rows is None:
        return rows, 0, how
    return rows, dead_rows.num_rows, f"{how}, unparsed records read again"


def _unparsed():
    """Whether the record did not parse with the spec's schema (a column of parsed_frame's)."""
    from pyspark.sql import functions as F

    record = F.col(PARSED)
    return record.isNull() | record[CORRUPT].isNotNull()


def observed_count(frame, name: str) -> int | None:
    """The first value of the metrics observed as `name` (Dataset.observe) while `frame`'s
    last action ran from its own query execution; None if they were not reported."""
    metrics = frame._jdf.queryExecution().observedMetrics()
    found = metrics.get(name)
    if not found.isDefined():
        return None
    row = found.get()
    return None if row.isNullAt(0) else int(row.getLong(0))


def shuffles(frame) -> bool:
    """Whether a partition of the frame may hold other rows when the batch is replayed.
    Without a shuffle, each partition is a fixed piece of the batch's Kafka offset ranges."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    return _UNSTABLE_OPERATORS.search(plan) is not None


def _write_partition(write, batches):
    """Runs in an executor: hand this Spark partition's rows to the sink, as one table."""
    import pyarrow as pa
    from pyspark import TaskContext

    part = TaskContext.get().partitionId()
    collected = list(batches)
    rows = write(part, pa.Table.from_batches(collected)) if collected else 0
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _write_partition_directly(write, batches):
    """Runs in an executor: stream this Spark partition's rows to the sink (direct path)."""
    import pyarrow as pa
    from pyspark import TaskContext

    rows, _ = write(TaskContext.get().partitionId(), ((b, None) for b in batches))
    yield pa.RecordBatch.from_pydict({"rows": [rows]})


def _write_partition_and_dead_letters(write, columns, parse_error, batches):
    """Runs in an executor: stream this Spark partition's good rows and dead letters to the
    sink, in one transaction (the single-pass path)."""
    import pyarrow as pa
    from pyspark import TaskContext

    rows, dead = write(
        TaskContext.get().partitionId(),
        (_split_dead_letters(b, columns, parse_error) for b in batches),
    )
    yield pa.RecordBatch.from_pydict({"rows": [rows], "dead": [dead]})


def _split_dead_letters(batch, columns, parse_error):
    """A record batch of the one-pass frame -> (good rows, dead letters)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    bad = batch.column(BAD)
    good = batch.filter(pc.invert(bad)).select(columns)
    if not pc.any(bad).as_py():
        return good, None
    letters = pa.Table.from_batches([batch.filter(bad)]).select(
        [f"_cp_{c}" for c in DEAD_LETTER_FIELDS]
    )
    letters = letters.rename_columns(list(DEAD_LETTER_FIELDS))
    error = pc.if_else(pc.is_null(letters.column("value")), EMPTY_VALUE, parse_error)
    return good, letters.append_column("error", error)


def for_copy(frame, only=None, *, binary_as_hex: bool = True):
    """The frame as COPY wants it: nested values become JSON text, binary becomes bytea hex
    (in the given columns, or all of them). The JVM writer sends binary as it is."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StructType

    columns = []
    for field in frame.schema.fields:
        column = F.col(f"`{field.name}`")
        if only is not None and field.name not in only:
            pass
        elif isinstance(field.dataType, ArrayType | MapType | StructType):
            column = F.to_json(column)
        elif binary_as_hex and isinstance(field.dataType, BinaryType):
            column = F.concat(F.lit("\\x"), F.hex(column))
        columns.append(column.alias(field.name))
    return frame.select(*columns)


def _nested(frame) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    return any(isinstance(f.dataType, ArrayType | MapType | StructType) for f in frame.schema)


def for_jvm(frame, only=None):
    """The frame as the JVM writer wants it: nested values as JSON text, the rest as is."""
    return for_copy(frame, only, binary_as_hex=False)


# Spark checks each Arrow batch's size in bytes after every row it adds when the limit is
# below Int.MaxValue (BatchedPythonArrowInput): ~8% of the executors' JVM time in the Python
# writer's hop (measured with JFR). Batches stay bounded by maxRecordsPerBatch (10,000 rows).
ARROW_SESSION_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


def marker_scope(spec: PipelineSpec, index: int) -> str:
    """What keeps a sink's markers apart from the others' in a pipeline with several sinks:
    a digest of what the sink writes (its kind, connection and table or topic), so that
    reordering the list, or removing a sink, gives no sink another's markers. None in the
    one-sink form."""
    if not spec.sinks:
        return ""
    sink = spec.sinks[index]
    target = sink_target(sink)
    digest = hashlib.sha1(f"{sink.kind}:{sink.connection}:{target}".encode()).hexdigest()  # noqa: S324 - a name
    return f"/s{digest[:10]}"


class SinksWriter:
    """The foreachBatch function of a pipeline with several sinks: each sink writes the
    batch in turn, exactly once with markers of its own; the first fails the batch (and the
    run) if it fails, the others are not tried, and a replayed batch is skipped by the sinks
    that committed it. Each reads the batch's records from Kafka (not cached: the writers'
    markers follow the Kafka offset ranges, which a cache would hide; a stateful pipeline's
    batch is cached, by StatefulBatches, and staged). The dead letters go with the first
    sink only: the others get the records that parsed."""

    def __init__(self, config: RunConfig, partitions: int = 2):
        self.writers = [
            writer_class(sink)(config, partitions=partitions, index=i)
            for i, sink in enumerate(config.spec.all_sinks())
        ]

    def __call__(self, parsed, batch_id: int) -> None:
        self.writers[0](parsed, batch_id)
        parsed_only = parsed.where(~_unparsed())
        for writer in self.writers[1:]:
            writer(parsed_only, batch_id)


class StatefulBatches:
    """The foreachBatch function of a stateful pipeline: the batch is cached while its
    writers write it, so that its stateful operators run once per batch whatever the
    writers do (several sinks, dead letters read again): each run of them commits the
    batch's state version again and adds to its metrics (rows dropped by the watermark...)."""

    def __init__(self, inner):
        self.inner = inner
        self.writers = getattr(inner, "writers", [inner])

    def __call__(self, batch, batch_id: int) -> None:
        batch = batch.persist()
        try:
            self.inner(batch, batch_id)
        finally:
            batch.unpersist()


def writer_class(sink) -> type[BatchWriter]:
    return {"kafka": KafkaBatchWriter, "files": FilesBatchWriter}.get(sink.kind, BatchWriter)


def batch_writer(config: RunConfig, partitions: int):
    """The foreachBatch function for the spec's sink or sinks."""
    if len(config.spec.all_sinks()) > 1:
        writer = SinksWriter(config, partitions)
    else:
        writer = writer_class(config.spec.sink)(config, partitions=partitions)
    return StatefulBatches(writer) if config.spec.stateful else writer


# Where a stateful pipeline keeps its state (the spec's state_store; None: RocksDB).
STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}
STATE_STORE_CONF = "spark.sql.streaming.stateStore.providerClass"
# RocksDB uploads each batch's changes (a changelog) instead of a snapshot of its files at
# every commit; snapshots are made in the background.
CHANGELOG_CONF = "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled"


class StateStoreError(DefinitionError, RuntimeError):
    """A definition error: the spec asks for another state store than the checkpoint's."""


def state_store(spec: PipelineSpec) -> str:
    return spec.state_store or "rocksdb"


def use_state_store(spark, config: RunConfig) -> None:
    """Set the session's state store for a stateful pipeline. Spark keeps the provider a
    checkpoint was started with in its offset log and goes on with it whatever the session
    says: a spec asking for another one is refused (a definition error) rather than ignored;
    the state can only move to another store with a new checkpoint (a reset)."""
    from .checkpoints import has_state, planned_conf

    wanted = STATE_STORE_PROVIDERS[state_store(config.spec)]
    # (Spark records a provider for stateless queries too: only state is kept in one.)
    store = config.store
    kept = (
        planned_conf(config.checkpoint, store).get(STATE_STORE_CONF)
        if has_state(config.checkpoint, store)
        else None
    )
    if kept and kept != wanted:
        names = {v: k for k, v in STATE_STORE_PROVIDERS.items()}
        raise StateStoreError(
            f"state_store: the checkpoint's state is kept in {names.get(kept, kept)!r} and the "
            f"spec asks for {state_store(config.spec)!r}; a checkpoint keeps the state store "
            "it started with: set state_store back, or reset the pipeline's offsets to start "
            "its state anew in the new store"
        )
    spark.conf.set(STATE_STORE_CONF, wanted)
    spark.conf.set(CHANGELOG_CONF, "true")


def stateful_frame(spark, parsed, spec: PipelineSpec):
    """(frame, output columns): a stateful pipeline's watermark, deduplication and transform
    over the stream, so that Spark keeps their state across batches; what foreachBatch gets
    looks like parsed_frame's (the sinks' paths take it as they are): the transform's output
    rows as the parsed record, and beside them, from the same batch, the records that did
    not parse with their Kafka metadata (the dead letters), as the union of the two. The
    records that parsed go into the stateful part only; each batch's output is what its
    stateful operators emit (finished windows in append mode, changed groups in update)."""
    from pyspark.sql import functions as F

    from .spec.ddl import parse_schema

    columns = [f.name for f in parse_schema(spec.source.schema).fields]
    good = parsed.where(~_unparsed()).select(*[F.col(PARSED)[c].alias(c) for c in columns])
    watermark = spec.source.watermark
    if watermark is not None:
        delay = round(watermark.delay_seconds * 1000)
        good = good.withWatermark(watermark.column, f"{delay} milliseconds")
    if spec.source.deduplicate is not None:
        good = good.dropDuplicatesWithinWatermark(list(spec.source.deduplicate.key))
    out = good
    if spec.transform is not None:
        good.createOrReplaceTempView("source")
        out = spark.sql(spec.transform.sql)
    names = list(out.columns)
    record = F.struct(
        *[F.col(f"`{c}`") for c in names], F.lit(None).cast("string").alias(CORRUPT)
    ).alias(PARSED)
    types = {f.name: f.dataType for f in parsed.schema.fields}
    rows = out.select(*[F.lit(None).cast(types[c]).alias(c) for c in DEAD_LETTER_FIELDS], record)
    record_type = rows.schema[PARSED].dataType
    letters = parsed.where(_unparsed()).select(
        *DEAD_LETTER_FIELDS, F.lit(None).cast(record_type).alias(PARSED)
    )
    return rows.unionByName(letters), names


def source_reads(spec: PipelineSpec) -> int:
    """How many times each batch reads its Kafka offsets: twice for a stateful pipeline (the
    records into the state, the unparsed ones as dead letters: the two halves of
    stateful_frame's union), which Spark counts twice in the batch's input rows."""
    return 2 if spec.stateful else 1


def start_query(spark, config: RunConfig, *, available_now: bool = False):
    # Which of its stores is which, for the words of a failure of one (jobs.failures): the
    # reads and writes from here on may find HDFS or S3 down.
    failures.name_stores(config.pipeline, _store_names(config))
    for key, value in ARROW_SESSION_CONF.items():
        spark.conf.set(key, value)
    register_sources(spark)
    pin = choose_reader(spark, config)
    # Shuffles (a transform's GROUP BY) into as many partitions as the batch's input, not
    # Spark's 200: a small batch then runs a few tasks, not 200. Spark keeps the value a
    # checkpoint was started with in its offset log, so this changes only new checkpoints.
    # A stateful pipeline's state is kept in that many partitions for good: at least the
    # application's cores, so that a member of a shared application (1 input partition by
    # default) does not keep all its state in one store.
    shuffle = pin.min_partitions
    if config.spec.stateful:
        shuffle = max(shuffle, spark.sparkContext.defaultParallelism)
    spark.conf.set("spark.sql.shuffle.partitions", str(shuffle))
    raw = source_frame(spark, config, pin)
    frame, columns = parsed_frame(raw, config.spec), None
    if config.spec.stateful:
        use_state_store(spark, config)
        frame, columns = stateful_frame(spark, frame, config.spec)
    batches = batch_writer(config, pin.min_partitions)
    for each in getattr(batches, "writers", [batches]):
        each.session = spark  # the session the query runs in (foreachBatch gets a clone)
        if columns is not None:
            each.columns = columns  # the stateful transform's output (stateful_frame)
    writer = (
        frame.writeStream.queryName(config.pipeline)
        # Spark passes on only the text of what the function raises: its exception is kept,
        # with its type, for the failure's classification (jobs.failures).
        .foreachBatch(failures.recording(config.pipeline, batches))
        .option("checkpointLocation", config.checkpoint)
    )
    if config.spec.output_mode is not None:
        writer = writer.outputMode(config.spec.output_mode)
    if available_now:
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{config.spec.trigger.interval_seconds} seconds")
    query = writer.start()
    for each in getattr(batches, "writers", [batches]):
        if isinstance(each, FilesBatchWriter):
            each.open(spark, query.id)
    return query
