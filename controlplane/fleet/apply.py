"""Plan and apply a fleet's files: every object they define created, updated or left
unchanged, and (with `prune`) the fleet's objects they no longer define deleted, all in one
transaction. A plan is an apply rolled back: it says exactly what the apply would do,
including what the database would refuse.

- All or nothing: one refused object refuses the set, and nothing is written.
- Idempotent: applying the same files again changes nothing (every object `unchanged`).
- One at a time: an apply holds a transaction-scoped advisory lock; another waits up to
  CONTROLPLANE_FLEET_LOCK_SECONDS, then is refused (Busy), never interleaved.
- Recorded: each object's fleet, source (repository, commit, path), who applied it and
  what it was left as (definitions.ManagedObject), so that a change made elsewhere shows as
  drift; a pipeline's new version keeps its source too.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import OperationalError, transaction
from django.db import connection as db

from controlplane.accounts.roles import has_role
from controlplane.definitions import preflight, services
from controlplane.definitions.models import ManagedObject, Pipeline
from controlplane.supervision import controls, tasks

from . import diff, documents, secrets
from .drift import drift
from .kinds import KINDS, ORDER, Context, Kind, Refused, digest, document, reason_for

# pg_advisory_xact_lock key ("cp-fleet" in ASCII): one apply at a time.
LOCK = 0x63702D666C656574
FLEET_NAME = documents.NAME_RE


class Busy(Exception):
    """Another apply held the lock for longer than CONTROLPLANE_FLEET_LOCK_SECONDS."""


@dataclass
class Request:
    fleet: str
    files: Mapping[str, str]
    environment: str | None = None
    dry_run: bool = True
    prune: bool = False
    restart: bool = True
    preflight: bool = True
    force: bool = False
    repository: str = ""
    commit: str = ""


@dataclass
class Entry:
    """One object's line in a plan."""

    kind: str
    name: str
    action: str  # create, update, unchanged, delete, left (not in the files, no prune), refused
    file: str = ""
    document: int = 0
    template: str = ""
    changes: list[dict] = field(default_factory=list)
    secrets_changed: list[str] = field(default_factory=list)
    adopted: bool = False  # existed, managed by no fleet: now this one's
    drifted: list[dict] = field(default_factory=list)  # changed since the last apply, how
    notes: dict[str, Any] = field(default_factory=dict)  # restart, restore_point, preflight
    errors: list[dict] = field(default_factory=list)  # {path, message}

    def as_dict(self) -> dict:
        out: dict[str, Any] = {"kind": self.kind, "name": self.name, "action": self.action}
        if self.file:
            out["file"] = self.file
            out["document"] = self.document
        if self.template:
            out["template"] = self.template
        for key in ("changes", "secrets_changed", "drifted", "errors"):
            if getattr(self, key):
                out[key] = getattr(self, key)
        if self.adopted:
            out["adopted"] = True
        out.update(self.notes)
        return out


@dataclass
class Result:
    fleet: str
    dry_run: bool
    entries: list[Entry] = field(default_factory=list)
    errors: list[dict] = field(default_factory=list)  # the files' own (documents.read)

    @property
    def refused(self) -> bool:
        return bool(self.errors) or any(e.action == "refused" for e in self.entries)

    @property
    def applied(self) -> bool:
        return not self.dry_run and not self.refused

    def as_dict(self) -> dict:
        counts = {a: 0 for a in ("create", "update", "unchanged", "delete", "left", "refused")}
        for entry in self.entries:
            counts[entry.action] += 1
        return {
            "fleet": self.fleet,
            "dry_run": self.dry_run,
            "applied": self.applied,
            "refused": self.refused,
            "summary": counts,
            "errors": self.errors,
            "objects": [e.as_dict() for e in self.entries],
        }


def store() -> secrets.Store:
    return secrets.Store(
        environ=os.environ,
        prefix=settings.CONTROLPLANE_FLEET_SECRET_PREFIX,
        directory=settings.CONTROLPLANE_FLEET_SECRETS_DIR or "",
    )


