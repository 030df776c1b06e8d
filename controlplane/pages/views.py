"""Server-rendered pages (roles as in the API) and the health endpoint."""

from __future__ import annotations

import json

from django.conf import settings
from django.contrib import messages
from django.db import DatabaseError, transaction
from django.http import Http404, JsonResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane import health
from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import OPERATOR, VIEWER, has_role
from controlplane.alerting import engine as alerting
from controlplane.connections.masking import known_secrets, mask
from controlplane.definitions import preflight, services
from controlplane.definitions.models import (
    AuditEntry,
    ManagedObject,
    Pipeline,
    ReconcilerState,
    RestorePoint,
    RunState,
)
from controlplane.fleet import drift
from controlplane.observability import dead_letters, metrics, state, writer_schemas
from controlplane.observability.assess import assess_one
from controlplane.supervision import (
    controls,
    driver_files,
    explain,
    offsets,
    restore_points,
    tasks,
)
from jobs.spec import SpecError

from . import detail, overview


@role_required(VIEWER)
def home(request):
    """The overview: every pipeline, problems first, refreshed in place every few seconds."""
    return render(request, "pipelines/overview.html", _overview_context(request))


@role_required(VIEWER)
def overview_rows(request):
    """The overview's table body alone, for the page's polling (htmx)."""
    return render(request, "pipelines/_overview_rows.html", _overview_context(request))


def _overview_context(request) -> dict:
    show = request.GET.get("show", "all")
    if show not in overview.FILTERS:
        show = "all"
    sort = request.GET.get("sort", "severity")
    if sort not in overview.SORTS:
        sort = "severity"
    try:
        page = int(request.GET.get("page", "1"))
    except ValueError:
        page = 1
    query = request.GET.get("q", "")[:100]
    label = request.GET.get("label", "").strip()[:130]
    selectors, label_error = [], ""
    if label:
        try:
            selectors = [services.parse_selector(label)]
        except services.Invalid as exc:
            label_error = exc.detail
    now = timezone.now()
    found = overview.rows(now, query=query, show=show, sort=sort, page=page, labels=selectors)
    return {
        "rows": found.rows,
        "page": found,
        "show": show,
        "sort": sort,
        "sorts": {key: label for key, (label, _) in overview.SORTS.items()},
        "q": query,
        "label": label,
        "label_error": label_error,
        "filters": list(overview.FILTERS),
        "now": now,
        "problems": found.problems,
        "figures_age": (now - found.collected_at).total_seconds() if found.collected_at else None,
        "reconciler": ReconcilerState.objects.filter(id=1).first(),
        "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
    }


OVERVIEW_REFRESH_SECONDS = 5
STATUS_REFRESH_SECONDS = 2
NOW_REFRESH_SECONDS = 5


@role_required(VIEWER)
def pipeline_page(request, name: str):
    """One pipeline: what it is doing now, its controls, lag, checkpoints, failures, runs,
    spec and versions."""
    pipeline = get_object_or_404(Pipeline, name=name)
    now = timezone.now()
    versions = list(pipeline.versions.select_related("created_by").order_by("-version")[:20])
    by_place, general = detail.placed(request)
    status = _status_context(pipeline, now)
    controls_here = [
        {
            "action": action,
            "label": label,
            "what": what,
            "id": f"control-{action}",
            "messages": by_place.get(f"control-{action}", []),
        }
        for action, label, what in detail.controls_for(pipeline, status["run"] is not None)
    ]
    points = _restore_points(pipeline)
    for point in points:
        point.messages = by_place.get(f"restore-point-{point.pk}", [])
    shown = {c["id"] for c in controls_here} | {"offsets-reset", "restore-points"}
    shown |= {f"restore-point-{point.pk}" for point in points}
    # About a control no longer offered (the state moved on): at the top.
    general += [m for where, found in by_place.items() if where not in shown for m in found]
    return render(
        request,
        "pipelines/pipeline.html",
        {
            **status,
            **_now_context(request, pipeline, now),
            "flash": general,
            "placed_offsets": by_place.get("offsets-reset", []),
            "placed_restore_points": by_place.get("restore-points", []),
            "checkpoint": _checkpoint(pipeline),
            "writers": writer_schemas.page(pipeline, now),
            "failures": _masked(pipeline.failures.select_related("run").order_by("-at")[:20]),
            "runs": pipeline.runs.select_related("application").order_by("-generation")[:20],
            "versions": versions,
            "restore_points": points,
            **_offsets(pipeline),
            "spec_json": json.dumps(pipeline.spec, indent=2, sort_keys=True),
            "managed": _managed(pipeline),
            "audit": AuditEntry.objects.filter(pipeline_name=pipeline.name).order_by("-at")[:20],
            **_driver_log(request, status["run"]),
            "controls": controls_here,
            "dangerous": detail.DANGEROUS,
            "launching": preflight.LAUNCHING,
            "dedicated_master": settings.SPARK_MASTER,
            "master_ui_url": (
                settings.SPARK_MASTER_UI_URL if settings.SPARK_MASTER.startswith("spark://") else ""
            ),
        },
    )


