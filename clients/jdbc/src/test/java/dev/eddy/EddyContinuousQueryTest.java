// Tests continuous queries (SELECT ... EMIT CHANGES) through pgjdbc: cursor-based fetching
// (fetchSize, autocommit off) of a metric's current rows and then its changes, WHERE and
// projection, stream subscriptions, cancelling a query that waits for rows, and ending a
// subscription by closing its result set, ending the transaction or closing the connection,
// as seen in SHOW SUBSCRIPTIONS.
package dev.eddy;

import static dev.eddy.EddyJdbcTest.EPS;
import static dev.eddy.EddyJdbcTest.connect;
import static dev.eddy.EddyJdbcTest.exec;
import static dev.eddy.EddyJdbcTest.reset;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.ResultSetMetaData;
import java.sql.SQLException;
import java.sql.Statement;
import java.sql.Timestamp;
import java.sql.Types;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.concurrent.TimeUnit;
import java.util.function.Predicate;
import org.junit.jupiter.api.AfterAll;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;
import org.postgresql.PGConnection;

// Below the connections' 60 s socket timeout, so a hang fails as a timeout.
@Timeout(value = 30, unit = TimeUnit.SECONDS)
class EddyContinuousQueryTest {

    /** How long a finished subscription may take to leave SHOW SUBSCRIPTIONS. */
    static final long GONE_WITHIN_MS = 5_000;

    static ExecutorService pool;

    @BeforeAll
    static void startPool() {
        pool = Executors.newCachedThreadPool(r -> {
            Thread t = new Thread(r, "eddy-cq-test");
            t.setDaemon(true);
            return t;
        });
    }

    @AfterAll
    static void stopPool() {
        pool.shutdownNow();
    }

    static Timestamp ts(String s) {
        return Timestamp.valueOf(s);
    }

    /** A stream of payments and a 1-minute sliding metric per card over it. */
    static void createPayments(Connection c, String stream, String metric, int partitions) throws SQLException {
        reset(c, stream, metric);
        exec(c, "CREATE STREAM " + stream
                + " (id BIGINT, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION)"
                + " WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = "
                + partitions + ")");
        exec(c, "CREATE METRIC " + metric
                + " AS SELECT card, COUNT(*) AS n, SUM(amount) AS total"
                + " FROM " + stream + " WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY card");
    }

    /** A connection in a transaction, as pgjdbc needs for cursor-based fetching. */
    static Connection subscriber(String applicationName) throws SQLException {
        Properties p = new Properties();
        p.setProperty("ApplicationName", applicationName);
        Connection c = connect(p);
        c.setAutoCommit(false);
        return c;
    }

    static int pid(Connection c) throws SQLException {
        return c.unwrap(PGConnection.class).getBackendPID();
    }

    /** The rows of SHOW SUBSCRIPTIONS, each as column name -> text value. */
    static List<Map<String, String>> subscriptions(Connection admin) throws SQLException {
        List<Map<String, String>> out = new ArrayList<>();
        try (Statement st = admin.createStatement(); ResultSet rs = st.executeQuery("SHOW SUBSCRIPTIONS")) {
            ResultSetMetaData md = rs.getMetaData();
            while (rs.next()) {
                Map<String, String> row = new LinkedHashMap<>();
                for (int i = 1; i <= md.getColumnCount(); i++) {
                    row.put(md.getColumnLabel(i), rs.getString(i));
                }
                out.add(row);
            }
        }
        return out;
    }

    /** The subscriptions of the session with backend process id {@code pid}. */
    static List<Map<String, String>> subscriptionsOf(Connection admin, int pid) throws SQLException {
        List<Map<String, String>> out = new ArrayList<>();
        for (Map<String, String> row : subscriptions(admin)) {
            if (String.valueOf(pid).equals(row.get("pid"))) {
                out.add(row);
            }
        }
        return out;
    }

    /** Polls SHOW SUBSCRIPTIONS until the session {@code pid} has a subscription matching {@code p}. */
    static Map<String, String> awaitSubscription(Connection admin, int pid, Predicate<Map<String, String>> p)
            throws SQLException, InterruptedException {
        long deadline = System.currentTimeMillis() + GONE_WITHIN_MS;
        List<Map<String, String>> seen;
        do {
            seen = subscriptionsOf(admin, pid);
            for (Map<String, String> row : seen) {
                if (p.test(row)) {
                    return row;
                }
            }
            Thread.sleep(50);
        } while (System.currentTimeMillis() < deadline);
        fail("no matching subscription of pid " + pid + " within " + GONE_WITHIN_MS + " ms; it has " + seen);
        return null;
    }

