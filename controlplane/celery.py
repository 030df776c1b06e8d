"""The Celery app: Redis broker, and a beat schedule whose one job is the reconcile tick.

The reconciler is level-based: every tick compares desired state (Postgres) with what is
observed and acts. Delays are stored times in Postgres, never countdowns held by Celery, so a
lost or duplicated tick is harmless.
"""

from __future__ import annotations

import os

from celery import Celery, signals

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()


# -- several control-plane hosts (controlplane.supervision.hosts) --------------------------

_heartbeat = None


@signals.celeryd_after_setup.connect
def _consume_host_queue(sender, instance, **kwargs) -> None:
    """Every worker also consumes its host's own queue: what touches a process on this host
    (launch, stop, kill, observe) is sent there."""
    from django.conf import settings

    instance.app.amqp.queues.select_add(f"host.{settings.CONTROLPLANE_HOST_NAME}")


@signals.worker_ready.connect
def _start_host_heartbeat(sender, **kwargs) -> None:
    global _heartbeat
    from controlplane.supervision.hosts import Heartbeat

    _heartbeat = Heartbeat()
    _heartbeat.start()


@signals.worker_shutdown.connect
def _stop_host_heartbeat(sender, **kwargs) -> None:
    if _heartbeat is not None:
        _heartbeat.stop()
