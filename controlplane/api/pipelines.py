from __future__ import annotations

import json
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.db import transaction
from django.http import StreamingHttpResponse
from django.utils import timezone
from django.utils.dateparse import parse_datetime
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.alerting import state as state_facts
from controlplane.definitions import preflight, services
from controlplane.definitions.models import DEDICATED, AuditEntry, Pipeline, RestorePoint
from controlplane.observability import dead_letters, metrics, state, writer_schemas
from controlplane.observability.assess import assess, assess_one
from controlplane.supervision import controls, offsets, restore_points, tasks
from jobs.spec import SpecError

from .serializers import (
    AuditEntrySerializer,
    BulkSerializer,
    ControlSerializer,
    DeadLetterRedriveSerializer,
    DraftSerializer,
    FailureSerializer,
    OffsetsResetSerializer,
    PipelineSerializer,
    PipelineVersionSerializer,
    RestoreSerializer,
    RollbackSerializer,
    RunSerializer,
    StartSerializer,
)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7396 JSON merge patch, except that an object whose `kind` changes is replaced
    whole (merging exponential-delay's fields into a fixed-delay policy makes no sense)."""
    if not isinstance(patch, dict):
        return patch
    if not isinstance(target, dict) or ("kind" in patch and patch["kind"] != target.get("kind")):
        target = {}
    result = dict(target)
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


class PipelineViewSet(viewsets.ModelViewSet):
    """Pipeline definitions. PATCH merges `spec` (RFC 7396); PUT replaces it."""

    # On-call controls: operators; creating and changing pipelines: editors (the default).
    action_roles = {
        name: OPERATOR
        for name in (
            "start",
            "stop",
            "kill",
            "restart",
            "suspend",
            "resume",
            "restart_now",
            "reset_restarts",
            "rollback",
            "bulk",
            "offsets_reset",
            "restore",
            "dead_letters",
            "dead_letters_download",
            "dead_letters_redrive",
            "take_restore_point",
            "delete_restore_point",
            "preflight",
        )
    }

    queryset = Pipeline.objects.all()
    serializer_class = PipelineSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def list(self, request, *args, **kwargs) -> Response:
        """The pipelines, a page at a time; each page's health assessed in one go."""
        queryset = self.filter_queryset(self.get_queryset())
        page = self.paginate_queryset(queryset)
        items = page if page is not None else list(queryset)
        context = {**self.get_serializer_context(), "assessments": assess(items, timezone.now())}
        data = self.get_serializer_class()(items, many=True, context=context).data
        return self.get_paginated_response(data) if page is not None else Response(data)

    def get_queryset(self):
        """`?label=team:payments` (repeatable): pipelines carrying every one of them."""
        pipelines = Pipeline.objects.all()
        if self.action == "list":
            for selector in self.request.query_params.getlist("label"):
                try:
                    key, value = services.parse_selector(selector)
                except services.Invalid as exc:
                    raise ValidationError(exc.as_dict()) from None
                pipelines = pipelines.filter(labels__contains={key: value})
        return pipelines

    @extend_schema(request=BulkSerializer, responses={200: None})
    @action(detail=False, methods=["post"])
    def bulk(self, request) -> Response:
        """One on-call action (`start`, `stop`, `restart`, `suspend`, `resume`) for every
        pipeline named and/or carrying all the `labels`, with one reason; each is audited as
        if done alone. Answers which were done and which refused, and why."""
        body = BulkSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        pipelines = Pipeline.objects.all()
        for selector in data.get("labels", []):
            try:
                key, value = services.parse_selector(selector)
            except services.Invalid as exc:
                raise ValidationError({"labels": [exc.detail]}) from None
            pipelines = pipelines.filter(labels__contains={key: value})
        if data.get("names"):
            pipelines = pipelines.filter(name__in=data["names"])
            unknown = sorted(set(data["names"]) - set(pipelines.values_list("name", flat=True)))
            if unknown:
                raise ValidationError({"names": [f"no pipeline named {', '.join(unknown)}"]})
        done, refused = [], {}
        now = timezone.now()
        for pipeline in pipelines.order_by("name"):
            try:
                controls.act(
                    pipeline,
                    data["action"],
                    user=request.user,
                    reason=data.get("reason", ""),
                    now=now,
                )
            except controls.NotApplicable as exc:
                refused[pipeline.name] = str(exc)
                continue
            done.append(pipeline.name)
            transaction.on_commit(lambda pk=pipeline.pk: tasks.nudge(pk))
        return Response({"action": data["action"], "done": done, "refused": refused})

    def perform_create(self, serializer: PipelineSerializer) -> None:
        data = serializer.validated_data
        try:
            serializer.instance = services.create_pipeline(
                name=data["name"],
                spec_data=data["spec"],
                description=data.get("description", ""),
                desired_state=data.get("desired_state", "stopped"),
                placement=data.get("placement", DEDICATED),
                labels=data.get("labels"),
                restore_point_minutes=data.get("restore_point_minutes"),
                auto_rollback_minutes=data.get("auto_rollback_minutes"),
                user=self.request.user,
            )
        except SpecError as exc:
            raise ValidationError(exc.as_dict("spec.")) from None
        except services.Invalid as exc:
            raise ValidationError(exc.as_dict()) from None
        except services.Conflict as exc:
            raise ValidationError({"name": [str(exc)]}) from None

    def update(self, request, *args, **kwargs) -> Response:
        partial = kwargs.pop("partial", False)
        pipeline = self.get_object()
        serializer = self.get_serializer(pipeline, data=request.data, partial=partial)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        spec_data = data.get("spec")
        if partial and spec_data is not None:
            spec_data = merge_patch(pipeline.spec, spec_data)
        try:
            pipeline = services.update_pipeline(
                pipeline,
                user=request.user,
                spec_data=spec_data,
                description=data.get("description"),
                # PUT fills in the serializer's default; only an explicit value changes state.
                desired_state=data["desired_state"] if "desired_state" in request.data else None,
                expected_version=data.get("version"),
                placement=data.get("placement"),
                labels=data.get("labels"),
                restore_point_minutes=data.get("restore_point_minutes", services.UNCHANGED),
                auto_rollback_minutes=data.get("auto_rollback_minutes", services.UNCHANGED),
            )
        except SpecError as exc:
            raise ValidationError(exc.as_dict("spec.")) from None
        except services.Invalid as exc:
            raise ValidationError(exc.as_dict()) from None
        except services.Conflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(pipeline).data)

    def destroy(self, request, *args, **kwargs) -> Response:
        """Delete a stopped pipeline and its history (audited); 409 while it is wanted
        running, not at rest, or has a driver. Its checkpoint is kept as its name's last
        restore point (the others go), unless `?keep_restore_point=false`: then all go."""
        pipeline = self.get_object()
        keep = request.query_params.get("keep_restore_point", "true").lower()
        if keep not in ("true", "false"):
            raise ValidationError({"keep_restore_point": ["must be true or false"]})
        try:
            services.delete_pipeline(pipeline, user=request.user, keep_restore_point=keep == "true")
        except services.Conflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _control(self, request, action: str) -> Response:
        pipeline = self.get_object()
        launching = action in preflight.LAUNCHING
        body = (StartSerializer if launching else ControlSerializer)(data=request.data or {})
        body.is_valid(raise_exception=True)
        gate = preflight.before(pipeline, action, forced=bool(body.validated_data.get("force")))
        checked = gate.report
        if gate.refused:
            return Response(
                {
                    "detail": "not started: the preflight found problems"
                    f" ({checked.errors_in_words()});"
                    " fix them, or send force: true to start anyway",
                    "preflight": checked.as_dict(),
                },
                status=status.HTTP_409_CONFLICT,
            )
        try:
            pipeline = controls.act(
                pipeline,
                action,
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except controls.NotApplicable as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        # The beat tick would get there too; this only saves the operator a few seconds.
        transaction.on_commit(lambda: tasks.nudge(pipeline.pk))
        data = dict(self.get_serializer(pipeline).data)
        if checked is not None:
            data["preflight"] = checked.as_dict()
        return Response(data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(
        request=None, responses={200: OpenApiTypes.OBJECT}, operation_id="pipelines_preflight"
    )
    @action(detail=True, methods=["post"])
    def preflight(self, request, name: str | None = None) -> Response:
        """Check the stored definition against the systems it names, without writing
        anything (docs/spec.md, Preflight): each check at its spec field, `ok`, `error`,
        `warning` (a system not reached in time: never blocking) or `info`; `ok` is false
        when any check is an error. 400 if the stored spec no longer validates."""
        pipeline = self.get_object()
        try:
            spec = services.validate(pipeline.spec)
        except SpecError as exc:
            raise ValidationError(exc.as_dict("spec.")) from None
        return Response(preflight.run(spec).as_dict())

    @extend_schema(
        request=DraftSerializer,
        responses={200: OpenApiTypes.OBJECT},
        operation_id="pipelines_preflight_draft",
    )
    @action(detail=False, methods=["post"], url_path="preflight")
    def preflight_draft(self, request) -> Response:
        """The preflight of a draft spec (`{"spec": {...}}`, not saved): 400 with the
        problems at their fields when it does not validate, as POST /api/pipelines/ says."""
        body = DraftSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            spec = services.validate(body.validated_data["spec"])
        except SpecError as exc:
            raise ValidationError(exc.as_dict("spec.")) from None
        return Response(preflight.run(spec).as_dict())

    @extend_schema(request=StartSerializer, responses={202: PipelineSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def start(self, request, name: str | None = None) -> Response:
        """Desire the pipeline running (a failed or backing-off one is launched at once, and
        its restart policy counts failures afresh); the reconciler launches its driver. The
        preflight runs first: with errors, 409 and its checks, unless `force` (see
        CONTROLPLANE_PREFLIGHT); its checks are in the answer's `preflight`."""
        return self._control(request, "start")

    @extend_schema(request=ControlSerializer, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, name: str | None = None) -> Response:
        """Desire the pipeline stopped: the batch in flight finishes, then the driver exits."""
        return self._control(request, "stop")

    @extend_schema(request=ControlSerializer, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def kill(self, request, name: str | None = None) -> Response:
        """Stop now: the driver's whole process tree is killed (the batch in flight is not
        committed; it is read again from Kafka on the next start, exactly once)."""
        return self._control(request, "kill")

    @extend_schema(request=StartSerializer, responses={202: PipelineSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def restart(self, request, name: str | None = None) -> Response:
        """Stop the driver gracefully and start a new one (or start, if none runs)."""
        return self._control(request, "restart")

    @extend_schema(request=ControlSerializer, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def suspend(self, request, name: str | None = None) -> Response:
        """Stop gracefully and hold: no automatic restart until resumed."""
        return self._control(request, "suspend")

    @extend_schema(request=StartSerializer, responses={202: PipelineSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def resume(self, request, name: str | None = None) -> Response:
        """Run a suspended pipeline again."""
        return self._control(request, "resume")

    @extend_schema(request=ControlSerializer, responses={202: PipelineSerializer, 409: None})
    @action(detail=True, methods=["post"], url_path="restart-now")
    def restart_now(self, request, name: str | None = None) -> Response:
        """Skip the rest of a pending restart delay (backoff)."""
        return self._control(request, "restart-now")

    @extend_schema(request=ControlSerializer, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"], url_path="reset-restarts")
    def reset_restarts(self, request, name: str | None = None) -> Response:
        """Make the restart policy count failures from now on (attempts, backoff)."""
        return self._control(request, "reset-restarts")

    @extend_schema(request=RollbackSerializer, responses={200: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def rollback(self, request, name: str | None = None) -> Response:
        """Make an earlier version's spec current again: a new version equal to it (checked
        against today's connections), audited with the reason. A pipeline with a driver
        running is restarted (gracefully) so that the older spec runs; one at rest runs it at
        its next start. Operators may do it: it only brings back a spec that was accepted."""
        pipeline = self.get_object()
        body = RollbackSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            pipeline = controls.rollback(
                pipeline,
                body.validated_data["version"],
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except SpecError as exc:
            raise ValidationError(exc.as_dict("spec.")) from None
        except services.Invalid as exc:
            raise ValidationError(exc.as_dict()) from None
        except services.Conflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        transaction.on_commit(lambda: tasks.nudge(pipeline.pk))
        return Response(self.get_serializer(pipeline).data)

    @extend_schema(responses={200: None})
    @action(detail=True, methods=["get"])
    def offsets(self, request, name: str | None = None) -> Response:
        """What the pipeline's checkpoint committed, per partition (the next offset it reads),
        and a reset waiting for its next run, if any."""
        try:
            return Response(offsets.committed(self.get_object()))
        except offsets.Refused as exc:  # the checkpoint's store cannot be reached
            return Response({"detail": str(exc)}, status=status.HTTP_503_SERVICE_UNAVAILABLE)

    @extend_schema(request=OffsetsResetSerializer, responses={200: None, 409: None})
    @action(detail=True, methods=["post"], url_path="offsets/reset")
    def offsets_reset(self, request, name: str | None = None) -> Response:
        """Reset a stopped pipeline's offsets (refused, 409, while it is wanted running or
        has a driver): its next run starts a new checkpoint at the offsets `to` resolves to
        now; the current checkpoint is kept aside. Audited with the reason."""
        pipeline = self.get_object()
        body = OffsetsResetSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            done = offsets.reset(
                pipeline,
                body.validated_data["to"],
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except offsets.BadTarget as exc:
            raise ValidationError({"to": [str(exc)]}) from None
        except offsets.Refused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(done)

    @extend_schema(responses={200: None})
    @action(detail=True, methods=["get"], url_path="restore-points")
    def restore_points(self, request, name: str | None = None) -> Response:
        """The pipeline's restore points, newest first (its name's: a deleted pipeline's
        last one is listed for a pipeline created again under the name)."""
        pipeline = self.get_object()
        points = RestorePoint.objects.filter(pipeline_name=pipeline.name).select_related(
            "created_by"
        )
        page = self.paginate_queryset(points)
        return self.get_paginated_response([restore_points.describe(p) for p in page])

    @extend_schema(request=ControlSerializer, responses={201: None, 409: None})
    @restore_points.mapping.post
    def take_restore_point(self, request, name: str | None = None) -> Response:
        """Take a restore point now (operators), as of the checkpoint's last committed batch,
        while the pipeline runs or not; audited with the reason."""
        pipeline = self.get_object()
        body = ControlSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            point = restore_points.take(
                pipeline,
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except restore_points.Refused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(restore_points.describe(point), status=status.HTTP_201_CREATED)

    @extend_schema(request=ControlSerializer, responses={204: None, 404: None})
    @action(detail=True, methods=["delete"], url_path=r"restore-points/(?P<point>\d+)")
    def delete_restore_point(self, request, name: str | None = None, point: str = "") -> Response:
        """Delete one restore point and its files (operators; audited with `?reason=`)."""
        pipeline = self.get_object()
        row = RestorePoint.objects.filter(pk=int(point), pipeline_name=pipeline.name).first()
        if row is None:
            return Response(
                {"detail": f"pipeline {pipeline.name!r} has no restore point {point}"},
                status=status.HTTP_404_NOT_FOUND,
            )
        restore_points.delete(row, user=request.user, reason=request.query_params.get("reason", ""))
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=RestoreSerializer, responses={200: None, 404: None, 409: None})
    @action(detail=True, methods=["post"])
    def restore(self, request, name: str | None = None) -> Response:
        """Make a stopped pipeline's next run continue from one of its restore points (409
        while it is wanted running or has a driver): the current checkpoint is kept as a
        restore point; the batches after the restore point are read and written again.
        Audited with the reason."""
        pipeline = self.get_object()
        body = RestoreSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            done = restore_points.restore(
                pipeline,
                body.validated_data["restore_point"],
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except LookupError as exc:
            raise ValidationError({"restore_point": [str(exc.args[0])]}) from None
        except restore_points.Refused as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(done)

    def _letter_filters(self, query) -> dead_letters.Filters:
        try:
            return dead_letters.parse_filters(query)
        except dead_letters.BadFilter as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None

    @staticmethod
    def _unavailable(exc: Exception) -> Response:
        if isinstance(exc, dead_letters.Elsewhere):
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response({"detail": str(exc)}, status=status.HTTP_503_SERVICE_UNAVAILABLE)

    @extend_schema(responses={200: None, 503: None})
    @action(detail=True, methods=["get"], url_path="dead-letters")
    def dead_letters(self, request, name: str | None = None) -> Response:
        """Records that did not parse, newest first, read from the sink database (operators:
        they hold the raw values). Filters: `error`, `since`, `until` (received), `topic`,
        `partition`, `batch`; `limit` (at most 500) and `offset`."""
        pipeline = self.get_object()
        filters = self._letter_filters(request.query_params)
        try:
            limit = min(max(int(request.query_params.get("limit", 50)), 1), 500)
            offset = max(int(request.query_params.get("offset", 0)), 0)
        except ValueError:
            raise ValidationError({"limit": ["limit and offset are whole numbers"]}) from None
        try:
            letters, total = dead_letters.page(pipeline, filters, limit=limit, offset=offset)
        except dead_letters.Unavailable as exc:
            return self._unavailable(exc)
        return Response(
            {
                "count": total,
                "limit": limit,
                "offset": offset,
                "results": [dead_letters.as_json(letter) for letter in letters],
            }
        )

    @extend_schema(responses={200: None, 503: None})
    @action(detail=True, methods=["get"], url_path="dead-letters/batches")
    def dead_letters_batches(self, request, name: str | None = None) -> Response:
        """How many records of each batch did not parse (the newest 100 batches with any),
        and per error."""
        pipeline = self.get_object()
        try:
            return Response(
                {
                    "batches": dead_letters.batches(pipeline),
                    "errors": dead_letters.errors(pipeline),
                }
            )
        except dead_letters.Unavailable as exc:
            return self._unavailable(exc)

    @extend_schema(responses={200: None})
    @action(detail=True, methods=["get"], url_path="dead-letters/download")
    def dead_letters_download(self, request, name: str | None = None):
        """Every letter the filters match, oldest first, as JSON Lines (operators)."""
        pipeline = self.get_object()
        filters = self._letter_filters(request.query_params)
        try:
            dead_letters.count(pipeline, filters)  # the database answers, before streaming
        except dead_letters.Unavailable as exc:
            return self._unavailable(exc)
        lines = (
            json.dumps(dead_letters.as_json(letter)) + "\n"
            for letter in dead_letters.rows(pipeline, filters)
        )
        response = StreamingHttpResponse(lines, content_type="application/x-ndjson")
        response["Content-Disposition"] = (
            f'attachment; filename="{pipeline.name}-dead-letters.jsonl"'
        )
        return response

    @extend_schema(request=DeadLetterRedriveSerializer, responses={200: None, 503: None})
    @action(detail=True, methods=["post"], url_path="dead-letters/redrive")
    def dead_letters_redrive(self, request, name: str | None = None) -> Response:
        """Produce the letters the `filters` match again, raw value as it was, to the topic
        each was read from (`"to": "source"`) or to a topic that exists on the source
        cluster; the ones Kafka acknowledged leave the dead-letter table (`error` says what
        went wrong with the others). Audited with the reason (operators); 409 while another
        redrive of the pipeline runs."""
        pipeline = self.get_object()
        body = DeadLetterRedriveSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        data = body.validated_data
        filters = self._letter_filters(data.get("filters") or {})
        try:
            outcome = dead_letters.redrive(
                pipeline,
                filters,
                to=data["to"],
                user=request.user,
                reason=data.get("reason", ""),
                now=timezone.now(),
            )
        except dead_letters.BadFilter as exc:
            raise ValidationError({exc.field: [str(exc)]}) from None
        except dead_letters.Busy as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        except dead_letters.Unavailable as exc:
            return self._unavailable(exc)
        return Response(outcome)

    @extend_schema(responses=RunSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=RunSerializer)
    def runs(self, request, name: str | None = None) -> Response:
        """Every run of the pipeline, newest first: start, end, exit code, cause, error tail."""
        pipeline = self.get_object()
        page = self.paginate_queryset(pipeline.runs.all())
        return self.get_paginated_response(RunSerializer(page, many=True).data)

    @extend_schema(responses=FailureSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=FailureSerializer)
    def failures(self, request, name: str | None = None) -> Response:
        """The exceptions history: failures newest first, with what the policy decided."""
        pipeline = self.get_object()
        page = self.paginate_queryset(pipeline.failures.select_related("run"))
        return self.get_paginated_response(FailureSerializer(page, many=True).data)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def metrics(self, request, name: str | None = None) -> Response:
        """Figures: checkpoint progress, Kafka lag (records, seconds, status, per partition),
        backpressure (level, busy ratio) and throughput, as the metrics collector last
        computed them (every CONTROLPLANE_COLLECT_SECONDS): `collected_at` and `age_seconds`
        say how fresh they are. `status` is the pipeline's current status; `health` its
        health (state, colour, why, and its last failure's cause with the runbook's fix:
        docs/oncall.md), as the overview shows it. `state`: each
        stateful operator's figures as of the last batch reported (empty without state)."""
        pipeline = self.get_object()
        now = timezone.now()
        return Response(
            {
                **metrics.stored(pipeline, now),
                "health": assess_one(pipeline, now).as_dict(),
                "state": state.current_of(pipeline),
            }
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="default: 1 h ago")
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"], url_path="metrics/history")
    def metrics_history(self, request, name: str | None = None) -> Response:
        """Figures for charts, oldest first: `points` per batch for the last 2,000 batches
        still kept raw, per hour (roll-ups) before that; `lag`, the metrics collector's lag
        samples (records and seconds, also while the job was down)."""
        pipeline = self.get_object()
        since = _since(request)
        return Response(
            {
                "since": since,
                "points": metrics.history(pipeline, since),
                "lag": metrics.lag_history(pipeline, since),
            }
        )

    @extend_schema(
        parameters=[
            OpenApiParameter("since", OpenApiTypes.DATETIME, description="default: 1 h ago"),
            OpenApiParameter(
                "hours",
                OpenApiTypes.NUMBER,
                description=f"the growth trend's window (default {state_facts.DEFAULT_HOURS:g})",
            ),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    @action(detail=True, methods=["get"], url_path="metrics/state")
    def metrics_state(self, request, name: str | None = None) -> Response:
        """The stateful operators' state (windowed aggregations, deduplication), one entry
        per operator (its index in the query and Spark's operatorName; `store`: rocksdb or
        hdfs, `size_in`: where `size_bytes` is, disk or memory): `current`, its figures as
        of the last batch with the late rows dropped in all; `trend`, its growth over the
        last `hours` (rows and bytes per hour, and whether it grows without bound); and
        `points` since `since`, oldest first, per batch for the last 2,000 batches still kept
        raw, per hour (means, maxima) before that. Empty for a pipeline without state."""
        pipeline = self.get_object()
        since = _since(request)
        hours = _hours(request)
        now = timezone.now()
        operators: dict[int, dict] = {}
        for entry in state.history(pipeline, since):
            operators[entry["operator"]] = {**entry, "current": None, "trend": None}
        for current in state.current_of(pipeline):
            entry = operators.setdefault(current["operator"], {"points": [], "trend": None})
            entry.update(
                operator=current["operator"],
                name=current["name"],
                store=current["store"],
                size_in=current["size_in"],
                current=current,
            )
        for index, trend in state_facts.trends(pipeline.pk, now, hours).items():
            if index in operators:
                operators[index]["trend"] = trend.as_dict()
        return Response(
            {
                "since": since,
                "hours": hours,
                "operators": [operators[i] for i in sorted(operators)],
            }
        )

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"], url_path="writer-schemas")
    def writer_schemas(self, request, name: str | None = None) -> Response:
        """A schema-registry source's subject, the reader's version (resolved when the spec
        was saved), and each writer schema seen in its topics, most recently seen first: its
        id, subject and version, how it compares to the reader, when it was first and last
        seen (`appeared_at`: when it turned up while the topics were already watched),
        and how many sampled records carried it. The metrics collector samples the newest
        records of each partition every `sample_seconds`. 404 for a pipeline whose source
        reads no schema registry."""
        pipeline = self.get_object()
        found = writer_schemas.page(pipeline, timezone.now())
        if found is None:
            return Response(
                {"detail": f"pipeline {pipeline.name!r} reads no schema registry"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(found)

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    @action(detail=True, methods=["get"])
    def checkpoints(self, request, name: str | None = None) -> Response:
        """The checkpoint: last committed batch, its offsets, batches in flight, size, the
        recent batches (WAL entry to commit times) and the state operators' rows, memory and
        watermark. Read from disk where the control plane can (`"source": "checkpoint"`),
        else from the drivers' progress reports (`"source": "progress"`)."""
        pipeline = self.get_object()
        page = metrics.checkpoint_page(pipeline)
        if page is None:
            return Response(
                {
                    "detail": f"pipeline {pipeline.name!r} has no checkpoint the control plane"
                    " can read and no progress reports (never started?)"
                },
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(page)

    @extend_schema(responses=PipelineVersionSerializer(many=True))
    @action(detail=True, methods=["get"], serializer_class=PipelineVersionSerializer)
    def versions(self, request, name: str | None = None) -> Response:
        """Every spec this pipeline has had, newest first."""
        pipeline = self.get_object()
        page = self.paginate_queryset(pipeline.versions.select_related("created_by"))
        return self.get_paginated_response(PipelineVersionSerializer(page, many=True).data)

    @extend_schema(responses=PipelineVersionSerializer)
    @action(
        detail=True,
        methods=["get"],
        url_path=r"versions/(?P<version>\d+)",
        serializer_class=PipelineVersionSerializer,
    )
    def version(self, request, name: str | None = None, version: str = "") -> Response:
        """One past (or the current) spec."""
        pipeline = self.get_object()
        row = pipeline.versions.filter(version=int(version)).first()
        if row is None:
            return Response(
                {"detail": f"pipeline {pipeline.name!r} has no version {version}"},
                status=status.HTTP_404_NOT_FOUND,
            )
        return Response(PipelineVersionSerializer(row).data)


def _since(request):
    raw = request.query_params.get("since")
    since = parse_datetime(raw) if raw else timezone.now() - timedelta(hours=1)
    if since is None or since.tzinfo is None:
        raise ValidationError(
            {"since": [f"must be an ISO 8601 time with a UTC offset; got {raw!r}"]}
        )
    return since


def _hours(request) -> float:
    raw = request.query_params.get("hours")
    if raw is None:
        return state_facts.DEFAULT_HOURS
    longest = settings.CONTROLPLANE_PROGRESS_ROLLUP_DAYS * 24
    try:
        hours = float(raw)
    except ValueError:
        hours = None
    if hours is None or not 0 < hours <= longest:
        raise ValidationError(
            {"hours": [f"must be a number of hours above 0, at most {longest:g}"]}
        )
    return hours


class AuditViewSet(viewsets.ReadOnlyModelViewSet):
    """The audit log, newest first: on-call actions and definition changes of pipelines,
    changes and tests of connections, and changes and controls of shared Spark applications.
    Filter with `?pipeline=<name>`, `?connection=<name>`, `?application=<name>` and
    `?actor=<username>`."""

    serializer_class = AuditEntrySerializer

    def get_queryset(self):
        entries = AuditEntry.objects.all()
        if pipeline := self.request.query_params.get("pipeline"):
            entries = entries.filter(pipeline_name=pipeline)
        if connection := self.request.query_params.get("connection"):
            entries = entries.filter(connection_name=connection)
        if application := self.request.query_params.get("application"):
            entries = entries.filter(application_name=application)
        if actor := self.request.query_params.get("actor"):
            entries = entries.filter(actor_name=actor)
        return entries