def _managed(pipeline: Pipeline) -> dict | None:
    """Where its definition is kept when a fleet's files manage it (fleet, source, who last
    applied it and when), and how it has drifted from them now (what differs)."""
    row = (
        ManagedObject.objects.filter(kind="Pipeline", name=pipeline.name)
        .select_related("applied_by")
        .first()
    )
    if row is None:
        return None
    (seen,) = drift.survey([row])
    return {"row": row, "drifted": [drift.in_words(change) for change in seen.changes]}


def _state(pipeline: Pipeline, now) -> dict:
    """The stateful operators as of the last batch, each with its growth over the window of
    the state-growth rules about the pipeline, and what those rules say (only for a pipeline
    that keeps state)."""
    operators = state.current_of(pipeline)
    if not operators:
        return {"state_operators": []}
    growth = alerting.state_growth(pipeline, now)
    for operator in operators:
        trend = growth["trends"].get(operator["operator"])
        operator["trend"] = trend
        operator["growth"] = trend.rates() if trend else "—"
    return {
        "state_operators": operators,
        "state_hours": growth["hours"],
        "state_growth": growth["holding"],
    }


def _offsets_text(offsets: dict | None) -> str:
    """{topic: {partition: offset}} as `topic/partition: offset · ...`."""
    return " · ".join(
        f"{topic}/{partition}: {offset}"
        for topic, parts in sorted((offsets or {}).items())
        for partition, offset in sorted(parts.items(), key=lambda kv: int(kv[0]))
    )


def _offsets(pipeline: Pipeline) -> dict:
    try:
        seen = offsets.committed(pipeline)
    except offsets.Refused as exc:  # the checkpoint's store cannot be reached
        return {"committed_text": str(exc), "pending_reset": None, "pending_reset_text": ""}
    return {
        "committed_text": _offsets_text(seen["committed"]),
        "pending_reset": seen["pending_reset"],
        "pending_reset_text": _offsets_text(seen["pending_reset"]),
    }


# The reset form's targets that come with a value of their own (the others: "earliest",
# "latest" as they are); offsets.reset checks them.
_RESET_TARGETS = {
    "timestamp": lambda post: {"timestamp": post.get("timestamp", "").strip()},
    "offsets": lambda post: {"offsets": json.loads(post.get("offsets", ""))},
}


