package controlplane.spark;

import java.io.FileNotFoundException;
import java.io.IOException;
import java.io.InputStream;
import java.io.OutputStream;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.TreeMap;
import java.util.UUID;
import org.apache.avro.file.CodecFactory;
import org.apache.avro.file.DataFileConstants;
import org.apache.avro.file.DataFileStream;
import org.apache.avro.file.DataFileWriter;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.hadoop.conf.Configuration;
import org.apache.hadoop.fs.CommonPathCapabilities;
import org.apache.hadoop.fs.FSDataOutputStream;
import org.apache.hadoop.fs.FileAlreadyExistsException;
import org.apache.hadoop.fs.FileStatus;
import org.apache.hadoop.fs.FileSystem;
import org.apache.hadoop.fs.Path;
import org.apache.parquet.hadoop.ParquetFileReader;
import org.apache.parquet.hadoop.ParquetFileWriter;
import org.apache.parquet.hadoop.ParquetWriter;
import org.apache.parquet.hadoop.metadata.BlockMetaData;
import org.apache.parquet.hadoop.metadata.ParquetMetadata;
import org.apache.parquet.hadoop.util.HadoopInputFile;
import org.apache.parquet.hadoop.util.HadoopStreams;
import org.apache.parquet.io.OutputFile;
import org.apache.parquet.io.PositionOutputStream;
import org.apache.parquet.schema.MessageType;

/**
 * The files sink's file-system work in the driver (jobs/sinks/files.py), on Hadoop's
 * FileSystem, so any URI Spark writes to works: listing a batch's staged files, small
 * bookkeeping files written whole or not at all, and merging staged files into one finished
 * file without decoding a row.
 *
 * <p>A merge copies: JSON lines byte for byte, Avro blocks as they are ({@code
 * DataFileWriter.appendAllFrom}, no recompression), Parquet row groups as they are ({@code
 * ParquetFileReader.appendTo}: column chunks copied, not re-encoded). Every input must have
 * the output's schema (the caller groups staged files by the schema their batch wrote).
 *
 * <p>On an object store (S3A: its output streams can be aborted, and a file written appears
 * only when its stream is closed, whole) files are written under their final names: a rename
 * there is a copy and a delete, neither atomic nor cheap. See {@link #writesInPlace}.
 */
public final class FileSink {
  private FileSink() {}

  private static FileSystem fs(Path path, Configuration conf) throws IOException {
    return path.getFileSystem(conf);
  }

  /**
   * Whether files written under {@code path} appear only when their stream is closed, whole,
   * and an unfinished one can be aborted without a trace (S3A; not HDFS nor a local disk, where
   * a file being written is visible): then a file is written directly under its final name.
   */
  public static boolean writesInPlace(String path, Configuration conf) throws IOException {
    Path p = new Path(path);
    return inPlace(fs(p, conf), p);
  }

  static boolean inPlace(FileSystem fs, Path path) throws IOException {
    return fs.hasPathCapability(path, CommonPathCapabilities.ABORTABLE_STREAM);
  }

  /** Makes sure nothing of an unfinished output becomes visible: aborted where the file
   * system can (an object store's upload), then closed (releases an HDFS lease). */
  static void abandon(FSDataOutputStream out) {
    try {
      out.abort();
    } catch (UnsupportedOperationException notAbortable) {
      // HDFS, local disks: the partial file stays under its (hidden) name
    }
    try {
      out.close();
    } catch (IOException | RuntimeException ignored) {
      // the failure being handled is the one to report
    }
  }

  /** Whether a name is hidden from readers (Spark, pyarrow and Hive skip "_" and "."). */
  static boolean hidden(String name) {
    return name.startsWith("_") || name.startsWith(".");
  }

  /**
   * Every file under {@code dir}, recursively, as "relative path TAB bytes TAB where": names
   * hidden from readers, and everything under them, are left out (never entered: Spark's
   * {@code _temporary} trees change while a batch is written), but for a directory a {@link
   * StagingCommitter} wrote: there the committed task attempts' files are listed as if they
   * were in the directory itself ("where" is their own relative path; for any other file it is
   * the relative path). A directory that vanishes while listed, or is missing, has none.
   */
  public static String[] listFiles(String dir, Configuration conf) throws IOException {
    Path root = new Path(dir);
    List<String> out = new ArrayList<>();
    walk(fs(root, conf), root, "", "", out);
    return out.toArray(new String[0]);
  }

