"""Which writer schemas a schema-registry source's topics hold: sampled by the metrics
collector, shown on the pipeline page and in the API, and what the `writer-schema` alert
rule watches.

Every SAMPLE_SECONDS per pipeline, the collector reads the records written since its last
sample, at most the newest TAIL of each partition (with the log ends the round already
asked for: no further offset lookups), takes the schema id from each value's Confluent
header, and keeps per id when it was first and last seen and how many sampled records
carried it (`WriterSchema`). A new id is looked up in the registry once (which subject and
version it is); one the registry did not answer is looked up again next time. An id that
turns up after the first sample has `appeared_at`: a producer started writing a new schema.
Values that are not in the wire format count under no id (they become dead letters).

Best-effort, as every figure: a cluster or registry that does not answer costs the sample,
never the round; the round spends at most ROUND_SECONDS sampling, the pipelines waited on
longest first, the rest next round.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import IntegrityError, transaction
from django.db.models import F

from controlplane.connections.masking import mask
from controlplane.definitions.models import Connection, Pipeline, WriterSchema
from jobs.kafka.offsets import flatten, nest
from jobs.registry.subjects import HEADER_BYTES, schema_ids, subject

from . import kafka_lookups

log = logging.getLogger("controlplane.metrics")

SAMPLE_SECONDS = 60.0  # how often each pipeline's topics are sampled
TAIL = 8  # at most this many of the newest records of each partition per sample
ROUND_SECONDS = 3.0  # at most this long sampling per collector round
READ_SECONDS = 2.0  # at most this long reading one pipeline's records
RECENT = timedelta(hours=1)  # a writer schema seen since is in use now
NEW = timedelta(hours=24)  # one that appeared since is flagged as new on the page


@dataclass(frozen=True)
class Sampling:
    """Where a pipeline's sampling stands: when it last sampled, up to which offsets."""

    at: datetime | None
    to: dict[tuple[str, int], int]

    def stored(self) -> tuple[datetime | None, dict | None]:
        return self.at, (nest(self.to) if self.to else None)


def watched(pipeline: Pipeline) -> dict | None:
    """The pipeline's source's resolved schema_registry section, if it reads through one."""
    found = (pipeline.spec.get("source") or {}).get("schema_registry")
    return found if isinstance(found, dict) and found.get("subject") else None


def subjects_of(section: dict, topics: list[str]) -> list[str]:
    """The subjects the source's topics' values are registered under (its strategy)."""
    out = []
    for topic in topics:
        try:
            name = subject(section.get("strategy") or "topic", topic, section.get("record"))
        except ValueError:
            continue
        if name not in out:
            out.append(name)
    return out


def ranges(ends: dict, to: dict, tail: int = TAIL) -> dict[tuple[str, int], tuple[int, int]]:
    """Each partition's offsets to read: from where the last sample stopped (never more
    than `tail` records before its end; the newest `tail` on a first sample, or when the
    log ends before where it stopped), to its end."""
    out = {}
    for tp, end in ends.items():
        last = to.get(tp)
        # Past the log end (the topic was recreated): as on a first sample.
        start = max(last, end - tail) if last is not None and last <= end else end - tail
        out[tp] = (max(0, start), end)
    return out


def sample(
    pipelines: list[Pipeline], computed: dict, previous: dict[int, Sampling], now: datetime
) -> dict[int, Sampling]:
    """Sample the due pipelines' topics (within ROUND_SECONDS); every watched pipeline's
    sampling as it stands after (the previous one where it was not sampled)."""
    out = {p.pk: previous.get(p.pk, Sampling(None, {})) for p in pipelines if watched(p)}
    due = [
        p
        for p in pipelines
        if p.pk in out
        and (out[p.pk].at is None or now - out[p.pk].at >= timedelta(seconds=SAMPLE_SECONDS))
    ]
    due.sort(key=lambda p: (out[p.pk].at is not None, out[p.pk].at or now))
    if not due:
        return out
    started = time.monotonic()
    names = {p.spec["source"]["connection"] for p in due}
    names |= {watched(p)["connection"] for p in due}
    connections = {c.name: c for c in Connection.objects.filter(name__in=names)}
    looked_up: dict[tuple[str, int], tuple[str, int | None, str]] = {}
    for pipeline in due:
        if time.monotonic() - started > ROUND_SECONDS:
            break  # the rest next round, first in line
        result = computed.get(pipeline.pk)
        lag = result.figures["lag"] if result is not None else {}
        ends = {(p["topic"], p["partition"]): p["end"] for p in lag.get("partitions") or ()}
        kafka = connections.get(pipeline.spec["source"]["connection"])
        if not ends or kafka is None:
            continue  # no log ends this round (the lag says why)
        try:
            counts, to = _read(kafka, ranges(ends, out[pipeline.pk].to))
        except Exception as exc:  # a sample we cannot take, not an error of the round
            log.warning("pipeline %s: no writer-schema sample: %s", pipeline.name, exc)
            continue
        first = out[pipeline.pk].at is None
        try:
            _record(pipeline, counts, now, first=first)
            _look_up(pipeline, connections, looked_up)
        except IntegrityError:
            continue  # deleted during the round
        out[pipeline.pk] = Sampling(now, to)
    return out


