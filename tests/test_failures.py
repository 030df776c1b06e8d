"""jobs.failures: a failure is permanent or transient by the exception's type, not its text.

The exceptions are real: raised by our own code, by psycopg against the real sink database,
and (marked `spark`) by the session-wide local Spark: an analysis error, a foreachBatch
function's exception behind Spark's wrapper, a JDBC write Postgres refuses, a Kafka read of a
topic that does not exist, a pipeline's own query whose sink table lacks a column.
"""

from __future__ import annotations

import json
import os
import uuid

import psycopg
import pytest

from jobs import failures
from jobs.failures import NO_TOPIC, PERMANENT, TRANSIENT, Verdict
from jobs.kafka.auth import SaslLoginError
from jobs.kafka.readers import ReaderError
from jobs.kafka.source import DataLossError
from jobs.sinks.files.store import FileSinkError
from jobs.sinks.kafka.client import KafkaSinkError
from jobs.sinks.postgres.store import MixedWritesError
from jobs.spec import SpecError, parse_spec
from jobs.stateful import StateStoreError
from tests.factories import valid_spec


def raised(make):
    """The exception `make()` raises (it must raise)."""
    try:
        make()
    except Exception as exc:
        return exc
    raise AssertionError("it did not raise")


def failed(query) -> BaseException:
    """What the streaming query ends with (it must fail)."""
    from pyspark.errors import StreamingQueryException

    with pytest.raises(StreamingQueryException) as caught:
        query.awaitTermination(120)
    return caught.value


def spec_error() -> SpecError:
    return raised(lambda: parse_spec(valid_spec(trigger={"interval_seconds": -1})))


# -- our own exceptions: their type says it ---------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "what"),
    [
        (spec_error(), "a definition error"),
        (MixedWritesError("batch 3 was partly written directly"), "a definition error"),
        (KafkaSinkError("the Kafka sink's topic 'out' does not exist"), "a definition error"),
        (FileSinkError("sink.partition_by[0]: column 'day' is missing"), "a definition error"),
        (StateStoreError("the checkpoint's state store is hdfs"), "a definition error"),
        (ReaderError("source.reader: spark-kafka needs the connector"), "a definition error"),
        (SaslLoginError("broker b:9092 refused user u (SCRAM-SHA-256)"), "bad credentials"),
        (DataLossError("t-0: offsets 0 to 10 were deleted"), "data loss"),
    ],
    ids=lambda x: type(x).__name__ if isinstance(x, Exception) else None,
)
def test_our_exceptions_are_permanent_by_type(exc, what):
    verdict = failures.classify(exc)
    assert verdict.kind == PERMANENT
    assert verdict.reason.startswith(what + (" " if what == "data loss" else ": "))
    assert verdict.type == f"{type(exc).__module__}.{type(exc).__qualname__}"
    assert str(exc).splitlines()[0][:100] in verdict.reason


def test_what_an_exception_says_does_not_make_it_permanent():
    """The old text table called any error output naming UNRESOLVED_COLUMN or SpecError
    permanent; a plain RuntimeError saying so is transient: only types decide."""
    exc = RuntimeError("[UNRESOLVED_COLUMN.WITH_SUGGESTION] SpecError: password authentication")
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.type, verdict.condition) == (
        TRANSIENT,
        "builtins.RuntimeError",
        "",
    )
    assert verdict.reason.startswith("RuntimeError: [UNRESOLVED_COLUMN")


def test_a_permanent_cause_makes_the_failure_permanent():
    def wrapped():
        try:
            raise SaslLoginError("broker refused user u")
        except SaslLoginError as exc:
            raise ConnectionError("could not read the topic's partitions") from exc

    verdict = failures.classify(raised(wrapped))
    assert verdict.kind == PERMANENT
    assert verdict.type == "jobs.kafka.auth.SaslLoginError"
    assert verdict.reason == "bad credentials: broker refused user u"


def test_a_new_permanent_exception_needs_no_list_edited():
    class CheckpointMoved(failures.DefinitionError, RuntimeError):
        pass

    assert failures.classify(CheckpointMoved("moved")).reason == "a definition error: moved"


def test_kafka_python_errors_by_class():
    from kafka.errors import KafkaTimeoutError, TopicAuthorizationFailedError
    from kafka.errors import UnknownTopicOrPartitionError as Unknown

    assert failures.classify(Unknown("orders")).reason.startswith(NO_TOPIC)
    denied = failures.classify(TopicAuthorizationFailedError("orders"))
    assert (denied.kind, denied.reason.split(":")[0]) == (PERMANENT, "missing privileges")
    assert failures.classify(KafkaTimeoutError("no broker")).kind == TRANSIENT


# -- psycopg, against the real sink database: the SQLSTATE decides ----------------------------


@pytest.fixture
def sink_table(sink_dsn):
    name = f"fail_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {name} (id text PRIMARY KEY, n integer)")
    yield name
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {name}")


