"""The import contracts of pyproject.toml ([tool.importlinter]), checked with import-linter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = str(Path(sys.executable).parent / "lint-imports")


def lint_imports(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run(
        [LINT_IMPORTS, "--no-cache", *args], cwd=cwd, env=env, capture_output=True, text=True
    )


def test_the_project_keeps_its_import_contracts():
    done = lint_imports(ROOT)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 broken" in done.stdout


def test_a_broken_layer_is_reported(tmp_path):
    """The same kind of contract over a tiny tree in which a domain module imports a face."""
    package = tmp_path / "app"
    for name in ("api", "definitions"):
        (package / name).mkdir(parents=True)
        (package / name / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "definitions" / "models.py").write_text("from app.api import views\n")
    (package / "api" / "views.py").write_text("")
    (tmp_path / ".importlinter").write_text(
        "[importlinter]\nroot_package = app\n\n"
        "[importlinter:contract:layers]\nname = faces above\ntype = layers\n"
        "layers =\n    app.api\n    app.definitions\n"
    )
    done = lint_imports(tmp_path)
    assert done.returncode != 0
    assert "app.definitions.models -> app.api.views" in done.stdout
