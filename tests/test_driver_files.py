"""What a driver leaves on its host for the pages (controlplane.supervision.driver_files):
where its Spark UI listens, its log's last lines (secrets masked), only on its own host."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from controlplane.accounts.roles import set_role
from controlplane.definitions.models import Pipeline, Run, SparkApplication
from controlplane.supervision import driver_files
from controlplane.supervision.launcher import this_host

pytestmark = pytest.mark.django_db


def run_with(tmp_path, pipeline_row, *, host=None, ui=None, log="") -> Run:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    if ui is not None:
        (run_dir / "ui.json").write_text(json.dumps({"url": ui}))
    (run_dir / "driver.log").write_text(log)
    return Run.objects.create(
        pipeline=pipeline_row,
        generation=1,
        spec_version=1,
        state="running",
        host=this_host() if host is None else host,
        run_dir=str(run_dir),
        log_path=str(run_dir / "driver.log"),
    )


@pytest.fixture
def orders(pipeline):
    Pipeline.objects.filter(name="orders").update(
        status="running", desired_state="running", generation=1
    )
    return Pipeline.objects.get(name="orders")


@pytest.mark.parametrize(
    ("url", "loopback"),
    [
        ("http://127.0.0.1:4041", True),
        ("http://localhost:4040", True),
        ("http://[::1]:4040", True),
        ("http://10.1.2.3:4040", False),
        ("http://spark-7.example:4040", False),
    ],
)
def test_the_spark_ui_is_read_from_the_run_and_said_loopback_or_not(
    tmp_path, orders, url, loopback
):
    found = driver_files.spark_ui(run_with(tmp_path, orders, ui=url))
    assert (found.url, found.loopback, found.port) == (url, loopback, int(url.rsplit(":", 1)[1]))


@pytest.mark.parametrize("url", [None, "javascript:alert(1)", "file:///etc/passwd", 7])
def test_no_ui_or_one_that_is_not_a_web_address_is_not_shown(tmp_path, orders, url):
    assert driver_files.spark_ui(run_with(tmp_path, orders, ui=url)) is None


def test_a_driver_on_another_host_is_not_read_here(tmp_path, orders):
    run = run_with(tmp_path, orders, host="elsewhere", ui="http://127.0.0.1:4040", log="x\n")
    assert driver_files.spark_ui(run) is None
    assert driver_files.log_tail(run.log_path, run.host) is None


def test_a_shared_applications_ui_is_in_its_ready_file(tmp_path):
    app_dir = tmp_path / "app"
    app_dir.mkdir()
    (app_dir / "ready.json").write_text(
        json.dumps({"ready_at": 1, "ui_url": "http://10.0.0.5:4040"})
    )
    app = SparkApplication.objects.create(name="shared", app_dir=str(app_dir), host=this_host())
    assert driver_files.application_ui(app).url == "http://10.0.0.5:4040"


def test_the_log_tail_is_the_last_lines_with_secrets_masked(tmp_path, api, sink_dsn, orders):
    api.patch(
        "/api/connections/warehouse/", {"secrets": {"password": "s3cr3t-pw-99"}}, format="json"
    )
    lines = [f"line {i}" for i in range(100)] + ["connecting with password s3cr3t-pw-99"]
    run = run_with(tmp_path, orders, log="\n".join(lines) + "\n")
    tail = driver_files.log_tail(run.log_path, run.host, lines=3)
    assert tail[:2] == ["line 98", "line 99"]
    assert "s3cr3t-pw-99" not in tail[2]


def test_operators_see_the_driver_log_and_the_ui_on_the_pipeline_page(
    tmp_path, django_user_model, orders
):
    run_with(tmp_path, orders, ui="http://127.0.0.1:4041", log="INFO query started\n")
    url = reverse("pipeline", kwargs={"name": "orders"})
    pages = {}
    for role in ("viewer", "operator"):
        user = django_user_model.objects.create_user(username=f"d-{role}")
        set_role(user, role)
        client = Client()
        client.force_login(user)
        pages[role] = client.get(url).content.decode()
    assert "INFO query started" in pages["operator"]
    assert "INFO query started" not in pages["viewer"]
    for page in pages.values():
        assert "Spark UI at <code>http://127.0.0.1:4041</code>" in page
        assert "ssh -L 4041:127.0.0.1:4041" in page
    lists = Client()
    lists.force_login(django_user_model.objects.get(username="d-viewer"))
    listed = lists.get(reverse("applications")).content.decode()
    assert 'data-dedicated="orders"' in listed
