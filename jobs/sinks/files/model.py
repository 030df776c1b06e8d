"""The files sink's spec: the `sink` (or one of `sinks`) of kind "files". Plain Python, no
imports beyond the standard library: jobs.spec.model names it in the Sink union."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# Where a files sink keeps its dead letters, under its path (jobs.sinks.files.store), as the
# control plane tells operators (jobs.sinks.files.spec.dead_letters).
DEAD_LETTERS_DIR = "_cp_dead_letters"


@dataclass(frozen=True)
class FilesSink:
    """Rows staged per batch, rolled into finished files by size, age and inactivity
    (jobs.sinks.files.store): only finished files are visible to readers, every row once."""

    connection: str  # a files connection: the root every path is under
    path: str  # relative to the connection's root: where the finished files go
    format: Literal["parquet", "json", "avro"] = "parquet"
    # Output columns written as Hive-style directories (col=value/), in this order.
    partition_by: tuple[str, ...] = ()
    # The rolling policy: a file is finished when its rows reach the target size, when its
    # oldest row has waited max_file_age_seconds, or when no row came for inactivity_seconds.
    target_file_mb: int = 128
    max_file_age_seconds: float = 900.0
    inactivity_seconds: float = 300.0
    kind: Literal["files"] = "files"

    def connection_names(self) -> tuple[str, ...]:
        """The connections it writes through."""
        return (self.connection,)
