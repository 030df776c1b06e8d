"""Authenticated Kafka clients against a real broker's SASL listener: no mocks.

The local broker (scripts/devstack.py) has a SASL_PLAINTEXT listener with a test user for
SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN; `./stack` exports KAFKA_SASL_BOOTSTRAP_SERVERS,
KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD and KAFKA_SASL_MECHANISMS. With an existing cluster
(KAFKA_BOOTSTRAP_SERVERS set) they come from the environment; without them this module is
skipped, and a mechanism KAFKA_SASL_MECHANISMS does not list (default: the two SCRAM ones) is
skipped. Topics are created and deleted through the SASL listener itself.

What is proven: clients built from a stored connection (jobs.connections.kafka_client_config)
authenticate with each mechanism; the pipeline metrics' lag lookups authenticate; the
connection check succeeds, and with a wrong password fails at once saying that the login was
refused, for which user and mechanism, without the password; both Kafka readers read through
SASL and fail with the same kind of message, not a hang, on a wrong password.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest
from django.utils import timezone
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import KafkaAdminClient, NewTopic

from controlplane.observability.collector import collect
from controlplane.supervision.restarts import classify
from jobs.connections import kafka_client_config, validate_connection
from tests.waiting import wait_for

pytestmark = [pytest.mark.kafka]

ALL_MECHANISMS = ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"]


@dataclass
class SaslBroker:
    servers: list[str]
    username: str
    password: str
    mechanisms: tuple[str, ...]
    topics: list[str]

    def settings(self, mechanism: str) -> dict:
        return {
            "bootstrap_servers": self.servers,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "sasl_username": self.username,
        }

    def client_config(self, mechanism: str, password: str | None = None) -> dict:
        """kafka-python arguments, made the way the control plane makes them from a stored
        connection."""
        settings, secrets = validate_connection(
            "kafka", self.settings(mechanism), {"sasl_password": password or self.password}
        )
        return kafka_client_config(settings, secrets)

    def new_topic(self, partitions: int = 3) -> str:
        name = f"sasl-{uuid.uuid4().hex[:10]}"
        admin = KafkaAdminClient(**self.client_config(self.mechanisms[0]))
        try:
            admin.create_topics([NewTopic(name, partitions, 1)])
        finally:
            admin.close()
        self.topics.append(name)
        return name

    def produce(self, mechanism: str, topic: str, n: int, partitions: int = 3) -> list[dict]:
        values = [{"id": f"r{i}", "n": i} for i in range(n)]
        producer = KafkaProducer(**self.client_config(mechanism), linger_ms=5)
        try:
            for i, value in enumerate(values):
                producer.send(
                    topic,
                    key=str(i).encode(),
                    value=json.dumps(value).encode(),
                    partition=i % partitions,
                )
            producer.flush(timeout=30)
        finally:
            producer.close()
        return values


@pytest.fixture(scope="module")
def sasl_broker():
    servers = os.environ.get("KAFKA_SASL_BOOTSTRAP_SERVERS", "").strip()
    username = os.environ.get("KAFKA_SASL_USERNAME", "").strip()
    password = os.environ.get("KAFKA_SASL_PASSWORD", "")
    if not (servers and username and password):
        pytest.skip(
            "no SASL listener to test: KAFKA_SASL_BOOTSTRAP_SERVERS, KAFKA_SASL_USERNAME and "
            "KAFKA_SASL_PASSWORD are not all set (an existing cluster without SCRAM, or a "
            "local broker started before it had a SASL listener: `./stack stop` restarts it)"
        )
    mechanisms = os.environ.get("KAFKA_SASL_MECHANISMS", "SCRAM-SHA-256,SCRAM-SHA-512")
    broker = SaslBroker(
        servers=[s.strip() for s in servers.split(",") if s.strip()],
        username=username,
        password=password,
        mechanisms=tuple(m.strip() for m in mechanisms.split(",") if m.strip()),
        topics=[],
    )
    yield broker
    if broker.topics:
        admin = KafkaAdminClient(**broker.client_config(broker.mechanisms[0]))
        try:
            admin.delete_topics(broker.topics)
        except Exception as exc:  # tidying up must not fail the run
            logging.getLogger(__name__).warning("could not delete the SASL topics: %s", exc)
        finally:
            admin.close()


@pytest.fixture(params=ALL_MECHANISMS)
def mechanism(request, sasl_broker) -> str:
    if request.param not in sasl_broker.mechanisms:
        pytest.skip(f"{request.param} is not in KAFKA_SASL_MECHANISMS")
    return request.param


def wrong_password() -> str:
    return f"wrong-{uuid.uuid4().hex[:12]}"


def assert_clear_refusal(text: str, broker: SaslBroker, mechanism: str, wrong: str) -> None:
    """Says the login was refused, for which user and mechanism; shows no password."""
    assert "authentication failed" in text.lower(), text
    assert mechanism in text, text
    assert wrong not in text, text
    assert broker.password not in text, text


# -- clients ----------------------------------------------------------------------------------


def test_clients_built_from_a_connection_produce_and_consume_with_each_mechanism(
    sasl_broker, mechanism
):
    topic = sasl_broker.new_topic(partitions=2)
    sent = sasl_broker.produce(mechanism, topic, 40, partitions=2)
    consumer = KafkaConsumer(
        **sasl_broker.client_config(mechanism),
        enable_auto_commit=False,
        auto_offset_reset="earliest",
    )
    try:
        consumer.assign([TopicPartition(topic, 0), TopicPartition(topic, 1)])
        got = []

        def read_all() -> bool:
            for records in consumer.poll(timeout_ms=500).values():
                got.extend(json.loads(r.value) for r in records)
            return len(got) >= len(sent)

        wait_for(read_all, 30, every=0)  # each poll waits up to 0.5 s for records
    finally:
        consumer.close()
    assert sorted(got, key=lambda v: v["n"]) == sent


def test_a_client_with_a_wrong_password_is_refused_at_once(sasl_broker, mechanism):
    """kafka-python alone would retry until its bootstrap timeout and say only "Unable to
    bootstrap": the metadata consumer every lookup uses says what was refused, at once."""
    from jobs.kafka.auth import SaslLoginError
    from jobs.kafka.metadata import metadata_consumer

    wrong = wrong_password()
    started = time.monotonic()
    with pytest.raises(SaslLoginError) as refused:
        metadata_consumer(sasl_broker.client_config(mechanism, wrong))
    assert time.monotonic() - started < 5
    assert_clear_refusal(str(refused.value), sasl_broker, mechanism, wrong)
    assert repr(sasl_broker.username) in str(refused.value)


