"""Creating and changing pipeline definitions.

Every write is a conditional update on the version the caller read, so two operators (or an
operator and a script) editing one pipeline at once cannot silently overwrite each other: the
second gets a conflict and re-reads.
"""

from __future__ import annotations

import re
from typing import Any

from django.db import IntegrityError, transaction
from django.db import connection as db
from django.db.models import F
from django.dispatch import Signal
from django.utils import timezone

from controlplane import bounded_json
from controlplane.connections import directories
from controlplane.connections.models import Connection, ConnectionKind
from jobs.spec import FieldError, PipelineSpec, SpecError, parse_spec

from . import audit, schemas
from .models import (
    AUTO,
    DEDICATED,
    DesiredState,
    Pipeline,
    PipelineConnection,
    PipelineVersion,
    RunState,
    SparkApplication,
    Status,
)


class Conflict(Exception):
    """The pipeline changed since the caller read it (or another write won a race)."""


class Invalid(ValueError):
    """A value refused for a field that is not part of the spec: `detail` is a message, a
    list of them, or (for an object) messages keyed by its keys."""

    def __init__(self, field: str, detail: str | list | dict):
        super().__init__(f"{field}: {detail}")
        self.field = field
        self.detail = detail

    def as_dict(self) -> dict:
        detail = [self.detail] if isinstance(self.detail, str) else self.detail
        return {self.field: detail}


LABEL_KEY = re.compile(r"^[a-z0-9][a-z0-9_.-]{0,62}$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9_.-]{0,63}$")
MAX_LABELS = 20
# Names the API's routes take for themselves (POST /api/pipelines/bulk/).
RESERVED_NAMES = {"bulk"}

# Sent once a pipeline's deletion has committed, with `name`, `spec_version` (of its last
# run), `keep_restore_point` and `user`: supervision keeps its checkpoint as its last restore
# point (controlplane.supervision.restore_points), or removes it.
pipeline_deleted = Signal()


def labels_problem(labels: Any) -> str | dict | None:
    """Why these labels are refused (a message, or messages by key), or None."""
    if not isinstance(labels, dict):
        return 'must be an object of names to values, e.g. {"team": "payments"}'
    if len(labels) > MAX_LABELS:
        return f"at most {MAX_LABELS} labels"
    problems = {}
    for key, value in labels.items():
        if not LABEL_KEY.match(key):
            problems[key] = (
                "a label's name is 1-63 lower-case letters, digits, '_', '.' or '-',"
                " starting with a letter or digit"
            )
        elif not isinstance(value, str) or not LABEL_VALUE.match(value):
            problems[key] = "a label's value is a string of up to 63 letters, digits, '_', '.', '-'"
    return problems or None


def parse_selector(selector: str) -> tuple[str, str]:
    """`name:value` (or `name=value`) as (name, value); raises Invalid("label", ...)."""
    for separator in (":", "="):
        if separator in selector:
            key, value = selector.split(separator, 1)
            if LABEL_KEY.match(key) and LABEL_VALUE.match(value):
                return key, value
            break
    raise Invalid("label", f"{selector!r} is not name:value (e.g. team:payments)")


def placement_problem(placement: str) -> str | None:
    """Why a pipeline cannot be placed so, or None: `dedicated` (its own Spark application),
    `auto` (any shared application with room) or the name of a shared application."""
    if placement in (DEDICATED, AUTO):
        return None
    if not SparkApplication.objects.filter(name=placement).exists():
        return (
            f"must be {DEDICATED!r}, {AUTO!r} or the name of a shared Spark application;"
            f" there is no application named {placement!r}"
        )
    return None


def _check_placement(placement: str) -> None:
    """In the transaction that stores it: the named application is locked, so that it
    cannot be deleted before this commits (its deletion sees the pipeline naming it). A
    pipeline's lock, where held, is taken before (applications' locks always come last)."""
    if placement in (DEDICATED, AUTO):
        return
    if not SparkApplication.objects.select_for_update().filter(name=placement).exists():
        raise Invalid("placement", placement_problem(placement) or "no such application")


def known_connections() -> dict[str, str]:
    return dict(Connection.objects.values_list("name", "kind"))


