"""A limit on failed API token authentications per client address.

Counted by `ApiTokenAuthentication` on each refused `Authorization: Token` header; requests
with a valid token are neither counted nor limited, nor is any other authentication (the
drivers' RunToken, sessions). Past the limit (REST_FRAMEWORK's DEFAULT_THROTTLE_RATES
"bad_token", from CONTROLPLANE_API_BAD_TOKEN_RATE) a refused token gets 429 with Retry-After
instead of 401, and a client that keeps trying stays limited: attempts made while limited
count too.
"""

from __future__ import annotations

from django.core.cache import caches
from rest_framework.settings import api_settings
from rest_framework.throttling import SimpleRateThrottle

from .security import client_ip

CACHE_ALIAS = "security"


class BadTokenThrottle(SimpleRateThrottle):
    scope = "bad_token"

    @property
    def cache(self):
        return caches[CACHE_ALIAS]

    def get_rate(self) -> str | None:
        # Read at each use, not at import: settings overridden in tests apply.
        return api_settings.DEFAULT_THROTTLE_RATES.get(self.scope)

    def get_cache_key(self, request, view) -> str | None:
        ip = client_ip(request)
        return self.cache_format % {"scope": self.scope, "ident": ip} if ip else None

    def record_failure(self, request) -> float | None:
        """Count one refused token from this client. None while under the limit; past it,
        the seconds until the client may try again."""
        if self.allow_request(request, None):
            return None
        wait = self.wait() or float(self.duration)
        # Count the refused attempt as well (allow_request does not), keeping only as many
        # timestamps as the limit needs.
        self.history.insert(0, self.now)
        del self.history[self.num_requests :]
        self.cache.set(self.key, self.history, self.duration)
        return wait