@pytest.mark.parametrize(
    ("statement", "state", "words"),
    [
        ("INSERT INTO {t} (id, n) VALUES ('a', 'many')", "22P02", "cannot take the output's"),
        ("INSERT INTO {t} (id, n) SELECT 'a', 'x'::text", "42804", "cannot take the output's"),
        ("INSERT INTO {t} (id, amount) VALUES ('a', 1)", "42703", "has no such column"),
        ("INSERT INTO {t}_gone (id) VALUES ('a')", "42P01", "does not exist"),
    ],
)
def test_postgres_errors_by_sqlstate(sink_dsn, sink_table, statement, state, words):
    with psycopg.connect(sink_dsn) as conn:
        exc = raised(lambda: conn.execute(statement.format(t=sink_table)))
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.condition) == (PERMANENT, state), verdict
    assert verdict.reason.startswith("a definition error (") and words in verdict.reason
    assert verdict.type.startswith("psycopg.errors.")


def test_an_unreachable_database_is_transient():
    exc = raised(lambda: psycopg.connect("postgresql://x@127.0.0.1:1/none", connect_timeout=2))
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.type) == (TRANSIENT, "psycopg.OperationalError")
    assert verdict.category == failures.CONNECTION_LOST


# -- the verdict file and what writes it -------------------------------------------------------


def test_the_first_verdict_written_is_kept(tmp_path):
    first = Verdict(PERMANENT, "a definition error: x", "jobs.X", "42703")
    assert failures.write_verdict(tmp_path, first) is True
    assert failures.write_verdict(tmp_path, Verdict(TRANSIENT, "later", "Y")) is False
    assert failures.read_verdict(tmp_path) == first.as_dict()


@pytest.mark.parametrize(
    "data",
    [
        "not json",
        json.dumps({"kind": "maybe", "reason": "x"}),
        json.dumps({"kind": "permanent", "reason": ""}),
        json.dumps({"kind": "permanent", "reason": "x" * (failures.MAX_REASON + 1)}),
        json.dumps({"kind": "permanent", "reason": "x", "condition": 42}),
        json.dumps(["permanent"]),
    ],
)
def test_a_file_that_is_not_a_verdict_reads_as_none(tmp_path, data):
    (tmp_path / failures.VERDICT_FILE).write_text(data)
    assert failures.read_verdict(tmp_path) is None


def test_the_driver_judges_the_exception_it_fails_with(tmp_path):
    """jobs/run.py's main: a run.json whose spec no longer parses is a permanent failure; the
    exception still goes on (the driver exits with it)."""
    from jobs import run

    with pytest.raises(SpecError), run.judged(tmp_path, "orders"):
        raise spec_error()
    verdict = failures.read_verdict(tmp_path)
    assert verdict["kind"] == PERMANENT
    assert verdict["type"] == "jobs.spec.fields.SpecError"
    assert "trigger.interval_seconds" in verdict["reason"]
    with run.judged(tmp_path / "nothing"):
        pass  # no exception: no verdict
    assert not (tmp_path / "nothing").exists()


def test_a_foreach_batch_functions_exception_is_kept_by_query():
    def batch(frame, batch_id):
        raise MixedWritesError(f"batch {batch_id}")

    call = failures.recording("orders", batch)
    with pytest.raises(MixedWritesError):
        call(None, 7)
    assert str(failures.raised_in_batch("orders")) == "batch 7"
    failures.recording("orders", batch)  # the query starts again: afresh
    assert failures.raised_in_batch("orders") is None
    assert failures.raised_in_batch(None) is None


# -- real Spark errors (the session-wide local Spark) ------------------------------------------


@pytest.mark.spark
def test_an_analysis_error_is_permanent_by_its_condition(spark):
    exc = raised(lambda: spark.sql("SELECT amout FROM range(3)").collect())
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.condition) == (PERMANENT, "UNRESOLVED_COLUMN.WITH_SUGGESTION")
    assert verdict.reason.startswith(failures.ANALYSIS + ": [UNRESOLVED_COLUMN")
    assert "`amout`" in verdict.reason


@pytest.mark.spark
def test_a_foreach_batch_exception_is_seen_through_sparks_wrapper(spark):
    """Spark ends the query with STREAM_FAILED around FOREACH_BATCH_USER_FUNCTION_ERROR around
    py4j's text of our exception: the recorded exception gives its type back."""

    def batch(frame, batch_id):
        raise MixedWritesError(f"batch {batch_id} was partly written directly")

    name = f"fb-{uuid.uuid4().hex[:8]}"
    query = (
        spark.readStream.format("rate")
        .load()
        .writeStream.queryName(name)
        .foreachBatch(failures.recording(name, batch))
        .start()
    )
    exc = failed(query)
    assert exc.getCondition() == "STREAM_FAILED"
    verdict = failures.classify(exc, batch_error=failures.raised_in_batch(name))
    assert verdict.kind == PERMANENT
    assert verdict.type == "jobs.sinks.postgres.store.MixedWritesError"
    assert verdict.reason == "a definition error: batch 0 was partly written directly"
    # Without it only the text of the exception is left: no verdict (the control plane
    # falls back to reading the error output).
    assert failures.classify(exc) is None


class UnknownToTheDriver(Exception):
    """An exception class of a module the classifier does not look in (tests.*)."""


def _fail_in_worker(spark, exc: BaseException) -> BaseException:
    def fail(batches):
        raise exc
        yield from batches

    return raised(lambda: spark.range(2).mapInArrow(fail, "id long").collect())


