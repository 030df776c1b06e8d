"""The schema registry away while a pipeline reads Confluent-framed Avro through it (the
suite's registry reached through a TCP forwarder of the test's own, closed and opened again:
connections refused, as when the registry is down, its data kept): writer schemas the
executors have seen keep decoding; a new schema id waits for the registry (the connection's
wait_seconds) and decodes once it is back; one it cannot get within that time fails the
batch, saying so in words. Real Kafka, Apicurio, Spark and Postgres."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import fastavro
import pytest
import requests

from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce
from tests.outage_stack import free_port
from tests.spark_helpers import drain, failure, fetch

pytestmark = [pytest.mark.spark, pytest.mark.kafka]

FORWARD = Path(__file__).resolve().parent / "drivers" / "forward.py"
V1 = {
    "type": "record",
    "name": "Delivery",
    "namespace": "acme",
    "fields": [{"name": "id", "type": "string"}],
}
V2 = {
    **V1,
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "status", "type": "string", "default": "created"},
    ],
}


class Door:
    """The registry at `target` (its URL), reached through a forwarder on a port of its own
    that can be closed (connections refused) and opened again."""

    def __init__(self, target: str):
        parts = urlsplit(target)
        self.target = f"{parts.hostname}:{parts.port}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}{parts.path}"
        self.proc: subprocess.Popen | None = None

    def open(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(FORWARD), f"127.0.0.1:{self.port}={self.target}"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
        )
        assert self.proc.stdout.readline().strip() == "ready"

    def close(self) -> None:
        if self.proc is not None:
            self.proc.terminate()
            self.proc.wait(10)
            self.proc = None


@pytest.fixture
def door():
    url = os.environ.get("CONTROLPLANE_SCHEMA_REGISTRY_URL")
    assert url, "CONTROLPLANE_SCHEMA_REGISTRY_URL is not set: run the tests with ./stack test"
    found = Door(url)
    found.open()
    try:
        yield found
    finally:
        found.close()


def register(url: str, subject: str, schema: dict) -> int:
    response = requests.post(
        f"{url}/subjects/{subject}/versions",
        json={"schema": json.dumps(schema)},
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return response.json()["id"]


def framed(schema_id: int, schema: dict, record: dict) -> bytes:
    out = io.BytesIO()
    out.write(b"\x00" + schema_id.to_bytes(4, "big"))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema), record)
    return out.getvalue()


def config(tmp_path, topic, bootstrap, sink_dsn, url, reader: dict, wait: float) -> RunConfig:
    spec = {
        "source": {
            "connection": "k",
            "topics": [topic],
            "format": "avro",
            "avro_framing": "confluent",
            "avro_schema": json.dumps(reader),
            "schema_registry": {"connection": "registry"},
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "pg", "table": f"regout_{uuid.uuid4().hex[:8]}"},
    }
    (tmp_path / "run").mkdir(parents=True, exist_ok=True)
    return RunConfig(
        pipeline=f"regout-{uuid.uuid4().hex[:8]}",
        spec=parse_spec(spec),
        kafka={"bootstrap_servers": [bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
        registry={"url": url, "auth": "none", "timeout_seconds": 2, "wait_seconds": wait},
    )


def test_seen_ids_decode_on_and_a_new_one_waits_or_fails_in_words(
    spark, kafka_bootstrap, sink_dsn, tmp_path, door
):
    topic = new_topic(kafka_bootstrap, partitions=1)
    subject = f"{topic}-value"
    registry_url = os.environ["CONTROLPLANE_SCHEMA_REGISTRY_URL"]
    v1 = register(registry_url, subject, V1)
    v2 = register(registry_url, subject, V2)
    cfg = config(tmp_path, topic, kafka_bootstrap, sink_dsn, door.url, V2, wait=20)
    table = cfg.spec.sink.table

    def ids() -> list[str]:
        return [r[0] for r in fetch(sink_dsn, f'SELECT id FROM "{table}" ORDER BY id')]

    produce(kafka_bootstrap, topic, [framed(v1, V1, {"id": f"a{i}"}) for i in range(10)], 1)
    drain(spark, cfg)
    assert len(ids()) == 10
    # The registry goes away: version 1's id was seen, and decodes on.
    door.close()
    produce(
        kafka_bootstrap, topic, [framed(v1, V1, {"id": f"b{i}"}) for i in range(10)], 1, start=10
    )
    drain(spark, cfg)
    assert len(ids()) == 20
    # Version 2's id is new: its batch waits for the registry, and reads once it is back.
    produce(kafka_bootstrap, topic, [framed(v2, V2, {"id": "c0", "status": "x"})], 1, start=20)
    reopen = threading.Timer(4, door.open)
    reopen.start()
    began = time.monotonic()
    drain(spark, cfg)
    reopen.join()
    assert time.monotonic() - began >= 4  # it waited for the registry
    assert "c0" in ids()
    # A new id the registry cannot be asked for within wait_seconds: the batch fails, in words.
    door.close()
    missing = register(registry_url, f"{topic}-other", {**V2, "name": "Other"})
    produce(kafka_bootstrap, topic, [framed(missing, V2, {"id": "d0", "status": "y"})], 1, start=21)
    short = dataclasses.replace(cfg, registry={**cfg.registry, "wait_seconds": 2})
    text = failure(spark, short)
    assert "RegistryUnavailableException" in text, text[:2000]
    assert f"did not answer for 2 s asked for schema id {missing}" in text, text[:2000]
    assert "d0" not in ids()
