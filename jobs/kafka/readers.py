"""Which Kafka reader a pipeline runs, and what Spark's connector is told.

Two readers read a pipeline's topics:

- `spark-kafka`: Spark's own JVM connector (`spark-sql-kafka-0-10`), the default wherever its
  jars are on the application's classpath (jobs.jvm builds them into one directory);
- `python`: our Python Data Source on kafka-python (jobs.kafka.source), for a Spark without
  the connector.

Their offset logs differ (ours records how each batch is cut, `$plan`; Spark's parser refuses
that), so a checkpoint is read on by the reader that started it: the choice is kept in a small
file beside the checkpoint's own files, with the input partitions a batch is cut into (which a
replay must repeat for the sink's per-partition commit markers). Plain Python: no Spark here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..failures import DefinitionError
from ..storage import Storage, join, storage_for

SPARK_KAFKA = "spark-kafka"
PYTHON = "python"
PIN_FILE = "controlplane-reader.json"

# Spark masks the data source options whose name or value matches this in plan strings, the
# SQL tab and the event log (its default is only "(?i)url"; `spark.redaction.regex` adds
# secret|password|token). The JAAS config holds the SASL password; the keystore key is a
# private key.
OPTIONS_REDACTION_REGEX = r"(?i)url|jaas|password|secret|token|ssl\.keystore\.key"

# Each SASL mechanism's JAAS login module in the Java client.
_LOGIN_MODULES = {
    "PLAIN": "org.apache.kafka.common.security.plain.PlainLoginModule",
    "SCRAM-SHA-256": "org.apache.kafka.common.security.scram.ScramLoginModule",
    "SCRAM-SHA-512": "org.apache.kafka.common.security.scram.ScramLoginModule",
}


class ReaderError(DefinitionError, RuntimeError):
    """The pipeline cannot be read as asked: a definition error, the same on every restart."""


@dataclass(frozen=True)
class Pin:
    """What a checkpoint was started with."""

    reader: str
    min_partitions: int | None = None


def read_pin(checkpoint: str | os.PathLike, store: Storage | None = None) -> Pin | None:
    """The reader this checkpoint was started with; None for a checkpoint not started yet.

    A checkpoint with an offset log but no pin file was written before readers were pinned,
    when every pipeline ran the Python reader (Spark's connector path had never run).
    """
    root = os.fspath(checkpoint)
    store = store or storage_for(root)
    try:
        data = json.loads(store.read_text(join(root, PIN_FILE)))
    except FileNotFoundError:
        if any(e.name.isdigit() for e in store.list(join(root, "offsets"))):
            return Pin(PYTHON)
        return None
    return Pin(str(data["reader"]), data.get("min_partitions"))


def write_pin(checkpoint: str | os.PathLike, pin: Pin, store: Storage | None = None) -> None:
    root = os.fspath(checkpoint)
    store = store or storage_for(root)
    store.makedirs(root)
    store.write_text(
        join(root, PIN_FILE),
        json.dumps({"reader": pin.reader, "min_partitions": pin.min_partitions}),
    )


def choose(requested: str | None, pinned: Pin | None, connector: bool) -> str:
    """The reader to run: the checkpoint's, the spec's, or the default; ReaderError if the
    spec asks for another reader than the checkpoint was started with, or for a connector
    this Spark does not have."""
    if pinned is not None:
        if requested is not None and requested != pinned.reader:
            raise ReaderError(
                f"source.reader: this pipeline's checkpoint was started by the {pinned.reader}"
                f" reader and cannot be read on by the {requested} reader (their offset logs"
                f" differ); set reader back to {pinned.reader!r} (or leave it unset), or start"
                " the pipeline on a new checkpoint"
            )
        reader = pinned.reader
    else:
        reader = requested or (SPARK_KAFKA if connector else PYTHON)
    if reader == SPARK_KAFKA and not connector:
        raise ReaderError(
            "source.reader: spark-kafka needs Spark's Kafka connector (spark-sql-kafka-0-10)"
            " on the application's classpath, and this Spark has none: build it with"
            " `python -m jobs.jvm build` or choose reader 'python'"
        )
    return reader


def decide(
    requested: str | None,
    min_partitions: int,
    pinned: Pin | None,
    *,
    connector: bool,
    replay_pending: bool,
) -> Pin:
    """What a run reads with (choose), and how many partitions a batch is cut into:
    `min_partitions` (the spec's, or the application's cores), except while the checkpoint's
    last batch waits to be replayed, which is cut as it was the first time (the sink's
    per-partition commit markers count on it). Spark's connector cuts its input into at
    least that many; the Python reader's offset log records each batch's cut itself ($plan);
    with either, an upsert is hashed by key into that many partitions."""
    reader = choose(requested, pinned, connector)
    if pinned is not None and pinned.reader == reader and pinned.min_partitions and replay_pending:
        return pinned
    return Pin(reader, min_partitions)


def starting_offsets_json(
    starting: Mapping[str, Mapping[str, int]], partitions: Iterable[tuple[str, int]]
) -> str:
    """Per-partition starting offsets as Spark's connector wants them: every partition of the
    subscribed topics named (Spark refuses a partial map), those the spec leaves out from
    their earliest offset (-2), as the Python reader does."""
    out: dict[str, dict[str, int]] = {}
    for topic, partition in sorted(partitions):
        wanted = starting.get(topic, {}).get(str(partition), -2)
        out.setdefault(topic, {})[str(partition)] = int(wanted)
    return json.dumps(out, sort_keys=True)


def java_client_options(client: Mapping[str, Any]) -> dict[str, str]:
    """A connection's kafka-python client arguments (jobs.connections.kafka_client_config) as
    Java client properties, for Spark's connector (`kafka.` + name) or Kafka's tools.

    Secrets go in as values (the JAAS config, the key password, the PEM key), never into a
    file name or a command line; TLS files are read here and passed as PEM text, so executors
    on other hosts need no copy of them.
    """
    props = {
        "bootstrap.servers": ",".join(client["bootstrap_servers"]),
        "security.protocol": client.get("security_protocol", "PLAINTEXT"),
    }
    if client.get("client_id"):
        props["client.id"] = str(client["client_id"])
    protocol = props["security.protocol"]
    if protocol.startswith("SASL"):
        mechanism = client["sasl_mechanism"]
        if mechanism not in _LOGIN_MODULES:
            raise ReaderError(f"sasl_mechanism {mechanism!r} is not supported")
        props["sasl.mechanism"] = mechanism
        props["sasl.jaas.config"] = (
            f"{_LOGIN_MODULES[mechanism]} required"
            f" username={_jaas_quote(client.get('sasl_plain_username') or '')}"
            f" password={_jaas_quote(client.get('sasl_plain_password') or '')};"
        )
    if protocol.endswith("SSL"):
        if client.get("ssl_cafile"):
            props["ssl.truststore.type"] = "PEM"
            props["ssl.truststore.certificates"] = _read_pem(client["ssl_cafile"])
        if client.get("ssl_certfile") and client.get("ssl_keyfile"):
            props["ssl.keystore.type"] = "PEM"
            props["ssl.keystore.certificate.chain"] = _read_pem(client["ssl_certfile"])
            props["ssl.keystore.key"] = _read_pem(client["ssl_keyfile"])
            if client.get("ssl_password"):
                props["ssl.key.password"] = client["ssl_password"]
        if client.get("ssl_check_hostname") is False:
            props["ssl.endpoint.identification.algorithm"] = ""
    return props


def _jaas_quote(value: str) -> str:
    """A JAAS option value in double quotes; the parser (a StreamTokenizer) reads backslash
    escapes inside them."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _read_pem(path: str) -> str:
    return Path(path).read_text()


# Consumer settings of Spark's connector that differ from the Java client's defaults
# (measured in bench/throughput.py; docs/observability.md "Throughput"). After each poll the
# connector asks the broker for the partition's log bounds (two ListOffsets requests); they
# queue behind the consumer's prefetch of the next records, which a broker holds for
# fetch.max.wait.ms (500 ms by default) when a task has read up to the log end. A task reads
# an offset range known to exist, so it never needs the broker to wait for new records.
# max.poll.records (500 by default) sets how often those lookups are made; the records a
# poll holds stay bounded by fetch.max.bytes and max.partition.fetch.bytes.
CONSUMER_SETTINGS = {"fetch.max.wait.ms": "10", "max.poll.records": "20000"}


def spark_kafka_options(
    client: Mapping[str, Any],
    *,
    topics: Iterable[str],
    starting: str | None,
    starting_timestamp_ms: int | None,
    max_records_per_batch: int,
    fail_on_data_loss: bool,
    min_partitions: int,
) -> dict[str, str]:
    """Every option of Spark's connector for one pipeline source. `starting`: "earliest",
    "latest" or per-partition JSON (starting_offsets_json); ignored with a start time."""
    options = {
        f"kafka.{k}": v for k, v in {**CONSUMER_SETTINGS, **java_client_options(client)}.items()
    }
    options.update(
        {
            "subscribe": ",".join(topics),
            "maxOffsetsPerTrigger": str(max_records_per_batch),
            "failOnDataLoss": str(fail_on_data_loss).lower(),
            "minPartitions": str(min_partitions),
            # Offsets are Spark's checkpoint's; no consumer group is created or committed by
            # the connector (our own mirror, jobs.kafka.group_commit, commits if asked to).
            "includeHeaders": "false",
        }
    )
    if starting_timestamp_ms is not None:
        # In each partition the first record at or after that time; the log end if none is.
        options["startingTimestamp"] = str(starting_timestamp_ms)
        options["startingOffsetsByTimestampStrategy"] = "latest"
    else:
        options["startingOffsets"] = starting or "latest"
    return options


def replay_pending(checkpoint: str | os.PathLike, store: Storage | None = None) -> bool:
    """Whether the checkpoint's last planned batch was not committed: Spark runs it again,
    with the same offsets, before planning a new one."""
    root = os.fspath(checkpoint)
    store = store or storage_for(root)

    def last(name: str) -> int:
        ids = [int(e.name) for e in store.list(join(root, name)) if e.name.isdigit()]
        return max(ids, default=-1)

    return last("offsets") > last("commits")
