"""Which reader a pipeline runs and what Spark's connector is told: pure logic, no Kafka."""

from __future__ import annotations

import json

import pytest

from jobs.kafka import readers
from jobs.kafka.readers import Pin, ReaderError
from jobs.spec import SpecError, parse_spec

SPARK, PY = readers.SPARK_KAFKA, readers.PYTHON


@pytest.mark.parametrize(
    ("requested", "pinned", "connector", "expected"),
    [
        (None, None, True, SPARK),  # the default, where the connector is installed
        (None, None, False, PY),  # ... and where it is not
        (PY, None, True, PY),
        (SPARK, None, True, SPARK),
        (None, Pin(PY), True, PY),  # a checkpoint keeps its reader
        (None, Pin(SPARK, 4), True, SPARK),
        (PY, Pin(PY), True, PY),
    ],
)
def test_choose(requested, pinned, connector, expected):
    assert readers.choose(requested, pinned, connector) == expected


def test_a_checkpoint_is_never_read_on_by_the_other_reader():
    with pytest.raises(ReaderError, match=r"source\.reader: .*started by the python reader"):
        readers.choose(SPARK, Pin(PY), True)
    with pytest.raises(ReaderError, match=r"started by the spark-kafka reader"):
        readers.choose(PY, Pin(SPARK, 2), True)


def test_spark_kafka_without_the_connector_is_a_clear_error():
    with pytest.raises(ReaderError, match="spark-sql-kafka-0-10"):
        readers.choose(SPARK, None, False)
    with pytest.raises(ReaderError, match="spark-sql-kafka-0-10"):
        readers.choose(None, Pin(SPARK, 2), False)


def test_a_replayed_batch_is_cut_as_it_was_then_the_new_cut_applies():
    pinned = Pin(SPARK, 2)
    kept = readers.decide(None, 8, pinned, connector=True, replay_pending=True)
    assert kept == pinned
    assert readers.decide(None, 8, pinned, connector=True, replay_pending=False) == Pin(SPARK, 8)
    assert readers.decide(None, 8, Pin(PY), connector=True, replay_pending=True) == Pin(PY, 8)
    assert readers.decide(None, 8, Pin(PY, 3), connector=True, replay_pending=True) == Pin(PY, 3)
    assert readers.decide(None, 8, Pin(PY, 3), connector=True, replay_pending=False) == Pin(PY, 8)


def test_pins_are_kept_beside_the_checkpoint(tmp_path):
    checkpoint = tmp_path / "checkpoint"
    assert readers.read_pin(checkpoint) is None
    readers.write_pin(checkpoint, Pin(SPARK, 3))
    assert readers.read_pin(checkpoint) == Pin(SPARK, 3)


def test_a_checkpoint_from_before_pins_was_written_by_the_python_reader(tmp_path):
    (tmp_path / "offsets").mkdir()
    assert readers.read_pin(tmp_path) is None  # started, no batch planned yet
    (tmp_path / "offsets" / "0").write_text("v1\n{}\n{}")
    assert readers.read_pin(tmp_path) == Pin(PY)


def test_replay_pending_compares_the_offset_and_commit_logs(tmp_path):
    assert not readers.replay_pending(tmp_path)
    (tmp_path / "offsets").mkdir()
    (tmp_path / "commits").mkdir()
    (tmp_path / "offsets" / "0").write_text("")
    assert readers.replay_pending(tmp_path)
    (tmp_path / "commits" / "0").write_text("")
    assert not readers.replay_pending(tmp_path)
    (tmp_path / "offsets" / ".1.tmp").write_text("")  # not a batch
    assert not readers.replay_pending(tmp_path)


def test_per_partition_starting_offsets_name_every_partition():
    got = readers.starting_offsets_json({"a": {"1": 42}}, [("a", 0), ("a", 1), ("b", 0)])
    assert json.loads(got) == {"a": {"0": -2, "1": 42}, "b": {"0": -2}}


