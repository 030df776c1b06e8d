"""What a kind of connection is (ConnectionKind): listed in jobs.connections.CONNECTION_KINDS.
A module of its own, importing nothing, so that a sink kind's package can define the kind of
connection it writes through (jobs.sinks.cassandra.connection) without importing
jobs.connections, which lists it."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ConnectionKind:
    """One kind of connection: its settings and secrets, how they are checked, and what
    identifies (and names) the far end."""

    name: str
    settings: frozenset[str]
    secrets: frozenset[str]
    # (errors, settings, secrets, policy) -> (clean settings, clean secrets)
    validate: Callable[..., tuple[dict[str, Any], dict[str, str]]]
    # (stored settings, a lenient policy) -> what its secrets belong to: a change of it drops
    # them (a password follows its host)
    endpoint: Callable[[Mapping[str, Any], Any], tuple]
    # stored settings -> one line naming what it reaches (lists, the admin)
    target: Callable[[Mapping[str, Any]], str]
    # Whether pipelines write directories under it (locked and checked against each other).
    holds_directories: bool = False
