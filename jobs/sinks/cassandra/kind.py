"""The cassandra sink kind, as the registry lists it."""

from ..kind import SinkKind
from . import spec
from .model import CassandraSink

KIND = SinkKind(
    name="cassandra",
    summary="cassandra: a table, idempotent upserts stamped with the records' position",
    model=CassandraSink,
    connection_kind="cassandra",
    parse=spec.parse,
    target=spec.target,
    dead_letters=spec.dead_letters,
    writer_path="jobs.sinks.cassandra.writer:Writer",
    check_update=spec.check_update,
    named_columns=spec.named_columns,
    form=spec.FORM,
    schema=spec.schema,
)
