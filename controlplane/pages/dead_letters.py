"""A pipeline's dead letters (records that did not parse), read from its sink database:
filters (error, time received, partition, batch), raw values shown as text where they are
UTF-8 and in hex where not (escaped, cut at 2 KB), a download of everything the filters
match, and redrive to the source topic or another topic. Operators: they see raw values."""

from __future__ import annotations

from urllib.parse import urlencode

from django.conf import settings
from django.contrib import messages
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_POST

from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import OPERATOR
from controlplane.definitions.models import Pipeline
from controlplane.observability import dead_letters

from . import detail

PAGE = 50
SHOWN = 2048  # bytes of a raw value shown on the page (the download has all)
FILTERS = ("error", "since", "until", "topic", "partition", "batch")


def _shown(raw: bytes | None) -> dict:
    if raw is None:
        return {"text": None, "hex": None, "size": 0, "cut": False}
    part = raw[:SHOWN]
    as_text = dead_letters.text(part)
    if as_text is None and len(raw) > SHOWN:
        # A multi-byte character cut at the edge is still text.
        as_text = part.decode("utf-8", errors="ignore") if dead_letters.text(raw) else None
    return {
        "text": as_text,
        "hex": None if as_text is not None else part.hex(" "),
        "size": len(raw),
        "cut": len(raw) > SHOWN,
    }


@role_required(OPERATOR)
def dead_letter_list(request, name: str):
    pipeline = get_object_or_404(Pipeline, name=name)
    given = {k: request.GET.get(k, "").strip() for k in FILTERS if request.GET.get(k, "").strip()}
    try:
        page_number = max(int(request.GET.get("page", "1")), 1)
    except ValueError:
        page_number = 1
    context = {
        "p": pipeline,
        "given": given,
        "query": urlencode(given),
        "letters": [],
        "total": 0,
        "errors": [],
        "batches": [],
        "problem": "",
        "page": page_number,
        "retention_days": settings.CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS,
    }
    try:
        filters = dead_letters.parse_filters(given)
    except dead_letters.BadFilter as exc:
        context["problem"] = f"{exc.field}: {exc}"
        filters = None
    try:
        context["errors"] = dead_letters.errors(pipeline)
        context["batches"] = dead_letters.batches(pipeline, limit=20)
        if filters is not None:
            letters, total = dead_letters.page(
                pipeline, filters, limit=PAGE, offset=(page_number - 1) * PAGE
            )
            context["letters"] = [{**letter, "shown": _shown(letter["raw"])} for letter in letters]
            context["total"] = total
            context["has_next"] = page_number * PAGE < total
    except dead_letters.Unavailable as exc:
        context["problem"] = str(exc)
    return render(request, "pipelines/dead_letters.html", context)


@require_POST
@role_required(OPERATOR)
def dead_letter_redrive(request, name: str):
    pipeline = get_object_or_404(Pipeline, name=name)
    given = {k: request.POST.get(k, "").strip() for k in FILTERS if request.POST.get(k, "")}
    back = reverse("pipeline-dead-letters", args=[name]) + (f"?{urlencode(given)}" if given else "")
    if not detail.confirmed(request, pipeline.name, refusal="Not redriven"):
        return redirect(back)
    to = "source" if request.POST.get("target") != "topic" else request.POST.get("topic_to", "")
    try:
        outcome = dead_letters.redrive(
            pipeline,
            dead_letters.parse_filters(given),
            to=to.strip(),
            user=request.user,
            reason=request.POST.get("reason", "").strip()[:500],
            now=timezone.now(),
        )
    except dead_letters.BadFilter as exc:
        messages.error(request, f"Not redriven: {exc.field}: {exc}.")
        return redirect(back)
    except (dead_letters.Unavailable, dead_letters.Busy) as exc:
        messages.error(request, f"Not redriven: {exc}.")
        return redirect(back)
    where = "their source topics" if outcome["to"] == "source" else f"topic {outcome['to']}"
    text = f"{outcome['redriven']} dead letters written again to {where}"
    if outcome["failed"]:
        text += f"; {outcome['failed']} not acknowledged by Kafka (kept)"
    if outcome["remaining"]:
        text += f"; {outcome['remaining']} more match (redrive again)"
    if outcome["error"]:
        text += f"; {outcome['error']}"
    messages.success(request, text + ".")
    return redirect(back)
