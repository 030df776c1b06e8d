"""Sign-in lockout (django-axes) for the sign-in page and the admin: see docs/security.md.

- A user name is locked **at one client address** after CONTROLPLANE_LOGIN_FAILURE_LIMIT
  failures within the cool-off (AXES_LOCKOUT_PARAMETERS = username + IP): whoever guesses
  passwords is stopped, while the real user, elsewhere, can still sign in. Locking by user
  name alone would let anyone lock every colleague out from one address.
- An address is locked for every user name after CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT
  failures (all names together): one address trying one password against many users
  (password spraying) or guessing user names is stopped too. It is higher, since people
  behind one NAT share an address.
"""

from __future__ import annotations

import math

from axes.handlers.database import AxesDatabaseHandler
from axes.helpers import get_cool_off, get_failure_limit
from axes.models import AccessAttempt
from django.conf import settings
from django.db.models import Sum
from django.shortcuts import render


class LoginLockoutHandler(AxesDatabaseHandler):
    """axes' database handler, plus the per-address limit over all user names."""

    def get_failures(self, request, credentials: dict | None = None) -> int:
        failures = super().get_failures(request, credentials)
        ip_limit = getattr(settings, "CONTROLPLANE_LOGIN_IP_FAILURE_LIMIT", 0)
        ip_address = getattr(request, "axes_ip_address", None)
        if not ip_limit or not ip_address:
            return failures
        attempts = AccessAttempt.objects.filter(ip_address=ip_address)
        cool_off = get_cool_off(request)
        if cool_off is not None:
            attempts = attempts.filter(attempt_time__gte=request.axes_attempt_time - cool_off)
        from_address = attempts.aggregate(n=Sum("failures_since_start"))["n"] or 0
        if from_address >= ip_limit:
            # Reported as the user's own limit reached: axes then locks and says so.
            return max(failures, get_failure_limit(request, credentials))
        return failures


def lockout_response(request, original_response=None, credentials=None):
    """AXES_LOCKOUT_CALLABLE: a page saying what happened and for how long (429)."""
    cool_off = get_cool_off(request)
    minutes = math.ceil(cool_off.total_seconds() / 60) if cool_off else None
    response = render(
        request,
        "registration/locked_out.html",
        {"minutes": minutes, "admin": request.path.startswith("/admin/")},
        status=429,
    )
    if cool_off:
        response["Retry-After"] = str(math.ceil(cool_off.total_seconds()))
    return response
