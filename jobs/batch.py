"""A micro-batch, as every sink's writer sees it: the records of the batch split into those that
parsed and those that did not (the dead letters), the transform run over the former, and
what the writers share (their markers' scope, the checks of a frame's plan, the conversions
for the JVM and for COPY). Each sink kind writes the batch with its own writer
(jobs.sinks.<kind>.writer), looked up in the sink registry (jobs.sinks.registry); a pipeline
with several sinks writes them in turn (SinksWriter)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from typing import TYPE_CHECKING, Any

from .runconfig import RunConfig
from .source import DEAD_LETTER_FIELDS, PARSED, REASON, parse_error, unparsed
from .spec import PipelineSpec
from .storage import Storage, join, storage_for

if TYPE_CHECKING:
    from .sinks.kind import SinkKind

log = logging.getLogger("jobs.pipeline")

BAD = "_cp_bad"
ORDER = "_cp_order"  # an upsert's position of each row in its batch
EMPTY_VALUE = "empty value (null)"


class Batch:
    """What a sink's writer is given for each micro-batch, and the steps every writer takes
    the same way: the one-pass frame (flag, dead-letter columns, parsed columns), the
    observed pass (the records that parsed, through the transform, those that did not
    counted on the way), and the dead letters of a batch."""

    # The session whose StreamingQueryManager runs the query (set by start_query).
    session = None

    def __init__(self, config: RunConfig, index: int = 0, kind: SinkKind | None = None):
        self.config = config
        # The sink's kind (jobs.sinks.kind): its connection arguments and what it writes.
        self.kind = kind
        # Which of the spec's sinks this writes (sinks after the first keep their markers
        # apart: a suffix of their stream id, a prefix of their transactional ids).
        self.index = index
        spec = config.spec
        self.sink = spec.all_sinks()[index]
        self.unparsed_before = False  # whether the last batch had records that did not parse
        self._one_pass = None  # the one-pass frame's columns, built once
        self._observed = None  # the observed pass's columns, built once
        self.parse_error = parse_error(spec.source)
        from .spec.ddl import parse_schema

        # The columns of the parsed records, and the transform run over each batch. For a
        # stateful pipeline the transform runs over the stream before the batch (see
        # jobs.stateful.stateful_frame): there the columns are its output's, and there is
        # none left here.
        self.columns = [f.name for f in parse_schema(spec.source.schema).fields]
        self.transform = None if spec.stateful else spec.transform

    def client(self) -> dict[str, Any]:
        """The sink's connection arguments (secrets included), as the control plane wrote
        them for the sink's kind of connection."""
        return self.config.sink_config(self.index).get(self.kind.connection_kind) or {}

    def stream_id(self) -> str:
        """The query's id, scoped to this sink: what its markers are kept under."""
        return stream_id(self.config.checkpoint, self.config.store) + marker_scope(
            self.config.spec, self.index, self.kind.target(self.sink)
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

            bad = unparsed()
            self._one_pass = [
                bad.alias(BAD),
                *[F.when(bad, F.col(c)).alias(f"_cp_{c}") for c in DEAD_LETTER_FIELDS],
                *self.parsed_columns(),
            ]
        return self._one_pass

    def parsed_columns(self) -> list:
        from pyspark.sql import functions as F

        return [F.col(PARSED)[c].alias(c) for c in self.columns]

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
        stateful = self.config.spec.stateful  # staged: the rows that parsed, BAD counted
        if not self.transform and not stateful:
            return None, parsed.select(*self.observed_parts()[0])
        return self.observed_output(parsed, batch_id)

    def observed_output(self, parsed, batch_id: int):
        """(name, frame): the records that parsed, through the transform if any, those that
        did not counted as `name` while the frame is computed (Dataset.observe)."""
        columns, count, good, named = self.observed_parts()
        name = f"cp_unparsed_{batch_id}"
        out = parsed.select(*columns).observe(name, count).where(good).select(*named)
        if not self.transform:
            return name, out
        out.createOrReplaceTempView("source")
        return name, parsed.sparkSession.sql(self.transform.sql)

    def observed_parts(self) -> tuple:
        """(columns with the flag BAD, the count of BAD rows, the good-row condition, the
        parsed columns by name): the observed pass's pieces, built once."""
        from pyspark.sql import functions as F

        if self._observed is None:
            self._observed = (
                [unparsed().alias(BAD), *self.parsed_columns()],
                F.count(F.when(F.col(BAD), 1)).alias("n"),
                ~F.col(BAD),
                [F.col(f"`{c}`") for c in self.columns],
            )
        return self._observed

    def dead_letters(self, batch):
        """The batch's records that did not parse, as dead-letter rows."""
        from pyspark.sql import functions as F

        return batch.where(F.col(BAD)).select(
            *[F.col(f"_cp_{c}").alias(c) for c in DEAD_LETTER_FIELDS if c != REASON],
            F.coalesce(
                F.col(f"_cp_{REASON}"),
                F.when(F.col("_cp_value").isNull(), F.lit(EMPTY_VALUE)).otherwise(
                    F.lit(self.parse_error)
                ),
            ).alias("error"),
        )

    def unparsed_letters(self, parsed, count: int | None):
        """The batch's dead letters, read again from Kafka, when `count` (of the records that
        did not parse, taken during the write) is not 0; None (not reported) reads them too,
        to be safe."""
        if count == 0:
            return None
        return self.dead_letters(parsed.select(*self.one_pass_columns())).toArrow()


def stream_id(checkpoint: str, store: Storage | None = None) -> str:
    """The query id Spark keeps in the checkpoint: the same across restarts of one
    checkpoint, new for a new one. Commit markers are scoped by it."""
    store = store or storage_for(checkpoint)
    return json.loads(store.read_text(join(checkpoint, "metadata")))["id"]


# Physical operators that pick some rows (LIMIT, ORDER BY ... LIMIT, TABLESAMPLE) or, for a
# COALESCE hint ("Coalesce 2"; the function prints in lower case), group input partitions by
# where they are preferred to run, which can differ on a cluster: a replayed batch's
# partitions may then hold other rows. No word boundary before the first three: GlobalLimit,
# CollectLimit...
PICKS_ROWS = r"Limit|TakeOrdered|Sample|\bCoalesce \d"

# Physical operators that move rows between partitions or pick some of them (joins,
# aggregations, sorts, limits, samples): partition contents are then not a fixed function of
# the batch's input partitions.
_UNSTABLE_OPERATORS = re.compile(rf"Exchange|{PICKS_ROWS}")


def written(rows: int, dead_rows, how: str) -> tuple[int, int, str]:
    """(rows, dead letters, how) of a one-pass write, saying when dead letters were read
    again."""
    if dead_rows is None:
        return rows, 0, how
    return rows, dead_rows.num_rows, f"{how}, unparsed records read again"


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


def nested(frame) -> bool:
    from pyspark.sql.types import ArrayType, MapType, StructType

    return any(isinstance(f.dataType, ArrayType | MapType | StructType) for f in frame.schema)


def for_jvm(frame, only=None):
    """The frame as the JVM writer wants it: nested values as JSON text, the rest as is."""
    return for_copy(frame, only, binary_as_hex=False)


# Spark checks each Arrow batch's size in bytes after every row it adds when the limit is
# below Int.MaxValue (BatchedPythonArrowInput): ~8% of the executors' JVM time in the Python
# writer's hop (measured with JFR). Batches stay bounded by maxRecordsPerBatch (10,000 rows).
ARROW_SESSION_CONF = {"spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1)}


def marker_scope(spec: PipelineSpec, index: int, target: str) -> str:
    """What keeps a sink's markers apart from the others' in a pipeline with several sinks:
    a digest of what the sink writes (its kind, connection and table or topic), so that
    reordering the list, or removing a sink, gives no sink another's markers. None in the
    one-sink form."""
    if not spec.sinks:
        return ""
    sink = spec.sinks[index]
    digest = hashlib.sha1(f"{sink.kind}:{sink.connection}:{target}".encode()).hexdigest()  # noqa: S324 - a name
    return f"/s{digest[:10]}"


def query_active(spark, query_id: str) -> bool:
    """Whether the streaming query with this id runs in the application (one lookup, however
    many queries a shared application runs)."""
    return spark._jsparkSession.streams().get(query_id) is not None


def count_all():
    from pyspark.sql import functions as F

    return F.count(F.lit(1)).alias("n")
