"""Stateful pipelines in the spec (#18): source.watermark, source.deduplicate,
transform.output_mode and state_store, and what is refused before launch (jobs.spec.validate:
_parse_event_time, _check_stateful, _check_update_sink; jobs.spec.streaming: the SQL's
shape). Pure logic, no database, no Spark: every error is asserted by its exact field."""

from __future__ import annotations

import pytest

from jobs.spec import SpecError, parse_spec
from jobs.spec.model import Deduplicate, Watermark
from jobs.spec.sql import SQLError
from jobs.spec.streaming import Shape, stream_shape
from tests.factories import valid_spec

CONNECTIONS = {"events": "kafka", "warehouse": "postgres", "lake": "files"}
SCHEMA = "id STRING, courier STRING, amount DOUBLE, ts TIMESTAMP, day DATE"
WATERMARK = {"column": "ts", "delay_seconds": 60}
# The docs' example: deliveries per courier per 5 minutes.
PER_COURIER = (
    "SELECT window.start AS window_start, window.end AS window_end, courier, "
    "count(*) AS deliveries FROM source GROUP BY window(ts, '5 minutes'), courier"
)
GROUP_KEY = ["window_start", "window_end", "courier"]
POSTGRES = {"connection": "warehouse", "table": "deliveries"}
UPSERT = {**POSTGRES, "mode": "upsert", "key": GROUP_KEY}
KAFKA = {"kind": "kafka", "connection": "events", "topic": "deliveries-out"}
FILES = {"kind": "files", "connection": "lake", "path": "deliveries"}


def source(**changes) -> dict:
    return {**valid_spec()["source"], "schema": SCHEMA, "watermark": WATERMARK, **changes}


def spec(
    *,
    sql: str | None = PER_COURIER,
    mode: str | None = None,
    sink: dict | None = None,
    sinks: list[dict] | None = None,
    **changes,
) -> dict:
    """A stateful spec: the per-courier count over a source with a watermark, into Postgres
    (append), unless told otherwise."""
    out = valid_spec(source=source(), sink=sink or POSTGRES)
    out["transform"] = None if sql is None else {"sql": sql, "output_mode": mode}
    if sinks is not None:
        out.pop("sink")
        out["sinks"] = sinks
    out.update(changes)
    return out


def errors_of(data: dict) -> dict[str, list[str]]:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, connections=CONNECTIONS)
    return caught.value.as_dict()


def assert_refused(data: dict, expected: dict[str, str | list[str]]) -> None:
    """Exactly these fields, each with messages containing these texts (in order)."""
    errors = errors_of(data)
    assert set(errors) == set(expected), errors
    for name, texts in expected.items():
        texts = [texts] if isinstance(texts, str) else texts
        assert len(errors[name]) == len(texts), errors[name]
        for message, text in zip(errors[name], texts, strict=True):
            assert text in message, (name, message)


def parsed(data: dict):
    return parse_spec(data, connections=CONNECTIONS)


# -- what is accepted, and what it means -------------------------------------------------------


def test_a_stateful_spec_is_parsed_and_its_canonical_form_parses_again():
    data = spec(
        source=source(deduplicate={"key": ["id"]}),
        mode="update",
        sink=UPSERT,
        state_store="hdfs",
    )
    made = parsed(data)
    assert made.source.watermark == Watermark(column="ts", delay_seconds=60)
    assert made.source.deduplicate == Deduplicate(key=("id",))
    assert (made.transform.output_mode, made.output_mode, made.state_store) == (
        "update",
        "update",
        "hdfs",
    )
    assert made.stateful
    canonical = made.to_dict()
    assert canonical["source"]["watermark"] == {"column": "ts", "delay_seconds": 60}
    assert canonical["source"]["deduplicate"] == {"key": ["id"]}
    assert canonical["transform"]["output_mode"] == "update"
    assert canonical["state_store"] == "hdfs"
    assert parsed(canonical).to_dict() == canonical


def test_a_pipeline_without_watermark_deduplication_or_output_mode_is_stateless():
    made = parsed(valid_spec())
    assert (made.stateful, made.output_mode, made.state_store) == (False, None, None)
    canonical = made.to_dict()
    assert (canonical["source"]["watermark"], canonical["source"]["deduplicate"]) == (None, None)
    assert (canonical["transform"]["output_mode"], canonical["state_store"]) == (None, None)
    # An aggregation without them runs over each batch alone: accepted, as before.
    per_batch = spec(
        source=source(watermark=None), sql="SELECT id, count(*) FROM source GROUP BY id"
    )
    assert not parsed(per_batch).stateful


