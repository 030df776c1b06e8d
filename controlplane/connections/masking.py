"""Masking stored secret values out of text shown to people.

A driver's error output, a failure message or a Kafka error may quote a password (a DSN in a
stack trace, a client library printing its configuration). Pattern-based redaction
(`controlplane.redaction`) catches what looks like a credential; this adds every secret value
actually stored in a connection, wherever it appears and whatever surrounds it.
"""

from __future__ import annotations

import threading

from django.db.models import Count, Max

from controlplane.crypto import SecretsUnreadable
from controlplane.redaction import redact

from .models import Connection

_lock = threading.Lock()
_cache: dict[str, object] = {"stamp": None, "values": ()}

# Shorter values would mask ordinary words and digits all over a message.
MIN_LENGTH = 4


def known_secrets() -> tuple[str, ...]:
    """Every stored secret value (decrypted once per change of the connections table)."""
    stamp = tuple(Connection.objects.aggregate(n=Count("id"), at=Max("updated_at")).values())
    with _lock:
        if _cache["stamp"] == stamp:
            return _cache["values"]  # type: ignore[return-value]
    values: set[str] = set()
    for connection in Connection.objects.exclude(secrets_encrypted="").only(
        "name", "kind", "secrets_encrypted"
    ):
        try:
            values.update(v for v in connection.get_secrets().values() if len(v) >= MIN_LENGTH)
        except SecretsUnreadable:
            continue
    ordered = tuple(sorted(values, key=len, reverse=True))
    with _lock:
        _cache.update(stamp=stamp, values=ordered)
    return ordered


def mask(text: str | None, secrets: tuple[str, ...] | None = None) -> str:
    """`text` with every stored secret value and anything shaped like a credential masked.
    `secrets`: known_secrets() fetched once by a caller masking many texts."""
    if not text:
        return text or ""
    return redact(text, known_secrets() if secrets is None else secrets)
