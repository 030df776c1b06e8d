"""The Apache Cassandra node of `./stack test` (scripts/devstack.py: one Cassandra 5.0 node on
loopback, started once per run beside HDFS and the S3 server), reached with the stack's
credentials through tests/stores.py: a real server, so authentication is enforced and writes
keep the timestamps clients give them."""

from __future__ import annotations

import pytest

from tests.stores import cassandra_env, cassandra_keyspace, cassandra_session

# A fixed write time (microseconds since the epoch, as CQL's USING TIMESTAMP takes it).
WRITTEN_AT = 1_764_288_000_123_456


@pytest.fixture
def keyspace():
    with cassandra_keyspace() as (session, name):
        yield session, name


def test_the_node_is_cassandra_5_in_the_stacks_data_centre():
    with cassandra_session() as session:
        row = session.execute("SELECT release_version, data_center FROM system.local").one()
    assert row.release_version.startswith("5.0"), row.release_version
    assert row.data_center == cassandra_env().dc


def test_a_write_keeps_its_timestamp_and_the_latest_write_wins(keyspace):
    session, name = keyspace
    session.execute("CREATE TABLE deliveries (id text PRIMARY KEY, status text)")
    insert = "INSERT INTO deliveries (id, status) VALUES (%s, %s) USING TIMESTAMP %s"
    session.execute(insert, ("d-1", "delivered", WRITTEN_AT))
    # Written later but stamped earlier: Cassandra keeps the write with the higher timestamp.
    session.execute(insert, ("d-1", "picked up", WRITTEN_AT - 1))

    row = session.execute(
        f"SELECT status, writetime(status) AS written FROM {name}.deliveries WHERE id = %s",
        ("d-1",),
    ).one()

    assert (row.status, row.written) == ("delivered", WRITTEN_AT)


def test_a_wrong_password_is_refused():
    from cassandra import AuthenticationFailed
    from cassandra.cluster import NoHostAvailable

    with pytest.raises(NoHostAvailable) as refused, cassandra_session(password="not-it"):
        pass

    errors = list(refused.value.errors.values())
    assert errors, refused.value
    assert all(isinstance(error, AuthenticationFailed) for error in errors), errors
