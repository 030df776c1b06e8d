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
# S3A's: hadoop-aws, and what it needs besides pyspark's jars, named with their group (the AWS
# SDK's artifact names are as plain as "utils").
S3A_GROUPS = (
    "software.amazon.awssdk",
    "software.amazon.eventstream",
    "software.amazon.s3.analyticsaccelerator",
    "org.reactivestreams",
    "org.wildfly.openssl",
)


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


def _s3a_dependency(artifact: str) -> bool:
    return artifact.startswith(tuple(f"{group}." for group in S3A_GROUPS))


def test_the_writer_comes_first_then_the_jdbc_driver_the_kafka_connector_avro_and_s3a(jars):
    assert jars[0] == str(jvm.JAR)
    artifacts = {_artifact(jar) for jar in jars[1:]}
    direct = {artifact for artifact in artifacts if not _s3a_dependency(artifact)}
    assert direct == {"postgresql", "spark-avro_2.13", "hadoop-aws", *KAFKA}
    s3a = artifacts - direct
    # The SDK modules S3A loads, not the whole SDK bundle (686 MB).
    assert {"software.amazon.awssdk.s3", "software.amazon.awssdk.sts"} <= s3a
    assert "software.amazon.awssdk.bundle" not in s3a
    assert len(s3a) < 60
    assert jvm.has_kafka_connector()
    assert {_artifact(jar) for jar in jvm.kafka_connector_jars()} == KAFKA
    assert f"spark-sql-kafka-0-10_2.13-{jvm.KAFKA_CONNECTOR_VERSION}.jar" in {
        Path(jar).name for jar in jvm.kafka_connector_jars()
    }


def test_no_jar_that_pyspark_ships_is_added_again(jars):
    shipped = {_artifact(p.name) for p in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    assert "scala-library" in shipped  # the names are parsed alike
    ours = {_artifact(jar) for jar in jars[1:]}
    # A group-prefixed name is compared by its artifact name too (netty, slf4j, httpclient...).
    ours |= {artifact.rsplit(".", 1)[-1] for artifact in ours if _s3a_dependency(artifact)}
    assert not ours & shipped


def test_an_up_to_date_build_runs_no_maven(jars, monkeypatch):
    monkeypatch.setattr(jvm, "_maven", lambda *args, **kwargs: pytest.fail("Maven ran"))
    assert jvm.build() == jvm.JAR


def test_drivers_write_checkpoints_through_our_file_system(spark, tmp_path):
    """conftest's session gets jvm.driver_conf() as every driver does: `file:` paths go
    through controlplane.spark.LocalFileSystem (no `chmod` process per file written) and
    checkpoints through Spark's FileSystem-based manager (no `readlink` process per rename)."""
    conf = jvm.driver_conf()
    assert conf["spark.hadoop.fs.file.impl"] == jvm.LOCAL_FILE_SYSTEM
    assert conf["spark.driver.extraClassPath"] == str(jvm.HADOOP_JAR)
    assert str(jvm.HADOOP_JAR) not in jvm.spark_jars()  # on the class path, not in spark.jars
    path = spark._jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri())
    fs = path.getFileSystem(spark._jsc.hadoopConfiguration())
    assert fs.getClass().getName() == jvm.LOCAL_FILE_SYSTEM
    assert spark.conf.get("spark.sql.streaming.checkpointFileManagerClass") == (
        jvm.FILE_SYSTEM_CHECKPOINTS
    )
    written = spark._jvm.org.apache.hadoop.fs.Path(tmp_path.as_uri() + "/0")
    out = fs.create(written, True)
    out.write(b"v1")
    out.close()
    assert (tmp_path / "0").read_bytes() == b"v1"
    assert oct((tmp_path / "0").stat().st_mode & 0o777) == oct(0o644 & ~_umask())


def _umask() -> int:
    import os

    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_drivers_start_from_the_class_data_archive_made_for_them(tmp_path, monkeypatch):
    """`python -m jobs.jvm build` makes the drivers' class-data archive (./stack runs it);
    every driver's conf names it while it was made from the Java, pyspark and build the
    drivers run, and a driver started with that conf maps it (-Xshare:on fails otherwise)."""
    assert jvm.class_archive_ready(), "run python -m jobs.jvm build (./stack does)"
    options = jvm.driver_conf()["spark.driver.extraJavaOptions"]
    assert f"-XX:SharedArchiveFile={jvm.CLASS_ARCHIVE}" in options.split()
    assert (
        "SharedArchiveFile"
        not in jvm.driver_conf(class_archive=False)["spark.driver.extraJavaOptions"]
    )
    checked = jvm._spark_submit(
        jvm.WARMUP,
        [str(tmp_path), "--session-only"],
        f"-XX:SharedArchiveFile={jvm.CLASS_ARCHIVE} -Xshare:on",
    )
    assert checked.returncode == 0, checked.stderr[-2000:]
    # Made from another build (its stamp differs): not used.
    stamp = tmp_path / "made"
    stamp.write_text("another build\n")
    monkeypatch.setattr(jvm, "CLASS_ARCHIVE_STAMP", stamp)
    assert not jvm.class_archive_ready()
    assert "SharedArchiveFile" not in jvm.driver_conf()["spark.driver.extraJavaOptions"]
