"""What drivers tell the control plane: the HTTP side of heartbeats, progress and exits.

Each run authenticates with its own token (`Authorization: RunToken <key>`), given to it at
launch. Reports are fenced: only the pipeline's current, still-active run is heard; anything
else gets 409 and is told to stop. What a report means is controlplane.supervision.reports
(fencing, liveness) and controlplane.observability.progress (batch progress).
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, extend_schema_field, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts import security
from controlplane.accounts.models import digest as token_digest
from controlplane.definitions.models import Run, SparkApplication
from controlplane.observability import progress
from controlplane.supervision import applications, endings, failures, reports, tasks
from controlplane.supervision.reports import STALE


class RunTokenAuthentication(BaseAuthentication):
    keyword = "RunToken"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if not parts or parts[0].lower() != self.keyword.lower().encode():
            return None
        if len(parts) != 2:
            security.api_token_refused(request, "malformed run token header")
            raise exceptions.AuthenticationFailed("Invalid run token header.")
        run = (
            Run.objects.select_related("pipeline")
            .filter(token_digest=token_digest(parts[1].decode(errors="replace")))
            .first()
        )
        if run is None:
            security.api_token_refused(request, "unknown run token")
            raise exceptions.AuthenticationFailed("Unknown run token.")
        return (None, run)

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsRun(BasePermission):
    def has_permission(self, request, view) -> bool:
        return isinstance(request.auth, Run) and str(request.auth.pk) == str(view.kwargs["run_id"])


HeartbeatReply = inline_serializer(
    "HeartbeatReply", {"stop": serializers.BooleanField(), "generation": serializers.IntegerField()}
)


class RunReportView(APIView):
    """Base of the driver-facing endpoints: run-token authentication, own run only."""

    authentication_classes = [RunTokenAuthentication]
    permission_classes = [IsRun]


class RunHeartbeat(RunReportView):
    """A driver's periodic sign of life (`{"idle": true}`: its query waits for data); the
    answer may ask it to stop gracefully."""

    @extend_schema(
        request=inline_serializer("Heartbeat", {"idle": serializers.BooleanField(required=False)}),
        responses={200: HeartbeatReply},
    )
    def post(self, request, run_id: int) -> Response:
        run: Run = request.auth
        if not reports.is_current(run):
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        idle = isinstance(request.data, dict) and request.data.get("idle") is True
        reports.heartbeat(run, timezone.now(), idle=idle)
        return Response(reports.answer(run))


# What a BIGINT column holds: a larger count is a corrupt report, refused.
MAX_COUNT = 2**63 - 1


def _count(**kw):
    return serializers.IntegerField(
        min_value=0, max_value=MAX_COUNT, required=False, allow_null=True, **kw
    )


class CustomMetricsField(serializers.DictField):
    """A state store's custom metrics (Spark reports numbers). Those the control plane reads
    must be counts (whole numbers, not negative); the others are not read, whatever they
    are."""

    READ = (
        "rocksdbSstFileSize",
        "rocksdbCommitCheckpointLatency",
        "stateOnCurrentVersionSizeBytes",
    )

    def __init__(self, **kwargs):
        super().__init__(child=serializers.JSONField(), **kwargs)

    def to_internal_value(self, data):
        value = super().to_internal_value(data)
        errors = {}
        for name in self.READ:
            number = value.get(name)
            if number is not None and (
                isinstance(number, bool)
                or not isinstance(number, int)
                or not 0 <= number <= MAX_COUNT
            ):
                errors[name] = [f"must be a whole number from 0 to {MAX_COUNT}"]
        if errors:
            raise serializers.ValidationError(errors)
        return value


# At most this many stateful operators per query (jobs: one per aggregation, deduplication,
# join or stateful function in its plan).
MAX_STATE_OPERATORS = 64


class StateOperatorSerializer(serializers.Serializer):
    """One StateOperatorProgress (camelCase, as Spark reports it); every figure optional
    (older Spark versions report fewer)."""

    operatorName = serializers.CharField(
        max_length=100, required=False, allow_blank=True, default=""
    )
    numRowsTotal = _count()
    numRowsUpdated = _count()
    numRowsRemoved = _count()
    allUpdatesTimeMs = _count()
    allRemovalsTimeMs = _count()
    commitTimeMs = _count()
    memoryUsedBytes = _count()
    numRowsDroppedByWatermark = _count()
    numShufflePartitions = _count()
    numStateStoreInstances = _count()
    customMetrics = CustomMetricsField(required=False)


class ProgressSerializer(serializers.Serializer):
    batchId = serializers.IntegerField(min_value=0)
    timestamp = serializers.DateTimeField()
    numInputRows = serializers.IntegerField(min_value=0, required=False, default=0)
    inputRowsPerSecond = serializers.FloatField(required=False, allow_null=True)
    processedRowsPerSecond = serializers.FloatField(required=False, allow_null=True)
    batchDuration = serializers.IntegerField(required=False, allow_null=True)
    durationMs = serializers.DictField(child=serializers.IntegerField(), required=False)
    sources = serializers.ListField(child=serializers.DictField(), required=False)
    stateOperators = StateOperatorSerializer(
        many=True, required=False, max_length=MAX_STATE_OPERATORS
    )
    eventTime = serializers.DictField(required=False)


# A driver that was cut off from the control plane sends what it queued in requests of at
# most this many batches (jobs.reporting.BATCH_LIMIT).
MAX_PROGRESS_PER_REQUEST = 100


class RunProgress(RunReportView):
    """Batch progress as Spark's listener produced it (camelCase, unchanged): one
    StreamingQueryProgress, or a list of up to 100 of them (what a driver queued)."""

    @extend_schema(request=ProgressSerializer(many=True), responses={200: HeartbeatReply})
    def post(self, request, run_id: int) -> Response:
        run: Run = request.auth
        if not reports.is_current(run):
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        many = isinstance(request.data, list)
        if many and not 0 < len(request.data) <= MAX_PROGRESS_PER_REQUEST:
            raise serializers.ValidationError(
                {"non_field_errors": [f"send 1 to {MAX_PROGRESS_PER_REQUEST} reports at a time"]}
            )
        data = ProgressSerializer(data=request.data, many=many)
        data.is_valid(raise_exception=True)
        batches = data.validated_data if many else [data.validated_data]
        progress.store(run, batches)
        reports.batches_completed(run, max(p["batchId"] for p in batches), timezone.now())
        return Response(reports.answer(run))


@extend_schema_field(
    {
        "type": "object",
        "nullable": True,
        "description": "The driver's verdict on its failure, by the exception's type "
        "(jobs.failures): permanent ones are not restarted.",
        "properties": {
            "kind": {"type": "string", "enum": ["permanent", "transient"]},
            "reason": {"type": "string", "maxLength": failures.MAX_REASON},
            "type": {"type": "string", "maxLength": failures.MAX_TYPE},
            "condition": {"type": "string", "maxLength": failures.MAX_CONDITION},
        },
        "required": ["kind", "reason"],
    }
)
class FailureField(serializers.Field):
    """A driver's verdict, checked once, where every report's is (failures.parse)."""

    def to_internal_value(self, data):
        try:
            return failures.parse(data)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None

    def to_representation(self, value):
        return value


class ExitSerializer(serializers.Serializer):
    exit_code = serializers.IntegerField(allow_null=True)
    error_tail = serializers.CharField(
        allow_blank=True, required=False, default="", trim_whitespace=False
    )
    # Absent from older drivers' reports: then the error output is read (failures.judge).
    failure = FailureField(required=False, allow_null=True, default=None)


ExitReply = inline_serializer("ExitReply", {"recorded": serializers.BooleanField()})


class RunExit(RunReportView):
    """The supervisor's report that the driver exited, sent the moment it happens: the run
    is recorded as ended and the restart policy decides at once (no waiting for a tick)."""

    @extend_schema(request=ExitSerializer, responses={200: ExitReply})
    def post(self, request, run_id: int) -> Response:
        run: Run = request.auth
        if not reports.is_current(run):
            # Fenced like the other reports. A run replaced by a restart is still recorded
            # as ended: the reconciler reads its exit.json at the next tick.
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        data = ExitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        recorded = endings.record_exit(
            run,
            timezone.now(),
            exit_code=data.validated_data["exit_code"],
            error=data.validated_data["error_tail"],
            failure=data.validated_data["failure"],
            current_only=True,  # checked again under the pipeline's lock
        )
        if recorded:
            # A restart with no delay starts now, not at the next tick.
            pipeline_id = run.pipeline_id
            transaction.on_commit(lambda: tasks.nudge(pipeline_id))
        return Response({"recorded": recorded})


class ApplicationTokenAuthentication(BaseAuthentication):
    """A shared application's supervisor: `Authorization: RunToken <key>` with the token of
    the application's current process (app.json)."""

    keyword = "RunToken"

    def authenticate(self, request):
        parts = get_authorization_header(request).split()
        if len(parts) != 2 or parts[0].lower() != self.keyword.lower().encode():
            return None
        app = SparkApplication.objects.filter(
            token_digest=token_digest(parts[1].decode(errors="replace"))
        ).first()
        if app is None:
            security.api_token_refused(request, "unknown application token")
            raise exceptions.AuthenticationFailed("Unknown application token.")
        return (None, app)

    def authenticate_header(self, request) -> str:
        return self.keyword


