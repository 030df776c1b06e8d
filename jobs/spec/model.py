"""Pipeline spec v1: the typed form of a pipeline definition.

Shared by the control plane (which validates what operators submit) and by the Spark job
(which runs it). Plain Python: no Django, no Celery, no PySpark at import time.

Restart-policy defaults follow Apache Flink 1.20 (`restart-strategy.*`): fixed-delay 1 attempt,
1 s; failure-rate 1 failure per 60 s, 1 s delay; exponential-delay 1 s initial, 60 s max,
x1.5, jitter 0.1, reset after 1 h of healthy running, unlimited attempts. As in Flink with
checkpointing enabled (which a streaming query always is here), a spec without a restart
policy gets exponential-delay.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Literal

SPEC_VERSION = 1

# "earliest", "latest", {"topic": {"partition": offset}}, or {"timestamp": "ISO 8601, UTC"}.
StartingOffsets = Literal["earliest", "latest"] | dict[str, dict[str, int]] | dict[str, str]


@dataclass(frozen=True)
class Watermark:
    """Event time: how late a record may come, by a timestamp column of the source schema.
    Stateful operators (windows, deduplication) finish a group and drop its state once the
    watermark (the latest event time seen, minus the delay) has passed it; a record older
    than the watermark is dropped and counted (numRowsDroppedByWatermark)."""

    column: str
    delay_seconds: float


@dataclass(frozen=True)
class Deduplicate:
    """Records with the same key are passed on once (Spark's dropDuplicatesWithinWatermark):
    a key is remembered until the watermark passes its first record's event time."""

    key: tuple[str, ...]


@dataclass(frozen=True)
class SchemaRegistry:
    """Where an Avro source's schemas are: a schema-registry connection and the subject of the
    values (jobs.registry.subjects). The reader schema is that subject's `version` ("latest":
    the latest when the spec is saved), copied into the source's `avro_schema` by the control
    plane on save; every record's writer schema is found by the id in its header."""

    connection: str
    # How the subject is named: "topic" (<topic>-value, of the first topic), "record" (the
    # record's full name), "topic-record" (<topic>-<record's full name>).
    strategy: Literal["topic", "record", "topic-record"] = "topic"
    record: str | None = None  # the record's full name, for the record strategies
    version: int | Literal["latest"] = "latest"
    # Set by the control plane on save: the subject and version the reader schema is, and the
    # schema's id in the registry.
    subject: str | None = None
    resolved_version: int | None = None
    schema_id: int | None = None


@dataclass(frozen=True)
class KafkaSource:
    """Records from Kafka topics, parsed from JSON with a Spark DDL schema."""

    connection: str
    topics: tuple[str, ...]
    # Spark DDL of the values' columns; for Avro, derived from `avro_schema` (jobs.spec.avro).
    schema: str
    format: Literal["json", "avro"] = "json"
    # Avro: the writers' record schema (canonical JSON text), and whether each value starts
    # with Confluent's header (magic byte 0 and a 4-byte schema id), as a schema registry's
    # serializers write it.
    avro_schema: str | None = None
    avro_framing: Literal["none", "confluent"] = "none"
    # Avro in Confluent's framing whose writers' schemas are in a registry: each record read
    # with its own writer schema (by the id in its header) as the reader schema.
    schema_registry: SchemaRegistry | None = None
    # "earliest", "latest", {"topic": {"partition": offset}} (-2 earliest, -1 latest), as
    # Spark; or {"timestamp": "2026-11-21T10:00:00Z"}: in each partition, the first record
    # stamped at or after that time (the log end if there is none).
    starting_offsets: StartingOffsets = "latest"
    max_records_per_batch: int = 100_000
    # Fail the query when records were deleted by retention before being read (Spark's default).
    fail_on_data_loss: bool = True
    # "spark-kafka": Spark's own JVM Kafka connector (spark-sql-kafka-0-10);
    # "python": our Python Data Source reader on kafka-python, for a Spark without the connector;
    # None: the connector where its jars are installed, else the Python reader. The reader a
    # checkpoint was started with is kept beside it (jobs.kafka.readers): their offset logs
    # differ, so a checkpoint is always read on by the reader that wrote it.
    reader: Literal["python", "spark-kafka"] | None = None
    # Spark input partitions a batch is cut into at least (large offset ranges are split):
    # None: the application's cores (spark.default.parallelism). Kept with the checkpoint like
    # the reader, so a replayed batch is cut as it was the first time.
    min_partitions: int | None = None
    # After each committed batch, also commit its end offsets to this Kafka consumer group,
    # so that existing lag tools (Burrow, kafka-consumer-groups, exporters) see the job.
    # Best-effort: the checkpoint stays the source of truth (jobs.kafka.group_commit).
    consumer_group: str | None = None
    # Event time for stateful pipelines (windows, deduplication); None: no watermark.
    watermark: Watermark | None = None
    # Drop records whose key was seen within the watermark, before the transform.
    deduplicate: Deduplicate | None = None
    kind: Literal["kafka"] = "kafka"


def starting_timestamp_ms(starting: StartingOffsets) -> int | None:
    """The start time of `{"timestamp": ...}` starting offsets, in epoch milliseconds."""
    from datetime import datetime

    if isinstance(starting, dict) and isinstance(starting.get("timestamp"), str):
        return round(datetime.fromisoformat(starting["timestamp"]).timestamp() * 1000)
    return None


OutputMode = Literal["append", "update"]


@dataclass(frozen=True)
class Transform:
    """Spark SQL over a temporary view named `source`.

    Without an output mode (and without a watermark or deduplication), the SQL runs over each
    micro-batch on its own: an aggregate counts within the batch. With one, it runs over the
    stream, its aggregates kept in the state store across batches: `append` writes each
    group once, when the watermark has finished it (a window's final count); `update` writes
    a group's new value after every batch that changed it (a running count, for an upsert).
    """

    sql: str
    output_mode: OutputMode | None = None


# A sink: the dataclass of its kind (jobs.sinks.<kind>.model). The spec does not know which
# kinds there are: the registry does (jobs.sinks.registry.sink_union(), the union of their
# models, which the JSON Schema is built from).
Sink = Any


@dataclass(frozen=True)
class Trigger:
    interval_seconds: float = 1.0


@dataclass(frozen=True)
class FixedDelay:
    attempts: int = 1
    delay_seconds: float = 1.0
    kind: Literal["fixed-delay"] = "fixed-delay"


@dataclass(frozen=True)
class FailureRate:
    max_failures: int = 1
    interval_seconds: float = 60.0
    delay_seconds: float = 1.0
    kind: Literal["failure-rate"] = "failure-rate"


@dataclass(frozen=True)
class ExponentialDelay:
    initial_backoff_seconds: float = 1.0
    max_backoff_seconds: float = 60.0
    multiplier: float = 1.5
    jitter: float = 0.1
    reset_after_seconds: float = 3600.0
    max_attempts: int | None = None
    kind: Literal["exponential-delay"] = "exponential-delay"


@dataclass(frozen=True)
class NoRestart:
    kind: Literal["none"] = "none"


RestartPolicy = FixedDelay | FailureRate | ExponentialDelay | NoRestart

# Where a stateful pipeline keeps its state: RocksDB on the executors' disks, committed with
# changelog checkpointing (only the changes of each batch are uploaded), or Spark's default
# ("hdfs": every key in the executors' memory, delta files and snapshots in the checkpoint).
StateStore = Literal["rocksdb", "hdfs"]


@dataclass(frozen=True)
class PipelineSpec:
    source: KafkaSource
    # The sink; with `sinks` (several), the first of them.
    sink: Sink
    transform: Transform | None = None
    trigger: Trigger = field(default_factory=Trigger)
    restart_policy: RestartPolicy = field(default_factory=ExponentialDelay)
    # Several sinks, each written exactly once with markers of its own (`sinks: [...]`);
    # empty when the spec has the one-sink form (`sink`).
    sinks: tuple[Sink, ...] = ()
    # Stateful pipelines only; None: "rocksdb".
    state_store: StateStore | None = None

    @property
    def stateful(self) -> bool:
        """Whether the transform runs over the stream with state kept across batches (a
        watermark, deduplication or an output mode), rather than over each batch alone."""
        return bool(
            self.source.watermark
            or self.source.deduplicate
            or (self.transform and self.transform.output_mode)
        )

    @property
    def output_mode(self) -> OutputMode | None:
        """Spark's output mode of a stateful pipeline (append unless the transform says)."""
        if not self.stateful:
            return None
        return (self.transform and self.transform.output_mode) or "append"

    def all_sinks(self) -> tuple[Sink, ...]:
        return self.sinks or (self.sink,)

    def connection_names(self) -> set[str]:
        registry = self.source.schema_registry
        return {
            self.source.connection,
            *((registry.connection,) if registry is not None else ()),
            *(n for s in self.all_sinks() for n in s.connection_names()),
        }

    def to_dict(self) -> dict[str, Any]:
        """The canonical JSON form: every default spelled out, keys in a stable order; the
        sinks in the form they were given (`sink`, or `sinks` for several)."""
        out = _plain(asdict(self))
        if self.sinks:
            out.pop("sink")
        else:
            out.pop("sinks")
        return out


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value
