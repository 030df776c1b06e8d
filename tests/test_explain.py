"""Why a run ended, in words (controlplane.supervision.explain): pure."""

from __future__ import annotations

import pytest

from controlplane.supervision.explain import CATALOGUE, KILLED, cause_of, recorded, summarize

SPARK_ANALYSIS = """Traceback (most recent call last):
  File "/work/main/jobs/run.py", line 97, in serve
pyspark.errors.exceptions.captured.AnalysisException: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, or function parameter with name `amount_cents` cannot be resolved. Did you mean one of the following? [`amount`, `id`]. SQLSTATE: 42703;
'Project ['amount_cents]
"""  # noqa: E501 - as Spark prints it
OOM = """26/11/23 10:00:01 ERROR Executor: Exception in task 0.0
java.lang.OutOfMemoryError: Java heap space
	at java.base/java.util.Arrays.copyOf(Arrays.java:3537)
"""
DATA_LOSS = """pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] Query terminated with exception: Partition events-0's offset was changed from 120 to 40, Some data may have been lost because they are not available in Kafka any more
"""  # noqa: E501
PYTHON = """Traceback (most recent call last):
  File "x.py", line 1, in <module>
ValueError: the spec's sink table is empty
"""


@pytest.mark.parametrize(
    ("cause", "code", "error", "expected"),
    [
        ("crashed", -9, "", "killed by signal 9 (SIGKILL)"),
        ("crashed", 137, "", "killed by signal 9 (SIGKILL)"),
        ("crashed", 143, "", "killed by signal 15 (SIGTERM)"),
        # The noise a killed driver leaves (its Python side losing the JVM) is not the cause.
        ("crashed", -9, "ConnectionRefusedError: [Errno 111]", "killed by signal 9 (SIGKILL)"),
        (
            "crashed",
            1,
            SPARK_ANALYSIS,
            "Spark analysis error: A column, variable, or function parameter with name"
            " `amount_cents` cannot be resolved. Did you mean one of the following? [`amount`,"
            " `id`]. SQLSTATE: 42703;",
        ),
        ("crashed", 1, OOM, "out of memory: Java heap space"),
        (
            "crashed",
            1,
            DATA_LOSS,
            "Kafka data loss: records were deleted by retention before the pipeline read them",
        ),
        ("crashed", 1, PYTHON, "ValueError: the spec's sink table is empty"),
        ("crashed", 3, "no idea\n", "exited with code 3"),
        ("exited", 0, "", "exited (code 0) without being asked to"),
        ("killed", -9, "killed by oncall: runaway", "killed by oncall: runaway"),
        ("stopped", 0, "", "stopped as asked"),
        (
            "lost-heartbeat",
            None,
            "no heartbeat for 47 s (timeout 45 s)",
            "lost heartbeat: no heartbeat for 47 s (timeout 45 s)",
        ),
        (
            "host-lost",
            None,
            "host b is lost (silent since 2026-11-23 10:00:00 UTC): the run's token is revoked",
            "host b is lost (silent since 2026-11-23 10:00:00 UTC): the run's token is revoked",
        ),
        (
            "vanished",
            None,
            "the driver process is gone",
            "the driver's process disappeared without an exit report",
        ),
        ("application-lost", None, "", "its shared application's process ended"),
    ],
)
def test_a_run_s_end_is_said_in_words(cause, code, error, expected):
    assert summarize(cause, code, error) == expected


def test_a_long_detail_is_clipped():
    said = summarize("crashed", 1, "RuntimeError: " + "x" * 500)
    assert said.startswith("RuntimeError: xxx") and said.endswith("…")
    assert len(said) <= len("RuntimeError: ") + 200