@pytest.mark.spark
def test_an_error_of_a_type_the_driver_does_not_know_gives_no_verdict(spark):
    exc = _fail_in_worker(spark, UnknownToTheDriver("a Python worker's error reaches it as text"))
    assert exc.getCondition() == "PYTHON_EXCEPTION"
    assert failures.classify(exc) is None


@pytest.mark.spark
def test_a_python_workers_error_is_judged_by_its_type_read_back(spark):
    """Its class is read from the traceback in the text and found among the driver's
    modules: a built-in error is transient, ours permanent, as if raised in the driver."""
    exc = _fail_in_worker(spark, MemoryError("no room for the batch"))
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.category, verdict.type) == (
        TRANSIENT,
        failures.OUT_OF_MEMORY,
        "MemoryError",
    ), verdict
    assert verdict.reason == "MemoryError: no room for the batch"
    exc = _fail_in_worker(spark, MixedWritesError("batch 3 was partly written directly"))
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.category) == (PERMANENT, failures.DEFINITION), verdict
    assert verdict.type == "jobs.sinks.postgres.store.MixedWritesError"
    assert verdict.reason == "a definition error: batch 3 was partly written directly"


@pytest.mark.spark
def test_a_python_workers_postgres_error_says_its_sqlstate_and_column(spark, sink_dsn, sink_table):
    """A type mismatch met by a COPY in a worker (as the Postgres sink's is): permanent by
    psycopg's class (SQLSTATE 22007), its CONTEXT naming the column."""

    def copy(batches):
        import psycopg as pg

        with pg.connect(sink_dsn) as conn, conn.cursor() as cur:
            conn.execute("CREATE TEMP TABLE typed (id text, at timestamptz)")
            with cur.copy("COPY typed (id, at) FROM STDIN") as stream:
                stream.write_row(("a", "2"))
        yield from batches

    verdict = failures.classify(
        raised(lambda: spark.range(1).mapInArrow(copy, "id long").collect())
    )
    assert (verdict.kind, verdict.category, verdict.condition) == (
        PERMANENT,
        failures.TYPE_MISMATCH,
        "22007",
    ), verdict
    assert verdict.type == "psycopg.errors.InvalidDatetimeFormat"
    assert "column at" in verdict.reason and "SQLSTATE" not in verdict.reason, verdict.reason


@pytest.mark.parametrize(
    "text",
    [
        # Not a module the classifier looks in (and nothing is imported for a name).
        "Traceback (most recent call last):\n  File x\nos.SomethingError: boom\n",
        "Traceback (most recent call last):\n  File x\nsubprocess.CalledProcessError: boom\n",
        # A name that is not an exception class.
        "Traceback (most recent call last):\n  File x\njobs.failures.classify: boom\n",
        # No traceback at all.
        "psycopg.errors.UndefinedColumn: column x does not exist\n",
    ],
)
def test_a_workers_text_names_only_known_exception_classes(text):
    assert failures._worker_exception(text) is None


@pytest.mark.spark
def test_a_jdbc_write_postgres_refuses_is_permanent_by_its_sqlstate(spark, sink_dsn, sink_table):
    from jobs.sinks.postgres.jvm import jdbc_target

    url, properties = jdbc_target({"conninfo": sink_dsn})
    frame = spark.createDataFrame([("a", "many")], "id string, n string")
    exc = raised(
        lambda: frame.write.jdbc(
            url,
            sink_table,
            mode="append",
            properties={
                **properties,
                "driver": "org.postgresql.Driver",
                "stringtype": "unspecified",
            },
        )
    )
    verdict = failures.classify(exc)
    assert (verdict.kind, verdict.condition) == (PERMANENT, "22P02"), verdict
    assert verdict.type in ("java.sql.BatchUpdateException", "org.postgresql.util.PSQLException")


@pytest.mark.spark
@pytest.mark.kafka
def test_a_kafka_topic_that_does_not_exist_is_permanent(spark, kafka_bootstrap):
    """Spark's connector, on a stream (STREAM_FAILED around Kafka's own exception)."""
    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", kafka_bootstrap)
        .option("subscribe", f"missing-{uuid.uuid4().hex[:8]}")
        .load()
        .writeStream.format("noop")
        .start()
    )
    try:
        verdict = failures.classify(failed(query))
    finally:
        query.stop()
    assert verdict.kind == PERMANENT
    assert verdict.type == "org.apache.kafka.common.errors.UnknownTopicOrPartitionException"
    assert verdict.reason.startswith(NO_TOPIC + ": ")


@pytest.mark.spark
@pytest.mark.kafka
def test_a_pipelines_sink_table_without_an_output_column_is_permanent(
    spark, kafka_bootstrap, sink_dsn, tmp_path
):
    """The pipeline's own query (start_query, which keeps its foreachBatch exception): the
    sink table was made without `ts` (by hand, or by an older spec)."""
    from jobs.pipeline import start_query
    from tests.kafka_helpers import new_topic, produce
    from tests.spark_helpers import run_config

    topic = new_topic(kafka_bootstrap)
    produce(kafka_bootstrap, topic, [b'{"id": "a", "amount": 1, "ts": "2026-11-21T10:00:00Z"}'])
    config = run_config(
        tmp_path, topic, sink_dsn, mode="upsert", key=["id"], bootstrap=kafka_bootstrap
    )
    table = config.spec.sink.table
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f"CREATE TABLE {table} (id text PRIMARY KEY, amount double precision)")
    try:
        query = start_query(spark, config, available_now=True)
        exc = failed(query)
        verdict = failures.classify(exc, batch_error=failures.raised_in_batch(config.pipeline))
    finally:
        with psycopg.connect(sink_dsn, autocommit=True) as conn:
            conn.execute(f"DROP TABLE IF EXISTS {table}")
    assert (verdict.kind, verdict.condition) == (PERMANENT, "42703"), verdict
    assert verdict.type == "psycopg.errors.UndefinedColumn"
    assert '"ts"' in verdict.reason


