package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.math.BigDecimal;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.CsvSource;

/**
 * PgCopyWriter.numeric against Postgres's own binary form of numeric (numeric_send: int16
 * ndigits, weight, sign 0x0000 or 0x4000, dscale, then ndigits base-10000 digits, the first
 * of which multiplies 10000^weight; leading and trailing zero digits left out). The expected
 * payloads are what `SELECT encode(numeric_send('...'::numeric), 'hex')` returns on Postgres
 * 16; each is preceded by the field's int32 length, 8 + 2 * ndigits.
 *
 * <p>No NaN or infinity: Spark's decimals (java.math.BigDecimal here) have neither.
 */
class NumericTest {

  @ParameterizedTest(name = "{0}")
  @CsvSource({
    "0, 0000000000000000",
    "0.00, 0000000000000002",
    "-0.00, 0000000000000002",
    "1, 00010000000000000001",
    "-12345.678, 0003000140000003000109291a7c",
    "10000, 00010001000000000001",
    "0.0001, 0001ffff000000040001",
    "0.00001, 0001fffe0000000503e8",
    "123456789012345678901234567890, 0008000700000000000c0d801ed204d2162e23340d801ed2",
    "1E+5, 0001000100000000000a",
    "-0.5, 0001ffff400000011388",
    "9999.9999, 0002000000000004270f270f",
    "1.10, 0002000000000002000103e8",
  })
  void matchesPostgresNumericSend(String value, String payload) {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(4);
    PgCopyWriter.numeric(new BigDecimal(value), buf);
    assertEquals(String.format("%08x", payload.length() / 2) + payload, Hex.of(buf));
  }

  @ParameterizedTest(name = "{0}")
  @CsvSource({
    // The largest decimal(38, 0) and a decimal(38, 18): Spark's widest.
    "99999999999999999999999999999999999999, 000a0009000000000063270f270f270f270f270f270f270f270f270f",
    "-12345678901234567890.123456789012345678,"
        + " 000a00044000001204d2162e23340d801ed204d2162e23340d801e78",
  })
  void encodesTheWidestSparkDecimals(String value, String payload) {
    PgCopyWriter.Buffer buf = new PgCopyWriter.Buffer(4);
    PgCopyWriter.numeric(new BigDecimal(value), buf);
    assertEquals(String.format("%08x", payload.length() / 2) + payload, Hex.of(buf));
  }
}
