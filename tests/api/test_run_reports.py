"""Heartbeats and progress from drivers: run-token auth and generation fencing."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.models import digest
from controlplane.pipelines.models import Pipeline, Run

PROGRESS = {
    "id": "q",
    "batchId": 3,
    "timestamp": "2026-11-21T10:00:00.000Z",
    "numInputRows": 1200,
    "inputRowsPerSecond": 1000.5,
    "processedRowsPerSecond": 2400.0,
    "batchDuration": 500,
    "durationMs": {"addBatch": 400, "latestOffset": 20, "triggerExecution": 500},
    "sources": [
        {
            "description": "cp_kafka",
            "startOffset": '{"t": {"0": 0}}',
            "endOffset": '{"t": {"0": 1200}, "$plan": {"min_splits": 2}}',
            "latestOffset": '{"t": {"0": 5000}}',
            "numInputRows": 1200,
        }
    ],
}


@pytest.fixture
def running(pipeline):
    """The pipeline with a current run (generation 1) whose driver holds token 'tok-1'."""
    row = Pipeline.objects.get(name="orders")
    Pipeline.objects.filter(pk=row.pk).update(
        generation=1, desired_state="running", status="running"
    )
    return Run.objects.create(
        pipeline=row, generation=1, spec_version=1, state="running", token_digest=digest("tok-1")
    )


def driver(token: str) -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"RunToken {token}")
    return client


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
