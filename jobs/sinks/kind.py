"""What a sink kind is: everything the rest of the product needs to know of one kind of sink,
in one record, registered in jobs.sinks.registry. The spec's parser, the job, the control
plane's launcher, dead letters, forms and preflight look a kind up by its name and never
branch on it.

Plain Python: the writer (which needs Spark) is imported only when a job asks for it."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class FormField:
    """One input of the browser's pipeline form for this kind's sink (shown when the form's
    sink kind is this one). `path` is the sink's field it edits."""

    name: str  # the input's name, unique in the form
    path: str  # the sink's field: "table", "headers"...
    label: str
    type: str = "text"  # text | number | select | list | json
    help: str = ""
    choices: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()


@dataclass(frozen=True)
class DeadLetters:
    """Where a sink keeps the records that did not parse (written with their batch)."""

    # "table": the dead-letter table of a Postgres connection (listed and redriven by the
    # control plane); "topic": records of a Kafka topic; "files": JSON Lines files in a
    # directory under a files connection's root.
    store: str
    connection: str  # the connection they are written through
    where: str = ""  # the topic, or the directory under the connection's root


@dataclass(frozen=True)
class SinkKind:
    name: str  # the spec's `kind`
    summary: str  # one line for people: what it writes and how (the form's help)
    model: type  # the spec's dataclass (jobs.sinks.<kind>.model)
    connection_kind: str  # the kind of connection it writes through
    # parse(errors, data, connections, source, transform, *, path) -> model | None: the
    # sink's JSON, each problem recorded as a FieldError naming its field.
    parse: Callable[..., Any]
    # What it writes within its connection: a table, a topic, a path (two sinks of one
    # pipeline may not write the same).
    target: Callable[[Any], str]
    # Where its dead letters go, from the stored (canonical) spec's sink.
    dead_letters: Callable[[Mapping[str, Any]], DeadLetters]
    # "module:Class" of its foreachBatch writer: Class(config, partitions=, index=).
    writer_path: str
    # check_update(errors, sink, path, shape): whether it can take update output (each batch
    # rewrites the groups it changed), shape: jobs.spec.streaming's of the transform, if known.
    check_update: Callable[..., None]
    # Output columns it names, as (its field, the column): an upsert's key, a write time...
    # checked against the transform's output where its SQL tells it.
    named_columns: Callable[[Any], tuple[tuple[str, str], ...]] = lambda sink: ()
    # Whether two of its targets in one connection overlap (beyond being equal).
    overlaps: Callable[[str, str], bool] | None = None
    form: tuple[FormField, ...] = ()
    # JSON Schema of its fields beyond their types, by field name (a function: it uses the
    # shared fragments of jobs.spec.schema, imported when the schema is built).
    schema: Callable[[], Mapping[str, Any]] = field(default=lambda: {})
    # Shapes whose fields depend on another's value (keyword arguments of jobs.spec.schema's
    # _variants), or None.
    schema_variants: Callable[[], Mapping[str, Any]] | None = None

    def writer(self) -> type:
        module, _, name = self.writer_path.partition(":")
        return getattr(importlib.import_module(module), name)