def validate(spec_data: Any) -> PipelineSpec:
    """The typed spec, checked against the connections that exist now; raises SpecError.
    First what any face may hand over (the API's parser checks its bodies, a form's inputs
    are plain strings): values PostgreSQL cannot store (U+0000, lone surrogates) and numbers
    or depths beyond bounds are refused at their field, never a database error."""
    try:
        bounded_json.check(spec_data)
    except bounded_json.Refused as exc:
        raise SpecError(
            [FieldError(path, " ".join(messages)) for path, messages in exc.errors.items()]
        ) from None
    return parse_spec(spec_data, connections=known_connections())


def _check_text(field: str, value: str | None) -> None:
    """A free-text field (description) PostgreSQL can store: raises Invalid at `field`."""
    try:
        bounded_json.check({field: value})
    except bounded_json.Refused as exc:
        raise Invalid(field, " ".join(m for ms in exc.errors.values() for m in ms)) from None


def _link_connections(pipeline: Pipeline, spec: PipelineSpec) -> None:
    names = spec.connection_names()
    connections = list(Connection.objects.select_for_update().filter(name__in=names))
    if len(connections) != len(names):
        # Deleted between validation and now: report it like any other bad reference.
        missing = names - {c.name for c in connections}
        raise SpecError([_missing_connection_error(spec, name) for name in sorted(missing)])
    PipelineConnection.objects.filter(pipeline=pipeline).exclude(
        connection__in=connections
    ).delete()
    for connection in connections:
        PipelineConnection.objects.get_or_create(pipeline=pipeline, connection=connection)


def _check_files_paths(pipeline: Pipeline, spec: PipelineSpec) -> None:
    """No two pipelines (nor two sinks of one) write files to the same directory or to one
    inside the other, and none into the control plane's own directories, judged by where
    their connections' roots and their paths lead as canonical locations (two spellings of
    one root, two connections with one root, symbolic links): readers of one would see the
    other's files, and the sinks' bookkeeping (_cp_staging, _cp_manifest, _cp_dead_letters)
    would mix. Raises SpecError on each files sink's path. In the saving transaction, before
    the pipeline's connections are locked: every files connection is locked first (in name
    order), so that two pipelines saved at once are checked one after the other."""
    others = (
        Pipeline.objects.filter(connections__kind=ConnectionKind.FILES)
        .exclude(pk=pipeline.pk)
        .distinct()
        .order_by("name")
    )
    directories.check_pipeline(pipeline.name, spec.to_dict(), others)


# pg_advisory_xact_lock key ("cp-group" in ASCII): pipelines that name a consumer group are
# saved one after the other, so that two saved at once cannot both take the same group.
CONSUMER_GROUP_LOCK = 0x63702D67726F7570


def _check_consumer_group(pipeline: Pipeline, spec: PipelineSpec) -> None:
    """No two pipelines mirror their offsets into one consumer group
    (`source.consumer_group`): each would overwrite the other's committed offsets, and lag
    tools would show one pipeline's progress as the other's. Group ids are compared across
    every connection (two connections may reach one cluster). Raises SpecError on
    `source.consumer_group`. In the saving transaction, before any connection is locked:
    the lock is held until it commits."""
    group = spec.source.consumer_group
    if group is None:
        return
    with db.cursor() as cursor:
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [CONSUMER_GROUP_LOCK])
    other = (
        Pipeline.objects.filter(spec__source__consumer_group=group)
        .exclude(pk=pipeline.pk)
        .order_by("name")
        .values_list("name", flat=True)
        .first()
    )
    if other is not None:
        raise SpecError(
            [
                FieldError(
                    "source.consumer_group",
                    f"{group!r} is the consumer group of pipeline {other!r} already: each"
                    " pipeline mirrors its offsets into a group of its own",
                )
            ]
        )


def _missing_connection_error(spec: PipelineSpec, name: str) -> FieldError:
    where = "source.connection"
    if spec.source.connection != name:
        index = next(i for i, s in enumerate(spec.all_sinks()) if s.connection == name)
        where = f"sinks[{index}].connection" if spec.sinks else "sink.connection"
    return FieldError(where, f"no connection named {name!r}")


