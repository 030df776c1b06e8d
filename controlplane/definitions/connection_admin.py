"""The Django admin of connections: here, beside the pipelines' admin, because its changes go
into the one audit log (controlplane.definitions.audit)."""

from __future__ import annotations

from django import forms
from django.contrib import admin, messages
from django.db import transaction

from controlplane.connections.models import Connection
from controlplane.connections.policy import clean_connection
from jobs.connections import CONNECTION_KINDS, SECRET_FIELDS
from jobs.spec import SpecError

from . import audit

_ALL_SECRETS = sorted(set().union(*SECRET_FIELDS.values()))


class ConnectionForm(forms.ModelForm):
    """Secrets are entered in password boxes that never show the stored value.

    Leave a box empty to keep what is stored; tick "clear" to remove it.
    """

    class Meta:
        model = Connection
        fields = ["name", "kind", "description", "settings"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        for name in _ALL_SECRETS:
            self.fields[f"secret_{name}"] = forms.CharField(
                label=name.replace("_", " "),
                required=False,
                widget=forms.PasswordInput(render_value=False),
                help_text="Write-only. Empty keeps the stored value.",
            )
            self.fields[f"clear_{name}"] = forms.BooleanField(label=f"clear {name}", required=False)

    def clean(self):
        data = super().clean()
        kind = data.get("kind")
        if not kind:
            return data
        submitted: dict[str, str | None] = {}
        for name in _ALL_SECRETS:
            if name not in SECRET_FIELDS[kind]:
                continue
            if data.get(f"clear_{name}"):
                submitted[name] = None
            elif data.get(f"secret_{name}"):
                submitted[name] = data[f"secret_{name}"]
        # What is stored counts only for the same kind (its secrets are another kind's).
        stored = self.instance.pk is not None and "kind" not in self.changed_data
        try:
            cleaned = clean_connection(
                kind,
                data.get("settings"),
                submitted,
                stored_settings=self.instance.settings if stored else None,
                stored_secrets=self.instance.get_secrets() if stored else None,
                connection=self.instance if stored else None,
            )
        except SpecError as exc:
            for error in exc.errors:
                self.add_error(None, f"{error.field}: {error.message}")
            return data
        data["settings"], self.cleaned_secrets = cleaned.settings, cleaned.secrets
        self.secrets_dropped = cleaned.dropped
        return data

    def save(self, commit: bool = True):
        connection = super().save(commit=False)
        connection.set_secrets(getattr(self, "cleaned_secrets", {}))
        if commit:
            connection.save()
        return connection


@admin.register(Connection)
class ConnectionAdmin(admin.ModelAdmin):
    form = ConnectionForm
    list_display = ("name", "kind", "target", "secrets_set", "updated_at")
    list_filter = ("kind",)
    search_fields = ("name", "description")

    def save_model(self, request, obj, form, change) -> None:
        with transaction.atomic():
            before = {}
            if change:
                before = audit.connection_snapshot(Connection.objects.get(pk=obj.pk))
            super().save_model(request, obj, form, change)
            dropped = getattr(form, "secrets_dropped", ())
            if dropped:
                self.message_user(
                    request,
                    f"{obj.name} now points elsewhere: its stored {', '.join(dropped)} was "
                    "removed. Enter it again.",
                    level=messages.WARNING,
                )
            audit.record_connection_saved(
                obj, user=request.user, before=before, created=not change, dropped=dropped
            )

    def delete_model(self, request, obj) -> None:
        with transaction.atomic():
            audit.record_connection(
                obj.name,
                "connection-delete",
                user=request.user,
                before=audit.connection_snapshot(obj),
                after={},
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    @admin.display(description="target")
    def target(self, obj: Connection) -> str:
        return CONNECTION_KINDS[obj.kind].target(obj.settings)

    @admin.display(description="secrets set")
    def secrets_set(self, obj: Connection) -> str:
        return ", ".join(obj.secret_fields) or "-"
