"""The Kafka sink's spec: the `sink` (or one of `sinks`) of kind "kafka". Plain Python, no
imports beyond the standard library: jobs.spec.model names it in the Sink union."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass(frozen=True)
class KafkaSink:
    """Each Spark task writes its records in one Kafka transaction with its commit marker
    (jobs.sinks.kafka.client): exactly once for `read_committed` consumers."""

    connection: str
    topic: str
    # Spark SQL expressions over the output columns: the record key (none: no key), the value
    # (none: every output column, as a JSON object), and headers by name.
    key: str | None = None
    value: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    format: Literal["json"] = "json"
    # Records that do not parse, as they arrived (the canonical form names the default,
    # "<topic>.dead-letters"); the topic must exist, like `topic`.
    dead_letter_topic: str | None = None
    # How long a partition's transaction may stay open before the broker aborts it (a killed
    # writer's transaction holds `read_committed` readers back until its restart or this).
    transaction_timeout_seconds: int = 120
    kind: Literal["kafka"] = "kafka"

    def connection_names(self) -> tuple[str, ...]:
        """The connections it writes through."""
        return (self.connection,)
