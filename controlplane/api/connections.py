from __future__ import annotations

from django.conf import settings
from django.db import transaction
from django.db.models import ProtectedError
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR
from controlplane.connections.directories import RootInUse, files_roots
from controlplane.connections.models import Connection
from controlplane.connections.probe import probe
from controlplane.connections.serializers import ConnectionSerializer
from controlplane.definitions import audit
from jobs.connections import CONNECTION_KINDS

ProbeResultSerializer = inline_serializer(
    "ConnectionTestResult",
    {
        "ok": serializers.BooleanField(),
        "latency_ms": serializers.FloatField(),
        "detail": serializers.CharField(),
        "topics": serializers.ListField(child=serializers.CharField(), required=False),
        "server_version": serializers.CharField(required=False),
    },
)


ROOT_IN_USE = (
    "A files connection's new root would make its pipelines write where other pipelines do"
    " (or into the control plane's own directories): nothing was saved."
)


def _root_in_use(conflict: RootInUse) -> Response:
    return Response(
        {
            "detail": conflict.message,
            "pipelines": conflict.pipelines,
            "conflicts": conflict.conflicts,
        },
        status=status.HTTP_409_CONFLICT,
    )


def save_connection(serializer: ConnectionSerializer, *, user, reason: str = "") -> Connection:
    """Create or change a connection from a validated serializer, audited, in one
    transaction; a files connection's change under every files connection's lock. Raises
    RootInUse (a files root moved onto other pipelines' directories since validation)."""
    with transaction.atomic():
        if serializer.instance is None:
            connection = serializer.save()
            audit.record_connection_saved(
                connection, user=user, before={}, created=True, reason=reason
            )
            return connection
        if CONNECTION_KINDS[serializer.instance.kind].holds_directories:
            # Every files connection, in name order, before this one alone: the order
            # pipeline saves take them in (controlplane.connections.directories).
            files_roots(lock=True)
        before = audit.connection_snapshot(
            Connection.objects.select_for_update().get(pk=serializer.instance.pk)
        )
        connection = serializer.save()
        audit.record_connection_saved(
            connection,
            user=user,
            before=before,
            created=False,
            dropped=serializer.secrets_dropped,
            reason=reason,
        )
        return connection


def delete_connection(connection: Connection, *, user, reason: str = "") -> None:
    """Delete it, audited; raises ProtectedError while pipelines use it."""
    with transaction.atomic():
        audit.record_connection(
            connection.name,
            "connection-delete",
            user=user,
            before=audit.connection_snapshot(connection),
            after={},
            reason=reason,
        )
        connection.delete()


class ConnectionViewSet(viewsets.ModelViewSet):
    """Kafka clusters, Postgres targets and file system roots. Secrets are write-only."""

    action_roles = {"test": OPERATOR}  # trying a connection changes nothing

    queryset = Connection.objects.all()
    serializer_class = ConnectionSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def perform_create(self, serializer) -> None:
        save_connection(serializer, user=self.request.user)

    @extend_schema(
        responses={200: ConnectionSerializer, 409: OpenApiResponse(description=ROOT_IN_USE)}
    )
    def update(self, request, *args, **kwargs) -> Response:
        """A files connection's root that its pipelines cannot follow (they would write where
        other pipelines do, or into the control plane's own directories) is refused with 409:
        `detail`, the `pipelines` involved and each of the `conflicts`; nothing is saved."""
        partial = kwargs.pop("partial", False)
        serializer = self.get_serializer(self.get_object(), data=request.data, partial=partial)
        if not serializer.is_valid():
            if serializer.root_conflict is not None and set(serializer.errors) == {"settings.root"}:
                return _root_in_use(serializer.root_conflict)
            raise ValidationError(serializer.errors)
        try:
            self.perform_update(serializer)
        except RootInUse as exc:  # moved onto a pipeline saved since validation
            return _root_in_use(exc)
        return Response(serializer.data)

    @extend_schema(
        responses={200: ConnectionSerializer, 409: OpenApiResponse(description=ROOT_IN_USE)}
    )
    def partial_update(self, request, *args, **kwargs) -> Response:
        return super().partial_update(request, *args, **kwargs)

    def perform_update(self, serializer) -> None:
        save_connection(serializer, user=self.request.user)

    def destroy(self, request, *args, **kwargs) -> Response:
        connection = self.get_object()
        try:
            delete_connection(connection, user=request.user)
        except ProtectedError:
            users = ", ".join(sorted(connection.pipelines.values_list("name", flat=True)))
            return Response(
                {"detail": f"connection {connection.name!r} is used by pipelines: {users}"},
                status=status.HTTP_409_CONFLICT,
            )
        return Response(status=status.HTTP_204_NO_CONTENT)

    @extend_schema(request=None, responses={200: OpenApiResponse(ProbeResultSerializer)})
    @action(detail=True, methods=["post"])
    def test(self, request, name: str | None = None) -> Response:
        """Really connect: list the cluster's topics, or run `SELECT 1`; for a files
        connection, check that a local root is a writable directory (other roots are not
        probed from the control plane).

        Answers 200 with `ok: false` and the reason when the target cannot be reached.
        """
        connection = self.get_object()
        result = probe(connection, settings.CONTROLPLANE_CONNECTION_TEST_TIMEOUT)
        audit.record_connection(
            connection.name,
            "connection-test",
            user=request.user,
            before={},
            after={"ok": result.ok, "detail": result.detail},
        )
        return Response(result.as_dict())
