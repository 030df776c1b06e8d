"""Request bodies an editor can send but the control plane cannot use: each answered with a
400 naming where the problem is (or a 413 for a body over the size Django reads), never a
500, and nothing created or changed. The JSON rules themselves (controlplane.bounded_json)
are also tested alone, without Django, at their edges."""

from __future__ import annotations

import json
import sys

import pytest
from django.test import Client
from django.urls import reverse

from controlplane import bounded_json
from controlplane.accounts.roles import set_role
from controlplane.connections.models import Connection
from controlplane.definitions.models import AuditEntry, Pipeline
from tests.factories import valid_spec
from tests.test_editing import new_pipeline_post

TOO_DEEP = "nests arrays and objects more than 200 levels deep"
TOO_BIG = "larger than 2,621,440 bytes (DATA_UPLOAD_MAX_MEMORY_SIZE)"
NUL = "contains U+0000"
SURROGATE = "contains a lone UTF-16 surrogate (U+D800)"
NOT_A_NUMBER = "is not a JSON number (JSON has no NaN or Infinity)"
OUT_OF_RANGE = "is out of range: JSON numbers must fit in a double-precision number"


def send(api, method: str, url: str, body: str | bytes):
    """`body` as it is written, not as a client library would encode it."""
    raw = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
    return getattr(api, method)(url, raw, content_type="application/json")


def nested_avro(levels: int) -> str:
    """`{"type": {"type": ... "int" ...}}`, `levels` objects deep, as text (json.dumps cannot
    write the deepest)."""
    return '{"type": ' * levels + '"int"' + "}" * levels


def pipeline_body(spec_text: str, name: str = "bad") -> str:
    return f'{{"name": "{name}", "spec": {spec_text}}}'


def spec_text(**overrides) -> str:
    return json.dumps(valid_spec(**overrides))


@pytest.fixture
def unchanged(pipeline):
    """The `orders` pipeline, and a check that nothing about it changed."""
    before = Pipeline.objects.get(name="orders")
    audits = AuditEntry.objects.count()

    def check() -> None:
        after = Pipeline.objects.get(name="orders")
        assert (after.version, after.spec, after.description, after.labels) == (
            before.version,
            before.spec,
            before.description,
            before.labels,
        )
        assert AuditEntry.objects.count() == audits

    return check


# -- nesting ------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("levels", [201, 1000, 50_000])
def test_a_spec_nested_too_deep_is_refused_naming_the_field(
    api, kafka_connection, postgres_connection, levels
):
    """201 levels: refused by the walk after parsing; 1,000 and 50,000: json.loads itself
    runs out of stack (RecursionError), the field is found by scanning the text."""
    source = '{"kind": "kafka", "connection": "events", "topics": ["orders"], "format": "avro", '
    body = pipeline_body('{"source": ' + source + '"avro_schema": ' + nested_avro(levels) + "}}")
    response = send(api, "post", "/api/pipelines/", body)
    assert response.status_code == 400, response.content[:300]
    assert TOO_DEEP in response.json()["spec.source.avro_schema"][0]
    assert not Pipeline.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/api/pipelines/", "/api/connections/"])
def test_a_body_that_is_only_nested_lists_is_refused(api, url):
    response = send(api, "post", url, "[" * 100_000 + "]" * 100_000)
    assert response.status_code == 400
    assert TOO_DEEP in response.json()["[0][0][0]"][0]
    assert not Pipeline.objects.exists()
    assert not Connection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["put", "patch"])
def test_changing_a_pipeline_with_a_too_deep_spec_changes_nothing(api, unchanged, method):
    body = pipeline_body(spec_text(transform={"sql": "SELECT * FROM source"}), "orders")
    body = body.replace('"SELECT * FROM source"', '"x", "deep": ' + "[" * 3000 + "]" * 3000)
    response = send(api, method, "/api/pipelines/orders/", body)
    assert response.status_code == 400, response.content[:300]
    assert TOO_DEEP in response.json()["spec.transform.deep"][0]
    unchanged()


