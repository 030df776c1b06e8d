"""Why a run ended, in words: the one line the exceptions history, the pipeline page's first
screen, the overview, the API and the alerts show ("killed by signal 9 (SIGKILL)", "a
definition error (the sink table has no such column): column "courier_id" named in key does
not exist"), its category, and the fix the runbook suggests for it (`CATALOGUE`, which
docs/oncall.md lists).

What decides, first to last (`cause_of`):
1. an end the control plane decided or was asked for (stopped, killed, stalled, lost
   heartbeat...): its own words;
2. a process killed by a signal: the signal (its output is only noise then);
3. the driver's verdict (jobs.failures: by the exception's type, innermost first, through
   Spark's wrappers): its reason and category;
4. an end the control plane saw without an exit report (its application's process ended,
   its host lost, the driver vanished, a launch that failed);
5. the error output read as text (a driver older than verdicts, a launch failure): the
   table `_ERRORS`, else the last "SomethingError: message" line.

Pure: no Django."""

from __future__ import annotations

import re
import signal
from dataclasses import dataclass

from jobs import failures as verdicts

from .causes import EndCause

# What the error output says, most telling first: (pattern, what it means). A pattern's
# group "detail", where it has one, is quoted.
_ERRORS: list[tuple[re.Pattern, str, str]] = [
    (
        re.compile(
            r"\[(?:UNRESOLVED_COLUMN|UNRESOLVED_ROUTINE|TABLE_OR_VIEW_NOT_FOUND|"
            r"DATATYPE_MISMATCH|PARSE_SYNTAX_ERROR|UNRESOLVED_FIELD)[^\]]*\]\s*(?P<detail>[^\n]+)"
        ),
        "Spark analysis error",
        verdicts.DEFINITION,
    ),
    (
        re.compile(r"AnalysisException: (?P<detail>[^\n]+)"),
        "Spark analysis error",
        verdicts.DEFINITION,
    ),
    (
        re.compile(r"OutOfMemoryError(?::\s*(?P<detail>[^\n]+))?"),
        "out of memory",
        verdicts.OUT_OF_MEMORY,
    ),
    (
        re.compile(r"(Some data may have been lost|OffsetOutOfRange|offsets? out of range)", re.I),
        "Kafka data loss: records were deleted by retention before the pipeline read them",
        verdicts.DATA_LOSS_CATEGORY,
    ),
    (
        re.compile(r"SinkRefused: (?P<detail>[^\n]+)"),
        "the sink connection may not be used",
        verdicts.AUTHORIZATION,
    ),
    (
        re.compile(r"password authentication failed[^\n]*"),
        "the sink database refused the credentials",
        verdicts.AUTHENTICATION,
    ),
    (
        re.compile(r"(Connection refused|connection to server .* failed)[^\n]*", re.I),
        "a database or broker refused the connection",
        verdicts.CONNECTION_LOST,
    ),
    (
        re.compile(
            r"(Timed out waiting for a node assignment|Broker may not be available|"
            r"NoBrokersAvailable)",
        ),
        "Kafka unreachable",
        verdicts.CONNECTION_LOST,
    ),
]
# The last "SomethingError: message" line of a Python or Java traceback.
_LAST_EXCEPTION = re.compile(
    r"^\s*(?:Caused by: )?(?P<name>[\w.$]*(?:Error|Exception)): (?P<detail>.+)$", re.M
)

# The words of the ends the control plane records itself (not the driver's exits).
_CAUSES = {c: c.label for c in EndCause if c not in (EndCause.EXITED, EndCause.CRASHED)}

# Ends the control plane decided or was asked for, and the word its message starts with.
_DECIDED = {
    EndCause.KILLED: "killed",
    EndCause.HOST_LOST: "host lost",
    EndCause.NO_HEARTBEAT: "lost heartbeat",
    EndCause.STALLED: "stalled",
}
DETAIL_CHARS = 200


def summarize(cause: str, exit_code: int | None, error: str) -> str:
    """One line: why the run ended."""
    error = error or ""
    if cause in (EndCause.STOPPED, EndCause.RECYCLED):
        return _CAUSES[cause]
    if cause in _DECIDED:
        # Asked for, or decided by the control plane: its own words (kept in the error).
        first = _first_line(error)
        if not first:
            return _CAUSES[cause]
        label = _DECIDED[cause]
        return first if first.lower().startswith(label.split()[0]) else f"{label}: {first}"
    by_signal = _signal(exit_code)
    if by_signal:
        # A process killed by a signal (the kernel's OOM killer, an operator's kill -9)
        # leaves only noise in its output: the signal is the fact.
        return (f"{_CAUSES[cause]}, " if cause in _CAUSES else "") + by_signal
    said = _from_error(error)
    if said:
        return said
    if cause in _CAUSES:
        return _CAUSES[cause]
    if exit_code not in (None, 0):
        return f"exited with code {exit_code}"
    if exit_code == 0:
        return "exited (code 0) without being asked to"
    return cause or "ended"


