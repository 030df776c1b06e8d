"""Stop every driver on this host (used when the development stack shuts down).

Desired states are left as they are, so pipelines meant to run start again with the stack.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.utils import timezone

from controlplane.definitions.models import Run, RunState
from controlplane.supervision import launcher, reconciler


class Command(BaseCommand):
    help = "Gracefully stop all drivers running on this host; kill those that do not stop."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args, timeout: float, **_):
        runs = [r for r in Run.objects.filter(state__in=RunState.active()) if launcher.alive(r)]
        for run in runs:
            launcher.request_stop(run)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and any(launcher.alive(r) for r in runs):
            time.sleep(0.5)
        for run in runs:
            if launcher.alive(run):
                launcher.kill(run)
            report = launcher.exit_report(run) or {}
            reconciler.finish(
                run,
                timezone.now(),
                exit_code=report.get("exit_code"),
                cause="stopped",
                error=report.get("error_tail", ""),
            )
        self.stdout.write(f"stopped {len(runs)} driver(s)")
