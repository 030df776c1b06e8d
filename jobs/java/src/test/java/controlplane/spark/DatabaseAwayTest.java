package controlplane.spark;

import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.SQLException;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.postgresql.util.PSQLException;
import org.postgresql.util.PSQLState;

/**
 * PgCopyWriter.databaseAway: which failures to connect are worth waiting out (the database is
 * unreachable, starting or shutting down) and which fail the task at once.
 */
class DatabaseAwayTest {

  @ParameterizedTest
  @ValueSource(
      strings = {
        "08000", // connection exception
        "08001", // unable to connect (connection refused)
        "08003", // connection does not exist
        "08006", // connection failure
        "57P01", // admin shutdown
        "57P02", // crash shutdown
        "57P03", // cannot connect now (starting up)
      })
  void waitsForAnAbsentDatabase(String state) {
    assertTrue(PgCopyWriter.databaseAway(new SQLException("away", state)));
  }

  @Test
  void anErrorWithoutStateCountsAsAway() {
    assertTrue(PgCopyWriter.databaseAway(new SQLException("no state")));
  }

  @Test
  void theDriversConnectionRefusedCountsAsAway() {
    assertTrue(
        PgCopyWriter.databaseAway(
            new PSQLException("refused", PSQLState.CONNECTION_UNABLE_TO_CONNECT)));
  }

  @ParameterizedTest
  @ValueSource(
      strings = {
        "28P01", // invalid password
        "28000", // invalid authorization
        "3D000", // database does not exist
        "42P01", // undefined table
        "23505", // unique violation
        "57014", // query canceled
        "53300", // too many connections
        "0A000", // feature not supported (not class 08)
      })
  void failsAtOnceOnAnythingElse(String state) {
    assertFalse(PgCopyWriter.databaseAway(new SQLException("not away", state)));
  }

  @Test
  void theDriversAuthenticationFailureIsNotAway() {
    assertFalse(
        PgCopyWriter.databaseAway(
            new PSQLException("bad password", PSQLState.INVALID_PASSWORD)));
  }
}
