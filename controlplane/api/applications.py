"""Shared Spark applications over the API: their definitions (admins), their controls
(operators: start, stop, recycle) and what is observed of them (viewers).

A shared application is one long-lived Spark driver that runs the queries of many pipelines
(those whose `placement` names it, or says `auto`). The reconciler starts, watches and stops
it; nothing here touches its process. The controls are also the dashboard's (`act`).
"""

from __future__ import annotations

from datetime import datetime

from django.db import transaction
from django.db.models import Prefetch
from django.utils import timezone
from drf_spectacular.utils import extend_schema, extend_schema_field
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.roles import ADMIN, OPERATOR
from controlplane.connections.masking import mask
from controlplane.definitions import application_audit, application_services
from controlplane.definitions.models import (
    ApplicationStatus,
    DesiredState,
    Pipeline,
    Run,
    RunState,
    SparkApplication,
)
from controlplane.definitions.services import Conflict, Invalid
from controlplane.supervision import applications, launcher

from .serializers import ControlSerializer, _secrets


class NotApplicable(Exception):
    """The control makes no sense in the application's current state (answered with 409)."""


ACTIONS = ("start", "stop", "recycle")


def act(app: SparkApplication, action: str, *, user, reason: str, now: datetime):
    """An operator's control, under the application's row lock, audited with its state
    before and after; asking again for what is already so changes nothing (and is audited
    as such). Raises NotApplicable, naming why, when it does not apply."""
    if action not in ACTIONS:
        raise ValueError(f"no action {action!r}")
    with transaction.atomic():
        current = SparkApplication.objects.select_for_update().filter(pk=app.pk).first()
        if current is None:
            raise NotApplicable(f"application {app.name!r} was deleted meanwhile")
        before = application_audit.snapshot(current)
        if action == "start":
            _want(current, DesiredState.RUNNING, now)
        elif action == "stop":
            if refusal := stop_refusal(current):
                raise NotApplicable(refusal)
            _want(current, DesiredState.STOPPED, now)
        else:
            if current.status not in (ApplicationStatus.STARTING, ApplicationStatus.RUNNING):
                raise NotApplicable(
                    f"application {current.name!r} is {current.status}: only a starting or"
                    " running application can be recycled"
                )
            who = user.get_username() if getattr(user, "pk", None) else "system"
            why = f"recycled by {who}" + (f": {reason}" if reason else "")
            if not applications.request_recycle(current.pk, current.generation, why, now):
                raise NotApplicable(f"application {current.name!r} is being recycled already")
        current.refresh_from_db()
        application_audit.record(
            current.name,
            f"application-{action}",
            user=user,
            reason=reason,
            before=before,
            after=application_audit.snapshot(current),
        )
    return current


def _want(app: SparkApplication, desired: str, now: datetime) -> None:
    # Only the desired state: what the reconciler records is never overwritten.
    if app.desired_state != desired:
        SparkApplication.objects.filter(pk=app.pk).update(desired_state=desired, updated_at=now)


def stop_refusal(app: SparkApplication) -> str | None:
    """Why the application cannot be stopped now (its members would lose their driver), or
    None. Called under its row lock: no pipeline is placed in it meanwhile."""
    placed = sorted(applications.members(app).values_list("pipeline__name", flat=True))
    wanted = sorted(
        Pipeline.objects.filter(placement=app.name, desired_state=DesiredState.RUNNING).values_list(
            "name", flat=True
        )
    )
    if not placed and not wanted:
        return None
    parts = []
    if placed:
        parts.append(f"it runs the queries of {application_services.listed(placed)}")
    if wanted := [n for n in wanted if n not in placed]:
        parts.append(
            f"{application_services.listed(wanted)} wanted running name it as their placement"
        )
    return (
        f"application {app.name!r} cannot be stopped: {' and '.join(parts)}; stop those"
        " pipelines or place them elsewhere first"
    )