  private static void walk(FileSystem fs, Path dir, String prefix, String where, List<String> out)
      throws IOException {
    FileStatus[] found;
    try {
      found = fs.listStatus(dir);
    } catch (FileNotFoundException gone) {
      return;
    }
    for (FileStatus status : found) {
      String name = status.getPath().getName();
      if (name.equals(StagingCommitter.TASKS) && status.isDirectory()) {
        for (String attempt : committedAttempts(fs, status.getPath())) {
          String mine = StagingCommitter.ATTEMPTS + "/" + attempt;
          walk(fs, new Path(dir, mine), prefix, where + mine + "/", out);
        }
      } else if (hidden(name)) {
        continue;
      } else if (status.isDirectory()) {
        walk(fs, status.getPath(), prefix + name + "/", where + name + "/", out);
      } else {
        out.add(prefix + name + "\t" + status.getLen() + "\t" + where + name);
      }
    }
  }

  /** The attempts a {@link StagingCommitter}'s task records name, one per task (the latest
   * record of a task if there were two). */
  static List<String> committedAttempts(FileSystem fs, Path tasks) throws IOException {
    Map<String, FileStatus> latest = new TreeMap<>();
    FileStatus[] records;
    try {
      records = fs.listStatus(tasks);
    } catch (FileNotFoundException gone) {
      return List.of();
    }
    for (FileStatus record : records) {
      String name = record.getPath().getName();
      int cut = name.indexOf('=');
      if (cut <= 0 || hidden(name)) {
        continue; // not a record (a hidden temporary file of a local file system)
      }
      latest.merge(
          name.substring(0, cut),
          record,
          (a, b) -> b.getModificationTime() > a.getModificationTime() ? b : a);
    }
    List<String> attempts = new ArrayList<>();
    for (FileStatus record : latest.values()) {
      String name = record.getPath().getName();
      attempts.add(name.substring(name.indexOf('=') + 1));
    }
    return attempts;
  }

  /** A file's size in bytes. */
  public static long length(String path, Configuration conf) throws IOException {
    Path p = new Path(path);
    return fs(p, conf).getFileStatus(p).getLen();
  }

  /** The records a finished file holds (from Parquet's footer, Avro's block counts, JSON
   * lines), without decoding one. */
  public static long rows(String format, String path, Configuration conf) throws IOException {
    Path p = new Path(path);
    FileSystem fs = fs(p, conf);
    switch (format) {
      case "parquet":
        try (ParquetFileReader reader =
            ParquetFileReader.open(HadoopInputFile.fromPath(p, conf))) {
          return reader.getRecordCount();
        }
      case "avro":
        try (DataFileStream<Object> stream =
            new DataFileStream<>(fs.open(p), new GenericDatumReader<>())) {
          long rows = 0;
          while (stream.hasNext()) {
            stream.nextBlock();
            rows += stream.getBlockCount();
          }
          return rows;
        }
      case "json":
        long lines = 0;
        byte[] buffer = new byte[1 << 16];
        try (InputStream in = fs.open(p)) {
          int n;
          while ((n = in.read(buffer)) > 0) {
            for (int i = 0; i < n; i++) {
              if (buffer[i] == '\n') {
                lines++;
              }
            }
          }
        }
        return lines;
      default:
        throw new IllegalArgumentException("no row count for format " + format);
    }
  }

  /** The names of a directory's entries (hidden ones too); none if it does not exist. */
  public static String[] children(String dir, Configuration conf) throws IOException {
    Path root = new Path(dir);
    FileSystem fs = fs(root, conf);
    if (!fs.exists(root)) {
      return new String[0];
    }
    FileStatus[] found = fs.listStatus(root);
    String[] names = new String[found.length];
    for (int i = 0; i < found.length; i++) {
      names[i] = found[i].getPath().getName();
    }
    return names;
  }

  public static boolean exists(String path, Configuration conf) throws IOException {
    Path p = new Path(path);
    return fs(p, conf).exists(p);
  }

  /** A small file's text (UTF-8), or null when there is none. */
  public static String read(String path, Configuration conf) throws IOException {
    Path p = new Path(path);
    FileSystem fs = fs(p, conf);
    if (!fs.exists(p)) {
      return null;
    }
    try (InputStream in = fs.open(p)) {
      return new String(in.readAllBytes(), StandardCharsets.UTF_8);
    }
  }

