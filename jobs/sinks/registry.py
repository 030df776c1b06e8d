"""The sink kinds: the one place that lists them. Everything else (the spec's parser and JSON
Schema, the job's writers, the control plane's launcher, dead letters, forms and preflight)
looks a kind up here by its name.

Adding a kind: a package jobs/sinks/<kind>/ (model.py, spec.py, kind.py, its writer and store)
and one line below."""

from __future__ import annotations

from typing import Any, Union

from .cassandra.kind import KIND as CASSANDRA
from .files.kind import KIND as FILES
from .kafka.kind import KIND as KAFKA
from .kind import SinkKind
from .postgres.kind import KIND as POSTGRES

KINDS: dict[str, SinkKind] = {
    POSTGRES.name: POSTGRES,
    KAFKA.name: KAFKA,
    FILES.name: FILES,
    CASSANDRA.name: CASSANDRA,
}
# What a sink without a `kind` is.
DEFAULT = POSTGRES.name


def names() -> tuple[str, ...]:
    return tuple(KINDS)


def kind(name: str) -> SinkKind:
    """The kind named `name` (KeyError: not a kind)."""
    return KINDS[name]


def of(sink: Any) -> SinkKind:
    """The kind of a sink: a spec's dataclass, or its JSON (a mapping, `kind` defaulting)."""
    name = sink.get("kind", DEFAULT) if isinstance(sink, dict) else sink.kind
    return KINDS[name]


def sink_union() -> Any:
    """The type of a spec's sink: the union of the kinds' models (jobs.spec.model.Sink)."""
    return Union[tuple(k.model for k in KINDS.values())]  # noqa: UP007 (built at run time)


def connection_kinds() -> tuple[str, ...]:
    """The kinds of connection sinks write through, each once."""
    return tuple(dict.fromkeys(k.connection_kind for k in KINDS.values()))
