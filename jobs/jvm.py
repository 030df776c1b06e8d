"""The jobs' JVM side: the Maven module jobs/java, and the jars a driver needs.

    python -m jobs.jvm build [--force]   (./stack runs it; a no-op unless pom.xml or a source
                                          changed; then the drivers' class-data archive,
                                          unless it is up to date)
    python -m jobs.jvm test              (./stack test runs it: the module's JUnit tests)

`build` runs `mvn package` in jobs/java (jobs/java/pom.xml pins every version), which puts
every jar a driver adds to `spark.jars` in jobs/java/build/jars/: controlplane-spark.jar (the
sinks' writers that run in the executors' JVM: the Postgres sink's direct writer,
jobs/java/src/main/java/controlplane/spark/PgCopyWriter.java, and the Cassandra sink's,
CassandraWriter.java, with the Apache Cassandra Java driver shaded into the jar), the Postgres
JDBC driver, and Spark's Kafka connector with the jars it needs besides pyspark's own; and
controlplane-spark-hadoop.jar, which goes on the driver's class path (Hadoop's local file
system without a child process per file). The code is compiled against the jars pip's
pyspark ships, so nothing of Spark is downloaded. Maven fetches the rest from Maven Central
into ~/.m2 once; later builds run offline. Without the jars, jobs still run: the sink uses its
Python writer (slower, the same guarantees).
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "java"
POM = SOURCES / "pom.xml"
BUILD = SOURCES / "build"
JARS = BUILD / "jars"
JAR = JARS / "controlplane-spark.jar"
WRITER_CLASS = "controlplane.spark.PgCopyWriter"
# The Cassandra sink's writer: CassandraWriter.write(frame._jdf, config_json) -> long[]
# {rows written, statements executed}; failures name CassandraWriter$DefinitionException
# (permanent) or CassandraWriter$RetriesExhaustedException (transient past retry_seconds).
CASSANDRA_WRITER_CLASS = "controlplane.spark.CassandraWriter"
# Hadoop's `file:` file system that sets permissions in the JVM (the stock one runs `chmod`
# in a child process for each file it creates: two per batch for a streaming checkpoint).
HADOOP_JAR = JARS / "controlplane-spark-hadoop.jar"
LOCAL_FILE_SYSTEM = "controlplane.spark.LocalFileSystem"
LOG_CONFIG = Path(__file__).resolve().parent / "log4j2.properties"
FILE_SYSTEM_CHECKPOINTS = (
    "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager"
)
# What the jars in JARS were built from (see _inputs_digest), and the pom of the last test run
# that passed: Maven runs offline (-o) when ~/.m2 is known to hold what that pom needs.
STAMP = BUILD / ".built"
# The drivers' class-data archive (build_class_archive): the classes a driver's JVM loads
# when it starts, mapped from this file instead of being found, read and verified from the
# jars again by every driver; and what it was made from.
CLASS_ARCHIVE = BUILD / "cds" / "driver.jsa"
CLASS_ARCHIVE_STAMP = BUILD / "cds" / ".made"
WARMUP = Path(__file__).resolve().parent / "jvm_warmup.py"
TESTED = BUILD / ".tested"
_LOCK = BUILD / ".lock"
_MAVEN_OUT = BUILD / "maven"  # the pom's <build><directory>
_POM_NS = {"m": "http://maven.apache.org/POM/4.0.0"}


def _pom_property(name: str) -> str:
    root = ET.parse(POM).getroot()  # noqa: S314 (this checkout's own file)
    value = root.findtext(f"m:properties/m:{name}", namespaces=_POM_NS)
    if not value:
        raise RuntimeError(f"{POM} has no property {name}")
    return value.strip()


# Spark's Kafka connector (org.apache.spark:spark-sql-kafka-0-10_2.13), pinned in the pom.
KAFKA_CONNECTOR_VERSION = _pom_property("spark.kafka.version")
KAFKA_CONNECTOR_JAR = JARS / f"spark-sql-kafka-0-10_2.13-{KAFKA_CONNECTOR_VERSION}.jar"
# The connector's jar and those it needs that pyspark does not ship (names without version).
_KAFKA_ARTIFACTS = (
    "spark-sql-kafka-0-10_2.13",
    "spark-token-provider-kafka-0-10_2.13",
    "kafka-clients",
    "commons-pool2",
)


def spark_jars() -> list[str]:
    """What a driver adds to `spark.jars` (or spark-submit --jars): every jar of the build
    but HADOOP_JAR, controlplane-spark.jar first; empty when the build is missing, and the
    sink then writes from Python."""
    if not JAR.is_file():
        return []
    rest = sorted(str(p) for p in JARS.glob("*.jar") if p not in (JAR, HADOOP_JAR))
    return [str(JAR), *rest]


def driver_conf(class_archive: bool = True) -> dict[str, str]:
    """Spark settings every driver of ours gets, for checkpoints on the local file system
    that cost no child process: Spark's FileSystem-based checkpoint manager (FileContext's
    rename runs `readlink` in one for each file) and, when built, Hadoop's `file:` file
    system that sets permissions in the JVM (`LOCAL_FILE_SYSTEM`, on the driver's own class
    path: Hadoop loads it before `spark.jars` are). Measured on this 2-core machine, one
    query of empty-sink batches ran 10.2 batches/s with Spark's defaults, 44.5 with these.
    And its logging: warnings and where the UI listens (LOG_CONFIG), not every task. And,
    when made for this Java, pyspark and build (`class_archive`: for pip's pyspark's own
    spark-submit), the class-data archive its JVM starts from (build_class_archive)."""
    logging = f"-Dlog4j2.configurationFile={LOG_CONFIG.as_uri()}"
    driver_options = logging
    if class_archive and class_archive_ready():
        driver_options += f" -XX:SharedArchiveFile={CLASS_ARCHIVE}"
    conf = {
        "spark.sql.streaming.checkpointFileManagerClass": FILE_SYSTEM_CHECKPOINTS,
        "spark.driver.extraJavaOptions": driver_options,
        # Executors of a cluster (in local mode they are the driver's JVM): the same paths,
        # which a standalone cluster on this host reaches (docs/deployment.md: other hosts).
        "spark.executor.extraJavaOptions": logging,
    }
    if HADOOP_JAR.is_file():
        conf["spark.driver.extraClassPath"] = str(HADOOP_JAR)
        conf["spark.executor.extraClassPath"] = str(HADOOP_JAR)
        conf["spark.hadoop.fs.file.impl"] = LOCAL_FILE_SYSTEM
    return conf


def has_kafka_connector() -> bool:
    """Whether Spark's Kafka connector (format "kafka") is among spark_jars()."""
    return JAR.is_file() and KAFKA_CONNECTOR_JAR.is_file()


