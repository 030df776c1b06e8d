"""Restart policies: after a failure, restart or not, when, and why, in words.

Pure logic, with the semantics of Apache Flink 1.20's restart strategies (flink-runtime,
`org.apache.flink.runtime.executiongraph.failover.*RestartBackoffTimeStrategy`); no Django, no
Celery, no clock: the failure history and `now` are passed in, and the answer is a function of
them alone (jitter included: it is drawn from a seed, not from a global random state), so
asking twice gives the same answer. tests/test_restarts_flink.py ports Flink's unit tests.

Durations count in whole milliseconds, as Flink's do (each setting rounded to the nearest
millisecond; the backoffs, the reset threshold and the interval at least 1 ms). `history` is
the failures since the pipeline was last started by hand (or had its restarts reset), which
is where Flink's strategy starts over: a job (re)submitted. With F failures in it, the last
one at time t:

* fixed-delay (Flink's FixedDelayRestartBackoffTimeStrategy): restart at t + delay while
  F <= attempts; give up when F > attempts (attempts 0: never restart).
* failure-rate (FailureRateRestartBackoffTimeStrategy): restart at t + delay unless more than
  max_failures failures fall within [t - interval, t] (both ends counted: Flink keeps the
  last max_failures + 1 failure times and gives up unless the oldest is more than interval
  before t).
* exponential-delay (ExponentialDelayRestartBackoffTimeStrategy): the failures in order; a
  failure at or before the restart already scheduled (`at <= next_restart`) is merged into it:
  same restart time, no new attempt. Otherwise a new attempt: when the failed run had been up
  for at least reset_after (see below) the count `n` of attempts since the last reset starts
  over at 0; the delay is
      b = floor(initial * multiplier ** n)       (in ms; Flink's (long) cast)
      o = floor(b * jitter)                      (the jitter range)
      delay = max(initial, min(b + r, max))      (r a whole number of ms drawn in [-o, o])
  so a delay is never below the initial backoff, and once b - o >= max it is exactly the
  maximum; next_restart = t + delay, n += 1. With max_attempts, give up when n > max_attempts.
* none: never restart.

Where we differ from Flink, on purpose (docs/spec.md says why): the reset measures the failed
run's own uptime (its failure time minus its start), where Flink measures from the restart it
had scheduled (t - next_restart), which counts a late or slow restart as healthy time; a run
that never started (a failed launch) has no uptime. A run that restart launched, failing at
its very instant, is not merged into it (the restart is no longer pending; Flink cannot tell
the two apart). Flink's long arithmetic overflows once initial * multiplier ** n passes
2^63 ms (after ~90 attempts at the defaults), and a positive jitter then wraps the delay to
the initial backoff; here it stays at the maximum.

A permanent failure (a definition error: a missing column, bad credentials) is never
restarted, whatever the policy: restarting cannot fix it (Flink's unrecoverable errors).
"""

from __future__ import annotations

import hashlib
import math
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
    # The failure joined a restart already scheduled (exponential-delay only): no new
    # attempt, the same restart time. Flink's notifyFailure() returns `not merged`.
    merged: bool = False

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
    # Flink counts every failure (notifyFailure: attempts++) and restarts while
    # attempts <= maxNumberRestartAttempts.
    failures = len(history)
    if failures > policy.attempts:
        return _give_up(
            failures,
            f"gave up: {failures} failures since the last start exceed {describe(policy)}",
        )
    return _restart(
        history[-1],
        _ms(policy.delay_seconds),
        now,
        attempt=failures,
        reason=f"restart {failures} of {policy.attempts} ({describe(policy)})",
    )


