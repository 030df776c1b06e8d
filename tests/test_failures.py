"""jobs.failures: a failure is permanent or transient by the exception's type, not its text.

The exceptions are real: raised by our own code, by psycopg against the real sink database,
and (marked `spark`) by the session-wide local Spark: an analysis error, a foreachBatch
function's exception behind Spark's wrapper, a JDBC write Postgres refuses, a Kafka read of a
topic that does not exist, a pipeline's own query whose sink table lacks a column.
"""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from jobs import failures
from jobs.failures import NO_TOPIC, PERMANENT, TRANSIENT, Verdict
from jobs.kafka.auth import SaslLoginError
from jobs.kafka.readers import ReaderError
from jobs.kafka.source import DataLossError
from jobs.pipeline import StateStoreError
from jobs.sinks.files import FileSinkError
from jobs.sinks.kafka import KafkaSinkError
from jobs.sinks.postgres import MixedWritesError
from jobs.spec import SpecError, parse_spec
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
    assert verdict["type"] == "jobs.spec.validate.SpecError"
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
    assert verdict.type == "jobs.sinks.postgres.MixedWritesError"
    assert verdict.reason == "a definition error: batch 0 was partly written directly"
    # Without it only the text of the exception is left: no verdict (the control plane
    # falls back to reading the error output).
    assert failures.classify(exc) is None


@pytest.mark.spark
def test_an_error_in_a_python_worker_gives_no_verdict(spark):
    def fail(batches):
        raise ValueError("a Python worker's error reaches the driver as text")
        yield from batches

    exc = raised(lambda: spark.range(2).mapInArrow(fail, "id long").collect())
    assert exc.getCondition() == "PYTHON_EXCEPTION"
    assert failures.classify(exc) is None


@pytest.mark.spark
def test_a_jdbc_write_postgres_refuses_is_permanent_by_its_sqlstate(spark, sink_dsn, sink_table):
    from jobs.sinks.jvm_writer import jdbc_target

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
    assert report["failure"]["type"] == "jobs.spec.validate.SpecError"
    assert not assignment.exists()
