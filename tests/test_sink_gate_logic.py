"""The Kafka sink's schema gate without a registry (controlplane.definitions.schemas): which
versions each compatibility rule checks the output's Avro schema against and in which
direction (BACKWARD: it reads the latest; FORWARD: the latest reads it; FULL: both; the
transitive rules: every version, the MAX_VERSIONS newest; NONE: none), what passes (a schema
the subject has, a subject without versions), the reasons in words, when the value's type is
known on save, the errors at the sink's field, and the preflight's word on it. Registries
here are fakes that answer as Confluent's API does and count what they are asked."""

from __future__ import annotations

import copy
import json

import pytest

from controlplane.definitions import preflight, schemas
from jobs.registry import spark_avro
from jobs.registry.client import NotFound, Refused, Unreachable, Version
from jobs.spec import SpecError, parse_spec
from jobs.spec.ddl import parse_schema


def spark_schema(ddl: str, record: str | None = None) -> dict:
    """The Avro schema Spark writes a sink's values with when the source's columns are
    `ddl` (the port's, checked against Spark in tests/test_spark_avro_port.py)."""
    name, namespace = spark_avro.record_name(record)
    return spark_avro.to_avro_type(
        spark_avro.as_nullable(parse_schema(ddl)), False, name, namespace
    )


V1 = spark_schema("id STRING, n BIGINT")
ADDED = spark_schema("id STRING, n BIGINT, extra STRING")  # a column more, no default
DROPPED = spark_schema("id STRING")  # n no longer written
NARROWED = spark_schema("id STRING, n INT")  # long written, read as int


class FakeRegistry:
    """A subject's versions (number -> schema), its rule, and what it was asked."""

    def __init__(self, versions: dict[int, dict] | None, level: str = "BACKWARD"):
        self.versions_ = versions
        self.level = level
        self.asked: list[tuple] = []

    def lookup(self, subject: str, schema: str) -> Version | None:
        self.asked.append(("lookup", subject))
        for number, registered in (self.versions_ or {}).items():
            if registered == json.loads(schema):  # the registry compares schemas, not text
                return Version(subject, number, 100 + number, json.dumps(registered))
        return None

    def versions(self, subject: str) -> list[int]:
        self.asked.append(("versions", subject))
        if self.versions_ is None:
            raise NotFound(f"GET /subjects/{subject}/versions: 404")
        return sorted(self.versions_)

    def compatibility_level(self, subject: str | None = None) -> str:
        self.asked.append(("config", subject))
        return self.level

    def version(self, subject: str, version: int | str = "latest") -> Version:
        number = max(self.versions_) if version == "latest" else int(version)
        self.asked.append(("version", number))
        return Version(subject, number, 100 + number, json.dumps(self.versions_[number]))

    def fetched(self) -> list[int]:
        return [a[1] for a in self.asked if a[0] == "version"]


def test_a_new_subject_and_a_registered_schema_pass_without_the_rule():
    registry = FakeRegistry(None)
    assert schemas.sink_problems(registry, "out-value", ADDED) == []
    assert ("config", "out-value") not in registry.asked  # nothing to be compatible with
    registry = FakeRegistry({})
    assert schemas.sink_problems(registry, "out-value", ADDED) == []
    # ADDED is version 1 (an earlier run registered it), whatever the versions after it.
    registry = FakeRegistry({1: ADDED, 2: V1}, "FULL_TRANSITIVE")
    assert schemas.sink_problems(registry, "out-value", ADDED) == []
    assert registry.fetched() == []


def test_backward_the_new_schema_reads_the_latest_version_only():
    registry = FakeRegistry({1: DROPPED, 2: V1})
    [message] = schemas.sink_problems(registry, "out-value", ADDED)
    assert message == (
        "the output's Avro schema breaks the compatibility rule BACKWARD of subject"
        " 'out-value': it cannot read what version 2 wrote: field extra: the reader has no"
        " default for it, and the writer does not write it"
    )
    assert registry.fetched() == [2]
    assert schemas.sink_problems(FakeRegistry({1: V1}), "out-value", DROPPED) == []
    [message] = schemas.sink_problems(FakeRegistry({1: V1}), "out-value", NARROWED)
    assert message.endswith(
        "it cannot read what version 1 wrote: n: written as long, which no branch of the"
        " reader's a union of int, null can read"
    )
    # An older version it cannot read is no matter under BACKWARD...
    assert schemas.sink_problems(FakeRegistry({1: DROPPED, 2: ADDED}), "s", V1) == []
    # ... and is under BACKWARD_TRANSITIVE.
    registry = FakeRegistry({1: DROPPED, 2: ADDED}, "backward_transitive")
    [message] = schemas.sink_problems(registry, "s", V1)
    assert "rule BACKWARD_TRANSITIVE" in message
    assert "it cannot read what version 1 wrote: field n: the reader has no default" in message
    assert registry.fetched() == [1, 2]


