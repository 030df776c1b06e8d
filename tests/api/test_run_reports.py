"""Heartbeats and progress from drivers: run-token auth and generation fencing."""

from __future__ import annotations

from controlplane.definitions.models import Pipeline, Run
from tests.clients import PROGRESS, driver


def test_a_heartbeat_is_recorded_and_answered(running):
    response = driver("tok-1").post(f"/api/runs/{running.pk}/heartbeat/")
    assert response.status_code == 200
    assert response.json() == {"stop": False, "generation": 1}
    running.refresh_from_db()
    assert running.last_heartbeat_at is not None


def test_the_answer_asks_for_a_stop_when_the_pipeline_should_not_run(running):
    Pipeline.objects.filter(pk=running.pipeline_id).update(desired_state="stopped")
    assert driver("tok-1").post(f"/api/runs/{running.pk}/heartbeat/").json()["stop"] is True


def test_progress_is_stored_once_per_batch(running):
    client = driver("tok-1")
    for _ in range(2):  # a retried request must not make two rows
        response = client.post(f"/api/runs/{running.pk}/progress/", PROGRESS, format="json")
        assert response.status_code == 200
    (batch,) = running.batches.all()
    assert (batch.batch_id, batch.num_input_rows, batch.batch_duration_ms) == (3, 1200, 500)
    assert batch.end_offsets == {"t": {"0": 1200}}
    assert batch.latest_offsets == {"t": {"0": 5000}}
    running.refresh_from_db()
    assert running.last_batch_id == 3


def test_a_stale_generation_is_refused_and_told_to_stop(running):
    Pipeline.objects.filter(pk=running.pipeline_id).update(generation=2)
    response = driver("tok-1").post(f"/api/runs/{running.pk}/heartbeat/")
    assert response.status_code == 409
    assert response.json()["stop"] is True
    response = driver("tok-1").post(f"/api/runs/{running.pk}/progress/", PROGRESS, format="json")
    assert response.status_code == 409
    assert not running.batches.exists()


def test_an_exited_run_is_refused(running):
    Run.objects.filter(pk=running.pk).update(state="exited")
    assert driver("tok-1").post(f"/api/runs/{running.pk}/heartbeat/").status_code == 409


def test_a_run_token_works_only_for_its_own_run(running):
    assert driver("tok-1").post(f"/api/runs/{running.pk + 1}/heartbeat/").status_code == 403
    assert driver("wrong").post(f"/api/runs/{running.pk}/heartbeat/").status_code == 401


def test_an_api_token_is_not_a_run_token(api, running):
    assert api.post(f"/api/runs/{running.pk}/heartbeat/").status_code == 401


def test_bad_progress_gets_field_errors(running):
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/progress/", {"batchId": -1}, format="json"
    )
    assert response.status_code == 400
    assert {"batchId", "timestamp"} <= set(response.json())


def test_a_list_of_progress_reports_is_stored_in_one_request(running):
    reports = [{**PROGRESS, "batchId": i} for i in range(3, 53)]
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/progress/", reports[:30], format="json"
    )
    assert response.status_code == 200
    # A retry that overlaps what was recorded adds only the new batches.
    response = driver("tok-1").post(
        f"/api/runs/{running.pk}/progress/", reports[20:], format="json"
    )
    assert response.status_code == 200
    assert sorted(running.batches.values_list("batch_id", flat=True)) == list(range(3, 53))
    running.refresh_from_db()
    assert running.last_batch_id == 52


def test_progress_lists_are_bounded_and_validated_item_by_item(running):
    client = driver("tok-1")
    url = f"/api/runs/{running.pk}/progress/"
    too_many = [{**PROGRESS, "batchId": i} for i in range(101)]
    response = client.post(url, too_many, format="json")
    assert response.status_code == 400
    assert "100" in str(response.json())
    assert client.post(url, [], format="json").status_code == 400
    response = client.post(url, [PROGRESS, {"batchId": -1}], format="json")
    assert response.status_code == 400
    assert set(response.json()) == {"1.batchId", "1.timestamp"}  # the item and its fields
    assert not running.batches.exists()  # nothing of a refused request is kept


def test_state_operators_and_the_watermark_are_kept(running):
    report = {
        **PROGRESS,
        "stateOperators": [
            {"operatorName": "stateStoreSave", "numRowsTotal": 1500, "memoryUsedBytes": 40_000},
            {"operatorName": "dedupe", "numRowsTotal": 500, "memoryUsedBytes": 2_000},
        ],
        "eventTime": {"watermark": "2026-11-21T09:59:30.000Z", "max": "2026-11-21T10:00:00.000Z"},
    }
    without = {**PROGRESS, "batchId": 4, "eventTime": {"watermark": "1970-01-01T00:00:00.000Z"}}
    client = driver("tok-1")
    assert (
        client.post(f"/api/runs/{running.pk}/progress/", report, format="json").status_code == 200
    )
    assert (
        client.post(f"/api/runs/{running.pk}/progress/", without, format="json").status_code == 200
    )
    first, second = running.batches.order_by("batch_id")
    assert (first.state_rows, first.state_memory_bytes) == (2000, 42_000)
    assert first.watermark.isoformat() == "2026-11-21T09:59:30+00:00"
    assert (second.state_rows, second.state_memory_bytes, second.watermark) == (None, None, None)


def test_an_unknown_run_token_is_refused_and_logged_without_the_token(running, caplog):
    with caplog.at_level("WARNING", logger="controlplane.security"):
        response = driver("forged-token-xyz").post(f"/api/runs/{running.pk}/heartbeat/", {})
    assert response.status_code == 401
    assert "unknown run token" in caplog.text
    assert "forged-token-xyz" not in caplog.text