    /** Polls SHOW SUBSCRIPTIONS until the session {@code pid} has no subscription left. */
    static void awaitNoSubscription(Connection admin, int pid, String what)
            throws SQLException, InterruptedException {
        long deadline = System.currentTimeMillis() + GONE_WITHIN_MS;
        List<Map<String, String>> left;
        do {
            left = subscriptionsOf(admin, pid);
            if (left.isEmpty()) {
                return;
            }
            Thread.sleep(50);
        } while (System.currentTimeMillis() < deadline);
        fail(what + ": subscription still listed after " + GONE_WITHIN_MS + " ms: " + left);
    }

    static void assertSelectOne(Connection c) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery("SELECT 1")) {
            assertTrue(rs.next(), "SELECT 1 returned no rows");
            assertEquals(1, rs.getInt(1));
            assertFalse(rs.next());
        }
    }

    /** One change row of the card metric: card, n, total (null when NULL), changed_at. */
    record CardRow(String card, long n, Double total, Timestamp changedAt) {
        static CardRow read(ResultSet rs) throws SQLException {
            String card = rs.getString("card");
            long n = rs.getLong("n");
            double total = rs.getDouble("total");
            Double t = rs.wasNull() ? null : total;
            return new CardRow(card, n, t, rs.getTimestamp("changed_at"));
        }
    }

    static void assertCardRow(CardRow row, String card, long n, Double total, String changedAt) {
        String what = "row " + row;
        assertNotNull(row, "missing row for card " + card);
        assertEquals(card, row.card(), what);
        assertEquals(n, row.n(), "n of " + what);
        if (total == null) {
            assertNull(row.total(), "total of " + what);
        } else {
            assertNotNull(row.total(), "total of " + what);
            assertEquals(total, row.total(), EPS, "total of " + what);
        }
        assertEquals(ts(changedAt), row.changedAt(), "changed_at of " + what);
    }

    /** Reads {@code count} change rows (each {@code rs.next()} waits for its row), by card. */
    static Map<String, CardRow> nextCardRows(ResultSet rs, int count) throws SQLException {
        Map<String, CardRow> rows = new HashMap<>();
        for (int i = 0; i < count; i++) {
            assertTrue(rs.next(), "continuous query ended before change row #" + (i + 1) + " of " + count);
            CardRow row = CardRow.read(rs);
            assertNull(rows.put(row.card(), row), "two rows for card " + row.card() + " in one change");
        }
        return rows;
    }

    @Test
    void metricCurrentRowsThenChanges() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_metric")) {
            // One partition: both cards share a task, so stream time (and window expiry)
            // advances for both with every event.
            createPayments(admin, "jdbc_sub_pay1", "jdbc_sub_card1", 1);
            exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES"
                    + " (1, '2026-01-01 00:00:00', 'a', 10.0),"
                    + " (2, '2026-01-01 00:00:00', 'b', 20.0),"
                    + " (3, '2026-01-01 00:00:10', 'a', 5.0)");

            try (Statement st = c.createStatement()) {
                // More than ever arrives at once: each fetch must return what exists.
                st.setFetchSize(10);
                try (ResultSet rs = st.executeQuery("SELECT card, n, total, changed_at FROM jdbc_sub_card1 EMIT CHANGES")) {
                    ResultSetMetaData md = rs.getMetaData();
                    assertEquals(4, md.getColumnCount());
                    assertEquals("card", md.getColumnLabel(1));
                    assertEquals("n", md.getColumnLabel(2));
                    assertEquals("total", md.getColumnLabel(3));
                    assertEquals("changed_at", md.getColumnLabel(4));
                    assertEquals(Types.VARCHAR, md.getColumnType(1), "type of card");
                    assertEquals(Types.BIGINT, md.getColumnType(2), "type of n");
                    assertEquals(Types.DOUBLE, md.getColumnType(3), "type of total");
                    assertEquals(Types.TIMESTAMP, md.getColumnType(4), "type of changed_at");

                    // The current rows, stamped with the task's stream time.
                    Map<String, CardRow> current = nextCardRows(rs, 2);
                    assertCardRow(current.get("a"), "a", 2, 15.0, "2026-01-01 00:00:10");
                    assertCardRow(current.get("b"), "b", 1, 20.0, "2026-01-01 00:00:10");

                    // One event, one changed group.
                    exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES (4, '2026-01-01 00:00:30', 'b', 7.0)");
                    assertCardRow(nextCardRows(rs, 1).get("b"), "b", 2, 27.0, "2026-01-01 00:00:30");

                    // The window (00:00:05, 00:01:05] drops both cards' first events.
                    exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES (5, '2026-01-01 00:01:05', 'a', 1.0)");
                    Map<String, CardRow> moved = nextCardRows(rs, 2);
                    assertCardRow(moved.get("a"), "a", 2, 6.0, "2026-01-01 00:01:05");
                    assertCardRow(moved.get("b"), "b", 1, 7.0, "2026-01-01 00:01:05");

                    // The window (00:01:00, 00:02:00] leaves card b empty: n = 0, total NULL.
                    exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES (6, '2026-01-01 00:02:00', 'a', 2.0)");
                    Map<String, CardRow> emptied = nextCardRows(rs, 2);
                    assertCardRow(emptied.get("a"), "a", 2, 3.0, "2026-01-01 00:02:00");
                    assertCardRow(emptied.get("b"), "b", 0, null, "2026-01-01 00:02:00");

                    // A duplicate event id changes nothing; the next real change comes next.
                    exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES (6, '2026-01-01 00:02:00', 'a', 2.0)");
                    exec(admin, "INSERT INTO jdbc_sub_pay1 VALUES (7, '2026-01-01 00:02:01', 'b', 4.0)");
                    assertCardRow(nextCardRows(rs, 1).get("b"), "b", 1, 4.0, "2026-01-01 00:02:01");
                }
            }
            c.commit();
            assertSelectOne(c);
        }
    }

    @Test
    void metricWhereAndProjection() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_where")) {
            createPayments(admin, "jdbc_sub_pay2", "jdbc_sub_card2", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay2 VALUES"
                    + " (1, '2026-01-01 00:00:00', 'a', 10.0),"
                    + " (2, '2026-01-01 00:00:00', 'b', 20.0)");

            try (Statement st = c.createStatement()) {
                st.setFetchSize(1);
                try (ResultSet rs = st.executeQuery("SELECT card, total FROM jdbc_sub_card2 WHERE card = 'b' EMIT CHANGES")) {
                    ResultSetMetaData md = rs.getMetaData();
                    // changed_at is added when the projection leaves it out.
                    assertEquals(3, md.getColumnCount());
                    assertEquals("card", md.getColumnLabel(1));
                    assertEquals("total", md.getColumnLabel(2));
                    assertEquals("changed_at", md.getColumnLabel(3));
                    assertEquals(Types.TIMESTAMP, md.getColumnType(3), "type of changed_at");

                    assertTrue(rs.next(), "current row of card b expected");
                    assertEquals("b", rs.getString(1));
                    assertEquals(20.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:00"), rs.getTimestamp(3));

                    // A change of card a is filtered out; the next row is card b's change.
                    exec(admin, "INSERT INTO jdbc_sub_pay2 VALUES (3, '2026-01-01 00:00:05', 'a', 1.0)");
                    exec(admin, "INSERT INTO jdbc_sub_pay2 VALUES (4, '2026-01-01 00:00:06', 'b', 2.0)");
                    assertTrue(rs.next(), "change row of card b expected");
                    assertEquals("b", rs.getString(1));
                    assertEquals(22.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:06"), rs.getTimestamp(3));
                }
            }
            c.rollback();
            assertSelectOne(c);
            c.commit();
        }
    }

    @Test
    void preparedStatementWithParameter() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_param")) {
            createPayments(admin, "jdbc_sub_pay9", "jdbc_sub_card9", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay9 VALUES"
                    + " (1, '2026-01-01 00:00:00', 'a', 10.0),"
                    + " (2, '2026-01-01 00:00:05', 'b', 20.0),"
                    + " (3, '2026-01-01 00:00:07', 'a', 5.0)");

            // pgjdbc binds the parameter and describes the portal before executing it.
            try (PreparedStatement ps = c.prepareStatement(
                    "SELECT card, total * 2 AS twice FROM jdbc_sub_card9 WHERE card = ? EMIT CHANGES")) {
                ps.setFetchSize(1);
                ps.setString(1, "a");
                try (ResultSet rs = ps.executeQuery()) {
                    ResultSetMetaData md = rs.getMetaData();
                    assertEquals(3, md.getColumnCount());
                    assertEquals("twice", md.getColumnLabel(2));
                    assertEquals("changed_at", md.getColumnLabel(3));
                    assertTrue(rs.next(), "current row of card a expected");
                    assertEquals("a", rs.getString(1));
                    assertEquals(30.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:07"), rs.getTimestamp(3), "changed_at of the current row");

                    exec(admin, "INSERT INTO jdbc_sub_pay9 VALUES (4, '2026-01-01 00:00:08', 'b', 100.0)");
                    exec(admin, "INSERT INTO jdbc_sub_pay9 VALUES (5, '2026-01-01 00:00:09', 'a', 5.0)");
                    assertTrue(rs.next(), "change row of card a expected");
                    assertEquals("a", rs.getString(1));
                    assertEquals(40.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:09"), rs.getTimestamp(3));
                }
            }
            c.commit();
        }
    }

    @Test
    void streamSubscriptionGetsOnlyNewMatchingEvents() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_stream")) {
            createPayments(admin, "jdbc_sub_pay3", "jdbc_sub_card3", 2);
            // Matches the WHERE but happened before the subscription: never sent.
            exec(admin, "INSERT INTO jdbc_sub_pay3 VALUES (1, '2026-01-01 00:00:00', 'a', 500.0)");

            int pid = pid(c);
            // executeQuery waits for the first row: insert once the subscription is open.
            Future<?> producer = pool.submit(() -> {
                try (Connection p = connect()) {
                    awaitSubscription(p, pid, row -> "jdbc_sub_pay3".equals(row.get("target")));
                    exec(p, "INSERT INTO jdbc_sub_pay3 VALUES (2, '2026-01-01 00:00:01', 'a', 50.0)");
                    exec(p, "INSERT INTO jdbc_sub_pay3 VALUES (3, '2026-01-01 00:00:02', 'b', 150.0)");
                    exec(p, "INSERT INTO jdbc_sub_pay3 VALUES (4, '2026-01-01 00:00:03', 'a', 100.0)");
                    exec(p, "INSERT INTO jdbc_sub_pay3 VALUES (5, '2026-01-01 00:00:04', 'a', 200.0)");
                }
                return null;
            });

            try (Statement st = c.createStatement()) {
                st.setFetchSize(10);
                try (ResultSet rs = st.executeQuery("SELECT id, amount FROM jdbc_sub_pay3 WHERE amount > 100 EMIT CHANGES")) {
                    ResultSetMetaData md = rs.getMetaData();
                    assertEquals(3, md.getColumnCount());
                    assertEquals("id", md.getColumnLabel(1));
                    assertEquals("amount", md.getColumnLabel(2));
                    assertEquals("changed_at", md.getColumnLabel(3));

                    assertTrue(rs.next(), "first new matching event expected");
                    assertEquals(3, rs.getLong(1));
                    assertEquals(150.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:02"), rs.getTimestamp(3));

                    assertTrue(rs.next(), "second new matching event expected");
                    assertEquals(5, rs.getLong(1));
                    assertEquals(200.0, rs.getDouble(2), EPS);
                    assertEquals(ts("2026-01-01 00:00:04"), rs.getTimestamp(3));
                }
            }
            producer.get(10, TimeUnit.SECONDS);
            c.commit();
            awaitNoSubscription(admin, pid, "after close and commit");
        }
    }

    @Test
    void statementCancelWhileWaitingForFirstRow() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_cancel1")) {
            createPayments(admin, "jdbc_sub_pay4", "jdbc_sub_card4", 2);
            int pid = pid(c);
            try (Statement st = c.createStatement()) {
                st.setFetchSize(5);
                Future<?> canceller = pool.submit(() -> {
                    try (Connection p = connect()) {
                        awaitSubscription(p, pid, row -> "jdbc_sub_pay4".equals(row.get("target")));
                    }
                    Thread.sleep(300);
                    st.cancel();
                    return null;
                });
                // A stream subscription has no current rows: executeQuery waits for an event.
                SQLException e = assertThrows(SQLException.class,
                        () -> st.executeQuery("SELECT * FROM jdbc_sub_pay4 WHERE amount > 0 EMIT CHANGES"));
                assertEquals("57014", e.getSQLState(), "cancelled query: " + e.getMessage());
                canceller.get(10, TimeUnit.SECONDS);
            }
            c.rollback();
            assertSelectOne(c);
            c.commit();
            awaitNoSubscription(admin, pid, "after cancel");
        }
    }

    @Test
    void cancelWhileNextWaitsForChange() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_cancel2")) {
            createPayments(admin, "jdbc_sub_pay5", "jdbc_sub_card5", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay5 VALUES (1, '2026-01-01 00:00:00', 'a', 10.0)");
            int pid = pid(c);
            try (Statement st = c.createStatement()) {
                st.setFetchSize(1);
                ResultSet rs = st.executeQuery("SELECT card, n FROM jdbc_sub_card5 EMIT CHANGES");
                assertTrue(rs.next(), "current row expected");
                assertEquals("a", rs.getString(1));
                assertEquals(1, rs.getLong(2));

                // pgjdbc's Statement.cancel() does nothing once executeQuery has returned
                // (it cancels only while the statement executes, not while its ResultSet
                // fetches more rows), so cancel the connection's running query instead.
                PGConnection pg = c.unwrap(PGConnection.class);
                Future<?> canceller = pool.submit(() -> {
                    Thread.sleep(300);
                    pg.cancelQuery();
                    return null;
                });
                // No change ever comes: rs.next() waits until cancelled.
                SQLException e = assertThrows(SQLException.class, rs::next);
                assertEquals("57014", e.getSQLState(), "cancelled fetch: " + e.getMessage());
                canceller.get(10, TimeUnit.SECONDS);
            }
            c.rollback();
            assertSelectOne(c);
            c.commit();
            awaitNoSubscription(admin, pid, "after cancel");
        }
    }

    @Test
    void showSubscriptionsListsOpenPortal() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_show")) {
            createPayments(admin, "jdbc_sub_pay6", "jdbc_sub_card6", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay6 VALUES"
                    + " (1, '2026-01-01 00:00:00', 'a', 10.0),"
                    + " (2, '2026-01-01 00:00:00', 'b', 20.0)");
            int pid = pid(c);
            String user = c.getMetaData().getUserName();
            try (Statement st = c.createStatement()) {
                st.setFetchSize(2);
                try (ResultSet rs = st.executeQuery("SELECT card, n FROM jdbc_sub_card6 WHERE n > 0 EMIT CHANGES")) {
                    assertTrue(rs.next(), "first current row expected");
                    assertTrue(rs.next(), "second current row expected");

                    List<Map<String, String>> mine = subscriptionsOf(admin, pid);
                    assertEquals(1, mine.size(), "subscriptions of this session: " + mine);
                    Map<String, String> sub = mine.get(0);
                    assertEquals(List.of("id", "pid", "user", "application_name", "client", "kind", "target",
                            "query", "started_at", "rows_sent", "rows_coalesced", "rows_queued"),
                            new ArrayList<>(sub.keySet()), "SHOW SUBSCRIPTIONS columns");
                    assertEquals("portal", sub.get("kind"), "kind: " + sub);
                    assertEquals("jdbc_sub_card6", sub.get("target"), "target: " + sub);
                    assertEquals(user, sub.get("user"), "user: " + sub);
                    assertTrue(sub.get("query").contains("FROM jdbc_sub_card6 WHERE n > 0 EMIT CHANGES"), "query: " + sub);
                    assertNotNull(sub.get("started_at"), "started_at: " + sub);
                    assertTrue(Long.parseLong(sub.get("rows_sent")) >= 2, "rows_sent: " + sub);
                    assertEquals("0", sub.get("rows_queued"), "rows_queued: " + sub);
                }
            }
            c.commit();
            awaitNoSubscription(admin, pid, "after close and commit");
        }
    }

    @Test
    void showSubscriptionsHasApplicationName() throws Exception {
        try (Connection admin = connect()) {
            createPayments(admin, "jdbc_sub_pay10", "jdbc_sub_card10", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay10 VALUES (1, '2026-01-01 00:00:00', 'a', 10.0)");

            // pgjdbc sends its ApplicationName as SET application_name right after
            // connecting (never in the startup packet).
            try (Connection c = subscriber("jdbc_sub_app"); Statement st = c.createStatement()) {
                st.setFetchSize(1);
                try (ResultSet rs = st.executeQuery("SELECT card, n FROM jdbc_sub_card10 EMIT CHANGES")) {
                    assertTrue(rs.next(), "current row expected");
                    Map<String, String> sub =
                            awaitSubscription(admin, pid(c), row -> "jdbc_sub_card10".equals(row.get("target")));
                    assertEquals("jdbc_sub_app", sub.get("application_name"),
                            "application_name after SET application_name: " + sub);
                }
                c.rollback();
            }
        }
    }

    @Test
    void closingResultSetAndEndingTransactionEndsSubscription() throws Exception {
        try (Connection admin = connect(); Connection c = subscriber("jdbc_sub_close")) {
            createPayments(admin, "jdbc_sub_pay7", "jdbc_sub_card7", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay7 VALUES (1, '2026-01-01 00:00:00', 'a', 10.0)");
            int pid = pid(c);
            String sql = "SELECT card, n FROM jdbc_sub_card7 EMIT CHANGES";

            // Close the result set and statement, then commit.
            Statement st = c.createStatement();
            st.setFetchSize(1);
            ResultSet rs = st.executeQuery(sql);
            assertTrue(rs.next(), "current row expected");
            awaitSubscription(admin, pid, row -> "jdbc_sub_card7".equals(row.get("target")));
            rs.close();
            st.close();
            c.commit();
            awaitNoSubscription(admin, pid, "after rs.close(), st.close() and commit");
            assertSelectOne(c);

            // Close only the result set, then roll back.
            try (Statement st2 = c.createStatement()) {
                st2.setFetchSize(1);
                ResultSet rs2 = st2.executeQuery(sql);
                assertTrue(rs2.next(), "current row expected");
                awaitSubscription(admin, pid, row -> "jdbc_sub_card7".equals(row.get("target")));
                rs2.close();
                c.rollback();
                awaitNoSubscription(admin, pid, "after rs.close() and rollback");
            }

            // End the transaction with the result set still open.
            try (Statement st3 = c.createStatement()) {
                st3.setFetchSize(1);
                ResultSet rs3 = st3.executeQuery(sql);
                assertTrue(rs3.next(), "current row expected");
                awaitSubscription(admin, pid, row -> "jdbc_sub_card7".equals(row.get("target")));
                c.commit();
                awaitNoSubscription(admin, pid, "after commit with the result set open");
            }
            assertSelectOne(c);
            c.commit();
        }
    }

    @Test
    void closingConnectionEndsSubscription() throws Exception {
        try (Connection admin = connect()) {
            createPayments(admin, "jdbc_sub_pay8", "jdbc_sub_card8", 2);
            exec(admin, "INSERT INTO jdbc_sub_pay8 VALUES (1, '2026-01-01 00:00:00', 'a', 10.0)");
            Connection c = subscriber("jdbc_sub_disconnect");
            int pid = pid(c);
            Statement st = c.createStatement();
            st.setFetchSize(1);
            ResultSet rs = st.executeQuery("SELECT card, n FROM jdbc_sub_card8 EMIT CHANGES");
            assertTrue(rs.next(), "current row expected");
            awaitSubscription(admin, pid, row -> "jdbc_sub_card8".equals(row.get("target")));
            c.close();
            awaitNoSubscription(admin, pid, "after closing the connection");

            // Drop the connection while rs.next() waits for a change inside Execute.
            Connection c2 = subscriber("jdbc_sub_abort");
            int pid2 = pid(c2);
            Statement st2 = c2.createStatement();
            st2.setFetchSize(1);
            ResultSet rs2 = st2.executeQuery("SELECT card, n FROM jdbc_sub_card8 EMIT CHANGES");
            assertTrue(rs2.next(), "current row expected");
            Future<?> aborter = pool.submit(() -> {
                Thread.sleep(300);
                c2.abort(pool);
                return null;
            });
            // How the read fails depends on who wins the race (socket closed under the
            // reader, or the server's reaction to the disconnect read first): any error.
            assertThrows(SQLException.class, rs2::next);
            aborter.get(10, TimeUnit.SECONDS);
            assertTrue(c2.isClosed(), "aborted connection should be closed");
            awaitNoSubscription(admin, pid2, "after aborting the connection during next()");
        }
    }
}
