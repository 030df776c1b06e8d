"""The dashboard's shared Spark applications: the list, one application with its members and
controls (refusals shown, never a server error), where a pipeline runs, its placement in the
edit form, the audit log and the Django admin. No Spark: members are Run rows made here."""

from __future__ import annotations

import re

import pytest
from django.urls import reverse

from controlplane.definitions.models import AuditEntry, Pipeline, Run, SparkApplication
from tests.clients import client_with, field_errors, form_for


@pytest.fixture
def shared(db) -> SparkApplication:
    """A running application, as the reconciler leaves it, with a last exit behind it."""
    from django.utils import timezone

    return SparkApplication.objects.create(
        name="shared",
        description="the small pipelines",
        capacity=4,
        driver_memory="3g",
        conf={"spark.sql.shuffle.partitions": "8"},
        status="running",
        generation=2,
        pid=4242,
        host="here",
        rss_bytes=768 * 1024 * 1024,
        cpu_percent=12.5,
        restarts=3,
        last_exit_code=137,
        last_exit_at=timezone.now(),
        last_error="java.lang.OutOfMemoryError; dsn postgresql://etl:hunter2-secret@db/x",
    )


def member(app: SparkApplication, pipeline_name: str) -> Run:
    pipeline = Pipeline.objects.get(name=pipeline_name)
    return Run.objects.create(
        pipeline=pipeline,
        generation=pipeline.runs.count() + 1,
        spec_version=1,
        state="running",
        application=app,
        application_generation=app.generation,
    )


def test_the_list_shows_each_application_s_state_load_and_size(django_user_model, shared):
    SparkApplication.objects.create(name="idle", desired_state="stopped")
    client = client_with(django_user_model, "viewer")
    html = client.get(reverse("applications")).content.decode()
    assert f'href="{reverse("applications")}">Applications</a>' in html  # in the nav
    assert re.findall(r'data-application="([^"]+)"', html) == ["idle", "shared"]
    row = html[html.index('data-application="shared"') :]
    row = row[: row.index("</tr>")]
    assert "● Running" in re.sub(r"<[^>]+>", "", row)
    assert "0 / 4" in row  # members / capacity
    assert ">768<" in row  # MiB
    assert ">12.5<" in row  # CPU %
    assert ">3<" in row  # restarts
    assert "exit 137" in row
    assert ">here<" in row  # its host
    assert "wanted stopped" in html  # the idle one


def test_the_list_shows_the_control_plane_hosts_with_their_drivers(django_user_model, shared):
    from datetime import timedelta

    from django.utils import timezone

    from controlplane.definitions.models import Host

    Host.objects.create(name="here", capacity=6, seen_at=timezone.now())
    Host.objects.create(
        name="gone", capacity=2, seen_at=timezone.now() - timedelta(hours=1),
        lost_at=timezone.now() - timedelta(minutes=59),
    )  # fmt: skip
    html = client_with(django_user_model, "viewer").get(reverse("applications")).content.decode()
    assert re.findall(r'data-host="([^"]+)"', html) == ["gone", "here"]
    here = html[html.index('data-host="here"') :]
    here = " ".join(re.sub(r"<[^>]+>", " ", here[: here.index("</tr>")]).split())
    assert "here up 1 / 6 0 s ago" in here, here  # the application's process is its driver
    gone = html[html.index('data-host="gone"') :]
    gone = " ".join(re.sub(r"<[^>]+>", " ", gone[: gone.index("</tr>")]).split())
    assert "lost" in gone and "0 / 2" in gone and "59 minutes ago" in gone


def test_the_application_page_shows_members_definition_and_last_error(
    django_user_model, pipeline, shared
):
    member(shared, "orders")
    Pipeline.objects.filter(name="orders").update(placement="shared", desired_state="running")
    html = client_with(django_user_model, "viewer").get(reverse("application", args=["shared"]))
    html = html.content.decode()
    assert 'data-member="orders"' in html
    assert f'<a href="{reverse("pipeline", args=["orders"])}">orders</a>' in html
    assert "1 of 4 pipelines" in html
    assert "<code>spark.sql.shuffle.partitions=8</code>" in html
    assert "3g" in html
    assert "java.lang.OutOfMemoryError" in html and "hunter2-secret" not in html
    assert "Exit code 137" in html
    assert "Controls" not in html  # a viewer's page has no controls
    assert client_with(django_user_model, "viewer").get("/applications/nope/").status_code == 404


