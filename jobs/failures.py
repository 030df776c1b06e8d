"""Why a run failed, and whether restarting it can help: decided by the exception's *type*
where the driver catches it, never by matching its text.

A failure is **permanent** when the next run would fail the same way until someone changes
the spec, the sink's table, the credentials or the grants (a missing column, a topic that
does not exist, a refused password); the control plane then gives up at once whatever the
restart policy says. Anything else is **transient**: the restart policy decides.

What is looked at, from the exception the driver caught down through its causes (Python's
`__cause__` / `__context__`, and for a Java exception behind py4j its `getCause()` chain):

* our own exceptions: a subclass of `PermanentError` (a `DefinitionError` for definition
  errors) is permanent, and says what it is (`what`): a new one needs no list edited here;
* Spark's errors by their error condition (`SparkThrowable.getCondition()`, in Python
  `PySparkException.getCondition()`) and, for analysis errors, by type (`AnalysisException`);
* Postgres errors by SQLSTATE (psycopg's `Error.sqlstate`, JDBC's `SQLException.getSQLState()`);
* Kafka's client errors by class (Java's `org.apache.kafka.common.errors.*`, kafka-python's
  `kafka.errors.*`);
* the stores checkpoints and files sinks live on (HDFS, S3), down, not ready or throttling:
  transient, and said in words naming the store ("the checkpoint store HDFS at nn:8020 could
  not be reached: ..."). By class (SafeModeException, StandbyException, RetriableException,
  S3A's and the AWS SDK's service exceptions with their HTTP status); for a RemoteException,
  by the class the NameNode raised (`getClassName()`); for a network failure (refused,
  reset, timed out), by where it was thrown: the stack frames' classes, HDFS's client or
  S3's (never the message). Which store is which comes from the pipeline's configuration
  (`name_stores`).

A foreachBatch function's exception reaches the driver wrapped by Spark
(FOREACH_BATCH_USER_FUNCTION_ERROR, around py4j's "exception raised by the Python proxy"), its
type lost on the way through the JVM: `recording` keeps the Python exception itself, by
query, and the classifier looks through the wrapper to it. An exception raised in a Python
worker (an executor) reaches the driver as text only (PYTHON_EXCEPTION): its type is read back
from the traceback where it is one the driver knows (see below); otherwise there is no typed
verdict (None), and the control plane falls back to reading the error output.

Besides permanent or transient, a verdict names its **category** (`CATEGORIES`: an unknown
column, a type mismatch, a missing topic, bad credentials, a lost connection, out of memory...),
by the same types; the control plane's catalogue of causes (controlplane.supervision.explain)
gives each the fix its runbook suggests. An exception raised in a Python worker reaches the
driver as text (PYTHON_EXCEPTION, its traceback inside): its type is read from that traceback's
last line and looked up among the modules the driver has loaded (psycopg's, kafka-python's,
ours; nothing is imported), so that a worker's psycopg error is judged by its class and SQLSTATE
like the driver's own.

The verdict goes to the control plane with the driver's exit (`write_verdict`: RUN_DIR/
failure.json, which the supervisor, or the shared application, adds to its exit report).

Plain Python at import time (it is read by jobs.supervise, which runs without PySpark); py4j,
PySpark, psycopg and kafka-python are only looked at when the exception comes from them.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

PERMANENT = "permanent"
TRANSIENT = "transient"
KINDS = (PERMANENT, TRANSIENT)
VERDICT_FILE = "failure.json"
# Bounds of each field, here and in the control plane's check of a report
# (controlplane.supervision.failures).
MAX_REASON = 1000
MAX_TYPE = 200
MAX_CONDITION = 100
MAX_CATEGORY = 40
DETAIL_CHARS = 500

# What a failure is, whatever decided it (one word each; the control plane's catalogue,
# controlplane.supervision.explain, says each in words with the fix its runbook suggests).
DEFINITION = "definition"  # the spec cannot work as written (Spark's analyzer, our checks)
UNKNOWN_COLUMN = "unknown-column"  # a column the transform or the sink table does not have
TYPE_MISMATCH = "type-mismatch"  # a value or type a column cannot take
MISSING_TABLE = "missing-table"  # a table (or database) that does not exist
MISSING_TOPIC = "missing-topic"  # a Kafka topic that does not exist
AUTHENTICATION = "authentication"  # credentials refused
AUTHORIZATION = "authorization"  # logged in, but not allowed
CONSTRAINT = "constraint"  # the sink table refused a row (unique, not null, check, foreign key)
DATA_LOSS_CATEGORY = "data-loss"  # records deleted by retention before they were read
STATE_INCOMPATIBLE = "state-incompatible"  # the checkpoint's state cannot follow the spec
STORE_UNAVAILABLE = "store-unavailable"  # HDFS or S3 down, not ready or throttling
CONNECTION_LOST = "connection-lost"  # a database or broker refused, dropped or timed out
OUT_OF_MEMORY = "out-of-memory"
OTHER = "other"
CATEGORIES = (
    DEFINITION,
    UNKNOWN_COLUMN,
    TYPE_MISMATCH,
    MISSING_TABLE,
    MISSING_TOPIC,
    AUTHENTICATION,
    AUTHORIZATION,
    CONSTRAINT,
    DATA_LOSS_CATEGORY,
    STATE_INCOMPATIBLE,
    STORE_UNAVAILABLE,
    CONNECTION_LOST,
    OUT_OF_MEMORY,
    OTHER,
)


class PermanentError(Exception):
    """Base of our exceptions that restarting cannot fix. `what` names the kind, in words
    (the start of the verdict's reason); `category` is its place in CATEGORIES."""

    what = "a permanent failure"
    category = DEFINITION


class DefinitionError(PermanentError):
    """The pipeline's definition cannot work (the spec, or what it asks of its checkpoint or
    sink): the same on every restart."""

    what = "a definition error"


@dataclass(frozen=True)
class Verdict:
    kind: str  # PERMANENT or TRANSIENT
    reason: str  # in words, for the operator
    type: str  # the exception's type that decided (Python or Java class name)
    condition: str = ""  # Spark's error condition, or the SQLSTATE, that decided (if any)
    category: str = OTHER  # what it is (CATEGORIES)

    @property
    def permanent(self) -> bool:
        return self.kind == PERMANENT

    def as_dict(self) -> dict[str, str]:
        return asdict(self)


# -- what decides ---------------------------------------------------------------------------

ANALYSIS = "a definition error (Spark cannot analyse the transform)"
STATE = "a state the checkpoint cannot restore"
STREAMING = "a definition error (Spark refuses the stateful transform on a stream)"
DATA_LOSS = "data loss (fail_on_data_loss is true)"
CREDENTIALS = "bad credentials"
PRIVILEGES = "missing privileges"
NO_TOPIC = "a topic that does not exist"
CASSANDRA_DEFINITION = "a definition error (Cassandra refuses the write)"

# Spark error conditions (CLASS or CLASS.SUBCLASS; a name ending in "_" is a prefix): the
# permanent kind in words, and the category.
_CONDITIONS: tuple[tuple[tuple[str, ...], str, str], ...] = (
    (
        ("UNRESOLVED_COLUMN", "UNRESOLVED_FIELD", "COLUMN_NOT_DEFINED_IN_TABLE"),
        ANALYSIS,
        UNKNOWN_COLUMN,
    ),
    (("DATATYPE_MISMATCH", "INVALID_EXTRACT_BASE_FIELD_TYPE"), ANALYSIS, TYPE_MISMATCH),
    (
        (
            "UNRESOLVED_ROUTINE",
            "TABLE_OR_VIEW_NOT_FOUND",
            "PARSE_SYNTAX_ERROR",
            "AMBIGUOUS_REFERENCE",
        ),
        ANALYSIS,
        DEFINITION,
    ),
    # A stateful transform changed in a way its checkpoint's state cannot follow: Spark
    # refuses to restore it at every start, until the spec goes back or the offsets are reset.
    (
        (
            "STATE_STORE_KEY_SCHEMA_NOT_COMPATIBLE",
            "STATE_STORE_VALUE_SCHEMA_NOT_COMPATIBLE",
            "STATE_STORE_INVALID_CONFIG_AFTER_RESTART",
            "STATE_STORE_INVALID_PROVIDER",
            "STATE_STORE_INVALID_VALUE_SCHEMA_EVOLUTION",
            "STATE_STORE_INVALID_VARIABLE_TYPE_CHANGE",
            "STREAMING_STATEFUL_OPERATOR_",
        ),
        STATE,
        STATE_INCOMPATIBLE,
    ),
    (
        (
            "STREAMING_OUTPUT_MODE",
            "NON_TIME_WINDOW_NOT_SUPPORTED_IN_STREAMING",
            "UNSUPPORTED_STREAMING_OPERATOR_",
        ),
        STREAMING,
        DEFINITION,
    ),
    (("KAFKA_DATA_LOSS",), DATA_LOSS, DATA_LOSS_CATEGORY),
)
# What wraps a foreachBatch function's exception (its Python type is behind it).
FOREACH_BATCH = "FOREACH_BATCH_USER_FUNCTION_ERROR"
# What an exception raised in a Python worker becomes: its type survives only as text.
PYTHON_WORKER = "PYTHON_EXCEPTION"

# Postgres SQLSTATEs (psycopg or JDBC), exact codes first, then classes (first two chars):
# the permanent kind in words (None: transient), and the category.
_SQLSTATES: dict[str, tuple[str | None, str]] = {
    "28P01": (f"{CREDENTIALS} (the database refused the password)", AUTHENTICATION),
    "28000": (f"{CREDENTIALS} (the database refused the login)", AUTHENTICATION),
    "42501": (f"{PRIVILEGES} (the database refused the statement)", AUTHORIZATION),
    "42703": ("a definition error (the sink table has no such column)", UNKNOWN_COLUMN),
    "42P01": ("a definition error (the sink table does not exist)", MISSING_TABLE),
    "42804": (
        "a definition error (a column of the sink table cannot take the output's type)",
        TYPE_MISMATCH,
    ),
    "22P02": (
        "a definition error (a column of the sink table cannot take the output's values)",
        TYPE_MISMATCH,
    ),
    "3D000": ("a definition error (the sink database does not exist)", MISSING_TABLE),
}
_SQLSTATE_CLASSES: dict[str, tuple[str | None, str]] = {
    "42": ("a definition error (the sink table does not fit the output)", DEFINITION),
    "22": (
        "a definition error (a column of the sink table cannot take the output's values)",
        TYPE_MISMATCH,
    ),
    "28": (CREDENTIALS, AUTHENTICATION),
    # A row the table refuses (unique, not null, check, foreign key): the batch is replayed
    # as it was, so it fails again, but an operator may change the table (or the data may be
    # let through by a fixed upstream): transient, the restart policy decides.
    "23": (None, CONSTRAINT),
    # Connection exceptions, an administrator's shutdown, too many connections.
    "08": (None, CONNECTION_LOST),
    "57": (None, CONNECTION_LOST),
    "53": (None, CONNECTION_LOST),
}

# Java classes (the exception's class or a superclass): the permanent kind in words (None:
# transient), and the category.
_JAVA_CLASSES: dict[str, tuple[str | None, str]] = {
    "org.apache.spark.sql.AnalysisException": (ANALYSIS, DEFINITION),
    "org.apache.kafka.common.errors.UnknownTopicOrPartitionException": (NO_TOPIC, MISSING_TOPIC),
    "org.apache.kafka.common.errors.InvalidTopicException": (NO_TOPIC, MISSING_TOPIC),
    "org.apache.kafka.common.errors.AuthenticationException": (CREDENTIALS, AUTHENTICATION),
    "org.apache.kafka.common.errors.AuthorizationException": (PRIVILEGES, AUTHORIZATION),
    # HDFS refused the user a path (its permissions or ACLs): an HDFS admin must change them.
    "org.apache.hadoop.security.AccessControlException": (PRIVILEGES, AUTHORIZATION),
    "java.lang.OutOfMemoryError": (None, OUT_OF_MEMORY),
    "org.apache.kafka.common.errors.TimeoutException": (None, CONNECTION_LOST),
    "org.apache.kafka.common.errors.NetworkException": (None, CONNECTION_LOST),
    "org.apache.kafka.common.errors.DisconnectException": (None, CONNECTION_LOST),
    "java.net.ConnectException": (None, CONNECTION_LOST),
    "java.net.SocketTimeoutException": (None, CONNECTION_LOST),
    "java.net.UnknownHostException": (None, CONNECTION_LOST),
    # The cassandra sink's writer (controlplane.spark.CassandraWriter) and its Java driver.
    "controlplane.spark.CassandraWriter$DefinitionException": (CASSANDRA_DEFINITION, DEFINITION),
    "controlplane.spark.CassandraWriter$RetriesExhaustedException": (None, CONNECTION_LOST),
    "com.datastax.oss.driver.api.core.auth.AuthenticationException": (
        CREDENTIALS,
        AUTHENTICATION,
    ),
    "com.datastax.oss.driver.api.core.servererrors.UnauthorizedException": (
        PRIVILEGES,
        AUTHORIZATION,
    ),
    "com.datastax.oss.driver.api.core.servererrors.InvalidQueryException": (
        CASSANDRA_DEFINITION,
        DEFINITION,
    ),
    "com.datastax.oss.driver.api.core.servererrors.SyntaxError": (CASSANDRA_DEFINITION, DEFINITION),
    "com.datastax.oss.driver.api.core.AllNodesFailedException": (None, CONNECTION_LOST),
    "com.datastax.oss.driver.api.core.NoNodeAvailableException": (None, CONNECTION_LOST),
    "com.datastax.oss.driver.api.core.DriverTimeoutException": (None, CONNECTION_LOST),
    "com.datastax.oss.driver.api.core.servererrors.QueryExecutionException": (
        None,
        CONNECTION_LOST,
    ),
}
_PY4J_PROXY_ERROR = "py4j.Py4JException"  # a Python callback's (foreachBatch's) exception

# The stores checkpoints and files sinks are on: what a failure of one is, in words, after
# the store's name (`name_stores`: "the checkpoint store HDFS at nn:8020"; else "HDFS", "S3").
HDFS, S3 = "hdfs", "s3"
_STORE_WORDS = {HDFS: "HDFS", S3: "S3"}  # how a failure's words name a store of each kind
_STORE_OF_SCHEME = {"hdfs": HDFS, "s3a": S3, "s3": S3, "s3n": S3}
# Where a store of each kind is, from its URI and the S3 endpoint: HDFS's NameNode is in the
# URI; S3's endpoint is the connection's (none: AWS's own).
_PLACE = {
    HDFS: lambda uri, endpoint: _address(uri),
    S3: lambda uri, endpoint: _address(endpoint) or "AWS",
}
UNREACHABLE = "could not be reached"
_STORE_CLASSES: dict[str, tuple[str, str]] = {
    "org.apache.hadoop.hdfs.server.namenode.SafeModeException": (HDFS, "is in safe mode"),
    "org.apache.hadoop.ipc.StandbyException": (HDFS, "answered from a standby NameNode"),
    "org.apache.hadoop.ipc.RetriableException": (HDFS, "asked to be retried later"),
    "org.apache.hadoop.hdfs.server.namenode.NotReplicatedYetException": (
        HDFS,
        "has not replicated a block yet",
    ),
    "org.apache.hadoop.hdfs.BlockMissingException": (
        HDFS,
        "has no live DataNode holding a block it needs",
    ),
    "org.apache.hadoop.fs.s3a.AWSApiCallTimeoutException": (S3, "did not answer in time"),
    "org.apache.hadoop.fs.s3a.AWSNoResponseException": (S3, "did not answer"),
    "software.amazon.awssdk.core.exception.ApiCallTimeoutException": (S3, "did not answer in time"),
    "software.amazon.awssdk.core.exception.ApiCallAttemptTimeoutException": (
        S3,
        "did not answer in time",
    ),
}
# What the NameNode raised travels as a RemoteException naming its class (getClassName()).
_REMOTE = "org.apache.hadoop.ipc.RemoteException"
# An answer of S3 with an HTTP status: S3A's wrapper and the AWS SDK's own exception.
_S3_ANSWERS = (
    "org.apache.hadoop.fs.s3a.AWSServiceIOException",
    "software.amazon.awssdk.awscore.exception.AwsServiceException",
)
# A write to a DataNode that failed (none left to write to): thrown by the writing thread.
_DATA_STREAMER = "org.apache.hadoop.hdfs.DataStreamer"
# A network failure (refused, no route, reset, closed mid-answer, timed out, no such host):
# the store it was on is told by the classes of its stack frames (_ORIGINS).
_NETWORK = (
    "java.net.SocketException",
    "java.net.SocketTimeoutException",
    "java.net.UnknownHostException",
    "java.io.EOFException",
)
_ORIGINS = (
    (HDFS, ("org.apache.hadoop.hdfs.",)),
    (S3, ("org.apache.hadoop.fs.s3a.", "software.amazon.")),
)
# Frames looked at (each is a call into the JVM): a NameNode call's client frames are within
# the first 30 (below the reflection and NetUtils frames that wrap the exception).
MAX_FRAMES = 64
# Our own store client's exception (jobs.storage, without a JVM), by class.
_STORAGE_ERROR = "jobs.storage.StorageError"
STORE_FAILED = "a checkpoint or files store could not be used"


_Judged = tuple  # (the permanent kind in words or None for transient, the category)


def _of_condition(condition: str) -> _Judged | None:
    for names, what, category in _CONDITIONS:
        for name in names:
            if (
                condition.startswith(name)
                if name.endswith("_")
                else condition == name or condition.startswith(name + ".")
            ):
                return what, category
    return None


def _of_sqlstate(state: str) -> _Judged | None:
    return _SQLSTATES.get(state) or _SQLSTATE_CLASSES.get(state[:2])


def _of_kafka_python(cls: type) -> _Judged | None:
    errors = sys.modules.get("kafka.errors")
    if errors is None:
        return None

    def named(*names: str) -> tuple:
        return tuple(
            getattr(errors, n) for n in names if isinstance(getattr(errors, n, None), type)
        )

    if issubclass(cls, named("UnknownTopicOrPartitionError", "InvalidTopicError")):
        return NO_TOPIC, MISSING_TOPIC
    if issubclass(
        cls,
        named(
            "TopicAuthorizationFailedError",
            "GroupAuthorizationFailedError",
            "ClusterAuthorizationFailedError",
            "TransactionalIdAuthorizationFailedError",
        ),
    ):
        return PRIVILEGES, AUTHORIZATION
    if issubclass(cls, named("AuthenticationFailedError", "SaslAuthenticationFailedError")):
        return CREDENTIALS, AUTHENTICATION
    if issubclass(
        cls,
        named(
            "NoBrokersAvailable",
            "KafkaConnectionError",
            "KafkaTimeoutError",
            "RequestTimedOutError",
        ),
    ):
        return None, CONNECTION_LOST
    return None


def _of_class(cls: type) -> _Judged | None:
    """What an exception's Python class says (ours, psycopg's, kafka-python's, the
    built-in ones), without an instance: also for a type read back from a worker's text."""
    if issubclass(cls, PermanentError):
        return cls.what, cls.category
    top = cls.__module__.split(".", 1)[0]
    if top == "psycopg":
        state = getattr(cls, "sqlstate", None)
        if isinstance(state, str) and state:
            return _of_sqlstate(state)
        if cls.__name__ in ("OperationalError", "InterfaceError"):
            return None, CONNECTION_LOST
        return None
    if top == "kafka":
        return _of_kafka_python(cls)
    if top == "cassandra":
        return _of_cassandra_python(cls)
    if issubclass(cls, MemoryError):
        return None, OUT_OF_MEMORY
    if issubclass(cls, (ConnectionError, TimeoutError)):
        return None, CONNECTION_LOST
    return None


def _of_cassandra_python(cls: type) -> _Judged | None:
    """cassandra-driver's exceptions (the cassandra sink's driver side: its table's checks)."""
    names = {c.__name__ for c in cls.__mro__}
    if "AuthenticationFailed" in names:
        return CREDENTIALS, AUTHENTICATION
    if "Unauthorized" in names:
        return PRIVILEGES, AUTHORIZATION
    if names & {"InvalidRequest", "SyntaxException", "ConfigurationException"}:
        return CASSANDRA_DEFINITION, DEFINITION
    if names & {"NoHostAvailable", "OperationTimedOut", "Unavailable", "WriteTimeout"}:
        return None, CONNECTION_LOST
    return None


# -- an exception raised in a Python worker, read back from its text ------------------------

# Where its traceback starts, and its last line: "module.Class: message".
_TRACEBACK = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^(?P<name>[A-Za-z_][\w.]*): ?(?P<detail>.*)$")
# What Spark appends to a message.
_SPARK_SUFFIX = re.compile(r"(\s*SQLSTATE: \w+)+\s*$")
# The packages whose exceptions are looked up by name (among the modules already loaded).
_KNOWN_PACKAGES = ("psycopg", "kafka", "jobs", "builtins")


def _worker_exception(text: str) -> tuple[type, str, str] | None:
    """(class, its name, message) of the exception a Python worker's traceback in `text`
    ends with, where its class is one the driver has loaded from a package it knows (never
    imported here: a message is not trusted to name modules); None otherwise."""
    at = text.rfind(_TRACEBACK)
    if at < 0:
        return None
    lines = text[at + len(_TRACEBACK) :].splitlines()
    for i, line in enumerate(lines):
        if line.startswith((" ", "\t")) or not line.strip():
            continue
        match = _EXCEPTION_LINE.match(line)
        if match is None:
            continue
        cls = _loaded_class(match.group("name"))
        if cls is None:
            continue
        detail = match.group("detail").strip()
        # What follows the exception's line: psycopg's CONTEXT (which row and column),
        # until Spark's own text starts.
        context = []
        for extra in lines[i + 1 :]:
            extra = _SPARK_SUFFIX.sub("", extra).strip()
            if not extra or extra.startswith(("===", "JVM stacktrace")):
                break
            context.append(extra)
        message = _SPARK_SUFFIX.sub("", detail)
        found = _context_of(context)
        return cls, match.group("name"), f"{message} ({found})" if found else message
    return None


def _context_of(lines: list[str]) -> str:
    """psycopg's CONTEXT line ("COPY t, line 1, column n: ..."), which names the column."""
    for line in lines:
        if line.startswith("CONTEXT:"):
            return line[len("CONTEXT:") :].strip()
    return ""


def _loaded_class(name: str) -> type | None:
    module, _, qualname = name.rpartition(".")
    module = module or "builtins"
    if module.split(".", 1)[0] not in _KNOWN_PACKAGES:
        return None
    found = sys.modules.get(module)
    for part in qualname.split("."):
        found = getattr(found, part, None) if found is not None else None
    if isinstance(found, type) and issubclass(found, BaseException):
        return found
    return None


# -- walking the causes ----------------------------------------------------------------------


@dataclass
class _Link:
    """One exception of the chain, Python or Java, with what can decide about it."""

    type: str
    message: str
    condition: str = ""
    sqlstate: str = ""
    what: str | None = None  # the permanent kind its type says, if any
    category: str | None = None  # what it is (CATEGORIES), if its type says
    lost: bool = False  # a Python exception whose type did not survive the JVM
    fault: str | None = None  # a store down, not ready or throttling, in words (transient)

    def judged(self, found: _Judged | None, *, over: bool = False) -> None:
        """Take what a type, condition or SQLSTATE says: if nothing decided yet (or `over`
        it, when `found` is the more telling)."""
        if found is None:
            return
        what, category = found
        if over and (what is not None or self.what is None):
            self.what, self.category = what or self.what, category
        elif self.what is None and (what is not None or self.category is None):
            self.what, self.category = what, category


def _python_link(exc: BaseException) -> _Link:
    kind = type(exc)
    link = _Link(type=f"{kind.__module__}.{kind.__qualname__}", message=str(exc))
    if isinstance(exc, PermanentError):
        link.what, link.category = exc.what, exc.category
        return link
    condition = _call(exc, "getCondition") if hasattr(exc, "getCondition") else None
    if condition:
        link.condition = str(condition)
        link.judged(_of_condition(link.condition))
        if link.condition == PYTHON_WORKER:
            _read_back(link)
    state = getattr(exc, "sqlstate", None)  # psycopg
    if isinstance(state, str) and state and _module(exc) == "psycopg":
        link.sqlstate = state
        link.judged(_of_sqlstate(state))
        context = getattr(getattr(exc, "diag", None), "context", None)
        if context:
            first = next((x for x in link.message.splitlines() if x.strip()), "")
            link.message = f"{first.strip()} ({str(context).strip().splitlines()[0]})"
    if link.what is None and _module(exc) == "pyspark":
        from pyspark.errors import AnalysisException

        if isinstance(exc, AnalysisException):
            link.judged((ANALYSIS, DEFINITION))
    if not link.lost:
        link.judged(_of_class(kind))
    if link.what is None and _STORAGE_ERROR in _python_classes(exc):
        # jobs.storage's words name the store and what failed ("HDFS at nn:9870: OPEN
        # /cp/metadata: could not connect"): its strerror, without "[Errno 5]".
        link.fault = STORE_FAILED
        link.category = STORE_UNAVAILABLE
        link.message = str(getattr(exc, "strerror", None) or exc)
    return link


def _read_back(link: _Link) -> None:
    """A Python worker's exception (PYTHON_EXCEPTION): its type read back from the
    traceback in its text where the driver knows it, else marked lost."""
    found = _worker_exception(link.message)
    if found is None:
        link.lost = True
        return
    cls, name, message = found
    link.type, link.message, link.condition = name, message, ""
    state = getattr(cls, "sqlstate", None)
    link.sqlstate = state if isinstance(state, str) else ""
    link.what = link.category = None
    link.judged(_of_class(cls))


def _python_classes(exc: BaseException) -> list[str]:
    return [f"{c.__module__}.{c.__qualname__}" for c in type(exc).__mro__]


def _java_link(java: Any, stores: Mapping[str, str]) -> _Link:
    classes = []
    cls = java.getClass()
    while cls is not None and len(classes) < 16:
        classes.append(str(cls.getName()))
        cls = cls.getSuperclass()
    link = _Link(type=classes[0] if classes else "java", message=str(java.getMessage() or ""))
    # What the NameNode raised, by its class's name (the client's RemoteException carries it).
    remote = str(_call(java, "getClassName") or "") if _REMOTE in classes else ""
    link.type = remote or link.type
    for name in (remote, *classes) if remote else classes:
        if name in _JAVA_CLASSES:
            link.judged(_JAVA_CLASSES[name])
            break
    if link.what is None:
        found = _store_fault(java, classes, remote, stores)
        if found is not None:
            link.fault, link.type = found
            link.category = STORE_UNAVAILABLE
    condition = _call(java, "getCondition")
    if condition:
        link.condition = str(condition)
        link.judged(_of_condition(link.condition), over=True)
        if link.condition == PYTHON_WORKER:
            _read_back(link)
        state = _call(java, "getSqlState")
        # Spark's analysis errors are SQLSTATE class 42 ("syntax error or access rule
        # violation"), whatever their condition.
        if link.what is None and not link.lost and state and str(state).startswith("42"):
            link.judged((ANALYSIS, DEFINITION))
    if "java.sql.SQLException" in classes:
        state = _call(java, "getSQLState")
        if state:
            link.sqlstate = str(state)
            link.judged(_of_sqlstate(link.sqlstate))
    return link


def _store_fault(
    java: Any, classes: list[str], remote: str, stores: Mapping[str, str]
) -> tuple[str, str] | None:
    """(in words, the deciding class) if `java` is a failure of the store a checkpoint or a
    files sink is on (down, not ready, throttling), else None."""
    if remote:
        if remote in _STORE_CLASSES:
            kind, what = _STORE_CLASSES[remote]
            return f"{_store(stores, kind)} {what}", remote
        # Any other refusal of the NameNode ("could only be written to 0 of the 1
        # minReplication nodes" is a java.io.IOException there): its class and message say it.
        return f"{_store(stores, HDFS)} refused the request", remote
    for name in classes:
        if name in _STORE_CLASSES:
            kind, what = _STORE_CLASSES[name]
            return f"{_store(stores, kind)} {what}", classes[0]
    if any(name in _S3_ANSWERS for name in classes):
        status = _call(java, "statusCode")
        if not isinstance(status, int) or not (status >= 500 or status == 429):
            return None  # a refusal (403, 404...): not the store being down
        details = _call(java, "awsErrorDetails")
        code = _call(details, "errorCode") if details is not None else None
        return f"{_store(stores, S3)} answered {status}{f' {code}' if code else ''}", classes[0]
    if any(name in _NETWORK for name in classes):
        origin = _origin(java)
        return (f"{_store(stores, origin)} {UNREACHABLE}", classes[0]) if origin else None
    if classes[0] == "java.io.IOException" and any(
        name.startswith(_DATA_STREAMER) for name in _frames(java, 1)
    ):
        return f"{_store(stores, HDFS)} lost the DataNodes a file was written to", classes[0]
    return None


def _store(stores: Mapping[str, str], kind: str) -> str:
    return stores.get(kind) or _STORE_WORDS[kind]


def _origin(java: Any) -> str | None:
    """The store whose client threw `java`: HDFS's or S3's, by its stack frames' classes."""
    for name in _frames(java, MAX_FRAMES):
        for kind, packages in _ORIGINS:
            if name.startswith(packages):
                return kind
    return None


def _frames(java: Any, limit: int) -> list[str]:
    """The classes of the first `limit` frames of `java`'s stack."""
    frames = _call(java, "getStackTrace")
    if frames is None:
        return []
    try:
        return [str(frames[i].getClassName()) for i in range(min(len(frames), limit))]
    except Exception:  # the JVM cannot answer: no frames to go by
        return []


def _links(
    exc: BaseException, batch_error: BaseException | None, stores: Mapping[str, str]
) -> Iterator[_Link]:
    """Every exception in `exc`'s causes, outermost first, each once; a foreachBatch
    function's own exception (`batch_error`) where Spark's wrapper of it is."""
    seen: set[Any] = set()
    kept: list[Any] = []  # what was seen stays alive: an id() is unique only meanwhile
    pending: list[Any] = [exc]
    batch = batch_error
    while pending:
        current = pending.pop(0)
        key = _key(current)
        if current is None or key in seen:
            continue
        seen.add(key)
        kept.append(current)
        if isinstance(current, BaseException):
            yield _python_link(current)
            java = _java_of(current)
            pending[:0] = [java] if java is not None else []
            # `raise X from None` (PySpark's conversion of a py4j error) hides the context:
            # it is the same failure, told again.
            context = None if current.__suppress_context__ else current.__context__
            pending += [current.__cause__, context]
            continue
        link = _java_link(current, stores)
        if batch is not None and (
            link.type == _PY4J_PROXY_ERROR or link.condition.startswith(FOREACH_BATCH)
        ):
            # Spark's wrapper of our foreachBatch function's exception: that exception
            # itself, with its type, is what failed.
            pending[:0] = [batch]
            batch = None
            continue
        if link.type == _PY4J_PROXY_ERROR:
            link.lost = True  # a Python callback's exception, as text only
        yield link
        pending[:0] = [_call(current, "getCause")]


def _java_of(exc: BaseException) -> Any:
    """The Java exception behind a py4j or PySpark exception, if any."""
    java = getattr(exc, "java_exception", None)  # py4j.protocol.Py4JJavaError
    if java is None:
        java = getattr(exc, "_origin", None)  # pyspark's CapturedException
    return java if java is not None and hasattr(java, "getClass") else None


def _key(obj: Any) -> Any:
    """Identity: a Java object's own (py4j makes a new Python object for each reference)."""
    if obj is None or isinstance(obj, BaseException):
        return id(obj)
    return ("java", getattr(obj, "_target_id", id(obj)))


def _call(obj: Any, method: str) -> Any:
    """obj.method(), or None when it has no such method (or the JVM cannot answer)."""
    try:
        return getattr(obj, method)()
    except Exception:  # py4j's Py4JError for a method the Java class lacks
        return None


def _module(exc: BaseException) -> str:
    return type(exc).__module__.split(".", 1)[0]


# -- the verdict -----------------------------------------------------------------------------


def classify(
    exc: BaseException,
    *,
    batch_error: BaseException | None = None,
    stores: Mapping[str, str] | None = None,
) -> Verdict | None:
    """The verdict on the exception a run failed with: permanent if any exception among its
    causes is of a kind restarting cannot fix (the outermost such one says why), else
    transient: said as a store's failure where one is among the causes (the outermost), else
    by the innermost cause. None when its type did not survive the way to the driver (an
    exception raised in a Python worker) and no store failed: nothing typed can be said.
    `batch_error`: the exception the query's foreachBatch function raised
    (`raised_in_batch()`), if any; `stores`: how the pipeline's stores are named
    (`stores_of()`)."""
    links = list(_links(exc, batch_error, stores or {}))
    for link in links:
        if link.what is not None:
            return Verdict(
                PERMANENT,
                _clip(f"{link.what}: {_detail(link.message)}", MAX_REASON),
                _clip(link.type, MAX_TYPE),
                _clip(link.condition or link.sqlstate, MAX_CONDITION),
                link.category or DEFINITION,
            )
    condition = next((x.condition or x.sqlstate for x in links if x.condition or x.sqlstate), "")
    fault = next((link for link in links if link.fault), None)
    if fault is not None:
        short = fault.type.rsplit(".", 1)[-1]
        return Verdict(
            TRANSIENT,
            _clip(f"{fault.fault}: {short}: {_detail(fault.message)}", MAX_REASON),
            _clip(fault.type, MAX_TYPE),
            _clip(condition, MAX_CONDITION),
            STORE_UNAVAILABLE,
        )
    if any(link.lost for link in links):
        return None
    root = links[-1]  # the innermost cause: what went wrong first
    short = root.type.rsplit(".", 1)[-1]
    # What it is: the outermost cause whose type says (a lost connection, out of memory).
    category = next((link.category for link in links if link.category), OTHER)
    return Verdict(
        TRANSIENT,
        _clip(f"{short}: {_detail(root.message)}", MAX_REASON),
        _clip(root.type, MAX_TYPE),
        _clip(condition, MAX_CONDITION),
        category,
    )


def _detail(message: str) -> str:
    first = next((line.strip() for line in message.splitlines() if line.strip()), "")
    return _clip(first, DETAIL_CHARS) or "(no message)"


def _clip(text: str, limit: int) -> str:
    return clip(text, limit)


def clip(text: str, limit: int) -> str:
    """`text` in at most `limit` characters: cut at a word's end (never inside a word, unless
    a single word is longer than half the limit), with an ellipsis."""
    if len(text) <= limit:
        return text
    cut = text[: limit - 1]
    space = cut.rstrip().rfind(" ")
    if space >= limit // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "…"


# -- a foreachBatch function's exception -----------------------------------------------------

_RAISED_IN_BATCH: dict[str, BaseException] = {}


def recording(query: str, function: Callable[[Any, int], None]) -> Callable[[Any, int], None]:
    """`function` (a foreachBatch function) keeping the exception it raises, by query name,
    for `classify` (Spark passes on only its text). A new query of that name starts afresh."""
    _RAISED_IN_BATCH.pop(query, None)

    def call(frame, batch_id: int) -> None:
        try:
            function(frame, batch_id)
        except BaseException as exc:
            _RAISED_IN_BATCH[query] = exc
            raise

    return call


def raised_in_batch(query: str | None) -> BaseException | None:
    """What the query's foreachBatch function last raised (`recording`), if anything."""
    return _RAISED_IN_BATCH.get(query) if query else None


# -- how a pipeline's stores are named in words ------------------------------------------------

_STORE_NAMES: dict[str, dict[str, str]] = {}


def store_names(
    checkpoint: str, files_roots: Iterable[str] = (), s3_endpoint: str | None = None
) -> dict[str, str]:
    """How a failure's words name the distributed stores of a pipeline whose checkpoint and
    files sinks are at these URIs, by kind: {"hdfs": "the checkpoint store HDFS at nn:8020",
    "s3": "the files sink's S3 at https://s3.example"}. (Addresses only: no keys, no paths.)"""
    roles: dict[str, list[str]] = {}
    places: dict[str, set[str]] = {}
    for role, uri in [("checkpoint", checkpoint), *(("files", root) for root in files_roots)]:
        scheme = urlsplit(uri).scheme.lower() if "://" in uri else ""
        kind = _STORE_OF_SCHEME.get(scheme)
        if kind is None:
            continue
        if role not in roles.setdefault(kind, []):
            roles[kind].append(role)
        where = _PLACE[kind](uri, s3_endpoint)
        places.setdefault(kind, set()).add(where)
    names = {}
    for kind, found in roles.items():
        store = _STORE_WORDS[kind]
        if len(places[kind]) == 1:  # several HDFS clusters: which one is in the message
            store = f"{store} at {next(iter(places[kind]))}"
        whose = {
            ("checkpoint",): "the checkpoint store",
            ("files",): "the files sink's",
        }.get(tuple(found), "the checkpoint store and files sink")
        names[kind] = f"{whose} {store}"
    return names


def _address(url: str | None) -> str:
    """Where a URL points, without what is not an address (user name, password, path)."""
    if not url:
        return ""
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return f"{parts.scheme}://{host}" if parts.scheme in ("http", "https") else host


def name_stores(pipeline: str, names: Mapping[str, str]) -> None:
    """Remember how pipeline `pipeline`'s stores are named (store_names), for its verdict."""
    _STORE_NAMES[pipeline] = dict(names)


def stores_of(pipeline: str | None) -> dict[str, str]:
    """How the pipeline's stores are named ({} before name_stores)."""
    return _STORE_NAMES.get(pipeline, {}) if pipeline else {}


# -- the verdict file ------------------------------------------------------------------------


def write_verdict(run_dir: str | os.PathLike, verdict: Verdict) -> bool:
    """RUN_DIR/failure.json, atomically, unless one is there already (the first verdict, the
    one nearest the failure, is kept). False if it was not written."""
    path = Path(run_dir) / VERDICT_FILE
    if path.exists():
        return False
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(verdict.as_dict()))
    tmp.replace(path)
    return True


