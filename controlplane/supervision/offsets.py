"""A stopped pipeline's Kafka offsets: reading what its checkpoint committed, and resetting
them (Kafka Connect's offsets API, KIP-875, for Spark): to the earliest or latest offsets, to
a time, or to explicit offsets per partition. A reset resolves the target to explicit
offsets now (a time through Kafka's offsets-for-times), keeps the current checkpoint as a
restore point (`restore_points`) and makes the next run start a new checkpoint at those
offsets. Refused while the pipeline is wanted running or has a driver."""

from __future__ import annotations

from datetime import datetime

from django.db import transaction

from controlplane.definitions import audit, checkpoints
from controlplane.definitions.models import Pipeline, RestorePointKind
from jobs.connections import kafka_client_config
from jobs.kafka.metadata import log_bounds, metadata_consumer
from jobs.kafka.offsets import nest
from jobs.storage import join

from .restore_points import Refused, ensure_at_rest, set_aside

__all__ = ["BadTarget", "Refused", "committed", "reset", "start_offsets_for_launch"]


class BadTarget(ValueError):
    """What to reset to is not understood (answered with 400 naming `to`)."""


def committed(pipeline: Pipeline) -> dict:
    """What the checkpoint committed (next offset to read, per partition), and any reset
    waiting for the next run."""
    start_offsets_for_launch(pipeline)  # a reset its checkpoint holds now is done
    pipeline.refresh_from_db(fields=["offsets_reset"])
    try:
        checkpoint = checkpoints.read(pipeline, history=1, sizes=False)
    except OSError as exc:
        raise Refused(f"the checkpoint could not be read: {exc}") from None
    last = checkpoint.last_committed if checkpoint else None
    return {
        "committed": nest(checkpoint.committed_offsets()) if last else {},
        "last_batch_id": last.batch_id if last else None,
        "pending_reset": pipeline.offsets_reset,
    }


def resolve(pipeline: Pipeline, to) -> dict[str, dict[str, int]]:
    """The target as explicit offsets for every partition of the pipeline's topics."""
    from kafka.errors import KafkaError

    try:
        return _resolve(pipeline, to)
    except (KafkaError, RuntimeError) as exc:  # SaslLoginError is a RuntimeError
        raise Refused(f"the source cluster did not answer: {exc}") from None


def _resolve(pipeline: Pipeline, to) -> dict[str, dict[str, int]]:
    from kafka import TopicPartition

    source = pipeline.spec["source"]
    connection = pipeline.connections.get(name=source["connection"])
    consumer = metadata_consumer(
        {**kafka_client_config(connection.settings, connection.get_secrets()),
         "request_timeout_ms": 10_000}
    )  # fmt: skip
    try:
        partitions = [
            (topic, n)
            for topic in source["topics"]
            for n in sorted(consumer.partitions_for_topic(topic) or ())
        ]
        if not partitions:
            raise Refused("its topics have no partitions (do they exist?)")
        earliest, ends = log_bounds(consumer, partitions)
        if to == "earliest":
            return nest(earliest)
        if to == "latest":
            return nest(ends)
        if isinstance(to, dict) and "timestamp" in to:
            at = _timestamp_ms(to["timestamp"])
            found = consumer.offsets_for_times({TopicPartition(t, n): at for t, n in partitions})
            return nest(
                {
                    (t, n): (
                        hit.offset if (hit := found.get(TopicPartition(t, n))) else ends[(t, n)]
                    )
                    for t, n in partitions
                }
            )
        if isinstance(to, dict) and "offsets" in to:
            return nest(_explicit(to["offsets"], partitions, earliest, ends))
        raise BadTarget(FORMS)
    finally:
        consumer.close()


FORMS = (
    'must be "earliest", "latest", {"timestamp": "<ISO 8601 time>"} or'
    ' {"offsets": {"<topic>": {"<partition>": <offset>}}}'
)


