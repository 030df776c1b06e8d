"""Telling the control plane how the job is doing, without ever slowing the job down.

Batch progress (read from the query by `ProgressPoller`) and periodic heartbeats go into a
bounded queue that one background thread sends over HTTP. When the control plane is slow or down the
queue fills and the oldest reports are dropped: metrics are best-effort, data is not. A reply
can ask the job to stop gracefully (the operator pressed stop), and so does a refusal that
means this run is not the current one (401, 404, 409): a driver nobody supervises stops.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import threading
import time
from collections.abc import Callable

import requests

log = logging.getLogger("jobs.reporting")

QUEUE_LIMIT = 200
BATCH_LIMIT = 100  # progress reports per request (the control plane takes at most 100)
TIMEOUT_SECONDS = (2.0, 5.0)  # connect, read
# Answers that mean the control plane does not know this run as its pipeline's current one:
# an unknown token (401), a run that no longer exists (404), a stale or ended run (409).
STOP_STATUSES = {401, 404, 409}


class Reporter:
    def __init__(
        self,
        base_url: str,
        run_id: int,
        token: str,
        *,
        heartbeat_seconds: float = 5.0,
        on_stop: Callable[[str], None] | None = None,
        on_refused: Callable[[str], None] | None = None,
        session: requests.Session | None = None,
        channel: SharedChannel | None = None,
    ):
        self.url = f"{base_url.rstrip('/')}/api/runs/{run_id}"
        self.run_id, self.token = run_id, token
        self.heartbeat_seconds = heartbeat_seconds
        self.on_stop = on_stop or (lambda reason: None)
        # Refused as not current: another run may own the pipeline now (on_stop if unset).
        self.on_refused = on_refused or self.on_stop
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"RunToken {token}"
        # A shared application's members send through its channel: one request for all.
        self.channel = channel
        self.queue: collections.deque[tuple[str, dict]] = collections.deque(maxlen=QUEUE_LIMIT)
        self.dropped = 0
        self.sent = 0
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cp-reporter", daemon=True)

    def start(self) -> Reporter:
        self._thread.start()
        return self

    def progress(self, progress: dict) -> None:
        """Queue a batch's progress; never blocks, never raises."""
        if len(self.queue) == self.queue.maxlen:
            self.dropped += 1
        self.queue.append(("progress", progress))
        self._wake.set()

    def idle(self) -> None:
        """The query waits for data (Spark's idle event): it is not stuck. Never blocks."""
        if self.queue and self.queue[-1] == ("heartbeat", {"idle": True}):
            return
        self.queue.append(("heartbeat", {"idle": True}))
        self._wake.set()

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (for at most `timeout` seconds) and stop the thread."""
        self._closed.set()
        self._wake.set()
        self._thread.join(timeout)

    def _loop(self) -> None:
        next_heartbeat = 0.0
        while True:
            while self.queue:
                kind, body, entries = self._next()
                if self._send(kind, body):
                    # Progress is a sign of life too: the next heartbeat is due a period later
                    # (half the requests when batches come as often as heartbeats would).
                    next_heartbeat = time.monotonic() + self.heartbeat_seconds
                    # Only what was sent: a full queue may have dropped some of it meanwhile.
                    sent = {id(e) for e in entries}
                    while self.queue and id(self.queue[0]) in sent:
                        self.queue.popleft()
                elif self._closed.is_set():
                    return
                else:
                    break  # the control plane is unreachable: keep it, try again later
            if self._closed.is_set() and not self.queue:
                return
            if time.monotonic() >= next_heartbeat:
                self._send("heartbeat", {})
                next_heartbeat = time.monotonic() + self.heartbeat_seconds
            self._wake.wait(min(self.heartbeat_seconds, 1.0))
            self._wake.clear()

    def _next(self) -> tuple[str, dict | list, list[tuple]]:
        """The next request: a heartbeat, or the queued progress reports up to the next
        heartbeat (at most BATCH_LIMIT) in one request; and the queue entries it holds."""
        head = self.queue[0]
        if head[0] != "progress":
            return head[0], head[1], [head]
        entries = []
        for entry in itertools.islice(self.queue.copy(), BATCH_LIMIT):
            if entry[0] != "progress":
                break
            entries.append(entry)
        if len(entries) == 1:
            return "progress", head[1], entries
        return "progress", [body for _, body in entries], entries

    def _post(self, kind: str, body: dict | list) -> tuple[int, dict | None] | None:
        """(status, answer) of the report; None if it did not reach the control plane."""
        if self.channel is not None:
            answered = self.channel.send(self.run_id, self.token, kind, body)
            if answered is not SharedChannel.UNSUPPORTED:
                return answered
        try:
            response = self.session.post(f"{self.url}/{kind}/", json=body, timeout=TIMEOUT_SECONDS)
        except requests.RequestException as exc:
            log.debug("report %s not sent: %s", kind, exc)
            return None
        try:
            answer = response.json()
        except ValueError:
            answer = None
        return response.status_code, answer if isinstance(answer, dict) else None

    def _send(self, kind: str, body: dict | list) -> bool:
        answered = self._post(kind, body)
        if answered is None:
            return False
        status_code, answer = answered
        if status_code in STOP_STATUSES:
            # Not (or no longer) a run the control plane knows as current: stop.
            self.on_refused(f"the control plane refused this run ({status_code})")
            return True
        if status_code >= 500:
            return False
        if status_code >= 400:
            log.warning("report %s refused (%s): %s", kind, status_code, str(answer)[:300])
            return True  # a bad report will not get better by sending it again
        self.sent += 1
        if answer and answer.get("stop"):
            self.on_stop("the control plane asked for a stop")
        return True


class SharedChannel:
    """One HTTP connection for every member of a shared application: the members' reporter
    threads hand their reports here and wait for their answers, and one thread sends
    whatever is waiting as one request (`POST /api/applications/{name}/reports/`, with the
    application's token; each report with its run's own token, fenced by the control plane
    as the run's own requests are). While a request is in flight the next one fills, so the
    busier the application, the more reports a request carries. A control plane that does
    not know the endpoint (404, 405) is not asked again: members then send their own."""

    UNSUPPORTED = object()
    LIMIT = 500  # reports per request (the control plane takes at most 500)

    def __init__(self, url: str, token: str, *, session: requests.Session | None = None):
        self.url = url
        self.session = session or requests.Session()
        self.session.headers["Authorization"] = f"RunToken {token}"
        self.unsupported = False
        self._lock = threading.Lock()
        self._waiting: list[dict] = []
        self._wake = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="cp-channel", daemon=True)
        self._thread.start()

    def send(self, run_id: int, token: str, kind: str, body) -> tuple[int, dict | None] | None:
        """The report's (status, answer) as the run's own endpoint would give them; None if
        it did not get through; UNSUPPORTED: send it alone. Blocks its reporter's thread
        (never the query's) until answered."""
        if self.unsupported or self._closed.is_set():
            return self.UNSUPPORTED
        item = {
            "report": {"run_id": run_id, "token": token, "kind": kind, "body": body},
            "done": threading.Event(),
            "answer": None,
        }
        with self._lock:
            self._waiting.append(item)
        self._wake.set()
        if not item["done"].wait(sum(TIMEOUT_SECONDS) + 5):
            return None
        return item["answer"]

    def close(self) -> None:
        self._closed.set()
        self._wake.set()

    def _loop(self) -> None:
        while not self._closed.is_set():
            self._wake.wait(1.0)
            self._wake.clear()
            while True:
                with self._lock:
                    batch, self._waiting = self._waiting[: self.LIMIT], self._waiting[self.LIMIT :]
                if not batch:
                    break
                self._deliver(batch)

    def _deliver(self, batch: list[dict]) -> None:
        answers = None
        try:
            response = self.session.post(
                self.url, json={"reports": [i["report"] for i in batch]}, timeout=TIMEOUT_SECONDS
            )
            if response.status_code in (404, 405):
                self.unsupported = True
                log.info("the control plane takes no batched reports: members send their own")
            elif response.status_code == 200:
                answers = response.json()["answers"]
            else:
                log.debug("batched reports not taken (%s)", response.status_code)
        except (requests.RequestException, ValueError, KeyError) as exc:
            log.debug("batched reports not sent: %s", exc)
        for position, item in enumerate(batch):
            if self.unsupported:
                item["answer"] = self.UNSUPPORTED
            elif answers is not None and position < len(answers):
                answer = answers[position]
                item["answer"] = (answer.get("status", 500), answer.get("body"))
            item["done"].set()


_ROW_COUNTS = ("numInputRows", "inputRowsPerSecond", "processedRowsPerSecond")


def per_read(progress: dict, reads: int) -> dict:
    """A batch's progress with its input row counts and rates divided by the number of times
    the batch read its source (so that they count records, not reads)."""
    if reads == 1:
        return progress
    out = {**progress, **_divided(progress, reads)}
    if isinstance(progress.get("sources"), list):
        out["sources"] = [
            {**s, **_divided(s, reads)} if isinstance(s, dict) else s for s in progress["sources"]
        ]
    return out


def _divided(part: dict, reads: int) -> dict:
    out = {}
    for name in _ROW_COUNTS:
        value = part.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            out[name] = value // reads if isinstance(value, int) else value / reads
    return out


class ProgressPoller:
    """A query's batch progress, read from the query itself by the thread that waits on it
    (`jobs.run.wait`), and handed to `on_progress` callbacks in batch order, each once.

    Not a StreamingQueryListener: Spark delivers every query's events to listeners on one
    thread per application, and a Python listener costs a py4j round trip into this process
    per event. With fifty queries in one shared application that thread ran minutes behind
    (progress reports 175 s late at the median), and the control plane took healthy queries
    for stalled ones. Here each query's own thread reads `lastProgress` (two cheap calls when
    nothing is new) and, when it missed batches, `recentProgress`. While the query waits for
    data (no trigger active, none available), `on_idle` is called at most every
    `idle_seconds`, as Spark's idle event would be."""

    def __init__(
        self,
        query,
        on_progress: list[Callable[[dict], None]],
        on_idle: Callable[[], None] | None = None,
        *,
        idle_seconds: float = 5.0,
        source_reads: int = 1,
    ):
        self.query = query
        self.on_progress = on_progress
        # How many times each batch reads its source (jobs.pipeline.source_reads): Spark
        # counts every read in the batch's input rows.
        self.source_reads = source_reads
        self.on_idle = on_idle
        self.idle_seconds = idle_seconds
        self._last: tuple[int, str] | None = None  # (batchId, timestamp) handed on last
        self._idle_checked = 0.0

    def poll(self, now: float | None = None) -> int:
        """Hand on what is new; the number of progress reports handed on. Never raises."""
        now = time.monotonic() if now is None else now
        try:
            handed = self._poll()
            if not handed and self.on_idle is not None:
                self._check_idle(now)
            return handed
        except Exception:  # the query's or the JVM's end: nothing more to read
            log.debug("progress not read", exc_info=True)
            return 0

    def _poll(self) -> int:
        jsq = self.query._jsq
        latest = jsq.lastProgress()
        if latest is None:
            return 0
        stamp = latest.timestamp()
        if self._last is not None and stamp == self._last[1]:
            return 0
        batch = latest.batchId()
        if self._last is not None and batch <= self._last[0] + 1:
            news = [json.loads(latest.json())]
        else:  # the first read, or batches ended since the last one: all that are kept
            news = [json.loads(p.json()) for p in jsq.recentProgress()]
        handed = 0
        for progress in news:
            key = (progress.get("batchId", -1), progress.get("timestamp", ""))
            if self._last is not None and key <= self._last:
                continue
            self._last = key
            handed += 1
            progress = per_read(progress, self.source_reads)
            for callback in self.on_progress:
                try:
                    callback(progress)
                except Exception:
                    log.exception("could not hand on batch %s's progress", key[0])
        return handed

    def _check_idle(self, now: float) -> None:
        if now - self._idle_checked < self.idle_seconds:
            return
        status = self.query._jsq.status()
        if not status.isTriggerActive() and not status.isDataAvailable():
            self._idle_checked = now
            self.on_idle()
