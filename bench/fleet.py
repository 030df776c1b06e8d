"""A fleet of small pipelines: shared Spark application against one application each.

    .venv/bin/python bench/fleet.py [--pipelines 50 --rate 200 --trigger 5 --window 300
                                     --dedicated-max 6 --restarts 10]
                                    (after: eval "$(./stack services)")

Runs the control plane for real, as `./stack up` does (gunicorn, a Celery worker and beat),
on the dev stack's PostgreSQL, Redis and Kafka, in a database (and a Redis database) of its
own, dropped at the end. Every pipeline reads a topic of its own (one partition), fed at
--rate events/s by one producer process of this bench (kafka-python, batched; a topic is fed
from the moment its pipeline is started), parses `id STRING, n INT` and appends to a table of
its own in the sink database, with a --trigger s micro-batch interval and a fixed-delay
restart policy of 0 s. Two modes, one after the other, in the same run:

shared      one SparkApplication (--driver-memory, capacity N) started by the reconciler;
            the N pipelines placed in it (`Pipeline.placement`): its memory empty, with one
            pipeline (after --steady s), then the others in steps of --ramp-step, each step
            checked (two samples of every pipeline started so far) before the next.
dedicated   the baseline: each pipeline its own Spark application (the product's defaults),
            started one at a time; adding stops at --dedicated-max, when the machine lacks
            the memory for one more, or when a pipeline falls behind (two samples after the
            newest one's first batch).

For both, over a --window s window (after --settle s), every --sample-every s:
  held        a pipeline is held if every sample of GET /api/pipelines/<name>/metrics/ said
              lag.seconds < 10 and backpressure.level is not "high" (and it answered); the
              figures are the metrics collector's (beat, every CONTROLPLANE_COLLECT_SECONDS)
  memory      resident memory of the process trees (psutil, supervisor and everything under
              it): shared, the application's, median over the window; per extra pipeline
              (rss_N - rss_1) / (N - 1). Dedicated, the sum of the runs' trees; per pipeline,
              and per extra pipeline as for shared
  CPU         CPU time of those trees over the window / the window / N (cores per pipeline)
  reports     failures by cause, batch durations, and how late the drivers' progress reports
              reached the control plane (stored, less the batch's end by the driver's clock)
Then:
  restart-one a member's query fails in a real batch (its sink table rejects one record, a
              CHECK constraint dropped again as soon as the run's exit is written), --restarts
              times, each on another pipeline: from the exit (the run's exit.json) to the next
              committed batch (its commit file in the checkpoint: the commit itself), and to
              the control plane storing that run's first progress with records (BatchProgress,
              waited for at most --report-wait s); p50/p95 (nearest rank). Dedicated:
              --dedicated-restarts times (each a cold start)
  loss        shared: SIGKILL of the application's driver JVM; from the kill until every
              member has committed a batch again (median and max over members; and until its
              progress is stored). Dedicated: SIGKILL of one driver JVM (--dedicated-kills)
Its waits are bounded by --start-timeout, --report-wait and --loss-timeout: with the
defaults it took 47 minutes on this 2-core machine, where 50 shared pipelines did not keep
up (less where they do). Figures are printed next to the dedicated baseline as ratios; the
last line is one JSON object with every figure, also written to bench/results/fleet.json.
Everything the bench started is stopped and removed at the end (pipelines, application,
processes, topics, tables, database; the run directories and logs stay in
var/bench-fleet/<id>).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from recovery import (  # noqa: E402
    cleanup_kafka_and_sink,
    create_database,
    driver_pid,
    drop_database,
    fail_query,
    free_port,
    own_redis_db,
    read_json,
    start_control_plane,
    wait,
)

SCHEMA = "id STRING, n INT"
POLICY = {"kind": "fixed-delay", "attempts": 10_000, "delay_seconds": 0}
LAG_LIMIT_S = 10.0
TARGETS = {"shared_held": 50, "shared_mb_per_extra_pipeline": 150, "shared_restart_one_p95_s": 3.0}
MB = 1024 * 1024


# -- the producer (a process of its own: python bench/fleet.py produce ...) -----------------


def produce_main(argv: list[str]) -> int:
    """Feed every topic listed in TOPICS_FILE (re-read every second) at RATE events/s each,
    from the moment it appears there; write what was sent to STATS_FILE every 2 s."""
    parser = argparse.ArgumentParser(prog="fleet.py produce")
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--topics-file", required=True)
    parser.add_argument("--stats-file", required=True)
    args = parser.parse_args(argv)
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=args.bootstrap, linger_ms=50, batch_size=256 * 1024, acks=1
    )
    errors = [0]

    def failed(_exc) -> None:
        errors[0] += 1

    started: dict[str, float] = {}
    sent: dict[str, int] = {}
    total = 0  # sent to every topic ever fed
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    last_read = last_stats = 0.0
    while not stop.is_set():
        now = time.monotonic()
        if now - last_read >= 1.0:
            last_read = now
            wanted = read_json(Path(args.topics_file))
            if wanted is not None:
                for topic in [t for t in started if t not in wanted]:
                    del started[topic], sent[topic]  # its pipeline was stopped
                for topic in wanted:
                    if topic not in started:
                        producer.partitions_for(topic)  # its metadata, before it is timed
                        started[topic], sent[topic] = time.monotonic(), 0
        for topic, since in started.items():
            due = int((time.monotonic() - since) * args.rate)
            for n in range(sent[topic], due):
                value = b'{"id":"%s-%d","n":%d}' % (topic.encode(), n, n)
                producer.send(topic, value).add_errback(failed)
            total += max(0, due - sent[topic])
            sent[topic] = max(sent[topic], due)
        if now - last_stats >= 2.0:
            last_stats = now
            due = sum(int((time.monotonic() - s) * args.rate) for s in started.values())
            times = os.times()
            stats = {
                "sent": total,
                "behind": due - sum(sent.values()),
                "topics": len(started),
                "errors": errors[0],
                "cpu_s": times.user + times.system,
                "at": time.time(),
            }
            tmp = Path(args.stats_file + ".tmp")
            tmp.write_text(json.dumps(stats))
            tmp.replace(args.stats_file)
        time.sleep(0.02)
    producer.flush()
    producer.close()
    return 0


# -- processes ------------------------------------------------------------------------------


def tree(pid: int | None) -> list:
    import psutil

    if not pid:
        return []
    try:
        process = psutil.Process(pid)
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss(pids) -> int:
    import psutil

    total = 0
    for pid in pids:
        for p in tree(pid):
            with contextlib.suppress(psutil.Error):
                total += p.memory_info().rss
    return total


def tree_cpu(pid: int | None) -> float:
    """CPU seconds of a process tree, its reaped children included."""
    import psutil

    total = 0.0
    for p in tree(pid):
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def busy_cpu_seconds() -> float:
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = values
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def forks() -> int:
    """Processes created on the machine since boot (/proc/stat)."""
    for line in Path("/proc/stat").read_text().splitlines():
        if line.startswith("processes "):
            return int(line.split()[1])
    return 0


def heap_used_mb(jvm_pid: int | None) -> float | None:
    """The JVM's heap in use (jcmd GC.heap_info; no GC is forced), or None."""
    if not jvm_pid:
        return None
    try:
        out = subprocess.run(
            ["jcmd", str(jvm_pid), "GC.heap_info"], capture_output=True, text=True, timeout=30
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(
        r"heap\s+total\s+(?:reserved\s+\d+K,\s+committed\s+)?\d+K,\s+used\s+(\d+)K", out
    )
    return round(int(match.group(1)) / 1024, 1) if match else None


def pct(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile (for 10 values, p95 is the largest)."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def r2(x: float | None) -> float | None:
    return None if x is None else round(x, 2)


def ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 2) if a is not None and b else None


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


# -- the fleet ------------------------------------------------------------------------------


@dataclass
class Pipe:
    name: str
    topic: str
    table: str


class Fleet:
    def __init__(self, args, suffix: str, base: str, api_key: str, bootstrap: str, sink_dsn: str,
                 topics_file: Path, stats_file: Path):  # fmt: skip
        import requests
        from kafka import KafkaProducer

        self.args, self.suffix, self.base = args, suffix, base
        self.bootstrap, self.sink_dsn = bootstrap, sink_dsn
        self.topics_file, self.stats_file = topics_file, stats_file
        self.fed: list[str] = []
        self.made: list[Pipe] = []
        self.local = threading.local()
        self.headers = {"Authorization": f"Token {api_key}"}
        self.requests = requests
        self.injector = KafkaProducer(bootstrap_servers=bootstrap)

    # pipelines

    def create(self, prefix: str, count: int, placement: str | None) -> list[Pipe]:
        from controlplane.definitions import services
        from controlplane.definitions.models import Pipeline
        from jobs.loadgen import ensure_topic

        pipes = []
        for i in range(count):
            name = f"fleet-{prefix}{i:03d}-{self.suffix}"
            topic = f"fleet-{self.suffix}-{prefix}{i:03d}"
            table = f"fleet_{self.suffix}_{prefix}{i:03d}"
            ensure_topic(self.bootstrap, topic, 1)
            spec = {
                "source": {
                    "connection": f"k-{self.suffix}",
                    "topics": [topic],
                    "schema": SCHEMA,
                    "starting_offsets": "earliest",
                },
                "sink": {"connection": f"pg-{self.suffix}", "table": table},
                "trigger": {"interval_seconds": self.args.trigger},
                "restart_policy": POLICY,
            }
            services.create_pipeline(name=name, spec_data=spec, desired_state="stopped")
            if placement:
                Pipeline.objects.filter(name=name).update(placement=placement)
            pipes.append(Pipe(name, topic, table))
        self.made += pipes
        return pipes

    def start(self, pipes: list[Pipe]) -> None:
        """Feed their topics, and want them running (the next reconcile tick launches them)."""
        from controlplane.definitions.models import Pipeline

        self.fed += [p.topic for p in pipes if p.topic not in self.fed]
        tmp = self.topics_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.fed))
        tmp.replace(self.topics_file)
        Pipeline.objects.filter(name__in=[p.name for p in pipes]).update(desired_state="running")

    def stop(self, pipes: list[Pipe], timeout: float = 180) -> None:
        from controlplane.definitions.models import Pipeline, Run, RunState

        names = [p.name for p in pipes]
        Pipeline.objects.filter(name__in=names).update(desired_state="stopped")
        gone = {p.topic for p in pipes}
        self.fed = [t for t in self.fed if t not in gone]
        self.topics_file.write_text(json.dumps(self.fed))
        try:
            wait(
                lambda: (
                    not Run.objects.filter(
                        pipeline__name__in=names, state__in=RunState.active()
                    ).exists()
                ),
                timeout,
                "the pipelines to stop",
                poll=1,
            )
        except TimeoutError as exc:
            say(f"{exc}: killing what is left")
            self.kill_leftovers()

    @staticmethod
    def kill_leftovers() -> None:
        from controlplane.definitions.models import Run, RunState, SparkApplication
        from controlplane.supervision import launcher

        for run in Run.objects.filter(state__in=RunState.active(), application=None):
            launcher.kill(run)
        for app in SparkApplication.objects.filter(pid__isnull=False):
            launcher.kill_application(app)

    @staticmethod
    def current(name: str):
        from controlplane.definitions.models import Run, RunState

        return (
            Run.objects.filter(pipeline__name=name, state=RunState.RUNNING)
            .order_by("-generation")
            .first()
        )

    @staticmethod
    def first_batch_after(name: str, generation: int):
        """The first batch with records committed by a run of a later generation."""
        from controlplane.definitions.models import BatchProgress

        return (
            BatchProgress.objects.filter(
                run__pipeline__name=name, run__generation__gt=generation, num_input_rows__gt=0
            )
            .select_related("run")
            .order_by("reported_at")
            .first()
        )

    @staticmethod
    def commits(name: str) -> dict[int, float]:
        """The pipeline's committed batches and when (its checkpoint's commit files): the
        truth about commits, which the control plane learns of only when the driver's
        progress report arrives (late, under load)."""
        from django.conf import settings

        out = {}
        directory = Path(settings.CONTROLPLANE_CHECKPOINT_ROOT, name, "commits")
        try:
            entries = list(os.scandir(directory))
        except OSError:
            return out
        for entry in entries:
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    out[int(entry.name)] = entry.stat().st_mtime
        return out

    def commit_after(self, name: str, since: float) -> tuple[int, float] | None:
        """The first batch committed after `since` (wall clock): (batch id, when)."""
        later = [(t, b) for b, t in self.commits(name).items() if t > since]
        return (min(later)[1], min(later)[0]) if later else None

    def wait_first_batches(self, pipes: list[Pipe], timeout: float) -> dict[str, float]:
        """Until each has committed its first batch; when (wall clock), by name."""
        done: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(done) < len(pipes) and time.monotonic() < deadline:
            for p in pipes:
                if p.name not in done and (commits := self.commits(p.name)):
                    done[p.name] = min(commits.values())
            time.sleep(0.5)
        return done

    def check(self, pipes: list[Pipe], sweeps: int = 2) -> dict[str, dict]:
        """`sweeps` samples, --sample-every s apart: the pipelines out of limits, and why."""
        behind: dict[str, dict] = {}
        for _ in range(sweeps):
            time.sleep(self.args.sample_every)
            for name, sample in self.sweep(pipes).items():
                if not self.ok(sample):
                    behind[name] = sample
        return behind

    # metrics

    def metrics(self, name: str) -> dict:
        session = getattr(self.local, "session", None)
        if session is None:
            session = self.local.session = self.requests.Session()
            session.headers.update(self.headers)
        try:
            response = session.get(f"{self.base}/api/pipelines/{name}/metrics/", timeout=30)
            response.raise_for_status()
            body = response.json()
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}"[:200]}
        lag = body.get("lag") or {}
        pressure = body.get("backpressure") or {}
        return {
            "lag_s": lag.get("seconds"),
            "lag_records": lag.get("records"),
            "lag_status": lag.get("status"),
            "level": pressure.get("level"),
            "busy": pressure.get("busy_ratio"),
            "status": body.get("status"),
            "error": lag.get("error"),
        }

    def sweep(self, pipes: list[Pipe]) -> dict[str, dict]:
        with ThreadPoolExecutor(4) as pool:
            return dict(
                zip(
                    [p.name for p in pipes],
                    pool.map(self.metrics, [p.name for p in pipes]),
                    strict=True,
                )
            )

    @staticmethod
    def ok(sample: dict) -> bool:
        return (
            not sample.get("error")
            and sample.get("lag_s") is not None
            and sample["lag_s"] < LAG_LIMIT_S
            and sample.get("level") != "high"
        )

    def producer_stats(self) -> dict:
        return read_json(self.stats_file) or {}

    def hold(self, pipes: list[Pipe], tree_pids) -> dict:
        """The window: every pipeline's metrics, the trees' memory and CPU, the machine's."""
        from django.utils import timezone

        window, every = self.args.window, self.args.sample_every
        began = timezone.now()
        pids0 = tree_pids()
        cpu0 = {pid: tree_cpu(pid) for pid in pids0}
        busy0, prod0, forks0 = busy_cpu_seconds(), self.producer_stats(), forks()
        t0 = time.monotonic()
        samples: dict[str, list[dict]] = {p.name: [] for p in pipes}
        rss: list[int] = []
        sweeps = 0
        while True:
            sweep_at = time.monotonic()
            for name, sample in self.sweep(pipes).items():
                samples[name].append(sample)
            rss.append(tree_rss(tree_pids()))
            sweeps += 1
            bad = [n for n, s in samples.items() if not self.ok(s[-1])]
            lags = [s[-1]["lag_s"] for s in samples.values() if s[-1].get("lag_s") is not None]
            say(
                f"  window {time.monotonic() - t0:5.0f} s: {len(pipes) - len(bad)}/{len(pipes)}"
                f" within limits now, max lag {max(lags, default=float('nan')):.1f} s,"
                f" rss {rss[-1] / MB:,.0f} MB, sweep {time.monotonic() - sweep_at:.1f} s,"
                f" load {os.getloadavg()[0]:.2f}"
            )
            if time.monotonic() - t0 + every > window:
                break
            time.sleep(max(0.0, sweep_at + every - time.monotonic()))
        time.sleep(max(0.0, t0 + window - time.monotonic()))
        elapsed = time.monotonic() - t0
        ended = timezone.now()
        pids1 = tree_pids()
        cpu = sum(tree_cpu(pid) - cpu0[pid] for pid in pids1 if pid in cpu0)
        replaced = len(set(pids0) - set(pids1))
        busy = busy_cpu_seconds() - busy0
        forked = forks() - forks0
        prod1 = self.producer_stats()
        held = [n for n, s in samples.items() if s and all(self.ok(x) for x in s)]
        # The same, judged only on the samples the API answered (a 503 from a control plane
        # short of CPU says nothing about the pipeline): separates the two.
        answered = {n: [x for x in s if not x.get("error")] for n, s in samples.items()}
        held_answered = [n for n, s in answered.items() if s and all(self.ok(x) for x in s)]
        unanswered = sum(len(s) - len(answered[n]) for n, s in samples.items())
        not_held = {
            n: next(x for x in s if not self.ok(x)) for n, s in samples.items() if n not in held
        }
        all_lags = [x["lag_s"] for s in samples.values() for x in s if x.get("lag_s") is not None]
        levels: dict[str, int] = {}
        for s in samples.values():
            for x in s:
                levels[str(x.get("level"))] = levels.get(str(x.get("level")), 0) + 1
        busy_ratios = [x["busy"] for s in samples.values() for x in s if x.get("busy") is not None]
        produced = None
        if prod0 and prod1 and prod1.get("at", 0) > prod0.get("at", 0):
            produced = {
                "events_per_s": round(
                    (prod1["sent"] - prod0["sent"]) / (prod1["at"] - prod0["at"])
                ),
                "target_events_per_s": round(self.args.rate * len(pipes)),
                "behind_at_end": prod1["behind"],
                "errors": prod1["errors"],
                "cpu_cores": round(
                    (prod1["cpu_s"] - prod0["cpu_s"]) / (prod1["at"] - prod0["at"]), 3
                ),
            }
        return {
            "pipelines": len(pipes),
            "held": len(held),
            "held_judging_answered_samples_only": len(held_answered),
            "unanswered_samples": unanswered,
            "window_s": round(elapsed),
            "sweeps": sweeps,
            "lag_s_median": r2(statistics.median(all_lags)) if all_lags else None,
            "lag_s_p95": r2(pct(all_lags, 95)),
            "lag_s_max": r2(max(all_lags)) if all_lags else None,
            "backpressure_samples": levels,
            "busy_ratio_median": r2(statistics.median(busy_ratios)) if busy_ratios else None,
            "busy_ratio_max": r2(max(busy_ratios)) if busy_ratios else None,
            "not_held_first_bad_sample": dict(list(not_held.items())[:10]),
            "rss_mb_median": round(statistics.median(rss) / MB),
            "rss_mb_max": round(max(rss) / MB),
            "cpu_cores": round(cpu / elapsed, 3),
            "cpu_cores_per_pipeline": round(cpu / elapsed / len(pipes), 4),
            "trees_replaced_during_window": replaced,
            "machine_busy_cores": round(busy / elapsed, 2),
            "machine_processes_created_per_s": round(forked / elapsed, 1),
            "producer": produced,
            **self.reports_in(pipes, began, ended),
        }

    @staticmethod
    def reports_in(pipes: list[Pipe], began, ended) -> dict:
        """What the control plane heard meanwhile: failures by cause, batch durations, and
        how late progress reports arrived (stored, less the batch's own end by the driver's
        clock, the same host's)."""
        from controlplane.definitions.models import BatchProgress, Failure

        names = [p.name for p in pipes]
        causes: dict[str, int] = {}
        for (cause,) in Failure.objects.filter(
            pipeline__name__in=names, at__gte=began, at__lte=ended
        ).values_list("cause"):
            causes[cause] = causes.get(cause, 0) + 1
        rows = BatchProgress.objects.filter(
            run__pipeline__name__in=names, reported_at__gte=began, reported_at__lte=ended
        ).values_list("reported_at", "timestamp", "batch_duration_ms")
        delays = [(r - t).total_seconds() - (d or 0) / 1000 for r, t, d in rows]
        durations = [d / 1000 for _, _, d in rows if d is not None]
        return {
            "failures": causes,
            "batches_reported": len(delays),
            "batch_s_median": r2(statistics.median(durations)) if durations else None,
            "batch_s_p95": r2(pct(durations, 95)),
            "report_delay_s_median": r2(statistics.median(delays)) if delays else None,
            "report_delay_s_p95": r2(pct(delays, 95)),
            "report_delay_s_max": r2(max(delays)) if delays else None,
        }

    # failures

    def send_bad(self, topic: str) -> None:
        self.injector.send(topic, b'{"id":"bench-rejected","n":-1}')
        self.injector.flush()

    def restart_one(self, pipe: Pipe) -> dict:
        """The pipeline's query fails in a batch; until its next run commits a batch (the
        checkpoint's commit file), and until the control plane has its progress."""
        from controlplane.definitions.models import Failure, Run

        run = wait(lambda: self.current(pipe.name), 240, f"{pipe.name} running", poll=0.5)
        since = run.created_at.timestamp()
        wait(lambda: self.commit_after(pipe.name, since), 240, f"a batch of {pipe.name}", poll=0.5)
        times = fail_query(
            run.run_dir, self.sink_dsn, pipe.table, "n", lambda: self.send_bad(pipe.topic)
        )
        ended = times["ended_at"]
        batch, back = wait(
            lambda: self.commit_after(pipe.name, ended), 300, "the next commit", poll=0.05
        )
        later = Run.objects.filter(pipeline__name=pipe.name, generation__gt=run.generation)
        new = later.order_by("-generation").first()
        try:  # its progress, as the control plane gets it
            row = wait(
                lambda: self.first_batch_after(pipe.name, run.generation),
                self.args.report_wait,
                "the next run's progress",
                poll=0.2,
            )
            reported = row.reported_at.timestamp() - ended
        except TimeoutError:
            reported = None
        failure = Failure.objects.filter(run=run).order_by("at").first()
        return {
            "pipeline": pipe.name,
            "restart_s": round(back - ended, 3),
            "restart_reported_s": r2(reported),
            "from_failure_recorded_s": round(back - failure.at.timestamp(), 3) if failure else None,
            "from_injection_s": round(back - times["injected_at"], 3),
            "injection_to_exit_s": round(ended - times["injected_at"], 3),
            "batch": batch,
            "cause": failure.cause if failure else None,
            "refailures": Failure.objects.filter(run__in=later).count(),
            "same_process": bool(new)
            and new.pid == run.pid
            and new.application_generation == run.application_generation,
        }

    def restarts(self, pipes: list[Pipe], count: int, label: str) -> dict:
        results = []
        for i in range(count):
            pipe = pipes[(i * max(1, len(pipes) // max(count, 1))) % len(pipes)]
            try:
                results.append(self.restart_one(pipe))
            except TimeoutError as exc:
                say(f"  {label} restart {i + 1} on {pipe.name}: {exc}")
                results.append({"pipeline": pipe.name, "error": str(exc)})
                continue
            r = results[-1]
            say(
                f"  {label} restart {i + 1} ({pipe.name}): exit -> next committed batch"
                f" {r['restart_s']:.2f} s (its progress reported after {r['restart_reported_s']} s;"
                f" bad record -> exit {r['injection_to_exit_s']:.2f} s,"
                f" refailures {r['refailures']}, same process {r['same_process']})"
            )
        times = [r["restart_s"] for r in results if "restart_s" in r]
        reported = [r["restart_reported_s"] for r in results if r.get("restart_reported_s")]
        return {
            "count": len(times),
            "errors": len(results) - len(times),
            "p50_s": r2(pct(times, 50)),
            "p95_s": r2(pct(times, 95)),
            "max_s": r2(max(times)) if times else None,
            "reported_p50_s": r2(pct(reported, 50)),
            "reported_p95_s": r2(pct(reported, 95)),
            "reported_within_wait": len(reported),
            "from_injection_p50_s": r2(
                pct([r["from_injection_s"] for r in results if "restart_s" in r], 50)
            ),
            "injection_to_exit_p50_s": r2(
                pct([r["injection_to_exit_s"] for r in results if "restart_s" in r], 50)
            ),
            "refailures": sum(r.get("refailures", 0) for r in results),
            "all_same_process": all(r.get("same_process") for r in results) if results else None,
            "causes": sorted({str(r.get("cause")) for r in results if "restart_s" in r}),
            "each": results,
        }

    def kill_and_recover(self, jvm_pid: int, pipes: list[Pipe], timeout: float) -> dict:
        """SIGKILL a driver JVM; until every pipeline has committed a batch again (the
        checkpoint: a commit after the kill is the next run's), and until the control plane
        has that progress (seconds from the kill, over the pipelines)."""
        before = {p.name: getattr(self.current(p.name), "generation", 0) for p in pipes}
        killed = time.time()
        os.kill(jvm_pid, signal.SIGKILL)
        back: dict[str, float] = {}
        deadline = time.monotonic() + timeout
        while len(back) < len(pipes) and time.monotonic() < deadline:
            for p in pipes:
                if p.name not in back and (found := self.commit_after(p.name, killed)):
                    back[p.name] = found[1] - killed
            time.sleep(0.5)
        reported: dict[str, float] = {}
        deadline = time.monotonic() + self.args.report_wait
        while len(reported) < len(back) and time.monotonic() < deadline:
            for name in back:
                if name not in reported and (row := self.first_batch_after(name, before[name])):
                    reported[name] = row.reported_at.timestamp() - killed
            time.sleep(0.5)
        values = sorted(back.values())
        return {
            "killed_at": killed,
            "members": len(pipes),
            "back": len(back),
            "median_s": r2(statistics.median(values)) if values else None,
            "max_s": r2(max(values)) if values else None,
            "min_s": r2(min(values)) if values else None,
            "reported": len(reported),
            "reported_median_s": r2(statistics.median(reported.values())) if reported else None,
            "reported_max_s": r2(max(reported.values())) if reported else None,
            "not_back": sorted(set(before) - set(back))[:10],
        }


def failure_causes(pipes: list[Pipe]) -> dict[str, int]:
    from controlplane.definitions.models import Failure

    causes: dict[str, int] = {}
    for (cause,) in Failure.objects.filter(pipeline__name__in=[p.name for p in pipes]).values_list(
        "cause"
    ):
        causes[cause] = causes.get(cause, 0) + 1
    return causes


# -- the two modes ----------------------------------------------------------------------------


def shared_mode(fleet: Fleet, args) -> dict:
    from controlplane.definitions.models import Failure, SparkApplication

    out: dict = {"driver_memory": args.driver_memory}
    app = SparkApplication.objects.create(
        name=f"fleet-{fleet.suffix}",
        driver_memory=args.driver_memory,
        capacity=args.pipelines,
        desired_state="running",
    )
    created = time.time()
    say(
        f"shared: application {app.name} (driver memory {args.driver_memory},"
        f" capacity {args.pipelines})"
    )

    def refreshed():
        app.refresh_from_db()
        return app

    wait(lambda: refreshed().status == "running" and app.pid, 300, "the application", poll=0.5)
    out["application_ready_s"] = r2(app.ready_at.timestamp() - created)
    pipes = fleet.create("s", args.pipelines, placement=app.name)
    time.sleep(5)
    out["rss_mb_empty"] = round(tree_rss([refreshed().pid]) / MB)
    say(
        f"shared: application up in {out['application_ready_s']} s,"
        f" rss empty {out['rss_mb_empty']} MB"
    )

    fleet.start(pipes[:1])
    firsts = fleet.wait_first_batches(pipes[:1], 240)
    if not firsts:
        raise RuntimeError("the first shared pipeline committed no batch within 240 s")
    time.sleep(args.steady)
    rss_1 = []
    for _ in range(3):
        rss_1.append(tree_rss([refreshed().pid]))
        time.sleep(5)
    out["rss_mb_1"] = round(statistics.median(rss_1) / MB)
    out["heap_used_mb_1"] = heap_used_mb(driver_pid(app.app_dir))
    say(f"shared: 1 pipeline: rss {out['rss_mb_1']} MB, heap used {out['heap_used_mb_1']} MB")

    # The others in steps of --ramp-step, each step checked (two samples of every pipeline
    # started so far) before the next: where the application stops keeping up.
    started_at = time.time()
    ramp, running, largest = [], pipes[:1], 1
    step = max(1, args.ramp_step)
    for i in range(1, len(pipes), step):
        group = pipes[i : i + step]
        step_at = time.time()
        fleet.start(group)
        running = running + group
        firsts = fleet.wait_first_batches(group, args.start_timeout)
        behind = fleet.check(running)
        lags = [b.get("lag_s") for b in behind.values() if b.get("lag_s") is not None]
        ramp.append(
            {
                "pipelines": len(running),
                "first_batches": len(firsts),
                "first_batch_after_s": r2(max(firsts.values()) - step_at) if firsts else None,
                "within_limits": len(running) - len(behind),
                "worst_lag_s": r2(max(lags)) if lags else None,
            }
        )
        if not behind and largest == len(running) - len(group):
            largest = len(running)
        say(
            f"shared: {len(running)} started ({len(firsts)}/{len(group)} new ones committed a"
            f" batch, the last {ramp[-1]['first_batch_after_s']} s after the start);"
            f" {ramp[-1]['within_limits']}/{len(running)} within limits in two samples"
        )
    out["ramp"] = ramp
    out["largest_ramp_step_within_limits"] = largest
    firsts = fleet.wait_first_batches(pipes, 5)
    out["started"] = len(firsts)
    out["all_started_after_s"] = r2(time.time() - started_at)
    say(f"shared: {len(firsts)}/{len(pipes)} have committed a batch; settling {args.settle} s")
    time.sleep(args.settle)
    out["failures_before_window"] = failure_causes(pipes)
    window = fleet.hold(pipes, lambda: [refreshed().pid])
    out["window"] = window
    out["held"] = window["held"]
    out["rss_mb_n"] = window["rss_mb_median"]
    out["heap_used_mb_n"] = heap_used_mb(driver_pid(refreshed().app_dir))
    out["rss_mb_reported_by_reconciler"] = (
        round(refreshed().rss_bytes / MB) if app.rss_bytes else None
    )
    n = len(pipes)
    out["mb_per_extra_pipeline"] = (
        r2((out["rss_mb_n"] - out["rss_mb_1"]) / (n - 1)) if n > 1 else None
    )
    out["cpu_percent_per_pipeline"] = r2(window["cpu_cores_per_pipeline"] * 100)
    say(
        f"shared: held {window['held']}/{n}, rss {out['rss_mb_n']} MB"
        f" ({out['mb_per_extra_pipeline']} MB per extra pipeline), CPU"
        f" {out['cpu_percent_per_pipeline']} % of a core per pipeline"
    )

    before = set(Failure.objects.values_list("pk", flat=True))
    out["restart_one"] = fleet.restarts(pipes, args.restarts, "shared")
    victims = {r["pipeline"] for r in out["restart_one"]["each"]}
    bystanders = Failure.objects.exclude(pk__in=before).exclude(pipeline__name__in=victims)
    out["restart_one"]["bystander_failures"] = bystanders.count()

    refreshed()
    generation = app.generation
    say(f"shared: SIGKILL of the application's driver JVM ({len(pipes)} members)")
    loss = fleet.kill_and_recover(driver_pid(app.app_dir), pipes, args.loss_timeout)
    refreshed()
    if app.generation > generation and app.ready_at:
        loss["application_ready_s"] = r2(app.ready_at.timestamp() - loss["killed_at"])
    lost = Failure.objects.filter(cause="application-lost").order_by("at")
    loss["application_lost_failures"] = lost.count()
    if lost:
        loss["detected_s"] = r2(lost.first().at.timestamp() - loss["killed_at"])
    loss.pop("killed_at")
    out["application_loss"] = loss
    say(
        f"shared: after the loss, {loss['back']}/{loss['members']} members committed again:"
        f" median {loss['median_s']} s, max {loss['max_s']} s (application up again after"
        f" {loss.get('application_ready_s')} s)"
    )
    fleet.stop(pipes)
    SparkApplication.objects.filter(pk=app.pk).update(desired_state="stopped")
    try:
        wait(lambda: refreshed().pid is None, 120, "the application to stop", poll=1)
    except TimeoutError:
        fleet.kill_leftovers()
    return out


def dedicated_mode(fleet: Fleet, args) -> dict:
    import psutil

    out: dict = {}
    pipes = fleet.create("d", args.dedicated_max, placement=None)
    started: list[Pipe] = []
    rss_1 = None
    stop_reason = f"--dedicated-max {args.dedicated_max}"

    def pids() -> list[int]:
        return [r.pid for p in started if (r := fleet.current(p.name)) and r.pid]

    for pipe in pipes:
        available = psutil.virtual_memory().available
        each = (tree_rss(pids()) / len(started)) if started else 1.6e9
        if available < each * 1.25 + args.memory_reserve_gb * 1024**3:
            stop_reason = (
                f"memory: {available / 1024**3:.1f} GiB available, one more needs"
                f" ~{each / 1024**3:.1f} GiB and {args.memory_reserve_gb} GiB are kept free"
            )
            break
        launched = time.time()
        fleet.start([pipe])
        started.append(pipe)
        firsts = fleet.wait_first_batches([pipe], 240)
        if not firsts:
            stop_reason = f"{pipe.name} committed no batch within 240 s of its start"
            break
        say(
            f"dedicated: {len(started)} running ({pipe.name} committed its first batch"
            f" {firsts[pipe.name] - launched:.1f} s after it was started)"
        )
        if len(started) == 1:
            time.sleep(args.steady)
            samples = []
            for _ in range(3):
                samples.append(tree_rss(pids()))
                time.sleep(5)
            rss_1 = statistics.median(samples)
            out["rss_mb_1"] = round(rss_1 / MB)
            run = fleet.current(pipe.name)
            out["heap_used_mb_1"] = heap_used_mb(driver_pid(run.run_dir)) if run else None
            say(
                f"dedicated: 1 pipeline: rss {out['rss_mb_1']} MB,"
                f" heap used {out['heap_used_mb_1']} MB"
            )
        behind = fleet.check(started)
        if behind:
            stop_reason = f"with {len(started)} pipelines, {len(behind)} fell behind: {behind}"
            say(f"dedicated: stop adding: {stop_reason}")
            break
    out["started"] = len(started)
    out["stopped_adding_because"] = stop_reason
    if not started:
        say(f"dedicated: none started: {stop_reason}")
        return out
    say(f"dedicated: {len(started)} started; settling {args.settle} s")
    time.sleep(args.settle)
    out["failures_before_window"] = failure_causes(started)
    window = fleet.hold(started, pids)
    out["window"] = window
    out["held"] = window["held"]
    out["rss_mb_n"] = window["rss_mb_median"]
    n = len(started)
    out["mb_per_pipeline"] = round(out["rss_mb_n"] / n) if n else None
    out["mb_per_extra_pipeline"] = (
        r2((out["rss_mb_n"] - out["rss_mb_1"]) / (n - 1)) if n > 1 and rss_1 else None
    )
    out["cpu_percent_per_pipeline"] = r2(window["cpu_cores_per_pipeline"] * 100)
    say(
        f"dedicated: held {window['held']}/{n}, rss {out['rss_mb_n']} MB ({out['mb_per_pipeline']}"
        f" MB per pipeline), CPU {out['cpu_percent_per_pipeline']} % of a core per pipeline"
    )
    out["restart_one"] = fleet.restarts(started, args.dedicated_restarts, "dedicated")
    kills = []
    for i in range(args.dedicated_kills):
        pipe = started[(i + 1) % len(started)]
        run = wait(lambda p=pipe: fleet.current(p.name), 240, f"{pipe.name} running", poll=0.5)
        since = run.created_at.timestamp()
        wait(lambda p=pipe, t=since: fleet.commit_after(p.name, t), 240, "a batch", poll=0.5)
        result = fleet.kill_and_recover(driver_pid(run.run_dir), [pipe], args.loss_timeout)
        result.pop("killed_at")
        kills.append(result)
        say(
            f"  dedicated: SIGKILL of {pipe.name}'s driver JVM: next committed batch after"
            f" {result['max_s']} s"
        )
    reported = [k["reported_median_s"] for k in kills if k["reported_median_s"] is not None]
    out["driver_kill"] = {
        "count": len(kills),
        "reported_median_s": r2(statistics.median(reported)) if reported else None,
        "median_s": r2(statistics.median([k["max_s"] for k in kills if k["max_s"] is not None]))
        if any(k["max_s"] is not None for k in kills)
        else None,
        "each": kills,
    }
    fleet.stop(started)
    return out


# -- main -----------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipelines", type=int, default=50, help="in the shared application")
    parser.add_argument("--rate", type=float, default=200.0, help="events/s per pipeline")
    parser.add_argument("--trigger", type=float, default=5.0, help="micro-batch interval, s")
    parser.add_argument("--window", type=float, default=300.0, help="the held window, s")
    parser.add_argument("--sample-every", type=float, default=15.0)
    parser.add_argument("--settle", type=float, default=60.0, help="before each window, s")
    parser.add_argument("--steady", type=float, default=30.0, help="before measuring rss_1, s")
    parser.add_argument("--ramp-step", type=int, default=10, help="shared: started at once")
    parser.add_argument("--start-timeout", type=float, default=240.0, help="per ramp step")
    parser.add_argument(
        "--report-wait", type=float, default=30.0,
        help="after a commit, how long to wait for the control plane to have its progress",
    )  # fmt: skip
    parser.add_argument("--loss-timeout", type=float, default=300.0)
    parser.add_argument("--dedicated-max", type=int, default=6)
    parser.add_argument("--restarts", type=int, default=10, help="shared restart-one repeats")
    parser.add_argument("--dedicated-restarts", type=int, default=3)
    parser.add_argument("--dedicated-kills", type=int, default=1)
    parser.add_argument("--driver-memory", default="4g", help="of the shared application")
    parser.add_argument("--memory-reserve-gb", type=float, default=3.0)
    parser.add_argument("--modes", default="shared,dedicated")
    parser.add_argument("--redis-db", type=int, default=14, help="the Celery broker's database")
    parser.add_argument("--output", default=str(ROOT / "bench" / "results" / "fleet.json"))
    args = parser.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]

    from throughput import machine

    load_start = os.getloadavg()
    started_at = time.monotonic()
    suffix = uuid.uuid4().hex[:6]
    workdir = ROOT / "var" / "bench-fleet" / suffix
    workdir.mkdir(parents=True)
    port = free_port()
    env = dict(os.environ)
    admin_url = env["DATABASE_URL"]
    database = f"controlplane_fleet_{suffix}"
    create_database(admin_url, database)
    env.update(
        DATABASE_URL=admin_url.rsplit("/", 1)[0] + f"/{database}",
        CELERY_BROKER_URL=own_redis_db(env["CELERY_BROKER_URL"], args.redis_db),
        WEB_ADDRESS=f"127.0.0.1:{port}",
        CONTROLPLANE_URL=f"http://127.0.0.1:{port}",
        CONTROLPLANE_RUNS_ROOT=str(workdir / "runs"),
        CONTROLPLANE_CHECKPOINT_ROOT=str(workdir / "checkpoints"),
        DJANGO_SETTINGS_MODULE="controlplane.settings",
    )
    os.environ.update(env)
    import django

    django.setup()
    logging.getLogger("kafka").setLevel(logging.WARNING)  # Django's console handler: INFO
    from django.conf import settings
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    from controlplane.accounts.models import ApiToken
    from controlplane.accounts.roles import VIEWER, set_role
    from controlplane.connections.models import Connection
    from controlplane.definitions.models import Pipeline, Run, RunState, SparkApplication
    from jobs.connections import validate_connection

    bootstrap = env["KAFKA_BOOTSTRAP_SERVERS"]
    sink_dsn = env["CONTROLPLANE_SINK_DATABASE_URL"]
    for conn_name, kind, conn_settings in (
        (f"k-{suffix}", "kafka", {"bootstrap_servers": bootstrap}),
        (f"pg-{suffix}", "postgres", {"dsn": sink_dsn}),
    ):
        clean, secrets = validate_connection(kind, conn_settings, {})
        connection = Connection(name=conn_name, kind=kind, settings=clean)
        connection.set_secrets(secrets)
        connection.save()
    user = get_user_model().objects.create_user("fleet-bench", password=uuid.uuid4().hex)
    set_role(user, VIEWER)
    _, api_key = ApiToken.issue(user, "fleet-bench")

    topics_file, stats_file = workdir / "topics.json", workdir / "producer.json"
    topics_file.write_text("[]")
    logs = workdir / "logs"
    processes = start_control_plane(env, workdir, web="gunicorn")
    producer_log = open(logs / "producer.log", "wb")  # noqa: SIM115 - closed with the process
    producer = subprocess.Popen(
        [sys.executable, __file__, "produce", "--bootstrap", bootstrap, "--rate", str(args.rate),
         "--topics-file", str(topics_file), "--stats-file", str(stats_file)],
        cwd=ROOT, env=env, stdout=producer_log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    processes.append(producer)
    base = env["CONTROLPLANE_URL"]
    import requests

    wait(lambda: _answers(requests, base), 60, "the web app", poll=0.5)
    say(
        f"control plane on port {port} (database {database}, Celery on {env['CELERY_BROKER_URL']}),"
        f" logs in {workdir}; load average {' '.join(f'{x:.2f}' for x in load_start)}"
    )
    fleet = Fleet(args, suffix, base, api_key, bootstrap, sink_dsn, topics_file, stats_file)
    results: dict = {}
    try:
        for mode in modes:
            phase_started = time.monotonic()
            results[mode] = (shared_mode if mode == "shared" else dedicated_mode)(fleet, args)
            results[mode]["phase_s"] = round(time.monotonic() - phase_started)
    finally:
        Pipeline.objects.update(desired_state="stopped")
        SparkApplication.objects.update(desired_state="stopped")
        try:
            wait(
                lambda: (
                    not Run.objects.filter(state__in=RunState.active()).exists()
                    and not SparkApplication.objects.filter(pid__isnull=False).exists()
                ),
                180,
                "everything to stop",
                poll=1,
            )
        except TimeoutError as exc:
            say(f"{exc}: killing what is left")
        finally:
            fleet.kill_leftovers()
            fleet.injector.close()
            for process in processes:
                process.terminate()
            for process in processes:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
            from django.db import connections

            connections.close_all()
            drop_database(admin_url, database)
            # The checkpoints are of topics about to be deleted; logs and run directories stay.
            shutil.rmtree(workdir / "checkpoints", ignore_errors=True)
            cleanup_kafka_and_sink(
                bootstrap,
                [p.topic for p in fleet.made],
                sink_dsn,
                [p.table for p in fleet.made],
                [p.name for p in fleet.made],
            )
    load_end = os.getloadavg()
    report(args, results, settings, load_start, load_end, time.monotonic() - started_at, machine())
    return 0


def _answers(requests, base: str) -> bool:
    try:
        requests.get(f"{base}/healthz", timeout=2)
        return True
    except requests.RequestException:
        return False


def report(args, results, settings, load_start, load_end, elapsed, machine_info) -> None:
    shared, dedicated = results.get("shared", {}), results.get("dedicated", {})

    def get(d: dict, *path):
        for key in path:
            if not isinstance(d, dict) or d.get(key) is None:
                return None
            d = d[key]
        return d

    rows = [
        ("pipelines held over the window", ("held",), "{:.0f}"),
        ("  of pipelines started", ("started",), "{:.0f}"),
        ("resident memory, all (MB)", ("rss_mb_n",), "{:,.0f}"),
        ("resident memory with 1 pipeline (MB)", ("rss_mb_1",), "{:,.0f}"),
        ("MB per extra pipeline", ("mb_per_extra_pipeline",), "{:.1f}"),
        ("CPU per pipeline (% of a core)", ("cpu_percent_per_pipeline",), "{:.2f}"),
        ("restart-one p50, to the commit (s)", ("restart_one", "p50_s"), "{:.2f}"),
        ("restart-one p95, to the commit (s)", ("restart_one", "p95_s"), "{:.2f}"),
        ("  p50, to its progress stored (s)", ("restart_one", "reported_p50_s"), "{:.2f}"),
        ("  p95, to its progress stored (s)", ("restart_one", "reported_p95_s"), "{:.2f}"),
        ("loss: members committed, median (s)", ("application_loss", "median_s"), "{:.1f}"),
        ("loss: members committed, max (s)", ("application_loss", "max_s"), "{:.1f}"),
        ("  median, progress stored (s)", ("application_loss", "reported_median_s"), "{:.1f}"),
        ("progress report delay p95 (s)", ("window", "report_delay_s_p95"), "{:.1f}"),
        ("batch duration p95 (s)", ("window", "batch_s_p95"), "{:.2f}"),
    ]
    baseline_paths = {
        ("application_loss", "median_s"): ("driver_kill", "median_s"),
        ("application_loss", "max_s"): ("driver_kill", "median_s"),
        ("application_loss", "reported_median_s"): ("driver_kill", "reported_median_s"),
    }
    ratios = {}
    print()
    print(f"{'':<40}{'shared':>12}{'dedicated':>12}{'shared/ded.':>13}")
    for label, path, fmt in rows:
        a = get(shared, *path)
        b = get(dedicated, *baseline_paths.get(path, path))
        key = "_".join(path)
        ratios[key] = ratio(a, b)

        def show(x, fmt=fmt):
            return fmt.format(x) if x is not None else "-"

        shown = f"{ratios[key]:.2f}" if ratios[key] is not None else "-"
        print(f"{label:<40}{show(a):>12}{show(b):>12}{shown:>13}")
    print(
        "  (dedicated 'loss' is the SIGKILL of one driver JVM: one pipeline back; shared, all"
        " members of the application)"
    )
    if shared.get("ramp"):
        print(
            "shared ramp (pipelines started: within limits in two samples): "
            + ", ".join(f"{r['pipelines']}: {r['within_limits']}" for r in shared["ramp"])
            + f"; largest step wholly within limits {shared['largest_ramp_step_within_limits']}"
        )
    if dedicated:
        print(f"dedicated stopped adding: {dedicated.get('stopped_adding_because')}")
    for mode, r in results.items():
        print(
            f"{mode}: failures during the window {get(r, 'window', 'failures')}, before it"
            f" {r.get('failures_before_window')}"
        )
    met = {
        "shared_held": (get(shared, "held") or 0) >= TARGETS["shared_held"],
        "shared_mb_per_extra_pipeline": get(shared, "mb_per_extra_pipeline") is not None
        and shared["mb_per_extra_pipeline"] <= TARGETS["shared_mb_per_extra_pipeline"],
        "shared_restart_one_p95_s": get(shared, "restart_one", "p95_s") is not None
        and shared["restart_one"]["p95_s"] <= TARGETS["shared_restart_one_p95_s"],
    }
    print()
    for key, target in TARGETS.items():
        print(f"target {key}: {target}  {'met' if met[key] else 'MISSED'}")
    for mode, r in results.items():
        p = get(r, "window", "producer") or {}
        print(
            f"{mode}: producer {p.get('events_per_s')}/s of {p.get('target_events_per_s')}/s"
            f" ({p.get('cpu_cores')} cores), machine busy {get(r, 'window', 'machine_busy_cores')}"
            f" cores of {os.cpu_count()} over the window, lag p95"
            f" {get(r, 'window', 'lag_s_p95')} s,"
            f" backpressure {get(r, 'window', 'backpressure_samples')}"
        )
    print(
        f"load average at the start: {' '.join(f'{x:.2f}' for x in load_start)}, at the end:"
        f" {' '.join(f'{x:.2f}' for x in load_end)}; {elapsed / 60:.1f} min in all"
    )
    line = json.dumps(
        {
            "pipelines": args.pipelines,
            "rate_events_per_s": args.rate,
            "trigger_s": args.trigger,
            "window_s": args.window,
            "lag_limit_s": LAG_LIMIT_S,
            "spark_master": settings.SPARK_MASTER,
            "application_master": settings.SPARK_APPLICATION_MASTER,
            "dedicated_driver_memory": settings.SPARK_DRIVER_MEMORY,
            "shared": shared,
            "dedicated": dedicated,
            "ratios_shared_to_dedicated": ratios,
            "targets": {**TARGETS, "met": met},
            "load_average_start": [round(x, 2) for x in load_start],
            "load_average_end": [round(x, 2) for x in load_end],
            "minutes": round(elapsed / 60, 1),
            "machine": machine_info,
        }
    )
    print(line)
    out = Path(args.output)
    out.parent.mkdir(exist_ok=True)
    out.write_text(line + "\n")


if __name__ == "__main__":
    if sys.argv[1:2] == ["produce"]:
        sys.exit(produce_main(sys.argv[2:]))
    sys.exit(main())
