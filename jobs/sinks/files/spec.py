"""The files sink's spec: parsed and checked (each problem naming its field), and what the rest
of the product asks of the kind (jobs.sinks.kind.SinkKind). Plain Python."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ...spec import locations
from ...spec.ddl import parse_schema
from ...spec.fields import MAX_DELAY_SECONDS, FieldError, Section, check_connection, names
from ..kind import DeadLetters, FormField
from .model import DEAD_LETTERS_DIR, FilesSink

if TYPE_CHECKING:
    from ...spec.model import KafkaSource, Transform

# A files sink's path under its connection's root: relative, segments that start with a letter
# or digit (never "..", and never hidden: readers skip names starting with "_" or ".").
FILES_PATH_SEGMENT_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
# Partition columns become directory names (col=value): no quoting, never hidden.
PARTITION_COLUMN_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,62}$")
MAX_PARTITION_COLUMNS = 4
MAX_TARGET_FILE_MB = 4096
# A files sink's path in the JSON Schema: 1-16 directories (each as parse allows), trailing
# "/" ignored.
_SEGMENT = FILES_PATH_SEGMENT_RE.pattern.strip("^$")
FILES_PATH = {
    "type": "string",
    "pattern": f"^{_SEGMENT}(/{_SEGMENT}){{0,15}}/*$",
    "maxLength": 512,
    "description": "directories under the connection's root, e.g. sales/orders",
}


def parse(
    errors: list[FieldError],
    data: Mapping[str, Any],
    connections: Mapping[str, str] | None,
    source: KafkaSource | None,
    transform: Transform | None,
    *,
    path: str = "sink",
) -> FilesSink | None:
    s = Section(errors, path, data, names(FilesSink))
    connection = s.string("connection")
    check_connection(s, connection, "files", connections)
    where = s.string("path")
    if where is not None:
        segments = where.strip("/").split("/") if where.strip("/") else []
        if where.startswith("/") or "://" in where:
            s.error("path", "must be relative: the connection gives the root it is under")
        elif not segments or len(segments) > 16 or len(where) > 512:
            s.error("path", "must name 1-16 directories under the connection's root")
        elif "" in segments:
            # Refused, not collapsed: the stored path is the one every comparison and the
            # job's marker digest use (jobs.spec.locations would read a//b as a/b too).
            s.error("path", f"{where!r} has an empty directory ('//')")
        elif (
            bad := next((x for x in segments if not FILES_PATH_SEGMENT_RE.fullmatch(x)), None)
        ) is not None:
            s.error(
                "path",
                f"directory {bad!r} is not allowed: use letters, digits, '.', '_' and '-', "
                "starting with a letter or digit (names starting with '_' or '.' are hidden "
                "from readers)",
            )
        where = "/".join(segments)
    fmt = s.string("format", "parquet", choices=("parquet", "json", "avro"))
    columns = None  # without a transform the output columns are the source schema's
    if source is not None and transform is None:
        columns = [f.name for f in parse_schema(source.schema).fields]
    partition_by = s.get("partition_by", [])
    if isinstance(partition_by, str):
        partition_by = [partition_by]
    if not isinstance(partition_by, list):
        s.error("partition_by", "must be a list of column names")
        partition_by = []
    if len(partition_by) > MAX_PARTITION_COLUMNS:
        s.error("partition_by", f"at most {MAX_PARTITION_COLUMNS} columns")
    for i, column in enumerate(partition_by):
        if not isinstance(column, str) or not PARTITION_COLUMN_RE.fullmatch(column):
            s.error(
                f"partition_by[{i}]",
                f"{column!r} is not a partition column name: letters, digits and underscores, "
                "starting with a letter",
            )
        elif columns is not None and column.lower() not in {c.lower() for c in columns}:
            s.error(f"partition_by[{i}]", f"column {column!r} is not in the source schema")
    if len({str(c).lower() for c in partition_by}) != len(partition_by):
        s.error("partition_by", "lists a column twice")
    elif columns is not None and partition_by and len(partition_by) >= len(columns):
        s.error("partition_by", "leaves no column to write in the files")
    target = s.integer(
        "target_file_mb", FilesSink.target_file_mb, minimum=1, maximum=MAX_TARGET_FILE_MB
    )
    max_age = s.number(
        "max_file_age_seconds",
        FilesSink.max_file_age_seconds,
        minimum=0,
        exclusive_minimum=True,
        maximum=MAX_DELAY_SECONDS,
    )
    inactivity = s.number(
        "inactivity_seconds",
        FilesSink.inactivity_seconds,
        minimum=0,
        exclusive_minimum=True,
        maximum=MAX_DELAY_SECONDS,
    )
    if not s.ok:
        return None
    return FilesSink(
        connection=connection,
        path=where,
        format=fmt,
        partition_by=tuple(partition_by),
        target_file_mb=target,
        max_file_age_seconds=float(max_age),
        inactivity_seconds=float(inactivity),
    )


def check_update(errors: list[FieldError], sink: FilesSink, path: str, shape) -> None:
    errors.append(
        FieldError(
            f"{path}.kind",
            "a files sink takes append output only (a finished file is never changed): "
            "use transform.output_mode append, or a postgres sink in upsert mode",
        )
    )


def target(sink: FilesSink) -> str:
    """Its path: canonical already (parse keeps only plain directory names, joined by one
    `/`), so returned as stored: it feeds the sinks' marker digests, which must not change
    (jobs.batch.marker_scope)."""
    return sink.path


def overlaps(a: str, b: str) -> bool:
    """Whether two paths under one root are the same directory or one inside the other
    (compared as canonical directories, never as text: `a` is not inside `ab`)."""
    return locations.overlapping(
        locations.Location("", "", locations.relative(a)),
        locations.Location("", "", locations.relative(b)),
    )


def dead_letters(sink: Mapping[str, Any]) -> DeadLetters:
    """JSON Lines files beside the output, a directory per query and batch."""
    return DeadLetters(
        "files", str(sink.get("connection") or ""), f"{sink.get('path')}/{DEAD_LETTERS_DIR}"
    )


FORM = (
    FormField(
        "files_path",
        "path",
        "Path",
        help="directories under the connection's root, e.g. sales/orders: the finished files"
        " go there (no other pipeline may write there or in a directory inside it)",
    ),
    FormField(
        "files_format", "format", "File format", "select", choices=("parquet", "json", "avro")
    ),
    FormField(
        "partition_by",
        "partition_by",
        "Partition by (optional)",
        "list",
        "output columns, comma-separated, at most 4: written as directories col=value/",
    ),
    FormField(
        "target_file_mb",
        "target_file_mb",
        "Target file size (MB)",
        "number",
        "1 to 4096 (empty: 128): a file is finished when its rows reach this size, when its"
        " oldest row waited the max age or when no row came for the inactivity time",
    ),
    FormField(
        "max_file_age_seconds",
        "max_file_age_seconds",
        "Max file age (s)",
        "number",
        "empty: 900; at most 7 days: a file is finished once its oldest row waited this long",
    ),
    FormField(
        "inactivity_seconds",
        "inactivity_seconds",
        "Inactivity (s)",
        "number",
        "empty: 300; at most 7 days: a file is finished when no row came for this long",
    ),
)


def schema() -> dict[str, Any]:
    from ...spec.fragments import DURATION, connection

    return {
        "connection": connection("files"),
        "path": FILES_PATH,
        "format": {"enum": ["parquet", "json", "avro"]},
        "partition_by": {
            "type": "array",
            "items": {
                "type": "string",
                "pattern": PARTITION_COLUMN_RE.pattern,
                "format": "column-name",
            },
            "maxItems": MAX_PARTITION_COLUMNS,
            "uniqueItems": True,
            "description": "output columns written as directories col=value/, in this order",
        },
        "target_file_mb": {"type": "integer", "minimum": 1, "maximum": MAX_TARGET_FILE_MB},
        "max_file_age_seconds": DURATION,
        "inactivity_seconds": DURATION,
    }
