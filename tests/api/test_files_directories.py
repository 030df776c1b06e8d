"""No two pipelines share a directory, whatever the spelling; none writes into the control
plane's own directories; a files root cannot move under its pipelines. Through the API as an
editor, the connection form and the admin, asserting status, the field named and what is
stored (controlplane.connections.directories, jobs.spec.locations)."""

from __future__ import annotations

import json

import pytest
from django.test import Client
from django.urls import reverse

from controlplane.connections.directories import RESTORE_POINTS_STORE, RootInUse
from controlplane.connections.models import Connection
from controlplane.connections.serializers import ConnectionSerializer
from controlplane.definitions.models import AuditEntry, Pipeline
from tests.factories import files_spec, valid_spec


def connect(api, name: str, root: str):
    body = {"name": name, "kind": "files", "settings": {"root": root}}
    return api.post("/api/connections/", body, format="json")


def on(connection: str, path: str) -> dict:
    spec = files_spec(path)
    spec["sink"]["connection"] = connection
    return spec


def sinks(*pairs: tuple[str, str]) -> dict:
    spec = valid_spec(sinks=[on(c, p)["sink"] for c, p in pairs])
    spec.pop("sink")
    return spec


def create(api, name: str, spec: dict):
    return api.post("/api/pipelines/", {"name": name, "spec": spec}, format="json")


def move(api, connection: str, root: str):
    body = {"settings": {"root": root}}
    return api.patch(f"/api/connections/{connection}/", body, format="json")


def stored_root(name: str) -> str:
    return Connection.objects.get(name=name).settings["root"]


@pytest.fixture
def control_plane_dirs(settings, tmp_path):
    """The control plane's checkpoint root (with its restore points) and runs root, made
    outside the files directory."""
    checkpoints = tmp_path / "cp" / "checkpoints"
    (checkpoints / RESTORE_POINTS_STORE).mkdir(parents=True)
    runs = tmp_path / "cp" / "runs"
    runs.mkdir()
    settings.CONTROLPLANE_CHECKPOINT_ROOT = checkpoints
    settings.CONTROLPLANE_RUNS_ROOT = runs
    return checkpoints, runs


# -- one directory, many spellings ------------------------------------------------------------


def test_two_spellings_of_one_hadoop_root_are_one_directory(api, kafka_connection):
    assert connect(api, "upper", "HDFS://NN:8020/lake").status_code == 201
    assert connect(api, "lower", "hdfs://nn/lake/").status_code == 201
    assert connect(api, "port9000", "hdfs://nn:9000/lake").status_code == 201
    assert create(api, "first", on("upper", "sales")).status_code == 201

    response = create(api, "second", on("lower", "sales"))
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sink.path"]
    message = response.json()["spec.sink.path"][0]
    assert "pipeline 'first' writes its files to hdfs://NN:8020/lake/sales already" in message
    assert "(sink.path 'sales' of connection 'upper')" in message
    assert "the same directory as hdfs://nn/lake/sales" in message
    # Nested, both ways.
    response = create(api, "second", on("lower", "sales/eu"))
    assert response.status_code == 400
    assert "are one inside the other" in response.json()["spec.sink.path"][0]
    assert create(api, "outer", on("upper", "deep")).status_code == 201
    response = create(api, "second", on("lower", "deep/er"))  # inside 'outer'
    assert "pipeline 'outer'" in response.json()["spec.sink.path"][0]
    # Beside it, and another NameNode port, are other directories.
    assert create(api, "second", on("lower", "sales-eu")).status_code == 201
    assert create(api, "third", on("port9000", "sales")).status_code == 201
    assert set(Pipeline.objects.values_list("name", flat=True)) == {
        "first",
        "outer",
        "second",
        "third",
    }


def test_azure_s_blob_and_data_lake_endpoints_reach_one_container(api, kafka_connection):
    blob = "wasbs://c@acct.blob.core.windows.net/lake"
    assert connect(api, "blob", blob).status_code == 201
    assert connect(api, "dfs", "abfss://c@ACCT.dfs.core.windows.net/lake/sales").status_code == 201
    assert connect(api, "other", "abfss://d@acct.dfs.core.windows.net/lake").status_code == 201
    assert create(api, "first", on("blob", "sales")).status_code == 201
    response = create(api, "second", on("dfs", "orders"))
    assert response.status_code == 400
    message = response.json()["spec.sink.path"][0]
    assert f"{blob}/sales, where pipeline 'first' writes its files" in message
    assert create(api, "second", on("other", "sales")).status_code == 201  # another container


