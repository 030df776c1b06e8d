"""The files sink kind, as the registry lists it."""

from ..kind import SinkKind
from . import spec
from .model import FilesSink

KIND = SinkKind(
    name="files",
    summary="files: Parquet, JSON or Avro files under a directory, only finished files visible",
    model=FilesSink,
    connection_kind="files",
    parse=spec.parse,
    target=spec.target,
    dead_letters=spec.dead_letters,
    writer_path="jobs.sinks.files.writer:Writer",
    check_update=spec.check_update,
    overlaps=spec.overlaps,
    form=spec.FORM,
    schema=spec.schema,
)
