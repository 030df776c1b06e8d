"""The browser's forms for pipelines and connections: form fields <-> spec or settings, and
each validation problem placed next to the field it concerns.

Validation itself is the API's (jobs.spec via services, ConnectionSerializer): a form only
turns text inputs into the JSON they stand for, and the dotted paths of the problems found
(`source.topics[1]`, `restart_policy.delay_seconds`, `settings.dsn`) back into input names.
No Django imports: plain data in, plain data out.
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass, field
from typing import Any

from controlplane import bounded_json
from jobs.connections import SASL_MECHANISMS, SECRET_FIELDS, SECURITY_PROTOCOLS
from jobs.sinks import registry

GENERAL = "__all__"  # problems that belong to no single field
NOT_SPEC = ("name", "description", "placement")  # pipeline fields outside its spec
DEFAULT_SINK = registry.DEFAULT  # what a sink without a kind is


@dataclass(frozen=True)
class Field:
    name: str  # the input's name
    path: str  # what it edits: a dotted spec path, or "name" / "description"
    label: str
    type: str = (
        "text"  # the input: text | textarea | number | select | checkbox | list | json | secret
    )
    help: str = ""
    choices: tuple[str, ...] = ()
    group: str = ""  # a restart policy kind: shown for that kind only
    sink: str = ""  # a sink kind: shown and sent for that kind only
    labels: tuple[str, ...] = ()  # what the choices are called, when not their values
    # Spec paths above the field's own whose problems are shown at it (`source.watermark`:
    # "is required for an aggregation" goes to the watermark's column).
    owns: tuple[str, ...] = ()


def _sink_fields() -> list[Field]:
    """Each sink kind's own inputs (jobs.sinks.<kind>.spec.FORM), shown for that kind."""
    return [
        Field(
            f.name,
            f"sink.{f.path}",
            f.label,
            f.type,
            f.help,
            f.choices,
            sink=kind.name,
            labels=f.labels,
        )
        for kind in registry.KINDS.values()
        for f in kind.form
    ]


RESTART_KINDS = ("exponential-delay", "fixed-delay", "failure-rate", "none")
SINK_KINDS = registry.names()
STATE_STORES = ("rocksdb", "hdfs")  # the first: what the spec's null means
# Inputs of the form's "Event time and state" section (the spec's source.watermark,
# source.deduplicate and state_store).
STATE_FIELDS = ("watermark_column", "watermark_delay_seconds", "deduplicate_key", "state_store")
_RESTART_FIELDS = {  # kind: (field, label, help)
    "fixed-delay": [
        ("attempts", "Attempts", "restarts before giving up"),
        ("delay_seconds", "Delay (s)", "between a failure and the restart"),
    ],
    "failure-rate": [
        ("max_failures", "Max failures", "per interval, before giving up"),
        ("interval_seconds", "Interval (s)", ""),
        ("delay_seconds", "Delay (s)", "between a failure and the restart"),
    ],
    "exponential-delay": [
        ("initial_backoff_seconds", "Initial backoff (s)", ""),
        ("max_backoff_seconds", "Max backoff (s)", ""),
        ("multiplier", "Multiplier", ""),
        ("jitter", "Jitter", "0 to 1: +/- this share of the backoff"),
        ("reset_after_seconds", "Reset after (s)", "healthy this long: the backoff starts over"),
        ("max_attempts", "Max attempts", "empty: unlimited"),
    ],
    "none": [],
}

