"""Give a user one of the roles (viewer, operator, editor, admin), or none."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from controlplane.accounts.roles import ROLES, set_role


class Command(BaseCommand):
    help = "Set USER's role: viewer, operator, editor or admin ('none' removes it)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("username")
        parser.add_argument("role", choices=[*ROLES, "none"])
        parser.add_argument("--create", action="store_true", help="create the user if missing")

    def handle(self, *args, username: str, role: str, create: bool, **_):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            if not create:
                raise CommandError(f"no user named {username!r} (pass --create to add one)")
            user = User.objects.create_user(username=username)
            user.set_unusable_password()
            user.save()
        set_role(user, None if role == "none" else role)
        self.stdout.write(f"{username}: {role}")
