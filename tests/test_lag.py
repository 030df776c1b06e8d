"""Lag status and backpressure maths (pure logic, time passed in)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from hypothesis import given
from hypothesis import strategies as st

from controlplane.observability.lag import (
    Batch,
    Sample,
    backpressure,
    lag_status,
    partition_lags,
)

T0 = datetime(2026, 11, 22, 3, 0, tzinfo=UTC)


def samples(*points):
    """(seconds, lag, committed) triples."""
    return [Sample(at=T0 + timedelta(seconds=s), lag=lag, committed=c) for s, lag, c in points]


def test_partition_lag_is_the_log_end_minus_what_was_committed():
    lags = partition_lags(
        {("t", 0): 90, ("t", 1): 100},
        {("t", 0): 100, ("t", 1): 100, ("t", 2): 40},
        earliest={("t", 2): 10},
    )
    assert [(p.partition, p.committed, p.lag) for p in lags] == [
        (0, 90, 10),
        (1, 100, 0),
        (2, None, 30),
    ]


def test_a_job_that_keeps_up_is_ok():
    status = lag_status(
        samples((0, 5, 100), (30, 0, 200), (60, 3, 300)),
        running=True,
        now=T0 + timedelta(seconds=60),
        window=60,
    )
    assert status.status == "ok"


def test_lag_growing_over_the_window_is_lagging():
    status = lag_status(
        samples((0, 100, 0), (30, 400, 500), (60, 900, 1000)),
        running=True,
        now=T0 + timedelta(seconds=60),
        window=60,
    )
    assert status.status == "lagging"
    assert status.trend == 800 / 60
    assert status.eta_seconds is None


def test_lag_with_offsets_that_do_not_move_is_stalled():
    status = lag_status(
        samples((0, 100, 500), (30, 150, 500), (60, 150, 500)),
        running=True,
        now=T0 + timedelta(seconds=60),
        window=60,
    )
    assert status.status == "stalled"


def test_a_shrinking_lag_is_ok_with_a_time_to_catch_up():
    status = lag_status(
        samples((0, 1000, 0), (10, 500, 600)),
        running=True,
        now=T0 + timedelta(seconds=10),
        window=60,
    )
    assert status.status == "ok"
    assert status.trend == -50
    assert status.eta_seconds == 10


def test_a_stopped_pipeline_is_stopped_whatever_its_lag():
    status = lag_status(
        samples((0, 10, 5), (60, 500, 5)), running=False, now=T0 + timedelta(seconds=60), window=60
    )
    assert status.status == "stopped"
    assert status.trend > 0  # the lag still grows, and is shown


def test_backpressure_levels_follow_the_busy_ratio():
    def level(duration_ms, trigger=1.0):
        return backpressure(
            [Batch(duration_ms, 100)] * 3,
            trigger_seconds=trigger,
            max_records_per_batch=10_000,
            lag_growing=False,
        )

    assert (level(200).level, level(200).busy_ratio) == ("ok", 0.2)
    assert level(700).level == "low"
    assert level(1500).level == "high"
    assert (
        backpressure([], trigger_seconds=1, max_records_per_batch=None, lag_growing=False).level
        == "ok"
    )


def test_batches_capped_by_admission_control_while_lag_grows_are_high_backpressure():
    capped = [Batch(300, 1000)] * 4
    high = backpressure(capped, trigger_seconds=0, max_records_per_batch=1000, lag_growing=True)
    assert (high.level, high.capped_share) == ("high", 1.0)
    assert "capped" in high.reason
    catching_up = backpressure(
        capped, trigger_seconds=0, max_records_per_batch=1000, lag_growing=False
    )
    assert catching_up.level == "low"


@given(
    st.lists(
        st.tuples(st.floats(0, 600), st.integers(0, 10**9), st.integers(0, 10**9)),
        min_size=0,
        max_size=30,
    ),
    st.booleans(),
)
def test_the_status_is_one_of_four_and_a_time_to_catch_up_only_when_the_lag_shrinks(
    points, running
):
    status = lag_status(
        samples(*points), running=running, now=T0 + timedelta(seconds=600), window=300
    )
    assert status.status in {"ok", "lagging", "stalled", "stopped"}
    if status.eta_seconds is not None:
        assert status.trend < 0 and status.eta_seconds >= 0


def test_the_offsets_a_query_started_from_are_read_from_its_checkpoint(tmp_path):
    from jobs.checkpoints import source_start_offsets as initial_offsets

    assert initial_offsets(tmp_path) == {}
    (tmp_path / "sources" / "0").mkdir(parents=True)
    # As Spark's Kafka connector writes it: a zero byte, a version line, then JSON.
    (tmp_path / "sources" / "0" / "0").write_bytes(b'\x00v1\n{"t":{"1":7,"0":42}}')
    assert initial_offsets(tmp_path) == {("t", 0): 42, ("t", 1): 7}


# -- judged over commits, as Burrow judges consumers ------------------------------------------


def sawtooth(lags):
    """A sample every 10 s, each after a new commit (committed grows by 2000 each time)."""
    return samples(*((10 * i, lag, 2000 * (i + 1)) for i, lag in enumerate(lags)))


def test_a_sawtooth_between_commits_is_ok_however_it_is_sampled():
    """200 events/s, a 1 s trigger: each sample catches the lag somewhere in its tooth."""
    for lags in ([150, 30, 190, 80, 120, 60, 170], [10, 50, 90, 130, 170, 190, 40]):
        status = lag_status(sawtooth(lags), running=True, now=T0 + timedelta(seconds=60), window=60)
        assert status.status == "ok", lags


def test_lag_at_every_commit_never_lower_than_before_is_lagging():
    status = lag_status(
        sawtooth([100, 300, 300, 700, 1200, 1500, 2100]),
        running=True,
        now=T0 + timedelta(seconds=60),
        window=60,
    )
    assert status.status == "lagging"


def test_one_commit_that_caught_up_is_ok():
    status = lag_status(
        sawtooth([100, 300, 0, 700, 1200]), running=True, now=T0 + timedelta(seconds=40), window=60
    )
    assert status.status == "ok"


def test_too_few_commits_are_not_enough_to_say_lagging():
    status = lag_status(
        sawtooth([100, 900]), running=True, now=T0 + timedelta(seconds=10), window=60
    )
    assert status.status == "ok"


def test_a_commits_lag_is_the_lowest_sampled_while_it_stood():
    from controlplane.observability.lag import commits

    found = commits(samples((0, 50, 1), (5, 20, 1), (10, 80, 2), (15, 90, 2), (20, 10, 3)))
    assert found == [20, 80, 10]


def test_growth_within_the_sawtooth_of_a_job_that_keeps_up_is_not_lagging():
    """A job keeping up with 200 records/s at a 1 s trigger drifted from 95 to 223 records
    over 20 s (seen on a real member of a shared application), then caught up: its lag never
    grew by more than what arrives in a trigger interval and a batch."""
    drift = sawtooth([95, 114, 124, 136, 145, 164, 175])
    now = T0 + timedelta(seconds=60)
    assert lag_status(drift, running=True, now=now, window=60, noise=260).status == "ok"
    assert lag_status(drift, running=True, now=now, window=60, noise=0).status == "lagging"


def test_a_window_not_yet_half_sampled_is_not_lagging():
    young = sawtooth([100, 300, 700])  # 20 s of samples in a 60 s window
    now = T0 + timedelta(seconds=20)
    assert lag_status(young, running=True, now=now, window=60).status == "ok"