PIPELINE_FIELDS = [
    Field("name", "name", "Name", help="lower-case letters, digits and -; cannot change later"),
    Field("description", "description", "Description"),
    Field(
        "placement",
        "placement",
        "Placement",
        "select",
        "where its query runs: dedicated (its own Spark application), auto (any running shared"
        " application with room) or a shared application; a change takes effect at its next run",
    ),
    Field("source_connection", "source.connection", "Kafka connection", "select"),
    Field("topics", "source.topics", "Topics", "list", "comma-separated"),
    Field(
        "format",
        "source.format",
        "Value format",
        "select",
        "json: parsed with the schema below; avro: decoded with the Avro schema below",
        choices=("json", "avro"),
    ),
    Field(
        "schema",
        "source.schema",
        "Schema",
        "textarea",
        "Spark DDL of the JSON values, e.g. id STRING, amount DOUBLE, ts TIMESTAMP (for Avro:"
        " derived from the Avro schema)",
    ),
    Field(
        "avro_schema",
        "source.avro_schema",
        "Avro schema",
        "textarea",
        'Avro only: the writers\' record schema as JSON, {"type": "record", "name": ...,'
        ' "fields": [...]}',
    ),
    Field(
        "avro_framing",
        "source.avro_framing",
        "Avro framing",
        "select",
        "confluent: each value starts with a schema registry's 5-byte header (magic byte 0,"
        " schema id)",
        choices=("none", "confluent"),
    ),
    Field(
        "registry_connection",
        "source.schema_registry.connection",
        "Schema registry",
        help="confluent framing: a schema-registry connection; the Avro schema then comes from"
        " the values' subject (<topic>-value) when the pipeline is saved",
    ),
    Field(
        "registry_version",
        "source.schema_registry.version",
        "Schema version",
        "json",
        "latest (the latest when saved), or a version number",
    ),
    Field(
        "starting_offsets",
        "source.starting_offsets",
        "Starting offsets",
        "json",
        'earliest, latest, {"timestamp": "2026-11-21T10:00:00Z"} or'
        ' {"topic": {"0": 42}}; only for a new checkpoint',
    ),
    Field(
        "max_records_per_batch", "source.max_records_per_batch", "Max records per batch", "number"
    ),
    Field(
        "fail_on_data_loss",
        "source.fail_on_data_loss",
        "Fail when unread records are gone",
        "checkbox",
        "off: log a warning and resume at the first record still there",
    ),
    Field(
        "reader",
        "source.reader",
        "Reader",
        "select",
        "empty: Spark's Kafka connector where installed, else the Python reader; a checkpoint"
        " keeps the reader it was started with",
        choices=("", "spark-kafka", "python"),
    ),
    Field(
        "min_partitions",
        "source.min_partitions",
        "Min input partitions",
        "number",
        "empty: the application's cores",
    ),
    Field(
        "consumer_group",
        "source.consumer_group",
        "Consumer group (optional)",
        help="mirror committed offsets to this group for lag tools",
    ),
    Field(
        "watermark_column",
        "source.watermark.column",
        "Event time column",
        help="a TIMESTAMP column of the schema; empty: no watermark. Needed to aggregate over"
        " the stream (GROUP BY window(<this column>, '5 minutes'), ...) and to deduplicate",
        owns=("source.watermark",),
    ),
    Field(
        "watermark_delay_seconds",
        "source.watermark.delay_seconds",
        "Watermark delay (s)",
        "number",
        "0 to 604800: how late a record may come (the watermark is the latest event time seen"
        " minus this); older records are dropped and counted",
    ),
    Field(
        "deduplicate_key",
        "source.deduplicate.key",
        "Deduplicate by (optional)",
        "list",
        "source columns, comma-separated: a record whose key was seen within the watermark is"
        " dropped; needs the event time column",
        owns=("source.deduplicate",),
    ),
    Field(
        "transform_sql",
        "transform.sql",
        "Transform (optional)",
        "textarea",
        "one Spark SQL query over the view `source`; empty: the parsed columns as they are",
    ),
    Field(
        "output_mode",
        "transform.output_mode",
        "Output mode",
        "select",
        "per batch: the SQL runs over each micro-batch alone (an aggregate counts within the"
        " batch); append: over the stream, each group written once when the watermark"
        " finishes it (a window's final count); update: over the stream, a group written"
        " again after every batch that changed it (a running count: a postgres upsert keyed"
        " by the group, or a kafka sink with a key)",
        choices=("", "append", "update"),
        labels=("per batch", "append (finished groups, once)", "update (changed groups)"),
    ),
    Field(
        "state_store",
        "state_store",
        "State store",
        "select",
        "for stateful pipelines (an event time column, deduplication or an output mode):"
        " RocksDB keeps state on the executors' disks and checkpoints only each batch's"
        " changes; HDFS-backed keeps every key in memory. A checkpoint keeps the store it was"
        " started with",
        choices=STATE_STORES,
        labels=("RocksDB (default)", "HDFS-backed (Spark's default)"),
    ),
    Field(
        "sink_kind",
        "sink.kind",
        "Sink",
        "select",
        "; ".join(k.summary for k in registry.KINDS.values()),
        choices=SINK_KINDS,
    ),
    Field("sink_connection", "sink.connection", "Sink connection", "select"),
    *_sink_fields(),
    Field(
        "sinks",
        "sinks",
        "Several sinks (optional)",
        "json",
        'a list of sinks as JSON, e.g. [{"connection": "warehouse", "table": "t"}, {"kind":'
        ' "kafka", "connection": "events", "topic": "out"}, {"kind": "files", "connection":'
        ' "lake", "path": "sales/orders"}]: each is written exactly once; when given, the'
        " sink fields above are not used",
    ),
    Field("interval_seconds", "trigger.interval_seconds", "Trigger interval (s)", "number"),
    Field("restart_kind", "restart_policy.kind", "Restart policy", "select", choices=RESTART_KINDS),
    *[
        Field(f"restart_{kind}_{name}", f"restart_policy.{name}", label, "number", help, group=kind)
        for kind, fields in _RESTART_FIELDS.items()
        for name, label, help in fields
    ],
]

