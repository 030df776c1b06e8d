"""`Authorization: Token <key>` authentication against hashed API tokens.

Each refused token is logged (controlplane.security: the reason and the client's address,
never the token) and counted per client address (`BadTokenThrottle`): past the limit the
answer is 429 instead of 401. A valid token is never limited by this.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone
from rest_framework import authentication, exceptions

from . import security
from .models import ApiToken, digest
from .throttles import BadTokenThrottle

# Writing last_used_at on every request would turn reads into writes; once a minute is enough.
_LAST_USED_RESOLUTION = timedelta(minutes=1)


class _Refused(exceptions.AuthenticationFailed):
    """AuthenticationFailed with what the security log should say about it."""

    def __init__(self, detail: str, reason: str, username: str | None = None):
        super().__init__(detail)
        self.reason = reason
        self.username = username


class ApiTokenAuthentication(authentication.TokenAuthentication):
    keyword = "Token"

    def authenticate(self, request):
        try:
            return super().authenticate(request)
        except exceptions.AuthenticationFailed as refused:
            wait = BadTokenThrottle().record_failure(request)
            security.api_token_refused(
                request,
                getattr(refused, "reason", "malformed header"),
                getattr(refused, "username", None),
                limited=wait is not None,
            )
            if wait is not None:
                raise exceptions.Throttled(wait=wait) from None
            raise

    def authenticate_credentials(self, key: str):
        token = (
            ApiToken.objects.active().select_related("user").filter(key_digest=digest(key)).first()
        )
        if token is None:
            raise _Refused("Invalid or revoked token.", "unknown or revoked token")
        if not token.user.is_active:
            raise _Refused(
                "User inactive or deleted.", "inactive user", username=token.user.get_username()
            )
        now = timezone.now()
        if token.last_used_at is None or now - token.last_used_at > _LAST_USED_RESOLUTION:
            ApiToken.objects.filter(pk=token.pk).update(last_used_at=now)
        return token.user, token
