// An order service in Java on Debian's PostgreSQL JDBC driver, writing its events through
// outboxkit's tables contract (docs/tables.md) with no outboxkit code: the order row and its event
// commit in one transaction, the event written by the schema's publish function.
//
//   javac -d OUT Writer.java
//   java -cp OUT:/usr/share/java/postgresql.jar Writer URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT
//
// URL is a libpq URL (postgres://user[:password]@host[:port]/database[?sslmode=…]), turned into the
// driver's jdbc:postgresql: form. It places COMMIT_ORDER and commits, places ROLLBACK_ORDER and rolls
// it back, and prints the id publish gave the committed event. Orders go to SCHEMA.orders.

import java.net.URI;
import java.net.URLDecoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.Properties;

public final class Writer {
    private static final String WRITER = "java";

    public static void main(String[] args) throws Exception {
        if (args.length != 6) {
            System.err.println("usage: java Writer URL SCHEMA TOPIC COMMIT_ORDER ROLLBACK_ORDER TRACEPARENT");
            System.exit(2);
        }
        String schema = args[1];
        if (!schema.matches("[a-z_][a-z0-9_]{0,49}")) {
            System.err.println("schema name \"" + schema + "\" is not usable");
            System.exit(2);
        }
        Properties props = new Properties();
        String url = jdbcURL(args[0], props);
        try (Connection conn = DriverManager.getConnection(url, props)) {
            conn.setAutoCommit(false);
            String id = placeOrder(conn, schema, args[2], args[3], args[5], true);
            placeOrder(conn, schema, args[2], args[4], args[5], false);
            System.out.println(id);
        }
    }

    // placeOrder writes the order and its OrderPlaced event in one transaction, committed or rolled
    // back, and returns the event's id.
    static String placeOrder(Connection conn, String schema, String topic, String orderId, String traceparent, boolean commit)
            throws SQLException {
        try {
            try (PreparedStatement order = conn.prepareStatement(
                    "INSERT INTO \"" + schema + "\".orders (id, writer, total) VALUES (?, ?, 42)")) {
                order.setString(1, orderId);
                order.setString(2, WRITER);
                order.executeUpdate();
            }
            String id;
            // The driver sends strings as varchar, which Postgres does not turn into json by
            // itself: the casts say what the parameters are.
            try (PreparedStatement publish = conn.prepareStatement(
                    "SELECT \"" + schema + "\".publish(?, 'OrderPlaced', ?, ?::json, ?::jsonb)")) {
                publish.setString(1, topic);
                publish.setString(2, orderId); // the partition key: the order's events keep their order
                publish.setString(3, "{\"order_id\":" + json(orderId) + ",\"total\":42,\"writer\":" + json(WRITER) + "}");
                publish.setString(4, "{\"traceparent\":" + json(traceparent) + ",\"x_writer\":" + json(WRITER) + "}");
                try (ResultSet rs = publish.executeQuery()) {
                    rs.next();
                    id = rs.getString(1);
                }
            }
            if (commit) {
                conn.commit();
            } else {
                conn.rollback();
            }
            return id;
        } catch (SQLException e) {
            conn.rollback();
            throw e;
        }
    }

    // json quotes s as a JSON string.
    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            switch (c) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                default -> {
                    if (c < 0x20) {
                        b.append(String.format("\\u%04x", (int) c));
                    } else {
                        b.append(c);
                    }
                }
            }
        }
        return b.append('"').toString();
    }

    // jdbcURL turns a libpq URL into the driver's, with the user and password in props.
    static String jdbcURL(String libpq, Properties props) {
        URI u = URI.create(libpq);
        if (u.getUserInfo() != null) {
            String[] userPassword = u.getUserInfo().split(":", 2);
            props.setProperty("user", URLDecoder.decode(userPassword[0], StandardCharsets.UTF_8));
            if (userPassword.length == 2) {
                props.setProperty("password", URLDecoder.decode(userPassword[1], StandardCharsets.UTF_8));
            }
        }
        String port = u.getPort() > 0 ? ":" + u.getPort() : "";
        String query = u.getRawQuery() != null ? "?" + u.getRawQuery() : "";
        return "jdbc:postgresql://" + u.getHost() + port + u.getRawPath() + query;
    }
}
