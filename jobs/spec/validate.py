"""Turning submitted JSON into a `PipelineSpec`, or into a list of every problem with it.

Operators fix a spec faster when they see all its problems at once, each named by its path
(`source.schema`, `restart_policy.delay_seconds`), so validation never stops at the first one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from ..kafka.names import internal_problem
from .avro import FRAMINGS, AvroSchemaError, avro_to_ddl
from .ddl import ArrayType, DDLError, MapType, StructType, parse_schema, to_ddl
from .fields import (
    LONG_MAX,
    MAX_DELAY_SECONDS,
    FieldError,
    Section,
    SpecError,
    is_topic_name,
    registry_subject,
)
from .fields import check_connection as _check_connection
from .fields import names as _names
from .fields import not_output as _not_output
from .fields import output_columns_of as _output_columns
from .model import (
    Deduplicate,
    ExponentialDelay,
    FailureRate,
    FixedDelay,
    KafkaSource,
    NoRestart,
    PipelineSpec,
    SchemaRegistry,
    Transform,
    Trigger,
    Watermark,
)
from .sql import (
    SQLError,
    check_transform_sql,
)
from .streaming import stream_shape


def _registry():
    """The sink kinds (jobs.sinks.registry), imported when first asked for: each kind's own
    parser reads this package's modules, so the registry is not imported with them."""
    from ..sinks import registry

    return registry


def parse_spec(
    data: Any,
    *,
    connections: Mapping[str, str] | None = None,
) -> PipelineSpec:
    """Validate `data` and return the typed spec, or raise SpecError naming every problem.

    `connections` maps the names of existing connections to their kind ("kafka", "postgres");
    when given, references to missing connections or connections of the wrong kind are errors.
    """
    errors: list[FieldError] = []
    top = Section(errors, "", data, _names(PipelineSpec))
    source = _parse_source(errors, top.get("source"), connections)
    transform = _parse_transform(errors, top.get("transform", None), source)
    sinks: tuple = ()
    if top.data.get("sinks") is not None:
        if top.data.get("sink") is not None:
            top.error("sink", "give either sink (one) or sinks (several), not both")
        sinks = _parse_sinks(errors, top, connections, source, transform)
        sink = sinks[0] if sinks else None
    else:
        sink = _parse_sink(errors, top.get("sink"), connections, source, transform)
    trigger = _parse_trigger(errors, top.get("trigger", {}))
    policy = parse_restart_policy(top.get("restart_policy", {"kind": "exponential-delay"}), errors)
    state_store = top.string("state_store", None, choices=STATE_STORES)
    if errors:
        raise SpecError(errors)
    assert source and sink and trigger and policy
    spec = PipelineSpec(
        source=source,
        transform=transform,
        sink=sink,
        sinks=sinks,
        trigger=trigger,
        restart_policy=policy,
        state_store=state_store,
    )
    _check_stateful(errors, spec)
    _check_output_keys(errors, spec)
    if errors:
        raise SpecError(errors)
    return spec


def _check_output_keys(errors: list[FieldError], spec: PipelineSpec) -> None:
    """An upsert's key columns are columns of the transform's output, where its SQL tells
    them (checked after the stateful checks, whose message about a key is the more telling).
    Where the output is only known to Spark, the run finds out: the sink's CREATE TABLE
    refuses the key (SQLSTATE 42703), a permanent failure (jobs.failures)."""
    if spec.transform is None:
        return  # the source schema's columns: checked with the sink
    columns = None
    reported = {e.field for e in errors}
    for i, sink in enumerate(spec.all_sinks()):
        named = _registry().of(sink).named_columns(sink)
        if not named:
            continue
        columns = columns or _output_columns(spec.source, spec.transform)
        if columns is None:
            return
        path = f"sinks[{i}]" if spec.sinks else "sink"
        for where, column in named:
            field = f"{path}.{where}"
            if column.lower() not in columns and field not in reported:
                errors.append(FieldError(field, f"column {column!r} is not {_not_output(columns)}"))


STATE_STORES = ("rocksdb", "hdfs")
OUTPUT_MODES = ("append", "update")


