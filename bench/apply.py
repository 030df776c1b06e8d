"""Plan and apply of a fleet's files (POST /api/apply/) next to the REST API one by one, in one run.

    .venv/bin/python bench/apply.py [--sizes 200 1000 --rounds 2]   (after ./stack services)

In a throwaway database on the stack's PostgreSQL, with the web app served the way
`./stack up` serves it (gunicorn, gthread, 2 workers of 8 threads, on its own port), for each
size N: one PipelineTemplate of N instances (a Kafka source on the stack's broker, an upsert
into a table of its own in the stack's sink database; the sink's password given as
`{env: FLEET_SECRET_BENCH_SINK}`, a variable of gunicorn's environment) and its two
connections, in fleet `bench`, each request `preflight: false`:

  plan new        dry_run of the N pipelines on a control plane without them
  apply new       the same applied
  plan unchanged  the same files again, dry_run            (goal at N=1000: <= 2 s)
  apply unchanged the same files again, applied
  plan updates    one template parameter's default changed (the trigger interval), dry_run
  apply updates   the same applied (N new versions)

against the baseline, the same N pipelines through the REST API one by one (one
requests.Session, sequential):

  create          POST /api/pipelines/ {name, spec, labels}, N times  (for plan/apply new)
  patch same      PATCH /api/pipelines/{name}/ with the spec and labels it has, N times
                  (the API's way to say the same again; for plan/apply unchanged)
  patch change    PATCH /api/pipelines/{name}/ {"spec": {"trigger": {"interval_seconds":
                  10}}}, N times (for plan/apply updates)

Every phase starts from no pipelines (deleted through the ORM, their fleet records too,
then VACUUM ANALYZE). This machine's speed drifts, so the rounds are interleaved (fleet then
REST, then REST then fleet; --rounds) and medians are reported, each fleet figure with its
baseline as a ratio (fleet / REST: below 1, the fleet is faster). Times are the client's, a
request sent to its answer read. For information: one apply of 200 new pipelines with
`preflight: true` (each pipeline's Kafka topic and sink table asked about, for real), and
the request body's size. The last line is one JSON object, also written to
bench/results/apply.json (goal at N=200: apply of new <= 10 s).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import machine, serve_web_app  # noqa: E402

FLEET = "bench"
TEMPLATE = "bench-orders"
SINK_REFERENCE_VAR = "FLEET_SECRET_BENCH_SINK"
INTERVAL, CHANGED_INTERVAL = 5, 10
SCHEMA = "id STRING, amount DOUBLE, ts TIMESTAMP"
GOALS = {"plan_1000_unchanged_s": 2.0, "apply_200_new_s": 10.0}


def delete_topic(bootstrap: str, topic: str) -> None:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.delete_topics([topic])
    except Exception as exc:
        print(f"(could not delete topic {topic}: {exc})", file=sys.stderr)
    finally:
        admin.close()


def sink_dsn_and_password(url: str) -> tuple[str, str | None]:
    """The sink's DSN without its password, and the password (None: the DSN has none)."""
    parts = urlsplit(url)
    if parts.password is None:
        return url, None
    host = parts.hostname or ""
    netloc = f"{parts.username}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc)), parts.password


def names(n: int) -> list[str]:
    return [f"bench-{i:04d}" for i in range(n)]


def key_of(name: str) -> str:
    return "k" + name.removeprefix("bench-")


def connections_yaml(bootstrap: str, dsn: str) -> str:
    return f"""apiVersion: controlplane/v1
kind: Connection
name: bench-kafka
spec:
  kind: kafka
  settings: {{bootstrap_servers: [{json.dumps(bootstrap)}]}}
---
apiVersion: controlplane/v1
kind: Connection
name: bench-sink
spec:
  kind: postgres
  settings: {{dsn: {json.dumps(dsn)}}}
  secrets: {{password: {{env: {SINK_REFERENCE_VAR}}}}}
"""


def template_yaml(n: int, topic: str, interval: int) -> str:
    head = f"""apiVersion: controlplane/v1
kind: PipelineTemplate
name: {TEMPLATE}
labels: {{team: bench}}
spec:
  parameters:
    key: {{type: string}}
    topic: {{type: string, default: {json.dumps(topic)}}}
    interval: {{type: integer, default: {interval}}}
  pipeline:
    source:
      kind: kafka
      connection: bench-kafka
      topics: ["${{params.topic}}"]
      format: json
      schema: "{SCHEMA}"
    sink:
      kind: postgres
      connection: bench-sink
      table: "t_${{params.key}}"
      mode: upsert
      key: [id]
    trigger: {{interval_seconds: "${{params.interval}}"}}
  instances:
"""
    lines = [f"    - {{name: {name}, parameters: {{key: {key_of(name)}}}}}" for name in names(n)]
    return head + "\n".join(lines) + "\n"


