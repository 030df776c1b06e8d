"""Why a run ended, in words, from its cause, exit code and error output: what the exceptions
history shows first, above the log tail ("killed by signal 9 (SIGKILL)", "Spark analysis
error: a column `x` cannot be resolved"). Pure: no Django."""

from __future__ import annotations

import re
import signal

# What the error output says, most telling first: (pattern, what it means). A pattern's
# group "detail", where it has one, is quoted.
_ERRORS: list[tuple[re.Pattern, str]] = [
    (
        re.compile(
            r"\[(?:UNRESOLVED_COLUMN|UNRESOLVED_ROUTINE|TABLE_OR_VIEW_NOT_FOUND|"
            r"DATATYPE_MISMATCH|PARSE_SYNTAX_ERROR|UNRESOLVED_FIELD)[^\]]*\]\s*(?P<detail>[^\n]+)"
        ),
        "Spark analysis error",
    ),
    (re.compile(r"AnalysisException: (?P<detail>[^\n]+)"), "Spark analysis error"),
    (
        re.compile(r"OutOfMemoryError(?::\s*(?P<detail>[^\n]+))?"),
        "out of memory",
    ),
    (
        re.compile(r"(Some data may have been lost|OffsetOutOfRange|offsets? out of range)", re.I),
        "Kafka data loss: records were deleted by retention before the pipeline read them",
    ),
    (re.compile(r"SinkRefused: (?P<detail>[^\n]+)"), "the sink connection may not be used"),
    (
        re.compile(r"password authentication failed[^\n]*"),
        "the sink database refused the credentials",
    ),
    (
        re.compile(r"(Connection refused|connection to server .* failed)[^\n]*", re.I),
        "a database or broker refused the connection",
    ),
    (
        re.compile(
            r"(Timed out waiting for a node assignment|Broker may not be available|"
            r"NoBrokersAvailable)",
        ),
        "Kafka unreachable",
    ),
]
# The last "SomethingError: message" line of a Python or Java traceback.
_LAST_EXCEPTION = re.compile(
    r"^\s*(?:Caused by: )?(?P<name>[\w.$]*(?:Error|Exception)): (?P<detail>.+)$", re.M
)

_CAUSES = {
    "stopped": "stopped as asked",
    "killed": "killed",
    "recycled": "stopped for a recycle of its shared application",
    "application-lost": "its shared application's process ended",
    "host-lost": "its control-plane host was lost",
    "vanished": "the driver's process disappeared without an exit report",
    "launch-lost": "its launch never completed",
    "launch-failed": "it could not be launched",
    "lost-heartbeat": "no heartbeat in time",
    "stalled": "stalled: no batch completed in time",
}

# Ends the control plane decided or was asked for, and the word its message starts with.
_DECIDED = {
    "killed": "killed",
    "host-lost": "host lost",
    "lost-heartbeat": "lost heartbeat",
    "stalled": "stalled",
}
DETAIL_CHARS = 200


def summarize(cause: str, exit_code: int | None, error: str) -> str:
    """One line: why the run ended."""
    error = error or ""
    if cause in ("stopped", "recycled"):
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
    for pattern, meaning in _ERRORS:
        match = pattern.search(error)
        if match:
            detail = (match.groupdict().get("detail") or "").strip()
            return meaning + (f": {_clip(detail)}" if detail else "")
    found = list(_LAST_EXCEPTION.finditer(error))
    if found:
        last = found[-1]
        name = last.group("name").rsplit(".", 1)[-1]
        return f"{name}: {_clip(last.group('detail').strip())}"
    return ""


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
    return text if len(text) <= DETAIL_CHARS else text[: DETAIL_CHARS - 1] + "…"
