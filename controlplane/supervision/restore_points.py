"""Restore points: consistent copies of a pipeline's checkpoint, as of one committed batch
(the Flink Kubernetes operator's savepoint history, for Structured Streaming), to go back to.

* Taken on demand (`take`), on the pipeline's schedule (`tick`, every minute), and before a
  new spec version's first run on an existing checkpoint (`before_change`, from the
  reconciler's launch): a copy of the checkpoint cut back to its last committed batch
  (`jobs.checkpoints.copy_committed`), so a running pipeline needs no pause.
* Set aside whole (`set_aside`) when a checkpoint is replaced: by a restore, by an offsets
  reset, by the pipeline's deletion.
* Restoring (`restore`, only while the pipeline is stopped and has no driver) keeps the
  current checkpoint as a restore point, puts the restore point's files in its place and
  gives it a new query id: the batches after the restore point are read again and written
  again (an upsert sink ends as if nothing had moved; an append sink gets those rows twice),
  never skipped as batches the old query had written under the same numbers.
* Kept per pipeline name (`prune`): the newest CONTROLPLANE_RESTORE_POINTS_KEEP of each kind,
  none older than CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS, the newest always; a deleted pipeline's
  newest one stays (unless its deletion said not to), for a pipeline of the same name.

Files live under `<checkpoint root>/_restore_points/<pipeline>/`, on the checkpoint's file
system, so copies share the checkpoint files' data through hard links."""

from __future__ import annotations

import logging
import shutil
from datetime import datetime, timedelta
from pathlib import Path

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.definitions import audit
from controlplane.definitions.models import (
    AuditEntry,
    DesiredState,
    Pipeline,
    RestorePoint,
    RestorePointKind,
    Run,
    RunState,
)
from jobs import checkpoints
from jobs.kafka.offsets import nest

log = logging.getLogger("controlplane.restore_points")

STORE = "_restore_points"


class Refused(Exception):
    """The action cannot be done now (answered with 409, saying why)."""


def checkpoint_dir(pipeline: Pipeline | str) -> Path:
    name = pipeline if isinstance(pipeline, str) else pipeline.name
    return Path(settings.CONTROLPLANE_CHECKPOINT_ROOT) / name


def store_dir(name: str) -> Path:
    return Path(settings.CONTROLPLANE_CHECKPOINT_ROOT) / STORE / name


def ensure_at_rest(locked: Pipeline) -> None:
    """Raises Refused, saying why, unless the (locked) pipeline is wanted stopped and has no
    driver: its checkpoint may be replaced."""
    if locked.desired_state == DesiredState.RUNNING:
        raise Refused(f"pipeline {locked.name!r} is wanted running: stop it first")
    active = Run.objects.filter(pipeline=locked, state__in=RunState.active()).first()
    if active is not None:
        raise Refused(
            f"pipeline {locked.name!r} still has run {active.generation} ({active.state}):"
            " wait until its driver has exited"
        )


def _folder(name: str, kind: str, now: datetime) -> Path:
    return store_dir(name) / f"{now:%Y%m%dT%H%M%S.%fZ}-{kind}"


def _last_spec_version(pipeline: Pipeline, *, before_generation: int | None = None) -> int | None:
    runs = Run.objects.filter(pipeline=pipeline)
    if before_generation is not None:
        runs = runs.filter(generation__lt=before_generation)
    return runs.order_by("-generation").values_list("spec_version", flat=True).first()


def _record(
    pipeline: Pipeline | None,
    name: str,
    folder: Path,
    checkpoint: checkpoints.Checkpoint | None,
    *,
    kind: str,
    user,
    reason: str,
    now: datetime,
    spec_version: int | None,
) -> RestorePoint:
    size, files = checkpoints.tree_size(folder)
    last = checkpoint.last_committed if checkpoint else None
    return RestorePoint.objects.create(
        pipeline=pipeline,
        pipeline_name=name,
        kind=kind,
        created_at=now,
        created_by=user if getattr(user, "pk", None) else None,
        reason=reason,
        path=str(folder),
        spec_version=spec_version,
        query_id=(checkpoint.query_id or "") if checkpoint else "",
        last_batch_id=last.batch_id if last else None,
        committed_at=last.committed_at if last else None,
        offsets=nest(checkpoint.committed_offsets()) if last else {},
        size_bytes=size,
        files=files,
    )


