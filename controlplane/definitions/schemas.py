"""A source's schemas from its schema registry, when its spec is saved: the reader schema is
the subject's version the spec names ("latest": the latest now), copied into the spec
(`source.avro_schema`, with the subject, the version and the schema's id beside it under
`schema_registry`), so the pipeline's columns are known and checked on save like any other
spec's; and the compatibility gate: a reader schema that cannot read what producers may
write (a newer version of the subject: a pinned version older than a change its readers
cannot follow), or what the subject's rule says its readers read (the version before it;
every older one under a transitive rule; a NONE or FORWARD rule lets such changes through)
is refused at `source.schema_registry.version`, naming each version and field that breaks
Avro's resolution rules (jobs.registry.compatibility: some registries' own check says only
yes or no).

Only on save (the API's create and update, the forms): a stored spec is run as it was saved.
A registry that does not answer refuses the save (nothing is stored half-resolved)."""

from __future__ import annotations

import copy
import json
from typing import Any

from jobs.registry import compatibility
from jobs.registry.client import NotFound, Registry, RegistryError, Unreachable
from jobs.registry.subjects import NEEDS_RECORD, STRATEGIES, subject
from jobs.spec import FieldError, SpecError

FIELD = "source.schema_registry"
MAX_VERSIONS = 100  # the newest versions the reader is checked against (a request each)


def resolve(spec_data: Any) -> Any:
    """`spec_data` with its source's reader schema filled in from the registry (a copy; the
    same object when the source names no registry). Raises SpecError naming the field."""
    source = spec_data.get("source") if isinstance(spec_data, dict) else None
    wanted = source.get("schema_registry") if isinstance(source, dict) else None
    if not isinstance(wanted, dict):
        return spec_data  # none, or not an object: the spec's own checks say so
    name, strategy = wanted.get("connection"), wanted.get("strategy") or "topic"
    topics = source.get("topics")
    if (
        not isinstance(name, str)
        or strategy not in STRATEGIES
        or not isinstance(topics, list)
        or not topics
        or not isinstance(topics[0], str)
        or (strategy in NEEDS_RECORD and not isinstance(wanted.get("record"), str))
    ):
        return spec_data  # incomplete: the spec's own checks name what is missing
    version = wanted.get("version", "latest")
    the_subject = subject(strategy, topics[0], wanted.get("record"))
    arguments = _arguments(name)
    if arguments is None:
        return spec_data  # no such schema-registry connection: said by the spec's checks
    try:
        with Registry(arguments) as registry:
            found = registry.version(the_subject, version)
            level = registry.compatibility_level(the_subject)
            numbers = registry.versions(the_subject)
            writers = {
                v: registry.version(the_subject, v)
                for v in writer_versions(found.version, numbers, level)
            }
    except NotFound:
        what = f"version {version} of subject" if version != "latest" else "subject"
        raise SpecError(
            [FieldError(FIELD, f"the registry has no {what} {the_subject!r}")]
        ) from None
    except Unreachable as exc:
        raise SpecError([FieldError(FIELD, str(exc))]) from None
    except RegistryError as exc:
        raise SpecError([FieldError(FIELD, f"the registry: {exc}")]) from None
    # The gate: the reader must read what producers may write now (every newer version) and
    # what the rule says readers of this version read (the one before it; with a transitive
    # rule, every older one).
    errors = []
    for number, writer in sorted(writers.items()):
        try:
            found_problems = compatibility.problems(
                json.loads(found.schema), json.loads(writer.schema)
            )
        except (ValueError, RecursionError, AttributeError, TypeError, KeyError):
            # Not Avro as a registry holds it (or nested too deep to compare).
            found_problems = [
                "the registry's schema cannot be compared (not Avro JSON, or too deep)"
            ]
        if found_problems:
            errors.append(
                f"version {found.version} of {the_subject!r} cannot read what version {number}"
                f" writes (the subject's rule: {level}): " + "; ".join(found_problems)
            )
    if errors:
        raise SpecError([FieldError(f"{FIELD}.version", e) for e in errors])
    out = copy.deepcopy(spec_data)
    out["source"]["avro_schema"] = found.schema
    out["source"].pop("schema", None)  # derived from the Avro schema
    out["source"]["schema_registry"] = {
        **wanted,
        "subject": the_subject,
        "resolved_version": found.version,
        "schema_id": found.id,
    }
    return out


def writer_versions(reader: int, versions: list[int], level: str) -> list[int]:
    """The versions a reader of version `reader` must read: the newer ones (producers may
    write them now), and the one before it (all before it, with a transitive rule); at most
    MAX_VERSIONS, the newest."""
    newer = [v for v in versions if v > reader]
    older = [v for v in versions if v < reader]
    if not level.upper().endswith("_TRANSITIVE"):
        older = older[-1:]
    return sorted([*older, *newer])[-MAX_VERSIONS:]


def _arguments(name: str) -> dict[str, Any] | None:
    """The named schema-registry connection's client arguments (None if there is none)."""
    from controlplane.connections.models import Connection, ConnectionKind
    from controlplane.connections.policy import registry_connection_arguments

    connection = Connection.objects.filter(name=name, kind=ConnectionKind.SCHEMA_REGISTRY).first()
    if connection is None:
        return None
    try:
        return registry_connection_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        raise SpecError([FieldError(FIELD, f"connection {name!r}: {exc}")]) from None