def test_the_login_check_leaves_an_unreachable_cluster_to_the_client():
    """No broker to ask: not a refusal (the client retries, and reports that itself)."""
    from jobs.kafka.auth import check_sasl_login

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    config = {
        "bootstrap_servers": [dead],
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "someone",
        "sasl_plain_password": "not-asked",
    }
    check_sasl_login(config, timeout=2)  # returns: nothing was refused


def test_a_sasl_connection_without_a_password_says_so():
    from jobs.kafka.auth import SaslLoginError, check_sasl_login

    settings, secrets = validate_connection(
        "kafka",
        {
            "bootstrap_servers": ["127.0.0.1:9"],
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "SCRAM-SHA-512",
            "sasl_username": "someone",
        },
        {},
    )
    with pytest.raises(SaslLoginError) as refused:
        check_sasl_login(kafka_client_config(settings, secrets))
    assert "'someone' with SASL SCRAM-SHA-512" in str(refused.value)
    assert "no sasl_password secret" in str(refused.value)


# -- the control plane: connection check, lag ----------------------------------------------------


def create_connection(api, name: str, broker: SaslBroker, mechanism: str, password: str):
    response = api.post(
        "/api/connections/",
        {
            "name": name,
            "kind": "kafka",
            "settings": broker.settings(mechanism),
            "secrets": {"sasl_password": password},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()


def test_the_connection_check_logs_in_and_reports_a_wrong_password_clearly(
    sasl_broker, mechanism, api
):
    topic = sasl_broker.new_topic(partitions=1)
    create_connection(api, "secured", sasl_broker, mechanism, sasl_broker.password)
    body = api.post("/api/connections/secured/test/").json()
    assert body["ok"] is True, body
    assert topic in body["topics"]

    wrong = wrong_password()
    response = api.patch(
        "/api/connections/secured/", {"secrets": {"sasl_password": wrong}}, format="json"
    )
    assert response.status_code == 200, response.json()
    body = api.post("/api/connections/secured/test/").json()
    assert body["ok"] is False
    detail = body["detail"]
    assert_clear_refusal(detail, sasl_broker, mechanism, wrong)
    assert repr(sasl_broker.username) in detail
    assert "Timeout" not in detail and "bootstrap" not in detail
    # At once: the broker's refusal, not the end of the connection test's timeout.
    assert body["latency_ms"] < 5000, body
    # The audit log keeps the same answer, as safe.
    audit = api.get("/api/audit/?connection=secured").json()
    entries = audit["results"] if isinstance(audit, dict) else audit
    text = json.dumps(entries)
    assert "authentication failed" in text
    assert wrong not in text and sasl_broker.password not in text


@pytest.fixture
def pooled_lookups():
    """The metrics' pooled Kafka consumers are closed after the test: they would go on
    asking for this module's topics once they are deleted."""
    from controlplane.observability import kafka_lookups

    yield
    kafka_lookups.close_all()


def test_the_lag_lookups_authenticate(
    sasl_broker, mechanism, api, postgres_connection, settings, tmp_path, pooled_lookups
):
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    topic = sasl_broker.new_topic(partitions=3)
    create_connection(api, "secured", sasl_broker, mechanism, sasl_broker.password)
    spec = {
        "source": {
            "connection": "secured",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": f"s_{topic.replace('-', '_')}"},
    }
    response = api.post("/api/pipelines/", {"name": "secured", "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    sasl_broker.produce(mechanism, topic, 30)

    collect(timezone.now())
    lag = api.get("/api/pipelines/secured/metrics/").json()["lag"]
    assert lag["error"] is None, lag
    assert lag["records"] == 30  # never started: everything in the topic is still to be read
    assert [(p["partition"], p["end"]) for p in lag["partitions"]] == [(0, 10), (1, 10), (2, 10)]

    wrong = wrong_password()
    response = api.patch(
        "/api/connections/secured/", {"secrets": {"sasl_password": wrong}}, format="json"
    )
    assert response.status_code == 200, response.json()
    started = time.monotonic()
    collect(timezone.now())
    assert time.monotonic() - started < 5  # a refused login costs the round no wait
    lag = api.get("/api/pipelines/secured/metrics/").json()["lag"]
    assert lag["records"] is None
    assert_clear_refusal(lag["error"], sasl_broker, mechanism, wrong)


# -- the Spark readers ----------------------------------------------------------------------------

READERS = ["spark-kafka", "python"]


def run_config(tmp_path: Path, broker: SaslBroker, topic: str, reader: str, password: str):
    from jobs.runconfig import RunConfig
    from jobs.spec import parse_spec

    spec = {
        "source": {
            "connection": "secured",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
            "max_records_per_batch": 50,
            "reader": reader,
        },
        "sink": {"connection": "pg", "table": "unused"},
    }
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"p-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka=broker.client_config("SCRAM-SHA-256", password),
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(run_dir),
    )


def read_available(spark, config, name: str):
    """Everything in the topic now, into a memory table, through the pipeline's own source
    (jobs.pipeline.source_frame); the finished query."""
    from jobs.source import register_sources, source_frame

    register_sources(spark)
    query = (
        source_frame(spark, config)
        .writeStream.format("memory")
        .queryName(name)
        .outputMode("append")
        .option("checkpointLocation", config.checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    finished = query.awaitTermination(120)
    if not finished:
        query.stop()
    assert finished, "the query neither finished nor failed within 120 s"
    return query


@pytest.mark.spark
@pytest.mark.parametrize("reader", READERS)
def test_the_readers_read_through_sasl(sasl_broker, spark, tmp_path, reader):
    if "SCRAM-SHA-256" not in sasl_broker.mechanisms:
        pytest.skip("SCRAM-SHA-256 is not in KAFKA_SASL_MECHANISMS")
    topic = sasl_broker.new_topic(partitions=3)
    sent = sasl_broker.produce("SCRAM-SHA-256", topic, 120)
    name = f"sasl_{reader.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    config = run_config(tmp_path, sasl_broker, topic, reader, sasl_broker.password)
    query = read_available(spark, config, name)
    assert query.exception() is None, query.exception()
    values = [json.loads(r.value) for r in spark.table(name).collect()]
    assert sorted(values, key=lambda v: v["n"]) == sent
    assert_password_not_shown(spark, query, sasl_broker.password)


@pytest.mark.spark
def test_the_connector_s_options_are_masked_in_the_plan(sasl_broker, spark, tmp_path):
    """The source's plan lists its options (the UI's SQL tab, the event log, explain()): the
    JAAS config, which holds the password, is shown masked."""
    from jobs.source import source_frame

    topic = sasl_broker.new_topic(partitions=1)
    config = run_config(tmp_path, sasl_broker, topic, "spark-kafka", sasl_broker.password)
    plan = source_frame(spark, config)._jdf.queryExecution().toString()
    assert "kafka.sasl.jaas.config" in plan, plan
    assert "redacted" in plan, plan
    assert sasl_broker.password not in plan


def assert_password_not_shown(spark, query, password: str) -> None:
    """Where a Spark application shows its sources: the configuration (the UI's environment
    page), the query's plans (the SQL tab, the event log) and its progress reports."""
    shown = [
        repr(spark.sparkContext.getConf().getAll()),
        json.dumps(query.recentProgress, default=str),
    ]
    execution = query._jsq.streamingQuery().lastExecution()
    if execution is not None:
        shown += [execution.toString(), execution.executedPlan().toString()]
    for text in shown:
        assert password not in text


@pytest.mark.spark
@pytest.mark.parametrize("reader", READERS)
def test_the_readers_fail_clearly_on_a_wrong_password(sasl_broker, spark, tmp_path, reader):
    if "SCRAM-SHA-256" not in sasl_broker.mechanisms:
        pytest.skip("SCRAM-SHA-256 is not in KAFKA_SASL_MECHANISMS")
    topic = sasl_broker.new_topic(partitions=1)
    sasl_broker.produce("SCRAM-SHA-256", topic, 5, partitions=1)
    wrong = wrong_password()
    name = f"sasl_bad_{reader.replace('-', '_')}_{uuid.uuid4().hex[:6]}"
    config = run_config(tmp_path, sasl_broker, topic, reader, wrong)
    try:
        query = read_available(spark, config, name)
    except Exception as exc:  # refused while the query was being set up
        error = str(exc)
    else:
        assert query.exception() is not None, "the query read with a wrong password"
        error = str(query.exception())
    assert_clear_refusal(error, sasl_broker, "SCRAM-SHA-256", wrong)
    # The supervisor's reading of the driver's error: a permanent failure, not retried.
    assert classify(error) == "bad credentials"
