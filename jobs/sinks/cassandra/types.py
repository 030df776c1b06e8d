"""Spark's column types and Cassandra's: what a table created from a pipeline's output gets
(`cql_type`), and which output column an existing table's column can take (`takes`): the same
type or a safe widening, as the writer converts them (controlplane.spark.CassandraWriter).
Pure: Spark's simple type strings (jobs.spec.ddl) and CQL type strings as Cassandra's schema
tables spell them (`text`, `list<int>`, `frozen<map<text, bigint>>`)."""

from __future__ import annotations

import re

_TO_CQL = {
    "string": "text",
    "boolean": "boolean",
    "tinyint": "tinyint",
    "smallint": "smallint",
    "int": "int",
    "bigint": "bigint",
    "float": "float",
    "double": "double",
    "date": "date",
    "timestamp": "timestamp",
    "timestamp_ntz": "timestamp",
    "binary": "blob",
}
# CQL type -> the Spark simple types a column of it takes.
_TAKES = {
    "text": {"string"},
    "varchar": {"string"},
    "ascii": {"string"},
    "uuid": {"string"},
    "timeuuid": {"string"},
    "inet": {"string"},
    "boolean": {"boolean"},
    "tinyint": {"tinyint"},
    "smallint": {"smallint", "tinyint"},
    "int": {"int", "smallint", "tinyint"},
    "bigint": {"bigint", "int", "smallint", "tinyint"},
    "varint": {"bigint", "int", "smallint", "tinyint", "decimal"},
    "decimal": {"decimal", "bigint", "int", "smallint", "tinyint"},
    "float": {"float", "smallint", "tinyint"},
    "double": {"double", "float", "int", "smallint", "tinyint"},
    "timestamp": {"timestamp", "timestamp_ntz"},
    "date": {"date"},
    "blob": {"binary"},
    "duration": {"string", "interval"},
}
_COLLECTION = re.compile(r"^(list|set|map)<(.*)>$")


class NoType(ValueError):
    """No Cassandra type for a Spark type (or the other way): the message says which."""


def cql_type(spark_type: str) -> str:
    """The CQL type a created table gives an output column of this Spark type."""
    t = spark_type.strip().lower()
    if t.startswith("decimal"):
        return "decimal"
    if t.startswith(("varchar(", "char(")):
        return "text"
    if t.startswith("array<") and t.endswith(">"):
        return f"list<{_frozen(cql_type(t[6:-1]))}>"
    if t.startswith("map<") and t.endswith(">"):
        key, value = _split_pair(t[4:-1])
        return f"map<{_frozen(cql_type(key))}, {_frozen(cql_type(value))}>"
    if t in _TO_CQL:
        return _TO_CQL[t]
    raise NoType(
        f"no Cassandra type for a Spark {spark_type}: select its fields, or to_json() it into"
        " a string"
    )


def _frozen(cql: str) -> str:
    return f"frozen<{cql}>" if "<" in cql else cql


def takes(cql: str, spark_type: str) -> bool:
    """Whether a column of CQL type `cql` takes an output column of `spark_type`."""
    cql = cql.strip().lower()
    t = spark_type.strip().lower()
    if t.startswith("decimal"):
        t = "decimal"
    elif t.startswith(("varchar(", "char(")):
        t = "string"
    elif t.startswith("interval"):
        t = "interval"
    collection = _COLLECTION.match(_strip_frozen(cql))
    if collection:
        return _COLLECTIONS[collection.group(1)](collection.group(2), t)
    return t in _TAKES.get(_strip_frozen(cql), set())


def is_counter(cql: str) -> bool:
    return cql.strip().lower() == "counter"


def _strip_frozen(cql: str) -> str:
    cql = cql.strip()
    if cql.startswith("frozen<") and cql.endswith(">"):
        return cql[7:-1].strip()
    return cql


def _split_pair(text: str) -> tuple[str, str]:
    """`k, v` at the top level of a type's parameters (nested types have commas inside)."""
    depth = 0
    for i, ch in enumerate(text):
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
        elif ch == "," and depth == 0:
            return text[:i].strip(), text[i + 1 :].strip()
    raise NoType(f"not a pair of types: {text!r}")


def _takes_array(inner: str, t: str) -> bool:
    """A list<inner> or set<inner> column takes an array of what inner takes."""
    return t.startswith("array<") and t.endswith(">") and takes(inner, t[6:-1])


def _takes_map(inner: str, t: str) -> bool:
    """A map<k, v> column takes a map of what k and v take."""
    if not (t.startswith("map<") and t.endswith(">")):
        return False
    ckey, cvalue = _split_pair(inner)
    skey, svalue = _split_pair(t[4:-1])
    return takes(_strip_frozen(ckey), skey) and takes(_strip_frozen(cvalue), svalue)


# Per CQL collection (the ones _COLLECTION matches), what Spark types it takes.
_COLLECTIONS = {"list": _takes_array, "set": _takes_array, "map": _takes_map}
