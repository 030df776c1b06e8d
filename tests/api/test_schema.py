from __future__ import annotations

from django.core.management import call_command


def test_the_openapi_schema_is_valid_and_generates_without_warnings(tmp_path, db):
    # --fail-on-warn turns any endpoint drf-spectacular cannot describe into an error.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yaml"))
    assert "/api/pipelines/{name}/versions/" in (tmp_path / "s.yaml").read_text()


def test_the_openapi_schema_describes_the_endpoints(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/connections/",
        "/api/connections/{name}/test/",
        "/api/pipelines/{name}/",
        "/api/pipelines/{name}/versions/",
        "/api/applications/{name}/",
        "/api/applications/{name}/recycle/",
    ):
        assert path in schema["paths"], sorted(schema["paths"])


def spec_examples() -> list[dict]:
    """Specs of every source format, sink kind and restart policy kind, as submitted and in
    their canonical form."""
    from jobs.spec import parse_spec
    from tests.factories import valid_spec

    avro = {"type": "record", "name": "R", "fields": [{"name": "id", "type": "string"}]}
    kafka_sink = {"kind": "kafka", "connection": "events", "topic": "out", "key": "id"}
    examples = [valid_spec()]
    files_sink = {"kind": "files", "connection": "lake", "path": "sales/orders"}
    full_files_sink = {
        **files_sink,
        "path": "sales/orders-2026/",
        "format": "avro",
        "partition_by": ["id", "ts"],
        "target_file_mb": 4096,
        "max_file_age_seconds": 0.5,
        "inactivity_seconds": 604800,
    }
    examples.append({**valid_spec(), "sink": kafka_sink})
    examples.append({**valid_spec(), "sink": files_sink})
    examples.append({**valid_spec(), "sink": full_files_sink})
    examples.append(
        {**valid_spec(), "sink": None, "sinks": [valid_spec()["sink"], kafka_sink, files_sink]}
    )
    examples[-1].pop("sink")
    source = {"connection": "events", "topics": ["t"], "format": "avro", "avro_schema": avro}
    examples.append({"source": source, "sink": {"connection": "warehouse", "table": "t"}})
    for kind in ("fixed-delay", "failure-rate", "exponential-delay", "none"):
        examples.append({**valid_spec(), "restart_policy": {"kind": kind}})
    examples.append(
        {
            **valid_spec(),
            "source": {
                **valid_spec()["source"],
                "starting_offsets": {"timestamp": "2026-11-21T10:00:00Z"},
            },
        }
    )
    examples.extend(stateful_examples())
    return examples + [parse_spec(e).to_dict() for e in examples]


def stateful_examples() -> list[dict]:
    """Stateful specs: a watermark, deduplication, both output modes, both state stores."""
    from tests.factories import valid_spec

    source = {**valid_spec()["source"], "watermark": {"column": "ts", "delay_seconds": 60}}
    window = (
        "SELECT window.start AS window_start, window.end AS window_end, id, count(*) AS n "
        "FROM source GROUP BY window(ts, '5 minutes'), id"
    )
    upsert = {"connection": "warehouse", "table": "counts", "mode": "upsert"}
    return [
        {
            **valid_spec(),
            "source": source,
            "transform": {"sql": window},
            "sink": {"connection": "warehouse", "table": "counts"},
        },
        {
            **valid_spec(),
            "source": source,
            "transform": {"sql": window, "output_mode": "update"},
            "sink": {**upsert, "key": ["window_start", "window_end", "id"]},
            "state_store": "hdfs",
        },
        {
            **valid_spec(),
            "source": {
                **source,
                "deduplicate": {"key": ["id"]},
                "watermark": {"column": "ts", "delay_seconds": 0},
            },
            "transform": {"sql": "SELECT * FROM source", "output_mode": "append"},
            "state_store": "rocksdb",
        },
    ]


