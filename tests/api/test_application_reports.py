"""A shared application's members' reports in one request: the application's token for the
request, each report fenced by its own run's token."""

from __future__ import annotations

import pytest

from controlplane.accounts.models import digest
from controlplane.definitions.models import BatchProgress, Pipeline, Run, SparkApplication
from tests.clients import PROGRESS, driver


@pytest.fixture
def members(pipeline):
    """Application `shared` (token 'app-tok') with two current members, orders (token
    'tok-o') and second ('tok-s'); a stale run of second (generation 1, 'tok-old'); and a
    current run of a pipeline in another application ('tok-x')."""
    app = SparkApplication.objects.create(
        name="shared", desired_state="running", status="running", generation=1,
        token_digest=digest("app-tok"),
    )  # fmt: skip
    other_app = SparkApplication.objects.create(name="other", token_digest=digest("other-tok"))
    orders = Pipeline.objects.get(name="orders")
    second = Pipeline.objects.create(name="second", spec=orders.spec)
    third = Pipeline.objects.create(name="third", spec=orders.spec)
    Pipeline.objects.update(desired_state="running", status="running", generation=2)
    runs = {}
    for key, pipeline, generation, token, application in (
        ("orders", orders, 2, "tok-o", app),
        ("old", second, 1, "tok-old", app),
        ("second", second, 2, "tok-s", app),
        ("third", third, 2, "tok-x", other_app),
    ):
        runs[key] = Run.objects.create(
            pipeline=pipeline, generation=generation, spec_version=1,
            state="running" if generation == 2 else "exited", token_digest=digest(token),
            application=application, application_generation=1,
        )  # fmt: skip
    return runs


def report(run, token, kind, body=None):
    return {"run_id": run.pk, "token": token, "kind": kind, "body": body or {}}


def test_every_member_s_reports_are_answered_in_order_as_their_own_endpoints_would(members):
    o, s = members["orders"], members["second"]
    batches = [{**PROGRESS, "batchId": b} for b in (4, 5)]
    response = driver("app-tok").post(
        "/api/applications/shared/reports/",
        {
            "reports": [
                report(o, "tok-o", "progress", PROGRESS),  # one batch
                report(s, "tok-s", "heartbeat", {"idle": True}),
                report(o, "tok-o", "progress", batches),  # a list
                report(members["old"], "tok-old", "heartbeat"),  # a stale generation
                report(members["third"], "tok-x", "heartbeat"),  # another application's
                report(s, "tok-o", "heartbeat"),  # another member's token
                report(s, "tok-s", "progress", {"batchId": -1}),  # bad progress
                {"run_id": s.pk, "kind": "reboot"},  # not a report
            ]
        },
        format="json",
    )
    assert response.status_code == 200, response.content
    answers = response.json()["answers"]
    assert [a["status"] for a in answers] == [200, 200, 200, 409, 401, 401, 400, 400]
    assert answers[0]["body"] == {"stop": False, "generation": 2}
    assert answers[3]["body"]["stop"] is True
    assert "batchId" in answers[6]["body"]["body"]
    assert set(answers[7]["body"]) == {"token", "kind"}
    assert sorted(BatchProgress.objects.filter(run=o).values_list("batch_id", flat=True)) == [
        3, 4, 5,
    ]  # fmt: skip
    o.refresh_from_db()
    s.refresh_from_db()
    assert o.last_batch_id == 5 and o.last_batch_at and o.last_heartbeat_at
    assert o.last_idle_at is None
    assert s.last_idle_at and s.last_heartbeat_at and s.last_batch_id is None
    assert not BatchProgress.objects.filter(run=s).exists()
    members["third"].refresh_from_db()
    assert members["third"].last_heartbeat_at is None  # not heard through `shared`


def test_a_member_whose_pipeline_should_stop_is_told_so(members):
    Pipeline.objects.filter(name="orders").update(desired_state="stopped")
    response = driver("app-tok").post(
        "/api/applications/shared/reports/",
        {"reports": [report(members["orders"], "tok-o", "heartbeat")]},
        format="json",
    )
    assert response.json()["answers"] == [{"status": 200, "body": {"stop": True, "generation": 2}}]


def test_only_the_application_itself_may_send_and_requests_are_bounded(members):
    body = {"reports": [report(members["orders"], "tok-o", "heartbeat")]}
    url = "/api/applications/shared/reports/"
    assert driver("other-tok").post(url, body, format="json").status_code == 403
    assert driver("tok-o").post(url, body, format="json").status_code == 401  # a run's token
    assert driver("nope").post(url, body, format="json").status_code == 401
    too_many = {"reports": [report(members["orders"], "tok-o", "heartbeat")] * 501}
    response = driver("app-tok").post(url, too_many, format="json")
    assert response.status_code == 400
    assert response.json()["reports"] == ["send a list of 1 to 500 reports"]
    assert driver("app-tok").post(url, {"reports": []}, format="json").status_code == 400
    assert Run.objects.get(pk=members["orders"].pk).last_heartbeat_at is None