@pytest.mark.spark
def test_a_shared_applications_member_reports_its_verdict(spark, tmp_path):
    """jobs/host.py: a member whose run.json no longer parses ends with exit code 1 and a
    permanent verdict in its exit report."""
    from jobs.host import Member

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "run.json").write_text(
        json.dumps(
            {
                "pipeline": "orders",
                "spec": valid_spec(trigger={"interval_seconds": -1}),
                "kafka": {},
                "postgres": {},
                "checkpoint": str(tmp_path / "checkpoint"),
            }
        )
    )
    assignment = tmp_path / "orders.json.taken"
    assignment.write_text("{}")
    Member(spark, assignment, run_dir).run()
    report = json.loads((run_dir / "exit.json").read_text())
    assert report["exit_code"] == 1
    assert report["failure"]["kind"] == PERMANENT
    assert report["failure"]["type"] == "jobs.spec.fields.SpecError"
    assert not assignment.exists()


# -- the stores checkpoints and files sinks are on: transient, in words, by type --------------
#
# The Java exceptions as py4j shows them (class and superclasses, message, cause, stack
# frames' classes, and the methods the classifier asks), with the class names, chains and
# frames Hadoop 3.5's HDFS client, S3A and the AWS SDK v2 raise (as seen from a driver).

CHECKPOINT_HDFS = "hdfs://127.0.0.1:58020/controlplane/cp/orders/checkpoint"
S3_ENDPOINT = "http://127.0.0.1:58333"
STORES = failures.store_names(CHECKPOINT_HDFS, ["s3a://lake/raw"], S3_ENDPOINT)
IO = ["java.io.IOException", "java.lang.Exception", "java.lang.Throwable", "java.lang.Object"]
SOCKET = ["java.net.SocketException", *IO]
RUNTIME = ["java.lang.RuntimeException", *IO[1:]]
S3A_SERVICE = [
    "org.apache.hadoop.fs.s3a.AWSServiceIOException",
    "org.apache.hadoop.fs.s3a.AWSClientIOException",
    *IO,
]
SDK = ["software.amazon.awssdk.core.exception.SdkException", *RUNTIME]
S3_EXCEPTION = [
    "software.amazon.awssdk.services.s3.model.S3Exception",
    "software.amazon.awssdk.awscore.exception.AwsServiceException",
    "software.amazon.awssdk.core.exception.SdkServiceException",
    *SDK,
]
# Where a NameNode call's failure is thrown: wrapped by NetUtils (through reflection) in the
# caller's thread, below the RPC client and HDFS's client; the original in the IPC thread.
WRAPPED_IN_IPC = [
    "jdk.internal.reflect.NativeConstructorAccessorImpl",
    "java.lang.reflect.Constructor",
    "org.apache.hadoop.util.dynamic.DynConstructors$Ctor",
    "org.apache.hadoop.net.NetUtils",
    "org.apache.hadoop.ipc.Client",
    "org.apache.hadoop.ipc.ProtobufRpcEngine2$Invoker",
    "jdk.proxy2.$Proxy64",
    "org.apache.hadoop.hdfs.protocolPB.ClientNamenodeProtocolTranslatorPB",
    "org.apache.hadoop.hdfs.DFSClient",
    "org.apache.hadoop.hdfs.DistributedFileSystem",
    "org.apache.spark.sql.execution.streaming.checkpointing.HDFSMetadataLog",
]
IN_IPC_THREAD = [
    "sun.nio.ch.Net",
    "org.apache.hadoop.net.SocketIOWithTimeout",
    "org.apache.hadoop.net.NetUtils",
    "org.apache.hadoop.ipc.Client$Connection",
]
IN_S3A = ["org.apache.hadoop.fs.s3a.S3AUtils", "org.apache.hadoop.fs.s3a.S3AFileSystem"]
FROM_NAMENODE = ["org.apache.hadoop.ipc.Client", *WRAPPED_IN_IPC[5:]]


class JavaClass:
    def __init__(self, names):
        self.names = names

    def getName(self):
        return self.names[0]

    def getSuperclass(self):
        return JavaClass(self.names[1:]) if len(self.names) > 1 else None


class Frame:
    def __init__(self, name):
        self.name = name

    def getClassName(self):
        return self.name


class Java:
    """A Java exception through py4j; `methods`: what else it answers (getClassName of a
    RemoteException, statusCode and awsErrorDetails of an AWS error, getCondition...)."""

    def __init__(self, classes, message="", cause=None, frames=(), **methods):
        self.classes, self.message, self.cause, self.frames = classes, message, cause, frames
        for name, value in methods.items():
            setattr(self, name, lambda value=value: value)

    def getClass(self):
        return JavaClass(self.classes)

    def getMessage(self):
        return self.message

    def getCause(self):
        return self.cause

    def getStackTrace(self):
        return [Frame(name) for name in self.frames]


