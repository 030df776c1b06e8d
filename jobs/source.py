"""The source: Kafka records read by Spark's connector or our Python reader, and each value
parsed with the spec's schema (JSON, or Avro) beside the record's Kafka metadata. A value that
does not parse is kept, flagged (its dead letter is written with its batch): never dropped,
never the end of the query."""

from __future__ import annotations

import json
import logging

from .kafka import readers
from .runconfig import RunConfig
from .spec import PipelineSpec
from .spec.model import starting_timestamp_ms

log = logging.getLogger("jobs.pipeline")

CORRUPT = "_cp_corrupt"
DECODED = "_cp_decoded"  # set by the Avro reader schema for every record that decodes
PARSED = "_cp_record"
# The Kafka metadata a dead letter keeps of its record.
# What a dead letter keeps of its record; `reason`: why it did not parse, in words, where the
# parser says (the schema registry's decoder), else null (the source's parse_error applies).
DEAD_LETTER_FIELDS = ("topic", "partition", "offset", "timestamp", "value", "reason")
REASON = "reason"


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
            starting = readers.starting_offsets_json(starting, source_partitions(config))
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


def source_partitions(config: RunConfig) -> list[tuple[str, int]]:
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


def parsed_frame(raw, spec: PipelineSpec, registry: dict | None = None):
    """Kafka metadata plus the value parsed with the spec's schema, and a corrupt marker.
    `registry`: the source's schema registry's client arguments (RunConfig.registry)."""
    from pyspark.sql import functions as F

    from .spec.ddl import parse_schema, to_ddl

    metadata = ("topic", "partition", "offset", "timestamp", "value")
    if spec.source.schema_registry is not None:
        # The decoder's reason for a value that did not decode (a null value has its own).
        record = registry_record(raw.sparkSession, spec.source, registry)
        reason = F.when(F.col("value").isNotNull(), F.col(f"{PARSED}.{CORRUPT}"))
        return raw.select(*metadata, record).withColumn(REASON, reason)
    if spec.source.format == "avro":
        record = avro_record(spec.source)
    else:
        # to_ddl: the canonical form, which from_json's strict JVM parser accepts.
        schema = f"{to_ddl(parse_schema(spec.source.schema))}, `{CORRUPT}` STRING"
        record = F.from_json(
            F.col("value").cast("string"),
            schema,
            {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT},
        ).alias(PARSED)
    return raw.select(*metadata, F.lit(None).cast("string").alias(REASON), record)


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


def registry_record(spark, source, registry: dict | None):
    """The value decoded by the executors' JVM (controlplane.spark.ConfluentAvro): its writer
    schema found in the registry by the id in its Confluent header, read as the spec's reader
    schema (`avro_schema`, from the registry when the spec was saved) by Avro's resolution
    rules, as the PARSED column. A value that cannot be read (not framed, an unknown id, a
    writer schema the reader cannot read, a body that does not decode) gets CORRUPT set to
    the reason."""
    from pyspark.sql import functions as F
    from pyspark.sql.classic.column import Column

    if not registry:
        raise ValueError("source.schema_registry: the run configuration has no registry")
    from .registry import DEFAULT_WAIT_SECONDS

    config = json.dumps(
        {
            "registry": registry,
            "reader_schema": source.avro_schema,
            # How long a new id waits for a registry that does not answer (the connection's
            # wait_seconds): ids seen decode on meanwhile.
            "retry_seconds": registry.get("wait_seconds", DEFAULT_WAIT_SECONDS),
        }
    )
    decoder = spark._jvm.controlplane.spark.ConfluentAvro
    decoded = Column(decoder.column(F.col("value")._jc, config))
    names = [f["name"] for f in json.loads(source.avro_schema)["fields"]]
    return F.struct(
        *[decoded["record"][n].alias(n) for n in names],
        # A null value (a tombstone) decodes to nothing: a dead letter too.
        F.when(decoded.isNull(), F.lit("no value")).otherwise(decoded["error"]).alias(CORRUPT),
    ).alias(PARSED)


def parse_error(source) -> str:
    """What a dead letter's error says about a value that did not parse."""
    if source.schema_registry is not None:
        return (
            "value cannot be read with the schema registry: not in Confluent's wire format,"
            " a schema id the registry does not know, a writer schema the reader schema"
            f" (version {source.schema_registry.resolved_version} of"
            f" {source.schema_registry.subject}) cannot read, or a body that does not decode"
        )
    if source.format == "avro":
        framing = (
            " after Confluent's 5-byte header (magic byte 0, schema id)"
            if source.avro_framing == "confluent"
            else ""
        )
        return f"value does not decode as Avro{framing} with the spec's avro_schema"
    return f"value does not parse as JSON with schema: {source.schema}"


def unparsed():
    """Whether the record did not parse with the spec's schema (a column of parsed_frame's)."""
    from pyspark.sql import functions as F

    record = F.col(PARSED)
    return record.isNull() | record[CORRUPT].isNotNull()
