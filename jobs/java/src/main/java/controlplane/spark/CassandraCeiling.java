package controlplane.spark;

import com.datastax.oss.driver.api.core.CqlSession;
import com.datastax.oss.driver.api.core.DefaultConsistencyLevel;
import com.datastax.oss.driver.api.core.cql.BoundStatement;
import com.datastax.oss.driver.api.core.cql.PreparedStatement;
import com.datastax.oss.driver.api.core.cql.SimpleStatement;
import java.time.Instant;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicReference;

/**
 * The benchmark's ceiling for the cassandra sink (bench/sinks.py): the same rows as the bench's
 * events, written by a bare loop of the Java driver, with no Spark and no Kafka: one prepared
 * INSERT ... USING TIMESTAMP per row, asynchronous, at most `inFlight` requests at a time (the
 * sink's tasks' concurrency in all), through the sink's own session (CassandraWriter.session),
 * latencies recorded in the same histogram the sink's writes use (CassandraWriter.LATENCIES).
 */
public final class CassandraCeiling {
  private CassandraCeiling() {}

  /**
   * Write `rows` rows {delivery_id, courier_id, status, lat, lon, event_time, note} into the
   * config's table; returns the seconds it took. `configJson`: a CassandraWriter config (its
   * connection, keyspace, table and consistency; its columns are ignored).
   */
  public static double run(String configJson, long rows, int inFlight) throws Exception {
    CassandraWriter.Config config = CassandraWriter.Config.parse(configJson);
    CqlSession session = CassandraWriter.session(config);
    String table = "\"" + config.keyspace.replace("\"", "\"\"") + "\".\""
        + config.table.replace("\"", "\"\"") + "\"";
    PreparedStatement insert = session.prepare(SimpleStatement.newInstance("INSERT INTO " + table
        + " (delivery_id, courier_id, status, lat, lon, event_time, note) VALUES (?, ?, ?, ?, ?,"
        + " ?, ?) USING TIMESTAMP ?"));
    String[] statuses = {"created", "assigned", "picked_up", "in_transit", "delivered"};
    Semaphore permits = new Semaphore(inFlight);
    AtomicReference<Throwable> failed = new AtomicReference<>();
    Instant at = Instant.parse("2026-11-28T10:00:00Z");
    long started = System.nanoTime();
    for (long i = 0; i < rows && failed.get() == null; i++) {
      BoundStatement bound = insert.bind(
              String.format("D%09d", i),
              String.format("C%04d", i % 997),
              statuses[(int) (i % statuses.length)],
              55.70 + (i % 1000) / 10000.0,
              37.50 + (i % 2000) / 10000.0,
              at.plusMillis(i),
              "ok",
              1L)
          .setConsistencyLevel(DefaultConsistencyLevel.valueOf(config.consistency))
          .setIdempotent(true);
      permits.acquire();
      long sent = System.nanoTime();
      session.executeAsync(bound).whenComplete((rs, error) -> {
        if (error == null) {
          CassandraWriter.LATENCIES.record(System.nanoTime() - sent);
        } else {
          failed.compareAndSet(null, error);
        }
        permits.release();
      });
    }
    if (!permits.tryAcquire(inFlight, 10, TimeUnit.MINUTES)) {
      throw new IllegalStateException("writes still in flight after 10 minutes");
    }
    if (failed.get() != null) {
      throw new IllegalStateException("a write failed: " + failed.get(), failed.get());
    }
    return (System.nanoTime() - started) / 1e9;
  }
}
