package controlplane.spark;

import java.io.IOException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.mapreduce.JobContext;
import org.apache.hadoop.mapreduce.JobStatus;
import org.apache.hadoop.mapreduce.TaskAttemptContext;
import org.apache.hadoop.mapreduce.TaskAttemptID;
import org.apache.hadoop.mapreduce.lib.output.FileOutputCommitter;

/**
 * How the files sink stages a batch (jobs/sinks/files.py, {@code FileSink.stage}): nothing is
 * renamed. Each task attempt writes under its own directory, {@code <batch>/_attempts/<attempt
 * id>/}, and a committed attempt leaves one empty record, {@code <batch>/_tasks/<task
 * id>=<attempt id>}. The batch's files are the committed attempts' files ({@link
 * FileSink#listFiles}); an attempt that failed, or a zombie one still writing after its task
 * was given to another executor, is never among them, whatever it left.
 *
 * <p>Why: Spark's FileOutputCommitter renames every task's files twice (into the job's
 * directory, then into the output), and on an object store a rename is a copy and a delete:
 * staging 2 small files on S3 took ~6.5 s and ~115 requests, now a few PUTs. Hadoop's S3A
 * "magic" committer solves the same problem but Spark uses a committer's work path only when
 * it is a FileOutputCommitter (spark-hadoop-cloud's protocol, which binds the others, is not
 * published for our Spark); this is one. It needs nothing of the file system but writes,
 * listings and deletes, so it serves every store alike (local disk, HDFS, S3).
 *
 * <p>What makes the batch visible is not the job's commit but the batch's marker, written by
 * the driver after the write (and a replayed batch is written again from scratch: the write's
 * "overwrite" mode deletes the directory first). Only one attempt of a task is let commit
 * (Spark's output commit coordinator asks the driver, since {@link #needsTaskCommit} says yes);
 * should two records of one task ever exist, the later one counts, as in FileOutputCommitter.
 * Set for a write with the options {@code spark.sql.sources.outputCommitterClass} and {@code
 * spark.sql.parquet.output.committer.class}.
 */
public final class StagingCommitter extends FileOutputCommitter {
  /** The hidden directories of a staged batch (readers skip names starting with "_"). */
  public static final String ATTEMPTS = "_attempts";

  public static final String TASKS = "_tasks";

  private final Path output;
  private final Path attempt;

  public StagingCommitter(Path outputPath, TaskAttemptContext context) throws IOException {
    super(outputPath, context);
    this.output = getOutputPath();
    this.attempt = attemptPath(output, context.getTaskAttemptID());
  }

  public StagingCommitter(Path outputPath, JobContext context) throws IOException {
    super(outputPath, context);
    this.output = getOutputPath();
    this.attempt = null;
  }

  static Path attemptPath(Path output, TaskAttemptID id) {
    return new Path(new Path(output, ATTEMPTS), id.toString());
  }

  /** The record a committed attempt leaves: "task id=attempt id". */
  static String record(TaskAttemptID id) {
    return id.getTaskID() + "=" + id;
  }

  /** Where Spark writes this task attempt's files (the output's layout below it). */
  @Override
  public Path getWorkPath() {
    return attempt;
  }

  @Override
  public void setupJob(JobContext context) {
    // nothing to make: a directory appears with its first file (and costs a request on S3)
  }

  @Override
  public void setupTask(TaskAttemptContext context) {}

  @Override
  public boolean needsTaskCommit(TaskAttemptContext context) {
    return true; // so that Spark's coordinator lets one attempt of each task commit
  }

  @Override
  public void commitTask(TaskAttemptContext context) throws IOException {
    Path done = new Path(new Path(output, TASKS), record(context.getTaskAttemptID()));
    FileSystem fs = done.getFileSystem(context.getConfiguration());
    fs.create(done, true).close();
  }

  @Override
  public void abortTask(TaskAttemptContext context) {
    Path mine = attemptPath(output, context.getTaskAttemptID());
    try {
      mine.getFileSystem(context.getConfiguration()).delete(mine, true);
    } catch (IOException | RuntimeException ignored) {
      // uncommitted files are never read; the batch's directory goes as a whole later
    }
  }

  @Override
  public void commitJob(JobContext context) {
    // the driver's marker commits the batch (no _SUCCESS, no job directory to move)
  }

  @Override
  public void abortJob(JobContext context, JobStatus.State state) {
    // the batch is written again from scratch, or never read
  }

  @Override
  public void cleanupJob(JobContext context) {}

  @Override
  public boolean isRecoverySupported() {
    return false;
  }
}
