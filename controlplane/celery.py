"""The Celery app: Redis broker, and a beat schedule whose one job is the reconcile tick.

The reconciler is level-based: every tick compares desired state (Postgres) with what is
observed and acts. Delays are stored times in Postgres, never countdowns held by Celery, so a
lost or duplicated tick is harmless.
"""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "controlplane.settings")

app = Celery("controlplane")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks()
