"""/healthz and every request answer at once when the database does not: a stopped database
refuses connections, a paused one (SIGSTOP, a partition) accepts them and never answers."""

from __future__ import annotations

import socket
import time

import pytest
from django.test import Client

from controlplane import health


@pytest.fixture
def black_hole():
    """A server that accepts connections and never says a word, like a paused Postgres."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    yield server.getsockname()[1]
    server.close()


@pytest.fixture
def paused_database(black_hole, monkeypatch):
    real = health._database_params

    def params():
        return {**real(), "host": "127.0.0.1", "port": black_hole}

    monkeypatch.setattr(health, "_database_params", params)
    health.forget()
    yield
    health.forget()


def test_healthz_names_a_paused_database_within_a_second(client, db, paused_database):
    response = client.get("/healthz")
    assert response.status_code == 503
    # "not answering" is the deadline's answer: the check did not wait for the connect to
    # time out (that would read "unreachable: ConnectionTimeout").
    assert response.json()["database"] == "not answering"
    assert response.json()["broker"] == "ok"
    # Asked again while the first check still hangs: the same answer, no new thread.
    assert client.get("/healthz").json()["database"] == "not answering"


def test_requests_get_a_503_while_the_database_does_not_answer(api, paused_database, monkeypatch):
    # Taken for hung once its check has run this long (5 s by default; a slow check is not).
    monkeypatch.setattr(health, "HUNG_SECONDS", 0.3)
    response = api.get("/api/pipelines/")
    assert response.status_code == 503
    assert "database is unavailable" in response.json()["detail"]
    assert response["Retry-After"] == "5"
    page = Client().get("/login/")
    assert page.status_code == 503


def test_requests_pass_when_the_database_answers(api):
    health.forget()
    assert api.get("/api/pipelines/").status_code == 200
    assert Client().get("/healthz").json()["database"] == "ok"


def test_a_slow_check_refuses_nothing_until_it_has_run_for_hung_seconds(api, monkeypatch):
    """A saturated machine takes seconds to open a connection: that is not a database down."""
    real = health._database

    def slow():
        time.sleep(1.5)
        real()

    monkeypatch.setattr(
        health, "_PROBES", {**health._PROBES, "database": health._Probe("database", slow)}
    )
    health.forget()
    try:
        started = time.monotonic()
        assert api.get("/api/pipelines/").status_code == 200  # the check is still running
        assert time.monotonic() - started < 1.5
        monkeypatch.setattr(health, "HUNG_SECONDS", 0.0)
        health.forget()
        time.sleep(0.1)
        # The same check, now past the (lowered) limit: refused.
        assert api.get("/api/pipelines/").status_code == 503
    finally:
        health.forget()
