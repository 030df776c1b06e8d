"""A fleet's plan carries the schema-registry checks of its pipelines (against the real
registry `./stack test` starts): a Kafka sink's Avro schema its subject's rule refuses is a
refusal at the file's path; one it allows is planned with what it was checked against."""

from __future__ import annotations

import uuid

import pytest

from tests.stores import registry_url
from tests.test_sink_schema_gate import V1, register

pytestmark = [pytest.mark.kafka, pytest.mark.django_db]

FILES = """
apiVersion: controlplane/v1
kind: Connection
name: events
spec: {kind: kafka, settings: {bootstrap_servers: ["kafka-1:9092"]}}
---
apiVersion: controlplane/v1
kind: Connection
name: registry
spec: {kind: schema-registry, settings: {url: "REGISTRY"}}
---
apiVersion: controlplane/v1
kind: Pipeline
name: to-avro
spec:
  source: {kind: kafka, connection: events, topics: [gate-in], format: json, schema: "COLUMNS"}
  sink:
    kind: kafka
    connection: events
    topic: TOPIC
    format: avro
    schema_registry: {connection: registry}
"""


def files(topic: str, columns: str) -> dict:
    text = FILES.replace("REGISTRY", registry_url()).replace("TOPIC", topic)
    return {"fleet/avro.yaml": text.replace("COLUMNS", columns)}


def test_the_plan_carries_the_sink_schema_gate(api):
    topic = f"gate-{uuid.uuid4().hex[:12]}"
    subject = f"{topic}-value"
    register(subject, V1)  # a run wrote (id, n) under the registry's rule, BACKWARD
    body = {"fleet": "avro", "files": files(topic, "id STRING, n BIGINT, extra STRING")}
    refused = api.post("/api/apply/", body, format="json")
    assert refused.status_code == 400
    entry = next(o for o in refused.json()["objects"] if o["name"] == "to-avro")
    assert [e["path"] for e in entry["errors"]] == ["spec.sink.schema_registry"]
    assert "field extra: the reader has no default" in entry["errors"][0]["message"]
    body = {"fleet": "avro", "files": files(topic, "id STRING, n BIGINT")}
    planned = api.post("/api/apply/", body, format="json")
    assert planned.status_code == 200, planned.json()
    entry = next(o for o in planned.json()["objects"] if o["name"] == "to-avro")
    assert entry["schemas"] == {
        "sink.schema_registry": {
            "subject": subject,
            "checked": "against the subject's versions, when saved",
        }
    }
