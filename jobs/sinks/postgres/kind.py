"""The postgres sink kind, as the registry lists it."""

from ..kind import SinkKind
from . import spec
from .model import PostgresSink

KIND = SinkKind(
    name="postgres",
    summary="postgres: a table, one transaction per batch",
    model=PostgresSink,
    connection_kind="postgres",
    parse=spec.parse,
    target=spec.target,
    dead_letters=spec.dead_letters,
    writer_path="jobs.sinks.postgres.writer:Writer",
    check_update=spec.check_update,
    named_columns=spec.named_columns,
    form=spec.FORM,
    schema=spec.schema,
    schema_variants=spec.schema_variants,
)
