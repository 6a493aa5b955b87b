// Tests Eddy through pgjdbc: prepared INSERT ... RETURNING (named statements, binary
// params), metric point lookups and result metadata, DatabaseMetaData catalog queries,
// SQLSTATE error codes with connection recovery, and simple vs extended query protocol.
package dev.eddy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.sql.Connection;
import java.sql.DatabaseMetaData;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.sql.Types;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 120, unit = TimeUnit.SECONDS)
class EddyJdbcTest {

    static final String DEFAULT_URL = "jdbc:postgresql://127.0.0.1:5433/eddy";
    static final double EPS = 1e-9;

    static String url() {
        String u = System.getProperty("eddy.url");
        return (u == null || u.isBlank()) ? DEFAULT_URL : u;
    }

    /** Opens a connection; {@code extra} holds pgjdbc connection properties (may be empty). */
    static Connection connect(Properties extra) throws SQLException {
        Properties p = new Properties();
        // Fail fast rather than hang if the server stops responding.
        p.setProperty("connectTimeout", "10");
        p.setProperty("socketTimeout", "60");
        String user = System.getProperty("eddy.user");
        if (user != null && !user.isBlank()) {
            p.setProperty("user", user);
        }
        String password = System.getProperty("eddy.password");
        if (password != null) {
            p.setProperty("password", password);
        }
        p.putAll(extra);
        return DriverManager.getConnection(url(), p);
    }

