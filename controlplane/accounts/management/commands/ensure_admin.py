"""Create the first administrator and an API token, once. Safe to run again: it then says so."""

from __future__ import annotations

import os
import secrets

from django.contrib.auth import get_user_model
from django.core.management import call_command
from django.core.management.base import BaseCommand

from controlplane.accounts.models import ApiToken


class Command(BaseCommand):
    help = "Create the admin user and its API token if they do not exist; print them once."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--username", default=os.environ.get("CONTROLPLANE_ADMIN_USER", "admin")
        )

    def handle(self, *args, username: str, **_):
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is None:
            password = os.environ.get("CONTROLPLANE_ADMIN_PASSWORD") or secrets.token_urlsafe(12)
            user = User.objects.create_superuser(username=username, email="", password=password)
            self.stdout.write(f"  Admin user:     {username}")
            self.stdout.write(f"  Password:       {password}   (shown once)")
        else:
            self.stdout.write(
                f"  Admin user:     {username} (exists; `./manage.py changepassword {username}`)"
            )
        if ApiToken.objects.active().filter(user=user, name="default").exists():
            self.stdout.write(
                "  API token:      exists (shown only when created; new one: "
                f"`./manage.py create_api_token {username} --rotate`)"
            )
        else:
            self.stdout.write("  API token:      ", ending="")
            call_command("create_api_token", username, name="default", stdout=self.stdout)
            self.stdout.write(
                "                  (shown once; send it as `Authorization: Token <key>`)"
            )