def _check_stateful(errors: list[FieldError], spec: PipelineSpec) -> None:
    """What Spark would refuse when a stateful pipeline starts, or run with state that grows
    without bound (jobs.spec.streaming), and sinks that cannot take its output mode."""
    if not spec.stateful:
        if spec.state_store is not None:
            errors.append(
                FieldError(
                    "state_store",
                    "applies to stateful pipelines only (source.watermark, "
                    "source.deduplicate or transform.output_mode)",
                )
            )
        return
    watermark = spec.source.watermark
    mode = spec.output_mode
    shape = None
    if spec.transform is not None:
        try:
            shape = stream_shape(spec.transform.sql, watermark.column if watermark else None)
        except SQLError as exc:
            errors.append(FieldError("transform.sql", str(exc)))
            return
    if shape is not None and shape.aggregates:
        if watermark is None:
            why = (
                "append writes each group once, when the watermark finishes it: without a "
                "watermark Spark refuses the query"
                if mode == "append"
                else "without one the aggregation's state grows without bound (no group "
                "is ever finished)"
            )
            errors.append(FieldError("source.watermark", f"is required for an aggregation: {why}"))
        elif shape.time_grouped is False:
            errors.append(
                FieldError(
                    "transform.sql",
                    "the aggregation does not group by event time, so the watermark never "
                    "finishes a group: its state grows without bound"
                    + (" and append mode never writes it" if mode == "append" else "")
                    + f"; GROUP BY window({watermark.column}, '5 minutes') (or "
                    f"session_window, or {watermark.column} itself) with the other keys",
                )
            )
    if shape is not None and shape.session_windows and mode == "update":
        errors.append(
            FieldError(
                "transform.output_mode",
                "session windows take append output only (Spark refuses update for them): "
                "use append, or window() for running counts",
            )
        )
    for i, sink in enumerate(spec.all_sinks()):
        path = f"sinks[{i}]" if spec.sinks else "sink"
        # (Update output without an aggregation is each new row once, as in append.)
        if mode == "update" and shape is not None and shape.aggregates:
            _check_update_sink(errors, sink, path, shape)


def _check_update_sink(errors: list[FieldError], sink, path: str, shape) -> None:
    """A sink of update output: every batch rewrites the groups it changed (its kind says
    whether and how it can)."""
    _registry().of(sink).check_update(errors, sink, path, shape)


MAX_SINKS = 8


def _parse_sinks(
    errors: list[FieldError],
    top: Section,
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
) -> tuple:
    """`sinks`: a list of sinks, each written exactly once with markers of its own."""
    data = top.data["sinks"]
    if not isinstance(data, list) or not data:
        top.error("sinks", "must be a non-empty list of sinks")
        return ()
    if len(data) > MAX_SINKS:
        top.error("sinks", f"at most {MAX_SINKS} sinks per pipeline, got {len(data)}")
        return ()
    before = len(errors)
    parsed = [
        _parse_sink(errors, item, connections, source, transform, path=f"sinks[{i}]")
        for i, item in enumerate(data)
    ]
    seen: dict[tuple, int] = {}
    for i, sink in enumerate(parsed):
        if sink is None:
            continue
        # Targets of one kind in one connection that overlap without being equal (a files
        # path inside another's), where the kind says targets can.
        overlaps = _registry().of(sink).overlaps
        target = (sink.kind, sink.connection, sink_target(sink))
        nested = next(
            (
                j
                for other, j in seen.items()
                if overlaps is not None
                and other[:2] == target[:2]
                and overlaps(other[2], target[2])
            ),
            None,
        )
        if target not in seen and nested is not None:
            errors.append(
                FieldError(
                    f"sinks[{i}]",
                    f"path {target[2]!r} is inside sinks[{nested}]'s or holds it: readers of "
                    "one would see the other's files",
                )
            )
        if target in seen:
            errors.append(
                FieldError(
                    f"sinks[{i}]",
                    f"writes where sinks[{seen[target]}] writes ({target[1]}: {target[2]})",
                )
            )
        seen.setdefault(target, i)
    if len(errors) > before:
        return ()
    return tuple(parsed)


def sink_target(sink) -> str:
    """What a sink writes, within its connection: a table, a topic, a path (its kind's
    `target`)."""
    return _registry().of(sink).target(sink)


def _parse_sink(
    errors: list[FieldError],
    data: Any,
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
    *,
    path: str = "sink",
):
    """One sink, parsed by its kind (jobs.sinks.registry; no kind: postgres)."""
    if data is None:
        return None
    if not isinstance(data, Mapping):
        Section(errors, path, data, set())  # "must be an object"
        return None
    name = data.get("kind")
    if name is None:
        name = _registry().DEFAULT
    kinds = _registry().names()
    if not isinstance(name, str) or not name.strip():
        errors.append(FieldError(f"{path}.kind", "must be a non-empty string"))
        return None
    if name not in kinds:
        errors.append(
            FieldError(f"{path}.kind", f"must be one of {', '.join(kinds)}; got {name!r}")
        )
        return None
    return _registry().kind(name).parse(errors, data, connections, source, transform, path=path)