    static Connection connect() throws SQLException {
        return connect(new Properties());
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    /** Drops the metric and the stream (in that order) so the test starts from scratch. */
    static void reset(Connection c, String stream, String metric) throws SQLException {
        exec(c, "DROP METRIC IF EXISTS " + metric);
        exec(c, "DROP STREAM IF EXISTS " + stream + " CASCADE");
    }

    static void createPayments(Connection c, String stream, String metric) throws SQLException {
        exec(c, "CREATE STREAM " + stream
                + " (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,"
                + " amount DOUBLE PRECISION)"
                + " WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 2)");
        exec(c, "CREATE METRIC " + metric
                + " AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, MAX(amount) AS top"
                + " FROM " + stream
                + " WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card");
    }

    @Test
    void preparedInsertReturning() throws SQLException {
        Properties props = new Properties();
        // Use a named server-side statement from the first execution (binary params).
        props.setProperty("prepareThreshold", "1");
        try (Connection c = connect(props)) {
            reset(c, "jdbc_pay", "jdbc_card");
            createPayments(c, "jdbc_pay", "jdbc_card");

            Timestamp base = Timestamp.valueOf("2026-11-22 10:00:00");
            String sql = "INSERT INTO jdbc_pay VALUES (?, ?, ?, ?) RETURNING jdbc_card.n, jdbc_card.total";
            try (PreparedStatement ps = c.prepareStatement(sql)) {
                double expectedTotal = 0.0;
                for (int i = 0; i < 5; i++) {
                    double amount = 10.0 * (i + 1);
                    expectedTotal += amount;
                    ps.setLong(1, i);
                    ps.setTimestamp(2, new Timestamp(base.getTime() + i * 1000L));
                    ps.setString(3, "c-1");
                    ps.setDouble(4, amount);
                    try (ResultSet rs = ps.executeQuery()) {
                        if (i == 0) {
                            ResultSetMetaData md = rs.getMetaData();
                            assertEquals(2, md.getColumnCount(), "RETURNING column count");
                            assertEquals("jdbc_card.n", md.getColumnLabel(1));
                            assertEquals("jdbc_card.total", md.getColumnLabel(2));
                            assertEquals(Types.BIGINT, md.getColumnType(1), "type of jdbc_card.n");
                            assertEquals(Types.DOUBLE, md.getColumnType(2), "type of jdbc_card.total");
                        }
                        assertTrue(rs.next(), "RETURNING row expected for insert #" + i);
                        assertEquals(i + 1, rs.getLong(1), "running count after insert #" + i);
                        assertEquals(expectedTotal, rs.getDouble(2), EPS, "running sum after insert #" + i);
                        assertFalse(rs.next(), "exactly one RETURNING row for insert #" + i);
                    }
                }

                // Duplicate event id: deduplicated, metric values unchanged.
                ps.setLong(1, 0);
                ps.setTimestamp(2, base);
                ps.setString(3, "c-1");
                ps.setDouble(4, 10.0);
                try (ResultSet rs = ps.executeQuery()) {
                    assertTrue(rs.next(), "RETURNING row expected for duplicate insert");
                    assertEquals(5, rs.getLong(1), "count unchanged after duplicate");
                    assertEquals(expectedTotal, rs.getDouble(2), EPS, "sum unchanged after duplicate");
                    assertFalse(rs.next(), "exactly one RETURNING row for duplicate insert");
                }
            }
        }
    }

    /** pgjdbc sends the JVM's zone at startup: it is the session's TimeZone, as in PostgreSQL. */
    /** pgjdbc's {@code options} property sets any session setting at startup, as PGOPTIONS does. */
    @Test
    void optionsPropertySetsSessionSettings() throws SQLException {
        Properties extra = new Properties();
        extra.setProperty("options", "-c synchronous_commit=off -c statement_timeout=5s");
        try (Connection c = connect(extra); Statement st = c.createStatement()) {
            try (ResultSet rs = st.executeQuery("SHOW synchronous_commit")) {
                assertTrue(rs.next());
                assertEquals("off", rs.getString(1));
            }
            try (ResultSet rs = st.executeQuery("SHOW statement_timeout")) {
                assertTrue(rs.next());
                assertEquals("5s", rs.getString(1));
            }
            st.execute("SET synchronous_commit = on");
            st.execute("RESET synchronous_commit");
            try (ResultSet rs = st.executeQuery("SHOW synchronous_commit")) {
                assertTrue(rs.next());
                assertEquals("off", rs.getString(1), "RESET goes back to the startup value");
            }
        }
        try (Connection c = connect(); Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SHOW synchronous_commit")) {
            assertTrue(rs.next());
            assertEquals("on", rs.getString(1));
        }
    }

    @Test
    void startupTimeZoneIsTheSessions() throws SQLException {
        java.util.TimeZone before = java.util.TimeZone.getDefault();
        java.util.TimeZone.setDefault(java.util.TimeZone.getTimeZone("Europe/Paris"));
        try (Connection c = connect(); Statement st = c.createStatement()) {
            try (ResultSet rs = st.executeQuery("SHOW TimeZone")) {
                assertTrue(rs.next());
                assertEquals("Europe/Paris", rs.getString(1));
            }
            st.execute("DROP STREAM IF EXISTS jdbc_tz CASCADE");
            st.execute("CREATE STREAM jdbc_tz (id BIGINT NOT NULL, ts TIMESTAMPTZ NOT NULL)"
                    + " WITH (event_time = 'ts', event_id = 'id')");
            st.execute("INSERT INTO jdbc_tz VALUES (1, '2026-01-01 10:00:00+00')");
            try (ResultSet rs = st.executeQuery("SELECT ts FROM jdbc_tz")) {
                assertTrue(rs.next());
                assertEquals("2026-01-01 11:00:00+01", rs.getString(1));
            }
            st.execute("DROP STREAM jdbc_tz CASCADE");
        } finally {
            java.util.TimeZone.setDefault(before);
        }
    }

    @Test
    void pointLookupMetadata() throws SQLException {
        try (Connection c = connect()) {
            reset(c, "jdbc_pay2", "jdbc_card2");
            createPayments(c, "jdbc_pay2", "jdbc_card2");

            try (Statement st = c.createStatement()) {
                st.execute("INSERT INTO jdbc_pay2 VALUES"
                        + " (1, '2026-11-22 10:00:00', 'a', 1.0),"
                        + " (2, '2026-11-22 10:00:01', 'a', 2.0),"
                        + " (3, '2026-11-22 10:00:02', 'a', 3.0),"
                        + " (4, '2026-11-22 10:00:03', 'b', 5.0)");
            }

            try (PreparedStatement ps = c.prepareStatement("SELECT card, n, total FROM jdbc_card2 WHERE card = ?")) {
                ps.setString(1, "a");
                try (ResultSet rs = ps.executeQuery()) {
                    ResultSetMetaData md = rs.getMetaData();
                    assertEquals(3, md.getColumnCount());
                    assertEquals("card", md.getColumnName(1));
                    assertEquals("n", md.getColumnName(2));
                    assertEquals("total", md.getColumnName(3));
                    // pgjdbc maps text to VARCHAR.
                    assertEquals(Types.VARCHAR, md.getColumnType(1), "type of card");
                    assertEquals(Types.BIGINT, md.getColumnType(2), "type of n");
                    assertEquals(Types.DOUBLE, md.getColumnType(3), "type of total");

                    assertTrue(rs.next(), "row expected for card 'a'");
                    assertEquals("a", rs.getString(1));
                    assertEquals(3, rs.getLong(2));
                    assertEquals(6.0, rs.getDouble(3), EPS);
                    assertFalse(rs.next(), "exactly one row for card 'a'");
                }

                ps.setString(1, "zzz");
                try (ResultSet rs = ps.executeQuery()) {
                    assertFalse(rs.next(), "no row expected for unknown card");
                }
            }

            try (Statement st = c.createStatement();
                 ResultSet rs = st.executeQuery("SELECT card, n FROM jdbc_card2 ORDER BY n DESC")) {
                assertTrue(rs.next(), "ORDER BY query returned no rows");
                assertEquals("a", rs.getString(1));
                assertEquals(3, rs.getLong(2));
            }
        }
    }

    @Test
    void databaseMetaDataListsStreamsAndMetrics() throws SQLException {
        try (Connection c = connect()) {
            reset(c, "jdbc_pay3", "jdbc_card3");
            createPayments(c, "jdbc_pay3", "jdbc_card3");

            Map<String, String> types = new LinkedHashMap<>();
            try (ResultSet rs = c.getMetaData().getTables(null, null, "jdbc_%", null)) {
                while (rs.next()) {
                    types.put(rs.getString("TABLE_NAME"), rs.getString("TABLE_TYPE"));
                }
            }
            assertEquals("TABLE", types.get("jdbc_pay3"), "stream type in getTables: " + types);
            assertEquals("VIEW", types.get("jdbc_card3"), "metric type in getTables: " + types);

            List<String> columns = new ArrayList<>();
            try (ResultSet rs = c.getMetaData().getColumns(null, null, "jdbc_pay3", null)) {
                while (rs.next()) {
                    columns.add(rs.getString("COLUMN_NAME"));
                }
            }
            assertEquals(List.of("id", "ts", "card", "amount"), columns);

            List<String> described = new ArrayList<>();
            try (ResultSet rs = c.getMetaData().getColumns(null, null, "jdbc_card3", null)) {
                while (rs.next()) {
                    described.add(rs.getString("COLUMN_NAME") + " " + rs.getString("TYPE_NAME")
                            + " " + rs.getInt("NULLABLE"));
                }
            }
            assertTrue(described.contains("card text 1"), "metric columns: " + described);
            try (ResultSet rs = c.getMetaData().getColumns(null, null, "jdbc_pay3", "card")) {
                assertTrue(rs.next(), "getColumns for one column");
                assertEquals(DatabaseMetaData.columnNoNulls, rs.getInt("NULLABLE"), "card is NOT NULL");
            }

            // Streams and metrics have no primary key; the driver's catalog query runs.
            try (ResultSet rs = c.getMetaData().getPrimaryKeys(null, null, "jdbc_pay3")) {
                assertFalse(rs.next(), "no primary key");
            }
            try (ResultSet rs = c.getMetaData().getSchemas()) {
                List<String> schemas = new ArrayList<>();
                while (rs.next()) {
                    schemas.add(rs.getString("TABLE_SCHEM"));
                }
                assertTrue(schemas.contains("public"), "schemas: " + schemas);
            }
        }
    }

    @Test
    void errorThenSuccessOnSameConnection() throws SQLException {
        try (Connection c = connect()) {
            assertTrue(c.getAutoCommit(), "autocommit should be on by default");
            exec(c, "DROP STREAM IF EXISTS jdbc_pay4 CASCADE");
            exec(c, "CREATE STREAM jdbc_pay4"
                    + " (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,"
                    + " amount DOUBLE PRECISION)"
                    + " WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 2)");

            try (Statement st = c.createStatement()) {
                SQLException bad = assertThrows(SQLException.class,
                        () -> st.execute("INSERT INTO jdbc_pay4 VALUES (1, 'not a timestamp', 'c', 1.0)"));
                assertEquals("22P02", bad.getSQLState(), "invalid timestamp: " + bad.getMessage());

                SQLException missing = assertThrows(SQLException.class,
                        () -> st.executeQuery("SELECT * FROM no_such_thing"));
                assertEquals("42P01", missing.getSQLState(), "undefined table: " + missing.getMessage());

                SQLException syntax = assertThrows(SQLException.class, () -> st.execute("SELEC 1"));
                assertEquals("42601", syntax.getSQLState(), "syntax error: " + syntax.getMessage());
            }

            assertTrue(c.getAutoCommit(), "autocommit should still be on");
            try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
                assertTrue(rs.next(), "SELECT 1 returned no rows");
                assertEquals(1, rs.getInt(1));
                assertFalse(rs.next());
            }
            assertTrue(c.getAutoCommit(), "autocommit should still be on");
        }
    }

