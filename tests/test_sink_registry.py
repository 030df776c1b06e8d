"""The sink kinds' one list (jobs.sinks.registry) and what every other part finds there: each
kind's model says its kind, the spec's sink is the union of the models (its JSON Schema tells
them apart by kind), the forms show each kind's own fields and take a spec of every kind
round trip, every kind has its preflight, and every kind of connection a sink writes through
has its probe and its drivers' arguments. Pure: no service."""

from __future__ import annotations

import typing

import pytest

from controlplane.connections import probe
from controlplane.pages import forms
from controlplane.supervision import launcher
from jobs.connections import CONNECTION_KINDS
from jobs.sinks import registry
from jobs.spec import parse_spec
from jobs.spec.schema import spec_json_schema
from tests.clients import form_for
from tests.factories import valid_spec

CONNECTIONS = {
    "events": "kafka",
    "warehouse": "postgres",
    "lake": "files",
    "cluster": "cassandra",
}
ONE_OF_EACH = {
    "postgres": {"connection": "warehouse", "table": "t", "mode": "upsert", "key": ["id"]},
    "kafka": {"kind": "kafka", "connection": "events", "topic": "out", "key": "id"},
    "files": {"kind": "files", "connection": "lake", "path": "a/b", "partition_by": ["id"]},
    "cassandra": {
        "kind": "cassandra",
        "connection": "cluster",
        "table": "t",
        "partition_key": ["id"],
        "ttl_seconds": 3600,
        "dead_letters": {"connection": "events", "topic": "dl"},
    },
}


def test_every_kind_is_listed_once_with_a_model_that_says_its_kind():
    assert set(registry.names()) == set(ONE_OF_EACH)
    for name, kind in registry.KINDS.items():
        assert kind.name == name
        assert typing.get_args(typing.get_type_hints(kind.model)["kind"]) == (name,)
        assert kind.model in typing.get_args(registry.sink_union())
        assert kind.connection_kind in CONNECTION_KINDS
        assert kind.writer().__name__ == "Writer"


def test_the_json_schema_tells_every_kind_apart():
    schema = spec_json_schema()
    mapping = schema["properties"]["sink"]["discriminator"]["mapping"]
    assert set(mapping) == set(registry.names())


@pytest.mark.parametrize("name", sorted(ONE_OF_EACH))
def test_a_spec_of_every_kind_survives_the_form(name):
    spec = parse_spec(valid_spec(sink=ONE_OF_EACH[name]), connections=CONNECTIONS).to_dict()
    post = {**form_for(spec), "sink_kind": name}
    for f in forms.PIPELINE_FIELDS:
        if f.sink == name:
            post[f.name] = forms._text(f, forms._get(spec, f.path))
    parsed = forms.pipeline_from_form(post, None)
    assert parsed.errors == {}
    assert parse_spec(parsed.data["spec"], connections=CONNECTIONS).to_dict() == spec
    # Each kind's own inputs, and no other kind's.
    shown = {f.name for f in forms.PIPELINE_FIELDS if f.sink == name}
    assert shown == {f.name for f in registry.kind(name).form}


def test_every_kind_and_connection_kind_has_its_checks_probe_and_arguments():
    from controlplane.definitions import preflight

    assert set(preflight.SINK_CHECKS) == set(registry.names())
    assert set(probe.PROBES) == set(CONNECTION_KINDS)
    assert set(launcher.DRIVER_ARGUMENTS) == set(CONNECTION_KINDS)
    assert set(forms.CONNECTION_FIELDS) == set(CONNECTION_KINDS)
