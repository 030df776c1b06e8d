"""The schema-registry kind of connection: a registry speaking Confluent's REST API, at a URL,
with basic (user and password) or bearer (a token) authentication or none, TLS trust and a
client certificate from the certificate directory. The password and the token are secrets:
write-only, dropped when the URL or the user changes.

What an editor can reach through one: the registry's API at that URL, as its credentials
allow: schemas are read (by id, by subject and version), a sink's schema is registered under
its subject, and compatibility is asked. Nothing else is sent. The URL may not carry a user,
a query or a fragment; redirects are never followed (a credential goes to the URL it was
entered for only); the control plane also refuses URLs at its own services (its API, its
database, its broker: controlplane.connections.policy)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from ..connection_kind import ConnectionKind
from . import DEFAULT_WAIT_SECONDS

if TYPE_CHECKING:
    from ..connections import ConnectionPolicy
    from ..spec.fields import FieldError

NAME = "schema-registry"
SETTINGS = frozenset(
    {
        "url",
        "auth",
        "username",
        "ssl_cafile",
        "ssl_certfile",
        "ssl_keyfile",
        "timeout_seconds",
        "wait_seconds",
    }
)
SECRETS = frozenset({"password", "token"})
AUTH = ("none", "basic", "bearer")
DEFAULT_TIMEOUT_SECONDS = 10.0
MAX_WAIT_SECONDS = 600.0
MAX_URL = 2000
_PATH_RE = re.compile(r"^[A-Za-z0-9._~/%-]*$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._-]+$")
_IPV6_RE = re.compile(r"^[0-9a-fA-F:.]+$")
# What a password or a token belongs to: where it is sent, and as whom.
ENDPOINT = ("url", "auth", "username", "ssl_cafile", "ssl_certfile", "ssl_keyfile")


def url_problem(url: str) -> str | None:
    """Why `url` is not a registry's base URL, or None."""
    if len(url) > MAX_URL:
        return f"at most {MAX_URL} characters"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        return f"is not a URL: {exc}"
    if parts.scheme not in ("http", "https"):
        return "must be an http:// or https:// URL"
    host = parts.hostname or ""
    if not (_HOST_RE.fullmatch(host) or (":" in host and _IPV6_RE.fullmatch(host))):
        return "must name a host"
    if port == 0:
        return "its port must be 1-65535"
    if parts.username is not None or parts.password is not None:
        return "may not carry a user or password: give them as username and password"
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "may not have a query or a fragment"
    segments = parts.path.split("/")
    if not _PATH_RE.fullmatch(parts.path) or "." in segments or ".." in segments:
        return "its path may hold letters, digits and . _ ~ - / % only, and no . or .. segment"
    return None


def validate(
    errors: list[FieldError], data: Any, secrets: Any, policy: ConnectionPolicy
) -> tuple[dict[str, Any], dict[str, str]]:
    from ..connections import secrets_section, tls_files
    from ..spec.fields import Section

    s = Section(errors, "settings", data, set(SETTINGS))
    clean: dict[str, Any] = {}
    url = s.string("url")
    if url is not None:
        if problem := url_problem(url):
            s.error("url", problem)
        else:
            clean["url"] = url.rstrip("/")
    auth = s.string("auth", "none", choices=AUTH)
    clean["auth"] = auth if auth in AUTH else "none"
    username = s.string("username", None)
    if username is not None and auth != "basic":
        s.error("username", "applies with auth: basic only")
    elif username is not None:
        clean["username"] = username
    elif auth == "basic":
        s.error("username", "is required with auth: basic")
    https = (url or "").startswith("https://")
    tls_files(s, clean, policy, None if https else "applies to an https:// URL only")
    if ("ssl_certfile" in clean) != ("ssl_keyfile" in clean):
        s.error("ssl_keyfile", "ssl_certfile and ssl_keyfile go together (a client certificate)")
    timeout = s.number("timeout_seconds", None, minimum=0.5, maximum=120)
    if timeout is not None:
        clean["timeout_seconds"] = float(timeout)
    wait = s.number("wait_seconds", None, maximum=MAX_WAIT_SECONDS)
    if wait is not None:
        clean["wait_seconds"] = float(wait)
    clean_secrets = secrets_section(errors, secrets, set(SECRETS))
    wanted = {"basic": "password", "bearer": "token"}.get(clean["auth"])
    for name in sorted(clean_secrets):
        if name != wanted:
            errors.append(
                _field_error(f"secrets.{name}", f"is not used with auth: {clean['auth']}")
            )
    return clean, clean_secrets


def _field_error(field: str, message: str):
    from ..spec.fields import FieldError

    return FieldError(field, message)


def endpoint(settings: Mapping[str, Any], policy: Any = None) -> tuple:
    """Where the password or token is sent, and as whom."""
    return tuple(settings.get(name) for name in ENDPOINT)


def target(settings: Mapping[str, Any]) -> str:
    return str(settings.get("url") or "")


KIND = ConnectionKind(NAME, SETTINGS, SECRETS, validate, endpoint, target)


def client_arguments(settings: Mapping[str, Any], secrets: Mapping[str, str]) -> dict[str, Any]:
    """What a driver (the Python client and the executors' JVM decoder) is given to reach the
    registry, its secret included (the run configuration is 0600)."""
    return {
        "url": settings.get("url"),
        "auth": settings.get("auth", "none"),
        "username": settings.get("username"),
        "password": secrets.get("password"),
        "token": secrets.get("token"),
        "ca_file": settings.get("ssl_cafile"),
        "cert_file": settings.get("ssl_certfile"),
        "key_file": settings.get("ssl_keyfile"),
        "timeout_seconds": settings.get("timeout_seconds", DEFAULT_TIMEOUT_SECONDS),
        "wait_seconds": settings.get("wait_seconds", DEFAULT_WAIT_SECONDS),
    }
