"""Pure parts of the writer-schema sampling (controlplane.observability.writer_sampling; no
Kafka, no registry, no database): which offsets a sample reads, the schema ids of values'
headers and which may be new, an id's subject and version for a pipeline, how it compares to
the reader in words, the `writer-schema` alert rule."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from controlplane.alerting import rules
from controlplane.observability.writer_sampling import (
    choose,
    compared,
    described,
    ranges,
    sample_of,
    subjects_of,
)
from jobs.registry.subjects import frame, schema_ids

NOW = datetime(2026, 11, 28, 9, 0, tzinfo=UTC)


def test_a_first_sample_reads_the_newest_records_and_later_ones_what_came_since():
    ends = {("t", 0): 100, ("t", 1): 3, ("t", 2): 0}
    # First: the newest 8 of each partition (all of a short one, none of an empty one).
    assert ranges(ends, {}, tail=8) == {("t", 0): (92, 100), ("t", 1): (0, 3), ("t", 2): (0, 0)}
    # Since: from where the last one stopped, never more than the newest 8.
    since = {("t", 0): 97, ("t", 1): 1, ("t", 2): 0}
    assert ranges(ends, since, tail=8) == {
        ("t", 0): (97, 100),
        ("t", 1): (1, 3),
        ("t", 2): (0, 0),
    }
    assert ranges({("t", 0): 1_000}, {("t", 0): 10}, tail=8) == {("t", 0): (992, 1_000)}
    # A log end below where it stopped (the topic was recreated): its newest records.
    assert ranges({("t", 0): 5}, {("t", 0): 50}, tail=8) == {("t", 0): (0, 5)}


def test_only_ids_in_partitions_sampled_before_can_be_new():
    prefixes = {
        ("t", 0): [frame(7, b"")[:5], frame(8, b"")[:5]],
        ("t", 1): [frame(9, b"")[:5], b"junk"],  # a partition sampled for the first time
    }
    taken = sample_of(prefixes, {("t", 0)})
    assert taken.counts == {7: 1, 8: 1, 9: 1, None: 1}
    assert taken.watched_ids == {7, 8}
    assert sample_of(prefixes, set()).watched_ids == frozenset()  # a first sample


def test_an_id_is_the_pipelines_subjects_version_when_it_is_one():
    found = [("other-value", 4), ("orders-value", 2)]
    assert choose(found, ["orders-value"]) == ("orders-value", 2)
    assert choose(found, ["payments-value"]) == ("other-value", 4)
    assert choose([], ["orders-value"]) == ("", None)


def test_writer_schemas_compared_to_the_reader_in_words():
    def say(**changes):
        row = dict(
            schema_id=12,
            looked_up=True,
            lookup_error="",
            subject="o-value",
            version=3,
            reader_subject="o-value",
            reader=2,
        )
        return compared(**{**row, **changes})

    assert say() == "newer than the reader: fields it adds are not read"
    assert say(version=1) == "older than the reader: read with the reader's defaults"
    assert say(version=2) == "the reader's version"
    assert say(subject="x-value") == "version 3 of another subject, 'x-value'"
    assert say(schema_id=None) == "not in Confluent's wire format: dead letters"
    assert say(looked_up=False, lookup_error="down") == "not looked up yet (down)"
    assert say(version=None).startswith("not registered as a version of any subject")
    row = dict(schema_id=12, subject="o-value", version=3, reader_subject="o-value")
    assert described(**row, reader=2) == (
        "version 3 of 'o-value' (id 12), the pipeline reads version 2"
    )
    assert described(**row, reader=3) == "version 3 of 'o-value' (id 12)"
    # Another subject's version numbers are not the reader's to compare with.
    assert described(**{**row, "subject": "x-value"}, reader=2) == "version 3 of 'x-value' (id 12)"


def test_schema_ids_come_from_the_header_and_anything_else_counts_as_unframed():
    values = [frame(7, b"x")[:5], frame(7, b"")[:5], frame(9, b"")[:5], b"\x01\x00", b"", None]
    assert schema_ids(values) == {7: 2, 9: 1, None: 3}
    assert schema_ids([]) == {}


def test_the_subjects_of_a_source_follow_its_strategy():
    assert subjects_of({"strategy": "topic"}, ["a", "b"]) == ["a-value", "b-value"]
    assert subjects_of({"strategy": "record", "record": "acme.D"}, ["a", "b"]) == ["acme.D"]
    assert subjects_of({"strategy": "topic-record", "record": "acme.D"}, ["a"]) == ["a-acme.D"]
    assert subjects_of({"strategy": "record"}, ["a"]) == []  # no record: no subject


def test_the_writer_schema_rule_holds_while_a_new_schema_is_recent():
    assert rules.params_problem("writer-schema", {"minutes": 30}) is None
    assert rules.params_problem("writer-schema", {"minutes": 0}) == "minutes must be more than 0"
    facts = rules.Facts(
        status="running",
        desired_state="running",
        writer_appeared=(
            (NOW - timedelta(minutes=5), "version 3 of 'o-value' (id 12)"),
            (NOW - timedelta(hours=2), "version 2 of 'o-value' (id 11)"),
        ),
    )
    assert rules.holds("writer-schema", {"minutes": 30}, facts, NOW) == (
        "a new writer schema appeared in its topics: version 3 of 'o-value' (id 12)"
    )
    assert "id 11" in rules.holds("writer-schema", {"minutes": 180}, facts, NOW)
    assert rules.holds("writer-schema", {"minutes": 1}, facts, NOW) is None
    quiet = rules.Facts(status="running", desired_state="running")
    assert rules.holds("writer-schema", {"minutes": 30}, quiet, NOW) is None
