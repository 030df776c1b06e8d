"""The Kafka sink, exactly once (controlplane.spark.KafkaTxWriter in the executors' JVM).

Spark's own Kafka sink is at-least-once: a batch replayed after a crash is written again. Here
every Spark task writes its partition's records in one Kafka transaction with a commit
marker: a consumer-group offset committed in the same transaction (Kafka's own
consume-transform-produce protocol), under a transactional id that is the same for every
attempt at that partition, so a replayed batch skips what was committed, an attempt's open
transaction is aborted by the next one, and a zombie writer is fenced by the broker.
`read_committed` consumers of the topic see every record once. See docs/spec.md (sink, kind
kafka) for what operators grant and how to read the output.

Records: the key and header values are the spec's SQL expressions (strings as UTF-8, binary
as it is, anything else as its string form); the value is the spec's expression, or every
output column, as JSON (a struct, map or array), UTF-8 (a string) or bytes (binary). Records
that do not parse go to the dead-letter topic, as they arrived, in the same transaction when
there is no transform (with one, in a transaction of their own, with their own markers), with
headers naming where they came from and why.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence

from ...batch import PICKS_ROWS
from ...kafka.transactions import (  # noqa: F401 (the sink's, where they are raised)
    HEADERS,
    KEY,
    VALUE,
    KafkaSinkError,
    KafkaWriter,
    MissingSinkTopic,
    check_topics,
    transactional_prefix,
)

log = logging.getLogger("jobs.sinks.kafka")

# Physical operators that pick rows (jobs.batch.PICKS_ROWS): the Postgres sink stages such
# batches (jobs.batch.shuffles); Kafka has no stage to commit from, so its sink refuses them.
_PICKS_ROWS = re.compile(PICKS_ROWS)


def check_plan(frame) -> None:
    """Raise KafkaSinkError when the transform's plan has an operator whose partitions a
    replay could fill differently (LIMIT, ORDER BY ... LIMIT, TABLESAMPLE)."""
    plan = frame._jdf.queryExecution().executedPlan().toString()
    found = _PICKS_ROWS.search(plan)
    if found:
        raise KafkaSinkError(
            f"the transform's plan has {found.group(0).split()[0]} (LIMIT, ORDER BY with LIMIT,"
            " TABLESAMPLE or a COALESCE hint):"
            " the Kafka sink cannot write it exactly once, since a replayed batch may pick"
            " other rows; remove it or use a Postgres sink"
        )


def _as_bytes(column, data_type):
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, BinaryType, MapType, StringType, StructType

    if isinstance(data_type, BinaryType):
        return column
    if isinstance(data_type, StructType | MapType | ArrayType):
        return F.to_json(column).cast("binary")
    if isinstance(data_type, StringType):
        return column.cast("binary")
    return column.cast("string").cast("binary")


class AvroValues:
    """Values in Avro, in Confluent's wire format (`format: avro`): the value's Avro schema,
    from its Spark type as Spark's to_avro writes it (SchemaConverters.toAvroType), registered
    under the sink's subject, or found there when it already is (one request per frame
    shape), and every value framed with its id."""

    def __init__(self, spark, sink, registry: dict | None):
        if not registry:
            raise KafkaSinkError("sink.schema_registry: the run configuration has no registry")
        self.spark = spark
        self.sink = sink
        self.registry = registry

    def schema_of(self, data_type) -> str:
        """The Avro schema (JSON) Spark writes a value of this Spark type with."""
        from pyspark.sql.types import StructType

        if not isinstance(data_type, StructType):
            raise KafkaSinkError(
                f"sink.value: format avro writes a record: the value must be a struct (the"
                f" output's columns, or struct(...)), not {data_type.simpleString()}"
            )
        from ...registry.spark_avro import record_name

        jvm = self.spark._jvm
        catalyst = self.spark._jsparkSession.parseDataType(data_type.json())
        short, namespace = record_name(self.sink.schema_registry.record)
        avro = jvm.org.apache.spark.sql.avro.SchemaConverters.toAvroType(
            catalyst, False, short, namespace
        )
        return avro.toString()

    def column(self, value, data_type):
        """The framed Avro value of a struct column."""
        from pyspark.sql import functions as F
        from pyspark.sql.avro.functions import to_avro

        from ...registry.client import Incompatible, InvalidSchema, Registry, RegistryError
        from ...registry.subjects import frame

        schema = self.schema_of(data_type)
        name = self.sink.value_subject()
        try:
            with Registry(self.registry) as registry:
                schema_id = registry.register(name, schema)
        except (Incompatible, InvalidSchema) as exc:
            raise KafkaSinkError(
                f"sink.schema_registry: the output's Avro schema cannot be registered under"
                f" {name!r}: {exc}; the schema: {schema}"
            ) from None
        except RegistryError as exc:
            raise RuntimeError(f"the Kafka sink's schema registry: {exc}") from None
        log.info("kafka sink: values in Avro, schema id %s under %s", schema_id, name)
        return F.concat(F.lit(frame(schema_id, b"")), to_avro(value, schema))


class RecordColumns:
    """The key, value and headers columns of a frame's records, built once per frame shape
    (the expressions' types are learnt from one analysis)."""

    def __init__(self, sink, avro: AvroValues | None = None):
        self.sink = sink
        self.avro = avro
        self._built: dict[tuple, list] = {}

    def columns(self, frame, names: Sequence[str]) -> list:
        """[key, value, headers] columns for `frame`, whose output columns are `names`."""
        shape = tuple(names)
        if shape not in self._built:
            from pyspark.sql import functions as F

            sink = self.sink
            value = (
                F.expr(sink.value) if sink.value else F.struct(*[F.col(f"`{c}`") for c in names])
            )
            exprs = {"value": value}
            if sink.key:
                exprs["key"] = F.expr(sink.key)
            for i, expression in enumerate(sink.headers.values()):
                exprs[f"h{i}"] = F.expr(expression)
            types = {
                f.name: f.dataType
                for f in frame.select(*[c.alias(n) for n, c in exprs.items()]).schema.fields
            }
            built = {n: _as_bytes(c, types[n]) for n, c in exprs.items()}
            if self.avro is not None:
                built["value"] = self.avro.column(exprs["value"], types["value"])
            headers = F.array(
                *[
                    F.struct(F.lit(name).alias("key"), built[f"h{i}"].alias("value"))
                    for i, name in enumerate(sink.headers)
                ]
            )
            self._built[shape] = [
                (built["key"] if "key" in built else F.lit(None).cast("binary")).alias(KEY),
                built["value"].alias(VALUE),
                headers.alias(HEADERS),
            ]
        return self._built[shape]
