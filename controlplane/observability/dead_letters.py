"""Dead letters, seen from the control plane: the records a pipeline could not parse, which
its sink wrote into `_cp_dead_letters` in the sink database, in the same transaction as the
batch's good rows (jobs.sinks.postgres.store). That table is the truth, so counts are exact:
the control plane reads it through the pipeline's sink connection (checked again against
the connection policy, never its own database).

* `counts` (per pipeline, for the collector's round: overview, API, Prometheus), `batches`
  (per batch), `errors` (per error, for the page's filter), `page` and `rows` (browse and
  download, with filters: error, time received, topic, partition, batch);
* `redrive`: the letters chosen are produced again, raw value as it was, to the pipeline's
  source topic or a topic the operator names, through the source connection; those Kafka
  acknowledged are then deleted from the table (a move: the ones that fail again come back
  as new dead letters, at their new offsets); audited;
* `purge`: letters older than CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS go (beat, hourly).

A pipeline whose first sink is Kafka (a dead-letter topic) or files (JSON Lines files under
`<root>/<path>/_cp_dead_letters/`) keeps its letters elsewhere: `Elsewhere` says where.
"""

from __future__ import annotations

import base64
import logging
import re
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta

import psycopg
from django.conf import settings
from psycopg import sql

from controlplane.connections.models import Connection, ConnectionKind
from controlplane.connections.policy import postgres_connect_arguments
from controlplane.definitions import audit
from controlplane.definitions.models import AuditEntry, Pipeline
from jobs.connections import files_root, kafka_client_config
from jobs.kafka.metadata import metadata_consumer
from jobs.kafka.names import internal_problem
from jobs.sinks import registry
from jobs.sinks.kind import DeadLetters
from jobs.sinks.postgres.store import DEAD_LETTERS_TABLE

log = logging.getLogger("controlplane.dead_letters")

TABLE = sql.Identifier(DEAD_LETTERS_TABLE)
COLUMNS = 'batch_id, topic, partition, "offset", raw, error, record_time, received_at'
# Kafka's legal topic names.
TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
REDRIVE_LIMIT = 100_000  # letters per redrive request


def first_sink(spec: dict) -> dict:
    """The sink that keeps a pipeline's dead letters: its only one, or the first of `sinks`."""
    sinks = spec.get("sinks") or [spec.get("sink") or {}]
    return sinks[0] or {}


def place(spec: dict) -> DeadLetters:
    """Where a pipeline's dead letters are kept: its first sink's kind says
    (jobs.sinks.<kind>.spec.dead_letters)."""
    sink = first_sink(spec)
    return registry.of(sink).dead_letters(sink)


def dead_letter_topic(spec: dict) -> str | None:
    """The topic a pipeline's dead letters are records of, if they are (else None: in a sink
    database's table, counted and browsed here, or files)."""
    where = place(spec)
    return where.where if where.store == IN_TOPIC else None


class Unavailable(Exception):
    """The sink database cannot be read now (answered with 503, saying why)."""


class Elsewhere(Unavailable):
    """The pipeline's first sink keeps its dead letters outside a sink database (answered
    with 409, saying where)."""


class InTopic(Elsewhere):
    """The pipeline's sink is Kafka: its dead letters are records of a topic, not rows here
    (answered with 409, naming the topic)."""


class InFiles(Elsewhere):
    """The pipeline's sink is a files sink: its dead letters are JSON Lines files beside its
    output (answered with 409, naming the directory)."""


def files_dead_letters_dir(pipeline: Pipeline) -> str | None:
    """Where a pipeline whose first sink writes files keeps its dead letters,
    `<root>/<path>/_cp_dead_letters/` (the root said in words when the connection is gone
    or its root is not valid any more), else None."""
    where = place(pipeline.spec or {})
    if where.store != IN_FILES:
        return None
    name = where.connection
    connection = pipeline.connections.filter(name=name).first()
    try:
        root = files_root(connection.settings) if connection is not None else None
    except ValueError:
        root = None
    root = root or f"<the root of connection {name!r}>"
    return f"{root}/{where.where}/"


def _in_files(pipeline: Pipeline, where: DeadLetters) -> Elsewhere:
    return InFiles(
        f"this pipeline writes files: its dead letters are JSON Lines files under"
        f" {files_dead_letters_dir(pipeline)} (a directory per query and batch:"
        " <query id>/<batch id>/), written with their batch"
    )


