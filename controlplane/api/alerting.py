"""Alerting over the API: channels (admins), rules (editors define them; operators silence
them), alerts (everyone reads them, with every delivery attempt; operators acknowledge
them). Every change is audited."""

from __future__ import annotations

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from drf_spectacular.utils import extend_schema
from rest_framework import serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from controlplane.accounts.roles import ADMIN, EDITOR, OPERATOR
from controlplane.alerting import actions, audit, rules
from controlplane.alerting.channels import TargetProblem, clean_target
from controlplane.alerting.models import (
    Alert,
    AlertChannel,
    AlertDelivery,
    AlertRule,
    AlertState,
    ChannelKind,
)
from controlplane.definitions import services
from controlplane.definitions.models import Pipeline

from .serializers import ControlSerializer


class AlertChannelSerializer(serializers.ModelSerializer):
    target = serializers.CharField(
        max_length=2000,
        help_text="E-mail: addresses, comma-separated. Webhooks: the URL. Its secret parts (user "
        "info, every query value, a Slack-style path) are write-only: shown masked (`***`, "
        "`•••`); send the masked URL back to keep them, or the full URL to replace them. A "
        "new scheme, host or port needs the full URL.",
    )
    signing_key = serializers.CharField(
        write_only=True, required=False, allow_blank=True, max_length=512,
        help_text="Webhooks: the HMAC-SHA256 key the body is signed with. Never shown.",
    )  # fmt: skip
    has_signing_key = serializers.SerializerMethodField()
    target_has_secrets = serializers.SerializerMethodField(
        help_text="Whether parts of the URL are secret (stored encrypted, masked here)."
    )

    class Meta:
        model = AlertChannel
        fields = [
            "name", "kind", "target", "target_has_secrets", "signing_key", "has_signing_key",
            "created_at",
        ]  # fmt: skip
        read_only_fields = ["created_at"]

    def get_has_signing_key(self, channel: AlertChannel) -> bool:
        return bool(channel.secret_encrypted)

    def get_target_has_secrets(self, channel: AlertChannel) -> bool:
        return bool(channel.url_encrypted)

    def validate(self, data):
        kind = data.get("kind", getattr(self.instance, "kind", None))
        kind_changed = self.instance is not None and kind != self.instance.kind
        if self.instance is None or "target" in data or kind_changed:
            submitted = data.get("target", getattr(self.instance, "target", ""))
            try:
                data["target"] = clean_target(kind, submitted, self.instance)
            except TargetProblem as exc:
                raise serializers.ValidationError({"target": [str(exc)]}) from None
        if data.get("signing_key") and kind != ChannelKind.WEBHOOK:
            raise serializers.ValidationError({"signing_key": ["only webhooks are signed"]})
        return data

    def create(self, data):
        key = data.pop("signing_key", "")
        channel = AlertChannel(**data)
        channel.set_signing_key(key)
        channel.save()  # the URL's secret parts go into url_encrypted (AlertChannel.save)
        return channel

    def update(self, channel, data):
        if "signing_key" in data:
            channel.set_signing_key(data.pop("signing_key"))
        for field, value in data.items():
            setattr(channel, field, value)
        channel.save()
        return channel


def save_channel(serializer: AlertChannelSerializer, *, user, reason: str = "") -> AlertChannel:
    """Create or change a channel from a validated serializer, audited (never its secrets)."""
    with transaction.atomic():
        if serializer.instance is None:
            channel = serializer.save()
            audit.record(
                "alert-channel-create", user=user, before={},
                after=audit.channel_snapshot(channel), reason=reason,
            )  # fmt: skip
            return channel
        before = audit.channel_snapshot(serializer.instance)
        before_url = audit.secret_url(serializer.instance)
        channel = serializer.save()
        audit.record(
            "alert-channel-update", user=user, before=before,
            after=audit.channel_change(before_url, channel), reason=reason,
        )  # fmt: skip
        return channel


def delete_channel(channel: AlertChannel, *, user, reason: str = "") -> None:
    with transaction.atomic():
        audit.record(
            "alert-channel-delete", user=user, before=audit.channel_snapshot(channel), after={},
            reason=reason,
        )  # fmt: skip
        channel.delete()


