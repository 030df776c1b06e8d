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

Restore points live on the checkpoint's own store (controlplane.definitions.checkpoints),
as cheap as it allows: on a local disk a copy whose files are hard links; on S3 server-side
copies (no data through the control plane); on HDFS an HDFS snapshot of the checkpoint's
directory (the NameNode keeps the files the query deletes after it, nothing is copied;
`dfs.namenode` refuses to snapshot unless the control plane's HDFS user may make the
directory snapshottable, and a copy through the DataNodes is made instead). Copies and
set-aside checkpoints are directories under `<checkpoint root>/_restore_points/<pipeline>/`.
A snapshot is not cut back when taken (it cannot be changed): every restore cuts the copy it
makes back to the restore point's batch, whatever the store."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from controlplane.definitions import audit
from controlplane.definitions import checkpoints as locations
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
from jobs.storage import HdfsStorage, StorageError, basename, join, parent

log = logging.getLogger("controlplane.restore_points")

STORE = locations.RESTORE_POINTS
SNAPSHOTS = "/.snapshot/"


class Refused(Exception):
    """The action cannot be done now (answered with 409, saying why)."""


def checkpoint_dir(pipeline: Pipeline | str) -> str:
    return locations.location(pipeline)


def store_dir(name: str) -> str:
    return locations.restore_points_location(name)


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


def _stamp(kind: str, now: datetime) -> str:
    return f"{now:%Y%m%dT%H%M%S.%fZ}-{kind}"


def _folder(name: str, kind: str, now: datetime) -> str:
    return join(store_dir(name), _stamp(kind, now))


def _last_spec_version(pipeline: Pipeline, *, before_generation: int | None = None) -> int | None:
    runs = Run.objects.filter(pipeline=pipeline)
    if before_generation is not None:
        runs = runs.filter(generation__lt=before_generation)
    return runs.order_by("-generation").values_list("spec_version", flat=True).first()


def _record(
    pipeline: Pipeline | None,
    name: str,
    folder: str,
    checkpoint: checkpoints.Checkpoint | None,
    *,
    kind: str,
    user,
    reason: str,
    now: datetime,
    spec_version: int | None,
) -> RestorePoint:
    size, files = locations.store().tree_size(folder)
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
    try:
        folder, copied = _copy(pipeline.name, kind, now)
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


def _copy(name: str, kind: str, now: datetime) -> tuple[str, checkpoints.Checkpoint | None]:
    """A consistent copy of the checkpoint of `name` as of its last committed batch: where
    it is, and the checkpoint as of that batch (None: nothing committed, nothing made)."""
    store, current = locations.store(), checkpoint_dir(name)
    snapshots = locations.snapshot_dir(name)
    if isinstance(store, HdfsStorage) and snapshots:
        before = checkpoints.read_checkpoint(current, history=1, sizes=False, store=store)
        if before is None or before.last_committed is None:
            return "", None
        try:
            store.allow_snapshots(snapshots)
            taken = store.create_snapshot(snapshots, _stamp(kind, now))
            return join(taken, basename(current)), before
        except StorageError as exc:
            log.warning("%s: no HDFS snapshot (%s): copying its files instead", current, exc)
    folder = _folder(name, kind, now)
    return folder, checkpoints.copy_committed(current, folder, store=store)


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
    store, current = locations.store(), checkpoint_dir(name)
    if not store.exists(current):
        return None
    before = checkpoints.read_checkpoint(current, history=0, sizes=False, store=store)
    folder = _folder(name, kind, now)
    store.move_tree(current, folder)
    if before is not None and before.last_committed is not None:
        checkpoints.trim_after(folder, before.last_committed.batch_id, store=store)
    if pipeline is not None and spec_version is None:
        spec_version = _last_spec_version(pipeline)
    return _record(
        pipeline,
        name,
        folder,
        checkpoints.read_checkpoint(folder, history=1, sizes=False, store=store),
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
        store = locations.store()
        try:
            before = locations.read(locked, history=0, sizes=False)
        except StorageError as exc:
            raise Refused(f"the checkpoint could not be read: {exc}") from None
        # The restored copy is made complete first; only then is the current checkpoint
        # moved aside, and moved back if the copy cannot take its place.
        target = checkpoint_dir(locked)
        partial = join(parent(target), f".{basename(target)}.restoring")
        query_id = _restored_copy(point, partial)
        try:
            kept = set_aside(
                locked,
                kind=RestorePointKind.BEFORE_RESTORE,
                user=user,
                reason=f"replaced by restore point {point_id}",
                now=now,
            )
        except OSError as exc:
            store.remove_tree(partial)
            raise Refused(f"the current checkpoint could not be set aside: {exc}") from None
        try:
            store.move_tree(partial, target)
        except OSError as exc:
            if kept is not None:
                store.move_tree(kept.path, target)
                kept.delete()
            store.remove_tree(partial)
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


def _restored_copy(point: RestorePoint, partial: str) -> str:
    """The restore point's files copied to `partial` (as cheaply as the store allows), cut
    back to its batch, checked complete, with a new query id (returned); Refused, with
    nothing left behind, if that cannot be done."""
    store = locations.store()
    store.remove_tree(partial)
    try:
        store.copy_tree(point.path, partial, skip=checkpoints.is_temporary)
        if point.last_batch_id is not None:
            checkpoints.trim_after(partial, point.last_batch_id, store=store)
        copied = checkpoints.read_checkpoint(partial, history=0, sizes=False, store=store)
        last = copied.last_committed.batch_id if copied and copied.last_committed else None
        if last != point.last_batch_id:
            raise Refused(f"restore point {point.pk}'s files are incomplete or gone ({point.path})")
        return checkpoints.new_query_id(partial, store=store)
    except BaseException as exc:
        store.remove_tree(partial)
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
    _remove_files(point.path)
    point.delete()


def _remove_files(path: str) -> None:
    """A restore point's files: an HDFS snapshot (`<dir>/.snapshot/<id>/checkpoint`), or a
    directory."""
    store = locations.store()
    if isinstance(store, HdfsStorage) and SNAPSHOTS in path:
        directory, _, rest = path.partition(SNAPSHOTS)
        store.delete_snapshot(directory, rest.split("/", 1)[0])
        return
    store.remove_tree(path)


def _remove_all(name: str, *, keep: RestorePoint | None) -> None:
    """The files of pipeline name `name` but `keep`'s: its checkpoint, its other restore
    points, and on HDFS its snapshots, and their directory once it holds nothing."""
    store, snapshots = locations.store(), locations.snapshot_dir(name)
    _remove_files(checkpoint_dir(name))
    for point in RestorePoint.objects.filter(pipeline_name=name):
        if keep is None or point.pk != keep.pk:
            _remove(point)
    if isinstance(store, HdfsStorage) and snapshots:
        for snapshot in store.snapshots(snapshots):
            store.delete_snapshot(snapshots, snapshot)
        if keep is None:
            store.remove_tree(snapshots)


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
        removed = 0
        for point in gone:
            try:
                _remove(point)
                removed += 1
            except StorageError as exc:  # its store is down: the row stays, tried again later
                log.warning("restore point %s not removed: %s", point.pk, exc)
    return removed


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
    if keep_restore_point and kept is None:  # no checkpoint: the newest one stays
        kept = (
            RestorePoint.objects.filter(pipeline_name=name).order_by("-created_at", "-id").first()
        )
    _remove_all(name, keep=kept if keep_restore_point else None)


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
        try:
            state = locations.read(pipeline, history=0, sizes=False)
        except StorageError as exc:
            log.warning("pipeline %s: no scheduled restore point: %s", pipeline.name, exc)
            continue
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
