package controlplane.spark;

import com.fasterxml.jackson.databind.ObjectMapper;
import java.io.Serializable;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListConsumerGroupOffsetsOptions;
import org.apache.kafka.clients.consumer.ConsumerGroupMetadata;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.spark.TaskContext;
import org.apache.spark.api.java.function.FlatMapFunction;
import org.apache.spark.sql.Dataset;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.util.ArrayData;

/**
 * The Kafka sink of jobs.sinks.kafka.client, exactly once, in the executors' JVM: each task writes
 * its Spark partition's records (and its dead letters) in one Kafka transaction, together with
 * its commit marker, with a transactional id of its own that is the same for every attempt.
 *
 * <p>The marker is a consumer-group offset committed inside the transaction
 * (sendOffsetsToTransaction): Kafka's own consume-transform-produce protocol, the one Kafka
 * Streams uses. One group per partition writer ("part"): where the partition reads one Kafka
 * offset range (Spark's connector, no shuffle), the part is the source topic-partition and the
 * marker is the end of the range read (the source progress, as the source's offsets); else
 * the part is Spark's partition number (a shuffle hashed into a pinned count; the Python
 * reader's cut kept in its offset log) and the marker is the batch's number + 1. A task first
 * takes over its transactional id (initTransactions: an open transaction of an earlier attempt
 * is aborted and that writer fenced), then reads its group's committed offset (requireStable:
 * after any pending transactional commit settled); at or past its own target, the partition
 * was written before (a retry, a replayed batch) and nothing is written again.
 *
 * <p>Records go to partitions by Kafka's default partitioner (by key). Producers are kept per
 * transactional id between batches (initTransactions once), closed after IDLE_MILLIS unused.
 */