def test_spark_options_map_every_spec_option():
    options = readers.spark_kafka_options(
        {"bootstrap_servers": ["k1:9092", "k2:9092"], "client_id": "cp"},
        topics=("a", "b"),
        starting="earliest",
        starting_timestamp_ms=None,
        max_records_per_batch=5000,
        fail_on_data_loss=False,
        min_partitions=6,
    )
    assert options == {
        "kafka.bootstrap.servers": "k1:9092,k2:9092",
        "kafka.security.protocol": "PLAINTEXT",
        "kafka.client.id": "cp",
        "kafka.fetch.max.wait.ms": "10",
        "kafka.max.poll.records": "20000",
        "subscribe": "a,b",
        "maxOffsetsPerTrigger": "5000",
        "failOnDataLoss": "false",
        "minPartitions": "6",
        "includeHeaders": "false",
        "startingOffsets": "earliest",
    }
    by_time = readers.spark_kafka_options(
        {"bootstrap_servers": ["k:1"]},
        topics=("a",),
        starting=None,
        starting_timestamp_ms=1_700_000_000_000,
        max_records_per_batch=1,
        fail_on_data_loss=True,
        min_partitions=1,
    )
    assert by_time["startingTimestamp"] == "1700000000000"
    assert by_time["startingOffsetsByTimestampStrategy"] == "latest"
    assert "startingOffsets" not in by_time


@pytest.mark.parametrize(
    ("mechanism", "module"),
    [
        ("PLAIN", "org.apache.kafka.common.security.plain.PlainLoginModule"),
        ("SCRAM-SHA-256", "org.apache.kafka.common.security.scram.ScramLoginModule"),
        ("SCRAM-SHA-512", "org.apache.kafka.common.security.scram.ScramLoginModule"),
    ],
)
def test_sasl_becomes_a_jaas_config_with_quotes_escaped(mechanism, module):
    props = readers.java_client_options(
        {
            "bootstrap_servers": ["k:1"],
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": mechanism,
            "sasl_plain_username": 'al"ice',
            "sasl_plain_password": 'p\\w"d;',
        }
    )
    assert props["sasl.mechanism"] == mechanism
    assert props["sasl.jaas.config"] == (
        f'{module} required username="al\\"ice" password="p\\\\w\\"d;";'
    )


def test_tls_files_are_passed_as_pem_text(tmp_path):
    ca, cert, key = (tmp_path / n for n in ("ca.pem", "cert.pem", "key.pem"))
    ca.write_text("-----BEGIN CERTIFICATE-----\nCA\n-----END CERTIFICATE-----\n")
    cert.write_text("-----BEGIN CERTIFICATE-----\nME\n-----END CERTIFICATE-----\n")
    key.write_text(
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nK\n-----END ENCRYPTED PRIVATE KEY-----\n"
    )
    props = readers.java_client_options(
        {
            "bootstrap_servers": ["k:1"],
            "security_protocol": "SSL",
            "ssl_cafile": str(ca),
            "ssl_certfile": str(cert),
            "ssl_keyfile": str(key),
            "ssl_password": "kp",
            "ssl_check_hostname": False,
        }
    )
    assert props["ssl.truststore.type"] == props["ssl.keystore.type"] == "PEM"
    assert props["ssl.truststore.certificates"] == ca.read_text()
    assert props["ssl.keystore.certificate.chain"] == cert.read_text()
    assert props["ssl.keystore.key"] == key.read_text()
    assert props["ssl.key.password"] == "kp"
    assert props["ssl.endpoint.identification.algorithm"] == ""
    assert not any(str(tmp_path) in v for v in props.values())


def test_the_redaction_pattern_covers_every_secret_option():
    import re

    pattern = re.compile(readers.OPTIONS_REDACTION_REGEX)
    for option in ("kafka.sasl.jaas.config", "kafka.ssl.key.password", "kafka.ssl.keystore.key"):
        assert pattern.search(option), option
    assert not pattern.search("kafka.bootstrap.servers")


def test_spec_reader_and_min_partitions():
    base = {
        "source": {"connection": "k", "topics": ["t"], "schema": "id STRING"},
        "sink": {"connection": "pg", "table": "t"},
    }
    spec = parse_spec(base)
    assert spec.source.reader is None and spec.source.min_partitions is None
    base["source"].update(reader="spark-kafka", min_partitions=4)
    assert parse_spec(base).source.min_partitions == 4
    base["source"].update(reader="jvm", min_partitions=0)
    with pytest.raises(SpecError) as err:
        parse_spec(base)
    assert set(err.value.as_dict()) == {"source.reader", "source.min_partitions"}