def create_pipeline(
    *,
    name: str,
    spec_data: Any,
    user=None,
    description: str = "",
    desired_state: str = "stopped",
    placement: str = DEDICATED,
    labels: dict | None = None,
    restore_point_minutes: int | None = None,
    auto_rollback_minutes: int | None = None,
    version_source: dict | None = None,
    resolve_schemas: bool = True,
) -> Pipeline:
    """Raises SpecError (the spec), Invalid (the placement, the labels) or Conflict (the
    name). `version_source`: where the spec came from (a fleet's files), kept on its
    version; `resolve_schemas` False: its schema-registry parts resolved already."""
    if name in RESERVED_NAMES:
        raise Invalid("name", f"{name!r} is reserved (the API's /api/pipelines/{name}/)")
    spec = validate(schemas.resolve(spec_data) if resolve_schemas else spec_data)
    canonical = spec.to_dict()
    _check_text("description", description)
    if problem := placement_problem(placement):
        raise Invalid("placement", problem)
    if problem := labels_problem(labels or {}):
        raise Invalid("labels", problem)
    try:
        with transaction.atomic():
            pipeline = Pipeline.objects.create(
                name=name,
                description=description,
                spec=canonical,
                version=1,
                desired_state=desired_state,
                placement=placement,
                labels=labels or {},
                restore_point_minutes=restore_point_minutes,
                auto_rollback_minutes=auto_rollback_minutes,
                created_by=user,
                updated_by=user,
            )
            PipelineVersion.objects.create(
                pipeline=pipeline,
                version=1,
                spec=canonical,
                created_by=user,
                source=version_source or {},
            )
            _check_consumer_group(pipeline, spec)
            _check_files_paths(pipeline, spec)
            _link_connections(pipeline, spec)
            _check_placement(placement)
            audit.record_with(
                pipeline,
                "create",
                user=user,
                reason="",
                before={},
                after=audit.definition_snapshot(pipeline),
            )
    except IntegrityError:
        raise Conflict(f"a pipeline named {name!r} already exists") from None
    return pipeline


UNCHANGED = object()  # an argument not given (where None means something)


def update_pipeline(
    pipeline: Pipeline,
    *,
    user=None,
    spec_data: Any = None,
    description: str | None = None,
    desired_state: str | None = None,
    expected_version: int | None = None,
    placement: str | None = None,
    labels: dict | None = None,
    restore_point_minutes: Any = UNCHANGED,
    auto_rollback_minutes: Any = UNCHANGED,
    action: str = "update",
    reason: str = "",
    resolve_schemas: bool = True,
    version_source: dict | None = None,
) -> Pipeline:
    """Apply the given changes; a changed spec becomes a new version, an identical one does not.

    `expected_version` defaults to the version of the `pipeline` object passed in, i.e. the
    one the caller read. A changed placement takes effect at the pipeline's next run. The
    audit entry says `action` (and `reason`). `resolve_schemas` False: a stored spec taken as
    it was saved, its schema-registry parts not asked of the registry again (a rollback).
    `version_source`: where a new spec came from (a fleet's files), kept on its version.
    """
    expected = pipeline.version if expected_version is None else expected_version
    spec = None
    if spec_data is not None:
        spec = validate(schemas.resolve(spec_data) if resolve_schemas else spec_data)
    _check_text("description", description)
    if placement is not None and (problem := placement_problem(placement)):
        raise Invalid("placement", problem)
    if labels is not None and (problem := labels_problem(labels)):
        raise Invalid("labels", problem)
    with transaction.atomic():
        current = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        before = audit.definition_snapshot(current)
        if current.version != expected:
            raise Conflict(
                f"pipeline {pipeline.name!r} is at version {current.version}, not {expected}; "
                "re-read it and apply your change again"
            )
        changes: dict[str, Any] = {"updated_by": user, "updated_at": timezone.now()}
        if description is not None:
            changes["description"] = description
        if desired_state is not None:
            changes["desired_state"] = desired_state
        if placement is not None and placement != current.placement:
            _check_placement(placement)
            changes["placement"] = placement
        if labels is not None and labels != current.labels:
            changes["labels"] = labels
        if restore_point_minutes is not UNCHANGED:
            changes["restore_point_minutes"] = restore_point_minutes
        if auto_rollback_minutes is not UNCHANGED:
            changes["auto_rollback_minutes"] = auto_rollback_minutes
        new_version = current.version
        if spec is not None and spec.to_dict() != current.spec:
            new_version = current.version + 1
            changes["spec"] = spec.to_dict()
            changes["version"] = F("version") + 1
            PipelineVersion.objects.create(
                pipeline=current,
                version=new_version,
                spec=changes["spec"],
                created_by=user,
                source=version_source or {},
            )
            _check_consumer_group(current, spec)
            _check_files_paths(current, spec)
            _link_connections(current, spec)
        # Conditional on the version read above: exactly one row, or somebody else won.
        updated = Pipeline.objects.filter(pk=current.pk, version=current.version).update(**changes)
        if updated != 1:
            raise Conflict(f"pipeline {pipeline.name!r} changed while it was being updated")
        current.refresh_from_db()
        after = audit.definition_snapshot(current)
        if after != before:
            audit.record_with(current, action, user=user, reason=reason, before=before, after=after)
    pipeline.refresh_from_db()
    return pipeline