def _audit(name: str, pipeline: Pipeline | None, action: str, *, user, reason: str, **after):
    AuditEntry.objects.create(
        **audit.actor(user),
        action=action,
        pipeline=pipeline,
        pipeline_name=name,
        reason=reason,
        before={},
        after=after,
    )


def describe(point: RestorePoint) -> dict:
    return {
        "id": point.pk,
        "pipeline": point.pipeline_name,
        "kind": point.kind,
        "created_at": point.created_at,
        "created_by": point.created_by.get_username() if point.created_by else None,
        "reason": point.reason,
        "spec_version": point.spec_version,
        "last_batch_id": point.last_batch_id,
        "committed_at": point.committed_at,
        "offsets": point.offsets,
        "size_bytes": point.size_bytes,
        "files": point.files,
    }


def take(
    pipeline: Pipeline,
    *,
    kind: str = RestorePointKind.MANUAL,
    user=None,
    reason: str = "",
    now: datetime,
    spec_version: int | None = None,
) -> RestorePoint:
    """A restore point of the pipeline's checkpoint as of its last committed batch, taken
    while it runs or not (audited unless scheduled); Refused if nothing was committed yet.
    Under the pipeline's row lock: no restore, offsets reset or deletion moves the
    checkpoint while it is copied."""
    with transaction.atomic():
        Pipeline.objects.select_for_update().filter(pk=pipeline.pk).first()
        point = _take(pipeline, kind=kind, user=user, reason=reason, now=now, version=spec_version)
    prune(pipeline.name, now)
    return point


def _take(pipeline: Pipeline, *, kind, user, reason, now, version) -> RestorePoint:
    folder = _folder(pipeline.name, kind, now)
    try:
        copied = checkpoints.copy_committed(checkpoint_dir(pipeline), folder)
    except OSError as exc:
        raise Refused(f"the checkpoint could not be copied: {exc}") from None
    if copied is None:
        raise Refused(
            f"pipeline {pipeline.name!r} has no committed batch yet: nothing to restore to"
        )
    spec_version = version if version is not None else _last_spec_version(pipeline)
    point = _record(
        pipeline,
        pipeline.name,
        folder,
        copied,
        kind=kind,
        user=user,
        reason=reason,
        now=now,
        spec_version=spec_version,
    )
    if kind != RestorePointKind.SCHEDULED:
        _audit(
            pipeline.name,
            pipeline,
            "restore-point",
            user=user,
            reason=reason,
            restore_point=point.pk,
            kind=kind,
            last_batch_id=point.last_batch_id,
        )
    return point


def set_aside(
    pipeline: Pipeline | None,
    *,
    name: str = "",
    kind: str,
    user=None,
    reason: str = "",
    now: datetime,
    spec_version: int | None = None,
) -> RestorePoint | None:
    """Move the checkpoint of `pipeline` (or of the deleted pipeline `name`), whole, into a
    restore point, cut back to its last committed batch: its next run starts from
    something else. None if there is no checkpoint."""
    name = pipeline.name if pipeline is not None else name
    current = checkpoint_dir(name)
    if not current.exists():
        return None
    before = checkpoints.read_checkpoint(current, history=0, sizes=False)
    folder = _folder(name, kind, now)
    folder.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.move(str(current), str(folder))
    if before is not None and before.last_committed is not None:
        checkpoints.trim_after(folder, before.last_committed.batch_id)
    if pipeline is not None and spec_version is None:
        spec_version = _last_spec_version(pipeline)
    return _record(
        pipeline,
        name,
        folder,
        checkpoints.read_checkpoint(folder, history=1, sizes=False),
        kind=kind,
        user=user,
        reason=reason,
        now=now,
        spec_version=spec_version,
    )


