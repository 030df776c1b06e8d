"""The schema registry of `./stack test` (scripts/devstack.py's Registry: Apicurio Registry 3.3
on loopback, started once per run beside HDFS, the S3 server and Cassandra), reached through
its Confluent REST API (`/apis/ccompat/v7`, CONTROLPLANE_SCHEMA_REGISTRY_URL) with requests: a
real registry, so schemas get ids and versions and compatibility rules refuse what they should.

Each test registers under a subject of its own (a uuid): the registry keeps everything in
memory for the run, and other tests share it."""

from __future__ import annotations

import importlib.util
import json
import sys
import uuid
from pathlib import Path

import pytest
import requests

from tests.stores import registry_url

ROOT = Path(__file__).resolve().parent.parent
CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"

DELIVERY_V1 = {
    "type": "record",
    "name": "Delivery",
    "namespace": "controlplane.test",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "status", "type": "string"},
    ],
}
# BACKWARD compatible with v1: the new field has a default, so v2 reads v1's records.
DELIVERY_V2 = {
    **DELIVERY_V1,
    "fields": [
        *DELIVERY_V1["fields"],
        {"name": "courier", "type": ["null", "string"], "default": None},
    ],
}
# Not BACKWARD compatible with v2: a new field without a default cannot be read from v2's
# records.
DELIVERY_V3 = {
    **DELIVERY_V2,
    "fields": [*DELIVERY_V2["fields"], {"name": "weight_grams", "type": "long"}],
}


def call(method: str, path: str, body: dict | None = None) -> requests.Response:
    return requests.request(
        method,
        registry_url() + path,
        data=None if body is None else json.dumps(body),
        headers={"Content-Type": CONTENT_TYPE, "Accept": CONTENT_TYPE},
        timeout=10,
    )


def ok(answer: requests.Response) -> object:
    assert answer.status_code == 200, (answer.status_code, answer.text)
    return answer.json()


def register(subject: str, schema: dict) -> requests.Response:
    return call("POST", f"/subjects/{subject}/versions", {"schema": json.dumps(schema)})


@pytest.fixture
def subject() -> str:
    return f"test-{uuid.uuid4().hex[:12]}-value"


def test_a_schema_is_read_back_by_id_and_by_version(subject):
    schema_id = ok(register(subject, DELIVERY_V1))["id"]
    assert isinstance(schema_id, int)

    by_id = ok(call("GET", f"/schemas/ids/{schema_id}"))
    assert json.loads(by_id["schema"]) == DELIVERY_V1
    assert subject in ok(call("GET", "/subjects"))
    assert ok(call("GET", f"/subjects/{subject}/versions")) == [1]
    for version in ("1", "latest"):
        found = ok(call("GET", f"/subjects/{subject}/versions/{version}"))
        assert (found["subject"], found["version"], found["id"]) == (subject, 1, schema_id)
        assert json.loads(found["schema"]) == DELIVERY_V1
    # The same schema again is the same version and id, not a new one.
    assert ok(register(subject, DELIVERY_V1))["id"] == schema_id
    assert ok(call("GET", f"/subjects/{subject}/versions")) == [1]


def test_backward_compatibility_takes_a_default_and_refuses_a_field_without_one(subject):
    # Confluent's registry answers {"compatibility": ...}; Apicurio adds "normalize": false.
    assert (
        ok(call("PUT", f"/config/{subject}", {"compatibility": "BACKWARD"}))["compatibility"]
        == "BACKWARD"
    )
    assert ok(call("GET", f"/config/{subject}"))["compatibilityLevel"] == "BACKWARD"
    first = ok(register(subject, DELIVERY_V1))["id"]
    second = ok(register(subject, DELIVERY_V2))["id"]
    assert second != first
    latest = ok(call("GET", f"/subjects/{subject}/versions/latest"))
    assert (latest["version"], latest["id"]) == (2, second)

    check = f"/compatibility/subjects/{subject}/versions/latest"
    assert ok(call("POST", check, {"schema": json.dumps(DELIVERY_V2)}))["is_compatible"] is True
    refused = ok(call("POST", check, {"schema": json.dumps(DELIVERY_V3)}))
    assert refused["is_compatible"] is False, refused

    answer = register(subject, DELIVERY_V3)
    assert answer.status_code == 409, (answer.status_code, answer.text)
    assert ok(call("GET", f"/subjects/{subject}/versions")) == [1, 2]


def test_the_stacks_registry_checks_backward_compatibility_by_default(subject):
    """./stack sets the global level at start (Apicurio's own default checks nothing)."""
    assert ok(call("GET", "/config"))["compatibilityLevel"] == "BACKWARD"
    ok(register(subject, DELIVERY_V2))

    answer = register(subject, DELIVERY_V3)

    assert answer.status_code == 409, (answer.status_code, answer.text)


# --- finding a Java 21+ (no registry needed) ------------------------------------------------


@pytest.fixture(scope="module")
def devstack():
    spec = importlib.util.spec_from_file_location(
        "devstack_registry", ROOT / "scripts" / "devstack.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def fake_java_home(path: Path, version: str) -> Path:
    """A directory that looks like a Java home of `version` (its `release` file says so)."""
    java = path / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text("#!/bin/sh\nexit 1\n")
    java.chmod(0o755)
    (path / "release").write_text(f'IMPLEMENTOR="test"\nJAVA_VERSION="{version}"\n')
    return path


def test_the_java_named_by_controlplane_java21_home_is_used(devstack, tmp_path, monkeypatch):
    home = fake_java_home(tmp_path / "jdk-25", "25.0.3")
    monkeypatch.setenv("CONTROLPLANE_JAVA21_HOME", str(home))

    assert devstack.find_java(21, "the registry") == home / "bin" / "java"


def test_a_java_older_than_21_is_refused_saying_what_to_do(devstack, tmp_path, monkeypatch):
    home = fake_java_home(tmp_path / "jdk-17", "17.0.15")
    monkeypatch.setenv("CONTROLPLANE_JAVA21_HOME", str(home))

    with pytest.raises(devstack.StackError, match=r"is Java 17; the registry needs Java 21"):
        devstack.find_java(21, "the registry")


def test_without_any_java_21_the_error_says_what_to_install(devstack, tmp_path, monkeypatch):
    fake_java_home(tmp_path / "jvm" / "jdk-17", "17.0.15")
    fake_java_home(tmp_path / "jvm" / "jdk-11", "11.0.2")
    for variable in ("CONTROLPLANE_JAVA21_HOME", "JAVA21_HOME", "JAVA_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setattr(devstack, "JAVA_SEARCH", (str(tmp_path / "jvm" / "*"),))

    with pytest.raises(devstack.StackError) as refused:
        devstack.find_java(21, "the registry")

    message = str(refused.value)
    assert "Java 17 at" in message and "Java 11 at" in message, message
    assert "CONTROLPLANE_JAVA21_HOME" in message and "adoptium" in message, message


def test_the_newest_java_of_the_usual_places_is_taken(devstack, tmp_path, monkeypatch):
    fake_java_home(tmp_path / "jvm" / "jdk-17", "17.0.15")
    fake_java_home(tmp_path / "jvm" / "jdk-21", "21.0.9")
    newest = fake_java_home(tmp_path / "jvm" / "jdk-25", "25.0.3")
    for variable in ("CONTROLPLANE_JAVA21_HOME", "JAVA21_HOME", "JAVA_HOME"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    monkeypatch.setattr(devstack, "JAVA_SEARCH", (str(tmp_path / "jvm" / "*"),))

    assert devstack.find_java(21, "the registry") == newest / "bin" / "java"
