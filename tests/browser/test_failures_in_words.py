"""Real failures, said in words everywhere: four members of one real shared Spark application
fail as the on-call engineer at 3 a.m. met them (an upsert key that is not an output column,
an existing column whose type cannot take the output, a topic that does not exist, a row the
table refuses at every replay), and a dedicated driver is SIGKILLed. For each: the one-line
cause names what to fix, in the API, on the overview and the pipeline page's first screen (a
real browser), and in the alert's text; the member that keeps failing is red (crash-looping)
although its status says it runs or backs off.
"""

from __future__ import annotations

import os
import signal
import uuid

import psycopg
import pytest
from django.utils import timezone
from playwright.sync_api import expect

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertRule
from controlplane.definitions.models import Failure, Pipeline
from controlplane.supervision import driver_files
from tests.browser.pages import sign_in
from tests.kafka_helpers import produce
from tests.runs import POLICY, current, driver_pid, new_pipeline, reconcile_until, tick_until

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

pytestmark = [pytest.mark.spark, pytest.mark.kafka, pytest.mark.django_db(transaction=True)]

# The transform hides its output from validation (a generator), so the key is checked only
# when the sink creates its table.
HIDDEN = "SELECT inline(array(struct(id, n))) FROM source"


def _failed(name: str) -> bool:
    return Pipeline.objects.get(name=name).status == "failed"


def test_each_failure_is_said_in_words_in_the_api_the_pages_and_the_alerts(
    browser,
    settings,
    api,
    kafka_connection,
    postgres_connection,
    kafka_bootstrap,
    sink_dsn,
    shared,
    django_user_model,
    live_server,
):
    missing = f"missing-{uuid.uuid4().hex[:8]}"
    made = {}
    for name, spec in {
        "keyed": {
            "transform": {"sql": HIDDEN},
            "sink": {
                "connection": "warehouse",
                "table": None,
                "mode": "upsert",
                "key": ["courier_id"],
            },
        },
        "typed": {},
        "notopic": {"source": {"topics": [missing]}},
        "looping": {},
    }.items():
        source = spec.pop("source", None)
        sink = spec.pop("sink", None)
        topic, table = new_pipeline(
            api, kafka_bootstrap, name, source=source, restart_policy=POLICY, **spec
        )
        if sink is not None:
            sink["table"] = table
            response = api.patch(f"/api/pipelines/{name}/", {"spec": {"sink": sink}}, format="json")
            assert response.status_code == 200, response.json()
        Pipeline.objects.filter(name=name).update(placement="shared")
        made[name] = (topic, table)
    with psycopg.connect(sink_dsn, autocommit=True) as conn:
        conn.execute(f'CREATE TABLE "{made["typed"][1]}" (id text, n timestamptz)')
        looping = made["looping"][1]
        conn.execute(
            f'CREATE TABLE "{looping}" (id text, n int, CONSTRAINT reject CHECK (n <> -1))'
        )
    for name, (topic, _) in made.items():
        if name != "notopic":
            rows = [{"id": f"{name}{i}", "n": -1 if name == "looping" else i} for i in range(5)]
            produce(kafka_bootstrap, topic, rows)
        assert api.post(f"/api/pipelines/{name}/start/").status_code == 202
    rule = AlertRule.objects.create(name="red", kind="unhealthy", repeat_seconds=0)

    tick_until(
        lambda: (
            all(_failed(n) for n in ("keyed", "typed", "notopic"))
            and Failure.objects.filter(pipeline__name="looping").count() >= 3
        ),
        300,
        "three permanent failures and a crash loop",
    )
    expected = {
        "keyed": ("unknown-column", 'column "courier_id" named in key does not exist'),
        "typed": ("type-mismatch", "column n"),
        "notopic": ("missing-topic", f"the source's topic '{missing}' not found"),
        "looping": ("constraint", 'violates check constraint "reject"'),
    }
    # The API: the health, the cause in one line, its category and fix.
    for name, (category, words) in expected.items():
        health = api.get(f"/api/pipelines/{name}/").json()["health"]
        assert health["colour"] == "red", (name, health)
        assert health["cause"]["category"] == category, (name, health)
        assert words in health["cause"]["summary"], (name, health)
        assert health["cause"]["fix"]
    # The row and column Postgres' CONTEXT names, from a Python worker's exception.
    assert ", line 1, column n:" in Failure.objects.filter(pipeline__name="typed")[0].reason
    looping = api.get("/api/pipelines/looping/").json()
    assert looping["health"]["state"] == "crash-looping"
    assert looping["status"] in ("running", "backing-off", "restarting", "starting")

    # The alert's text.
    engine.evaluate(timezone.now())
    for name, (_, words) in expected.items():
        alert = Alert.objects.get(rule=rule, pipeline__name=name)
        assert words in alert.message, (name, alert.message)

    # The overview and the pipeline page's first screen, in a real browser.
    page = sign_in(browser, live_server, django_user_model, "oona", "viewer")
    for name, (_, words) in expected.items():
        row = page.locator(f'tr[data-pipeline="{name}"]')
        expect(row.locator(".health")).to_have_class("health health-red")
        assert words in row.locator(".why.clamp").get_attribute("title"), name
    for name, (_, words) in expected.items():
        page.goto(f"{live_server.url}/pipelines/{name}/")
        cause = page.locator("#status [data-cause]")
        expect(cause).to_contain_text(words)
        box = cause.bounding_box()
        assert box["y"] + box["height"] <= page.viewport_size["height"], name

    # A dedicated driver SIGKILLed: its cause is the signal, never the noise it printed.
    # (With its Spark UI on: the page says where it listens.)
    settings.CONTROLPLANE_SPARK_UI_ENABLED = True
    for name in expected:
        api.post(f"/api/pipelines/{name}/stop/")
    topic, _ = new_pipeline(api, kafka_bootstrap, "killed", restart_policy=POLICY)
    produce(kafka_bootstrap, topic, [{"id": "k0", "n": 0}])
    assert api.post("/api/pipelines/killed/start/").status_code == 202
    reconcile_until(
        "killed",
        lambda: (run := current("killed")) is not None and run.last_batch_id is not None,
        240,
        "the dedicated driver's first batch",
    )
    ui = driver_files.spark_ui(current("killed"))
    assert ui is not None and ui.loopback and ui.port >= 4040, ui
    page.goto(f"{live_server.url}/pipelines/killed/")
    expect(page.locator("#status [data-spark-ui]")).to_contain_text(f"Spark UI at {ui.url}")
    os.kill(driver_pid(current("killed")), signal.SIGKILL)
    reconcile_until(
        "killed",
        lambda: Failure.objects.filter(pipeline__name="killed").exists(),
        60,
        "the killed driver's failure",
    )
    failure = Failure.objects.get(pipeline__name="killed")
    assert (failure.category, failure.reason) == ("killed", "killed by signal 9 (SIGKILL)")
    restarts = AlertRule.objects.create(
        name="restarts", kind="restarts", params={"count": 0, "minutes": 10}, repeat_seconds=0
    )
    engine.evaluate(timezone.now())
    alert = Alert.objects.get(rule=restarts, pipeline__name="killed")
    assert alert.message.endswith("; last failure: killed by signal 9 (SIGKILL)"), alert.message
    page.goto(f"{live_server.url}/pipelines/killed/")
    expect(page.locator("#status [data-cause]")).to_have_text("killed by signal 9 (SIGKILL)")
    said = api.get("/api/pipelines/killed/failures/").json()["results"][0]
    assert said["summary"] == "killed by signal 9 (SIGKILL)" and "OOM killer" in said["fix"]