KAFKA_FIELDS = [
    Field(
        "bootstrap_servers",
        "settings.bootstrap_servers",
        "Bootstrap servers",
        "list",
        "host:port, comma-separated",
    ),
    Field(
        "security_protocol",
        "settings.security_protocol",
        "Security protocol",
        "select",
        choices=SECURITY_PROTOCOLS,
    ),
    Field(
        "sasl_mechanism",
        "settings.sasl_mechanism",
        "SASL mechanism",
        "select",
        choices=("", *SASL_MECHANISMS),
    ),
    Field("sasl_username", "settings.sasl_username", "SASL username"),
    Field("sasl_password", "secrets.sasl_password", "SASL password", "secret"),
    Field("client_id", "settings.client_id", "Client id"),
    Field(
        "ssl_cafile",
        "settings.ssl_cafile",
        "CA file",
        help="a path on the machines that run the jobs",
    ),
    Field("ssl_certfile", "settings.ssl_certfile", "Client certificate file"),
    Field("ssl_keyfile", "settings.ssl_keyfile", "Client key file"),
    Field("ssl_password", "secrets.ssl_password", "Client key password", "secret"),
    Field(
        "ssl_check_hostname",
        "settings.ssl_check_hostname",
        "Check the broker's host name",
        "select",
        choices=("", "true", "false"),
    ),
]
POSTGRES_FIELDS = [
    Field(
        "dsn",
        "settings.dsn",
        "DSN",
        help="postgresql://user@host:port/dbname (a password in it is moved to the secrets)",
    ),
    Field("password", "secrets.password", "Password", "secret"),
]
FILES_FIELDS = [
    Field(
        "root",
        "settings.root",
        "Root",
        help="a URI: file:///path (a local directory inside the one an admin allows,"
        " CONTROLPLANE_FILES_DIR), hdfs://namenode:8020/path, viewfs://, s3a://bucket/path,"
        " abfs(s)://container@account..., gs://bucket/path or wasbs://...; credentials come"
        " from the cluster's Hadoop configuration, never from here",
    ),
]
CASSANDRA_FIELDS = [
    Field(
        "contact_points",
        "settings.contact_points",
        "Contact points",
        "list",
        "host:port, comma-separated (port 9042 when left out)",
    ),
    Field("local_datacenter", "settings.local_datacenter", "Local data centre"),
    Field(
        "keyspace",
        "settings.keyspace",
        "Keyspace",
        help="where the sinks' tables are (it must exist; never one of Cassandra's own)",
    ),
    Field("username", "settings.username", "Username"),
    Field("password", "secrets.password", "Password", "secret"),
    Field("tls", "settings.tls", "TLS", "select", choices=("", "true", "false")),
    Field(
        "ssl_cafile",
        "settings.ssl_cafile",
        "CA file",
        help="in the certificate directory an admin allows (CONTROLPLANE_CERT_DIR)",
    ),
    Field("ssl_certfile", "settings.ssl_certfile", "Client certificate file"),
    Field("ssl_keyfile", "settings.ssl_keyfile", "Client key file"),
    Field(
        "ssl_check_hostname",
        "settings.ssl_check_hostname",
        "Check the nodes' host names",
        "select",
        choices=("", "true", "false"),
    ),
]
REGISTRY_FIELDS = [
    Field(
        "url",
        "settings.url",
        "URL",
        help="the registry's Confluent API, e.g. https://registry:8081 or"
        " http://apicurio:8080/apis/ccompat/v7 (no user, query or fragment)",
    ),
    Field("auth", "settings.auth", "Authentication", "select", choices=("none", "basic", "bearer")),
    Field("username", "settings.username", "Username", help="with basic authentication"),
    Field("password", "secrets.password", "Password", "secret"),
    Field("token", "secrets.token", "Bearer token", "secret"),
    Field(
        "ssl_cafile",
        "settings.ssl_cafile",
        "CA file",
        help="https only; in the certificate directory an admin allows (CONTROLPLANE_CERT_DIR)",
    ),
    Field("ssl_certfile", "settings.ssl_certfile", "Client certificate file"),
    Field("ssl_keyfile", "settings.ssl_keyfile", "Client key file"),
    Field("timeout_seconds", "settings.timeout_seconds", "Timeout (s)", "number"),
    Field(
        "wait_seconds",
        "settings.wait_seconds",
        "Wait for it (s)",
        "number",
        help="how long a job waits for a registry that does not answer, asked for a schema it"
        " has not seen yet, before its batch fails (60 s when left empty)",
    ),
]
CONNECTION_FIELDS = {
    "kafka": KAFKA_FIELDS,
    "postgres": POSTGRES_FIELDS,
    "files": FILES_FIELDS,
    "cassandra": CASSANDRA_FIELDS,
    "schema-registry": REGISTRY_FIELDS,
}
# Settings chosen as true or false (a select: empty leaves the default).
_BOOLEAN_SELECTS = ("ssl_check_hostname", "tls")
CONNECTION_COMMON = [
    Field("name", "name", "Name", help="pipelines refer to it by this name; cannot change later"),
    Field("kind", "kind", "Kind", "select", choices=tuple(CONNECTION_FIELDS)),
    Field("description", "description", "Description"),
]


