from __future__ import annotations

from django.db import transaction
from rest_framework import serializers

from jobs.connections import CONNECTION_KINDS
from jobs.spec import SpecError

from .directories import RootInUse, root_change_conflicts
from .models import Connection, ConnectionKind
from .policy import clean_connection


class ConnectionSerializer(serializers.ModelSerializer):
    """A connection as the API shows it: settings visible, secrets write-only.

    On update, `secrets` is merged: omitted keys keep their stored value, a key set to null
    is removed, and a change of endpoint (host, port, database, user, brokers, security
    protocol, TLS trust) drops the stored ones unless new ones come with it. A Postgres DSN's
    password is moved into the secrets.
    """

    secrets_dropped: tuple[str, ...] = ()
    # Set when the only trouble is a files root its pipelines cannot follow: the API answers
    # 409 with it (a conflict with stored pipelines, not a malformed request).
    root_conflict: RootInUse | None = None

    kind = serializers.ChoiceField(choices=ConnectionKind.choices)
    settings = serializers.JSONField()
    secrets = serializers.JSONField(
        write_only=True,
        required=False,
        help_text="Passwords (kafka: sasl_password, ssl_password; postgres: password; files: "
        "none, the cluster's Hadoop configuration gives any credentials). Never returned.",
    )
    secret_fields = serializers.ListField(
        child=serializers.CharField(), read_only=True, help_text="Which secrets are set."
    )
    url = serializers.HyperlinkedIdentityField(
        view_name="api:connection-detail", lookup_field="name"
    )

    class Meta:
        model = Connection
        fields = [
            "url",
            "name",
            "kind",
            "description",
            "settings",
            "secrets",
            "secret_fields",
            "created_at",
            "updated_at",
        ]
        read_only_fields = ["created_at", "updated_at"]

    def validate_name(self, value: str) -> str:
        if self.instance is not None and value != self.instance.name:
            raise serializers.ValidationError(
                "a connection cannot be renamed (pipelines refer to it by name)"
            )
        return value

    def validate_kind(self, value: str) -> str:
        if self.instance is not None and value != self.instance.kind:
            raise serializers.ValidationError("the kind of a connection cannot change")
        return value

    def to_internal_value(self, data):
        # Field errors (a bad name) and settings errors are reported together, so a client
        # sees every problem in one answer rather than one round trip each.
        try:
            attrs = super().to_internal_value(data)
        except serializers.ValidationError as exc:
            errors = dict(exc.detail)
            kind = data.get("kind") if hasattr(data, "get") else None
            if kind in ConnectionKind.values and "settings" not in errors:
                try:
                    self._clean_settings(kind, data.get("settings"), data.get("secrets"))
                except serializers.ValidationError as more:
                    errors.update(more.detail)
            raise serializers.ValidationError(errors) from None
        return attrs

    def validate(self, attrs: dict) -> dict:
        kind = attrs.get("kind", getattr(self.instance, "kind", None))
        settings = attrs.get("settings", getattr(self.instance, "settings", None))
        attrs["settings"], attrs["secrets"] = self._clean_settings(
            kind, settings, attrs.get("secrets") if "secrets" in attrs else None
        )
        return attrs

    def _clean_settings(self, kind: str, settings, submitted) -> tuple[dict, dict]:
        if submitted is not None and not isinstance(submitted, dict):
            raise serializers.ValidationError({"secrets": "must be an object"})
        try:
            cleaned = clean_connection(
                kind,
                settings,
                submitted,
                stored_settings=self.instance.settings if self.instance is not None else None,
                stored_secrets=self.instance.get_secrets() if self.instance is not None else None,
                connection=self.instance,
            )
        except SpecError as exc:
            if isinstance(exc, RootInUse):
                self.root_conflict = exc
            raise serializers.ValidationError(exc.as_dict()) from None
        self.secrets_dropped = cleaned.dropped
        return cleaned.settings, cleaned.secrets

    def create(self, validated_data: dict) -> Connection:
        secrets = validated_data.pop("secrets", {})
        connection = Connection(**validated_data)
        connection.set_secrets(secrets)
        connection.save()
        return connection

    def update(self, instance: Connection, validated_data: dict) -> Connection:
        """Raises RootInUse if a files root moved onto other pipelines' directories since it
        was validated (checked again here with every files connection locked, as pipeline
        saves lock them, so the two cannot cross)."""
        secrets = validated_data.pop("secrets", None)
        with transaction.atomic():
            root = (validated_data.get("settings") or {}).get("root")
            if CONNECTION_KINDS[instance.kind].holds_directories and root:
                conflict = root_change_conflicts(instance, root, lock=True)
                if conflict is not None:
                    self.root_conflict = conflict
                    raise conflict
            for key, value in validated_data.items():
                setattr(instance, key, value)
            if secrets is not None:
                instance.set_secrets(secrets)
            instance.save()
        return instance
