from __future__ import annotations

from django import forms
from django.contrib import admin

from jobs.connections import SECRET_FIELDS, validate_connection
from jobs.spec import SpecError

from .models import Connection

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
        secrets = self.instance.get_secrets() if self.instance.pk else {}
        for name in _ALL_SECRETS:
            if data.get(f"clear_{name}"):
                secrets.pop(name, None)
            elif data.get(f"secret_{name}"):
                secrets[name] = data[f"secret_{name}"]
        secrets = {k: v for k, v in secrets.items() if k in SECRET_FIELDS[kind]}
        try:
            data["settings"], self.cleaned_secrets = validate_connection(
                kind, data.get("settings"), secrets
            )
        except SpecError as exc:
            for error in exc.errors:
                self.add_error(None, f"{error.field}: {error.message}")
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

    @admin.display(description="target")
    def target(self, obj: Connection) -> str:
        if obj.kind == "kafka":
            return ", ".join(obj.settings.get("bootstrap_servers", []))
        return obj.settings.get("dsn", "")

    @admin.display(description="secrets set")
    def secrets_set(self, obj: Connection) -> str:
        return ", ".join(obj.secret_fields) or "-"
