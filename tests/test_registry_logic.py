"""Pure logic of the schema registry's parts (no registry): Avro's resolution rules in words
(jobs.registry.compatibility, the gate's), subjects by strategy and Confluent's wire format
(jobs.registry.subjects), the connection's settings (jobs.registry.connection), which
versions the gate checks (controlplane.definitions.schemas.writer_versions)."""

from __future__ import annotations

import pytest

from jobs.connections import ConnectionPolicy, validate_connection
from jobs.registry.compatibility import problems
from jobs.registry.subjects import frame, subject, unframe
from jobs.spec import SpecError


def record(*fields, name="Delivery"):
    return {"type": "record", "name": name, "namespace": "acme", "fields": list(fields)}


ID = {"name": "id", "type": "string"}


def test_added_fields_need_a_default_and_removed_ones_are_skipped():
    v1 = record(ID, {"name": "n", "type": "int"})
    v2 = record(ID, {"name": "n", "type": "long"}, {"name": "s", "type": "string", "default": "x"})
    assert problems(v2, v1) == []  # promotion, a default
    assert problems(v1, v2) == ["n: written as long, read as int"]
    v3 = record(ID, {"name": "s", "type": "string", "default": "x"})
    assert problems(v3, v2) == []  # n written, not read: skipped
    assert problems(v2, v3) == [
        "field n: the reader has no default for it, and the writer does not write it"
    ]


def test_types_promote_one_way_only():
    assert problems(
        record({"name": "n", "type": "int"}), record({"name": "n", "type": "long"})
    ) == ["n: written as long, read as int"]
    assert (
        problems(record({"name": "n", "type": "double"}), record({"name": "n", "type": "int"}))
        == []
    )
    assert (
        problems(record({"name": "b", "type": "bytes"}), record({"name": "b", "type": "string"}))
        == []
    )


def test_unions_enums_and_nested_records_name_the_field():
    nullable = record({"name": "c", "type": ["null", "string"], "default": None})
    plain = record({"name": "c", "type": "string"})
    assert problems(nullable, plain) == []
    assert problems(plain, nullable) == ["c: written as null, read as string"]
    assert problems(record({"name": "c", "type": ["null", "long"]}), plain) == [
        "c: written as string, which no branch of the reader's a union of null, long can read"
    ]
    enum = {"type": "enum", "name": "Status", "symbols": ["A", "B"]}
    wider = {"type": "enum", "name": "Status", "symbols": ["A", "B", "C"]}
    assert problems(record({"name": "s", "type": enum}), record({"name": "s", "type": wider})) == [
        "s: the writer's symbols C are not the reader's, and it has no default symbol"
    ]
    inner_v1 = {"type": "record", "name": "Where", "fields": [{"name": "lat", "type": "double"}]}
    inner_v2 = {"type": "record", "name": "Where", "fields": [{"name": "lon", "type": "double"}]}
    found = problems(
        record({"name": "at", "type": inner_v2}), record({"name": "at", "type": inner_v1})
    )
    assert found == [
        "field at.lon: the reader has no default for it, and the writer does not write it"
    ]
    arrays = problems(
        record({"name": "t", "type": {"type": "array", "items": "int"}}),
        record({"name": "t", "type": {"type": "array", "items": "string"}}),
    )
    assert arrays == ["t[]: written as string, read as int"]


def test_a_named_type_referred_to_and_a_recursive_one_are_compared_once():
    node = {
        "type": "record",
        "name": "Node",
        "fields": [{"name": "next", "type": ["null", "Node"], "default": None}, ID],
    }
    assert problems(node, node) == []
    twice = record(
        {"name": "a", "type": {"type": "fixed", "name": "Hash", "size": 16}},
        {"name": "b", "type": "Hash"},
    )
    other = record(
        {"name": "a", "type": {"type": "fixed", "name": "Hash", "size": 32}},
        {"name": "b", "type": "Hash"},
    )
    assert len(problems(twice, other)) == 2