@pytest.mark.parametrize(
    ("changes", "stateful_by"),
    [
        ({"source": source()}, "a watermark"),
        ({"source": source(deduplicate={"key": ["id"]})}, "deduplication"),
        ({"source": source(watermark=None)}, None),
    ],
)
def test_a_watermark_or_deduplication_alone_makes_a_stateful_append_pipeline(changes, stateful_by):
    made = parsed(spec(sql="SELECT id, ts FROM source", **changes))
    assert made.stateful is (stateful_by is not None)
    assert made.output_mode == ("append" if stateful_by else None)


def test_an_output_mode_alone_makes_a_stateful_pipeline():
    made = parsed(spec(source=source(watermark=None), sql="SELECT id FROM source", mode="append"))
    assert (made.stateful, made.output_mode) == (True, "append")


@pytest.mark.parametrize(
    ("watermark", "expected"),
    [
        ({"column": "TS", "delay_seconds": 1}, Watermark("ts", 1)),  # the schema's spelling
        ({"column": "ts", "delay_seconds": 0}, Watermark("ts", 0)),
        ({"column": "ts", "delay_seconds": 0.5}, Watermark("ts", 0.5)),
        ({"column": "ts", "delay_seconds": 604800}, Watermark("ts", 604800)),
    ],
)
def test_watermarks_that_are_accepted(watermark, expected):
    assert parsed(spec(source=source(watermark=watermark))).source.watermark == expected


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("id", ("id",)),  # one column as a string
        (["ID"], ("id",)),  # the schema's spelling
        (["courier", "id"], ("courier", "id")),
    ],
)
def test_deduplication_keys_that_are_accepted(key, expected):
    made = parsed(spec(sql=None, source=source(deduplicate={"key": key})))
    assert made.source.deduplicate == Deduplicate(key=expected)


