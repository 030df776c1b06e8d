from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from controlplane.connections.masking import known_secrets, mask
from controlplane.definitions import services
from controlplane.definitions.models import (
    AuditEntry,
    DesiredState,
    Failure,
    Pipeline,
    PipelineVersion,
    Run,
    RunState,
    Status,
)
from controlplane.observability.assess import assess_one
from controlplane.supervision import explain


@extend_schema_field({"$ref": "#/components/schemas/PipelineSpec"})
class SpecField(serializers.JSONField):
    """A pipeline spec: JSON, described in the OpenAPI document by its JSON Schema."""


@extend_schema_field(
    {"type": "string", "maxLength": 63, "format": "spark-placement", "examples": ["dedicated"]}
)
class PlacementField(serializers.CharField):
    """`dedicated`, `auto` or a shared application's name (checked when saved)."""


class PipelineSerializer(serializers.ModelSerializer):
    """A pipeline definition. `spec` is validated as a whole by `jobs.spec.parse_spec`.

    `version` is read-only, but may be sent back on PUT/PATCH as a precondition: if the pipeline
    has moved on since, the write is refused with 409 instead of overwriting someone's change.
    """

    url = serializers.HyperlinkedIdentityField(view_name="api:pipeline-detail", lookup_field="name")
    spec = SpecField(help_text="Pipeline spec v1 (see docs/spec.md).")
    version = serializers.IntegerField(
        required=False, min_value=1, help_text="Increases with every spec change."
    )
    desired_state = serializers.ChoiceField(
        choices=DesiredState.choices, default=DesiredState.STOPPED
    )
    status = serializers.ChoiceField(choices=Status.choices, read_only=True)
    # No default: a PUT without it keeps the pipeline where it is (a new one: dedicated).
    placement = PlacementField(
        required=False,
        max_length=63,
        help_text=(
            "Where the pipeline's query runs: `dedicated` (its own Spark application, the"
            " default), `auto` (any running shared application with room) or the name of a"
            " shared Spark application (/api/applications/). A change takes effect at the"
            " pipeline's next run: a running pipeline keeps its current run until it is"
            " restarted."
        ),
    )
    application = serializers.SerializerMethodField(
        help_text="The shared application its current run is placed in (null: none)."
    )
    labels = serializers.JSONField(
        required=False,
        help_text='Labels, e.g. {"team": "payments", "domain": "orders"}: the overview,'
        " bulk actions and alert rules select pipelines by them.",
    )
    restore_point_minutes = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=7 * 24 * 60,
        help_text="Take a restore point this often while it runs (minutes; null: never on a"
        " schedule).",
    )
    auto_rollback_minutes = serializers.IntegerField(
        required=False,
        allow_null=True,
        min_value=1,
        max_value=24 * 60,
        help_text="Roll a new spec version back to the last healthy one when it runs this"
        " many minutes without committing a batch while records wait that long, or fails"
        " repeatedly (null: never).",
    )
    last_failure = serializers.SerializerMethodField()
    health = serializers.SerializerMethodField(
        help_text="Whether it does its job: state (failed, crash-looping, failing, recovering,"
        " lagging, degraded, healthy, stopped), colour, why, and the cause of its last failure"
        " since its last start by hand (summary, category, title, fix). docs/oncall.md."
    )

    class Meta:
        model = Pipeline
        fields = [
            "url",
            "name",
            "description",
            "spec",
            "version",
            "desired_state",
            "placement",
            "labels",
            "restore_point_minutes",
            "auto_rollback_minutes",
            "auto_rolled_back_at",
            "auto_rollback_note",
            "application",
            "status",
            "status_message",
            "attempt",
            "restarts",
            "next_attempt_at",
            "health",
            "last_failure",
            "created_at",
            "updated_at",
        ]
        read_only_fields = [
            "created_at",
            "updated_at",
            "status",
            "status_message",
            "attempt",
            "restarts",
            "next_attempt_at",
            "auto_rolled_back_at",
            "auto_rollback_note",
        ]

    @extend_schema_field(
        {
            "type": "object",
            "nullable": True,
            "properties": {
                "cause": {"type": "string"},
                "at": {"type": "string", "format": "date-time"},
                "summary": {"type": "string"},
                "category": {"type": "string"},
                "fix": {"type": "string"},
                "message": {"type": "string"},
                "decision": {"type": "string"},
            },
        }
    )
    def get_last_failure(self, pipeline: Pipeline) -> dict | None:
        failure = pipeline.failures.select_related("run").first()
        if failure is None:
            return None
        said = explain.recorded(
            failure.cause,
            failure.run.exit_code if failure.run_id else None,
            failure.message,
            failure.reason,
            failure.category,
        )
        secrets = _secrets(self.context)
        return {
            "cause": failure.cause,
            "at": serializers.DateTimeField().to_representation(failure.at),
            "summary": mask(said.line, secrets),
            "category": said.category,
            "fix": said.fix,
            "message": mask(failure.message, secrets),
            "decision": failure.decision,
        }

    @extend_schema_field({"type": "object"})
    def get_health(self, pipeline: Pipeline) -> dict:
        found = (self.context.get("assessments") or {}).get(pipeline.pk)
        if found is None:
            found = assess_one(pipeline, timezone.now())
        out = found.as_dict()
        if out["cause"]:
            out["cause"]["summary"] = mask(out["cause"]["summary"], _secrets(self.context))
        out["why"] = mask(out["why"], _secrets(self.context))
        return out

    @extend_schema_field({"type": "string", "nullable": True})
    def get_application(self, pipeline: Pipeline) -> str | None:
        run = (
            pipeline.runs.filter(state__in=RunState.active(), application__isnull=False)
            .select_related("application")
            .first()
        )
        return run.application.name if run else None

    def validate_name(self, value: str) -> str:
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError("a pipeline cannot be renamed")
        return value

    def validate_placement(self, value: str) -> str:
        if problem := services.placement_problem(value):
            raise serializers.ValidationError(problem)
        return value


class PipelineVersionSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = PipelineVersion
        fields = ["version", "spec", "created_at", "created_by"]


class ControlSerializer(serializers.Serializer):
    """The body of an on-call action: why (kept in the audit log). Optional."""

    reason = serializers.CharField(required=False, allow_blank=True, max_length=2000)


class StartSerializer(ControlSerializer):
    """The body of an action that launches a driver (start, resume, restart)."""

    force = serializers.BooleanField(
        required=False,
        default=False,
        help_text="Launch even though the preflight finds errors (CONTROLPLANE_PREFLIGHT refuse).",
    )


class DraftSerializer(serializers.Serializer):
    """A draft definition to preflight: its spec, as POST /api/pipelines/ takes it."""

    spec = SpecField()


BULK_ACTIONS = ["start", "stop", "restart", "suspend", "resume"]


class BulkSerializer(ControlSerializer):
    """One on-call action for many pipelines: by name, or every pipeline with the labels."""

    action = serializers.ChoiceField(choices=BULK_ACTIONS)
    names = serializers.ListField(
        child=serializers.CharField(max_length=63), required=False, max_length=1000
    )
    labels = serializers.ListField(
        child=serializers.CharField(max_length=130),
        required=False,
        max_length=20,
        help_text="name:value selectors; a pipeline must carry all of them.",
    )

    def validate(self, data):
        if not data.get("names") and not data.get("labels"):
            raise serializers.ValidationError(
                {"non_field_errors": ["say which pipelines: names, or labels, or both"]}
            )
        return data


class OffsetsResetSerializer(ControlSerializer):
    to = serializers.JSONField(
        help_text='"earliest", "latest", {"timestamp": "2026-11-23T10:00:00Z"} or'
        ' {"offsets": {"<topic>": {"<partition>": <offset>}}}'
    )


