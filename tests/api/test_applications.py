"""Shared Spark applications over the API: definitions (admins), controls (operators), what
is observed (viewers), the refusals that protect their members, the audit log, pipelines'
placement and the Prometheus series. No Spark: members are Run rows made here."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from controlplane.accounts.models import ApiToken
from controlplane.accounts.roles import set_role
from controlplane.definitions.models import AuditEntry, Pipeline, Run, SparkApplication

URL = "/api/applications/"


@pytest.fixture
def as_role(django_user_model):
    """An API client whose token's user has the given role."""

    def make(role: str | None) -> APIClient:
        user, _ = django_user_model.objects.get_or_create(username=f"app-{role}")
        set_role(user, role)
        _, key = ApiToken.issue(user, "tests")
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Token {key}")
        return client

    return make


@pytest.fixture
def admin(as_role) -> APIClient:
    return as_role("admin")


@pytest.fixture
def operator(as_role) -> APIClient:
    return as_role("operator")


@pytest.fixture
def shared(admin) -> dict:
    response = admin.post(
        URL,
        {"name": "shared", "description": "small pipelines", "capacity": 3},
        format="json",
    )
    assert response.status_code == 201, response.json()
    return response.json()


def member(app: SparkApplication, pipeline_name: str, *, generation=None, state="running"):
    """A pipeline's active run placed in the application (as the reconciler would place it)."""
    pipeline = Pipeline.objects.get(name=pipeline_name)
    return Run.objects.create(
        pipeline=pipeline,
        generation=pipeline.runs.count() + 1,
        spec_version=1,
        state=state,
        application=app,
        application_generation=app.generation if generation is None else generation,
    )


def running(name: str = "shared", **extra) -> SparkApplication:
    """The application as the reconciler leaves it once its process is up."""
    SparkApplication.objects.filter(name=name).update(
        **{"status": "running", "generation": 1, "pid": 4242, "host": "here", **extra}
    )
    return SparkApplication.objects.get(name=name)


def entries(name: str = "shared") -> list[str]:
    return list(
        AuditEntry.objects.filter(application_name=name)
        .order_by("id")
        .values_list("action", flat=True)
    )


# -- definitions ----------------------------------------------------------------------------


