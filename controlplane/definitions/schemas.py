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

And the same gate for each kafka sink writing Avro (`format: avro`) whose value's type is known
when the spec is saved (no transform and no `value` expression: the value is then a record of
the source's columns, every one nullable at every depth, as Spark's parsers give them): the
Avro schema Spark will register for it at the run's first batch (jobs.registry.spark_avro, a
port of Spark's toAvroType; a type or a name Spark cannot write as Avro is refused) is checked
against the subject's versions under the subject's compatibility rule (BACKWARD, the registry's
default: it must read the latest version; FORWARD: the latest must read it; FULL: both; a
transitive rule: every version, the MAX_VERSIONS newest; NONE: nothing), and refused at
`sink.schema_registry` (`sinks[i].schema_registry`) naming the subject, the rule, the version
and each field that breaks Avro's resolution rules; a schema the subject already has (the
registry would return its id) or a subject without versions passes, and nothing is registered.
With a transform or a `value` expression only Spark knows the value's type: the rule is checked
when the run starts (an incompatible schema stops it with a definition error). The sink's check
changes nothing in the spec.

Only on save (the API's create and update, the forms): a stored spec is run as it was saved.
A registry that does not answer refuses the save (nothing is stored half-resolved)."""

from __future__ import annotations

import copy
import json
from typing import Any

from jobs.registry import compatibility, spark_avro
from jobs.registry.client import NotFound, Registry, RegistryError, Unreachable
from jobs.registry.subjects import NEEDS_RECORD, STRATEGIES, subject
from jobs.sinks.kafka.model import KafkaSink
from jobs.spec import FieldError, PipelineSpec, SpecError
from jobs.spec.ddl import parse_schema

FIELD = "source.schema_registry"
# The newest versions a source's reader, or a sink's schema under a transitive rule, is checked
# against (a request each).
MAX_VERSIONS = 100

# A subject's compatibility rule -> what a new schema is checked for: (it reads the registered
# versions, they read it, against every version rather than the latest).
SINK_RULES = {
    "NONE": (False, False, False),
    "BACKWARD": (True, False, False),
    "BACKWARD_TRANSITIVE": (True, False, True),
    "FORWARD": (False, True, False),
    "FORWARD_TRANSITIVE": (False, True, True),
    "FULL": (True, True, False),
    "FULL_TRANSITIVE": (True, True, True),
}
DEFAULT_RULE = "BACKWARD"  # a rule this does not know is checked as the registry's default


def resolve(spec_data: Any) -> Any:
    """`spec_data` with its source's reader schema filled in from the registry (a copy; the
    same object when the source names no registry), its kafka sinks' Avro schemas checked
    against their subjects (check_sinks). Raises SpecError naming the field."""
    resolved = _resolve_source(spec_data)
    check_sinks(resolved)
    return resolved


def _resolve_source(spec_data: Any) -> Any:
    """The source's part of resolve: its reader schema from the registry, and its gate."""
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


def _arguments(name: str, field: str = FIELD) -> dict[str, Any] | None:
    """The named schema-registry connection's client arguments (None if there is none);
    its settings refused at `field`."""
    try:
        return registry_arguments(name)
    except ValueError as exc:
        raise SpecError([FieldError(field, f"connection {name!r}: {exc}")]) from None


def registry_arguments(name: str) -> dict[str, Any] | None:
    """The named schema-registry connection's client arguments (None if there is none;
    ValueError naming the problem if the policy refuses its settings)."""
    from controlplane.connections.models import Connection, ConnectionKind
    from controlplane.connections.policy import registry_connection_arguments

    connection = Connection.objects.filter(name=name, kind=ConnectionKind.SCHEMA_REGISTRY).first()
    if connection is None:
        return None
    return registry_connection_arguments(connection.settings, connection.get_secrets())


# -- kafka sinks writing Avro ------------------------------------------------------------------


def check_sinks(spec_data: Any) -> None:
    """The sink gate: each kafka sink writing Avro whose value's Avro schema is known now
    (sink_value_schema), checked against its subject's versions under the subject's rule.
    Raises SpecError at `sink.schema_registry` (`sinks[i].schema_registry`); changes nothing.
    A spec that does not validate is left to its own checks (they run after this)."""
    if not _names_avro_sink(spec_data):
        return
    from . import services  # services imports this module

    try:
        spec = services.validate(spec_data)
    except SpecError:
        return  # the spec's own checks say what is wrong
    errors: list[FieldError] = []
    for path, sink in avro_sinks(spec):
        field = f"{path}.schema_registry"
        try:
            schema = sink_value_schema(spec, sink)
        except spark_avro.NotWritable as exc:
            errors.append(FieldError(field, f"Spark cannot write the output as Avro: {exc}"))
            continue
        if schema is None:
            continue  # known only when the run starts: checked then
        arguments = _arguments(sink.schema_registry.connection, field)
        if arguments is None:
            continue  # no such connection: said by the spec's checks
        try:
            with Registry(arguments) as registry:
                found = sink_problems(registry, sink_subject(sink), schema)
        except Unreachable as exc:
            found = [str(exc)]
        except RegistryError as exc:
            found = [f"the registry: {exc}"]
        errors.extend(FieldError(field, message) for message in found)
    if errors:
        raise SpecError(errors)


