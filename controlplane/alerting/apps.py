from django.apps import AppConfig


class AlertingConfig(AppConfig):
    name = "controlplane.alerting"
    label = "alerting"
    verbose_name = "Alerting"
    default_auto_field = "django.db.models.BigAutoField"
