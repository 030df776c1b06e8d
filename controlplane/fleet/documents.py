"""Definitions as code: the files a fleet is kept in, read into the objects they define (pure:
no Django; what the control plane makes of them is its `plan`'s).

A file holds YAML documents (`---` between them), each one object:

    apiVersion: controlplane/v1
    kind: Pipeline            # Connection, Pipeline, SparkApplication, AlertRule, AlertChannel
    name: orders-to-pg        #   or PipelineTemplate, Environment (below)
    labels: {team: payments}  # optional
    description: ...          # optional
    spec: {...}               # the object's own settings, as the REST API takes them
    deployment: {...}         # optional, a Pipeline's: placement, restore_point_minutes,
                              #   auto_rollback_minutes

A `PipelineTemplate` is a family of pipelines: typed `parameters` (string, integer, number,
boolean, list, object; a default makes one optional), a `pipeline` body in which
`${params.NAME}` and `${vars.NAME}` stand for values, and `instances`, each a name and its
parameter values, each expanding into a Pipeline object. An `Environment` (one per target:
dev, staging, prod) gives `variables` for `${vars.NAME}` and `overlays`: per object
(`Kind/name`) a JSON merge patch (RFC 7386) applied to its spec; which environment is used is
the reader's choice (`read(..., environment=...)`).

A placeholder that is a whole string takes its value's type (`"${params.partitions}"` is the
integer); inside a longer string it is written as text. `$${` is a literal `${`.

Every problem is a `DocumentError` naming its file, the document's place in it and the path
inside (`fleet/orders.yaml: document 2 (PipelineTemplate orders): spec.instances[3].parameters.
sink: ...`); all of a set's problems are reported together. YAML is read without aliases,
custom tags or duplicate keys, and within size limits.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import yaml

API_VERSION = "controlplane/v1"
OBJECT_KINDS = ("Connection", "Pipeline", "SparkApplication", "AlertRule", "AlertChannel")
# Where export writes each kind's objects (`pipelines/orders.yaml`).
FOLDERS = {
    "Connection": "connections",
    "SparkApplication": "applications",
    "Pipeline": "pipelines",
    "AlertChannel": "alert-channels",
    "AlertRule": "alert-rules",
}
TEMPLATE = "PipelineTemplate"
ENVIRONMENT = "Environment"
KINDS = (*OBJECT_KINDS, TEMPLATE, ENVIRONMENT)
DOCUMENT_FIELDS = ("apiVersion", "kind", "name", "labels", "description", "spec", "deployment")
DEPLOYMENT_FIELDS = ("placement", "restore_point_minutes", "auto_rollback_minutes")
MAX_DESCRIPTION = 10_000
MAX_FILE_BYTES = 1024 * 1024
MAX_DOCUMENTS = 5000  # in one set
MAX_DEPTH = 32
NAME_RE = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
PARAMETER_TYPES = {
    "string": str,
    "integer": int,
    "number": (int, float),
    "boolean": bool,
    "list": list,
    "object": dict,
}
_PLACEHOLDER = re.compile(r"\$\{(params|vars)\.([A-Za-z_][A-Za-z0-9_]*)\}")
_WHOLE = re.compile(r"^\$\{(params|vars)\.([A-Za-z_][A-Za-z0-9_]*)\}$")


@dataclass(frozen=True)
class DocumentError:
    file: str
    where: str  # the document: "document 2 (Pipeline orders)"
    path: str  # inside it: "spec.source.topics[0]" ("" for the document itself)
    message: str

    def __str__(self) -> str:
        inside = f": {self.path}" if self.path else ""
        return f"{self.file}: {self.where}{inside}: {self.message}"

    def as_dict(self) -> dict:
        """As the API and `cpfleet --json` give a problem."""
        return {
            "file": self.file,
            "document": self.where,
            "path": self.path,
            "message": self.message,
        }


class DocumentsRefused(Exception):
    """The set has problems: every one of them, in `errors`."""

    def __init__(self, errors: list[DocumentError]):
        super().__init__("; ".join(str(e) for e in errors[:5]))
        self.errors = errors


@dataclass(frozen=True)
class Source:
    """Where an object was written: the file, the document's number in it (from 1), and the
    template instance it came from, if any."""

    file: str
    document: int
    instance: str = ""

    def where(self, kind: str, name: str) -> str:
        of = f" of template {self.instance}" if self.instance else ""
        return f"document {self.document} ({kind} {name}{of})"


@dataclass(frozen=True)
class Object:
    """One object a set defines (after templates and the environment); as read, a document
    (templates and environments are read as such, then expanded or applied)."""

    kind: str
    name: str
    labels: dict[str, str]
    spec: dict[str, Any]
    source: Source
    description: str = ""
    deployment: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.kind}/{self.name}"


@dataclass
class _Errors:
    found: list[DocumentError] = field(default_factory=list)

    def add(self, source: Source, label: str, path: str, message: str) -> None:
        self.found.append(DocumentError(source.file, label, path, message))


def read(files: Mapping[str, str], *, environment: str | None = None) -> list[Object]:
    """The objects `files` ({path: YAML text}) define, templates expanded and `environment`'s
    variables and overlays applied, in file order. Raises DocumentsRefused with every
    problem."""
    errors = _Errors()
    documents = []
    for path in sorted(files):
        documents.extend(_parse_file(path, files[path], errors))
    if len(documents) > MAX_DOCUMENTS:
        raise DocumentsRefused(
            [DocumentError("", "the set", "", f"more than {MAX_DOCUMENTS:,} documents")]
        )
    environments = {d.name: d for d in documents if d.kind == ENVIRONMENT}
    variables: dict[str, Any] = {}
    overlays: dict[str, Any] = {}
    if environment is not None:
        chosen = environments.get(environment)
        if chosen is None:
            known = ", ".join(sorted(environments)) or "none"
            raise DocumentsRefused(
                [
                    DocumentError(
                        "", "the set", "", f"no Environment {environment!r} (known: {known})"
                    )
                ]
            )
        variables, overlays = _environment(chosen, errors)
    objects: list[Object] = []
    for document in documents:
        if document.kind == TEMPLATE:
            objects.extend(_expand(document, variables, errors))
        elif document.kind != ENVIRONMENT:
            label = document.source.where(document.kind, document.name)
            spec = _substitute(document.spec, {}, variables, errors, document.source, label, "spec")
            deployment = _substitute(
                document.deployment, {}, variables, errors, document.source, label, "deployment"
            )
            objects.append(replace(document, spec=spec, deployment=deployment))
    seen: dict[str, Object] = {}
    for obj in objects:
        if obj.key in seen:
            first = seen[obj.key].source
            errors.add(
                obj.source,
                obj.source.where(obj.kind, obj.name),
                "name",
                f"{obj.key} is defined twice (first in {first.file}, document {first.document})",
            )
        seen.setdefault(obj.key, obj)
    out = []
    for obj in objects:
        patch = overlays.get(obj.key)
        if patch is not None:
            obj = replace(obj, spec=merge_patch(obj.spec, patch))
        out.append(obj)
    for key in overlays:
        if key not in seen:
            errors.add(
                environments[environment].source,
                environments[environment].source.where(ENVIRONMENT, environment or ""),
                f"spec.overlays.{key}",
                "names no object of the set",
            )
    if errors.found:
        raise DocumentsRefused(errors.found)
    return out


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merged key by key, null removes, anything else
    replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    out = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = merge_patch(out.get(key), value)
    return out


# -- parsing -----------------------------------------------------------------------------------


def _parse_file(path: str, text: str, errors: _Errors) -> list[Object]:
    whole = Source(path, 0)
    if len(text.encode()) > MAX_FILE_BYTES:
        errors.add(whole, "the file", "", f"is over {MAX_FILE_BYTES:,} bytes")
        return []
    try:
        loaded = list(yaml.load_all(text, Loader=_Loader))
    except RecursionError:
        errors.add(whole, "the file", "", f"is nested more than {MAX_DEPTH} levels deep")
        return []
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "the file"
        problem = getattr(exc, "problem", None) or str(exc)
        errors.add(whole, at, "", f"is not YAML this reads: {problem}")
        return []
    out = []
    for number, data in enumerate(loaded, start=1):
        if data is None:
            continue  # an empty document (a trailing ---)
        source = Source(path, number)
        document = _document(data, source, errors)
        if document is not None:
            out.append(document)
    return out


def _document(data: Any, source: Source, errors: _Errors) -> Object | None:
    label = f"document {source.document}"
    if not isinstance(data, dict):
        errors.add(source, label, "", "must be a mapping (apiVersion, kind, name, spec)")
        return None
    kind, name = data.get("kind"), data.get("name")
    if isinstance(kind, str) and isinstance(name, str):
        label = source.where(kind, name)
    before = len(errors.found)
    for key in sorted(set(data) - set(DOCUMENT_FIELDS), key=str):
        errors.add(
            source, label, str(key), f"is not a document field ({', '.join(DOCUMENT_FIELDS)})"
        )
    if data.get("apiVersion") != API_VERSION:
        errors.add(source, label, "apiVersion", f"must be {API_VERSION!r}")
    if kind not in KINDS:
        errors.add(source, label, "kind", f"must be one of {', '.join(KINDS)}")
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        errors.add(
            source, label, "name", "must be 1-63 lower-case letters, digits and -, not at an end"
        )
    labels = data.get("labels", {})
    if not isinstance(labels, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in labels.items()
    ):
        errors.add(source, label, "labels", "must map names to strings")
        labels = {}
    spec = data.get("spec")
    if not isinstance(spec, dict):
        errors.add(source, label, "spec", "must be a mapping")
    elif _depth(spec) > MAX_DEPTH:
        errors.add(source, label, "spec", f"is nested more than {MAX_DEPTH} levels deep")
    description = data.get("description", "")
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        errors.add(source, label, "description", f"must be text of at most {MAX_DESCRIPTION:,}")
    deployment = data.get("deployment", {})
    if "deployment" in data and kind != "Pipeline":
        errors.add(source, label, "deployment", "only a Pipeline has one")
    else:
        _check_deployment(deployment, source, label, "deployment", errors)
    if len(errors.found) > before:
        return None
    return Object(kind, name, dict(labels), spec, source, description, dict(deployment))


def _check_deployment(value: Any, source: Source, label: str, at: str, errors: _Errors) -> None:
    if not isinstance(value, dict):
        errors.add(source, label, at, f"must be a mapping ({', '.join(DEPLOYMENT_FIELDS)})")
        return
    for key in sorted(set(value) - set(DEPLOYMENT_FIELDS), key=str):
        errors.add(
            source,
            label,
            f"{at}.{key}",
            f"is not a deployment field ({', '.join(DEPLOYMENT_FIELDS)})",
        )


def _depth(value: Any, level: int = 0) -> int:
    if level > MAX_DEPTH:
        return level
    if isinstance(value, dict):
        return max([_depth(v, level + 1) for v in value.values()], default=level)
    if isinstance(value, list):
        return max([_depth(v, level + 1) for v in value], default=level)
    return level


# -- environments and templates -----------------------------------------------------------------


def _environment(document: Object, errors: _Errors) -> tuple[dict, dict]:
    label = document.source.where(ENVIRONMENT, document.name)
    spec = document.spec
    for key in sorted(set(spec) - {"variables", "overlays"}):
        errors.add(
            document.source,
            label,
            f"spec.{key}",
            "is not an Environment field (variables, overlays)",
        )
    variables = spec.get("variables", {})
    if not isinstance(variables, dict):
        errors.add(document.source, label, "spec.variables", "must map names to values")
        variables = {}
    overlays = spec.get("overlays", {})
    if not isinstance(overlays, dict):
        errors.add(document.source, label, "spec.overlays", "must map Kind/name to a patch")
        overlays = {}
    for key, patch in overlays.items():
        kind, _, name = str(key).partition("/")
        if kind not in OBJECT_KINDS or not NAME_RE.fullmatch(name):
            errors.add(
                document.source,
                label,
                f"spec.overlays.{key}",
                "must be Kind/name, e.g. Pipeline/orders",
            )
        elif not isinstance(patch, dict):
            errors.add(
                document.source,
                label,
                f"spec.overlays.{key}",
                "must be a mapping (a merge patch of its spec)",
            )
    return dict(variables), dict(overlays)


def _expand(template: Object, variables: dict, errors: _Errors) -> list[Object]:
    source = template.source
    label = source.where(TEMPLATE, template.name)
    spec = template.spec
    fields = ("parameters", "pipeline", "instances", "labels", "description", "deployment")
    for key in sorted(set(spec) - set(fields), key=str):
        errors.add(source, label, f"spec.{key}", f"is not a template field ({', '.join(fields)})")
    description = spec.get("description", "")
    if not isinstance(description, str):
        errors.add(source, label, "spec.description", "must be text")
        description = ""
    deployment = spec.get("deployment", {})
    _check_deployment(deployment, source, label, "spec.deployment", errors)
    if not isinstance(deployment, dict):
        deployment = {}
    parameters = _parameters(spec.get("parameters", {}), source, label, errors)
    body = spec.get("pipeline")
    if not isinstance(body, dict):
        errors.add(source, label, "spec.pipeline", "must be a mapping: the pipelines' spec")
        return []
    instances = spec.get("instances")
    if not isinstance(instances, list) or not instances:
        errors.add(
            source, label, "spec.instances", "must be a non-empty list of {name, parameters}"
        )
        return []
    common_labels = spec.get("labels", {})
    if not isinstance(common_labels, dict):
        errors.add(source, label, "spec.labels", "must map names to strings")
        common_labels = {}
    out = []
    for i, instance in enumerate(instances):
        at = f"spec.instances[{i}]"
        if not isinstance(instance, dict) or set(instance) - {"name", "parameters", "labels"}:
            errors.add(source, label, at, "must be a mapping of name, parameters and labels")
            continue
        name = instance.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            errors.add(
                source,
                label,
                f"{at}.name",
                "must be 1-63 lower-case letters, digits and -, not at an end",
            )
            continue
        given = instance.get("parameters", {})
        if not isinstance(given, dict):
            errors.add(source, label, f"{at}.parameters", "must map parameter names to values")
            continue
        values = _values(parameters, given, source, label, f"{at}.parameters", errors)
        if values is None:
            continue
        mine = Source(source.file, source.document, template.name)
        here = mine.where("Pipeline", name)
        pipeline = _substitute(body, values, variables, errors, mine, here, "spec.pipeline")
        text = _substitute(description, values, variables, errors, mine, here, "spec.description")
        placed = _substitute(deployment, values, variables, errors, mine, here, "spec.deployment")
        labels = {**common_labels, **(instance.get("labels") or {}), "template": template.name}
        out.append(
            Object("Pipeline", name, {**template.labels, **labels}, pipeline, mine, text, placed)
        )
    return out


def _parameters(data: Any, source: Source, label: str, errors: _Errors) -> dict[str, dict]:
    if not isinstance(data, dict):
        errors.add(source, label, "spec.parameters", "must map names to {type, default}")
        return {}
    out = {}
    for name, declared in data.items():
        at = f"spec.parameters.{name}"
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            errors.add(source, label, at, "must be a name of letters, digits and _")
            continue
        if not isinstance(declared, dict) or declared.get("type") not in PARAMETER_TYPES:
            errors.add(source, label, f"{at}.type", f"must be one of {', '.join(PARAMETER_TYPES)}")
            continue
        if set(declared) - {"type", "default", "description"}:
            errors.add(source, label, at, "takes type, default and description only")
            continue
        if "default" in declared and not _typed(declared["default"], declared["type"]):
            errors.add(source, label, f"{at}.default", f"must be {a_noun(declared['type'])}")
            continue
        out[name] = declared
    return out


def _typed(value: Any, kind: str) -> bool:
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    return isinstance(value, PARAMETER_TYPES[kind])


def _values(
    parameters: dict, given: dict, source: Source, label: str, at: str, errors: _Errors
) -> dict | None:
    before = len(errors.found)
    for name in sorted(set(given) - set(parameters)):
        known = ", ".join(sorted(parameters)) or "none"
        errors.add(
            source,
            label,
            f"{at}.{name}",
            f"is not a parameter of the template (its parameters: {known})",
        )
    values = {}
    for name, declared in parameters.items():
        if name in given:
            if not _typed(given[name], declared["type"]):
                errors.add(source, label, f"{at}.{name}", f"must be {a_noun(declared['type'])}")
                continue
            values[name] = given[name]
        elif "default" in declared:
            values[name] = copy.deepcopy(declared["default"])
        else:
            errors.add(source, label, f"{at}.{name}", "is required (the parameter has no default)")
    return values if len(errors.found) == before else None


def _substitute(
    value: Any,
    params: dict,
    variables: dict,
    errors: _Errors,
    source: Source,
    label: str,
    path: str,
) -> Any:
    """`value` with its placeholders replaced (a whole-string placeholder keeps its value's
    type)."""
    if isinstance(value, dict):
        return {
            k: _substitute(v, params, variables, errors, source, label, f"{path}.{k}")
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [
            _substitute(v, params, variables, errors, source, label, f"{path}[{i}]")
            for i, v in enumerate(value)
        ]
    if not isinstance(value, str) or "${" not in value:
        return value
    scopes = {"params": params, "vars": variables}
    whole = _WHOLE.fullmatch(value)
    if whole:
        scope, name = whole.groups()
        if name in scopes[scope]:
            return copy.deepcopy(scopes[scope][name])
        errors.add(source, label, path, _unknown(scope, name, scopes[scope]))
        return value

    def replace(match: re.Match) -> str:
        scope, name = match.groups()
        if name not in scopes[scope]:
            errors.add(source, label, path, _unknown(scope, name, scopes[scope]))
            return match.group(0)
        found = scopes[scope][name]
        if isinstance(found, dict | list):
            errors.add(
                source,
                label,
                path,
                f"${{{scope}.{name}}} is a {type(found).__name__}: only a whole value can be one",
            )
            return match.group(0)
        return str(found).lower() if isinstance(found, bool) else str(found)

    # `$${` is a literal `${`: the text between escapes is substituted.
    return "${".join(_PLACEHOLDER.sub(replace, part) for part in value.split("$${"))


def _unknown(scope: str, name: str, known: Mapping) -> str:
    what = "parameter" if scope == "params" else "variable of the environment"
    names = ", ".join(sorted(known)) or "none"
    return f"${{{scope}.{name}}}: no such {what} (known: {names})"


# -- YAML: safe, no aliases, no duplicate keys, no dates, booleans only true/false ----------


class _Loader(yaml.SafeLoader):
    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, "aliases (*name) are not allowed", event.start_mark
            )
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"the key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


# A date stays the text it is (specs take timestamps as strings), and yes/no/on/off stay
# words (YAML 1.1 would make them booleans).
_BOOL, _TIMESTAMP = "tag:yaml.org,2002:bool", "tag:yaml.org,2002:timestamp"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag not in (_BOOL, _TIMESTAMP)]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def a_noun(noun: str) -> str:
    return f"an {noun}" if noun[:1].lower() in ("a", "e", "i", "o", "u") else f"a {noun}"
