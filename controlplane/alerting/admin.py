"""The Django admin of alert channels. As over the API: the signing key and the URL's secret
parts are write-only (the list and the form show the target masked; sending the masked URL
back keeps them), the target is checked by the same `clean_target`, and every change is in
the audit log."""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db import transaction

from . import audit
from .channels import TargetProblem, clean_target
from .models import AlertChannel, ChannelKind


class AlertChannelForm(forms.ModelForm):
    signing_key = forms.CharField(
        required=False,
        max_length=512,
        widget=forms.PasswordInput(render_value=False),
        help_text="Webhooks: the HMAC-SHA256 key. Write-only: empty keeps the stored one.",
    )
    clear_signing_key = forms.BooleanField(required=False, label="clear the signing key")

    class Meta:
        model = AlertChannel
        fields = ["name", "kind", "target"]
        help_texts = {
            "target": "E-mail: addresses, comma-separated. Webhooks: the URL; its secret parts "
            "(user info, query values, a Slack-style path) are shown masked: leave them masked "
            "to keep them, or give the URL in full to replace them (always, for a new host).",
        }

    def clean(self):
        data = super().clean()
        kind, target = data.get("kind"), data.get("target")
        if kind and target is not None:
            try:
                data["target"] = clean_target(kind, target, self.instance)
            except TargetProblem as exc:
                self.add_error("target", str(exc))
        if data.get("signing_key") and kind != ChannelKind.WEBHOOK:
            self.add_error("signing_key", "only webhooks are signed")
        return data

    def save(self, commit: bool = True):
        channel = super().save(commit=False)
        if self.cleaned_data.get("clear_signing_key"):
            channel.set_signing_key("")
        elif self.cleaned_data.get("signing_key"):
            channel.set_signing_key(self.cleaned_data["signing_key"])
        if commit:
            channel.save()
        return channel


@admin.register(AlertChannel)
class AlertChannelAdmin(admin.ModelAdmin):
    form = AlertChannelForm
    list_display = ("name", "kind", "target", "url_secrets", "signing_key_set", "created_at")
    list_filter = ("kind",)
    search_fields = ("name",)

    def save_model(self, request, obj, form, change) -> None:
        with transaction.atomic():
            before, before_url = {}, None
            if change:
                stored = AlertChannel.objects.get(pk=obj.pk)
                before, before_url = audit.channel_snapshot(stored), audit.secret_url(stored)
            super().save_model(request, obj, form, change)
            audit.record(
                "alert-channel-update" if change else "alert-channel-create",
                user=request.user,
                before=before,
                after=audit.channel_change(before_url, obj) if change else
                audit.channel_snapshot(obj),
            )  # fmt: skip

    def delete_model(self, request, obj) -> None:
        with transaction.atomic():
            audit.record(
                "alert-channel-delete",
                user=request.user,
                before=audit.channel_snapshot(obj),
                after={},
            )
            super().delete_model(request, obj)

    def delete_queryset(self, request, queryset) -> None:
        for obj in queryset:
            self.delete_model(request, obj)

    @admin.display(description="URL secrets", boolean=True)
    def url_secrets(self, obj: AlertChannel) -> bool:
        return bool(obj.url_encrypted)

    @admin.display(description="signing key", boolean=True)
    def signing_key_set(self, obj: AlertChannel) -> bool:
        return bool(obj.secret_encrypted)