def rollback_pipeline(pipeline: Pipeline, *, to_version: int, user=None, reason: str = "") -> bool:
    """Make an earlier version's spec the current one: a new version equal to it (checked
    again against today's connections, its schema-registry parts as they were saved; raises
    SpecError, Invalid for a version that is not kept, or Conflict), audited as a rollback
    with `reason`. False if the current spec is that one already (nothing changes)."""
    row = pipeline.versions.filter(version=to_version).first()
    if row is None:
        kept = list(pipeline.versions.order_by("version").values_list("version", flat=True))
        raise Invalid(
            "version",
            f"pipeline {pipeline.name!r} has no version {to_version} "
            f"(kept: {', '.join(map(str, kept)) or 'none'})",
        )
    if row.spec == pipeline.spec:
        return False
    update_pipeline(
        pipeline,
        user=user,
        spec_data=row.spec,
        action="rollback",
        reason=f"to version {to_version}" + (f": {reason}" if reason else ""),
        # As it ran: its reader schema as resolved then (not the subject's latest now), and
        # no registry needed (an automatic rollback must not wait on one).
        resolve_schemas=False,
    )
    return True


def delete_pipeline(
    pipeline: Pipeline, *, user=None, reason: str = "", keep_restore_point: bool = True
) -> bool:
    """Delete a pipeline that has no driver, with its history; audited (the entry keeps its
    name). Under the pipeline's row lock, so no run starts meanwhile (the reconciler skips
    a locked pipeline); refused with Conflict, naming the state, while it is wanted running,
    is not at rest, or has a run that is not over. False if it was gone already. Once it
    has committed, `pipeline_deleted` is sent (its checkpoint: the last restore point
    kept, unless `keep_restore_point` is False)."""
    with transaction.atomic():
        current = Pipeline.objects.select_for_update().filter(pk=pipeline.pk).first()
        if current is None:
            return False
        run = current.runs.filter(state__in=RunState.active()).first()
        if (
            run is not None
            or current.desired_state == DesiredState.RUNNING
            or current.status not in Status.terminal()
        ):
            detail = (
                f"pipeline {current.name!r} is {current.status} (desired {current.desired_state}"
            )
            if run is not None:
                detail += f", run {run.generation} {run.state}"
            raise Conflict(f"{detail}); stop it and let its driver exit before deleting it")
        entry = audit.record(
            current, "delete", user=user, reason=reason, before=audit.snapshot(current)
        )
        entry.after = {}  # nothing is left
        entry.save(update_fields=["after"])
        name = current.name
        last = current.runs.order_by("-generation").values_list("spec_version", flat=True)
        spec_version = last.first()
        current.delete()
        transaction.on_commit(
            lambda: pipeline_deleted.send(
                sender=Pipeline,
                name=name,
                spec_version=spec_version,
                keep_restore_point=keep_restore_point,
                user=user,
            )
        )
    return True