def test_an_admin_creates_reads_changes_and_deletes_an_application(admin, as_role, shared):
    assert shared["name"] == "shared"
    assert shared["url"].endswith("/api/applications/shared/")
    assert (shared["driver_memory"], shared["executor_memory"], shared["master"]) == ("2g", "", "")
    assert (shared["capacity"], shared["conf"]) == (3, {})
    # Wanted running from the start; stopped until the reconciler launches it.
    assert (shared["desired_state"], shared["status"]) == ("running", "stopped")
    assert (shared["member_count"], shared["members"], shared["capacity_free"]) == (0, [], 3)
    for field in ("generation", "pid", "restarts", "last_error", "rss_bytes", "cpu_percent"):
        assert field in shared

    viewer = as_role("viewer")
    listed = viewer.get(URL).json()
    assert [a["name"] for a in listed["results"]] == ["shared"]
    assert viewer.get(f"{URL}shared/").json()["description"] == "small pipelines"

    response = admin.patch(
        f"{URL}shared/",
        {
            "capacity": 10,
            "driver_memory": "4g",
            "executor_memory": "1g",
            "master": "local[4]",
            "conf": {
                "spark.sql.shuffle.partitions": 8,
                "spark.sql.adaptive.enabled": True,
                "spark.memory.fraction": 0.6,
            },
        },
        format="json",
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    assert (body["capacity"], body["capacity_free"], body["driver_memory"]) == (10, 10, "4g")
    # Stored as spark-submit takes them.
    assert body["conf"] == {
        "spark.sql.shuffle.partitions": "8",
        "spark.sql.adaptive.enabled": "true",
        "spark.memory.fraction": "0.6",
    }
    # PUT with its own name is fine; what it leaves out stays.
    response = admin.put(f"{URL}shared/", {"name": "shared", "capacity": 12}, format="json")
    assert response.status_code == 200, response.json()
    assert (response.json()["capacity"], response.json()["driver_memory"]) == (12, "4g")

    assert admin.delete(f"{URL}shared/").status_code == 204
    assert not SparkApplication.objects.exists()
    assert entries() == [
        "application-create",
        "application-update",
        "application-update",
        "application-delete",
    ]


def test_writing_what_is_already_so_is_not_audited_and_observed_fields_are_read_only(admin, shared):
    response = admin.patch(
        f"{URL}shared/",
        {"capacity": 3, "status": "running", "pid": 1, "desired_state": "stopped"},
        format="json",
    )
    assert response.status_code == 200
    app = SparkApplication.objects.get()
    assert (app.status, app.pid, app.desired_state) == ("stopped", None, "running")
    assert entries() == ["application-create"]


def test_a_change_leaves_what_the_reconciler_records_alone(admin, shared):
    running(rss_bytes=123, restarts=2)
    response = admin.patch(f"{URL}shared/", {"description": "now bigger"}, format="json")
    assert response.status_code == 200
    app = SparkApplication.objects.get()
    assert (app.status, app.pid, app.generation, app.rss_bytes, app.restarts) == (
        "running",
        4242,
        1,
        123,
        2,
    )


def test_only_admins_define_applications(as_role, shared):
    for role in ("viewer", "operator", "editor"):
        client = as_role(role)
        assert client.get(f"{URL}shared/").status_code == 200
        for response in (
            client.post(URL, {"name": f"by-{role}"}, format="json"),
            client.patch(f"{URL}shared/", {"capacity": 5}, format="json"),
            client.put(f"{URL}shared/", {"name": "shared"}, format="json"),
            client.delete(f"{URL}shared/"),
        ):
            assert response.status_code == 403, (role, response.status_code)
            assert "needs the admin role" in response.json()["detail"]
    assert list(SparkApplication.objects.values_list("name", "capacity")) == [("shared", 3)]


def test_operators_use_the_controls_and_viewers_cannot(as_role, shared):
    viewer = as_role("viewer")
    for action in ("start", "stop", "recycle"):
        response = viewer.post(f"{URL}shared/{action}/", {}, format="json")
        assert response.status_code == 403
        assert "needs the operator role" in response.json()["detail"]
    operator = as_role("operator")
    assert operator.post(f"{URL}shared/stop/", {}, format="json").status_code == 202
    assert operator.post(f"{URL}shared/start/", {}, format="json").status_code == 202
    running()
    assert operator.post(f"{URL}shared/recycle/", {}, format="json").status_code == 202
    editor = as_role("editor")  # an editor has an operator's rights too
    assert editor.post(f"{URL}shared/start/", {}, format="json").status_code == 202


@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"name": "Shared_1"}, "name", "lower-case letters"),
        ({"name": "auto"}, "name", "placement says"),
        ({"name": "dedicated"}, "name", "placement says"),
        ({"driver_memory": "2gb"}, "driver_memory", "is not an amount of memory"),
        ({"driver_memory": ""}, "driver_memory", ""),
        ({"driver_memory": "0g"}, "driver_memory", "is not an amount of memory"),
        ({"executor_memory": "lots"}, "executor_memory", "is not an amount of memory"),
        ({"master": "local[0]"}, "master", "is not a Spark master"),
        ({"master": "local [2]"}, "master", "whitespace"),
        ({"master": "'yarn'"}, "master", "quotes"),
        ({"master": "--conf=x"}, "master", "must not start with '-'"),
        ({"master": "spark://host"}, "master", "is not a Spark master"),
        ({"master": "spark://host:99999"}, "master", "port outside 1-65535"),
        ({"master": "k8s://http://api:6443"}, "master", "is not a Spark master"),
        ({"master": "mesos://zk:2181"}, "master", "is not a Spark master"),
        ({"conf": ["spark.sql.shuffle.partitions"]}, "conf", "must be an object"),
        ({"capacity": 0}, "capacity", "greater than or equal to 1"),
        ({"capacity": 1001}, "capacity", "less than or equal to 1000"),
    ],
)
def test_each_bad_field_is_refused_with_400_naming_it(admin, db, body, field, says):
    response = admin.post(URL, {"name": "shared", **body}, format="json")
    assert response.status_code == 400
    errors = response.json()
    assert list(errors) == [field], errors
    assert says in " ".join(errors[field]), errors
    assert not SparkApplication.objects.exists()
    assert not AuditEntry.objects.exists()


@pytest.mark.parametrize(
    "master",
    [
        "",
        "local",
        "local[4]",
        "local[*]",
        "local[2,3]",
        "local[*,4]",
        "spark://spark-a.example:7077",
        "spark://10.0.0.1:7077,10.0.0.2:7077",
        "yarn",
        "k8s://https://k8s.example.com:6443",
        "k8s://https://10.0.0.9/api",
    ],
)
def test_every_kind_of_master_is_accepted(admin, db, master):
    response = admin.post(URL, {"name": "shared", "master": master}, format="json")
    assert response.status_code == 201, response.json()
    assert response.json()["master"] == master


