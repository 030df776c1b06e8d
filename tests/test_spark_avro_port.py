"""jobs.registry.spark_avro, the port of Spark's SchemaConverters.toAvroType: the same schema
as Spark's own (parsed JSON, and the very text its toString() gives) for every type the spec's
DDL describes, nested, nullable and not, under several record names; the same refusals; and
the Avro schema the Kafka sink's writer registers for a spec without a transform or a value
expression (from JSON, Avro and registry sources, and a deduplicating stateful one) is the one
the control plane checks on save (controlplane.definitions.schemas.sink_value_schema). Pure
tests first, then the ones that need Spark."""

from __future__ import annotations

import json
import uuid

import pytest

from jobs.registry import spark_avro
from jobs.spec import parse_spec
from jobs.spec.ddl import ArrayType, MapType, PrimitiveType, StructType, parse_schema

# Every type the spec's DDL has that Spark writes as Avro, nested, nullable and not.
WIDE = (
    "a BOOLEAN, b TINYINT NOT NULL, c SMALLINT, d INT NOT NULL, e BIGINT, f FLOAT,"
    " g DOUBLE NOT NULL, h STRING, i BINARY NOT NULL, j DECIMAL(9,2) NOT NULL, k DECIMAL(38,10),"
    " l DECIMAL(1,0), m DATE, n TIMESTAMP NOT NULL, o TIMESTAMP_NTZ, p ARRAY<INT>,"
    " q ARRAY<ARRAY<DECIMAL(18,4)>> NOT NULL, r MAP<STRING, DECIMAL(5,1)>,"
    " s STRUCT<x: INT NOT NULL, y: STRUCT<z: DECIMAL(3,0), w: ARRAY<STRUCT<v: STRING NOT NULL>>>,"
    " t: MAP<STRING, STRUCT<u: DATE>>> NOT NULL,"
    " u ARRAY<STRUCT<s: DECIMAL(20,3), t: TIMESTAMP_NTZ>>, v MAP<STRING, ARRAY<BINARY>> NOT NULL,"
    " w VOID, x INTERVAL YEAR TO MONTH, y INTERVAL DAY TO SECOND NOT NULL, z INTERVAL MONTH,"
    " aa INTERVAL HOUR TO MINUTE, ab TIME(6), ac TIME(0) NOT NULL,"
    " `fixed` STRUCT<`fixed`: STRUCT<`record`: DECIMAL(4,2)>>, `Ünïcode_1` STRING"
)
# What Spark's converter refuses (and so does the port).
REFUSED = (
    "a MAP<INT, STRING>",
    "a MAP<STRING COLLATE UTF8_LCASE, INT>",
    "a STRING COLLATE UNICODE",
    "a CHAR(3)",
    "a VARCHAR(3)",
    "a VARIANT",
    "a INTERVAL",
    "`a-b` INT",
    "`1a` INT",
    "a STRUCT<`b c`: INT>",
    "`a.b` STRUCT<c: INT>",
    "a ARRAY<STRUCT<`x y`: DECIMAL(3,1)>>",
)
NAMES = (  # (nullable, record name, namespace)
    (False, "topLevelRecord", ""),
    (False, "Order", "com.acme"),
    (True, "x", ""),
)


# -- pure ----------------------------------------------------------------------------------------


def test_decimal_sizes_are_the_fewest_bytes_that_hold_every_unscaled_value():
    for precision in range(1, 39):
        size = spark_avro.min_bytes_for_precision(precision)
        assert 2 ** (8 * size - 1) >= 10**precision > 2 ** (8 * (size - 1) - 1), precision


def test_records_and_decimals_are_named_by_their_field_in_the_enclosing_namespace():
    schema = spark_avro.to_avro_type(
        parse_schema("d DECIMAL(9,2) NOT NULL, s STRUCT<e: DECIMAL(3,0), t: STRUCT<n: INT>>"),
        record_name="Order",
        namespace="acme",
    )
    assert (schema["type"], schema["name"], schema["namespace"]) == ("record", "Order", "acme")
    d, s = schema["fields"]
    assert d == {
        "name": "d",
        "type": {
            "type": "fixed",
            "name": "fixed",
            "namespace": "acme.Order.d",
            "size": 4,
            "logicalType": "decimal",
            "precision": 9,
            "scale": 2,
        },
    }
    record, null = s["type"]
    assert null == "null"
    assert (record["name"], record["namespace"]) == ("s", "acme.Order")
    e, t = record["fields"]
    assert e["type"][0]["namespace"] == "acme.Order.s.e"
    assert (t["type"][0]["name"], t["type"][0]["namespace"]) == ("t", "acme.Order.s")
    assert t["type"][0]["fields"] == [{"name": "n", "type": ["int", "null"]}]
    # Without a namespace, the record's own name is the first part of its children's.
    plain = spark_avro.to_avro_type(parse_schema("s STRUCT<e: DECIMAL(3,0)>"))
    assert "namespace" not in plain
    assert plain["fields"][0]["type"][0]["namespace"] == "topLevelRecord"
    assert plain["fields"][0]["type"][0]["fields"][0]["type"][0]["namespace"] == (
        "topLevelRecord.s.e"
    )


