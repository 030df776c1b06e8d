package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import java.math.BigDecimal;
import java.time.LocalDate;
import java.time.LocalDateTime;
import java.time.ZoneOffset;
import java.time.temporal.ChronoUnit;
import org.apache.spark.sql.catalyst.expressions.GenericInternalRow;
import org.apache.spark.sql.types.Decimal;
import org.apache.spark.unsafe.types.UTF8String;
import org.junit.jupiter.api.Test;

/**
 * PgCopyWriter.encode: one row of binary COPY per Spark row, an int16 field count, then per
 * field an int32 length (-1: NULL) and the value in Postgres's binary send form. The expected
 * bytes are what Postgres's own send functions return (int2send, int4send, int8send,
 * float4send, float8send, boolsend, textsend, jsonb_send, date_send, timestamp_send, as
 * `SELECT encode(...send(...), 'hex')` on Postgres 16). Spark's rows hold its internal forms:
 * UTF8String, days since 1970-01-01 for dates, microseconds since 1970 for timestamps.
 */
class EncodeTest {
  private static final int TEXT = PgCopyWriter.TEXT, JSONB = PgCopyWriter.JSONB;
  private static final int BYTEA = PgCopyWriter.BYTEA, BOOL = PgCopyWriter.BOOL;
  private static final int INT2_FROM_BYTE = PgCopyWriter.INT2_FROM_BYTE;
  private static final int INT2 = PgCopyWriter.INT2, INT4 = PgCopyWriter.INT4;
  private static final int INT8 = PgCopyWriter.INT8, FLOAT4 = PgCopyWriter.FLOAT4;
  private static final int FLOAT8 = PgCopyWriter.FLOAT8, DATE = PgCopyWriter.DATE;
  private static final int TIMESTAMP = PgCopyWriter.TIMESTAMP, NUMERIC = PgCopyWriter.NUMERIC;

  /** A writer for columns of these encodings, read from the row's ordinals in that order. */
  private static PgCopyWriter writer(int[] ordinals, int[] encodings, int precision, int scale)
      throws Exception {
    StringBuilder precisions = new StringBuilder(), scales = new StringBuilder();
    for (int i = 0; i < encodings.length; i++) {
      precisions.append(i == 0 ? "" : ",").append(precision);
      scales.append(i == 0 ? "" : ",").append(scale);
    }
    String json =
        "{\"url\": \"jdbc:postgresql://unused/db\", \"properties\": {}, \"pipeline\": \"p\","
            + " \"stream_id\": \"s\", \"batch_id\": 7, \"claim_sql\": \"\", \"copy_sql\": \"\","
            + " \"rows_sql\": \"\", \"dead_letter_sql\": \"\","
            + " \"ordinals\": " + java.util.Arrays.toString(ordinals) + ","
            + " \"encodings\": " + java.util.Arrays.toString(encodings) + ","
            + " \"decimal_precisions\": [" + precisions + "],"
            + " \"decimal_scales\": [" + scales + "],"
            + " \"bad_ordinal\": -1, \"dead_ordinals\": [], \"parse_error\": \"\","
            + " \"empty_value_error\": \"\"}";
    return new PgCopyWriter(json);
  }

  private static String encode(PgCopyWriter writer, Object... values) {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(8);
    writer.encode(new GenericInternalRow(values), buf);
    return Hex.of(buf);
  }

  /** One column: "0001" (one field), then the field's int32 length and its bytes. */
  private static String one(int encoding, Object value) throws Exception {
    return encode(writer(new int[] {0}, new int[] {encoding}, 38, 0), value);
  }

  private static String decimal(String value, int precision, int scale) throws Exception {
    BigDecimal exact = new BigDecimal(value);
    return encode(
        writer(new int[] {0}, new int[] {NUMERIC}, precision, scale),
        Decimal.apply(exact, precision, scale));
  }

  @Test
  void text() throws Exception {
    assertEquals("0001" + "00000006" + "68c3a96c6c6f", one(TEXT, UTF8String.fromString("héllo")));
    assertEquals("0001" + "00000000", one(TEXT, UTF8String.fromString("")));
  }

  @Test
  void jsonbIsVersionOneThenTheText() throws Exception {
    assertEquals(
        "0001" + "00000009" + "017b2261223a20317d", one(JSONB, UTF8String.fromString("{\"a\": 1}")));
  }

  @Test
  void bytea() throws Exception {
    assertEquals("0001" + "00000003" + "00ff10", one(BYTEA, new byte[] {0, (byte) 0xff, 0x10}));
    assertEquals("0001" + "00000000", one(BYTEA, new byte[0]));
  }

  @Test
  void bool() throws Exception {
    assertEquals("0001" + "00000001" + "01", one(BOOL, true));
    assertEquals("0001" + "00000001" + "00", one(BOOL, false));
  }

