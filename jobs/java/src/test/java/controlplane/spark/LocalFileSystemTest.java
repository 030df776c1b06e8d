package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.attribute.PosixFilePermissions;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.hadoop.fs.permission.FsPermission;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

class LocalFileSystemTest {
  @TempDir java.nio.file.Path dir;

  @Test
  void modesMapBitForBit() {
    assertEquals("rw-r--r--", PosixFilePermissions.toString(LocalFileSystem.posix((short) 0644)));
    assertEquals("rwx------", PosixFilePermissions.toString(LocalFileSystem.posix((short) 0700)));
    assertEquals("r-x-w---x", PosixFilePermissions.toString(LocalFileSystem.posix((short) 0521)));
  }

  @Test
  void createsRenamesAndSetsPermissionsInProcess() throws Exception {
    Configuration conf = new Configuration(false);
    conf.set("fs.file.impl", LocalFileSystem.class.getName());
    conf.setBoolean("fs.file.impl.disable.cache", true);
    FileSystem fs = FileSystem.get(java.net.URI.create("file:///"), conf);
    assertTrue(fs instanceof LocalFileSystem);
    Path temp = new Path(dir.toUri().toString(), ".0.tmp");
    try (FSDataOutputStream out = fs.create(temp, true)) {
      out.write("v1".getBytes(StandardCharsets.UTF_8));
    }
    Path done = new Path(dir.toUri().toString(), "0");
    assertTrue(fs.rename(temp, done));
    assertEquals("v1", Files.readString(dir.resolve("0")));
    fs.setPermission(done, new FsPermission((short) 0600));
    assertEquals("rw-------", PosixFilePermissions.toString(Files.getPosixFilePermissions(dir.resolve("0"))));
  }
}