def kafka_connector_jars() -> list[str]:
    """The connector's jars among spark_jars() (empty without the connector)."""
    if not has_kafka_connector():
        return []
    return [
        jar
        for jar in spark_jars()
        if any(Path(jar).name.startswith(f"{name}-") for name in _KAFKA_ARTIFACTS)
    ]


def _digest(paths: list[Path], *extra: str) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(str(path.relative_to(SOURCES)).encode() + b"\0" + path.read_bytes() + b"\0")
    for item in extra:
        digest.update(item.encode() + b"\0")
    return digest.hexdigest()[:16]


def _pom_digest() -> str:
    return _digest([POM])


def _inputs_digest() -> str:
    """pom.xml, the main sources and pyspark's version (whose jars they are compiled against):
    the tests are not part of the jar."""
    main = sorted(p for p in (SOURCES / "src" / "main").rglob("*") if p.is_file())
    return _digest([POM, *main], "pyspark " + importlib.metadata.version("pyspark"))


@contextmanager
def _locked() -> Iterator[None]:
    """One Maven run at a time in this checkout (test sessions build concurrently)."""
    BUILD.mkdir(exist_ok=True)
    with _LOCK.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _pyspark_jars() -> Path:
    """pip's pyspark's jars, after checking they are the ones the pom names."""
    import pyspark

    want = _pom_property("pyspark.version")
    if pyspark.__version__ != want:
        raise RuntimeError(
            f"jobs/java/pom.xml compiles against pyspark {want}'s jars but pyspark"
            f" {pyspark.__version__} is installed: update the pom's pyspark.* properties"
            " (the jars' names in pyspark/jars/)"
        )
    return Path(pyspark.__file__).parent / "jars"