def _from_error(error: str) -> str:
    return _read(error)[0]


def _read(error: str) -> tuple[str, str]:
    """(the line, its category) the error output says, or ("", OTHER)."""
    for pattern, meaning, category in _ERRORS:
        match = pattern.search(error)
        if match:
            detail = (match.groupdict().get("detail") or "").strip()
            return meaning + (f": {_clip(detail)}" if detail else ""), category
    found = list(_LAST_EXCEPTION.finditer(error))
    if found:
        last = found[-1]
        name = last.group("name").rsplit(".", 1)[-1]
        return f"{name}: {_clip(last.group('detail').strip())}", verdicts.OTHER
    return "", verdicts.OTHER


def _signal(exit_code: int | None) -> str:
    if exit_code is None or exit_code == 0:
        return ""
    number = -exit_code if exit_code < 0 else exit_code - 128 if 128 < exit_code <= 192 else 0
    if not number:
        return ""
    try:
        name = signal.Signals(number).name
    except ValueError:
        return f"killed by signal {number}"
    return f"killed by signal {number} ({name})"


def _first_line(text: str) -> str:
    for line in text.splitlines():
        if line.strip():
            return _clip(line.strip())
    return ""


def _clip(text: str) -> str:
    return verdicts.clip(text, DETAIL_CHARS)


# -- the catalogue of causes -----------------------------------------------------------------

# Categories of ends without a verdict (the control plane's own observations).
KILLED = EndCause.KILLED.value  # by a signal: the kernel's OOM killer, an operator, a shutdown
APPLICATION_LOST = EndCause.APPLICATION_LOST.value
HOST_LOST = EndCause.HOST_LOST.value
NO_HEARTBEAT = EndCause.NO_HEARTBEAT.value
STALLED = EndCause.STALLED.value
LAUNCH_FAILED = EndCause.LAUNCH_FAILED.value
VANISHED = EndCause.VANISHED.value


@dataclass(frozen=True)
class Entry:
    title: str  # the kind of failure, in a few words
    fix: str  # what the runbook suggests (docs/oncall.md)


CATALOGUE: dict[str, Entry] = {
    verdicts.DEFINITION: Entry(
        "a definition error",
        "Edit the pipeline (the line above names the part of the spec), then start it."
        " Restarting cannot fix it, so the control plane does not.",
    ),
    verdicts.UNKNOWN_COLUMN: Entry(
        "a column that does not exist",
        "Make the output and the sink table agree: add the column to the table"
        " (ALTER TABLE ... ADD COLUMN), or change the transform or the key; then start it.",
    ),
    verdicts.TYPE_MISMATCH: Entry(
        "a value its column cannot take",
        "Change the sink table's column type, or CAST the value in the transform so that"
        " it fits; then start it.",
    ),
    verdicts.MISSING_TABLE: Entry(
        "a table or database that does not exist",
        "Create it, or correct the name in the spec (a Postgres sink creates a table it is"
        " allowed to create); then start it.",
    ),
    verdicts.MISSING_TOPIC: Entry(
        "a Kafka topic that does not exist",
        "Create the topic (the control plane never creates topics) or correct its name in"
        " the spec; then start it.",
    ),
    verdicts.AUTHENTICATION: Entry(
        "credentials refused",
        "Update the connection's user name and password (Connections), then start it.",
    ),
    verdicts.AUTHORIZATION: Entry(
        "not allowed",
        "Grant the connection's user what the pipeline needs (READ on its topics, INSERT"
        " and CREATE on its table, the HDFS path's permissions), then start it.",
    ),
    verdicts.CONSTRAINT: Entry(
        "a row the sink table refuses",
        "The batch is replayed as it was, so it fails again until the row is let in: relax"
        " the constraint or fix the data upstream. Restarts follow the restart policy.",
    ),
    verdicts.DATA_LOSS_CATEGORY: Entry(
        "records deleted before they were read",
        "Kafka's retention deleted records the pipeline had not read. Accept the loss (reset"
        " its offsets to the earliest still there) or raise the topic's retention; then start.",
    ),
    verdicts.STATE_INCOMPATIBLE: Entry(
        "a state its checkpoint cannot restore",
        "Roll the spec back to the version the checkpoint was written by, or reset its"
        " offsets (a new checkpoint, without the old state).",
    ),
    verdicts.STORE_UNAVAILABLE: Entry(
        "its checkpoint or files store is unavailable",
        "Check the store named above (HDFS NameNode and DataNodes, the S3 endpoint). The"
        " pipeline restarts by its policy and goes on from its checkpoint once it answers.",
    ),
    verdicts.CONNECTION_LOST: Entry(
        "a database or broker unreachable",
        "Check that the host named above is up and reachable from the Spark hosts. Restarts"
        " follow the restart policy; nothing committed is lost.",
    ),
    verdicts.OUT_OF_MEMORY: Entry(
        "out of memory",
        "Give the driver or executors more memory (its application's settings) or lower"
        " source.max_records_per_batch.",
    ),
    KILLED: Entry(
        "killed by a signal",
        "Something outside the control plane killed the driver: the kernel's OOM killer"
        " (see dmesg on its host: then give it more memory), an operator or a shutdown."
        " It restarts by its policy from its checkpoint.",
    ),
    APPLICATION_LOST: Entry(
        "its shared Spark application ended",
        "See its application's page for why. Its members restart once it is back.",
    ),
    HOST_LOST: Entry(
        "its control-plane host was lost",
        "See Hosts. Its pipelines are placed on another host.",
    ),
    NO_HEARTBEAT: Entry(
        "no heartbeat",
        "The driver stopped answering (a long GC pause, a hung JVM, a network partition):"
        " it was killed and restarts by its policy. See the driver's log.",
    ),
    STALLED: Entry(
        "no batch completed in time",
        "A batch hung (a locked sink table, a store not answering): it was killed and"
        " restarts by its policy. See the driver's log for the batch in flight.",
    ),
    LAUNCH_FAILED: Entry(
        "it could not be launched",
        "See the message: spark-submit could not start (Java, memory, a host's capacity).",
    ),
    VANISHED: Entry(
        "the driver disappeared",
        "Its process ended without an exit report (killed with its supervisor, a host"
        " reboot). It restarts by its policy.",
    ),
    verdicts.OTHER: Entry(
        "a failure",
        "Read the full message and the driver's log. Restarts follow the restart policy.",
    ),
}
_BY_CAUSE = {
    EndCause.APPLICATION_LOST: APPLICATION_LOST,
    EndCause.HOST_LOST: HOST_LOST,
    EndCause.NO_HEARTBEAT: NO_HEARTBEAT,
    EndCause.STALLED: STALLED,
    EndCause.LAUNCH_FAILED: LAUNCH_FAILED,
    EndCause.LAUNCH_LOST: LAUNCH_FAILED,
    EndCause.VANISHED: VANISHED,
}


