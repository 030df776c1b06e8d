"""The pipeline's status machine (controlplane.supervision.transitions): the table's steps,
its shape as a graph, that nothing else writes a status, and that the docs draw it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from controlplane.definitions.models import DesiredState
from controlplane.definitions.models import Status as ModelStatus
from controlplane.supervision.transitions import (
    Action,
    Desired,
    Observation,
    Status,
    edges,
    mermaid,
    step,
)

ROOT = Path(__file__).resolve().parent.parent
S, D, Ob = Status, Desired, Observation


def test_the_table_speaks_the_models_values():
    assert {s.value for s in Status} == set(ModelStatus.values)
    assert {d.value for d in Desired} == set(DesiredState.values)


@pytest.mark.parametrize(
    ("status", "desired", "observation", "action", "to"),
    [
        (S.STOPPED, D.RUNNING, Ob.IDLE, Action.LAUNCH, S.STARTING),
        (S.SUSPENDED, D.RUNNING, Ob.IDLE, Action.LAUNCH, S.STARTING),
        (S.STARTING, D.RUNNING, Ob.LAUNCHED, Action.NONE, S.RUNNING),
        (S.RESTARTING, D.RUNNING, Ob.LAUNCHED, Action.NONE, S.RUNNING),
        (S.RUNNING, D.STOPPED, Ob.UNWANTED, Action.STOP, S.STOPPING),
        (S.RUNNING, D.SUSPENDED, Ob.UNWANTED, Action.STOP, S.STOPPING),
        (S.RESTARTING, D.RUNNING, Ob.UNWANTED, Action.STOP, S.RESTARTING),
        (S.STOPPING, D.STOPPED, Ob.ENDED, Action.RECORD, S.STOPPED),
        (S.STOPPING, D.SUSPENDED, Ob.ENDED, Action.RECORD, S.SUSPENDED),
        (S.RUNNING, D.RUNNING, Ob.FAILED_RESTART, Action.RECORD, S.BACKING_OFF),
        (S.STARTING, D.RUNNING, Ob.FAILED_GIVE_UP, Action.RECORD, S.FAILED),
        (S.BACKING_OFF, D.RUNNING, Ob.RESTART_DUE, Action.RELAUNCH, S.RESTARTING),
        (S.BACKING_OFF, D.STOPPED, Ob.IDLE, Action.SETTLE, S.STOPPED),
        (S.STOPPED, D.SUSPENDED, Ob.IDLE, Action.SETTLE, S.SUSPENDED),
        (S.RUNNING, D.RUNNING, Ob.IDLE, Action.SETTLE, S.STOPPED),
        (S.FAILED, D.RUNNING, Ob.START, Action.LAUNCH, S.STOPPED),
        (S.RUNNING, D.RUNNING, Ob.RESTART, Action.STOP, S.RESTARTING),
    ],
)
def test_steps(status, desired, observation, action, to):
    found = step(status, desired, observation)
    assert found is not None
    assert (found.action, found.status) == (action, to)


@pytest.mark.parametrize(
    ("status", "desired", "observation"),
    [
        (S.FAILED, D.RUNNING, Ob.IDLE),  # the policy gave up: only an operator starts it again
        (S.FAILED, D.STOPPED, Ob.IDLE),
        (S.BACKING_OFF, D.RUNNING, Ob.IDLE),  # its delay is not over
        (S.STOPPED, D.RUNNING, Ob.LAUNCHED),  # no run was being launched
        (S.RUNNING, D.STOPPED, Ob.FAILED_RESTART),  # not wanted: a failure restarts nothing
        (S.STOPPED, D.STOPPED, Ob.RESTART),  # nothing runs to restart
    ],
)
def test_what_the_table_does_not_allow_changes_nothing(status, desired, observation):
    assert step(status, desired, observation) is None


def test_a_failed_pipeline_leaves_failed_only_when_started_by_hand():
    assert {(label, b) for a, b, label in edges() if a == S.FAILED} == {(Ob.START.value, S.STOPPED)}


def test_every_status_is_reached_from_stopped_and_can_come_to_rest():
    graph: dict[Status, set[Status]] = {}
    for a, b, _ in edges():
        graph.setdefault(a, set()).add(b)

    def reach(start: Status) -> set[Status]:
        seen, todo = {start}, [start]
        while todo:
            for nxt in graph.get(todo.pop(), ()):
                if nxt not in seen:
                    seen.add(nxt)
                    todo.append(nxt)
        return seen

    assert reach(S.STOPPED) == set(Status)
    for status in Status:
        assert reach(status) & {S.STOPPED, S.SUSPENDED}, f"{status} can never come to rest"


def _status_writes(path: Path) -> list[int]:
    """Lines where a file writes a pipeline's status: a queryset update() or create() with
    status=..., or an assignment to something.status."""
    lines = []
    for node in ast.walk(ast.parse(path.read_text())):
        writes = ("update", "create", "update_or_create", "get_or_create")
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in writes
            and any(k.arg == "status" for k in node.keywords)
        ):
            lines.append(node.lineno)
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr == "status":
                lines.append(node.lineno)
    return lines


def test_only_the_status_module_writes_a_status():
    allowed = ROOT / "controlplane" / "supervision" / "status.py"
    found = {
        str(path.relative_to(ROOT)): lines
        for path in sorted((ROOT / "controlplane").rglob("*.py"))
        if "migrations" not in path.parts and path != allowed
        if (lines := _status_writes(path))
    }
    assert found == {}
    assert _status_writes(allowed), "the check must see the one place that writes"


def test_the_architecture_page_draws_the_table_as_it_is():
    page = (ROOT / "docs" / "architecture.md").read_text()
    drawn = re.search(r"```mermaid\n(stateDiagram-v2\n.*?)\n```", page, re.DOTALL)
    assert drawn, "docs/architecture.md has no state diagram"
    assert drawn.group(1) == mermaid(), (
        "the diagram is out of date: python -m controlplane.supervision.transitions"
    )