@dataclass
class Parsed:
    """What a submitted form stands for, and the problems found before any validation."""

    data: dict[str, Any]
    errors: dict[str, list[str]] = field(default_factory=dict)

    def error(self, name: str, message: str) -> None:
        self.errors.setdefault(name, []).append(message)


def _get(tree: dict, path: str, default: Any = None) -> Any:
    for part in path.split("."):
        if not isinstance(tree, dict) or part not in tree:
            return default
        tree = tree[part]
    return tree


def _set(tree: dict, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    for part in parents:
        if not isinstance(tree.get(part), dict):
            tree[part] = {}
        tree = tree[part]
    tree[last] = value


def _number(text: str) -> int | float:
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)


def _value(f: Field, raw: Any, parsed: Parsed) -> Any:
    """One input's text as the JSON value it stands for; `None` when left empty."""
    if f.type == "checkbox":
        return raw not in (None, "", "off", "false")
    text = (raw or "").strip() if isinstance(raw, str) or raw is None else raw
    if text == "":
        return None
    if f.type == "list":
        return [part.strip() for part in text.split(",") if part.strip()]
    if f.type == "number":
        try:
            return _number(text)
        except ValueError:
            parsed.error(f.name, f"{text!r} is not a number")
            return None
    if f.type == "json":
        if re.fullmatch(r"[A-Za-z_-]+", text):
            return text  # earliest, latest: a bare word
        try:
            return bounded_json.loads(text)
        except ValueError as exc:
            parsed.error(f.name, f"not a word or JSON: {exc}")
            return None
    if f.name in _BOOLEAN_SELECTS:
        return text == "true"
    return text


