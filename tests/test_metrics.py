"""Pipeline metrics and checkpoints through the API, against real Kafka, Spark and Postgres.

The job runs in the test's Spark session (Trigger.AvailableNow) with the checkpoint where the
control plane keeps it; between runs the pipeline is stopped, as after an operator's stop.
Figures are what the metrics collector stored: each test runs a round (`collect`) where the
beat task would.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from django.utils import timezone

from controlplane.observability.collector import collect
from jobs.runconfig import RunConfig
from jobs.spec import parse_spec
from tests.kafka_helpers import new_topic, produce
from tests.spark_helpers import drain

pytestmark = [pytest.mark.spark, pytest.mark.kafka]


@pytest.fixture
def lagging(
    api, kafka_connection, postgres_connection, kafka_bootstrap, sink_dsn, settings, tmp_path
):
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    topic = new_topic(kafka_bootstrap, partitions=3)
    spec = {
        "source": {
            "connection": "events",
            "topics": [topic],
            "schema": "id STRING, n INT",
            "starting_offsets": "earliest",
        },
        "sink": {"connection": "warehouse", "table": f"m_{topic.replace('-', '_')}"},
    }
    response = api.post("/api/pipelines/", {"name": "metered", "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    config = RunConfig(
        pipeline="metered",
        spec=parse_spec(response.json()["spec"]),
        kafka={"bootstrap_servers": [kafka_bootstrap]},
        postgres={"conninfo": sink_dsn},
        checkpoint=str(Path(settings.CONTROLPLANE_CHECKPOINT_ROOT) / "metered"),
        run_dir=str(tmp_path),
    )
    return topic, config


def figures(api, name: str = "metered") -> dict:
    """A collector round, then the pipeline's figures as the API serves them."""
    assert "skipped" not in collect(timezone.now())
    return api.get(f"/api/pipelines/{name}/metrics/").json()


def test_lag_is_exact_while_stopped_and_nothing_once_caught_up(
    spark, api, kafka_bootstrap, lagging
):
    topic, config = lagging
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(300)))
    drain(spark, config)
    oldest_ms = int(time.time() * 1000) - 7_000
    produce(
        kafka_bootstrap,
        topic,
        ({"id": f"b{i}", "n": i} for i in range(120)),
        start=300,
        timestamp=lambda i: oldest_ms + (i - 300) * 10,
    )
    asked = time.time()
    body = figures(api)
    assert 0 <= body["age_seconds"] < 10 and body["collected_at"]
    lag = body["lag"]
    assert lag["error"] is None
    assert lag["records"] == 120
    assert [(p["partition"], p["committed"], p["end"], p["lag"]) for p in lag["partitions"]] == [
        (0, 100, 140, 40),
        (1, 100, 140, 40),
        (2, 100, 140, 40),
    ]
    # The oldest unread record was stamped oldest_ms: its age, as of the collector's round.
    assert abs(lag["seconds"] - (asked - oldest_ms / 1000)) < 1.0
    assert lag["status"] == "stopped"
    checkpoint = body["checkpoint"]
    assert checkpoint["source"] == "checkpoint"
    assert checkpoint["committed_offsets"] == {topic: {"0": 100, "1": 100, "2": 100}}

    page = api.get("/api/pipelines/metered/checkpoints/").json()
    assert page["last_batch_id"] == checkpoint["last_batch_id"]
    assert page["committed_offsets"] == checkpoint["committed_offsets"]
    assert page["in_flight"] == []
    assert page["history"][0]["batch_id"] == page["last_batch_id"]
    assert page["source"] == "checkpoint"
    # No stateful operator in this pipeline: the state figures are there, and empty.
    assert page["state"] == {"state_rows": None, "state_memory_bytes": None, "watermark": None}
    assert page["history"][0]["state_rows"] is None

    drain(spark, config)
    lag = figures(api)["lag"]
    assert (lag["records"], lag["seconds"]) == (0, 0.0)
    # The lag chart has a sample from each round, the stopped job's too.
    history = api.get("/api/pipelines/metered/metrics/history/").json()["lag"]
    assert [point["records"] for point in history] == [120, 0]


def test_a_pipeline_never_started_has_no_checkpoint_but_its_lag_is_known(
    api, kafka_bootstrap, lagging
):
    topic, _config = lagging
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(30)))
    response = api.get("/api/pipelines/metered/checkpoints/")
    assert response.status_code == 404
    assert "has no checkpoint" in response.json()["detail"]
    body = figures(api)
    assert body["checkpoint"]["last_batch_id"] is None
    assert body["lag"]["records"] == 30  # from `earliest`: everything in the topic is to read


def test_an_unreachable_cluster_is_reported_not_a_server_error(api, lagging):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"127.0.0.1:{s.getsockname()[1]}"  # nothing listens there once closed
    response = api.patch(
        "/api/connections/events/", {"settings": {"bootstrap_servers": [dead]}}, format="json"
    )
    assert response.status_code == 200, response.json()
    assert collect(timezone.now())["lag_unknown"] == 1
    response = api.get("/api/pipelines/metered/metrics/")
    assert response.status_code == 200
    lag = response.json()["lag"]
    assert lag["records"] is None
    assert lag["error"].startswith("cannot reach Kafka")


