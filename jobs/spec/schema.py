"""The pipeline spec as JSON Schema (draft 2020-12, which OpenAPI 3.1 uses), built from the
spec's dataclasses (jobs.spec.model) and the validator's limits (jobs.spec.validate): the
types, kinds, defaults, patterns and ranges, so that automation can generate clients and a
fuzzer can generate specs that pass. What a schema cannot say (a DDL schema that parses, SQL
that passes the function allow-list, connections that exist and are of the right kind) is
still checked by `parse_spec`, which stays the one authority.

Plain Python: no Django.
"""

from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Any, Literal

from ..sinks import registry
from . import model
from .avro import FRAMINGS
from .fields import AVRO_FULL_NAME, MAX_DELAY_SECONDS, TOPIC_RE
from .fragments import (
    KAFKA_INTERNAL,
    SOURCE_COLUMN,
    SQL,
    TOPIC,
    connection,
)
from .validate import (
    _GROUP_ID,
    MAX_MIN_PARTITIONS,
    MAX_SINKS,
    OUTPUT_MODES,
    READERS,
    STATE_STORES,
)

_AVRO_NAME = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]{0,62}$"}
# The object form of an Avro record schema, as far as JSON Schema can say it (fields of
# primitive types; the JSON text form takes any record schema fastavro accepts).
AVRO_RECORD = {
    "type": "object",
    "properties": {
        "type": {"const": "record"},
        "name": _AVRO_NAME,
        "fields": {
            "type": "array",
            "minItems": 1,
            "maxItems": 64,
            "items": {
                "type": "object",
                "properties": {
                    "name": _AVRO_NAME,
                    "type": {
                        "enum": ["string", "int", "long", "float", "double", "boolean", "bytes"]
                    },
                },
                "required": ["name", "type"],
                "additionalProperties": False,
            },
        },
    },
    "required": ["type", "name", "fields"],
    "additionalProperties": False,
}
# Per (dataclass, field): what the validator asks beyond the field's type.
_FIELDS: dict[tuple[type, str], dict[str, Any]] = {
    (model.KafkaSource, "topics"): {
        "type": "array",
        "items": TOPIC,
        "minItems": 1,
        "uniqueItems": True,
    },
    (model.KafkaSource, "schema"): {
        "type": "string",
        "minLength": 1,
        "format": "spark-ddl",
        "description": "Spark DDL of the values' columns, e.g. `id STRING, n INT`; for Avro"
        " values, derived from avro_schema (leave it out)",
    },
    (model.KafkaSource, "format"): {"enum": ["json", "avro"]},
    (model.KafkaSource, "connection"): connection("kafka"),
    (model.KafkaSource, "avro_schema"): {
        "anyOf": [{"type": "string", "format": "avro-schema"}, AVRO_RECORD, {"type": "null"}],
        "description": "Avro only: the writers' record schema (JSON text or object)",
    },
    (model.KafkaSource, "avro_framing"): {"enum": list(FRAMINGS)},
    (model.KafkaSource, "starting_offsets"): {
        "oneOf": [
            {"enum": ["earliest", "latest"]},
            {
                "type": "object",
                "properties": {
                    "timestamp": {
                        "anyOf": [
                            {"type": "string", "format": "date-time"},
                            {"type": "integer", "minimum": 0, "maximum": 253402300799999},
                        ]
                    }
                },
                "required": ["timestamp"],
                "additionalProperties": False,
            },
            {
                "type": "object",
                "propertyNames": {"pattern": TOPIC_RE.pattern, "not": {"const": "timestamp"}},
                "additionalProperties": {
                    "type": "object",
                    "propertyNames": {"pattern": "^[0-9]+$"},
                    "additionalProperties": {"type": "integer", "minimum": -2},
                    "minProperties": 1,
                },
                "minProperties": 1,
            },
        ]
    },
    (model.KafkaSource, "max_records_per_batch"): {"type": "integer", "minimum": 1},
    (model.KafkaSource, "reader"): {"enum": [*READERS, None]},
    (model.KafkaSource, "min_partitions"): {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": MAX_MIN_PARTITIONS,
    },
    (model.SchemaRegistry, "connection"): connection("schema-registry"),
    (model.SchemaRegistry, "record"): {
        "type": ["string", "null"],
        "pattern": AVRO_FULL_NAME.pattern,
    },
    (model.SchemaRegistry, "version"): {
        "anyOf": [{"type": "integer", "minimum": 1, "maximum": 2**31 - 1}, {"const": "latest"}],
        "description": "the subject's version the reader schema is; latest: the latest when the"
        " spec is saved",
    },
    (model.SchemaRegistry, "subject"): {"type": ["string", "null"], "maxLength": 255},
    (model.SchemaRegistry, "resolved_version"): {
        "type": ["integer", "null"],
        "minimum": 1,
        "maximum": 2**31 - 1,
    },
    (model.SchemaRegistry, "schema_id"): {
        "type": ["integer", "null"],
        "minimum": 0,
        "maximum": 2**31 - 1,
    },
    (model.KafkaSource, "consumer_group"): {
        "type": ["string", "null"],
        "pattern": f"^{_GROUP_ID.pattern}$",
        "not": KAFKA_INTERNAL,
    },
    (model.Transform, "sql"): {
        **SQL,
        "format": "spark-sql",
        "description": "one Spark SQL query over the view source",
    },
    (model.Transform, "output_mode"): {
        "enum": [*OUTPUT_MODES, None],
        "description": "null: the SQL runs over each micro-batch alone; append: over the "
        "stream, each group written once when the watermark finishes it (a window's final "
        "value); update: over the stream, a group written again after every batch that "
        "changed it (a running value: a postgres upsert keyed by the group, or a kafka sink "
        "with a key). complete is not supported",
    },
    (model.Watermark, "column"): {
        **SOURCE_COLUMN,
        "format": "event-time-column",
        "description": "a TIMESTAMP column of the source schema: the records' event time",
    },
    (model.Watermark, "delay_seconds"): {
        "type": "number",
        "minimum": 0,
        "maximum": MAX_DELAY_SECONDS,
        "description": "how late a record may come: the watermark is the latest event time "
        "seen minus this; older records are dropped (and counted)",
    },
    (model.Deduplicate, "key"): {
        "type": "array",
        "items": SOURCE_COLUMN,
        "minItems": 1,
        "uniqueItems": True,
        "description": "columns of the source schema: a record whose key was seen within the "
        "watermark is dropped",
    },
    (model.Trigger, "interval_seconds"): {"type": "number", "minimum": 0, "maximum": 86400},
    (model.FixedDelay, "attempts"): {"type": "integer", "minimum": 0},
    (model.FailureRate, "max_failures"): {"type": "integer", "minimum": 1},
    (model.FailureRate, "interval_seconds"): {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": MAX_DELAY_SECONDS,
    },
    (model.ExponentialDelay, "initial_backoff_seconds"): {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": MAX_DELAY_SECONDS,
    },
    (model.ExponentialDelay, "max_backoff_seconds"): {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": MAX_DELAY_SECONDS,
    },
    (model.ExponentialDelay, "multiplier"): {"type": "number", "exclusiveMinimum": 1},
    (model.ExponentialDelay, "jitter"): {"type": "number", "minimum": 0, "maximum": 1},
    (model.ExponentialDelay, "reset_after_seconds"): {"type": "number", "exclusiveMinimum": 0},
    (model.ExponentialDelay, "max_attempts"): {"type": ["integer", "null"], "minimum": 1},
    (model.PipelineSpec, "state_store"): {
        "enum": [*STATE_STORES, None],
        "description": "where a stateful pipeline (source.watermark, source.deduplicate or "
        "transform.output_mode) keeps its state; null: rocksdb (RocksDB on the executors' disks, "
        "changelog checkpointing); hdfs: Spark's default (every key in memory). Stateful "
        "pipelines only; a checkpoint keeps the store it started with",
    },
}
# Descriptions of fields whose schema is derived from their type (a reference to a part).
_DESCRIPTIONS: dict[tuple[type, str], str] = {
    (model.KafkaSource, "watermark"): "event time, for stateful pipelines (windows, "
    "deduplication): an aggregation over the stream needs it; null: none",
    (model.KafkaSource, "deduplicate"): "drop records whose key was seen within the watermark, "
    "before the transform (needs watermark); null: none",
}
_DELAY = {"type": "number", "minimum": 0, "maximum": MAX_DELAY_SECONDS}
for _policy in (model.FixedDelay, model.FailureRate):
    _FIELDS[(_policy, "delay_seconds")] = _DELAY
