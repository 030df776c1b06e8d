"""What drivers tell the control plane: heartbeats and batch progress.

Each run authenticates with its own token (`Authorization: RunToken <key>`), given to it at
launch. Reports are fenced: only the pipeline's current, still-active run is heard; anything
else (a driver the control plane already gave up on, a zombie from an older generation) gets
409 and is told to stop.
"""

from __future__ import annotations

import json

from django.db import transaction
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.permissions import BasePermission
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts import security
from controlplane.accounts.models import digest as token_digest

from . import reconciler, tasks
from .models import BatchProgress, DesiredState, Run, RunState


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


def _current(run: Run) -> bool:
    # run.pipeline was loaded with the run by RunTokenAuthentication, in this request.
    return run.generation == run.pipeline.generation and run.state in RunState.active()


def _answer(run: Run) -> dict:
    pipeline = run.pipeline
    stop = pipeline.desired_state != DesiredState.RUNNING or run.stop_requested_at is not None
    return {"stop": stop, "generation": run.generation}


STALE = {"detail": "stale run: this driver is not the pipeline's current run", "stop": True}

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
        if not _current(run):
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        now = timezone.now()
        changes = {"last_heartbeat_at": now}
        if isinstance(request.data, dict) and request.data.get("idle") is True:
            changes["last_idle_at"] = now  # waiting for data, not stuck
        Run.objects.filter(pk=run.pk).update(**changes)
        return Response(_answer(run))


class ProgressSerializer(serializers.Serializer):
    batchId = serializers.IntegerField(min_value=0)
    timestamp = serializers.DateTimeField()
    numInputRows = serializers.IntegerField(min_value=0, required=False, default=0)
    inputRowsPerSecond = serializers.FloatField(required=False, allow_null=True)
    processedRowsPerSecond = serializers.FloatField(required=False, allow_null=True)
    batchDuration = serializers.IntegerField(required=False, allow_null=True)
    durationMs = serializers.DictField(child=serializers.IntegerField(), required=False)
    sources = serializers.ListField(child=serializers.DictField(), required=False)
    stateOperators = serializers.ListField(child=serializers.DictField(), required=False)
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
        if not _current(run):
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        many = isinstance(request.data, list)
        if many and not 0 < len(request.data) <= MAX_PROGRESS_PER_REQUEST:
            raise serializers.ValidationError(
                {"non_field_errors": [f"send 1 to {MAX_PROGRESS_PER_REQUEST} reports at a time"]}
            )
        data = ProgressSerializer(data=request.data, many=many)
        data.is_valid(raise_exception=True)
        reports = data.validated_data if many else [data.validated_data]
        # A retried request repeats batches already recorded: those are ignored.
        BatchProgress.objects.bulk_create(
            [_progress_row(run, p) for p in reports], ignore_conflicts=True
        )
        now = timezone.now()
        Run.objects.filter(pk=run.pk).update(
            last_heartbeat_at=now,
            last_batch_id=max(p["batchId"] for p in reports),
            last_batch_at=now,
        )
        return Response(_answer(run))


def _progress_row(run: Run, p: dict) -> BatchProgress:
    source = (p.get("sources") or [{}])[0]
    operators = p.get("stateOperators") or []
    return BatchProgress(
        run=run,
        batch_id=p["batchId"],
        timestamp=p["timestamp"],
        num_input_rows=p["numInputRows"],
        input_rows_per_second=p.get("inputRowsPerSecond"),
        processed_rows_per_second=p.get("processedRowsPerSecond"),
        batch_duration_ms=p.get("batchDuration"),
        durations_ms=p.get("durationMs", {}),
        end_offsets=_offsets(source.get("endOffset")),
        latest_offsets=_offsets(source.get("latestOffset")),
        state_rows=_total(operators, "numRowsTotal"),
        state_memory_bytes=_total(operators, "memoryUsedBytes"),
        watermark=_watermark(p.get("eventTime") or {}),
    )


def _total(operators: list[dict], key: str) -> int | None:
    values = [o[key] for o in operators if isinstance(o.get(key), int)]
    return sum(values) if values else None


def _watermark(event_time: dict):
    """Spark reports the watermark as ISO text; the epoch (no watermark yet) is left out."""
    try:
        value = parse_datetime(str(event_time.get("watermark") or ""))
    except ValueError:
        return None
    if value is None or value.timestamp() <= 0:
        return None
    return value


class ExitSerializer(serializers.Serializer):
    exit_code = serializers.IntegerField(allow_null=True)
    error_tail = serializers.CharField(
        allow_blank=True, required=False, default="", trim_whitespace=False
    )


ExitReply = inline_serializer("ExitReply", {"recorded": serializers.BooleanField()})


class RunExit(RunReportView):
    """The supervisor's report that the driver exited, sent the moment it happens: the run
    is recorded as ended and the restart policy decides at once (no waiting for a tick)."""

    @extend_schema(request=ExitSerializer, responses={200: ExitReply})
    def post(self, request, run_id: int) -> Response:
        run: Run = request.auth
        if not _current(run):
            # Fenced like the other reports. A run replaced by a restart is still recorded
            # as ended: the reconciler reads its exit.json at the next tick.
            return Response(STALE, status=status.HTTP_409_CONFLICT)
        data = ExitSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        recorded = reconciler.record_exit(
            run,
            timezone.now(),
            exit_code=data.validated_data["exit_code"],
            error=data.validated_data["error_tail"],
            current_only=True,  # checked again under the pipeline's lock
        )
        if recorded:
            # A restart with no delay starts now, not at the next tick.
            pipeline_id = run.pipeline_id
            transaction.on_commit(lambda: tasks.nudge(pipeline_id))
        return Response({"recorded": recorded})


def _offsets(value):
    """Spark reports source offsets as JSON text; keep the per-topic offsets as JSON (keys
    starting with `$` are the source's own bookkeeping, such as a batch's split plan)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return None
    if isinstance(value, dict):
        return {k: v for k, v in value.items() if not str(k).startswith("$")}
    return value


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