def _read(kafka: Connection, wanted: dict) -> tuple[dict[int | None, int], dict]:
    """(records per schema id, the offsets read up to) over these partitions' ranges."""
    from kafka import TopicPartition

    from jobs.kafka.metadata import record_prefixes

    config = kafka_lookups.lookup_config(kafka)
    consumer = kafka_lookups.acquire(config)
    healthy = False
    try:
        by_tp = {TopicPartition(t, n): r for (t, n), r in wanted.items()}
        read = record_prefixes(consumer, by_tp, prefix_bytes=HEADER_BYTES, seconds=READ_SECONDS)
        healthy = True
    finally:
        kafka_lookups.release(config, consumer, healthy=healthy)
    counts: dict[int | None, int] = {}
    to = {}
    for tp, (prefixes, reached) in read.items():
        for schema_id, n in schema_ids(prefixes).items():
            counts[schema_id] = counts.get(schema_id, 0) + n
        to[(tp.topic, tp.partition)] = reached  # a partial read resumes there
    return counts, to


def _record(pipeline: Pipeline, counts: dict, now: datetime, *, first: bool) -> None:
    """The sample's ids into the pipeline's writer schemas."""
    with transaction.atomic():
        known = set(
            WriterSchema.objects.filter(
                pipeline=pipeline, schema_id__in=[i for i in counts if i is not None]
            ).values_list("schema_id", flat=True)
        )
        if (
            None in counts
            and WriterSchema.objects.filter(pipeline=pipeline, schema_id=None).exists()
        ):
            known.add(None)
        for schema_id, n in counts.items():
            if schema_id in known:
                WriterSchema.objects.filter(pipeline=pipeline, schema_id=schema_id).update(
                    last_seen_at=now, records=F("records") + n
                )
                continue
            WriterSchema.objects.create(
                pipeline=pipeline,
                schema_id=schema_id,
                first_seen_at=now,
                last_seen_at=now,
                appeared_at=None if first else now,
                records=n,
                looked_up=schema_id is None,  # nothing to look up
            )
            if not first:
                log.info(
                    "pipeline %s: a new writer schema appears: id %s", pipeline.name, schema_id
                )


def _look_up(pipeline: Pipeline, connections: dict, cache: dict) -> None:
    """Which subject and version each of the pipeline's ids not looked up yet is."""
    pending = list(WriterSchema.objects.filter(pipeline=pipeline, looked_up=False))
    if not pending:
        return
    section = watched(pipeline)
    mine = subjects_of(section, pipeline.spec["source"]["topics"])
    registry = connections.get(section["connection"])
    for row in pending:
        key = (section["connection"], row.schema_id)
        if key not in cache:
            cache[key] = _versions(registry, row.schema_id, mine)
        row.subject, row.version, row.lookup_error = cache[key]
        row.looked_up = not row.lookup_error
        row.save(update_fields=["subject", "version", "looked_up", "lookup_error"])