  /**
   * Creates {@code path} with {@code text}, whole or not at all: written to a hidden file
   * beside it, then renamed (on an object store: under its name, visible on close). False (and
   * nothing changed) when the path exists already.
   */
  public static boolean create(String path, String text, Configuration conf) throws IOException {
    Path target = new Path(path);
    FileSystem fs = fs(target, conf);
    if (fs.exists(target)) {
      return false;
    }
    if (inPlace(fs, target)) {
      FSDataOutputStream out;
      try {
        out = fs.create(target, false); // S3A looks for the name once more
      } catch (FileAlreadyExistsException taken) {
        return false;
      }
      boolean written = false;
      try {
        out.write(text.getBytes(StandardCharsets.UTF_8));
        written = true;
      } finally {
        if (!written) {
          abandon(out);
        }
      }
      out.close(); // the upload: the file appears whole, or this throws and it does not
      return true;
    }
    Path temp = new Path(target.getParent(), "." + target.getName() + ".tmp-" + UUID.randomUUID());
    try (OutputStream out = fs.create(temp, false)) {
      out.write(text.getBytes(StandardCharsets.UTF_8));
    }
    return renameOrDiscard(fs, temp, target);
  }

  /** Moves a file into place (its directory made first); false if the target exists. */
  public static boolean rename(String from, String to, Configuration conf) throws IOException {
    Path source = new Path(from);
    Path target = new Path(to);
    FileSystem fs = fs(target, conf);
    if (fs.exists(target)) {
      return false;
    }
    fs.mkdirs(target.getParent());
    return renameOrDiscard(fs, source, target);
  }

  private static boolean renameOrDiscard(FileSystem fs, Path from, Path to) throws IOException {
    // Local file systems replace an existing target on rename, HDFS refuses: checked before,
    // so both keep the first file written.
    if (fs.exists(to)) {
      fs.delete(from, false);
      return false;
    }
    if (!fs.rename(from, to)) {
      fs.delete(from, false);
      if (fs.exists(to)) {
        return false;
      }
      throw new IOException("could not rename " + from + " to " + to);
    }
    return true;
  }

  public static boolean delete(String path, boolean recursive, Configuration conf)
      throws IOException {
    Path p = new Path(path);
    return fs(p, conf).delete(p, recursive);
  }

  /**
   * A roll's file: {@code inputs} merged into {@code output}; returns {bytes, rows} of it.
   * Where files are written in place (an object store) the merge writes {@code output} itself,
   * which appears on close, whole: a kill before leaves nothing under the name, and the roll's
   * plan, written ahead, makes the next driver merge the same inputs into the same name again
   * (a file there is replaced by one with the same rows). Elsewhere it merges into {@code
   * merging}, a hidden file, renamed into place once whole; an {@code output} there already
   * fails it. (The caller keeps a file it finds under the name: whole either way.)
   */
  public static long[] mergeInto(
      String format, String[] inputs, String merging, String output, Configuration conf)
      throws IOException {
    Path target = new Path(output);
    FileSystem fs = fs(target, conf);
    if (inPlace(fs, target)) {
      return merge(format, inputs, output, conf);
    }
    long[] merged = merge(format, inputs, merging, conf);
    if (!rename(merging, output, conf)) {
      throw new IOException(output + " appeared while " + merging + " was merged");
    }
    return merged;
  }

  /**
   * Merges {@code inputs} into {@code output} (replaced if it exists) in the sink's format;
   * returns {bytes, rows} of the output. A merge that fails leaves no file under the name on an
   * object store (its upload is aborted), a partial one elsewhere.
   */
  public static long[] merge(String format, String[] inputs, String output, Configuration conf)
      throws IOException {
    if (inputs.length == 0) {
      throw new IllegalArgumentException("nothing to merge into " + output);
    }
    if (!format.equals("json") && !format.equals("avro") && !format.equals("parquet")) {
      throw new IllegalArgumentException("no merge for format " + format);
    }
    Path out = new Path(output);
    FileSystem fs = fs(out, conf);
    FSDataOutputStream stream = fs.create(out, true);
    long rows;
    boolean done = false;
    try {
      switch (format) {
        case "json":
          rows = mergeLines(stream, inputs, conf);
          break;
        case "avro":
          mergeAvro(stream, inputs, conf);
          rows = -1;
          break;
        default:
          rows = mergeParquet(stream, fs.getDefaultBlockSize(out), inputs, conf);
      }
      done = true;
    } finally {
      if (!done) {
        abandon(stream);
      }
    }
    if (rows < 0) {
      rows = rows(format, output, conf);
    }
    return new long[] {fs.getFileStatus(out).getLen(), rows};
  }

