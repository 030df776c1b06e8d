"""Encryption at rest for connection secrets (Fernet: AES-128-CBC + HMAC-SHA256).

The keys are their own secret, never derived from Django's SECRET_KEY (a leaked SECRET_KEY
must not open every stored password):

- `CONTROLPLANE_SECRETS_KEY`: one or more keys, comma-separated, newest first; each a Fernet
  key (`Fernet.generate_key()`) or any string of 32+ characters (hashed to one); or else
- the key file `CONTROLPLANE_SECRETS_KEY_FILE` (default `var/secrets.key`): one key a line,
  newest first, generated on first use with mode 0600.

The newest key encrypts; every listed key decrypts, so keys can be rotated without downtime
(`manage.py rotate_secrets_key`). The file is re-read when it changes, so a rotation reaches
running processes without a restart. A secret that no key opens raises `SecretsUnreadable`
with a message saying what to do, never a stack trace.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import os
import threading
from functools import cache
from pathlib import Path

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from django.conf import settings


class SecretsUnreadable(RuntimeError):
    """Stored secrets were encrypted with a key that is not configured."""


class SecretsKeyError(RuntimeError):
    """The configured keys cannot be used (a clear message for the operator)."""


@cache
def fernet_for(material: str) -> Fernet:
    """A Fernet for one configured key: a Fernet key as it is, any other string hashed."""
    try:
        if len(base64.urlsafe_b64decode(material.encode())) == 32:
            return Fernet(material.encode())
    except (binascii.Error, ValueError):
        pass
    if len(material) < 32:
        raise SecretsKeyError(
            "a secrets key must be a Fernet key or at least 32 characters long "
            "(make one with: python -c 'from cryptography.fernet import Fernet; "
            "print(Fernet.generate_key().decode())')"
        )
    digest = hashlib.sha256(b"controlplane-secrets:" + material.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


def legacy_fernet(secret_key: str) -> Fernet:
    """The key earlier versions derived from SECRET_KEY (only to re-encrypt old rows)."""
    digest = hashlib.sha256(b"controlplane-secrets:" + secret_key.encode()).digest()
    return Fernet(base64.urlsafe_b64encode(digest))


_file_lock = threading.Lock()
_file_cache: dict[str, tuple[tuple[int, int], list[str]]] = {}


def key_file() -> Path:
    return Path(settings.CONTROLPLANE_SECRETS_KEY_FILE)


def configured_keys() -> list[str]:
    """The key material, newest first: from the environment, or from the key file (made
    on first use)."""
    if settings.CONTROLPLANE_SECRETS_KEY:
        return [k.strip() for k in settings.CONTROLPLANE_SECRETS_KEY.split(",") if k.strip()]
    path = key_file()
    with _file_lock:
        if not path.exists():
            write_key_file(path, [Fernet.generate_key().decode()])
        stat = path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        cached = _file_cache.get(str(path))
        if cached and cached[0] == stamp:
            return cached[1]
        keys = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not keys:
            raise SecretsKeyError(f"the secrets key file {path} holds no key")
        _file_cache[str(path)] = (stamp, keys)
        return keys


def write_key_file(path: Path, keys: list[str]) -> None:
    """Write the keys (newest first) atomically, readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write("".join(f"{k}\n" for k in keys))
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def current() -> MultiFernet:
    return MultiFernet([fernet_for(k) for k in configured_keys()])


def encrypt_json(value: dict) -> str:
    if not value:
        return ""
    return current().encrypt(json.dumps(value, sort_keys=True).encode()).decode()


def decrypt_json(token: str) -> dict:
    if not token:
        return {}
    try:
        return json.loads(current().decrypt(token.encode()))
    except InvalidToken:
        raise SecretsUnreadable(
            "stored secrets cannot be decrypted with the configured keys "
            "(CONTROLPLANE_SECRETS_KEY or its key file changed); set them again, or put "
            "the old key back after the new one"
        ) from None


def rotate_token(token: str) -> str:
    """The same secret, encrypted with the newest key (MultiFernet.rotate)."""
    if not token:
        return token
    try:
        return current().rotate(token.encode()).decode()
    except InvalidToken:
        raise SecretsUnreadable(
            "a stored secret cannot be decrypted with any configured key"
        ) from None