@require_POST
@role_required(OPERATOR)
def pipeline_offsets_reset(request, name: str):
    """Reset a stopped pipeline's offsets from the page (confirmed by name, with a reason)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    if not detail.confirmed(request, pipeline.name, refusal="Not reset"):
        return detail.back(request, name, "offsets")
    chosen = request.POST.get("to", "")
    read = _RESET_TARGETS.get(chosen)
    try:
        to: object = read(request.POST) if read else chosen
    except ValueError:
        detail.say(
            request, messages.ERROR, 'Not reset: offsets must be JSON, {"topic": {"0": 1234}}.'
        )
        return detail.back(request, name, "offsets")
    try:
        done = offsets.reset(
            pipeline,
            to,
            user=request.user,
            reason=request.POST.get("reason", "").strip()[:500],
            now=timezone.now(),
        )
    except (offsets.BadTarget, offsets.Refused) as exc:
        detail.say(request, messages.ERROR, f"Not reset: {exc}.")
    else:
        detail.say(
            request,
            messages.SUCCESS,
            f"{pipeline.name} starts at {_offsets_text(done['start'])} when it is next started.",
        )
    return detail.back(request, name, "offsets")


def _restore_points(pipeline: Pipeline) -> list[RestorePoint]:
    """The newest 30, each with its offsets as `topic/partition: offset` text."""
    points = list(
        RestorePoint.objects.filter(pipeline_name=pipeline.name)
        .select_related("created_by")
        .order_by("-created_at", "-id")[:30]
    )
    for point in points:
        point.offsets_text = _offsets_text(point.offsets)
    return points


def _driver_log(request, run) -> dict:
    """The current driver's last log lines, for operators (its shared application's log,
    for a member)."""
    if run is None or not has_role(request.user, OPERATOR):
        return {"log_lines": None, "log_host": ""}
    lines = driver_files.log_tail(run.log_path, run.host)
    where = f"its shared application {run.application.name}'s" if run.application_id else ""
    return {"log_lines": lines, "log_host": run.host, "log_where": where}


def _now_context(request, pipeline: Pipeline, now) -> dict:
    """The "Now" section: the collector's figures, state growth, dead letters."""
    return {
        "p": pipeline,
        "figures": metrics.stored(pipeline, now),
        **_state(pipeline, now),
        "dead_letter_topic": dead_letters.dead_letter_topic(pipeline.spec),
        "dead_letter_dir": dead_letters.files_dead_letters_dir(pipeline),
        "can_operate": has_role(request.user, OPERATOR),
        "collect_seconds": settings.CONTROLPLANE_COLLECT_SECONDS,
        "now_refresh_seconds": NOW_REFRESH_SECONDS,
    }


def _checkpoint(pipeline: Pipeline) -> dict | None:
    """The checkpoint page, each batch's offsets as `topic/partition: offset` text."""
    found = metrics.checkpoint_page(pipeline)
    for batch in (found or {}).get("history", []):
        batch["offsets_text"] = _offsets_text(batch.get("offsets"))
    return found


@role_required(VIEWER)
def pipeline_now(request, name: str):
    """The page's "Now" section alone (polled every few seconds)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    return render(
        request, "pipelines/_pipeline_now.html", _now_context(request, pipeline, timezone.now())
    )


@role_required(VIEWER)
def pipeline_status(request, name: str):
    """The page's live status block alone (polled every few seconds)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    return render(
        request, "pipelines/_pipeline_status.html", _status_context(pipeline, timezone.now())
    )


def _status_context(pipeline: Pipeline, now) -> dict:
    """The live status block: health, the cause in words with its fix, what the control
    plane does next, the current run."""
    run = pipeline.runs.filter(state__in=RunState.active()).select_related("application").first()
    judged = assess_one(pipeline, now)
    restart = detail.restart_progress(pipeline, now)
    cause = judged.cause
    if cause is not None:
        cause = explain.Cause(cause.category, mask(cause.line, known_secrets()))
    return {
        "p": pipeline,
        "run": run,
        "restart": restart,
        "health": judged.health,
        "health_symbol": overview.HEALTH_SYMBOLS[judged.health.colour],
        "cause": cause,
        "failure_at": judged.failure_at,
        "failure_id": judged.failure_id,
        "next_step": detail.next_step(pipeline, restart, judged.health.colour),
        "spec_note": detail.spec_note(pipeline, run),
        "status_refresh_seconds": STATUS_REFRESH_SECONDS,
        "ui": driver_files.spark_ui(run) if run is not None else None,
    }