def rest_spec(name: str, topic: str, interval: int) -> dict:
    """What the template makes of instance `name`: the same pipeline, for the REST API."""
    return {
        "source": {
            "kind": "kafka",
            "connection": "bench-kafka",
            "topics": [topic],
            "format": "json",
            "schema": SCHEMA,
        },
        "sink": {
            "kind": "postgres",
            "connection": "bench-sink",
            "table": f"t_{key_of(name)}",
            "mode": "upsert",
            "key": ["id"],
        },
        "trigger": {"interval_seconds": interval},
    }


LABELS = {"team": "bench", "template": TEMPLATE}


class Bench:
    def __init__(self, base: str, api_token: str, bench_url: str, bootstrap: str, dsn: str):
        self.base = base
        self.api = requests.Session()
        self.api.headers["Authorization"] = f"Token {api_token}"
        self.bench_url = bench_url
        self.connections = connections_yaml(bootstrap, dsn)
        self.topic = ""

    def files(self, n: int, interval: int) -> dict[str, str]:
        return {
            "fleet/connections.yaml": self.connections,
            "fleet/orders.yaml": template_yaml(n, self.topic, interval),
        }

    def body(self, files: dict, *, dry_run: bool, preflight: bool = False, prune=False) -> dict:
        return {
            "fleet": FLEET,
            "files": files,
            "dry_run": dry_run,
            "prune": prune,
            "preflight": preflight,
            "restart": True,
        }

    def apply(self, files: dict, *, dry_run: bool, preflight: bool = False, **expect) -> tuple:
        """Seconds for one POST /api/apply/ and its answer; `expect`: summary counts."""
        data = json.dumps(self.body(files, dry_run=dry_run, preflight=preflight)).encode()
        started = time.perf_counter()
        response = self.api.post(
            f"{self.base}/api/apply/",
            data=data,
            headers={"Content-Type": "application/json"},
            timeout=900,
        )
        answer = response.json()
        seconds = time.perf_counter() - started
        if response.status_code != 200:
            refused = [o for o in answer.get("objects", []) if o.get("action") == "refused"]
            raise RuntimeError(
                f"apply answered {response.status_code}: {answer.get('errors') or refused[:3]}"
                f" {str(answer)[:500]}"
            )
        summary = answer["summary"]
        wrong = {k: (summary[k], v) for k, v in expect.items() if summary[k] != v}
        assert not wrong, f"summary {summary}, expected {expect}"
        assert answer["applied"] is (not dry_run), answer["applied"]
        return seconds, answer

    def create_one_by_one(self, n: int, interval: int) -> float:
        started = time.perf_counter()
        for name in names(n):
            response = self.api.post(
                f"{self.base}/api/pipelines/",
                json={
                    "name": name,
                    "spec": rest_spec(name, self.topic, interval),
                    "labels": LABELS,
                },
                timeout=60,
            )
            if response.status_code != 201:
                raise RuntimeError(f"POST {name}: {response.status_code} {response.text[:500]}")
        return time.perf_counter() - started

    def patch_one_by_one(self, n: int, body_of) -> float:
        started = time.perf_counter()
        for name in names(n):
            response = self.api.patch(
                f"{self.base}/api/pipelines/{name}/", json=body_of(name), timeout=60
            )
            if response.status_code != 200:
                raise RuntimeError(f"PATCH {name}: {response.status_code} {response.text[:500]}")
        return time.perf_counter() - started

    def reset(self) -> None:
        """No pipelines (nor their fleet records): every phase starts from the same state."""
        from controlplane.definitions.models import ManagedObject, Pipeline

        Pipeline.objects.all().delete()
        ManagedObject.objects.filter(kind="Pipeline").delete()
        with psycopg.connect(self.bench_url, autocommit=True) as conn:
            conn.execute("VACUUM ANALYZE")

    def fleet_round(self, n: int) -> dict:
        from controlplane.definitions.models import Pipeline

        self.reset()
        files = self.files(n, INTERVAL)
        changed = self.files(n, CHANGED_INTERVAL)
        out = {}
        out["plan_new_s"], _ = self.apply(files, dry_run=True, create=n, unchanged=2)
        assert not Pipeline.objects.exists()
        out["apply_new_s"], _ = self.apply(files, dry_run=False, create=n, unchanged=2)
        assert Pipeline.objects.count() == n
        out["plan_unchanged_s"], _ = self.apply(files, dry_run=True, unchanged=n + 2)
        out["apply_unchanged_s"], _ = self.apply(files, dry_run=False, unchanged=n + 2)
        out["plan_updates_s"], _ = self.apply(changed, dry_run=True, update=n, unchanged=2)
        out["apply_updates_s"], _ = self.apply(changed, dry_run=False, update=n, unchanged=2)
        versions = Counter(Pipeline.objects.values_list("version", flat=True))
        assert versions == {2: n}, versions
        return out

    def rest_round(self, n: int) -> dict:
        from controlplane.definitions.models import Pipeline

        self.reset()
        out = {"create_s": self.create_one_by_one(n, INTERVAL)}
        assert Pipeline.objects.count() == n
        out["patch_same_s"] = self.patch_one_by_one(
            n, lambda name: {"spec": rest_spec(name, self.topic, INTERVAL), "labels": LABELS}
        )
        assert set(Pipeline.objects.values_list("version", flat=True)) == {1}
        out["patch_change_s"] = self.patch_one_by_one(
            n, lambda name: {"spec": {"trigger": {"interval_seconds": CHANGED_INTERVAL}}}
        )
        versions = Counter(Pipeline.objects.values_list("version", flat=True))
        assert versions == {2: n}, versions
        return out

    def preflight_apply(self, n: int) -> dict:
        self.reset()
        seconds, answer = self.apply(
            self.files(n, INTERVAL), dry_run=False, preflight=True, create=n, unchanged=2
        )
        statuses: Counter = Counter()
        checked = 0
        for obj in answer["objects"]:
            report = obj.get("preflight")
            if report:
                checked += 1
                statuses.update(c["status"] for c in report["checks"])
        assert checked == n, f"{checked} of {n} pipelines preflighted"
        return {"seconds": seconds, "pipelines_preflighted": checked, "checks": dict(statuses)}


