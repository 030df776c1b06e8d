"""The files sink's rolling policy (jobs.sinks.rolling): pure logic, time passed in."""

from __future__ import annotations

from jobs.sinks.rolling import Policy, Staged, next_check, plan

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


def test_files_are_cut_as_soon_as_their_inputs_reach_the_target():
    files = [staged(b, 3, at=1000 + b) for b in range(10)]  # 30 MB in 3 MB pieces
    rolls = plan({"day=1": files}, POLICY, now=1010)
    assert [r.reason for r in rolls] == ["size", "size"]
    assert [r.bytes // MB for r in rolls] == [12, 12]
    assert [s.batch[1] for s in rolls[0].inputs] == [0, 1, 2, 3]
    # The last 6 MB wait: younger than the age limit, and batches still come.
    assert sum(len(r.inputs) for r in rolls) == 8


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
