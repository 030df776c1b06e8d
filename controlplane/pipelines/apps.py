from django.apps import AppConfig


class PipelinesConfig(AppConfig):
    name = "controlplane.pipelines"
    label = "pipelines"
    verbose_name = "Pipelines"
