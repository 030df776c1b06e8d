"""Create an API token for a user and print it (the only time it is ever shown)."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.db import transaction
from django.utils import timezone

from controlplane.accounts.models import ApiToken


class Command(BaseCommand):
    help = "Create an API token for USER and print it once. Tokens are stored hashed."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("--name", default="default", help="what the token is for")
        parser.add_argument(
            "--rotate",
            action="store_true",
            help="revoke the user's active token of the same name first",
        )
        parser.add_argument(
            "--if-missing",
            action="store_true",
            help="do nothing (and print nothing secret) if an active token of that name exists",
        )

    def handle(self, *args, username: str, name: str, rotate: bool, if_missing: bool, **_):
        User = get_user_model()
        try:
            user = User.objects.get(username=username)
        except User.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
        with transaction.atomic():
            existing = ApiToken.objects.active().select_for_update().filter(user=user, name=name)
            if existing.exists():
                if if_missing:
                    self.stdout.write(f"token {name!r} for {username} already exists")
                    return
                if not rotate:
                    raise CommandError(
                        f"{username} already has an active token named {name!r}; "
                        "pass --rotate to replace it or --name to add another"
                    )
                existing.update(revoked_at=timezone.now())
            _, key = ApiToken.issue(user, name)
        self.stdout.write(key)
