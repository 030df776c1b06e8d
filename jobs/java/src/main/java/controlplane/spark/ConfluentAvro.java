package controlplane.spark;

import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.IOException;
import java.io.Serializable;
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.Base64;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.Map;
import org.apache.avro.Schema;
import org.apache.avro.SchemaCompatibility;
import org.apache.spark.sql.Column;
import org.apache.avro.generic.GenericDatumReader;
import org.apache.avro.io.BinaryDecoder;
import org.apache.avro.io.DecoderFactory;
import org.apache.spark.sql.avro.AvroDeserializer;
import org.apache.spark.sql.avro.AvroOptions;
import org.apache.spark.sql.avro.SchemaConverters;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.CodeBlock;
import org.apache.spark.sql.catalyst.expressions.codegen.JavaCode;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.classic.ExpressionUtils;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.DataTypes;
import org.apache.spark.sql.types.Metadata;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.unsafe.types.UTF8String;

/**
 * Kafka values in Confluent's wire format (a zero byte, the writer schema's id in 4 bytes
 * big-endian, the Avro body), decoded in the executors' JVM into the reader schema's row: a
 * Catalyst expression over the value's bytes, giving a struct {record, schema_id, error}.
 *
 * <p>Each record's writer schema is looked up by its id in the schema registry (Confluent's
 * REST API: {@code GET /schemas/ids/{id}}), once per executor JVM (a bounded cache shared by
 * every task), and the body resolved to the reader schema by Avro's resolution rules (fields
 * added with defaults, removed, promoted) by Avro's resolving reader, then turned into the
 * reader's row by Spark's own AvroDeserializer, as {@code from_avro} does. A value
 * that is not in the wire format, whose id the registry does not know, whose writer schema
 * cannot be read as the reader schema, or whose body does not decode gives {record null,
 * error: the reason in words}: a dead letter, never a failed batch. A registry that does not
 * answer (down, 5xx, a timeout) is asked again with backoff for up to {@code retry_seconds},
 * then the task fails ({@link RegistryUnavailableException}: transient, the restart policy
 * decides); credentials refused fail it at once ({@link RegistryRefusedException}). Ids already
 * cached keep decoding while the registry is away.
 *
 * <p>The configuration (JSON: {@code registry} {url, auth, username, password, token, ca_file,
 * cert_file, key_file, timeout_seconds}, {@code reader_schema}, {@code retry_seconds}, {@code
 * max_cached}) never shows in the plan's text (only the value's column does).
 */
public final class ConfluentAvro extends Expression implements Serializable {
  private static final long serialVersionUID = 1L;
  static final int HEADER_BYTES = 5;
  static final long FIRST_DELAY_MS = 200;
  static final long MAX_DELAY_MS = 5_000;
  private static final ObjectMapper JSON = new ObjectMapper();

