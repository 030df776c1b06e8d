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

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any

from ..failures import MISSING_TOPIC, DefinitionError
from ..kafka.readers import java_client_options

log = logging.getLogger("jobs.sinks.kafka")

WRITER_CLASS = "controlplane.spark.KafkaTxWriter"
KEY, VALUE, HEADERS = "_cp_key", "_cp_value_out", "_cp_headers"
# Producer settings the writer needs (the connection's own come on top of none of these).
PRODUCER_SETTINGS = {"linger.ms": "5", "batch.size": "262144"}
# Physical operators that pick some rows (LIMIT, ORDER BY ... LIMIT, TABLESAMPLE) or, for a
# COALESCE hint ("Coalesce 2"; the function prints in lower case), group input partitions by
# where they are preferred to run, which can differ on a cluster: a replayed batch's
# partitions may then hold other rows. No word boundary before the first three: GlobalLimit,
# CollectLimit... The Postgres sink stages such batches (jobs.pipeline.shuffles, which adds
# Exchange); Kafka has no stage to commit from, so its sink refuses them.
PICKS_ROWS = r"Limit|TakeOrdered|Sample|\bCoalesce \d"
_PICKS_ROWS = re.compile(PICKS_ROWS)


class KafkaSinkError(DefinitionError, RuntimeError):
    """The Kafka sink cannot write as asked: a definition error, the same on every restart."""


class MissingSinkTopic(KafkaSinkError):
    """The Kafka sink's topic (or its dead-letter topic) does not exist."""

    category = MISSING_TOPIC


def transactional_prefix(pipeline: str, stream_id: str) -> str:
    """What every transactional id and marker group of a pipeline's checkpoint starts with,
    `cp.<pipeline>.<query id's first 12 hex digits>/`: a new checkpoint (a new query id)
    starts its markers anew. A sink of a pipeline with several has a scope of its own (the
    stream id `<query id>/<scope>`: `cp.<pipeline>.<query id>/<scope>/`). Parts follow; `/`
    cannot be in a topic name, so no part of one scope reads as another's."""
    query, _, scope = stream_id.partition("/")
    return f"cp.{pipeline}.{query.replace('-', '')[:12]}/{scope + '/' if scope else ''}"


def producer_config(client: Mapping[str, Any], timeout_seconds: float) -> dict[str, str]:
    """The Java producer's properties for a connection's kafka-python client arguments."""
    return {
        **PRODUCER_SETTINGS,
        **java_client_options(client),
        "transaction.timeout.ms": str(int(timeout_seconds * 1000)),
    }


def check_topics(client: Mapping[str, Any], topics: Sequence[str]) -> None:
    """Raise KafkaSinkError naming a topic that does not exist (the writer never creates one:
    a producer would wait for it a minute per record batch, then fail)."""
    from ..kafka.source import metadata_consumer

    consumer = metadata_consumer(dict(client))
    try:
        missing = [t for t in topics if not consumer.partitions_for_topic(t)]
    finally:
        consumer.close()
    if missing:
        raise MissingSinkTopic(
            f"the Kafka sink's topic {missing[0]!r} does not exist on the sink's cluster;"
            " create it (the control plane never creates topics)"
        )


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


class RecordColumns:
    """The key, value and headers columns of a frame's records, built once per frame shape
    (the expressions' types are learnt from one analysis)."""

    def __init__(self, sink):
        self.sink = sink
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


class KafkaWriter:
    """Writes frames of records with KafkaTxWriter; one per pipeline run."""

    def __init__(self, spark, *, pipeline: str, sink, client: Mapping[str, Any]):
        self.spark = spark
        self.pipeline = pipeline
        self.sink = sink
        self.producer = producer_config(client, sink.transaction_timeout_seconds)

    def config(self, batch_id: int, stream_id: str, names: Sequence[str], **extra) -> str:
        def at(column: str | None) -> int:
            return names.index(column) if column in names else -1

        dead = extra.get("dead_letter_columns") or ()
        return json.dumps(
            {
                "producer": self.producer,
                "topic": self.sink.topic,
                "dead_letter_topic": self.sink.dead_letter_topic,
                "prefix": transactional_prefix(self.pipeline, stream_id) + extra.get("part", ""),
                "batch_id": batch_id,
                "key_ordinal": at(KEY),
                "value_ordinal": at(VALUE),
                "headers_ordinal": at(HEADERS),
                "bad_ordinal": at(extra.get("bad_column")),
                "dead_ordinals": [names.index(c) for c in dead],
                "parse_error": extra.get("parse_error", ""),
                "empty_value_error": extra.get("empty_value_error", ""),
                "check_scheme": extra.get("check_scheme", False),
                "source_parts": list(extra.get("source_parts", ())),
            }
        )

    def write(self, frame, batch_id: int, stream_id: str, **extra) -> tuple[int, int]:
        """Write every partition of `frame` (columns KEY, VALUE, HEADERS; with `bad_column`,
        rows flagged there go to the dead-letter topic from `dead_letter_columns`), each in a
        transaction with its marker. `part`: a prefix of this write's markers (the dead letters
        of a batch with a transform have markers of their own). (records, dead letters)."""
        config = self.config(batch_id, stream_id, frame.columns, **extra)
        writer = self.spark._jvm.controlplane.spark.KafkaTxWriter
        records, dead = writer.write(frame._jdf, config)
        return int(records), int(dead)

    def committed(self, stream_id: str, parts: Sequence[str]) -> dict[str, int]:
        """The committed marker offset of each of these parts that has one."""
        from py4j.java_collections import ListConverter

        config = self.config(0, stream_id, [])
        jvm = self.spark._jvm
        found = jvm.controlplane.spark.KafkaTxWriter.committed(
            config, ListConverter().convert(list(parts), self.spark._sc._gateway._gateway_client)
        )
        return {str(k): int(found.get(k)) for k in found.keySet()}