def _versions(registry: Connection | None, schema_id: int, mine: list[str]):
    """(subject, version, error) of an id: its version in one of `mine` if it is one, else
    the first subject the registry names; an error in words when it could not say."""
    from controlplane.connections.policy import registry_connection_arguments
    from jobs.registry.client import NotFound, Registry, RegistryError

    if registry is None:
        return "", None, "the schema-registry connection does not exist"
    try:
        arguments = registry_connection_arguments(registry.settings, registry.get_secrets())
        with Registry(arguments) as client:
            found = client.versions_of(schema_id)
    except NotFound:
        return (
            "",
            None,
            "",
        )  # not in the registry: a looked-up answer (the records are dead letters)
    except (RegistryError, ValueError) as exc:
        return "", None, mask(str(exc))
    for name, version in found:
        if name in mine:
            return name, version, ""
    return (found[0][0], found[0][1], "") if found else ("", None, "")


def describe(row: WriterSchema, reader: int | None) -> str:
    """A writer schema in words: its version and subject, id, and how it compares to the
    reader's version."""
    if row.schema_id is None:
        return "records not in Confluent's wire format"
    if row.version is None:
        return f"schema id {row.schema_id} (not a version the registry names)"
    what = f"version {row.version} of {row.subject!r} (id {row.schema_id})"
    if reader is not None and row.version != reader:
        what += f", the pipeline reads version {reader}"
    return what


def appeared(since: datetime) -> dict[int, tuple[tuple[datetime, str], ...]]:
    """Writer schemas that appeared since `since`, per pipeline, newest first, in words."""
    out: dict[int, list] = {}
    rows = WriterSchema.objects.filter(appeared_at__gte=since).select_related("pipeline")
    for row in rows.order_by("-appeared_at"):
        section = watched(row.pipeline) or {}
        what = describe(row, section.get("resolved_version"))
        out.setdefault(row.pipeline_id, []).append((row.appeared_at, what))
    return {k: tuple(v) for k, v in out.items()}


def stored_sampling(pipeline_ids) -> dict[int, Sampling]:
    """The pipelines' sampling as the last round stored it."""
    from controlplane.definitions.models import PipelineFigures

    out = {}
    for pk, at, to in PipelineFigures.objects.filter(pipeline_id__in=pipeline_ids).values_list(
        "pipeline_id", "writers_sampled_at", "writers_sampled_to"
    ):
        out[pk] = Sampling(at, flatten(to) if to else {})
    return out


def page(pipeline: Pipeline, now: datetime) -> dict[str, Any] | None:
    """What the pipeline page and the API show (None: its source reads no registry): the
    subject, the reader's version, each writer schema seen (newest first) with how it
    compares to the reader, and when the topics were last sampled."""
    section = watched(pipeline)
    if section is None:
        return None
    reader = section.get("resolved_version")
    figures = getattr(pipeline, "figures", None)
    sampled_at = figures.writers_sampled_at if figures is not None else None
    writers = []
    for row in WriterSchema.objects.filter(pipeline=pipeline).order_by(
        "-last_seen_at", "-first_seen_at"
    ):
        if row.schema_id is None:
            compared = "not in Confluent's wire format: dead letters"
        elif not row.looked_up:
            compared = (
                f"not looked up yet ({row.lookup_error})"
                if row.lookup_error
                else "not looked up yet"
            )
        elif row.version is None:
            compared = "unknown to the registry: dead letters"
        elif row.subject != section["subject"]:
            compared = f"version {row.version} of another subject, {row.subject!r}"
        elif reader is None or row.version == reader:
            compared = "the reader's version" if reader is not None else ""
        elif row.version > reader:
            compared = "newer than the reader: fields it adds are not read"
        else:
            compared = "older than the reader: read with the reader's defaults"
        writers.append(
            {
                "schema_id": row.schema_id,
                "subject": row.subject,
                "version": row.version,
                "compared": compared,
                "first_seen_at": row.first_seen_at,
                "last_seen_at": row.last_seen_at,
                "appeared_at": row.appeared_at,
                "records": row.records,
                "recent": now - row.last_seen_at <= RECENT,
                "new": row.appeared_at is not None and now - row.appeared_at <= NEW,
            }
        )
    return {
        "subject": section["subject"],
        "connection": section["connection"],
        "strategy": section.get("strategy") or "topic",
        "reader_version": reader,
        "reader_schema_id": section.get("schema_id"),
        "pinned": section.get("version", "latest") != "latest",
        "sampled_at": sampled_at,
        "sample_seconds": SAMPLE_SECONDS,
        "writers": writers,
    }
