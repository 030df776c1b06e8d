package controlplane.spark;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.time.ZoneOffset;
import java.time.temporal.ChronoUnit;
import java.util.ArrayList;
import java.util.Collections;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.unsafe.types.UTF8String;
import org.postgresql.PGConnection;
import org.postgresql.copy.CopyIn;

/**
 * The direct path of jobs.sinks.postgres.store, in the executors' JVM: each task COPYs its Spark
 * partition into the target table, in one Postgres transaction with the partition's commit
 * marker, and writes the partition's dead letters in the same transaction. A task whose marker
 * exists (a retry, a replayed batch) writes nothing.
 *
 * <p>Rows go from Spark's internal rows straight to Postgres's binary COPY format, without the
 * hop through Arrow and a Python worker that the Python writer pays. Every SQL statement, the
 * column encodings and the connection come from the Python side (jobs/sinks/jvm_writer.py), as
 * one JSON document; this class holds no SQL of its own and never logs the connection.
 */
public final class PgCopyWriter
    implements FlatMapFunction<Iterator<InternalRow>, long[]>, Serializable {
  private static final long serialVersionUID = 1L;

  // Column encodings, as numbered in jobs/sinks/jvm_writer.py.
  static final int TEXT = 1, JSONB = 2, BYTEA = 3, BOOL = 4, INT2_FROM_BYTE = 5, INT2 = 6,
      INT4 = 7, INT8 = 8, FLOAT4 = 9, FLOAT8 = 10, DATE = 11, TIMESTAMP = 12, NUMERIC = 13;

  private static final long PG_EPOCH_US = 946_684_800_000_000L; // 2000-01-01 in Unix µs
  private static final int PG_EPOCH_DAYS = 10_957;
  private static final byte[] HEADER = {
    'P', 'G', 'C', 'O', 'P', 'Y', '\n', (byte) 0xff, '\r', '\n', 0, 0, 0, 0, 0, 0, 0, 0, 0
  };
  private static final int FLUSH_BYTES = 1 << 20;

  private final String url;
  private final Map<String, String> properties;
  private final String pipeline;
  private final String streamId;
  private final long batchId;
  private final String claimSql;
  private final String copySql;
  private final String rowsSql;
  private final String deadLetterSql;
  // Statements run in the task's transaction after its claim, before and after the COPY (an
  // upsert COPYs into a temporary table, then merges it into the target; a stage's slice is
  // locked and emptied first); none for an append. A `?` in one is the task's partition.
  private final List<String> beforeCopySql;
  private final List<String> afterCopySql;
  private final int[] ordinals; // of the target's columns, in the COPY's column order
  private final int[] encodings;
  private final int[] decimalPrecisions; // per column: Spark's decimal(p, s) (NUMERIC only)
  private final int[] decimalScales;
  private final int badOrdinal; // -1: no row is to be left out
  // topic, partition, offset, timestamp, value; none: rows flagged bad are counted, not kept
  private final int[] deadOrdinals;
  private final String parseError;
  private final String emptyValueError;
  // How long a task keeps trying to reach the database before it fails (an outage shorter
  // than this costs a pause; the write is idempotent, so Spark may also retry the task).
  private final long connectRetryMillis;

  @SuppressWarnings("unchecked")
  public PgCopyWriter(String json) throws Exception {
    Map<String, Object> c = new ObjectMapper().readValue(json, Map.class);
    url = (String) c.get("url");
    properties = (Map<String, String>) c.get("properties");
    pipeline = (String) c.get("pipeline");
    streamId = (String) c.get("stream_id");
    batchId = ((Number) c.get("batch_id")).longValue();
    claimSql = (String) c.get("claim_sql");
    copySql = (String) c.get("copy_sql");
    rowsSql = (String) c.get("rows_sql");
    deadLetterSql = (String) c.get("dead_letter_sql");
    beforeCopySql = strings(c.get("before_copy_sql"));
    afterCopySql = strings(c.get("after_copy_sql"));
    ordinals = ints(c.get("ordinals"));
    encodings = ints(c.get("encodings"));
    decimalPrecisions = ints(c.get("decimal_precisions"));
    decimalScales = ints(c.get("decimal_scales"));
    badOrdinal = ((Number) c.get("bad_ordinal")).intValue();
    deadOrdinals = ints(c.get("dead_ordinals"));
    parseError = (String) c.get("parse_error");
    emptyValueError = (String) c.get("empty_value_error");
    Object retry = c.get("connect_retry_seconds");
    connectRetryMillis = retry == null ? 0 : (long) (((Number) retry).doubleValue() * 1000);
  }

  // Per Spark partition, the number its commit marker is kept under: one that names the Kafka
  // offset range the partition reads, where it can be traced back to one without a shuffle.
  // Spark's connector plans a replayed batch anew, and leaves out ranges that became empty
  // (records deleted by retention meanwhile): the partitions after such a range then get
  // other indexes than the first time, and a marker kept under the index would let a
  // partition written the first time be written again. Null: Spark's partition index (a
  // shuffle's partitions, hashed by key into a pinned count; the Python reader, whose offset
  // log keeps each batch's cut).
  private int[] markers;

  static int[] stableMarkers(org.apache.spark.rdd.RDD<?> rdd) {
    int n = rdd.getNumPartitions();
    int[] out = new int[n];
    java.util.Map<String, Integer> seen = new java.util.HashMap<>();
    java.util.Set<Integer> used = new java.util.HashSet<>();
    for (int i = 0; i < n; i++) {
      String range = kafkaRange(rdd, i);
      if (range == null) {
        return null;
      }
      int occurrence = seen.merge(range, 1, Integer::sum); // a range read twice (UNION ALL)
      out[i] = (range + "#" + occurrence).hashCode() & 0x3fffffff;
      if (!used.add(out[i])) {
        return null; // two ranges on one number: keep Spark's indexes
      }
    }
    return out;
  }

  /** "topic-partition:from:until" of the Kafka range partition `index` of `rdd` reads. */
  static String kafkaRange(org.apache.spark.rdd.RDD<?> rdd, int index) {
    while (true) {
      if (rdd instanceof org.apache.spark.sql.execution.datasources.v2.DataSourceRDD) {
        Object partition = rdd.partitions()[index];
        scala.Option<?> only =
            ((org.apache.spark.sql.execution.datasources.v2.DataSourceRDDPartition) partition)
                .inputPartition();
        if (only.isEmpty()) {
          return null;
        }
        Object input = only.get();
        if (!input.getClass().getName().equals(
            "org.apache.spark.sql.kafka010.KafkaBatchInputPartition")) {
          return null;
        }
        try {
          Object range = input.getClass().getMethod("offsetRange").invoke(input);
          Class<?> kind = range.getClass();
          return kind.getMethod("topicPartition").invoke(range)
              + ":" + kind.getMethod("fromOffset").invoke(range)
              + ":" + kind.getMethod("untilOffset").invoke(range);
        } catch (ReflectiveOperationException e) {
          return null;
        }
      }
      org.apache.spark.rdd.RDD<?> parent = null;
      int parentIndex = -1;
      scala.collection.Iterator<?> deps = rdd.dependencies().iterator();
      while (deps.hasNext()) {
        Object dep = deps.next();
        if (!(dep instanceof org.apache.spark.NarrowDependency)) {
          return null; // a shuffle: no one range
        }
        scala.collection.Seq<Object> parents =
            ((org.apache.spark.NarrowDependency<?>) dep).getParents(index);
        if (parents.size() == 1 && parent == null) {
          parent = ((org.apache.spark.NarrowDependency<?>) dep).rdd();
          parentIndex = (Integer) parents.head();
        } else if (parents.size() > 0) {
          return null; // several parents: no one range
        }
      }
      if (parent == null) {
        return null;
      }
      rdd = parent;
      index = parentIndex;
    }
  }

  @SuppressWarnings("unchecked")
  private static List<String> strings(Object list) {
    return list == null ? Collections.emptyList() : (List<String>) list;
  }

  /** The `?` placeholders of a statement, those in quoted names and literals left out. */
  static int placeholders(String statement) {
    int count = 0;
    char quote = 0;
    for (char c : statement.toCharArray()) {
      if (quote != 0) {
        if (c == quote) {
          quote = 0; // a doubled quote closes and reopens: the same count
        }
      } else if (c == '"' || c == '\'') {
        quote = c;
      } else if (c == '?') {
        count++;
      }
    }
    return count;
  }

  /**
   * {rows, rows flagged bad at `badOrdinal` (-1: none)} of a partition written before (a
   * retry, a replayed batch): its rows are consumed and counted, none written.
   */
  static long[] count(Iterator<InternalRow> rows, int badOrdinal) {
    long written = 0, letters = 0;
    while (rows.hasNext()) {
      InternalRow row = rows.next();
      if (badOrdinal >= 0 && row.getBoolean(badOrdinal)) {
        letters++;
      } else {
        written++;
      }
    }
    return new long[] {written, letters};
  }

  /** Run each statement; every `?` in one is the task's partition number. */
  private static void execute(Connection conn, List<String> statements, int part)
      throws SQLException {
    for (String statement : statements) {
      try (PreparedStatement st = conn.prepareStatement(statement)) {
        for (int i = 1; i <= placeholders(statement); i++) {
          st.setInt(i, part);
        }
        st.execute();
      }
    }
  }

  private static int[] ints(Object list) {
    List<?> values = (List<?>) list;
    int[] out = new int[values.size()];
    for (int i = 0; i < out.length; i++) {
      out[i] = ((Number) values.get(i)).intValue();
    }
    return out;
  }

  /** Write every partition of the frame; returns {rows, dead letters} over all of them. */
  public static long[] write(Dataset<Row> frame, String json) throws Exception {
    PgCopyWriter writer = new PgCopyWriter(json);
    org.apache.spark.rdd.RDD<InternalRow> rdd = frame.queryExecution().toRdd();
    writer.markers = stableMarkers(rdd);
    List<long[]> parts = rdd.toJavaRDD().mapPartitions(writer).collect();
    long[] total = new long[2];
    for (long[] part : parts) {
      total[0] += part[0];
      total[1] += part[1];
    }
    return total;
  }

  // Idle connections kept in the executor's JVM between tasks (opening one costs more than a
  // small partition's COPY): at most MAX_IDLE in all, none idle longer than IDLE_MILLIS, each
  // checked before reuse; a connection that failed is closed, never kept.
  private static final int MAX_IDLE = 8;
  private static final long IDLE_MILLIS = 60_000;
  private static final java.util.ArrayDeque<Object[]> IDLE = new java.util.ArrayDeque<>();

  private String poolKey() {
    return url + "\u0000" + new java.util.TreeMap<>(properties);
  }

  Connection connect() throws SQLException {
    String key = poolKey();
    while (true) {
      Connection idle = null;
      synchronized (IDLE) {
        for (Iterator<Object[]> it = IDLE.iterator(); it.hasNext(); ) {
          Object[] entry = it.next();
          if (entry[0].equals(key)) {
            it.remove();
            idle = (Connection) entry[1];
            break;
          }
        }
      }
      if (idle == null) {
        break;
      }
      if (idle.isValid(2)) {
        return idle;
      }
      closeQuietly(idle);
    }
    Properties props = new Properties();
    props.putAll(properties);
    long deadline = System.currentTimeMillis() + connectRetryMillis;
    long delay = 500;
    while (true) {
      try {
        // The driver itself, not DriverManager: Spark loads this jar in a child class loader.
        Connection conn = new org.postgresql.Driver().connect(url, props);
        if (conn == null) {
          throw new SQLException("the Postgres JDBC driver does not accept the sink's URL");
        }
        return conn;
      } catch (SQLException e) {
        if (!databaseAway(e) || System.currentTimeMillis() + delay > deadline) {
          throw e;
        }
        System.err.println(
            "sink database unreachable, retrying in " + delay + " ms: " + e.getMessage());
        try {
          Thread.sleep(delay);
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw e;
        }
        delay = Math.min(delay * 2, 5_000);
      }
    }
  }

  /** The database is away (connection refused or broken, starting up, shutting down). */
  static boolean databaseAway(SQLException e) {
    String state = e.getSQLState();
    return state == null
        || state.startsWith("08")
        || state.equals("57P01")
        || state.equals("57P02")
        || state.equals("57P03");
  }

  private void release(Connection conn) {
    long now = System.currentTimeMillis();
    List<Connection> expired = new ArrayList<>();
    synchronized (IDLE) {
      IDLE.addFirst(new Object[] {poolKey(), conn, now});
      while (IDLE.size() > MAX_IDLE
          || (!IDLE.isEmpty() && now - (Long) IDLE.peekLast()[2] > IDLE_MILLIS)) {
        expired.add((Connection) IDLE.pollLast()[1]);
      }
    }
    expired.forEach(PgCopyWriter::closeQuietly);
  }

  private static void closeQuietly(Connection conn) {
    try {
      conn.close();
    } catch (SQLException ignored) {
      // already broken: nothing to release
    }
  }

  @Override
  public Iterator<long[]> call(Iterator<InternalRow> rows) throws Exception {
    int index = TaskContext.getPartitionId();
    int part = markers == null ? index : markers[index];
    Connection conn = connect();
    try {
      conn.setAutoCommit(false);
      long[] result = writePartition(conn, part, rows);
      conn.commit();
      release(conn);
      return Collections.singletonList(result).iterator();
    } catch (Exception e) {
      try {
        conn.rollback();
      } catch (SQLException ignored) {
        // the connection is gone; closing it below is all that is left
      }
      closeQuietly(conn);
      throw e;
    }
  }

  private boolean claim(Connection conn, int part) throws SQLException {
    try (PreparedStatement st = conn.prepareStatement(claimSql)) {
      st.setString(1, pipeline);
      st.setString(2, streamId);
      st.setLong(3, batchId);
      st.setInt(4, part);
      st.setLong(5, 0);
      try (ResultSet rs = st.executeQuery()) {
        return rs.next();
      }
    }
  }

  private long[] writePartition(Connection conn, int part, Iterator<InternalRow> rows)
      throws Exception {
    long written = 0;
    long skipped = 0;
    List<Object[]> dead = new ArrayList<>();
    // No claim: a stage's slice, replaced by each attempt (its statements say how).
    if (claimSql != null && !claim(conn, part)) {
      // A retry or a replay: Spark still computes the rows; count them, write none.
      return count(rows, badOrdinal);
    }
    execute(conn, beforeCopySql, part);
    CopyIn copy = ((PGConnection) conn.unwrap(PGConnection.class)).getCopyAPI().copyIn(copySql);
    try {
      Buffer buf = new Buffer(FLUSH_BYTES + (FLUSH_BYTES >> 2));
      buf.bytes(HEADER, HEADER.length);
      while (rows.hasNext()) {
        InternalRow row = rows.next();
        if (badOrdinal >= 0 && row.getBoolean(badOrdinal)) {
          if (deadOrdinals.length == 0) {
            skipped++; // counted only: the caller fetches these dead letters itself
          } else {
            dead.add(deadLetter(row));
          }
          continue;
        }
        encode(row, buf);
        written++;
        if (buf.size >= FLUSH_BYTES) {
          copy.writeToCopy(buf.data, 0, buf.size);
          buf.size = 0;
        }
      }
      buf.int16(-1);
      copy.writeToCopy(buf.data, 0, buf.size);
      copy.endCopy();
    } finally {
      if (copy.isActive()) {
        copy.cancelCopy();
      }
    }
    execute(conn, afterCopySql, part);
    if (!dead.isEmpty()) {
      try (PreparedStatement st = conn.prepareStatement(deadLetterSql)) {
        for (Object[] letter : dead) {
          st.setString(1, pipeline);
          st.setLong(2, batchId);
          st.setString(3, (String) letter[0]);
          st.setInt(4, (Integer) letter[1]);
          st.setLong(5, (Long) letter[2]);
          st.setBytes(6, (byte[]) letter[4]);
          st.setString(7, letter[5] != null ? (String) letter[5]
              : letter[4] == null ? emptyValueError : parseError);
          if (letter[3] == null) {
            st.setNull(8, Types.TIMESTAMP_WITH_TIMEZONE);
          } else {
            st.setObject(8, letter[3]);
          }
          st.addBatch();
        }
        st.executeBatch();
      }
    }
    if (rowsSql != null) {
      try (PreparedStatement st = conn.prepareStatement(rowsSql)) {
        st.setLong(1, written);
        st.setString(2, pipeline);
        st.setString(3, streamId);
        st.setLong(4, batchId);
        st.setInt(5, part);
        st.executeUpdate();
      }
    }
    return new long[] {written, dead.size() + skipped};
  }

  private Object[] deadLetter(InternalRow row) {
    int topic = deadOrdinals[0], partition = deadOrdinals[1], offset = deadOrdinals[2];
    int stamp = deadOrdinals[3], value = deadOrdinals[4];
    return new Object[] {
      row.isNullAt(topic) ? null : row.getUTF8String(topic).toString(),
      row.getInt(partition),
      row.getLong(offset),
      row.isNullAt(stamp)
          ? null
          : OffsetDateTime.ofInstant(
              Instant.EPOCH.plus(row.getLong(stamp), ChronoUnit.MICROS), ZoneOffset.UTC),
      row.isNullAt(value) ? null : row.getBinary(value),
      reason(row, deadOrdinals),
    };
  }

  /** Why a record did not parse, where its parser said (the 6th dead-letter column), else null. */
  static String reason(InternalRow row, int[] deadOrdinals) {
    if (deadOrdinals.length < 6 || row.isNullAt(deadOrdinals[5])) {
      return null;
    }
    return row.getUTF8String(deadOrdinals[5]).toString();
  }

  /** One row in binary COPY form: a field count, then per field a length and its bytes. */
  void encode(InternalRow row, Buffer buf) {
    buf.int16(ordinals.length);
    for (int i = 0; i < ordinals.length; i++) {
      int o = ordinals[i];
      if (row.isNullAt(o)) {
        buf.int32(-1);
        continue;
      }
      switch (encodings[i]) {
        case TEXT:
          {
            UTF8String s = row.getUTF8String(o);
            buf.int32(s.numBytes());
            buf.utf8(s);
            break;
          }
        case JSONB:
          {
            UTF8String s = row.getUTF8String(o);
            buf.int32(s.numBytes() + 1);
            buf.int8(1); // jsonb's binary version
            buf.utf8(s);
            break;
          }
        case BYTEA:
          {
            byte[] b = row.getBinary(o);
            buf.int32(b.length);
            buf.bytes(b, b.length);
            break;
          }
        case BOOL:
          buf.int32(1);
          buf.int8(row.getBoolean(o) ? 1 : 0);
          break;
        case INT2_FROM_BYTE:
          buf.int32(2);
          buf.int16(row.getByte(o));
          break;
        case INT2:
          buf.int32(2);
          buf.int16(row.getShort(o));
          break;
        case INT4:
          buf.int32(4);
          buf.int32(row.getInt(o));
          break;
        case INT8:
          buf.int32(8);
          buf.int64(row.getLong(o));
          break;
        case FLOAT4:
          buf.int32(4);
          buf.int32(Float.floatToRawIntBits(row.getFloat(o)));
          break;
        case FLOAT8:
          buf.int32(8);
          buf.int64(Double.doubleToRawLongBits(row.getDouble(o)));
          break;
        case DATE:
          buf.int32(4);
          buf.int32(row.getInt(o) - PG_EPOCH_DAYS);
          break;
        case TIMESTAMP:
          buf.int32(8);
          buf.int64(row.getLong(o) - PG_EPOCH_US);
          break;
        case NUMERIC:
          numeric(row.getDecimal(o, decimalPrecisions[i], decimalScales[i]).toJavaBigDecimal(), buf);
          break;
        default:
          throw new IllegalStateException("unknown column encoding " + encodings[i]);
      }
    }
  }

  /**
   * Postgres's numeric_send form: int16 ndigits, weight, sign, dscale, then base-10000
   * digits, the first of which multiplies 10000^weight.
   */
  static void numeric(BigDecimal value, Buffer buf) {
    int sign = value.signum() < 0 ? 0x4000 : 0;
    BigDecimal abs = value.abs();
    int dscale = Math.max(abs.scale(), 0);
    // Scale up to a multiple of 4 decimal places: the unscaled integer's base-10000 digits
    // are then the numeric's digits, the last `fractionGroups` of them after the point.
    int fractionGroups = (dscale + 3) / 4;
    BigInteger unscaled = abs.setScale(fractionGroups * 4).unscaledValue();
    List<Integer> digits = new ArrayList<>();
    BigInteger tenThousand = BigInteger.valueOf(10_000);
    while (unscaled.signum() > 0) {
      BigInteger[] qr = unscaled.divideAndRemainder(tenThousand);
      digits.add(qr[1].intValue());
      unscaled = qr[0];
    }
    Collections.reverse(digits);
    int weight = digits.size() - fractionGroups - 1;
    int end = digits.size();
    while (end > 0 && digits.get(end - 1) == 0) {
      end--; // trailing zero digits are implied
    }
    int start = 0;
    while (start < end && digits.get(start) == 0) {
      start++; // as are leading ones, which lower the weight
      weight--;
    }
    int n = end - start;
    if (n == 0) {
      weight = 0;
      sign = 0;
    }
    buf.int32(8 + 2 * n);
    buf.int16(n);
    buf.int16(weight);
    buf.int16(sign);
    buf.int16(dscale);
    for (int i = start; i < end; i++) {
      buf.int16(digits.get(i));
    }
  }

  /** A growable big-endian byte buffer. */
  static final class Buffer {
    byte[] data;
    int size;

    Buffer(int capacity) {
      data = new byte[capacity];
    }

    private void room(int n) {
      if (size + n > data.length) {
        data = java.util.Arrays.copyOf(data, Math.max(data.length * 2, size + n));
      }
    }

    void int8(int v) {
      room(1);
      data[size++] = (byte) v;
    }

    void int16(int v) {
      room(2);
      data[size++] = (byte) (v >>> 8);
      data[size++] = (byte) v;
    }

    void int32(int v) {
      room(4);
      data[size++] = (byte) (v >>> 24);
      data[size++] = (byte) (v >>> 16);
      data[size++] = (byte) (v >>> 8);
      data[size++] = (byte) v;
    }

    void int64(long v) {
      int32((int) (v >>> 32));
      int32((int) v);
    }

    void bytes(byte[] b, int n) {
      room(n);
      System.arraycopy(b, 0, data, size, n);
      size += n;
    }

    void utf8(UTF8String s) {
      int n = s.numBytes();
      room(n);
      s.writeToMemory(data, org.apache.spark.unsafe.Platform.BYTE_ARRAY_OFFSET + size);
      size += n;
    }
  }
}
