from django.apps import AppConfig


class ConnectionsConfig(AppConfig):
    name = "controlplane.connections"
    label = "connections"
    verbose_name = "Connections"
