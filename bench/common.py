"""What the benchmarks share: the machine they ran on, a free port, and the web app served
the way `./stack up` serves it."""

from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> dict:
    def first(path: str, key: str) -> str | None:
        try:
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        except OSError:
            return None
        return None

    memory_kb = first("/proc/meminfo", "MemTotal")
    return {
        "host": socket.gethostname(),
        "cpus": os.cpu_count(),
        "cpu_model": first("/proc/cpuinfo", "model name"),
        "memory_gb": round(int(memory_kb.split()[0]) / 1024**2, 1) if memory_kb else None,
        "kernel": platform.release(),
        "date": datetime.now(UTC).strftime("%Y-%m-%d"),
    }


def serve_web_app(env: dict) -> tuple[subprocess.Popen, str]:
    """The web app under gunicorn as `./stack up` runs it (gthread, 2 workers of 8 threads)
    on a free port, once it answers: (its process, its base URL)."""
    port = free_port()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "controlplane.wsgi",
            "--bind",
            f"127.0.0.1:{port}",
            "--worker-class",
            "gthread",
            "--workers",
            "2",
            "--threads",
            "8",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            requests.get(f"{base}/api/", timeout=2)
            return server, base
        except requests.RequestException:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                raise
            time.sleep(0.3)
