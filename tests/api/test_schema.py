from __future__ import annotations

from django.core.management import call_command


def test_the_openapi_schema_is_valid_and_generates_without_warnings(tmp_path, db):
    # --fail-on-warn turns any endpoint drf-spectacular cannot describe into an error.
    call_command("spectacular", "--validate", "--fail-on-warn", "--file", str(tmp_path / "s.yaml"))
    assert "/api/pipelines/{name}/versions/" in (tmp_path / "s.yaml").read_text()


def test_the_openapi_schema_describes_the_endpoints(api):
    response = api.get("/api/schema/", HTTP_ACCEPT="application/vnd.oai.openapi+json")
    assert response.status_code == 200
    schema = response.json()
    assert schema["openapi"].startswith("3.")
    for path in (
        "/api/connections/",
        "/api/connections/{name}/test/",
        "/api/pipelines/{name}/",
        "/api/pipelines/{name}/versions/",
        "/api/applications/{name}/",
        "/api/applications/{name}/recycle/",
    ):
        assert path in schema["paths"], sorted(schema["paths"])
