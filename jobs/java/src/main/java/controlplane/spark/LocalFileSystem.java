package controlplane.spark;

import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermission;
import java.util.EnumSet;
import java.util.Set;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.RawLocalFileSystem;
import org.apache.hadoop.fs.permission.FsPermission;

/**
 * Hadoop's local file system ({@code file:}) without a process per file written.
 *
 * <p>Without Hadoop's native library (pip's pyspark ships none), {@link RawLocalFileSystem}
 * sets the permission of every file it creates by running {@code chmod} in a child process:
 * a streaming query's checkpoint writes two files per batch (its offsets and its commit), so
 * a driver hosting fifty queries forked a few hundred processes a second. This one sets them
 * through java.nio, in the JVM. The launcher names it as {@code fs.file.impl} for every driver
 * (with Spark's FileSystem-based checkpoint manager, which renames through this class instead
 * of FileContext, whose rename runs {@code readlink} in a child process for each file).
 */
public final class LocalFileSystem extends org.apache.hadoop.fs.LocalFileSystem {
  public LocalFileSystem() {
    super(new Raw());
  }

  /** The raw (checksum-less) file system under {@link LocalFileSystem}. */
  public static final class Raw extends RawLocalFileSystem {
    @Override
    public void setPermission(Path p, FsPermission permission) throws IOException {
      if (permission.getStickyBit()) {
        super.setPermission(p, permission); // java.nio cannot set it; rare, so the slow way
        return;
      }
      Files.setPosixFilePermissions(pathToFile(p).toPath(), posix(permission.toShort()));
    }
  }

  private static final PosixFilePermission[] BITS = {
    PosixFilePermission.OTHERS_EXECUTE, PosixFilePermission.OTHERS_WRITE,
    PosixFilePermission.OTHERS_READ, PosixFilePermission.GROUP_EXECUTE,
    PosixFilePermission.GROUP_WRITE, PosixFilePermission.GROUP_READ,
    PosixFilePermission.OWNER_EXECUTE, PosixFilePermission.OWNER_WRITE,
    PosixFilePermission.OWNER_READ,
  };

  /** The java.nio form of a permission's rwx bits (bit 0 is others' execute). */
  static Set<PosixFilePermission> posix(short mode) {
    Set<PosixFilePermission> set = EnumSet.noneOf(PosixFilePermission.class);
    for (int bit = 0; bit < BITS.length; bit++) {
      if ((mode & (1 << bit)) != 0) {
        set.add(BITS[bit]);
      }
    }
    return set;
  }
}
