package controlplane.spark;

import java.util.HexFormat;

/** What a Buffer holds, as lower-case hex (the form Postgres's encode(..., 'hex') prints). */
final class Hex {
  private Hex() {}

  static String of(PgCopyWriter.Buffer buf) {
    return HexFormat.of().formatHex(buf.data, 0, buf.size);
  }
}
