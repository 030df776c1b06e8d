"""Time until data loss, against the real broker: records a pipeline has not read, in a
topic with a short retention, are counted down to the moment retention may delete them;
the figure is stored by the metrics collector, shown by the API and Prometheus, and a
`data-loss` alert rule fires on it."""

from __future__ import annotations

import time
import uuid

import pytest
from django.utils import timezone
from kafka import KafkaAdminClient
from kafka.admin import NewTopic

from controlplane.alerting import engine
from controlplane.alerting.models import Alert, AlertRule
from controlplane.definitions.models import PipelineFigures
from controlplane.observability.collector import collect
from controlplane.observability.lag import time_until_loss
from tests.kafka_helpers import CREATED, produce

pytestmark = pytest.mark.kafka

HOUR_MS = 3_600_000


def topic_with_retention(bootstrap: str, retention_ms: int) -> str:
    name = f"loss-{uuid.uuid4().hex[:10]}"
    CREATED.add(name)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics(
            [NewTopic(name, 1, 1, topic_configs={"retention.ms": str(retention_ms)})]
        )
    finally:
        admin.close()
    return name


def new_pipeline(api, name: str, topic: str) -> None:
    spec = {
        "source": {
            "connection": "events", "topics": [topic], "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": name},
    }  # fmt: skip
    response = api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")
    assert response.status_code == 201, response.json()


def test_the_soonest_partition_under_time_retention_counts():
    now = 10 * HOUR_MS
    unread = {("a", 0): now - 50 * 60_000, ("a", 1): now - 10 * 60_000, ("b", 0): now - HOUR_MS}
    assert time_until_loss(unread, {"a": HOUR_MS, "b": None}, now) == {
        "seconds": 600.0, "topic": "a", "partition": 0, "retention_ms": HOUR_MS,
    }  # fmt: skip
    assert time_until_loss(unread, {"a": None, "b": None}, now) is None
    late = {("a", 0): now - 2 * HOUR_MS}
    assert time_until_loss(late, {"a": HOUR_MS}, now)["seconds"] == 0.0  # past it already


def test_a_stopped_pipeline_s_unread_records_are_counted_down_and_alerted(
    api, kafka_connection, postgres_connection, kafka_bootstrap
):
    short = topic_with_retention(kafka_bootstrap, HOUR_MS)
    forever = topic_with_retention(kafka_bootstrap, -1)
    fifty_minutes_ago = int(time.time() * 1000) - 50 * 60_000
    for topic in (short, forever):
        produce(
            kafka_bootstrap, topic, ({"id": f"r{i}", "n": i} for i in range(20)), partitions=1,
            timestamp=lambda i: fifty_minutes_ago + i,
        )  # fmt: skip
    new_pipeline(api, "soon", short)
    new_pipeline(api, "never", forever)
    AlertRule.objects.create(name="loss", kind="data-loss", params={"below": 900})

    now = timezone.now()
    collect(now)
    left = PipelineFigures.objects.get(pipeline__name="soon").data_loss_seconds
    expected = (fifty_minutes_ago + HOUR_MS) / 1000 - now.timestamp()
    assert left == pytest.approx(expected, abs=2)  # about 10 minutes
    assert PipelineFigures.objects.get(pipeline__name="never").data_loss_seconds is None

    lag = api.get("/api/pipelines/soon/metrics/").json()["lag"]
    assert lag["records"] == 20
    assert lag["data_loss"]["topic"] == short and lag["data_loss"]["partition"] == 0
    assert lag["data_loss"]["retention_ms"] == HOUR_MS
    assert api.get("/api/pipelines/never/metrics/").json()["lag"]["data_loss"] is None
    scrape = api.get("/metrics").content.decode()
    assert 'cp_time_until_data_loss_seconds{pipeline="soon"}' in scrape
    assert 'cp_time_until_data_loss_seconds{pipeline="never"}' not in scrape

    from django.contrib.auth import get_user_model
    from django.test import Client

    from controlplane.accounts.roles import set_role

    viewer = get_user_model().objects.create_user(username="v", password="x-not-used-1")
    set_role(viewer, "viewer")
    page = Client()
    page.force_login(viewer)
    html = page.get("/pipelines/soon/").content.decode()
    assert f"unread records in {short}/0 may be deleted by retention in" in html

    assert engine.evaluate(now)["fired"] == 1
    alert = Alert.objects.get()
    assert alert.subject == "soon"
    assert alert.message.startswith("unread records may be deleted by retention in 10 min")