def test_the_api_and_the_page_say_it_first(api, pipeline, django_user_model):
    from django.test import Client
    from django.utils import timezone

    from controlplane.accounts.roles import set_role
    from controlplane.definitions.models import Failure, Pipeline, Run

    p = Pipeline.objects.get(name="orders")
    run = Run.objects.create(
        pipeline=p, generation=1, spec_version=1, state="exited", exit_code=1, cause="crashed",
        error_tail=OOM,
    )  # fmt: skip
    Failure.objects.create(
        pipeline=p, run=run, at=timezone.now(), cause="crashed", message=OOM, decision="x"
    )
    failures = api.get("/api/pipelines/orders/failures/").json()["results"]
    assert failures[0]["summary"] == "out of memory: Java heap space"
    assert failures[0]["message"] == OOM  # the tail is still there, below
    runs = api.get("/api/pipelines/orders/runs/").json()["results"]
    assert runs[0]["summary"] == "out of memory: Java heap space"

    user = django_user_model.objects.create_user(username="v", password="x-not-used-1")
    set_role(user, "viewer")
    client = Client()
    client.force_login(user)
    html = client.get("/pipelines/orders/").content.decode()
    assert '<strong class="summary">out of memory: Java heap space</strong>' in html


# -- the catalogue: one line naming what to fix, its category and the fix --------------------

KEY_VERDICT = {
    "kind": "permanent",
    "reason": 'a definition error (the sink table has no such column): column "courier_id"'
    " named in key does not exist",
    "type": "psycopg.errors.UndefinedColumn",
    "condition": "42703",
    "category": "unknown-column",
}
# What the run's error output holds then: Spark's wrapper first, the cause after 1,500 chars.
WRAPPED = (
    "pyspark.errors.exceptions.captured.StreamingQueryException: [STREAM_FAILED] Query [id ="
    " 1] terminated with exception: [FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred in"
    " the user provided function in foreach batch sink. " + "x" * 1500
)


def test_the_drivers_verdict_is_the_line_shown_not_sparks_wrapper():
    said = cause_of("crashed", 1, WRAPPED, KEY_VERDICT)
    assert said.line == KEY_VERDICT["reason"]
    assert said.category == "unknown-column"
    assert "ALTER TABLE" in said.fix
    assert said.title == "a column that does not exist"


def test_a_signal_beats_whatever_the_killed_driver_printed():
    said = cause_of("crashed", -9, "WARNING: Using incubator modules: jdk.incubator.vector", None)
    assert (said.category, said.line) == (KILLED, "killed by signal 9 (SIGKILL)")
    assert "OOM killer" in said.fix


@pytest.mark.parametrize(
    ("cause", "category", "words"),
    [
        ("application-lost", "application-lost", "its shared application's process ended"),
        ("host-lost", "host-lost", "host was lost"),
        ("lost-heartbeat", "lost-heartbeat", "no heartbeat"),
        ("vanished", "vanished", "disappeared without an exit report"),
    ],
)
def test_ends_the_control_plane_saw_have_their_own_entries(cause, category, words):
    said = cause_of(cause, None, "", None)
    assert said.category == category and words in said.line
    assert said.fix and said.fix != CATALOGUE["other"].fix


def test_an_unknown_category_from_a_report_is_other():
    said = cause_of("crashed", 1, "", {**KEY_VERDICT, "category": "<script>"})
    assert said.category == "other" and said.fix == CATALOGUE["other"].fix


def test_without_a_verdict_the_text_says_what_it_can():
    said = cause_of("crashed", 1, OOM, None)
    assert (said.category, said.line) == ("out-of-memory", "out of memory: Java heap space")


def test_every_category_a_driver_gives_has_an_entry():
    from jobs.failures import CATEGORIES

    assert set(CATEGORIES) <= set(CATALOGUE)


def test_a_recorded_reason_is_kept_and_an_older_failure_is_read_again():
    kept = recorded("crashed", 1, WRAPPED, reason="missing x", category="missing-topic")
    assert (kept.line, kept.category) == ("missing x", "missing-topic")
    again = recorded("crashed", -9, "noise", reason="", category="")
    assert again.line == "killed by signal 9 (SIGKILL)"


def test_a_long_line_is_cut_at_a_word_never_inside_one():
    from jobs.failures import clip

    text = "column " + " ".join(f"word{i}" for i in range(100))
    cut = clip(text, 60)
    assert len(cut) <= 60 and cut.endswith("…")
    assert cut[:-1].split()[-1] in text.split()  # the last word is whole
