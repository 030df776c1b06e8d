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
