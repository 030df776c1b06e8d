"""Connection secrets are encrypted with keys of their own, not derived from SECRET_KEY:
generated once (mode 0600), rotatable, and masked out of every error text shown."""

from __future__ import annotations

import importlib
import stat

import pytest
from cryptography.fernet import Fernet, InvalidToken
from django.apps import apps
from django.core.management import CommandError, call_command
from django.test import Client
from django.utils import timezone

from controlplane import crypto
from controlplane.accounts.roles import VIEWER, set_role
from controlplane.connections.models import Connection
from controlplane.definitions.models import Failure, Pipeline


@pytest.fixture
def key_file(settings, tmp_path):
    settings.CONTROLPLANE_SECRETS_KEY = None
    settings.CONTROLPLANE_SECRETS_KEY_FILE = tmp_path / "keys" / "secrets.key"
    return settings.CONTROLPLANE_SECRETS_KEY_FILE


def stored(name: str, password: str = "hunter2-long") -> Connection:  # noqa: S107
    connection = Connection(
        name=name, kind="postgres", settings={"dsn": "postgresql://app@db.internal/sales"}
    )
    connection.set_secrets({"password": password})
    connection.save()
    return connection


def test_the_key_is_generated_once_readable_by_its_owner_only(key_file, db):
    token = crypto.encrypt_json({"password": "x"})
    assert stat.S_IMODE(key_file.stat().st_mode) == 0o600
    first = key_file.read_text()
    assert crypto.decrypt_json(token) == {"password": "x"}
    assert key_file.read_text() == first  # not regenerated


def test_the_key_is_not_derived_from_the_secret_key(key_file, settings, db):
    connection = stored("wh")
    with pytest.raises(InvalidToken):
        crypto.legacy_fernet(settings.SECRET_KEY).decrypt(connection.secrets_encrypted.encode())
    settings.SECRET_KEY = "another-secret-key-" * 3
    assert Connection.objects.get(name="wh").get_secrets() == {"password": "hunter2-long"}


def test_rotation_reencrypts_every_secret_and_drops_the_old_key(key_file, db):
    stored("a", "first-password")
    stored("b", "second-password")
    old_key = crypto.configured_keys()[0]
    old_token = Connection.objects.get(name="a").secrets_encrypted
    call_command("rotate_secrets_key")
    keys = crypto.configured_keys()
    assert len(keys) == 1 and keys != [old_key]
    assert Connection.objects.get(name="a").get_secrets() == {"password": "first-password"}
    assert Connection.objects.get(name="b").get_secrets() == {"password": "second-password"}
    with pytest.raises(crypto.SecretsUnreadable):
        crypto.decrypt_json(old_token)  # the old key is gone, with everything it encrypted
    call_command("rotate_secrets_key", "--keep-old")
    assert len(crypto.configured_keys()) == 2


def test_keys_from_the_environment_are_rotated_by_listing_the_new_one_first(settings, db):
    old, new = Fernet.generate_key().decode(), Fernet.generate_key().decode()
    settings.CONTROLPLANE_SECRETS_KEY = old
    stored("wh")
    settings.CONTROLPLANE_SECRETS_KEY = f"{new},{old}"
    with pytest.raises(CommandError, match="CONTROLPLANE_SECRETS_KEY"):
        call_command("rotate_secrets_key")
    call_command("rotate_secrets_key", "--reencrypt")
    settings.CONTROLPLANE_SECRETS_KEY = new
    assert Connection.objects.get(name="wh").get_secrets() == {"password": "hunter2-long"}
    settings.CONTROLPLANE_SECRETS_KEY = "short"
    with pytest.raises(crypto.SecretsKeyError, match="at least 32 characters"):
        crypto.encrypt_json({"password": "x"})


def test_secrets_stored_under_the_old_derived_key_are_reencrypted_by_the_migration(
    key_file, settings, db
):
    connection = stored("wh")
    legacy = crypto.legacy_fernet(settings.SECRET_KEY)
    Connection.objects.filter(pk=connection.pk).update(
        secrets_encrypted=legacy.encrypt(b'{"password": "from-before"}').decode()
    )
    with pytest.raises(crypto.SecretsUnreadable):
        Connection.objects.get(pk=connection.pk).get_secrets()
    migration = importlib.import_module("controlplane.connections.migrations.0002_secrets_own_key")
    migration.reencrypt(apps, None)
    assert Connection.objects.get(pk=connection.pk).get_secrets() == {"password": "from-before"}


def test_stored_secret_values_are_masked_in_every_error_text_shown(
    api, pipeline, django_user_model
):
    secret = "Zq8-unusual-Pa55"  # nothing about it looks like a credential to a pattern
    api.patch("/api/connections/warehouse/", {"secrets": {"password": secret}}, format="json")
    stored_pipeline = Pipeline.objects.get(name="orders")
    Failure.objects.create(
        pipeline=stored_pipeline,
        at=timezone.now(),
        cause="crashed",
        message=f"psycopg.OperationalError: connecting with {secret} to db.internal failed",
        decision="gave up",
    )
    shown = [
        api.get("/api/pipelines/orders/failures/").content.decode(),
        api.get("/api/pipelines/orders/").content.decode(),
    ]
    viewer = django_user_model.objects.create_user(username="v")
    set_role(viewer, VIEWER)
    client = Client()
    client.force_login(viewer)
    shown.append(client.get("/pipelines/orders/").content.decode())
    for text in shown:
        assert "db.internal failed" in text  # the message is there...
        assert secret not in text  # ...without the secret


def test_rotation_reencrypts_alert_channels_too(key_file, db):
    from controlplane.alerting.models import AlertChannel

    stored("a", "first-password")
    channel = AlertChannel(
        name="pager", kind="webhook", target="https://hooks.example.com/p?token=s3cret-token"
    )
    channel.set_signing_key("signing-key-value")
    channel.save()
    before = AlertChannel.objects.get(name="pager")
    old = (before.secret_encrypted, before.url_encrypted)
    assert all(old)
    call_command("rotate_secrets_key")
    after = AlertChannel.objects.get(name="pager")
    assert after.secret_encrypted not in old and after.url_encrypted not in old
    assert after.get_signing_key() == "signing-key-value"
    assert after.get_url() == "https://hooks.example.com/p?token=s3cret-token"
    for token in old:
        with pytest.raises(crypto.SecretsUnreadable):
            crypto.decrypt_json(token)  # the old key is gone: only the new tokens can be read
    assert Connection.objects.get(name="a").get_secrets() == {"password": "first-password"}
