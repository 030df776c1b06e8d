"""Create the demo connections and pipeline for the embedded stack, if they are missing."""

from __future__ import annotations

import os

from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from controlplane.connections.models import Connection
from controlplane.connections.policy import clean_connection
from controlplane.definitions import application_services, checkpoints, services
from controlplane.definitions.models import (
    DesiredState,
    Pipeline,
    RunState,
    SparkApplication,
    Status,
)
from controlplane.supervision import controls
from jobs.spec import SpecError

DEMO_PIPELINE = "demo-deliveries"
# The shared Spark application the demo runs in (pipelines added later may join it).
DEMO_APPLICATION = "shared"
DEMO_SPEC = {
    "source": {
        "kind": "kafka",
        "connection": "local-kafka",
        "topics": ["deliveries"],
        "format": "json",
        "schema": "delivery_id STRING, courier_id STRING, status STRING, lat DOUBLE, "
        "lon DOUBLE, event_time TIMESTAMP",
        "starting_offsets": "earliest",
        "max_records_per_batch": 200000,
    },
    "transform": {
        "sql": "SELECT delivery_id, courier_id, status, lat, lon, event_time FROM source "
        "WHERE delivery_id IS NOT NULL"
    },
    "sink": {
        "kind": "postgres",
        "connection": "local-postgres",
        "table": "delivery_status",
        "mode": "upsert",
        "key": ["delivery_id"],
    },
    "trigger": {"interval_seconds": 1},
    "restart_policy": {"kind": "exponential-delay"},
}


class Command(BaseCommand):
    help = "Create the demo connections (local-kafka, local-postgres) and pipeline if missing."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--kafka-restarted-empty",
            action="store_true",
            help="the embedded broker's storage was just formatted (a new, empty log): the"
            " demo's checkpoint points into a log that no longer exists, so start the demo from"
            " a new one",
        )

    def handle(self, *args, kafka_restarted_empty: bool = False, **_):
        if kafka_restarted_empty:
            self._fresh_checkpoint()
        try:
            self._connection(
                "local-kafka",
                "kafka",
                {"bootstrap_servers": os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:59092")},
            )
            # The demo's sink is a database of its own, never the control plane's
            # (DATABASE_URL): that one is refused like any other pipeline's would be.
            sink_url = os.environ.get("CONTROLPLANE_SINK_DATABASE_URL", "").strip()
            if not sink_url:
                self.stdout.write(
                    "  Demo pipeline:  not created: set CONTROLPLANE_SINK_DATABASE_URL to a "
                    "database the demo may write to"
                )
                return
            self._connection("local-postgres", "postgres", {"dsn": sink_url})
            if not SparkApplication.objects.filter(name=DEMO_APPLICATION).exists():
                application_services.create_application(
                    name=DEMO_APPLICATION,
                    description="The demo's shared Spark application.",
                    driver_memory="2g",
                    capacity=50,
                )
                self.stdout.write(f"  Shared app:     {DEMO_APPLICATION} (created)")
            if not Pipeline.objects.filter(name=DEMO_PIPELINE).exists():
                services.create_pipeline(
                    name=DEMO_PIPELINE,
                    spec_data=DEMO_SPEC,
                    description="Courier delivery status events from Kafka into Postgres.",
                    # Running from the start; if an operator stops it, a re-run respects that.
                    desired_state="running",
                    placement=DEMO_APPLICATION,
                )
                self.stdout.write(
                    f"  Demo pipeline:  {DEMO_PIPELINE} (created, in {DEMO_APPLICATION})"
                )
            else:
                self.stdout.write(f"  Demo pipeline:  {DEMO_PIPELINE} (exists)")
        except SpecError as exc:
            raise CommandError(f"demo definitions are invalid: {exc}") from None

    def _connection(self, name: str, kind: str, settings: dict) -> None:
        if Connection.objects.filter(name=name).exists():
            return
        cleaned = clean_connection(kind, settings, {})
        connection = Connection(
            name=name, kind=kind, settings=cleaned.settings, description="embedded dev stack"
        )
        connection.set_secrets(cleaned.secrets)
        connection.save()

    def _fresh_checkpoint(self) -> None:
        """The demo's Kafka log is gone (new broker storage): drop its checkpoint, and start it
        again if it gave up on the records it can no longer find (audited)."""
        pipeline = Pipeline.objects.filter(name=DEMO_PIPELINE).first()
        if pipeline is None:
            return
        if pipeline.runs.filter(state__in=RunState.active()).exists():
            return  # a driver still uses the checkpoint: leave it (the reconciler sees it)
        store, checkpoint = checkpoints.store(), checkpoints.location(DEMO_PIPELINE)
        if store.exists(checkpoint):
            store.remove_tree(checkpoint)
            self.stdout.write(
                "  Demo pipeline:  new checkpoint (the embedded Kafka restarted empty)"
            )
        if pipeline.status == Status.FAILED and pipeline.desired_state == DesiredState.RUNNING:
            controls.act(
                pipeline,
                "start",
                user=None,
                reason="the embedded Kafka restarted empty; the demo starts from a new checkpoint",
                now=timezone.now(),
            )
