from django.urls import path

from . import pages, prometheus

urlpatterns = [
    path("", pages.home, name="home"),
    path("pipelines/rows", pages.overview_rows, name="overview-rows"),
    path("healthz", pages.healthz, name="healthz"),
    path("metrics", prometheus.prometheus_metrics, name="prometheus"),
]
