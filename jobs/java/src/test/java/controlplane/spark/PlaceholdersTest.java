package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertEquals;

import org.junit.jupiter.api.Test;

/** PgCopyWriter.placeholders: the `?` a statement binds to the task's partition. */
class PlaceholdersTest {

  @Test
  void countsPlaceholders() {
    assertEquals(
        2, PgCopyWriter.placeholders("SELECT pg_advisory_xact_lock(hashtext('s'), ?), ?"));
    assertEquals(0, PgCopyWriter.placeholders("INSERT INTO t (a) SELECT a FROM s"));
  }

  @Test
  void leavesOutQuotedNamesAndLiterals() {
    assertEquals(
        1, PgCopyWriter.placeholders("DELETE FROM \"odd?name\" WHERE \"_cp_part\" = ? AND x <> '?'"));
    assertEquals(1, PgCopyWriter.placeholders("SELECT 'it''s ?' , \"a\"\"?\" , ?"));
  }
}
