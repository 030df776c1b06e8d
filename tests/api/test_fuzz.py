"""The API under a fuzzer (schemathesis, generating requests from the OpenAPI document):
whatever a generated body holds, the answer is one the document describes (never a 500)."""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.specs.openapi.checks import positive_data_acceptance

pytestmark = pytest.mark.django_db


@pytest.fixture
def api_schema(token):
    from django.core.signals import request_finished, request_started
    from django.db import close_old_connections

    from controlplane.wsgi import application

    # As Django's test client does: requests must not close the test's database connection
    # (its transaction holds the test's data).
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield schemathesis.openapi.from_wsgi(
            "/api/schema/?format=json", application, headers={"Authorization": f"Token {token}"}
        )
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def fuzz(schema, path: str, method: str, token: str, examples: int) -> list[int]:
    """Generated requests to one operation, each answer checked against the document
    (schemathesis' checks: no server error, a documented status, a conforming body);
    returns the status codes. (Through hypothesis directly: schemathesis' pytest plugin
    does not run under pytest 9.)"""
    statuses: list[int] = []

    @given(case=schema[path][method].as_strategy())
    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        database=None,
    )
    def check(case):
        response = case.call(headers={"Authorization": f"Token {token}"})
        statuses.append(response.status_code)
        # A body the document allows may still be refused: its connections must exist, its
        # DDL and SQL parse (what JSON Schema cannot say); refused with field errors, never a
        # 500 (the other checks stand).
        case.validate_response(response, excluded_checks=[positive_data_acceptance])

    check()
    return statuses


@pytest.mark.parametrize(
    ("path", "method"),
    [
        ("/api/pipelines/", "POST"),
        ("/api/connections/", "POST"),
    ],
)
def test_generated_bodies_get_a_documented_answer(api_schema, token, path, method):
    statuses = fuzz(api_schema, path, method, token, 30)
    assert len(statuses) >= 30
    assert all(s < 500 for s in statuses)