def openapi_spec_validator(api):
    import json

    import jsonschema

    document = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json").json()
    schemas = json.loads(
        json.dumps(document["components"]["schemas"]).replace("#/components/schemas/", "#/$defs/")
    )
    spec = {**schemas["PipelineSpec"], "$defs": schemas}
    jsonschema.Draft202012Validator.check_schema(spec)
    return document, jsonschema.Draft202012Validator(spec)


def test_the_openapi_document_describes_the_whole_spec_as_json_schema(api):
    document, validator = openapi_spec_validator(api)
    assert document["openapi"] == "3.1.0"
    body = document["components"]["schemas"]["PipelineRequest"]["properties"]["spec"]
    assert "#/components/schemas/PipelineSpec" in str(body)
    for name in (
        "SpecKafkaSource",
        "SpecPostgresSink",
        "SpecKafkaSink",
        "SpecFilesSink",
        "SpecFailureRate",
        "SpecWatermark",
        "SpecDeduplicate",
    ):
        assert name in document["components"]["schemas"]
    for example in spec_examples():
        errors = [e.message for e in validator.iter_errors(example)]
        assert not errors, (example, errors)


def test_what_the_schema_refuses_the_validator_refuses_too(api):
    from jobs.spec import SpecError, parse_spec
    from tests.factories import valid_spec

    _, validator = openapi_spec_validator(api)
    bad = [
        {**valid_spec(), "sink": {**valid_spec()["sink"], "kind": "s3"}},
        {**valid_spec(), "extra": 1},
        {**valid_spec(), "sinks": [valid_spec()["sink"]]},  # sink and sinks
        {**valid_spec(), "restart_policy": {"kind": "fixed-delay", "attempts": -1}},
        {**valid_spec(), "sink": {"kind": "kafka", "connection": "events", "topic": "a b"}},
        {**valid_spec(), "trigger": {"interval_seconds": -1}},
        *[
            {**valid_spec(), "sink": {"kind": "files", "connection": "lake", **fields}}
            for fields in (
                {},  # no path
                {"path": "/abs"},
                {"path": "a/../b"},
                {"path": "_hidden/x"},
                {"path": "a/.x"},
                {"path": "hdfs://nn/x"},
                {"path": "/".join(["d"] * 17)},
                {"path": "x", "format": "csv"},
                {"path": "x", "partition_by": ["a", "b", "c", "d", "e"]},
                {"path": "x", "partition_by": ["1a"]},
                {"path": "x", "partition_by": ["a-b"]},
                {"path": "x", "partition_by": ["id", "id"]},
                {"path": "x", "target_file_mb": 0},
                {"path": "x", "target_file_mb": 4097},
                {"path": "x", "max_file_age_seconds": 0},
                {"path": "x", "inactivity_seconds": 604801},
                {"path": "x", "table": "t"},
            )
        ],
        *[
            {**valid_spec(), "source": {**valid_spec()["source"], **fields}}
            for fields in (
                {"watermark": {"column": "ts"}},  # no delay
                {"watermark": {"column": "", "delay_seconds": 1}},
                {"watermark": {"column": "ts", "delay_seconds": -1}},
                {"watermark": {"column": "ts", "delay_seconds": 604801}},
                {"watermark": {"column": "ts", "delay_seconds": 1, "late": True}},
                {"watermark": "ts"},
                {
                    "watermark": {"column": "ts", "delay_seconds": 1},
                    "deduplicate": {"key": []},
                },
                {
                    "watermark": {"column": "ts", "delay_seconds": 1},
                    "deduplicate": {"key": ["id", "id"]},
                },
            )
        ],
        {**valid_spec(), "transform": {"sql": "SELECT * FROM source", "output_mode": "complete"}},
        {**valid_spec(), "state_store": "memory"},
    ]
    for spec in bad:
        assert list(validator.iter_errors(spec)), spec
        try:
            parse_spec(spec)
        except SpecError:
            continue
        raise AssertionError(f"parse_spec accepted {spec}")
