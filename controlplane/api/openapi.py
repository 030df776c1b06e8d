"""The OpenAPI document's additions: the pipeline spec as JSON Schema (jobs.spec.schema),
under components/schemas (PipelineSpec and Spec* for its parts), so that clients see every
source, sink and restart policy kind instead of an untyped object; and the 400 answer of every
operation that takes a body (its field errors), which a fuzzer's requests get most often."""

from __future__ import annotations

from jobs.spec.schema import spec_schema_parts

PREFIX = "Spec"


def add_spec_schemas(result, generator, request, public):
    """A drf-spectacular postprocessing hook."""
    spec, parts = spec_schema_parts(f"#/components/schemas/{PREFIX}")
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.update({f"{PREFIX}{name}": schema for name, schema in parts.items()})
    schemas["PipelineSpec"] = spec
    schemas["FieldErrors"] = FIELD_ERRORS
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            if "{" in path and method in ("get", "put", "patch", "delete", "post"):
                operation.setdefault("responses", {}).setdefault(
                    "404", {"description": "No such object (or not visible to this user)"}
                )
            if method in ("post", "put", "patch") and "requestBody" in operation:
                operation.setdefault("responses", {}).setdefault(
                    "400",
                    {
                        "description": "The body was refused: what is wrong, by field",
                        "content": {
                            "application/json": {
                                "schema": {"$ref": "#/components/schemas/FieldErrors"}
                            }
                        },
                    },
                )
    return result


# A refused body: each field (a dotted path such as spec.source.topics, or detail /
# non_field_errors) with its messages; nested serializers nest.
FIELD_ERRORS = {
    "type": "object",
    "description": "Field errors: each field with what is wrong with it",
    "additionalProperties": {
        "anyOf": [
            {"type": "array", "items": {"anyOf": [{"type": "string"}, {"type": "object"}]}},
            {"type": "string"},
            {"type": "object"},
        ]
    },
    "example": {"spec.source.topics": ["must be a non-empty list of topic names"]},
}