def run(request: Request, *, user, now: datetime) -> Result:
    """Plan (`dry_run`) or apply `request`'s files as fleet `request.fleet`. Raises Busy."""
    result = Result(request.fleet, request.dry_run)
    if not FLEET_NAME.fullmatch(request.fleet or ""):
        problem = documents.DocumentError(
            "", "", "fleet", "must be 1-63 lower-case letters, digits, -"
        )
        result.errors.append(problem.as_dict())
        return result
    try:
        objects = documents.read(request.files, environment=request.environment)
    except documents.DocumentsRefused as exc:
        result.errors = [e.as_dict() for e in exc.errors]
        return result
    source = {"fleet": request.fleet}
    if request.repository:
        source["repository"] = request.repository
    if request.commit:
        source["commit"] = request.commit
    with transaction.atomic():
        _lock()
        # Pipeline saves take the consumer-group lock before any files connection's row
        # lock (definitions.services): an apply, which may change files connections first,
        # takes it now, in the same order, so that the two never wait on each other.
        with db.cursor() as cursor:
            cursor.execute("SELECT pg_advisory_xact_lock(%s)", [services.CONSUMER_GROUP_LOCK])
        managed = {(m.kind, m.name): m for m in ManagedObject.objects.select_for_update()}
        ctx = Context(
            user=user,
            reason=reason_for(source),
            source=source,
            store=store(),
            now=now,
            connections=services.known_connections(),
            restart=request.restart,
            preflight=request.preflight,
            force=request.force,
        )
        wanted = {o.key for o in objects}
        for name in ORDER:
            kind = KINDS[name]
            instances = kind.instances()
            behind = kind.unsettled()
            for obj in (o for o in objects if o.kind == name):
                entry = _entry(obj)
                result.entries.append(entry)
                settled = obj.name not in behind
                _object(kind, obj, instances.get(obj.name), managed, entry, request, ctx, settled)
        for name in reversed(ORDER):
            kind = KINDS[name]
            gone = sorted(
                m.name
                for (k, _), m in managed.items()
                if k == name and m.fleet == request.fleet and f"{name}/{m.name}" not in wanted
            )
            for object_name in gone:
                entry = Entry(name, object_name, "left")
                result.entries.append(entry)
                if request.prune:
                    _delete(kind, managed[(name, object_name)], entry, user, ctx)
        if result.refused or request.dry_run:
            transaction.set_rollback(True)
    _follow_up(result, ctx, request, user=user, now=now)
    return result


def _follow_up(result: Result, ctx: Context, request: Request, *, user, now: datetime) -> None:
    """Once the transaction is over (its locks released): each new or changed pipeline's
    preflight (unless it names a connection this apply creates or changes: not before that
    is applied), and the restarts of running pipelines whose run runs an older version,
    unless their preflight finds errors, CONTROLPLANE_PREFLIGHT refuses and the apply is not
    forced (then they keep their run, and the plan says why)."""
    mode = settings.CONTROLPLANE_PREFLIGHT
    for item in ctx.follow_ups:
        notes = item.entry.notes
        report = None
        if request.preflight and mode != "off":
            if item.spec.connection_names() & ctx.changed_connections:
                notes["preflight"] = {"skipped": "it names a connection this apply changes"}
            else:
                report = preflight.run(item.spec)
                notes["preflight"] = report.as_dict()
        if not item.restart or result.refused:
            continue
        if report is not None and not report.ok and mode == "refuse" and not request.force:
            notes["restart"] = False
            notes["restart_refused"] = (
                "its preflight finds errors: it keeps its run; fix them and restart it, or"
                " apply with force"
            )
            continue
        if request.dry_run:
            continue
        pipeline = Pipeline.objects.filter(pk=item.pipeline_id).first()
        if pipeline is None:
            continue
        try:
            controls.act(pipeline, "restart", user=user, reason=ctx.reason, now=now)
        except controls.NotApplicable as exc:
            notes["restart"] = False
            notes["restart_refused"] = str(exc)
            continue
        transaction.on_commit(lambda pk=pipeline.pk: tasks.nudge(pk))


def _lock() -> None:
    with db.cursor() as cursor:
        cursor.execute("SELECT current_setting('lock_timeout')")
        (previous,) = cursor.fetchone()
        cursor.execute(
            "SELECT set_config('lock_timeout', %s, true)",
            [f"{int(settings.CONTROLPLANE_FLEET_LOCK_SECONDS * 1000)}ms"],
        )
        try:
            with transaction.atomic():
                cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK])
        except OperationalError as exc:
            if getattr(exc.__cause__, "sqlstate", None) == "55P03":  # lock_not_available
                raise Busy("another apply is in progress; try again once it has finished") from None
            raise
        cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])


def _entry(obj: documents.Object) -> Entry:
    return Entry(
        obj.kind,
        obj.name,
        "refused",
        file=obj.source.file,
        document=obj.source.document,
        template=obj.source.instance,
    )


def input_digest(obj: documents.Object, values: dict) -> str:
    """The object as the files give it, its secrets' values included."""
    doc = document(
        obj.kind,
        obj.name,
        obj.spec,
        labels=obj.labels,
        description=obj.description,
        deployment=obj.deployment,
    )
    return digest(doc, secrets.fingerprint(values))


