"""Pipeline definitions through the API: validation, versions, concurrency, deletion."""

from __future__ import annotations

import pytest

from controlplane.definitions.models import Pipeline, PipelineVersion
from jobs.spec import SpecError
from tests.factories import files_spec, valid_spec


def test_creating_a_pipeline_stores_the_canonical_spec_as_version_1(api, pipeline):
    assert pipeline["name"] == "orders"
    assert pipeline["version"] == 1
    assert pipeline["desired_state"] == "stopped"
    assert pipeline["status"] == "stopped"
    assert pipeline["spec"]["source"]["fail_on_data_loss"] is True  # default spelled out
    row = Pipeline.objects.get(name="orders")
    assert row.spec == pipeline["spec"]
    assert list(row.versions.values_list("version", flat=True)) == [1]


def test_the_list_is_paginated(api, kafka_connection, postgres_connection):
    for i in range(3):
        api.post("/api/pipelines/", {"name": f"p{i}", "spec": valid_spec()}, format="json")
    page = api.get("/api/pipelines/?page_size=2").json()
    assert page["count"] == 3
    assert len(page["results"]) == 2
    assert page["next"]


def test_every_spec_change_is_a_new_version_and_old_specs_are_kept(api, pipeline):
    spec = valid_spec(trigger={"interval_seconds": 30})
    response = api.put("/api/pipelines/orders/", {"name": "orders", "spec": spec}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["version"] == 2
    versions = api.get("/api/pipelines/orders/versions/").json()
    assert [v["version"] for v in versions["results"]] == [2, 1]
    assert versions["results"][1]["spec"]["trigger"]["interval_seconds"] == 5
    assert versions["results"][0]["created_by"] == "oncall"
    one = api.get("/api/pipelines/orders/versions/1/").json()
    assert one["spec"] == pipeline["spec"]
    assert api.get("/api/pipelines/orders/versions/9/").status_code == 404


def test_an_identical_spec_does_not_make_a_new_version(api, pipeline):
    response = api.put(
        "/api/pipelines/orders/", {"name": "orders", "spec": valid_spec()}, format="json"
    )
    assert response.json()["version"] == 1
    assert PipelineVersion.objects.count() == 1


def test_patch_merges_into_the_spec(api, pipeline):
    response = api.patch(
        "/api/pipelines/orders/",
        {"spec": {"trigger": {"interval_seconds": 2}, "transform": None}},
        format="json",
    )
    assert response.status_code == 200, response.json()
    spec = response.json()["spec"]
    assert spec["trigger"] == {"interval_seconds": 2}
    assert spec["transform"] is None
    assert spec["source"] == pipeline["spec"]["source"]
    assert response.json()["version"] == 2


def test_patch_replaces_a_restart_policy_whose_kind_changes(api, pipeline):
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"restart_policy": {"kind": "none"}}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert response.json()["spec"]["restart_policy"] == {"kind": "none"}


def test_changing_only_the_desired_state_keeps_the_version(api, pipeline):
    response = api.patch("/api/pipelines/orders/", {"desired_state": "running"}, format="json")
    assert response.status_code == 200
    assert response.json()["desired_state"] == "running"
    assert response.json()["version"] == 1


def test_a_stale_version_is_refused_with_409_and_nothing_changes(api, pipeline):
    api.patch(
        "/api/pipelines/orders/", {"spec": {"trigger": {"interval_seconds": 9}}}, format="json"
    )
    response = api.patch(
        "/api/pipelines/orders/",
        {"version": 1, "spec": {"trigger": {"interval_seconds": 1}}},
        format="json",
    )
    assert response.status_code == 409
    assert "version 2" in response.json()["detail"]
    assert Pipeline.objects.get(name="orders").spec["trigger"]["interval_seconds"] == 9


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"source": {**valid_spec()["source"], "connection": "missing"}}, "spec.source.connection"),
        ({"source": {**valid_spec()["source"], "schema": "id STRANG"}}, "spec.source.schema"),
        ({"transform": {"sql": "SELECT FROM WHERE"}}, "spec.transform.sql"),
        ({"sink": {**valid_spec()["sink"], "table": "orders; DROP TABLE x"}}, "spec.sink.table"),
        (
            {"restart_policy": {"kind": "fixed-delay", "delay_seconds": -10}},
            "spec.restart_policy.delay_seconds",
        ),
        (
            # An aggregation in append mode without a watermark: Spark would refuse it.
            {
                "transform": {
                    "sql": "SELECT window.start AS window_start, count(*) AS n FROM source "
                    "GROUP BY window(ts, '1 minute')",
                    "output_mode": "append",
                },
                "sink": {**valid_spec()["sink"], "mode": "append", "key": []},
            },
            "spec.source.watermark",
        ),
    ],
    ids=[
        "unknown-connection",
        "bad-ddl",
        "bad-sql",
        "unsafe-table",
        "negative-delay",
        "aggregation-without-watermark",
    ],
)
def test_each_class_of_bad_spec_is_refused_with_400_naming_the_field(
    api, kafka_connection, postgres_connection, change, field
):
    response = api.post(
        "/api/pipelines/", {"name": "bad", "spec": valid_spec(**change)}, format="json"
    )
    assert response.status_code == 400
    body = response.json()
    assert field in body, body
    assert all(isinstance(message, str) and message for message in body[field])
    assert not Pipeline.objects.filter(name="bad").exists()


