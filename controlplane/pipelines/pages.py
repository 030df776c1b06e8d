"""Server-rendered pages (roles as in the API) and the health endpoint."""

from __future__ import annotations

from django.conf import settings
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render
from django.utils import timezone

from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import VIEWER

from . import overview
from .models import ReconcilerState


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
    query = request.GET.get("q", "")[:100]
    now = timezone.now()
    found = overview.rows(now, query=query, show=show)
    return {
        "rows": found,
        "show": show,
        "q": query,
        "filters": list(overview.FILTERS),
        "now": now,
        "problems": sum(1 for r in found if r.severity < overview.HEALTHY),
        "reconciler": ReconcilerState.objects.filter(id=1).first(),
        "refresh_seconds": OVERVIEW_REFRESH_SECONDS,
    }


OVERVIEW_REFRESH_SECONDS = 5


def healthz(request):
    """Liveness for load balancers and the dev stack: the database answers, the tick is recent."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        database_ok = True
    except Exception:
        database_ok = False
    state = ReconcilerState.objects.filter(id=1).first() if database_ok else None
    age = (
        (timezone.now() - state.last_tick_at).total_seconds()
        if state and state.last_tick_at
        else None
    )
    stale_after = 3 * settings.CONTROLPLANE_RECONCILE_SECONDS + 10
    body = {
        "database": "ok" if database_ok else "unreachable",
        "reconciler_last_tick_seconds_ago": None if age is None else round(age, 1),
        "reconciler": "ok" if age is not None and age <= stale_after else "stale",
    }
    return JsonResponse(body, status=200 if database_ok else 503)
