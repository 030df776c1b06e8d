"""Reading a spec's JSON: the errors it collects (each naming its field), the section reader,
and the checks every part of a spec shares (connections, topics, SQL expressions over the
output). Used by the spec's parser (jobs.spec.validate) and by each sink kind's own parser
(jobs.sinks.<kind>.spec). Plain Python."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..failures import DefinitionError
from ..kafka.names import internal_problem
from .ddl import parse_schema
from .sql import SQLError, check_expression, output_columns

if TYPE_CHECKING:
    from .model import KafkaSource, Transform

# The largest whole number a spec may hold: Java's Long.MAX_VALUE (Kafka offsets, Spark options).
LONG_MAX = 2**63 - 1

# Postgres identifiers we create and quote ourselves: lower case, no quoting surprises, < 64 bytes.
IDENTIFIER_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Kafka's own rule for topic names.
TOPIC_RE = re.compile(r"^[a-zA-Z0-9._-]{1,249}$")
MAX_DELAY_SECONDS = 7 * 24 * 3600


@dataclass(frozen=True)
class FieldError:
    field: str
    message: str


class SpecError(DefinitionError, ValueError):
    """A spec with one or more problems; `errors` names each field and what is wrong."""

    def __init__(self, errors: list[FieldError]):
        self.errors = errors
        super().__init__("; ".join(f"{e.field}: {e.message}" for e in errors))

    def as_dict(self, prefix: str = "") -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for e in self.errors:
            out.setdefault(prefix + e.field, []).append(e.message)
        return out


MISSING = object()


class Section:
    """Reads one JSON object, recording problems instead of raising on the first."""

    def __init__(self, errors: list[FieldError], path: str, data: Any, allowed: set[str]):
        self.errors = errors
        self.path = path
        self.ok = True
        if not isinstance(data, Mapping):
            self.error("", f"must be an object, got {type_name(data)}")
            data = {}
        self.data = data
        for key in sorted(set(data) - allowed):
            self.error(str(key), "unknown field")

    def at(self, name: str) -> str:
        if not name:
            return self.path
        return f"{self.path}.{name}" if self.path else name

    def error(self, name: str, message: str) -> None:
        self.ok = False
        self.errors.append(FieldError(self.at(name), message))

    def get(self, name: str, default: Any = MISSING) -> Any:
        if name in self.data and self.data[name] is not None:
            return self.data[name]
        if default is MISSING:
            self.error(name, "is required")
            return None
        return default

    def string(self, name: str, default: Any = MISSING, *, choices: tuple[str, ...] = ()) -> Any:
        value = self.get(name, default)
        if value is None or value is default:
            return value
        if not isinstance(value, str) or not value.strip():
            self.error(name, "must be a non-empty string")
            return None
        if choices and value not in choices:
            self.error(name, f"must be one of {', '.join(choices)}; got {value!r}")
            return None
        return value

    def integer(
        self,
        name: str,
        default: Any = MISSING,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> Any:
        value = self.get(name, default)
        if value is None or value is default:
            return value
        if isinstance(value, bool) or not isinstance(value, int):
            if isinstance(value, float) and value.is_integer():
                value = int(value)
            else:
                self.error(name, f"must be a whole number, got {value!r}")
                return None
        if minimum is not None and value < minimum:
            self.error(name, f"must be at least {minimum}, got {value}")
            return None
        # Whole numbers end up in the JVM (Kafka and Spark options are longs): never beyond
        # a signed 64-bit integer, whatever the field's own maximum.
        maximum = LONG_MAX if maximum is None else min(maximum, LONG_MAX)
        if value > maximum:
            self.error(name, f"must be at most {maximum}, got {value}")
            return None
        return value

    def number(
        self,
        name: str,
        default: Any = MISSING,
        *,
        minimum: float = 0.0,
        exclusive_minimum: bool = False,
        maximum: float | None = None,
    ) -> Any:
        value = self.get(name, default)
        if value is None or value is default:
            return value
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            self.error(name, f"must be a number, got {value!r}")
            return None
        if value < minimum or (exclusive_minimum and value == minimum):
            relation = "greater than" if exclusive_minimum else "at least"
            self.error(name, f"must be {relation} {minimum:g}, got {value:g}")
            return None
        if maximum is not None and value > maximum:
            self.error(name, f"must be at most {maximum:g}, got {value:g}")
            return None
        return value

    def boolean(self, name: str, default: Any = MISSING) -> Any:
        value = self.get(name, default)
        if value is not None and not isinstance(value, bool):
            self.error(name, f"must be true or false, got {value!r}")
            return None
        return value


def type_name(value: Any) -> str:
    if value is None:
        return "null"
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}.get(
        type(value), type(value).__name__
    )


def names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def check_connection(
    section: Section, name: str | None, kind: str, connections: Mapping[str, str] | None
) -> None:
    if name is None or connections is None:
        return
    if name not in connections:
        known = ", ".join(sorted(connections)) or "none defined"
        section.error("connection", f"no connection named {name!r} (known: {known})")
    elif connections[name] != kind:
        section.error(
            "connection", f"connection {name!r} is a {connections[name]} connection, not {kind}"
        )


# An Avro full name: dotted names of letters, digits and underscores, none starting with a digit.
AVRO_FULL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")


def registry_subject(
    r: Section, connections: Mapping[str, str] | None
) -> tuple[str | None, str | None, str | None]:
    """A `schema_registry` section's connection (a schema-registry one), subject naming
    strategy and record full name (which the record strategies need): (connection, strategy,
    record), each problem recorded at its field."""
    from ..registry.subjects import NEEDS_RECORD, STRATEGIES

    connection = r.string("connection")
    check_connection(r, connection, "schema-registry", connections)
    strategy = r.string("strategy", "topic", choices=STRATEGIES)
    record = r.string("record", None)
    if record is not None and not AVRO_FULL_NAME.fullmatch(record):
        r.error("record", f"{record!r} is not an Avro full name (namespace.Name)")
    if strategy in NEEDS_RECORD and record is None:
        r.error("record", f"is required with strategy {strategy} (the record's full name)")
    return connection, strategy, record


def is_topic_name(name: str) -> bool:
    """Kafka's own rule for topic names."""
    return bool(TOPIC_RE.fullmatch(name)) and name not in {".", ".."}


