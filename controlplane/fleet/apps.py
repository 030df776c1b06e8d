from django.apps import AppConfig


class FleetConfig(AppConfig):
    """Definitions as code (no models of its own: definitions.ManagedObject records what it
    manages); an app so that Celery finds its periodic drift check."""

    name = "controlplane.fleet"
    label = "fleet"
    verbose_name = "Definitions as code"
