"""Template filters for every page (a builtin library: no {% load %}): durations in human
units ("7 days", "2 h 5 min", "12 s"), ages ("3 min ago") that the page's clock keeps
ticking, and one timestamp style ("2026-11-27 23:44:10 UTC") in a <time> element."""

from __future__ import annotations

from datetime import UTC, datetime

from django import template
from django.utils import timezone
from django.utils.html import format_html

register = template.Library()

_UNITS = ((86400, "day", "days"), (3600, "h", "h"), (60, "min", "min"), (1, "s", "s"))


def human(seconds: float | None) -> str:
    """A duration in at most two units: 7 days, 1 day 3 h, 2 h 5 min, 4 min 10 s, 12 s,
    0.4 s."""
    if seconds is None:
        return "—"
    seconds = float(seconds)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 10:
        return f"{sign}{seconds:.1f} s".replace(".0 s", " s")
    parts = []
    left = round(seconds)
    for size, one, many in _UNITS:
        if left >= size and len(parts) < 2:
            count, left = divmod(left, size)
            parts.append(f"{count} {one if count == 1 else many}")
        elif parts:
            break  # the next unit down only: "1 day 3 h", never "1 day 12 s"
    return sign + " ".join(parts)


@register.filter
def seconds(value) -> str:
    """Seconds in human units."""
    try:
        return human(None if value in (None, "") else float(value))
    except (TypeError, ValueError):
        return str(value)


@register.filter
def ms(value) -> str:
    """Milliseconds in human units."""
    try:
        return human(None if value in (None, "") else float(value) / 1000)
    except (TypeError, ValueError):
        return str(value)


def _moment(value) -> datetime | None:
    if isinstance(value, str):
        from django.utils.dateparse import parse_datetime

        value = parse_datetime(value)
    if not isinstance(value, datetime):
        return None
    if timezone.is_naive(value):
        value = value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


@register.filter
def ago(value) -> str:
    """How long ago, in human units, in an element the page's clock updates every second
    (static/js/ages.js)."""
    moment = _moment(value)
    if moment is None:
        return "—"
    age = (timezone.now() - moment).total_seconds()
    return format_html(
        '<time datetime="{}" data-ago title="{}">{} ago</time>',
        moment.isoformat(),
        _text(moment),
        human(max(0.0, age)),
    )


@register.filter
def when(value) -> str:
    """A moment in the one style of every page: 2026-11-27 23:44:10 UTC."""
    moment = _moment(value)
    if moment is None:
        return "—"
    return format_html('<time datetime="{}">{}</time>', moment.isoformat(), _text(moment))


def _text(moment: datetime) -> str:
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")