class ErrorDetails:
    def __init__(self, code):
        self.code = code

    def errorCode(self):
        return self.code


class JavaError(Exception):
    """py4j's Py4JJavaError: the Java exception behind it in `java_exception`."""

    def __init__(self, java):
        super().__init__("An error occurred while calling o164.awaitTermination.")
        self.java_exception = java


def query_failed(cause: Java) -> JavaError:
    """A streaming query that ended with `cause` (Spark's STREAM_FAILED around it)."""
    return JavaError(
        Java(
            ["org.apache.spark.sql.streaming.StreamingQueryException", *IO[1:]],
            f"[STREAM_FAILED] Query terminated with exception: {cause.message}",
            cause,
            getCondition="STREAM_FAILED",
        )
    )


def refused_namenode(cls="java.net.ConnectException", supers=SOCKET, what="Connection refused"):
    inner = Java([cls, *supers], what, frames=IN_IPC_THREAD)
    return Java(
        [cls, *supers],
        f"Call From vm/127.0.0.1 to localhost:58020 failed on connection exception: {cls}:"
        f" {what}; For more details see:  http://wiki.apache.org/hadoop/ConnectionRefused",
        inner,
        frames=WRAPPED_IN_IPC,
    )


def from_namenode(cls, message):
    """What the NameNode raised, as its client throws it: a RemoteException naming it."""
    return Java(
        ["org.apache.hadoop.ipc.RemoteException", *IO],
        message,
        frames=FROM_NAMENODE,
        getClassName=cls,
    )


def s3_answer(s3a_class, status, code, message):
    sdk = Java(
        S3_EXCEPTION,
        f"{message} (Service: S3, Status Code: {status})",
        statusCode=status,
        awsErrorDetails=ErrorDetails(code),
    )
    return Java(
        [s3a_class, *S3A_SERVICE],
        f"getFileStatus on s3a://lake/raw/x: {message}",
        sdk,
        frames=IN_S3A,
        statusCode=status,
        awsErrorDetails=ErrorDetails(code),
    )


HDFS_AT = "the checkpoint store HDFS at 127.0.0.1:58020"
S3_AT = f"the files sink's S3 at {S3_ENDPOINT}"
SAFE_MODE = "org.apache.hadoop.hdfs.server.namenode.SafeModeException"