@require_POST
@role_required(OPERATOR)
def pipeline_control(request, name: str, action: str):
    """An on-call action from the page: confirmed by the form, with a reason, audited."""
    pipeline = get_object_or_404(Pipeline, name=name)
    if action not in detail.CONTROL_NAMES:
        raise Http404(f"no action {action!r}")
    reason = request.POST.get("reason", "").strip()[:500]
    if not detail.confirmed(request, pipeline.name, refusal="Not done"):
        return detail.back(request, name)
    gate = preflight.before(pipeline, action, forced=bool(request.POST.get("force")))
    if gate.refused:
        detail.say(
            request,
            messages.ERROR,
            f"{action} not done: the preflight found problems:"
            f" {gate.report.errors_in_words()}. Fix them, or tick “even though the preflight"
            " finds problems”.",
        )
        return detail.back(request, name)
    if gate.report is not None and not gate.report.ok:
        messages.warning(request, f"The preflight found problems: {gate.report.errors_in_words()}.")
    try:
        controls.act(pipeline, action, user=request.user, reason=reason, now=timezone.now())
    except controls.NotApplicable as exc:
        detail.say(request, messages.ERROR, f"{action} not done: {exc}")
        return detail.back(request, name)
    transaction.on_commit(lambda: tasks.nudge(pipeline.pk))
    messages.success(request, f"{action} of {pipeline.name} requested.")
    return redirect("pipeline", name=name)


AUDIT_PAGE = 100


@role_required(VIEWER)
def audit_log(request):
    """Every operator action, newest first; filter by pipeline, application and by who."""
    pipeline = request.GET.get("pipeline", "").strip()[:63]
    application = request.GET.get("application", "").strip()[:63]
    actor = request.GET.get("actor", "").strip()[:150]
    entries = AuditEntry.objects.order_by("-at")
    if pipeline:
        entries = entries.filter(pipeline_name=pipeline)
    if application:
        entries = entries.filter(application_name=application)
    if actor:
        entries = entries.filter(actor_name=actor)
    return render(
        request,
        "audit.html",
        {
            "entries": entries[:AUDIT_PAGE],
            "pipeline": pipeline,
            "application": application,
            "actor": actor,
            "limit": AUDIT_PAGE,
        },
    )


@role_required(VIEWER)
def pipeline_diff(request, name: str):
    """The difference between two versions of the spec (default: the last two)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    newest = pipeline.version
    try:
        new = int(request.GET.get("b", newest))
        old = int(request.GET.get("a", max(1, new - 1)))
    except ValueError:
        raise Http404("versions are whole numbers") from None
    rows = {v.version: v for v in pipeline.versions.filter(version__in=[old, new])}
    if old not in rows or new not in rows:
        raise Http404(f"pipeline {name!r} has no version {old if old not in rows else new}")
    lines = detail.spec_diff(rows[old].spec, rows[new].spec, f"v{old}", f"v{new}")
    return render(
        request,
        "pipelines/diff.html",
        {
            "p": pipeline,
            "old": old,
            "new": new,
            "lines": lines,
            "versions": pipeline.versions.order_by("-version").values_list("version", flat=True),
            "can_rollback": has_role(request.user, OPERATOR) and old != newest,
        },
    )


@require_POST
@role_required(OPERATOR)
def pipeline_rollback(request, name: str):
    """Roll back to an earlier version from the diff page (with a reason, audited); a
    pipeline with a driver is restarted so that the older spec runs."""
    pipeline = get_object_or_404(Pipeline, name=name)
    reason = request.POST.get("reason", "").strip()[:2000]
    try:
        version = int(request.POST.get("version", ""))
    except ValueError:
        messages.error(request, "Not rolled back: choose a version.")
        return redirect("pipeline", name=name)
    if not detail.confirmed(request, pipeline.name, refusal="Not rolled back"):
        return redirect(reverse("pipeline-diff", args=[name]) + f"?a={version}")
    try:
        pipeline = controls.rollback(
            pipeline, version, user=request.user, reason=reason, now=timezone.now()
        )
    except SpecError as exc:
        problems = "; ".join(f"{e.field}: {e.message}" for e in exc.errors)
        messages.error(
            request, f"Not rolled back: version {version} is not valid today: {problems}"
        )
        return redirect("pipeline", name=name)
    except (services.Invalid, services.Conflict) as exc:
        messages.error(request, f"Not rolled back: {exc}")
        return redirect("pipeline", name=name)
    transaction.on_commit(lambda: tasks.nudge(pipeline.pk))
    messages.success(
        request,
        f"{pipeline.name} rolled back to the spec of version {version} (now version"
        f" {pipeline.version}).",
    )
    return redirect("pipeline", name=name)


@require_POST
@role_required(OPERATOR)
def restore_point_take(request, name: str):
    """Take a restore point now (audited, with the reason)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    reason = request.POST.get("reason", "").strip()[:500]
    try:
        point = restore_points.take(pipeline, user=request.user, reason=reason, now=timezone.now())
    except restore_points.Refused as exc:
        detail.say(request, messages.ERROR, f"No restore point taken: {exc}.")
    else:
        detail.say(
            request,
            messages.SUCCESS,
            f"Restore point {point.pk} taken (batch {point.last_batch_id}).",
        )
    return detail.back(request, name, "restore-points")


