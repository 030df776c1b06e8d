package controlplane.spark;

import java.io.IOException;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager;

/**
 * Spark's checkpoint file manager for object stores (S3A): a checkpoint file is written
 * directly under its final name, and the store makes it visible only when the stream is
 * closed (one PUT, or a multipart upload's completion), whole or not at all. No temporary
 * file, no rename: S3A's rename is a copy and a delete, neither atomic nor cheap.
 *
 * <p>The same contract as Spark's {@code AbortableStreamBasedCheckpointFileManager}
 * (spark-hadoop-cloud, whose jar for Spark 4.1 is on Maven Central and loads in 4.3), with one
 * difference that matters for exactly once: Spark's logs and swallows a failure to close
 * (the upload failed: S3 answered 503, or went away) and a destination that appeared
 * meanwhile, so the streaming query goes on as if its offsets or commit were written. Here
 * both propagate: the batch fails, the upload is aborted, and the next run replays it.
 *
 * <p>Without a check-and-write in one request, a writer that loses a race to another one
 * would overwrite its file: the existence check before close narrows the window but cannot
 * close it. The control plane keeps one writer per checkpoint (the supervisor's fencing of
 * runs: one driver per pipeline at a time), which is what makes this safe.
 *
 * <p>On a file system whose output streams cannot be aborted (HDFS, local disks) it writes
 * the way {@link FileSystemBasedCheckpointFileManager} does (a temporary file, renamed), so a
 * session configured with it still works for checkpoints elsewhere.
 */
public class AbortableCheckpointFileManager extends FileSystemBasedCheckpointFileManager {
  private final boolean abortable;

  public AbortableCheckpointFileManager(Path path, Configuration hadoopConf) throws IOException {
    super(path, hadoopConf);
    this.abortable = fs().hasPathCapability(path, CommonPathCapabilities.ABORTABLE_STREAM);
  }

  /** Whether files are written in place (the file system's streams can be aborted). */
  public boolean writesInPlace() {
    return abortable;
  }

  @Override
  public CancellableFSDataOutputStream createAtomic(Path path, boolean overwriteIfPossible) {
    if (!abortable) {
      return super.createAtomic(path, overwriteIfPossible);
    }
    try {
      // S3A checks here that no file has the name (overwrite false), and writes nothing
      // visible until close.
      return new InPlace(fs(), fs().create(path, overwriteIfPossible), path, overwriteIfPossible);
    } catch (IOException e) {
      // Scala callers catch checked exceptions declared or not; Java needs a declaration
      // that the overridden method has not.
      throw sneaky(e);
    }
  }

  @SuppressWarnings("unchecked")
  private static <E extends Throwable> RuntimeException sneaky(Throwable e) throws E {
    throw (E) e;
  }

  /** A stream whose close publishes the file and whose cancel aborts the upload. */
  static final class InPlace extends CancellableFSDataOutputStream {
    private final FileSystem fs;
    private final FSDataOutputStream out;
    private final Path path;
    private final boolean overwrite;
    private boolean terminated;

    InPlace(FileSystem fs, FSDataOutputStream out, Path path, boolean overwrite) {
      super(out);
      this.fs = fs;
      this.out = out;
      this.path = path;
      this.overwrite = overwrite;
    }

    @Override
    public synchronized void close() throws IOException {
      if (terminated) {
        return;
      }
      terminated = true;
      boolean published = false;
      try {
        if (!overwrite && fs.exists(path)) {
          // Spark's metadata logs read this exception as "another query writes this
          // checkpoint" (and cancel, which is a no-op now: aborted below).
          throw new FileAlreadyExistsException(
              "Failed to close " + path + ": it was created by another writer meanwhile");
        }
        out.close(); // the upload: the file appears whole, or this throws
        published = true;
      } finally {
        if (!published) {
          abortQuietly();
        }
      }
    }

    @Override
    public synchronized void cancel() {
      if (terminated) {
        return;
      }
      terminated = true;
      abortQuietly();
    }

    /** Nothing of the file becomes visible (a multipart upload is aborted, not completed). */
    private void abortQuietly() {
      try {
        out.abort();
      } catch (RuntimeException | Error ignored) {
        // UnsupportedOperationException for a stream that cannot abort; the close below
        // then releases it.
      }
      try {
        out.close(); // after abort: releases the stream's buffers, uploads nothing
      } catch (IOException | RuntimeException ignored) {
        // the write failed already: its failure is what the caller reports
      }
    }

    @Override
    public String toString() {
      return "InPlace[" + path + "]";
    }
  }
}