public final class KafkaTxWriter
    implements FlatMapFunction<Iterator<InternalRow>, long[]>, Serializable {
  private static final long serialVersionUID = 1L;

  private final Map<String, String> producerConfig;
  private final String topic;
  private final String deadLetterTopic;
  private final String prefix; // transactional ids and group ids: prefix + part
  private final long batchId;
  private final int keyOrdinal; // -1: no key
  private final int valueOrdinal;
  private final int headersOrdinal; // -1: no headers; else array<struct<key string, value binary>>
  private final int badOrdinal; // -1: every row is a record
  // topic, partition, offset, timestamp, value of a dead letter; none: bad rows are counted only
  private final int[] deadOrdinals;
  private final String parseError;
  private final String emptyValueError;
  private final boolean checkScheme; // the first batch of a run: see checkScheme()
  private final List<String> sourceParts; // the source's "topic-partition"s (checkScheme)
  private String[] parts; // per Spark partition: its part (group / transactional id suffix)
  private long[] targets; // per Spark partition: the offset its marker commits
  private String[] ranges; // per Spark partition: "from:until" it reads, null if untraced

  @SuppressWarnings("unchecked")
  public KafkaTxWriter(String json) throws Exception {
    Map<String, Object> c = new ObjectMapper().readValue(json, Map.class);
    producerConfig = new TreeMap<>((Map<String, String>) c.get("producer"));
    topic = (String) c.get("topic");
    deadLetterTopic = (String) c.get("dead_letter_topic");
    prefix = (String) c.get("prefix");
    batchId = ((Number) c.get("batch_id")).longValue();
    keyOrdinal = ((Number) c.get("key_ordinal")).intValue();
    valueOrdinal = ((Number) c.get("value_ordinal")).intValue();
    headersOrdinal = ((Number) c.get("headers_ordinal")).intValue();
    badOrdinal = ((Number) c.get("bad_ordinal")).intValue();
    List<?> dead = (List<?>) c.get("dead_ordinals");
    deadOrdinals = new int[dead.size()];
    for (int i = 0; i < deadOrdinals.length; i++) {
      deadOrdinals[i] = ((Number) dead.get(i)).intValue();
    }
    parseError = (String) c.get("parse_error");
    emptyValueError = (String) c.get("empty_value_error");
    checkScheme = Boolean.TRUE.equals(c.get("check_scheme"));
    Object source = c.get("source_parts");
    sourceParts = source == null ? Collections.emptyList() : (List<String>) source;
  }

  /**
   * Parts and marker targets for partitions reading these ranges ("topic-partition:from:until",
   * null where one cannot be traced): the source topic-partition and the range's end where
   * every partition reads one range (a topic-partition read by several partitions, split by
   * minPartitions or read twice by a UNION ALL, gets "#1", "#2"... in partition order, which
   * follows the offsets); else "p" + Spark's partition number and the batch's number + 1.
   */
  static Object[] plan(String[] ranges, long batchId) {
    String[] parts = new String[ranges.length];
    long[] targets = new long[ranges.length];
    String[] spans = new String[ranges.length];
    Map<String, Integer> seen = new HashMap<>();
    boolean traced = true;
    for (String range : ranges) {
      traced &= range != null;
    }
    for (int i = 0; i < ranges.length; i++) {
      if (!traced) {
        parts[i] = "p" + i;
        targets[i] = batchId + 1;
        continue;
      }
      int until = ranges[i].lastIndexOf(':');
      int from = ranges[i].lastIndexOf(':', until - 1);
      String tp = ranges[i].substring(0, from);
      int occurrence = seen.merge(tp, 1, Integer::sum);
      parts[i] = occurrence == 1 ? tp : tp + "#" + (occurrence - 1);
      targets[i] = Long.parseLong(ranges[i].substring(until + 1));
      spans[i] = ranges[i].substring(from + 1);
    }
    return new Object[] {parts, targets, spans};
  }

  /** Write every partition of the frame; returns {records, dead letters} over all of them. */
  public static long[] write(Dataset<Row> frame, String json) throws Exception {
    KafkaTxWriter writer = new KafkaTxWriter(json);
    org.apache.spark.rdd.RDD<InternalRow> rdd = frame.queryExecution().toRdd();
    String[] ranges = new String[rdd.getNumPartitions()];
    for (int i = 0; i < ranges.length; i++) {
      ranges[i] = PgCopyWriter.kafkaRange(rdd, i);
    }
    Object[] plan = plan(ranges, writer.batchId);
    writer.parts = (String[]) plan[0];
    writer.targets = (long[]) plan[1];
    writer.ranges = (String[]) plan[2];
    if (writer.checkScheme) {
      List<String> other = new ArrayList<>();
      if (writer.ranges.length > 0 && writer.ranges[0] == null) {
        other.addAll(writer.sourceParts); // planned by number now: were they by range?
      } else {
        for (int i = 0; i < writer.parts.length; i++) {
          other.add("p" + i); // planned by range now: were they by number?
        }
      }
      writer.checkScheme(other);
    }
    List<long[]> parts = rdd.toJavaRDD().mapPartitions(writer).collect();
    long[] total = new long[2];
    for (long[] part : parts) {
      total[0] += part[0];
      total[1] += part[1];
    }
    return total;
  }

  /**
   * The committed marker offset of every part of a prefix's groups that has one (for tests
   * and tools that check markers; a task reads its own with marker()).
   */
  public static Map<String, Long> committed(String json, List<String> parts) throws Exception {
    KafkaTxWriter writer = new KafkaTxWriter(json);
    Map<String, Long> out = new TreeMap<>();
    for (String part : parts) {
      OffsetAndMetadata found = writer.marker(part);
      if (found != null) {
        out.put(part, found.offset());
      }
    }
    return out;
  }

  /**
   * A replayed batch's parts must be named as the first time: when it is planned under the
   * other naming (its transform gained or lost a shuffle since, or the reader changed), the
   * parts it wrote are under other names and would be written again. Fails then, naming
   * what to restore, as the Postgres sink does (MixedWritesError). Checked for the first
   * batch of a run (the only one that can be a replay), with the names the other scheme
   * would use.
   */
  void checkScheme(List<String> otherParts) throws Exception {
    for (String part : otherParts) {
      OffsetAndMetadata found = marker(part);
      if (found != null && batchOf(found) == batchId) {
        throw new IllegalStateException(
            "MixedWritesError: batch " + batchId + " was partly written to Kafka under part "
                + part + " before a restart, and is now planned with other parts (the"
                + " transform gained or lost a shuffle, or the reader changed): it cannot be"
                + " completed exactly once. Restore the previous transform until this batch"
                + " is committed.");
      }
    }
  }

  private static final ObjectMapper JSON = new ObjectMapper();

  /** The batch a marker was committed for (its metadata), -1 if it does not say. */
  static long batchOf(OffsetAndMetadata marker) {
    try {
      Object batch = JSON.readValue(marker.metadata(), Map.class).get("batch");
      return batch instanceof Number ? ((Number) batch).longValue() : -1;
    } catch (Exception e) {
      return -1;
    }
  }

  static String rangeOf(OffsetAndMetadata marker) {
    try {
      Object range = JSON.readValue(marker.metadata(), Map.class).get("range");
      return range instanceof String ? (String) range : null;
    } catch (Exception e) {
      return null;
    }
  }

  @Override
  public Iterator<long[]> call(Iterator<InternalRow> rows) throws Exception {
    int index = TaskContext.getPartitionId();
    if (!rows.hasNext()) {
      // Nothing to write, now or in a replay (the same input gives the same nothing).
      return Collections.singletonList(new long[] {0, 0}).iterator();
    }
    String part = parts[index];
    long target = targets[index];
    String range = ranges == null ? null : ranges[index];
    KafkaProducer<byte[], byte[]> producer = acquire(prefix + part);
    boolean open = false;
    try {
      OffsetAndMetadata marker = marker(part);
      // Written before (a retry, a replayed batch) only when the marker is this batch's: a
      // marker of an earlier batch at or past the target means the source's offsets went
      // back (a topic deleted and created again), not that this range was written.
      if (marker != null && batchOf(marker) == batchId) {
        String written = rangeOf(marker);
        if (range != null && written != null && !range.equals(written)) {
          throw new IllegalStateException(
              "batch " + batchId + " part " + part + " was written for offsets " + written
                  + " and is now planned for " + range + " (records deleted by retention"
                  + " meanwhile?): it cannot be completed exactly once");
        }
        long[] counted = PgCopyWriter.count(rows, badOrdinal);
        release(prefix + part, producer);
        return Collections.singletonList(counted).iterator();
      }
      producer.beginTransaction();
      open = true;
      long written = 0, letters = 0, skipped = 0;
      while (rows.hasNext()) {
        InternalRow row = rows.next();
        if (badOrdinal >= 0 && row.getBoolean(badOrdinal)) {
          if (deadOrdinals.length == 0) {
            skipped++;
          } else {
            producer.send(deadLetter(row));
            letters++;
          }
          continue;
        }
        producer.send(record(row));
        written++;
      }
      Map<String, Object> meta = new HashMap<>();
      meta.put("batch", batchId);
      meta.put("records", written);
      meta.put("dead", letters);
      if (range != null) {
        meta.put("range", range);
      }
      String metadata = JSON.writeValueAsString(meta);
      producer.sendOffsetsToTransaction(
          Collections.singletonMap(
              new TopicPartition(topic, 0), new OffsetAndMetadata(target, metadata)),
          new ConsumerGroupMetadata(prefix + part));
      producer.commitTransaction(); // throws if any send failed: nothing of it is visible
      open = false;
      release(prefix + part, producer);
      return Collections.singletonList(new long[] {written, letters + skipped}).iterator();
    } catch (Exception e) {
      if (open) {
        try {
          producer.abortTransaction();
        } catch (Exception ignored) {
          // fenced or broken: closing it below aborts nothing more; the next owner does
        }
      }
      discard(producer);
      throw e;
    }
  }

  private ProducerRecord<byte[], byte[]> record(InternalRow row) {
    byte[] key = keyOrdinal < 0 || row.isNullAt(keyOrdinal) ? null : row.getBinary(keyOrdinal);
    byte[] value = row.isNullAt(valueOrdinal) ? null : row.getBinary(valueOrdinal);
    List<Header> headers = new ArrayList<>();
    if (headersOrdinal >= 0 && !row.isNullAt(headersOrdinal)) {
      ArrayData array = row.getArray(headersOrdinal);
      for (int i = 0; i < array.numElements(); i++) {
        InternalRow header = array.getStruct(i, 2);
        if (header.isNullAt(0)) {
          continue;
        }
        headers.add(
            new RecordHeader(
                header.getUTF8String(0).toString(),
                header.isNullAt(1) ? null : header.getBinary(1)));
      }
    }
    return new ProducerRecord<>(topic, null, key, value, headers);
  }

  /** A record that did not parse, as it was, with where it came from and why in headers. */
  private ProducerRecord<byte[], byte[]> deadLetter(InternalRow row) {
    int t = deadOrdinals[0], p = deadOrdinals[1], o = deadOrdinals[2];
    int stamp = deadOrdinals[3], v = deadOrdinals[4];
    byte[] value = row.isNullAt(v) ? null : row.getBinary(v);
    List<Header> headers = new ArrayList<>();
    String reason = PgCopyWriter.reason(row, deadOrdinals);
    headers.add(header("cp-error",
        reason != null ? reason : value == null ? emptyValueError : parseError));
    if (!row.isNullAt(t)) {
      headers.add(header("cp-source-topic", row.getUTF8String(t).toString()));
    }
    headers.add(header("cp-source-partition", Integer.toString(row.getInt(p))));
    headers.add(header("cp-source-offset", Long.toString(row.getLong(o))));
    Long timestamp = row.isNullAt(stamp) ? null : row.getLong(stamp) / 1000; // µs -> ms
    if (timestamp != null && timestamp < 0) {
      timestamp = null; // Kafka's -1 (none): the producer stamps it
    }
    return new ProducerRecord<>(deadLetterTopic, null, timestamp, null, value, headers);
  }

  private static Header header(String key, String value) {
    return new RecordHeader(key, value.getBytes(StandardCharsets.UTF_8));
  }

  // -- markers ---------------------------------------------------------------------------

  /** The part's committed marker, null if none; waits for pending transactions. */
  OffsetAndMetadata marker(String part) throws Exception {
    Map<TopicPartition, OffsetAndMetadata> offsets =
        admin()
            .listConsumerGroupOffsets(
                prefix + part, new ListConsumerGroupOffsetsOptions().requireStable(true))
            .partitionsToOffsetAndMetadata()
            .get(60, TimeUnit.SECONDS);
    return offsets.get(new TopicPartition(topic, 0));
  }

  // -- clients kept in the executor's JVM ------------------------------------------------

  private static final long IDLE_MILLIS = 300_000;
  private static final Map<String, Object[]> PRODUCERS = new HashMap<>(); // key -> producer, used
  private static final Map<String, Object[]> ADMINS = new HashMap<>(); // connection -> admin, used
  // Producer settings that are not the connection's (an Admin of the same cluster is shared).
  private static final java.util.Set<String> PRODUCER_ONLY =
      java.util.Set.of(
          "transaction.timeout.ms", "linger.ms", "batch.size", "compression.type",
          "max.request.size");
  private static final java.util.concurrent.ScheduledExecutorService REAPER =
      java.util.concurrent.Executors.newSingleThreadScheduledExecutor(
          task -> {
            Thread thread = new Thread(task, "cp-kafka-sink-reaper");
            thread.setDaemon(true);
            return thread;
          });

  static {
    // Clients of pipelines that stopped (or of parts no longer planned) are closed after
    // IDLE_MILLIS unused, so a shared application does not keep their threads.
    REAPER.scheduleWithFixedDelay(KafkaTxWriter::closeIdle, 60, 60, TimeUnit.SECONDS);
  }

  private String clientKey() {
    return producerConfig.toString();
  }

  private String connectionKey() {
    Map<String, String> connection = new TreeMap<>(producerConfig);
    connection.keySet().removeAll(PRODUCER_ONLY);
    return connection.toString();
  }

  private Admin admin() {
    synchronized (ADMINS) {
      Object[] entry =
          ADMINS.computeIfAbsent(
              connectionKey(), k -> new Object[] {Admin.create(properties(null)), 0L});
      entry[1] = System.currentTimeMillis();
      return (Admin) entry[0];
    }
  }

  static void closeIdle() {
    long now = System.currentTimeMillis();
    List<AutoCloseable> idle = new ArrayList<>();
    for (Map<String, Object[]> clients : List.of(PRODUCERS, ADMINS)) {
      synchronized (clients) {
        for (Iterator<Object[]> it = clients.values().iterator(); it.hasNext(); ) {
          Object[] entry = it.next();
          if (now - (Long) entry[1] > IDLE_MILLIS) {
            idle.add((AutoCloseable) entry[0]);
            it.remove();
          }
        }
      }
    }
    for (AutoCloseable client : idle) {
      try {
        client.close();
      } catch (Exception ignored) {
        // closing what nobody uses: nothing to report
      }
    }
  }

  private Properties properties(String transactionalId) {
    Properties props = new Properties();
    props.putAll(producerConfig);
    if (transactionalId != null) {
      props.put("transactional.id", transactionalId);
      props.put("enable.idempotence", "true");
      props.put("acks", "all");
      props.put("key.serializer", ByteArraySerializer.class.getName());
      props.put("value.serializer", ByteArraySerializer.class.getName());
    } else {
      props.keySet().removeAll(PRODUCER_ONLY);
    }
    return props;
  }

  @SuppressWarnings("unchecked")
  private KafkaProducer<byte[], byte[]> acquire(String transactionalId) {
    Object[] cached;
    synchronized (PRODUCERS) {
      cached = PRODUCERS.remove(clientKey() + "\u0000" + transactionalId);
    }
    if (cached != null) {
      return (KafkaProducer<byte[], byte[]>) cached[0];
    }
    KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(properties(transactionalId));
    try {
      producer.initTransactions(); // aborts an earlier attempt's open transaction, fences it
    } catch (RuntimeException e) {
      producer.close(java.time.Duration.ZERO);
      throw e;
    }
    return producer;
  }

  private void release(String transactionalId, KafkaProducer<byte[], byte[]> producer) {
    String key = clientKey() + "\u0000" + transactionalId;
    Object[] previous;
    synchronized (PRODUCERS) {
      previous = PRODUCERS.put(key, new Object[] {producer, System.currentTimeMillis()});
    }
    if (previous != null && previous[0] != producer) {
      ((KafkaProducer<?, ?>) previous[0]).close(java.time.Duration.ZERO);
    }
  }

  private static void discard(KafkaProducer<byte[], byte[]> producer) {
    try {
      producer.close(java.time.Duration.ZERO);
    } catch (Exception ignored) {
      // already broken
    }
  }
}
