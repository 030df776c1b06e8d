from __future__ import annotations

from django.conf import settings
from django.db.models import ProtectedError
from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.roles import OPERATOR

from .models import Connection
from .probe import probe
from .serializers import ConnectionSerializer

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


class ConnectionViewSet(viewsets.ModelViewSet):
    """Kafka clusters and Postgres targets. Secrets are write-only."""

    action_roles = {"test": OPERATOR}  # trying a connection changes nothing

    queryset = Connection.objects.all()
    serializer_class = ConnectionSerializer
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def destroy(self, request, *args, **kwargs) -> Response:
        connection = self.get_object()
        try:
            connection.delete()
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
        """Really connect: list the cluster's topics, or run `SELECT 1`.

        Answers 200 with `ok: false` and the reason when the target cannot be reached.
        """
        result = probe(self.get_object(), settings.CONTROLPLANE_CONNECTION_TEST_TIMEOUT)
        return Response(result.as_dict())
