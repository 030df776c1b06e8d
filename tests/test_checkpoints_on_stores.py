"""What the control plane reads and changes of a checkpoint, with the checkpoint root on the
local disk, on HDFS and on the S3 server (tests.stores.checkpoint_store): the checkpoint page
(last batch, offsets, batches in flight, size, state size), the offsets, an offsets reset,
the lag from the checkpoint; and with a store that does not answer, pages and the API answer
anyway, saying why. The round trips with real drivers are in test_storage_pipelines.py."""

from __future__ import annotations

import pytest

from controlplane.definitions import checkpoints as locations
from controlplane.definitions.models import Pipeline, RestorePoint
from controlplane.observability import metrics
from tests.kafka_helpers import new_topic, produce
from tests.stores import fake_checkpoint


def live(store, committed: int = 2, name: str = "orders") -> str:
    return fake_checkpoint(store.store, locations.location(name), committed=committed)


@pytest.mark.django_db
def test_the_checkpoint_page_and_offsets_are_read_from_the_store(api, pipeline, checkpoint_store):
    assert api.get("/api/pipelines/orders/checkpoints/").status_code == 404  # none yet
    live(checkpoint_store)
    page = api.get("/api/pipelines/orders/checkpoints/").json()
    assert page["source"] == "checkpoint"
    assert page["path"] == locations.location("orders")
    assert page["unreachable"] is None
    assert (page["last_batch_id"], page["in_flight"]) == (2, [3])
    assert page["committed_offsets"] == {"orders": {"0": 30, "1": 15}}
    assert page["state_size_bytes"] == 4 * 4
    assert page["size_bytes"] > page["state_size_bytes"]
    assert [b["batch_id"] for b in page["history"]] == [3, 2, 1, 0]
    assert page["history"][1]["committed_at"] is not None
    offsets = api.get("/api/pipelines/orders/offsets/").json()
    assert offsets == {
        "committed": {"orders": {"0": 30, "1": 15}},
        "last_batch_id": 2,
        "pending_reset": None,
    }


@pytest.mark.django_db
def test_an_offsets_reset_sets_the_checkpoint_aside_on_the_store(
    api, pipeline, checkpoint_store, kafka_bootstrap
):
    topic = new_topic(kafka_bootstrap, partitions=2)
    produce(kafka_bootstrap, topic, ({"id": f"r{i}"} for i in range(6)), partitions=2)
    assert (
        api.patch(
            "/api/pipelines/orders/", {"spec": {"source": {"topics": [topic]}}}, format="json"
        ).status_code
        == 200
    )
    root = live(checkpoint_store)
    response = api.post(
        "/api/pipelines/orders/offsets/reset/",
        {"to": "earliest", "reason": "replay"},
        format="json",
    )
    assert response.status_code == 200, response.json()
    assert not checkpoint_store.store.exists(root)  # the next run starts a new checkpoint
    kept = RestorePoint.objects.get(kind="before-offsets-reset")
    assert kept.last_batch_id == 2
    assert checkpoint_store.store.exists(kept.path)
    pending = api.get("/api/pipelines/orders/offsets/").json()["pending_reset"]
    assert pending == {topic: {"0": 0, "1": 0}}


@pytest.mark.django_db
def test_lag_is_measured_from_the_checkpoint_on_the_store(pipeline, checkpoint_store):
    live(checkpoint_store, committed=4)
    orders = Pipeline.objects.get(name="orders")
    found = metrics.checkpoint_of(orders, history=1, sizes=False)
    assert found.last_committed.batch_id == 4
    assert found.committed_offsets() == {("orders", 0): 50, ("orders", 1): 25}


@pytest.fixture
def unanswered(settings, silent_address):
    """The checkpoint root on an HDFS whose NameNode accepts connections and never answers."""
    settings.CONTROLPLANE_CHECKPOINT_ROOT = "hdfs://namenode:8020/cp"
    settings.CONTROLPLANE_HDFS_HTTP_ADDRESS = silent_address
    settings.CONTROLPLANE_STORAGE_TIMEOUT_SECONDS = 0.5


def test_with_the_store_not_answering_pages_and_api_answer_and_say_why(
    api, client, running, unanswered, django_user_model, silent_address
):
    from controlplane.accounts.roles import set_role

    name = running.pipeline.name
    offsets = api.get(f"/api/pipelines/{name}/offsets/")
    assert offsets.status_code == 503
    detail = offsets.json()["detail"]
    assert f"HDFS at {silent_address}" in detail and "did not answer in time" in detail
    # No checkpoint read and no report yet: nothing to show, said as such.
    assert api.get(f"/api/pipelines/{name}/checkpoints/").status_code == 404
    assert api.get(f"/api/pipelines/{name}/").status_code == 200
    user = django_user_model.objects.create_user(username="ops-unanswered")
    set_role(user, "operator")
    client.force_login(user)
    page = client.get(f"/pipelines/{name}/")
    assert page.status_code == 200
    assert "did not answer in time" in page.content.decode()