def _in_topic(pipeline: Pipeline, where: DeadLetters) -> Elsewhere:
    return InTopic(
        f"this pipeline's dead letters are the records of topic {where.where!r} (as they"
        " arrived, with headers cp-error, cp-source-topic, cp-source-partition and"
        " cp-source-offset), written exactly once with their batch; read them with a"
        " read_committed consumer"
    )


# Where dead letters are kept outside a sink database's table, and what is answered then.
IN_TABLE, IN_TOPIC, IN_FILES = "table", "topic", "files"  # DeadLetters.store
_ELSEWHERE = {IN_FILES: _in_files, IN_TOPIC: _in_topic}


class BadFilter(ValueError):
    """A filter or redrive target is not understood (400, naming the field)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Filters:
    error: str = ""
    since: datetime | None = None
    until: datetime | None = None
    topic: str = ""
    partition: int | None = None
    batch: int | None = None

    def where(self, pipeline: str) -> tuple[sql.Composable, list]:
        clauses, params = [sql.SQL("pipeline = %s")], [pipeline]
        for column, value in (
            ("error", self.error or None),
            ("topic", self.topic or None),
            ("partition", self.partition),
            ("batch_id", self.batch),
        ):
            if value is not None:
                clauses.append(sql.SQL("{} = %s").format(sql.Identifier(column)))
                params.append(value)
        if self.since is not None:
            clauses.append(sql.SQL("received_at >= %s"))
            params.append(self.since)
        if self.until is not None:
            clauses.append(sql.SQL("received_at < %s"))
            params.append(self.until)
        return sql.SQL(" AND ").join(clauses), params


def parse_filters(query) -> Filters:
    """Filters from a query string (`error`, `since`, `until`, `topic`, `partition`,
    `batch`); BadFilter names the field that is wrong."""

    def given(name: str) -> str:
        value = query.get(name)
        return "" if value is None else str(value).strip()

    values = {}
    for name in ("since", "until"):
        if raw := given(name):
            moment = _moment(raw) or _moment(raw.replace(" ", "+"))  # a URL's + read as space
            if moment is None or moment.tzinfo is None:
                raise BadFilter(name, f"{raw!r} is not an ISO 8601 time with a time zone")
            values[name] = moment
    for name in ("partition", "batch"):
        if raw := given(name):
            if not (raw.isascii() and raw.isdigit()):
                raise BadFilter(name, f"{raw!r} is not a whole number")
            values[name] = int(raw)
    for name in ("error", "topic"):
        if raw := given(name):
            values[name] = raw[:2000]
    return Filters(**values)


def _moment(raw: str) -> datetime | None:
    from django.utils.dateparse import parse_datetime

    try:
        return parse_datetime(raw.replace("Z", "+00:00"))
    except ValueError:
        return None


def _sink_connection(pipeline: Pipeline) -> Connection:
    where = place(pipeline.spec)
    elsewhere = _ELSEWHERE.get(where.store)
    if elsewhere is not None:
        raise elsewhere(pipeline, where)
    name = where.connection
    try:
        return pipeline.connections.get(name=name)
    except Connection.DoesNotExist:
        raise Unavailable(f"the sink connection {name!r} is gone") from None


def _connect(connection: Connection) -> psycopg.Connection:
    try:
        kwargs = postgres_connect_arguments(connection.settings, connection.get_secrets())
    except ValueError as exc:
        raise Unavailable(f"connection {connection.name!r} is refused: {exc}") from None
    kwargs["connect_timeout"] = 5
    kwargs["options"] = "-c statement_timeout=15000"
    try:
        return psycopg.connect(**kwargs, autocommit=True)
    except psycopg.Error as exc:
        raise Unavailable(f"the sink database of connection {connection.name!r}: {exc}") from None


def _query(pipeline: Pipeline, statement: sql.Composable, params: list) -> list[tuple]:
    try:
        with _connect(_sink_connection(pipeline)) as conn:
            return conn.execute(statement, params).fetchall()
    except psycopg.errors.UndefinedTable:
        return []  # no batch written yet
    except psycopg.Error as exc:
        raise Unavailable(f"the sink database: {exc}") from None


def _letter(row: tuple) -> dict:
    batch_id, topic, partition, offset, raw, error, record_time, received_at = row
    return {
        "batch_id": batch_id,
        "topic": topic,
        "partition": partition,
        "offset": offset,
        "raw": bytes(raw) if raw is not None else None,
        "error": error,
        "record_time": record_time,
        "received_at": received_at,
    }


def text(raw: bytes | None) -> str | None:
    """The raw value as text, where it is UTF-8 (None where it is not)."""
    if raw is None:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return None


def as_json(letter: dict) -> dict:
    """A letter for the API and downloads: the raw value in base64 and, where it is UTF-8,
    as text."""
    raw = letter["raw"]
    return {
        **{k: v for k, v in letter.items() if k != "raw"},
        "record_time": letter["record_time"].isoformat() if letter["record_time"] else None,
        "received_at": letter["received_at"].isoformat() if letter["received_at"] else None,
        "raw_base64": base64.b64encode(raw).decode() if raw is not None else None,
        "raw_text": text(raw),
    }


def page(pipeline: Pipeline, filters: Filters, *, limit: int, offset: int) -> tuple[list, int]:
    """One page of letters, newest first, and how many match."""
    where, params = filters.where(pipeline.name)
    found = _query(
        pipeline,
        sql.SQL(
            "SELECT {cols}, count(*) OVER () FROM {table} WHERE {where}"
            ' ORDER BY received_at DESC, topic, partition, "offset" LIMIT %s OFFSET %s'
        ).format(cols=sql.SQL(COLUMNS), table=TABLE, where=where),
        [*params, limit, offset],
    )
    total = found[0][-1] if found else 0
    if not found and offset:
        total = count(pipeline, filters)
    return [_letter(row[:-1]) for row in found], total


def count(pipeline: Pipeline, filters: Filters) -> int:
    where, params = filters.where(pipeline.name)
    found = _query(
        pipeline,
        sql.SQL("SELECT count(*) FROM {} WHERE {}").format(TABLE, where),
        params,
    )
    return found[0][0] if found else 0


def rows(pipeline: Pipeline, filters: Filters) -> Iterator[dict]:
    """Every letter that matches, oldest first, read in chunks (a download)."""
    where, params = filters.where(pipeline.name)
    try:
        with _connect(_sink_connection(pipeline)) as conn, conn.transaction():
            cursor = conn.cursor(name="dead_letters")
            cursor.itersize = 2000
            cursor.execute(
                sql.SQL(
                    'SELECT {} FROM {} WHERE {} ORDER BY received_at, topic, partition, "offset"'
                ).format(sql.SQL(COLUMNS), TABLE, where),
                params,
            )
            for row in cursor:
                yield _letter(row)
    except psycopg.errors.UndefinedTable:
        return
    except psycopg.Error as exc:
        raise Unavailable(f"the sink database: {exc}") from None


def batches(pipeline: Pipeline, *, limit: int = 100) -> list[dict]:
    """Letters per batch, newest batch first."""
    found = _query(
        pipeline,
        sql.SQL(
            "SELECT batch_id, count(*), min(received_at) FROM {} WHERE pipeline = %s"
            " GROUP BY batch_id ORDER BY batch_id DESC LIMIT %s"
        ).format(TABLE),
        [pipeline.name, limit],
    )
    return [{"batch_id": b, "count": n, "received_at": at} for b, n, at in found]


def errors(pipeline: Pipeline) -> list[dict]:
    """Letters per error, most first (the page's error filter)."""
    found = _query(
        pipeline,
        sql.SQL(
            "SELECT error, count(*) FROM {} WHERE pipeline = %s GROUP BY error"
            " ORDER BY count(*) DESC LIMIT 50"
        ).format(TABLE),
        [pipeline.name],
    )
    return [{"error": e, "count": n} for e, n in found]


def counts(pipelines: list[Pipeline]) -> dict[int, dict]:
    """{pipeline id: {"count": n, "last_at": ISO time}} for the pipelines whose sink databases
    answer: one query per sink connection. Best-effort: a database that does not answer
    leaves its pipelines out."""
    by_connection: dict[str, list[Pipeline]] = defaultdict(list)
    for pipeline in pipelines:
        where = place(pipeline.spec or {})
        if where.store == IN_TABLE and where.connection:
            by_connection[where.connection].append(pipeline)
    known = {c.name: c for c in Connection.objects.filter(name__in=list(by_connection))}
    out: dict[int, dict] = {}
    for name, members in by_connection.items():
        connection = known.get(name)
        if connection is None or connection.kind != ConnectionKind.POSTGRES:
            continue
        found = {}
        try:
            with _connect(connection) as conn:
                found = {
                    p: (n, at)
                    for p, n, at in conn.execute(
                        sql.SQL(
                            "SELECT pipeline, count(*), max(received_at) FROM {}"
                            " WHERE pipeline = ANY(%s) GROUP BY pipeline"
                        ).format(TABLE),
                        [[p.name for p in members]],
                    ).fetchall()
                }
        except psycopg.errors.UndefinedTable:
            pass  # nothing written there yet: none
        except (psycopg.Error, Unavailable) as exc:
            log.warning("dead letters of connection %s not counted: %s", name, exc)
            continue
        for pipeline in members:
            n, at = found.get(pipeline.name, (0, None))
            out[pipeline.pk] = {"count": n, "last_at": at.isoformat() if at else None}
    return out


def check_topic(topic: str) -> None:
    if not TOPIC.match(topic or ""):
        raise BadFilter("topic", f"{topic!r} is not a Kafka topic name")
    if problem := internal_problem("topic", topic):
        raise BadFilter("to", problem)


def check_source_topics(pipeline: Pipeline, letters: list[dict]) -> None:
    """BadFilter naming `to` unless every letter was recorded from one of the pipeline's
    source topics: a redrive to source writes each letter to the topic its row names, and
    the dead-letter table is in the sink database, which the pipeline (and whoever else can
    write there) writes: a row naming __consumer_offsets or another pipeline's topic must
    not make the control plane produce there."""
    topics = list((pipeline.spec.get("source") or {}).get("topics") or [])
    strays: dict[str | None, int] = defaultdict(int)
    for letter in letters:
        if letter["topic"] not in topics:
            strays[letter["topic"]] += 1
    if not strays:
        return
    named = ", ".join(
        f"{t!r} ({n} letter{'s' if n > 1 else ''})"
        for t, n in sorted(strays.items(), key=lambda item: str(item[0]))
    )
    raise BadFilter(
        "to",
        f"letters recorded from topics this pipeline does not read: {named}; a redrive to"
        f" source writes only to its source.topics ({', '.join(map(repr, topics))}): narrow"
        " the filters (topic), or name the topic to redrive them to. Nothing was redriven",
    )


def redrive(
    pipeline: Pipeline, filters: Filters, *, to: str, user, reason: str, now: datetime
) -> dict:
    """Produce the chosen letters again (raw value, as it was) to `to` ("source": the topic
    each was read from; else a topic name that must exist on the source cluster) through
    the source connection, then delete those Kafka acknowledged; audited. At most
    REDRIVE_LIMIT letters per call (`remaining` says how many are left). One redrive of a
    pipeline at a time (Busy otherwise): a letter is never sent twice by two of them."""
    if to != "source":
        check_topic(to)
    source = pipeline.spec["source"]
    try:
        kafka = pipeline.connections.get(name=source["connection"])
    except Connection.DoesNotExist:
        raise Unavailable(f"the source connection {source['connection']!r} is gone") from None
    config = kafka_client_config(kafka.settings, kafka.get_secrets())
    with _connect(_sink_connection(pipeline)) as lock:
        key = f"cp-redrive:{pipeline.name}"
        if not lock.execute("SELECT pg_try_advisory_lock(hashtext(%s))", [key]).fetchone()[0]:
            raise Busy(f"a redrive of pipeline {pipeline.name!r} is running: try again after it")
        # Held until this connection closes, at the end of the redrive.
        return _redrive(pipeline, filters, to=to, config=config, user=user, reason=reason)


class Busy(Exception):
    """Another redrive of the pipeline is running (409)."""


def _redrive(pipeline: Pipeline, filters: Filters, *, to, config, user, reason) -> dict:
    from kafka import KafkaProducer
    from kafka.errors import KafkaError

    letters = []
    for letter in rows(pipeline, filters):
        letters.append(letter)
        if len(letters) >= REDRIVE_LIMIT:
            break
    if not letters:
        return {"redriven": 0, "failed": 0, "remaining": 0, "to": to, "error": None}
    if to == "source":
        check_source_topics(pipeline, letters)
    # A redrive never creates a topic: the target (or each source topic) must exist.
    for topic in sorted({to} if to != "source" else {letter["topic"] for letter in letters}):
        _check_exists(config, topic)
    try:
        producer = KafkaProducer(
            **config,
            acks="all",
            enable_idempotence=True,
            request_timeout_ms=15_000,
            max_block_ms=15_000,
        )
    except (KafkaError, RuntimeError) as exc:
        raise Unavailable(f"the source cluster: {exc}") from None
    sent, error = [], None
    try:
        for letter in letters:
            origin = f"{letter['topic']}/{letter['partition']}/{letter['offset']}"
            headers = [
                ("cp-redriven-from", origin.encode()),
                ("cp-pipeline", pipeline.name.encode()),
                ("cp-error", (letter["error"] or "")[:500].encode()),
            ]
            future = producer.send(
                letter["topic"] if to == "source" else to,
                value=letter["raw"] if letter["raw"] is not None else b"",
                headers=headers,
            )
            sent.append((letter, future))
        producer.flush(timeout=60)
    except KafkaError as exc:
        error = f"the source cluster: {exc}"  # those acknowledged before it still count
    finally:
        producer.close(timeout=10)
    done = [letter for letter, future in sent if future.is_done and future.succeeded()]
    outcome = {
        "redriven": len(done),
        "failed": len(letters) - len(done),
        "remaining": 0,
        "to": to,
        "error": error,
    }
    try:
        _delete(pipeline, done)
        outcome["remaining"] = count(pipeline, filters)
    except (psycopg.Error, Unavailable) as exc:
        outcome["error"] = f"sent, but not removed from the dead-letter table: {exc}"
    audit.record_with(
        pipeline,
        "dead-letters-redrive",
        user=user,
        reason=reason,
        before={"filters": _described(filters)},
        after=outcome,
    )
    if outcome["error"] and not done:
        raise Unavailable(outcome["error"])
    return outcome


def _check_exists(config: dict, topic: str) -> None:
    """BadFilter naming `to` unless the topic exists (a redrive never creates one)."""
    from kafka.errors import KafkaError

    try:
        consumer = metadata_consumer({**config, "request_timeout_ms": 10_000})
    except (KafkaError, RuntimeError) as exc:
        raise Unavailable(f"the source cluster: {exc}") from None
    try:
        found = consumer.partitions_for_topic(topic)
    except (KafkaError, RuntimeError) as exc:
        raise Unavailable(f"the source cluster: {exc}") from None
    finally:
        consumer.close()
    if not found:
        raise BadFilter("to", f"topic {topic!r} does not exist on the source cluster")


def _described(filters: Filters) -> dict:
    return {
        k: (v.isoformat() if isinstance(v, datetime) else v)
        for k, v in vars(filters).items()
        if v not in (None, "")
    }


def _delete(pipeline: Pipeline, letters: list[dict]) -> None:
    if not letters:
        return
    keys = [(letter["topic"], letter["partition"], letter["offset"]) for letter in letters]
    with _connect(_sink_connection(pipeline)) as conn, conn.cursor() as cursor:
        cursor.executemany(
            sql.SQL(
                "DELETE FROM {} WHERE pipeline = %s AND topic = %s AND partition = %s"
                ' AND "offset" = %s'
            ).format(TABLE),
            [(pipeline.name, *key) for key in keys],
        )


def purge(now: datetime) -> int:
    """Delete letters older than the retention, for every pipeline; how many went."""
    older = now - timedelta(days=settings.CONTROLPLANE_DEAD_LETTER_RETENTION_DAYS)
    # This control plane's pipelines, and those it deleted (their letters age out too), in
    # every Postgres connection's database (a deleted pipeline's sink is not known).
    names = set(Pipeline.objects.values_list("name", flat=True))
    names |= set(
        AuditEntry.objects.filter(action="delete")
        .exclude(pipeline_name="")
        .values_list("pipeline_name", flat=True)
    )
    gone = 0
    for connection in Connection.objects.filter(kind="postgres"):
        try:
            with _connect(connection) as conn:
                gone += conn.execute(
                    sql.SQL("DELETE FROM {} WHERE pipeline = ANY(%s) AND received_at < %s").format(
                        TABLE
                    ),
                    [sorted(names), older],
                ).rowcount
        except psycopg.errors.UndefinedTable:
            continue
        except (psycopg.Error, Unavailable) as exc:
            log.warning("dead letters of connection %s not purged: %s", connection.name, exc)
    return gone
