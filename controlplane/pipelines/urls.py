from django.urls import path

from . import editing, pages, prometheus

urlpatterns = [
    path("", pages.home, name="home"),
    path("pipelines/rows", pages.overview_rows, name="overview-rows"),
    path("audit/", pages.audit_log, name="audit"),
    path("new/pipeline", editing.pipeline_new, name="pipeline-new"),
    path("new/connection", editing.connection_new, name="connection-new"),
    path("connections/", editing.connection_list, name="connections"),
    path("connections/<slug:name>/edit", editing.connection_edit, name="connection-edit"),
    path("pipelines/<slug:name>/edit", editing.pipeline_edit, name="pipeline-edit"),
    path("pipelines/<slug:name>/", pages.pipeline_page, name="pipeline"),
    path("pipelines/<slug:name>/status", pages.pipeline_status, name="pipeline-status"),
    path("pipelines/<slug:name>/diff", pages.pipeline_diff, name="pipeline-diff"),
    path(
        "pipelines/<slug:name>/control/<slug:action>",
        pages.pipeline_control,
        name="pipeline-control",
    ),
    path("healthz", pages.healthz, name="healthz"),
    path("metrics", prometheus.prometheus_metrics, name="prometheus"),
]