def test_avro_columns_can_be_event_time():
    avro = {
        "type": "record",
        "name": "Delivery",
        "fields": [
            {"name": "id", "type": "string"},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    data = spec(
        sql=None,
        source={
            **source(),
            "format": "avro",
            "avro_schema": avro,
            "deduplicate": {"key": ["id"]},
        },
    )
    data["source"].pop("schema")
    made = parsed(data)
    assert (made.source.watermark.column, made.source.deduplicate.key) == ("ts", ("id",))


# -- _parse_event_time: source.watermark and source.deduplicate ---------------------------------


@pytest.mark.parametrize(
    ("watermark", "expected"),
    [
        (
            "ts",
            {
                "source.watermark": "must be an object, got a string",
                "source.watermark.column": "is required",
                "source.watermark.delay_seconds": "is required",
            },
        ),
        (
            ["ts"],
            {
                "source.watermark": "must be an object, got a list",
                "source.watermark.column": "is required",
                "source.watermark.delay_seconds": "is required",
            },
        ),
        (
            {},
            {
                "source.watermark.column": "is required",
                "source.watermark.delay_seconds": "is required",
            },
        ),
        ({"column": "ts"}, {"source.watermark.delay_seconds": "is required"}),
        ({"delay_seconds": 5}, {"source.watermark.column": "is required"}),
        ({**WATERMARK, "late": True}, {"source.watermark.late": "unknown field"}),
        ({"column": 5, "delay_seconds": 1}, {"source.watermark.column": "non-empty string"}),
        ({"column": "  ", "delay_seconds": 1}, {"source.watermark.column": "non-empty string"}),
        (
            {"column": "nope", "delay_seconds": 1},
            {"source.watermark.column": "column 'nope' is not in the source schema"},
        ),
        (
            {"column": "courier", "delay_seconds": 1},
            {"source.watermark.column": "column 'courier' is STRING: event time must be a TIME"},
        ),
        (
            {"column": "amount", "delay_seconds": 1},
            {"source.watermark.column": "column 'amount' is DOUBLE"},
        ),
        ({"column": "day", "delay_seconds": 1}, {"source.watermark.column": "is DATE"}),
        (
            {"column": "ts", "delay_seconds": -1},
            {"source.watermark.delay_seconds": "must be at least 0, got -1"},
        ),
        (
            {"column": "ts", "delay_seconds": 604801},
            {"source.watermark.delay_seconds": "must be at most 604800, got 604801"},
        ),
        (
            {"column": "ts", "delay_seconds": True},
            {"source.watermark.delay_seconds": "must be a number, got True"},
        ),
        (
            {"column": "ts", "delay_seconds": "60"},
            {"source.watermark.delay_seconds": "must be a number, got '60'"},
        ),
        (
            {"column": "ts", "delay_seconds": float("nan")},
            {"source.watermark.delay_seconds": "must be a number, got nan"},
        ),
    ],
)
def test_bad_watermarks_are_refused_at_their_field(watermark, expected):
    assert_refused(spec(source=source(watermark=watermark)), expected)


def test_a_nested_column_is_not_event_time():
    data = spec(
        sql=None,
        source=source(
            schema="id STRING, meta STRUCT<ts: TIMESTAMP>",
            watermark={"column": "meta.ts", "delay_seconds": 1},
        ),
    )
    assert_refused(
        data, {"source.watermark.column": "column 'meta.ts' is not in the source schema"}
    )


def test_a_bad_schema_is_reported_without_column_errors_from_the_watermark():
    data = spec(source=source(schema="id STRNG", watermark={"column": "x", "delay_seconds": 1}))
    assert set(errors_of(data)) == {"source.schema"}


@pytest.mark.parametrize(
    ("deduplicate", "expected"),
    [
        ({"key": []}, {"source.deduplicate.key": "must be a non-empty list of source columns"}),
        ({"key": 5}, {"source.deduplicate.key": "must be a non-empty list of source columns"}),
        (
            {"key": {"id": 1}},
            {"source.deduplicate.key": "must be a non-empty list of source columns"},
        ),
        ({}, {"source.deduplicate.key": "is required"}),
        (
            ["id"],
            {
                "source.deduplicate": "must be an object, got a list",
                "source.deduplicate.key": "is required",
            },
        ),
        (
            {"key": ["id"], "within_seconds": 5},
            {"source.deduplicate.within_seconds": "unknown field"},
        ),
        ({"key": ["id", 5]}, {"source.deduplicate.key[1]": "must be a column name, got 5"}),
        (
            {"key": ["id", "nope"]},
            {"source.deduplicate.key[1]": "column 'nope' is not in the source schema"},
        ),
        ({"key": ["id", "ID"]}, {"source.deduplicate.key": "lists a column twice"}),
        (
            {"key": ["nope", "nope"]},
            {
                "source.deduplicate.key[0]": "column 'nope' is not in the source schema",
                "source.deduplicate.key[1]": "column 'nope' is not in the source schema",
                "source.deduplicate.key": "lists a column twice",
            },
        ),
    ],
)
def test_bad_deduplication_is_refused_at_its_field(deduplicate, expected):
    assert_refused(spec(sql=None, source=source(deduplicate=deduplicate)), expected)


def test_deduplication_needs_a_watermark():
    data = spec(sql=None, source=source(watermark=None, deduplicate={"key": ["id"]}))
    assert_refused(
        data,
        {
            "source.deduplicate": "needs source.watermark: a key is remembered until the "
            "watermark passes its first record"
        },
    )


def test_deduplication_with_a_bad_watermark_names_the_watermark_only():
    data = spec(
        sql=None,
        source=source(
            watermark={"column": "courier", "delay_seconds": 1}, deduplicate={"key": ["id"]}
        ),
    )
    assert_refused(data, {"source.watermark.column": "is STRING"})


# -- transform.output_mode and state_store -------------------------------------------------------


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        (
            "complete",
            "complete is not supported: it keeps every group forever and rewrites all of "
            "them each batch",
        ),
        ("Append", "must be one of append, update; got 'Append'"),
        ("", "must be a non-empty string"),
        (1, "must be a non-empty string"),
        (["append"], "must be a non-empty string"),
    ],
)
def test_bad_output_modes_are_refused_at_their_field(mode, message):
    assert_refused(spec(mode=mode), {"transform.output_mode": message})


def test_an_output_mode_needs_the_transforms_sql():
    data = spec()
    data["transform"] = {"output_mode": "append"}
    assert_refused(data, {"transform.sql": "is required"})


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("memory", "must be one of rocksdb, hdfs; got 'memory'"),
        ("RocksDB", "must be one of rocksdb, hdfs; got 'RocksDB'"),
        (5, "must be a non-empty string"),
    ],
)
def test_bad_state_stores_are_refused(store, message):
    assert_refused(spec(state_store=store), {"state_store": message})


@pytest.mark.parametrize("store", ["rocksdb", "hdfs"])
def test_a_state_store_is_for_stateful_pipelines_only(store):
    stateless = spec(source=source(watermark=None), sql="SELECT id FROM source", state_store=store)
    assert_refused(
        stateless,
        {
            "state_store": "applies to stateful pipelines only (source.watermark, "
            "source.deduplicate or transform.output_mode)"
        },
    )
    assert parsed(spec(state_store=store)).state_store == store


def test_stateful_rules_are_checked_once_the_rest_of_the_spec_is_valid():
    data = spec(source=source(watermark=None), mode="append", state_store="hdfs")
    data["sink"] = {**POSTGRES, "table": "_cp_x"}
    # The aggregation without a watermark is reported once the table is fixed.
    assert set(errors_of(data)) == {"sink.table"}
    data["sink"] = POSTGRES
    assert set(errors_of(data)) == {"source.watermark"}


