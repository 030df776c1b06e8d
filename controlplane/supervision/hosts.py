"""Control-plane hosts: who is alive, where the next driver goes, and routing work to the
host that runs a process.

Every host's Celery worker consumes, besides the shared queue, a queue of its own
(`host.<name>`) and says every few seconds that its host is alive (`beat`, from a thread in
the worker, and from every tick the host runs). Whatever touches a process (launching it,
asking it to stop, killing it, looking at it) is sent to its host's queue; the decisions
themselves (the coordinator's tick: placement, lost hosts) may run on any host. A host silent
for CONTROLPLANE_HOST_TIMEOUT is lost: its runs end (their tokens are revoked: their drivers'
reports are refused from then on, and a driver refused stops itself) and their pipelines
start again on a live host.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from datetime import datetime, timedelta

import psutil
from celery import current_app
from django.conf import settings
from django.db import close_old_connections, connection, transaction
from django.db.models import Count, Q
from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily

from controlplane.definitions.models import (
    ApplicationStatus,
    Host,
    Pipeline,
    Run,
    RunState,
    SparkApplication,
)

from . import capacity
from .launcher import this_host as here

log = logging.getLogger("controlplane.hosts")

RECONCILE_PIPELINE = "controlplane.supervision.tasks.reconcile_pipeline"
RECONCILE_APPLICATION = "controlplane.supervision.tasks.reconcile_application"
RECONCILE_HOST = "controlplane.supervision.tasks.reconcile_host"
# A dedicated driver sent to a host counts as that host's for this long, or until its run
# exists there (placements in one tick see each other; the launch itself is asynchronous).
PLACEMENT_HELD = timedelta(seconds=60)


def queue(name: str) -> str:
    return f"host.{name}"


def timeout() -> timedelta:
    return timedelta(seconds=settings.CONTROLPLANE_HOST_TIMEOUT)


def beat(now: datetime) -> None:
    """This host is alive (and takes this many drivers)."""
    changes = {
        "seen_at": now,
        "lost_at": None,
        "capacity": settings.CONTROLPLANE_HOST_DRIVERS,
        "memory_bytes": psutil.virtual_memory().total,
    }
    if not Host.objects.filter(name=here()).update(**changes):
        Host.objects.get_or_create(name=here(), defaults=changes)


def loads(now: datetime, *, with_here: bool = True) -> list[capacity.HostLoad]:
    """Every known host with the driver processes placed on it (this host, `with_here`,
    counts as seen now: a worker is running this code)."""
    runs = dict(
        Run.objects.filter(state__in=RunState.active(), application__isnull=True)
        .values_list("host")
        .annotate(n=Count("id"))
    )
    apps = dict(
        SparkApplication.objects.filter(Q(pid__isnull=False) | Q(status=ApplicationStatus.STARTING))
        .values_list("host")
        .annotate(n=Count("id"))
    )
    # Drivers sent to a host and not launched there yet count as its own.
    placed = dict(
        Pipeline.objects.filter(placed_at__gt=now - PLACEMENT_HELD)
        .exclude(placed_host="")
        .values_list("placed_host")
        .annotate(n=Count("id"))
    )
    known = {h.name: h for h in Host.objects.all()}
    out = []
    for name in sorted({*known, here()} if with_here else known):
        host = known.get(name)
        out.append(
            capacity.HostLoad(
                name=name,
                capacity=settings.CONTROLPLANE_HOST_DRIVERS if name == here() else host.capacity,
                used=runs.get(name, 0) + apps.get(name, 0) + placed.get(name, 0),
                seen_at=now if name == here() else host.seen_at,
            )
        )
    return out


def overview(now: datetime) -> list[dict]:
    """Each host whose worker was ever heard, as the API and Prometheus show it."""
    rows = {h.name: h for h in Host.objects.all()}
    out = []
    for load in loads(now, with_here=False):
        host = rows[load.name]
        out.append(
            {
                "name": load.name,
                "state": "lost" if capacity.lost(load.seen_at, now, timeout()) else "up",
                "capacity": load.capacity,
                "drivers": load.used,
                "seen_at": host.seen_at,
                "heartbeat_age_seconds": round((now - host.seen_at).total_seconds(), 1),
                "lost_at": host.lost_at,
            }
        )
    return out


def choose(now: datetime) -> tuple[str | None, str]:
    """The host the next driver process goes to, or None and why it has to wait."""
    return capacity.choose(loads(now), now, timeout())


def live(now: datetime) -> list[str]:
    """The hosts whose workers are alive (this one included)."""
    return [h.name for h in loads(now) if not capacity.lost(h.seen_at, now, timeout())]


def is_lost(name: str, now: datetime) -> bool:
    """Whether host `name` has been silent for longer than the timeout (a host never heard
    of is lost: nothing vouches for what runs there)."""
    return name != here() and lost(silent_since(name), now)


def lost(seen_at: datetime | None, now: datetime) -> bool:
    """Whether a host last heard at `seen_at` is lost by now."""
    return capacity.lost(seen_at, now, timeout())


def silent_since(name: str) -> datetime | None:
    """When host `name`'s worker was last heard (None: never)."""
    return Host.objects.filter(name=name).values_list("seen_at", flat=True).first()