def test_pages_link_the_standalone_master_s_ui_for_what_runs_on_it(
    django_user_model, pipeline, shared, settings
):
    settings.SPARK_MASTER_UI_URL = "http://127.0.0.1:58080"
    settings.SPARK_APPLICATION_MASTER = "local[8,4]"
    settings.SPARK_MASTER = "local[2,4]"
    client = client_with(django_user_model, "viewer")

    def links(url: str) -> list[str]:
        html = client.get(url).content.decode()
        return re.findall(r'<a href="([^"]+)"[^>]*data-master-ui', html)

    app_page, pipeline_page = (
        reverse("application", args=["shared"]),
        reverse("pipeline", args=["orders"]),
    )
    assert links(app_page) == [] and links(pipeline_page) == []  # local mode: no master UI
    SparkApplication.objects.filter(name="shared").update(master="spark://127.0.0.1:57077")
    assert links(app_page) == ["http://127.0.0.1:58080"]
    settings.SPARK_MASTER = "spark://127.0.0.1:57077"
    assert links(pipeline_page) == ["http://127.0.0.1:58080"]  # a dedicated pipeline
    Pipeline.objects.filter(name="orders").update(placement="shared")
    assert links(pipeline_page) == []  # its runs are the application's


def test_operators_control_it_from_the_page_and_refusals_say_why(
    django_user_model, pipeline, shared
):
    url = reverse("application", args=["shared"])
    operator = client_with(django_user_model, "operator")
    page = operator.get(url).content.decode()
    assert "Recycle shared?" in page and "Type <code>shared</code> to confirm" in page

    def control(action: str, **post):
        target = reverse("application-control", args=["shared", action])
        response = operator.post(target, {"confirm": "shared", **post}, follow=True)
        assert response.status_code == 200
        return response.content.decode()

    assert "Not done: type the application" in control("stop", confirm="share")
    run = member(shared, "orders")
    html = control("stop", reason="INC-5")
    assert (
        "stop not done: application &#x27;shared&#x27; cannot be stopped: it runs the queries"
        " of 1 pipeline (orders)" in html
    )
    assert SparkApplication.objects.get().desired_state == "running"
    html = control("recycle", reason="INC-5: memory keeps growing")
    assert "recycle of shared requested." in html
    assert SparkApplication.objects.get().status == "recycling"
    html = control("recycle")
    assert "recycle not done: application &#x27;shared&#x27; is recycling" in html
    Run.objects.filter(pk=run.pk).update(state="exited")
    assert "stop of shared requested." in control("stop", reason="maintenance")
    assert SparkApplication.objects.get().desired_state == "stopped"
    entry = AuditEntry.objects.get(application_name="shared", action="application-recycle")
    assert (entry.actor_name, entry.reason) == ("page-operator", "INC-5: memory keeps growing")
    assert "INC-5: memory keeps growing" in operator.get(url).content.decode()
    assert operator.post(reverse("application-control", args=["shared", "kill"])).status_code in (
        404,
    )


def test_the_audit_page_filters_by_application(django_user_model, shared):
    operator = client_with(django_user_model, "operator")
    operator.post(
        reverse("application-control", args=["shared", "start"]),
        {"confirm": "shared", "reason": "why"},
    )
    html = operator.get(reverse("audit"), {"application": "shared"}).content.decode()
    assert "application-start" in html
    assert f'application <a href="{reverse("application", args=["shared"])}">shared</a>' in html
    none = operator.get(reverse("audit"), {"application": "other"}).content.decode()
    assert "No actions match." in none


