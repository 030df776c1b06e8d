"""Keeping secrets out of logs and error messages.

Connection secrets are encrypted at rest and never serialised; this is the last line of
defence for text that might carry one anyway (a driver's error message quoting a DSN, a
third-party library logging its configuration).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

MASK = "********"

_PATTERNS = [
    # scheme://user:password@host
    (re.compile(r"(?P<pre>[a-zA-Z][a-zA-Z0-9+.-]*://[^:/@\s]*:)[^@\s]+(?P<post>@)"), None),
    # password=..., sasl_password: '...', "ssl_password": "...", secret=..., token ...
    (
        re.compile(
            r"(?P<pre>\b[\w-]*(?:password|passwd|secret|token)[\w-]*\b['\"]?\s*[:=]\s*['\"]?)"
            r"[^'\"\s,;&}]+",
            re.IGNORECASE,
        ),
        None,
    ),
]


def redact(text: str, known_secrets: Iterable[str] = ()) -> str:
    """`text` with every known secret value, and anything shaped like a credential, masked."""
    for secret in sorted((s for s in known_secrets if s), key=len, reverse=True):
        text = text.replace(secret, MASK)
    for pattern, _ in _PATTERNS:
        text = pattern.sub(
            lambda m: f"{m.group('pre')}{MASK}{m.groupdict().get('post') or ''}", text
        )
    return text


class RedactSecretsFilter(logging.Filter):
    """Rewrites each record's message with credentials masked (installed on every handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a broken format string is not ours to fix here
            return True
        cleaned = redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        return True


def without_credentials(url: str) -> str:
    """`url` without its user info (`https://ci-token:TOKEN@git.example/x` is
    `https://git.example/x`): where a repository's address is kept and shown. An scp-like
    address (`git@git.example:x`) has no password and stays as it is."""
    from urllib.parse import urlsplit, urlunsplit

    try:
        parts = urlsplit(url)
    except ValueError:
        return redact(url)
    if not parts.scheme or "@" not in parts.netloc:
        return url
    return urlunsplit(parts._replace(netloc=parts.netloc.rsplit("@", 1)[1]))