def test_a_bad_update_is_refused_and_the_accepted_spec_is_kept(api, pipeline):
    response = api.patch(
        "/api/pipelines/orders/", {"spec": {"trigger": {"interval_seconds": -1}}}, format="json"
    )
    assert response.status_code == 400
    assert "spec.trigger.interval_seconds" in response.json()
    row = Pipeline.objects.get(name="orders")
    assert (row.version, row.spec) == (1, pipeline["spec"])


def test_bad_names_states_and_json_get_clear_400s(api, kafka_connection, postgres_connection):
    response = api.post(
        "/api/pipelines/",
        {"name": "Not A Slug", "spec": valid_spec(), "desired_state": "flying"},
        format="json",
    )
    assert response.status_code == 400
    assert {"name", "desired_state"} <= set(response.json())
    response = api.post("/api/pipelines/", data="{not json", content_type="application/json")
    assert response.status_code == 400
    assert "detail" in response.json()


def test_duplicate_names_are_refused(api, pipeline):
    response = api.post("/api/pipelines/", {"name": "orders", "spec": valid_spec()}, format="json")
    assert response.status_code == 400
    assert "name" in response.json()


def test_a_pipeline_cannot_be_renamed(api, pipeline):
    response = api.put(
        "/api/pipelines/orders/", {"name": "other", "spec": valid_spec()}, format="json"
    )
    assert response.status_code == 400
    assert "name" in response.json()


def test_a_pipeline_meant_to_run_cannot_be_deleted(api, pipeline):
    api.patch("/api/pipelines/orders/", {"desired_state": "running"}, format="json")
    response = api.delete("/api/pipelines/orders/")
    assert response.status_code == 409
    assert Pipeline.objects.filter(name="orders").exists()


def test_deleting_a_stopped_pipeline_removes_it_and_its_history(api, pipeline):
    assert api.delete("/api/pipelines/orders/").status_code == 204
    assert api.get("/api/pipelines/orders/").status_code == 404
    assert not PipelineVersion.objects.exists()


# -- files sinks: no two pipelines write to one directory ------------------------------------


def test_two_pipelines_may_not_write_files_to_the_same_or_nested_directories(
    api, kafka_connection, files_connection, files_dir
):
    def create(name, spec):
        return api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")

    assert create("first", files_spec("sales/orders")).status_code == 201
    root = f"file://{files_dir}/lake"
    for path, problem in (
        ("sales/orders", f"pipeline 'first' writes its files to {root}/sales/orders already"),
        ("sales/orders/", f"pipeline 'first' writes its files to {root}/sales/orders already"),
        ("sales", f"{root}/sales and {root}/sales/orders, where pipeline 'first' writes"),
        ("sales/orders/eu", f"{root}/sales/orders/eu and {root}/sales/orders, where pipeline"),
    ):
        response = create("second", files_spec(path))
        assert response.status_code == 400, path
        message = response.json()["spec.sink.path"][0]
        assert problem in message and "(sink.path 'sales/orders' of connection 'lake')" in message
    # Beside it is fine; a shared prefix of letters is not nesting.
    assert create("second", files_spec("sales/orders-eu")).status_code == 201
    assert create("third", files_spec("sales/returns")).status_code == 201
    # Another connection with the same root leads to the same directory.
    same = {"name": "lake2", "kind": "files", "settings": {"root": root + "/sales"}}
    assert api.post("/api/connections/", same, format="json").status_code == 201
    spec = files_spec("orders")
    spec["sink"]["connection"] = "lake2"
    response = create("fourth", spec)
    assert "pipeline 'first' writes its files to" in response.json()["spec.sink.path"][0]
    # Several sinks: the one that overlaps is named.
    spec = valid_spec(sinks=[files_spec("mine")["sink"], files_spec("sales/returns/x")["sink"]])
    spec.pop("sink")
    response = create("fifth", spec)
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sinks[1].path"]
    assert "pipeline 'third'" in response.json()["spec.sinks[1].path"][0]
    assert set(Pipeline.objects.values_list("name", flat=True)) == {"first", "second", "third"}


def test_an_update_or_rollback_onto_another_pipeline_s_files_is_refused(
    api, kafka_connection, files_connection
):
    def create(name, spec):
        return api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")

    assert create("first", files_spec("a")).status_code == 201
    assert create("second", files_spec("b")).status_code == 201
    # A pipeline's own directory is not in its way.
    response = api.patch(
        "/api/pipelines/first/", {"spec": {"sink": {"format": "json"}}}, format="json"
    )
    assert response.status_code == 200, response.json()
    response = api.patch(
        "/api/pipelines/second/", {"spec": {"sink": {"path": "a/b"}}}, format="json"
    )
    assert response.status_code == 400
    assert "pipeline 'first'" in response.json()["spec.sink.path"][0]
    # second moves to c, first takes b: second's version 1 (path b) cannot come back.
    assert (
        api.patch(
            "/api/pipelines/second/", {"spec": {"sink": {"path": "c"}}}, format="json"
        ).status_code
        == 200
    )
    assert (
        api.patch(
            "/api/pipelines/first/", {"spec": {"sink": {"path": "b"}}}, format="json"
        ).status_code
        == 200
    )
    from controlplane.definitions import services

    with pytest.raises(SpecError) as caught:
        services.rollback_pipeline(Pipeline.objects.get(name="second"), to_version=1)
    assert "pipeline 'first' writes its files to" in str(caught.value)
    assert Pipeline.objects.get(name="second").spec["sink"]["path"] == "c"
