"""Rotate the key that encrypts stored secrets, re-encrypting every one of them: each model
that lists its token columns in `ENCRYPTED_FIELDS` (connections, alert channels, ...), found
through Django's app registry so this command imports no app above its own."""

from __future__ import annotations

from cryptography.fernet import Fernet
from django.apps import apps
from django.conf import settings
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction

from controlplane import crypto


class Command(BaseCommand):
    help = (
        "With the key file (the default): add a new key, re-encrypt every stored "
        "secret with it, then drop the old keys (--keep-old keeps them). With keys from "
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
        self.stdout.write(f"re-encrypted {count} stored secret(s); keys: {where}")

    @staticmethod
    def _reencrypt_all() -> int:
        """Every token of every model with ENCRYPTED_FIELDS, in one transaction: a token that
        cannot be read changes nothing at all."""
        count = 0
        with transaction.atomic():
            for model in apps.get_models():
                fields = getattr(model, "ENCRYPTED_FIELDS", ())
                if not fields:
                    continue
                for row in model.objects.select_for_update().order_by("pk"):
                    changed = {}
                    for field in fields:
                        token = getattr(row, field)
                        if not token:
                            continue
                        try:
                            changed[field] = crypto.rotate_token(token)
                        except crypto.SecretsUnreadable as exc:
                            raise CommandError(
                                f"{model._meta.verbose_name} {str(row)!r} ({field}): {exc};"
                                " nothing was changed"
                            ) from None
                    if changed:
                        model.objects.filter(pk=row.pk).update(**changed)
                        count += len(changed)
        return count