def test_spark_settings_are_checked_against_the_allow_list_each_key_named(admin, shared):
    response = admin.patch(
        f"{URL}shared/",
        {
            "conf": {
                "spark.driver.extraJavaOptions": "-javaagent:/tmp/evil.jar",
                "spark.sql.streaming.stopTimeout": "1",
                "spark.sql.shuffle.partitions": "4",
                "spark.executor.cores": {"nested": 1},
                "spark.jars": "/tmp/x.jar",
                "spark.sql.streaming.checkpointFileManagerClass": "evil.Manager",
                "bad key": "1",
                "spark.sql.adaptive.enabled": "true\n--conf spark.jars=/tmp/x.jar",
            }
        },
        format="json",
    )
    assert response.status_code == 400
    # The API's one error shape: each refused setting by its path under `conf`.
    assert response.json() == {
        "conf.spark.driver.extraJavaOptions": [
            "spark.driver.extraJavaOptions is not a setting a shared application may be given"
        ],
        "conf.spark.sql.streaming.stopTimeout": [
            "spark.sql.streaming.stopTimeout is set by the control plane"
        ],
        "conf.spark.executor.cores": ["must be a string, a number or a boolean"],
        "conf.spark.jars": ["spark.jars is not a setting a shared application may be given"],
        "conf.spark.sql.streaming.checkpointFileManagerClass": [
            "spark.sql.streaming.checkpointFileManagerClass names code for the JVM to load: "
            "not a setting a shared application may be given"
        ],
        "conf.bad key": ["'bad key' is not a Spark setting's name"],
        "conf.spark.sql.adaptive.enabled": [
            "must not contain control characters (line breaks, tabs)"
        ],
    }
    assert SparkApplication.objects.get().conf == {}
    too_many = {f"spark.sql.adaptive.x{i}": "1" for i in range(51)}
    response = admin.patch(f"{URL}shared/", {"conf": too_many}, format="json")
    assert response.status_code == 400
    assert response.json() == {"conf": ["at most 50 settings; got 51"]}


def test_an_application_cannot_be_renamed_or_created_twice(admin, shared):
    response = admin.patch(f"{URL}shared/", {"name": "other"}, format="json")
    assert response.status_code == 400
    assert "cannot be renamed" in response.json()["name"][0]
    response = admin.post(URL, {"name": "shared"}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["name"]
    assert list(SparkApplication.objects.values_list("name", flat=True)) == ["shared"]


# -- observed state ---------------------------------------------------------------------------


def test_members_are_the_active_runs_of_its_current_process(admin, pipeline, shared):
    app = running()
    for name in ("b-pipe", "c-pipe"):
        spec = admin.get("/api/pipelines/orders/").json()["spec"]
        assert (
            admin.post("/api/pipelines/", {"name": name, "spec": spec}, format="json").status_code
            == 201
        )
    member(app, "orders", state="running")
    member(app, "b-pipe", state="starting")
    member(app, "c-pipe", generation=0, state="running")  # a process before this one
    body = admin.get(f"{URL}shared/").json()
    assert body["member_count"] == 2
    assert body["capacity_free"] == 1
    assert [(m["pipeline"], m["state"]) for m in body["members"]] == [
        ("b-pipe", "starting"),
        ("orders", "running"),
    ]
    assert set(body["members"][0]) == {"pipeline", "generation", "state", "started_at"}
    listed = admin.get(URL).json()["results"][0]
    assert (listed["member_count"], listed["capacity_free"]) == (2, 1)
    # The pipeline says which application its current run is in.
    assert admin.get("/api/pipelines/orders/").json()["application"] == "shared"
    assert admin.get("/api/pipelines/c-pipe/").json()["application"] == "shared"


def test_the_last_error_is_shown_without_credentials(admin, shared):
    SparkApplication.objects.filter(name="shared").update(
        last_error="cannot connect to postgresql://etl:hunter2-secret@db/x; password=swordfish"
    )
    text = admin.get(f"{URL}shared/").json()["last_error"]
    assert "hunter2-secret" not in text and "swordfish" not in text
    assert "cannot connect to postgresql://etl:" in text


# -- controls ---------------------------------------------------------------------------------


def test_start_and_stop_change_what_is_desired_and_are_audited(operator, shared):
    response = operator.post(f"{URL}shared/stop/", {"reason": "INC-9: host maintenance"})
    assert response.status_code == 202, response.json()
    assert response.json()["desired_state"] == "stopped"
    assert operator.post(f"{URL}shared/stop/", {}, format="json").status_code == 202  # again
    response = operator.post(f"{URL}shared/start/", {"reason": "back"}, format="json")
    assert response.status_code == 202
    assert SparkApplication.objects.get().desired_state == "running"
    stop = AuditEntry.objects.filter(action="application-stop").order_by("id").first()
    assert (stop.actor_name, stop.reason) == ("app-operator", "INC-9: host maintenance")
    assert (stop.before["desired_state"], stop.after["desired_state"]) == ("running", "stopped")
    assert stop.after["capacity"] == 3 and stop.after["status"] == "stopped"
    assert (stop.pipeline_name, stop.connection_name) == ("", "")
    assert entries() == [
        "application-create",
        "application-stop",
        "application-stop",
        "application-start",
    ]


def test_stop_is_refused_while_it_has_members_or_pipelines_wanted_running_name_it(
    operator, pipeline, shared
):
    app = running()
    run = member(app, "orders")
    response = operator.post(f"{URL}shared/stop/", {"reason": "x"}, format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "application 'shared' cannot be stopped: it runs the queries of 1 pipeline (orders);"
        " stop those pipelines or place them elsewhere first"
    )
    Run.objects.filter(pk=run.pk).update(state="exited")
    Pipeline.objects.filter(name="orders").update(placement="shared", desired_state="running")
    response = operator.post(f"{URL}shared/stop/", {}, format="json")
    assert response.status_code == 409
    assert (
        "1 pipeline (orders) wanted running name it as their placement"
        in (response.json()["detail"])
    )
    assert SparkApplication.objects.get().desired_state == "running"
    assert entries() == ["application-create"]  # refusals change nothing
    # Stopped pipelines may keep naming it.
    Pipeline.objects.filter(name="orders").update(desired_state="stopped")
    assert operator.post(f"{URL}shared/stop/", {}, format="json").status_code == 202


def test_recycle_asks_the_reconciler_to_replace_a_running_process_once(operator, shared):
    response = operator.post(f"{URL}shared/recycle/", {"reason": "leak"}, format="json")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "application 'shared' is stopped: only a starting or running application can be recycled"
    )
    running()
    response = operator.post(f"{URL}shared/recycle/", {"reason": "driver leaks"}, format="json")
    assert response.status_code == 202, response.json()
    assert response.json()["status"] == "recycling"
    app = SparkApplication.objects.get()
    assert app.recycle_reason == "recycled by app-operator: driver leaks"
    assert app.recycle_requested_at is not None
    response = operator.post(f"{URL}shared/recycle/", {}, format="json")
    assert response.status_code == 409
    assert "is recycling" in response.json()["detail"]
    entry = AuditEntry.objects.get(action="application-recycle")
    assert (entry.before["status"], entry.after["status"]) == ("running", "recycling")
    assert entry.reason == "driver leaks"


