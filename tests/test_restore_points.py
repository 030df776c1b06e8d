"""Restore points without Spark: checkpoint directories laid out as Spark writes them
(write-ahead and commit logs with Hadoop's checksum files, state store versions, a batch in
flight), copied, cut back, restored, kept and pruned; the API by role; the reconciler's
restore point before a new spec version runs; a pipeline's deletion. The round trip with
real Spark is in test_restore_points_spark.py."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.definitions import checkpoints as locations
from controlplane.definitions.models import (
    AuditEntry,
    DesiredState,
    Pipeline,
    RestorePoint,
    Run,
    RunState,
)
from controlplane.supervision import restore_points
from jobs import checkpoints
from tests import stores
from tests.spark_helpers import fake_checkpoint


def names(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*") if p.is_file()}


def test_a_copy_is_cut_back_to_the_last_committed_batch_and_shares_the_files(tmp_path):
    source = fake_checkpoint(tmp_path / "live", committed=3)
    copied = checkpoints.copy_committed(source, tmp_path / "copy")
    assert copied.last_committed.batch_id == 3
    assert copied.in_flight == []
    kept = names(tmp_path / "copy")
    assert "offsets/4" not in kept and "offsets/.4.crc" not in kept
    assert "state/0/0/5.delta" not in kept and "state/0/0/.5.delta.crc" not in kept
    assert {"offsets/3", "offsets/.3.crc", "commits/3", "state/0/0/4.delta"} <= kept
    assert {"metadata", ".metadata.crc", "sources/0/0"} <= kept
    assert not any(n.endswith(".tmp") for n in kept)
    # Hard links: the same data, no copy; the live checkpoint is untouched.
    assert os.path.samefile(source / "offsets" / "3", tmp_path / "copy" / "offsets" / "3")
    assert "offsets/4" in names(source)
    assert copied.committed_offsets() == {("orders", 0): 40, ("orders", 1): 20}


def test_nothing_is_copied_from_a_checkpoint_without_a_commit(tmp_path):
    source = fake_checkpoint(tmp_path / "live", committed=-1)
    assert checkpoints.copy_committed(source, tmp_path / "copy") is None
    assert not (tmp_path / "copy").exists()
    assert checkpoints.copy_committed(tmp_path / "missing", tmp_path / "copy") is None


def test_a_new_query_id_drops_the_old_checksum(tmp_path):
    root = fake_checkpoint(tmp_path / "live", committed=0)
    new = checkpoints.new_query_id(root)
    assert json.loads((root / "metadata").read_text()) == {"id": new}
    assert new != "11111111-old"
    assert not (root / ".metadata.crc").exists()


@pytest.fixture
def store(settings, tmp_path):
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    return tmp_path / "checkpoints"


def live(where, name: str = "orders", committed: int = 3) -> str:
    if isinstance(where, Path):
        return fake_checkpoint(where / name, committed=committed)
    return stores.fake_checkpoint(where.store, locations.location(name), committed=committed)


def read(where, name: str = "orders"):
    return checkpoints.read_checkpoint(locations.location(name), store=where.store)


def new_run(pipeline: Pipeline, generation: int, spec_version: int, state=RunState.EXITED):
    return Run.objects.create(
        pipeline=pipeline, generation=generation, spec_version=spec_version, state=state
    )


@pytest.mark.django_db
def test_restore_points_are_taken_listed_and_deleted_through_the_api(
    api, pipeline, checkpoint_store
):
    live(checkpoint_store)
    response = api.post(
        "/api/pipelines/orders/restore-points/", {"reason": "before the upgrade"}, format="json"
    )
    assert response.status_code == 201, response.json()
    point = response.json()
    assert point["kind"] == "manual"
    assert point["last_batch_id"] == 3
    assert point["offsets"] == {"orders": {"0": 40, "1": 20}}
    assert point["created_by"] == "oncall"
    assert point["size_bytes"] > 0 and point["files"] > 0
    assert "path" not in point  # where the files are is the control plane's business
    listed = api.get("/api/pipelines/orders/restore-points/").json()["results"]
    assert [p["id"] for p in listed] == [point["id"]]
    entry = AuditEntry.objects.get(action="restore-point")
    assert entry.reason == "before the upgrade"
    assert entry.after["last_batch_id"] == 3

    row = RestorePoint.objects.get(pk=point["id"])
    response = api.delete(f"/api/pipelines/orders/restore-points/{point['id']}/?reason=tidy")
    assert response.status_code == 204
    assert not checkpoint_store.store.exists(row.path)
    assert AuditEntry.objects.get(action="restore-point-deleted").reason == "tidy"
    missing = api.delete(f"/api/pipelines/orders/restore-points/{point['id']}/")
    assert missing.status_code == 404
    assert missing.json()["detail"] == f"pipeline 'orders' has no restore point {point['id']}"


@pytest.mark.django_db
def test_a_pipeline_with_nothing_committed_has_nothing_to_restore_to(api, pipeline, store):
    response = api.post("/api/pipelines/orders/restore-points/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "pipeline 'orders' has no committed batch yet: nothing to restore to"
    )


@pytest.mark.django_db
def test_a_restore_keeps_the_current_checkpoint_and_gives_the_query_a_new_id(
    api, pipeline, checkpoint_store
):
    live(checkpoint_store, committed=2)
    first = api.post("/api/pipelines/orders/restore-points/").json()
    # The pipeline goes on: batches 3..6 are committed after the restore point.
    live(checkpoint_store, committed=6)
    Pipeline.objects.filter(name="orders").update(offsets_reset={"orders": {"0": 0}})

    body = {"restore_point": first["id"], "reason": "bad batch"}
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.RUNNING)
    refused = api.post("/api/pipelines/orders/restore/", body, format="json")
    assert refused.status_code == 409
    assert refused.json()["detail"] == "pipeline 'orders' is wanted running: stop it first"
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.STOPPED)
    run = new_run(Pipeline.objects.get(name="orders"), 1, 1, state=RunState.STOPPING)
    refused = api.post("/api/pipelines/orders/restore/", body, format="json")
    assert refused.status_code == 409
    assert "still has run 1 (stopping)" in refused.json()["detail"]
    Run.objects.filter(pk=run.pk).update(state=RunState.EXITED)

    response = api.post("/api/pipelines/orders/restore/", body, format="json")
    assert response.status_code == 200, response.json()
    done = response.json()
    assert done["last_batch_id"] == 2
    restored = read(checkpoint_store)
    assert restored.last_committed.batch_id == 2 and restored.in_flight == []
    assert restored.query_id == done["query_id"] != "11111111-old"
    kept = RestorePoint.objects.get(pk=done["kept_restore_point"])
    assert (kept.kind, kept.last_batch_id) == ("before-restore", 6)
    assert Pipeline.objects.get(name="orders").offsets_reset is None
    entry = AuditEntry.objects.get(action="restore")
    assert (entry.reason, entry.before["last_batch_id"]) == ("bad batch", 6)
    # The restore point itself is untouched: it can be restored again.
    path = RestorePoint.objects.get(pk=first["id"]).path
    assert (
        checkpoints.read_checkpoint(path, store=checkpoint_store.store).query_id == "11111111-old"
    )
    again = api.post("/api/pipelines/orders/restore/", body, format="json")
    assert again.status_code == 200, again.json()
    assert read(checkpoint_store).last_committed.batch_id == 2

    unknown = api.post("/api/pipelines/orders/restore/", {"restore_point": 999}, format="json")
    assert unknown.status_code == 400
    assert unknown.json() == {"restore_point": ["pipeline 'orders' has no restore point 999"]}


@pytest.mark.django_db
def test_retention_keeps_the_newest_by_count_and_age(pipeline, checkpoint_store, settings):
    settings.CONTROLPLANE_RESTORE_POINTS_KEEP = 3
    settings.CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS = 6
    orders = Pipeline.objects.get(name="orders")
    now = timezone.now()
    live(checkpoint_store)
    taken = [
        restore_points.take(orders, now=now - timedelta(days=10 - i), reason=str(i))
        for i in range(5)
    ]
    # Each take pruned by count: the three newest remain (ages 8, 7 and 6 days by then).
    left = list(RestorePoint.objects.filter(pipeline_name="orders").order_by("created_at"))
    assert [p.reason for p in left] == ["2", "3", "4"]
    assert not checkpoint_store.store.exists(taken[0].path)
    assert checkpoint_store.store.exists(left[0].path)
    # By age (now, more than 6 days old): 8 and 7 days go; the newest always stays.
    assert restore_points.prune("orders", now) == 2
    assert [p.reason for p in RestorePoint.objects.filter(pipeline_name="orders")] == ["4"]
    assert restore_points.prune("orders", now + timedelta(days=365)) == 0


@pytest.mark.django_db
def test_scheduled_restore_points_follow_the_interval_and_need_progress(pipeline, store):
    orders = Pipeline.objects.get(name="orders")
    live(store, committed=3)
    new_run(orders, 1, 1, state=RunState.RUNNING)
    now = timezone.now()
    assert restore_points.tick(now)["taken"] == 0  # no schedule
    Pipeline.objects.filter(pk=orders.pk).update(restore_point_minutes=60)
    assert restore_points.tick(now)["taken"] == 1
    assert restore_points.tick(now + timedelta(minutes=30))["taken"] == 0  # not due
    assert restore_points.tick(now + timedelta(minutes=61))["taken"] == 0  # no new commit
    fake_checkpoint(store / "orders", committed=5)
    assert restore_points.tick(now + timedelta(minutes=62))["taken"] == 1
    points = RestorePoint.objects.filter(pipeline_name="orders")
    assert [(p.kind, p.last_batch_id, p.spec_version) for p in points] == [
        ("scheduled", 5, 1),
        ("scheduled", 3, 1),
    ]
    assert not AuditEntry.objects.filter(action="restore-point").exists()  # not a person's


@pytest.mark.django_db
def test_a_new_spec_versions_first_run_keeps_the_old_versions_checkpoint(pipeline, store):
    orders = Pipeline.objects.get(name="orders")
    live(store, committed=4)
    now = timezone.now()
    assert restore_points.before_change(new_run(orders, 1, 1), now) is None  # first run
    assert restore_points.before_change(new_run(orders, 2, 1), now) is None  # same version
    point = restore_points.before_change(new_run(orders, 3, 2, state=RunState.STARTING), now)
    assert (point.kind, point.spec_version, point.last_batch_id) == ("before-change", 1, 4)
    assert point.reason == "before version 2 (was 1)"


@pytest.mark.django_db(transaction=True)
def test_a_deleted_pipeline_leaves_its_checkpoint_as_its_last_restore_point(
    api, pipeline, checkpoint_store
):
    orders = Pipeline.objects.get(name="orders")
    live(checkpoint_store, committed=2)
    restore_points.take(orders, now=timezone.now() - timedelta(hours=1))
    live(checkpoint_store, committed=5)
    new_run(orders, 1, 1)
    bad = api.delete("/api/pipelines/orders/?keep_restore_point=maybe")
    assert bad.status_code == 400
    assert bad.json() == {"keep_restore_point": ["must be true or false"]}
    assert api.delete("/api/pipelines/orders/").status_code == 204
    # A pipeline created again under the name starts afresh.
    assert not checkpoint_store.store.exists(locations.location("orders"))
    (left,) = RestorePoint.objects.filter(pipeline_name="orders")
    assert (left.kind, left.last_batch_id, left.spec_version, left.pipeline) == (
        "before-delete",
        5,
        1,
        None,
    )
    # Created again under the name: the restore point is there to restore to.
    from tests.factories import valid_spec

    api.post("/api/pipelines/", {"name": "orders", "spec": valid_spec()}, format="json")
    listed = api.get("/api/pipelines/orders/restore-points/").json()["results"]
    assert [p["id"] for p in listed] == [left.pk]
    response = api.post("/api/pipelines/orders/restore/", {"restore_point": left.pk}, format="json")
    assert response.status_code == 200, response.json()
    assert read(checkpoint_store).last_committed.batch_id == 5

    # Deleted again, asked not to keep anything: nothing is left.
    assert api.delete("/api/pipelines/orders/?keep_restore_point=false").status_code == 204
    assert not RestorePoint.objects.exists()
    assert not checkpoint_store.store.exists(locations.location("orders"))
    assert checkpoint_store.store.list(locations.restore_points_location("orders")) == []


@pytest.mark.django_db
def test_the_schedule_is_part_of_the_definition(api, pipeline):
    response = api.patch("/api/pipelines/orders/", {"restore_point_minutes": 30}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["restore_point_minutes"] == 30
    assert api.get("/api/pipelines/orders/").json()["restore_point_minutes"] == 30
    entry = AuditEntry.objects.filter(action="update").first()
    assert (entry.before["restore_point_minutes"], entry.after["restore_point_minutes"]) == (
        None,
        30,
    )
    bad = api.patch("/api/pipelines/orders/", {"restore_point_minutes": 0}, format="json")
    assert bad.status_code == 400
    assert "restore_point_minutes" in bad.json()
    off = api.patch("/api/pipelines/orders/", {"restore_point_minutes": None}, format="json")
    assert off.json()["restore_point_minutes"] is None


@pytest.mark.django_db
def test_the_pipeline_page_lists_takes_restores_and_deletes_restore_points(
    client, django_user_model, pipeline, store
):
    from controlplane.accounts.roles import set_role

    operator = django_user_model.objects.create_user(username="ops")
    set_role(operator, "operator")
    client.force_login(operator)
    live(store, committed=2)
    page = client.post("/pipelines/orders/restore-points", {"reason": "by hand"}, follow=True)
    text = page.content.decode()
    point = RestorePoint.objects.get()
    assert f"Restore point {point.pk} taken (batch 2)." in text
    assert f'data-restore-point="{point.pk}"' in text and "by hand" in text

    body = {"restore_point": point.pk, "confirm": "wrong", "reason": "r"}
    text = client.post("/pipelines/orders/restore", body, follow=True).content.decode()
    assert "Not restored: type the pipeline&#x27;s name (orders) to confirm." in text
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.RUNNING)
    body["confirm"] = "orders"
    text = client.post("/pipelines/orders/restore", body, follow=True).content.decode()
    assert "Not restored: pipeline &#x27;orders&#x27; is wanted running: stop it first." in text
    Pipeline.objects.filter(name="orders").update(desired_state=DesiredState.STOPPED)
    text = client.post("/pipelines/orders/restore", body, follow=True).content.decode()
    kept = RestorePoint.objects.get(kind="before-restore")
    assert (
        f"orders restored to batch 2: its next start reads on from there (the replaced"
        f" checkpoint is kept as restore point {kept.pk})."
    ) in text

    gone = f"/pipelines/orders/restore-points/{point.pk}/delete"
    text = client.post(gone, {"reason": "tidy"}, follow=True).content.decode()
    assert "Not deleted: type the pipeline&#x27;s name (orders) to confirm." in text
    text = client.post(gone, {"reason": "tidy", "confirm": "orders"}, follow=True).content.decode()
    assert f"Restore point {point.pk} deleted." in text
    assert list(RestorePoint.objects.values_list("pk", flat=True)) == [kept.pk]


@pytest.mark.django_db
def test_a_restore_point_whose_files_are_gone_leaves_the_checkpoint_in_place(api, pipeline, store):
    live(store, committed=2)
    point = api.post("/api/pipelines/orders/restore-points/").json()
    fake_checkpoint(store / "orders", committed=5)
    row = RestorePoint.objects.get(pk=point["id"])
    Path(row.path, "commits", "2").unlink()  # damaged since it was taken
    response = api.post("/api/pipelines/orders/restore/", {"restore_point": row.pk}, format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        f"restore point {row.pk}'s files are incomplete or gone ({row.path})"
    )
    assert checkpoints.read_checkpoint(store / "orders").last_committed.batch_id == 5
    assert not (store / ".orders.restoring").exists()
    assert list(RestorePoint.objects.values_list("kind", flat=True)) == ["manual"]


@pytest.mark.django_db
def test_retention_counts_per_kind(pipeline, store, settings):
    settings.CONTROLPLANE_RESTORE_POINTS_KEEP = 2
    orders = Pipeline.objects.get(name="orders")
    now = timezone.now()
    live(store)
    restore_points.take(orders, kind="before-change", now=now - timedelta(hours=5))
    for i in range(4):
        restore_points.take(orders, kind="scheduled", now=now - timedelta(hours=4 - i))
    kinds = list(RestorePoint.objects.values_list("kind", flat=True))
    assert kinds == ["scheduled", "scheduled", "before-change"]  # not pushed out
