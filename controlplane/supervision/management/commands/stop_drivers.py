"""Stop every driver on this host (used when the development stack shuts down): dedicated
runs' drivers and shared applications (with their members).

Desired states are left as they are, so pipelines and applications meant to run start again
with the stack.
"""

from __future__ import annotations

import time

from django.core.management.base import BaseCommand
from django.utils import timezone

from controlplane.definitions.models import Run, RunState, SparkApplication
from controlplane.supervision import applications, endings, launcher
from controlplane.supervision.causes import EndCause


class Command(BaseCommand):
    help = "Gracefully stop all drivers running on this host; kill those that do not stop."

    def add_arguments(self, parser) -> None:
        parser.add_argument("--timeout", type=float, default=30.0)

    def handle(self, *args, timeout: float, **_):
        runs = [r for r in Run.objects.filter(state__in=RunState.active()) if launcher.alive(r)]
        apps = [a for a in SparkApplication.objects.all() if launcher.application_alive(a)]
        for run in runs:
            launcher.request_stop(run)
        for app in apps:
            launcher.request_application_stop(app)  # and each of its members, gracefully

        def running() -> bool:
            return any(launcher.alive(r) for r in runs) or any(
                launcher.application_alive(a) for a in apps
            )

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and running():
            time.sleep(0.5)
        for app in apps:
            if launcher.application_alive(app):
                launcher.kill_application(app)
        for run in runs:
            if run.application_id is None and launcher.alive(run):
                launcher.kill(run)
            report = launcher.exit_report(run) or {}
            endings.finish(
                run,
                timezone.now(),
                exit_code=report.get("exit_code"),
                cause=EndCause.STOPPED,
                error=report.get("error_tail", ""),
            )
        for app in apps:
            applications.stopped_with_host(app)
        self.stdout.write(f"stopped {len(runs)} run(s) and {len(apps)} shared application(s)")
