"""The OpenAPI document's additions: the pipeline spec as JSON Schema (jobs.spec.schema),
under components/schemas (PipelineSpec and Spec* for its parts), so that clients see every
source, sink and restart policy kind instead of an untyped object."""

from __future__ import annotations

from jobs.spec.schema import spec_schema_parts

PREFIX = "Spec"


def add_spec_schemas(result, generator, request, public):
    """A drf-spectacular postprocessing hook."""
    spec, parts = spec_schema_parts(f"#/components/schemas/{PREFIX}")
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.update({f"{PREFIX}{name}": schema for name, schema in parts.items()})
    schemas["PipelineSpec"] = spec
    return result
