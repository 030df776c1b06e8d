"""Creating and editing pipelines and connections from the browser (the `editor` role).

The same validation and the same services as the API: a problem is shown next to the field
it concerns and the form keeps what was typed (except passwords, which are never sent back
to the browser); a pipeline changed by someone else since the form was opened is not
overwritten (the form carries the version it was made from).
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import ValidationError
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_http_methods

from controlplane.accounts.decorators import role_required
from controlplane.accounts.roles import EDITOR, VIEWER, has_role
from controlplane.connections.directories import RootInUse
from controlplane.connections.models import Connection, ConnectionKind
from controlplane.connections.serializers import ConnectionSerializer
from controlplane.definitions import audit, preflight, services
from controlplane.definitions.models import AUTO, DEDICATED, Pipeline, SparkApplication
from jobs.sinks import registry
from jobs.spec import SpecError

from . import forms

IGNORE_PREFLIGHT = "ignore_preflight"


def _preflight_errors(request, spec_data) -> dict[str, list[str]]:
    """The preflight's errors at their spec fields (`spec.sink.table`), before a save; none
    when the editor chose to save anyway, or when the spec does not validate (the save says
    why)."""
    mode = settings.CONTROLPLANE_PREFLIGHT
    if mode == "off" or request.POST.get(IGNORE_PREFLIGHT):
        return {}
    try:
        spec = services.validate(spec_data)
    except SpecError:
        return {}
    report = preflight.run(spec)
    if report.ok:
        return {}
    if mode == "warn":
        messages.warning(request, f"The preflight found problems: {report.errors_in_words()}.")
        return {}
    errors = {f"spec.{path}": found for path, found in report.by_field(preflight.ERROR).items()}
    errors[forms.GENERAL] = [
        "The preflight found problems with the systems this definition names (below, at their"
        " fields): it would fail as it is. Fix them, or tick “save even though the preflight"
        " finds problems”."
    ]
    return errors


def _pipeline_form(request, *, pipeline, values, errors, status=200):
    by_kind: dict[str, list[str]] = {}
    for kind, name in Connection.objects.values_list("kind", "name"):
        by_kind.setdefault(kind, []).append(name)
    placements = [DEDICATED, AUTO, *SparkApplication.objects.values_list("name", flat=True)]
    chosen = values.get("placement") or ""
    if chosen and chosen not in placements:  # e.g. an application deleted since: shown
        placements.append(chosen)
    choices = {
        "source_connection": by_kind.get(ConnectionKind.KAFKA, []),
        # Connections of the kinds sinks write through (jobs.sinks.registry), kind by kind.
        "sink_connection": [n for k in registry.connection_kinds() for n in by_kind.get(k, [])],
        "placement": placements,
    }
    fields = []
    for f in forms.PIPELINE_FIELDS:
        if f.name == "name" and pipeline is not None:
            continue  # names do not change
        fields.append(
            {
                "f": f,
                "value": values.get(f.name, ""),
                "errors": errors.get(f.name, []),
                "choices": forms.options(f, choices.get(f.name, f.choices)),
            }
        )
    return render(
        request,
        "pipelines/edit.html",
        {
            "p": pipeline,
            "fields": fields,
            "general": errors.get(forms.GENERAL, []),
            "version": values.get("version", pipeline.version if pipeline else ""),
            "restart_kind": values.get("restart_kind") or "",
            "state_fields": forms.STATE_FIELDS,
            "ignore_preflight": IGNORE_PREFLIGHT,
            "preflight_failed": any(
                "The preflight found problems" in e for e in errors.get(forms.GENERAL, [])
            ),
        },
        status=status,
    )


NEW_PIPELINE_DEFAULTS = {
    "starting_offsets": "latest",
    "max_records_per_batch": "100000",
    "fail_on_data_loss": True,
    "reader": "",
    "state_store": forms.STATE_STORES[0],
    "mode": "append",
    "interval_seconds": "1",
    "restart_kind": "exponential-delay",
    "placement": DEDICATED,
}


@require_http_methods(["GET", "POST"])
@role_required(EDITOR)
def pipeline_new(request):
    if request.method == "GET":
        return _pipeline_form(request, pipeline=None, values=NEW_PIPELINE_DEFAULTS, errors={})
    parsed = forms.pipeline_from_form(request.POST, None)
    name = parsed.data["name"]
    errors = _name_errors(name, dict(parsed.errors))
    if not errors:
        errors = _preflight_errors(request, parsed.data["spec"])
    if not errors:
        try:
            pipeline = services.create_pipeline(
                name=name,
                spec_data=parsed.data["spec"],
                description=parsed.data["description"],
                placement=parsed.data["placement"] or DEDICATED,
                user=request.user,
            )
        except SpecError as exc:
            errors = exc.as_dict("spec.")
        except services.Invalid as exc:
            errors = exc.as_dict()
        except services.Conflict as exc:
            errors = {"name": [str(exc)]}
        else:
            messages.success(request, f"Pipeline {pipeline.name} created (stopped).")
            return redirect("pipeline", name=pipeline.name)
    return _pipeline_form(
        request,
        pipeline=None,
        values=request.POST,
        errors=forms.place_errors(
            errors,
            forms.PIPELINE_FIELDS,
            group=request.POST.get("restart_kind"),
            sink=request.POST.get("sink_kind"),
        ),
        status=400,
    )


def _name_errors(name: str, errors: dict) -> dict:
    """The new pipeline's name, checked as the API checks it (the model field's rules)."""
    field = Pipeline._meta.get_field("name")
    if not name:
        return {**errors, "name": ["is required"]}
    try:
        field.clean(name, None)
    except ValidationError as exc:
        return {**errors, "name": list(exc.messages)}
    return errors


@require_http_methods(["GET", "POST"])
@role_required(EDITOR)
def pipeline_edit(request, name: str):
    pipeline = get_object_or_404(Pipeline, name=name)
    if request.method == "GET":
        values = forms.pipeline_values(
            pipeline.name, pipeline.description, pipeline.spec, pipeline.placement
        )
        return _pipeline_form(request, pipeline=pipeline, values=values, errors={})
    parsed = forms.pipeline_from_form(request.POST, pipeline.spec)
    errors = dict(parsed.errors)
    try:
        read_version = int(request.POST.get("version", ""))
    except ValueError:
        read_version = None
    if read_version is None:
        errors[forms.GENERAL] = ["the form lost the version it was made from; reload the page"]
    if not errors:
        errors = _preflight_errors(request, parsed.data["spec"])
    if not errors:
        try:
            services.update_pipeline(
                pipeline,
                user=request.user,
                spec_data=parsed.data["spec"],
                description=parsed.data["description"],
                expected_version=read_version,
                placement=parsed.data["placement"] or None,
            )
        except SpecError as exc:
            errors = exc.as_dict("spec.")
        except services.Invalid as exc:
            errors = exc.as_dict()
        except services.Conflict as exc:
            errors = {
                forms.GENERAL: [
                    f"Not saved: {exc}. Your changes are still below; open the pipeline in"
                    " another tab to see the other change, then save again."
                ]
            }
        else:
            pipeline.refresh_from_db()
            messages.success(request, f"Saved: {pipeline.name} is at version {pipeline.version}.")
            return redirect("pipeline", name=pipeline.name)
    return _pipeline_form(
        request,
        pipeline=pipeline,
        values=request.POST,
        errors=forms.place_errors(
            errors,
            forms.PIPELINE_FIELDS,
            group=request.POST.get("restart_kind"),
            sink=request.POST.get("sink_kind"),
        ),
        status=409 if "Not saved:" in " ".join(errors.get(forms.GENERAL, [])) else 400,
    )


# -- connections --------------------------------------------------------------------------------


@role_required(VIEWER)
def connection_list(request):
    connections = Connection.objects.prefetch_related("pipelines").order_by("name")
    return render(
        request,
        "connections/list.html",
        {"connections": connections, "can_edit": has_role(request.user, EDITOR)},
    )


def _connection_form(request, *, connection, kind, values, errors, status=200):
    stored = set(connection.secret_fields) if connection else set()
    fields = [
        {
            "f": f,
            "value": values.get(f.name, ""),
            "errors": errors.get(f.name, []),
            "choices": forms.options(f, f.choices),
            "is_set": f.type == "secret" and f.path.split(".", 1)[1] in stored,
        }
        for f in forms.CONNECTION_COMMON + forms.CONNECTION_FIELDS.get(kind, [])
        if not (connection is not None and f.name in ("name", "kind"))
    ]
    return render(
        request,
        "connections/edit.html",
        {
            "c": connection,
            "kind": kind,
            "kinds": list(forms.CONNECTION_FIELDS),
            "fields": fields,
            "general": errors.get(forms.GENERAL, []),
            "secrets_set": connection.secret_fields if connection else [],
        },
        status=status,
    )


def _save_connection(request, connection, kind):
    parsed = forms.connection_from_form(request.POST, kind)
    data = dict(parsed.data)
    if connection is not None:
        data.update(name=connection.name, kind=connection.kind)
    if not data["secrets"]:
        data.pop("secrets")  # nothing typed: every stored secret stays
    errors = dict(parsed.errors)
    if not errors:
        serializer = ConnectionSerializer(connection, data=data)
        saved = None
        if serializer.is_valid():
            try:
                with transaction.atomic():
                    before = audit.connection_snapshot(connection)
                    saved = serializer.save()
                    audit.record_connection_saved(
                        saved,
                        user=request.user,
                        before=before,
                        created=connection is None,
                        dropped=serializer.secrets_dropped,
                    )
            except RootInUse as exc:  # a pipeline saved onto the new root since validation
                errors = {"settings.root": [exc.message]}
        if saved is not None:
            verb = "saved" if connection else "created"
            if serializer.secrets_dropped:
                messages.warning(
                    request,
                    f"The connection now points elsewhere: its stored "
                    f"{', '.join(serializer.secrets_dropped)} was removed. Enter it again.",
                )
            messages.success(request, f"Connection {saved.name} {verb}.")
            return redirect("connections")
        errors = errors or {k: [str(m) for m in v] for k, v in serializer.errors.items()}
    fields = forms.CONNECTION_COMMON + forms.CONNECTION_FIELDS.get(kind, [])
    return _connection_form(
        request,
        connection=connection,
        kind=kind,
        values=forms.without_secrets(request.POST),
        errors=forms.place_errors(errors, fields),
        status=400,
    )


@require_http_methods(["GET", "POST"])
@role_required(EDITOR)
def connection_new(request):
    kind = request.POST.get("kind") or request.GET.get("kind") or ConnectionKind.KAFKA
    if kind not in forms.CONNECTION_FIELDS:
        kind = ConnectionKind.KAFKA
    if request.method == "GET":
        values = {"kind": kind, "security_protocol": "PLAINTEXT"}
        return _connection_form(request, connection=None, kind=kind, values=values, errors={})
    return _save_connection(request, None, kind)


@require_http_methods(["GET", "POST"])
@role_required(EDITOR)
def connection_edit(request, name: str):
    connection = get_object_or_404(Connection, name=name)
    if request.method == "GET":
        values = forms.connection_values(
            connection.name, connection.kind, connection.description, connection.settings
        )
        return _connection_form(
            request, connection=connection, kind=connection.kind, values=values, errors={}
        )
    return _save_connection(request, connection, connection.kind)