def avro_sinks(spec: PipelineSpec) -> list[tuple[str, KafkaSink]]:
    """(field path, sink) of each kafka sink writing Avro through a registry."""
    return [
        (f"sinks[{i}]" if spec.sinks else "sink", sink)
        for i, sink in enumerate(spec.all_sinks())
        if isinstance(sink, KafkaSink) and sink.format == "avro" and sink.schema_registry
    ]


def sink_value_schema(spec: PipelineSpec, sink: KafkaSink) -> dict | None:
    """The Avro schema (parsed JSON) Spark writes the sink's values with, when it is known
    without Spark: no transform and no `value` expression. The value is then a record of the
    source's columns (jobs.sinks.kafka.client RecordColumns: the parsed columns, no Kafka
    metadata), each nullable at every depth (from_json's and from_avro's types, and the
    registry's decoder's, are), named by the sink's `schema_registry.record`. None: only
    Spark knows (a transform, a value expression). Raises spark_avro.NotWritable where
    Spark's converter fails."""
    if spec.transform is not None or sink.value is not None:
        return None
    value = spark_avro.as_nullable(parse_schema(spec.source.schema))
    name, namespace = spark_avro.record_name(sink.schema_registry.record)
    return spark_avro.to_avro_type(value, False, name, namespace)


def sink_subject(sink: KafkaSink) -> str:
    """The subject the sink's values are registered under (as jobs.sinks.kafka.client names
    it at the run's start)."""
    return sink.value_subject()


def sink_problems(registry: Registry, the_subject: str, schema: dict) -> list[str]:
    """Why `schema` would break the subject's compatibility rule, in words naming the
    subject, the rule, each version and field ([] if it would not). A schema the subject has
    (the registry's lookup, or equal to a version checked) and a subject without versions
    pass. `registry`: anything with Registry's lookup, versions, compatibility_level and
    version."""
    if registry.lookup(the_subject, spark_avro.to_json(schema)) is not None:
        return []  # registered: the run's registration returns its id
    try:
        numbers = registry.versions(the_subject)
    except NotFound:
        return []  # a new subject: the schema is its first version
    if not numbers:
        return []
    level = registry.compatibility_level(the_subject).upper()
    reads, read_by, transitive = SINK_RULES.get(level, SINK_RULES[DEFAULT_RULE])
    if not (reads or read_by):
        return []
    wanted = sorted(numbers)[-MAX_VERSIONS:] if transitive else [max(numbers)]
    registered = {}
    for number in wanted:
        try:
            found = registry.version(the_subject, number)
        except NotFound:
            continue  # deleted since the subject's versions were listed
        try:
            registered[number] = json.loads(found.schema)
        except ValueError:
            registered[number] = None
        if registered[number] == schema:
            return []
    out = []
    for number, theirs in sorted(registered.items()):
        checks = []
        if reads:  # the new schema reads what this version wrote
            checks.append((f"it cannot read what version {number} wrote", schema, theirs))
        if read_by:  # this version's readers read what the new schema writes
            checks.append((f"version {number} cannot read what it writes", theirs, schema))
        for what, reader, writer in checks:
            found = _problems(reader, writer)
            if found:
                out.append(
                    f"the output's Avro schema breaks the compatibility rule {level} of"
                    f" subject {the_subject!r}: {what}: " + "; ".join(found)
                )
    return out


def _problems(reader: Any, writer: Any) -> list[str]:
    if reader is None or writer is None:
        return ["the registry's schema cannot be compared (not Avro JSON)"]
    try:
        return compatibility.problems(reader, writer)
    except (ValueError, RecursionError, AttributeError, TypeError, KeyError):
        return ["the registry's schema cannot be compared (not Avro JSON, or too deep)"]


def _names_avro_sink(spec_data: Any) -> bool:
    """Whether the spec's data names a sink writing Avro through a registry (before it is
    validated)."""
    if not isinstance(spec_data, dict):
        return False
    sinks = spec_data.get("sinks")
    sinks = sinks if isinstance(sinks, list) else [spec_data.get("sink")]
    return any(
        isinstance(s, dict) and s.get("format") == "avro" and s.get("schema_registry") is not None
        for s in sinks
    )


def summary(spec: PipelineSpec) -> dict[str, dict]:
    """What a saved spec's schema-registry parts were checked against, by field, for a plan
    to show: the source's subject, version and schema id (its reader passed the gate), and
    each Avro kafka sink's subject and when its schema is checked (when saved, when Spark
    alone knows the output's type: at its run's first batch)."""
    out: dict[str, dict] = {}
    registry = getattr(spec.source, "schema_registry", None)
    if registry is not None and registry.resolved_version is not None:
        out[FIELD] = {
            "subject": registry.subject,
            "version": registry.resolved_version,
            "schema_id": registry.schema_id,
            "checked": "its reader reads the subject's newer versions and the one before",
        }
    for path, sink in avro_sinks(spec):
        try:
            known = sink_value_schema(spec, sink) is not None
        except spark_avro.NotWritable:
            known = False
        out[f"{path}.schema_registry"] = {
            "subject": sink_subject(sink),
            "checked": "against the subject's versions, when saved"
            if known
            else "at its run's first batch (only Spark knows the output's type)",
        }
    return out
