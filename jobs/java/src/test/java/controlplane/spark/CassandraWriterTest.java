package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.datastax.oss.driver.api.core.AllNodesFailedException;
import com.datastax.oss.driver.api.core.DefaultConsistencyLevel;
import com.datastax.oss.driver.api.core.DriverTimeoutException;
import com.datastax.oss.driver.api.core.InvalidKeyspaceException;
import com.datastax.oss.driver.api.core.NoNodeAvailableException;
import com.datastax.oss.driver.api.core.ProtocolVersion;
import com.datastax.oss.driver.api.core.auth.AuthenticationException;
import com.datastax.oss.driver.api.core.connection.BusyConnectionException;
import com.datastax.oss.driver.api.core.connection.ClosedConnectionException;
import com.datastax.oss.driver.api.core.connection.ConnectionInitException;
import com.datastax.oss.driver.api.core.data.CqlDuration;
import com.datastax.oss.driver.api.core.data.CqlVector;
import com.datastax.oss.driver.api.core.data.TupleValue;
import com.datastax.oss.driver.api.core.data.UdtValue;
import com.datastax.oss.driver.api.core.metadata.Node;
import com.datastax.oss.driver.api.core.servererrors.DefaultWriteType;
import com.datastax.oss.driver.api.core.servererrors.InvalidQueryException;
import com.datastax.oss.driver.api.core.servererrors.OverloadedException;
import com.datastax.oss.driver.api.core.servererrors.SyntaxError;
import com.datastax.oss.driver.api.core.servererrors.UnauthorizedException;
import com.datastax.oss.driver.api.core.servererrors.UnavailableException;
import com.datastax.oss.driver.api.core.servererrors.WriteTimeoutException;
import com.datastax.oss.driver.api.core.type.DataType;
import com.datastax.oss.driver.api.core.type.DataTypes;
import com.datastax.oss.driver.api.core.type.UserDefinedType;
import com.datastax.oss.driver.api.core.type.codec.CodecNotFoundException;
import com.datastax.oss.driver.api.core.type.codec.registry.CodecRegistry;
import com.datastax.oss.driver.internal.core.metadata.DefaultEndPoint;
import com.datastax.oss.driver.internal.core.type.UserDefinedTypeBuilder;
import java.math.BigDecimal;
import java.math.BigInteger;
import java.net.ConnectException;
import java.net.InetAddress;
import java.net.InetSocketAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.security.KeyPairGenerator;
import java.security.KeyStore;
import java.security.PrivateKey;
import java.security.cert.CertificateException;
import java.time.Duration;
import java.time.Instant;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.LocalTime;
import java.time.Period;
import java.util.AbstractMap;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.Base64;
import java.util.LinkedHashMap;
import java.util.LinkedHashSet;
import java.util.List;
import java.util.Map;
import java.util.UUID;
import javax.net.ssl.SSLContext;
import javax.net.ssl.SSLHandshakeException;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.catalyst.expressions.GenericRowWithSchema;
import org.apache.spark.sql.types.IntegerType$;
import org.apache.spark.sql.types.LongType$;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.io.TempDir;

/** CassandraWriter's pure parts: configuration, CQL text, values, grouping, errors. */
class CassandraWriterTest {

  static final String CONFIG = "{\"contact_points\": [\"127.0.0.1:9042\", \"db2\"],"
      + " \"local_datacenter\": \"datacenter1\", \"username\": \"u\", \"password\": \"s3cret\","
      + " \"tls\": null, \"keyspace\": \"ks\", \"table\": \"t\","
      + " \"columns\": [{\"name\": \"id\", \"ordinal\": 0}, {\"name\": \"ts\", \"ordinal\": 2},"
      + " {\"name\": \"v\", \"ordinal\": 1}],"
      + " \"partition_key\": [\"id\"], \"primary_key\": [\"id\", \"ts\"], \"order_ordinal\": 3,"
      + " \"write_time\": {\"ordinal\": 2, \"unit\": \"timestamp\"}, \"ttl_seconds\": 3600,"
      + " \"consistency\": \"LOCAL_ONE\", \"max_in_flight\": 64, \"max_batch_rows\": 16,"
      + " \"retry_seconds\": 30, \"request_timeout_ms\": 5000,"
      + " \"application_name\": \"cp:orders\"}";

  static final CodecRegistry CODECS = CodecRegistry.DEFAULT;

  // ------------------------------------------------------------ configuration

