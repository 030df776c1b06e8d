from __future__ import annotations

from io import StringIO

import pytest
from django.contrib.auth import get_user_model
from django.core.management import CommandError, call_command

from controlplane.accounts.models import ApiToken
from controlplane.connections.models import Connection
from controlplane.definitions.models import Pipeline


def run(*args, **kwargs) -> str:
    out = StringIO()
    call_command(*args, stdout=out, **kwargs)
    return out.getvalue()


def test_create_api_token_prints_a_key_that_authenticates(db, anon):
    get_user_model().objects.create_user("ci")
    key = run("create_api_token", "ci", name="deploy").strip()
    assert key.startswith("cpt_")
    anon.credentials(HTTP_AUTHORIZATION=f"Token {key}")
    # Authenticated, but a user without a role may do nothing until given one.
    assert anon.get("/api/connections/").status_code == 403
    assert run("set_role", "ci", "viewer").strip() == "ci: viewer"
    assert anon.get("/api/connections/").status_code == 200
    assert anon.post("/api/connections/", {}, format="json").status_code == 403


def test_set_role_creates_users_on_request_and_refuses_unknown_ones(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        run("set_role", "ghost", "operator")
    run("set_role", "robot", "operator", create=True)
    user = get_user_model().objects.get(username="robot")
    assert list(user.groups.values_list("name", flat=True)) == ["operator"]
    assert not user.has_usable_password()
    run("set_role", "robot", "none")
    assert not user.groups.exists()


def test_create_api_token_refuses_a_duplicate_unless_rotating(db, anon):
    get_user_model().objects.create_user("ci")
    old = run("create_api_token", "ci").strip()
    with pytest.raises(CommandError, match="--rotate"):
        run("create_api_token", "ci")
    new = run("create_api_token", "ci", rotate=True).strip()
    assert new != old
    anon.credentials(HTTP_AUTHORIZATION=f"Token {old}")
    assert anon.get("/api/connections/").status_code == 401


def test_create_api_token_for_an_unknown_user_is_a_clear_error(db):
    with pytest.raises(CommandError, match="no user named 'ghost'"):
        run("create_api_token", "ghost")


def test_ensure_admin_prints_credentials_once(db):
    first = run("ensure_admin")
    assert "Password:" in first
    assert "cpt_" in first
    second = run("ensure_admin")
    assert "Password:" not in second
    assert "cpt_" not in second
    assert ApiToken.objects.count() == 1


def test_seed_demo_is_idempotent(db, kafka_bootstrap, sink_dsn, monkeypatch):
    monkeypatch.setenv("CONTROLPLANE_SINK_DATABASE_URL", sink_dsn)
    run("seed_demo")
    run("seed_demo")
    assert set(Connection.objects.values_list("name", flat=True)) == {
        "local-kafka",
        "local-postgres",
    }
    demo = Pipeline.objects.get(name="demo-deliveries")
    assert demo.version == 1
    assert demo.connections.count() == 2
    # The demo runs in a shared Spark application, created with it.
    from controlplane.definitions.models import SparkApplication

    assert demo.placement == "shared"
    assert SparkApplication.objects.filter(name="shared", desired_state="running").count() == 1


def test_a_demo_whose_embedded_kafka_restarted_empty_gets_a_new_checkpoint(
    db, kafka_bootstrap, sink_dsn, monkeypatch, settings, tmp_path
):
    from controlplane.definitions.models import AuditEntry

    monkeypatch.setenv("CONTROLPLANE_SINK_DATABASE_URL", sink_dsn)
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path
    run("seed_demo")
    # It ran before, then gave up: its checkpoint points past the new, empty log.
    (tmp_path / "demo-deliveries" / "offsets").mkdir(parents=True)
    Pipeline.objects.filter(name="demo-deliveries").update(status="failed")
    run("seed_demo")  # the broker kept its data: nothing is touched
    assert (tmp_path / "demo-deliveries").exists()
    assert Pipeline.objects.get(name="demo-deliveries").status == "failed"

    out = run("seed_demo", kafka_restarted_empty=True)
    assert "new checkpoint" in out
    assert not (tmp_path / "demo-deliveries").exists()
    demo = Pipeline.objects.get(name="demo-deliveries")
    assert demo.status != "failed" and demo.desired_state == "running"
    entry = AuditEntry.objects.get(pipeline_name="demo-deliveries", action="start")
    assert entry.actor_name == "system" and "restarted empty" in entry.reason