def check_target(to) -> None:
    """Raises BadTarget unless `to` has one of the forms (before anything is asked of Kafka)."""
    if to in ("earliest", "latest"):
        return
    if isinstance(to, dict) and set(to) == {"timestamp"}:
        _timestamp_ms(to["timestamp"])
        return
    if isinstance(to, dict) and set(to) == {"offsets"} and isinstance(to["offsets"], dict):
        return
    raise BadTarget(FORMS)


def _timestamp_ms(value) -> int:
    try:
        at = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
    except ValueError:
        raise BadTarget(f"timestamp {value!r} is not an ISO 8601 time") from None
    if at.tzinfo is None:
        raise BadTarget(f"timestamp {value!r} has no time zone (add Z or +00:00)")
    return int(at.timestamp() * 1000)


def _explicit(given, partitions, earliest, ends) -> dict[tuple[str, int], int]:
    if not isinstance(given, dict):
        raise BadTarget("offsets must be {topic: {partition: offset}}")
    known = set(partitions)
    out = {}
    for topic, parts in given.items():
        if not isinstance(parts, dict):
            raise BadTarget(f"offsets.{topic} must be {{partition: offset}}")
        for partition, offset in parts.items():
            try:
                key = (topic, int(partition))
            except ValueError:
                raise BadTarget(f"offsets.{topic}.{partition} is not a partition number") from None
            if key not in known:
                raise BadTarget(
                    f"offsets.{topic}.{partition}: the pipeline reads no such partition"
                )
            if isinstance(offset, bool) or not isinstance(offset, int):
                raise BadTarget(f"offsets.{topic}.{partition} must be a whole number")
            if not earliest[key] <= offset <= ends[key]:
                raise BadTarget(
                    f"offsets.{topic}.{partition}: {offset} is outside the log"
                    f" ({earliest[key]} to {ends[key]})"
                )
            out[key] = offset
    # Partitions not named keep what the checkpoint committed, else start at the earliest.
    return out


def reset(pipeline: Pipeline, to, *, user, reason: str, now: datetime) -> dict:
    """Reset the stopped pipeline's offsets (audited); returns the new start offsets and
    where the old checkpoint was kept."""
    check_target(to)
    with transaction.atomic():
        locked = Pipeline.objects.select_for_update().get(pk=pipeline.pk)
        ensure_at_rest(locked)
        before = committed(locked)
        target = resolve(locked, to)
        if isinstance(to, dict) and "offsets" in to:
            # Partitions not named: what the checkpoint committed, else where the spec says.
            known = before["committed"]
            for topic, parts in known.items():
                for partition, offset in parts.items():
                    target.setdefault(topic, {}).setdefault(partition, offset)
        kept = set_aside(
            locked,
            kind=RestorePointKind.BEFORE_OFFSETS_RESET,
            user=user,
            reason=reason,
            now=now,
        )
        Pipeline.objects.filter(pk=locked.pk).update(offsets_reset=target)
        locked.offsets_reset = target
        done = {
            "start": target,
            "kept_restore_point": kept.pk if kept else None,
            "kept_checkpoint": kept.path if kept else None,
        }
        audit.record_with(
            locked,
            "offsets-reset",
            user=user,
            reason=reason,
            before={"committed": before["committed"], "last_batch_id": before["last_batch_id"]},
            after=done,
        )
    return done


def start_offsets_for_launch(pipeline: Pipeline) -> dict | None:
    """The offsets a run about to launch must start from: a pending reset, while the
    checkpoint does not hold its start offsets yet; once it does, the reset is done and
    cleared (None)."""
    if not pipeline.offsets_reset:
        return None
    store, current = checkpoints.store(), checkpoints.location(pipeline)
    # Spark's connector writes its start offsets to sources/0/0, our reader to offsets/0.
    if store.exists(join(current, "sources", "0", "0")) or store.exists(
        join(current, "offsets", "0")
    ):
        Pipeline.objects.filter(pk=pipeline.pk).update(offsets_reset=None)
        return None
    return pipeline.offsets_reset