class AlertChannelViewSet(viewsets.ModelViewSet):
    """Where alerts go: e-mail addresses, a webhook (JSON, signed with HMAC-SHA256 over
    `<timestamp>.<body>`: headers `X-Controlplane-Timestamp`, `X-Controlplane-Signature:
    sha256=<hex>`), or a Slack-compatible webhook. Admins define them. A URL's secret parts
    (user info, query values, a Slack-style path) are write-only: shown masked, stored
    encrypted, kept when the masked URL is sent back to the same scheme, host and port."""

    write_role = ADMIN
    serializer_class = AlertChannelSerializer
    queryset = AlertChannel.objects.all()
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def perform_create(self, serializer):
        save_channel(serializer, user=self.request.user)

    def perform_update(self, serializer):
        save_channel(serializer, user=self.request.user)

    def perform_destroy(self, channel):
        delete_channel(channel, user=self.request.user)


class AlertRuleSerializer(serializers.ModelSerializer):
    pipeline = serializers.SlugRelatedField(
        slug_field="name", queryset=Pipeline.objects.all(), required=False, allow_null=True,
        help_text="One pipeline; empty: every pipeline.",
    )  # fmt: skip
    channels = serializers.SlugRelatedField(
        slug_field="name", queryset=AlertChannel.objects.all(), many=True, required=False
    )
    kind = serializers.ChoiceField(choices=sorted(rules.KINDS))

    class Meta:
        model = AlertRule
        fields = [
            "name", "kind", "params", "pipeline", "label", "for_seconds", "repeat_seconds",
            "channels",
            "enabled", "silenced_until", "silence_reason", "created_at",
        ]  # fmt: skip
        read_only_fields = ["silenced_until", "silence_reason", "created_at"]

    def validate(self, data):
        kind = data.get("kind", getattr(self.instance, "kind", None))
        params = data.get("params", getattr(self.instance, "params", {}))
        if not isinstance(params, dict):
            raise serializers.ValidationError({"params": ["must be an object"]})
        if problem := rules.params_problem(kind, params):
            raise serializers.ValidationError({"params": [problem]})
        if data.get("label"):
            try:
                services.parse_selector(data["label"])
            except services.Invalid as exc:
                raise serializers.ValidationError({"label": [exc.detail]}) from None
        if not rules.KINDS[kind].about_pipelines and data.get("pipeline"):
            raise serializers.ValidationError(
                {"pipeline": ["a control-plane rule is about the control plane, not a pipeline"]}
            )
        return data

    def validate_repeat_seconds(self, value: int) -> int:
        if problem := rules.repeat_problem(value, settings.CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS):
            raise serializers.ValidationError(problem)
        return value


def save_rule(serializer: AlertRuleSerializer, *, user, reason: str = "") -> AlertRule:
    """Create or change a rule from a validated serializer, audited."""
    with transaction.atomic():
        before = audit.rule_snapshot(serializer.instance) if serializer.instance else {}
        created = serializer.instance is None
        rule = serializer.save()
        audit.record(
            "alert-rule-create" if created else "alert-rule-update", user=user, before=before,
            after=audit.rule_snapshot(rule), pipeline=rule.pipeline, reason=reason,
        )  # fmt: skip
        return rule


def delete_rule(rule: AlertRule, *, user, reason: str = "") -> None:
    with transaction.atomic():
        audit.record(
            "alert-rule-delete", user=user, before=audit.rule_snapshot(rule), after={},
            pipeline=rule.pipeline, reason=reason,
        )  # fmt: skip
        rule.delete()


class SilenceSerializer(ControlSerializer):
    minutes = serializers.IntegerField(min_value=1, max_value=60 * 24 * 30)