  @Test
  void parsesTheWholeConfiguration() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    assertEquals(List.of("127.0.0.1:9042", "db2:9042"), c.contactPoints);
    assertEquals("datacenter1", c.localDatacenter);
    assertEquals("u", c.username);
    assertEquals("s3cret", c.password);
    assertEquals(null, c.caFile);
    assertArrayEquals(new String[] {"id", "ts", "v"}, c.columns);
    assertArrayEquals(new int[] {0, 2, 1}, c.ordinals);
    assertArrayEquals(new int[] {0}, c.partitionKey);
    assertArrayEquals(new int[] {0, 1}, c.primaryKey);
    assertEquals(3, c.orderOrdinal);
    assertFalse(c.constantWriteTime);
    assertEquals(2, c.writeTimeOrdinal);
    assertFalse(c.writeTimeMicros);
    assertEquals(3600, c.ttlSeconds);
    assertEquals("LOCAL_ONE", c.consistency);
    assertEquals(64, c.maxInFlight);
    assertEquals(16, c.maxBatchRows);
    assertEquals(30_000, c.retryMillis);
    assertEquals(5000, c.requestTimeoutMillis);
    assertEquals("cp:orders", c.applicationName);
  }

  @Test
  void defaultsAndAConstantWriteTime() {
    CassandraWriter.Config c = CassandraWriter.Config.parse("{\"contact_points\": [\"h\"],"
        + " \"local_datacenter\": \"dc\", \"keyspace\": \"ks\", \"table\": \"t\","
        + " \"columns\": [{\"name\": \"id\", \"ordinal\": 0}], \"partition_key\": [\"id\"],"
        + " \"write_time\": {\"constant\": 1700000000000000}}");
    assertTrue(c.constantWriteTime);
    assertEquals(1_700_000_000_000_000L, c.writeTime);
    assertEquals(-1, c.orderOrdinal);
    assertEquals(null, c.ttlSeconds);
    assertEquals(null, c.username);
    assertEquals("LOCAL_QUORUM", c.consistency);
    assertEquals(128, c.maxInFlight);
    assertEquals(32, c.maxBatchRows);
    assertEquals(60_000, c.retryMillis);
    assertEquals(10_000, c.requestTimeoutMillis);
    assertArrayEquals(new int[] {0}, c.primaryKey);
  }

  @Test
  void tlsSettings() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG.replace("\"tls\": null",
        "\"tls\": {\"ca_file\": \"/ca.pem\", \"cert_file\": null, \"key_file\": null,"
            + " \"hostname_validation\": false}"));
    assertEquals("/ca.pem", c.caFile);
    assertFalse(c.hostnameValidation);
    assertEquals(null, c.certFile);
  }

  @Test
  void refusesABadConfigurationSayingWhichKey() {
    String[][] cases = {
      {"\"local_datacenter\": \"datacenter1\",", "", "local_datacenter is missing"},
      {"\"partition_key\": [\"id\"]", "\"partition_key\": [\"nope\"]", "partition_key names"},
      {"\"LOCAL_ONE\"", "\"SOMETIMES\"", "consistency is not a consistency level"},
      {"\"unit\": \"timestamp\"", "\"unit\": \"seconds\"", "write_time.unit"},
      {"\"max_batch_rows\": 16", "\"max_batch_rows\": 0", "max_batch_rows is below 1"},
      {"\"password\": \"s3cret\"", "\"password\": null", "username and password go together"},
      {"\"tls\": null", "\"tls\": {\"ca_file\": \"/ca\", \"cert_file\": \"/c\"}",
          "tls.cert_file and tls.key_file go together"},
      {"{\"name\": \"v\", \"ordinal\": 1}", "{\"name\": \"id\", \"ordinal\": 1}", "twice"},
      {"[\"127.0.0.1:9042\", \"db2\"]", "[\"h:99999\"]", "bad port"},
    };
    for (String[] c : cases) {
      String json = CONFIG.replace(c[0], c[1]);
      assertNotEquals(CONFIG, json, c[0]);
      CassandraWriter.DefinitionException e = assertThrows(
          CassandraWriter.DefinitionException.class, () -> CassandraWriter.Config.parse(json));
      assertTrue(e.getMessage().contains(c[2]), e.getMessage());
      assertFalse(e.getMessage().contains("s3cret"));
    }
    assertThrows(CassandraWriter.DefinitionException.class,
        () -> CassandraWriter.Config.parse("not json"));
  }

  @Test
  void contactPointsGetAPort() {
    assertEquals("db:9042", CassandraWriter.Config.contactPoint("db"));
    assertEquals("db:9142", CassandraWriter.Config.contactPoint(" db:9142 "));
    assertEquals("::1:9042", CassandraWriter.Config.contactPoint("[::1]"));
    assertEquals("::1:9043", CassandraWriter.Config.contactPoint("[::1]:9043"));
    assertEquals("fe80::1:9042", CassandraWriter.Config.contactPoint("fe80::1"));
  }

  @Test
  void checksOrdinalsAgainstTheFrame() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    String[] three = {"a", "b", "c"};
    CassandraWriter.DefinitionException e =
        assertThrows(CassandraWriter.DefinitionException.class, () -> c.checkFields(three));
    assertTrue(e.getMessage().contains("ordinal 3"), e.getMessage());
    c.checkFields(new String[] {"a", "b", "c", "d"});
    assertEquals("\"b\"", c.field(1));
  }

  @Test
  void theSessionKeyIsTheConnectionHashedAndNothingShowsThePassword() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    String key = c.sessionKey();
    assertEquals(64, key.length());
    assertFalse(key.contains("s3cret"));
    assertEquals(key, CassandraWriter.Config.parse(
        CONFIG.replace("\"table\": \"t\"", "\"table\": \"other\"")
            .replace("\"max_in_flight\": 64", "\"max_in_flight\": 8")).sessionKey());
    assertNotEquals(key, CassandraWriter.Config.parse(
        CONFIG.replace("s3cret", "other")).sessionKey());
    assertNotEquals(key, CassandraWriter.Config.parse(
        CONFIG.replace("datacenter1", "dc2")).sessionKey());
    assertFalse(c.toString().contains("s3cret"));
    assertFalse(c.toString().contains("127.0.0.1"));
  }

  // ------------------------------------------------------------ CQL text

  @Test
  void quotesIdentifiers() {
    assertEquals("\"id\"", CassandraWriter.quote("id"));
    assertEquals("\"Mixed Case\"", CassandraWriter.quote("Mixed Case"));
    assertEquals("\"a\"\"b\"", CassandraWriter.quote("a\"b"));
    assertEquals("\"\"\"\"", CassandraWriter.quote("\""));
  }

  @Test
  void theInsertStatement() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    assertEquals("INSERT INTO \"ks\".\"t\" (\"id\", \"ts\", \"v\") VALUES (?, ?, ?)"
        + " USING TIMESTAMP ? AND TTL ?", c.insertCql());
    c.ttlSeconds = null;
    c.keyspace = "K\"s";
    c.columns = new String[] {"x"};
    assertEquals("INSERT INTO \"K\"\"s\".\"t\" (\"x\") VALUES (?) USING TIMESTAMP ?",
        c.insertCql());
  }

  // ------------------------------------------------------------ values

  /** Convert for `type` and check the driver's codec for it encodes the result. */
  static Object convert(DataType type, Object value) {
    Object out = CassandraWriter.conversion(type, CODECS).apply(value);
    assertNotNull(CODECS.codecFor(type).encode(out, ProtocolVersion.DEFAULT));
    return out;
  }

  static void refused(DataType type, Object value, String text) {
    CassandraWriter.NoConversion e = assertThrows(CassandraWriter.NoConversion.class,
        () -> CassandraWriter.conversion(type, CODECS).apply(value));
    assertTrue(e.getMessage().contains(text), e.getMessage());
  }

  @Test
  void scalarsOfTheirOwnType() {
    assertEquals("x", convert(DataTypes.TEXT, "x"));
    assertEquals("x", convert(DataTypes.ASCII, "x"));
    assertEquals(true, convert(DataTypes.BOOLEAN, true));
    assertEquals((byte) 1, convert(DataTypes.TINYINT, (byte) 1));
    assertEquals((short) 2, convert(DataTypes.SMALLINT, (short) 2));
    assertEquals(3, convert(DataTypes.INT, 3));
    assertEquals(4L, convert(DataTypes.BIGINT, 4L));
    assertEquals(1.5f, convert(DataTypes.FLOAT, 1.5f));
    assertEquals(2.5, convert(DataTypes.DOUBLE, 2.5));
    assertEquals(new BigDecimal("1.25"), convert(DataTypes.DECIMAL, new BigDecimal("1.25")));
    assertEquals(BigInteger.TEN, convert(DataTypes.VARINT, BigInteger.TEN));
    assertEquals(ByteBuffer.wrap(new byte[] {1, 2}), convert(DataTypes.BLOB, new byte[] {1, 2}));
    assertEquals(LocalTime.of(1, 2, 3), convert(DataTypes.TIME, LocalTime.of(1, 2, 3)));
  }

  @Test
  void safeWideningsOnly() {
    assertEquals(3L, convert(DataTypes.BIGINT, 3));
    assertEquals(3L, convert(DataTypes.BIGINT, (short) 3));
    assertEquals(3, convert(DataTypes.INT, (byte) 3));
    assertEquals((short) 3, convert(DataTypes.SMALLINT, (byte) 3));
    assertEquals(1.5, convert(DataTypes.DOUBLE, 1.5f));
    assertEquals(7.0, convert(DataTypes.DOUBLE, 7));
    assertEquals(BigInteger.valueOf(Long.MAX_VALUE), convert(DataTypes.VARINT, Long.MAX_VALUE));
    assertEquals(new BigInteger("123"), convert(DataTypes.VARINT, new BigDecimal("123")));
    assertEquals(BigDecimal.valueOf(5), convert(DataTypes.DECIMAL, 5L));
    assertEquals(BigDecimal.valueOf(5), convert(DataTypes.DECIMAL, 5));
    assertEquals(new BigDecimal("2.5"),
        convert(DataTypes.DECIMAL, new scala.math.BigDecimal(new BigDecimal("2.5"))));
    refused(DataTypes.INT, 3L, "java.lang.Long does not convert to int");
    refused(DataTypes.FLOAT, 1.5, "java.lang.Double does not convert to float");
    refused(DataTypes.BIGINT, 1.0, "Double");
    refused(DataTypes.TINYINT, (short) 1, "Short");
    refused(DataTypes.INT, "3", "java.lang.String does not convert to int");
    refused(DataTypes.TEXT, 3, "Integer does not convert to text");
    refused(DataTypes.VARINT, new BigDecimal("1.5"), "fractional part");
    refused(DataTypes.ASCII, "é", "non-ASCII");
    refused(DataTypes.BOOLEAN, "true", "String");
  }

  @Test
  void timesAndDates() {
    Instant at = Instant.parse("2024-05-06T07:08:09.123456Z");
    java.sql.Timestamp ts = java.sql.Timestamp.from(at);
    assertEquals(at, convert(DataTypes.TIMESTAMP, ts));
    assertEquals(at, convert(DataTypes.TIMESTAMP, at));
    assertEquals(at, convert(DataTypes.TIMESTAMP, LocalDateTime.parse("2024-05-06T07:08:09.123456")));
    assertEquals(LocalDate.of(2024, 5, 6), convert(DataTypes.DATE, java.sql.Date.valueOf("2024-05-06")));
    assertEquals(LocalDate.of(1900, 1, 1), convert(DataTypes.DATE, LocalDate.of(1900, 1, 1)));
    refused(DataTypes.TIMESTAMP, 1700000000L, "Long");
    refused(DataTypes.DATE, ts, "Timestamp");
  }

  @Test
  void uuidsInetsAndDurations() {
    UUID random = UUID.randomUUID();
    assertEquals(random, convert(DataTypes.UUID, random.toString()));
    assertEquals(random, convert(DataTypes.UUID, random));
    UUID time = UUID.fromString("9b6c1c50-1a8e-11ef-9262-0242ac120002");
    assertEquals(time, convert(DataTypes.TIMEUUID, time.toString()));
    refused(DataTypes.TIMEUUID, random.toString(), "version 4");
    refused(DataTypes.UUID, "not-a-uuid", "not a UUID");
    assertEquals(InetAddress.getLoopbackAddress(), convert(DataTypes.INET, "127.0.0.1"));
    assertEquals(16, ((InetAddress) convert(DataTypes.INET, "::1")).getAddress().length);
    assertEquals(16, ((InetAddress) convert(DataTypes.INET, "[fe80::1]")).getAddress().length);
    refused(DataTypes.INET, "localhost", "not an IP address"); // never a DNS lookup
    refused(DataTypes.INET, "300.1.1.1", "not an IP address");
    refused(DataTypes.INET, "zz:1", "not an IP address");
    assertEquals(CqlDuration.newInstance(0, 0, 90_000_000_000L),
        convert(DataTypes.DURATION, Duration.ofSeconds(90)));
    assertEquals(CqlDuration.newInstance(14, 3, 0),
        convert(DataTypes.DURATION, Period.of(1, 2, 3)));
    assertEquals(CqlDuration.from("1h30m"), convert(DataTypes.DURATION, "1h30m"));
  }

  static StructType struct(Object... namesAndTypes) {
    StructField[] fields = new StructField[namesAndTypes.length / 2];
    for (int i = 0; i < fields.length; i++) {
      fields[i] = new StructField((String) namesAndTypes[2 * i],
          (org.apache.spark.sql.types.DataType) namesAndTypes[2 * i + 1], true, Metadata.empty());
    }
    return new StructType(fields);
  }

  static <T> scala.collection.immutable.Seq<T> seq(List<T> values) {
    return scala.jdk.javaapi.CollectionConverters.asScala(values).toList();
  }

  @Test
  void collections() {
    assertEquals(List.of(1L, 2L), convert(DataTypes.listOf(DataTypes.BIGINT), seq(List.of(1, 2))));
    assertEquals(List.of("a"), convert(DataTypes.listOf(DataTypes.TEXT), List.of("a")));
    assertEquals(new LinkedHashSet<>(List.of("a", "b")),
        convert(DataTypes.setOf(DataTypes.TEXT), seq(List.of("a", "b", "a"))));
    Map<String, Integer> javaMap = new LinkedHashMap<>();
    javaMap.put("k", 1);
    Object scalaMap = scala.jdk.javaapi.CollectionConverters.asScala(javaMap);
    assertEquals(Map.of("k", 1L),
        convert(DataTypes.mapOf(DataTypes.TEXT, DataTypes.BIGINT), scalaMap));
    assertEquals(Map.of("k", 1L),
        convert(DataTypes.mapOf(DataTypes.TEXT, DataTypes.BIGINT), javaMap));
    assertEquals(List.of(List.of(1), List.of()),
        convert(DataTypes.listOf(DataTypes.listOf(DataTypes.INT)),
            seq(List.of(seq(List.of(1)), seq(List.<Integer>of())))));
    refused(DataTypes.listOf(DataTypes.INT), seq(Arrays.asList(1, null)), "a null in a list");
    refused(DataTypes.listOf(DataTypes.INT), seq(List.of(1L)), "Long does not convert to int");
    refused(DataTypes.listOf(DataTypes.INT), "x", "does not convert to list");
  }

  @Test
  void vectors() {
    DataType vector = DataTypes.vectorOf(DataTypes.FLOAT, 3);
    Object out = convert(vector, seq(List.of(1f, 2f, 3f)));
    assertInstanceOf(CqlVector.class, out);
    assertEquals(CqlVector.newInstance(1f, 2f, 3f), out);
    refused(vector, seq(List.of(1f, 2f)), "a vector of 2 values");
    refused(vector, seq(List.of(1.0, 2.0, 3.0)), "Double does not convert to float");
  }

  @Test
  void tuplesAndUserDefinedTypes() {
    DataType tuple = DataTypes.tupleOf(DataTypes.INT, DataTypes.TEXT);
    TupleValue t = (TupleValue) convert(tuple, RowFactory.create(1, "a"));
    assertEquals(1, t.getInt(0));
    assertEquals("a", t.getString(1));
    TupleValue withNull = (TupleValue) convert(tuple, RowFactory.create(1, null));
    assertTrue(withNull.isNull(1));
    refused(tuple, RowFactory.create(1), "a struct of 1 fields for 2");

    UserDefinedType udt = new UserDefinedTypeBuilder("ks", "address")
        .withField("number", DataTypes.BIGINT)
        .withField("zip", DataTypes.INT)
        .build();
    Row byName = new GenericRowWithSchema(new Object[] {12345, 7L},
        struct("zip", IntegerType$.MODULE$, "number", LongType$.MODULE$));
    UdtValue u = (UdtValue) convert(udt, byName);
    assertEquals(7L, u.getLong("number"));
    assertEquals(12345, u.getInt("zip"));
    UdtValue byPosition = (UdtValue) convert(udt, RowFactory.create(8L, 1));
    assertEquals(8L, byPosition.getLong("number"));
    Row extra = new GenericRowWithSchema(new Object[] {1, 2},
        struct("zip", IntegerType$.MODULE$, "city", IntegerType$.MODULE$));
    refused(udt, extra, "field \"city\"");
  }

  @Test
  void writeTimes() {
    Instant at = Instant.parse("2024-05-06T07:08:09.123456789Z");
    long micros = at.getEpochSecond() * 1_000_000 + 123_456;
    assertEquals(micros, CassandraWriter.writeTimeMicros(java.sql.Timestamp.from(at), false));
    assertEquals(micros, CassandraWriter.writeTimeMicros(at, false));
    Instant before = Instant.parse("1969-12-31T23:59:59.5Z");
    assertEquals(-500_000, CassandraWriter.writeTimeMicros(before, false));
    assertEquals(-500_000,
        CassandraWriter.writeTimeMicros(java.sql.Timestamp.from(before), false));
    assertEquals(42L, CassandraWriter.writeTimeMicros(42L, true));
    assertThrows(CassandraWriter.NoConversion.class,
        () -> CassandraWriter.writeTimeMicros(at, true));
    assertThrows(CassandraWriter.NoConversion.class,
        () -> CassandraWriter.writeTimeMicros(42L, false));
  }

  // ------------------------------------------------------------ grouping

  @Test
  void batchesByPartitionKeyUpToTheRowLimit() {
    CassandraWriter.Batcher<String> b = new CassandraWriter.Batcher<>(3, 1 << 20);
    List<List<String>> ready = new ArrayList<>();
    String[][] rows = {{"a", "a1"}, {"b", "b1"}, {"a", "a2"}, {"c", "c1"}, {"a", "a3"},
        {"a", "a4"}, {"b", "b2"}};
    for (String[] row : rows) {
      ready.addAll(b.add(row[0], row[1], 10));
    }
    assertEquals(List.of(List.of("a1", "a2", "a3")), ready);
    assertEquals(4, b.held());
    assertEquals(List.of(List.of("b1", "b2"), List.of("c1"), List.of("a4")), b.drain());
    assertEquals(0, b.held());
    assertEquals(List.of(), b.drain());
  }

  @Test
  void oneRowPerBatchWhenTheLimitIsOne() {
    CassandraWriter.Batcher<String> b = new CassandraWriter.Batcher<>(1, 1 << 20);
    assertEquals(List.of(List.of("x")), b.add("k", "x", 1));
    assertEquals(List.of(List.of("y")), b.add("k", "y", 1));
    assertEquals(List.of(), b.drain());
  }

  @Test
  void batchesStayUnderTheByteLimit() {
    CassandraWriter.Batcher<String> b = new CassandraWriter.Batcher<>(100, 100);
    assertEquals(List.of(), b.add("k", "a", 60));
    assertEquals(List.of(List.of("a")), b.add("k", "b", 60)); // 120 > 100: a goes alone
    assertEquals(List.of(List.of("b")), b.add("k", "big", 500)); // too big for any batch
    assertEquals(List.of(List.of("big")), b.drain());
  }

  @Test
  void keysAreComparedByValue() {
    CassandraWriter.Batcher<String> b = new CassandraWriter.Batcher<>(10, 1 << 20);
    b.add(List.of(ByteBuffer.wrap(new byte[] {1}), ByteBuffer.wrap(new byte[] {2})), "x", 1);
    b.add(List.of(ByteBuffer.wrap(new byte[] {1}), ByteBuffer.wrap(new byte[] {2})), "y", 1);
    b.add(List.of(ByteBuffer.wrap(new byte[] {1}), ByteBuffer.wrap(new byte[] {3})), "z", 1);
    assertEquals(List.of(List.of("x", "y"), List.of("z")), b.drain());
  }

  @Test
  void keepsTheLastRowPerPrimaryKeyByOrder() {
    CassandraWriter.LastPerKey<String> last = new CassandraWriter.LastPerKey<>();
    last.add("a", 5, "a@5");
    last.add("b", 1, "b@1");
    last.add("a", 3, "a@3"); // older: dropped
    last.add("c", Long.MIN_VALUE, "c@null");
    last.add("b", 1, "b@1-later"); // a tie: the later row
    last.add("c", 0, "c@0");
    last.add("a", 9, "a@9");
    assertEquals(List.of("a@9", "b@1-later", "c@0"), last.values());
  }

  // ------------------------------------------------------------ errors

  static Node node(String name) {
    return (Node) java.lang.reflect.Proxy.newProxyInstance(Node.class.getClassLoader(),
        new Class<?>[] {Node.class}, (proxy, method, args) -> {
          switch (method.getName()) {
            case "toString":
              return name;
            case "hashCode":
              return name.hashCode();
            case "equals":
              return proxy == args[0];
            default:
              return null;
          }
        });
  }

  /** Named as netty's (relocated in the driver): classified by name. */
  static final class NotSslRecordException extends RuntimeException {
    NotSslRecordException(String message) {
      super(message);
    }
  }

  static AllNodesFailedException allFailed(Throwable... errors) {
    List<Map.Entry<Node, Throwable>> entries = new ArrayList<>();
    for (int i = 0; i < errors.length; i++) {
      entries.add(new AbstractMap.SimpleEntry<>(node("n" + i), errors[i]));
    }
    return AllNodesFailedException.fromErrors(entries);
  }

  @Test
  void transientFailures() {
    Node n = node("n");
    Throwable[] transients = {
      new NoNodeAvailableException(),
      new WriteTimeoutException(n, DefaultConsistencyLevel.QUORUM, 1, 2, DefaultWriteType.SIMPLE),
      new UnavailableException(n, DefaultConsistencyLevel.QUORUM, 2, 1),
      new OverloadedException(n),
      new BusyConnectionException(1024),
      new DriverTimeoutException("Query timed out after PT10S"),
      new ClosedConnectionException("Lost connection to remote peer"),
      new ConnectionInitException("could not connect", new ConnectException("refused")),
      new ConnectException("Connection refused"),
      allFailed(new ConnectException("refused"), new ClosedConnectionException("closed")),
      allFailed(new ConnectionInitException("init", new ConnectException("refused"))),
      new ConnectionInitException("ssl", new SSLHandshakeException("Remote host terminated")
          .initCause(new java.io.EOFException("SSL peer shut down incorrectly"))),
      new ConnectionInitException("closed", new ClosedConnectionException("Lost connection")),
      new java.util.concurrent.CompletionException(new OverloadedException(n)),
    };
    for (Throwable e : transients) {
      assertTrue(CassandraWriter.isTransient(e), e.toString());
    }
  }

  @Test
  void permanentFailures() {
    Node n = node("n");
    DefaultEndPoint endPoint = new DefaultEndPoint(new InetSocketAddress("127.0.0.1", 9042));
    Throwable[] permanents = {
      new InvalidQueryException(n, "unconfigured table t"),
      new SyntaxError(n, "line 1:0 no viable alternative"),
      new UnauthorizedException(n, "User u has no MODIFY permission"),
      new AuthenticationException(endPoint, "Provided username u and/or password are incorrect"),
      new CodecNotFoundException(DataTypes.INT, null),
      new InvalidKeyspaceException("Invalid keyspace ks"),
      new CassandraWriter.NoConversion("a java.lang.String does not convert to int"),
      new IllegalArgumentException("x"),
      allFailed(new AuthenticationException(endPoint, "bad credentials")),
      allFailed(new ConnectException("refused"), new InvalidQueryException(n, "bad")),
      new ConnectionInitException("ssl", new SSLHandshakeException("PKIX path building failed")
          .initCause(new CertificateException("unable to find valid certification path"))),
      new ConnectionInitException("ssl", new SSLHandshakeException("the certificate of 10.0.0.1"
          + " does not name it")),
      new ConnectionInitException("ssl", new SSLHandshakeException(
          "Received fatal alert: certificate_required")),
      new ConnectionInitException("ssl", new NotSslRecordException("not an SSL/TLS record")),
    };
    for (Throwable e : permanents) {
      assertFalse(CassandraWriter.isTransient(e), e.toString());
    }
  }

  @Test
  void failuresKeepTheDriversExceptionAsCause() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    InvalidQueryException refused = new InvalidQueryException(node("n"), "Undefined column name v");
    CassandraWriter.DefinitionException d = CassandraWriter.definition(c, "writing rows", refused);
    assertEquals(refused, d.getCause());
    assertTrue(d.getMessage().contains(InvalidQueryException.class.getName()), d.getMessage());
    assertTrue(d.getMessage().contains("\"ks\".\"t\""), d.getMessage());
    CassandraWriter.RetriesExhaustedException r =
        CassandraWriter.exhausted(c, "writing to", new NoNodeAvailableException());
    assertTrue(r.getMessage().contains("retrying for 30.0 s"), r.getMessage());
    assertTrue(r.getMessage().contains("NoNodeAvailableException"), r.getMessage());
    assertFalse(r.getMessage().contains("s3cret"));
  }

  @Test
  void retryingGivesUpOnPermanentFailuresAtOnceAndOnTransientOnesInTime() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG);
    c.retryMillis = 700;
    int[] calls = {0};
    assertThrows(CassandraWriter.DefinitionException.class,
        () -> CassandraWriter.retrying(() -> {
          calls[0]++;
          throw new InvalidQueryException(node("n"), "unconfigured table t");
        }, c, "x"));
    assertEquals(1, calls[0]);
    calls[0] = 0;
    long start = System.nanoTime();
    assertThrows(CassandraWriter.RetriesExhaustedException.class,
        () -> CassandraWriter.retrying(() -> {
          calls[0]++;
          throw new NoNodeAvailableException();
        }, c, "x"));
    long elapsed = (System.nanoTime() - start) / 1_000_000;
    // At 0, 100, 300 and 700 ms (the last wait cut to what is left of the 700 ms).
    assertTrue(calls[0] >= 3 && calls[0] <= 5, "calls " + calls[0]);
    assertTrue(elapsed >= 700 && elapsed < 1_500, "elapsed " + elapsed);
    calls[0] = 0;
    assertEquals("ok", CassandraWriter.retrying(() -> {
      if (++calls[0] < 3) {
        throw new OverloadedException(node("n"));
      }
      return "ok";
    }, c, "x"));
  }

  @Test
  void backoffNeverWaitsPastTheRetryTime() {
    assertEquals(100, CassandraWriter.backoff(0, 100, 60_000));
    assertEquals(5_000, CassandraWriter.backoff(10_000, 5_000, 60_000));
    assertEquals(300, CassandraWriter.backoff(59_700, 5_000, 60_000)); // the remainder only
    assertEquals(-1, CassandraWriter.backoff(60_000, 5_000, 60_000));
    assertEquals(-1, CassandraWriter.backoff(0, 100, 0)); // retry_seconds 0: no retry
  }

  /** The real driver, against a port nobody listens on: a transient failure, given up. */
  @Test
  void aRefusedConnectionIsRetriedThenGivenUp() {
    CassandraWriter.Config c = CassandraWriter.Config.parse(
        CONFIG.replace("[\"127.0.0.1:9042\", \"db2\"]", "[\"127.0.0.1:1\"]")
            .replace("\"retry_seconds\": 30", "\"retry_seconds\": 0.5"));
    long start = System.nanoTime();
    CassandraWriter.RetriesExhaustedException e = assertThrows(
        CassandraWriter.RetriesExhaustedException.class, () -> CassandraWriter.session(c));
    assertTrue((System.nanoTime() - start) / 1_000_000 < 10_000);
    assertInstanceOf(AllNodesFailedException.class, e.getCause());
    assertTrue(e.getMessage().contains("127.0.0.1:1"), e.getMessage());
    assertFalse(e.getMessage().contains("s3cret"));
  }

  // ------------------------------------------------------------ TLS

  @Test
  void readsPemKeysInPkcs8AndPkcs1() throws Exception {
    KeyPairGenerator rsa = KeyPairGenerator.getInstance("RSA");
    rsa.initialize(2048);
    PrivateKey key = rsa.generateKeyPair().getPrivate();
    byte[] pkcs8 = key.getEncoded();
    assertEquals(key, Tls.privateKey(pem("PRIVATE KEY", pkcs8)));
    // PKCS#8 of a 2048-bit RSA key: a 26-byte header, then the PKCS#1 key.
    byte[] pkcs1 = Arrays.copyOfRange(pkcs8, 26, pkcs8.length);
    assertArrayEquals(pkcs8, Tls.pkcs8OfPkcs1(pkcs1));
    assertEquals(key, Tls.privateKey(pem("RSA PRIVATE KEY", pkcs1)));
    KeyPairGenerator ec = KeyPairGenerator.getInstance("EC");
    PrivateKey ecKey = ec.generateKeyPair().getPrivate();
    assertEquals(ecKey, Tls.privateKey("junk\n" + pem("PRIVATE KEY", ecKey.getEncoded())));
    Tls.TlsException e = assertThrows(Tls.TlsException.class,
        () -> Tls.privateKey(pem("ENCRYPTED PRIVATE KEY", pkcs8)));
    assertTrue(e.getMessage().contains("pkcs8"), e.getMessage());
  }

  static String pem(String kind, byte[] der) {
    return "-----BEGIN " + kind + "-----\n"
        + Base64.getMimeEncoder(64, "\n".getBytes(StandardCharsets.US_ASCII)).encodeToString(der)
        + "\n-----END " + kind + "-----\n";
  }

  /** A self-signed certificate and its key (alias "node"), made by the JDK's keytool. */
  static KeyStore selfSigned(Path dir, String cn, String san) throws Exception {
    Path store = dir.resolve(cn.replace('*', '_') + san.hashCode() + ".p12");
    List<String> command = new ArrayList<>(List.of(
        Path.of(System.getProperty("java.home"), "bin", "keytool").toString(),
        "-genkeypair", "-keystore", store.toString(), "-storetype", "PKCS12",
        "-storepass", "changeit", "-alias", "node", "-keyalg", "RSA", "-keysize", "2048",
        "-dname", "CN=" + cn, "-validity", "2"));
    if (!san.isEmpty()) {
      command.addAll(List.of("-ext", "SAN=" + san));
    }
    Process keytool = new ProcessBuilder(command).redirectErrorStream(true).start();
    assertEquals(0, keytool.waitFor(), new String(keytool.getInputStream().readAllBytes()));
    KeyStore p12 = KeyStore.getInstance("PKCS12");
    try (var in = Files.newInputStream(store)) {
      p12.load(in, "changeit".toCharArray());
    }
    return p12;
  }

  @Test
  void checksHostNamesAgainstTheCertificate(@TempDir Path dir) throws Exception {
    java.security.cert.X509Certificate sans = (java.security.cert.X509Certificate)
        selfSigned(dir, "node1", "dns:db.example.org,dns:*.nodes.example.org,ip:10.1.2.3,ip:::1")
            .getCertificate("node");
    CassandraWriter.HostnameChecking.check(sans, "10.1.2.3");
    CassandraWriter.HostnameChecking.check(sans, "::1");
    CassandraWriter.HostnameChecking.check(sans, "0:0:0:0:0:0:0:1");
    CassandraWriter.HostnameChecking.check(sans, "DB.example.org");
    CassandraWriter.HostnameChecking.check(sans, "n7.nodes.example.org");
    for (String other : new String[] {"10.1.2.4", "node1", "a.b.nodes.example.org",
        "nodes.example.org", "example.org"}) {
      assertThrows(CertificateException.class,
          () -> CassandraWriter.HostnameChecking.check(sans, other), other);
    }
    java.security.cert.X509Certificate cnOnly = (java.security.cert.X509Certificate)
        selfSigned(dir, "db2.example.org", "").getCertificate("node");
    CassandraWriter.HostnameChecking.check(cnOnly, "db2.example.org");
    assertThrows(CertificateException.class,
        () -> CassandraWriter.HostnameChecking.check(cnOnly, "db3.example.org"));
    assertThrows(CertificateException.class,
        () -> CassandraWriter.HostnameChecking.check(cnOnly, "10.9.9.9"));
  }

  @Test
  void buildsAnSslContextFromPemFiles(@TempDir Path dir) throws Exception {
    KeyStore p12 = selfSigned(dir, "localhost", "");
    Path cert = dir.resolve("cert.pem");
    Path key = dir.resolve("key.pem");
    Files.writeString(cert, "subject=CN=localhost\n"
        + pem("CERTIFICATE", p12.getCertificate("node").getEncoded()));
    Files.writeString(key, pem("PRIVATE KEY",
        p12.getKey("node", "changeit".toCharArray()).getEncoded()));
    String tls = "\"tls\": {\"ca_file\": \"" + cert + "\", \"cert_file\": \"" + cert
        + "\", \"key_file\": \"" + key + "\", \"hostname_validation\": true}";
    CassandraWriter.Config c = CassandraWriter.Config.parse(CONFIG.replace("\"tls\": null", tls));
    SSLContext context = CassandraWriter.sslContext(c);
    assertNotNull(context.createSSLEngine());
    c.caFile = dir.resolve("missing.pem").toString();
    CassandraWriter.DefinitionException e = assertThrows(
        CassandraWriter.DefinitionException.class, () -> CassandraWriter.sslContext(c));
    assertTrue(e.getMessage().contains("tls.ca_file"), e.getMessage());
    c.caFile = key.toString();
    e = assertThrows(CassandraWriter.DefinitionException.class, () -> CassandraWriter.sslContext(c));
    assertTrue(e.getMessage().contains("no PEM certificate"), e.getMessage());
  }
}
