"""The kafka sink kind, as the registry lists it."""

from ..kind import SinkKind
from . import spec
from .model import KafkaSink

KIND = SinkKind(
    name="kafka",
    summary="kafka: a topic, Kafka transactions",
    model=KafkaSink,
    connection_kind="kafka",
    parse=spec.parse,
    target=spec.target,
    dead_letters=spec.dead_letters,
    writer_path="jobs.sinks.kafka.writer:Writer",
    check_update=spec.check_update,
    form=spec.FORM,
    schema=spec.schema,
)
