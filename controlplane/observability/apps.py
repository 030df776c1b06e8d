from django.apps import AppConfig


class ObservabilityConfig(AppConfig):
    """Checkpoint progress, Kafka lag, backpressure, Prometheus, progress retention. No
    models of its own (they are the definitions app's); an app for its Celery tasks."""

    name = "controlplane.observability"
    label = "observability"
    verbose_name = "Observability"