def _maven(goals: list[str], *, offline: bool, jars_dir: Path) -> None:
    """Run Maven quietly in jobs/java; on failure, its output goes to stderr."""
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError("Maven is missing (Debian packages maven and openjdk-17-jdk-headless)")
    command = [
        mvn, "-q", "-B", "-Dstyle.color=never", *(["-o"] if offline else []),
        "-f", str(POM),
        f"-Dpyspark.jars={_pyspark_jars()}",
        f"-Djars.dir={jars_dir}",
        *goals,
    ]  # fmt: skip
    # Built from files of this checkout with tools found on PATH, no user input.
    result = subprocess.run(command, cwd=SOURCES, capture_output=True, text=True, check=False)  # noqa: S603
    if result.returncode != 0:
        # Debian's Maven prints colour resets even with -B: dropped.
        sys.stderr.write(re.sub(r"\x1b\[[0-9;]*m", "", result.stdout + result.stderr))
        raise RuntimeError(f"{' '.join(['mvn', *goals])} failed in {SOURCES} (see above)")


def _install(new: Path) -> None:
    """Move the fresh build's jars into JARS one file at a time (each replaced atomically: a
    JVM still reading the old file keeps it), then drop jars the build no longer has."""
    JARS.mkdir(exist_ok=True)
    names = set()
    for path in new.glob("*.jar"):
        path.replace(JARS / path.name)
        names.add(path.name)
    for path in JARS.glob("*.jar"):
        if path.name not in names:
            path.unlink()
    shutil.rmtree(new)


def build(force: bool = False) -> Path:
    """Build jobs/java into JARS unless it is up to date; returns the writer jar's path."""

    def up_to_date(want: str) -> bool:
        return JAR.is_file() and STAMP.is_file() and STAMP.read_text().split()[1:] == [want]

    want = _inputs_digest()
    if not force and up_to_date(want):
        return JAR
    with _locked():
        if not force and up_to_date(want):  # built by another process meanwhile
            return JAR
        pom = _pom_digest()
        offline = STAMP.is_file() and STAMP.read_text().split()[:1] == [pom]
        new = BUILD / "jars.new"
        shutil.rmtree(new, ignore_errors=True)
        # clean: a class whose source went away must not stay in the jar. The tests are
        # `python -m jobs.jvm test`'s.
        _maven(["clean", "package", "-Dmaven.test.skip=true"], offline=offline, jars_dir=new)
        if not (new / JAR.name).is_file():
            raise RuntimeError(f"mvn package made no {JAR.name} in {new}")
        _install(new)
        STAMP.write_text(f"{pom} {want}\n")
        for legacy in (BUILD / "controlplane-spark.jar", BUILD / ".sources"):  # javac's build
            legacy.unlink(missing_ok=True)
    return JAR


def _java() -> Path | None:
    """The java spark-submit runs (JAVA_HOME's, else the one on PATH), resolved."""
    import os

    home = os.environ.get("JAVA_HOME")
    found = Path(home) / "bin" / "java" if home else shutil.which("java")
    return Path(found).resolve() if found and Path(found).exists() else None


def _class_archive_inputs() -> str:
    """What the archive depends on: the JVM (its binary), pyspark (its jars are the class
    path), and the driver's own class-path jar (HADOOP_JAR). Another of any: a new archive."""
    parts = [f"pyspark {importlib.metadata.version('pyspark')}"]
    for path in (_java(), HADOOP_JAR if HADOOP_JAR.is_file() else None):
        if path is None:
            parts.append("none")
            continue
        stat = path.stat()
        parts.append(f"{path} {stat.st_size} {stat.st_mtime_ns}")
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def class_archive_ready() -> bool:
    """Whether the drivers' class-data archive is there and made from what drivers run now."""
    return (
        CLASS_ARCHIVE.is_file()
        and CLASS_ARCHIVE_STAMP.is_file()
        and CLASS_ARCHIVE_STAMP.read_text().strip() == _class_archive_inputs()
    )


