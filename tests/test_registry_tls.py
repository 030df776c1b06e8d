"""A schema registry reached over TLS: the Apicurio Registry `./stack test` starts, on its HTTPS
port, with a certificate of the stack's own test CA (scripts/devstack.py test_certificates).
A connection trusting that CA (`ssl_cafile`, a file in CONTROLPLANE_CERT_DIR) tests ok; one
that does not is refused with the TLS failure in words; a spec saved through it has its
reader schema resolved, and its Avro sink's schema checked, over TLS; run in Spark, the
executors fetch each writer schema over TLS (controlplane.spark.ConfluentAvro, its PEM trust)
and the Kafka sink registers its schema over TLS, readable by Confluent's own deserializer."""

from __future__ import annotations

import json
import shutil
import uuid
from pathlib import Path

import pytest

from controlplane.connections.models import Connection
from controlplane.connections.policy import registry_connection_arguments
from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic
from tests.spark_helpers import drain
from tests.stores import required_env
from tests.test_avro_registry import V1, V2, read_avro
from tests.test_writer_schemas import produce

pytestmark = [pytest.mark.kafka, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def tls_registry(api, settings, tmp_path) -> str:
    """A schema-registry connection `secure` to the registry's TLS port, trusting the stack's
    test CA (copied into a certificate directory of the test's own); its URL."""
    url = required_env("CONTROLPLANE_SCHEMA_REGISTRY_TLS_URL", "the schema registry over TLS")
    ca = Path(required_env("CONTROLPLANE_SCHEMA_REGISTRY_CA", "the schema registry over TLS"))
    certs = tmp_path / "certs"
    certs.mkdir()
    shutil.copy(ca, certs / "registry-ca.pem")
    settings.CONTROLPLANE_CERT_DIR = str(certs)
    response = api.post(
        "/api/connections/",
        {
            "name": "secure",
            "kind": "schema-registry",
            "settings": {"url": url, "ssl_cafile": "registry-ca.pem"},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return url


def source_to_avro_sink(source: str, out: str, dead: str) -> dict:
    return {
        "source": {
            "connection": "events",
            "topics": [source],
            "format": "avro",
            "avro_framing": "confluent",
            "schema_registry": {"connection": "secure"},
            "starting_offsets": "earliest",
        },
        "sink": {
            "kind": "kafka",
            "connection": "events",
            "topic": out,
            "dead_letter_topic": dead,
            "key": "id",
            "format": "avro",
            "schema_registry": {"connection": "secure", "record": "acme.Out"},
        },
    }


def test_a_connection_trusting_the_ca_answers_over_tls_and_one_that_does_not_is_refused(
    api, tls_registry
):
    response = api.post("/api/connections/secure/test/")
    assert response.status_code == 200, response.json()
    assert response.json()["ok"] is True, response.json()
    # The same URL, trusting only the system's CAs: the certificate is not theirs.
    response = api.post(
        "/api/connections/",
        {"name": "untrusted", "kind": "schema-registry", "settings": {"url": tls_registry}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    response = api.post("/api/connections/untrusted/test/")
    assert response.status_code == 200, response.json()
    found = response.json()
    assert found["ok"] is False, found
    assert "TLS failed: the server's certificate is not trusted" in found["detail"], found
    assert "ssl_cafile" in found["detail"], found


@pytest.mark.spark
def test_a_pipeline_reads_and_writes_avro_through_a_registry_over_tls(
    api, kafka_connection, tls_registry, kafka_bootstrap, registry_url, spark, tmp_path
):
    source, out, dead = (new_topic(kafka_bootstrap, partitions=2) for _ in range(3))
    # Producers register over the plain port: the same registry, the same ids.
    produce(kafka_bootstrap, registry_url, source, V1, [{"id": f"a{i}", "n": i} for i in range(20)])
    produce(
        kafka_bootstrap,
        registry_url,
        source,
        V2,
        [{"id": f"b{i}", "n": 2**40 + i, "status": "assigned"} for i in range(20)],
    )
    body = {"name": "tls-run", "spec": source_to_avro_sink(source, out, dead)}
    response = api.post("/api/pipelines/", body, format="json")
    assert response.status_code == 201, response.json()  # resolved and gated over TLS
    saved = response.json()["spec"]
    assert saved["source"]["schema_registry"]["resolved_version"] == 2

    connection = Connection.objects.get(name="secure")
    arguments = registry_connection_arguments(connection.settings, connection.get_secrets())
    assert arguments["ca_file"].endswith("registry-ca.pem"), arguments
    (tmp_path / "run").mkdir()
    cfg = RunConfig(
        pipeline=f"tls-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(saved),
        kafka={"bootstrap_servers": [kafka_bootstrap]},
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
        registry=arguments,
        sink_configs=(
            {"kafka": {"bootstrap_servers": [kafka_bootstrap]}, "schema-registry": arguments},
        ),
    )
    drain(spark, cfg)
    read = read_avro(kafka_bootstrap, registry_url, out, 40)
    # Version 1's records read with version 2's reader: its default for the added field.
    expected = [{"id": f"a{i}", "n": i, "status": "created"} for i in range(20)]
    expected += [{"id": f"b{i}", "n": 2**40 + i, "status": "assigned"} for i in range(20)]
    assert sorted(read, key=lambda r: r["id"]) == sorted(expected, key=lambda r: r["id"])
    # Registered over TLS under the sink topic's subject.
    from jobs.registry.client import Registry

    with Registry(arguments) as registry:
        schema = json.loads(registry.version(f"{out}-value").schema)
    assert (schema["name"], schema["namespace"]) == ("Out", "acme")
