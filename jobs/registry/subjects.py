"""Which subject of a schema registry a topic's values are registered under, as Confluent's
serializers name them (pure).

- `topic` (TopicNameStrategy, the default): `<topic>-value`;
- `record` (RecordNameStrategy): the record's full name, whatever the topic;
- `topic-record` (TopicRecordNameStrategy): `<topic>-<record's full name>`.
"""

from __future__ import annotations

MAGIC = 0  # Confluent's wire format: this byte, the schema id (4 bytes, big-endian), the body
HEADER_BYTES = 5
# strategy -> (topic, the record's full name) -> the subject
_SUBJECTS = {
    "topic": lambda topic, record: f"{topic}-value",
    "record": lambda topic, record: record,
    "topic-record": lambda topic, record: f"{topic}-{record}",
}
STRATEGIES = tuple(_SUBJECTS)
NEEDS_RECORD = frozenset({"record", "topic-record"})


def subject(strategy: str, topic: str, record: str | None = None) -> str:
    """The subject of `topic`'s values under `strategy`; `record`: the record's full name
    (namespace.name), which the two record strategies need."""
    if strategy in NEEDS_RECORD and not record:
        raise ValueError(f"the {strategy} strategy names subjects by the record's full name")
    return _SUBJECTS[strategy](topic, record)


def frame(schema_id: int, body: bytes) -> bytes:
    """A value in Confluent's wire format."""
    return bytes([MAGIC]) + schema_id.to_bytes(4, "big") + body


def unframe(value: bytes) -> tuple[int, bytes]:
    """(schema id, body) of a value in Confluent's wire format; ValueError if it is not."""
    if len(value) < HEADER_BYTES or value[0] != MAGIC:
        raise ValueError("not in Confluent's wire format (a zero byte, then a 4-byte schema id)")
    return int.from_bytes(value[1:HEADER_BYTES], "big"), value[HEADER_BYTES:]


def schema_ids(prefixes) -> dict[int | None, int]:
    """How many values carry each schema id, from their first HEADER_BYTES bytes (None: a
    value that is not in Confluent's wire format, or no value at all)."""
    counts: dict[int | None, int] = {}
    for prefix in prefixes:
        try:
            found: int | None = unframe(prefix or b"")[0]
        except ValueError:
            found = None
        counts[found] = counts.get(found, 0) + 1
    return counts
