"""The pipeline's status machine: status x desired state x observation -> action, next status.

Pure logic (no Django, no Celery): the one table every change of a pipeline's status follows.
The reconciler, the end of a run and the on-call controls observe something, look the step
up here and act; `controlplane.supervision.status.transition` is the one place that writes
the new status (a conditional update on the status it was read with).

`python -m controlplane.supervision.transitions` prints the table as a Mermaid state diagram
(docs/architecture.md holds it; a test keeps the two the same).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from enum import Enum, StrEnum


class Status(StrEnum):
    """What the control plane observes of a pipeline (the values of models.Status)."""

    STARTING = "starting"
    RUNNING = "running"
    RESTARTING = "restarting"
    BACKING_OFF = "backing-off"
    STOPPING = "stopping"
    STOPPED = "stopped"
    SUSPENDED = "suspended"
    FAILED = "failed"


class Desired(StrEnum):
    """What an operator wants (the values of models.DesiredState)."""

    RUNNING = "running"
    STOPPED = "stopped"
    SUSPENDED = "suspended"


class Observation(StrEnum):
    # The reconcile tick, when the pipeline has no active run.
    IDLE = "no run"
    RESTART_DUE = "no run, restart due"
    # The launch completed: the driver's process runs.
    LAUNCHED = "driver launched"
    # The tick sees a run that is no longer wanted (stopped, suspended, or restarted by hand).
    UNWANTED = "run not wanted"
    # A run ended: as asked (stopped, killed) or while not wanted; else it failed, and the
    # restart policy said whether to restart.
    ENDED = "run ended as asked"
    FAILED_RESTART = "run failed, policy restarts"
    FAILED_GIVE_UP = "run failed, policy gives up"
    # On-call controls.
    START = "start by hand"
    RESTART = "restart by hand"


class Action(StrEnum):
    NONE = "none"
    LAUNCH = "launch"  # a new run (generation + 1)
    RELAUNCH = "relaunch"  # a new run after a failure, counted as a restart
    STOP = "stop"  # ask the driver to stop gracefully (killed after a timeout)
    SETTLE = "settle"  # nothing runs and nothing is pending: at rest
    RECORD = "record"  # the run's end is recorded, the pipeline takes its new status


# The status a pipeline rests in when no run is wanted.
REST = "rest"
# The statuses a pipeline can have while it has an active run.
ACTIVE = (Status.STARTING, Status.RUNNING, Status.RESTARTING, Status.STOPPING)
NOT_RUNNING = (Desired.STOPPED, Desired.SUSPENDED)
ALL_DESIRES = tuple(Desired)


@dataclass(frozen=True)
class Rule:
    statuses: tuple[Status, ...]
    desires: tuple[Desired, ...]
    observation: Observation
    action: Action
    to: str  # a Status, or REST (stopped or suspended, as desired)
    why: str


# Read top to bottom; the first rule that matches applies. A (status, desired, observation)
# that no rule matches changes nothing.
RULES: tuple[Rule, ...] = (
    # -- no run, none wanted: at rest (a failed pipeline stays failed until started again)
    Rule(
        (Status.STARTING, Status.RUNNING, Status.RESTARTING, Status.STOPPING, Status.BACKING_OFF),
        NOT_RUNNING, Observation.IDLE, Action.SETTLE, REST,
        "nothing runs and none is wanted",
    ),
    Rule(
        (Status.STOPPED, Status.SUSPENDED), NOT_RUNNING, Observation.IDLE, Action.SETTLE, REST,
        "stopped and suspended follow the desired state",
    ),
    # -- no run, one wanted
    Rule(
        (Status.STOPPED, Status.SUSPENDED, Status.STARTING, Status.RESTARTING),
        (Desired.RUNNING,), Observation.IDLE, Action.LAUNCH, Status.STARTING,
        "wanted running: launch a new run",
    ),
    Rule(
        (Status.BACKING_OFF,), (Desired.RUNNING,), Observation.RESTART_DUE, Action.RELAUNCH,
        Status.RESTARTING, "the restart policy's delay is over",
    ),
    Rule(
        (Status.RUNNING, Status.STOPPING), (Desired.RUNNING,), Observation.IDLE, Action.SETTLE,
        Status.STOPPED, "no run although it looked alive (a run row removed): launched next",
    ),
    # -- a run
    Rule(
        (Status.STARTING, Status.RESTARTING), ALL_DESIRES, Observation.LAUNCHED, Action.NONE,
        Status.RUNNING, "the driver runs (stopped at the next tick if no longer wanted)",
    ),
    Rule(
        (Status.RESTARTING,), ALL_DESIRES, Observation.UNWANTED, Action.STOP, Status.RESTARTING,
        "a restart by hand shows as such until the next run starts",
    ),
    Rule(
        ACTIVE, ALL_DESIRES, Observation.UNWANTED, Action.STOP, Status.STOPPING,
        "stopped, suspended or replaced: a graceful stop",
    ),
    Rule(ACTIVE, ALL_DESIRES, Observation.ENDED, Action.RECORD, REST, "it stopped as asked"),
    Rule(
        ACTIVE, (Desired.RUNNING,), Observation.FAILED_RESTART, Action.RECORD,
        Status.BACKING_OFF, "failed: restarted at the policy's time",
    ),
    Rule(
        ACTIVE, (Desired.RUNNING,), Observation.FAILED_GIVE_UP, Action.RECORD, Status.FAILED,
        "failed: the policy gives up, or the failure is permanent",
    ),
    # -- on-call controls
    Rule(
        (Status.FAILED, Status.BACKING_OFF), ALL_DESIRES, Observation.START, Action.LAUNCH,
        Status.STOPPED, "started by hand: launched at once, failures counted from now",
    ),
    Rule(
        ACTIVE, ALL_DESIRES, Observation.RESTART, Action.STOP, Status.RESTARTING,
        "restarted by hand: the current run stops, the next one starts",
    ),
)  # fmt: skip


@dataclass(frozen=True)
class Step:
    action: Action
    status: Status
    rule: Rule


def step(status: str, desired: str, observation: Observation) -> Step | None:
    """The step for what was observed, or None: nothing changes."""
    status, desired = Status(status), Desired(desired)
    for rule in RULES:
        if status in rule.statuses and desired in rule.desires and observation is rule.observation:
            return Step(rule.action, resolve(rule.to, desired), rule)
    return None


class Rest(Enum):
    """Whether a pipeline without an active run is at rest (its tick step does nothing)."""

    NEVER = "never"
    ALWAYS = "always"
    UNLESS_RESTART_PENDING = "unless a restart time is left on it"


def at_rest(status: str, desired: str) -> Rest:
    """For a pipeline with no active run: whether the reconcile step leaves it as it is. A
    backing-off pipeline that wants to run waits for its stored restart time, which the
    caller compares (NEVER here); one that settles into its own status is at rest once no
    restart time is left on it."""
    status, desired = Status(status), Desired(desired)
    if status is Status.BACKING_OFF and desired is Desired.RUNNING:
        return Rest.NEVER
    found = step(status, desired, Observation.IDLE)
    if found is None:
        return Rest.ALWAYS
    if found.action is Action.SETTLE and found.status is status:
        return Rest.UNLESS_RESTART_PENDING
    return Rest.NEVER


def resolve(to: str, desired: Desired) -> Status:
    if to == REST:
        return Status.SUSPENDED if desired is Desired.SUSPENDED else Status.STOPPED
    return Status(to)


def edges() -> list[tuple[Status, Status, str]]:
    """Every (from, to, label) the table allows, in the rules' order, each once."""
    seen: dict[tuple[Status, Status], list[str]] = {}
    for rule in RULES:
        for status in rule.statuses:
            for desired in rule.desires:
                if step(status, desired, rule.observation) is None:
                    continue
                target = step(status, desired, rule.observation).status
                if target == status:
                    continue
                labels = seen.setdefault((status, target), [])
                if rule.observation.value not in labels:
                    labels.append(rule.observation.value)
    return [(a, b, " / ".join(labels)) for (a, b), labels in seen.items()]


def mermaid() -> str:
    """The table as a Mermaid state diagram."""
    name = {s: s.name.lower() for s in Status}
    lines = ["stateDiagram-v2", f"    [*] --> {name[Status.STOPPED]}"]
    lines += [f"    {name[a]} --> {name[b]}: {label}" for a, b, label in edges()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(mermaid() + "\n")
