"""Restart policies: after a failure, restart or not, when, and why, in words.

Pure logic, with Apache Flink 1.20's semantics (`restart-strategy.*`); no Django, no Celery,
no clock: the failure history and `now` are passed in, and the answer is a function of them
alone (jitter included: it is drawn from a seed, not from a global random state), so asking
twice gives the same answer.

* fixed-delay: up to `attempts` restarts since the pipeline was last started by hand (or its
  restarts were reset), `delay_seconds` apart; the next failure gives up.
* failure-rate: restart `delay_seconds` after each failure while at most `max_failures`
  failures fall within the trailing `interval_seconds`; give up when that rate is exceeded.
* exponential-delay: restart after a backoff that starts at `initial_backoff_seconds` and
  grows by `multiplier` up to `max_backoff_seconds`, +/- `jitter` (never above the maximum);
  a failure that arrives while a restart is already pending is merged into it (no growth);
  the backoff starts over once the failed run had been healthy for `reset_after_seconds`;
  with `max_attempts`, give up after that many restarts since the last reset.
* none: never restart.

A permanent failure (a definition error: a missing column, bad credentials) is never
restarted, whatever the policy: restarting cannot fix it.
"""

from __future__ import annotations

import hashlib
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from jobs.spec.model import ExponentialDelay, FailureRate, FixedDelay, NoRestart, RestartPolicy


@dataclass(frozen=True)
class Failure:
    """One failed run, as the policy needs it."""

    at: datetime  # when the failure was detected
    cause: str = "crashed"  # crashed, vanished, lost-heartbeat, stalled, launch-failed...
    started_at: datetime | None = None  # when the failed run started (its healthy time)
    permanent: bool = False


@dataclass(frozen=True)
class Decision:
    restart: bool
    # When to start the next run (restart only): never before the failure, nor before now.
    restart_at: datetime | None
    delay_seconds: float  # from the failure to the restart
    attempt: int  # which restart this is (1 = the first since the last start or reset)
    reason: str

    @property
    def gave_up(self) -> bool:
        return not self.restart


def decide(
    policy: RestartPolicy, failures: Sequence[Failure], now: datetime, *, seed: str = ""
) -> Decision:
    """What to do after the last of `failures`: the failures since the pipeline was last
    started by hand (or had its restarts reset), oldest first or in any order."""
    history = sorted(failures, key=_order)
    if not history:
        raise ValueError("decide() needs at least one failure")
    last = history[-1]
    if last.permanent:
        return _give_up(
            len(history), f"gave up: {last.cause} is permanent (restarting cannot fix it)"
        )
    if isinstance(policy, NoRestart):
        return _give_up(len(history), "gave up: the restart policy is none")
    if isinstance(policy, FixedDelay):
        return _fixed_delay(policy, history, now)
    if isinstance(policy, FailureRate):
        return _failure_rate(policy, history, now)
    if isinstance(policy, ExponentialDelay):
        return _exponential_delay(policy, history, now, seed)
    raise TypeError(f"unknown restart policy {policy!r}")


# Errors that a restart cannot fix: the run fails the same way every time until someone
# changes the spec, the credentials or the grants. Matched in the driver's error output.
_PERMANENT = [
    (
        re.compile(
            r"\[(UNRESOLVED_COLUMN|UNRESOLVED_ROUTINE|TABLE_OR_VIEW_NOT_FOUND|PARSE_SYNTAX_ERROR"
            r"|DATATYPE_MISMATCH|INVALID_EXTRACT_BASE_FIELD_TYPE|AMBIGUOUS_REFERENCE)"
        ),
        "a definition error (Spark cannot analyse the transform)",
    ),
    (
        re.compile(
            r"\b(SpecError|MixedWritesError|SinkRefused|ReaderError|KafkaSinkError|FileSinkError"
            r"|StateStoreError)\b"
        ),
        "a definition error",
    ),
    # A stateful transform changed in a way its checkpoint's state cannot follow (other
    # group keys or aggregates, stateful operators added or removed): Spark refuses to
    # restore it at every start, until the spec goes back or the offsets are reset.
    (
        re.compile(
            r"\[(STATE_STORE_(KEY|VALUE)_SCHEMA_NOT_COMPATIBLE"
            r"|STATE_STORE_INVALID_(CONFIG_AFTER_RESTART|PROVIDER|VALUE_SCHEMA_EVOLUTION"
            r"|VARIABLE_TYPE_CHANGE)|STREAMING_STATEFUL_OPERATOR_\w+)"
        ),
        "a state the checkpoint cannot restore",
    ),
    # What Spark's analyzer refuses on a stream (jobs.spec.streaming checks most of it when
    # the spec is saved).
    (
        re.compile(
            r"\[(STREAMING_OUTPUT_MODE\.\w+|NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING"
            r"|UNSUPPORTED_STREAMING_OPERATOR_\w+)"
            r"|correctness' issue due to global watermark"
            r"|output mode not supported when there are streaming aggregations"
            r"|not supported (with|on) streaming DataFrames/Data[Ss]ets"
            r"|session window in streaming query is not supported",
        ),
        "a definition error (Spark refuses the stateful transform on a stream)",
    ),
    (
        re.compile(
            r"password authentication failed|SaslAuthentication(Failed|Exception)|SaslLoginError"
            r"|SASL authentication|invalid credentials with SASL mechanism",
            re.I,
        ),
        "bad credentials",
    ),
    (re.compile(r"InsufficientPrivilege|permission denied for", re.I), "missing privileges"),
    # Ours (the Python reader) and Spark's connector's (error class KAFKA_DATA_LOSS).
    (
        re.compile(r"\bDataLossError\b|\bKAFKA_DATA_LOSS\b|Some data may have been lost"),
        "data loss (fail_on_data_loss is true)",
    ),
]


