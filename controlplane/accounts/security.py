"""Security events: failed sign-ins, lockouts and refused API tokens, logged to
`controlplane.security`, and the client address they are attributed to.

What is logged: the user name tried, the client's address, where (the sign-in page, the admin,
the API) and why. Never a password or a token, not even part of one.
"""

from __future__ import annotations

import logging

from csp.constants import SELF, UNSAFE_INLINE
from csp.middleware import CSPMiddleware as BaseCSPMiddleware
from django.conf import settings

log = logging.getLogger("controlplane.security")


def client_ip(request) -> str | None:
    """The client's address: REMOTE_ADDR, or, behind CONTROLPLANE_PROXY_COUNT reverse proxies,
    the address the outermost of them saw (the proxies append to X-Forwarded-For, so the
    entries a client wrote itself are further left and never trusted)."""
    meta = getattr(request, "META", {})
    proxies = getattr(settings, "CONTROLPLANE_PROXY_COUNT", 0)
    if proxies:
        forwarded = [a.strip() for a in meta.get("HTTP_X_FORWARDED_FOR", "").split(",")]
        forwarded = [a for a in forwarded if a]
        if len(forwarded) >= proxies:
            return forwarded[-proxies]
    return meta.get("REMOTE_ADDR") or None


def _where(request) -> str:
    path = getattr(request, "path", "") or ""
    if path.startswith("/admin/"):
        return "admin"
    if path.startswith("/api/") or path == "/metrics":
        return "api"
    return "sign-in page"


def _name(value) -> str:
    # repr(): a user name with a newline in it cannot forge a second log line.
    return repr(str(value)[:150]) if value is not None else "(none)"


def login_failed(sender, credentials, request=None, **kwargs) -> None:
    """user_login_failed: Django has already masked the password in `credentials`; only the
    user name is used."""
    locked = bool(getattr(request, "axes_locked_out", False))
    log.warning(
        "sign-in failed: user %s from %s at %s%s",
        _name((credentials or {}).get("username")),
        client_ip(request) if request is not None else "(unknown)",
        _where(request) if request is not None else "(unknown)",
        " (locked out)" if locked else "",
    )


def locked_out(sender, request=None, username=None, ip_address=None, **kwargs) -> None:
    """axes' user_locked_out: the limit was reached (or a locked-out client tried again)."""
    log.warning(
        "sign-in locked out: user %s from %s at %s after repeated failures",
        _name(username),
        ip_address or "(unknown)",
        _where(request) if request is not None else "(unknown)",
    )


def logged_in(sender, request=None, user=None, **kwargs) -> None:
    if request is None or user is None:
        return
    log.info(
        "signed in: user %s from %s at %s",
        _name(user.get_username()),
        client_ip(request),
        _where(request),
    )


def api_token_refused(
    request, reason: str, username: str | None = None, *, limited: bool = False
) -> None:
    """A request with an `Authorization: Token` header that was not accepted (`limited`:
    answered 429, the client being over the limit of refused tokens)."""
    log.warning(
        "API token refused (%s)%s from %s: %s %s%s",
        reason,
        f" for user {_name(username)}" if username else "",
        client_ip(request),
        getattr(request, "method", "?"),
        _name(getattr(request, "path", "")),
        " -> 429, over the limit of refused tokens" if limited else "",
    )


class CSPMiddleware(BaseCSPMiddleware):
    """django-csp's middleware (CONTENT_SECURITY_POLICY), with one loosening, for the HTML of
    DRF's browsable API only: it has a few `style="float: right"` attributes and an inline
    <style> of syntax-highlighting rules, allowed there by `style-src-attr` and
    `style-src-elem` 'unsafe-inline' (styles only: scripts stay as strict). The dashboard and
    the admin get the policy as configured."""

    def get_policy_parts(self, request, response, report_only: bool = False):
        parts = super().get_policy_parts(request, response, report_only)
        content_type = response.get("Content-Type", "") if hasattr(response, "get") else ""
        if request.path_info.startswith("/api/") and content_type.startswith("text/html"):
            parts.update = {
                **(parts.update or {}),
                "style-src-attr": [UNSAFE_INLINE],
                "style-src-elem": [SELF, UNSAFE_INLINE],
            }
        return parts