def test_a_bad_control_body_is_refused_with_400(operator, shared):
    response = operator.post(f"{URL}shared/start/", {"reason": "x" * 2001}, format="json")
    assert response.status_code == 400
    assert list(response.json()) == ["reason"]


# -- deleting ---------------------------------------------------------------------------------


def test_delete_is_refused_while_anything_holds_the_application(admin, pipeline, shared):
    Pipeline.objects.filter(name="orders").update(placement="shared")
    response = admin.delete(f"{URL}shared/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "application 'shared' is the placement of 1 pipeline (orders): place them elsewhere first"
    )
    Pipeline.objects.filter(name="orders").update(placement="auto")
    app = running()
    run = member(app, "orders")
    response = admin.delete(f"{URL}shared/")
    assert response.status_code == 409
    assert (
        "still runs the queries of 1 pipeline (orders): stop them first"
        in (response.json()["detail"])
    )
    Run.objects.filter(pk=run.pk).update(state="exited")
    response = admin.delete(f"{URL}shared/")
    assert response.status_code == 409
    assert response.json()["detail"] == (
        "application 'shared' is running (process 4242 on here): stop it first, and delete"
        " it once it is stopped"
    )
    assert entries() == ["application-create"]
    SparkApplication.objects.filter(name="shared").update(status="stopped", pid=None)
    response = admin.delete(f"{URL}shared/", {"reason": "INC-3: retired"}, format="json")
    assert response.status_code == 204
    entry = AuditEntry.objects.get(action="application-delete")
    assert (entry.after, entry.before["capacity"], entry.reason) == ({}, 3, "INC-3: retired")
    # The run's history stays, without its application.
    assert Run.objects.get(pk=run.pk).application is None


# -- the audit log ----------------------------------------------------------------------------


