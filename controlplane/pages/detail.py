"""What the pipeline page shows, beyond the raw models: restart progress, spec diffs."""

from __future__ import annotations

import difflib
import json
from datetime import datetime

from django.contrib import messages

from controlplane.definitions.models import Pipeline, Status

CONTROLS = [
    # action, label, what it does (shown in the confirmation)
    ("start", "Start", "Launch a driver; a failed pipeline's restart policy counts afresh."),
    ("stop", "Stop", "Finish the batch in flight, then stop the driver."),
    ("restart", "Restart", "Stop the driver gracefully and start a new one."),
    ("kill", "Kill", "Kill the driver now; the batch in flight is read again on the next start."),
    ("suspend", "Suspend", "Stop gracefully and hold: no automatic restart until resumed."),
    ("resume", "Resume", "Run a suspended pipeline again."),
    ("restart-now", "Restart now", "Skip the rest of the restart delay."),
    ("reset-restarts", "Reset restarts", "Count failures afresh from now (attempts, backoff)."),
]
CONTROL_NAMES = {c[0] for c in CONTROLS}
# Actions that lose the batch in flight or keep a pipeline down: shown apart, in red.
DANGEROUS = {"kill", "suspend", "stop"}


def confirmed(request, name: str, *, refusal: str, kind: str = "pipeline") -> bool:
    """Whether a dangerous form was confirmed by typing `name`; if not, a message says so
    (starting with `refusal`, e.g. "Not restored")."""
    if request.POST.get("confirm") == name:
        return True
    messages.error(request, f"{refusal}: type the {kind}'s name ({name}) to confirm.")
    return False


def restart_progress(pipeline: Pipeline, now: datetime) -> dict:
    """ "attempt 3 of 5, next in 12 s": the policy's bound on attempts (None: unbounded)."""
    policy = (pipeline.spec or {}).get("restart_policy") or {}
    kind = policy.get("kind", "exponential-delay")
    limit = None
    if kind == "fixed-delay":
        limit = policy.get("attempts")
    elif kind == "exponential-delay":
        limit = policy.get("max_attempts")
    elif kind == "none":
        limit = 0
    seconds = None
    if pipeline.status == Status.BACKING_OFF and pipeline.next_attempt_at is not None:
        seconds = max(0, round((pipeline.next_attempt_at - now).total_seconds()))
    return {
        "kind": kind,
        "policy": policy,
        "attempt": pipeline.attempt,
        "limit": limit,
        "next_in_seconds": seconds,
    }


def spec_diff(old: dict, new: dict, old_label: str, new_label: str) -> list[tuple[str, str]]:
    """A unified diff of two specs as (kind, line): kind is add, remove, hunk or same."""
    a = json.dumps(old, indent=2, sort_keys=True).splitlines()
    b = json.dumps(new, indent=2, sort_keys=True).splitlines()
    out = []
    for line in difflib.unified_diff(a, b, old_label, new_label, lineterm="", n=3):
        if line.startswith(("+++", "---")):
            continue
        kind = {"+": "add", "-": "remove", "@": "hunk"}.get(line[:1], "same")
        out.append((kind, line))
    return out
