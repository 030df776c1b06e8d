from django.apps import AppConfig


class DefinitionsConfig(AppConfig):
    """Pipeline definitions and every record the other concerns keep about a pipeline (its
    runs, failures, progress, audit). The label stays "pipelines": the tables and migrations
    were made under it, and no model moved to another app."""

    name = "controlplane.definitions"
    label = "pipelines"
    verbose_name = "Pipelines"