    @Test
    void simpleAndExtendedProtocol() throws SQLException {
        String sql = "SELECT 1 AS one, 'x' AS s";

        // Simple query protocol.
        Properties simple = new Properties();
        simple.setProperty("preferQueryMode", "simple");
        try (Connection c = connect(simple);
             Statement st = c.createStatement();
             ResultSet rs = st.executeQuery(sql)) {
            assertTrue(rs.next(), "simple protocol returned no rows");
            assertEquals(1, rs.getInt("one"));
            assertEquals("x", rs.getString("s"));
            assertFalse(rs.next());
        }

        // Extended query protocol (default mode): PreparedStatement and plain Statement.
        try (Connection c = connect()) {
            try (PreparedStatement ps = c.prepareStatement(sql); ResultSet rs = ps.executeQuery()) {
                assertTrue(rs.next(), "extended protocol (PreparedStatement) returned no rows");
                assertEquals(1, rs.getInt(1));
                assertEquals("x", rs.getString(2));
                assertFalse(rs.next());
            }
            try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
                assertTrue(rs.next(), "extended protocol (Statement) returned no rows");
                assertEquals(1, rs.getInt("one"));
                assertEquals("x", rs.getString("s"));
                assertFalse(rs.next());
            }
        }
    }

    @Test
    void timesAndIntervalsHaveTheirTypes() throws SQLException {
        String sql = "SELECT time '10:11:12' AS t, interval '1 day 02:30:00' AS i";
        // prepareThreshold 1: the statement is server-prepared at once, and pgjdbc asks
        // for the time in binary.
        Properties binary = new Properties();
        binary.setProperty("prepareThreshold", "1");
        try (Connection c = connect(binary)) {
            for (int run = 0; run < 3; run++) {
                try (PreparedStatement ps = c.prepareStatement(sql); ResultSet rs = ps.executeQuery()) {
                    ResultSetMetaData md = rs.getMetaData();
                    assertEquals(Types.TIME, md.getColumnType(1));
                    assertEquals("time", md.getColumnTypeName(1));
                    assertEquals("interval", md.getColumnTypeName(2));
                    assertTrue(rs.next());
                    assertEquals(java.time.LocalTime.of(10, 11, 12), rs.getObject(1, java.time.LocalTime.class));
                    assertEquals(new org.postgresql.util.PGInterval(0, 0, 1, 2, 30, 0), rs.getObject(2));
                    assertFalse(rs.next());
                }
            }
        }
    }
}