class DeadLetterRedriveSerializer(ControlSerializer):
    """The body of a redrive: where to, which letters, and why."""

    to = serializers.CharField(
        max_length=249,
        help_text='"source" (the topic each letter was read from) or a topic on the source'
        " cluster.",
    )
    filters = serializers.DictField(
        required=False,
        help_text="As the list's query: error, since, until, topic, partition, batch.",
    )


class RestoreSerializer(ControlSerializer):
    """The body of a restore: which restore point, and why."""

    restore_point = serializers.IntegerField(min_value=1)


class RollbackSerializer(ControlSerializer):
    """The body of a rollback: to which earlier version, and why."""

    version = serializers.IntegerField(min_value=1)


class RunSerializer(serializers.ModelSerializer):
    error_tail = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField(
        help_text="Why the run ended, in words (empty while it is active)."
    )

    class Meta:
        model = Run
        fields = [
            "generation",
            "spec_version",
            "state",
            "host",
            "pid",
            "created_at",
            "started_at",
            "stop_requested_at",
            "ended_at",
            "exit_code",
            "cause",
            "summary",
            "error_tail",
            "last_heartbeat_at",
            "last_batch_id",
            "last_batch_at",
        ]

    def get_error_tail(self, run: Run) -> str:
        return mask(run.error_tail, _secrets(self.context))

    def get_summary(self, run: Run) -> str:
        if not run.cause:
            return ""
        failure = run.failures.order_by("-at").first()  # its cause as recorded, if it failed
        said = (
            explain.recorded(
                run.cause, run.exit_code, run.error_tail, failure.reason, failure.category
            )
            if failure is not None
            else explain.cause_of(run.cause, run.exit_code, run.error_tail)
        )
        return mask(said.line, _secrets(self.context))


class FailureSerializer(serializers.ModelSerializer):
    run = serializers.SlugRelatedField(slug_field="generation", read_only=True)
    message = serializers.SerializerMethodField()
    summary = serializers.SerializerMethodField(
        help_text="Why the run ended, in one line naming what to fix (the innermost cause)."
    )
    category = serializers.SerializerMethodField(
        help_text="The kind of failure: a key of the cause catalogue (docs/oncall.md)."
    )
    fix = serializers.SerializerMethodField(help_text="What the runbook suggests for it.")

    class Meta:
        model = Failure
        fields = [
            "at", "cause", "summary", "category", "fix", "message", "permanent", "decision",
            "restart_at", "run",
        ]  # fmt: skip

    def get_message(self, failure: Failure) -> str:
        return mask(failure.message, _secrets(self.context))

    def _cause(self, failure: Failure) -> explain.Cause:
        exit_code = failure.run.exit_code if failure.run_id else None
        return explain.recorded(
            failure.cause, exit_code, failure.message, failure.reason, failure.category
        )

    def get_summary(self, failure: Failure) -> str:
        return mask(self._cause(failure).line, _secrets(self.context))

    def get_category(self, failure: Failure) -> str:
        return self._cause(failure).category

    def get_fix(self, failure: Failure) -> str:
        return self._cause(failure).fix


class AuditEntrySerializer(serializers.ModelSerializer):
    actor = serializers.CharField(source="actor_name")
    pipeline = serializers.CharField(source="pipeline_name")
    connection = serializers.CharField(source="connection_name")
    application = serializers.CharField(source="application_name")

    class Meta:
        model = AuditEntry
        fields = [
            "id",
            "at",
            "actor",
            "action",
            "pipeline",
            "connection",
            "application",
            "reason",
            "before",
            "after",
        ]


def _secrets(context: dict) -> tuple[str, ...]:
    """The stored secret values, looked up once per response (a list shares its context)."""
    if "known_secrets" not in context:
        context["known_secrets"] = known_secrets()
    return context["known_secrets"]