# -- _check_stateful: aggregations --------------------------------------------------------------


def test_an_aggregation_in_append_mode_without_a_watermark_is_refused():
    assert_refused(
        spec(source=source(watermark=None), mode="append"),
        {
            "source.watermark": "is required for an aggregation: append writes each group "
            "once, when the watermark finishes it: without a watermark Spark refuses the query"
        },
    )


def test_an_aggregation_in_update_mode_without_a_watermark_is_refused():
    assert_refused(
        spec(source=source(watermark=None), mode="update", sink=UPSERT),
        {
            "source.watermark": "is required for an aggregation: without one the "
            "aggregation's state grows without bound"
        },
    )


def test_deduplication_without_a_watermark_is_reported_before_the_aggregation_is_read():
    data = spec(source=source(watermark=None, deduplicate={"key": ["id"]}))
    assert set(errors_of(data)) == {"source.deduplicate"}  # found first, in the source


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT courier, count(*) AS n FROM source GROUP BY courier",
        "SELECT count(*) AS n FROM source",  # one global group
        "SELECT max(amount) AS m FROM source",
        "SELECT date_trunc('minute', ts) AS m, count(*) AS n FROM source "
        "GROUP BY date_trunc('minute', ts)",
        "SELECT window.start AS s, count(*) AS n FROM source GROUP BY window(day, '1 day')",
        # One SELECT of a UNION ALL groups by event time, the other does not.
        "SELECT courier, count(*) AS n FROM source GROUP BY window(ts, '5 minutes'), courier "
        "UNION ALL SELECT courier, count(*) AS n FROM source GROUP BY courier",
    ],
)
@pytest.mark.parametrize("mode", [None, "append", "update"])
def test_an_aggregation_not_grouped_by_event_time_is_refused(sql, mode):
    sink = {**POSTGRES, "mode": "upsert", "key": ["n"]} if mode == "update" else POSTGRES
    errors = errors_of(spec(sql=sql, mode=mode, sink=sink))
    message = errors["transform.sql"]
    assert len(message) == 1
    assert message[0].startswith(
        "the aggregation does not group by event time, so the watermark never finishes a "
        "group: its state grows without bound"
    )
    assert ("append mode never writes it" in message[0]) is (mode != "update")
    assert "GROUP BY window(ts, '5 minutes') (or session_window, or ts itself)" in message[0]


@pytest.mark.parametrize(
    "sql",
    [
        PER_COURIER,
        "SELECT window.start AS s, count(*) AS n FROM source GROUP BY window(TS, '5 minutes')",
        "SELECT window.start AS s, count(*) AS n FROM source "
        "GROUP BY window(source.ts, '10 minutes', '5 minutes')",
        "SELECT session_window.start AS s, courier, count(*) AS n FROM source "
        "GROUP BY session_window(ts, '5 minutes'), courier",
        "SELECT ts, count(*) AS n FROM source GROUP BY ts",
        "SELECT window(ts, '5 minutes') AS w, count(*) AS n FROM source GROUP BY w",
        "SELECT window.start AS s, approx_count_distinct(courier) AS couriers FROM source "
        "GROUP BY window(ts, '5 minutes')",
        "SELECT window.start AS s, count(*) AS n FROM source GROUP BY window(ts, '1 minute') "
        "HAVING count(*) > 1",
        # Grouping a subquery's or a CTE's columns: Spark's analyzer tells.
        "SELECT w, count(*) AS n FROM (SELECT window(ts, '1 minute') AS w FROM source) GROUP BY w",
        "WITH t AS (SELECT * FROM source) SELECT courier, count(*) AS n FROM t GROUP BY courier",
    ],
)
def test_aggregations_grouped_by_event_time_or_that_cannot_be_told_are_accepted(sql):
    assert parsed(spec(sql=sql)).output_mode == "append"


