from django.apps import AppConfig


class SupervisionConfig(AppConfig):
    """Runs: the reconciler, the launcher, on-call controls, restart policies. No models of
    its own (they are the definitions app's); an app for its Celery tasks and commands."""

    name = "controlplane.supervision"
    label = "supervision"
    verbose_name = "Supervision"
