"""/metrics: Prometheus' text exposition of what the control plane stored (the metrics
collector's figures, applications: controlplane.observability.prometheus), of its hosts
(controlplane.supervision.hosts.HostFigures) and of its alerts (alerting.engine.AlertFigures).

Scraped with an API token (Prometheus: `authorization: {type: Token, credentials: cpt_...}`).
"""

from __future__ import annotations

from django.http import HttpResponse
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from rest_framework.decorators import api_view, renderer_classes
from rest_framework.renderers import BaseRenderer

from controlplane.alerting.engine import AlertFigures
from controlplane.observability.prometheus import exposition
from controlplane.supervision.hosts import HostFigures


class PrometheusRenderer(BaseRenderer):
    media_type = "text/plain"
    format = "prometheus"

    def render(self, data, accepted_media_type=None, renderer_context=None):
        return data if isinstance(data, bytes | str) else str(data)


@extend_schema(exclude=True)  # Prometheus' text format, not part of the JSON API
@api_view(["GET"])
@renderer_classes([PrometheusRenderer])
def prometheus_metrics(request) -> HttpResponse:
    now = timezone.now()
    return HttpResponse(
        exposition(now, HostFigures(now), AlertFigures()), content_type=CONTENT_TYPE_PLAIN_0_0_4
    )
