"""What the pipeline page shows, beyond the raw models: restart progress, spec diffs."""

from __future__ import annotations

import difflib
import json
import re
from datetime import datetime

from django.contrib import messages
from django.shortcuts import redirect
from django.urls import reverse

from controlplane.definitions.models import DesiredState, Pipeline, Status

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


def controls_for(pipeline: Pipeline, has_run: bool) -> list[tuple[str, str, str]]:
    """The controls that make sense in the pipeline's state (no Start on a running one, no
    Restart now without a restart pending, no Kill without a driver), in CONTROLS' order.
    The others are still refused by the API in words (409) if asked for."""
    status, desired = pipeline.status, pipeline.desired_state
    wanted: set[str] = set()
    if desired != DesiredState.RUNNING or status in (Status.FAILED, Status.BACKING_OFF):
        wanted.add("resume" if desired == DesiredState.SUSPENDED else "start")
    if desired == DesiredState.RUNNING:
        wanted |= {"stop", "suspend"}
        if has_run:
            wanted.add("restart")
        if status == Status.BACKING_OFF:
            wanted |= {"restart-now", "reset-restarts"}
        elif status in (Status.RESTARTING, Status.STARTING, Status.RUNNING) and pipeline.attempt:
            wanted.add("reset-restarts")
    if desired == DesiredState.SUSPENDED:
        wanted.add("stop")
    if has_run:
        wanted.add("kill")
    return [c for c in CONTROLS if c[0] in wanted]


def next_step(pipeline: Pipeline, restart: dict, colour: str) -> str:
    """What the control plane will do next, and when, in words."""
    status = pipeline.status
    if status == Status.FAILED:
        return "Nothing: it gave up restarting. Fix the cause, then Start it."
    if status == Status.BACKING_OFF:
        attempt = f"attempt {restart['attempt']}" + (
            f" of {restart['limit']}" if restart["limit"] else ""
        )
        if restart["next_in_seconds"] is not None:
            return (
                f"Restarts it in {restart['next_in_seconds']} s ({attempt}, its"
                f" {restart['kind']} policy)."
            )
        return f"Restarts it when its delay is over ({attempt})."
    if status in (Status.STARTING, Status.RESTARTING):
        return "Launching its driver."
    if status == Status.STOPPING:
        return "Stopping its driver (the batch in flight finishes first)."
    if status == Status.RUNNING and colour == "red":
        return (
            "Restarts it after each failure, by its restart policy, until the policy gives up"
            " or the cause is fixed."
        )
    return ""


def spec_note(pipeline: Pipeline, run) -> str:
    """ "v3 saved, v2 running: restart to apply" when the running run has an older spec."""
    if run is not None and run.spec_version and run.spec_version != pipeline.version:
        return f"spec v{pipeline.version} saved, v{run.spec_version} running: restart to apply"
    return f"spec v{pipeline.version}"


def confirmed(request, name: str, *, refusal: str, kind: str = "pipeline") -> bool:
    """Whether a dangerous form was confirmed by typing `name`; if not, a message says so
    (starting with `refusal`, e.g. "Not restored"), next to the control used."""
    if request.POST.get("confirm") == name:
        return True
    say(request, messages.ERROR, f"{refusal}: type the {kind}'s name ({name}) to confirm.")
    return False


# Where on the page a form was (its control's element id, the form's hidden `where`): its
# outcome is shown there, not at the top of a long page.
_PLACE = re.compile(r"[a-z0-9][a-z0-9-]{0,62}")
PLACED = "at-"


def place(request) -> str:
    """The id of the control a form was posted from (`where`), or ""."""
    where = request.POST.get("where", "")
    return where if _PLACE.fullmatch(where) else ""


def say(request, level: int, text: str) -> None:
    """A message about what the posted form did, shown next to it."""
    where = place(request)
    messages.add_message(request, level, text, extra_tags=f"{PLACED}{where}" if where else "")


def back(request, name: str, anchor: str = ""):
    """Back to the pipeline's page, at the control the form was posted from."""
    where = place(request) or anchor
    return redirect(reverse("pipeline", args=[name]) + (f"#{where}" if where else ""))


def placed(request) -> tuple[dict[str, list], list]:
    """The request's messages: by the id of the control they are about, and the others."""
    by_place: dict[str, list] = {}
    rest = []
    for message in messages.get_messages(request):
        tag = next((t for t in message.extra_tags.split() if t.startswith(PLACED)), None)
        if tag:
            by_place.setdefault(tag[len(PLACED) :], []).append(message)
        else:
            rest.append(message)
    return by_place, rest


# A restart policy's bound on attempts, by its kind (failure-rate bounds failures per interval,
# not attempts: None, as an unbounded one).
_ATTEMPT_LIMITS = {
    "fixed-delay": lambda policy: policy.get("attempts"),
    "exponential-delay": lambda policy: policy.get("max_attempts"),
    "none": lambda policy: 0,
}


def restart_progress(pipeline: Pipeline, now: datetime) -> dict:
    """ "attempt 3 of 5, next in 12 s": the policy's bound on attempts (None: unbounded)."""
    policy = (pipeline.spec or {}).get("restart_policy") or {}
    kind = policy.get("kind", "exponential-delay")
    limit = _ATTEMPT_LIMITS.get(kind, lambda p: None)(policy)
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
