package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.sun.net.httpserver.HttpServer;
import java.io.ByteArrayOutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.atomic.AtomicInteger;
import org.apache.avro.Schema;
import org.apache.avro.generic.GenericData;
import org.apache.avro.generic.GenericDatumWriter;
import org.apache.avro.generic.GenericRecord;
import org.apache.avro.io.BinaryEncoder;
import org.apache.avro.io.EncoderFactory;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.BoundReference;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.StructType;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Confluent-framed Avro decoder against a registry served in-process (the JDK's HTTP
 * server answering Confluent's {@code GET /schemas/ids/{id}}): three writer versions read as
 * one reader schema, and each way a record becomes a dead letter, with its reason; the
 * registry away (cached ids go on, a new one fails the task after retry_seconds) and refusing
 * credentials. The real registry and Spark: tests/test_avro_registry.py.
 */
class ConfluentAvroTest {
  static final String V1 = "{\"type\":\"record\",\"name\":\"Delivery\",\"namespace\":\"acme\","
      + "\"fields\":[{\"name\":\"id\",\"type\":\"string\"},{\"name\":\"n\",\"type\":\"int\"}]}";
  // v2: a field added with a default; n promoted to long.
  static final String V2 = "{\"type\":\"record\",\"name\":\"Delivery\",\"namespace\":\"acme\","
      + "\"fields\":[{\"name\":\"id\",\"type\":\"string\"},{\"name\":\"n\",\"type\":\"long\"},"
      + "{\"name\":\"status\",\"type\":\"string\",\"default\":\"created\"}]}";
  // v3: n removed (the reader's default applies), a field the reader does not know added.
  static final String V3 = "{\"type\":\"record\",\"name\":\"Delivery\",\"namespace\":\"acme\","
      + "\"fields\":[{\"name\":\"id\",\"type\":\"string\"},"
      + "{\"name\":\"status\",\"type\":\"string\",\"default\":\"created\"},"
      + "{\"name\":\"courier\",\"type\":[\"null\",\"string\"],\"default\":null}]}";
  // The reader: v2 with a default for n.
  static final String READER = "{\"type\":\"record\",\"name\":\"Delivery\",\"namespace\":"
      + "\"acme\",\"fields\":[{\"name\":\"id\",\"type\":\"string\"},{\"name\":\"n\",\"type\":"
      + "\"long\",\"default\":-1},{\"name\":\"status\",\"type\":\"string\",\"default\":"
      + "\"created\"}]}";
  // A writer the reader cannot read: id is a number.
  static final String BAD = "{\"type\":\"record\",\"name\":\"Delivery\",\"namespace\":\"acme\","
      + "\"fields\":[{\"name\":\"id\",\"type\":\"int\"}]}";

  HttpServer server;
  final Map<Integer, String> schemas = new ConcurrentHashMap<>();
  final AtomicInteger asked = new AtomicInteger();
  volatile int status = 200;
  volatile String expectedAuth;

  @BeforeEach
  void start() throws Exception {
    ConfluentAvro.Schemas.forget();
    schemas.put(1, V1);
    schemas.put(2, V2);
    schemas.put(3, V3);
    schemas.put(9, BAD);
    server = HttpServer.create(new InetSocketAddress("127.0.0.1", 0), 0);
    server.createContext("/registry/schemas/ids/", exchange -> {
      asked.incrementAndGet();
      String auth = exchange.getRequestHeaders().getFirst("Authorization");
      int id = Integer.parseInt(exchange.getRequestURI().getPath().replaceAll(".*/", ""));
      String schema = schemas.get(id);
      int code = expectedAuth != null && !expectedAuth.equals(auth) ? 401
          : status != 200 ? status : schema == null ? 404 : 200;
      byte[] body = (code == 200
          ? "{\"schema\":" + quote(schema) + "}"
          : "{\"error_code\":" + code + "01,\"message\":\"no\"}").getBytes(StandardCharsets.UTF_8);
      exchange.sendResponseHeaders(code, body.length);
      exchange.getResponseBody().write(body);
      exchange.close();
    });
    server.start();
  }

  @AfterEach
  void stop() {
    if (server != null) {
      server.stop(0);
    }
    ConfluentAvro.Schemas.forget();
  }

  static String quote(String text) {
    return "\"" + text.replace("\\", "\\\\").replace("\"", "\\\"") + "\"";
  }

  String config(double retrySeconds, String auth) {
    return "{\"registry\": {\"url\": \"http://127.0.0.1:" + server.getAddress().getPort()
        + "/registry/\", \"timeout_seconds\": 2" + auth + "}, \"reader_schema\": "
        + quote(READER) + ", \"retry_seconds\": " + retrySeconds + "}";
  }

  ConfluentAvro decoder(String config) {
    return new ConfluentAvro(new BoundReference(0, DataTypes.BinaryType, true), config);
  }

  static byte[] framed(int id, String schemaText, Map<String, Object> values) throws Exception {
    Schema schema = new Schema.Parser().parse(schemaText);
    GenericRecord record = new GenericData.Record(schema);
    values.forEach(record::put);
    ByteArrayOutputStream out = new ByteArrayOutputStream();
    out.write(0);
    out.write(new byte[] {(byte) (id >>> 24), (byte) (id >>> 16), (byte) (id >>> 8), (byte) id});
    BinaryEncoder encoder = EncoderFactory.get().binaryEncoder(out, null);
    new GenericDatumWriter<GenericRecord>(schema).write(record, encoder);
    encoder.flush();
    return out.toByteArray();
  }

  static InternalRow decode(ConfluentAvro decoder, byte[] value) {
    return (InternalRow) decoder.eval(new GenericInternalRow(new Object[] {value}));
  }

  @Test
  void readsThreeWriterVersionsAsTheReaderSchema() throws Exception {
    ConfluentAvro decoder = decoder(config(5, ""));
    StructType type = (StructType) decoder.dataType();
    assertEquals("struct<record:struct<id:string,n:bigint,status:string>,schema_id:int,"
        + "error:string>", type.simpleString());
    InternalRow one = decode(decoder, framed(1, V1, Map.of("id", "d1", "n", 7)));
    assertNull(one.getUTF8String(2), () -> one.getUTF8String(2).toString());
    assertEquals(1, one.getInt(1));
    InternalRow record = one.getStruct(0, 3);
    assertEquals("d1", record.getUTF8String(0).toString());
    assertEquals(7L, record.getLong(1));
    assertEquals("created", record.getUTF8String(2).toString()); // the reader's default
    InternalRow two = decode(decoder, framed(2, V2, Map.of("id", "d2", "n", 8L, "status",
        "assigned"))).getStruct(0, 3);
    assertEquals("d2 8 assigned", two.getUTF8String(0) + " " + two.getLong(1) + " "
        + two.getUTF8String(2));
    InternalRow three = decode(decoder, framed(3, V3, Map.of("id", "d3", "status",
        "delivered", "courier", "ann"))).getStruct(0, 3);
    assertEquals("d3 -1 delivered", three.getUTF8String(0) + " " + three.getLong(1) + " "
        + three.getUTF8String(2));
    // Each id asked once, however many records carry it.
    decode(decoder, framed(1, V1, Map.of("id", "d4", "n", 9)));
    assertEquals(3, asked.get());
  }

  @Test
  void badRecordsAreDeadLettersWithTheirReasons() throws Exception {
    ConfluentAvro decoder = decoder(config(5, ""));
    assertTrue(error(decoder, new byte[] {0, 0, 1}).contains("shorter than its 5-byte header"));
    assertTrue(error(decoder, "{\"id\":1}".getBytes(StandardCharsets.UTF_8))
        .contains("its first byte is 123, not 0"));
    assertTrue(error(decoder, framed(77, V1, Map.of("id", "x", "n", 1)))
        .contains("schema id 77 is not in the schema registry"));
    String incompatible = error(decoder, framed(9, BAD, Map.of("id", 5)));
    assertTrue(incompatible.contains("written with schema id 9, which cannot be read"),
        incompatible);
    byte[] cut = framed(2, V2, Map.of("id", "d2", "n", 8L, "status", "assigned"));
    String truncated = error(decoder, java.util.Arrays.copyOf(cut, 7));
    assertTrue(truncated.startsWith("does not decode with writer schema id 2"), truncated);
  }

  static String error(ConfluentAvro decoder, byte[] value) {
    InternalRow row = decode(decoder, value);
    assertTrue(row.isNullAt(0), "a record for a dead letter");
    assertFalse(row.isNullAt(2), "no reason");
    return row.getUTF8String(2).toString();
  }

  @Test
  void cachedIdsGoOnWhileTheRegistryIsAwayAndANewOneFailsTheTaskInWords() throws Exception {
    ConfluentAvro decoder = decoder(config(0.5, ""));
    decode(decoder, framed(1, V1, Map.of("id", "d1", "n", 7)));
    server.stop(0);
    server = null;
    // Another task (a new copy of the expression) still knows id 1: the JVM's cache.
    ConfluentAvro other = decoder(decoder.configJson());
    assertNull(decode(other, framed(1, V1, Map.of("id", "d1", "n", 7))).getUTF8String(2));
    ConfluentAvro.RegistryUnavailableException e = assertThrows(
        ConfluentAvro.RegistryUnavailableException.class,
        () -> decode(other, framed(2, V2, Map.of("id", "d2", "n", 8L, "status", "x"))));
    assertTrue(e.getMessage().contains("did not answer") && e.getMessage().contains("id 2"),
        e.getMessage());
  }

  @Test
  void aServerErrorIsWaitedForAndRefusedCredentialsFailAtOnce() throws Exception {
    status = 503;
    ConfluentAvro decoder = decoder(config(0.5, ""));
    assertThrows(ConfluentAvro.RegistryUnavailableException.class,
        () -> decode(decoder, framed(1, V1, Map.of("id", "d1", "n", 7))));
    assertTrue(asked.get() >= 2, "asked again before giving up: " + asked.get());
    status = 200;
    expectedAuth = "Basic " + java.util.Base64.getEncoder().encodeToString(
        "reader:right".getBytes(StandardCharsets.UTF_8));
    ConfluentAvro wrong = decoder(config(5, ", \"auth\": \"basic\", \"username\": \"reader\","
        + " \"password\": \"wrong\""));
    ConfluentAvro.RegistryRefusedException refused = assertThrows(
        ConfluentAvro.RegistryRefusedException.class,
        () -> decode(wrong, framed(1, V1, Map.of("id", "d1", "n", 7))));
    assertFalse(refused.getMessage().contains("wrong"), "the password in words");
    ConfluentAvro right = decoder(config(5, ", \"auth\": \"basic\", \"username\": \"reader\","
        + " \"password\": \"right\""));
    assertNull(decode(right, framed(1, V1, Map.of("id", "d1", "n", 7))).getUTF8String(2));
  }

  @Test
  void thePlanShowsNoConfiguration() {
    ConfluentAvro decoder = decoder(config(5, ", \"auth\": \"bearer\", \"token\": \"s3cret\""));
    assertFalse(decoder.toString().contains("s3cret"), decoder.toString());
    assertFalse(decoder.toString().contains("registry"), decoder.toString());
  }
}
