"""A pipeline's health in one word, which cannot read green when it is not: pure logic, time
passed in (no Django).

The status (running, backing off, failed...) says what the control plane is doing with a
pipeline; health says whether the pipeline is doing its job. A pipeline can be `running` and
failing: a shared application's member restarted within a second or two after each failure is
running most of the time, and never commits. The rules, first match wins:

  failed         it gave up restarting (a permanent failure, or its restart policy ran out)
  crash-looping  it failed `CRASH_LOOP_FAILURES` times (3) within `CRASH_LOOP_MINUTES` (10),
                 counting from its last start by hand, and its current run has not committed
                 since it started (red: whatever its status says)
  failing        it is running and its current run, up for longer than the start-up grace,
                 has committed nothing since it started while records wait, or its lag is
                 `stalled` (its committed offsets do not move while records wait) (red)
  recovering     starting, restarting or backing off (amber)
  lagging        running, its lag `lagging` or `stalled` (controlplane.observability.lag:
                 judged over commits, as Burrow judges consumers), or its lag unknown (amber)
  degraded       running with high backpressure (amber)
  healthy        running, keeping up
  stopped        not wanted running (stopped, suspended)

Severity orders them for the overview: red (failed, crash-looping, failing), amber
(recovering, lagging, degraded), green (healthy), grey (stopped).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

FAILED = "failed"
CRASH_LOOPING = "crash-looping"
FAILING = "failing"
RECOVERING = "recovering"
LAGGING = "lagging"
DEGRADED = "degraded"
HEALTHY = "healthy"
STOPPED = "stopped"

RED, AMBER, GREEN, GREY = "red", "amber", "green", "grey"
COLOURS = {
    FAILED: RED,
    CRASH_LOOPING: RED,
    FAILING: RED,
    RECOVERING: AMBER,
    LAGGING: AMBER,
    DEGRADED: AMBER,
    HEALTHY: GREEN,
    STOPPED: GREY,
}
# The overview's order, worst first.
STATES = (FAILED, CRASH_LOOPING, FAILING, RECOVERING, LAGGING, DEGRADED, HEALTHY, STOPPED)

CRASH_LOOP_FAILURES = 3
CRASH_LOOP_MINUTES = 10.0


@dataclass(frozen=True)
class Facts:
    """What health is judged from: the pipeline's row, its current run, its failures and the
    collector's figures."""

    status: str  # Pipeline.status
    wanted_running: bool  # desired state `running`
    # When its failures since its last start by hand happened (any order).
    failures: tuple[datetime, ...] = ()
    run_started_at: datetime | None = None  # its current active run's start, if any
    last_commit_at: datetime | None = None  # its checkpoint's last commit
    lag_records: int | None = None
    lag_status: str = ""  # ok, lagging, stalled, stopped
    lag_error: str = ""
    backpressure: str = ""  # ok, low, high
    last_cause: str = ""  # its last failure's cause, in one line
    attempt: int = 0


@dataclass(frozen=True)
class Policy:
    crash_loop_failures: int = CRASH_LOOP_FAILURES
    crash_loop_minutes: float = CRASH_LOOP_MINUTES
    grace_seconds: float = 120.0  # how long a run may take to commit its first batch


@dataclass(frozen=True)
class Health:
    state: str
    why: str  # in words, for the overview and alerts
    recent_failures: int = 0  # within the crash-loop window

    @property
    def colour(self) -> str:
        return COLOURS[self.state]

    @property
    def severity(self) -> int:
        return STATES.index(self.state)

    def as_dict(self) -> dict:
        return {
            "state": self.state,
            "colour": self.colour,
            "why": self.why,
            "recent_failures": self.recent_failures,
        }


def judge(facts: Facts, now: datetime, policy: Policy | None = None) -> Health:
    """The pipeline's health now (see the module's docstring for the rules)."""
    policy = policy or Policy()
    window = timedelta(minutes=policy.crash_loop_minutes)
    recent = sum(1 for at in facts.failures if now - at <= window)
    cause = f": {facts.last_cause}" if facts.last_cause else ""
    committed_since_start = (
        facts.run_started_at is not None
        and facts.last_commit_at is not None
        and facts.last_commit_at >= facts.run_started_at
    )
    if facts.status == "failed":
        return Health(FAILED, f"gave up restarting{cause}", recent)
    if not facts.wanted_running:
        return Health(STOPPED, facts.status, recent)
    if recent >= policy.crash_loop_failures and not committed_since_start:
        minutes = f"{policy.crash_loop_minutes:g} min"
        return Health(CRASH_LOOPING, f"{recent} failures in {minutes}{cause}", recent)
    if facts.status == "running" and facts.run_started_at is not None:
        up = (now - facts.run_started_at).total_seconds()
        if up > policy.grace_seconds and not committed_since_start and facts.lag_records:
            return Health(
                FAILING,
                f"no batch committed in the {up:.0f} s since its start while"
                f" {facts.lag_records} records wait{cause}",
                recent,
            )
        if up > policy.grace_seconds and facts.lag_status == "stalled":
            return Health(
                FAILING, "stalled: its committed offsets have not moved while records wait", recent
            )
    if facts.status in ("backing-off", "restarting", "starting"):
        word = facts.status.replace("-", " ")
        return Health(RECOVERING, f"{word} (attempt {facts.attempt}){cause}", recent)
    if facts.status != "running":
        return Health(RECOVERING, facts.status, recent)
    if facts.lag_error:
        return Health(LAGGING, f"lag unknown: {facts.lag_error}", recent)
    if facts.lag_status in ("lagging", "stalled"):  # stalled within the grace: starting up
        return Health(LAGGING, f"lag {facts.lag_status}", recent)
    if facts.backpressure == "high":
        return Health(DEGRADED, "high backpressure", recent)
    return Health(HEALTHY, "ok", recent)
