"""The jobs' JVM side: jobs/java/*.java built into one jar, and the jars a driver needs.

    python -m jobs.jvm build     (./stack runs it; rebuilds only when a source changed)

The jar holds the Postgres sink's direct writer (jobs/java/PgCopyWriter.java), which runs in
the executors' JVM. It is compiled against the Spark jars shipped with pip's pyspark and
Debian's Postgres JDBC driver (libpostgresql-jdbc-java). Without the jar or the driver, jobs
still run: the sink uses its Python writer (slower, the same guarantees).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCES = Path(__file__).resolve().parent / "java"
BUILD = SOURCES / "build"
JAR = BUILD / "controlplane-spark.jar"
STAMP = BUILD / ".sources"
DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"
WRITER_CLASS = "controlplane.spark.PgCopyWriter"


def jdbc_jar() -> Path | None:
    path = Path(os.environ.get("CONTROLPLANE_JDBC_JAR", DEFAULT_JDBC_JAR))
    return path if path.is_file() else None


def spark_jars() -> list[str]:
    """What a driver adds to `spark.jars` (or spark-submit --jars): empty when either jar is
    missing, and the sink then writes from Python."""
    driver = jdbc_jar()
    if driver is None or not JAR.is_file():
        return []
    return [str(JAR), str(driver)]


def _sources_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCES.glob("*.java")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def build(force: bool = False) -> Path:
    """Compile jobs/java into JAR unless it is up to date; returns the jar's path."""
    import pyspark

    want = _sources_digest()
    if not force and JAR.is_file() and STAMP.is_file() and STAMP.read_text() == want:
        return JAR
    driver = jdbc_jar()
    if driver is None:
        raise RuntimeError(
            f"the Postgres JDBC driver is missing ({DEFAULT_JDBC_JAR}; Debian package"
            " libpostgresql-jdbc-java, or set CONTROLPLANE_JDBC_JAR)"
        )
    javac, jar = shutil.which("javac"), shutil.which("jar")
    if javac is None or jar is None:
        raise RuntimeError("javac and jar are missing (Debian package openjdk-17-jdk-headless)")
    classpath = os.pathsep.join([str(Path(pyspark.__file__).parent / "jars" / "*"), str(driver)])
    BUILD.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=BUILD) as tmp:
        classes = Path(tmp) / "classes"
        # Built from files of this checkout with tools found on PATH, no user input.
        subprocess.run(  # noqa: S603
            [javac, "--release", "17", "-nowarn", "-cp", classpath, "-d", str(classes)]
            + [str(p) for p in sorted(SOURCES.glob("*.java"))],
            check=True,
        )
        built = Path(tmp) / JAR.name
        subprocess.run([jar, "cf", str(built), "-C", str(classes), "."], check=True)  # noqa: S603
        built.replace(JAR)
    STAMP.write_text(want)
    return JAR


def main(argv: list[str]) -> int:
    if argv[:1] != ["build"]:
        print("usage: python -m jobs.jvm build [--force]", file=sys.stderr)
        return 2
    try:
        path = build(force="--force" in argv)
    except (RuntimeError, subprocess.CalledProcessError) as exc:
        print(f"jobs.jvm: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
