from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect

from jobs.spec import SpecError

from . import (
    connection_admin,  # noqa: F401 - registers the connections' admin
    services,
)
from .models import AuditEntry, Failure, Pipeline, PipelineVersion, ReconcilerState


class PipelineForm(forms.ModelForm):
    class Meta:
        model = Pipeline
        fields = ["name", "description", "spec", "desired_state"]

    def clean_spec(self):
        spec = self.cleaned_data["spec"]
        try:
            self.typed_spec = services.validate(spec)
        except SpecError as exc:
            raise forms.ValidationError([f"{e.field}: {e.message}" for e in exc.errors]) from None
        return spec


class PipelineVersionInline(admin.TabularInline):
    model = PipelineVersion
    extra = 0
    can_delete = False
    fields = ("version", "created_at", "created_by", "spec_json")
    readonly_fields = fields
    ordering = ("-version",)

    def has_add_permission(self, request, obj=None) -> bool:
        return False

    @admin.display(description="spec")
    def spec_json(self, obj: PipelineVersion) -> str:
        return json.dumps(obj.spec, sort_keys=True)


@admin.register(Pipeline)
class PipelineAdmin(admin.ModelAdmin):
    form = PipelineForm
    list_display = ("name", "version", "desired_state", "status", "updated_at")
    list_filter = ("desired_state", "status")
    search_fields = ("name", "description")
    readonly_fields = ("version", "status", "status_message", "created_at", "updated_at")
    inlines = [PipelineVersionInline]

    def save_model(self, request, obj: Pipeline, form, change: bool) -> None:
        # Through the same service as the API, so versions and connection links stay right.
        try:
            if change:
                current = Pipeline.objects.get(pk=obj.pk)
                services.update_pipeline(
                    current,
                    user=request.user,
                    spec_data=form.cleaned_data["spec"],
                    description=form.cleaned_data["description"],
                    desired_state=form.cleaned_data["desired_state"],
                )
            else:
                created = services.create_pipeline(
                    name=form.cleaned_data["name"],
                    spec_data=form.cleaned_data["spec"],
                    description=form.cleaned_data["description"],
                    desired_state=form.cleaned_data["desired_state"],
                    user=request.user,
                )
                obj.pk = created.pk
        except (services.Conflict, SpecError) as exc:
            messages.error(request, str(exc))

    # Deleting goes through the service: under the pipeline's lock, refused while a driver
    # may run, audited. One at a time (the bulk action would report refusals as deleted).
    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request, obj: Pipeline) -> None:
        services.delete_pipeline(obj, user=request.user, reason="deleted in the admin")

    def delete_queryset(self, request, queryset) -> None:
        for pipeline in queryset:
            services.delete_pipeline(pipeline, user=request.user, reason="deleted in the admin")

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except services.Conflict as exc:
            messages.error(request, f"Not deleted: {exc}")
            return redirect("admin:pipelines_pipeline_change", object_id)


@admin.register(ReconcilerState)
class ReconcilerStateAdmin(admin.ModelAdmin):
    list_display = ("last_tick_at", "ticks")
    readonly_fields = ("last_tick_at", "ticks", "last_summary")

    def has_add_permission(self, request) -> bool:
        return False


class ReadOnlyAdmin(admin.ModelAdmin):
    """Records of what happened: viewable, never edited by hand."""

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False

    def has_delete_permission(self, request, obj=None) -> bool:
        return False


@admin.register(AuditEntry)
class AuditEntryAdmin(ReadOnlyAdmin):
    list_display = ("at", "actor_name", "action", "pipeline_name", "reason")
    list_filter = ("action",)
    search_fields = ("pipeline_name", "actor_name", "reason")


@admin.register(Failure)
class FailureAdmin(ReadOnlyAdmin):
    list_display = ("at", "pipeline", "cause", "permanent", "decision")
    list_filter = ("cause", "permanent")
    search_fields = ("pipeline__name", "message")