def test_the_pipeline_page_says_where_it_runs(django_user_model, pipeline, shared):
    client = client_with(django_user_model, "viewer")
    status_url = reverse("pipeline-status", args=["orders"])
    assert "placement: dedicated" in client.get(status_url).content.decode()
    Pipeline.objects.filter(name="orders").update(placement="shared")
    member(shared, "orders")
    html = client.get(reverse("pipeline", args=["orders"])).content.decode()
    link = f'<a href="{reverse("application", args=["shared"])}">shared</a>'
    assert f"placement: {link}" in html
    assert f"in shared application {link}" in html


def test_the_edit_form_places_a_pipeline_and_refuses_an_unknown_application(
    django_user_model, pipeline, shared
):
    editor = client_with(django_user_model, "editor")
    url = reverse("pipeline-edit", args=["orders"])
    page = editor.get(url).content.decode()
    select = page[page.index('name="placement"') :]
    select = select[: select.index("</select>")]
    assert re.findall(r'<option value="([^"]*)"', select) == ["dedicated", "auto", "shared"]
    assert '<option value="dedicated" selected>' in select
    post = {"version": "1", "placement": "shared"}
    spec = Pipeline.objects.get(name="orders").spec
    response = editor.post(url, {**form_for(spec), **post})
    assert response.status_code == 302, field_errors(response.content.decode(), "placement")
    row = Pipeline.objects.get(name="orders")
    assert (row.placement, row.version) == ("shared", 1)
    entry = AuditEntry.objects.get(pipeline_name="orders", action="update")
    assert (entry.before["placement"], entry.after["placement"]) == ("dedicated", "shared")
    # An application deleted while the form was open.
    response = editor.post(url, {**form_for(spec), "version": "1", "placement": "gone"})
    assert response.status_code == 400
    assert "there is no application named &#x27;gone&#x27;" in field_errors(
        response.content.decode(), "placement"
    )
    assert Pipeline.objects.get(name="orders").placement == "shared"


def test_the_admin_defines_applications_through_the_same_checks(admin_client, pipeline):
    for url in ("/admin/pipelines/sparkapplication/", "/admin/pipelines/sparkapplication/add/"):
        assert admin_client.get(url).status_code == 200, url
    form = {"name": "shared", "description": "", "master": "", "executor_memory": ""}
    response = admin_client.post(
        "/admin/pipelines/sparkapplication/add/",
        {**form, "driver_memory": "2 GB", "capacity": "0"},
    )
    assert response.status_code == 200
    html = response.content.decode()
    assert "is not an amount of memory" in html
    assert "greater than or equal to 1" in html
    assert not SparkApplication.objects.exists()
    response = admin_client.post(
        "/admin/pipelines/sparkapplication/add/", {**form, "driver_memory": "2g", "capacity": "5"}
    )
    assert response.status_code == 302
    app = SparkApplication.objects.get()
    assert (app.capacity, app.desired_state) == (5, "running")
    change = f"/admin/pipelines/sparkapplication/{app.pk}/change/"
    assert admin_client.get(change).status_code == 200
    response = admin_client.post(change, {**form, "driver_memory": "4g", "capacity": "5"})
    assert response.status_code == 302
    assert SparkApplication.objects.get().driver_memory == "4g"
    # Deleting goes through the same refusals.
    Pipeline.objects.filter(name="orders").update(placement="shared")
    response = admin_client.post(
        f"/admin/pipelines/sparkapplication/{app.pk}/delete/", {"post": "yes"}, follow=True
    )
    assert "Not deleted: application &#x27;shared&#x27; is the placement of 1 pipeline" in (
        response.content.decode()
    )
    assert SparkApplication.objects.exists()
    Pipeline.objects.filter(name="orders").update(placement="dedicated")
    admin_client.post(f"/admin/pipelines/sparkapplication/{app.pk}/delete/", {"post": "yes"})
    assert not SparkApplication.objects.exists()
    assert list(
        AuditEntry.objects.filter(application_name="shared")
        .order_by("id")
        .values_list("action", "actor_name")
    ) == [
        ("application-create", "admin"),
        ("application-update", "admin"),
        ("application-delete", "admin"),
    ]