def test_spellings_of_a_path_are_refused_or_found_to_be_the_same_directory(
    api, kafka_connection, files_connection, files_dir
):
    assert create(api, "first", files_spec("sales")).status_code == 201
    for path, message in (
        ("sales/", "pipeline 'first' writes its files to"),
        ("a//b", "has an empty directory ('//')"),
        ("x/../y", "directory '..' is not allowed"),
        ("./sales", "directory '.' is not allowed"),
        ("%73ales", "directory '%73ales' is not allowed"),
    ):
        response = create(api, "second", files_spec(path))
        assert response.status_code == 400, path
        assert message in response.json()["spec.sink.path"][0], (path, response.json())
    # A root is stored canonical, or refused on settings.root: never two forms of one place.
    for root in ("s3a://b/x/./y", "s3a://b/x//y", f"file://{files_dir}/lake/%61", "hdfs://nn/.."):
        response = connect(api, "odd", root)
        assert response.status_code == 400, root
        assert list(response.json()) == ["settings.root"]
    assert not Connection.objects.filter(name="odd").exists()
    assert list(Pipeline.objects.values_list("name", flat=True)) == ["first"]


def test_symbolic_links_lead_to_the_directory_they_point_at(
    api, kafka_connection, files_connection, files_dir
):
    lake = files_dir / "lake"
    (lake / "sales").mkdir()
    (files_dir / "alias").symlink_to(lake)
    (lake / "mirror").symlink_to(lake / "sales")
    assert connect(api, "alias", f"file://{files_dir}/alias").status_code == 201
    assert create(api, "first", files_spec("sales")).status_code == 201

    for name, spec in (
        ("through-root", on("alias", "sales")),
        ("through-root-nested", on("alias", "sales/eu")),
        ("through-path", files_spec("mirror")),
        ("through-path-nested", files_spec("mirror/eu")),
    ):
        response = create(api, name, spec)
        assert response.status_code == 400, name
        assert "pipeline 'first'" in response.json()["spec.sink.path"][0], name
    assert create(api, "beside", on("alias", "returns")).status_code == 201
    assert set(Pipeline.objects.values_list("name", flat=True)) == {"first", "beside"}


def test_two_sinks_of_one_pipeline_through_two_connections_to_one_root(
    api, kafka_connection, files_connection, files_dir
):
    assert connect(api, "again", f"file:{files_dir}/lake/").status_code == 201
    response = create(api, "both", sinks(("lake", "a/b"), ("again", "a")))
    assert response.status_code == 400
    assert list(response.json()) == ["spec.sinks[1].path"]
    message = response.json()["spec.sinks[1].path"][0]
    assert f"file://{files_dir}/lake/a is nested with file://{files_dir}/lake/a/b" in message
    assert "where sinks[0] writes (sinks[0].path 'a/b' of connection 'lake')" in message
    response = create(api, "both", sinks(("lake", "a"), ("again", "a")))
    assert "is the same directory as" in response.json()["spec.sinks[1].path"][0]
    assert create(api, "both", sinks(("lake", "a"), ("again", "b"))).status_code == 201


# -- the control plane's own directories ------------------------------------------------------


def test_a_files_sink_may_not_write_into_the_control_plane_s_own_directories(
    api, kafka_connection, files_connection, files_dir, settings, control_plane_dirs
):
    checkpoints, runs = control_plane_dirs
    lake = files_dir / "lake"
    # Links inside the root (made after the root was saved) lead into them.
    (lake / "ckpt").symlink_to(checkpoints)
    (lake / "rp").symlink_to(checkpoints / RESTORE_POINTS_STORE)
    (lake / "runs").symlink_to(runs)
    for path, message in (
        ("ckpt", f"is the control plane's own directory file://{checkpoints}"),
        ("ckpt/orders", "is inside the control plane's own directory"),
        ("rp/orders", f"{RESTORE_POINTS_STORE} (restore points, CONTROLPLANE_CHECKPOINT_ROOT"),
        ("runs/orders", f"file://{runs} (CONTROLPLANE_RUNS_ROOT)"),
    ):
        response = create(api, "p", files_spec(path))
        assert response.status_code == 400, path
        assert list(response.json()) == ["spec.sink.path"]
        assert message in response.json()["spec.sink.path"][0], (path, response.json())
        assert "a pipeline may not write there" in response.json()["spec.sink.path"][0]
    # A directory moved under a root after it was saved: holding it is refused too.
    settings.CONTROLPLANE_CHECKPOINT_ROOT = lake / "deep" / "checkpoints"
    response = create(api, "p", files_spec("deep"))
    assert "holds the control plane's own directory" in response.json()["spec.sink.path"][0]
    response = create(api, "p", sinks(("lake", "fine"), ("lake", "deep/checkpoints/x")))
    assert list(response.json()) == ["spec.sinks[1].path"]
    assert not Pipeline.objects.exists()
    assert create(api, "p", files_spec("fine")).status_code == 201


