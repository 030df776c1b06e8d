"""controlplane.spark.StagingCommitter and FileSink.listFiles: a files sink's batch is staged
without renames; its files are the committed task attempts' files, never a failed or zombie
attempt's (the committer driven as Spark drives it, on the local disk; on HDFS and S3 the
sink's own tests in tests/test_storage_spark.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

JOB = "202611271200_0007"


@pytest.fixture
def jvm(spark):
    return spark._jvm


@pytest.fixture
def conf(spark):
    return spark._jsc.hadoopConfiguration()


def _context(jvm, conf, task: int, attempt: int):
    attempt_id = jvm.org.apache.hadoop.mapreduce.TaskAttemptID.forName(
        f"attempt_{JOB}_m_{task:06d}_{attempt}"
    )
    return jvm.org.apache.hadoop.mapreduce.task.TaskAttemptContextImpl(conf, attempt_id)


def _committer(jvm, conf, batch: Path, task: int, attempt: int):
    context = _context(jvm, conf, task, attempt)
    path = jvm.org.apache.hadoop.fs.Path(batch.as_uri())
    return jvm.controlplane.spark.StagingCommitter(path, context), context


def _write(work_path, relative: str, text: str) -> None:
    target = Path(work_path.toUri().getPath()) / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def _visible(directory: Path) -> list[str]:
    """A directory's entries, without the local file system's checksum files (.name.crc)."""
    return sorted(p.name for p in directory.iterdir() if not p.name.endswith(".crc"))


def _listed(jvm, conf, directory: Path) -> list[tuple[str, int, str]]:
    lines = jvm.controlplane.spark.FileSink.listFiles(directory.as_uri(), conf)
    out = []
    for line in lines:
        relative, size, where = line.split("\t")
        out.append((relative, int(size), where))
    return sorted(out)


def test_a_task_attempt_writes_under_its_own_directory_and_its_commit_leaves_a_record(
    jvm, conf, tmp_path
):
    batch = tmp_path / "q" / "0"
    committer, context = _committer(jvm, conf, batch, task=0, attempt=0)
    work = committer.getWorkPath()
    assert work.toUri().getPath() == str(batch / "_attempts" / f"attempt_{JOB}_m_000000_0")
    committer.setupJob(context)
    committer.setupTask(context)
    assert not batch.exists()  # nothing made before the first file
    _write(work, "p=1/part-00000.json", '{"id": 1}\n')
    # Written but not committed: not part of the batch.
    assert _listed(jvm, conf, tmp_path / "q") == []
    assert committer.needsTaskCommit(context)
    committer.commitTask(context)
    assert _visible(batch / "_tasks") == [f"task_{JOB}_m_000000=attempt_{JOB}_m_000000_0"]
    committer.commitJob(context)
    assert _visible(batch) == ["_attempts", "_tasks"]  # no _SUCCESS
    # Listed as if in the batch's directory, with where they are.
    assert _listed(jvm, conf, tmp_path / "q") == [
        ("0/p=1/part-00000.json", 10, f"0/_attempts/attempt_{JOB}_m_000000_0/p=1/part-00000.json")
    ]


def test_only_committed_attempts_count_and_an_aborted_attempt_leaves_nothing(jvm, conf, tmp_path):
    batch = tmp_path / "q" / "3"
    # Task 0: attempt 0 fails (aborted: its files deleted), attempt 1 commits.
    failed, failed_context = _committer(jvm, conf, batch, task=0, attempt=0)
    _write(failed.getWorkPath(), "part-00000.json", '{"id": "partial"}\n')
    failed.abortTask(failed_context)
    assert not Path(failed.getWorkPath().toUri().getPath()).exists()
    retry, retry_context = _committer(jvm, conf, batch, task=0, attempt=1)
    _write(retry.getWorkPath(), "part-00000.json", '{"id": 0}\n')
    retry.commitTask(retry_context)
    # Task 1: a zombie attempt (its executor lost, still writing) and the attempt that commits.
    zombie, _ = _committer(jvm, conf, batch, task=1, attempt=0)
    winner, winner_context = _committer(jvm, conf, batch, task=1, attempt=1)
    _write(winner.getWorkPath(), "part-00001.json", '{"id": 1}\n')
    winner.commitTask(winner_context)
    _write(zombie.getWorkPath(), "part-00001.json", '{"id": "zombie"}\n{"id": "zombie"}\n')
    # Hidden names and other files beside: never listed; plain directories are.
    (batch / "_temporary").mkdir()
    (batch / "_temporary" / "x.json").write_text("{}\n")
    plain = tmp_path / "q" / "4"
    plain.mkdir()
    (plain / "part-9.json").write_text('{"id": 9}\n')
    listed = _listed(jvm, conf, tmp_path / "q")
    assert [(relative, where.split("/")[2]) for relative, _, where in listed[:2]] == [
        ("3/part-00000.json", f"attempt_{JOB}_m_000000_1"),
        ("3/part-00001.json", f"attempt_{JOB}_m_000001_1"),
    ]
    assert listed[2] == ("4/part-9.json", 10, "4/part-9.json")
    assert len(listed) == 3
    for _, _, where in listed:
        assert "zombie" not in (tmp_path / "q" / where).read_text()


def test_two_records_of_one_task_the_later_one_counts(jvm, conf, tmp_path):
    import os

    batch = tmp_path / "q" / "0"
    first, first_context = _committer(jvm, conf, batch, task=0, attempt=0)
    _write(first.getWorkPath(), "part-0.json", '{"id": "first"}\n')
    first.commitTask(first_context)
    second, second_context = _committer(jvm, conf, batch, task=0, attempt=1)
    _write(second.getWorkPath(), "part-0.json", '{"id": "second"}\n')
    second.commitTask(second_context)
    records = [batch / "_tasks" / name for name in _visible(batch / "_tasks")]
    # The second record made older than the first: then the first one counts.
    os.utime(records[1], (1_000_000, 1_000_000))
    [(relative, _, where)] = _listed(jvm, conf, tmp_path / "q")
    assert relative == "0/part-0.json"
    assert (tmp_path / "q" / where).read_text() == '{"id": "first"}\n'
    os.utime(records[0], (500_000, 500_000))
    [(_, _, where)] = _listed(jvm, conf, tmp_path / "q")
    assert (tmp_path / "q" / where).read_text() == '{"id": "second"}\n'


def test_a_batch_staged_by_spark_is_written_without_a_rename(spark, tmp_path):
    """FilesStore.stage's write, on the local disk: the files land in committed attempts'
    directories, Spark's own _temporary tree and _SUCCESS are never made, and every row is in
    the listed files once."""
    from jobs.sinks.files import store as files

    frame = spark.range(0, 50, numPartitions=3).selectExpr("id", "id % 2 AS p")
    target = tmp_path / "q" / "0"
    (
        frame.write.mode("overwrite")
        .format("parquet")
        .option(files.OUTPUT_COMMITTER, files.STAGING_COMMITTER)
        .option(files.PARQUET_COMMITTER, files.STAGING_COMMITTER)
        .partitionBy("p")
        .save(str(target))
    )
    assert _visible(target) == ["_attempts", "_tasks"]
    assert len(_visible(target / "_tasks")) == 3
    listed = _listed(spark._jvm, spark._jsc.hadoopConfiguration(), tmp_path / "q")
    assert {relative.split("/")[1] for relative, _, _ in listed} == {"p=0", "p=1"}
    ids = []
    for _, _, where in listed:
        ids += [r.id for r in spark.read.parquet(str(tmp_path / "q" / where)).collect()]
    assert sorted(ids) == list(range(50))
