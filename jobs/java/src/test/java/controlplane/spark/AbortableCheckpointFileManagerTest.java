package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.util.stream.Stream;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.Abortable;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;
import org.apache.hadoop.util.Progressable;
import org.apache.spark.sql.execution.streaming.checkpointing.CheckpointFileManager.CancellableFSDataOutputStream;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/**
 * The checkpoint manager on a file system that behaves as an object store does for what it
 * relies on (S3A's block output stream): a file written is invisible until its stream is
 * closed, when it appears whole; an aborted stream publishes nothing; an upload can fail.
 */
class AbortableCheckpointFileManagerTest {
  @TempDir java.nio.file.Path dir;

  /** The local disk seen as an object store: uploads on close, abortable, may fail. */
  public static final class ObjectStore extends RawLocalFileSystem {
    static volatile boolean failNextUpload;
    static volatile int aborted;

    @Override
    public boolean hasPathCapability(Path path, String capability) throws IOException {
      return CommonPathCapabilities.ABORTABLE_STREAM.equals(capability)
          || super.hasPathCapability(path, capability);
    }

    @Override
    public FSDataOutputStream create(
        Path f,
        FsPermission permission,
        boolean overwrite,
        int bufferSize,
        short replication,
        long blockSize,
        Progressable progress)
        throws IOException {
      return create(f, overwrite, bufferSize, replication, blockSize, progress);
    }

    @Override
    public FSDataOutputStream create(
        Path f,
        boolean overwrite,
        int bufferSize,
        short replication,
        long blockSize,
        Progressable progress)
        throws IOException {
      if (!overwrite && exists(f)) {
        throw new FileAlreadyExistsException(f + " exists");
      }
      return new FSDataOutputStream(new Upload(pathToFile(f).toPath()), statistics);
    }

    static final class Upload extends ByteArrayOutputStream implements Abortable {
      private final java.nio.file.Path target;
      private boolean done;

      Upload(java.nio.file.Path target) {
        this.target = target;
      }

      @Override
      public synchronized void close() throws IOException {
        if (done) {
          return;
        }
        done = true;
        if (failNextUpload) {
          failNextUpload = false;
          throw new IOException("503 Slow Down");
        }
        Files.createDirectories(target.getParent());
        java.nio.file.Path part = target.resolveSibling(target.getFileName() + ".upload");
        Files.write(part, toByteArray());
        Files.move(part, target, java.nio.file.StandardCopyOption.REPLACE_EXISTING,
            java.nio.file.StandardCopyOption.ATOMIC_MOVE);
      }

      @Override
      public synchronized AbortableResult abort() {
        boolean wasDone = done;
        done = true;
        if (!wasDone) {
          aborted++;
        }
        return new AbortableResult() {
          @Override
          public boolean alreadyClosed() {
            return wasDone;
          }

          @Override
          public IOException anyCleanupException() {
            return null;
          }
        };
      }
    }
  }

  private Configuration conf;
  private Path root;

  @BeforeEach
  void objectStore() {
    conf = new Configuration(false);
    conf.set("fs.file.impl", ObjectStore.class.getName());
    conf.setBoolean("fs.file.impl.disable.cache", true);
    root = new Path(dir.toUri().toString());
    ObjectStore.failNextUpload = false;
    ObjectStore.aborted = 0;
  }

  private static byte[] bytes(String text) {
    return text.getBytes(StandardCharsets.UTF_8);
  }

  private String[] names() throws IOException {
    try (Stream<java.nio.file.Path> found = Files.list(dir)) {
      return found.map(p -> p.getFileName().toString()).sorted().toArray(String[]::new);
    }
  }

  @Test
  void aFileAppearsUnderItsNameOnCloseWithoutATemporaryFile() throws Exception {
    AbortableCheckpointFileManager manager = new AbortableCheckpointFileManager(root, conf);
    assertTrue(manager.writesInPlace());
    Path file = new Path(root, "0");
    CancellableFSDataOutputStream out = manager.createAtomic(file, false);
    out.write(bytes("v1\n{}"));
    assertArrayEquals(new String[0], names()); // nothing visible, no temporary file either
    out.close();
    assertArrayEquals(new String[] {"0"}, names());
    assertEquals("v1\n{}", Files.readString(dir.resolve("0")));
    out.cancel(); // after close: nothing to undo
    assertEquals("v1\n{}", Files.readString(dir.resolve("0")));
    assertEquals(0, ObjectStore.aborted);
  }

  @Test
  void cancelPublishesNothing() throws Exception {
    AbortableCheckpointFileManager manager = new AbortableCheckpointFileManager(root, conf);
    CancellableFSDataOutputStream out = manager.createAtomic(new Path(root, "1"), true);
    out.write(bytes("half"));
    out.cancel();
    out.close(); // a no-op once cancelled
    assertArrayEquals(new String[0], names());
    assertEquals(1, ObjectStore.aborted);
  }

  @Test
  void aFailedUploadFailsTheClose() throws Exception {
    // Spark's AbortableStreamBasedCheckpointFileManager logs this and goes on.
    AbortableCheckpointFileManager manager = new AbortableCheckpointFileManager(root, conf);
    CancellableFSDataOutputStream out = manager.createAtomic(new Path(root, "2"), false);
    out.write(bytes("offsets"));
    ObjectStore.failNextUpload = true;
    IOException failed = assertThrows(IOException.class, out::close);
    assertEquals("503 Slow Down", failed.getMessage());
    assertArrayEquals(new String[0], names());
  }

  @Test
  void aFileAnotherWriterCreatedMeanwhileIsKeptAndTheCloseFails() throws Exception {
    AbortableCheckpointFileManager manager = new AbortableCheckpointFileManager(root, conf);
    CancellableFSDataOutputStream out = manager.createAtomic(new Path(root, "3"), false);
    out.write(bytes("mine"));
    Files.writeString(dir.resolve("3"), "theirs");
    assertThrows(FileAlreadyExistsException.class, out::close);
    assertEquals("theirs", Files.readString(dir.resolve("3")));
    assertEquals(1, ObjectStore.aborted);
  }

  @Test
  void anExistingFileIsRefusedUnlessOverwriting() throws Exception {
    AbortableCheckpointFileManager manager = new AbortableCheckpointFileManager(root, conf);
    Files.writeString(dir.resolve("4"), "old");
    assertThrows(
        FileAlreadyExistsException.class, () -> manager.createAtomic(new Path(root, "4"), false));
    CancellableFSDataOutputStream out = manager.createAtomic(new Path(root, "4"), true);
    out.write(bytes("new"));
    assertEquals("old", Files.readString(dir.resolve("4")));
    out.close();
    assertEquals("new", Files.readString(dir.resolve("4")));
  }

  @Test
  void onAFileSystemThatCannotAbortItLeavesTheWritingToSparksRenames() throws Exception {
    // (Spark's own FileSystemBasedCheckpointFileManager then writes: tested by Spark.)
    Configuration local = new Configuration(false);
    local.set("fs.file.impl", RawLocalFileSystem.class.getName());
    local.setBoolean("fs.file.impl.disable.cache", true);
    assertFalse(new AbortableCheckpointFileManager(root, local).writesInPlace());
  }
}
