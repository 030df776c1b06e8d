"""tests/workers.py: what each pytest-xdist worker keeps to itself."""

from __future__ import annotations

import os

from tests import workers


def test_each_worker_gets_its_own_broker_database_runs_and_checkpoints(monkeypatch, tmp_path):
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:56379/15")
    monkeypatch.setenv("CONTROLPLANE_VAR_DIR", str(tmp_path))
    monkeypatch.delenv("CONTROLPLANE_RUNS_ROOT", raising=False)
    monkeypatch.setenv("CONTROLPLANE_CHECKPOINT_ROOT", "hdfs://nn:8020/named")
    workers._own_environment(1)
    assert os.environ["CELERY_BROKER_URL"] == "redis://127.0.0.1:56379/14"
    assert os.environ["CONTROLPLANE_RUNS_ROOT"] == str(tmp_path / "test-workers" / "gw1" / "runs")
    # What the environment names is kept.
    assert os.environ["CONTROLPLANE_CHECKPOINT_ROOT"] == "hdfs://nn:8020/named"
    monkeypatch.setenv("CELERY_BROKER_URL", "redis://127.0.0.1:56379/0")
    workers._own_environment(2)
    assert os.environ["CELERY_BROKER_URL"] == "redis://127.0.0.1:56379/14"


def test_the_worker_number_comes_from_xdist(monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")
    assert workers.worker_number() == 3
    monkeypatch.delenv("PYTEST_XDIST_WORKER")
    assert workers.worker_number() is None


def test_the_longest_files_exist():
    from pathlib import Path

    for path in workers.LONGEST:
        assert (workers.ROOT / Path(path)).is_file(), path
