"""Builders for test data."""

from __future__ import annotations


def valid_spec(**overrides) -> dict:
    """A spec that passes validation against the `events`/`warehouse` connections."""
    spec = {
        "source": {
            "kind": "kafka",
            "connection": "events",
            "topics": ["orders"],
            "format": "json",
            "schema": "id STRING, amount DOUBLE, ts TIMESTAMP",
            "starting_offsets": "earliest",
            "max_records_per_batch": 50000,
        },
        "transform": {"sql": "SELECT id, amount * 2 AS amount, ts FROM source WHERE amount > 0"},
        "sink": {
            "kind": "postgres",
            "connection": "warehouse",
            "table": "orders",
            "mode": "upsert",
            "key": ["id"],
        },
        "trigger": {"interval_seconds": 5},
        "restart_policy": {"kind": "fixed-delay", "attempts": 3, "delay_seconds": 10},
    }
    for key, value in overrides.items():
        spec[key] = value
    return spec


def files_spec(path: str = "orders/clean", **sink) -> dict:
    """valid_spec() writing files under `path` of the `lake` connection instead of Postgres."""
    return valid_spec(sink={"kind": "files", "connection": "lake", "path": path, **sink})
