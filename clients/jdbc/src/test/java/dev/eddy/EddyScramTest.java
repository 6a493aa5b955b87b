// SCRAM-SHA-256 over TLS through pgjdbc against an Eddy started with a password and
// --tls-required (.ci/test starts one and runs this class alone with
// -Deddy.scram.password, -Deddy.url with ssl=true&sslmode=require, and -Deddy.plain.url):
// the right password gets in, a wrong one and an unknown user get 28P01 with the same
// message, plaintext gets 28000, and grants decide what a role may do.
package dev.eddy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.Timeout;

@Timeout(value = 60, unit = TimeUnit.SECONDS)
class EddyScramTest {

    static String password() {
        String p = System.getProperty("eddy.scram.password");
        // The general run has no password server; .ci/test runs this class on its own.
        assumeTrue(p != null && !p.isEmpty(), "no -Deddy.scram.password");
        return p;
    }

    static Connection connect(String user, String password) throws SQLException {
        Properties p = new Properties();
        p.setProperty("connectTimeout", "10");
        p.setProperty("user", user);
        p.setProperty("password", password);
        return DriverManager.getConnection(EddyJdbcTest.url(), p);
    }

    @Test
    void theRightPasswordGetsIn() throws SQLException {
        try (Connection c = connect("eddy", password());
                Statement st = c.createStatement();
                ResultSet rs = st.executeQuery("SELECT 41 + 1")) {
            rs.next();
            assertEquals(42, rs.getLong(1));
        }
    }

    @Test
    void aWrongPasswordAndAnUnknownUserFailAlike() {
        String right = password();
        SQLException wrong = assertThrows(SQLException.class, () -> connect("eddy", right + "x"));
        SQLException unknown = assertThrows(SQLException.class, () -> connect("mallory", right));
        assertEquals("28P01", wrong.getSQLState(), wrong.getMessage());
        assertEquals("28P01", unknown.getSQLState(), unknown.getMessage());
        assertEquals(
                wrong.getMessage().replace("\"eddy\"", "\"mallory\""), unknown.getMessage());
    }

    @Test
    void plaintextIsRefusedWhenTlsIsRequired() {
        String right = password();
        String plain = System.getProperty("eddy.plain.url");
        assumeTrue(plain != null && !plain.isEmpty(), "no -Deddy.plain.url");
        Properties p = new Properties();
        p.setProperty("user", "eddy");
        p.setProperty("password", right);
        SQLException refused =
                assertThrows(SQLException.class, () -> DriverManager.getConnection(plain, p));
        assertEquals("28000", refused.getSQLState(), refused.getMessage());
    }

    static String state(SQLException e) {
        return e.getSQLState();
    }

    @Test
    void grantsDecideWhatARoleMayDo() throws SQLException {
        try (Connection admin = connect("eddy", password());
                Statement st = admin.createStatement()) {
            st.execute("DROP METRIC IF EXISTS jdbc_spend");
            st.execute("DROP STREAM IF EXISTS jdbc_pay");
            st.execute("DROP ROLE IF EXISTS jdbc_writer");
            st.execute(
                    "CREATE STREAM jdbc_pay (card TEXT, amount BIGINT, ts TIMESTAMP)"
                            + " WITH (event_time = 'ts')");
            st.execute(
                    "CREATE METRIC jdbc_spend AS SELECT card, COUNT(*) AS n FROM jdbc_pay"
                            + " WINDOW INFINITE GROUP BY card");
            st.execute("CREATE ROLE jdbc_writer LOGIN PASSWORD 'w-pass'");
            st.execute("GRANT INSERT ON STREAM jdbc_pay TO jdbc_writer");
        }
        try (Connection writer = connect("jdbc_writer", "w-pass")) {
            try (PreparedStatement insert =
                    writer.prepareStatement(
                            "INSERT INTO jdbc_pay VALUES (?, 1, '2026-01-01 00:00:00')")) {
                for (int i = 0; i < 3; i++) {
                    insert.setString(1, "c1");
                    assertEquals(1, insert.executeUpdate());
                }
            }
            try (Statement st = writer.createStatement()) {
                SQLException denied =
                        assertThrows(SQLException.class, () -> st.executeQuery("SELECT * FROM jdbc_spend"));
                assertEquals("42501", state(denied), denied.getMessage());
                denied = assertThrows(SQLException.class, () -> st.execute("DROP METRIC jdbc_spend"));
                assertEquals("42501", state(denied), denied.getMessage());
            }
        }
        try (Connection admin = connect("eddy", password());
                Statement st = admin.createStatement()) {
            st.execute("REVOKE INSERT ON STREAM jdbc_pay FROM jdbc_writer");
            try (ResultSet rs = st.executeQuery("SELECT n FROM jdbc_spend WHERE card = 'c1'")) {
                rs.next();
                assertEquals(3, rs.getLong(1));
            }
        }
        try (Connection writer = connect("jdbc_writer", "w-pass");
                Statement st = writer.createStatement()) {
            SQLException denied =
                    assertThrows(
                            SQLException.class,
                            () -> st.execute("INSERT INTO jdbc_pay VALUES ('c1', 1, '2026-01-01 00:00:00')"));
            assertEquals("42501", state(denied), denied.getMessage());
        }
    }
}
