"""API tokens for automation.

Only a SHA-256 digest of each token is stored: a database dump or an admin page never reveals a
usable credential. The token itself is shown once, when it is created.
"""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import models
from django.utils import timezone

TOKEN_PREFIX = "cpt_"  # noqa: S105 - a prefix, not a secret


def digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiTokenQuerySet(models.QuerySet):
    def active(self):
        return self.filter(revoked_at__isnull=True)


class ApiToken(models.Model):
    """A bearer credential for the REST API, belonging to one user."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, help_text="What the token is for, e.g. 'ci-deploy'.")
    key_digest = models.CharField(max_length=64, unique=True, editable=False)
    # The first characters, kept so an operator can tell tokens apart in lists.
    hint = models.CharField(max_length=12, editable=False)
    created_at = models.DateTimeField(default=timezone.now, editable=False)
    last_used_at = models.DateTimeField(null=True, blank=True, editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    objects = ApiTokenQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "name"],
                condition=models.Q(revoked_at__isnull=True),
                name="one_active_token_name_per_user",
            )
        ]

    def __str__(self) -> str:
        return f"{self.name} ({self.hint}…) for {self.user}"

    @classmethod
    def issue(cls, user, name: str) -> tuple[ApiToken, str]:
        """Create a token; returns the row and the only copy of the secret key."""
        key = TOKEN_PREFIX + secrets.token_urlsafe(32)
        token = cls.objects.create(user=user, name=name, key_digest=digest(key), hint=key[:10])
        return token, key
