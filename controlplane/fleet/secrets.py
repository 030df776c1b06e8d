"""Secrets in a fleet's files: never values, references the control plane reads (pure: the
environment, the prefix and the store's directory are passed in).

    {env: FLEET_SECRET_PG_PASSWORD}   the control plane's environment variable; its name must
                                      begin with the configured prefix, so that a file (which
                                      an editor writes) cannot name the control plane's own
                                      secrets (DATABASE_URL, the secret key) and send them to
                                      a server of its choosing
    {file: pg-password}               the file of that name in the secret store's directory
                                      (a mounted secret volume: /run/secrets, a Kubernetes
                                      Secret); a bare name, never a path, and never
                                      leading outside it

A value is never shown, logged or put in a plan: only whether it changed.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

MAX_BYTES = 64 * 1024
_ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_FILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
REFERENCE_HELP = "a reference: {env: NAME} or {file: NAME}; files never hold a secret's value"


@dataclass(frozen=True)
class Store:
    """Where references are read: `environ` (the control plane's environment), the names it
    may read (`prefix`), and the secret store's `directory` ("" for none)."""

    environ: Mapping[str, str]
    prefix: str
    directory: str = ""


class Unresolved(ValueError):
    """A reference that cannot be read, or is not one: the message says which and why (never
    a value)."""


def is_reference(value: Any) -> bool:
    return isinstance(value, dict) and len(value) == 1 and next(iter(value)) in ("env", "file")


def check(value: Any, store: Store) -> str:
    """Why `value` is no reference this store may read ("" when it is one)."""
    if not is_reference(value):
        return f"must be {REFERENCE_HELP}"
    ((how, name),) = value.items()
    if not isinstance(name, str):
        return f"{how}: must be a name"
    if how == "env":
        if not _ENV_NAME.fullmatch(name):
            return f"env: {name!r} is not an environment variable's name (A-Z, 0-9, _)"
        if not name.startswith(store.prefix):
            return (
                f"env: {name!r} does not begin with {store.prefix!r}: only such variables of"
                " the control plane's environment are readable from files"
                " (CONTROLPLANE_FLEET_SECRET_PREFIX)"
            )
        return ""
    if not store.directory:
        return "file: this control plane has no secret store (CONTROLPLANE_FLEET_SECRETS_DIR)"
    if not _FILE_NAME.fullmatch(name):
        return f"file: {name!r} is not a secret's name (letters, digits, '.', '_', '-')"
    return ""


def read(value: Any, store: Store) -> str:
    """The secret `value` references; raises Unresolved."""
    if problem := check(value, store):
        raise Unresolved(problem)
    ((how, name),) = value.items()
    if how == "env":
        found = store.environ.get(name)
        if found is None:
            raise Unresolved(f"env: {name} is not set in the control plane's environment")
        return found
    # A mounted secret volume's entries are symbolic links into its `..data/` directory
    # (Kubernetes): followed, as long as they end inside the store's directory.
    root = os.path.realpath(store.directory)
    path = os.path.realpath(os.path.join(root, name))
    if os.path.commonpath([root, path]) != root:
        raise Unresolved(f"file: {name!r} leads outside the secret store")
    try:
        # Non-blocking: a FIFO put there cannot hold the apply (its read finds nothing).
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise Unresolved(f"file: {name!r} is not in the secret store") from None
    except OSError as exc:
        raise Unresolved(f"file: {name!r} cannot be read ({exc.strerror})") from None
    with os.fdopen(fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise Unresolved(f"file: {name!r} is not a file")
        data = handle.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise Unresolved(f"file: {name!r} is over {MAX_BYTES:,} bytes")
    try:
        text = data.decode()
    except UnicodeDecodeError:
        raise Unresolved(f"file: {name!r} is not UTF-8 text") from None
    # One trailing line break is the file's, not the secret's (echo 'pw' > file).
    return text[:-1] if text.endswith("\n") else text


def fingerprint(values: Mapping[str, Any]) -> str:
    """A digest of secret values, to tell whether they changed (never shown; "" for none)."""
    if not values:
        return ""
    text = json.dumps(dict(values), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()