REFUSED_ON_A_STREAM = [
    ("SELECT id FROM source ORDER BY ts", "ORDER BY does not run on a stream"),
    (
        PER_COURIER + " ORDER BY window_start",
        "ORDER BY does not run on a stream",
    ),
    ("SELECT id FROM source LIMIT 10", "LIMIT does not run on a stateful stream"),
    (
        "SELECT a.id FROM source a JOIN source b ON a.id = b.id",
        "joins are not supported in a stateful pipeline",
    ),
    ("SELECT a.id FROM source a, source b", "joins are not supported in a stateful pipeline"),
    (
        "SELECT id, row_number() OVER (PARTITION BY courier ORDER BY ts) AS r FROM source",
        "window functions (... OVER (...)) do not run on a stream",
    ),
    (
        "SELECT id, count(*) OVER (PARTITION BY courier) AS n FROM source",
        "window functions (... OVER (...)) do not run on a stream",
    ),
    ("SELECT DISTINCT courier FROM source", "SELECT DISTINCT keeps every distinct row"),
    (
        "SELECT id FROM source UNION SELECT courier FROM source",
        "UNION (without ALL) keeps every distinct row in state forever",
    ),
    ("SELECT id FROM source INTERSECT SELECT id FROM source", "INTERSECT does not run"),
    ("SELECT id FROM source EXCEPT SELECT id FROM source", "EXCEPT does not run"),
]


@pytest.mark.parametrize(("sql", "message"), REFUSED_ON_A_STREAM)
def test_shapes_that_do_not_run_on_a_stream_are_refused_in_a_stateful_pipeline(sql, message):
    assert_refused(spec(sql=sql), {"transform.sql": message})
    # Over each batch alone (no watermark, no output mode), they run as before.
    assert not parsed(spec(sql=sql, source=source(watermark=None))).stateful


def test_union_all_of_rows_is_accepted_on_a_stream():
    made = parsed(spec(sql="SELECT id FROM source UNION ALL SELECT courier FROM source"))
    assert made.output_mode == "append"


# -- _check_update_sink: sinks of update output --------------------------------------------------


def test_update_output_into_an_upsert_keyed_by_the_group_is_accepted():
    assert parsed(spec(mode="update", sink=UPSERT)).output_mode == "update"
    # window.start alone stands for the window (its end follows from it).
    keyed_by_start = {**UPSERT, "key": ["window_start", "courier"]}
    assert parsed(spec(mode="update", sink=keyed_by_start)).sink.key == (
        "window_start",
        "courier",
    )


@pytest.mark.parametrize(
    ("sink", "expected"),
    [
        (
            FILES,
            {
                "sink.kind": "a files sink takes append output only (a finished file is never "
                "changed): use transform.output_mode append, or a postgres sink in upsert mode"
            },
        ),
        (
            KAFKA,
            {
                "sink.key": "is required with update output: each batch writes a group's new "
                "value, keyed by the group"
            },
        ),
        (
            POSTGRES,
            {
                "sink.mode": "must be upsert with update output (each batch rewrites the "
                "groups it changed): key = the group's columns"
            },
        ),
        (
            {**UPSERT, "key": [*GROUP_KEY, "deliveries"]},
            {
                "sink.key[3]": "column 'deliveries' is not a GROUP BY column "
                "(window(ts, '5 minutes'), courier): an upsert of update output is keyed by "
                "the group"
            },
        ),
        (
            {**UPSERT, "key": ["window_start", "window_end"]},
            {
                "sink.key": "misses the GROUP BY item courier (output column 'courier'): "
                "groups that differ only there would overwrite each other"
            },
        ),
        (
            {**UPSERT, "key": ["courier"]},
            {
                "sink.key": "misses the GROUP BY item window(ts, '5 minutes') (output column "
                "'window_start')"
            },
        ),
        (
            {**UPSERT, "key": ["id", "courier"]},
            {
                "sink.key[0]": "column 'id' is not a GROUP BY column",
                "sink.key": "misses the GROUP BY item window(ts, '5 minutes')",
            },
        ),
    ],
)
def test_sinks_that_cannot_take_update_output_are_refused_at_their_field(sink, expected):
    assert_refused(spec(mode="update", sink=sink), expected)


def test_a_group_item_that_is_no_output_column_is_named_without_a_column():
    sql = (
        "SELECT window.start AS window_start, count(*) AS n FROM source "
        "GROUP BY window(ts, '5 minutes'), courier"
    )
    data = spec(sql=sql, mode="update", sink={**UPSERT, "key": ["window_start"]})
    errors = errors_of(data)
    assert errors == {
        "sink.key": [
            "misses the GROUP BY item courier: groups that differ only there would overwrite "
            "each other"
        ]
    }


def test_a_keyed_kafka_sink_takes_update_output():
    key = "concat(courier, '@', window_start)"
    made = parsed(spec(mode="update", sink={**KAFKA, "key": key}))
    assert (made.output_mode, made.sink.key) == ("update", key)


def test_append_output_goes_to_any_sink():
    for sink in (POSTGRES, FILES, KAFKA, UPSERT):
        assert parsed(spec(mode="append", sink=sink)).output_mode == "append"


