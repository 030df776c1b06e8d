"""A sink key is a column of the pipeline's output: refused when the spec is saved where the
transform's SQL tells its output columns (without Spark); where it does not, the run finds out
and fails permanently (tests/test_failures.py)."""

from __future__ import annotations

import pytest

from controlplane.definitions.models import Pipeline
from tests.factories import valid_spec

RENAMED = {"sql": "SELECT id AS order_id, amount, ts FROM source"}


@pytest.fixture
def connections(kafka_connection, postgres_connection):
    return kafka_connection, postgres_connection


def create(api, spec):
    return api.post("/api/pipelines/", {"name": "orders", "spec": spec}, format="json")


def test_an_upsert_key_the_transform_does_not_output_is_refused(api, connections):
    response = create(api, valid_spec(transform=RENAMED))
    assert response.status_code == 400
    assert response.json() == {
        "spec.sink.key[0]": [
            "column 'id' is not an output column of the transform (amount, order_id, ts)"
        ]
    }
    assert not Pipeline.objects.exists()
    spec = valid_spec(transform=RENAMED)
    spec["sink"]["key"] = ["order_id"]
    assert create(api, spec).status_code == 201


def test_a_change_of_the_transform_that_drops_the_key_is_refused(api, pipeline):
    response = api.patch("/api/pipelines/orders/", {"spec": {"transform": RENAMED}}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sink.key[0]"]
    stored = Pipeline.objects.get(name="orders")
    assert stored.version == 1
    assert stored.spec["transform"]["sql"] == valid_spec()["transform"]["sql"]


def test_each_sink_of_several_is_checked_at_its_own_path(api, connections):
    spec = valid_spec(transform=RENAMED)
    first = {**spec.pop("sink"), "key": ["order_id"]}
    spec["sinks"] = [first, {**first, "table": "orders_copy", "key": ["order_id", "id"]}]
    response = create(api, spec)
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sinks[1].key[1]"]


def test_a_transform_whose_output_only_spark_knows_is_left_to_run_time(api, connections):
    exploded = {"sql": "SELECT explode(array(id, 'x')) FROM source"}
    assert create(api, valid_spec(transform=exploded)).status_code == 201


def test_a_kafka_sink_key_naming_a_column_the_output_lacks_is_refused(api, connections):
    sink = {"kind": "kafka", "connection": "events", "topic": "orders-out", "key": "upper(id)"}
    response = create(api, valid_spec(transform=RENAMED, sink=sink))
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sink.key"]
    assert "unknown column 'id'" in response.json()["spec.sink.key"][0]
    sink["key"] = "upper(order_id)"
    assert create(api, valid_spec(transform=RENAMED, sink=sink)).status_code == 201