def annotated(queryset=None):
    """Applications with `member_count` and their active runs (`active_runs`), for showing
    many at once in a few queries."""
    active = (
        Run.objects.filter(state__in=RunState.active())
        .select_related("pipeline")
        .order_by("pipeline__name")
    )
    return applications.with_members(queryset).prefetch_related(
        Prefetch("runs", queryset=active, to_attr="active_runs")
    )


def member_runs(app: SparkApplication) -> list[Run]:
    """The active runs placed in its current process, by pipeline name."""
    if hasattr(app, "active_runs"):
        return [r for r in app.active_runs if r.application_generation == app.generation]
    return list(applications.members(app).select_related("pipeline").order_by("pipeline__name"))


def member_count(app: SparkApplication) -> int:
    count = getattr(app, "member_count", None)
    return len(member_runs(app)) if count is None else count


# -- the API --------------------------------------------------------------------------------


class MemberSerializer(serializers.Serializer):
    pipeline = serializers.CharField(source="pipeline.name")
    generation = serializers.IntegerField()
    state = serializers.CharField()
    started_at = serializers.DateTimeField(allow_null=True)


class ApplicationSerializer(serializers.ModelSerializer):
    """A shared Spark application: its definition (admins write it; it takes effect at the
    application's next start) and what is observed of it (read-only)."""

    url = serializers.HyperlinkedIdentityField(
        view_name="api:application-detail", lookup_field="name"
    )
    master = serializers.CharField(
        required=False,
        allow_blank=True,
        max_length=255,
        help_text=f"Spark master: {application_services.MASTER_FORMS}.",
    )
    driver_memory = serializers.CharField(
        required=False, max_length=16, help_text="e.g. 2g (default), 512m."
    )
    executor_memory = serializers.CharField(
        required=False, allow_blank=True, max_length=16, help_text="empty: Spark's default."
    )
    conf = serializers.JSONField(
        required=False,
        help_text=(
            f"Spark settings (at most {application_services.MAX_CONF}): names to strings,"
            " numbers or booleans; only memory, parallelism and SQL/streaming tuning are"
            " allowed (docs/api.md)."
        ),
    )
    capacity = serializers.IntegerField(
        required=False,
        min_value=1,
        max_value=application_services.MAX_CAPACITY,
        help_text="At most this many pipelines' queries at once (default 25).",
    )
    desired_state = serializers.ChoiceField(choices=DesiredState.choices[:2], read_only=True)
    status = serializers.ChoiceField(choices=ApplicationStatus.choices, read_only=True)
    last_error = serializers.SerializerMethodField()
    member_count = serializers.SerializerMethodField()
    members = serializers.SerializerMethodField()
    capacity_free = serializers.SerializerMethodField()

    class Meta:
        model = SparkApplication
        fields = [
            "url",
            "name",
            "description",
            "master",
            "driver_memory",
            "executor_memory",
            "conf",
            "capacity",
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
            "member_count",
            "members",
            "capacity_free",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
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
            "rss_bytes",
            "cpu_percent",
            "measured_at",
            "created_at",
            "updated_at",
        ]

    def get_last_error(self, app: SparkApplication) -> str:
        return mask(app.last_error, _secrets(self.context))

    def get_member_count(self, app: SparkApplication) -> int:
        return member_count(app)

    @extend_schema_field(MemberSerializer(many=True))
    def get_members(self, app: SparkApplication) -> list:
        return MemberSerializer(member_runs(app), many=True).data

    def get_capacity_free(self, app: SparkApplication) -> int:
        return max(0, app.capacity - member_count(app))

    def validate_name(self, value: str) -> str:
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError(
                "an application cannot be renamed: pipelines' placement refers to it by name"
            )
        if problem := application_services.name_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_master(self, value: str) -> str:
        if problem := application_services.master_problem(value):
            raise serializers.ValidationError(problem)
        return value

    def validate_driver_memory(self, value: str) -> str:
        if problem := application_services.memory_problem(value, required=True):
            raise serializers.ValidationError(problem)
        return value

    def validate_executor_memory(self, value: str) -> str:
        if problem := application_services.memory_problem(value, required=False):
            raise serializers.ValidationError(problem)
        return value

    def validate_conf(self, value) -> dict:
        try:
            return application_services.clean_conf(value, launcher.conf_problem)
        except Invalid as exc:
            raise serializers.ValidationError(exc.detail) from None


