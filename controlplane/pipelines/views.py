from __future__ import annotations

from typing import Any

from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from controlplane.api.fields import flatten_spec_error
from jobs.spec import SpecError

from . import services, tasks
from .models import DesiredState, Pipeline, Status
from .serializers import PipelineSerializer, PipelineVersionSerializer


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

    queryset = Pipeline.objects.all()
    serializer_class = PipelineSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def perform_create(self, serializer: PipelineSerializer) -> None:
        data = serializer.validated_data
        try:
            serializer.instance = services.create_pipeline(
                name=data["name"],
                spec_data=data["spec"],
                description=data.get("description", ""),
                desired_state=data.get("desired_state", "stopped"),
                user=self.request.user,
            )
        except SpecError as exc:
            raise ValidationError(flatten_spec_error(exc, "spec.")) from None
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
            )
        except SpecError as exc:
            raise ValidationError(flatten_spec_error(exc, "spec.")) from None
        except services.Conflict as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(pipeline).data)

    def destroy(self, request, *args, **kwargs) -> Response:
        pipeline = self.get_object()
        if pipeline.desired_state == "running" or pipeline.status not in Status.terminal():
            return Response(
                {
                    "detail": f"pipeline {pipeline.name!r} is {pipeline.status} (desired "
                    f"{pipeline.desired_state}); stop it before deleting it"
                },
                status=status.HTTP_409_CONFLICT,
            )
        pipeline.delete()
        return Response(status=status.HTTP_204_NO_CONTENT)

    def _set_desired(self, request, desired: str) -> Response:
        pipeline = self.get_object()
        changes = {
            "desired_state": desired,
            "updated_by": request.user,
            "updated_at": timezone.now(),
        }
        if desired == DesiredState.RUNNING and (
            pipeline.desired_state != DesiredState.RUNNING
            or pipeline.status in (Status.FAILED, Status.BACKING_OFF)
        ):
            # A start by hand: the restart policy counts failures from here on, and a failed
            # or backing-off pipeline is launched at once.
            changes.update(restarts_since=timezone.now(), attempt=0, next_attempt_at=None)
            if pipeline.status in (Status.FAILED, Status.BACKING_OFF):
                changes["status"] = Status.STOPPED
        Pipeline.objects.filter(pk=pipeline.pk).update(**changes)
        # The beat tick would get there too; this only saves the operator a few seconds.
        transaction.on_commit(lambda: tasks.reconcile_pipeline.delay(pipeline.pk))
        pipeline.refresh_from_db()
        return Response(self.get_serializer(pipeline).data, status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=None, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def start(self, request, name: str | None = None) -> Response:
        """Desire the pipeline running; the reconciler launches its driver."""
        return self._set_desired(request, DesiredState.RUNNING)

    @extend_schema(request=None, responses={202: PipelineSerializer})
    @action(detail=True, methods=["post"])
    def stop(self, request, name: str | None = None) -> Response:
        """Desire the pipeline stopped: the batch in flight finishes, then the driver exits."""
        return self._set_desired(request, DesiredState.STOPPED)

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
