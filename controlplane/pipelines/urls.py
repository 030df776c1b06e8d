from django.urls import path

from . import pages, prometheus

urlpatterns = [
    path("", pages.home, name="home"),
    path("pipelines/rows", pages.overview_rows, name="overview-rows"),
    path("audit/", pages.audit_log, name="audit"),
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