@pytest.mark.django_db
def test_two_hundred_levels_are_not_refused_for_their_depth(api):
    """The limit is a bound, not a ban on nesting: 200 levels reach the connection's own
    validation (which refuses an unknown setting)."""
    deep = "[" * 197 + "]" * 197  # the body, settings and x: 200 levels in all
    body = f'{{"name": "deep", "kind": "kafka", "settings": {{"x": {deep}}}}}'
    response = send(api, "post", "/api/connections/", body)
    assert response.status_code == 400
    assert response.json()["settings.x"] == ["unknown field"]


# -- size ---------------------------------------------------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/api/pipelines/", "/api/connections/"])
def test_a_body_over_the_size_limit_is_a_413_naming_the_limit(api, url):
    body = json.dumps({"name": "big", "kind": "kafka", "description": "x" * 10_000_000})
    response = send(api, "post", url, body)
    assert response.status_code == 413
    assert TOO_BIG in response.json()["detail"]
    assert not Pipeline.objects.exists()
    assert not Connection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("method", ["put", "patch"])
def test_a_change_over_the_size_limit_is_a_413_and_changes_nothing(api, unchanged, method):
    body = json.dumps({"name": "orders", "spec": valid_spec(), "description": "x" * 3_000_000})
    response = send(api, method, "/api/pipelines/orders/", body)
    assert response.status_code == 413
    assert TOO_BIG in response.json()["detail"]
    unchanged()


@pytest.mark.django_db
def test_a_form_encoded_body_with_too_many_fields_is_a_400(api):
    body = "&".join(f"f{i}=1" for i in range(1500))
    response = api.post("/api/connections/", body, content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert "DATA_UPLOAD_MAX_NUMBER_FIELDS" in response.json()["detail"]
    assert not Connection.objects.exists()


# -- what JSON can say but the control plane cannot hold ----------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("literal", "words"),
    [
        ("NaN", f"NaN {NOT_A_NUMBER}"),
        ("Infinity", f"Infinity {NOT_A_NUMBER}"),
        ("-Infinity", f"-Infinity {NOT_A_NUMBER}"),
        ("1e999999", f"1e999999 {OUT_OF_RANGE}"),
        ("-1" + "0" * 400, f"(402 characters) {OUT_OF_RANGE}"),
        ("9" * 5000, f"(5000 characters) {OUT_OF_RANGE}"),
    ],
)
def test_a_number_the_control_plane_cannot_hold_is_refused_naming_the_field(
    api, kafka_connection, postgres_connection, literal, words
):
    """Before: a 4,000-digit interval was an OverflowError (500), and NaN and 1e999999 were
    refused by later checks that did not all name the field."""
    body = pipeline_body(spec_text(trigger={"interval_seconds": 5}))
    body = body.replace('"interval_seconds": 5', f'"interval_seconds": {literal}')
    response = send(api, "post", "/api/pipelines/", body)
    assert response.status_code == 400, response.content[:300]
    assert words in response.json()["spec.trigger.interval_seconds"][0]
    assert not Pipeline.objects.exists()


@pytest.mark.django_db
def test_a_big_integer_within_a_doubles_range_is_left_to_the_fields_validation(api):
    """2^70 is no JSON problem: the connection's own validation answers (narrower ranges,
    a 64-bit offset say, are each field's)."""
    body = f'{{"name": "n", "kind": "kafka", "settings": {{"x": {2**70}}}}}'
    response = send(api, "post", "/api/connections/", body)
    assert response.json()["settings.x"] == ["unknown field"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("escape", "words"), [("\\u0000", NUL), ("\\ud800", SURROGATE), ("\\udc00", "(U+DC00)")]
)
def test_a_string_postgres_cannot_store_is_refused_naming_the_field(api, unchanged, escape, words):
    """Before: a 500 (PostgreSQL refuses U+0000 and lone surrogates in jsonb)."""
    body = f'{{"spec": {{"transform": {{"sql": "SELECT * FROM source WHERE id = \'{escape}\'"}}}}}}'
    response = send(api, "patch", "/api/pipelines/orders/", body)
    assert response.status_code == 400, response.content[:300]
    assert words in response.json()["spec.transform.sql"][0]
    unchanged()


