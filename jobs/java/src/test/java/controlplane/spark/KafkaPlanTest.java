package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;

import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.junit.jupiter.api.Test;

/** KafkaTxWriter.plan and the markers' metadata: which part each partition writes under. */
class KafkaPlanTest {

  @Test
  void tracedPartitionsArePartsOfTheirSourceTopicPartition() {
    Object[] plan =
        KafkaTxWriter.plan(
            new String[] {"orders.eu-0:10:20", "orders.eu-1:5:9", "orders.eu-0:20:30"}, 7);
    assertArrayEquals(
        new String[] {"orders.eu-0", "orders.eu-1", "orders.eu-0#1"}, (String[]) plan[0]);
    assertArrayEquals(new long[] {20, 9, 30}, (long[]) plan[1]); // the end of each range
    assertArrayEquals(new String[] {"10:20", "5:9", "20:30"}, (String[]) plan[2]);
  }

  @Test
  void untracedPartitionsArePartsByNumberWithTheBatchAsTarget() {
    Object[] plan = KafkaTxWriter.plan(new String[] {"t-0:0:5", null}, 41);
    assertArrayEquals(new String[] {"p0", "p1"}, (String[]) plan[0]);
    assertArrayEquals(new long[] {42, 42}, (long[]) plan[1]);
    assertArrayEquals(new String[] {null, null}, (String[]) plan[2]);
  }

  @Test
  void aMarkerSaysItsBatchAndRange() {
    OffsetAndMetadata marker = new OffsetAndMetadata(30, "{\"batch\":7,\"range\":\"20:30\"}");
    assertEquals(7, KafkaTxWriter.batchOf(marker));
    assertEquals("20:30", KafkaTxWriter.rangeOf(marker));
    assertEquals(-1, KafkaTxWriter.batchOf(new OffsetAndMetadata(3, "")));
  }
}
