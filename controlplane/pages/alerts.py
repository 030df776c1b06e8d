"""The dashboard's alerts: what is firing (acknowledge it), the rules (silence one for a
while), the channels (their URLs masked) and the latest delivery attempts. Rules and channels
are defined through the API."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import OPERATOR, VIEWER, has_role
from controlplane.alerting import actions
from controlplane.alerting.models import (
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertRule,
    AlertState,
)

SILENCES = [(60, "1 hour"), (240, "4 hours"), (1440, "1 day")]


@role_required(VIEWER)
def alert_list(request):
    now = timezone.now()
    return render(
        request,
        "alerts/list.html",
        {
            "open": Alert.objects.filter(state__in=AlertState.open())
            .select_related("rule", "acknowledged_by")
            .order_by("-since"),
            "recent": Alert.objects.exclude(state__in=AlertState.open())
            .select_related("rule")
            .order_by("-since")[:20],
            "rules": AlertRule.objects.select_related("pipeline").prefetch_related("channels"),
            # `target` is stored masked: nothing here can show a URL's secret parts.
            "channels": AlertChannel.objects.all(),
            "deliveries": AlertDelivery.objects.select_related("alert__rule", "channel")[:30],
            "now": now,
            "silences": SILENCES,
            "can_operate": has_role(request.user, OPERATOR),
        },
    )


@require_POST
@role_required(OPERATOR)
def alert_acknowledge(request, alert_id: int):
    get_object_or_404(Alert, pk=alert_id)
    reason = request.POST.get("reason", "").strip()[:2000]
    try:
        alert = actions.acknowledge(alert_id, user=request.user, reason=reason, now=timezone.now())
    except actions.NotFiring as exc:
        messages.error(request, f"Not acknowledged: {exc}")
        return redirect("alerts")
    messages.success(request, f"Alert {alert.rule.name} on {alert.subject} acknowledged.")
    return redirect("alerts")


@require_POST
@role_required(OPERATOR)
def rule_silence(request, name: str):
    rule = get_object_or_404(AlertRule, name=name)
    reason = request.POST.get("reason", "").strip()[:2000]
    try:
        minutes = int(request.POST.get("minutes", ""))
    except ValueError:
        minutes = 0
    if minutes <= 0:
        actions.silence(rule.pk, None, user=request.user, reason=reason)
        messages.success(request, f"Rule {rule.name} is no longer silenced.")
    else:
        until = timezone.now() + timedelta(minutes=min(minutes, 60 * 24 * 30))
        actions.silence(rule.pk, until, user=request.user, reason=reason)
        messages.success(request, f"Rule {rule.name} silenced for {minutes} minutes.")
    return redirect("alerts")
