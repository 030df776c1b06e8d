"""Preflight: a valid definition checked against the real systems it names, before it runs.

Validation (jobs.spec) says whether a spec can work at all; preflight asks the systems
whether it will work with them now, where they can answer quickly:

* Kafka source: each topic exists on the source's cluster and the connection may read it
  (its partitions' log ends are asked for: an ACL that refuses says so);
* Postgres sink: the table exists with a column for every output column whose type can take
  the output's (an assignment cast, or a string column), no NOT NULL column the output does
  not fill, the privileges to write (INSERT; UPDATE for an upsert), and for an upsert a
  unique key on the key columns; or it does not exist and will be created (the user may
  create tables in its schema);
* Kafka sink: its topic (and dead-letter topic) exists; the control plane never creates one;
  writing Avro, when its schema is checked against its subject's compatibility rule: on save
  when the value's type is known from the spec (`ok`), else when the run starts (`info`);
* files sink: its connection's root is a writable directory (a local root; an HDFS or S3 root
  is reached only by the jobs: said so, as information);
* cassandra sink: the table exists in the connection's keyspace with a column for every
  output column whose type can take the output's (the same type or a safe widening), its
  primary key's columns all in the output, no counter column; or it does not exist and the
  spec gives the primary key to create it with; its dead letters' topic exists (a kafka
  connection).

Every check reports at the spec's field it is about (`sink.table`, `source.topics[1]`), as
`ok`, `error` (the definition will fail: fix it first), `warning` (a system that could not be
reached in time, or a check that could not be made: never blocking) or `info`. Nothing is
written: the checks read metadata (Kafka's metadata and log ends, Postgres' catalogs). Each
system is asked within `timeout` seconds.

Each source and sink kind has its check here, looked up by kind (`SOURCE_CHECKS`,
`SINK_CHECKS`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import sql

from controlplane.connections.models import Connection
from controlplane.connections.policy import (
    cassandra_connection_arguments,
    files_connection_root,
    postgres_connect_arguments,
)
from controlplane.connections.probe import kafka_consumer, probe
from controlplane.redaction import redact
from jobs.registry import spark_avro
from jobs.sinks.cassandra.model import CassandraSink
from jobs.sinks.files.model import FilesSink
from jobs.sinks.kafka.model import KafkaSink
from jobs.sinks.postgres.model import PostgresSink
from jobs.spec import PipelineSpec, SpecError
from jobs.spec.ddl import parse_schema, simple_string
from jobs.spec.model import KafkaSource

from . import schemas

OK, ERROR, WARNING, INFO = "ok", "error", "warning", "info"


@dataclass
class Check:
    field: str  # the spec's field it is about
    check: str  # what was checked, in a few words
    status: str  # ok, error, warning, info
    message: str
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {
            "field": self.field,
            "check": self.check,
            "status": self.status,
            "message": self.message,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(c.status == ERROR for c in self.checks)

    def by_field(self, status: str) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for check in self.checks:
            if check.status == status:
                out.setdefault(check.field, []).append(check.message)
        return out

    def errors_in_words(self) -> str:
        """Its errors in one line: `sink.table: table 'x' ...; source.topics[0]: ...`."""
        return "; ".join(
            f"{path}: {' '.join(found)}" for path, found in self.by_field(ERROR).items()
        )

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "errors": self.by_field(ERROR),
            "warnings": self.by_field(WARNING),
            "checks": [c.as_dict() for c in self.checks],
        }


class _Context:
    """What the checks share: the connections by name (with their secrets, loaded once),
    the time allowed per system, and the report being written."""

    def __init__(self, timeout: float):
        self.timeout = timeout
        self.report = Report()
        self._connections: dict[str, Connection | None] = {}

    def connection(self, name: str) -> Connection | None:
        if name not in self._connections:
            self._connections[name] = Connection.objects.filter(name=name).first()
        return self._connections[name]

    def add(self, field_: str, check: str, status: str, message: str, started: float) -> None:
        self.report.checks.append(Check(field_, check, status, message, time.monotonic() - started))


def run(spec: PipelineSpec, *, timeout: float | None = None) -> Report:
    """The preflight of a valid spec (jobs.spec.parse_spec's); each system asked within
    `timeout` seconds (CONTROLPLANE_PREFLIGHT_TIMEOUT)."""
    if timeout is None:
        from django.conf import settings

        timeout = settings.CONTROLPLANE_PREFLIGHT_TIMEOUT
    context = _Context(timeout)
    SOURCE_CHECKS[spec.source.kind](context, spec, spec.source)
    for i, sink in enumerate(spec.all_sinks()):
        path = f"sinks[{i}]" if spec.sinks else "sink"
        SINK_CHECKS[sink.kind](context, spec, sink, path)
    return context.report


# Actions that launch a driver: the preflight runs before them (`before`).
LAUNCHING = ("start", "resume", "restart")


@dataclass(frozen=True)
class Gate:
    report: Report | None  # None: not run (no launch, CONTROLPLANE_PREFLIGHT off, no spec)
    refused: bool  # errors found, and CONTROLPLANE_PREFLIGHT refuses unless forced


def before(pipeline, action: str, *, forced: bool) -> Gate:
    """The preflight before an on-call `action` (the API's and the page's alike): run for
    actions that launch a driver unless CONTROLPLANE_PREFLIGHT is off; refusing when it
    found errors, the setting is `refuse` and the user did not force it."""
    from django.conf import settings

    mode = settings.CONTROLPLANE_PREFLIGHT
    if action not in LAUNCHING or mode == "off":
        return Gate(None, False)
    report = of_pipeline(pipeline)
    refused = report is not None and not report.ok and mode == "refuse" and not forced
    return Gate(report, refused)


def of_pipeline(pipeline) -> Report | None:
    """The preflight of a stored pipeline's definition; None when it no longer validates
    (its driver refuses it at the start, and says why)."""
    from . import services

    try:
        spec = services.validate(pipeline.spec)
    except SpecError:
        return None
    return run(spec)


# -- Kafka -------------------------------------------------------------------------------------


def _unreachable(what: str, exc: BaseException, connection: Connection | None) -> str:
    secrets = connection.get_secrets().values() if connection is not None else ()
    detail = redact(f"{type(exc).__name__}: {exc}".strip(), secrets)
    return f"{what} could not be asked in time ({detail}): not checked"


def _kafka_topics(
    context: _Context, connection_name: str, wanted: list[tuple[str, str]], role: str
) -> None:
    """Each (field, topic) of `wanted` exists on the connection's cluster; for the source's
    (`role` "source"), its log ends can be read with the connection's credentials."""
    from kafka import TopicPartition
    from kafka import errors as kafka_errors

    started = time.monotonic()
    connection = context.connection(connection_name)
    if connection is None:
        return  # validation names it
    try:
        consumer = kafka_consumer(connection.settings, connection.get_secrets(), context.timeout)
    except Exception as exc:  # the cluster could not be reached or logged in to
        for path, _ in wanted:
            context.add(
                path,
                "topic exists",
                WARNING,
                _unreachable(f"Kafka ({connection_name})", exc, connection),
                started,
            )
        return
    try:
        existing = consumer.topics()
        for path, topic in wanted:
            begun = time.monotonic()
            if topic not in existing:
                context.add(
                    path,
                    "topic exists",
                    ERROR,
                    f"topic {topic!r} does not exist on the cluster of connection"
                    f" {connection_name!r}; create it (the control plane never creates topics)",
                    begun,
                )
                continue
            if role != "source":
                context.add(path, "topic exists", OK, f"topic {topic!r} exists", begun)
                continue
            partitions = consumer.partitions_for_topic(topic) or set()
            try:
                consumer.end_offsets([TopicPartition(topic, p) for p in partitions])
            except kafka_errors.TopicAuthorizationFailedError:
                context.add(
                    path,
                    "topic readable",
                    ERROR,
                    f"connection {connection_name!r} may not read topic {topic!r} (its ACLs"
                    " refuse it)",
                    begun,
                )
                continue
            context.add(
                path,
                "topic readable",
                OK,
                f"topic {topic!r} exists with {len(partitions)} partition(s) and can be read",
                begun,
            )
    except Exception as exc:  # the cluster stopped answering half-way
        context.add(
            wanted[0][0],
            "topic exists",
            WARNING,
            _unreachable(f"Kafka ({connection_name})", exc, connection),
            started,
        )
    finally:
        consumer.close()


def _kafka_source(context: _Context, spec: PipelineSpec, source: KafkaSource) -> None:
    wanted = [(f"source.topics[{i}]", topic) for i, topic in enumerate(source.topics)]
    _kafka_topics(context, source.connection, wanted, "source")


def _kafka_sink(context: _Context, spec: PipelineSpec, sink: KafkaSink, path: str) -> None:
    wanted = [(f"{path}.topic", sink.topic)]
    if sink.dead_letter_topic:
        wanted.append((f"{path}.dead_letter_topic", sink.dead_letter_topic))
    _kafka_topics(context, sink.connection, wanted, "sink")
    if sink.format == "avro" and sink.schema_registry is not None:
        _kafka_sink_schema(context, spec, sink, path)


def _kafka_sink_schema(context: _Context, spec: PipelineSpec, sink: KafkaSink, path: str) -> None:
    """Whether an Avro sink's schema meets its subject's compatibility rule now, where the
    value's type is known from the spec (controlplane.definitions.schemas); else that it is
    checked at the run's start."""
    from jobs.registry.client import Registry, RegistryError

    started = time.monotonic()
    field_ = f"{path}.schema_registry"
    the_subject = schemas.sink_subject(sink)
    try:
        schema = schemas.sink_value_schema(spec, sink)
    except spark_avro.NotWritable as exc:  # refused on save: a spec stored before the gate
        context.add(
            field_, "Avro schema", ERROR, f"Spark cannot write the output as Avro: {exc}", started
        )
        return
    if schema is None:
        why = "a transform" if spec.transform is not None else "a value expression"
        context.add(
            field_,
            "Avro schema",
            INFO,
            f"the output's Avro schema is known only when the run starts ({why}: Spark derives"
            f" the value's type): the compatibility rule of subject {the_subject!r} is checked"
            " then, and an incompatible schema stops the run with a definition error",
            started,
        )
        return
    try:
        arguments = schemas.registry_arguments(sink.schema_registry.connection)
        if arguments is None:
            raise ValueError(f"no schema-registry connection {sink.schema_registry.connection!r}")
        with Registry({**arguments, "timeout_seconds": context.timeout}) as registry:
            problems = schemas.sink_problems(registry, the_subject, schema)
    except (RegistryError, ValueError) as exc:
        context.add(
            field_, "Avro schema", WARNING, f"the registry could not be asked: {exc}", started
        )
        return
    if problems:
        context.add(field_, "Avro schema", ERROR, "; ".join(problems), started)
        return
    context.add(
        field_,
        "Avro schema",
        OK,
        f"the output's Avro schema (from the source's columns) meets the compatibility rule of"
        f" subject {the_subject!r} now; it is registered at the run's first batch",
        started,
    )


# -- Postgres ----------------------------------------------------------------------------------

_COLUMNS = """
SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypid, t.typcategory,
       a.attnotnull AND NOT a.atthasdef AND a.attidentity = '' AND a.attgenerated = ''
FROM pg_attribute a JOIN pg_type t ON t.oid = a.atttypid
WHERE a.attrelid = %s AND a.attnum > 0 AND NOT a.attisdropped
"""
_UNIQUE_KEYS = """
SELECT array_agg(a.attname::text)
FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = ANY(i.indkey)
WHERE i.indrelid = %s AND i.indisunique AND i.indpred IS NULL
GROUP BY i.indexrelid
"""
# Whether a value of the first type can be written into a column of the second by COPY's
# and INSERT's assignment: the same type, a string column, or an implicit or assignment cast.
_ASSIGNABLE = """
SELECT %(out)s = %(col)s
    OR EXISTS (SELECT 1 FROM pg_cast WHERE castsource = %(out)s AND casttarget = %(col)s
               AND castcontext IN ('a', 'i'))
"""


def _postgres_sink(context: _Context, spec: PipelineSpec, sink: PostgresSink, path: str) -> None:
    started = time.monotonic()
    connection = context.connection(sink.connection)
    if connection is None:
        return
    field_ = f"{path}.table"
    try:
        kwargs = postgres_connect_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        context.add(field_, "table", ERROR, f"connection {sink.connection!r}: {exc}", started)
        return
    kwargs["connect_timeout"] = max(1, round(context.timeout))
    try:
        with psycopg.connect(**kwargs, autocommit=True) as conn:
            conn.execute(
                "SELECT set_config('statement_timeout', %s, false),"
                " set_config('default_transaction_read_only', 'on', false)",
                (str(int(context.timeout * 1000)),),
            )
            _postgres_table(context, conn, spec, sink, path, started)
    except psycopg.OperationalError as exc:
        context.add(
            field_,
            "table",
            WARNING,
            _unreachable(f"Postgres ({sink.connection})", exc, connection),
            started,
        )
    except psycopg.Error as exc:  # a catalog query refused (a timeout, a privilege)
        detail = redact(f"{type(exc).__name__}: {exc}".strip(), connection.get_secrets().values())
        context.add(field_, "table", WARNING, f"could not be checked: {detail}", started)


def _postgres_table(context, conn, spec: PipelineSpec, sink: PostgresSink, path, started):
    field_ = f"{path}.table"
    ident = sql.Identifier(*sink.table.split(".")).as_string(conn)
    (oid,) = conn.execute("SELECT to_regclass(%s)::oid", (ident,)).fetchone()
    output = output_types(spec)
    if oid is None:
        schema = sink.table.split(".")[0] if "." in sink.table else None
        # The sink creates a missing schema too (CREATE on the database), else the table in
        # it (CREATE on the schema).
        (may,) = conn.execute(
            "SELECT CASE WHEN to_regnamespace(coalesce(%s, current_schema())) IS NULL"
            " THEN has_database_privilege(current_database(), 'CREATE')"
            " ELSE has_schema_privilege(coalesce(%s, current_schema()), 'CREATE') END",
            (schema, schema),
        ).fetchone()
        if not may:
            context.add(
                field_,
                "table",
                ERROR,
                f"table {sink.table!r} does not exist and the connection's user may not create"
                " tables in its schema: create it, or grant CREATE",
                started,
            )
            return
        context.add(
            field_,
            "table",
            OK,
            f"table {sink.table!r} does not exist: the pipeline creates it"
            + (f" with a primary key ({', '.join(sink.key)})" if sink.mode == "upsert" else ""),
            started,
        )
        return
    columns = {
        name.lower(): (name, shown, type_oid, category, required)
        for name, shown, type_oid, category, required in conn.execute(_COLUMNS, (oid,))
    }
    begun = time.monotonic()
    problems = []
    if output is not None:
        for name, spark_type in output.items():
            found = columns.get(name.lower())
            if found is None:
                problems.append(f"has no column {name!r}, which the output has")
                continue
            if spark_type is None:
                continue  # only Spark knows its type
            from jobs.sinks.postgres.store import postgres_type

            wanted = postgres_type(spark_type)
            (out_oid,) = conn.execute("SELECT to_regtype(%s)::oid", (wanted,)).fetchone()
            _, shown, type_oid, category, _ = found
            if out_oid is None or category == "S":
                continue
            (fits,) = conn.execute(_ASSIGNABLE, {"out": out_oid, "col": type_oid}).fetchone()
            if not fits:
                problems.append(
                    f"column {found[0]!r} is {shown}, which cannot take the output's"
                    f" {spark_type} ({wanted})"
                )
        filled = {n.lower() for n in output}
        for name, (shown_name, _, _, _, required) in columns.items():
            if required and name not in filled:
                problems.append(
                    f"column {shown_name!r} is NOT NULL without a default, and the output"
                    " does not fill it"
                )
    if problems:
        context.add(field_, "columns", ERROR, f"table {sink.table!r} " + "; ".join(problems), begun)
    elif output is None:
        context.add(
            field_,
            "columns",
            INFO,
            f"table {sink.table!r} exists; its columns are checked against the output when it"
            " runs (the transform's output is known only to Spark)",
            begun,
        )
    else:
        context.add(
            field_,
            "columns",
            OK,
            f"table {sink.table!r} has a column for every output column, each able to take it",
            begun,
        )
    if sink.mode == "upsert":
        _postgres_key(context, conn, sink, path, oid, columns, output)
    needed = ("INSERT", "UPDATE") if sink.mode == "upsert" else ("INSERT",)
    begun = time.monotonic()
    missing = [
        p
        for p in needed
        if not conn.execute("SELECT has_table_privilege(%s, %s)", (oid, p)).fetchone()[0]
    ]
    if missing:
        context.add(
            field_,
            "privileges",
            ERROR,
            f"the connection's user may not {' or '.join(missing)} into {sink.table!r}: grant it",
            begun,
        )


def _postgres_key(context, conn, sink: PostgresSink, path, oid, columns, output) -> None:
    begun = time.monotonic()
    field_ = f"{path}.key"
    missing = [k for k in sink.key if k.lower() not in columns]
    if missing:
        context.add(
            field_,
            "key columns",
            ERROR,
            f"table {sink.table!r} has no column {missing[0]!r}, named in the key",
            begun,
        )
        return
    if output is not None and (absent := [k for k in sink.key if k.lower() not in
                                          {n.lower() for n in output}]):  # fmt: skip
        context.add(
            field_,
            "key columns",
            ERROR,
            f"key column {absent[0]!r} is not an output column",
            begun,
        )
        return
    keys = [{name.lower() for name in names} for (names,) in conn.execute(_UNIQUE_KEYS, (oid,))]
    if {k.lower() for k in sink.key} not in keys:
        context.add(
            field_,
            "unique key",
            ERROR,
            f"table {sink.table!r} has no primary key or unique index on exactly"
            f" ({', '.join(sink.key)}): an upsert needs one (ON CONFLICT); add it",
            begun,
        )
        return
    context.add(field_, "unique key", OK, f"a unique key on ({', '.join(sink.key)})", begun)


def output_types(spec: PipelineSpec) -> dict[str, str | None] | None:
    """The output's columns and their Spark types where the spec tells them: the source
    schema's without a transform; with one, its projections that are a source column or a
    CAST (others: None, known only to Spark); None when the columns themselves are not known
    (SELECT *, a generator, a join...)."""
    source = {
        f.name.lower(): simple_string(f.type) for f in parse_schema(spec.source.schema).fields
    }
    names = {f.name.lower(): f.name for f in parse_schema(spec.source.schema).fields}
    if spec.transform is None:
        return {names[n]: t for n, t in source.items()}
    from sqlglot import exp

    from jobs.spec.sql import SQLError, parse_query

    try:
        query = parse_query(spec.transform.sql)
    except (SQLError, ValueError):
        return None
    if not isinstance(query, exp.Select) or query.args.get("joins"):
        return None
    out: dict[str, str | None] = {}
    for projection in query.expressions:
        if isinstance(projection, exp.Star) or (
            isinstance(projection, exp.Column) and isinstance(projection.this, exp.Star)
        ):
            return None
        name = projection.alias_or_name
        if not name:
            return None
        node = projection.this if isinstance(projection, exp.Alias) else projection
        if isinstance(node, exp.Column):
            out[name] = source.get(node.name.lower())
        elif isinstance(node, exp.Cast | exp.TryCast):
            out[name] = node.args["to"].sql("spark").lower().replace(" ", "")
        else:
            out[name] = None
    return out


# -- files --------------------------------------------------------------------------------------


def _files_sink(context: _Context, spec: PipelineSpec, sink: FilesSink, path: str) -> None:
    started = time.monotonic()
    connection = context.connection(sink.connection)
    if connection is None:
        return
    try:
        root = files_connection_root(connection.settings)
    except ValueError as exc:
        context.add(f"{path}.connection", "root", ERROR, f"its root {exc}", started)
        return
    result = probe(connection, context.timeout)
    status = OK if result.ok else ERROR
    if result.ok and not root.startswith("file://"):
        status = INFO
    context.add(f"{path}.path", "root writable", status, result.detail, started)


# -- Cassandra ---------------------------------------------------------------------------------


def _cassandra_sink(context: _Context, spec: PipelineSpec, sink: CassandraSink, path: str) -> None:
    from jobs.sinks.cassandra import store as cassandra
    from jobs.sinks.cassandra.connection import session

    started = time.monotonic()
    if sink.dead_letters.topic is not None:
        _kafka_topics(
            context,
            sink.dead_letters.connection,
            [(f"{path}.dead_letters.topic", sink.dead_letters.topic)],
            "sink",
        )
    connection = context.connection(sink.connection)
    if connection is None:
        return
    field_ = f"{path}.table"
    try:
        arguments = cassandra_connection_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        context.add(field_, "table", ERROR, f"connection {sink.connection!r}: {exc}", started)
        return
    try:
        cass = session(arguments, context.timeout)
    except Exception as exc:  # the cluster could not be reached or logged in to
        context.add(
            field_,
            "table",
            WARNING,
            _unreachable(f"Cassandra ({sink.connection})", exc, connection),
            started,
        )
        return
    try:
        table = cassandra.read_table(cass, arguments["keyspace"], sink.table)
    except Exception as exc:  # a schema query refused (a timeout, a privilege)
        detail = redact(f"{type(exc).__name__}: {exc}".strip(), connection.get_secrets().values())
        context.add(field_, "table", WARNING, f"could not be checked: {detail}", started)
        return
    finally:
        cass.cluster.shutdown()
    where = f"keyspace {arguments['keyspace']!r}"
    if table is None:
        if sink.partition_key:
            status, message = INFO, "it will be created from the output"
        else:
            status, message = ERROR, "create it, or give partition_key to create it from the output"
        context.add(
            field_,
            "table",
            status,
            f"table {sink.table!r} does not exist in {where}: {message}",
            started,
        )
        return
    # The output's columns and types where the spec tells them (None: known only to Spark,
    # whose writer checks them when it opens the table).
    output = output_types(spec)
    found = cassandra.problems(table, output, sink)
    for _, message in found:
        context.add(field_, "table", ERROR, message, started)
    if not found:
        partly = output is None or None in output.values()
        note = " (what the transform computes is known only to Spark: checked when it runs)"
        context.add(
            field_,
            "table",
            OK,
            f"table {sink.table!r} in {where} takes the output{note if partly else ''}",
            started,
        )


SOURCE_CHECKS: dict[str, Callable[[_Context, PipelineSpec, Any], None]] = {
    "kafka": _kafka_source,
}
SINK_CHECKS: dict[str, Callable[[_Context, PipelineSpec, Any, str], None]] = {
    "postgres": _postgres_sink,
    "kafka": _kafka_sink,
    "files": _files_sink,
    "cassandra": _cassandra_sink,
}
