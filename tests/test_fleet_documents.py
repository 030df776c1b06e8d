"""Definitions as code, the files (controlplane.fleet.documents; pure): documents read into
objects, templates expanded into pipelines with typed parameters, an environment's variables
and overlays, and every problem named by its file, document and path."""

from __future__ import annotations

import pytest

from controlplane.fleet.documents import DocumentsRefused, merge_patch, read

CONNECTION = """
apiVersion: controlplane/v1
kind: Connection
name: events
spec: {kind: kafka, settings: {bootstrap_servers: ["kafka:9092"]}}
"""

TEMPLATE = """
apiVersion: controlplane/v1
kind: PipelineTemplate
name: orders
labels: {team: shop}
spec:
  parameters:
    topic: {type: string}
    partitions: {type: integer, default: 4}
    format: {type: string, default: json}
    compact: {type: boolean, default: false}
  pipeline:
    source:
      connection: events
      topics: ["${params.topic}"]
      format: "${params.format}"
      min_partitions: "${params.partitions}"
      starting_offsets: "2026-11-28T00:00:00Z"
    sink: {connection: "${vars.warehouse}", table: "t_${params.topic}", note: "$${literal}"}
  instances:
    - name: orders-eu
      parameters: {topic: orders.eu}
    - name: orders-us
      parameters: {topic: orders.us, partitions: 12, format: avro}
      labels: {region: us}
---
apiVersion: controlplane/v1
kind: Environment
name: prod
spec:
  variables: {warehouse: pg-prod}
  overlays:
    Pipeline/orders-us: {source: {min_partitions: 24, format: null}}
---
apiVersion: controlplane/v1
kind: Environment
name: dev
spec:
  variables: {warehouse: pg-dev}
"""


def test_templates_expand_into_typed_pipelines_and_environments_overlay_them():
    objects = read(
        {"fleet/events.yaml": CONNECTION, "fleet/orders.yaml": TEMPLATE}, environment="prod"
    )
    assert [o.key for o in objects] == [
        "Connection/events",
        "Pipeline/orders-eu",
        "Pipeline/orders-us",
    ]
    eu, us = objects[1], objects[2]
    assert eu.spec["source"] == {
        "connection": "events",
        "topics": ["orders.eu"],
        "format": "json",
        "min_partitions": 4,  # a whole placeholder keeps its type
        "starting_offsets": "2026-11-28T00:00:00Z",  # a date stays text
    }
    assert eu.spec["sink"] == {
        "connection": "pg-prod",
        "table": "t_orders.eu",
        "note": "${literal}",
    }
    assert eu.labels == {"team": "shop", "template": "orders"}
    assert (eu.source.file, eu.source.document, eu.source.instance) == (
        "fleet/orders.yaml",
        1,
        "orders",
    )
    # prod's overlay: a merge patch (null removes).
    assert us.spec["source"]["min_partitions"] == 24 and "format" not in us.spec["source"]
    assert us.labels == {"team": "shop", "region": "us", "template": "orders"}
    dev = read({"fleet/orders.yaml": TEMPLATE}, environment="dev")
    assert (
        dev[1].spec["source"]["min_partitions"] == 12 and dev[1].spec["source"]["format"] == "avro"
    )
    assert dev[0].spec["sink"]["connection"] == "pg-dev"


def errors_of(files, **kwargs) -> list[str]:
    with pytest.raises(DocumentsRefused) as caught:
        read(files, **kwargs)
    return [str(e) for e in caught.value.errors]


