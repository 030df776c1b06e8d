from django.apps import AppConfig


class SupervisionConfig(AppConfig):
    """Runs: the reconciler, the launcher, on-call controls, restart policies. No models of
    its own (they are the definitions app's); an app for its Celery tasks and commands."""

    name = "controlplane.supervision"
    label = "supervision"
    verbose_name = "Supervision"

    def ready(self) -> None:
        from controlplane.definitions.services import pipeline_deleted

        from .restore_points import after_delete

        pipeline_deleted.connect(after_delete, dispatch_uid="restore-points-after-delete")