@pytest.mark.django_db
def test_a_key_with_a_lone_surrogate_is_refused_and_the_answer_can_be_written(api, unchanged):
    """Before: a 500 whose own answer could not be encoded (it echoed the key)."""
    response = send(api, "patch", "/api/pipelines/orders/", '{"labels": {"a\\ud800": "b"}}')
    assert response.status_code == 400
    assert response.json() == {
        "labels": [
            "the key 'a\\ud800' contains a lone UTF-16 surrogate (U+D800), which is not a character"
        ]
    }
    unchanged()


@pytest.mark.django_db
def test_a_connection_setting_with_a_nul_is_refused(api, kafka_connection):
    body = '{"settings": {"bootstrap_servers": ["k:1\\u0000"]}}'
    response = send(api, "patch", "/api/connections/events/", body)
    assert response.status_code == 400
    assert NUL in response.json()["settings.bootstrap_servers[0]"][0]
    assert Connection.objects.get(name="events").settings["bootstrap_servers"] != ["k:1\x00"]


@pytest.mark.django_db
def test_a_key_given_twice_is_refused_naming_it(api, kafka_bootstrap):
    """Before: the last one silently won (a connection named `b` was created), while a
    reviewer reading the body may have seen `a`."""
    body = (
        '{"name": "a", "name": "b", "kind": "kafka", '
        f'"settings": {{"bootstrap_servers": ["{kafka_bootstrap}"]}}}}'
    )
    response = send(api, "post", "/api/connections/", body)
    assert response.status_code == 400
    assert response.json() == {"name": ["is given more than once in the same object"]}
    assert not Connection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"name": "\xff\xfe"}', "the body is not valid utf-8"),
        (b'{"name": "a"', "JSON parse error - Expecting ',' delimiter"),
    ],
)
@pytest.mark.parametrize("url", ["/api/pipelines/", "/api/connections/"])
def test_a_body_that_is_not_json_is_refused_saying_why(api, url, body, words):
    response = send(api, "post", url, body)
    assert response.status_code == 400
    assert words in response.json()["detail"]
    assert not Pipeline.objects.exists()
    assert not Connection.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("url", ["/api/pipelines/", "/api/connections/"])
def test_a_top_level_list_is_refused(api, url):
    response = send(api, "post", url, '[{"name": "a"}]')
    assert response.status_code == 400
    assert "Expected a dictionary, but got list" in response.json()["non_field_errors"][0]
    assert not Pipeline.objects.exists()
    assert not Connection.objects.exists()


@pytest.mark.django_db
def test_a_valid_body_still_goes_through(api, kafka_connection, postgres_connection):
    """Unicode beyond the BMP (a surrogate pair in the text) and big-but-64-bit numbers."""
    spec = valid_spec()
    spec["source"]["max_records_per_batch"] = 2**31
    response = api.post(
        "/api/pipelines/", {"name": "ok", "spec": spec, "description": "😀 ok"}, format="json"
    )
    assert response.status_code == 201, response.json()
    assert Pipeline.objects.get(name="ok").description == "😀 ok"


# -- the pages ----------------------------------------------------------------------------------


@pytest.fixture
def editor(db, django_user_model) -> Client:
    user = django_user_model.objects.create_user(username="ed")
    set_role(user, "editor")
    client = Client(raise_request_exception=False)
    client.force_login(user)
    return client


def test_a_form_over_the_size_limit_gets_the_400_page_saying_why(editor):
    response = editor.post(reverse("pipeline-new"), {"name": "big", "description": "x" * 3_000_000})
    assert response.status_code == 400
    page = response.content.decode()
    assert "Request refused (400)" in page
    assert "at most 2.5 MB (<code>DATA_UPLOAD_MAX_MEMORY_SIZE</code>)" in page
    assert not Pipeline.objects.exists()