def test_every_problem_names_its_file_document_and_path():
    bad = TEMPLATE.replace("parameters: {topic: orders.eu}", "parameters: {topic: 7, region: eu}")
    bad = bad.replace('topics: ["${params.topic}"]', 'topics: ["${params.topc}"]')
    found = errors_of({"f.yaml": bad}, environment="prod")
    assert (
        "f.yaml: document 1 (PipelineTemplate orders): spec.instances[0].parameters.region:"
        " is not a parameter of the template (its parameters: compact, format, partitions, topic)"
    ) in found
    assert (
        "f.yaml: document 1 (PipelineTemplate orders): spec.instances[0].parameters.topic:"
        " must be a string"
    ) in found
    assert any(
        e.startswith(
            "f.yaml: document 1 (Pipeline orders-us of template orders):"
            " spec.pipeline.source.topics[0]:"
        )
        and "${params.topc}: no such parameter" in e
        for e in found
    ), found
    missing = TEMPLATE.replace("parameters: {topic: orders.eu}", "parameters: {}")
    assert any(
        "spec.instances[0].parameters.topic: is required (the parameter has no default)" in e
        for e in errors_of({"f.yaml": missing}, environment="prod")
    )
    # Variables come from the environment chosen: without one, ${vars.warehouse} is unknown.
    assert any("${vars.warehouse}: no such variable" in e for e in errors_of({"f.yaml": TEMPLATE}))
    assert errors_of({"f.yaml": TEMPLATE}, environment="staging") == [
        ": the set: no Environment 'staging' (known: dev, prod)"
    ]


def test_documents_are_checked_field_by_field_and_yaml_is_read_safely():
    found = errors_of(
        {
            "a.yaml": "apiVersion: v0\nkind: Pipe\nname: Bad_Name\nspec: []\nextra: 1\n",
            "b.yaml": "a: &x [1]\nb: *x\n",
            "c.yaml": "kind: Pipeline\nkind: Connection\n",
            "d.yaml": "- just\n- a list\n",
        }
    )
    assert (
        "a.yaml: document 1 (Pipe Bad_Name): extra: is not a document field"
        " (apiVersion, kind, name, labels, description, spec, deployment)"
    ) in found
    assert "a.yaml: document 1 (Pipe Bad_Name): apiVersion: must be 'controlplane/v1'" in found
    assert any(
        e.startswith("a.yaml: document 1 (Pipe Bad_Name): kind: must be one of") for e in found
    )
    assert any(
        e.startswith("a.yaml: document 1 (Pipe Bad_Name): name: must be 1-63") for e in found
    )
    assert "a.yaml: document 1 (Pipe Bad_Name): spec: must be a mapping" in found
    assert any(
        e.startswith("b.yaml: line 2, column 4: is not YAML this reads: aliases") for e in found
    ), found
    assert any("the key 'kind' is given twice" in e for e in found), found
    assert "d.yaml: document 1: must be a mapping (apiVersion, kind, name, spec)" in found
    # yes/no stay words.
    [obj] = read({"e.yaml": CONNECTION.replace("kafka:9092", 'kafka:9092"], note: ["yes')})
    assert obj.spec["settings"] == {"bootstrap_servers": ["kafka:9092"], "note": ["yes"]}


def test_an_object_defined_twice_and_an_overlay_of_nothing_are_refused():
    twice = CONNECTION + "---" + CONNECTION
    assert errors_of({"c.yaml": twice}) == [
        "c.yaml: document 2 (Connection events): name: Connection/events is defined twice"
        " (first in c.yaml, document 1)"
    ]
    stray = TEMPLATE.replace("Pipeline/orders-us:", "Pipeline/orders-ca:")
    assert errors_of({"t.yaml": stray}, environment="prod") == [
        "t.yaml: document 2 (Environment prod): spec.overlays.Pipeline/orders-ca:"
        " names no object of the set"
    ]


def test_merge_patch_follows_rfc_7386():
    target = {"a": "b", "c": {"d": "e", "f": "g"}}
    assert merge_patch(target, {"a": "z", "c": {"f": None}}) == {"a": "z", "c": {"d": "e"}}
    assert merge_patch({"a": [1, 2]}, {"a": [3]}) == {"a": [3]}
    assert merge_patch({"a": {"b": "c"}}, {"a": {"b": {"x": 1}}}) == {"a": {"b": {"x": 1}}}
    assert target == {"a": "b", "c": {"d": "e", "f": "g"}}  # untouched


def test_yaml_nested_past_what_python_can_read_is_an_error_not_a_crash():
    with pytest.raises(DocumentsRefused) as refused:
        read({"deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n"})
    assert [str(e) for e in refused.value.errors] == [
        "deep.yaml: the file: is nested more than 32 levels deep"
    ]
