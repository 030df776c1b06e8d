"""Names a Kafka broker keeps for itself, which no pipeline, connection or redrive may use.

Every topic, consumer group and client id an editor can name goes through `internal_problem`
(the spec's source topics, sink and dead-letter topics and consumer group, a connection's
client id, a dead-letter redrive's target), so there is one rule:

* topics starting with `__` are the broker's internal topics (`__consumer_offsets`,
  `__transaction_state`, `__share_group_state`, `__cluster_metadata`...): reading them shows
  every group's offsets and every producer's transactions, writing them corrupts the broker's
  own bookkeeping;
* client ids starting with `__`: Apache Kafka lets a client whose id is `__admin_client`
  produce to internal topics (the broker compares the request's client id with
  `AdminUtils.ADMIN_CLIENT_ID`), and a later version may give other `__` ids meaning;
* consumer group ids starting with `__`: kept for the broker's and its tools' own groups.

Plain Python: used by the validator, the connection settings and the Spark job alike.
"""

from __future__ import annotations

from typing import Literal

INTERNAL_PREFIX = "__"

Kind = Literal["topic", "consumer group", "client id"]

_WHY: dict[str, str] = {
    "topic": "its internal topics: __consumer_offsets, __transaction_state...",
    "consumer group": "kept for the broker and its tools",
    "client id": "a client named __admin_client may write the broker's internal topics",
}


def is_internal(name: str) -> bool:
    """Whether `name` (a topic, consumer group or client id) is one Kafka keeps for itself."""
    return name.startswith(INTERNAL_PREFIX)


def internal_problem(kind: Kind, name: str) -> str | None:
    """Why `name` may not be used as a `kind`, or None: the message for a 400 naming the
    field."""
    if not is_internal(name):
        return None
    return (
        f"{name!r}: {kind}s starting with {INTERNAL_PREFIX} are Kafka's own ({_WHY[kind]}); "
        "choose another name"
    )