  @Test
  void integers() throws Exception {
    assertEquals("0001" + "00000002" + "fffe", one(INT2_FROM_BYTE, (byte) -2));
    assertEquals("0001" + "00000002" + "007f", one(INT2_FROM_BYTE, (byte) 127));
    assertEquals("0001" + "00000002" + "fffe", one(INT2, (short) -2));
    assertEquals("0001" + "00000002" + "8000", one(INT2, Short.MIN_VALUE));
    assertEquals("0001" + "00000004" + "fffe1dc0", one(INT4, -123_456));
    assertEquals("0001" + "00000004" + "7fffffff", one(INT4, Integer.MAX_VALUE));
    assertEquals("0001" + "00000008" + "0020000000000001", one(INT8, 9_007_199_254_740_993L));
    assertEquals("0001" + "00000008" + "8000000000000000", one(INT8, Long.MIN_VALUE));
  }

  @Test
  void floats() throws Exception {
    assertEquals("0001" + "00000004" + "3fc00000", one(FLOAT4, 1.5f));
    assertEquals("0001" + "00000008" + "bfb999999999999a", one(FLOAT8, -0.1));
    // Postgres stores NaN and the infinities too; the bits go as they are.
    assertEquals("0001" + "00000008" + "7ff0000000000000", one(FLOAT8, Double.POSITIVE_INFINITY));
    assertEquals("0001" + "00000004" + "7fc00000", one(FLOAT4, Float.NaN));
  }

  @Test
  void dateIsDaysSince2000() throws Exception {
    assertEquals("0001" + "00000004" + "ffffd533", one(DATE, 0)); // 1970-01-01
    assertEquals("0001" + "00000004" + "ffffffff", one(DATE, days("1999-12-31")));
    assertEquals("0001" + "00000004" + "00000000", one(DATE, days("2000-01-01")));
    assertEquals("0001" + "00000004" + "00002279", one(DATE, days("2024-02-29")));
  }

  @Test
  void timestampIsMicrosecondsSince2000() throws Exception {
    assertEquals("0001" + "00000008" + "fffca2fec4c82000", one(TIMESTAMP, 0L)); // 1970-01-01
    assertEquals(
        "0001" + "00000008" + "0002b58341728614",
        one(TIMESTAMP, micros("2024-02-29T12:34:56.789012")));
    assertEquals("0001" + "00000008" + "0000000000000000", one(TIMESTAMP, micros("2000-01-01T00:00")));
  }

  @Test
  void numericTakesTheColumnsScale() throws Exception {
    assertEquals("0001" + "0000000e" + "0003000140000003000109291a7c", decimal("-12345.678", 10, 3));
    assertEquals("0001" + "0000000c" + "0002000000000002000103e8", decimal("1.1", 12, 2));
    assertEquals("0001" + "00000008" + "0000000000000000", decimal("0", 10, 0));
    assertEquals(
        "0001" + "00000018" + "0008000700000000000c0d801ed204d2162e23340d801ed2",
        decimal("123456789012345678901234567890", 38, 0));
  }

  @Test
  void nullIsLengthMinusOne() throws Exception {
    assertEquals("0001" + "ffffffff", one(INT4, null));
    assertEquals("0001" + "ffffffff", one(TEXT, null));
  }

  @Test
  void columnsGoInTheCopysOrderReadFromTheirOrdinals() throws Exception {
    PgCopyWriter writer = writer(new int[] {2, 0, 1}, new int[] {INT8, TEXT, INT4}, 38, 0);
    assertEquals(
        "0003" + "00000008" + "0000000000000005" + "00000001" + "61" + "ffffffff",
        encode(writer, UTF8String.fromString("a"), null, 5L));
  }

  @Test
  void rowsFollowOneAnother() throws Exception {
    PgCopyWriter writer = writer(new int[] {0}, new int[] {INT2}, 38, 0);
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(1);
    writer.encode(new GenericInternalRow(new Object[] {(short) 1}), buf);
    writer.encode(new GenericInternalRow(new Object[] {(short) 2}), buf);
    assertEquals("0001000000020001" + "0001000000020002", Hex.of(buf));
  }

  @Test
  void anUnknownEncodingIsRefused() throws Exception {
    PgCopyWriter writer = writer(new int[] {0}, new int[] {99}, 38, 0);
    IllegalStateException e =
        assertThrows(IllegalStateException.class, () -> encode(writer, 1));
    assertEquals("unknown column encoding 99", e.getMessage());
  }

  private static int days(String date) {
    return (int) LocalDate.parse(date).toEpochDay();
  }

  private static long micros(String timestamp) {
    return ChronoUnit.MICROS.between(
        LocalDateTime.of(1970, 1, 1, 0, 0).toInstant(ZoneOffset.UTC),
        LocalDateTime.parse(timestamp).toInstant(ZoneOffset.UTC));
  }
}
