"""Each kind of object a fleet's files define, in one place: how an object reads as a
document (what export writes, and what drift compares), what a document would make of it
(checked by the API's own validators), and how it is created, changed and deleted (through
the API's and the services' own functions, audited as theirs are). Looked up in `KINDS`,
in the order an apply takes them (what refers to something comes after it; deletions go
in reverse).

A document read back from an object is canonical: the pipeline spec as stored (defaults
spelled out), keys sorted, empty labels, description and deployment left out, so that an
export applied again is unchanged everywhere.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from django.db.models import F, ProtectedError
from rest_framework import serializers

from controlplane import bounded_json
from controlplane.accounts.roles import ADMIN, EDITOR
from controlplane.alerting import targets
from controlplane.alerting.models import MAILED, AlertChannel, AlertRule
from controlplane.api.alerting import (
    AlertChannelSerializer,
    AlertRuleSerializer,
    delete_channel,
    delete_rule,
    save_channel,
    save_rule,
)
from controlplane.api.applications import ApplicationSerializer
from controlplane.api.connections import delete_connection, save_connection
from controlplane.api.serializers import PipelineSerializer
from controlplane.connections.directories import RootInUse
from controlplane.connections.models import Connection
from controlplane.connections.serializers import ConnectionSerializer
from controlplane.crypto import SecretsUnreadable
from controlplane.definitions import application_services, schemas, services
from controlplane.definitions.models import (
    DEDICATED,
    DesiredState,
    Pipeline,
    Run,
    RunState,
    SparkApplication,
)
from jobs.spec import PipelineSpec, SpecError, parse_spec

from . import secrets
from .documents import API_VERSION, Object


class Refused(Exception):
    """The object cannot be so: messages by the document path they are about ("" for the
    object as a whole)."""

    def __init__(self, problems: dict[str, list[str]]):
        super().__init__("; ".join(f"{k}: {' '.join(v)}" for k, v in problems.items()))
        self.problems = problems


@dataclass
class Context:
    """What an apply writes with: who, why (the audit entries' reason), where the files are
    (kept on a pipeline's new versions), the connections known so far (name: kind, the ones
    this apply creates included) and the secret store."""

    user: Any
    reason: str
    source: dict
    store: secrets.Store
    now: datetime
    connections: dict[str, str] = field(default_factory=dict)
    restart: bool = True  # restart running pipelines whose spec changed
    preflight: bool = True  # preflight pipelines created or changed
    force: bool = False  # restart even when their preflight finds errors
    # Connections this apply creates or changes: no preflight reaches them before it commits.
    changed_connections: set[str] = field(default_factory=set)
    # What is done once the transaction is over, outside its locks (network calls): a
    # pipeline's preflight and restart, by its plan entry.
    follow_ups: list[FollowUp] = field(default_factory=list)


@dataclass
class FollowUp:
    """A pipeline to preflight (its spec) and, if `restart`, to restart once applied."""

    entry: Any  # apply.Entry: its notes get the preflight and whether it restarted
    pipeline_id: int | None
    spec: PipelineSpec
    restart: bool


@dataclass
class Wanted:
    """What an object would be after the apply: its document, its secrets' fingerprint, and
    what writing it needs (a validated serializer, or the checked spec)."""

    document: dict
    secrets_print: str = ""
    write: Any = None
    notes: dict = field(default_factory=dict)  # for the plan, when it is created or changed


def document(
    kind: str,
    name: str,
    spec: dict,
    *,
    labels: dict | None = None,
    description: str = "",
    deployment: dict | None = None,
) -> dict:
    """A canonical document: its fields in one order, mappings' keys sorted, empty labels,
    description and deployment left out."""
    out: dict[str, Any] = {"apiVersion": API_VERSION, "kind": kind, "name": name}
    if labels:
        out["labels"] = _sorted(labels)
    if description:
        out["description"] = description
    out["spec"] = _sorted(spec)
    if deployment:
        out["deployment"] = _sorted(deployment)
    return out


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def digest(doc: dict, secrets_print: str = "") -> str:
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{text}\n{secrets_print}".encode()).hexdigest()


def _problems(errors: Any, prefix: str, *, at: dict[str, str] | None = None) -> dict:
    """A serializer's errors ({field: [messages]}, nested for JSON fields) as document paths:
    `at` maps a field to its place in the document, others go under `prefix`."""
    out: dict[str, list[str]] = {}
    for key, value in dict(errors).items():
        path = (at or {}).get(key, f"{prefix}{key}")
        if key == "non_field_errors":
            path = prefix.rstrip(".")
        if isinstance(value, dict):
            for inner, messages in _problems(value, f"{path}.").items():
                out.setdefault(inner, []).extend(messages)
        else:
            messages = value if isinstance(value, list) else [value]
            out.setdefault(path, []).extend(str(m) for m in messages)
    return out


def _validated(serializer_class, instance: Any, data: dict) -> tuple[Any, dict]:
    """(the serializer, its validated data) of the API's own serializer for `data`; raises
    Refused with its errors at the document's paths (its fields under spec, but the
    document's own name and description)."""
    serializer = serializer_class(instance=instance, data=data)
    if not serializer.is_valid():
        at = {"name": "name", "description": "description"}
        raise Refused(_problems(serializer.errors, "spec.", at=at))
    return serializer, serializer.validated_data


def _only(spec: dict, allowed: tuple[str, ...], kind: str) -> None:
    extra = sorted(set(spec) - set(allowed), key=str)
    if extra:
        raise Refused(
            {f"spec.{key}": [f"is not a {kind} field ({', '.join(allowed)})"] for key in extra}
        )


def _no_labels(obj: Object) -> None:
    if obj.labels:
        raise Refused({"labels": [f"a {obj.kind} has no labels (only pipelines have)"]})


class Kind:
    """One kind of object (subclasses below)."""

    kind: str
    model: Any
    role: str = EDITOR
    secret_paths: tuple[str, ...] = ()  # spec keys whose values may be secret references

    def queryset(self):
        return self.model.objects.all()

    def instances(self, names: list[str] | None = None) -> dict[str, Any]:
        """Its objects by name: all of them, or those `names` name."""
        found = self.queryset()
        if names is not None:
            found = found.filter(name__in=names)
        return {o.name: o for o in found}

    def document(self, instance: Any, refs: dict) -> dict:
        raise NotImplementedError

    def secrets_print(self, instance: Any) -> str:
        return ""

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        raise NotImplementedError

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> Any:
        raise NotImplementedError

    def delete(self, instance: Any, ctx: Context) -> None:
        raise NotImplementedError

    def role_for(self, refs: dict) -> str:
        """The role creating or changing it needs: an admin's when its secrets come from the
        control plane's environment or store (an editor could otherwise point a connection
        at a server of their own with a secret they were never given)."""
        return ADMIN if refs else self.role

    def refs(self, obj: Object) -> dict:
        """The secret references the object's spec gives, by dotted path under spec."""
        return {p: obj.spec[p] for p in self.secret_paths if secrets.is_reference(obj.spec.get(p))}

    def secret_fields(self, instance: Any) -> list[str]:
        """The dotted paths under spec of the secrets the object holds."""
        return []

    def after_write(self, before: Any, after: Any, ctx: Context) -> dict:
        """What else follows from the object as applied (`before`: as it was, None if new),
        for the plan: a pipeline's restart and preflight (ctx.follow_ups)."""
        return {}

    def unsettled(self) -> set[str]:
        """The names of its objects on which something of an earlier apply is pending (a
        pipeline whose run runs an older version): never judged unchanged unread."""
        return set()

    def secret_values(self, instance: Any) -> dict[str, str]:
        """Its secrets' values by dotted path under spec (never shown: compared)."""
        return {}

    def state(self, instance: Any, refs: dict) -> tuple[dict, str]:
        """Its document and its secrets' fingerprint."""
        return self.document(instance, refs), self.secrets_print(instance)


def _with_refs(spec: dict, refs: dict) -> dict:
    """`spec` with the secret references the files gave put back in (`refs`: {dotted path
    under spec: reference})."""
    out = dict(spec)
    for path, ref in refs.items():
        parts = path.split(".")
        here = out
        for part in parts[:-1]:
            here[part] = dict(here.get(part) or {})
            here = here[part]
        here[parts[-1]] = ref
    return out


# -- connections --------------------------------------------------------------------------------


class ConnectionKind(Kind):
    """`spec: {kind, settings, secrets: {name: reference}}`; its secrets are the references'
    values, and only those (a secret the files do not name is removed)."""

    kind = "Connection"
    model = Connection
    fields = ("kind", "settings", "secrets")

    def document(self, instance: Connection, refs: dict) -> dict:
        spec = _with_refs({"kind": instance.kind, "settings": instance.settings}, refs)
        return document(self.kind, instance.name, spec, description=instance.description)

    def refs(self, obj: Object) -> dict:
        given = obj.spec.get("secrets") or {}
        return {f"secrets.{k}": v for k, v in given.items()} if isinstance(given, dict) else {}

    def secret_fields(self, instance: Connection) -> list[str]:
        return [f"secrets.{f}" for f in instance.secret_fields]

    def secret_values(self, instance: Connection) -> dict[str, str]:
        try:
            return {f"secrets.{k}": v for k, v in instance.get_secrets().items()}
        except SecretsUnreadable:
            return {}

    def secrets_print(self, instance: Connection) -> str:
        try:
            return secrets.fingerprint(instance.get_secrets())
        except SecretsUnreadable:
            return "unreadable"

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        _no_labels(obj)
        _only(obj.spec, self.fields, self.kind)
        given = {path.removeprefix("spec.secrets."): value for path, value in values.items()}
        submitted: dict[str, Any] = dict(given)
        if instance is not None:
            for key in instance.secret_fields:
                submitted.setdefault(key, None)  # not in the files: removed
        data = {
            "name": obj.name,
            "kind": obj.spec.get("kind"),
            "description": obj.description,
            "settings": obj.spec.get("settings", {}),
            "secrets": submitted,
        }
        serializer, cleaned = _validated(ConnectionSerializer, instance, data)
        kept = {k: v for k, v in (cleaned.get("secrets") or {}).items() if v is not None}
        smuggled = sorted(set(kept) - set(given))
        if smuggled:  # e.g. a DSN's password, which the API moves into the secrets
            raise Refused(
                {
                    "spec.settings": [
                        f"holds a secret ({', '.join(smuggled)}): files never do; give it as"
                        f" spec.secrets.{smuggled[0]}: {{env: NAME}} or {{file: NAME}}"
                    ]
                }
            )
        refs = self.refs(obj)
        spec = _with_refs({"kind": cleaned["kind"], "settings": cleaned["settings"]}, refs)
        return Wanted(
            document(self.kind, obj.name, spec, description=cleaned.get("description", "")),
            secrets.fingerprint(kept),
            serializer,
        )

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> Connection:
        try:
            connection = save_connection(wanted.write, user=ctx.user, reason=ctx.reason)
        except RootInUse as exc:
            raise Refused({"spec.settings.root": [exc.message]}) from None
        ctx.connections[connection.name] = connection.kind
        ctx.changed_connections.add(connection.name)
        return connection

    def delete(self, instance: Connection, ctx: Context) -> None:
        try:
            delete_connection(instance, user=ctx.user, reason=ctx.reason)
        except ProtectedError:
            users = ", ".join(sorted(instance.pipelines.values_list("name", flat=True)))
            raise Refused({"": [f"cannot be deleted: pipelines use it ({users})"]}) from None
        ctx.connections.pop(instance.name, None)


# -- shared Spark applications ----------------------------------------------------------------


class ApplicationKind(Kind):
    """`spec: {master, driver_memory, executor_memory, conf, capacity}`; what is left out is
    the default (the files are the whole definition). Admins'."""

    kind = "SparkApplication"
    model = SparkApplication
    role = ADMIN
    fields = ("master", "driver_memory", "executor_memory", "conf", "capacity")

    def _defaults(self) -> dict:
        return {f: SparkApplication._meta.get_field(f).get_default() for f in self.fields}

    def document(self, instance: SparkApplication, refs: dict) -> dict:
        spec = {f: getattr(instance, f) for f in self.fields}
        return document(self.kind, instance.name, spec, description=instance.description)

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        _no_labels(obj)
        _only(obj.spec, self.fields, self.kind)
        data = {**self._defaults(), **obj.spec, "name": obj.name, "description": obj.description}
        _, validated = _validated(ApplicationSerializer, instance, data)
        cleaned = {**self._defaults(), **validated}
        spec = {f: cleaned[f] for f in self.fields}
        definition = {**spec, "description": cleaned.get("description", "")}
        return Wanted(
            document(self.kind, obj.name, spec, description=definition["description"]),
            write=definition,
        )

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> Any:
        if instance is None:
            return application_services.create_application(
                name=obj.name, user=ctx.user, **wanted.write
            )
        return application_services.update_application(
            instance, user=ctx.user, reason=ctx.reason, **wanted.write
        )

    def delete(self, instance: SparkApplication, ctx: Context) -> None:
        try:
            application_services.delete_application(instance, user=ctx.user, reason=ctx.reason)
        except services.Conflict as exc:
            raise Refused({"": [f"cannot be deleted: {exc}"]}) from None


# -- pipelines ------------------------------------------------------------------------------------


_DEPLOYMENT_DEFAULTS = {
    "placement": DEDICATED,
    "restore_point_minutes": None,
    "auto_rollback_minutes": None,
}


class PipelineKind(Kind):
    """`spec`: the pipeline spec (docs/spec.md); `deployment`: placement,
    restore_point_minutes, auto_rollback_minutes. Its desired state (running or not) is the
    operators' (on-call controls), never the files'."""

    kind = "Pipeline"
    model = Pipeline

    def queryset(self):
        return Pipeline.objects.defer("offsets_reset")

    def document(self, instance: Pipeline, refs: dict) -> dict:
        deployment = {
            key: getattr(instance, key)
            for key, default in _DEPLOYMENT_DEFAULTS.items()
            if getattr(instance, key) != default
        }
        return document(
            self.kind,
            instance.name,
            instance.spec,
            labels=instance.labels,
            description=instance.description,
            deployment=deployment,
        )

    @staticmethod
    def prefixes(obj: Object) -> tuple[str, str]:
        """Where the spec and the deployment are in the file: a template instance's are the
        template's."""
        if obj.source.instance:
            return "spec.pipeline.", "spec.deployment."
        return "spec.", "deployment."

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        spec_at, deployment_at = self.prefixes(obj)
        problems: dict[str, list[str]] = {}
        canonical = None
        try:
            resolved = schemas.resolve(obj.spec)
            bounded_json.check(resolved)
            parsed = parse_spec(resolved, connections=ctx.connections)
            canonical = parsed.to_dict()
        except SpecError as exc:
            for path, messages in exc.as_dict(spec_at).items():
                problems.setdefault(path, []).extend(messages)
        except bounded_json.Refused as exc:
            for path, messages in exc.errors.items():
                problems.setdefault(f"{spec_at}{path}", []).extend(messages)
        if problem := services.labels_problem(obj.labels):
            detail = problem if isinstance(problem, dict) else {"": problem}
            labels_at = "spec.labels" if obj.source.instance else "labels"  # a template's
            for key, message in detail.items():
                problems.setdefault(f"{labels_at}.{key}" if key else labels_at, []).append(message)
        deployment = {**_DEPLOYMENT_DEFAULTS, **obj.deployment}
        fields = PipelineSerializer().fields
        for key in _DEPLOYMENT_DEFAULTS:
            try:
                deployment[key] = fields[key].run_validation(deployment[key])
            except serializers.ValidationError as exc:
                problems.setdefault(f"{deployment_at}{key}", []).extend(str(m) for m in exc.detail)
        if "placement" not in problems and (
            problem := services.placement_problem(deployment["placement"])
        ):
            problems.setdefault(f"{deployment_at}placement", []).append(problem)
        if problems:
            raise Refused(problems)
        shown = {k: v for k, v in deployment.items() if v != _DEPLOYMENT_DEFAULTS[k]}
        doc = document(
            self.kind,
            obj.name,
            canonical,
            labels=obj.labels,
            description=obj.description,
            deployment=shown,
        )
        checked = schemas.summary(parsed)
        notes = {"schemas": checked} if checked else {}
        return Wanted(doc, write={"spec": canonical, **deployment}, notes=notes)

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> Pipeline:
        spec_at, deployment_at = self.prefixes(obj)
        settings = dict(wanted.write)
        spec = settings.pop("spec")
        try:
            if instance is None:
                return services.create_pipeline(
                    name=obj.name,
                    spec_data=spec,
                    user=ctx.user,
                    description=obj.description,
                    labels=obj.labels,
                    version_source=ctx.source,
                    resolve_schemas=False,
                    **settings,
                )
            return services.update_pipeline(
                instance,
                spec_data=spec,
                user=ctx.user,
                description=obj.description,
                labels=obj.labels,
                reason=ctx.reason,
                version_source=ctx.source,
                resolve_schemas=False,
                **settings,
            )
        except SpecError as exc:
            raise Refused(exc.as_dict(spec_at)) from None
        except services.Invalid as exc:
            path = exc.field if exc.field in ("name", "labels", "description") else None
            if path in ("labels", "description") and obj.source.instance:
                path = f"spec.{path}"  # the template's
            path = path or f"{deployment_at}{exc.field}"
            raise Refused({path: [str(exc.detail)]}) from None
        except services.Conflict as exc:
            raise Refused({"": [str(exc)]}) from None

    def unsettled(self) -> set[str]:
        return set(
            Run.objects.filter(state__in=RunState.active())
            .exclude(spec_version=F("pipeline__version"))
            .values_list("pipeline__name", flat=True)
        )

    def after_write(self, before: Pipeline | None, after: Pipeline, ctx: Context) -> dict:
        """A new spec (or one its run does not run yet): preflighted once applied
        (CONTROLPLANE_PREFLIGHT not off), and, when the operators want it running and its run
        runs an older version, restarted gracefully to run it (ctx.follow_ups, after the
        transaction); a restore point of its checkpoint is taken before the new version's
        first run when it has committed a batch."""
        changed = before is None or before.version != after.version
        running = (
            after.desired_state == DesiredState.RUNNING
            and Run.objects.filter(pipeline=after, state=RunState.RUNNING)
            .exclude(spec_version=after.version)
            .exists()
        )
        if not changed and not running:
            return {}
        restart = running and ctx.restart
        spec = parse_spec(after.spec, connections=ctx.connections)
        ctx.follow_ups.append(FollowUp(None, after.pk, spec, restart))
        if before is None:
            return {}
        committed = Run.objects.filter(pipeline=after, last_batch_id__isnull=False).exists()
        return {"restart": restart, "restore_point": committed}

    def delete(self, instance: Pipeline, ctx: Context) -> None:
        try:
            services.delete_pipeline(instance, user=ctx.user, reason=ctx.reason)
        except services.Conflict as exc:
            raise Refused({"": [f"cannot be deleted: {exc}"]}) from None


# -- alerting ---------------------------------------------------------------------------------


class ChannelKind(Kind):
    """`spec: {kind, target, signing_key}`: a webhook URL with secret parts (user info, query
    values, a Slack-style path) and a signing key are references. Admins'."""

    kind = "AlertChannel"
    model = AlertChannel
    role = ADMIN
    fields = ("kind", "target", "signing_key")
    secret_paths = ("target", "signing_key")

    def document(self, instance: AlertChannel, refs: dict) -> dict:
        spec = _with_refs({"kind": instance.kind, "target": instance.target}, refs)
        return document(self.kind, instance.name, spec)

    def secret_values(self, instance: AlertChannel) -> dict[str, str]:
        try:
            return {"target": instance.get_url(), "signing_key": instance.get_signing_key()}
        except SecretsUnreadable:
            return {}

    def secret_fields(self, instance: AlertChannel) -> list[str]:
        return (["target"] if instance.url_encrypted else []) + (
            ["signing_key"] if instance.secret_encrypted else []
        )

    def secrets_print(self, instance: AlertChannel) -> str:
        try:
            return secrets.fingerprint(
                {"url": instance.get_url(), "signing_key": instance.get_signing_key()}
            )
        except SecretsUnreadable:
            return "unreadable"

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        _no_labels(obj)
        _only(obj.spec, self.fields, self.kind)
        if obj.description:
            raise Refused({"description": ["an AlertChannel has no description"]})
        kind = obj.spec.get("kind")
        target = values.get("spec.target", obj.spec.get("target"))
        key = values.get("spec.signing_key", "")
        if "spec.signing_key" not in values and obj.spec.get("signing_key") not in (None, ""):
            raise Refused({"spec.signing_key": [f"must be {secrets.REFERENCE_HELP}"]})
        if (
            "spec.target" not in values
            and isinstance(target, str)
            and kind not in MAILED
            and targets.mask(target, kind) != target
        ):
            raise Refused(
                {
                    "spec.target": [
                        "has secret parts (user info, query values or a Slack-style path):"
                        f" give the URL as {secrets.REFERENCE_HELP}"
                    ]
                }
            )
        data = {"name": obj.name, "kind": kind, "target": target, "signing_key": key}
        serializer, cleaned = _validated(AlertChannelSerializer, instance, data)
        shown = cleaned["target"] if kind in MAILED else targets.mask(cleaned["target"], kind)
        spec = _with_refs({"kind": kind, "target": shown}, self.refs(obj))
        url = "" if kind in MAILED else cleaned["target"]
        return Wanted(
            document(self.kind, obj.name, spec),
            secrets.fingerprint({"url": url or shown, "signing_key": key}),
            serializer,
        )

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> AlertChannel:
        return save_channel(wanted.write, user=ctx.user, reason=ctx.reason)

    def delete(self, instance: AlertChannel, ctx: Context) -> None:
        delete_channel(instance, user=ctx.user, reason=ctx.reason)


class RuleKind(Kind):
    """`spec: {kind, params, pipeline, label, for_seconds, repeat_seconds, channels,
    enabled}` (docs/alerting.md); silences are the operators'."""

    kind = "AlertRule"
    model = AlertRule
    fields = (
        "kind",
        "params",
        "pipeline",
        "label",
        "for_seconds",
        "repeat_seconds",
        "channels",
        "enabled",
    )
    _defaults = {
        "params": {},
        "pipeline": None,
        "label": "",
        "for_seconds": 0,
        "repeat_seconds": 1800,
        "channels": [],
        "enabled": True,
    }

    def queryset(self):
        return AlertRule.objects.select_related("pipeline").prefetch_related("channels")

    @staticmethod
    def _spec(values: dict) -> dict:
        spec = {k: values[k] for k in ("kind", "params", "for_seconds", "repeat_seconds")}
        spec["channels"] = sorted(values["channels"])
        spec["enabled"] = values["enabled"]
        if values.get("pipeline"):
            spec["pipeline"] = values["pipeline"]
        if values.get("label"):
            spec["label"] = values["label"]
        return spec

    def document(self, instance: AlertRule, refs: dict) -> dict:
        values = {f: getattr(instance, f) for f in ("kind", "params", "label", "for_seconds")}
        values["repeat_seconds"] = instance.repeat_seconds
        values["enabled"] = instance.enabled
        values["pipeline"] = instance.pipeline.name if instance.pipeline_id else None
        values["channels"] = [c.name for c in instance.channels.all()]
        return document(self.kind, instance.name, self._spec(values))

    def wanted(self, obj: Object, instance: Any, values: dict, ctx: Context) -> Wanted:
        _no_labels(obj)
        _only(obj.spec, self.fields, self.kind)
        if obj.description:
            raise Refused({"description": ["an AlertRule has no description"]})
        data = {**self._defaults, **obj.spec, "name": obj.name}
        serializer, validated = _validated(AlertRuleSerializer, instance, data)
        cleaned = {**self._defaults, **validated}
        cleaned["pipeline"] = cleaned["pipeline"].name if cleaned["pipeline"] else None
        cleaned["channels"] = [c.name for c in cleaned["channels"]]
        return Wanted(document(self.kind, obj.name, self._spec(cleaned)), write=serializer)

    def write(self, obj: Object, wanted: Wanted, instance: Any, ctx: Context) -> AlertRule:
        return save_rule(wanted.write, user=ctx.user, reason=ctx.reason)

    def delete(self, instance: AlertRule, ctx: Context) -> None:
        delete_rule(instance, user=ctx.user, reason=ctx.reason)


# In the order an apply takes them: connections and applications before the pipelines that
# name them, pipelines and channels before the rules that name them.
KINDS: dict[str, Kind] = {
    k.kind: k
    for k in (ConnectionKind(), ApplicationKind(), PipelineKind(), ChannelKind(), RuleKind())
}
ORDER: tuple[str, ...] = tuple(KINDS)


def reason_for(source: dict) -> str:
    where = source.get("repository") or "files"
    commit = source.get("commit")
    at = f"{where}@{commit[:12]}" if commit else where
    return f"applied from {at} (fleet {source.get('fleet')})"
