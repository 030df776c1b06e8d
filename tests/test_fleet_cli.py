"""`cpfleet`, the console script installed with the project, as a person or a CI job runs
it: lint offline, then plan, apply, diff and export against a live control plane, with
its exit codes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.test_fleet_apply import CONNECTIONS, ORDERS, PASSWORD

CPFLEET = str(Path(sys.executable).with_name("cpfleet"))


def cpfleet(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [CPFLEET, *args],
        cwd=cwd,
        env={**os.environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


@pytest.fixture
def user(db, django_user_model):
    """An admin (the token's user): the files' connections read secrets from the control
    plane, which only an admin may have an apply do."""
    from controlplane.accounts.roles import ADMIN, set_role

    user = django_user_model.objects.create_user(username="ci", password="not-used-here-1")
    set_role(user, ADMIN)
    return user


@pytest.fixture
def repo(tmp_path) -> Path:
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "connections.yaml").write_text(CONNECTIONS)
    (tmp_path / "fleet" / "orders.yaml").write_text(ORDERS)
    return tmp_path


def test_lint_checks_the_files_offline(repo):
    done = cpfleet("lint", "fleet", cwd=repo)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 files: 0 errors, 0 warnings" in done.stdout
    (repo / "fleet" / "orders.yaml").write_text(ORDERS.replace("format: json", "format: jsn"))
    (repo / "fleet" / "extra.yaml").write_text(
        "apiVersion: controlplane/v1\nkind: Connection\nname: x\n"
        "spec: {kind: postgres, settings: {dsn: 'postgresql://a:pw@h/db'},"
        " secrets: {password: hunter2}}\n"
    )
    done = cpfleet("lint", "fleet", cwd=repo)
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert any(
        line.startswith(
            "error: fleet/orders.yaml: document 1 (Pipeline orders-eu of template orders):"
            " spec.pipeline.source.format:"
        )
        for line in lines
    ), lines
    assert (
        "error: fleet/extra.yaml: document 1 (Connection x): spec.secrets.password: must be a"
        " reference: {env: NAME} or {file: NAME}; files never hold a secret's value"
    ) in lines
    assert (
        "error: fleet/extra.yaml: document 1 (Connection x): spec.settings: holds a secret"
        " (password): give it in spec.secrets"
    ) in lines
    assert cpfleet("lint", "nowhere", cwd=repo).returncode == 64


def test_plan_apply_diff_and_export_against_a_live_control_plane(
    repo, live_server, token, monkeypatch
):
    monkeypatch.setenv("FLEET_SECRET_WAREHOUSE", PASSWORD)  # the server's environment
    env = {"CONTROLPLANE_URL": live_server.url, "CONTROLPLANE_TOKEN": token}
    fleet = ("--fleet", "shop", "--repository", "git@example:shop", "--commit", "c0ffee")

    plan = cpfleet("plan", "fleet", *fleet, "--detailed-exitcode", cwd=repo, env=env)
    assert plan.returncode == 2, plan.stdout + plan.stderr  # changes to make
    assert "+ Pipeline/orders-eu  create  fleet/orders.yaml#1 (template orders)" in plan.stdout
    assert "planned: 5 to create, 0 to update, 0 unchanged" in plan.stdout

    # No terminal to ask on, and no --yes: nothing applied.
    assert cpfleet("apply", "fleet", *fleet, cwd=repo, env=env).returncode == 64
    applied = cpfleet("apply", "fleet", *fleet, "--yes", cwd=repo, env=env)
    assert applied.returncode == 0, applied.stdout + applied.stderr
    assert "applied: 5 to create" in applied.stdout

    again = cpfleet("plan", "fleet", *fleet, "--detailed-exitcode", cwd=repo, env=env)
    assert again.returncode == 0, again.stdout
    assert "0 to create, 0 to update, 5 unchanged" in again.stdout
    as_json = cpfleet("plan", "fleet", *fleet, "--json", cwd=repo, env=env)
    assert as_json.returncode == 0
    answer = json.loads(as_json.stdout)  # for machines: the server's answer
    assert answer["summary"]["unchanged"] == 5 and answer["dry_run"] is True

    # A change in the files: diff says what, and exits 2.
    (repo / "fleet" / "orders.yaml").write_text(ORDERS.replace("default: 5", "default: 6"))
    diff = cpfleet("diff", "fleet", *fleet, cwd=repo, env=env)
    assert diff.returncode == 2, diff.stdout + diff.stderr
    assert "    spec.trigger.interval_seconds: 5 -> 6" in diff.stdout

    # A refused set: exit 1, the file and path named, nothing applied.
    (repo / "fleet" / "orders.yaml").write_text(
        ORDERS.replace("connection: warehouse", "connection: nope")
    )
    refused = cpfleet("apply", "fleet", *fleet, "--yes", cwd=repo, env=env)
    assert refused.returncode == 1
    assert "! Pipeline/orders-eu  refused  fleet/orders.yaml#1 (template orders)" in refused.stdout
    assert "error: spec.pipeline.sink.connection: no connection named 'nope'" in refused.stdout
    assert "nothing was applied" in refused.stdout

    exported = cpfleet("export", "--fleet", "shop", "--out", "exported", cwd=repo, env=env)
    assert exported.returncode == 0, exported.stderr
    assert "5 files written under exported" in exported.stdout
    assert PASSWORD not in "".join(p.read_text() for p in (repo / "exported").rglob("*.yaml"))
    same = cpfleet("plan", "exported", *fleet, "--detailed-exitcode", cwd=repo, env=env)
    assert same.returncode == 0, same.stdout + same.stderr
    assert "5 unchanged" in same.stdout

    # Without a valid token, or a server: exit 3.
    bad = cpfleet("plan", "fleet", *fleet, cwd=repo, env={**env, "CONTROLPLANE_TOKEN": "x"})
    assert bad.returncode == 3 and "not allowed (401" in bad.stderr
    gone = cpfleet(
        "plan", "fleet", *fleet, cwd=repo, env={**env, "CONTROLPLANE_URL": "http://127.0.0.1:9"}
    )
    assert gone.returncode == 3 and "cannot be reached" in gone.stderr


def test_export_writes_only_objects_files_and_sources_never_carry_credentials():
    from controlplane.fleet.cli import EXPORTED
    from controlplane.redaction import without_credentials

    assert EXPORTED.fullmatch("pipelines/orders-eu.yaml")
    assert EXPORTED.fullmatch("alert-rules/lag.yaml")
    for path in (".git/config", ".github/workflows/x.yml", "pipelines/../x.yaml", "x.yaml"):
        assert not EXPORTED.fullmatch(path), path
    assert without_credentials(
        "https://gitlab-ci-token:glcbt-s3cret@git.example/shop/fleet.git"
    ) == ("https://git.example/shop/fleet.git")
    assert without_credentials("git@git.example:shop/fleet.git") == "git@git.example:shop/fleet.git"
