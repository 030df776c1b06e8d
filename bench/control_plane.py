"""The control plane under 1,000 pipelines, next to an empty-database baseline from the same run.

    .venv/bin/python bench/control_plane.py [--pipelines 1000]   (after ./stack services)

In a throwaway database on the stack's PostgreSQL, with the web app served the way
`./stack up` serves it (gunicorn, on its own port) and a real Kafka topic on the stack's broker:

  baseline   one pipeline with one running run;
  loaded     the same plus N-1 more pipelines registered through the API, each with a running
             run (fresh heartbeats, so the reconciler observes every one of them) and a stream
             of synthetic batch progress.

For both it measures: the progress ingestion rate the web app sustains (4 drivers posting
one report per request; the batched form drivers use after an outage, 20 reports per
request; and shared applications sending their members' reports together, 25 members a
request), the metrics collector's round over every pipeline (median of 3: Kafka asked once,
figures and lag samples stored), the latency of GET /api/pipelines/{name}/metrics/, of the
overview page and of a pipeline's page (p50, p95; signed in as a viewer), a full Prometheus
scrape (median and slowest of 10), and the reconcile tick (median of 5). The last line is
one JSON object; the goals of #15 are printed beside the figures at 1,000 pipelines.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import serve_web_app  # noqa: E402

SENDERS = 4


def progress(batch_id: int, topic: str, at: datetime, end: int) -> dict:
    return {
        "id": "bench",
        "batchId": batch_id,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "numInputRows": 1000,
        "inputRowsPerSecond": 1000.0,
        "processedRowsPerSecond": 4000.0,
        "batchDuration": 250,
        "durationMs": {"addBatch": 200, "walCommit": 5, "triggerExecution": 250},
        "sources": [
            {
                "description": "cp_kafka",
                "endOffset": json.dumps({topic: {"0": end}}),
                "latestOffset": json.dumps({topic: {"0": end + 100}}),
                "numInputRows": 1000,
            }
        ],
        "stateOperators": [],
    }


class Bench:
    def __init__(self, base: str, api_token: str, topic: str):
        self.base = base
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"Token {api_token}"
        self.topic = topic
        self.runs: list[tuple[str, int, str]] = []  # pipeline name, run id, run token
        self.next_batch: dict[int, int] = {}

    def register(self, name: str, spec: dict) -> None:
        response = self.api.post(f"{self.base}/api/pipelines/", json={"name": name, "spec": spec})
        response.raise_for_status()

    def ingest(self, reports: int, per_request: int) -> float:
        """Reports per second, `reports` of them spread over every run, SENDERS at once."""
        jobs = []
        for i in range(reports // per_request):
            _, run_id, token = self.runs[i % len(self.runs)]
            first = self.next_batch.get(run_id, 0)
            self.next_batch[run_id] = first + per_request
            jobs.append((run_id, token, first))

        def send(session, job) -> None:
            run_id, token, first = job
            now = datetime.now(UTC)
            body = [progress(b, self.topic, now, 10 * b) for b in range(first, first + per_request)]
            response = session.post(
                f"{self.base}/api/runs/{run_id}/progress/",
                json=body if per_request > 1 else body[0],
                headers={"Authorization": f"RunToken {token}"},
                timeout=30,
            )
            response.raise_for_status()

        return len(jobs) * per_request / self.post_all(send, jobs)

    @staticmethod
    def post_all(send, jobs: list) -> float:
        """Seconds to `send(session, job)` every job, SENDERS at once (a session each)."""
        local = threading.local()

        def one(job) -> None:
            if getattr(local, "session", None) is None:
                local.session = requests.Session()
            send(local.session, job)

        started = time.perf_counter()
        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(one, jobs))
        return time.perf_counter() - started

    def ingest_shared(self, reports: int, per_request: int = 25) -> float:
        """Reports per second as shared applications send them: their members' reports in
        one request each (`/api/applications/{name}/reports/`), `per_request` members an
        application, SENDERS applications at once. The applications exist only meanwhile."""
        from controlplane.accounts.models import digest
        from controlplane.definitions.models import Run, SparkApplication

        groups = [self.runs[i : i + per_request] for i in range(0, len(self.runs), per_request)]
        apps = []
        for n, group in enumerate(groups):
            token = uuid.uuid4().hex
            app = SparkApplication.objects.create(
                name=f"bench-app-{n}", token_digest=digest(token), generation=1
            )
            Run.objects.filter(pk__in=[run_id for _, run_id, _ in group]).update(
                application=app, application_generation=1
            )
            apps.append((app.name, token, group))
        jobs = []
        for i in range(reports // per_request):
            name, token, group = apps[i % len(apps)]
            items = []
            for j in range(per_request):
                _, run_id, run_token = group[j % len(group)]
                batch = self.next_batch.get(run_id, 0)
                self.next_batch[run_id] = batch + 1
                items.append((run_id, run_token, batch))
            jobs.append((name, token, items))

        def send(session, job) -> None:
            name, token, items = job
            now = datetime.now(UTC)
            body = {
                "reports": [
                    {
                        "run_id": run_id,
                        "token": run_token,
                        "kind": "progress",
                        "body": progress(batch, self.topic, now, 10 * batch),
                    }
                    for run_id, run_token, batch in items
                ]
            }
            response = session.post(
                f"{self.base}/api/applications/{name}/reports/",
                json=body,
                headers={"Authorization": f"RunToken {token}"},
                timeout=30,
            )
            response.raise_for_status()
            refused = [a for a in response.json()["answers"] if a["status"] != 200]
            assert not refused, refused[:3]

        try:
            return len(jobs) * per_request / self.post_all(send, jobs)
        finally:
            SparkApplication.objects.filter(name__startswith="bench-app-").delete()

    def metrics_latency(self, requests_: int) -> tuple[float, float]:
        def check(response) -> None:
            assert response.json()["lag"]["error"] is None, response.json()["lag"]

        return self.latency(requests_, "/api/pipelines/{name}/metrics/", self.api, check)

    def latency(self, requests_: int, path: str, session, check=None) -> tuple[float, float]:
        """p50 and p95 in ms of GET `path` ({name}: a random pipeline)."""
        names = [name for name, _, _ in self.runs]
        times = []
        for _ in range(requests_):
            url = self.base + path.format(name=random.choice(names))
            started = time.perf_counter()
            response = session.get(url, timeout=30)
            times.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            if check:
                check(response)
        times.sort()
        return statistics.median(times), times[int(0.95 * (len(times) - 1))]

    def scrape(self, rounds: int = 10) -> tuple[float, float]:
        """Median and slowest full Prometheus scrape, ms."""
        times = []
        for _ in range(rounds):
            started = time.perf_counter()
            response = self.api.get(f"{self.base}/metrics", timeout=60)
            times.append((time.perf_counter() - started) * 1000)
            response.raise_for_status()
            assert b"cp_lag_records" in response.content
        return statistics.median(times), max(times)


def viewer_session(base: str):
    """A signed-in viewer's browser session (a session row, as a sign-in makes it)."""
    from django.contrib.auth import (
        BACKEND_SESSION_KEY,
        HASH_SESSION_KEY,
        SESSION_KEY,
        get_user_model,
    )
    from django.contrib.sessions.backends.db import SessionStore

    from controlplane.accounts.roles import VIEWER, set_role

    user = get_user_model().objects.create_user("bench-viewer", password=uuid.uuid4().hex)
    set_role(user, VIEWER)
    store = SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    session = requests.Session()
    session.cookies.set("sessionid", store.session_key, domain="127.0.0.1")
    response = session.get(f"{base}/", timeout=30)
    response.raise_for_status()
    assert "Pipelines" in response.text and "/login" not in response.url, response.url
    return session


