"""The example fleet (examples/fleet/) and the files' JSON Schema (docs/fleet.schema.json):
the example lints, plans and applies for both its environments, the schema is what the code
builds, and every document the example and an export hold fits it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from jsonschema import Draft202012Validator

from controlplane.fleet import cli
from controlplane.fleet.schema import document_schema
from tests.clients import client_as

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "fleet"


def example_files() -> dict[str, str]:
    return {
        f"fleet/{p.relative_to(EXAMPLE).as_posix()}": p.read_text()
        for p in sorted(EXAMPLE.rglob("*.yaml"))
    }


def test_the_published_schema_is_the_one_the_code_builds():
    published = json.loads((ROOT / "docs" / "fleet.schema.json").read_text())
    built = json.loads(json.dumps(document_schema()))  # as JSON: tuples are lists
    assert published == built, "regenerate: cpfleet schema > docs/fleet.schema.json"
    Draft202012Validator.check_schema(published)


def test_the_example_lints_clean_for_each_environment():
    for environment in ("dev", "prod"):
        errors, warnings = cli.lint(example_files(), environment)
        assert (errors, warnings) == ([], []), environment


@pytest.fixture
def admin(django_user_model, monkeypatch):
    monkeypatch.setenv("FLEET_SECRET_SINK_PASSWORD", "example-pw")
    return client_as(django_user_model, "admin")


def test_the_example_applies_and_its_documents_and_export_fit_the_schema(admin):
    validator = Draft202012Validator(document_schema())
    for path, text in example_files().items():
        for document in yaml.safe_load_all(text):
            problems = [e.message for e in validator.iter_errors(document)]
            assert problems == [], path
    body = {"fleet": "logistics", "files": example_files(), "environment": "prod"}
    plan = admin.post("/api/apply/", body, format="json")
    assert plan.status_code == 200, plan.json()
    us = next(o for o in plan.json()["objects"] if o["name"] == "deliveries-us")
    assert us["action"] == "create"
    applied = admin.post(
        "/api/apply/", {**body, "environment": "dev", "dry_run": False}, format="json"
    )
    assert applied.status_code == 200, applied.json()
    assert applied.json()["summary"]["create"] == 9
    again = admin.post("/api/apply/", {**body, "environment": "dev"}, format="json").json()
    assert again["summary"]["unchanged"] == 9
    exported = admin.get("/api/export/", {"fleet": "logistics"}).json()["files"]
    assert len(exported) == 9
    for path, text in exported.items():
        problems = [e.message for e in validator.iter_errors(yaml.safe_load(text))]
        assert problems == [], path
