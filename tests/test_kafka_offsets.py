"""Offset maths of the Kafka source: admission control and splitting (pure logic)."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from jobs.kafka.offsets import Range, available, cap, find_losses, flatten, record_stamps, split


def test_without_a_limit_the_batch_takes_everything():
    start = {"t": {"0": 5, "1": 0}}
    latest = {"t": {"0": 10, "1": 7}}
    assert cap(start, latest, None) == latest
    assert cap(start, latest, 100) == latest


def test_a_limit_is_shared_in_proportion_to_each_partition_backlog():
    start = {"t": {"0": 0, "1": 0}}
    latest = {"t": {"0": 900, "1": 100}}
    assert cap(start, latest, 100) == {"t": {"0": 90, "1": 10}}


def test_every_partition_with_a_backlog_makes_progress():
    start = {"t": {"0": 0, "1": 0, "2": 0}}
    latest = {"t": {"0": 1_000_000, "1": 1, "2": 0}}
    end = cap(start, latest, 10)
    assert end["t"]["1"] == 1
    assert end["t"]["2"] == 0
    assert available(start, end) == 10


def test_new_partitions_missing_from_start_are_not_read_by_cap():
    assert cap({"t": {"0": 0}}, {"t": {"0": 3, "1": 4}}, None) == {"t": {"0": 3, "1": 4}}


def test_split_cuts_one_big_range_so_every_core_works():
    pieces = split({"t": {"0": 0}}, {"t": {"0": 1000}}, min_splits=4, max_split_records=10**6)
    assert [(p.start, p.end) for p in pieces] == [(0, 250), (250, 500), (500, 750), (750, 1000)]


def test_split_respects_the_maximum_piece_size_and_skips_empty_ranges():
    pieces = split(
        {"a": {"0": 0, "1": 5}}, {"a": {"0": 25, "1": 5}}, min_splits=1, max_split_records=10
    )
    assert pieces == [Range("a", 0, 0, 9), Range("a", 0, 9, 18), Range("a", 0, 18, 25)]


offsets = st.dictionaries(
    st.integers(0, 5), st.tuples(st.integers(0, 10**6), st.integers(0, 10**6))
)


def _pair(draw):
    return (
        {"t": {str(p): lo for p, (lo, hi) in draw.items()}},
        {"t": {str(p): lo + hi for p, (lo, hi) in draw.items()}},
    )


@given(offsets, st.one_of(st.none(), st.integers(1, 10**6)))
def test_cap_never_exceeds_the_limit_nor_the_log_and_never_goes_back(parts, limit):
    start, latest = _pair(parts)
    end = cap(start, latest, limit)
    for tp, offset in flatten(end).items():
        assert flatten(start)[tp] <= offset <= flatten(latest)[tp]
    taken = available(start, end)
    backlog = available(start, latest)
    assert taken == (backlog if limit is None else min(limit, backlog))


small_offsets = st.dictionaries(
    st.integers(0, 5), st.tuples(st.integers(0, 10**6), st.integers(0, 5000))
)


@given(small_offsets, st.integers(1, 8), st.integers(50, 10**5))
def test_split_covers_each_range_exactly_once(parts, min_splits, max_records):
    start, end = _pair(parts)
    pieces = split(start, end, min_splits=min_splits, max_split_records=max_records)
    covered: dict[int, list[tuple[int, int]]] = {}
    for piece in pieces:
        assert 0 < piece.size <= max_records
        covered.setdefault(piece.partition, []).append((piece.start, piece.end))
    for (_, partition), last in flatten(end).items():
        first = flatten(start)[("t", partition)]
        runs = sorted(covered.get(partition, []))
        if first == last:
            assert not runs
            continue
        assert runs[0][0] == first and runs[-1][1] == last
        assert all(a[1] == b[0] for a, b in itertools.pairwise(runs))


def test_records_deleted_before_they_were_read_are_a_loss():
    (loss,) = find_losses({"t": {"0": 10, "1": 50}}, {("t", 0): 25, ("t", 1): 0}, LATEST)
    assert (loss.topic, loss.partition, loss.position, loss.resume) == ("t", 0, 10, 25)
    assert "records 10..24 were deleted before they were read" in str(loss)


def test_a_log_that_ends_before_what_was_read_is_a_loss():
    """The topic was deleted and created again (or truncated): resume at its beginning."""
    (loss,) = find_losses(
        {"t": {"0": 10, "1": 50}},
        {("t", 0): 0, ("t", 1): 0},
        {
            ("t", 0): 100,
            ("t", 1): 3,
        },
    )
    assert (loss.partition, loss.position, loss.resume) == (1, 50, 0)
    assert "the log ends at offset 3 but the query had read up to 50" in str(loss)


def test_positions_within_the_log_or_at_its_ends_are_no_loss():
    earliest = {("t", 0): 5, ("t", 1): 0}
    assert find_losses({"t": {"0": 5, "1": 100}, "$plan": {}}, earliest, LATEST) == []
    assert find_losses({"t": {"0": 7}, "u": {"0": 3}}, earliest, LATEST) == []  # u: not there


LATEST = {("t", 0): 100, ("t", 1): 100}


# -- record_stamps: a stamp of its own for each record of a batch -----------------------------


def test_record_stamps_lie_between_the_batch_before_and_this_batch():
    start = {("a", 0): 10, ("a", 1): 5, ("b", 0): 0}
    end = {("a", 0): 14, ("a", 1): 5, ("b", 0): 3}
    previous = 10 + 5 + 0 + 6  # the batch before (id 6) ended where this one starts
    position = 14 + 5 + 3 + 7  # this batch: id 7
    added = record_stamps(start, end, position, previous)
    stamps = [added[tp] + o for tp in sorted(end) for o in range(start[tp], end[tp])]
    assert len(stamps) == len(set(stamps)) == 7
    assert previous < min(stamps) and max(stamps) < position
    # Within a partition a later offset is a higher stamp: the later record wins.
    assert stamps == sorted(stamps)


def test_record_stamps_of_a_first_batch_and_of_an_empty_one():
    added = record_stamps({("a", 0): 0}, {("a", 0): 3}, 3 + 0, None)
    assert [added[("a", 0)] + o for o in range(3)] == [0, 1, 2]
    assert record_stamps({("a", 0): 3}, {("a", 0): 3}, 3 + 1, 3 + 0) == {("a", 0): 1}


def test_record_stamps_are_refused_when_where_the_batch_starts_is_not_known():
    end = {("a", 0): 5, ("a", 1): 5}
    assert record_stamps({("a", 0): 0}, end, 11, 5) is None  # a new partition
    assert record_stamps({("a", 0): 6, ("a", 1): 0}, end, 11, 5) is None  # start after end
    # Partitions dropped from the source: the layout would reach below the batch before.
    assert record_stamps({("a", 0): 0, ("a", 1): 0}, end, 11, 50) is None


def test_a_symbolic_end_offset_is_no_partition_of_the_batch():
    assert record_stamps({("a", 0): 1}, {("a", 0): 4, ("a", 1): -1}, 4 + 1, 1 + 0) == {("a", 0): 1}