def pipeline_from_form(post: dict[str, Any], current_spec: dict | None) -> Parsed:
    """name, description, placement and spec from a submitted pipeline form. Starts from
    the current spec, so parts the form does not show are kept."""
    spec = copy.deepcopy(current_spec) if current_spec else {}
    parsed = Parsed({"spec": spec})
    kind = (post.get("restart_kind") or "").strip() or None
    sink_kind = (post.get("sink_kind") or "").strip() or _get(spec, "sink.kind") or DEFAULT_SINK
    if isinstance(spec.get("sink"), dict) and spec["sink"].get("kind", DEFAULT_SINK) != sink_kind:
        spec["sink"] = {}  # another kind of sink: none of the old one's fields apply
    several = (post.get("sinks") or "").strip() != ""
    spec.pop("sink" if several else "sinks", None)
    for f in PIPELINE_FIELDS:
        if f.group or f.name == "restart_kind" or (f.sink and f.sink != sink_kind):
            continue
        if several and f.path.startswith("sink."):
            continue  # the list replaces the one sink
        if f.path == "sinks":
            if several:
                spec["sinks"] = _value(f, post.get(f.name), parsed)
            continue
        value = _value(f, post.get(f.name), parsed)
        if f.path in NOT_SPEC:
            parsed.data[f.path] = value or ""
        elif f.path == "transform.sql":
            if value is None:
                spec.pop("transform", None)
            else:
                spec["transform"] = {"sql": value}
        elif f.path == "transform.output_mode":
            if value is not None and isinstance(spec.get("transform"), dict):
                spec["transform"]["output_mode"] = value
            elif value is not None:
                parsed.error(f.name, "applies to a transform: write its SQL, or choose per batch")
        elif f.path == "state_store":
            _state_store(spec, value, current_spec)
        elif value is None:
            *parents, last = f.path.split(".")
            parent = _get(spec, ".".join(parents))
            if isinstance(parent, dict):
                parent.pop(last, None)  # the spec's default applies
        else:
            _set(spec, f.path, value)
    source = spec.get("source")
    for part in ("watermark", "deduplicate", "schema_registry"):
        if isinstance(source, dict) and source.get(part) == {}:
            source.pop(part)  # every input of it left empty: none
    if isinstance(source, dict) and source.get("format") == "avro":
        source.pop("schema", None)  # derived from the Avro schema
    elif isinstance(source, dict):
        source.pop("avro_framing", None)  # shown with its default for JSON too
    if kind is None:
        spec.pop("restart_policy", None)
    else:
        policy: dict[str, Any] = {"kind": kind}
        for f in PIPELINE_FIELDS:
            if f.group == kind:
                value = _value(f, post.get(f.name), parsed)
                if value is not None:
                    policy[f.path.split(".", 1)[1]] = value
        spec["restart_policy"] = policy
    return parsed


def _state_store(spec: dict, value: Any, current_spec: dict | None) -> None:
    """The state store: RocksDB (the first choice) is what the spec's null means, so it is
    sent as null (a stateless pipeline takes no state store), or as it was stored."""
    if value is not None and value != STATE_STORES[0]:
        spec["state_store"] = value
    elif value is not None and (current_spec or {}).get("state_store") == value:
        spec["state_store"] = value  # as stored: the form changes nothing
    else:
        spec.pop("state_store", None)


def pipeline_values(
    name: str, description: str, spec: dict, placement: str = "dedicated"
) -> dict[str, Any]:
    """The form's inputs for a stored pipeline (its canonical spec)."""
    values: dict[str, Any] = {"name": name, "description": description, "placement": placement}
    kind = _get(spec, "restart_policy.kind")
    sink_kind = _get(spec, "sink.kind") or DEFAULT_SINK
    for f in PIPELINE_FIELDS:
        if f.path in NOT_SPEC:
            continue
        if (f.group and f.group != kind) or (f.sink and f.sink != sink_kind):
            continue
        values[f.name] = _text(f, _get(spec, f.path))
    values["state_store"] = spec.get("state_store") or STATE_STORES[0]
    return values


