package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.nio.charset.StandardCharsets;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;

/** PgCopyWriter.Buffer: big-endian integers (COPY's network byte order), bytes, growth. */
class BufferTest {

  @Test
  void integersAreWrittenBigEndianInTwosComplement() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(64);
    buf.int8(0x7f);
    buf.int8(-1);
    buf.int16(0x0102);
    buf.int16(-2);
    buf.int32(0x01020304);
    buf.int32(-123_456);
    buf.int64(0x0102030405060708L);
    buf.int64(-2L);
    assertEquals(
        "7f" + "ff" + "0102" + "fffe" + "01020304" + "fffe1dc0" + "0102030405060708"
            + "fffffffffffffffe",
        Hex.of(buf));
    assertEquals(1 + 1 + 2 + 2 + 4 + 4 + 8 + 8, buf.size);
  }

  @Test
  void int16KeepsOnlyTheLowSixteenBits() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(2);
    buf.int16(0x12345);
    assertEquals("2345", Hex.of(buf));
  }

  @Test
  void bytesCopiesTheFirstNBytesOnly() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(8);
    buf.bytes(new byte[] {1, 2, 3, 4}, 3);
    buf.bytes(new byte[0], 0);
    assertEquals("010203", Hex.of(buf));
  }

  @Test
  void utf8WritesTheStringsEncodedBytes() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(4);
    buf.int8(0);
    buf.utf8(UTF8String.fromString("héllo, ✓"));
    assertEquals("00" + "68c3a96c6c6f2c20e29c93", Hex.of(buf));
  }

  @Test
  void growsFromNothingAndKeepsWhatItHolds() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(0);
    StringBuilder want = new StringBuilder();
    for (int i = 0; i < 1000; i++) {
      buf.int32(i);
      want.append(String.format("%08x", i));
    }
    assertEquals(4000, buf.size);
    assertTrue(buf.data.length >= 4000);
    assertEquals(want.toString(), Hex.of(buf));
  }

  @Test
  void growsAtLeastByWhatOneWriteNeeds() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(2);
    byte[] big = "a longer value than twice the capacity".getBytes(StandardCharsets.UTF_8);
    buf.int8(9);
    buf.bytes(big, big.length);
    assertEquals(1 + big.length, buf.size);
    byte[] written = new byte[big.length];
    System.arraycopy(buf.data, 1, written, 0, big.length);
    assertArrayEquals(big, written);
    assertEquals(9, buf.data[0]);
  }

  @Test
  void growthDoublesTheCapacity() {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(16);
    buf.bytes(new byte[16], 16);
    assertEquals(16, buf.data.length);
    buf.int8(1);
    assertEquals(32, buf.data.length);
  }
}