def test_a_files_root_may_not_be_hold_or_be_inside_the_control_plane_s_own_directories(
    api, settings, tmp_path, control_plane_dirs
):
    checkpoints, runs = control_plane_dirs
    settings.CONTROLPLANE_FILES_DIR = str(tmp_path)
    (tmp_path / "link").symlink_to(runs)
    for root, message in (
        (f"file://{checkpoints}", "is the control plane's own directory"),
        (f"file:{checkpoints}/", "is the control plane's own directory"),
        (f"file://{checkpoints}/{RESTORE_POINTS_STORE}/x", "restore points"),
        (f"file://{tmp_path}/cp", "holds the control plane's own directory"),
        (
            f"file://{tmp_path}/link/orders",
            f"is inside the control plane's own directory file://{runs}",
        ),
    ):
        response = connect(api, "lake", root)
        assert response.status_code == 400, root
        assert list(response.json()) == ["settings.root"]
        assert message in response.json()["settings.root"][0], (root, response.json())
    assert not Connection.objects.exists()
    assert connect(api, "lake", f"file://{tmp_path}/lake").status_code == 201


def test_the_restore_points_directory_is_the_one_supervision_uses():
    from controlplane.supervision.restore_points import STORE

    assert RESTORE_POINTS_STORE == STORE


# -- a files connection's root changed --------------------------------------------------------


def test_moving_a_root_onto_another_pipeline_s_directory_is_a_409_naming_them(
    api, kafka_connection, files_connection, files_dir
):
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    assert create(api, "first", files_spec("sales")).status_code == 201
    assert create(api, "second", on("other", "sales")).status_code == 201
    assert create(api, "third", on("other", "archive")).status_code == 201
    audited = AuditEntry.objects.filter(connection_name="other").count()
    lake = f"file://{files_dir}/lake"

    response = move(api, "other", lake)
    assert response.status_code == 409
    body = response.json()
    assert body["pipelines"] == ["first", "second"]
    assert body["conflicts"] == [
        {
            "pipeline": "second",
            "field": "sink.path",
            "connection": "other",
            "path": "sales",
            "location": f"{lake}/sales",
            "with": {
                "pipeline": "first",
                "field": "sink.path",
                "connection": "lake",
                "path": "sales",
                "location": f"{lake}/sales",
            },
        }
    ]
    assert f"connection 'other' cannot move to {lake}" in body["detail"]
    assert (
        f"pipeline 'second' (sink.path 'sales') would write to {lake}/sales, the same"
        f" directory as {lake}/sales where pipeline 'first' writes"
    ) in body["detail"]
    assert "nothing was changed" in body["detail"]
    # Nested: under first's directory, both of other's pipelines would be inside it.
    response = move(api, "other", f"file:{files_dir}/lake/sales/")
    assert response.status_code == 409
    assert response.json()["pipelines"] == ["first", "second", "third"]
    # A full update (PUT) is refused the same way.
    body = {"name": "other", "kind": "files", "settings": {"root": lake}}
    assert api.put("/api/connections/other/", body, format="json").status_code == 409
    # Nothing was saved, nothing audited.
    assert stored_root("other") == f"file://{files_dir}/other"
    assert AuditEntry.objects.filter(connection_name="other").count() == audited
    # The same place spelled another way is no move; a free place is fine.
    assert move(api, "other", f"file:{files_dir}/other/").status_code == 200
    assert move(api, "other", f"file://{files_dir}/moved").status_code == 200
    assert stored_root("other") == f"file://{files_dir}/moved"


def test_moving_a_hadoop_root_onto_another_spelling_of_a_used_one_is_a_409(api, kafka_connection):
    assert connect(api, "h1", "hdfs://nn/lake").status_code == 201
    assert connect(api, "h2", "hdfs://nn:9000/lake").status_code == 201
    assert create(api, "p", on("h1", "x")).status_code == 201
    assert create(api, "q", on("h2", "x")).status_code == 201
    response = move(api, "h2", "HDFS://NN:8020/lake/")
    assert response.status_code == 409
    assert response.json()["pipelines"] == ["p", "q"]
    assert stored_root("h2") == "hdfs://nn:9000/lake"