def options(f: Field, choices: Any) -> list[tuple[str, str]]:
    """A select's (value, label) pairs: the field's labels, else the values ("" shown as
    "(default)")."""
    labels = dict(zip(f.choices, f.labels, strict=False))
    return [(c, labels.get(c) or c or "(default)") for c in choices]


def _text(f: Field, value: Any) -> Any:
    if value is None:
        return ""
    if f.type == "checkbox":
        return bool(value)
    if f.type == "list":
        return ", ".join(str(v) for v in value)
    if f.type == "json":
        return value if isinstance(value, str) else json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def connection_from_form(post: dict[str, Any], kind: str) -> Parsed:
    """name, kind, description, settings and the secrets to change (a secret left empty is
    kept, one marked for removal becomes None)."""
    parsed = Parsed({"settings": {}, "secrets": {}})
    for f in CONNECTION_COMMON:
        parsed.data[f.path] = (post.get(f.name) or "").strip()
    for f in CONNECTION_FIELDS.get(kind, []):
        section, key = f.path.split(".", 1)
        if f.type == "secret":
            if post.get(f"remove_{f.name}"):
                parsed.data["secrets"][key] = None
            elif post.get(f.name):
                parsed.data["secrets"][key] = post[f.name]  # exactly as typed
            continue
        value = _value(f, post.get(f.name), parsed)
        if value is not None:
            parsed.data[section][key] = value
    return parsed


def connection_values(name: str, kind: str, description: str, settings: dict) -> dict:
    """The form's inputs for a stored connection: its settings, never its secrets."""
    values: dict[str, Any] = {"name": name, "kind": kind, "description": description}
    for f in CONNECTION_FIELDS.get(kind, []):
        if f.type != "secret":
            values[f.name] = _text(f, _get({"settings": settings}, f.path))
    return values


def without_secrets(post: dict[str, Any]) -> dict[str, Any]:
    """A submitted connection form to show again: what was typed, minus every secret."""
    secret_names = {
        f.name for fields in CONNECTION_FIELDS.values() for f in fields if f.type == "secret"
    }
    return {k: v for k, v in post.items() if k not in secret_names}


def place_errors(
    errors: dict[str, list[str]],
    fields: list[Field],
    *,
    group: str | None = None,
    sink: str | None = None,
) -> dict[str, list[str]]:
    """Problems keyed by dotted path (`spec.source.topics[1]`, `settings.dsn`) -> keyed by
    the input they concern, the rest under GENERAL with their path. Restart policy fields
    are looked up in the chosen kind's group, sink fields in the chosen sink's."""
    by_path = {}
    owned = set()
    for f in fields:
        if (not f.group or f.group == group) and (not f.sink or f.sink == (sink or DEFAULT_SINK)):
            by_path.setdefault(f.path, f.name)
            for path in f.owns:
                by_path.setdefault(path, f.name)
                owned.add(path)
    placed: dict[str, list[str]] = {}
    for path, messages in errors.items():
        clean = re.sub(r"\[[^\]]*\]", "", path.removeprefix("spec.")).strip(".")
        name, probe = None, clean
        while probe:
            if probe in by_path:
                name = by_path[probe]
                break
            probe = probe.rpartition(".")[0]
        if name is None:
            placed.setdefault(GENERAL, []).extend(
                f"{path}: {m}" if path not in ("", GENERAL, "non_field_errors", "detail") else m
                for m in messages
            )
            continue
        # Say which item or sub-field when the problem is in a part of the input.
        inner = path.removeprefix("spec.")
        detail = "" if inner == _path_of(fields, name) or inner in owned else inner
        placed.setdefault(name, []).extend(f"{detail}: {m}" if detail else m for m in messages)
    return placed


def _path_of(fields: list[Field], name: str) -> str:
    return next(f.path for f in fields if f.name == name)


def secret_fields(kind: str) -> list[str]:
    return sorted(SECRET_FIELDS.get(kind, ()))
