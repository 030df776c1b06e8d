"""Which writer schemas a schema-registry source's topics hold: sampled by the metrics
collector, shown on the pipeline page and in the API, and what the `writer-schema` alert
rule watches. (The pure parts: controlplane.observability.writer_sampling.)

Every SAMPLE_SECONDS per pipeline, the collector reads the records written since its last
sample, at most the newest TAIL of each partition (from the log ends the round already asked
for, never before a log's start), takes the schema id from each value's Confluent header,
and keeps per id when it was first and last seen and how many sampled records carried it
(`WriterSchema`, at most MAX_IDS ids per pipeline), with where the sampling stands, in one
transaction. A new id is looked up in the registry once (which subject and version it is);
one the registry did not answer is looked up again next time. An id that turns up in a
partition sampled before, and that the registry registers as a subject's version, has
`appeared_at`: a producer started writing a new schema. An id first seen in a partition
first sampled now (a topic the source just started reading) was there before: not new.
Values that are not in the wire format count under no id (they become dead letters).

Best-effort, as every figure: a cluster or registry that does not answer costs that
pipeline's sample, never the round. The round takes no more pipelines after ROUND_SECONDS
(those waited on longest go first; the rest next round); one pipeline's read takes at most
READ_SECONDS, a registry lookup at most LOOKUP_SECONDS, and a registry that did not answer is
not asked again in the same round.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import F

from controlplane.connections.masking import mask
from controlplane.definitions.models import Connection, Pipeline, PipelineFigures, WriterSchema
from jobs.kafka.offsets import flatten, nest
from jobs.registry.subjects import HEADER_BYTES

from . import kafka_lookups
from .writer_sampling import (
    MAX_IDS,
    Sample,
    choose,
    compared,
    described,
    ranges,
    sample_of,
    subjects_of,
)

log = logging.getLogger("controlplane.metrics")

SAMPLE_SECONDS = 60.0  # how often each pipeline's topics are sampled
ROUND_SECONDS = 3.0  # sampling stops taking pipelines after this long in a round
READ_SECONDS = 2.0  # at most this long reading one pipeline's records
LOOKUP_SECONDS = 3.0  # a registry lookup's timeout (the connection's own, if shorter)
RECENT = timedelta(hours=1)  # a writer schema seen since is in use now
NEW = timedelta(hours=24)  # one that appeared since is flagged as new on the page
SHOWN = MAX_IDS + 1  # the page's and the API's rows at most (every id kept, and unframed)
ALERTED = 5  # new writer schemas an alert names at most (the newest)


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


def sample(
    pipelines: list[Pipeline], computed: dict, previous: dict[int, Sampling], now: datetime
) -> dict[int, Sampling]:
    """Sample the due pipelines' topics (taking no more after ROUND_SECONDS); every watched
    pipeline's sampling as it stands after (the previous one where it was not sampled).
    Never raises: a pipeline that cannot be sampled keeps its previous sampling."""
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
    deadline = time.monotonic() + ROUND_SECONDS
    names = {p.spec["source"]["connection"] for p in due}
    connections = {c.name: c for c in Connection.objects.filter(name__in=names)}
    registries = _Registries(deadline)
    try:
        for pipeline in due:
            if time.monotonic() > deadline:
                break  # the rest next round, first in line
            try:
                taken = _sample_one(pipeline, computed, out[pipeline.pk], connections, now)
                if taken is not None:
                    out[pipeline.pk] = taken
                    _look_up(pipeline, registries)
            except Exception as exc:  # one pipeline's sample, never the round
                log.warning("pipeline %s: no writer-schema sample: %s", pipeline.name, exc)
    finally:
        registries.close()
    return out


def _sample_one(
    pipeline: Pipeline, computed: dict, before: Sampling, connections: dict, now: datetime
) -> Sampling | None:
    """Read what was written since the last sample and record its ids; the new sampling
    (None: nothing could be read this round)."""
    result = computed.get(pipeline.pk)
    lag = result.figures["lag"] if result is not None else {}
    ends = {(p["topic"], p["partition"]): p["end"] for p in lag.get("partitions") or ()}
    kafka = connections.get(pipeline.spec["source"]["connection"])
    if not ends or kafka is None:
        return None  # no log ends this round (the lag says why)
    found, to = _read(kafka, ranges(ends, before.to))
    taken = Sampling(now, to)
    watched_before = set(before.to) if before.at is not None else set()
    _record(pipeline, sample_of(found, watched_before), now, taken)
    return taken


def _read(kafka: Connection, wanted: dict) -> tuple[dict, dict]:
    """(each partition's values' first bytes, the offsets read up to) over these ranges."""
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
    prefixes = {(tp.topic, tp.partition): values for tp, (values, _) in read.items()}
    # A partial read resumes where it stopped.
    to = {(tp.topic, tp.partition): reached for tp, (_, reached) in read.items()}
    return prefixes, to


def _record(pipeline: Pipeline, taken: Sample, now: datetime, sampling: Sampling) -> None:
    """The sample's ids into the pipeline's writer schemas, and where its sampling stands,
    together. An id seen first now is a candidate new writer schema when a partition sampled
    before holds it (confirmed by the registry's lookup); at most MAX_IDS ids are kept."""
    with transaction.atomic():
        kept = dict(WriterSchema.objects.filter(pipeline=pipeline).values_list("schema_id", "pk"))
        room = MAX_IDS + (1 if None in kept else 0) - len(kept)
        dropped = 0
        for schema_id, n in taken.counts.items():
            if schema_id in kept:
                WriterSchema.objects.filter(pk=kept[schema_id]).update(
                    last_seen_at=now, records=F("records") + n
                )
                continue
            if schema_id is not None and room <= 0:
                dropped += n
                continue
            room -= schema_id is not None
            WriterSchema.objects.create(
                pipeline=pipeline,
                schema_id=schema_id,
                first_seen_at=now,
                last_seen_at=now,
                appeared_at=now if schema_id in taken.watched_ids else None,
                records=n,
                looked_up=schema_id is None,  # nothing to look up
            )
        if dropped:
            log.warning(
                "pipeline %s: %s sampled records carry schema ids beyond the %s kept",
                pipeline.name,
                dropped,
                MAX_IDS,
            )
        at, to = sampling.stored()
        PipelineFigures.objects.filter(pipeline=pipeline).update(
            writers_sampled_at=at, writers_sampled_to=to
        )


class _Registries:
    """One round's registry clients, one per connection, and what they answered per id; a
    registry that did not answer is not asked again this round; none is asked after the
    round's deadline (the ids wait for the next round)."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.clients: dict[str, Any] = {}
        self.down: dict[str, str] = {}
        self.answers: dict[tuple[str, int], list[tuple[str, int]] | str] = {}

    def versions_of(self, name: str, schema_id: int) -> list[tuple[str, int]] | str | None:
        """Every (subject, version) of the id; an error in words; None: not asked now."""
        from controlplane.definitions.schemas import registry_arguments
        from jobs.registry.client import NotFound, Registry, RegistryError, Unreachable

        key = (name, schema_id)
        if key in self.answers:
            return self.answers[key]
        if name in self.down:
            return self.down[name]
        if time.monotonic() > self.deadline:
            return None
        try:
            client = self.clients.get(name)
            if client is None:
                arguments = registry_arguments(name)
                if arguments is None:
                    raise ValueError("the schema-registry connection does not exist")
                timeout = float(arguments.get("timeout_seconds") or LOOKUP_SECONDS)
                arguments["timeout_seconds"] = min(timeout, LOOKUP_SECONDS)
                client = self.clients[name] = Registry(arguments)
            answer: list[tuple[str, int]] | str = client.versions_of(schema_id)
        except NotFound:
            answer = []  # registered as no subject's version
        except (Unreachable, ValueError) as exc:
            self.down[name] = mask(str(exc))
            return self.down[name]
        except (RegistryError, TypeError, KeyError) as exc:  # an answer it could not read
            answer = mask(f"the registry: {exc}")
        self.answers[key] = answer
        return answer

    def close(self) -> None:
        for client in self.clients.values():
            client.close()


def _look_up(pipeline: Pipeline, registries: _Registries) -> None:
    """Which subject and version each of the pipeline's ids not looked up yet is. An id no
    subject registers is no new writer schema (its records are dead letters)."""
    section = watched(pipeline)
    mine = subjects_of(section, pipeline.spec["source"]["topics"])
    for row in WriterSchema.objects.filter(pipeline=pipeline, looked_up=False):
        answer = registries.versions_of(section["connection"], row.schema_id)
        if answer is None:
            return  # the round's time is up: next round
        if isinstance(answer, str):
            WriterSchema.objects.filter(pk=row.pk).update(lookup_error=answer)
            continue
        name, version = choose(answer, mine)
        changes: dict[str, Any] = {"subject": name, "version": version, "looked_up": True}
        changes["lookup_error"] = ""
        if version is None:
            changes["appeared_at"] = None
        elif row.appeared_at is not None:
            log.info(
                "pipeline %s: a new writer schema appears: version %s of %s (id %s)",
                pipeline.name,
                version,
                name,
                row.schema_id,
            )
        WriterSchema.objects.filter(pk=row.pk).update(**changes)


def appeared(since: datetime) -> dict[int, tuple[tuple[datetime, str], ...]]:
    """New writer schemas (confirmed by the registry) that appeared since `since`, per
    pipeline, the newest ALERTED, in words."""
    out: dict[int, list] = {}
    rows = WriterSchema.objects.filter(
        appeared_at__gte=since, looked_up=True, version__isnull=False
    ).select_related("pipeline")
    for row in rows.order_by("-appeared_at"):
        mine = out.setdefault(row.pipeline_id, [])
        if len(mine) >= ALERTED:
            continue
        section = watched(row.pipeline) or {}
        what = described(
            schema_id=row.schema_id,
            subject=row.subject,
            version=row.version,
            reader_subject=section.get("subject", ""),
            reader=section.get("resolved_version"),
        )
        mine.append((row.appeared_at, what))
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
    subject, the reader's version, each writer schema seen (most recently seen first) with
    how it compares to the reader, and when the topics were last sampled."""
    section = watched(pipeline)
    if section is None:
        return None
    reader = section.get("resolved_version")
    figures = PipelineFigures.objects.filter(pipeline=pipeline).first()
    writers = []
    rows = WriterSchema.objects.filter(pipeline=pipeline)
    for row in rows.order_by("-last_seen_at", "-first_seen_at")[:SHOWN]:
        writers.append(
            {
                "schema_id": row.schema_id,
                "subject": row.subject,
                "version": row.version,
                "compared": compared(
                    schema_id=row.schema_id,
                    looked_up=row.looked_up,
                    lookup_error=row.lookup_error,
                    subject=row.subject,
                    version=row.version,
                    reader_subject=section["subject"],
                    reader=reader,
                ),
                "first_seen_at": row.first_seen_at,
                "last_seen_at": row.last_seen_at,
                "appeared_at": row.appeared_at if row.looked_up else None,
                "records": row.records,
                "recent": now - row.last_seen_at <= RECENT,
                "new": row.looked_up
                and row.appeared_at is not None
                and now - row.appeared_at <= NEW,
            }
        )
    return {
        "subject": section["subject"],
        "connection": section["connection"],
        "strategy": section.get("strategy") or "topic",
        "reader_version": reader,
        "reader_schema_id": section.get("schema_id"),
        "pinned": section.get("version", "latest") != "latest",
        "sampled_at": figures.writers_sampled_at if figures is not None else None,
        "sample_seconds": SAMPLE_SECONDS,
        "writers": writers,
    }