def _refuse(entry: Entry, problems: dict[str, list[str]]) -> None:
    entry.action = "refused"
    for path, messages in problems.items():
        entry.errors.extend({"path": path, "message": m} for m in messages)


def _object(
    kind: Kind,
    obj: documents.Object,
    instance: Any,
    managed: dict,
    entry: Entry,
    request: Request,
    ctx: Context,
    settled: bool,
) -> None:
    row = managed.get((obj.kind, obj.name))
    if row is not None and row.fleet != request.fleet:
        _refuse(entry, {"name": [f"{obj.key} is managed by fleet {row.fleet!r}"]})
        return
    refs = kind.refs(obj)
    values, problems = {}, {}
    for path, ref in refs.items():
        try:
            values[f"spec.{path}"] = secrets.read(ref, ctx.store)
        except secrets.Unresolved as exc:
            problems[f"spec.{path}"] = [str(exc)]
    if problems:
        _refuse(entry, problems)
        return
    given = input_digest(obj, values)
    # An object no fleet managed yet is read with the files' references (where its secrets
    # are kept is the files' to say): adopting it changes nothing when their values agree.
    before = kind.state(instance, row.secret_refs if row else refs) if instance else None
    if row is not None and instance is not None:
        if digest(*before) != row.digest:
            entry.drifted = drift(row, before)
        elif row.input_digest == given and settled:
            entry.action = "unchanged"  # the same files, nobody changed it, nothing pending
            return
    elif row is not None:
        entry.drifted = drift(row, None)
    source = {
        **ctx.source,
        "path": obj.source.file,
        "document": obj.source.document,
        **({"template": obj.source.instance} if obj.source.instance else {}),
    }
    ctx = dataclasses.replace(ctx, source=source)  # its versions keep where it came from
    try:
        with transaction.atomic():
            wanted = kind.wanted(obj, instance, values, ctx)
            previous = copy.copy(instance)
            if before is not None and before == (wanted.document, wanted.secrets_print):
                entry.action = "unchanged"
                after = instance
            else:
                entry.action = "update" if instance is not None else "create"
                needed = kind.role_for(refs)
                if not has_role(ctx.user, needed):
                    what = documents.a_noun(obj.kind)
                    why = " whose secrets the control plane keeps" if refs else ""
                    verb = "changing" if instance is not None else "creating"
                    raise Refused({"kind": [f"{verb} {what}{why} needs the {needed} role"]})
                entry.changes = diff.document_changes(
                    before[0] if before else None, wanted.document
                )
                if before is not None and before[1] != wanted.secrets_print:
                    entry.secrets_changed = _secrets_changed(kind, instance, values)
                after = kind.write(obj, wanted, instance, ctx)
            follow = len(ctx.follow_ups)
            entry.notes = kind.after_write(previous, after, ctx)
            if entry.action != "unchanged":
                entry.notes.update(wanted.notes)
            for item in ctx.follow_ups[follow:]:
                item.entry = entry
            entry.adopted = instance is not None and row is None
            state = kind.state(after, refs)
            ManagedObject.objects.update_or_create(
                kind=obj.kind,
                name=obj.name,
                defaults={
                    "fleet": request.fleet,
                    "input_digest": given,
                    "digest": digest(*state),
                    "document": state[0],
                    "secret_refs": refs,
                    "source": source,
                    "applied_at": ctx.now,
                    "applied_by": ctx.user if getattr(ctx.user, "pk", None) else None,
                    "drifted_at": None,
                    "drift": [],
                },
            )
    except Refused as exc:
        _refuse(entry, exc.problems)


def _secrets_changed(kind: Kind, instance: Any, values: dict) -> list[str]:
    """Which secrets (dotted paths under spec) the files give other values than the object
    holds, or no longer give; never the values."""
    now = kind.secret_values(instance)
    wanted = {path.removeprefix("spec."): value for path, value in values.items()}
    changed = sorted(k for k in set(now) | set(wanted) if now.get(k, "") != wanted.get(k, ""))
    return changed or ["secrets"]


def _delete(kind: Kind, row: ManagedObject, entry: Entry, user, ctx: Context) -> None:
    entry.action = "delete"
    if not has_role(user, kind.role):
        _refuse(
            entry,
            {"kind": [f"deleting {documents.a_noun(kind.kind)} needs the {kind.role} role"]},
        )
        return
    instance = kind.model.objects.filter(name=row.name).first()
    try:
        with transaction.atomic():
            if instance is not None:
                entry.changes = diff.document_changes(
                    kind.state(instance, row.secret_refs)[0], None
                )
                kind.delete(instance, ctx)
            row.delete()
    except Refused as exc:
        _refuse(entry, exc.problems)