def test_every_field_is_nullable_once_made_so_at_every_depth():
    schema = parse_schema("a INT NOT NULL, s STRUCT<b: ARRAY<STRUCT<c: DATE NOT NULL>>> NOT NULL")
    nullable = spark_avro.as_nullable(schema)
    assert all(f.nullable for f in nullable.fields)
    inner = nullable.fields[1].type
    assert isinstance(inner, StructType)
    element = inner.fields[0].type
    assert isinstance(element, ArrayType) and isinstance(element.element, StructType)
    assert element.element.fields[0].nullable
    assert spark_avro.as_nullable(MapType(PrimitiveType("string"), PrimitiveType("int"))) == (
        MapType(PrimitiveType("string"), PrimitiveType("int"))
    )
    avro = spark_avro.to_avro_type(nullable)
    assert [f["type"][-1] for f in avro["fields"]] == ["null", "null"]


def test_a_type_or_a_name_spark_cannot_write_is_refused_naming_the_column():
    with pytest.raises(spark_avro.NotWritable) as caught:
        spark_avro.to_avro_type(parse_schema("s STRUCT<m: MAP<INT, STRING>>"))
    assert caught.value.path == "s.m"
    with pytest.raises(spark_avro.NotWritable) as caught:
        spark_avro.to_avro_type(parse_schema("a ARRAY<STRUCT<`x y`: INT>>"))
    assert caught.value.path == "a[].x y"
    assert "Illegal character" in caught.value.why
    with pytest.raises(spark_avro.NotWritable):
        spark_avro.to_avro_type(parse_schema("a INT"), record_name="string")
    # A letter beyond the BMP is two UTF-16 surrogates to Avro's Java validator.
    with pytest.raises(spark_avro.NotWritable):
        spark_avro.to_avro_type(parse_schema("`a\U00010400` INT"))


def test_the_record_option_splits_at_its_last_dot():
    assert spark_avro.record_name(None) == ("topLevelRecord", "")
    assert spark_avro.record_name("acme.orders.Order") == ("Order", "acme.orders")
    assert spark_avro.record_name("Order") == ("Order", "")


# -- against Spark ---------------------------------------------------------------------------


def _spark_schema(spark, ddl: str, nullable: bool, record: str, namespace: str) -> str:
    jvm = spark._jvm
    catalyst = jvm.org.apache.spark.sql.types.StructType.fromDDL(ddl)
    converters = jvm.org.apache.spark.sql.avro.SchemaConverters
    return converters.toAvroType(catalyst, nullable, record, namespace).toString()


@pytest.mark.spark
@pytest.mark.parametrize(("nullable", "record", "namespace"), NAMES)
def test_the_port_gives_spark_s_own_schema_for_every_type(spark, nullable, record, namespace):
    for ddl in (WIDE, spark_avro_nullable_ddl()):
        theirs = _spark_schema(spark, ddl, nullable, record, namespace)
        ours = spark_avro.to_avro_type(parse_schema(ddl), nullable, record, namespace)
        assert ours == json.loads(theirs)
        assert spark_avro.to_json(ours) == theirs  # the very text Spark registers


def spark_avro_nullable_ddl() -> str:
    """WIDE with every NOT NULL dropped: the same types, all nullable."""
    return WIDE.replace(" NOT NULL", "")


@pytest.mark.spark
def test_what_spark_refuses_the_port_refuses(spark):
    from py4j.protocol import Py4JJavaError

    for ddl in REFUSED:
        with pytest.raises(Py4JJavaError):
            _spark_schema(spark, ddl, False, "topLevelRecord", "")
        with pytest.raises(spark_avro.NotWritable):
            spark_avro.to_avro_type(parse_schema(ddl))


# -- the schema the Kafka sink's writer registers ---------------------------------------------