def _parse_source(
    errors: list[FieldError], data: Any, connections: Mapping[str, str] | None
) -> KafkaSource | None:
    if data is None:
        return None  # already reported as required
    s = Section(errors, "source", data, _names(KafkaSource))
    s.string("kind", "kafka", choices=("kafka",))
    connection = s.string("connection")
    _check_connection(s, connection, "kafka", connections)
    topics = _parse_topics(s)
    fmt = s.string("format", "json", choices=FORMATS)
    avro_schema, framing = None, "none"
    registry = None
    if fmt == "avro":
        avro_schema, derived = _parse_avro(s)
        framing = s.string("avro_framing", "none", choices=FRAMINGS)
        registry = _parse_registry(s, framing, topics or (), connections)
        given = s.get("schema", None)
        schema = derived
        if given is not None and derived is not None and _ddl_or_none(given) != derived:
            s.error(
                "schema",
                "is derived from avro_schema for Avro values: leave it out (it would be "
                f"{derived})",
            )
    else:
        for name in ("avro_schema", "avro_framing", "schema_registry"):
            if s.data.get(name) not in (None, "none"):
                s.error(name, "applies to format avro only")
        schema = s.string("schema")
    if schema is not None:
        try:
            parsed = parse_schema(schema)
        except DDLError as exc:
            s.error("schema", f"is not a valid Spark DDL schema: {exc}")
        else:
            fixed = [n for n in _type_names(parsed) if n.startswith(("char(", "varchar("))]
            if fixed:
                s.error(
                    "schema",
                    f"{fixed[0].upper()} cannot be used to parse JSON (Spark's from_json "
                    "refuses it): use STRING",
                )
            reserved = [f.name for f in parsed.fields if f.name.lower().startswith("_cp_")]
            if reserved:
                s.error(
                    "schema",
                    f"column {reserved[0]!r}: names starting with _cp_ are reserved for the"
                    " control plane's own columns",
                )
    starting = _parse_starting_offsets(s, topics or ())
    max_records = s.integer("max_records_per_batch", KafkaSource.max_records_per_batch, minimum=1)
    fail_on_data_loss = s.boolean("fail_on_data_loss", True)
    reader = s.string("reader", None, choices=READERS)
    min_partitions = s.integer("min_partitions", None, minimum=1, maximum=MAX_MIN_PARTITIONS)
    group = s.string("consumer_group", None)
    if group is not None and not _GROUP_ID.fullmatch(group):
        s.error(
            "consumer_group",
            f"must be 1-249 characters of letters, digits, '.', '_' and '-'; got {group!r}",
        )
    elif group is not None and (problem := internal_problem("consumer group", group)):
        s.error("consumer_group", problem)
    watermark, deduplicate = _parse_event_time(s, schema if s.ok else None)
    if not s.ok:
        return None
    return KafkaSource(
        connection=connection,
        topics=tuple(topics),
        schema=schema,
        format=fmt,
        avro_schema=avro_schema,
        avro_framing=framing,
        starting_offsets=starting,
        max_records_per_batch=max_records,
        fail_on_data_loss=fail_on_data_loss,
        reader=reader,
        min_partitions=min_partitions,
        consumer_group=group,
        watermark=watermark,
        deduplicate=deduplicate,
        schema_registry=registry,
    )


MAX_SUBJECT = 255


def _parse_registry(
    s: Section, framing: str | None, topics: Sequence[str], connections: Mapping[str, str] | None
) -> SchemaRegistry | None:
    """source.schema_registry: where the values' schemas are (Confluent-framed Avro)."""
    data = s.get("schema_registry", None)
    if data is None:
        return None
    if framing != "confluent":
        s.error("schema_registry", "needs avro_framing: confluent (a schema id in every value)")
        return None
    r = Section(s.errors, s.at("schema_registry"), data, _names(SchemaRegistry))
    connection, strategy, record = registry_subject(r, connections)
    version = r.get("version", "latest")
    if version != "latest" and (
        isinstance(version, bool) or not isinstance(version, int) or not 1 <= version < 2**31
    ):
        r.error("version", f'must be "latest" or a version number (1 or more); got {version!r}')
    subject = r.string("subject", None)
    if subject is not None and len(subject) > MAX_SUBJECT:
        r.error("subject", f"at most {MAX_SUBJECT} characters")
    resolved = r.integer("resolved_version", None, minimum=1, maximum=2**31 - 1)
    schema_id = r.integer("schema_id", None, minimum=0, maximum=2**31 - 1)
    if not r.ok:
        return None
    return SchemaRegistry(
        connection=connection,
        strategy=strategy,
        record=record,
        version=version,
        subject=subject,
        resolved_version=resolved,
        schema_id=schema_id,
    )