def collector_round_ms(rounds: int = 3) -> tuple[float, dict]:
    from django.utils import timezone

    from controlplane.observability.collector import collect

    times, summary = [], {}
    for _ in range(rounds):
        started = time.perf_counter()
        summary = collect(timezone.now())
        times.append((time.perf_counter() - started) * 1000)
        assert "skipped" not in summary and summary["lag_unknown"] == 0, summary
    return statistics.median(times), summary


def tick_ms(rounds: int = 5) -> float:
    from django.utils import timezone

    from controlplane.definitions.models import Run
    from controlplane.supervision import reconciler

    times = []
    for _ in range(rounds):
        now = timezone.now()
        Run.objects.filter(state="running").update(last_heartbeat_at=now, last_batch_at=now)
        started = time.perf_counter()
        summary = reconciler.tick(now)
        times.append((time.perf_counter() - started) * 1000)
        assert not summary["actions"], summary["actions"]  # healthy runs: observed, untouched
    return statistics.median(times)


def start_runs(bench: Bench, names: list[str]) -> None:
    from controlplane.accounts.models import digest
    from controlplane.definitions.models import Pipeline, Run

    now = datetime.now(UTC)
    for pipeline in Pipeline.objects.filter(name__in=names):
        Pipeline.objects.filter(pk=pipeline.pk).update(
            generation=1, desired_state="running", status="running"
        )
        token = uuid.uuid4().hex
        run = Run.objects.create(
            pipeline=pipeline,
            generation=1,
            spec_version=1,
            state="running",
            host=socket.gethostname(),
            pid=os.getpid(),  # alive: the reconciler leaves healthy runs alone
            token_digest=digest(token),
            started_at=now - timedelta(minutes=5),
            last_heartbeat_at=now,
            last_batch_at=now,
        )
        bench.runs.append((pipeline.name, run.pk, token))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipelines", type=int, default=1000)
    parser.add_argument("--reports", type=int, default=4000, help="per ingestion measurement")
    parser.add_argument("--metrics-requests", type=int, default=200)
    parser.add_argument("--page-requests", type=int, default=100)
    args = parser.parse_args()

    admin_url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    db_name = f"cp_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    bench_url = admin_url.rsplit("/", 1)[0] + "/" + db_name
    env = {**os.environ, "DATABASE_URL": bench_url}
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    server = None
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth import get_user_model

        from controlplane.accounts.models import ApiToken
        from controlplane.accounts.roles import EDITOR, set_role
        from controlplane.definitions.models import BatchProgress
        from jobs.loadgen import ensure_topic

        user = get_user_model().objects.create_user("bench", password=uuid.uuid4().hex)
        set_role(user, EDITOR)
        _, key = ApiToken.issue(user, "bench")
        server, base = serve_web_app(env)

        topic = f"bench-cp-{uuid.uuid4().hex[:8]}"
        ensure_topic(bootstrap, topic, 1)
        from kafka import KafkaProducer

        producer = KafkaProducer(bootstrap_servers=bootstrap)
        for i in range(1000):
            producer.send(topic, value=b'{"n": %d}' % i, partition=0)
        producer.flush()
        producer.close()

        bench = Bench(base, key, topic)
        bench.api.post(
            f"{base}/api/connections/",
            json={"name": "k", "kind": "kafka", "settings": {"bootstrap_servers": [bootstrap]}},
        ).raise_for_status()
        sink = os.environ.get("CONTROLPLANE_SINK_DATABASE_URL", admin_url)
        bench.api.post(
            f"{base}/api/connections/",
            json={"name": "pg", "kind": "postgres", "settings": {"dsn": sink}},
        ).raise_for_status()
        spec = {
            "source": {"connection": "k", "topics": [topic], "schema": "n INT"},
            "sink": {"connection": "pg", "table": "bench_cp"},
        }

        def measure(label: str) -> dict:
            single = bench.ingest(args.reports, 1)
            batched = bench.ingest(args.reports * 5, 20)
            shared = bench.ingest_shared(args.reports * 5)
            collector, summary = collector_round_ms()
            p50, p95 = bench.metrics_latency(args.metrics_requests)
            o50, o95 = bench.latency(args.page_requests, "/", viewer)
            d50, d95 = bench.latency(args.page_requests, "/pipelines/{name}/", viewer)
            scrape, slowest_scrape = bench.scrape()
            tick = tick_ms()
            print(
                f"{label:<10} {len(bench.runs):>5} pipelines: ingestion {single:,.0f} reports/s"
                f" (batched by 20: {batched:,.0f}/s; shared applications, 25 members a"
                f" request: {shared:,.0f}/s); collector round {collector:.0f} ms"
                f" ({summary['kafka_bound_lookups']} Kafka bound lookups); metrics API p50"
                f" {p50:.1f} ms p95 {p95:.1f} ms; overview p50 {o50:.1f} ms p95 {o95:.1f} ms;"
                f" pipeline page p50 {d50:.1f} ms p95 {d95:.1f} ms; Prometheus scrape"
                f" {scrape:.0f} ms (slowest {slowest_scrape:.0f}); reconcile tick {tick:.1f} ms",
                flush=True,
            )
            return {
                "ingest_reports_per_s": round(single),
                "ingest_batched_reports_per_s": round(batched),
                "ingest_shared_reports_per_s": round(shared),
                "collector_round_ms": round(collector, 1),
                "metrics_p50_ms": round(p50, 1),
                "metrics_p95_ms": round(p95, 1),
                "overview_p50_ms": round(o50, 1),
                "overview_p95_ms": round(o95, 1),
                "pipeline_page_p50_ms": round(d50, 1),
                "pipeline_page_p95_ms": round(d95, 1),
                "scrape_ms": round(scrape, 1),
                "scrape_max_ms": round(slowest_scrape, 1),
                "tick_ms": round(tick, 1),
            }

        bench.register("p0000", spec)
        start_runs(bench, ["p0000"])
        viewer = viewer_session(base)
        # Warm-up, not measured: gunicorn's workers import and connect on first use.
        bench.ingest(200, 1)
        collector_round_ms(1)
        bench.metrics_latency(50)
        bench.latency(20, "/", viewer)
        bench.latency(20, "/pipelines/{name}/", viewer)
        baseline = measure("baseline")

        started = time.perf_counter()
        names = [f"p{i:04d}" for i in range(1, args.pipelines)]
        with ThreadPoolExecutor(SENDERS) as pool:
            list(pool.map(lambda n: bench.register(n, spec), names))
        print(
            f"registered {len(names)} pipelines through the API in"
            f" {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        start_runs(bench, names)
        loaded = measure("loaded")
        rows = BatchProgress.objects.count()
        print(f"progress rows stored: {rows:,}")
        ratios = {k: round(loaded[k] / baseline[k], 2) if baseline[k] else None for k in baseline}
        print("loaded / baseline:   " + ", ".join(f"{k} {v}" for k, v in ratios.items()))
        goals = {
            "tick_ms": ("<", 1000),
            "overview_p95_ms": ("<", 300),
            "pipeline_page_p95_ms": ("<", 300),
            "scrape_ms": ("<", 1000),
            "ingest_reports_per_s": (">=", 2000),
            "ingest_batched_reports_per_s": (">=", 2000),
            "ingest_shared_reports_per_s": (">=", 2000),
        }
        met = {}
        for key, (op, goal) in goals.items():
            value = loaded[key]
            met[key] = value < goal if op == "<" else value >= goal
            print(f"goal {key} {op} {goal}: {value} -> {'met' if met[key] else 'NOT met'}")
        line = json.dumps(
            {
                "pipelines": len(bench.runs),
                "progress_rows": rows,
                "baseline": baseline,
                "loaded": loaded,
                "loaded_to_baseline": ratios,
                "goals_met": met,
                "machine": {
                    "host": socket.gethostname(),
                    "cpus": os.cpu_count(),
                    "date": datetime.now(UTC).strftime("%Y-%m-%d"),
                },
            }
        )
        print(line)
        results = ROOT / "bench" / "results"
        results.mkdir(exist_ok=True)
        (results / "control_plane.json").write_text(line + "\n")
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
