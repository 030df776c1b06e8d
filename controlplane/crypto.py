"""Encryption at rest for connection secrets (Fernet: AES-128-CBC + HMAC-SHA256).

The key is CONTROLPLANE_SECRETS_KEY (any string; hashed to a Fernet key) or, by default, one
derived from SECRET_KEY. Changing the key makes stored secrets unreadable: they must be
entered again, which `SecretsUnreadable` says in so many words instead of a stack trace.
"""

from __future__ import annotations

import base64
import hashlib
import json
from functools import cache

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings


class SecretsUnreadable(RuntimeError):
    """Stored secrets were encrypted with another key."""


@cache
def _fernet(key_material: str) -> Fernet:
    digest = hashlib.sha256(b"controlplane-secrets:" + key_material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def _current() -> Fernet:
    return _fernet(settings.CONTROLPLANE_SECRETS_KEY or settings.SECRET_KEY)


def encrypt_json(value: dict) -> str:
    if not value:
        return ""
    return _current().encrypt(json.dumps(value, sort_keys=True).encode()).decode()


def decrypt_json(token: str) -> dict:
    if not token:
        return {}
    try:
        return json.loads(_current().decrypt(token.encode()))
    except InvalidToken:
        raise SecretsUnreadable(
            "stored secrets cannot be decrypted with the current key "
            "(CONTROLPLANE_SECRETS_KEY or SECRET_KEY changed); set them again"
        ) from None