# Each sink kind's fields (jobs.sinks.<kind>.spec.schema): by name for the kind's model, or by
# (dataclass, name) for a part of it.
_FIELDS.update(
    {
        name if isinstance(name, tuple) else (k.model, name): value
        for k in registry.KINDS.values()
        for name, value in k.schema().items()
    }
)
# Fields the spec may leave out although the dataclass has no default (filled in by parse).
_OPTIONAL = {(model.KafkaSource, "schema"), (model.PipelineSpec, "sink")}


def _title(cls: type) -> str:
    return cls.__name__


def _nullable(schema: dict[str, Any]) -> bool:
    """Whether the schema takes null (a null type or an enum with null; not its prose)."""
    return "null" in json.dumps({k: v for k, v in schema.items() if k != "description"})


_REF = "#/$defs/"  # where references point (spec_schema_parts sets another prefix)


def _type_schema(annotation: Any, defs: dict[str, Any]) -> dict[str, Any]:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if annotation is type(None):
        return {"type": "null"}
    if dataclasses.is_dataclass(annotation):
        _define(annotation, defs)
        return {"$ref": f"{_REF}{_title(annotation)}"}
    if origin is Literal:
        return {"enum": list(args)}
    if origin in (typing.Union, types.UnionType):
        members = [_type_schema(a, defs) for a in args]
        kinds = [a for a in args if dataclasses.is_dataclass(a)]
        if len(kinds) == len(args) and all(
            any(f.name == "kind" for f in dataclasses.fields(a)) for a in kinds
        ):
            # Told apart by "kind", as the validator does.
            mapping = {
                typing.get_args(typing.get_type_hints(a)["kind"])[0]: f"{_REF}{_title(a)}"
                for a in kinds
            }
            return {"oneOf": members, "discriminator": {"propertyName": "kind", "mapping": mapping}}
        return {"anyOf": members}
    if origin in (tuple, list):
        return {"type": "array", "items": _type_schema(args[0], defs) if args else {}}
    if origin is dict:
        return {"type": "object", "additionalProperties": _type_schema(args[1], defs)}
    simple = {str: "string", int: "integer", float: "number", bool: "boolean"}
    if annotation in simple:
        return {"type": simple[annotation]}
    return {}