# Spark's event time is a TIMESTAMP (from_json reads ISO 8601 text and epoch seconds into it).
EVENT_TIME_TYPES = ("timestamp",)


def _parse_event_time(s: Section, schema: str | None) -> tuple[Any, Any]:
    """source.watermark and source.deduplicate, checked against the source schema."""
    columns = {}
    if schema is not None:
        columns = {f.name.lower(): f for f in parse_schema(schema).fields}
    watermark = None
    data = s.get("watermark", None)
    if data is not None:
        w = Section(s.errors, s.at("watermark"), data, _names(Watermark))
        column = w.string("column")
        delay = w.number("delay_seconds", maximum=MAX_DELAY_SECONDS)
        field = columns.get(column.lower()) if column else None
        if column is not None and columns and field is None:
            w.error("column", f"column {column!r} is not in the source schema")
        elif field is not None and field.type.name not in EVENT_TIME_TYPES:
            w.error(
                "column",
                f"column {column!r} is {field.type.name.upper()}: event time must be a "
                "TIMESTAMP column of the source schema",
            )
        if w.ok:
            watermark = Watermark(column=field.name if field else column, delay_seconds=delay)
        else:
            s.ok = False
    deduplicate = None
    data = s.get("deduplicate", None)
    if data is not None:
        d = Section(s.errors, s.at("deduplicate"), data, _names(Deduplicate))
        key = d.get("key")
        if isinstance(key, str):
            key = [key]
        if key is not None and (not isinstance(key, list) or not key):
            d.error("key", "must be a non-empty list of source columns")
            key = None
        for i, column in enumerate(key or []):
            if not isinstance(column, str):
                d.error(f"key[{i}]", f"must be a column name, got {column!r}")
            elif columns and column.lower() not in columns:
                d.error(f"key[{i}]", f"column {column!r} is not in the source schema")
        if key and len({str(c).lower() for c in key}) != len(key):
            d.error("key", "lists a column twice")
        if s.data.get("watermark") is None:
            d.error(
                "",
                "needs source.watermark: a key is remembered until the watermark passes "
                "its first record (without one, every key would be kept forever)",
            )
        if d.ok:
            named = [columns[c.lower()].name if columns else c for c in key]
            deduplicate = Deduplicate(key=tuple(named))
        else:
            s.ok = False
    return watermark, deduplicate


_GROUP_ID = re.compile(r"[A-Za-z0-9._-]{1,249}")
FORMATS = ("json", "avro")


def _parse_avro(s: Section) -> tuple[str | None, str | None]:
    """(canonical Avro schema JSON, the Spark DDL of its columns), or Nones after an error.
    avro_to_ddl checks the schema's size, nesting and inlined size first (the limits in
    jobs/spec/avro.py), and says every problem as an AvroSchemaError."""
    given = s.get("avro_schema")
    if given is None:
        return None, None
    try:
        return avro_to_ddl(given)
    except AvroSchemaError as exc:
        s.error("avro_schema", str(exc))
    return None, None


def _ddl_or_none(text: Any) -> str | None:
    if not isinstance(text, str):
        return None
    try:
        return to_ddl(parse_schema(text))
    except DDLError:
        return None


READERS = ("spark-kafka", "python")
MAX_MIN_PARTITIONS = 10_000


def _type_names(t: Any) -> list[str]:
    """Every primitive type name in a parsed schema, nested ones included."""
    if isinstance(t, StructType):
        return [n for f in t.fields for n in _type_names(f.type)]
    if isinstance(t, ArrayType):
        return _type_names(t.element)
    if isinstance(t, MapType):
        return _type_names(t.key) + _type_names(t.value)
    return [t.name]