def read_verdict(run_dir: str | os.PathLike) -> dict[str, str] | None:
    """The verdict the driver wrote, checked (kind, and each field a bounded string), or None
    if there is none or it is not one."""
    with contextlib.suppress(OSError, ValueError):
        return checked(json.loads((Path(run_dir) / VERDICT_FILE).read_text()))
    return None


def checked(data: Any) -> dict[str, str]:
    """`data` as a verdict: {kind, reason, type, condition, category}, every field a string
    within its bound (an older driver's has no category: none then); ValueError naming the field
    otherwise. Other keys are left out (a newer driver's)."""
    if not isinstance(data, dict):
        raise ValueError("must be an object: {kind, reason, type, condition}")
    if data.get("kind") not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}")
    out = {"kind": data["kind"]}
    for name, limit, required in (
        ("reason", MAX_REASON, True),
        ("type", MAX_TYPE, False),
        ("condition", MAX_CONDITION, False),
        ("category", MAX_CATEGORY, False),
    ):
        value = data.get(name)
        if name == "category" and value is None:
            continue  # an older driver's verdict: without one
        if value is None and not required:
            value = ""
        if not isinstance(value, str) or (required and not value.strip()):
            raise ValueError(f"{name} must be a{' non-empty' if required else ''} string")
        if len(value) > limit:
            raise ValueError(f"{name} must be at most {limit} characters")
        out[name] = value
    return out
