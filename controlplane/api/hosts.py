"""Control-plane hosts: who is alive and how many driver processes each runs (read only)."""

from __future__ import annotations

from django.utils import timezone
from drf_spectacular.utils import extend_schema, inline_serializer
from rest_framework import serializers
from rest_framework.response import Response
from rest_framework.views import APIView

from controlplane.supervision import hosts

HostSerializer = inline_serializer(
    "Host",
    {
        "name": serializers.CharField(),
        "state": serializers.ChoiceField(choices=["up", "lost"]),
        "capacity": serializers.IntegerField(help_text="Driver processes it takes."),
        "drivers": serializers.IntegerField(help_text="Driver processes placed on it now."),
        "seen_at": serializers.DateTimeField(allow_null=True),
        "heartbeat_age_seconds": serializers.FloatField(allow_null=True),
        "lost_at": serializers.DateTimeField(allow_null=True),
    },
    many=True,
)


class HostList(APIView):
    """Every control-plane host whose worker was ever heard: `up` while its worker says so,
    `lost` once silent for CONTROLPLANE_HOST_TIMEOUT (its runs then start elsewhere)."""

    @extend_schema(responses={200: HostSerializer})
    def get(self, request) -> Response:
        return Response(hosts.overview(timezone.now()))