def test_the_audit_log_filters_by_application(admin, operator, pipeline, shared):
    operator.post(f"{URL}shared/stop/", {"reason": "why not"}, format="json")
    admin.post(URL, {"name": "other"}, format="json")
    found = admin.get("/api/audit/", {"application": "shared"}).json()["results"]
    assert [(e["action"], e["application"], e["pipeline"]) for e in found] == [
        ("application-stop", "shared", ""),
        ("application-create", "shared", ""),
    ]
    assert found[0]["reason"] == "why not"
    assert found[0]["actor"] == "app-operator"
    everything = admin.get("/api/audit/").json()["results"]
    assert {e["application"] for e in everything} == {"shared", "other", ""}


# -- pipelines' placement ---------------------------------------------------------------------


def test_a_pipeline_is_placed_dedicated_auto_or_in_a_named_application(api, pipeline, shared):
    assert pipeline["placement"] == "dedicated"
    assert pipeline["application"] is None
    response = api.patch("/api/pipelines/orders/", {"placement": "shared"}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["placement"] == "shared"
    assert response.json()["version"] == 1  # not a spec change
    entry = AuditEntry.objects.filter(pipeline_name="orders", action="update").get()
    assert (entry.before["placement"], entry.after["placement"]) == ("dedicated", "shared")
    response = api.patch("/api/pipelines/orders/", {"placement": "auto"}, format="json")
    assert response.json()["placement"] == "auto"
    # A PUT that leaves it out keeps it.
    body = {"name": "orders", "spec": response.json()["spec"]}
    assert api.put("/api/pipelines/orders/", body, format="json").json()["placement"] == "auto"
    # Placing nowhere known is refused, naming the field.
    response = api.patch("/api/pipelines/orders/", {"placement": "nowhere"}, format="json")
    assert response.status_code == 400
    assert response.json() == {
        "placement": [
            "must be 'dedicated', 'auto' or the name of a shared Spark application; there is"
            " no application named 'nowhere'"
        ]
    }
    assert Pipeline.objects.get(name="orders").placement == "auto"
    spec = api.get("/api/pipelines/orders/").json()["spec"]
    response = api.post(
        "/api/pipelines/", {"name": "placed", "spec": spec, "placement": "shared"}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert response.json()["placement"] == "shared"
    created = AuditEntry.objects.get(pipeline_name="placed", action="create")
    assert created.after["placement"] == "shared"
    response = api.post(
        "/api/pipelines/", {"name": "lost", "spec": spec, "placement": "Bad!"}, format="json"
    )
    assert response.status_code == 400 and list(response.json()) == ["placement"]


def test_placement_is_changed_by_editors_not_operators(as_role, pipeline, shared):
    response = as_role("operator").patch(
        "/api/pipelines/orders/", {"placement": "shared"}, format="json"
    )
    assert response.status_code == 403
    assert Pipeline.objects.get(name="orders").placement == "dedicated"


# -- Prometheus -------------------------------------------------------------------------------


def test_prometheus_exposes_each_application_and_where_pipelines_run(api, pipeline, shared):
    app = running(rss_bytes=512 * 1024 * 1024, cpu_percent=37.5, restarts=4)
    member(app, "orders")
    Pipeline.objects.filter(name="orders").update(placement="auto")
    SparkApplication.objects.create(name="idle", capacity=7)
    text = api.get("/metrics").content.decode()
    samples = dict(
        line.rsplit(" ", 1) for line in text.splitlines() if line and not line.startswith("#")
    )
    assert samples['cp_application_up{application="shared"}'] == "1.0"
    assert samples['cp_application_up{application="idle"}'] == "0.0"
    assert samples['cp_application_status{application="shared",status="running"}'] == "1.0"
    assert samples['cp_application_status{application="idle",status="stopped"}'] == "1.0"
    assert samples['cp_application_members{application="shared"}'] == "1.0"
    assert samples['cp_application_members{application="idle"}'] == "0.0"
    assert samples['cp_application_capacity{application="shared"}'] == "3.0"
    assert samples['cp_application_capacity{application="idle"}'] == "7.0"
    assert float(samples['cp_application_resident_memory_bytes{application="shared"}']) == 2**29
    assert samples['cp_application_cpu_percent{application="shared"}'] == "37.5"
    assert samples['cp_application_restarts_total{application="shared"}'] == "4.0"
    assert 'cp_application_resident_memory_bytes{application="idle"}' not in samples  # unknown
    # prometheus_client writes label names in alphabetical order.
    info = 'cp_pipeline_placement_info{application="shared",pipeline="orders",placement="auto"}'
    assert samples[info] == "1.0"
    assert "# TYPE cp_application_restarts_total counter" in text
    assert "# TYPE cp_application_up gauge" in text
    # The pipelines' own series are as they were.
    assert samples['cp_pipeline_status{pipeline="orders",status="stopped"}'] == "1.0"