def _define(cls: type, defs: dict[str, Any]) -> None:
    name = _title(cls)
    if name in defs:
        return
    defs[name] = {}  # a placeholder: recursive references end here
    hints = typing.get_type_hints(cls, localns={"Sink": registry.sink_union()})
    properties: dict[str, Any] = {}
    required: list[str] = []
    for f in dataclasses.fields(cls):
        schema = dict(_FIELDS.get((cls, f.name)) or _type_schema(hints[f.name], defs))
        if f.default is not dataclasses.MISSING:
            if f.default is not None or _nullable(schema):
                schema["default"] = f.default
        elif f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            value = f.default_factory()  # type: ignore[misc]
            if not dataclasses.is_dataclass(value):
                schema["default"] = value
        elif (cls, f.name) not in _OPTIONAL:
            required.append(f.name)
        if (cls, f.name) in _DESCRIPTIONS:
            schema["description"] = _DESCRIPTIONS[(cls, f.name)]
        properties[f.name] = schema
    if "kind" in properties:
        kind = typing.get_args(hints["kind"])[0]
        properties["kind"] = {"const": kind, "default": kind}
        if cls is not model.KafkaSource and cls is not registry.kind(registry.DEFAULT).model:
            required.append("kind")  # restart policies and other sinks say which they are
    defs[name] = {
        "type": "object",
        "title": name,
        "description": " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split()),
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }
    if cls is model.KafkaSource:
        defs[name] = _variants(
            defs[name],
            # JSON values: a schema; no Avro settings (the canonical form spells them null).
            json={
                "format": {"const": "json", "default": "json"},
                "avro_schema": {"type": "null", "default": None},
                "avro_framing": {"const": "none", "default": "none"},
            },
            json_required=["schema"],
            # Avro values: the writers' schema; `schema` is derived from it.
            avro={
                "format": {"const": "avro"},
                "avro_schema": {
                    "anyOf": [{"type": "string", "format": "avro-schema"}, AVRO_RECORD]
                },
            },
            avro_required=["format", "avro_schema"],
        )
    variants = next((k.schema_variants for k in registry.KINDS.values() if k.model is cls), None)
    if variants is not None:
        defs[name] = _variants(defs[name], **variants())


def _variants(base: dict[str, Any], **variants: Any) -> dict[str, Any]:
    """`base` as a oneOf of variants, each with some properties narrowed (merged into the
    base's) and more required: what the validator asks of a field depends on another's
    value, which generators follow as separate shapes (not as if/then/else)."""
    names = [k for k in variants if not k.endswith("_required")]
    shapes = []
    for variant in names:
        properties = {
            key: ({**base["properties"][key], **extra} if "const" not in extra else extra)
            for key, extra in variants[variant].items()
        }
        shapes.append(
            {
                **base,
                "title": f"{base['title']} ({variant})",
                "properties": {**base["properties"], **properties},
                "required": sorted({*base["required"], *variants[f"{variant}_required"]}),
            }
        )
    return {"title": base["title"], "description": base["description"], "oneOf": shapes}


def spec_schema_parts(ref_prefix: str = "#/$defs/") -> tuple[dict[str, Any], dict[str, Any]]:
    """(the spec's schema, the schemas it refers to by name), references made with
    `ref_prefix` + name (an OpenAPI document keeps them under #/components/schemas/)."""
    global _REF
    _REF = ref_prefix
    try:
        defs: dict[str, Any] = {}
        _define(model.PipelineSpec, defs)
        spec = defs.pop("PipelineSpec")
        sink = spec["properties"]["sink"]
        spec["properties"]["sinks"] = {
            "type": "array",
            "items": sink,
            "minItems": 1,
            "maxItems": MAX_SINKS,
            "description": "several sinks, each written exactly once (instead of sink)",
        }
        spec["properties"]["transform"] = {
            "anyOf": [{"$ref": f"{ref_prefix}Transform"}, {"type": "null"}],
            "default": None,
        }
        # One sink or several: `sink` or `sinks`, never both.
        spec["oneOf"] = [{"required": ["sink"]}, {"required": ["sinks"]}]
        spec["description"] = (
            "Pipeline spec v1 (docs/spec.md); checked as a whole by parse_spec when submitted."
        )
        return spec, defs
    finally:
        _REF = "#/$defs/"


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of a pipeline spec: one self-contained document with `$defs`."""
    spec, defs = spec_schema_parts()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **spec, "$defs": defs}
