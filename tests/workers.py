"""What two tests running at once must not share, per pytest-xdist worker (`./stack test` runs
the suite in CONTROLPLANE_TEST_WORKERS processes, 2 by default).

Loaded as a plugin (`-p tests.workers`, pyproject.toml) so that it runs before pytest-django
loads the settings: each worker then has its own Celery broker database in Redis (a worker's
Celery processes never take another worker's tasks), its own runs and checkpoints
directories under var/test-workers/<worker>/ (unless the environment names them), and
pytest-django gives it its own test database (test_<name>_<worker>). The services
themselves (PostgreSQL, Redis, Kafka, HDFS, S3) are shared: tests name their topics, tables
and roots uniquely.

The longest test files are handed out first (LONGEST, measured), each whole in one worker:
xdist's `--dist loadfile` sorts the files by their number of tests, which put the long
single-test files (the kill tests) last, one worker running them alone at the end; the
scheduler below moves LONGEST's files to the front of its queue and leaves the others in
xdist's order. (`--no-loadscope-reorder` would change the others' order too: tests/api/
test_fuzz.py's generated bodies were then accepted 9 times in 60 instead of 25, its outcome
depending on what ran before it in its process, not yet understood.) Without xdist this does
nothing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REDIS_DATABASES = 16

# The test files that take longest, longest first (./stack test with 2 workers, 2026-11-27:
# each 1.5-5 minutes, most of it real drivers started, killed and started again).
LONGEST = (
    "tests/test_launch_and_stop.py",
    "tests/test_stateful_kills.py",
    "tests/test_kafka_sink_kills.py",
    "tests/test_cassandra_kills.py",
    "tests/test_two_hosts.py",
    "tests/test_outages.py",
    "tests/test_shared_applications.py",
    "tests/test_storage_faults.py",
    "tests/test_standalone_cluster.py",
    "tests/test_cassandra_outage.py",
    "tests/test_lag_status_real.py",
    "tests/browser/test_dashboard.py",
    "tests/browser/test_failures_in_words.py",
    "tests/browser/test_night.py",
    "tests/test_kafka_sink.py",
    "tests/test_pipeline_postgres.py",
)


def worker_number() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    return int(worker.removeprefix("gw")) if worker.startswith("gw") else None


def _own_environment(number: int) -> None:
    broker = os.environ.get("CELERY_BROKER_URL")
    if broker:
        base, _, db = broker.rpartition("/")
        first = int(db or 0)
        # Downwards from the run's own database (15 by default), wrapping round.
        os.environ["CELERY_BROKER_URL"] = f"{base}/{(first - number) % REDIS_DATABASES}"
    var = Path(os.environ.get("CONTROLPLANE_VAR_DIR") or ROOT / "var")
    own = var / "test-workers" / f"gw{number}"
    for name, folder in (
        ("CONTROLPLANE_RUNS_ROOT", "runs"),
        ("CONTROLPLANE_CHECKPOINT_ROOT", "checkpoints"),
    ):
        if not os.environ.get(name):
            os.environ[name] = str(own / folder)


_number = worker_number()
if _number is not None:
    _own_environment(_number)


@pytest.hookimpl(trylast=True)  # after pytest-django's order (database tests, then the rest)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under xdist, LONGEST's files first, in that order; the rest as they were."""
    if worker_number() is None:
        return
    rank = {path: i for i, path in enumerate(LONGEST)}

    def order(item: pytest.Item) -> int:
        return rank.get(item.nodeid.split("::", 1)[0], len(LONGEST))

    items.sort(key=order)  # stable: each file's tests keep their order


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, LONGEST's files handed out first (see the module's docstring)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class LongestFirst(LoadFileScheduling):
        _ordered = False

        def _assign_work_unit(self, node) -> None:
            if not self._ordered:
                self._ordered = True
                for scope in reversed(LONGEST):
                    if scope in self.workqueue:
                        self.workqueue.move_to_end(scope, last=False)
            super()._assign_work_unit(node)

    return LongestFirst(config, log)
