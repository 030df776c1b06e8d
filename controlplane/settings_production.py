"""The production profile: `DJANGO_SETTINGS_MODULE=controlplane.settings_production`, for
every process (web, Celery worker and beat, manage.py).

Everything of controlplane.settings, plus: HTTPS only (redirect, secure cookies, HSTS), and a
refusal to start without an explicit DJANGO_SECRET_KEY (no key generated into var/) and
DJANGO_ALLOWED_HOSTS, or with DJANGO_DEBUG on. `manage.py check --deploy --fail-level WARNING`
is clean under it (`./stack test` checks that). See docs/security.md.
"""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

from .env import env_bool, env_int, env_str
from .settings import *  # noqa: F403


def _refuse(problem: str) -> None:
    raise ImproperlyConfigured(f"production profile (controlplane.settings_production): {problem}")


_key = env_str("DJANGO_SECRET_KEY")
if not _key:
    _refuse("DJANGO_SECRET_KEY must be set (50 or more random characters)")
if len(_key) < 50 or len(set(_key)) < 5 or _key.startswith("django-insecure-"):
    _refuse("DJANGO_SECRET_KEY must be 50 or more random characters")
if not env_str("DJANGO_ALLOWED_HOSTS"):
    _refuse("DJANGO_ALLOWED_HOSTS must name the host names the control plane is served as")
if env_bool("DJANGO_DEBUG", False):
    _refuse("DJANGO_DEBUG must be off: debug pages show settings and stack traces")
DEBUG = False
# Local roots of files connections only where an admin says (no var/files default here).
CONTROLPLANE_FILES_DIR = env_str("CONTROLPLANE_FILES_DIR", None)

# HTTPS only. Behind a proxy that terminates TLS, set DJANGO_SECURE_PROXY_SSL_HEADER to the
# header it sets to "https" (X-Forwarded-Proto), or every request looks like plain HTTP and
# is redirected forever. The proxy must overwrite that header, never pass a client's on.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", True)
SESSION_COOKIE_SECURE = True
CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env_int("DJANGO_SECURE_HSTS_SECONDS", 31536000, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", True)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", True)
if _proxy_header := env_str("DJANGO_SECURE_PROXY_SSL_HEADER"):
    _name, _, _value = _proxy_header.partition("=")
    SECURE_PROXY_SSL_HEADER = (
        "HTTP_" + _name.strip().upper().replace("-", "_"),
        _value.strip() or "https",
    )
# A setting turned off on purpose is a decision, not an oversight: its deploy check is
# silenced (SSL redirect done by the proxy, HSTS set by the proxy or not wanted, ...).
SILENCED_SYSTEM_CHECKS = [
    *globals().get("SILENCED_SYSTEM_CHECKS", []),
    *(["security.W008"] if not SECURE_SSL_REDIRECT else []),
    *(["security.W004"] if not SECURE_HSTS_SECONDS else []),
    *(["security.W005"] if SECURE_HSTS_SECONDS and not SECURE_HSTS_INCLUDE_SUBDOMAINS else []),
    *(["security.W021"] if SECURE_HSTS_SECONDS and not SECURE_HSTS_PRELOAD else []),
]
