package controlplane.spark;

import com.datastax.oss.driver.api.core.AllNodesFailedException;
import com.datastax.oss.driver.api.core.CqlIdentifier;
import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.CqlSessionBuilder;
import com.datastax.oss.driver.api.core.DefaultConsistencyLevel;
import com.datastax.oss.driver.api.core.DriverTimeoutException;
import com.datastax.oss.driver.api.core.NoNodeAvailableException;
import com.datastax.oss.driver.api.core.NodeUnavailableException;
import com.datastax.oss.driver.api.core.RequestThrottlingException;
import com.datastax.oss.driver.api.core.config.DefaultDriverOption;
import com.datastax.oss.driver.api.core.config.DriverConfigLoader;
import com.datastax.oss.driver.api.core.connection.BusyConnectionException;
import com.datastax.oss.driver.api.core.connection.ClosedConnectionException;
import com.datastax.oss.driver.api.core.connection.ConnectionInitException;
import com.datastax.oss.driver.api.core.connection.HeartbeatException;
import com.datastax.oss.driver.api.core.cql.AsyncResultSet;
import com.datastax.oss.driver.api.core.cql.BatchStatement;
import com.datastax.oss.driver.api.core.cql.BatchType;
import com.datastax.oss.driver.api.core.cql.BoundStatement;
import com.datastax.oss.driver.api.core.cql.BoundStatementBuilder;
import com.datastax.oss.driver.api.core.cql.ColumnDefinitions;
import com.datastax.oss.driver.api.core.cql.PreparedStatement;
import com.datastax.oss.driver.api.core.cql.SimpleStatement;
import com.datastax.oss.driver.api.core.cql.Statement;
import com.datastax.oss.driver.api.core.data.CqlDuration;
import com.datastax.oss.driver.api.core.data.CqlVector;
import com.datastax.oss.driver.api.core.data.SettableByIndex;
import com.datastax.oss.driver.api.core.servererrors.BootstrappingException;
import com.datastax.oss.driver.api.core.servererrors.CDCWriteFailureException;
import com.datastax.oss.driver.api.core.servererrors.OverloadedException;
import com.datastax.oss.driver.api.core.servererrors.ReadTimeoutException;
import com.datastax.oss.driver.api.core.servererrors.ServerError;
import com.datastax.oss.driver.api.core.servererrors.TruncateException;
import com.datastax.oss.driver.api.core.servererrors.UnavailableException;
import com.datastax.oss.driver.api.core.servererrors.WriteFailureException;
import com.datastax.oss.driver.api.core.servererrors.WriteTimeoutException;
import com.datastax.oss.driver.api.core.metadata.EndPoint;
import com.datastax.oss.driver.api.core.ssl.SslEngineFactory;
import com.datastax.oss.driver.api.core.type.DataType;
import com.datastax.oss.driver.api.core.type.ListType;
import com.datastax.oss.driver.api.core.type.MapType;
import com.datastax.oss.driver.api.core.type.SetType;
import com.datastax.oss.driver.api.core.type.TupleType;
import com.datastax.oss.driver.api.core.type.UserDefinedType;
import com.datastax.oss.driver.api.core.type.VectorType;
import com.datastax.oss.driver.api.core.type.codec.TypeCodec;
import com.datastax.oss.driver.api.core.type.codec.registry.CodecRegistry;
import com.datastax.oss.protocol.internal.ProtocolConstants;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.Serializable;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.net.InetAddress;
import java.net.UnknownHostException;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.GeneralSecurityException;
import java.security.KeyFactory;
import java.security.KeyStore;
import java.security.MessageDigest;
import java.security.PrivateKey;
import java.security.cert.Certificate;
import java.security.cert.CertificateException;
import java.security.cert.CertificateFactory;
import java.security.cert.X509Certificate;
import java.security.spec.PKCS8EncodedKeySpec;
import java.time.Duration;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.Period;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.Collections;
import java.util.HexFormat;
import java.util.Iterator;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.CompletionException;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.ScheduledExecutorService;
import java.util.concurrent.ScheduledThreadPoolExecutor;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.Supplier;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import javax.net.ssl.KeyManager;
import javax.net.ssl.KeyManagerFactory;
import javax.net.ssl.SSLContext;
import javax.net.ssl.TrustManagerFactory;
import javax.net.ssl.X509ExtendedTrustManager;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.encoders.ExpressionEncoder;
import org.apache.spark.sql.types.StructType;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * The Cassandra sink's writer, in the executors' JVM: each Spark task writes its partition
 * with one prepared {@code INSERT ... USING TIMESTAMP ? [AND TTL ?]}, asynchronously, at most
 * {@code max_in_flight} requests at a time, routed token-aware to the local datacenter's
 * replicas. Rows of one partition key go together in UNLOGGED batches of at most
 * {@code max_batch_rows}; a lone row goes as a plain bound statement.
 *
 * <p>Called from Python as {@code CassandraWriter.write(frame._jdf, json)}, which returns
 * {rows written, statements executed} over all partitions. The configuration (see {@link
 * Config#parse}) comes from the Python side as one JSON document; neither it nor the password
 * is ever logged or put in a message.
 *
 * <p>Failures: transient ones (no node reachable, timeouts, unavailable or overloaded
 * replicas, closed or busy connections) are retried with exponential backoff, 100 ms to 5 s,
 * until {@code retry_seconds} have passed since a statement's first failure; then the task
 * fails with {@link RetriesExhaustedException}. Permanent ones (the table or a column does
 * not exist, no permission, bad credentials, a value that does not convert to its column's
 * CQL type) fail the task at once with {@link DefinitionException}. Either way the driver's
 * exception is the cause, so its class name shows in the failure's text.
 *
 * <p>Writes are upserts with an explicit write time: a retried or replayed write leaves the
 * same cells, so a task Spark runs again does no harm.
 */
public final class CassandraWriter implements FlatMapFunction<Iterator<Row>, long[]>, Serializable {
  private static final long serialVersionUID = 1L;
  private static final Logger LOG = LoggerFactory.getLogger(CassandraWriter.class);

  /** The write cannot succeed as defined (a permanent failure): the message says why. */
  public static final class DefinitionException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public DefinitionException(String message) {
      super(message);
    }

    public DefinitionException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** Transient failures that lasted longer than retry_seconds (Cassandra away). */
  public static final class RetriesExhaustedException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RetriesExhaustedException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  static final long FIRST_DELAY_MS = 100;
  static final long MAX_DELAY_MS = 5_000;
  // Rows a task holds back to find more of a partition key before it sends what it holds
  // (without an order column; with one, the whole partition is held to keep the last row of
  // each primary key).
  static final int WINDOW_ROWS = 16_384;

  private final Config config;

  CassandraWriter(Config config) {
    this.config = config;
  }

  /**
   * Write every partition of `frame`; returns {rows written, statements executed}. The frame's
   * own query execution runs (its rows deserialized here, per partition), as PgCopyWriter's
   * does: metrics observed on the frame (Dataset.observe: the records that did not parse) are
   * then the frame's, which the Python side reads back.
   */
  public static long[] write(Dataset<Row> frame, String configJson) {
    Config config = Config.parse(configJson);
    StructType schema = frame.schema();
    config.checkFields(schema.fieldNames());
    List<long[]> parts = frame.queryExecution().toRdd().toJavaRDD()
        .mapPartitions(new FromInternalRows(new CassandraWriter(config), schema))
        .collect();
    long[] total = new long[2];
    for (long[] part : parts) {
      total[0] += part[0];
      total[1] += part[1];
    }
    return total;
  }

  /** A partition of Spark's internal rows, turned into Rows for the writer. */
  static final class FromInternalRows
      implements FlatMapFunction<Iterator<InternalRow>, long[]>, Serializable {
    private static final long serialVersionUID = 1L;
    private final CassandraWriter writer;
    private final StructType schema;

    FromInternalRows(CassandraWriter writer, StructType schema) {
      this.writer = writer;
      this.schema = schema;
    }

    @Override
    public Iterator<long[]> call(Iterator<InternalRow> rows) throws Exception {
      ExpressionEncoder<Row> encoder = ExpressionEncoder.apply(schema);
      ExpressionEncoder.Deserializer<Row> rowOf = encoder
          .resolveAndBind(encoder.resolveAndBind$default$1(), encoder.resolveAndBind$default$2())
          .createDeserializer();
      return writer.call(new Iterator<Row>() {
        @Override
        public boolean hasNext() {
          return rows.hasNext();
        }

        @Override
        public Row next() {
          return rowOf.apply(rows.next());
        }
      });
    }
  }

  @Override
  public Iterator<long[]> call(Iterator<Row> rows) throws Exception {
    if (!rows.hasNext()) {
      return Collections.singletonList(new long[2]).iterator(); // no session for nothing
    }
    CqlSession session = session(config);
    PreparedStatement prepared = prepare(session, config);
    Binder binder = new Binder(config, prepared, session.getContext().getCodecRegistry());
    Flight flight = new Flight(session, config);
    Batcher<BoundStatement> batcher = new Batcher<>(config.maxBatchRows, config.maxBatchBytes);
    try {
      if (config.orderOrdinal >= 0) {
        LastPerKey<BoundStatement> last = new LastPerKey<>();
        while (rows.hasNext()) {
          Row row = rows.next();
          BoundStatement bound = binder.bind(row);
          last.add(binder.key(bound, binder.primaryKey), binder.order(row), bound);
        }
        for (BoundStatement bound : last.values()) {
          for (List<BoundStatement> group :
              batcher.add(binder.key(bound, binder.partitionKey), bound, Binder.size(bound))) {
            flight.submit(group);
          }
        }
      } else {
        while (rows.hasNext()) {
          BoundStatement bound = binder.bind(rows.next());
          for (List<BoundStatement> group :
              batcher.add(binder.key(bound, binder.partitionKey), bound, Binder.size(bound))) {
            flight.submit(group);
          }
          if (batcher.held() >= WINDOW_ROWS) {
            for (List<BoundStatement> group : batcher.drain()) {
              flight.submit(group);
            }
          }
        }
      }
      for (List<BoundStatement> group : batcher.drain()) {
        flight.submit(group);
      }
      flight.finish();
    } catch (Throwable e) {
      flight.stop();
      if (e instanceof DefinitionException) {
        forget(config); // the table may have changed: prepare again next time
      }
      throw e;
    }
    return Collections.singletonList(new long[] {flight.rows.sum(), flight.statements.sum()})
        .iterator();
  }

  // ---------------------------------------------------------------- configuration

  /** The writer's configuration, parsed from the JSON the Python side sends. */
  static final class Config implements Serializable {
    private static final long serialVersionUID = 1L;

    List<String> contactPoints;
    String localDatacenter;
    String username;
    String password;
    String caFile; // null: no TLS
    String certFile;
    String keyFile;
    boolean hostnameValidation;
    String keyspace;
    String table;
    String[] columns;
    int[] ordinals;
    String[] fieldNames; // the frame's, for messages (set by checkFields)
    int[] partitionKey; // indexes into columns
    int[] primaryKey;
    int orderOrdinal;
    boolean constantWriteTime;
    long writeTime; // the constant
    int writeTimeOrdinal;
    boolean writeTimeMicros; // the field is a bigint of µs, not a timestamp
    Integer ttlSeconds;
    String consistency;
    int maxInFlight;
    int maxBatchRows;
    int maxBatchBytes;
    long retryMillis;
    long requestTimeoutMillis;
    String applicationName;

    @SuppressWarnings("unchecked")
    static Config parse(String json) {
      Map<String, Object> c;
      try {
        c = new ObjectMapper().readValue(json, Map.class);
      } catch (IOException e) {
        throw new DefinitionException("CassandraWriter: the configuration is not JSON");
      }
      Config config = new Config();
      config.contactPoints = new ArrayList<>();
      for (Object point : list(c, "contact_points")) {
        config.contactPoints.add(contactPoint(String.valueOf(point)));
      }
      if (config.contactPoints.isEmpty()) {
        throw bad("contact_points", "is empty");
      }
      config.localDatacenter = string(c, "local_datacenter", true);
      config.username = string(c, "username", false);
      config.password = string(c, "password", false);
      if ((config.username == null) != (config.password == null)) {
        throw bad("username", "and password go together");
      }
      Object tls = c.get("tls");
      if (tls != null) {
        if (!(tls instanceof Map)) {
          throw bad("tls", "is not an object");
        }
        Map<String, Object> t = (Map<String, Object>) tls;
        config.caFile = string(t, "ca_file", true);
        config.certFile = string(t, "cert_file", false);
        config.keyFile = string(t, "key_file", false);
        if ((config.certFile == null) != (config.keyFile == null)) {
          throw bad("tls.cert_file", "and tls.key_file go together");
        }
        Object validation = t.get("hostname_validation");
        config.hostnameValidation = validation == null || Boolean.TRUE.equals(validation);
      }
      config.keyspace = string(c, "keyspace", true);
      config.table = string(c, "table", true);
      List<Object> columns = list(c, "columns");
      if (columns.isEmpty()) {
        throw bad("columns", "is empty");
      }
      config.columns = new String[columns.size()];
      config.ordinals = new int[columns.size()];
      Map<String, Integer> index = new LinkedHashMap<>();
      for (int i = 0; i < columns.size(); i++) {
        if (!(columns.get(i) instanceof Map)) {
          throw bad("columns", "holds something other than {name, ordinal}");
        }
        Map<String, Object> column = (Map<String, Object>) columns.get(i);
        config.columns[i] = string(column, "name", true);
        config.ordinals[i] = integer(column, "ordinal", 0);
        if (index.put(config.columns[i], i) != null) {
          throw bad("columns", "names " + quote(config.columns[i]) + " twice");
        }
      }
      config.partitionKey = indexes(c, "partition_key", index);
      if (config.partitionKey.length == 0) {
        throw bad("partition_key", "is empty");
      }
      config.primaryKey = c.get("primary_key") == null ? config.partitionKey
          : indexes(c, "primary_key", index);
      config.orderOrdinal = c.get("order_ordinal") == null ? -1 : integer(c, "order_ordinal", -1);
      Object writeTime = c.get("write_time");
      if (!(writeTime instanceof Map)) {
        throw bad("write_time", "is missing");
      }
      Map<String, Object> w = (Map<String, Object>) writeTime;
      if (w.get("constant") != null) {
        config.constantWriteTime = true;
        config.writeTime = number(w, "constant").longValue();
      } else {
        config.writeTimeOrdinal = integer(w, "ordinal", 0);
        String unit = string(w, "unit", true);
        if (!unit.equals("timestamp") && !unit.equals("micros")) {
          throw bad("write_time.unit", "is neither timestamp nor micros");
        }
        config.writeTimeMicros = unit.equals("micros");
      }
      config.ttlSeconds = c.get("ttl_seconds") == null ? null : integer(c, "ttl_seconds", 0);
      String consistency = c.get("consistency") == null ? "LOCAL_QUORUM"
          : string(c, "consistency", true).toUpperCase(java.util.Locale.ROOT);
      try {
        DefaultConsistencyLevel.valueOf(consistency);
      } catch (IllegalArgumentException e) {
        throw bad("consistency", "is not a consistency level");
      }
      config.consistency = consistency;
      config.maxInFlight = c.get("max_in_flight") == null ? 128 : integer(c, "max_in_flight", 1);
      config.maxBatchRows = c.get("max_batch_rows") == null ? 32 : integer(c, "max_batch_rows", 1);
      config.maxBatchBytes =
          c.get("max_batch_bytes") == null ? 1 << 20 : integer(c, "max_batch_bytes", 1);
      config.retryMillis = c.get("retry_seconds") == null ? 60_000
          : (long) (number(c, "retry_seconds").doubleValue() * 1000);
      if (config.retryMillis < 0) {
        throw bad("retry_seconds", "is negative");
      }
      config.requestTimeoutMillis = c.get("request_timeout_ms") == null ? 10_000
          : integer(c, "request_timeout_ms", 1);
      config.applicationName = string(c, "application_name", false);
      return config;
    }

    /** Check the ordinals against the frame's schema and keep its field names for messages. */
    void checkFields(String[] names) {
      List<Integer> used = new ArrayList<>();
      for (int ordinal : ordinals) {
        used.add(ordinal);
      }
      if (orderOrdinal >= 0) {
        used.add(orderOrdinal);
      }
      if (!constantWriteTime) {
        used.add(writeTimeOrdinal);
      }
      for (int ordinal : used) {
        if (ordinal >= names.length) {
          throw new DefinitionException(
              "CassandraWriter: field ordinal " + ordinal + " is past the frame's "
                  + names.length + " fields");
        }
      }
      fieldNames = names;
    }

    String field(int ordinal) {
      return fieldNames != null && ordinal < fieldNames.length
          ? quote(fieldNames[ordinal]) : "#" + ordinal;
    }

    String target() {
      return quote(keyspace) + "." + quote(table);
    }

    String insertCql() {
      StringBuilder sql = new StringBuilder("INSERT INTO ").append(target()).append(" (");
      for (int i = 0; i < columns.length; i++) {
        sql.append(i == 0 ? "" : ", ").append(quote(columns[i]));
      }
      sql.append(") VALUES (");
      for (int i = 0; i < columns.length; i++) {
        sql.append(i == 0 ? "?" : ", ?");
      }
      sql.append(") USING TIMESTAMP ?");
      if (ttlSeconds != null) {
        sql.append(" AND TTL ?");
      }
      return sql.toString();
    }

    /**
     * What identifies a session: the connection part of the configuration, hashed (the
     * password is part of it, never kept in the clear as a key).
     */
    String sessionKey() {
      StringBuilder key = new StringBuilder();
      for (Object part : new Object[] {contactPoints, localDatacenter, username, password, caFile,
          certFile, keyFile, hostnameValidation, applicationName}) {
        key.append(part).append('\u0000');
      }
      try {
        MessageDigest sha = MessageDigest.getInstance("SHA-256");
        return HexFormat.of().formatHex(sha.digest(key.toString().getBytes(StandardCharsets.UTF_8)));
      } catch (GeneralSecurityException e) {
        throw new IllegalStateException(e);
      }
    }

    @Override
    public String toString() {
      return "CassandraWriter.Config(" + target() + ")"; // never the connection
    }

    private static DefinitionException bad(String key, String problem) {
      return new DefinitionException("CassandraWriter configuration: " + key + " " + problem);
    }

    private static List<Object> list(Map<String, Object> c, String key) {
      Object value = c.get(key);
      if (!(value instanceof List)) {
        throw bad(key, value == null ? "is missing" : "is not a list");
      }
      @SuppressWarnings("unchecked")
      List<Object> list = (List<Object>) value;
      return list;
    }

    private static String string(Map<String, Object> c, String key, boolean required) {
      Object value = c.get(key);
      if (value == null) {
        if (required) {
          throw bad(key, "is missing");
        }
        return null;
      }
      if (!(value instanceof String)) {
        throw bad(key, "is not a string");
      }
      if (required && ((String) value).isEmpty()) {
        throw bad(key, "is empty");
      }
      return (String) value;
    }

    private static Number number(Map<String, Object> c, String key) {
      Object value = c.get(key);
      if (!(value instanceof Number)) {
        throw bad(key, value == null ? "is missing" : "is not a number");
      }
      return (Number) value;
    }

    private static int integer(Map<String, Object> c, String key, int min) {
      Number value = number(c, key);
      if (value instanceof Double || value instanceof Float || value instanceof BigDecimal
          || value.longValue() != value.intValue()) {
        throw bad(key, "is not a 32-bit integer");
      }
      if (value.intValue() < min) {
        throw bad(key, "is below " + min);
      }
      return value.intValue();
    }

    private static int[] indexes(Map<String, Object> c, String key, Map<String, Integer> index) {
      List<Object> names = list(c, key);
      int[] out = new int[names.size()];
      for (int i = 0; i < out.length; i++) {
        Integer at = index.get(String.valueOf(names.get(i)));
        if (at == null) {
          throw bad(key, "names " + quote(String.valueOf(names.get(i))) + ", not among columns");
        }
        out[i] = at;
      }
      return out;
    }

    /** "host:port" as the driver's contact-points option takes it (port 9042 by default). */
    static String contactPoint(String point) {
      String p = point.trim();
      if (p.startsWith("[")) { // [v6]:port or [v6]
        int close = p.indexOf(']');
        if (close < 0) {
          throw bad("contact_points", "holds a malformed address");
        }
        String host = p.substring(1, close);
        String rest = p.substring(close + 1);
        return host + ":" + (rest.startsWith(":") ? port(rest.substring(1)) : 9042);
      }
      int colon = p.lastIndexOf(':');
      if (colon < 0) {
        return p + ":9042";
      }
      if (p.indexOf(':') != colon) { // a bare IPv6 address
        return p + ":9042";
      }
      return p.substring(0, colon) + ":" + port(p.substring(colon + 1));
    }

    private static int port(String port) {
      try {
        int value = Integer.parseInt(port);
        if (value > 0 && value < 65536) {
          return value;
        }
      } catch (NumberFormatException e) {
        // below
      }
      throw bad("contact_points", "holds a bad port");
    }
  }

  /** A CQL identifier, double-quoted (a double quote inside doubled). */
  static String quote(String identifier) {
    return "\"" + identifier.replace("\"", "\"\"") + "\"";
  }

  // ---------------------------------------------------------------- sessions

  // One session per distinct connection configuration in this JVM (opening one costs ~1 s),
  // closed when the JVM exits.
  private static final ConcurrentHashMap<String, CqlSession> SESSIONS = new ConcurrentHashMap<>();
  private static final ConcurrentHashMap<String, Object> OPENING = new ConcurrentHashMap<>();
  private static final ConcurrentHashMap<String, PreparedStatement> PREPARED =
      new ConcurrentHashMap<>();
  private static final ScheduledExecutorService RETRIES;

  static {
    ScheduledThreadPoolExecutor retries = new ScheduledThreadPoolExecutor(1, runnable -> {
      Thread thread = new Thread(runnable, "cassandra-writer-retries");
      thread.setDaemon(true);
      return thread;
    });
    retries.setRemoveOnCancelPolicy(true);
    RETRIES = retries;
    Runtime.getRuntime().addShutdownHook(new Thread(CassandraWriter::closeSessions,
        "cassandra-writer-close"));
  }

  static void closeSessions() {
    List<CompletableFuture<Void>> closing = new ArrayList<>();
    for (CqlSession session : SESSIONS.values()) {
      closing.add(session.closeAsync().toCompletableFuture());
    }
    SESSIONS.clear();
    try {
      CompletableFuture.allOf(closing.toArray(new CompletableFuture<?>[0]))
          .get(5, TimeUnit.SECONDS);
    } catch (Exception e) {
      // exiting anyway
    }
  }

  static CqlSession session(Config config) {
    String key = config.sessionKey();
    CqlSession session = SESSIONS.get(key);
    if (session != null && !session.isClosed()) {
      return session;
    }
    synchronized (OPENING.computeIfAbsent(key, k -> new Object())) {
      session = SESSIONS.get(key);
      if (session != null && !session.isClosed()) {
        return session;
      }
      CqlSession opened = retrying(() -> open(config), config,
          "connecting to " + String.join(", ", config.contactPoints));
      SESSIONS.put(key, opened);
      return opened;
    }
  }

  private static CqlSession open(Config config) {
    ClassLoader loader = CassandraWriter.class.getClassLoader();
    DriverConfigLoader options = DriverConfigLoader.programmaticBuilder(loader)
        .withStringList(DefaultDriverOption.CONTACT_POINTS, config.contactPoints)
        .withString(DefaultDriverOption.LOAD_BALANCING_LOCAL_DATACENTER, config.localDatacenter)
        .withDuration(DefaultDriverOption.REQUEST_TIMEOUT,
            Duration.ofMillis(config.requestTimeoutMillis))
        .withBoolean(DefaultDriverOption.REQUEST_DEFAULT_IDEMPOTENCE, true)
        // Server warnings (a large batch) are not worth a log line per request.
        .withBoolean(DefaultDriverOption.REQUEST_LOG_WARNINGS, false)
        // No Dropwizard metrics (neither it nor HdrHistogram is shipped).
        .withString(DefaultDriverOption.METRICS_FACTORY_CLASS, "NoopMetricsFactory")
        // Back within 5 s of a node's return (the default waits up to 60 s between attempts,
        // longer than a task's retry_seconds may be).
        .withDuration(DefaultDriverOption.RECONNECTION_MAX_DELAY, Duration.ofSeconds(5))
        // Every task of the executor shares the one connection per node: room for all their
        // requests in flight (protocol v4+ has 32768 stream ids; the default, 1024, would turn
        // 8 tasks x 128 in flight into BusyConnectionExceptions).
        .withInt(DefaultDriverOption.CONNECTION_MAX_REQUESTS, 32768)
        .build();
    CqlSessionBuilder builder = CqlSession.builder().withConfigLoader(options).withClassLoader(loader);
    if (config.username != null) {
      builder = builder.withAuthCredentials(config.username, config.password);
    }
    if (config.caFile != null) {
      builder = builder.withSslEngineFactory(new SslEngines(sslContext(config)));
    }
    if (config.applicationName != null) {
      builder = builder.withApplicationName(config.applicationName);
    }
    try {
      return builder.build();
    } catch (CompletionException e) {
      throw e.getCause() instanceof RuntimeException ? (RuntimeException) e.getCause() : e;
    }
  }

  static PreparedStatement prepare(CqlSession session, Config config) {
    String key = config.sessionKey() + "\u0000" + config.insertCql();
    PreparedStatement prepared = PREPARED.get(key);
    if (prepared != null) {
      return prepared;
    }
    SimpleStatement statement = SimpleStatement.newInstance(config.insertCql())
        .setTimeout(Duration.ofMillis(config.requestTimeoutMillis));
    prepared = retrying(() -> session.prepare(statement), config,
        "preparing its INSERT");
    PREPARED.put(key, prepared);
    return prepared;
  }

  private static void forget(Config config) {
    PREPARED.remove(config.sessionKey() + "\u0000" + config.insertCql());
  }

  /** Run `action`, retrying transient failures until retry_seconds; else fail as classified. */
  static <T> T retrying(Supplier<T> action, Config config, String what) {
    long start = System.nanoTime();
    long delay = FIRST_DELAY_MS;
    boolean logged = false;
    while (true) {
      try {
        return action.get();
      } catch (RuntimeException e) {
        Throwable error = unwrap(e);
        if (error instanceof DefinitionException) {
          throw (DefinitionException) error;
        }
        if (!isTransient(error)) {
          throw definition(config, what, error);
        }
        long wait = backoff((System.nanoTime() - start) / 1_000_000, delay, config.retryMillis);
        if (wait < 0) {
          throw exhausted(config, what, error);
        }
        if (!logged) {
          LOG.warn("Cassandra write to {}: {} failed ({}), retrying for up to {} s",
              config.target(), what, describe(error), config.retryMillis / 1000.0);
          logged = true;
        }
        try {
          Thread.sleep(wait);
        } catch (InterruptedException interrupted) {
          Thread.currentThread().interrupt();
          throw exhausted(config, what, error);
        }
        delay = Math.min(delay * 2, MAX_DELAY_MS);
      }
    }
  }

  /**
   * How long to wait before the next attempt, `elapsed` ms after the first failure and with
   * `delay` the backoff's next step: never past retry_seconds; -1 once they have passed.
   */
  static long backoff(long elapsed, long delay, long retryMillis) {
    if (elapsed >= retryMillis) {
      return -1;
    }
    return Math.max(1, Math.min(delay, retryMillis - elapsed));
  }

  /** A permanent failure of the write to the target, `what` it was doing. */
  static DefinitionException definition(Config config, String what, Throwable error) {
    return new DefinitionException("Cassandra write to " + config.target() + " failed ("
        + what + "): " + describe(error), error);
  }

  /** Transient failures that outlasted retry_seconds. */
  static RetriesExhaustedException exhausted(Config config, String what, Throwable error) {
    return new RetriesExhaustedException("Cassandra write to " + config.target()
        + " still failing after retrying for " + config.retryMillis / 1000.0 + " s (" + what
        + "): " + describe(error), error);
  }

  static String describe(Throwable error) {
    return error.getClass().getName() + ": " + error.getMessage();
  }

  static Throwable unwrap(Throwable error) {
    while ((error instanceof CompletionException || error instanceof ExecutionException)
        && error.getCause() != null) {
      error = error.getCause();
    }
    return error;
  }

  /**
   * Whether a failure is worth waiting out: Cassandra (or enough replicas) unreachable,
   * overloaded, timing out or closing connections. Everything else (an unknown table or
   * column, a type mismatch, no permission, bad credentials, a certificate not trusted) fails
   * at once.
   */
  static boolean isTransient(Throwable error) {
    error = unwrap(error);
    if (error instanceof AllNodesFailedException) { // NoNodeAvailableException too
      if (error instanceof NoNodeAvailableException) {
        return true;
      }
      Map<?, List<Throwable>> all = ((AllNodesFailedException) error).getAllErrors();
      for (List<Throwable> errors : all.values()) {
        for (Throwable each : errors) {
          if (!isTransient(each)) {
            return false;
          }
        }
      }
      return true; // none tried, or every node failed transiently
    }
    if (error instanceof ConnectionInitException) {
      // A TLS handshake refused (a certificate not trusted or not naming the node, TLS
      // spoken to a plain port) or bad credentials will fail again; a connection refused,
      // reset or closed (a node starting or going away), also mid-handshake, will not.
      for (Throwable c = error.getCause(); c != null; c = c.getCause()) {
        if (c instanceof com.datastax.oss.driver.api.core.auth.AuthenticationException
            || c instanceof CertificateException
            || c.getClass().getSimpleName().equals("NotSslRecordException")) {
          return false;
        }
        if (c instanceof javax.net.ssl.SSLException) {
          return dropped(c);
        }
      }
      return true;
    }
    return error instanceof NodeUnavailableException
        || error instanceof WriteTimeoutException
        || error instanceof ReadTimeoutException
        || error instanceof UnavailableException
        || error instanceof OverloadedException
        || error instanceof BootstrappingException
        || error instanceof ServerError
        || error instanceof TruncateException
        || error instanceof WriteFailureException
        || error instanceof CDCWriteFailureException
        || error instanceof BusyConnectionException
        || error instanceof ClosedConnectionException
        || error instanceof HeartbeatException
        || error instanceof DriverTimeoutException
        || error instanceof RequestThrottlingException
        || error instanceof java.util.concurrent.TimeoutException
        || error instanceof java.net.ConnectException
        || error instanceof java.nio.channels.ClosedChannelException
        || (error instanceof IOException && !(error instanceof javax.net.ssl.SSLException));
  }

  /** A TLS failure that is the connection going away (closed, reset) mid-handshake. */
  private static boolean dropped(Throwable ssl) {
    for (Throwable c = ssl.getCause(); c != null; c = c.getCause()) {
      if (c instanceof CertificateException) {
        return false;
      }
      if (c instanceof java.io.EOFException || c instanceof java.net.SocketException
          || c instanceof java.nio.channels.ClosedChannelException) {
        return true;
      }
    }
    return false;
  }

  // ---------------------------------------------------------------- TLS

  static SSLContext sslContext(Config config) {
    try {
      return Tls.context(config.caFile, config.certFile, config.keyFile,
          config.hostnameValidation ? HostnameChecking::new : null);
    } catch (Tls.TlsException e) {
      throw new DefinitionException("Cassandra TLS: " + e.getMessage(), e);
    }
  }

  /**
   * TLS engines for the driver's connections, their peer the node's address as given (a
   * contact point's name or IP, a discovered node's IP), never a reverse DNS lookup as the
   * driver's own factories do: host names are checked by {@link HostnameChecking}.
   */
  static final class SslEngines implements SslEngineFactory {
    private final SSLContext context;

    SslEngines(SSLContext context) {
      this.context = context;
    }

    @Override
    public javax.net.ssl.SSLEngine newSslEngine(EndPoint endPoint) {
      java.net.SocketAddress address = endPoint.resolve();
      javax.net.ssl.SSLEngine engine = address instanceof java.net.InetSocketAddress
          ? context.createSSLEngine(((java.net.InetSocketAddress) address).getHostString(),
              ((java.net.InetSocketAddress) address).getPort())
          : context.createSSLEngine();
      engine.setUseClientMode(true);
      return engine;
    }

    @Override
    public void close() {
      // nothing held
    }
  }

  /**
   * The JDK's trust manager, and then the node's certificate checked against the name it was
   * reached by: the address as given or, for an IP address, its reverse DNS name (what the
   * driver's own validation uses): a certificate naming either passes.
   */
  static final class HostnameChecking extends X509ExtendedTrustManager {
    private final X509ExtendedTrustManager trust;

    HostnameChecking(X509ExtendedTrustManager trust) {
      this.trust = trust;
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType,
        javax.net.ssl.SSLEngine engine) throws CertificateException {
      trust.checkServerTrusted(chain, authType, engine);
      check(chain[0], engine.getPeerHost());
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType,
        java.net.Socket socket) throws CertificateException {
      trust.checkServerTrusted(chain, authType, socket);
      check(chain[0], socket.getInetAddress() == null ? null
          : socket.getInetAddress().getHostAddress());
    }

    @Override
    public void checkServerTrusted(X509Certificate[] chain, String authType)
        throws CertificateException {
      throw new CertificateException("no peer to check the certificate's names against");
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType,
        java.net.Socket socket) throws CertificateException {
      trust.checkClientTrusted(chain, authType, socket);
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType,
        javax.net.ssl.SSLEngine engine) throws CertificateException {
      trust.checkClientTrusted(chain, authType, engine);
    }

    @Override
    public void checkClientTrusted(X509Certificate[] chain, String authType)
        throws CertificateException {
      trust.checkClientTrusted(chain, authType);
    }

    @Override
    public X509Certificate[] getAcceptedIssuers() {
      return trust.getAcceptedIssuers();
    }

    static void check(X509Certificate certificate, String host) throws CertificateException {
      if (host == null) {
        throw new CertificateException("no peer host to check the certificate's names against");
      }
      if (names(certificate, host)) {
        return;
      }
      if (isIpLiteral(host)) {
        try {
          String reverse = InetAddress.getByName(host).getCanonicalHostName();
          if (!reverse.equals(host) && names(certificate, reverse)) {
            return;
          }
        } catch (UnknownHostException e) {
          // no name: the address alone did not match
        }
      }
      throw new CertificateException("the certificate of " + host + " does not name it"
          + " (tls.hostname_validation)");
    }

    /** Whether the certificate names `host`: an IP in its IP SANs, a name in its DNS SANs
     * (a leading "*." matching one label) or, with no DNS SAN, in its subject's CN. */
    static boolean names(X509Certificate certificate, String host) throws CertificateException {
      Collection<List<?>> alternatives = certificate.getSubjectAlternativeNames();
      if (isIpLiteral(host)) {
        if (alternatives == null) {
          return false;
        }
        InetAddress address = literal(host);
        if (address == null) {
          return false;
        }
        for (List<?> entry : alternatives) {
          if (((Integer) entry.get(0)) == 7 && address.equals(literal((String) entry.get(1)))) {
            return true;
          }
        }
        return false;
      }
      boolean anyDns = false;
      if (alternatives != null) {
        for (List<?> entry : alternatives) {
          if (((Integer) entry.get(0)) == 2) {
            anyDns = true;
            if (dnsMatches((String) entry.get(1), host)) {
              return true;
            }
          }
        }
      }
      if (!anyDns) {
        try {
          for (javax.naming.ldap.Rdn rdn : new javax.naming.ldap.LdapName(
              certificate.getSubjectX500Principal().getName()).getRdns()) {
            if (rdn.getType().equalsIgnoreCase("CN") && dnsMatches(rdn.getValue().toString(), host)) {
              return true;
            }
          }
        } catch (javax.naming.InvalidNameException e) {
          return false;
        }
      }
      return false;
    }

    static boolean dnsMatches(String pattern, String host) {
      String p = pattern.toLowerCase(java.util.Locale.ROOT);
      String h = host.toLowerCase(java.util.Locale.ROOT);
      if (p.endsWith(".")) {
        p = p.substring(0, p.length() - 1);
      }
      if (h.endsWith(".")) {
        h = h.substring(0, h.length() - 1);
      }
      if (p.startsWith("*.")) {
        int dot = h.indexOf('.');
        return dot > 0 && h.substring(dot).equals(p.substring(1)) && p.indexOf('.', 2) > 0;
      }
      return p.equals(h);
    }

    private static boolean isIpLiteral(String host) {
      return IPV4.matcher(host).matches() || host.indexOf(':') >= 0;
    }

    private static InetAddress literal(String ip) {
      try {
        return inet(ip);
      } catch (NoConversion e) {
        return null;
      }
    }
  }

  // ---------------------------------------------------------------- values

  /** A Spark value to the Java type the driver's codec for a CQL type takes. */
  @FunctionalInterface
  interface Conversion {
    Object apply(Object value);
  }

  /** A value that does not convert: the message says what it is and what was wanted. */
  static final class NoConversion extends IllegalArgumentException {
    private static final long serialVersionUID = 1L;

    NoConversion(String message) {
      super(message);
    }
  }

  private static NoConversion no(Object value, String wanted) {
    return new NoConversion("a " + value.getClass().getName() + " does not convert to " + wanted
        + " (only the same type or a safe widening)");
  }

  /** How a Spark external value (a Row's) becomes a value of `type` for `registry`'s codecs. */
  static Conversion conversion(DataType type, CodecRegistry registry) {
    if (type instanceof ListType) {
      Conversion element = conversion(((ListType) type).getElementType(), registry);
      return v -> elements(v, element, "list");
    }
    if (type instanceof SetType) {
      Conversion element = conversion(((SetType) type).getElementType(), registry);
      return v -> new LinkedHashSet<>(elements(v, element, "set"));
    }
    if (type instanceof MapType) {
      Conversion key = conversion(((MapType) type).getKeyType(), registry);
      Conversion value = conversion(((MapType) type).getValueType(), registry);
      return v -> entries(v, key, value);
    }
    if (type instanceof VectorType) {
      VectorType vector = (VectorType) type;
      Conversion element = conversion(vector.getElementType(), registry);
      return v -> {
        List<Object> values = elements(v, element, "vector");
        if (values.size() != vector.getDimensions()) {
          throw new NoConversion("a vector of " + values.size() + " values for "
              + vector.asCql(false, true));
        }
        for (Object each : values) {
          if (!(each instanceof Number)) {
            throw new NoConversion("a vector of non-numbers");
          }
        }
        @SuppressWarnings({"unchecked", "rawtypes"})
        CqlVector<?> out = CqlVector.newInstance((List) values);
        return out;
      };
    }
    if (type instanceof TupleType) {
      return tuple((TupleType) type, registry);
    }
    if (type instanceof UserDefinedType) {
      return udt((UserDefinedType) type, registry);
    }
    String cql = type.asCql(false, true);
    switch (type.getProtocolCode()) {
      case ProtocolConstants.DataType.VARCHAR:
        return v -> {
          if (v instanceof String) {
            return v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.ASCII:
        return v -> {
          if (v instanceof String) {
            String s = (String) v;
            for (int i = 0; i < s.length(); i++) {
              if (s.charAt(i) > 127) {
                throw new NoConversion("a string with non-ASCII characters for ascii");
              }
            }
            return s;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.BOOLEAN:
        return v -> {
          if (v instanceof Boolean) {
            return v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.TINYINT:
        return v -> {
          if (v instanceof Byte) {
            return v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.SMALLINT:
        return v -> {
          if (v instanceof Short) {
            return v;
          }
          if (v instanceof Byte) {
            return (short) (byte) v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.INT:
        return v -> {
          if (v instanceof Integer) {
            return v;
          }
          if (v instanceof Short || v instanceof Byte) {
            return ((Number) v).intValue();
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.BIGINT:
      case ProtocolConstants.DataType.COUNTER:
        return v -> {
          if (v instanceof Long) {
            return v;
          }
          if (v instanceof Integer || v instanceof Short || v instanceof Byte) {
            return ((Number) v).longValue();
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.VARINT:
        return v -> {
          if (v instanceof BigInteger) {
            return v;
          }
          if (v instanceof Long || v instanceof Integer || v instanceof Short
              || v instanceof Byte) {
            return BigInteger.valueOf(((Number) v).longValue());
          }
          BigDecimal decimal = decimal(v);
          if (decimal != null) {
            try {
              return decimal.toBigIntegerExact();
            } catch (ArithmeticException e) {
              throw new NoConversion("a decimal with a fractional part for varint");
            }
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.DECIMAL:
        return v -> {
          BigDecimal decimal = decimal(v);
          if (decimal != null) {
            return decimal;
          }
          if (v instanceof Long || v instanceof Integer || v instanceof Short
              || v instanceof Byte) {
            return BigDecimal.valueOf(((Number) v).longValue());
          }
          if (v instanceof BigInteger) {
            return new BigDecimal((BigInteger) v);
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.FLOAT:
        return v -> {
          if (v instanceof Float) {
            return v;
          }
          if (v instanceof Short || v instanceof Byte) {
            return ((Number) v).floatValue();
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.DOUBLE:
        return v -> {
          if (v instanceof Double) {
            return v;
          }
          if (v instanceof Float || v instanceof Integer || v instanceof Short
              || v instanceof Byte) {
            return ((Number) v).doubleValue();
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.TIMESTAMP:
        return v -> {
          if (v instanceof Instant) {
            return v;
          }
          if (v instanceof java.sql.Timestamp) {
            return ((java.sql.Timestamp) v).toInstant();
          }
          if (v instanceof LocalDateTime) { // Spark's TIMESTAMP_NTZ: taken as UTC
            return ((LocalDateTime) v).toInstant(ZoneOffset.UTC);
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.DATE:
        return v -> {
          if (v instanceof LocalDate) {
            return v;
          }
          if (v instanceof java.sql.Date) {
            return ((java.sql.Date) v).toLocalDate();
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.TIME:
        return v -> {
          if (v instanceof LocalTime) {
            return v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.BLOB:
        return v -> {
          if (v instanceof byte[]) {
            return ByteBuffer.wrap((byte[]) v);
          }
          if (v instanceof ByteBuffer) {
            return v;
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.UUID:
      case ProtocolConstants.DataType.TIMEUUID:
        boolean time = type.getProtocolCode() == ProtocolConstants.DataType.TIMEUUID;
        return v -> {
          UUID uuid;
          if (v instanceof UUID) {
            uuid = (UUID) v;
          } else if (v instanceof String) {
            try {
              uuid = UUID.fromString((String) v);
            } catch (IllegalArgumentException e) {
              throw new NoConversion("a string that is not a UUID for " + cql);
            }
          } else {
            throw no(v, cql);
          }
          if (time && uuid.version() != 1) {
            throw new NoConversion("a version " + uuid.version() + " UUID for timeuuid"
                + " (which takes version 1 only)");
          }
          return uuid;
        };
      case ProtocolConstants.DataType.INET:
        return v -> {
          if (v instanceof InetAddress) {
            return v;
          }
          if (v instanceof String) {
            return inet((String) v);
          }
          throw no(v, cql);
        };
      case ProtocolConstants.DataType.DURATION:
        return v -> {
          if (v instanceof CqlDuration) {
            return v;
          }
          if (v instanceof Duration) { // Spark's day-time interval: exact nanoseconds
            try {
              return CqlDuration.newInstance(0, 0, ((Duration) v).toNanos());
            } catch (ArithmeticException e) {
              throw new NoConversion("a day-time interval too long for duration");
            }
          }
          if (v instanceof Period) { // year-month interval
            Period p = (Period) v;
            return CqlDuration.newInstance((int) p.toTotalMonths(), p.getDays(), 0);
          }
          if (v instanceof String) {
            try {
              return CqlDuration.from((String) v);
            } catch (IllegalArgumentException e) {
              throw new NoConversion("a string that is not a CQL duration");
            }
          }
          throw no(v, cql);
        };
      default:
        throw new NoConversion("the CQL type " + cql + " is not supported by the writer");
    }
  }

  private static BigDecimal decimal(Object v) {
    if (v instanceof BigDecimal) {
      return (BigDecimal) v;
    }
    if (v instanceof scala.math.BigDecimal) {
      return ((scala.math.BigDecimal) v).bigDecimal();
    }
    if (v instanceof org.apache.spark.sql.types.Decimal) {
      return ((org.apache.spark.sql.types.Decimal) v).toJavaBigDecimal();
    }
    return null;
  }

  private static final Pattern IPV4 = Pattern.compile("(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})\\.(\\d{1,3})");
  private static final Pattern IPV6 = Pattern.compile("[0-9A-Fa-f:.]*:[0-9A-Fa-f:.]*(%[0-9A-Za-z_.-]+)?");

  /** An IP address literal (never a host name: no DNS lookup per value). */
  static InetAddress inet(String text) {
    String s = text.trim();
    if (s.startsWith("[") && s.endsWith("]")) {
      s = s.substring(1, s.length() - 1);
    }
    try {
      Matcher v4 = IPV4.matcher(s);
      if (v4.matches()) {
        byte[] address = new byte[4];
        for (int i = 0; i < 4; i++) {
          int octet = Integer.parseInt(v4.group(i + 1));
          if (octet > 255) {
            throw new UnknownHostException();
          }
          address[i] = (byte) octet;
        }
        return InetAddress.getByAddress(address);
      }
      // A literal with a colon (parsed as IPv6 by the JDK, never looked up).
      if (IPV6.matcher(s).matches()) {
        return InetAddress.getByName(s);
      }
    } catch (UnknownHostException e) {
      // below
    }
    throw new NoConversion("a string that is not an IP address for inet");
  }

  /** The elements of a Spark array (a Scala Seq) or a Java collection, each converted. */
  static List<Object> elements(Object v, Conversion element, String kind) {
    List<Object> out = new ArrayList<>();
    if (v instanceof scala.collection.Iterable && !(v instanceof scala.collection.Map)) {
      scala.collection.Iterator<?> it = ((scala.collection.Iterable<?>) v).iterator();
      while (it.hasNext()) {
        out.add(element(it.next(), element, kind));
      }
    } else if (v instanceof Collection) {
      for (Object each : (Collection<?>) v) {
        out.add(element(each, element, kind));
      }
    } else if (v instanceof Object[]) {
      for (Object each : (Object[]) v) {
        out.add(element(each, element, kind));
      }
    } else {
      throw no(v, kind);
    }
    return out;
  }

  private static Object element(Object value, Conversion conversion, String kind) {
    if (value == null) {
      throw new NoConversion("a null in a " + kind + " (CQL collections hold no nulls)");
    }
    return conversion.apply(value);
  }

  static Map<Object, Object> entries(Object v, Conversion key, Conversion value) {
    Map<Object, Object> out = new LinkedHashMap<>();
    if (v instanceof scala.collection.Map) {
      scala.collection.Iterator<?> it = ((scala.collection.Map<?, ?>) v).iterator();
      while (it.hasNext()) {
        scala.Tuple2<?, ?> entry = (scala.Tuple2<?, ?>) it.next();
        out.put(element(entry._1(), key, "map"), element(entry._2(), value, "map"));
      }
    } else if (v instanceof Map) {
      for (Map.Entry<?, ?> entry : ((Map<?, ?>) v).entrySet()) {
        out.put(element(entry.getKey(), key, "map"), element(entry.getValue(), value, "map"));
      }
    } else {
      throw no(v, "map");
    }
    return out;
  }

  private static Conversion tuple(TupleType type, CodecRegistry registry) {
    return composite(type.getComponentTypes(), null, type::newValue, registry);
  }

  private static Conversion udt(UserDefinedType type, CodecRegistry registry) {
    List<String> names = new ArrayList<>();
    for (CqlIdentifier name : type.getFieldNames()) {
      names.add(name.asInternal());
    }
    return composite(type.getFieldTypes(), names, type::newValue, registry);
  }

  /**
   * A struct into a tuple or a UDT value (`fresh`: a new empty one), each of its `types`
   * converted and set by index (null set as null); `names`: the UDT's field names (null for
   * a tuple, whose values go by position).
   */
  private static <V extends SettableByIndex<V>>
      Conversion composite(List<DataType> types, List<String> names,
          Supplier<V> fresh, CodecRegistry registry) {
    Conversion[] conversions = new Conversion[types.size()];
    List<TypeCodec<Object>> codecs = new ArrayList<>();
    for (int i = 0; i < conversions.length; i++) {
      conversions[i] = conversion(types.get(i), registry);
      codecs.add(registry.codecFor(types.get(i)));
    }
    return v -> {
      List<Object> values = fields(v, conversions.length, names);
      V out = fresh.get();
      for (int i = 0; i < conversions.length; i++) {
        Object each = values.get(i);
        out = each == null ? out.setToNull(i)
            : out.set(i, conversions[i].apply(each), codecs.get(i));
      }
      return out;
    };
  }

  /**
   * A struct's values for a tuple (by position) or a UDT (by field name when the Row has a
   * schema, else by position); a UDT field the struct lacks is null.
   */
  private static List<Object> fields(Object v, int n, List<String> names) {
    if (!(v instanceof Row)) {
      throw no(v, names == null ? "tuple" : "user-defined type");
    }
    Row row = (Row) v;
    List<Object> out = new ArrayList<>(n);
    StructType schema = row.schema();
    if (names != null && schema != null) {
      java.util.Set<String> known = new java.util.HashSet<>(List.of(schema.fieldNames()));
      for (String name : names) {
        out.add(known.contains(name) ? row.get(row.fieldIndex(name)) : null);
      }
      for (String field : schema.fieldNames()) {
        if (!names.contains(field)) {
          throw new NoConversion("a struct with field " + quote(field)
              + ", which the user-defined type has not");
        }
      }
      return out;
    }
    if (row.size() != n) {
      throw new NoConversion("a struct of " + row.size() + " fields for " + n);
    }
    for (int i = 0; i < n; i++) {
      out.add(row.get(i));
    }
    return out;
  }

  /** Binds rows to the prepared insert: values converted per their column's CQL type. */
  static final class Binder {
    final Config config;
    final PreparedStatement prepared;
    final Conversion[] conversions;
    final List<TypeCodec<Object>> codecs = new ArrayList<>();
    final String[] types;
    final int[] partitionKey;
    final int[] primaryKey;
    final boolean[] keyColumns; // a null there fails here, not as a whole batch in Cassandra
    final DefaultConsistencyLevel consistency;
    final Duration timeout;

    Binder(Config config, PreparedStatement prepared, CodecRegistry registry) {
      this.config = config;
      this.prepared = prepared;
      ColumnDefinitions variables = prepared.getVariableDefinitions();
      int n = config.columns.length;
      if (variables.size() != n + (config.ttlSeconds == null ? 1 : 2)) {
        throw new DefinitionException("Cassandra: the insert into " + config.target()
            + " has " + variables.size() + " bind markers, not " + n + " columns and the"
            + " write time");
      }
      conversions = new Conversion[n];
      types = new String[n];
      for (int i = 0; i < n; i++) {
        DataType type = variables.get(i).getType();
        types[i] = type.asCql(false, true);
        try {
          conversions[i] = conversion(type, registry);
          codecs.add(registry.codecFor(type));
        } catch (RuntimeException e) {
          throw new DefinitionException(column(i) + ": " + e.getMessage(), e);
        }
      }
      partitionKey = config.partitionKey;
      primaryKey = config.primaryKey;
      keyColumns = new boolean[n];
      for (int i : primaryKey) {
        keyColumns[i] = true;
      }
      for (int i : partitionKey) {
        keyColumns[i] = true;
      }
      for (int i : prepared.getPartitionKeyIndices()) {
        if (i < n) {
          keyColumns[i] = true;
        }
      }
      consistency = DefaultConsistencyLevel.valueOf(config.consistency);
      timeout = Duration.ofMillis(config.requestTimeoutMillis);
    }

    String column(int i) {
      return "column " + quote(config.columns[i]) + " (CQL " + (types == null || types[i] == null
          ? "?" : types[i]) + ", from field " + config.field(config.ordinals[i]) + ")";
    }

    BoundStatement bind(Row row) {
      BoundStatementBuilder builder = prepared.boundStatementBuilder();
      int n = conversions.length;
      for (int i = 0; i < n; i++) {
        Object value = row.get(config.ordinals[i]);
        if (value == null) {
          if (keyColumns[i]) {
            throw new DefinitionException(column(i) + ": a null in a primary key column");
          }
          builder = builder.setToNull(i); // a tombstone for the cell, as an upsert of null
          continue;
        }
        try {
          builder = builder.set(i, conversions[i].apply(value), codecs.get(i));
        } catch (DefinitionException e) {
          throw e;
        } catch (RuntimeException e) {
          throw new DefinitionException(column(i) + ": " + message(e), e);
        }
      }
      builder = builder.setLong(n, writeTime(row));
      if (config.ttlSeconds != null) {
        builder = builder.setInt(n + 1, config.ttlSeconds);
      }
      return builder
          .setConsistencyLevel(consistency)
          .setIdempotence(true)
          .setTimeout(timeout)
          .build();
    }

    private static String message(RuntimeException e) {
      return e instanceof NoConversion ? e.getMessage() : describe(e);
    }

    long writeTime(Row row) {
      if (config.constantWriteTime) {
        return config.writeTime;
      }
      Object value = row.get(config.writeTimeOrdinal);
      if (value == null) {
        throw new DefinitionException("write time field " + config.field(config.writeTimeOrdinal)
            + " is null in a row (USING TIMESTAMP needs a value)");
      }
      try {
        return writeTimeMicros(value, config.writeTimeMicros);
      } catch (NoConversion e) {
        throw new DefinitionException("write time field " + config.field(config.writeTimeOrdinal)
            + ": " + e.getMessage(), e);
      }
    }

    /** The order value: a bigint field (null loses to any value). */
    long order(Row row) {
      Object value = row.get(config.orderOrdinal);
      if (value == null) {
        return Long.MIN_VALUE;
      }
      if (value instanceof Long || value instanceof Integer || value instanceof Short
          || value instanceof Byte) {
        return ((Number) value).longValue();
      }
      throw new DefinitionException("order field " + config.field(config.orderOrdinal)
          + " is a " + value.getClass().getName() + ", not a bigint");
    }

    /** The serialized values of `columns` (equal keys: equal bytes). */
    Object key(BoundStatement bound, int[] columns) {
      if (columns.length == 1) {
        return bytes(bound.getBytesUnsafe(columns[0]));
      }
      List<Object> key = new ArrayList<>(columns.length);
      for (int column : columns) {
        key.add(bytes(bound.getBytesUnsafe(column)));
      }
      return key;
    }

    private static Object bytes(ByteBuffer value) {
      return value == null ? Collections.emptyList() : value; // null: a key of its own
    }

    /** The bound values' size in bytes. */
    static int size(BoundStatement bound) {
      int size = 0;
      for (ByteBuffer value : bound.getValues()) {
        size += value == null ? 0 : value.remaining();
      }
      return size;
    }
  }

  /** Microseconds since the epoch of a write-time value: a timestamp, or a bigint of µs. */
  static long writeTimeMicros(Object value, boolean micros) {
    if (micros) {
      if (value instanceof Long || value instanceof Integer) {
        return ((Number) value).longValue();
      }
      throw new NoConversion("a " + value.getClass().getName() + ", not a bigint of microseconds");
    }
    Instant instant;
    if (value instanceof java.sql.Timestamp) {
      instant = ((java.sql.Timestamp) value).toInstant();
    } else if (value instanceof Instant) {
      instant = (Instant) value;
    } else if (value instanceof LocalDateTime) {
      instant = ((LocalDateTime) value).toInstant(ZoneOffset.UTC);
    } else {
      throw new NoConversion("a " + value.getClass().getName() + ", not a timestamp");
    }
    return Math.addExact(Math.multiplyExact(instant.getEpochSecond(), 1_000_000L),
        instant.getNano() / 1_000);
  }

  // ---------------------------------------------------------------- grouping

  /**
   * Groups items by key into batches of at most `maxRows` items and `maxBytes` bytes (an item
   * larger than that goes alone), in the order keys first come.
   */
  static final class Batcher<T> {
    private final int maxRows;
    private final int maxBytes;
    private final LinkedHashMap<Object, List<T>> groups = new LinkedHashMap<>();
    private final Map<Object, Integer> bytes = new java.util.HashMap<>();
    private int held;

    Batcher(int maxRows, int maxBytes) {
      this.maxRows = maxRows;
      this.maxBytes = maxBytes;
    }

    /** Add an item; returns the groups that are complete (none, mostly). */
    List<List<T>> add(Object key, T item, int size) {
      List<List<T>> ready = new ArrayList<>(0);
      List<T> group = groups.get(key);
      if (group != null && bytes.get(key) + size > maxBytes) {
        ready.add(group);
        held -= group.size();
        groups.remove(key);
        bytes.remove(key);
        group = null;
      }
      if (group == null) {
        group = new ArrayList<>(Math.min(maxRows, 8));
        groups.put(key, group);
        bytes.put(key, 0);
      }
      group.add(item);
      bytes.merge(key, size, Integer::sum);
      held++;
      if (group.size() >= maxRows) {
        ready.add(group);
        held -= group.size();
        groups.remove(key);
        bytes.remove(key);
      }
      return ready;
    }

    int held() {
      return held;
    }

    /** Every group held, emptied. */
    List<List<T>> drain() {
      List<List<T>> out = new ArrayList<>(groups.values());
      groups.clear();
      bytes.clear();
      held = 0;
      return out;
    }
  }

  /** Per key, the item with the highest order (the later one of equal orders). */
  static final class LastPerKey<T> {
    private final LinkedHashMap<Object, Object[]> items = new LinkedHashMap<>();

    void add(Object key, long order, T item) {
      Object[] held = items.get(key);
      if (held == null || (Long) held[0] <= order) {
        items.put(key, new Object[] {order, item});
      }
    }

    @SuppressWarnings("unchecked")
    List<T> values() {
      List<T> out = new ArrayList<>(items.size());
      for (Object[] held : items.values()) {
        out.add((T) held[1]);
      }
      return out;
    }
  }

  // ---------------------------------------------------------------- execution

  /** A task's asynchronous requests: at most max_in_flight at once, retried when transient. */
  /**
   * Request latencies (send to acknowledgement, successes only) of every writer in this JVM,
   * in buckets 5% wide from 1 microsecond: what the benchmark reports (bench/sinks.py). Cheap
   * enough to keep always (one array increment per request).
   */
  static final class Latencies {
    private static final double STEP = Math.log(1.05);
    private final java.util.concurrent.atomic.AtomicLongArray counts =
        new java.util.concurrent.atomic.AtomicLongArray(600);

    void record(long nanos) {
      double micros = Math.max(1.0, nanos / 1000.0);
      int bucket = (int) Math.min(counts.length() - 1, Math.floor(Math.log(micros) / STEP));
      counts.incrementAndGet(bucket);
    }

    /** The latency below which a share `q` of the requests fell, in milliseconds. */
    double percentileMillis(double q) {
      long total = 0;
      for (int i = 0; i < counts.length(); i++) {
        total += counts.get(i);
      }
      if (total == 0) {
        return Double.NaN;
      }
      long seen = 0;
      for (int i = 0; i < counts.length(); i++) {
        seen += counts.get(i);
        if (seen >= Math.ceil(q * total)) {
          return Math.exp((i + 1) * STEP) / 1000.0;
        }
      }
      return Double.NaN;
    }

    long count() {
      long total = 0;
      for (int i = 0; i < counts.length(); i++) {
        total += counts.get(i);
      }
      return total;
    }

    void reset() {
      for (int i = 0; i < counts.length(); i++) {
        counts.set(i, 0);
      }
    }
  }

  static final Latencies LATENCIES = new Latencies();

  /** The writers' request latencies in this JVM: {count, p50 ms, p95 ms, p99 ms}. */
  public static double[] latencies() {
    return new double[] {
      LATENCIES.count(),
      LATENCIES.percentileMillis(0.50),
      LATENCIES.percentileMillis(0.95),
      LATENCIES.percentileMillis(0.99)
    };
  }

  public static void resetLatencies() {
    LATENCIES.reset();
  }

  static final class Flight {
    final CqlSession session;
    final Config config;
    final Semaphore permits;
    final LongAdder rows = new LongAdder();
    final LongAdder statements = new LongAdder();
    final LongAdder retries = new LongAdder();
    final AtomicReference<RuntimeException> failure = new AtomicReference<>();
    private volatile boolean stopped;
    private volatile boolean warned;

    Flight(CqlSession session, Config config) {
      this.session = session;
      this.config = config;
      this.permits = new Semaphore(config.maxInFlight);
    }

    void submit(List<BoundStatement> group) throws InterruptedException {
      check();
      Statement<?> statement = group.size() == 1 ? group.get(0)
          : BatchStatement.builder(BatchType.UNLOGGED)
              .addStatements(new ArrayList<>(group))
              .setConsistencyLevel(DefaultConsistencyLevel.valueOf(config.consistency))
              .setIdempotence(true)
              .setTimeout(Duration.ofMillis(config.requestTimeoutMillis))
              .build();
      permits.acquire();
      if (failure.get() != null) {
        permits.release();
        check();
      }
      send(statement, group.size(), 0L, FIRST_DELAY_MS);
    }

    /** `started`: System.nanoTime() of the statement's first failure, 0 before any. */
    private void send(Statement<?> statement, int count, long started, long delay) {
      if (stopped || failure.get() != null) {
        permits.release();
        return;
      }
      CompletionStage<AsyncResultSet> result;
      try {
        result = session.executeAsync(statement);
      } catch (RuntimeException e) {
        result = CompletableFuture.failedFuture(e);
      }
      long sent = System.nanoTime();
      result.whenComplete((rs, error) -> {
        if (error == null) {
          LATENCIES.record(System.nanoTime() - sent);
          rows.add(count);
          statements.increment();
          permits.release();
          return;
        }
        Throwable cause = unwrap(error);
        long now = System.nanoTime();
        long first = started == 0L ? (now == 0L ? 1L : now) : started;
        String what = "writing rows";
        if (!isTransient(cause)) {
          failure.compareAndSet(null, definition(config, what, cause));
          permits.release();
        } else if (stopped
            || backoff((now - first) / 1_000_000, delay, config.retryMillis) < 0) {
          failure.compareAndSet(null, exhausted(config, what, cause));
          permits.release();
        } else {
          retries.increment();
          if (!warned) {
            warned = true;
            LOG.warn("Cassandra write to {} failed ({}), retrying for up to {} s",
                config.target(), describe(cause), config.retryMillis / 1000.0);
          }
          try {
            RETRIES.schedule(() -> send(statement, count, first,
                Math.min(delay * 2, MAX_DELAY_MS)),
                backoff((now - first) / 1_000_000, delay, config.retryMillis),
                TimeUnit.MILLISECONDS);
          } catch (RuntimeException rejected) {
            failure.compareAndSet(null, exhausted(config, what, cause));
            permits.release();
          }
        }
      });
    }

    private void check() {
      RuntimeException failed = failure.get();
      if (failed != null) {
        throw failed;
      }
    }

    /** Wait for every request sent; throw the first failure. */
    void finish() throws InterruptedException {
      permits.acquire(config.maxInFlight);
      permits.release(config.maxInFlight);
      check();
    }

    /** The task failed or was cancelled: send no more retries. */
    void stop() {
      stopped = true;
    }
  }
}
