"""The pure parts of sampling a schema-registry source's writer schemas
(controlplane.observability.writer_schemas): which offsets a sample reads, which ids it may
call new, which subject and version an id is for a pipeline, and how a writer schema compares
to the pipeline's reader, in words. No Django, no Kafka, no registry: what they answered is
passed in."""

from __future__ import annotations

from dataclasses import dataclass

from jobs.registry.subjects import schema_ids, subject

TAIL = 8  # at most this many of the newest records of each partition per sample
MAX_IDS = 50  # distinct writer schemas kept per pipeline; more are counted, not kept

Partition = tuple[str, int]


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


def ranges(
    ends: dict[Partition, int], to: dict[Partition, int], tail: int = TAIL
) -> dict[Partition, tuple[int, int]]:
    """Each partition's offsets to read: from where the last sample stopped (never more
    than `tail` records before its end; the newest `tail` on a first sample, or when the
    log ends before where it stopped), to its end. (The reader starts no earlier than the
    log's start: jobs.kafka.metadata.record_prefixes.)"""
    out = {}
    for tp, end in ends.items():
        last = to.get(tp)
        # Past the log end (the topic was recreated): as on a first sample.
        start = max(last, end - tail) if last is not None and last <= end else end - tail
        out[tp] = (max(0, start), end)
    return out


@dataclass(frozen=True)
class Sample:
    """What one sample read: records per schema id (None: not in the wire format), and the
    ids seen in partitions an earlier sample read too (only those can be new: an id in a
    partition first sampled now, one the source just started reading, was there before)."""

    counts: dict[int | None, int]
    watched_ids: frozenset


def sample_of(prefixes: dict[Partition, list], watched: set[Partition]) -> Sample:
    """The sample of each partition's values' first bytes; `watched`: the partitions an
    earlier sample read."""
    counts: dict[int | None, int] = {}
    seen_before: set = set()
    for tp, values in prefixes.items():
        found = schema_ids(values)
        for schema_id, n in found.items():
            counts[schema_id] = counts.get(schema_id, 0) + n
        if tp in watched:
            seen_before |= set(found)
    return Sample(counts, frozenset(seen_before))


def choose(found: list[tuple[str, int]], mine: list[str]) -> tuple[str, int | None]:
    """(subject, version) of an id the registry registers as `found` ((subject, version)
    pairs): its version in one of the pipeline's subjects if it is one, else the first the
    registry named; ("", None): none (the registry does not know the id)."""
    for name, version in found:
        if name in mine:
            return name, version
    return found[0] if found else ("", None)


def compared(
    *,
    schema_id: int | None,
    looked_up: bool,
    lookup_error: str,
    subject: str,
    version: int | None,
    reader_subject: str,
    reader: int | None,
) -> str:
    """How a writer schema compares to the pipeline's reader, in words."""
    if schema_id is None:
        return "not in Confluent's wire format: dead letters"
    if not looked_up:
        return f"not looked up yet ({lookup_error})" if lookup_error else "not looked up yet"
    if version is None:
        return (
            "not registered as a version of any subject: its records are dead letters"
            " unless the registry still has the schema by id"
        )
    if subject != reader_subject:
        return f"version {version} of another subject, {subject!r}"
    if reader is None or version == reader:
        return "the reader's version" if reader is not None else ""
    if version > reader:
        return "newer than the reader: fields it adds are not read"
    return "older than the reader: read with the reader's defaults"


def described(
    *,
    schema_id: int | None,
    subject: str,
    version: int | None,
    reader_subject: str,
    reader: int | None,
) -> str:
    """A writer schema in words (an alert's): its version and subject, id, and the version
    the pipeline reads when it is another version of the same subject."""
    if schema_id is None:
        return "records not in Confluent's wire format"
    if version is None:
        return f"schema id {schema_id}"
    what = f"version {version} of {subject!r} (id {schema_id})"
    if subject == reader_subject and reader is not None and version != reader:
        what += f", the pipeline reads version {reader}"
    return what
