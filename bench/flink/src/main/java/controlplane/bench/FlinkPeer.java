package controlplane.bench;

import com.fasterxml.jackson.annotation.JsonIgnoreProperties;
import com.fasterxml.jackson.databind.DeserializationFeature;
import com.fasterxml.jackson.databind.ObjectMapper;
import java.lang.management.ManagementFactory;
import java.sql.Timestamp;
import java.time.Instant;
import java.time.OffsetDateTime;
import java.util.UUID;
import java.util.concurrent.atomic.AtomicLong;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.functions.RichMapFunction;
import org.apache.flink.connector.jdbc.JdbcConnectionOptions;
import org.apache.flink.connector.jdbc.JdbcExactlyOnceOptions;
import org.apache.flink.connector.jdbc.JdbcExecutionOptions;
import org.apache.flink.connector.jdbc.core.datastream.sink.JdbcSink;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.datastream.DataStream;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.v2.DiscardingSink;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.postgresql.xa.PGXADataSource;

/**
 * The peer in bench/throughput.py: Apache Flink draining one Kafka topic of JSON delivery events
 * from its start to its end (a bounded Kafka source), in a local MiniCluster in this JVM with
 * the given parallelism, each value read by Jackson into a POJO, into Flink's discarding sink
 * ({@code noop}), the JDBC connector's exactly-once sink (XA transactions committed at each
 * checkpoint: {@code jdbc-xa}) or its at-least-once sink ({@code jdbc}), into a table the bench
 * made.
 *
 * <pre>java -cp ... controlplane.bench.FlinkPeer MODE BOOTSTRAP TOPIC EXPECTED PARALLELISM WARMUPS
 *     [JDBC_URL USER TABLE]</pre>
 *
 * The job runs WARMUPS times unmeasured first (the JIT's work, as the Spark paths are measured
 * in a warmed-up driver), then once measured. Prints one JSON line: the events read, the
 * seconds from the first record parsed to the job's end, and this JVM's CPU seconds over the
 * same window (so that start-up is left out, as the Spark paths leave out their query's
 * start).
 */
public final class FlinkPeer {
  static final AtomicLong COUNT = new AtomicLong();
  static final AtomicLong FIRST_NANOS = new AtomicLong();
  static final AtomicLong FIRST_CPU = new AtomicLong();

  /** The event, as Jackson reads it (the fields the Spark pipelines' schema has). */
  @JsonIgnoreProperties(ignoreUnknown = true)
  public static final class Delivery {
    public String delivery_id;
    public String courier_id;
    public String status;
    public double lat;
    public double lon;
    public Instant event_time;

    public Delivery() {}
  }

  /** Parses a value; notes when the first record was parsed, and this JVM's CPU then. */
  static final class Parse extends RichMapFunction<byte[], Delivery> {
    private transient ObjectMapper mapper;

    @Override
    public void open(org.apache.flink.api.common.functions.OpenContext context) {
      mapper =
          new ObjectMapper()
              .configure(DeserializationFeature.FAIL_ON_UNKNOWN_PROPERTIES, false)
              .registerModule(new InstantModule());
    }

    @Override
    public Delivery map(byte[] value) throws Exception {
      if (COUNT.getAndIncrement() == 0) {
        FIRST_CPU.set(cpuNanos());
        FIRST_NANOS.set(System.nanoTime());
      }
      return mapper.readValue(value, Delivery.class);
    }
  }

  /** ISO 8601 text into an Instant, with Java's own parser (no jsr310 module needed). */
  static final class InstantModule extends com.fasterxml.jackson.databind.module.SimpleModule {
    InstantModule() {
      addDeserializer(
          Instant.class,
          new com.fasterxml.jackson.databind.JsonDeserializer<Instant>() {
            @Override
            public Instant deserialize(
                com.fasterxml.jackson.core.JsonParser parser,
                com.fasterxml.jackson.databind.DeserializationContext context)
                throws java.io.IOException {
              return OffsetDateTime.parse(parser.getText()).toInstant();
            }
          });
    }
  }