AVRO_SOURCE = {
    "type": "record",
    "name": "Delivery",
    "namespace": "example",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": ["null", "int"], "default": None},
        {
            "name": "amount",
            "type": {"type": "bytes", "logicalType": "decimal", "precision": 9, "scale": 2},
        },
        {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "local", "type": {"type": "long", "logicalType": "local-timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "status", "type": {"type": "enum", "name": "Status", "symbols": ["A", "B"]}},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": ["null", "double"]}},
        {
            "name": "where",
            "type": {
                "type": "record",
                "name": "Where",
                "fields": [
                    {"name": "lat", "type": "double"},
                    {"name": "code", "type": {"type": "fixed", "name": "Code", "size": 3}},
                ],
            },
        },
        {"name": "either", "type": ["int", "string"]},
    ],
}


def _spec(source: dict, *, record: str | None = None, **extra) -> dict:
    return {
        "source": {"connection": "k", "topics": ["in"], "starting_offsets": "earliest", **source},
        "sink": {
            "kind": "kafka",
            "connection": "k",
            "topic": "out",
            "key": "id",
            "format": "avro",
            "schema_registry": {"connection": "registry", "record": record},
        },
        **extra,
    }


SOURCES = {
    "json": _spec(
        {"schema": WIDE.replace(", `Ünïcode_1` STRING", "") + ", id STRING"},
        record="acme.Order",
    ),
    "avro": _spec({"format": "avro", "avro_schema": AVRO_SOURCE}),
    "registry": _spec(
        {
            "format": "avro",
            "avro_framing": "confluent",
            "avro_schema": json.dumps(AVRO_SOURCE),
            "schema_registry": {
                "connection": "registry",
                "subject": "in-value",
                "resolved_version": 1,
                "schema_id": 1,
            },
        },
        record="Out",
    ),
    "stateful": _spec(
        {
            "schema": "id STRING NOT NULL, ts TIMESTAMP, s STRUCT<n: INT NOT NULL>",
            "watermark": {"column": "ts", "delay_seconds": 60},
            "deduplicate": {"key": ["id"]},
        }
    ),
}


@pytest.mark.spark
@pytest.mark.parametrize("kind", sorted(SOURCES))
def test_the_writer_registers_the_schema_checked_on_save(spark, tmp_path, kind):
    """The no-transform path of jobs.sinks.kafka.writer over the real parsed frame: the
    schema AvroValues derives from the value's Spark type is sink_value_schema's."""
    from pyspark.sql.types import (
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )

    from controlplane.definitions.schemas import sink_value_schema
    from jobs.batch import Batch
    from jobs.runconfig import RunConfig
    from jobs.sinks.kafka import client
    from jobs.sinks.kafka.kind import KIND
    from jobs.source import parsed_frame
    from jobs.stateful import stateful_frame

    spec = parse_spec(SOURCES[kind])
    (tmp_path / "run").mkdir()
    config = RunConfig(
        pipeline=f"port-{uuid.uuid4().hex[:8]}",
        spec=spec,
        kafka={"bootstrap_servers": ["127.0.0.1:1"]},
        postgres={},
        checkpoint=str(tmp_path / "checkpoint"),
        run_dir=str(tmp_path / "run"),
        registry={"url": "http://127.0.0.1:1", "auth": "none"},
    )
    raw = spark.createDataFrame(
        [],
        StructType(
            [
                StructField("key", BinaryType()),
                StructField("value", BinaryType()),
                StructField("topic", StringType()),
                StructField("partition", IntegerType()),
                StructField("offset", LongType()),
                StructField("timestamp", TimestampType()),
            ]
        ),
    )
    parsed = parsed_frame(raw, spec, config.registry)
    if spec.stateful:
        parsed, _ = stateful_frame(spark, parsed, spec)
    sink = spec.sink

    class Registered(client.AvroValues):
        """What the writer would register, kept instead of asking a registry."""

        def __init__(self, *args):
            super().__init__(*args)
            self.schemas: list[str] = []

        def column(self, value, data_type):
            self.schemas.append(self.schema_of(data_type))
            return value

    batch = Batch(config, 0, KIND)
    frame = parsed.select(*batch.one_pass_columns())
    avro = Registered(spark, sink, {"url": "http://127.0.0.1:1"})
    client.RecordColumns(sink, avro).columns(frame, batch.columns)
    [registered] = avro.schemas
    expected = sink_value_schema(spec, sink)
    assert expected == json.loads(registered)
    assert spark_avro.to_json(expected) == registered