  /** The registry did not answer for retry_seconds (transient: waiting may fix it). */
  public static final class RegistryUnavailableException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RegistryUnavailableException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  /** The registry refused the connection's credentials (401/403): permanent. */
  public static final class RegistryRefusedException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public RegistryRefusedException(String message) {
      super(message);
    }
  }

  /** The configuration cannot work (a reader schema that does not parse...): permanent. */
  public static final class DefinitionException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    public DefinitionException(String message, Throwable cause) {
      super(message, cause);
    }
  }

  private final Expression child;
  private final String configJson;
  private transient Config config;
  private transient DataType type;
  private transient DataType recordType;
  // Per writer schema id, its decoder (this expression is one task's at a time).
  private transient Map<Integer, Decoder> decoders;

  public ConfluentAvro(Expression child, String configJson) {
    this.child = child;
    this.configJson = configJson;
  }

  /** The decoding column over a binary column (from Python: the value). */
  public static Column column(Column value, String configJson) {
    ConfluentAvro expression = new ConfluentAvro(ExpressionUtils.expression(value), configJson);
    expression.config(); // a configuration that does not parse fails here, on the driver
    return ExpressionUtils.column(expression);
  }

  // ------------------------------------------------------------ the expression

  public Expression child() {
    return child;
  }

  String configJson() {
    return configJson;
  }

  @Override
  public scala.collection.immutable.Seq<Expression> children() {
    return scala.collection.immutable.List$.MODULE$.<Expression>empty().$colon$colon(child);
  }

  @Override
  public Expression withNewChildrenInternal(
      scala.collection.immutable.IndexedSeq<Expression> newChildren) {
    return new ConfluentAvro(newChildren.apply(0), configJson);
  }

  @Override
  public boolean foldable() {
    return false;
  }

  @Override
  public Object eval(InternalRow input) {
    Object value = child.eval(input);
    return value == null ? null : nullSafeEval(value);
  }

  @Override
  public DataType dataType() {
    if (type == null) {
      type = new StructType(new StructField[] {
          new StructField("record", recordType(), true, Metadata.empty()),
          new StructField("schema_id", DataTypes.IntegerType, true, Metadata.empty()),
          new StructField("error", DataTypes.StringType, true, Metadata.empty())});
    }
    return type;
  }

  DataType recordType() {
    if (recordType == null) {
      recordType = SchemaConverters.toSqlType(config().reader).dataType().asNullable();
    }
    return recordType;
  }

  @Override
  public boolean nullable() {
    return true;
  }

  @Override
  public org.apache.spark.sql.catalyst.analysis.TypeCheckResult checkInputDataTypes() {
    if (child.dataType() instanceof org.apache.spark.sql.types.BinaryType) {
      return org.apache.spark.sql.catalyst.analysis.TypeCheckResult.TypeCheckSuccess$.MODULE$;
    }
    return new org.apache.spark.sql.catalyst.analysis.TypeCheckResult.TypeCheckFailure(
        "confluent_avro takes a binary value, not " + child.dataType().simpleString());
  }

  Object nullSafeEval(Object input) {
    byte[] value = (byte[]) input;
    if (value.length < HEADER_BYTES || value[0] != 0) {
      return result(null, null, value.length < HEADER_BYTES
          ? "not in Confluent's wire format: " + value.length + " byte(s), shorter than its"
              + " 5-byte header"
          : "not in Confluent's wire format: its first byte is " + (value[0] & 0xff)
              + ", not 0");
    }
    int id = ((value[1] & 0xff) << 24) | ((value[2] & 0xff) << 16) | ((value[3] & 0xff) << 8)
        | (value[4] & 0xff);
    Decoder decoder = decoder(id);
    if (decoder.problem != null) {
      return result(null, id, decoder.problem);
    }
    try {
      return result(decoder.decode(value), id, null);
    } catch (Exception e) { // from_avro's SparkException is a checked one, thrown from Scala
      return result(null, id, "does not decode with writer schema id " + id + ": "
          + innermost(e));
    }
  }

  private static InternalRow result(Object record, Integer id, String error) {
    return new GenericInternalRow(new Object[] {
        record, id, error == null ? null : UTF8String.fromString(error)});
  }

  /**
   * Generated code, as from_avro's: the value's bytes from the child's own generated code,
   * then {@link #decodeBytes} through a reference to this expression. (CodegenFallback would
   * make whole-stage code materialize every input row to call eval on it.)
   */
  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    ExprCode input = child.genCode(ctx);
    String self = ctx.addReferenceObj("confluentAvro", this, ConfluentAvro.class.getName());
    String code = input.code().toString() + "\n"
        + "boolean " + ev.isNull() + " = " + input.isNull() + ";\n"
        + "InternalRow " + ev.value() + " = null;\n"
        + "if (!" + ev.isNull() + ") {\n"
        + "  " + ev.value() + " = (InternalRow) " + self + ".decodeBytes(" + input.value()
        + ");\n"
        + "}\n";
    CodeBlock block = new CodeBlock(
        scala.jdk.javaapi.CollectionConverters.asScala(java.util.List.of(code)).toList(),
        scala.collection.immutable.List$.MODULE$.<JavaCode>empty());
    return ev.copy(block, ev.isNull(), ev.value());
  }

  /** What the generated code calls for a value that is not null. */
  public Object decodeBytes(byte[] value) {
    return nullSafeEval(value);
  }

  @Override
  public String prettyName() {
    return "confluent_avro";
  }

  @Override
  public int productArity() {
    return 1; // the configuration (a secret in it) stays out of the plan's text
  }

  @Override
  public Object productElement(int n) {
    if (n == 0) {
      return child;
    }
    throw new IndexOutOfBoundsException(String.valueOf(n));
  }

  @Override
  public boolean canEqual(Object that) {
    return that instanceof ConfluentAvro;
  }

  @Override
  public boolean equals(Object that) {
    return that instanceof ConfluentAvro && ((ConfluentAvro) that).child.equals(child)
        && ((ConfluentAvro) that).configJson.equals(configJson);
  }

  @Override
  public int hashCode() {
    return child.hashCode() * 31 + configJson.hashCode();
  }

  // ------------------------------------------------------------ decoding

  /**
   * One writer schema's decoder (Avro's resolving reader from the writer to the reader schema,
   * then Spark's own AvroDeserializer into the reader's row, as from_avro does, reading the
   * body in place after the header), or why records of its id are dead letters.
   */
  static final class Decoder {
    final GenericDatumReader<Object> reader;
    final AvroDeserializer deserializer;
    final String problem;
    private BinaryDecoder binary;
    private Object reused;

    Decoder(GenericDatumReader<Object> reader, AvroDeserializer deserializer, String problem) {
      this.reader = reader;
      this.deserializer = deserializer;
      this.problem = problem;
    }

    Object decode(byte[] value) throws IOException {
      binary = DecoderFactory.get().binaryDecoder(
          value, HEADER_BYTES, value.length - HEADER_BYTES, binary);
      reused = reader.read(reused, binary);
      return deserializer.deserialize(reused).get();
    }
  }

  private Decoder decoder(int id) {
    if (decoders == null) {
      decoders = new HashMap<>();
    }
    Decoder found = decoders.get(id);
    if (found == null) {
      found = newDecoder(id);
      decoders.put(id, found);
    }
    return found;
  }

  private Decoder newDecoder(int id) {
    Config c = config();
    Schema writer = Schemas.get(c, id);
    if (writer == null) {
      return new Decoder(null, null, "schema id " + id + " is not in the schema registry");
    }
    String incompatible = Schemas.incompatibility(c, id, writer);
    if (incompatible != null) {
      return new Decoder(null, null, "written with schema id " + id + ", which cannot be read"
          + " as the reader schema: " + incompatible);
    }
    // from_avro's own options (its defaults and the session's settings, as it reads them).
    AvroOptions options = AvroOptions.apply(scala.collection.immutable.Map$.MODULE$.empty());
    AvroDeserializer deserializer = new AvroDeserializer(c.reader, recordType(),
        options.datetimeRebaseModeInRead(), options.useStableIdForUnionType(),
        options.stableIdPrefixForUnionType(), options.recursiveFieldMaxDepth());
    return new Decoder(new GenericDatumReader<>(writer, c.reader), deserializer, null);
  }

  static String describe(SchemaCompatibility.SchemaPairCompatibility compatibility) {
    StringBuilder out = new StringBuilder();
    for (SchemaCompatibility.Incompatibility each
        : compatibility.getResult().getIncompatibilities()) {
      if (out.length() > 0) {
        out.append("; ");
      }
      out.append(each.getType()).append(" at ").append(each.getLocation());
      if (each.getMessage() != null && !each.getMessage().isEmpty()) {
        out.append(" (").append(each.getMessage()).append(")");
      }
    }
    return out.length() > 0 ? out.toString() : compatibility.getDescription();
  }

  static String innermost(Throwable e) {
    Throwable at = e;
    while (at.getCause() != null && at.getCause() != at) {
      at = at.getCause();
    }
    String message = at.getMessage();
    String text = at.getClass().getSimpleName() + (message == null ? "" : ": " + message);
    return text.length() > 300 ? text.substring(0, 297) + "..." : text;
  }

  // ------------------------------------------------------------ configuration

  Config config() {
    if (config == null) {
      config = Config.parse(configJson);
    }
    return config;
  }

  static final class Config {
    String url;
    String auth;
    String username;
    String password;
    String token;
    String caFile;
    String certFile;
    String keyFile;
    Duration timeout;
    long retryMillis;
    int maxCached;
    String readerJson;
    Schema reader;

    static Config parse(String json) {
      try {
        JsonNode root = JSON.readTree(json);
        JsonNode registry = root.path("registry");
        Config c = new Config();
        c.url = text(registry, "url");
        if (c.url == null) {
          throw new IllegalArgumentException("registry.url is missing");
        }
        c.url = c.url.replaceAll("/+$", "");
        c.auth = registry.path("auth").asText("none");
        c.username = text(registry, "username");
        c.password = text(registry, "password");
        c.token = text(registry, "token");
        c.caFile = text(registry, "ca_file");
        c.certFile = text(registry, "cert_file");
        c.keyFile = text(registry, "key_file");
        c.timeout = Duration.ofMillis((long) (registry.path("timeout_seconds").asDouble(10.0)
            * 1000));
        c.retryMillis = (long) (root.path("retry_seconds").asDouble(60.0) * 1000);
        c.maxCached = root.path("max_cached").asInt(1000);
        c.readerJson = text(root, "reader_schema");
        if (c.readerJson == null) {
          throw new IllegalArgumentException("reader_schema is missing");
        }
        c.reader = new Schema.Parser().parse(c.readerJson);
        return c;
      } catch (IOException | RuntimeException e) {
        throw new DefinitionException("confluent_avro: " + innermost(e), e);
      }
    }

    private static String text(JsonNode node, String name) {
      JsonNode value = node.get(name);
      return value == null || value.isNull() ? null : value.asText();
    }

    String key() {
      return url + "|" + auth + "|" + username;
    }
  }

  // ------------------------------------------------------------ the registry

  /**
   * Writer schemas by registry and id, shared by every task of this JVM: bounded (the least
   * recently used goes), and only what the registry answered (an id it does not know is asked
   * again by the next task that meets it).
   */
  static final class Schemas {
    private static final Map<String, Schema> CACHE = new LinkedHashMap<>(64, 0.75f, true);
    private static final Map<String, HttpClient> CLIENTS = new HashMap<>();

    static Schema get(Config c, int id) {
      String key = c.key() + "#" + id;
      synchronized (CACHE) {
        Schema found = CACHE.get(key);
        if (found != null) {
          return found;
        }
      }
      String text = fetch(c, id);
      if (text == null) {
        return null;
      }
      Schema schema;
      try {
        schema = new Schema.Parser().parse(text);
      } catch (RuntimeException e) {
        throw new DefinitionException("the schema registry's schema id " + id
            + " does not parse as Avro: " + innermost(e), e);
      }
      synchronized (CACHE) {
        CACHE.put(key, schema);
        while (CACHE.size() > Math.max(1, c.maxCached)) {
          CACHE.remove(CACHE.keySet().iterator().next());
        }
      }
      return schema;
    }

    // Per reader schema and writer id, why the reader cannot read the writer ("" if it can):
    // asked once per JVM, not once per task.
    private static final Map<String, String> VERDICTS = new LinkedHashMap<>(64, 0.75f, true);

    static String incompatibility(Config c, int id, Schema writer) {
      String key = c.key() + "#" + id + "#" + c.readerJson.hashCode() + "#" + c.readerJson;
      synchronized (VERDICTS) {
        String found = VERDICTS.get(key);
        if (found != null) {
          return found.isEmpty() ? null : found;
        }
      }
      SchemaCompatibility.SchemaPairCompatibility compatibility =
          SchemaCompatibility.checkReaderWriterCompatibility(c.reader, writer);
      String verdict =
          compatibility.getType() == SchemaCompatibility.SchemaCompatibilityType.COMPATIBLE
              ? "" : describe(compatibility);
      synchronized (VERDICTS) {
        VERDICTS.put(key, verdict);
        while (VERDICTS.size() > Math.max(1, c.maxCached)) {
          VERDICTS.remove(VERDICTS.keySet().iterator().next());
        }
      }
      return verdict.isEmpty() ? null : verdict;
    }

    static void forget() {
      synchronized (CACHE) {
        CACHE.clear();
      }
      synchronized (VERDICTS) {
        VERDICTS.clear();
      }
    }

    /** The schema's text, or null if the registry does not know the id (404). */
    static String fetch(Config c, int id) {
      long deadline = System.currentTimeMillis() + c.retryMillis;
      long delay = FIRST_DELAY_MS;
      while (true) {
        Exception failure;
        try {
          HttpResponse<byte[]> response = client(c).send(request(c, "/schemas/ids/" + id),
              HttpResponse.BodyHandlers.ofByteArray());
          int status = response.statusCode();
          if (status == 200) {
            JsonNode body = JSON.readTree(response.body());
            JsonNode schema = body.get("schema");
            if (schema == null || !schema.isTextual()) {
              throw new DefinitionException("the schema registry at " + c.url
                  + " answered schema id " + id + " without a schema", null);
            }
            return schema.asText();
          }
          if (status == 404) {
            return null;
          }
          if (status == 401 || status == 403) {
            throw new RegistryRefusedException("the schema registry at " + c.url
                + " refused the connection's credentials (" + status + ") asked for schema id "
                + id);
          }
          failure = new IOException("HTTP " + status + ": " + new String(response.body(),
              StandardCharsets.UTF_8).replaceAll("\\s+", " ").trim());
          if (status < 500 && status != 429) {
            throw new DefinitionException("the schema registry at " + c.url + " answered "
                + failure.getMessage() + " asked for schema id " + id, failure);
          }
        } catch (IOException e) {
          failure = e;
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new RegistryUnavailableException("interrupted asking the schema registry", e);
        }
        if (System.currentTimeMillis() + delay > deadline) {
          throw new RegistryUnavailableException("the schema registry at " + c.url
              + " did not answer for " + (c.retryMillis / 1000) + " s asked for schema id " + id
              + ": " + innermost(failure), failure);
        }
        try {
          Thread.sleep(delay);
        } catch (InterruptedException e) {
          Thread.currentThread().interrupt();
          throw new RegistryUnavailableException("interrupted asking the schema registry", e);
        }
        delay = Math.min(delay * 2, MAX_DELAY_MS);
      }
    }

    static HttpRequest request(Config c, String path) {
      HttpRequest.Builder request = HttpRequest.newBuilder(URI.create(c.url + path))
          .timeout(c.timeout)
          .header("Accept", "application/vnd.schemaregistry.v1+json, application/json")
          .GET();
      if ("basic".equals(c.auth)) {
        String pair = (c.username == null ? "" : c.username) + ":"
            + (c.password == null ? "" : c.password);
        request.header("Authorization", "Basic "
            + Base64.getEncoder().encodeToString(pair.getBytes(StandardCharsets.UTF_8)));
      } else if ("bearer".equals(c.auth)) {
        request.header("Authorization", "Bearer " + (c.token == null ? "" : c.token));
      }
      return request.build();
    }

    static HttpClient client(Config c) {
      synchronized (CLIENTS) {
        return CLIENTS.computeIfAbsent(c.key() + "|" + c.caFile + "|" + c.certFile, k -> {
          HttpClient.Builder builder = HttpClient.newBuilder()
              .connectTimeout(c.timeout)
              .followRedirects(HttpClient.Redirect.NEVER)
              .proxy(java.net.ProxySelector.of(null));
          if (c.caFile != null || c.certFile != null) {
            try {
              // The host name is checked by the client itself (HTTPS endpoint identification).
              builder.sslContext(Tls.context(c.caFile, c.certFile, c.keyFile, null));
            } catch (Tls.TlsException e) {
              throw new DefinitionException("schema registry TLS: " + e.getMessage(), e);
            }
          }
          return builder.build();
        });
      }
    }
  }
}