@pytest.mark.parametrize(
    ("cause", "words", "type_"),
    [
        pytest.param(
            refused_namenode(),
            f"{HDFS_AT} could not be reached: ConnectException: Call From vm/127.0.0.1 to"
            " localhost:58020 failed on connection exception",
            "java.net.ConnectException",
            id="namenode-refused",
        ),
        pytest.param(
            refused_namenode("java.io.EOFException", IO, "End of File Exception"),
            f"{HDFS_AT} could not be reached: EOFException: Call From",
            "java.io.EOFException",
            id="namenode-gone-mid-call",
        ),
        pytest.param(
            refused_namenode("java.net.NoRouteToHostException", SOCKET, "No route to host"),
            f"{HDFS_AT} could not be reached: NoRouteToHostException",
            "java.net.NoRouteToHostException",
            id="namenode-no-route",
        ),
        pytest.param(
            refused_namenode(
                "org.apache.hadoop.net.ConnectTimeoutException",
                ["java.net.SocketTimeoutException", "java.io.InterruptedIOException", *IO],
                "20000 millis timeout while waiting for channel to be ready for connect",
            ),
            f"{HDFS_AT} could not be reached: ConnectTimeoutException",
            "org.apache.hadoop.net.ConnectTimeoutException",
            id="namenode-connect-timeout",
        ),
        pytest.param(
            Java(
                [SAFE_MODE, *IO],
                "Cannot create file/cp/offsets/7. Name node is in safe mode.",
                from_namenode(SAFE_MODE, "Cannot create file/cp/offsets/7."),
                frames=[
                    "jdk.internal.reflect.NativeConstructorAccessorImpl",
                    "org.apache.hadoop.ipc.RemoteException",
                    "org.apache.hadoop.hdfs.DFSOutputStream",
                ],
            ),
            f"{HDFS_AT} is in safe mode: SafeModeException: Cannot create file/cp/offsets/7.",
            SAFE_MODE,
            id="safe-mode-unwrapped",
        ),
        pytest.param(
            from_namenode("org.apache.hadoop.ipc.StandbyException", "Operation category READ"),
            f"{HDFS_AT} answered from a standby NameNode: StandbyException: Operation category",
            "org.apache.hadoop.ipc.StandbyException",
            id="standby",
        ),
        pytest.param(
            from_namenode("org.apache.hadoop.ipc.RetriableException", "NameNode still starting"),
            f"{HDFS_AT} asked to be retried later: RetriableException: NameNode still starting",
            "org.apache.hadoop.ipc.RetriableException",
            id="retriable",
        ),
        pytest.param(
            # A DataNode lost: the NameNode finds none to write to (its class: IOException).
            from_namenode(
                "java.io.IOException",
                "File /cp/offsets/7 could only be written to 0 of the 1 minReplication nodes."
                " There are 1 datanode(s) running and 1 node(s) are excluded in this operation.",
            ),
            f"{HDFS_AT} refused the request: IOException: File /cp/offsets/7 could only be"
            " written to 0 of the 1 minReplication nodes.",
            "java.io.IOException",
            id="datanode-lost-namenode-refuses",
        ),
        pytest.param(
            Java(
                IO,
                "All datanodes [DatanodeInfoWithStorage[127.0.0.1:58866]] are bad.",
                frames=["org.apache.hadoop.hdfs.DataStreamer"],
            ),
            f"{HDFS_AT} lost the DataNodes a file was written to: IOException: All datanodes",
            "java.io.IOException",
            id="datanode-lost-mid-write",
        ),
        pytest.param(
            Java(
                ["org.apache.hadoop.hdfs.BlockMissingException", *IO],
                "Could not obtain block: BP-1:blk_1 file=/cp/metadata No live nodes contain"
                " current block",
                frames=["org.apache.hadoop.hdfs.DFSInputStream"],
            ),
            f"{HDFS_AT} has no live DataNode holding a block it needs: BlockMissingException",
            "org.apache.hadoop.hdfs.BlockMissingException",
            id="datanode-lost-read",
        ),
        pytest.param(
            s3_answer(
                "org.apache.hadoop.fs.s3a.AWSServiceThrottledException",
                503,
                "SlowDown",
                "Please reduce your request rate.",
            ),
            f"{S3_AT} answered 503 SlowDown: AWSServiceThrottledException: getFileStatus on",
            "org.apache.hadoop.fs.s3a.AWSServiceThrottledException",
            id="s3-throttled",
        ),
        pytest.param(
            s3_answer(
                "org.apache.hadoop.fs.s3a.AWSStatus500Exception",
                500,
                "InternalError",
                "We encountered an internal error.",
            ),
            f"{S3_AT} answered 500 InternalError: AWSStatus500Exception",
            "org.apache.hadoop.fs.s3a.AWSStatus500Exception",
            id="s3-500",
        ),
        pytest.param(
            # Hadoop 3.5's analytics-accelerator reader: a plain IOException around the SDK's.
            Java(
                IO,
                "Server error accessing s3://lake/raw/_cp_staging/q/_batches/0.json",
                Java(
                    S3_EXCEPTION,
                    "Please reduce your request rate. (Status Code: 503)",
                    statusCode=503,
                    awsErrorDetails=ErrorDetails("SlowDown"),
                ),
                frames=["software.amazon.s3.analyticsaccelerator.exceptions.ExceptionHandler"],
            ),
            f"{S3_AT} answered 503 SlowDown: S3Exception: Please reduce your request rate.",
            "software.amazon.awssdk.services.s3.model.S3Exception",
            id="s3-throttled-read",
        ),
        pytest.param(
            Java(
                ["java.net.ConnectException", *SOCKET],
                "getFileStatus on s3a://lake/raw/x: Unable to execute HTTP request",
                Java(
                    ["software.amazon.awssdk.core.exception.SdkClientException", *SDK],
                    "Unable to execute HTTP request: Connect to 127.0.0.1:58333 failed",
                    Java(
                        [
                            "org.apache.http.conn.HttpHostConnectException",
                            "java.net.ConnectException",
                            *SOCKET,
                        ],
                        "Connection refused",
                    ),
                ),
                frames=[
                    "jdk.internal.reflect.NativeConstructorAccessorImpl",
                    "org.apache.hadoop.fs.s3a.impl.ErrorTranslation",
                ],
            ),
            f"{S3_AT} could not be reached: ConnectException: getFileStatus on s3a://lake/raw/x",
            "java.net.ConnectException",
            id="s3-refused",
        ),
    ],
)
def test_a_store_down_or_throttling_is_transient_and_said_in_words(cause, words, type_):
    verdict = failures.classify(query_failed(cause), stores=STORES)
    assert (verdict.kind, verdict.type, verdict.condition) == (TRANSIENT, type_, "STREAM_FAILED")
    assert verdict.reason.startswith(words), verdict.reason


def test_without_the_pipelines_names_a_store_is_named_by_its_kind():
    verdict = failures.classify(query_failed(refused_namenode()))
    assert verdict.reason.startswith("HDFS could not be reached: ConnectException: ")


@pytest.mark.parametrize(
    "cause",
    [
        # A database refusing the connection: the same Java class, thrown by its driver.
        Java(
            ["java.net.ConnectException", *SOCKET],
            "Connection refused",
            frames=["sun.nio.ch.Net", "org.postgresql.core.PGStream"],
        ),
        # S3 refusing (403) or missing (404): not a store being down.
        s3_answer(
            "org.apache.hadoop.fs.s3a.AWSServiceIOException", 403, "AccessDenied", "Access Denied"
        ),
        Java(
            ["java.io.FileNotFoundException", *IO],
            "No such file: /cp/metadata",
            frames=["org.apache.hadoop.hdfs.DFSClient"],
        ),
    ],
    ids=["postgres-refused", "s3-403", "hdfs-file-not-found"],
)
def test_other_failures_are_not_said_to_be_a_stores(cause):
    verdict = failures.classify(query_failed(cause), stores=STORES)
    assert verdict.kind == TRANSIENT
    assert not verdict.reason.startswith((*STORES.values(), "HDFS ", "S3 ")), verdict
    innermost = cause
    while innermost.cause is not None:
        innermost = innermost.cause
    assert verdict.type == innermost.classes[0]  # as before: the innermost cause


