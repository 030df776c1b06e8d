"""The checkpoints page where the checkpoint directory cannot be read: from progress reports."""

from __future__ import annotations

from tests.clients import PROGRESS, driver


def test_without_a_readable_checkpoint_the_page_comes_from_progress_reports(
    api,
    running,
    settings,
    tmp_path,
):
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "elsewhere"  # on another host
    name = running.pipeline.name
    assert api.get(f"/api/pipelines/{name}/checkpoints/").status_code == 404
    reports = [
        {
            **PROGRESS,
            "batchId": i,
            "durationMs": {"walCommit": 7 + i, "triggerExecution": 400},
            "sources": [{**PROGRESS["sources"][0], "endOffset": f'{{"t": {{"0": {100 * i}}}}}'}],
            "stateOperators": [{"numRowsTotal": 10 * i, "memoryUsedBytes": 1000 * i}],
            "eventTime": {"watermark": f"2026-11-21T10:00:0{i}.000Z"},
        }
        for i in range(1, 4)
    ]
    for report in reports:  # one by one: reported_at orders them
        response = driver("tok-1").post(f"/api/runs/{running.pk}/progress/", report, format="json")
        assert response.status_code == 200
    page = api.get(f"/api/pipelines/{name}/checkpoints/").json()
    assert page["source"] == "progress"
    assert (page["last_batch_id"], page["committed_offsets"]) == (3, {"t": {"0": 300}})
    assert page["state"] == {
        "state_rows": 30,
        "state_memory_bytes": 3000,
        "watermark": "2026-11-21T10:00:03Z",
    }
    assert [b["batch_id"] for b in page["history"]] == [3, 2, 1]
    assert [b["wal_to_commit_ms"] for b in page["history"]] == [10, 9, 8]
    assert page["history"][2]["offsets"] == {"t": {"0": 100}}
    assert page["history"][1]["state_rows"] == 20
