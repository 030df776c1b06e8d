"""The fleet's files as JSON Schema (draft 2020-12), for editors (the YAML language server:
`# yaml-language-server: $schema=...`). Pure: built from the same definitions the readers
use (documents' kinds and fields, the pipeline spec's schema, the alert rule kinds).

`cpfleet schema` prints it, GET /api/fleet/schema/ serves it, and docs/fleet.schema.json is
a copy (a test keeps it equal). It describes what the files may say; the control plane's
checks (documents.read, the API's validators) remain the judge: a placeholder
(`${params.x}`) where the spec wants a number is fine for them, and only a warning here.
"""

from __future__ import annotations

from typing import Any

from controlplane.alerting.rules import KINDS as RULE_KINDS
from jobs.connections import CONNECTION_KINDS
from jobs.spec.schema import spec_schema_parts

from . import documents

NAME = {
    "type": "string",
    "pattern": documents.NAME_RE.pattern,
    "description": "1-63 lower-case letters, digits and -, not at an end",
}
REFERENCE = {
    "description": "A secret, by reference: an environment variable of the control plane"
    " (its name begins with CONTROLPLANE_FLEET_SECRET_PREFIX, FLEET_SECRET_ by default) or a"
    " file of its secret store (CONTROLPLANE_FLEET_SECRETS_DIR)",
    "oneOf": [
        {
            "type": "object",
            "properties": {"env": {"type": "string", "pattern": "^[A-Z_][A-Z0-9_]*$"}},
            "required": ["env"],
            "additionalProperties": False,
        },
        {
            "type": "object",
            "properties": {"file": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9._-]*$"}},
            "required": ["file"],
            "additionalProperties": False,
        },
    ],
}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
DEPLOYMENT = {
    "type": "object",
    "properties": {
        "placement": {
            "type": "string",
            "description": "dedicated (the default), auto, or a SparkApplication's name",
        },
        "restore_point_minutes": {"type": ["integer", "null"], "minimum": 1},
        "auto_rollback_minutes": {"type": ["integer", "null"], "minimum": 1},
    },
    "additionalProperties": False,
}


def _specs() -> dict[str, dict]:
    pipeline, defs = spec_schema_parts()
    return {
        "Connection": {
            "type": "object",
            "properties": {
                "kind": {"enum": sorted(CONNECTION_KINDS)},
                "settings": {"type": "object", "description": "as the API takes them"},
                "secrets": {"type": "object", "additionalProperties": {"$ref": "#/$defs/Secret"}},
            },
            "required": ["kind"],
            "additionalProperties": False,
        },
        "Pipeline": {"$ref": "#/$defs/PipelineSpec"},
        "SparkApplication": {
            "type": "object",
            "properties": {
                "master": {"type": "string"},
                "driver_memory": {"type": "string", "examples": ["2g"]},
                "executor_memory": {"type": "string"},
                "conf": {
                    "type": "object",
                    "additionalProperties": {"type": ["string", "number", "boolean"]},
                },
                "capacity": {"type": "integer", "minimum": 1},
            },
            "additionalProperties": False,
        },
        "AlertChannel": {
            "type": "object",
            "properties": {
                "kind": {"enum": ["email", "webhook", "slack"]},
                "target": {
                    "description": "e-mail addresses, or a URL without secret parts, or a"
                    " reference to one with them",
                    "oneOf": [{"type": "string"}, {"$ref": "#/$defs/Secret"}],
                },
                "signing_key": {"$ref": "#/$defs/Secret"},
            },
            "required": ["kind", "target"],
            "additionalProperties": False,
        },
        "AlertRule": {
            "type": "object",
            "properties": {
                "kind": {"enum": sorted(RULE_KINDS)},
                "params": {"type": "object", "additionalProperties": {"type": "number"}},
                "pipeline": NAME,
                "label": {"type": "string", "description": "name:value"},
                "for_seconds": {"type": "integer", "minimum": 0},
                "repeat_seconds": {"type": "integer", "minimum": 0},
                "channels": {"type": "array", "items": NAME},
                "enabled": {"type": "boolean"},
            },
            "required": ["kind"],
            "additionalProperties": False,
        },
        "PipelineTemplate": {
            "type": "object",
            "properties": {
                "parameters": {
                    "type": "object",
                    "additionalProperties": {
                        "type": "object",
                        "properties": {
                            "type": {"enum": list(documents.PARAMETER_TYPES)},
                            "default": {},
                            "description": {"type": "string"},
                        },
                        "required": ["type"],
                        "additionalProperties": False,
                    },
                },
                "pipeline": {
                    "type": "object",
                    "description": "a pipeline spec in which ${params.NAME} and ${vars.NAME}"
                    " stand for values",
                },
                "instances": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "properties": {
                            "name": NAME,
                            "parameters": {"type": "object"},
                            "labels": LABELS,
                        },
                        "required": ["name"],
                        "additionalProperties": False,
                    },
                },
                "labels": LABELS,
                "description": {"type": "string"},
                "deployment": DEPLOYMENT,
            },
            "required": ["pipeline", "instances"],
            "additionalProperties": False,
        },
        "Environment": {
            "type": "object",
            "properties": {
                "variables": {"type": "object"},
                "overlays": {
                    "type": "object",
                    "description": "Kind/name: a JSON merge patch of that object's spec",
                    "additionalProperties": {"type": "object"},
                },
            },
            "additionalProperties": False,
        },
    }, {**defs, "PipelineSpec": pipeline}


def document_schema() -> dict[str, Any]:
    """One document of a fleet's files (a file holds several, `---` between them)."""
    specs, defs = _specs()
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://controlplane.invalid/fleet/v1/document.schema.json",
        "title": "A fleet document (controlplane/v1)",
        "type": "object",
        "properties": {
            "apiVersion": {"const": documents.API_VERSION},
            "kind": {"enum": list(documents.KINDS)},
            "name": NAME,
            "labels": LABELS,
            "description": {"type": "string", "maxLength": documents.MAX_DESCRIPTION},
            "spec": {"type": "object"},
            "deployment": DEPLOYMENT,
        },
        "required": ["apiVersion", "kind", "name", "spec"],
        "additionalProperties": False,
        "allOf": [
            {
                "if": {"properties": {"kind": {"const": kind}}},
                "then": {"properties": {"spec": spec}},
            }
            for kind, spec in specs.items()
        ],
        "$defs": {**defs, "Secret": REFERENCE},
    }