@require_POST
@role_required(OPERATOR)
def restore_point_delete(request, name: str, point: int):
    """Delete a restore point (confirmed by name, with a reason, audited)."""
    row = RestorePoint.objects.filter(pk=point, pipeline_name=name).first()
    if row is None:
        messages.info(request, f"Restore point {point} is gone already.")
        return detail.back(request, name, "restore-points")
    if not detail.confirmed(request, name, refusal="Not deleted"):
        return detail.back(request, name, "restore-points")
    reason = request.POST.get("reason", "").strip()[:500] or "deleted on the pipeline page"
    restore_points.delete(row, user=request.user, reason=reason)
    messages.success(request, f"Restore point {point} deleted.")
    return detail.back(request, name, "restore-points")


@require_POST
@role_required(OPERATOR)
def pipeline_restore(request, name: str):
    """Restore a stopped pipeline to a restore point (confirmed by name, with a reason)."""
    pipeline = get_object_or_404(Pipeline, name=name)
    if not detail.confirmed(request, pipeline.name, refusal="Not restored"):
        return detail.back(request, name, "restore-points")
    try:
        point = int(request.POST.get("restore_point", ""))
        done = restore_points.restore(
            pipeline,
            point,
            user=request.user,
            reason=request.POST.get("reason", "").strip()[:500],
            now=timezone.now(),
        )
    except ValueError:
        detail.say(request, messages.ERROR, "Not restored: choose a restore point.")
    except (LookupError, restore_points.Refused) as exc:
        detail.say(request, messages.ERROR, f"Not restored: {exc.args[0]}.")
    else:
        kept = done["kept_restore_point"]
        messages.success(
            request,
            f"{pipeline.name} restored to batch {done['last_batch_id']}: its next start reads"
            " on from there"
            + (f" (the replaced checkpoint is kept as restore point {kept})." if kept else "."),
        )
    return detail.back(request, name, "restore-points")


def _masked(failures) -> list:
    """Failures with stored secret values masked out of their messages (for display), each
    with why its run ended in words (`summary`)."""
    out = list(failures)
    secrets = known_secrets()
    for failure in out:
        exit_code = failure.run.exit_code if failure.run_id else None
        said = explain.recorded(
            failure.cause, exit_code, failure.message, failure.reason, failure.category
        )
        failure.summary = mask(said.line, secrets)
        failure.fix = said.fix
        failure.message = mask(failure.message, secrets)
    return out


def healthz(request):
    """Liveness for load balancers and the dev stack, within about a second whatever the
    dependencies do: 503 naming the one that is down (database, broker), else 200 with the
    reconciler's last tick."""
    deps = health.check()
    database_ok = deps["database"] == "ok"
    age = None
    if database_ok:
        try:
            state = ReconcilerState.objects.filter(id=1).first()
        except DatabaseError:
            state, database_ok, deps["database"] = None, False, "unreachable"
        if state and state.last_tick_at:
            age = (timezone.now() - state.last_tick_at).total_seconds()
    stale_after = 3 * settings.CONTROLPLANE_RECONCILE_SECONDS + 10
    body = {
        **deps,
        "reconciler_last_tick_seconds_ago": None if age is None else round(age, 1),
        "reconciler": "ok" if age is not None and age <= stale_after else "stale",
    }
    healthy = all(v == "ok" for v in deps.values())
    return JsonResponse(body, status=200 if healthy else 503)
