from django.urls import path

from . import alerts, applications, dead_letters, editing, views

urlpatterns = [
    path("", views.home, name="home"),
    path("pipelines/rows", views.overview_rows, name="overview-rows"),
    path("audit/", views.audit_log, name="audit"),
    path("new/pipeline", editing.pipeline_new, name="pipeline-new"),
    path("new/connection", editing.connection_new, name="connection-new"),
    path("connections/", editing.connection_list, name="connections"),
    path("connections/<slug:name>/edit", editing.connection_edit, name="connection-edit"),
    path("pipelines/<slug:name>/edit", editing.pipeline_edit, name="pipeline-edit"),
    path("pipelines/<slug:name>/", views.pipeline_page, name="pipeline"),
    path("pipelines/<slug:name>/status", views.pipeline_status, name="pipeline-status"),
    path("pipelines/<slug:name>/now", views.pipeline_now, name="pipeline-now"),
    path("pipelines/<slug:name>/diff", views.pipeline_diff, name="pipeline-diff"),
    path("pipelines/<slug:name>/rollback", views.pipeline_rollback, name="pipeline-rollback"),
    path(
        "pipelines/<slug:name>/restore-points",
        views.restore_point_take,
        name="pipeline-restore-point-take",
    ),
    path(
        "pipelines/<slug:name>/restore-points/<int:point>/delete",
        views.restore_point_delete,
        name="pipeline-restore-point-delete",
    ),
    path("pipelines/<slug:name>/restore", views.pipeline_restore, name="pipeline-restore"),
    path(
        "pipelines/<slug:name>/offsets/reset",
        views.pipeline_offsets_reset,
        name="pipeline-offsets-reset",
    ),
    path(
        "pipelines/<slug:name>/dead-letters",
        dead_letters.dead_letter_list,
        name="pipeline-dead-letters",
    ),
    path(
        "pipelines/<slug:name>/dead-letters/redrive",
        dead_letters.dead_letter_redrive,
        name="pipeline-dead-letters-redrive",
    ),
    path(
        "pipelines/<slug:name>/control/<slug:action>",
        views.pipeline_control,
        name="pipeline-control",
    ),
    path("applications/", applications.application_list, name="applications"),
    path("applications/<slug:name>/", applications.application_page, name="application"),
    path(
        "applications/<slug:name>/control/<slug:action>",
        applications.application_control,
        name="application-control",
    ),
    path("alerts/", alerts.alert_list, name="alerts"),
    path("alerts/<int:alert_id>/acknowledge", alerts.alert_acknowledge, name="alert-acknowledge"),
    path("alerts/rules/<slug:name>/silence", alerts.rule_silence, name="alert-rule-silence"),
    path("healthz", views.healthz, name="healthz"),
]