class AlertRuleViewSet(viewsets.ModelViewSet):
    """When to alert (`kind` with its `params`), for one pipeline or all, after the condition
    held `for_seconds`, again every `repeat_seconds` while it holds (0: never; else at least
    CONTROLPLANE_ALERT_MIN_REPEAT_SECONDS), to which `channels`. Editors define them;
    operators silence them for a while."""

    write_role = EDITOR
    action_roles = {"silence": OPERATOR, "unsilence": OPERATOR}
    serializer_class = AlertRuleSerializer
    queryset = AlertRule.objects.select_related("pipeline").prefetch_related("channels")
    lookup_field = "name"
    lookup_value_regex = "[a-z0-9-]+"

    def perform_create(self, serializer):
        save_rule(serializer, user=self.request.user)

    def perform_update(self, serializer):
        save_rule(serializer, user=self.request.user)

    def perform_destroy(self, rule):
        delete_rule(rule, user=self.request.user)

    @extend_schema(request=SilenceSerializer, responses={200: AlertRuleSerializer})
    @action(detail=True, methods=["post"])
    def silence(self, request, name=None) -> Response:
        """Send nothing for this rule for `minutes` (its alerts still open and resolve)."""
        body = SilenceSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        return self._silence(
            timezone.now() + timedelta(minutes=body.validated_data["minutes"]),
            body.validated_data.get("reason", ""),
        )

    @extend_schema(request=ControlSerializer, responses={200: AlertRuleSerializer})
    @action(detail=True, methods=["post"])
    def unsilence(self, request, name=None) -> Response:
        """End a silence now."""
        body = ControlSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        return self._silence(None, body.validated_data.get("reason", ""))

    def _silence(self, until, reason: str) -> Response:
        rule = actions.silence(self.get_object().pk, until, user=self.request.user, reason=reason)
        return Response(self.get_serializer(rule).data)


class DeliverySerializer(serializers.ModelSerializer):
    channel = serializers.CharField(source="channel.name")
    status = serializers.CharField(
        source="outcome",
        help_text="pending, sent, failed, or suppressed (over the channel's rate limit: not sent)",
    )
    suppressed_before = serializers.IntegerField(
        read_only=True,
        help_text="Messages to the channel suppressed just before this one (it says so).",
    )

    class Meta:
        model = AlertDelivery
        fields = [
            "channel", "event", "status", "attempts", "created_at", "sent_at", "next_try_at",
            "suppressed_before", "last_error",
        ]  # fmt: skip


class AlertSerializer(serializers.ModelSerializer):
    rule = serializers.CharField(source="rule.name")
    kind = serializers.CharField(source="rule.kind")
    acknowledged_by = serializers.SerializerMethodField()
    deliveries = DeliverySerializer(many=True, read_only=True)

    class Meta:
        model = Alert
        fields = [
            "id", "rule", "kind", "subject", "state", "message", "since", "fired_at",
            "notified_at", "repeats", "resolved_at", "acknowledged_at", "acknowledged_by",
            "deliveries",
        ]  # fmt: skip

    def get_acknowledged_by(self, alert: Alert) -> str | None:
        user = alert.acknowledged_by
        return user.get_username() if user else None


class AlertViewSet(viewsets.ReadOnlyModelViewSet):
    """Alerts, newest first, with every delivery attempt. `?state=open` (pending or firing),
    `firing`, `resolved`...; `?pipeline=<name>`. Operators acknowledge a firing alert: no
    more reminders (it still resolves, and says so)."""

    action_roles = {"acknowledge": OPERATOR}
    serializer_class = AlertSerializer

    def get_queryset(self):
        alerts = Alert.objects.select_related("rule", "acknowledged_by").prefetch_related(
            "deliveries__channel"
        )
        state = self.request.query_params.get("state")
        if state == "open":
            alerts = alerts.filter(state__in=AlertState.open())
        elif state:
            alerts = alerts.filter(state=state)
        if pipeline := self.request.query_params.get("pipeline"):
            alerts = alerts.filter(pipeline__name=pipeline)
        return alerts

    @extend_schema(request=ControlSerializer, responses={200: AlertSerializer, 409: None})
    @action(detail=True, methods=["post"])
    def acknowledge(self, request, pk=None) -> Response:
        body = ControlSerializer(data=request.data or {})
        body.is_valid(raise_exception=True)
        try:
            alert = actions.acknowledge(
                self.get_object().pk,
                user=request.user,
                reason=body.validated_data.get("reason", ""),
                now=timezone.now(),
            )
        except actions.NotFiring as exc:
            return Response({"detail": str(exc)}, status=status.HTTP_409_CONFLICT)
        return Response(self.get_serializer(alert).data)
