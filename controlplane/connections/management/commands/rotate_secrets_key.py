"""Rotate the key that encrypts connection secrets, re-encrypting every stored secret."""

from __future__ import annotations

from cryptography.fernet import Fernet
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane import crypto
from controlplane.connections.models import Connection


class Command(BaseCommand):
    help = (
        "With the key file (the default): add a new key, re-encrypt every connection's "
        "secrets with it, then drop the old keys (--keep-old keeps them). With keys from "
        "CONTROLPLANE_SECRETS_KEY: --reencrypt only re-encrypts with the first key listed "
        "(put the new key first, run this, then remove the old one)."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--keep-old", action="store_true", help="keep the old keys")
        parser.add_argument(
            "--reencrypt",
            action="store_true",
            help="only re-encrypt with the newest configured key",
        )

    def handle(self, *args, keep_old: bool, reencrypt: bool, **options) -> None:
        from_env = bool(settings.CONTROLPLANE_SECRETS_KEY)
        if from_env and not reencrypt:
            raise CommandError(
                "the keys come from CONTROLPLANE_SECRETS_KEY, which this command cannot "
                "change: put a new key first in it (comma-separated), restart, run "
                "`manage.py rotate_secrets_key --reencrypt`, then remove the old key"
            )
        old = crypto.configured_keys()
        if not reencrypt:
            new = Fernet.generate_key().decode()
            crypto.write_key_file(crypto.key_file(), [new, *old])
        count = self._reencrypt_all()
        if not reencrypt and not keep_old:
            crypto.write_key_file(crypto.key_file(), [new])
        where = "CONTROLPLANE_SECRETS_KEY" if from_env else str(crypto.key_file())
        self.stdout.write(f"re-encrypted the secrets of {count} connection(s); keys: {where}")

    @staticmethod
    def _reencrypt_all() -> int:
        count = 0
        with transaction.atomic():
            for connection in Connection.objects.select_for_update().exclude(secrets_encrypted=""):
                try:
                    token = crypto.rotate_token(connection.secrets_encrypted)
                except crypto.SecretsUnreadable as exc:
                    raise CommandError(
                        f"connection {connection.name!r}: {exc}; nothing was changed"
                    ) from None
                Connection.objects.filter(pk=connection.pk).update(secrets_encrypted=token)
                count += 1
        return count