def _parse_topics(s: Section) -> list[str] | None:
    topics = s.get("topics")
    if topics is None:
        return None
    if isinstance(topics, str):
        topics = [topics]
    if not isinstance(topics, list) or not topics:
        s.error("topics", "must be a non-empty list of topic names")
        return None
    seen: set[str] = set()
    for i, topic in enumerate(topics):
        if not isinstance(topic, str) or not is_topic_name(topic):
            s.error(f"topics[{i}]", f"{topic!r} is not a valid Kafka topic name")
        elif problem := internal_problem("topic", topic):
            s.error(f"topics[{i}]", problem)
        elif topic in seen:
            s.error(f"topics[{i}]", f"topic {topic!r} is listed twice")
        else:
            seen.add(topic)
    return topics


STARTING_FORMS = "'earliest', 'latest', {topic: {partition: offset}} or {\"timestamp\": ...}"


def _parse_starting_offsets(s: Section, topics: list[str] | tuple[str, ...]) -> Any:
    value = s.get("starting_offsets", "latest")
    if value in ("earliest", "latest"):
        return value
    if isinstance(value, str):
        s.error("starting_offsets", f"must be {STARTING_FORMS}; got {value!r}")
        return None
    if not isinstance(value, Mapping) or not value:
        s.error("starting_offsets", f"must be {STARTING_FORMS}")
        return None
    if len(value) == 1 and "timestamp" in value and not isinstance(value["timestamp"], Mapping):
        # (A topic named "timestamp" maps to partitions, so the two forms cannot be confused.)
        return _parse_starting_timestamp(s, value["timestamp"])
    out: dict[str, dict[str, int]] = {}
    for topic, partitions in value.items():
        where = f"starting_offsets.{topic}"
        if topics and topic not in topics:
            s.error(where, f"topic {topic!r} is not one of source.topics")
            continue
        if not isinstance(partitions, Mapping) or not partitions:
            s.error(where, "must map partition numbers to offsets")
            continue
        out[topic] = {}
        for partition, offset in partitions.items():
            if not str(partition).isdigit():
                s.error(f"{where}.{partition}", "partition must be a number")
            elif (
                isinstance(offset, bool)
                or not isinstance(offset, int)
                or not -2 <= offset <= LONG_MAX
            ):
                s.error(
                    f"{where}.{partition}",
                    f"offset must be 0 to 2^63-1, or -2 (earliest) / -1 (latest); got {offset!r}",
                )
            else:
                out[topic][str(int(partition))] = offset
    return out


def _parse_starting_timestamp(s: Section, value: Any) -> dict[str, str] | None:
    """An ISO 8601 time with a UTC offset (or epoch milliseconds), kept as ISO 8601 in UTC."""
    where = "starting_offsets.timestamp"
    try:
        if isinstance(value, bool):
            raise TypeError
        if isinstance(value, int):
            moment = datetime.fromtimestamp(value / 1000, tz=UTC)
        elif isinstance(value, str):
            moment = datetime.fromisoformat(value.strip())
            if moment.tzinfo is None:
                s.error(where, f"needs a UTC offset (such as Z or +01:00); got {value!r}")
                return None
        else:
            raise TypeError
    except (TypeError, ValueError, OverflowError, OSError):
        s.error(
            where,
            "must be an ISO 8601 time such as '2026-11-21T10:00:00Z', or epoch milliseconds;"
            f" got {value!r}",
        )
        return None
    text = moment.astimezone(UTC).isoformat().replace("+00:00", "Z")
    return {"timestamp": text}


def _parse_transform(
    errors: list[FieldError], data: Any, source: KafkaSource | None
) -> Transform | None:
    if data is None:
        return None
    s = Section(errors, "transform", data, _names(Transform))
    sql = s.string("sql")
    mode = s.get("output_mode", None)
    if mode == "complete":
        s.error(
            "output_mode",
            "complete is not supported: it keeps every group forever and rewrites all of "
            "them each batch; use update (with an upsert) or append",
        )
    elif mode is not None:
        mode = s.string("output_mode", None, choices=OUTPUT_MODES)
    if sql is None or not s.ok:
        return None
    columns = None
    if source is not None:
        columns = [f.name for f in parse_schema(source.schema).fields]
    try:
        check_transform_sql(sql, columns=columns)
    except SQLError as exc:
        s.error("sql", str(exc))
        return None
    return Transform(sql=sql.strip(), output_mode=mode)


