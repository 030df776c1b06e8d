"""`Authorization: Token <key>` authentication against hashed API tokens."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from .models import ApiToken, digest

# Writing last_used_at on every request would turn reads into writes; once a minute is enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


class ApiTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate_credentials(self, key: str):
        token = (
            ApiToken.objects.active().select_related("user").filter(key_digest=digest(key)).first()
        )
        if token is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        if not token.user.is_active:
            raise exceptions.AuthenticationFailed("User inactive or deleted.")
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