  /** JSON lines: the inputs one after the other (a newline added where one lacks it); closes
   * {@code sink} once all are written. */
  static long mergeLines(FSDataOutputStream sink, String[] inputs, Configuration conf)
      throws IOException {
    long lines = 0;
    byte[] buffer = new byte[1 << 16];
    for (String input : inputs) {
      Path p = new Path(input);
      int last = '\n';
      try (InputStream in = fs(p, conf).open(p)) {
        int n;
        while ((n = in.read(buffer)) > 0) {
          sink.write(buffer, 0, n);
          for (int i = 0; i < n; i++) {
            if (buffer[i] == '\n') {
              lines++;
            }
          }
          last = buffer[n - 1];
        }
      }
      if (last != '\n') {
        sink.write('\n');
        lines++;
      }
    }
    sink.close();
    return lines;
  }

  /** Avro object container files: the inputs' blocks copied as they are; closes {@code sink}
   * once all are written (the caller abandons it on failure). */
  static void mergeAvro(FSDataOutputStream sink, String[] inputs, Configuration conf)
      throws IOException {
    DataFileWriter<Object> writer = new DataFileWriter<>(new GenericDatumWriter<>());
    boolean started = false;
    for (String input : inputs) {
      Path p = new Path(input);
      try (DataFileStream<Object> stream =
          new DataFileStream<>(fs(p, conf).open(p), new GenericDatumReader<>())) {
        if (!started) {
          String codec = stream.getMetaString(DataFileConstants.CODEC);
          writer.setCodec(CodecFactory.fromString(codec == null ? "null" : codec));
          for (String key : stream.getMetaKeys()) {
            if (!key.startsWith("avro.")) {
              writer.setMeta(key, stream.getMeta(key));
            }
          }
          writer.create(stream.getSchema(), sink);
          started = true;
        }
        writer.appendAllFrom(stream, false);
      }
    }
    writer.close(); // flushes the last block, closes sink
  }

  /** Spark's Parquet footer keys that say how to read every row group's dates. */
  private static final String[] LEGACY_KEYS = {
    "org.apache.spark.legacyDateTime", "org.apache.spark.legacyINT96"
  };

  /** Parquet's view of an output stream opened by the caller. */
  private static OutputFile outputFile(FSDataOutputStream stream, long blockSize) {
    return new OutputFile() {
      @Override
      public PositionOutputStream create(long blockSizeHint) {
        return HadoopStreams.wrap(stream);
      }

      @Override
      public PositionOutputStream createOrOverwrite(long blockSizeHint) {
        return HadoopStreams.wrap(stream);
      }

      @Override
      public boolean supportsBlockSize() {
        return blockSize > 0;
      }

      @Override
      public long defaultBlockSize() {
        return blockSize;
      }
    };
  }

  /** Parquet: the inputs' row groups copied as they are, under the first input's schema;
   * closes {@code sink} once all are written (the caller abandons it on failure). */
  static long mergeParquet(
      FSDataOutputStream sink, long blockSize, String[] inputs, Configuration conf)
      throws IOException {
    ParquetMetadata first;
    try (ParquetFileReader reader =
        ParquetFileReader.open(HadoopInputFile.fromPath(new Path(inputs[0]), conf))) {
      first = reader.getFooter();
    }
    MessageType schema = first.getFileMetaData().getSchema();
    Map<String, String> meta = first.getFileMetaData().getKeyValueMetaData();
    ParquetFileWriter writer =
        new ParquetFileWriter(
            outputFile(sink, blockSize),
            schema,
            ParquetFileWriter.Mode.OVERWRITE,
            ParquetWriter.DEFAULT_BLOCK_SIZE,
            ParquetWriter.MAX_PADDING_SIZE_DEFAULT);
    long rows = 0;
    boolean done = false;
    try {
      writer.start();
      for (String input : inputs) {
        try (ParquetFileReader reader =
            ParquetFileReader.open(HadoopInputFile.fromPath(new Path(input), conf))) {
          MessageType own = reader.getFooter().getFileMetaData().getSchema();
          if (!own.equals(schema)) {
            throw new IOException(input + " has another schema than " + inputs[0]);
          }
          Map<String, String> theirs = reader.getFooter().getFileMetaData().getKeyValueMetaData();
          for (String key : LEGACY_KEYS) {
            if (!java.util.Objects.equals(theirs.get(key), meta.get(key))) {
              // Spark reads every row group of a file with the file's rebase mode: merging
              // would shift old dates silently.
              throw new IOException(input + " was written with another " + key + " than " + inputs[0]);
            }
          }
          for (BlockMetaData block : reader.getRowGroups()) {
            rows += block.getRowCount();
          }
          reader.appendTo(writer);
        }
      }
      writer.end(meta); // closes sink
      done = true;
    } finally {
      if (!done) {
        abandon(sink); // before Parquet closes it: an object store publishes on close
        writer.abort();
      }
    }
    return rows;
  }
}