def test_update_output_without_an_aggregation_goes_to_sinks_that_only_append():
    """Without an aggregation, update output is each new row once, as in append."""
    rows = "SELECT id, courier, ts FROM source"
    for sink in (FILES, POSTGRES, KAFKA, {**POSTGRES, "mode": "upsert", "key": ["id"]}):
        assert parsed(spec(sql=rows, mode="update", sink=sink)).output_mode == "update"


def test_an_upsert_keyed_by_a_query_that_is_not_one_plain_select_is_left_to_spark():
    sql = (
        "SELECT w.start AS window_start, courier, count(*) AS n FROM "
        "(SELECT window(ts, '5 minutes') AS w, courier FROM source) GROUP BY w, courier"
    )
    upsert = {**POSTGRES, "mode": "upsert", "key": ["n"]}
    assert parsed(spec(sql=sql, mode="update", sink=upsert)).output_mode == "update"


def test_each_of_several_sinks_is_checked_under_its_own_path():
    data = spec(
        mode="update",
        sinks=[
            {**UPSERT, "key": [*GROUP_KEY, "deliveries"]},
            FILES,
            KAFKA,
            {**POSTGRES, "table": "other"},
            {**UPSERT, "table": "good"},
            {**KAFKA, "topic": "keyed", "key": "concat(courier, window_start)"},
        ],
    )
    assert_refused(
        data,
        {
            "sinks[0].key[3]": "column 'deliveries' is not a GROUP BY column",
            "sinks[1].kind": "a files sink takes append output only",
            "sinks[2].key": "is required with update output",
            "sinks[3].mode": "must be upsert with update output",
        },
    )


def test_several_sinks_take_append_output():
    made = parsed(spec(sinks=[POSTGRES, FILES, KAFKA]))
    assert (made.output_mode, len(made.all_sinks())) == ("append", 3)


# -- jobs.spec.streaming: the SQL's shape --------------------------------------------------------


@pytest.mark.parametrize(("sql", "message"), REFUSED_ON_A_STREAM)
def test_stream_shape_refuses_what_does_not_run_on_a_stream(sql, message):
    with pytest.raises(SQLError, match=message.replace("(", r"\(").replace(")", r"\)")):
        stream_shape(sql, "ts")


@pytest.mark.parametrize(
    "sql",
    [
        # An ORDER BY inside an aggregate (WITHIN GROUP) sorts no stream.
        "SELECT window.start AS s, percentile_cont(0.5) WITHIN GROUP (ORDER BY amount) AS p "
        "FROM source GROUP BY window(ts, '5 minutes')",
        "SELECT id FROM source UNION ALL SELECT id FROM source",
    ],
)
def test_stream_shape_accepts(sql):
    stream_shape(sql, "ts")


@pytest.mark.parametrize(
    ("sql", "watermark", "time_grouped"),
    [
        (PER_COURIER, "ts", True),
        (PER_COURIER, "TS", True),
        (
            "SELECT count(*) FROM source GROUP BY session_window(ts, '1 minute'), courier",
            "ts",
            True,
        ),
        ("SELECT count(*) FROM source s GROUP BY window(s.ts, '1 minute')", "ts", True),
        ("SELECT ts, count(*) FROM source GROUP BY ts", "ts", True),
        ("SELECT window(ts, '1 minute') AS w, count(*) FROM source GROUP BY w", "ts", True),
        ("SELECT courier, count(*) FROM source GROUP BY courier", "ts", False),
        ("SELECT count(*) FROM source", "ts", False),
        ("SELECT count(*) FROM source GROUP BY window(other, '1 minute')", "ts", False),
        # An expression over event time is none (its groups are never finished).
        ("SELECT date_trunc('hour', ts) AS ts2, count(*) FROM source GROUP BY ts2", "ts", False),
        (PER_COURIER, None, False),  # no watermark: nothing finishes a group
        # Over a subquery, a CTE or a LATERAL VIEW: cannot be told.
        (
            "SELECT w, count(*) FROM (SELECT window(ts, '1 minute') AS w FROM source) GROUP BY w",
            "ts",
            None,
        ),
        ("WITH t AS (SELECT * FROM source) SELECT count(*) FROM t GROUP BY ts", "ts", None),
        (
            "SELECT window.start AS s, tag, count(*) FROM source LATERAL VIEW explode(tags) t "
            "AS tag GROUP BY window(ts, '5 minutes'), tag",
            "ts",
            None,
        ),
        # Several aggregating SELECTs: False wins over None, None over True.
        (
            "SELECT count(*) AS n FROM source GROUP BY ts UNION ALL "
            "SELECT count(*) AS n FROM source GROUP BY courier",
            "ts",
            False,
        ),
        (
            "SELECT count(*) AS n FROM source GROUP BY ts UNION ALL "
            "SELECT count(*) AS n FROM (SELECT * FROM source) GROUP BY courier",
            "ts",
            None,
        ),
    ],
)
def test_time_grouped_says_whether_every_aggregation_groups_by_event_time(
    sql, watermark, time_grouped
):
    shape = stream_shape(sql, watermark)
    assert shape.aggregates
    assert shape.time_grouped is time_grouped