def test_forward_the_latest_version_reads_the_new_schema():
    registry = FakeRegistry({1: V1}, "FORWARD")
    [message] = schemas.sink_problems(registry, "out-value", DROPPED)
    assert message == (
        "the output's Avro schema breaks the compatibility rule FORWARD of subject"
        " 'out-value': version 1 cannot read what it writes: field n: the reader has no"
        " default for it, and the writer does not write it"
    )
    assert schemas.sink_problems(FakeRegistry({1: V1}, "FORWARD"), "s", ADDED) == []
    # FORWARD checks the latest version only; FORWARD_TRANSITIVE every one.
    replaced = spark_schema("id STRING, other STRING")  # n gone, a column added
    assert schemas.sink_problems(FakeRegistry({1: V1, 2: DROPPED}, "FORWARD"), "s", replaced) == []
    registry = FakeRegistry({1: V1, 2: DROPPED}, "FORWARD_TRANSITIVE")
    found = schemas.sink_problems(registry, "s", replaced)
    assert [m.split(": ", 2)[1] for m in found] == ["version 1 cannot read what it writes"]
    assert "field n: the reader has no default" in found[0]
    assert registry.fetched() == [1, 2]


def test_full_checks_both_ways_and_the_transitive_rules_at_most_the_newest_versions(
    monkeypatch,
):
    # An added column: FULL's backward half refuses it (the new schema has no default for
    # it), its forward half takes it (version 1 skips it).
    found = schemas.sink_problems(FakeRegistry({1: V1}, "FULL"), "s", ADDED)
    assert len(found) == 1 and "it cannot read what version 1 wrote" in found[0]
    found = schemas.sink_problems(FakeRegistry({1: V1}, "FULL"), "s", DROPPED)
    assert len(found) == 1 and "version 1 cannot read what it writes" in found[0]
    found = schemas.sink_problems(FakeRegistry({1: V1}, "FULL"), "s", NARROWED)
    # int is read as long, long not as int: only the backward half breaks.
    assert [m.split(": ", 2)[1] for m in found] == ["it cannot read what version 1 wrote"]
    monkeypatch.setattr(schemas, "MAX_VERSIONS", 3)
    registry = FakeRegistry({n: ADDED for n in range(1, 8)}, "FULL_TRANSITIVE")
    found = schemas.sink_problems(registry, "s", DROPPED)
    assert registry.fetched() == [5, 6, 7]
    assert [m.split(": ", 2)[1] for m in found] == [
        f"version {n} cannot read what it writes" for n in (5, 6, 7)
    ]


def test_none_checks_nothing_and_an_unknown_rule_is_the_registry_default():
    registry = FakeRegistry({1: V1}, "NONE")
    assert schemas.sink_problems(registry, "s", ADDED) == []
    assert registry.fetched() == []
    [message] = schemas.sink_problems(FakeRegistry({1: V1}, "SOMETHING_NEW"), "s", ADDED)
    assert "it cannot read what version 1 wrote" in message


def test_a_registered_schema_that_is_not_avro_is_said_so():
    registry = FakeRegistry({1: V1})
    registry.version = lambda subject, version="latest": Version(subject, 1, 9, "not json")
    [message] = schemas.sink_problems(registry, "s", ADDED)
    assert "cannot be compared" in message


# -- the spec: when the value's type is known, the subject, the errors' fields ---------------


def spec_data(*, transform=None, value=None, sinks=1, strategy="topic", record=None) -> dict:
    sink = {
        "kind": "kafka",
        "connection": "events",
        "topic": "orders-out",
        "format": "avro",
        "schema_registry": {"connection": "registry", "strategy": strategy, "record": record},
    }
    if value is not None:
        sink["value"] = value
    data = {
        "source": {"connection": "events", "topics": ["orders"], "schema": "id STRING, n BIGINT"},
        "transform": transform,
    }
    if sinks == 1:
        data["sink"] = sink
    else:
        data["sinks"] = [{**sink, "format": "json", "schema_registry": None}] + [
            {**sink, "topic": f"orders-out-{i}"} for i in range(1, sinks)
        ]
    return data


def test_the_value_s_schema_is_known_without_a_transform_or_a_value_expression():
    spec = parse_spec(spec_data(record="acme.Order"))
    assert schemas.sink_value_schema(spec, spec.sink) == spark_schema(
        "id STRING, n BIGINT", "acme.Order"
    )
    spec = parse_spec(spec_data(transform={"sql": "SELECT id FROM source"}))
    assert schemas.sink_value_schema(spec, spec.sink) is None
    spec = parse_spec(spec_data(value="named_struct('id', id)"))
    assert schemas.sink_value_schema(spec, spec.sink) is None


