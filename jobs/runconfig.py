"""What a job is given: the run configuration the control plane writes into the run directory
(0600), secrets included."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .files import write_private
from .spec import PipelineSpec, parse_spec
from .storage import Storage, StorageSettings, storage_for


@dataclass(frozen=True)
class RunConfig:
    """Everything a job needs, written by the control plane into the run directory (0600)."""

    pipeline: str
    spec: PipelineSpec
    kafka: dict[str, Any]  # kafka-python client arguments, secrets included
    postgres: dict[str, Any]  # psycopg.connect() arguments, password included
    checkpoint: str
    run_dir: str
    # Where to send heartbeats and progress: url, run_id, token, heartbeat_seconds.
    control_plane: dict[str, Any] | None = None
    # The input partitions of a spec that names none (source.min_partitions). None: the
    # application's parallelism (a dedicated driver's cores, each a task of every batch). A
    # shared application's members take 1, the topic's own partitions: there the many
    # queries are the parallelism, and splitting each small batch into one task per slot
    # multiplies its fixed cost (a task, a Postgres transaction and marker) by the slots.
    default_partitions: int | None = None
    # The sink's Kafka client arguments (a Kafka sink), secrets included.
    sink_kafka: dict[str, Any] | None = None
    # With several sinks: per sink, {"postgres": psycopg arguments} or {"kafka": client
    # arguments}, in the spec's order (empty: the one sink's, in postgres / sink_kafka).
    sink_configs: tuple[dict[str, Any], ...] = ()
    # Where the checkpoint lives and how to reach that store (jobs.storage.StorageSettings.
    # for_driver: keys included); None: a local path.
    storage: dict[str, Any] | None = None
    # The source's schema registry's client arguments (jobs.registry.connection.
    # client_arguments), secret included; None: the source has none.
    registry: dict[str, Any] | None = None

    @property
    def store(self) -> Storage:
        """The store the checkpoint is on, for the driver's own reads and writes of it."""
        return storage_for(self.checkpoint, StorageSettings.from_driver_config(self.storage))

    def sink_config(self, index: int) -> dict[str, Any]:
        if self.sink_configs:
            return self.sink_configs[index]
        return {"postgres": self.postgres, "kafka": self.sink_kafka}

    @classmethod
    def load(cls, path: str | Path) -> RunConfig:
        data = json.loads(Path(path).read_text())
        return cls(
            pipeline=data["pipeline"],
            spec=parse_spec(data["spec"]),
            kafka=data["kafka"],
            postgres=data["postgres"],
            checkpoint=data["checkpoint"],
            run_dir=data.get("run_dir") or str(Path(path).parent),
            control_plane=data.get("control_plane"),
            sink_kafka=data.get("sink_kafka"),
            sink_configs=tuple(data.get("sink_configs") or ()),
            storage=data.get("storage"),
            registry=data.get("registry"),
        )

    def kafka_config_file(self) -> str:
        """The client config for the source, in a file only this user can read."""
        path = Path(self.run_dir) / "kafka-client.json"
        write_private(path, json.dumps(self.kafka))
        return str(path)