@pytest.mark.parametrize(
    "java",
    [
        Java(
            ["org.apache.hadoop.security.AccessControlException", *IO],
            'Permission denied: user=spark, access=WRITE, inode="/cp":hdfs:hdfs:drwxr-xr-x',
        ),
        from_namenode(
            "org.apache.hadoop.security.AccessControlException",
            "Permission denied: user=spark, access=WRITE",
        ),
    ],
    ids=["unwrapped", "from-the-namenode"],
)
def test_hdfs_refusing_a_path_to_the_user_is_permanent(java):
    verdict = failures.classify(query_failed(java), stores=STORES)
    assert verdict.kind == PERMANENT
    assert verdict.type == "org.apache.hadoop.security.AccessControlException"
    assert verdict.reason.startswith("missing privileges: Permission denied: user=spark")


def test_a_suppressed_context_is_not_the_root_cause():
    """PySpark converts a py4j error with `raise ... from None`: the error it replaced is the
    same failure, not an innermost cause to report."""

    class Converted(Exception):
        pass

    java = Java(
        ["org.apache.spark.sql.streaming.StreamingQueryException", *IO[1:]],
        "[STREAM_FAILED] terminated",
        Java(["java.lang.IllegalStateException", *RUNTIME], "the offset log is ahead"),
    )

    def converted():
        try:
            raise JavaError(java)
        except JavaError:
            error = Converted("[STREAM_FAILED] terminated")
            error._origin = java  # as pyspark's CapturedException keeps it
            raise error from None

    verdict = failures.classify(raised(converted))
    assert verdict.type == "java.lang.IllegalStateException"
    assert verdict.reason == "IllegalStateException: the offset log is ahead"


def test_our_store_clients_error_is_said_as_a_store_failure():
    """jobs.storage against a NameNode address nobody listens on (a real StorageError)."""
    from jobs.storage import StorageSettings, storage_for
    from tests.outage_stack import free_port

    address = f"127.0.0.1:{free_port()}"
    store = storage_for(
        f"hdfs://{address}/cp", StorageSettings(hdfs_http=address, timeout=2, hdfs_user="u")
    )
    verdict = failures.classify(raised(lambda: store.read_text(f"hdfs://{address}/cp/metadata")))
    assert (verdict.kind, verdict.type) == (TRANSIENT, "jobs.storage.StorageError")
    assert verdict.reason.startswith(
        f"{failures.STORE_FAILED}: StorageError: HDFS at {address}: OPEN /cp/metadata"
    ), verdict.reason


def test_a_files_sink_that_cannot_roll_fails_with_what_it_met(tmp_path):
    """After MAX_FAILURES rolls in a row the files sink fails the run (Compactor.check): the
    failure is classified by what rolling met, S3 throttling here, not by the wrapper."""
    from types import SimpleNamespace

    from jobs.sinks.files import store as files

    name = f"roll-{uuid.uuid4().hex[:8]}"
    sink = SimpleNamespace(base="s3a://lake/raw", query="q1")
    roller = files.Compactor(sink, alive=lambda: True, pipeline=name)
    files._ROLLERS.pop(name)  # never started: nothing to stop
    throttled = s3_answer(
        "org.apache.hadoop.fs.s3a.AWSServiceThrottledException",
        503,
        "SlowDown",
        "Please reduce your request rate.",
    )
    roller.failures, roller.error = files.MAX_FAILURES, JavaError(throttled)
    error = raised(roller.check)
    assert "rolling staged files failed 5 times in a row" in str(error)
    verdict = failures.classify(error, stores=STORES)
    assert verdict.reason.startswith(f"{S3_AT} answered 503 SlowDown: "), verdict.reason


@pytest.mark.parametrize(
    ("checkpoint", "roots", "names"),
    [
        (CHECKPOINT_HDFS, ["s3a://lake/raw"], {"hdfs": HDFS_AT, "s3": S3_AT}),
        (
            "s3a://cp/orders",
            ["s3a://lake/raw"],
            {"s3": f"the checkpoint store and files sink S3 at {S3_ENDPOINT}"},
        ),
        ("/var/cp/orders", ["hdfs://nn:8020/lake"], {"hdfs": "the files sink's HDFS at nn:8020"}),
        # Two HDFS clusters: the address is in the exception's message, not guessed.
        (
            CHECKPOINT_HDFS,
            ["hdfs://other:8020/lake"],
            {"hdfs": "the checkpoint store and files sink HDFS"},
        ),
        ("/var/cp/orders", ["file:///srv/lake"], {}),
    ],
)
def test_a_pipelines_stores_are_named_by_what_it_keeps_there(checkpoint, roots, names):
    assert failures.store_names(checkpoint, roots, S3_ENDPOINT) == names


def test_a_stores_name_is_its_address_only():
    names = failures.store_names(
        "hdfs://spark@nn:8020/cp/orders", ["s3a://lake/raw"], "https://k:secret@s3.example/x"
    )
    assert names == {
        "hdfs": "the checkpoint store HDFS at nn:8020",
        "s3": "the files sink's S3 at https://s3.example",
    }


