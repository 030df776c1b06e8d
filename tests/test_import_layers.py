from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def load_checker():
    spec = importlib.util.spec_from_file_location(
        "check_imports", ROOT / "scripts/check_imports.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jobs_and_pure_modules_import_no_django_or_celery():
    assert load_checker().violations() == []


def test_the_checker_catches_a_violation(tmp_path, monkeypatch):
    checker = load_checker()
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "bad.py").write_text("from django.db import models\n")
    monkeypatch.setattr(checker, "ROOT", tmp_path)
    monkeypatch.setattr(checker, "PURE_MODULES", [])
    assert checker.violations() == ["jobs/bad.py:1: imports django.db"]
