"""Server-rendered pages (the full dashboard comes later) and the health endpoint."""

from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.db import connection
from django.http import JsonResponse
from django.shortcuts import render
from django.utils import timezone

from .models import Pipeline, ReconcilerState


@login_required
def home(request):
    state = ReconcilerState.objects.filter(id=1).first()
    return render(
        request,
        "pipelines/home.html",
        {"pipelines": Pipeline.objects.all(), "reconciler": state},
    )


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
