"""Layer contracts, checked on every test run.

- `jobs/` runs inside Spark: it never imports Django, Celery or the control plane.
- Pure logic modules (listed below) import neither Django nor Celery, so they can be tested
  with time passed in and reused anywhere.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN_IN_JOBS = ("django", "celery", "controlplane", "rest_framework")
PURE_MODULES = [
    "controlplane/env.py",
    "controlplane/redaction.py",
    "controlplane/restarts.py",
    "controlplane/lag.py",
    "controlplane/checkpoints.py",
]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
    return found


def violations() -> list[str]:
    problems = []
    targets = [(p, FORBIDDEN_IN_JOBS) for p in sorted((ROOT / "jobs").rglob("*.py"))]
    targets += [(ROOT / p, ("django", "celery")) for p in PURE_MODULES]
    for path, forbidden in targets:
        for line, module in imported_modules(path):
            if module.split(".")[0] in forbidden:
                problems.append(f"{path.relative_to(ROOT)}:{line}: imports {module}")
    return problems


if __name__ == "__main__":
    found = violations()
    for problem in found:
        print(problem)
    sys.exit(1 if found else 0)