def _conflict(exc: Exception) -> Response:
    return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)


class ApplicationViewSet(viewsets.ModelViewSet):
    """Shared Spark applications. Everyone reads; admins create, change and delete them
    (they choose the resources and Spark settings); operators start, stop and recycle them.

    A changed definition (master, memory, Spark settings, capacity) takes effect at the
    application's next start: recycle it (or stop and start it) to apply it now. An
    application cannot be renamed (pipelines' `placement` names it), stopped while it runs
    pipelines' queries or pipelines wanted running name it, or deleted while any pipeline
    names it, it runs queries, or its process runs (409, saying which).
    """

    write_role = ADMIN
    action_roles = {name: OPERATOR for name in ACTIONS}

    serializer_class = ApplicationSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def get_queryset(self):
        return annotated(SparkApplication.objects.order_by("name"))

    def _fresh(self, app: SparkApplication) -> SparkApplication:
        return self.get_queryset().get(pk=app.pk)

    def perform_create(self, serializer: ApplicationSerializer) -> None:
        data = dict(serializer.validated_data)
        name = data.pop("name")
        try:
            app = application_services.create_application(name=name, user=self.request.user, **data)
        except Invalid as exc:
            raise serializers.ValidationError(exc.as_dict()) from None
        except Conflict as exc:
            raise serializers.ValidationError({"name": [str(exc)]}) from None
        serializer.instance = self._fresh(app)

    def update(self, request, *args, **kwargs) -> Response:
        partial = kwargs.pop("partial", False)
        app = self.get_object()
        serializer = self.get_serializer(app, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        data = dict(serializer.validated_data)
        data.pop("name", None)
        try:
            app = application_services.update_application(app, user=request.user, **data)
        except Conflict as exc:
            return _conflict(exc)
        return Response(self.get_serializer(self._fresh(app)).data)

    def destroy(self, request, *args, **kwargs) -> Response:
        """Delete an application (audited, with an optional `{"reason": "..."}`); 409 while
        a pipeline's placement names it, it runs pipelines' queries, or its process runs."""
        app = self.get_object()
        body = ControlSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            application_services.delete_application(
                app, user=request.user, reason=body.validated_data.get("reason", "")
            )
        except Conflict as exc:
            return _conflict(exc)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _control(self, request, action: str) -> Response:
        app = self.get_object()
        body = ControlSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            app = act(
                app,
                action,
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except NotApplicable as exc:
            return _conflict(exc)
        # No nudge: the beat tick reconciles every application within a few seconds.
        return Response(self.get_serializer(self._fresh(app)).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=ControlSerializer, responses={202: ApplicationSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def start(self, request, name: str | None = None) -> Response:
        """Desire the application running: the reconciler starts its process (with its
        current definition), which then takes pipelines placed in it."""
        return self._control(request, "start")

    @extend_schema(request=ControlSerializer, responses={202: ApplicationSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def stop(self, request, name: str | None = None) -> Response:
        """Desire the application stopped: its process is asked to exit. 409 while it runs
        pipelines' queries or a pipeline wanted running names it as its placement."""
        return self._control(request, "stop")

    @extend_schema(request=ControlSerializer, responses={202: ApplicationSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def recycle(self, request, name: str | None = None) -> Response:
        """Replace the application's process: its members' queries are stopped gracefully,
        the process is killed and started again (with its current definition), and the
        members start again in it (not counted as failures). 409 unless it is starting or
        running."""
        return self._control(request, "recycle")
