"""Which directories files sinks write to, and the refusals that keep them apart.

Three rules, each judged by canonical locations (jobs.spec.locations: scheme and host in one
case, default ports explicit, `.`/`..`/`//` resolved, local symbolic links followed), never
by comparing the text of roots and paths:

- **No two pipelines share a directory.** A pipeline's files sink may not write where another
  pipeline's does, nor in a directory inside it or holding it (readers of one would see the
  other's files, and the sinks' `_cp_staging`, `_cp_manifest` and `_cp_dead_letters` would
  mix); nor may two sinks of one pipeline (checked here across connections, and with symbolic
  links; jobs.spec.validate checks two paths of one connection as text is typed).
- **The control plane's own directories are not sinks.** Nothing may write into, or over,
  the checkpoint root, the restore points under it, or the runs root.
- **A files connection's root cannot move under its pipelines' feet.** Changing the root
  re-checks every pipeline that uses the connection against every other files sink; a change
  that would make two share a directory is refused (RootInUse: the API answers 409 naming
  them) and nothing is saved.

Checks that must hold against concurrent saves lock every files connection, in name order,
in the saving transaction (pipeline saves do the same), so two saves are judged one after
the other. Pipelines are reached through `Connection.pipelines` (the link kept by the
definitions app), so that this module stays below the definitions layer.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings as django_settings

from jobs.connections import files_root
from jobs.spec import FieldError, SpecError
from jobs.spec.locations import Location, LocationError, files_sinks, local, location

from .models import Connection, ConnectionKind

# controlplane.supervision.restore_points.STORE (a layer above this one): restore points live
# in `<checkpoint root>/_restore_points/<pipeline>/` (tests/test_files_locations.py checks
# the two agree).
RESTORE_POINTS_STORE = "_restore_points"

MAX_LINES = 10  # conflicts spelled out in a root change's message
SHARED = (
    "two pipelines may not write to the same directory or nested ones (readers of one would"
    " see the other's files)"
)


@dataclass(frozen=True)
class Written:
    """One files sink: whose, which field names its path, and where it leads."""

    pipeline: str
    field: str  # sink.path, sinks[1].path
    connection: str
    path: str
    shown: str  # the root as stored, joined to the path: what the operator wrote
    where: Location

    def describe(self) -> str:
        return f"{self.field} {self.path!r} of connection {self.connection!r}"


class RootInUse(SpecError):
    """A files connection's new root would make pipelines share directories (or write into
    the control plane's own). `settings.root` names the problem for forms; `pipelines` and
    `conflicts` say who and where, for the API's 409."""

    def __init__(self, message: str, pipelines: list[str], conflicts: list[dict[str, Any]]):
        super().__init__([FieldError("settings.root", message)])
        self.message = message
        self.pipelines = pipelines
        self.conflicts = conflicts


# -- the control plane's own directories ----------------------------------------------------


def control_plane_directories() -> list[tuple[str, Location]]:
    """(what it is, where) of each directory the control plane keeps its own files in."""
    root = os.fspath(django_settings.CONTROLPLANE_CHECKPOINT_ROOT)
    runs = Path(os.path.abspath(django_settings.CONTROLPLANE_RUNS_ROOT))
    if "://" in root:  # on HDFS or S3: compared as the files sinks' roots are
        checkpoints = location(root)
        store = location(root, RESTORE_POINTS_STORE)
    else:
        checkpoints = local(os.path.abspath(root))
        store = local(Path(os.path.abspath(root)) / RESTORE_POINTS_STORE)
    return [
        ("restore points, CONTROLPLANE_CHECKPOINT_ROOT/" + RESTORE_POINTS_STORE, store),
        ("CONTROLPLANE_CHECKPOINT_ROOT", checkpoints),
        ("CONTROLPLANE_RUNS_ROOT", local(runs)),
    ]


def control_plane_overlap(where: Location) -> str | None:
    """How `where` meets one of the control plane's own directories ("is inside the control
    plane's own directory /var/cp/checkpoints (CONTROLPLANE_CHECKPOINT_ROOT)"), or None."""
    found = []
    for name, own in control_plane_directories():
        if where == own:
            found.append((0, 0, "is", own, name))
        elif own.contains(where):  # the innermost one holding it
            found.append((1, -len(own.segments), "is inside", own, name))
        elif where.contains(own):  # the outermost one it holds
            found.append((2, len(own.segments), "holds", own, name))
    if not found:
        return None
    _, _, relation, own, name = min(found, key=lambda f: f[:2])
    return f"{relation} the control plane's own directory {own} ({name})"


# -- where sinks write ----------------------------------------------------------------------


def files_roots(*, lock: bool) -> dict[str, Any]:
    """Every files connection's stored root by name; `lock`: each row locked (in name order,
    as every saver of pipelines and roots takes them) until the transaction ends."""
    query = Connection.objects.filter(kind=ConnectionKind.FILES).order_by("name")
    if lock:
        query = query.select_for_update()
    return {c.name: c.settings.get("root") for c in query}


def written(pipeline: str, spec: Any, roots: Mapping[str, Any]) -> list[Written]:
    """Where each files sink of a stored spec (a dict) writes, given the connections' roots;
    a sink whose connection is not (or no longer) a files connection is left out."""
    out = []
    for field, sink in files_sinks(spec):
        connection, path = sink.get("connection"), sink.get("path")
        if not isinstance(path, str) or not isinstance(connection, str):
            continue
        if connection not in roots:
            continue
        root = roots[connection]
        out.append(
            Written(
                pipeline,
                field,
                connection,
                path,
                _shown(root, path),
                _where(root, path, connection),
            )
        )
    return out


