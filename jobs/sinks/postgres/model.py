"""The Postgres sink's spec: the `sink` (or one of `sinks`) of kind "postgres". Plain Python, no
imports beyond the standard library: jobs.spec.model names it in the Sink union."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class PostgresSink:
    """Each micro-batch is written in one transaction with its commit marker."""

    connection: str
    table: str
    mode: Literal["append", "upsert"] = "append"
    key: tuple[str, ...] = ()
    kind: Literal["postgres"] = "postgres"

    def connection_names(self) -> tuple[str, ...]:
        """The connections it writes through."""
        return (self.connection,)
