"""The files sink's rolling policy (jobs.sinks.files.rolling): pure logic, time passed in."""

from __future__ import annotations

import pytest

from jobs.sinks.files.rolling import Policy, Staged, next_check, plan

MB = 1024 * 1024
POLICY = Policy(target_bytes=10 * MB, max_age_seconds=900, inactivity_seconds=300)


def staged(batch, size_mb, at, partition="day=1", schema="s1"):
    return Staged(
        batch=(0, batch),
        path=f"_cp_staging/q/{batch}/{partition}/part-0.parquet",
        bytes=int(size_mb * MB),
        committed_at=at,
        schema=schema,
    )


def test_files_are_cut_at_the_boundary_closest_to_the_target():
    files = [staged(b, 3, at=1000 + b) for b in range(10)]  # 30 MB in 3 MB pieces
    rolls = plan({"day=1": files}, POLICY, now=1010)
    # 9 MB is closer to 10 than 12 is: each file is cut before the 4th piece.
    assert [r.reason for r in rolls] == ["size", "size", "size"]
    assert [r.bytes // MB for r in rolls] == [9, 9, 9]
    assert [s.batch[1] for s in rolls[0].inputs] == [0, 1, 2]
    # The last 3 MB wait: younger than the age limit, and batches still come.
    assert sum(len(r.inputs) for r in rolls) == 9
    # 10.4 MB is closer than 7.8: the piece that crosses the target is taken.
    files = [staged(b, 2.6, at=1000 + b) for b in range(8)]
    assert [round(r.bytes / MB, 1) for r in plan({"d": files}, POLICY, now=1010)] == [10.4, 10.4]
    # Only what has arrived is cut: 9 MB staged waits for the next piece to tell.
    assert plan({"d": [staged(b, 3, at=1000 + b) for b in range(3)]}, POLICY, now=1003) == []
    # A staged file larger than the target is a file of its own.
    big = [staged(0, 1, at=1000), staged(1, 25, at=1001), staged(2, 1, at=1002)]
    rolls = plan({"d": big}, POLICY, now=1003)
    assert [[s.batch[1] for s in r.inputs] for r in rolls] == [[0], [1]]


@pytest.mark.parametrize("piece_mb", [0.3, 0.7, 1.3, 1.9])
def test_finished_files_land_within_ten_percent_of_the_target_when_pieces_are_small(piece_mb):
    """The seed's small-files problem: whatever a batch stages, up to a fifth of the target,
    files come out within 10 % of it."""
    files = [staged(b, piece_mb, at=1000 + b) for b in range(200)]
    rolls = plan({"d": files}, POLICY, now=1200)
    assert len(rolls) >= 5
    for roll in rolls:
        assert abs(roll.bytes - POLICY.target_bytes) <= 0.1 * POLICY.target_bytes


def test_the_rest_rolls_by_age_or_by_inactivity():
    files = [staged(0, 1, at=1000), staged(1, 1, at=1500)]
    assert plan({"d": files}, POLICY, now=1700) == []
    # 300 s without a batch: inactivity.
    assert [r.reason for r in plan({"d": files}, POLICY, now=1800)] == ["inactivity"]
    # A partition that keeps getting rows still rolls once its oldest waited 900 s.
    busy = [staged(b, 0.1, at=1000 + 100 * b) for b in range(10)]
    assert [r.reason for r in plan({"d": busy}, POLICY, now=1899)] == []
    assert [r.reason for r in plan({"d": busy}, POLICY, now=1900)] == ["age"]


def test_partitions_roll_on_their_own():
    pending = {
        "day=1": [staged(0, 11, at=1000, partition="day=1")],
        "day=2": [staged(0, 1, at=1000, partition="day=2")],
    }
    rolls = plan(pending, POLICY, now=1001)
    assert [(r.partition, r.reason) for r in rolls] == [("day=1", "size")]


def test_files_of_another_schema_are_never_merged_together():
    files = [staged(0, 1, 1000, schema="old"), staged(1, 1, 1001, schema="new")]
    rolls = plan({"d": files}, POLICY, now=1002)
    assert [(r.reason, [s.schema for s in r.inputs]) for r in rolls] == [("schema", ["old"])]


def test_flush_rolls_everything_and_order_is_by_batch():
    files = [staged(2, 1, 1002), staged(0, 1, 1000), staged(1, 1, 1001)]
    (roll,) = plan({"d": files}, POLICY, now=1003, flush=True)
    assert roll.reason == "flush"
    assert [s.batch[1] for s in roll.inputs] == [0, 1, 2]


def test_next_check_is_the_earliest_age_or_inactivity_deadline():
    files = [staged(0, 1, at=1000), staged(1, 1, at=1100)]
    assert next_check({"d": files}, POLICY, now=1100) == 1400  # inactivity: 1100 + 300
    assert next_check({"d": files}, POLICY, now=1500) == 1500  # overdue: now
    assert next_check({}, POLICY, now=1100) is None