def _parse_trigger(errors: list[FieldError], data: Any) -> Trigger | None:
    s = Section(errors, "trigger", data, _names(Trigger))
    interval = s.number("interval_seconds", Trigger.interval_seconds, maximum=24 * 3600)
    return Trigger(interval_seconds=interval) if s.ok else None


def parse_restart_policy(data: Any, errors: list[FieldError] | None = None) -> Any:
    """The typed restart policy; raises SpecError when called without an `errors` list."""
    own = errors is None
    errors = [] if errors is None else errors
    kind = data.get("kind") if isinstance(data, Mapping) else None
    parser = _POLICIES.get(kind) if isinstance(kind, str) else None
    if parser is None:
        s = Section(
            errors, "restart_policy", data, set(data) if isinstance(data, Mapping) else set()
        )
        if s.ok:
            choices = ", ".join(_POLICIES)
            if kind is None:
                s.error("kind", f"is required: one of {choices}")
            else:
                s.error("kind", f"must be one of {choices}; got {kind!r}")
        policy = None
    else:
        policy = parser(errors)(data)
    if own and errors:
        raise SpecError(errors)
    return policy


def _fixed_delay(errors: list[FieldError]) -> Callable[[Any], Any]:
    def parse(data: Any) -> FixedDelay | None:
        s = Section(errors, "restart_policy", data, _names(FixedDelay))
        attempts = s.integer("attempts", FixedDelay.attempts, minimum=0)
        delay = s.number("delay_seconds", FixedDelay.delay_seconds, maximum=MAX_DELAY_SECONDS)
        return FixedDelay(attempts=attempts, delay_seconds=delay) if s.ok else None

    return parse


def _failure_rate(errors: list[FieldError]) -> Callable[[Any], Any]:
    def parse(data: Any) -> FailureRate | None:
        s = Section(errors, "restart_policy", data, _names(FailureRate))
        max_failures = s.integer("max_failures", FailureRate.max_failures, minimum=1)
        interval = s.number(
            "interval_seconds",
            FailureRate.interval_seconds,
            exclusive_minimum=True,
            maximum=MAX_DELAY_SECONDS,
        )
        delay = s.number("delay_seconds", FailureRate.delay_seconds, maximum=MAX_DELAY_SECONDS)
        if not s.ok:
            return None
        return FailureRate(
            max_failures=max_failures, interval_seconds=interval, delay_seconds=delay
        )

    return parse


def _exponential_delay(errors: list[FieldError]) -> Callable[[Any], Any]:
    def parse(data: Any) -> ExponentialDelay | None:
        d = ExponentialDelay
        s = Section(errors, "restart_policy", data, _names(d))
        initial = s.number(
            "initial_backoff_seconds",
            d.initial_backoff_seconds,
            exclusive_minimum=True,
            maximum=MAX_DELAY_SECONDS,
        )
        maximum = s.number(
            "max_backoff_seconds",
            d.max_backoff_seconds,
            exclusive_minimum=True,
            maximum=MAX_DELAY_SECONDS,
        )
        # Flink refuses a multiplier of 1 or less ("Backoff multiplier must be greater than
        # 1"): the backoff must grow; a constant delay is what fixed-delay is for.
        multiplier = s.number("multiplier", d.multiplier, minimum=1.0, exclusive_minimum=True)
        jitter = s.number("jitter", d.jitter, maximum=1.0)
        reset = s.number("reset_after_seconds", d.reset_after_seconds, exclusive_minimum=True)
        attempts = s.integer("max_attempts", None, minimum=1)
        if initial is not None and maximum is not None and initial > maximum:
            s.error(
                "initial_backoff_seconds",
                f"must not exceed max_backoff_seconds ({initial:g} > {maximum:g})",
            )
        if not s.ok:
            return None
        return ExponentialDelay(
            initial_backoff_seconds=initial,
            max_backoff_seconds=maximum,
            multiplier=multiplier,
            jitter=jitter,
            reset_after_seconds=reset,
            max_attempts=attempts,
        )

    return parse


def _no_restart(errors: list[FieldError]) -> Callable[[Any], Any]:
    def parse(data: Any) -> NoRestart | None:
        s = Section(errors, "restart_policy", data, _names(NoRestart))
        return NoRestart() if s.ok else None

    return parse


_POLICIES: dict[str, Callable[[list[FieldError]], Callable[[Any], Any]]] = {
    "fixed-delay": _fixed_delay,
    "failure-rate": _failure_rate,
    "exponential-delay": _exponential_delay,
    "none": _no_restart,
}