@dataclass(frozen=True)
class Cause:
    category: str  # a key of CATALOGUE
    line: str  # one line naming what to fix

    @property
    def title(self) -> str:
        return entry(self.category).title

    @property
    def fix(self) -> str:
        return entry(self.category).fix


def entry(category: str) -> Entry:
    """The catalogue's entry of `category` (OTHER's for one it does not know: a report's
    category is the driver's word, not trusted to be one)."""
    return CATALOGUE.get(category) or CATALOGUE[verdicts.OTHER]


def cause_of(cause: str, exit_code: int | None, error: str, verdict: dict | None = None) -> Cause:
    """Why a run ended, in one line, and its category (see the module's docstring for what
    decides). `verdict`: the driver's, as its exit report carried it (checked), if any."""
    error = error or ""
    if cause in _DECIDED or cause in (EndCause.STOPPED, EndCause.RECYCLED):
        return Cause(_BY_CAUSE.get(cause, verdicts.OTHER), summarize(cause, exit_code, error))
    if cause in _BY_CAUSE and not (verdict and verdict.get("reason")):
        # Seen by the control plane (its application's process ended, the driver vanished, a
        # launch failed): that is the cause, whatever signal ended which process.
        return Cause(_BY_CAUSE[cause], summarize(cause, exit_code, error))
    by_signal = _signal(exit_code)
    if by_signal:
        return Cause(KILLED, summarize(cause, exit_code, error))
    if verdict and verdict.get("reason"):
        category = verdict.get("category") or (
            verdicts.DEFINITION if verdict.get("kind") == verdicts.PERMANENT else verdicts.OTHER
        )
        category = category if category in CATALOGUE else verdicts.OTHER
        return Cause(category, verdicts.clip(_one_line(verdict["reason"]), verdicts.MAX_REASON))
    said, category = _read(error)
    if said:
        return Cause(category, said)
    return Cause(verdicts.OTHER, summarize(cause, exit_code, error))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def recorded(
    cause: str, exit_code: int | None, message: str, reason: str = "", category: str = ""
) -> Cause:
    """A recorded failure's cause: as recorded (its `reason` and `category`), or, for one
    recorded before failures kept their reason, read again from its message."""
    if reason:
        return Cause(category if category in CATALOGUE else verdicts.OTHER, reason)
    return cause_of(cause, exit_code, message)
