"""Definitions as code over the API: plan and apply a fleet's files (POST /api/apply/),
export objects as files (GET /api/export/), and the managed objects with their drift
(GET /api/fleet/). docs/definitions-as-code.md."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.accounts.roles import EDITOR
from controlplane.definitions.models import ManagedObject
from controlplane.redaction import without_credentials

from . import apply, documents, drift, export
from .kinds import ORDER
from .schema import document_schema

MAX_FILES = 5000


class ApplySerializer(serializers.Serializer):
    fleet = serializers.RegexField(
        documents.NAME_RE.pattern,
        max_length=63,
        help_text="The fleet these files are: its objects are the ones `prune` may delete.",
    )
    files = serializers.DictField(
        child=serializers.CharField(allow_blank=True, trim_whitespace=False),
        allow_empty=True,
        help_text="{path: YAML text}: the fleet's files, as in its repository.",
    )
    environment = serializers.CharField(
        required=False, allow_null=True, max_length=63, help_text="The Environment to read for."
    )
    dry_run = serializers.BooleanField(
        default=True, help_text="Plan only (the default): what an apply would do, nothing written."
    )
    prune = serializers.BooleanField(
        default=False, help_text="Delete the fleet's objects its files no longer define."
    )
    restart = serializers.BooleanField(
        default=True, help_text="Restart running pipelines whose spec changes (gracefully)."
    )
    preflight = serializers.BooleanField(
        default=True,
        help_text="Preflight each pipeline created or changed (CONTROLPLANE_PREFLIGHT not off).",
    )
    force = serializers.BooleanField(
        default=False, help_text="Restart pipelines even though their preflight finds errors."
    )
    repository = serializers.CharField(
        required=False, allow_blank=True, max_length=500, help_text="Where the files are kept."
    )
    commit = serializers.CharField(
        required=False, allow_blank=True, max_length=100, help_text="The files' revision."
    )

    def validate_repository(self, value: str) -> str:
        return without_credentials(value)  # a CI job's remote may carry its token

    def validate_files(self, value: dict) -> dict:
        if len(value) > MAX_FILES:
            raise serializers.ValidationError(f"at most {MAX_FILES:,} files")
        for path in value:
            if not path or len(path) > 500 or "\x00" in path:
                raise serializers.ValidationError(f"{path[:80]!r} is not a file's path")
        return value


class Apply(APIView):
    """Plan (`dry_run`, the default) or apply a fleet's files. Answers the plan: per object
    `create`, `update` (its `changes`, which `secrets_changed`, whether it will `restart`
    and take a `restore_point` first, its `preflight`), `unchanged`, `delete` (only with
    `prune`, only this fleet's objects), `left` (no longer in the files, kept without prune)
    or `refused` (its `errors`, each with its path), with its file and document; `drifted`
    when it changed since the last apply. 400 when anything is refused (nothing applied),
    409 when another apply held the lock for CONTROLPLANE_FLEET_LOCK_SECONDS."""

    write_role = EDITOR

    @extend_schema(
        request=ApplySerializer,
        responses={
            200: OpenApiTypes.OBJECT,
            400: OpenApiTypes.OBJECT,
            409: OpenApiResponse(description="another apply is in progress"),
        },
    )
    def post(self, request) -> Response:
        body = ApplySerializer(data=request.data)
        body.is_valid(raise_exception=True)
        data = body.validated_data
        req = apply.Request(
            fleet=data["fleet"],
            files=data["files"],
            environment=data.get("environment") or None,
            dry_run=data["dry_run"],
            prune=data["prune"],
            restart=data["restart"],
            preflight=data["preflight"],
            force=data["force"],
            repository=data.get("repository", ""),
            commit=data.get("commit", ""),
        )
        try:
            result = apply.run(req, user=request.user, now=timezone.now())
        except apply.Busy as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        code = status.HTTP_400_BAD_REQUEST if result.refused else status.HTTP_200_OK
        return Response(result.as_dict(), status=code)


def _kinds(request) -> list[str] | None:
    kinds = request.query_params.getlist("kind")
    unknown = sorted(set(kinds) - set(ORDER))
    if unknown:
        raise ValidationError({"kind": [f"{unknown[0]!r} is not one of {', '.join(ORDER)}"]})
    return kinds or None


class Export(APIView):
    """The objects as a fleet's files, one per object (`pipelines/orders.yaml`): all of
    them, a fleet's (`?fleet=`), or some kinds' (`?kind=`, repeatable). Applying them plans
    `unchanged` everywhere. `notes` name the environment variables that secrets set
    outside files are written as references to."""

    @extend_schema(
        parameters=[
            OpenApiParameter("fleet", str, description="Only this fleet's objects."),
            OpenApiParameter("kind", str, many=True, enum=list(ORDER)),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request) -> Response:
        fleet = request.query_params.get("fleet") or None
        files, notes = export.export(fleet=fleet, kinds=_kinds(request))
        return Response({"files": files, "notes": notes})


class Fleet(APIView):
    """The objects fleets manage: fleet, source (repository, commit, path), when and by whom
    last applied, and drift now (`drifted`: what differs from what the apply left; since
    `drifted_at`, as the periodic check first saw it). `?fleet=`, `?kind=`,
    `?drifted=true`."""

    @extend_schema(
        parameters=[
            OpenApiParameter("fleet", str),
            OpenApiParameter("kind", str, many=True, enum=list(ORDER)),
            OpenApiParameter("drifted", bool),
        ],
        responses={200: OpenApiTypes.OBJECT},
    )
    def get(self, request) -> Response:
        rows = ManagedObject.objects.select_related("applied_by")
        if fleet := request.query_params.get("fleet"):
            rows = rows.filter(fleet=fleet)
        if kinds := _kinds(request):
            rows = rows.filter(kind__in=kinds)
        only_drifted = request.query_params.get("drifted", "").lower() == "true"
        out = []
        for seen in drift.survey(list(rows)):
            if only_drifted and not seen.changes:
                continue
            row = seen.row
            out.append(
                {
                    "kind": row.kind,
                    "name": row.name,
                    "fleet": row.fleet,
                    "source": row.source,
                    "applied_at": row.applied_at,
                    "applied_by": row.applied_by.get_username() if row.applied_by else None,
                    "drifted": seen.changes,
                    "drifted_at": row.drifted_at,
                }
            )
        out.sort(key=lambda o: (ORDER.index(o["kind"]), o["name"]))
        return Response({"count": len(out), "results": out})


class Schema(APIView):
    """The fleet's files as JSON Schema (draft 2020-12), for editors: one document."""

    @extend_schema(responses={200: OpenApiTypes.OBJECT})
    def get(self, request) -> Response:
        return Response(document_schema())