def test_a_form_with_too_many_fields_gets_the_400_page(editor):
    body = "&".join(f"f{i}=1" for i in range(1500))
    response = editor.post(
        reverse("pipeline-new"), body, content_type="application/x-www-form-urlencoded"
    )
    assert response.status_code == 400
    assert "at most 1,000 fields" in response.content.decode()


def test_a_form_json_input_nested_too_deep_is_refused_at_the_input(
    editor, kafka_connection, postgres_connection
):
    post = {"name": "deep", "starting_offsets": "[" * 5000 + "]" * 5000}
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert not Pipeline.objects.exists()


@pytest.mark.parametrize("field", ["transform_sql", "description"])
def test_a_nul_typed_in_a_form_is_refused_at_its_input(
    editor, kafka_connection, postgres_connection, field
):
    post = new_pipeline_post(**{field: "SELECT id, amount FROM source WHERE id <> '\x00'"})
    response = editor.post(reverse("pipeline-new"), post)
    assert response.status_code == 400
    assert not Pipeline.objects.exists()


# -- the rules alone (pure, no Django) ----------------------------------------------------------


def refused(text: str) -> dict[str, list[str]]:
    with pytest.raises(bounded_json.Refused) as caught:
        bounded_json.loads(text)
    return caught.value.errors


def test_depth_is_counted_in_arrays_and_objects_from_the_top():
    assert bounded_json.loads("[" * 200 + "]" * 200) is not None
    assert list(refused("[" * 201 + "]" * 201)) == ["[0][0][0]"]
    # A bracket in a string is not nesting, for the walk and for the scan of the text.
    text = '{"a": "[[[[", "b": [1, {"c": ' + "[" * 5000 + "]" * 5000 + "}]}"
    assert list(refused(text)) == ["b[1].c"]
    assert list(refused(text.replace("5000", "300"))) == ["b[1].c"]


def test_every_problem_is_named_by_its_path():
    largest = int(sys.float_info.max)
    fine = f'"f": -{largest}, "g": 1.5e-999, "h": "\\ud83d\\ude00", "i": {2**70}'
    text = f'{{"a": [1, {{"b": "x\\u0000"}}], "c": NaN, "d": -1e999, "e": -{largest + 1}, {fine}}}'
    errors = refused(text)
    assert set(errors) == {"a[1].b", "c", "d", "e"}
    assert errors["a[1].b"] == ["contains U+0000 (a NUL character), which cannot be stored"]
    assert errors["c"] == [f"NaN {NOT_A_NUMBER}"]
    assert errors["d"] == [f"-1e999 {OUT_OF_RANGE} (at most about ±1.8e308)"]
    assert errors["e"] == [
        f"-1797693134862315708...4124858369 (310 characters) {OUT_OF_RANGE}"
        " (at most about ±1.8e308)"
    ]
    # The largest double, 2^70, an underflow (0.0) and a surrogate pair are all fine.
    assert bounded_json.loads(f"{{{fine}}}") == {"f": -largest, "g": 0.0, "h": "😀", "i": 2**70}


def test_duplicate_keys_are_named_once_each_wherever_they_are():
    errors = refused('{"a": 1, "a": 2, "a": 3, "b": [{"c": 1, "c": 1}]}')
    assert errors == {
        "a": ["is given more than once in the same object"],
        "b[0].c": ["is given more than once in the same object"],
    }


def test_a_scalar_body_is_checked_too():
    assert refused("NaN") == {"non_field_errors": [f"NaN {NOT_A_NUMBER}"]}
    assert bounded_json.loads('"x"') == "x"


def test_not_json_is_a_value_error_not_a_refusal():
    with pytest.raises(ValueError) as caught:
        bounded_json.loads("{")
    assert not isinstance(caught.value, bounded_json.Refused)
