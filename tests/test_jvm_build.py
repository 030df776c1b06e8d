"""jobs.jvm: what the Maven build of jobs/java gives drivers (jobs/java/build/jars/)."""

from __future__ import annotations

import re
from pathlib import Path

import pyspark
import pytest

from jobs import jvm

KAFKA = {
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
}


def _artifact(jar: str) -> str:
    """A jar's artifact name: its file name up to the version (spark-sql-kafka-0-10_2.13)."""
    parts = Path(jar).name.removesuffix(".jar").split("-")
    for i, part in enumerate(parts):
        if i and re.fullmatch(r"\d+(\.\w+)+", part):
            return "-".join(parts[:i])
    raise AssertionError(f"no version in {jar}")


@pytest.fixture(scope="module")
def jars() -> list[str]:
    jvm.build()  # a no-op when up to date
    return jvm.spark_jars()


def test_the_writer_comes_first_then_the_jdbc_driver_and_the_kafka_connector(jars):
    assert jars[0] == str(jvm.JAR)
    assert {_artifact(jar) for jar in jars[1:]} == {"postgresql", *KAFKA}
    assert jvm.has_kafka_connector()
    assert {_artifact(jar) for jar in jvm.kafka_connector_jars()} == KAFKA
    assert f"spark-sql-kafka-0-10_2.13-{jvm.KAFKA_CONNECTOR_VERSION}.jar" in {
        Path(jar).name for jar in jvm.kafka_connector_jars()
    }


def test_no_jar_that_pyspark_ships_is_added_again(jars):
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert "scala-library" in shipped  # the names are parsed alike
    assert not {_artifact(jar) for jar in jars[1:]} & shipped


def test_an_up_to_date_build_runs_no_maven(jars, monkeypatch):
    monkeypatch.setattr(jvm, "_maven", lambda *args, **kwargs: pytest.fail("Maven ran"))
    assert jvm.build() == jvm.JAR
