"""What differs between two documents, by path (pure): what a plan shows of an update, and
what drift says changed."""

from __future__ import annotations

from typing import Any

_MISSING = object()


def changes(before: Any, after: Any, path: str = "") -> list[dict]:
    """[{path, before, after}] for each place the two differ: mappings key by key, lists of
    one length item by item, anything else whole. A key only on one side has `before` or
    `after` left out."""
    if isinstance(before, dict) and isinstance(after, dict):
        out: list[dict] = []
        for key in sorted(set(before) | set(after), key=str):
            here = f"{path}.{key}" if path else str(key)
            out.extend(changes(before.get(key, _MISSING), after.get(key, _MISSING), here))
        return out
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        out = []
        for i, (b, a) in enumerate(zip(before, after, strict=True)):
            out.extend(changes(b, a, f"{path}[{i}]"))
        return out
    if before == after:
        return []
    change: dict[str, Any] = {"path": path}
    if before is not _MISSING:
        change["before"] = before
    if after is not _MISSING:
        change["after"] = after
    return [change]


def document_changes(before: dict | None, after: dict | None) -> list[dict]:
    """The changes between two canonical documents, without their apiVersion, kind and name
    (the same on both sides)."""

    def body(doc: dict | None) -> dict:
        return {k: v for k, v in (doc or {}).items() if k not in ("apiVersion", "kind", "name")}

    return changes(body(before), body(after))
