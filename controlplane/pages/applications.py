"""The shared Spark applications' pages: the list, one application (its members, definition,
last error and the operators' controls). Defining them is for admins (API, Django admin)."""

from __future__ import annotations

from pathlib import Path

from django.conf import settings
from django.contrib import messages
from django.http import Http404
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import ADMIN, OPERATOR, VIEWER, has_role
from controlplane.api import applications as controls
from controlplane.connections.masking import known_secrets, mask
from controlplane.definitions.models import (
    ApplicationStatus,
    AuditEntry,
    Pipeline,
    Run,
    RunState,
    SparkApplication,
)
from controlplane.supervision import driver_files, hosts

from . import detail

CONTROLS = [
    # action, label, what it does (shown in the confirmation)
    (
        "start",
        "Start",
        "Start its process with its current definition; it then takes the pipelines placed in it.",
    ),
    (
        "stop",
        "Stop",
        "Ask its process to exit. Refused while it runs pipelines' queries or pipelines"
        " wanted running name it: stop or move those first.",
    ),
    (
        "recycle",
        "Recycle",
        "Stop its members' queries gracefully, kill its process and start it again (with its"
        " current definition); the members start again in it.",
    ),
]
CONTROL_NAMES = {c[0] for c in CONTROLS}
DANGEROUS = {"stop", "recycle"}
STATUS_SYMBOLS = {
    ApplicationStatus.RUNNING: "●",
    ApplicationStatus.STARTING: "◔",
    ApplicationStatus.RECYCLING: "↻",
    ApplicationStatus.RESTARTING: "↻",
    ApplicationStatus.STOPPING: "◌",
    ApplicationStatus.STOPPED: "■",
}
MIB = 1024 * 1024


def _shown(app: SparkApplication) -> SparkApplication:
    """What the pages show beyond the model: members, memory in MiB, the status symbol."""
    app.members = controls.member_runs(app)
    app.members_now = controls.member_count(app)
    app.rss_mib = None if app.rss_bytes is None else app.rss_bytes / MIB
    app.symbol = STATUS_SYMBOLS.get(app.status, "?")
    app.effective_master = app.master or settings.SPARK_APPLICATION_MASTER
    # The standalone master's UI, which lists the application, its executors and workers.
    app.master_ui_url = (
        settings.SPARK_MASTER_UI_URL if app.effective_master.startswith("spark://") else ""
    )
    return app


def _dedicated() -> list[Run]:
    """The pipelines running in a Spark application of their own (dedicated drivers), with
    where each Spark UI listens."""
    runs = list(
        Run.objects.filter(state__in=RunState.active(), application__isnull=True)
        .select_related("pipeline")
        .order_by("pipeline__name")
    )
    for run in runs:
        run.ui = driver_files.spark_ui(run)
    return runs


@role_required(VIEWER)
def application_list(request):
    """Every shared application: status, load, size, restarts, last exit, host; and the
    control-plane hosts their processes (and dedicated drivers) run on."""
    apps = [_shown(app) for app in controls.annotated(SparkApplication.objects.order_by("name"))]
    return render(
        request,
        "applications/list.html",
        {
            "apps": apps,
            "can_admin": has_role(request.user, ADMIN),
            "hosts": hosts.overview(timezone.now()),
            "dedicated": _dedicated(),
            "host_timeout": settings.CONTROLPLANE_HOST_TIMEOUT,
        },
    )


@role_required(VIEWER)
def application_page(request, name: str):
    """One application: its state, members, definition, last error, controls and audit."""
    app = get_object_or_404(controls.annotated(SparkApplication.objects.all()), name=name)
    _shown(app)
    return render(
        request,
        "applications/application.html",
        {
            "app": app,
            "last_error": mask(app.last_error, known_secrets()),
            "named_by": Pipeline.objects.filter(placement=app.name).order_by("name"),
            "conf": sorted(app.conf.items()),
            "audit": AuditEntry.objects.filter(application_name=app.name).order_by("-at")[:20],
            "controls": CONTROLS,
            "dangerous": DANGEROUS,
            "can_operate": has_role(request.user, OPERATOR),
            "can_admin": has_role(request.user, ADMIN),
            "ui": driver_files.application_ui(app),
            "log_lines": (
                driver_files.log_tail(str(Path(app.app_dir) / "driver.log"), app.host)
                if app.app_dir and has_role(request.user, OPERATOR)
                else None
            ),
            "log_host": app.host,
        },
    )


@require_POST
@role_required(OPERATOR)
def application_control(request, name: str, action: str):
    """An operator's control from the page: confirmed by typing the name, with a reason,
    audited; a refusal is shown with its reason."""
    app = get_object_or_404(SparkApplication, name=name)
    if action not in CONTROL_NAMES:
        raise Http404(f"no action {action!r}")
    reason = request.POST.get("reason", "").strip()[:500]
    if not detail.confirmed(request, app.name, refusal="Not done", kind="application"):
        return redirect("application", name=name)
    try:
        controls.act(app, action, user=request.user, reason=reason, now=timezone.now())
    except controls.NotApplicable as exc:
        messages.error(request, f"{action} not done: {exc}")
        return redirect("application", name=name)
    messages.success(request, f"{action} of {app.name} requested.")
    return redirect("application", name=name)