class IsApplication(BasePermission):
    def has_permission(self, request, view) -> bool:
        app = request.auth
        return isinstance(app, SparkApplication) and app.name == view.kwargs["name"]


class ApplicationExit(APIView):
    """The supervisor's report that a shared application's driver exited: its members' runs
    end (cause `application-lost`) and it is started again, at once."""

    authentication_classes = [ApplicationTokenAuthentication]
    permission_classes = [IsApplication]

    @extend_schema(request=ExitSerializer, responses={200: ExitReply})
    def post(self, request, name: str) -> Response:
        app: SparkApplication = request.auth
        data = ExitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # The supervisor wrote exit.json before reporting: the application's step reads it.
        pipelines = list(applications.members(app).values_list("pipeline_id", flat=True))
        action = applications.reconcile_application(app.pk, timezone.now())
        for pipeline_id in pipelines:
            transaction.on_commit(lambda p=pipeline_id: tasks.nudge(p))
        return Response({"recorded": action in ("lost", "recycled", "stopped")})


class MemberReportSerializer(serializers.Serializer):
    run_id = serializers.IntegerField(min_value=1)
    token = serializers.CharField(max_length=256, trim_whitespace=False)
    kind = serializers.ChoiceField(choices=["heartbeat", "progress"])
    body = serializers.JSONField(required=False, default=dict)


