"""Drift: a managed object changed outside its fleet's files (a form, the API, the admin),
or deleted, since the last apply. Seen live (the API's /api/fleet/, the pipeline page, the
next plan) and marked by a periodic check (`check`: when it was first seen, for the
Prometheus gauge and the `fleet-drift` alert rule)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime

from django.db import transaction

from controlplane.definitions.models import ManagedObject

from . import diff
from .kinds import KINDS, digest


def drift(row: ManagedObject, state: tuple[dict, str] | None) -> list[dict]:
    """How an object differs from what the last apply left it as (`state`: its document and
    secrets' fingerprint now; None: it was deleted): [{path, before, after}], a secret's
    change as {path: "secrets", message}; [] when it has not drifted."""
    if state is None:
        return [{"path": "", "message": "deleted since it was last applied"}]
    if digest(*state) == row.digest:
        return []
    found = diff.document_changes(row.document, state[0])
    if digest(row.document, state[1]) != row.digest:
        found.append({"path": "secrets", "message": "changed since it was last applied"})
    return found


def in_words(change: dict) -> str:
    """One change (diff.changes' or drift's) as a line: `path: before -> after`."""
    if "message" in change:
        return f"{change['path'] or '(the object)'}: {change['message']}"

    def shown(key: str) -> str:
        return json.dumps(change[key], sort_keys=True) if key in change else "(none)"

    return f"{change['path']}: {shown('before')} -> {shown('after')}"


@dataclass
class Seen:
    row: ManagedObject
    changes: list[dict]


def survey(rows: list[ManagedObject] | None = None) -> list[Seen]:
    """Each managed object (or those of `rows`) with its drift now."""
    rows = list(ManagedObject.objects.all()) if rows is None else rows
    out = []
    for name, kind in KINDS.items():
        mine = [r for r in rows if r.kind == name]
        if not mine:
            continue
        instances = kind.instances([r.name for r in mine] if len(mine) < 500 else None)
        for row in mine:
            instance = instances.get(row.name)
            state = kind.state(instance, row.secret_refs) if instance is not None else None
            out.append(Seen(row, drift(row, state)))
    return out


def check(now: datetime) -> dict:
    """Mark what drifted (`drifted_at`: first seen) and clear what no longer has."""
    marked = cleared = 0
    for seen in survey():
        row = seen.row
        with transaction.atomic():
            if seen.changes and (row.drifted_at is None or row.drift != seen.changes):
                ManagedObject.objects.filter(pk=row.pk, digest=row.digest).update(
                    drifted_at=row.drifted_at or now, drift=seen.changes
                )
                marked += 1
            elif not seen.changes and row.drifted_at is not None:
                ManagedObject.objects.filter(pk=row.pk, digest=row.digest).update(
                    drifted_at=None, drift=[]
                )
                cleared += 1
    return {"drifted": marked, "cleared": cleared}
