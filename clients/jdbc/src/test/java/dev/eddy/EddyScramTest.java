// SCRAM-SHA-256 through pgjdbc against an Eddy started with a password (.ci/test starts
// one and runs this class alone with -Deddy.scram.password): the right password gets in,
// a wrong one and an unknown user get 28P01 with the same message.
package dev.eddy;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assumptions.assumeTrue;

import java.sql.Connection;
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
}
