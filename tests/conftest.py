"""Shared fixtures.

Integration tests talk to the real services that `./stack test` starts (PostgreSQL, Redis,
Apache Kafka) and to one local Spark session shared by the whole run. Nothing here skips a test
when a service is missing: a missing service is a failed run, with a message saying why.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

from tests.factories import valid_spec
from tests.stores import (  # noqa: F401 - fixtures
    checkpoint_store,
    remote,
    silent_address,
    where,
)
from tests.stores import required_env as _required_env


@pytest.fixture(scope="session")
def registry_url() -> str:
    """The schema registry under test (tests.stores.registry_url)."""
    from tests.stores import registry_url as url

    return url()


@pytest.fixture
def registry_connection(api, registry_url):
    """A schema-registry connection `registry` to the registry under test."""
    response = api.post(
        "/api/connections/",
        {"name": "registry", "kind": "schema-registry", "settings": {"url": registry_url}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """host:port of the Kafka broker under test (Apache Kafka in development). The topics
    the session created are deleted at its end."""
    bootstrap = _required_env("KAFKA_BOOTSTRAP_SERVERS")
    yield bootstrap
    from tests.kafka_helpers import delete_created_topics

    try:
        delete_created_topics(bootstrap)
    except Exception as exc:  # tidying up must not fail the run
        logging.getLogger(__name__).warning("could not delete the session's topics: %s", exc)


@pytest.fixture(scope="session")
def spark():
    """One local SparkSession for the whole run: starting one costs ~5 s and ~1 GB."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    # py4j logs at INFO from a finaliser after pytest closed its streams: noise, not news.
    logging.getLogger("py4j").setLevel(logging.WARNING)

    from jobs import jvm

    # The Postgres sink's JVM writer: built here too (a no-op when up to date), so tests run
    # directly with pytest exercise it as well.
    jvm.build()
    session = (
        SparkSession.builder.master("local[2]")
        .appName("controlplane-tests")
        .config("spark.jars", ",".join(jvm.spark_jars()))
        .config(map=jvm.driver_conf())
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    yield session
    session.stop()


# --- Django / API fixtures ----------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _fast_password_hashing():
    """Users made by tests get passwords hashed with a fast hasher: Django's default
    (PBKDF2, 1,000,000 iterations) costs 0.3-0.8 s a hash on these 2 cores, and most tests
    create a user (and many sign one in). Only tests run this way: the settings keep the
    default, and no test here checks how a password is stored (Django's own tests do)."""
    from django.test import override_settings

    with override_settings(PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"]):
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_spark_ui():
    """Drivers launched by tests start without Spark's web UI (its Jetty server and event
    listeners cost every driver start time and CPU on 2 cores, and no test looks at it;
    test_driver_isolation checks the flag that turns it off). The setting's default stays."""
    from django.test import override_settings

    with override_settings(CONTROLPLANE_SPARK_UI_ENABLED=False):
        yield


@pytest.fixture(scope="session", autouse=True)
def _no_preflight():
    """Most tests save and start pipelines named after topics and tables that do not exist
    (stand-in drivers never read them): saving and starting do not preflight them. The
    production default (`refuse`) is what tests/test_preflight.py runs with."""
    from django.test import override_settings

    with override_settings(CONTROLPLANE_PREFLIGHT="off"):
        yield


@pytest.fixture(autouse=True)
def _no_security_counters():
    """Counters of refused API tokens live in a cache, not the database: each test starts with
    none, as it starts with an empty database (else one test's bad tokens throttle the next)."""
    from django.core.cache import caches

    caches["security"].clear()


@pytest.fixture(autouse=True)
def _no_remembered_web_app_answer():
    """The reconciler remembers for a few seconds whether the web app drivers report to
    answers (CONTROLPLANE_URL): each test starts without that answer."""
    from controlplane.supervision import reconciler

    reconciler._ingestion.update(checked=float("-inf"), why=None)
    yield
    reconciler._ingestion.update(checked=float("-inf"), why=None)


@pytest.fixture
def listening(settings, live_server):
    """Drivers' reports go to this test's own web app (the reconciler spares silent drivers
    while the web app does not answer)."""
    settings.CONTROLPLANE_URL = live_server.url
    return live_server


@pytest.fixture
def user(db, django_user_model):
    """An editor: may read, use the on-call controls and change pipelines and connections."""
    from controlplane.accounts.roles import EDITOR, set_role

    user = django_user_model.objects.create_user(username="oncall", password="not-used-here-1")
    set_role(user, EDITOR)
    return user


@pytest.fixture
def token(user) -> str:
    from controlplane.accounts.models import ApiToken

    _, key = ApiToken.issue(user, "tests")
    return key


@pytest.fixture
def api(token):
    """An API client authenticated with a real token, as automation would be."""
    from rest_framework.test import APIClient

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {token}")
    return client


@pytest.fixture
def anon():
    from rest_framework.test import APIClient

    return APIClient()


@pytest.fixture
def sink_dsn() -> str:
    """DSN of a real Postgres database used as a sink target (not the Django test database)."""
    return _required_env("CONTROLPLANE_SINK_DATABASE_URL")


@pytest.fixture
def kafka_connection(api, kafka_bootstrap):
    response = api.post(
        "/api/connections/",
        {"name": "events", "kind": "kafka", "settings": {"bootstrap_servers": [kafka_bootstrap]}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def postgres_connection(api, sink_dsn):
    response = api.post(
        "/api/connections/",
        {"name": "warehouse", "kind": "postgres", "settings": {"dsn": sink_dsn}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def cassandra_connection(api):
    """The cassandra connection `cluster`: the Cassandra `./stack test` starts, its keyspace
    `cp_test` (created if missing: the control plane never creates one)."""
    from tests.stores import cassandra_env, cassandra_session

    env = cassandra_env()
    with cassandra_session() as session:
        session.execute(
            "CREATE KEYSPACE IF NOT EXISTS cp_test WITH replication ="
            f" {{'class': 'NetworkTopologyStrategy', '{env.dc}': 1}}"
        )
    response = api.post(
        "/api/connections/",
        {
            "name": "cluster",
            "kind": "cassandra",
            "settings": {
                "contact_points": env.hosts.split(","),
                "local_datacenter": env.dc,
                "keyspace": "cp_test",
                "username": env.user,
            },
            "secrets": {"password": env.password},
        },
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def pipeline(api, kafka_connection, postgres_connection):
    response = api.post("/api/pipelines/", {"name": "orders", "spec": valid_spec()}, format="json")
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def files_dir(settings, tmp_path):
    """CONTROLPLANE_FILES_DIR for this test: the directory local (file:) roots must be in."""
    path = tmp_path / "files"
    path.mkdir()
    settings.CONTROLPLANE_FILES_DIR = str(path)
    return path


@pytest.fixture
def files_connection(api, files_dir):
    """`lake`: a files connection whose local root (made here) is in the files directory."""
    (files_dir / "lake").mkdir()
    response = api.post(
        "/api/connections/",
        {"name": "lake", "kind": "files", "settings": {"root": f"file://{files_dir}/lake/"}},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


@pytest.fixture
def editor(django_user_model):
    """A page client signed in as an editor (the pages' forms, as a browser posts them)."""
    from django.test import Client

    from controlplane.accounts.roles import set_role

    user = django_user_model.objects.create_user(username="ed")
    set_role(user, "editor")
    client = Client()
    client.force_login(user)
    return client


@pytest.fixture
def receiver():
    """An HTTP receiver of what the control plane posts out (tests/receivers.py)."""
    from tests.receivers import Receiver

    server = Receiver()
    yield server
    server.shutdown()


# --- drivers, runs and shared applications ------------------------------------------------


@pytest.fixture
def running(pipeline):
    """The pipeline with a current run (generation 1) whose driver holds token 'tok-1'."""
    from controlplane.definitions.models import Pipeline
    from tests.runs import with_current_run

    return with_current_run(Pipeline.objects.get(name="orders"))


@pytest.fixture
def standin(settings, tmp_path, monkeypatch, pipeline):
    """Pipeline `orders`, whose drivers are stand-ins for spark-submit
    (tests/drivers/standin.py) under the real supervisor: a test goes through many runs in
    seconds. Set STANDIN_* on the monkeypatch returned to choose how they behave. Drivers
    still running at the end are killed."""
    from controlplane.definitions.models import Run, RunState
    from controlplane.supervision import launcher

    settings.SPARK_SUBMIT = str(Path(__file__).resolve().parent / "drivers" / "standin.py")
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "runs"
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    settings.CONTROLPLANE_DRIVER_ENV = ["STANDIN_*"]  # drivers get an allow-listed env only
    yield monkeypatch
    for run in Run.objects.filter(state__in=RunState.active()):
        launcher.kill(run)


@pytest.fixture
def silent(standin):
    """Stand-in drivers that run until stopped (stop file) or killed."""
    standin.setenv("STANDIN_MODE", "silent")
    return standin


@pytest.fixture
def job_dirs(settings, tmp_path, live_server):
    """Real spark-submit drivers, launched by the reconciler: their runs and checkpoints
    under tmp_path (returned); they report heartbeats and progress to this test's own web
    server. Drivers still running at the end are killed."""
    from controlplane.definitions.models import Run, RunState
    from controlplane.supervision import launcher

    settings.CONTROLPLANE_URL = live_server.url
    settings.CONTROLPLANE_HEARTBEAT_SECONDS = 1
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "runs"
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    settings.CONTROLPLANE_STOP_TIMEOUT = 90
    yield tmp_path
    # A failed assertion must not leave a driver running for the rest of the suite.
    for run in Run.objects.filter(state__in=RunState.active()):
        launcher.kill(run)


@pytest.fixture
def shared(settings, tmp_path, live_server):
    """A shared Spark application `shared` (real Spark, capacity 5) for pipelines placed in
    it; its drivers report to this test's own web server. What still runs at the end (the
    application, dedicated drivers) is killed. Modules whose `shared` is a row made without
    Spark define their own."""
    from controlplane.definitions.models import Run, RunState, SparkApplication
    from controlplane.supervision import launcher

    settings.CONTROLPLANE_URL = live_server.url
    settings.CONTROLPLANE_HEARTBEAT_SECONDS = 1
    settings.CONTROLPLANE_RUNS_ROOT = tmp_path / "runs"
    settings.CONTROLPLANE_CHECKPOINT_ROOT = tmp_path / "checkpoints"
    settings.CONTROLPLANE_STOP_TIMEOUT = 60
    app = SparkApplication.objects.create(name="shared", capacity=5, driver_memory="1g")
    yield app
    # A failed assertion must not leave an application running for the rest of the suite.
    for run in Run.objects.filter(state__in=RunState.active(), application__isnull=True):
        launcher.kill(run)
    for app in SparkApplication.objects.all():
        if app.pid:
            launcher.kill_application(app)
