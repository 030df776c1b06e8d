from __future__ import annotations

import json

from django import forms
from django.contrib import admin, messages
from django.shortcuts import redirect

from jobs.spec import SpecError

from . import (
    application_services,
    connection_admin,  # noqa: F401 - registers the connections' admin
    services,
)
from .models import (
    DEDICATED,
    AuditEntry,
    Failure,
    Pipeline,
    PipelineVersion,
    ReconcilerState,
    SparkApplication,
)


class PipelineForm(forms.ModelForm):
    placement = forms.CharField(
        required=False,
        max_length=63,
        help_text="dedicated, auto or a shared application's name (empty: as it is); a change"
        " takes effect at the pipeline's next run.",
    )

    class Meta:
        model = Pipeline
        fields = ["name", "description", "spec", "desired_state", "placement"]

    def clean_placement(self):
        placement = self.cleaned_data.get("placement", "").strip()
        if not placement:
            return self.instance.placement if self.instance.pk else DEDICATED
        if problem := services.placement_problem(placement):
            raise forms.ValidationError(problem)
        return placement

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
                    placement=form.cleaned_data["placement"],
                )
            else:
                created = services.create_pipeline(
                    name=form.cleaned_data["name"],
                    spec_data=form.cleaned_data["spec"],
                    description=form.cleaned_data["description"],
                    desired_state=form.cleaned_data["desired_state"],
                    placement=form.cleaned_data["placement"],
                    user=request.user,
                )
                obj.pk = created.pk
        except (services.Conflict, services.Invalid, SpecError) as exc:
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


class SparkApplicationForm(forms.ModelForm):
    """An application's definition, checked as the API checks it. Its Spark settings
    (`conf`) are checked against the launcher's allow-list, which lives above this package:
    they are changed through the API (PATCH /api/applications/{name}/ with `conf`)."""

    capacity = forms.IntegerField(min_value=1, max_value=application_services.MAX_CAPACITY)

    class Meta:
        model = SparkApplication
        fields = ["name", "description", "master", "driver_memory", "executor_memory", "capacity"]

    def clean_name(self):
        name = self.cleaned_data["name"]
        if problem := application_services.name_problem(name):
            raise forms.ValidationError(problem)
        return name

    def clean_master(self):
        return self._checked("master", application_services.master_problem)

    def clean_driver_memory(self):
        return self._checked(
            "driver_memory", lambda v: application_services.memory_problem(v, required=True)
        )

    def clean_executor_memory(self):
        return self._checked(
            "executor_memory", lambda v: application_services.memory_problem(v, required=False)
        )

    def _checked(self, field: str, problem_of):
        value = (self.cleaned_data.get(field) or "").strip()
        if problem := problem_of(value):
            raise forms.ValidationError(problem)
        return value


@admin.register(SparkApplication)
class SparkApplicationAdmin(admin.ModelAdmin):
    """Admins define shared applications here or through the API; operators start, stop and
    recycle them from the dashboard or the API. What the reconciler observes is read-only,
    and so is what is desired (the controls check members first)."""

    form = SparkApplicationForm
    list_display = ("name", "desired_state", "status", "capacity", "restarts", "updated_at")
    list_filter = ("desired_state", "status")
    search_fields = ("name", "description")
    OBSERVED = (
        "conf",
        "desired_state",
        "status",
        "status_message",
        "generation",
        "host",
        "pid",
        "started_at",
        "ready_at",
        "restarts",
        "attempt",
        "next_attempt_at",
        "last_exit_code",
        "last_exit_at",
        "last_error",
        "rss_bytes",
        "cpu_percent",
        "measured_at",
        "recycle_requested_at",
        "recycle_reason",
        "created_at",
        "updated_at",
    )

    def get_readonly_fields(self, request, obj=None):
        return ("name", *self.OBSERVED) if obj is not None else self.OBSERVED

    def save_model(self, request, obj: SparkApplication, form, change: bool) -> None:
        # Through the same functions as the API: audited, and only the definition written.
        definition = {
            k: form.cleaned_data[k]
            for k in ("description", "master", "driver_memory", "executor_memory", "capacity")
        }
        try:
            if change:
                current = SparkApplication.objects.get(pk=obj.pk)
                application_services.update_application(current, user=request.user, **definition)
            else:
                created = application_services.create_application(
                    name=form.cleaned_data["name"], user=request.user, **definition
                )
                obj.pk = created.pk
        except (services.Conflict, services.Invalid) as exc:
            messages.error(request, str(exc))

    def get_actions(self, request):
        actions = super().get_actions(request)
        actions.pop("delete_selected", None)
        return actions

    def delete_model(self, request, obj: SparkApplication) -> None:
        application_services.delete_application(
            obj, user=request.user, reason="deleted in the admin"
        )

    def delete_queryset(self, request, queryset) -> None:
        for app in queryset:
            self.delete_model(request, app)

    def delete_view(self, request, object_id, extra_context=None):
        try:
            return super().delete_view(request, object_id, extra_context)
        except services.Conflict as exc:
            messages.error(request, f"Not deleted: {exc}")
            return redirect("admin:pipelines_sparkapplication_change", object_id)


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
    list_display = (
        "at",
        "actor_name",
        "action",
        "pipeline_name",
        "connection_name",
        "application_name",
        "reason",
    )
    list_filter = ("action",)
    search_fields = ("pipeline_name", "connection_name", "application_name", "actor_name", "reason")


@admin.register(Failure)
class FailureAdmin(ReadOnlyAdmin):
    list_display = ("at", "pipeline", "cause", "permanent", "decision")
    list_filter = ("cause", "permanent")
    search_fields = ("pipeline__name", "message")