def classify(error: str) -> str | None:
    """What makes a failure permanent, from the driver's error output; None if transient."""
    for pattern, kind in _PERMANENT:
        if pattern.search(error or ""):
            return kind
    return None


def describe(policy: RestartPolicy) -> str:
    """The policy in one short phrase, as reasons quote it."""
    if isinstance(policy, FixedDelay):
        return f"fixed-delay(attempts {policy.attempts}, delay {_s(policy.delay_seconds)})"
    if isinstance(policy, FailureRate):
        return (
            f"failure-rate(max {policy.max_failures} per {_s(policy.interval_seconds)},"
            f" delay {_s(policy.delay_seconds)})"
        )
    if isinstance(policy, ExponentialDelay):
        attempts = f", max {policy.max_attempts} attempts" if policy.max_attempts else ""
        return (
            f"exponential-delay({_s(policy.initial_backoff_seconds)} to"
            f" {_s(policy.max_backoff_seconds)}, x{policy.multiplier:g}{attempts})"
        )
    return "none"


# -- the policies -----------------------------------------------------------------------------


def _fixed_delay(policy: FixedDelay, history: list[Failure], now: datetime) -> Decision:
    failures = len(history)
    if failures > policy.attempts:
        return _give_up(
            failures,
            f"gave up: {failures} failures since the last start exceed {describe(policy)}",
        )
    return _restart(
        history[-1],
        policy.delay_seconds,
        now,
        attempt=failures,
        reason=f"restart {failures} of {policy.attempts} ({describe(policy)})",
    )


def _failure_rate(policy: FailureRate, history: list[Failure], now: datetime) -> Decision:
    last = history[-1]
    window = timedelta(seconds=policy.interval_seconds)
    recent = sum(1 for f in history if last.at - f.at < window)
    if recent > policy.max_failures:
        return _give_up(
            len(history),
            f"gave up: {recent} failures in {_s(policy.interval_seconds)} exceed"
            f" {describe(policy)}",
        )
    return _restart(
        last,
        policy.delay_seconds,
        now,
        attempt=len(history),
        reason=(
            f"restart: {recent} of at most {policy.max_failures} failures in"
            f" {_s(policy.interval_seconds)} ({describe(policy)})"
        ),
    )


def _exponential_delay(
    policy: ExponentialDelay, history: list[Failure], now: datetime, seed: str
) -> Decision:
    backoff = 0.0
    attempt = 0
    pending_until: datetime | None = None
    delay = 0.0
    merged = False
    reset = False
    for failure in history:
        if pending_until is not None and failure.at < pending_until:
            merged = True  # part of the failure a restart is already pending for
            continue
        merged = False
        healthy = (
            (failure.at - failure.started_at).total_seconds()
            if failure.started_at is not None
            else 0.0
        )
        reset = attempt > 0 and healthy >= policy.reset_after_seconds
        if attempt == 0 or reset:
            backoff, attempt = policy.initial_backoff_seconds, 1
        else:
            backoff = min(backoff * policy.multiplier, policy.max_backoff_seconds)
            attempt += 1
        delay = _jittered(backoff, policy, f"{seed}/{attempt}/{failure.at.isoformat()}")
        pending_until = failure.at + timedelta(seconds=delay)
    last = history[-1]
    if policy.max_attempts is not None and attempt > policy.max_attempts:
        return _give_up(
            attempt,
            f"gave up: {attempt} restarts since the backoff was last reset exceed"
            f" {describe(policy)}",
        )
    if merged:
        # The restart already scheduled covers this failure too: same time, no growth.
        assert pending_until is not None
        return Decision(
            restart=True,
            restart_at=max(pending_until, now),
            # The time left of the pending delay (pending_until is rounded to microseconds:
            # never report more than the delay itself).
            delay_seconds=min(delay, max(0.0, (pending_until - last.at).total_seconds())),
            attempt=attempt,
            reason=f"restart {attempt} already pending: failure merged ({describe(policy)})",
        )
    note = ", backoff reset after a healthy run" if reset else ""
    return _restart(
        last,
        delay,
        now,
        attempt=attempt,
        reason=f"restart {attempt} after {_s(delay)}{note} ({describe(policy)})",
    )


# -- shared pieces ------------------------------------------------------------------------------


def _order(failure: Failure) -> tuple:
    """A total order: the history means the same whatever order it was given in."""
    return (failure.at, failure.started_at or failure.at, failure.cause, failure.permanent)


def _jittered(backoff: float, policy: ExponentialDelay, seed: str) -> float:
    """The backoff +/- jitter, drawn from the seed (stable), within [0, max_backoff]."""
    digest = hashlib.sha256(seed.encode()).digest()
    factor = random.Random(digest).uniform(-policy.jitter, policy.jitter)  # noqa: S311 - not security
    return min(policy.max_backoff_seconds, max(0.0, backoff * (1 + factor)))


def _restart(failure: Failure, delay: float, now: datetime, *, attempt: int, reason: str):
    due = failure.at + timedelta(seconds=delay)
    return Decision(
        restart=True,
        restart_at=max(due, now),
        delay_seconds=delay,
        attempt=attempt,
        reason=reason,
    )


def _give_up(attempt: int, reason: str) -> Decision:
    return Decision(
        restart=False, restart_at=None, delay_seconds=0.0, attempt=attempt, reason=reason
    )


def _s(seconds: float) -> str:
    return f"{seconds:g} s"