# What a shared application sends at once: every member's queued heartbeats and progress.
MAX_MEMBER_REPORTS = 500

MemberAnswer = inline_serializer(
    "MemberAnswer",
    {
        "status": serializers.IntegerField(
            help_text="What /api/runs/{id}/{kind}/ would have answered: 200, 400, 401, 409."
        ),
        "body": serializers.DictField(),
    },
)


class ApplicationReports(APIView):
    """Heartbeats and progress of a shared application's members, many in one request (one
    HTTP request for the whole application, not one per member and report). The request is
    the application's (its token); each report is still its run's: it carries the run's own
    token and is fenced as `/api/runs/{id}/heartbeat/` and `.../progress/` are (only the
    pipeline's current, active run of this application is heard). Each gets the answer
    that endpoint would have given, in order."""

    authentication_classes = [ApplicationTokenAuthentication]
    permission_classes = [IsApplication]

    @extend_schema(
        request=inline_serializer("MemberReports", {"reports": MemberReportSerializer(many=True)}),
        responses={200: inline_serializer("MemberAnswers", {"answers": MemberAnswer})},
    )
    def post(self, request, name: str) -> Response:
        app: SparkApplication = request.auth
        items = request.data.get("reports") if isinstance(request.data, dict) else None
        if not isinstance(items, list) or not 0 < len(items) <= MAX_MEMBER_REPORTS:
            raise serializers.ValidationError(
                {"reports": [f"send a list of 1 to {MAX_MEMBER_REPORTS} reports"]}
            )
        # One serializer of each kind for the request: building one per report (DRF copies
        # every field) cost more than the rest of the request.
        reader, progress_reader = MemberReportSerializer(), ProgressSerializer()
        parsed = []  # (valid, the report or its errors)
        for item in items:
            try:
                parsed.append((True, reader.run_validation(item)))
            except serializers.ValidationError as exc:
                parsed.append((False, exc.detail))
        digests = {token_digest(p["token"]) for valid, p in parsed if valid}
        runs = {
            run.token_digest: run
            for run in Run.objects.select_related("pipeline").filter(
                token_digest__in=digests, application_id=app.pk
            )
        }
        now = timezone.now()
        answers, rows, heard = [], [], {}
        for valid, report in parsed:
            status_code, body = (
                self._one(report, runs, rows, heard, progress_reader) if valid else (400, report)
            )
            answers.append({"status": status_code, "body": body})
        progress.store_many(rows)
        reports.heard_many(heard, now)
        return Response({"answers": answers})

    @staticmethod
    def _one(report, runs, rows, heard, progress_reader) -> tuple[int, dict]:
        run = runs.get(token_digest(report["token"]))
        if run is None or run.pk != report["run_id"]:
            return 401, {"detail": "Unknown run token."}
        if not reports.is_current(run):
            return 409, STALE
        batch, idle = heard.get(run.pk, (None, False))
        body = report["body"]
        if report["kind"] == "heartbeat":
            idle = idle or (isinstance(body, dict) and body.get("idle") is True)
        else:
            many = isinstance(body, list)
            if many and not 0 < len(body) <= MAX_PROGRESS_PER_REQUEST:
                return 400, {
                    "non_field_errors": [f"send 1 to {MAX_PROGRESS_PER_REQUEST} reports at a time"]
                }
            try:
                batches = [progress_reader.run_validation(b) for b in (body if many else [body])]
            except serializers.ValidationError as exc:
                return 400, {"body": exc.detail}
            rows.append((run, batches))
            newest = max(p["batchId"] for p in batches)
            batch = newest if batch is None else max(batch, newest)
        heard[run.pk] = (batch, idle)
        return 200, reports.answer(run)


class RunTokenScheme(OpenApiAuthenticationExtension):
    """Describes the drivers' `Authorization: RunToken <key>` scheme in the OpenAPI schema."""

    target_class = RunTokenAuthentication
    name = "runToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Drivers only: `RunToken <key>`, the run's own token from run.json.",
        }


class ApplicationTokenScheme(OpenApiAuthenticationExtension):
    """Describes a shared application's supervisor's token scheme in the OpenAPI schema."""

    target_class = ApplicationTokenAuthentication
    name = "applicationToken"

    def get_security_definition(self, auto_schema):
        return {
            "type": "apiKey",
            "in": "header",
            "name": "Authorization",
            "description": "Shared applications' supervisors only: `RunToken <key>`, the "
            "application's own token from app.json.",
        }