def topic(s: Section, name: str, default: Any = MISSING) -> str | None:
    topic = s.string(name, default)
    if topic is not None and not is_topic_name(topic):
        s.error(name, f"{topic!r} is not a valid Kafka topic name")
        return None
    if topic is not None and (problem := internal_problem("topic", topic)):
        s.error(name, problem)
        return None
    return topic


def output_columns_of(source: KafkaSource | None, transform: Transform | None) -> frozenset | None:
    """The pipeline's output columns (lower case), what its sinks write: the source schema's
    without a transform, the transform's where its SQL tells them (jobs.spec.sql.
    output_columns), else None (only Spark knows)."""
    if source is None:
        return None
    names = [f.name for f in parse_schema(source.schema).fields]
    if transform is None:
        return frozenset(n.lower() for n in names)
    return output_columns(transform.sql, columns=names)


def not_output(columns: frozenset) -> str:
    plain = sorted(c for c in columns if IDENTIFIER_RE.fullmatch(c))
    listed = f" ({', '.join(plain)})" if 0 < len(plain) <= 12 else ""
    return f"an output column of the transform{listed}"


def expression(s: Section, name: str, columns: list[str] | None) -> str | None:
    text = s.get(name, None)
    if text is None:
        return None
    if not isinstance(text, str):
        s.error(name, "must be a SQL expression (a string)")
        return None
    try:
        check_expression(text, columns=columns)
    except SQLError as exc:
        s.error(name, str(exc))
        return None
    return text.strip()