# Each fleet figure and the REST baseline it is set against.
AGAINST = {
    "plan_new_s": "create_s",
    "apply_new_s": "create_s",
    "plan_unchanged_s": "patch_same_s",
    "apply_unchanged_s": "patch_same_s",
    "plan_updates_s": "patch_change_s",
    "apply_updates_s": "patch_change_s",
}
REST_WORDS = {
    "create_s": "REST POST one by one",
    "patch_same_s": "REST PATCH same one by one",
    "patch_change_s": "REST PATCH change one by one",
}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--rounds", type=int, default=2, help="of fleet and REST, interleaved")
    parser.add_argument("--preflight-pipelines", type=int, default=200)
    parser.add_argument("--no-write", action="store_true", help="do not write the results file")
    args = parser.parse_args()

    logging.getLogger("kafka").setLevel(logging.WARNING)
    began = time.monotonic()
    load_start = os.getloadavg()
    admin_url = os.environ["DATABASE_URL"]
    bootstrap = os.environ["KAFKA_BOOTSTRAP_SERVERS"]
    sink_dsn, sink_password = sink_dsn_and_password(
        os.environ.get("CONTROLPLANE_SINK_DATABASE_URL", admin_url)
    )
    # The stack's PostgreSQL trusts local users: any password does when the DSN has none.
    secret = sink_password if sink_password is not None else uuid.uuid4().hex
    db_name = f"cp_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{db_name}"')
    bench_url = admin_url.rsplit("/", 1)[0] + "/" + db_name
    env = {**os.environ, "DATABASE_URL": bench_url, SINK_REFERENCE_VAR: secret}
    os.environ["DATABASE_URL"] = bench_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")
    server = None
    topic = f"bench-apply-{uuid.uuid4().hex[:8]}"
    topic_made = False
    try:
        import django

        django.setup()
        from django.core.management import call_command

        call_command("migrate", verbosity=0)
        from django.contrib.auth import get_user_model

        from controlplane.accounts.models import ApiToken
        from controlplane.accounts.roles import ADMIN, set_role
        from jobs.loadgen import ensure_topic

        user = get_user_model().objects.create_user("bench", password=uuid.uuid4().hex)
        set_role(user, ADMIN)  # the connections read secrets from the control plane
        _, key = ApiToken.issue(user, "bench")
        server, base = serve_web_app(env)

        ensure_topic(bootstrap, topic, 1)
        topic_made = True
        bench = Bench(base, key, bench_url, bootstrap, sink_dsn)
        bench.topic = topic
        # The connections, applied once (every request below carries them: unchanged).
        bench.apply({"fleet/connections.yaml": bench.connections}, dry_run=False, create=2)
        # Warm-up, not measured: gunicorn's workers import and connect on first use.
        for _ in range(2):
            bench.fleet_round(10)
            bench.rest_round(10)

        body_bytes = {
            n: len(json.dumps(bench.body(bench.files(n, INTERVAL), dry_run=True)).encode())
            for n in args.sizes
        }
        results: dict[str, dict] = {}
        preflight = None
        for n in args.sizes:
            fleet_rounds, rest_rounds = [], []
            for r in range(args.rounds):
                # fleet then REST, then REST then fleet, ...: drift falls on both alike
                order = ("fleet", "rest") if r % 2 == 0 else ("rest", "fleet")
                for which in order:
                    if which == "fleet":
                        fleet_rounds.append(bench.fleet_round(n))
                        got = fleet_rounds[-1]
                    else:
                        rest_rounds.append(bench.rest_round(n))
                        got = rest_rounds[-1]
                    print(
                        f"N={n} round {r + 1} {which}: "
                        + ", ".join(f"{k} {v:.2f}" for k, v in got.items()),
                        flush=True,
                    )
            fleet = {k: statistics.median(r[k] for r in fleet_rounds) for k in fleet_rounds[0]}
            rest = {k: statistics.median(r[k] for r in rest_rounds) for k in rest_rounds[0]}
            ratios = {k: fleet[k] / rest[AGAINST[k]] for k in fleet}
            results[str(n)] = {
                "fleet_s": {k: round(v, 3) for k, v in fleet.items()},
                "rest_s": {k: round(v, 3) for k, v in rest.items()},
                "fleet_to_rest": {k: round(v, 3) for k, v in ratios.items()},
                "fleet_rounds": [{k: round(v, 3) for k, v in r.items()} for r in fleet_rounds],
                "rest_rounds": [{k: round(v, 3) for k, v in r.items()} for r in rest_rounds],
                "request_body_bytes": body_bytes[n],
            }
            print(f"N={n} (medians of {args.rounds} rounds; request body {body_bytes[n]:,} bytes):")
            for k, v in fleet.items():
                against = AGAINST[k]
                print(
                    f"  fleet {k.removesuffix('_s').replace('_', ' '):<16} {v:8.2f} s"
                    f"  ({v / n * 1000:6.1f} ms/pipeline)   vs {REST_WORDS[against]}"
                    f" {rest[against]:8.2f} s: ratio {ratios[k]:.3f}",
                    flush=True,
                )
            if n == min(args.sizes) and args.preflight_pipelines:
                preflight = bench.preflight_apply(args.preflight_pipelines)
                print(
                    f"apply of {args.preflight_pipelines} new with preflight: "
                    f"{preflight['seconds']:.2f} s (without: {fleet['apply_new_s']:.2f} s at"
                    f" N={n}); checks {preflight['checks']}",
                    flush=True,
                )
                preflight["seconds"] = round(preflight["seconds"], 3)
        bench.reset()
        delete_topic(bootstrap, topic)
        topic_made = False

        def target(goal_key: str, size: str, figure: str) -> dict:
            measured = results.get(size, {}).get("fleet_s", {}).get(figure)
            goal = GOALS[goal_key]
            return {
                "goal": goal,
                "measured": measured,
                "met": measured is not None and measured <= goal,
            }

        targets = {
            "plan_1000_unchanged_s": target("plan_1000_unchanged_s", "1000", "plan_unchanged_s"),
            "apply_200_new_s": target("apply_200_new_s", "200", "apply_new_s"),
        }
        for k, t in targets.items():
            verdict = "met" if t["met"] else "NOT met"
            print(f"target {k} <= {t['goal']} s: {t['measured']} -> {verdict}")
        line = json.dumps(
            {
                "sizes": results,
                "baseline": "the same pipelines through the REST API one by one (sequential,"
                " one session): create_s POST, patch_same_s PATCH of the same spec and labels,"
                " patch_change_s PATCH of the changed interval; fleet_to_rest = fleet / REST",
                "preflight_apply_new": {"pipelines": args.preflight_pipelines, **(preflight or {})},
                "targets": targets,
                "rounds": args.rounds,
                "gunicorn": "gthread, 2 workers, 8 threads",
                "load_average_start": [round(x, 2) for x in load_start],
                "load_average_end": [round(x, 2) for x in os.getloadavg()],
                "minutes": round((time.monotonic() - began) / 60, 1),
                "machine": machine(),
            }
        )
        print(line)
        if not args.no_write:
            out = ROOT / "bench" / "results"
            out.mkdir(exist_ok=True)
            (out / "apply.json").write_text(line + "\n")
        return 0
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        if topic_made:
            delete_topic(bootstrap, topic)
        from django.db import connections

        connections.close_all()
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{db_name}" WITH (FORCE)')


if __name__ == "__main__":
    sys.exit(main())