def sweep(now: datetime) -> list[str]:
    """Mark the hosts that went silent as lost (once each, logged); their names."""
    cutoff = now - timeout()
    newly = list(
        Host.objects.filter(seen_at__lt=cutoff, lost_at=None)
        .exclude(name=here())
        .values_list("name", flat=True)
    )
    for name in newly:
        if Host.objects.filter(name=name, seen_at__lt=cutoff, lost_at=None).update(lost_at=now):
            log.warning(
                "host %s has been silent for more than %.0f s: it is lost; what ran there is "
                "started again elsewhere",
                name,
                settings.CONTROLPLANE_HOST_TIMEOUT,
            )
    return newly


# -- routing -------------------------------------------------------------------------------


def _send(task: str, host: str, args: list, kwargs: dict | None = None) -> None:
    """Send `task` to `host`'s queue once the current transaction commits; never raises (a
    lost message costs a tick: the coordinator decides again). A message that waited longer
    than a reconcile interval (its host was busy or down) is dropped unrun."""

    def send() -> None:
        try:
            current_app.send_task(
                task,
                args=args,
                kwargs=kwargs or {},
                queue=queue(host),
                expires=max(10.0, 2 * settings.CONTROLPLANE_RECONCILE_SECONDS),
                retry=False,
            )
        except Exception as exc:  # the broker is down: the next tick sends it again
            log.warning("could not send %s to host %s: %s", task.rsplit(".", 1)[-1], host, exc)

    transaction.on_commit(send)


def route_pipeline(
    host: str, pipeline_id: int, *, placed: bool = False, now: datetime | None = None
) -> str:
    """Reconcile the pipeline on `host` (its run is there; or, `placed` at `now`, its next
    driver is to be launched there: recorded on the pipeline, whose row lock the caller
    holds, so that the next placement counts it)."""
    if placed and now is not None:
        Pipeline.objects.filter(pk=pipeline_id).update(placed_host=host, placed_at=now)
    _send(RECONCILE_PIPELINE, host, [pipeline_id], {"placed": placed})
    return f"placed on {host}" if placed else f"routed to {host}"


def route_application(host: str, app_id: int) -> str:
    """Launch the application on `host` (the coordinator placed it there)."""
    _send(RECONCILE_APPLICATION, host, [app_id], {"placed": True})
    return f"placed on {host}"


def fan_out(now: datetime) -> list[str]:
    """Ask every other live host to reconcile what runs on it; their names."""
    others = [name for name in live(now) if name != here()]
    for name in others:
        _send(RECONCILE_HOST, name, [])
    return others


# -- the worker's heartbeat ----------------------------------------------------------------


class Heartbeat(threading.Thread):
    """Says from a worker, every CONTROLPLANE_HOST_HEARTBEAT_SECONDS, that its host is alive
    (whether or not ticks reach it). Best effort: a database that is down costs beats, and
    the host is lost only after CONTROLPLANE_HOST_TIMEOUT without one."""

    def __init__(self) -> None:
        super().__init__(name="cp-host-heartbeat", daemon=True)
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.is_set():
            try:
                close_old_connections()
                beat(timezone.now())
            except Exception as exc:
                log.warning("host %s: could not record its heartbeat: %s", here(), exc)
                with contextlib.suppress(Exception):
                    connection.close()
            self.stopped.wait(settings.CONTROLPLANE_HOST_HEARTBEAT_SECONDS)

    def stop(self) -> None:
        self.stopped.set()


class HostFigures:
    """A prometheus_client collector: each host's state, drivers and capacity."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def collect(self):
        families = {
            key: GaugeMetricFamily(name, text, labels=["host"])
            for key, name, text in (
                ("up", "cp_host_up", "1 while the control-plane host's worker says it is alive"),
                ("drivers", "cp_host_drivers", "driver processes placed on the host"),
                ("capacity", "cp_host_capacity", "driver processes the host takes"),
                (
                    "heartbeat_age_seconds",
                    "cp_host_heartbeat_age_seconds",
                    "seconds since the host's worker was heard",
                ),
            )
        }
        for host in overview(self.now):
            values = {**host, "up": int(host["state"] == "up")}
            for key, family in families.items():
                family.add_metric([host["name"]], float(values[key]))
        yield from families.values()