def _failure_rate(policy: FailureRate, history: list[Failure], now: datetime) -> Decision:
    # Flink keeps the last max_failures + 1 failure times and, once it has that many, restarts
    # only if the oldest of them is more than the interval before the last (the clock it reads
    # is the failure's): a failure exactly one interval ago still counts.
    last = history[-1]
    window = timedelta(milliseconds=max(1, _ms(policy.interval_seconds)))
    recent = sum(1 for f in history if last.at - f.at <= window)
    if recent > policy.max_failures:
        return _give_up(
            len(history),
            f"gave up: {recent} failures in {_s(policy.interval_seconds)} exceed"
            f" {describe(policy)}",
        )
    return _restart(
        last,
        _ms(policy.delay_seconds),
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
    # Flink's notifyFailure() replayed over the history: `attempts` is its
    # currentRestartAttempt, `next_restart` its nextRestartTimestamp.
    initial = max(1, _ms(policy.initial_backoff_seconds))
    maximum = max(initial, _ms(policy.max_backoff_seconds))
    healthy = timedelta(milliseconds=max(1, _ms(policy.reset_after_seconds)))
    attempts = 0
    next_restart: datetime | None = None
    delay = 0
    merged = reset = False
    for failure in history:
        if next_restart is not None and _pending(failure, next_restart):
            merged = True  # part of the failure a restart is already scheduled for
            continue
        merged = False
        # Flink resets when t - next_restart >= threshold; we ask how long the failed run was
        # really up (a restart that came late, or a slow launch, is no healthy time).
        reset = attempts > 0 and _uptime(failure) >= healthy
        if reset:
            attempts = 0
        delay = _backoff_ms(
            policy, attempts, initial, maximum, f"{seed}/{attempts + 1}/{failure.at.isoformat()}"
        )
        next_restart = failure.at + timedelta(milliseconds=delay)
        attempts += 1
    last = history[-1]
    if policy.max_attempts is not None and attempts > policy.max_attempts:
        return _give_up(
            attempts,
            f"gave up: {attempts} restarts since the backoff was last reset exceed"
            f" {describe(policy)}",
        )
    assert next_restart is not None  # the first failure is never merged
    if merged:
        # The restart already scheduled covers this failure too: same time, no growth.
        left = max(timedelta(0), next_restart - last.at)
        return Decision(
            restart=True,
            restart_at=max(next_restart, now),
            delay_seconds=left.total_seconds(),
            attempt=attempts,
            reason=f"restart {attempts} already pending: failure merged ({describe(policy)})",
            merged=True,
        )
    note = ", backoff reset after a healthy run" if reset else ""
    return _restart(
        last,
        delay,
        now,
        attempt=attempts,
        reason=f"restart {attempts} after {_s(delay / 1000)}{note} ({describe(policy)})",
    )


def _backoff_ms(
    policy: ExponentialDelay, attempts: int, initial: int, maximum: int, seed: str
) -> int:
    """Flink's calculateActualBackoffTime(), in whole milliseconds: the initial backoff times
    the multiplier to the power of the attempts since the reset, +/- the jitter drawn from
    the seed, capped at the maximum and never below the initial backoff."""
    try:
        grown = initial * math.pow(policy.multiplier, attempts)
    except OverflowError:
        grown = math.inf
    # Java's (long) cast: truncated, saturating at Long.MAX_VALUE. Python's ints do not wrap
    # when the jitter is added, so the delay stays at the maximum (Flink's wraps to initial).
    backoff = _LONG_MAX if grown >= _LONG_MAX else int(grown)
    jitter = 0
    if policy.jitter:
        offset = int(backoff * policy.jitter)
        digest = hashlib.sha256(seed.encode()).digest()
        jitter = random.Random(digest).randint(-offset, offset)  # noqa: S311 - not security
    return max(initial, min(backoff + jitter, maximum))


# -- shared pieces ------------------------------------------------------------------------------

_LONG_MAX = 2**63 - 1


def _ms(seconds: float) -> int:
    """A setting in whole milliseconds, as Flink takes its durations."""
    return round(seconds * 1000)


def _pending(failure: Failure, next_restart: datetime) -> bool:
    """Whether the failure came while the restart scheduled for `next_restart` was pending:
    at or before its time (Flink: now <= nextRestartTimestamp), and not of the run that
    restart launched (a run started at that time, failing at that very instant, is a failure
    of its own: the restart had happened)."""
    if failure.at > next_restart:
        return False
    return failure.started_at is None or failure.started_at < next_restart


def _uptime(failure: Failure) -> timedelta:
    """How long the failed run was up; a run that never started was never healthy."""
    if failure.started_at is None:
        return timedelta(0)
    return max(timedelta(0), failure.at - failure.started_at)


def _order(failure: Failure) -> tuple:
    """A total order: the history means the same whatever order it was given in."""
    return (failure.at, failure.started_at or failure.at, failure.cause, failure.permanent)


def _restart(failure: Failure, delay_ms: int, now: datetime, *, attempt: int, reason: str):
    due = failure.at + timedelta(milliseconds=delay_ms)
    return Decision(
        restart=True,
        restart_at=max(due, now),
        delay_seconds=delay_ms / 1000,
        attempt=attempt,
        reason=reason,
    )


def _give_up(attempt: int, reason: str) -> Decision:
    return Decision(
        restart=False, restart_at=None, delay_seconds=0.0, attempt=attempt, reason=reason
    )


def _s(seconds: float) -> str:
    return f"{seconds:g} s"