def test_a_query_without_aggregation_has_no_verdict():
    assert stream_shape("SELECT id, ts FROM source WHERE amount > 0", "ts") == Shape(
        aggregates=False, time_grouped=None
    )


@pytest.mark.parametrize(
    ("sql", "items", "keys"),
    [
        (
            PER_COURIER,
            ("window(ts, '5 minutes')", "courier"),
            {"window_start": 0, "window_end": 0, "courier": 1},
        ),
        (
            "SELECT window, courier, count(*) AS n FROM source "
            "GROUP BY window(ts, '5 minutes'), courier",
            ("window(ts, '5 minutes')", "courier"),
            {"window": 0, "courier": 1},
        ),
        (
            "SELECT session_window.start AS s, session_window.end AS e, id, count(*) AS n "
            "FROM source GROUP BY session_window(ts, '5 minutes'), id",
            ("session_window(ts, '5 minutes')", "id"),
            {"s": 0, "e": 0, "id": 1},
        ),
        (
            # window.start is the window's bound, not a session window's.
            "SELECT window.start AS s, count(*) AS n FROM source "
            "GROUP BY session_window(ts, '5 minutes'), id",
            ("session_window(ts, '5 minutes')", "id"),
            {},
        ),
        (
            "SELECT window(ts, '1 minute') AS w, courier AS c, count(*) AS n FROM source "
            "GROUP BY w, courier",
            ("w", "courier"),
            {"w": 0, "c": 1},
        ),
        (
            "SELECT upper(courier) AS c, ts, count(*) AS n FROM source GROUP BY upper(courier), ts",
            ("upper(courier)", "ts"),
            {"c": 0, "ts": 1},
        ),
        (
            "SELECT s.courier, s.ts, count(*) AS n FROM source AS s GROUP BY s.courier, s.ts",
            ("s.courier", "s.ts"),
            {"courier": 0, "ts": 1},
        ),
    ],
)
def test_key_columns_name_the_output_columns_that_are_group_items(sql, items, keys):
    shape = stream_shape(sql, "ts")
    assert (shape.group_items, shape.key_columns) == (items, keys)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT id FROM source",  # no GROUP BY
        "SELECT w, count(*) FROM (SELECT window(ts, '1 minute') AS w FROM source) GROUP BY w",
        "SELECT ts, count(*) FROM source GROUP BY ts UNION ALL SELECT ts, 1 FROM source",
    ],
)
def test_key_columns_are_only_told_for_one_plain_select_from_the_source(sql):
    assert stream_shape(sql, "ts").key_columns is None


def test_the_source_view_can_have_another_name():
    sql = "SELECT window.start AS s, count(*) AS n FROM events GROUP BY window(ts, '1 minute')"
    assert stream_shape(sql, "ts", source_view="events").key_columns == {"s": 0}
    assert stream_shape(sql, "ts").time_grouped is None  # `events` is not the source here


# -- shapes Spark resolves or refuses that a first version of these checks got wrong -----------


@pytest.mark.parametrize(
    "sql",
    [
        PER_COURIER.replace(", courier, count", ", COURIER, count"),
        PER_COURIER.replace(", courier, count", ", `courier`, count"),
        PER_COURIER.replace("'5 minutes'), courier", "'5 minutes'), source.courier"),
    ],
)
def test_the_group_key_is_found_whatever_the_spelling_of_its_columns(sql):
    assert parsed(spec(sql=sql, mode="update", sink=UPSERT)).output_mode == "update"


def test_group_by_ordinals_are_resolved_to_the_select_list():
    sql = "SELECT window(ts, '5 minutes') AS w, courier, count(*) AS n FROM source GROUP BY 1, 2"
    assert parsed(spec(sql=sql)).output_mode == "append"


def test_a_distinct_aggregate_is_refused_before_launch():
    sql = (
        "SELECT window.start AS window_start, count(DISTINCT courier) AS couriers "
        "FROM source GROUP BY window(ts, '5 minutes')"
    )
    errors = errors_of(spec(sql=sql))
    assert list(errors) == ["transform.sql"]
    assert "approx_count_distinct" in errors["transform.sql"][0]