def test_a_root_change_is_checked_against_the_same_pipeline_s_other_sinks(
    api, kafka_connection, files_connection, files_dir
):
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    assert create(api, "both", sinks(("lake", "a"), ("other", "a/b"))).status_code == 201
    response = move(api, "other", f"file://{files_dir}/lake")
    assert response.status_code == 409
    assert response.json()["pipelines"] == ["both"]
    assert response.json()["conflicts"][0]["field"] == "sinks[1].path"
    assert response.json()["conflicts"][0]["with"]["field"] == "sinks[0].path"


def test_a_root_change_that_leads_a_sink_into_the_control_plane_s_directories_is_a_409(
    api, kafka_connection, files_connection, files_dir, control_plane_dirs
):
    checkpoints, _ = control_plane_dirs
    (files_dir / "next").mkdir()
    (files_dir / "next" / "ckpt").symlink_to(checkpoints)
    assert create(api, "p", files_spec("ckpt")).status_code == 201
    response = move(api, "lake", f"file://{files_dir}/next")
    assert response.status_code == 409
    body = response.json()
    assert body["pipelines"] == ["p"]
    assert body["conflicts"][0]["control_plane_directory"] == (
        f"file://{checkpoints} (CONTROLPLANE_CHECKPOINT_ROOT)"
    )
    assert "which is the control plane's own directory" in body["detail"]
    assert stored_root("lake") == f"file://{files_dir}/lake"


def test_a_root_change_is_checked_again_when_saved(
    api, kafka_connection, files_connection, files_dir
):
    """A pipeline saved between the change's validation and its save: the save checks again
    with every files connection locked, and refuses (the API answers 409 from it too)."""
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    assert create(api, "first", files_spec("sales")).status_code == 201
    other = Connection.objects.get(name="other")
    data = {"settings": {"root": f"file://{files_dir}/lake"}}
    serializer = ConnectionSerializer(other, data=data, partial=True)
    assert serializer.is_valid(), serializer.errors  # nothing uses `other` yet
    assert create(api, "second", on("other", "sales")).status_code == 201
    with pytest.raises(RootInUse) as caught:
        serializer.save()
    assert caught.value.pipelines == ["first", "second"]
    assert stored_root("other") == f"file://{files_dir}/other"


def test_the_connection_form_shows_a_root_its_pipelines_cannot_follow(
    api, user, kafka_connection, files_connection, files_dir
):
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    assert create(api, "first", files_spec("sales")).status_code == 201
    assert create(api, "second", on("other", "sales")).status_code == 201
    browser = Client()
    browser.force_login(user)
    url = reverse("connection-edit", kwargs={"name": "other"})
    response = browser.post(url, {"root": f"file://{files_dir}/lake", "description": ""})
    assert response.status_code == 400
    page = response.content.decode()
    errors = page.split('id="e-root"', 1)[1].split("</ul>", 1)[0]
    assert "connection &#x27;other&#x27; cannot move to" in errors
    assert "pipeline &#x27;first&#x27; writes" in errors
    assert stored_root("other") == f"file://{files_dir}/other"
    response = browser.post(url, {"root": f"file://{files_dir}/moved", "description": ""})
    assert response.status_code == 302
    assert stored_root("other") == f"file://{files_dir}/moved"


def test_the_admin_refuses_a_root_its_pipelines_cannot_follow(
    api, admin_client, kafka_connection, files_connection, files_dir
):
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    assert create(api, "first", files_spec("sales")).status_code == 201
    assert create(api, "second", on("other", "sales")).status_code == 201
    other = Connection.objects.get(name="other")
    form = {
        "name": "other",
        "kind": "files",
        "description": "",
        "settings": json.dumps({"root": f"file://{files_dir}/lake"}),
    }
    response = admin_client.post(f"/admin/connections/connection/{other.pk}/change/", form)
    assert response.status_code == 200  # the form again, with the problem
    assert "connection &#x27;other&#x27; cannot move to" in response.content.decode()
    assert stored_root("other") == f"file://{files_dir}/other"


def test_a_long_list_of_conflicts_is_cut_in_the_message_but_whole_in_the_body(
    api, kafka_connection, files_connection, files_dir
):
    assert connect(api, "other", f"file://{files_dir}/other").status_code == 201
    for i in range(12):
        assert create(api, f"on-lake-{i:02}", files_spec(f"d{i:02}")).status_code == 201
        assert create(api, f"on-other-{i:02}", on("other", f"d{i:02}")).status_code == 201
    response = move(api, "other", f"file://{files_dir}/lake")
    assert response.status_code == 409
    body = response.json()
    assert len(body["conflicts"]) == 12 and len(body["pipelines"]) == 24
    assert "and 2 more (see conflicts)" in body["detail"]
    assert body["detail"].count("would write to") == 10
