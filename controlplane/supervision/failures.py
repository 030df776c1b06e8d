"""Whether a failed run is permanent, and why: the driver's own verdict where it gave one.

A driver classifies the exception its run failed with by type (jobs.failures: our exception
classes, Spark's error conditions, SQLSTATEs, Kafka's error classes) and sends the verdict
with its exit report (`failure`: kind, reason, type, condition). That verdict decides.

The old reading of the error output (`restarts.classify`, regular expressions over the
driver's log tail) is only a fallback, for what comes without a verdict: an exit report of a
driver started before drivers sent one, a launch that failed in the control plane (no driver
ran), and a failure whose type did not reach the driver (an exception raised in a Python
worker arrives as text: jobs.failures says so by giving no verdict).

Pure logic: no Django, no Celery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from jobs.failures import MAX_CONDITION, MAX_REASON, MAX_TYPE, PERMANENT, checked

from . import restarts

__all__ = ["MAX_CONDITION", "MAX_REASON", "MAX_TYPE", "Judgement", "decision_reason", "judge"]


@dataclass(frozen=True)
class Judgement:
    permanent: bool
    # What the restart policy's history calls the failure: the kind when permanent (the
    # verdict's reason, or the text table's kind), else the run's cause.
    cause: str
    # The driver's words (its verdict's reason), or None when the text table decided.
    reason: str | None = None
    # The driver's verdict as checked (kind, reason, type, condition, category), if any.
    verdict: dict | None = None


def parse(data: Any) -> dict[str, str]:
    """A report's `failure`, checked (jobs.failures.checked: the kind, and each field a
    string within its bound); ValueError saying what is wrong."""
    return checked(data)


def judge(failure: Any, error: str, cause: str) -> Judgement:
    """Permanent or not: by the driver's verdict `failure` (as reported: checked here, and
    ignored if it is not one), else by the error output (the fallback: see the docstring)."""
    verdict = None
    if failure is not None:
        try:
            verdict = parse(failure)
        except ValueError:
            verdict = None  # not a verdict (a report read from a file): the fallback decides
    if verdict is not None:
        permanent = verdict["kind"] == PERMANENT
        reason = verdict["reason"]
        return Judgement(permanent, reason if permanent else cause, reason, verdict)
    # Fallback for reports without a verdict (older drivers, a type lost in a Python worker)
    # and launch failures: the text table of restarts.classify.
    kind = restarts.classify(error)
    return Judgement(bool(kind), kind or cause)


def decision_reason(judgement: Judgement, policy_reason: str) -> str:
    """What the exceptions history records as the decision: the policy's words, or, for a
    permanent failure the driver explained, the driver's reason; a transient failure the
    driver explained (a store down, a broker unreachable) adds the driver's reason to the
    policy's words, so that the operator reads why it had to restart."""
    if judgement.permanent and judgement.reason:
        return f"gave up: {judgement.reason} (permanent: restarting cannot fix it)"
    if judgement.reason:
        return f"{policy_reason}, after a transient failure: {judgement.reason}"
    return policy_reason