def restore(pipeline: Pipeline, point_id: int, *, user, reason: str, now: datetime) -> dict:
    """Make the stopped pipeline's next run continue from restore point `point_id` (its
    current checkpoint kept as a restore point); audited. Refused while it runs."""
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        point = (
            RestorePoint.objects.select_for_update()  # retention passes over it meanwhile
            .filter(pk=point_id, pipeline_name=locked.name)
            .first()
        )
        if point is None:
            raise LookupError(f"pipeline {locked.name!r} has no restore point {point_id}")
        ensure_at_rest(locked)
        before = checkpoints.read_checkpoint(checkpoint_dir(locked), history=0, sizes=False)
        # The restored copy is made complete first; only then is the current checkpoint
        # moved aside, and moved back if the copy cannot take its place.
        target = checkpoint_dir(locked)
        partial = target.with_name(f".{target.name}.restoring")
        query_id = _restored_copy(point, partial)
        kept = set_aside(
            locked,
            kind=RestorePointKind.BEFORE_RESTORE,
            user=user,
            reason=f"replaced by restore point {point_id}",
            now=now,
        )
        try:
            partial.rename(target)
        except OSError as exc:
            if kept is not None:
                shutil.move(kept.path, str(target))
                kept.delete()
            shutil.rmtree(partial, ignore_errors=True)
            raise Refused(f"the restored checkpoint could not be put in place: {exc}") from None
        Pipeline.objects.filter(pk=locked.pk).update(offsets_reset=None)
        done = {
            "restore_point": point.pk,
            "last_batch_id": point.last_batch_id,
            "offsets": point.offsets,
            "spec_version": point.spec_version,
            "query_id": query_id,
            "kept_restore_point": kept.pk if kept else None,
        }
        last = before.last_committed if before else None
        audit.record_with(
            locked,
            "restore",
            user=user,
            reason=reason,
            before={
                "last_batch_id": last.batch_id if last else None,
                "committed": nest(before.committed_offsets()) if last else {},
            },
            after=done,
        )
    prune(locked.name, now)
    return done


def _restored_copy(point: RestorePoint, partial: Path) -> str:
    """The restore point's files linked at `partial`, checked complete, with a new query id
    (returned); Refused, with nothing left behind, if that cannot be done."""
    shutil.rmtree(partial, ignore_errors=True)
    try:
        checkpoints.link_tree(Path(point.path), partial)
        copied = checkpoints.read_checkpoint(partial, history=0, sizes=False)
        last = copied.last_committed.batch_id if copied and copied.last_committed else None
        if last != point.last_batch_id:
            raise Refused(f"restore point {point.pk}'s files are incomplete or gone ({point.path})")
        return checkpoints.new_query_id(partial)
    except BaseException as exc:
        shutil.rmtree(partial, ignore_errors=True)
        if isinstance(exc, OSError):
            raise Refused(f"restore point {point.pk} could not be copied: {exc}") from None
        raise


def delete(point: RestorePoint, *, user, reason: str = "") -> None:
    """Delete one restore point and its files (audited)."""
    _audit(
        point.pipeline_name,
        point.pipeline,
        "restore-point-deleted",
        user=user,
        reason=reason,
        restore_point=point.pk,
        kind=point.kind,
        last_batch_id=point.last_batch_id,
    )
    _remove(point)


def _remove(point: RestorePoint) -> None:
    shutil.rmtree(point.path, ignore_errors=True)
    point.delete()


def prune(name: str, now: datetime) -> int:
    """Apply retention to one pipeline name's restore points: the newest KEEP of each kind,
    none older than the age limit, the newest one always; how many were deleted."""
    keep = settings.CONTROLPLANE_RESTORE_POINTS_KEEP
    oldest = now - timedelta(days=settings.CONTROLPLANE_RESTORE_POINTS_MAX_AGE_DAYS)
    with transaction.atomic():
        points = list(
            RestorePoint.objects.select_for_update(skip_locked=True)  # not one being restored
            .filter(pipeline_name=name)
            .order_by("-created_at", "-id")
        )
        seen: dict[str, int] = {}
        gone = []
        for point in points:
            # Per kind: scheduled points never push out the one taken before a change.
            rank = seen[point.kind] = seen.get(point.kind, -1) + 1
            if point is not points[0] and (rank >= keep or point.created_at < oldest):
                gone.append(point)
        for point in gone:
            _remove(point)
    return len(gone)