def test_subjects_by_strategy_and_the_wire_format():
    assert subject("topic", "orders") == "orders-value"
    assert subject("record", "orders", "acme.Order") == "acme.Order"
    assert subject("topic-record", "orders", "acme.Order") == "orders-acme.Order"
    with pytest.raises(ValueError, match="record's full name"):
        subject("record", "orders")
    assert frame(258, b"body") == b"\x00\x00\x00\x01\x02body"
    assert unframe(b"\x00\x00\x00\x01\x02body") == (258, b"body")
    for bad in (b"\x01\x00\x00\x00\x01", b"\x00\x00"):
        with pytest.raises(ValueError, match="wire format"):
            unframe(bad)


def test_a_connection_names_a_url_without_credentials_and_its_secret_by_auth(tmp_path):
    def check(settings, secrets=None):
        return validate_connection(
            "schema-registry", settings, secrets or {}, ConnectionPolicy(cert_dir=str(tmp_path))
        )

    clean, _ = check({"url": "https://registry.example:8081/apis/ccompat/v7/"})
    assert clean == {"url": "https://registry.example:8081/apis/ccompat/v7", "auth": "none"}
    _, secrets = check(
        {"url": "http://r:8081", "auth": "basic", "username": "u"}, {"password": "p"}
    )
    assert secrets == {"password": "p"}
    for settings, secrets, field, words in (
        ({"url": "ftp://r"}, {}, "settings.url", "http:// or https://"),
        ({"url": "http://u:p@r:8081"}, {}, "settings.url", "may not carry a user"),
        ({"url": "http://r:8081/?x=1"}, {}, "settings.url", "query"),
        ({"url": "http://r:8081/a/../b"}, {}, "settings.url", "segment"),
        ({"url": "http://r", "auth": "basic"}, {}, "settings.username", "is required"),
        ({"url": "http://r"}, {"token": "t"}, "secrets.token", "not used with auth: none"),
        ({"url": "http://r", "ssl_cafile": "ca.pem"}, {}, "settings.ssl_cafile", "https"),
        ({"url": "https://r", "ssl_cafile": "../ca.pem"}, {}, "settings.ssl_cafile", "not a file"),
    ):
        with pytest.raises(SpecError) as caught:
            check(settings, secrets)
        messages = {e.field: e.message for e in caught.value.errors}
        assert words in messages.get(field, ""), messages


def test_the_gate_checks_newer_versions_and_the_rule_s_older_ones():
    from controlplane.definitions.schemas import writer_versions

    assert writer_versions(3, [1, 2, 3, 4, 5], "BACKWARD") == [2, 4, 5]
    assert writer_versions(3, [1, 2, 3, 4, 5], "BACKWARD_TRANSITIVE") == [1, 2, 4, 5]
    assert writer_versions(5, [1, 2, 3, 4, 5], "NONE") == [4]
    assert writer_versions(1, [1], "BACKWARD") == []


def test_an_avro_kafka_sink_names_its_registry_and_a_json_one_does_not():
    from jobs.spec import parse_spec

    def sink(**extra):
        spec = {
            "source": {"connection": "k", "topics": ["in"], "schema": "id STRING"},
            "sink": {"kind": "kafka", "connection": "k", "topic": "out", **extra},
        }
        return parse_spec(spec)

    avro = sink(format="avro", schema_registry={"connection": "reg", "record": "acme.Event"})
    assert avro.sink.schema_registry.record == "acme.Event"
    assert avro.connection_names() == {"k", "reg"}
    for extra, field, words in (
        ({"format": "avro"}, "sink.schema_registry", "is required with format avro"),
        ({"schema_registry": {"connection": "reg"}}, "sink.schema_registry", "avro only"),
        (
            {"format": "avro", "schema_registry": {"connection": "reg", "strategy": "record"}},
            "sink.schema_registry.record",
            "is required with strategy record",
        ),
        (
            {"format": "avro", "schema_registry": {"connection": "reg", "record": "9x"}},
            "sink.schema_registry.record",
            "not an Avro full name",
        ),
    ):
        with pytest.raises(SpecError) as caught:
            sink(**extra)
        messages = {e.field: e.message for e in caught.value.errors}
        assert words in messages.get(field, ""), messages