def test_the_subject_is_named_as_the_sink_names_it_at_the_run_s_start():
    spec = parse_spec(spec_data())
    assert schemas.sink_subject(spec.sink) == "orders-out-value"
    spec = parse_spec(spec_data(strategy="record", record="acme.Order"))
    assert schemas.sink_subject(spec.sink) == "acme.Order"
    spec = parse_spec(spec_data(strategy="topic-record", record="acme.Order"))
    assert schemas.sink_subject(spec.sink) == "orders-out-acme.Order"


@pytest.fixture
def registries(monkeypatch):
    """check_sinks with fakes: the spec validated without a database, the connection's
    arguments its name, and each Registry(arguments) the fake (or error) set for it."""
    from controlplane.definitions import services

    made: dict[str, object] = {}
    opened: list[str] = []
    monkeypatch.setattr(services, "validate", lambda data: parse_spec(data))
    monkeypatch.setattr(schemas, "_arguments", lambda name, field: {"name": name})

    class Opened:
        def __init__(self, arguments):
            opened.append(arguments["name"])
            self.found = made[arguments["name"]]

        def __enter__(self):
            if isinstance(self.found, Exception):
                raise self.found
            return self.found

        def __exit__(self, *exc):
            return None

    monkeypatch.setattr(schemas, "Registry", Opened)
    made["opened"] = opened
    return made


def test_refusals_name_the_sink_s_field_and_nothing_in_the_spec_changes(registries):
    registries["registry"] = FakeRegistry({1: V1})
    data = spec_data(sinks=3)
    data["source"]["schema"] = "id STRING, n BIGINT, extra STRING"
    before = copy.deepcopy(data)
    with pytest.raises(SpecError) as caught:
        schemas.check_sinks(data)
    errors = caught.value.as_dict()
    assert set(errors) == {"sinks[1].schema_registry", "sinks[2].schema_registry"}
    assert "'orders-out-1-value'" in errors["sinks[1].schema_registry"][0]
    assert "field extra" in errors["sinks[2].schema_registry"][0]
    assert data == before
    # A compatible one passes, and resolve hands the data on as it was.
    data["source"]["schema"] = "id STRING"
    assert schemas.resolve(data) is data
    assert data == {**before, "source": {**before["source"], "schema": "id STRING"}}


def test_a_registry_that_does_not_answer_or_refuses_refuses_the_save(registries):
    for error, words in (
        (Unreachable("the registry at http://r does not answer (timeout)"), "does not answer"),
        (Refused("the registry refused the connection's credentials"), "the registry: "),
    ):
        registries["registry"] = error
        with pytest.raises(SpecError) as caught:
            schemas.check_sinks(spec_data())
        [message] = caught.value.as_dict()["sink.schema_registry"]
        assert words in message


def test_a_value_spark_cannot_write_as_avro_is_refused_and_an_unknown_one_not_asked(registries):
    data = spec_data()
    data["source"]["schema"] = "id STRING, m MAP<INT, STRING>"
    with pytest.raises(SpecError) as caught:
        schemas.check_sinks(data)
    [message] = caught.value.as_dict()["sink.schema_registry"]
    assert "Spark cannot write the output as Avro: column 'm'" in message
    # A transform: only Spark knows the value's type; no registry is asked.
    schemas.check_sinks(spec_data(transform={"sql": "SELECT id, 1 AS extra FROM source"}))
    # A spec that does not validate is left to its checks.
    broken = spec_data()
    broken["sink"]["topic"] = "__internal"
    schemas.check_sinks(broken)
    assert registries["opened"] == []


def test_the_preflight_says_when_the_subject_s_rule_is_checked():
    # (Known from the spec: the registry is asked, tests/test_sink_schema_gate.py.)
    for data, status, words in (
        (
            spec_data(transform={"sql": "SELECT id FROM source"}),
            preflight.INFO,
            "known only when the run starts (a transform",
        ),
        (
            spec_data(value="named_struct('id', id)"),
            preflight.INFO,
            "an incompatible schema stops the run with a definition error",
        ),
    ):
        spec = parse_spec(data)
        context = preflight._Context(1.0)
        preflight._kafka_sink_schema(context, spec, spec.sink, "sink")
        [check] = context.report.checks
        assert (check.field, check.status) == ("sink.schema_registry", status)
        assert words in check.message
        assert "'orders-out-value'" in check.message
    # A stored spec whose value Spark cannot write as Avro (saved before the gate): an error.
    data = spec_data()
    data["source"]["schema"] = "id STRING, tags MAP<INT, STRING>"
    spec = parse_spec(data)
    context = preflight._Context(1.0)
    preflight._kafka_sink_schema(context, spec, spec.sink, "sink")
    assert context.report.by_field(preflight.ERROR) == {
        "sink.schema_registry": [
            "Spark cannot write the output as Avro: column 'tags': Spark writes no Avro for a"
            " map whose keys are not strings (Unexpected type map<int,...>)"
        ]
    }