def test_a_session_window_in_update_mode_is_refused_before_launch():
    sql = (
        "SELECT session_window.start AS s, session_window.end AS e, courier, count(*) AS n "
        "FROM source GROUP BY session_window(ts, '5 minutes'), courier"
    )
    errors = errors_of(spec(sql=sql, mode="update", sink={**UPSERT, "key": ["s", "e", "courier"]}))
    assert set(errors) <= {"transform.output_mode", "transform.sql"}


def test_a_global_session_window_is_refused_before_launch():
    sql = (
        "SELECT session_window.start AS s, count(*) AS n FROM source "
        "GROUP BY session_window(ts, '5 minutes')"
    )
    assert list(errors_of(spec(sql=sql))) == ["transform.sql"]


# -- the review's cases: what Spark runs is accepted, what it cannot replay is refused ---------


@pytest.mark.parametrize(
    "sql",
    [
        # GROUP BY ALL: the select list's items that do not aggregate.
        "SELECT window(ts, '5 minutes') AS w, courier, count(*) AS n FROM source GROUP BY ALL",
        # A name that is the event-time column groups by the column, not by the alias.
        "SELECT date_trunc('minute', ts) AS ts, count(*) AS n FROM source GROUP BY ts",
    ],
)
def test_groupings_spark_resolves_to_event_time_are_accepted(sql):
    assert parsed(spec(sql=sql)).output_mode == "append"


@pytest.mark.parametrize(
    ("sql", "text"),
    [
        (PER_COURIER.replace("), courier", "), ROLLUP(courier)"), "ROLLUP, CUBE"),
        (PER_COURIER.replace("), courier", "), CUBE(courier)"), "ROLLUP, CUBE"),
        (PER_COURIER.replace("SELECT", "SELECT /*+ COALESCE(1) */"), "COALESCE"),
        (PER_COURIER.replace("SELECT", "SELECT /*+ REPARTITION(4) */"), "REPARTITION"),
        (PER_COURIER.replace("FROM source", "FROM source TABLESAMPLE (50 PERCENT)"), "sampling"),
    ],
)
def test_shapes_a_replay_could_cut_differently_are_refused(sql, text):
    assert_refused(spec(sql=sql), {"transform.sql": text})


def test_a_kafka_key_of_update_output_must_use_every_group_item():
    keyed = {**KAFKA, "key": "courier"}
    assert_refused(
        spec(mode="update", sink=keyed), {"sink.key": "does not use the GROUP BY item window"}
    )
    whole = {**KAFKA, "key": "concat(courier, '@', window_start)"}
    assert parsed(spec(mode="update", sink=whole)).output_mode == "update"


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        (
            "[STATE_STORE_INVALID_CONFIG_AFTER_RESTART] Cannot change ...",
            "a state the checkpoint cannot restore",
        ),
        ("[STATE_STORE_INVALID_STAMP] Invalid stamp ...", None),  # a zombie task: transient
        (
            "Detected pattern of possible 'correctness' issue due to global watermark. ...",
            "a definition error (Spark refuses the stateful transform on a stream)",
        ),
        (
            "[UNSUPPORTED_STREAMING_OPERATOR_WITHOUT_WATERMARK] ... is not supported for ...",
            "a definition error (Spark refuses the stateful transform on a stream)",
        ),
        ("StateStoreError: state_store: the checkpoint's state is kept in", "a definition error"),
    ],
)
def test_state_failures_are_permanent_or_not(error, kind):
    from controlplane.supervision.restarts import classify

    assert classify(error) == kind


# -- docs/spec.md's examples --------------------------------------------------------------------


def docs_examples() -> list[dict]:
    """The JSON of docs/spec.md's "Stateful pipelines" examples: the first a whole spec, the
    others parts of one (top-level fields)."""
    import json
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "spec.md").read_text()
    section = text.split("## Stateful pipelines", 1)[1].split("### State store", 1)[0]
    blocks = re.findall(r"```json\n(.*?)```", section, re.S)
    return [json.loads(b if b.lstrip().startswith("{") else "{" + b + "}") for b in blocks]


def test_the_docs_examples_are_valid_specs():
    whole, running, distinct, deduplicated = docs_examples()
    known = {"local-kafka": "kafka", "local-postgres": "postgres"}
    made = parse_spec(whole, connections=known)
    assert (made.output_mode, made.sink.mode) == ("append", "append")
    made = parse_spec({**whole, **running}, connections=known)
    assert (made.output_mode, made.sink.key) == ("update", tuple(GROUP_KEY))
    made = parse_spec({**whole, **distinct}, connections=known)
    assert "approx_count_distinct" in made.transform.sql
    made = parse_spec({**whole, **deduplicated, "transform": None}, connections=known)
    assert (made.output_mode, made.source.deduplicate.key) == ("append", ("delivery_id", "status"))