def test_prometheus_exposes_the_same_figures_as_the_api(api, anon, kafka_bootstrap, lagging):
    topic, _config = lagging
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(30)))
    assert anon.get("/metrics").status_code == 401
    lag = figures(api)["lag"]
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    text = response.content.decode()
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert float(samples['cp_lag_records{pipeline="metered"}']) == lag["records"] == 30
    assert 0 <= float(samples['cp_figures_age_seconds{pipeline="metered"}']) < 10
    assert samples['cp_pipeline_status{pipeline="metered",status="stopped"}'] == "1.0"
    assert samples['cp_pipeline_status{pipeline="metered",status="running"}'] == "0.0"
    assert samples['cp_lag_status{pipeline="metered",status="stopped"}'] == "1.0"
    # prometheus_client writes label names in alphabetical order.
    partition = f'cp_partition_lag_records{{partition="0",pipeline="metered",topic="{topic}"}}'
    assert samples[partition] == "10.0"
    assert "# TYPE cp_pipeline_restarts_total counter" in text


def test_history_returns_points_since_a_time_and_refuses_a_bad_one(api, lagging):
    body = api.get("/api/pipelines/metered/metrics/history/").json()
    assert (body["points"], body["lag"]) == ([], [])
    response = api.get("/api/pipelines/metered/metrics/history/?since=yesterday")
    assert response.status_code == 400
    assert response.json() == {
        "since": ["must be an ISO 8601 time with a UTC offset; got 'yesterday'"]
    }


def test_a_round_asks_kafka_once_per_cluster_and_scrapes_ask_it_nothing(
    api, kafka_bootstrap, lagging, monkeypatch
):
    from controlplane.observability import kafka_lookups

    topic, _config = lagging
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(12)))
    spec = api.get("/api/pipelines/metered/").json()["spec"]
    for name in ("twin-a", "twin-b"):  # three pipelines reading one topic
        response = api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")
        assert response.status_code == 201, response.json()
    opened = []
    monkeypatch.setattr(
        kafka_lookups,
        "metadata_consumer",
        lambda config: opened.append(1) or kafka_lookups_original(config),
    )
    kafka_lookups.close_all()

    summary = collect(timezone.now())
    assert summary["pipelines"] == 3 and summary["kafka_bound_lookups"] == 1
    assert len(opened) == 1  # one consumer for the cluster
    for name in ("metered", "twin-a", "twin-b"):
        assert api.get(f"/api/pipelines/{name}/metrics/").json()["lag"]["records"] == 12
    for _ in range(3):
        assert api.get("/metrics").status_code == 200
    assert len(opened) == 1  # pages and scrapes read what was stored
    collect(timezone.now())
    assert len(opened) == 1  # the next round reuses the pooled consumer


def test_before_the_first_round_the_api_says_nothing_was_collected(api, lagging):
    body = api.get("/api/pipelines/metered/metrics/").json()
    assert body["collected_at"] is None and body["age_seconds"] is None
    assert body["lag"]["records"] is None
    assert body["lag"]["error"] == "not collected yet"
    assert body["status"] == "stopped"


def test_a_pipeline_starting_at_latest_lags_only_by_what_came_after_it_started(
    api, kafka_bootstrap, lagging
):
    from controlplane.definitions.models import Pipeline

    topic, _config = lagging
    produce(kafka_bootstrap, topic, ({"id": f"a{i}", "n": i} for i in range(60)))
    spec = api.get("/api/pipelines/metered/").json()["spec"]
    spec["source"]["starting_offsets"] = "latest"
    response = api.post("/api/pipelines/", {"name": "fresh", "spec": spec}, format="json")
    assert response.status_code == 201, response.json()
    # Never run: it will start at the log end, whatever is in the topic now.
    assert figures(api, "fresh")["lag"]["records"] == 0
    produce(kafka_bootstrap, topic, ({"id": f"b{i}", "n": i} for i in range(30)), start=60)
    assert figures(api, "fresh")["lag"]["records"] == 0
    # Launched (its first batch not committed yet): the end it started from is kept, and
    # what arrives after it is lag, not the whole topic.
    Pipeline.objects.filter(name="fresh").update(generation=1)
    assert figures(api, "fresh")["lag"]["records"] == 0
    produce(kafka_bootstrap, topic, ({"id": f"c{i}", "n": i} for i in range(15)), start=90)
    lag = figures(api, "fresh")["lag"]
    assert (lag["records"], lag["from"]) == (15, "start")
    assert figures(api)["lag"]["records"] == 105  # `earliest`: the whole topic


def kafka_lookups_original(config):
    from jobs.kafka.metadata import metadata_consumer

    return metadata_consumer(config)
