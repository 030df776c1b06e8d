"""Named Kafka clusters, Postgres targets and file system roots, referenced by name from
pipeline specs."""

from __future__ import annotations

from django.core.validators import RegexValidator
from django.db import models

from controlplane.crypto import decrypt_json, encrypt_json
from jobs.connections import SECRET_FIELDS

NAME_VALIDATOR = RegexValidator(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    "use lower-case letters, digits and hyphens (1-63 characters, no leading or trailing hyphen)",
)


class ConnectionKind(models.TextChoices):
    KAFKA = "kafka", "Kafka cluster"
    POSTGRES = "postgres", "PostgreSQL database"
    FILES = "files", "File system (local or Hadoop)"
    CASSANDRA = "cassandra", "Apache Cassandra cluster"
    SCHEMA_REGISTRY = "schema-registry", "Schema registry (Confluent API)"


class Connection(models.Model):
    """Where a pipeline reads from or writes to. Secrets are stored encrypted, never shown."""

    name = models.CharField(max_length=63, unique=True, validators=[NAME_VALIDATOR])
    kind = models.CharField(max_length=16, choices=ConnectionKind.choices)
    description = models.TextField(blank=True)
    settings = models.JSONField(default=dict, help_text="Non-secret settings (shown).")
    secrets_encrypted = models.TextField(blank=True, default="", editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    # Columns holding crypto tokens: `manage.py rotate_secrets_key` re-encrypts every model's.
    ENCRYPTED_FIELDS = ("secrets_encrypted",)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name

    def __repr__(self) -> str:  # never include secrets, even by accident in a traceback
        return f"<Connection {self.name} ({self.kind})>"

    def get_secrets(self) -> dict[str, str]:
        return decrypt_json(self.secrets_encrypted)

    def set_secrets(self, secrets: dict[str, str]) -> None:
        allowed = SECRET_FIELDS.get(self.kind, set())
        self.secrets_encrypted = encrypt_json({k: v for k, v in secrets.items() if k in allowed})

    @property
    def secret_fields(self) -> list[str]:
        """The names (never the values) of the secrets that are set."""
        if not self.secrets_encrypted:
            return []
        return sorted(self.get_secrets())