def _shown(root: Any, path: str) -> str:
    try:
        return f"{files_root({'root': root})}/{path}"
    except ValueError:
        return f"{str(root).rstrip('/')}/{path}"


def _where(root: Any, path: str, connection: str) -> Location:
    try:
        return location(root, path)
    except (LocationError, TypeError):
        # A root or path stored by an older, looser version: it is compared by connection,
        # which still keeps two sinks of that connection apart.
        return Location("connection", connection, tuple(x for x in path.split("/") if x))


# -- a pipeline being saved -----------------------------------------------------------------


def check_pipeline(name: str, spec: Any, others: Iterable[Any]) -> None:
    """Raise SpecError (on each offending `sink.path` / `sinks[i].path`) if a files sink of
    the pipeline `name` being saved with `spec` (a dict) writes where another pipeline's does
    or in a directory inside it or holding it, where another of its own sinks does (across
    connections or through a symbolic link), or into the control plane's own directories.

    In the saving transaction: every files connection is locked first (in name order), so
    that two pipelines saved at once are checked one after the other; `others` (pipelines
    with `name` and `spec`, the one being saved left out) is read after that."""
    if not files_sinks(spec):
        return
    roots = files_roots(lock=True)
    mine = written(name, spec, roots)
    theirs = [w for other in others for w in written(other.name, other.spec, roots)]
    errors = []
    for i, here in enumerate(mine):
        problem = (
            _protected_problem(here)
            or _own_problem(here, mine[:i])
            or _theirs_problem(here, theirs)
        )
        if problem:
            errors.append(FieldError(here.field, problem))
    if errors:
        raise SpecError(errors)


def _protected_problem(here: Written) -> str | None:
    overlap = control_plane_overlap(here.where)
    if overlap is None:
        return None
    return f"{here.shown} {overlap}: a pipeline may not write there"


def _own_problem(here: Written, before: list[Written]) -> str | None:
    for other in before:
        if here.where.overlaps(other.where):
            how = "is the same directory as" if here.where == other.where else "is nested with"
            sink = other.field.removesuffix(".path")
            return (
                f"{here.shown} {how} {other.shown}, where {sink} writes ({other.describe()}):"
                " two sinks may not write to the same directory or nested ones"
            )
    return None


def _theirs_problem(here: Written, theirs: list[Written]) -> str | None:
    for other in theirs:
        if not here.where.overlaps(other.where):
            continue
        if here.where == other.where:
            problem = (
                f"pipeline {other.pipeline!r} writes its files to {other.shown} already"
                f" ({other.describe()})"
            )
            if other.shown != here.shown:
                problem += f", the same directory as {here.shown}"
        else:
            problem = (
                f"{here.shown} and {other.shown}, where pipeline {other.pipeline!r} writes its"
                f" files ({other.describe()}), are one inside the other"
            )
        return f"{problem}: {SHARED}"
    return None


# -- a files connection's root being changed ------------------------------------------------


def root_change_conflicts(connection: Connection, new_root: str, *, lock: bool) -> RootInUse | None:
    """What changing the files connection `connection`'s root to `new_root` would break: its
    pipelines' sinks, under the new root, against every other files sink (other pipelines',
    and the same pipeline's of other connections) and the control plane's own directories.
    None when nothing would (or the root leads to the same place as before). `lock`: in the
    saving transaction, lock every files connection first (see files_roots)."""
    if connection.pk is None or connection.kind != ConnectionKind.FILES:
        return None
    roots = files_roots(lock=lock)
    old = roots.get(connection.name)
    if old is not None and _where(old, "", connection.name) == _where(
        new_root, "", connection.name
    ):
        return None  # spelled differently, or not at all: the same directory as before
    roots[connection.name] = new_root
    pipelines = {
        p.pk: p
        for c in Connection.objects.filter(kind=ConnectionKind.FILES).prefetch_related("pipelines")
        for p in c.pipelines.all()
    }
    sinks = [
        w
        for p in sorted(pipelines.values(), key=lambda p: p.name)
        for w in written(p.name, p.spec, roots)
    ]
    moved = [w for w in sinks if w.connection == connection.name]
    still = [w for w in sinks if w.connection != connection.name]
    lines, names, conflicts = [], set(), []
    for here in moved:
        overlap = control_plane_overlap(here.where)
        if overlap:
            lines.append(
                f"pipeline {here.pipeline!r} ({here.field} {here.path!r}) would write to"
                f" {here.shown}, which {overlap}"
            )
            names.add(here.pipeline)
            conflicts.append(
                {**_side(here), "control_plane_directory": overlap.partition("directory ")[2]}
            )
        for other in still:
            if not here.where.overlaps(other.where):
                continue
            how = "the same directory as" if here.where == other.where else "nested with"
            lines.append(
                f"pipeline {here.pipeline!r} ({here.field} {here.path!r}) would write to"
                f" {here.shown}, {how} {other.shown} where pipeline {other.pipeline!r} writes"
                f" ({other.describe()})"
            )
            names.update((here.pipeline, other.pipeline))
            conflicts.append({**_side(here), "with": _side(other)})
    if not lines:
        return None
    if len(lines) > MAX_LINES:  # the message stays readable; `conflicts` has them all
        lines[MAX_LINES:] = [f"and {len(lines) - MAX_LINES} more (see conflicts)"]
    message = (
        f"connection {connection.name!r} cannot move to {new_root}: " + "; ".join(lines) + ". "
        f"{SHARED[0].upper()}{SHARED[1:]}; nothing was changed (move those pipelines' paths"
        " first)"
    )
    return RootInUse(message, sorted(names), conflicts)


def _side(w: Written) -> dict[str, str]:
    return {
        "pipeline": w.pipeline,
        "field": w.field,
        "connection": w.connection,
        "path": w.path,
        "location": w.shown,
    }