  static long cpuNanos() {
    return ((com.sun.management.OperatingSystemMXBean)
            ManagementFactory.getOperatingSystemMXBean())
        .getProcessCpuTime();
  }

  public static void main(String[] args) throws Exception {
    String mode = args[0];
    long expected = Long.parseLong(args[3]);
    int warmups = Integer.parseInt(args[5]);
    for (int pass = 0; pass <= warmups; pass++) {
      COUNT.set(0);
      run(args);
    }
    long end = System.nanoTime();
    long cpu = cpuNanos();
    double seconds = (end - FIRST_NANOS.get()) / 1e9;
    System.out.printf(
        "{\"mode\": \"%s\", \"events\": %d, \"expected\": %d, \"seconds\": %.3f,"
            + " \"jvm_cpu_seconds\": %.3f, \"warmups\": %d}%n",
        mode, COUNT.get(), expected, seconds, (cpu - FIRST_CPU.get()) / 1e9, warmups);
  }

  static void run(String[] args) throws Exception {
    String mode = args[0];
    String bootstrap = args[1];
    String topic = args[2];
    int parallelism = Integer.parseInt(args[4]);
    StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
    env.setParallelism(parallelism);
    if (!mode.equals("noop")) {
      env.enableCheckpointing(5_000); // the XA sink commits at each checkpoint
    }
    KafkaSource<byte[]> source =
        KafkaSource.<byte[]>builder()
            .setBootstrapServers(bootstrap)
            .setTopics(topic)
            .setGroupId("flink-peer-" + UUID.randomUUID())
            .setStartingOffsets(OffsetsInitializer.earliest())
            .setBounded(OffsetsInitializer.latest())
            .setDeserializer(KafkaRecordDeserializationSchema.valueOnly(ByteArrayDeserializer.class))
            .build();
    DataStream<Delivery> parsed =
        env.fromSource(source, WatermarkStrategy.noWatermarks(), "kafka").map(new Parse());
    String sql =
        "INSERT INTO \"%s\" (delivery_id, courier_id, status, lat, lon, event_time)"
            + " VALUES (?, ?, ?, ?, ?, ?)";
    switch (mode) {
      case "noop" -> parsed.sinkTo(new DiscardingSink<>());
      case "jdbc", "jdbc-xa" -> {
        String url = args[6];
        String user = args[7];
        String table = args[8];
        var builder =
            JdbcSink.<Delivery>builder()
                .withQueryStatement(
                    String.format(sql, table),
                    (statement, d) -> {
                      statement.setString(1, d.delivery_id);
                      statement.setString(2, d.courier_id);
                      statement.setString(3, d.status);
                      statement.setDouble(4, d.lat);
                      statement.setDouble(5, d.lon);
                      statement.setTimestamp(6, Timestamp.from(d.event_time));
                    })
                .withExecutionOptions(
                    JdbcExecutionOptions.builder()
                        .withBatchSize(5_000)
                        .withBatchIntervalMs(200)
                        .withMaxRetries(0)
                        .build());
        if (mode.equals("jdbc")) {
          parsed.sinkTo(
              builder.buildAtLeastOnce(
                  new JdbcConnectionOptions.JdbcConnectionOptionsBuilder()
                      .withUrl(url)
                      .withDriverName("org.postgresql.Driver")
                      .withUsername(user)
                      .withPassword(System.getenv().getOrDefault("FLINK_PEER_PASSWORD", ""))
                      .build()));
        } else {
          parsed.sinkTo(
              builder.buildExactlyOnce(
                  JdbcExactlyOnceOptions.builder().withTransactionPerConnection(true).build(),
                  () -> {
                    PGXADataSource xa = new PGXADataSource();
                    xa.setUrl(url);
                    xa.setUser(user);
                    xa.setPassword(System.getenv().getOrDefault("FLINK_PEER_PASSWORD", ""));
                    return xa;
                  }));
        }
      }
      default -> throw new IllegalArgumentException("mode: noop, jdbc or jdbc-xa; not " + mode);
    }
    env.execute("flink-peer " + mode);
  }
}