def _spark_submit(
    script: Path, arguments: list[str], java_options: str
) -> subprocess.CompletedProcess:
    """spark-submit (pip's pyspark's) of one of our scripts as a driver of ours runs, with
    these options added to its JVM's."""
    import os

    import pyspark

    conf = driver_conf(class_archive=False)
    conf["spark.driver.extraJavaOptions"] += f" {java_options}"
    command = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--master", "local[2]",
        "--driver-memory", "1g",
        "--conf", "spark.ui.enabled=false",
        *[a for k, v in conf.items() for a in ("--conf", f"{k}={v}")],
        *(["--jars", ",".join(jars)] if (jars := spark_jars()) else []),
        str(script), *arguments,
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
    # Our own script and paths of this checkout; no user input.
    return subprocess.run(  # noqa: S603
        command, env=env, capture_output=True, text=True, check=False, timeout=900
    )


def build_class_archive(force: bool = False) -> Path:
    """Make the drivers' class-data archive (AppCDS) unless it is up to date: a driver's
    start (jobs/jvm_warmup.py) run once with -XX:ArchiveClassesAtExit, the archive then
    checked by a second start that must map it (-Xshare:on). Drivers started from it load
    Spark's classes mapped from the archive instead of reading and verifying them from the
    jars: measured on this 2-core machine, a driver's start to its first batch of a rate
    source took 8.8 s (12.7 s of CPU) without it, 5.8 s (8.4 s of CPU) with it; the archive
    (~160 MiB) is mapped read-only, its pages shared by the drivers of a host."""
    import tempfile

    want = _class_archive_inputs()
    if not force and class_archive_ready():
        return CLASS_ARCHIVE
    with _locked():
        if not force and class_archive_ready():
            return CLASS_ARCHIVE
        CLASS_ARCHIVE.parent.mkdir(parents=True, exist_ok=True)
        new = CLASS_ARCHIVE.with_suffix(".new")
        new.unlink(missing_ok=True)
        with tempfile.TemporaryDirectory(prefix="cp-warmup-") as work:
            made = _spark_submit(WARMUP, [work], f"-XX:ArchiveClassesAtExit={new}")
            if made.returncode != 0 or not new.is_file():
                new.unlink(missing_ok=True)
                raise RuntimeError(
                    "the drivers' class-data archive was not made: "
                    + (made.stderr or made.stdout)[-2000:]
                )
        with tempfile.TemporaryDirectory(prefix="cp-warmup-") as work:
            checked = _spark_submit(
                WARMUP, [work, "--session-only"], f"-XX:SharedArchiveFile={new} -Xshare:on"
            )
        if checked.returncode != 0:
            new.unlink(missing_ok=True)
            raise RuntimeError(
                "the drivers' class-data archive does not map: "
                + (checked.stderr or checked.stdout)[-2000:]
            )
        new.replace(CLASS_ARCHIVE)
        CLASS_ARCHIVE_STAMP.write_text(want + "\n")
    return CLASS_ARCHIVE


def test() -> str:
    """Run jobs/java's unit tests; returns a one-line summary, raises RuntimeError on failure."""
    with _locked():
        pom = _pom_digest()
        offline = TESTED.is_file() and TESTED.read_text().strip() == pom
        reports = _MAVEN_OUT / "surefire-reports"
        shutil.rmtree(reports, ignore_errors=True)
        # `test` stops before packaging: JARS is not touched.
        _maven(["test"], offline=offline, jars_dir=BUILD / "jars.test")
        TESTED.write_text(pom + "\n")
    counts = [0, 0]
    for report in reports.glob("TEST-*.xml"):
        suite = ET.parse(report).getroot()  # noqa: S314 (written by Maven just now)
        counts[0] += int(suite.get("tests", 0))
        counts[1] += int(suite.get("skipped", 0))
    return f"jobs/java: {counts[0]} tests passed ({counts[1]} skipped)"


def main(argv: list[str]) -> int:
    command = argv[:1]
    if command not in (["build"], ["test"]):
        print("usage: python -m jobs.jvm build [--force] | test", file=sys.stderr)
        return 2
    try:
        print(build(force="--force" in argv) if command == ["build"] else test())
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        print(f"jobs.jvm: {exc}", file=sys.stderr)
        return 1
    if command == ["build"]:
        try:
            print(build_class_archive(force="--force" in argv))
        except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
            # Drivers start without it (slower, the same otherwise).
            print(f"jobs.jvm: warning: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
