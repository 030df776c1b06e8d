from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerSplitView
from rest_framework.routers import DefaultRouter

from controlplane.api.alerting import AlertChannelViewSet, AlertRuleViewSet, AlertViewSet
from controlplane.api.applications import ApplicationViewSet
from controlplane.api.connections import ConnectionViewSet
from controlplane.api.hosts import HostList
from controlplane.api.pipelines import AuditViewSet, PipelineViewSet
from controlplane.api.prometheus import prometheus_metrics
from controlplane.api.reports import (
    ApplicationExit,
    ApplicationReports,
    RunExit,
    RunHeartbeat,
    RunProgress,
)
from controlplane.fleet.views import Apply, Export, Fleet, Schema

router = DefaultRouter()
router.register("connections", ConnectionViewSet, basename="connection")
router.register("pipelines", PipelineViewSet, basename="pipeline")
router.register("applications", ApplicationViewSet, basename="application")
router.register("audit", AuditViewSet, basename="audit")
router.register("alert-channels", AlertChannelViewSet, basename="alert-channel")
router.register("alert-rules", AlertRuleViewSet, basename="alert-rule")
router.register("alerts", AlertViewSet, basename="alert")

api_patterns = [
    path("schema/", SpectacularAPIView.as_view(), name="schema"),
    path(
        "schema/swagger-ui/",
        SpectacularSwaggerSplitView.as_view(url_name="api:schema"),
        name="swagger-ui",
    ),
    path("hosts/", HostList.as_view(), name="hosts"),
    path("apply/", Apply.as_view(), name="apply"),
    path("export/", Export.as_view(), name="export"),
    path("fleet/", Fleet.as_view(), name="fleet"),
    path("fleet/schema/", Schema.as_view(), name="fleet-schema"),
    path("runs/<int:run_id>/heartbeat/", RunHeartbeat.as_view(), name="run-heartbeat"),
    path("runs/<int:run_id>/progress/", RunProgress.as_view(), name="run-progress"),
    path("runs/<int:run_id>/exit/", RunExit.as_view(), name="run-exit"),
    path("applications/<str:name>/exit/", ApplicationExit.as_view(), name="application-exit"),
    path(
        "applications/<str:name>/reports/",
        ApplicationReports.as_view(),
        name="application-reports",
    ),
    *router.urls,
]

urlpatterns = [
    path("login/", auth_views.LoginView.as_view(), name="login"),
    path("logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("api/", include((api_patterns, "api"))),
    path("metrics", prometheus_metrics, name="prometheus"),
    path("", include("controlplane.pages.urls")),
]
