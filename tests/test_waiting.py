"""The polling helpers every waiting test goes through (tests/waiting.py)."""

from __future__ import annotations

import pytest

from tests.waiting import wait_for, wait_until


def test_wait_until_returns_the_first_truthy_value():
    values = iter([None, 0, "", {"found": 1}])
    assert wait_until(lambda: next(values), 5, "a value", every=0.01) == {"found": 1}


def test_wait_until_fails_saying_what_it_waited_for_with_the_details():
    with pytest.raises(AssertionError) as failed:
        wait_until(lambda: False, 0.2, "the pipeline to stop", every=0.05, details=lambda: "runs")
    assert str(failed.value) == "timed out after 0.2s waiting for the pipeline to stop\nruns"


def test_a_failing_details_callback_does_not_hide_the_timeout():
    def broken():
        raise RuntimeError("the stack is down")

    with pytest.raises(AssertionError, match="waiting for rows") as failed:
        wait_until(lambda: False, 0.1, "rows", every=0.05, details=broken)
    assert "the stack is down" in str(failed.value)


def test_ignored_errors_count_as_not_yet_and_the_last_is_named():
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError("refused")
        return "up"

    assert wait_until(flaky, 5, "the service", every=0.01, ignore=(ConnectionError,)) == "up"
    with pytest.raises(AssertionError, match="last error: ConnectionError"):
        wait_until(flaky_down, 0.1, "the service", every=0.05, ignore=(ConnectionError,))
    with pytest.raises(KeyError):  # not ignored: raised at once
        wait_until(lambda: {}["x"], 5, "a key", ignore=(ConnectionError,))


def flaky_down():
    raise ConnectionError("refused")


def test_wait_for_says_whether_the_condition_came_true():
    assert wait_for(lambda: True, 1) is True
    assert wait_for(lambda: False, 0.1) is False