def test_the_driver_names_its_stores_in_its_verdict(tmp_path):
    """jobs/run.py's judge: the names the pipeline's query start gave (jobs.pipeline)."""
    from jobs import run
    from jobs.pipeline import store_names
    from jobs.runconfig import RunConfig
    from tests.factories import files_spec

    config = RunConfig(
        pipeline=f"named-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(files_spec()),
        kafka={},
        postgres={},
        checkpoint=CHECKPOINT_HDFS,
        run_dir=str(tmp_path),
        sink_configs=({"files": {"root": "s3a://lake/raw"}},),
        storage={
            "checkpoint_root": "hdfs://127.0.0.1:58020/controlplane/cp",
            "s3": {"endpoint": S3_ENDPOINT, "secret_key": "never-in-words"},
        },
    )
    assert store_names(config) == STORES
    failures.name_stores(config.pipeline, store_names(config))
    verdict = run.judge(query_failed(refused_namenode()), config.pipeline)
    assert verdict["reason"].startswith(f"{HDFS_AT} could not be reached: ")
    assert "never-in-words" not in json.dumps(verdict)


def test_the_exceptions_history_says_why_a_transient_failure_was_restarted():
    from controlplane.supervision import failures as supervision

    verdict = failures.classify(query_failed(refused_namenode()), stores=STORES)
    judgement = supervision.judge(verdict.as_dict(), "Connection refused", "crashed")
    assert (judgement.permanent, judgement.cause) == (False, "crashed")
    decision = supervision.decision_reason(judgement, "restart 1 of 3 (fixed-delay)")
    assert decision == f"restart 1 of 3 (fixed-delay), after a transient failure: {verdict.reason}"
    # Without the driver's words (an older driver's report): the policy's alone.
    plain = supervision.judge(None, "Connection refused", "crashed")
    assert supervision.decision_reason(plain, "restart 1 of 3") == "restart 1 of 3"


def _store_conf(spark, storage: dict):
    """A Hadoop configuration of the session's with a driver's store settings
    (jobs.hadoop.session_conf), file systems not cached: a fresh client per test."""
    from jobs import hadoop

    conf = spark._jvm.org.apache.hadoop.conf.Configuration(spark._jsc.hadoopConfiguration())
    for key, value in hadoop.session_conf(storage).items():
        if key.startswith("spark.hadoop."):
            conf.set(key.removeprefix("spark.hadoop."), value)
    conf.set("fs.hdfs.impl.disable.cache", "true")
    conf.set("fs.s3a.impl.disable.cache", "true")
    return conf


def _exists(spark, conf, uri: str) -> bool:
    path = spark._jvm.org.apache.hadoop.fs.Path(uri)
    return path.getFileSystem(conf).exists(path)


@pytest.mark.spark
def test_a_namenode_nobody_answers_for_is_said_unreachable(spark):
    """Hadoop's own client, bounded as a driver's is: refused twice, then the call fails."""
    from tests.outage_stack import free_port

    root = f"hdfs://127.0.0.1:{free_port()}/controlplane/cp"
    conf = _store_conf(spark, {"checkpoint_root": root, "timeout_seconds": 1})
    exc = raised(lambda: _exists(spark, conf, f"{root}/orders/checkpoint/metadata"))
    verdict = failures.classify(exc, stores=failures.store_names(f"{root}/orders/checkpoint"))
    assert (verdict.kind, verdict.type) == (TRANSIENT, "java.net.ConnectException")
    address = root.split("/")[2]
    assert verdict.reason.startswith(
        f"the checkpoint store HDFS at {address} could not be reached: ConnectException: "
    ), verdict.reason


@pytest.mark.spark
def test_s3_answering_503_slow_down_is_said_so(spark):
    """S3A against the S3 server through a proxy that answers 503 Slow Down; S3A's throttling
    retries are off here (a driver's take ~30 s), so the first answer is the failure."""
    from tests.s3_faults import FaultyS3
    from tests.stores import settings_for

    s3 = settings_for("s3")
    proxy = FaultyS3(s3.s3_endpoint).start()
    try:
        storage = {
            "checkpoint_root": "/var/cp",
            "s3": {
                "endpoint": proxy.endpoint,
                "access_key": s3.s3_access_key,
                "secret_key": s3.s3_secret_key,
            },
            "timeout_seconds": 2,
        }
        conf = _store_conf(spark, storage)
        conf.set("fs.s3a.retry.throttle.limit", "0")
        bucket = os.environ.get("CONTROLPLANE_S3_BUCKET") or "controlplane"
        lake = f"s3a://{bucket}/tests/slow-{uuid.uuid4().hex[:8]}"
        assert not _exists(spark, conf, f"{lake}/x")  # through the proxy: it answers
        proxy.fail()
        exc = raised(lambda: _exists(spark, conf, f"{lake}/x"))
    finally:
        proxy.close()
    verdict = failures.classify(
        exc, stores=failures.store_names("/var/cp/orders", [lake], proxy.endpoint)
    )
    assert verdict.kind == TRANSIENT
    assert verdict.type == "org.apache.hadoop.fs.s3a.AWSServiceThrottledException"
    assert verdict.reason.startswith(f"the files sink's S3 at {proxy.endpoint} answered 503"), (
        verdict.reason
    )
    assert proxy.failed >= 1