def after_delete(
    sender, *, name: str, spec_version, keep_restore_point: bool, user, **kwargs
) -> None:
    """A pipeline was deleted (definitions.services.pipeline_deleted): its checkpoint becomes
    its name's last restore point and the other restore points go, so that a pipeline
    created again under the name starts afresh and can be restored to where this one was;
    with `keep_restore_point` False, all of them go, and the checkpoint too. Runs once the
    deletion has committed: a failure is logged, never raised."""
    try:
        _after_delete(name, spec_version, keep_restore_point, user)
    except Exception:
        log.exception("pipeline %s: its checkpoint was not kept after its deletion", name)


def _after_delete(name: str, spec_version, keep_restore_point: bool, user) -> None:
    now = timezone.now()
    kept = None
    if keep_restore_point:
        kept = set_aside(
            None,
            name=name,
            kind=RestorePointKind.BEFORE_DELETE,
            user=user,
            reason="the checkpoint of the deleted pipeline",
            now=now,
            spec_version=spec_version,
        )
        if kept is not None and kept.last_batch_id is None:
            _remove(kept)  # nothing was ever committed: nothing to go back to
            kept = None
    shutil.rmtree(checkpoint_dir(name), ignore_errors=True)
    for point in RestorePoint.objects.filter(pipeline_name=name).order_by("-created_at", "-id"):
        if keep_restore_point and (kept is None or point.pk == kept.pk):
            kept = point  # the newest one stays
            continue
        _remove(point)


def before_change(run: Run, now: datetime) -> RestorePoint | None:
    """Before `run`, the first of a new spec version, starts on an existing checkpoint: a
    restore point of it (the old version's), so a bad deploy can be undone. Best-effort: a
    failure is logged and the run starts."""
    pipeline = run.pipeline
    previous = _last_spec_version(pipeline, before_generation=run.generation)
    if previous is None or previous == run.spec_version:
        return None
    try:
        return take(
            pipeline,
            kind=RestorePointKind.BEFORE_CHANGE,
            reason=f"before version {run.spec_version} (was {previous})",
            now=now,
            spec_version=previous,
        )
    except Refused:
        return None  # nothing committed yet
    except Exception:
        log.exception("pipeline %s: the restore point before the change failed", pipeline.name)
        return None


def tick(now: datetime) -> dict:
    """Scheduled restore points (a pipeline whose `restore_point_minutes` have passed since
    its newest one, that committed a batch since), then retention for every pipeline name."""
    taken = 0
    due = Pipeline.objects.filter(
        restore_point_minutes__isnull=False, runs__state=RunState.RUNNING
    ).distinct()
    for pipeline in due:
        newest = RestorePoint.objects.filter(pipeline_name=pipeline.name).first()
        if newest and now - newest.created_at < timedelta(minutes=pipeline.restore_point_minutes):
            continue
        state = checkpoints.read_checkpoint(checkpoint_dir(pipeline), history=0, sizes=False)
        last = state.last_committed if state else None
        if last is None or (newest and newest.last_batch_id == last.batch_id):
            continue  # nothing new to keep
        try:
            take(pipeline, kind=RestorePointKind.SCHEDULED, reason="scheduled", now=now)
            taken += 1
        except Refused:
            continue
        except Exception:
            log.exception("pipeline %s: the scheduled restore point failed", pipeline.name)
    names = RestorePoint.objects.values_list("pipeline_name", flat=True).distinct()
    pruned = sum(prune(name, now) for name in names)
    return {"taken": taken, "pruned": pruned}
