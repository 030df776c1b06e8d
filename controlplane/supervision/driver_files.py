"""What a driver leaves on its host for the pages: where its Spark UI listens, and its log's
last lines (for operators).

Both are files on the driver's host (RUN_DIR/ui.json, a shared application's
APP_DIR/ready.json; the run's log), read only by that host's web process: for a driver on
another host the pages say which host has them. A Spark UI listening on loopback (the default,
CONTROLPLANE_SPARK_UI_HOST) is reachable only from its host: the pages say so and
docs/deployment.md says how to reach it (an SSH tunnel, or a routable address).
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from controlplane.connections.masking import known_secrets, mask
from controlplane.definitions.models import Run, SparkApplication
from controlplane.redaction import redact

from .launcher import this_host

UI_FILE = "ui.json"  # jobs.run.UI_FILE
READY_FILE = "ready.json"  # jobs.host.READY
LOG_TAIL_BYTES = 64 * 1024


@dataclass(frozen=True)
class SparkUI:
    url: str
    loopback: bool  # reachable only from its host
    host: str  # the control-plane host the driver runs on

    @property
    def port(self) -> int:
        parts = urlsplit(self.url)
        return parts.port or (443 if parts.scheme == "https" else 80)


def _here(host: str) -> bool:
    return not host or host == this_host()


def _ui(url: object, host: str) -> SparkUI | None:
    if not isinstance(url, str):
        return None
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    try:
        loopback = ipaddress.ip_address(parts.hostname).is_loopback
    except ValueError:
        loopback = parts.hostname == "localhost"
    return SparkUI(url, loopback, host)


def _read(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def spark_ui(run: Run) -> SparkUI | None:
    """Where the run's driver's Spark UI listens (its shared application's, for a member);
    None when unknown here (no UI, not started yet, or on another host)."""
    if run.application_id is not None:
        return application_ui(run.application)
    if not run.run_dir or not _here(run.host):
        return None
    return _ui(_read(Path(run.run_dir) / UI_FILE).get("url"), run.host or this_host())


def application_ui(app: SparkApplication) -> SparkUI | None:
    if not app.app_dir or not _here(app.host):
        return None
    return _ui(_read(Path(app.app_dir) / READY_FILE).get("ui_url"), app.host or this_host())


def log_tail(path: str, host: str, lines: int = 40) -> list[str] | None:
    """The last `lines` lines of a driver's log on this host, secrets masked; None when it
    is not here (another host's, or gone)."""
    if not path or not _here(host):
        return None
    try:
        with open(path, "rb") as log:
            log.seek(0, 2)
            size = log.tell()
            log.seek(max(0, size - LOG_TAIL_BYTES))
            text = log.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    tail = text.splitlines()[-lines:]
    secrets = known_secrets()
    return [mask(redact(line), secrets) for line in tail]
