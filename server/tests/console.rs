//! The HTTP port's console API on a real `eddy` process, through curl: statements over
//! `POST /api/sql`, a continuous query over server-sent events, and HTTP Basic logins.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

use common::{spawn_eddy_env, temp_dir};

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// curl `args` against the node; the HTTP status and the body.
fn curl(args: &[&str]) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sS", "--max-time", "20", "-w", "\n%{http_code}"])
        .args(args)
        .output()
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, status) = text.rsplit_once('\n').expect("a status line");
    (status.parse().expect("a status"), body.to_string())
}

fn sql(base: &str, auth: Option<&str>, statement: &str) -> (u16, serde_json::Value) {
    let url = format!("{base}/api/sql");
    let mut args = vec!["-X", "POST", "--data-binary", statement, &url];
    if let Some(user) = auth {
        args.extend(["-u", user]);
    }
    let (status, body) = curl(&args);
    let value = serde_json::from_str(&body).unwrap_or(serde_json::Value::String(body));
    (status, value)
}

#[test]
fn statements_and_continuous_queries_over_http() {
    let dir = temp_dir("console-api");
    let http = free_port();
    let http_addr = format!("127.0.0.1:{http}");
    let (eddy, _port) = spawn_eddy_env(&dir, &["--http-addr", &http_addr], &[]);
    let base = format!("http://{http_addr}");
    let ok = |statement: &str| {
        let (status, value) = sql(&base, None, statement);
        assert_eq!(status, 200, "{statement}: {value}");
        value
    };
    ok(
        "CREATE STREAM web (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount DOUBLE PRECISION) \
        WITH (event_time = 'ts', partition_by = 'card', partitions = 2)",
    );
    ok(
        "CREATE METRIC web_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total FROM web \
        WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
    );

    // A continuous query of one key, read as server-sent events while rows arrive.
    let q = "SELECT card, n, total FROM web_card WHERE card = 'c-1' EMIT CHANGES";
    let url = format!(
        "{base}/api/subscribe?q={}",
        q.replace(' ', "%20")
            .replace('\'', "%27")
            .replace('=', "%3D")
    );
    let mut events = Command::new("curl")
        .args(["-sSN", "--max-time", "30", &url])
        .stdout(Stdio::piped())
        .spawn()
        .expect("curl runs");
    let mut lines = BufReader::new(events.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "event: columns");
    assert_eq!(
        lines.next().unwrap().unwrap(),
        "data: [\"card\",\"n\",\"total\",\"changed_at\"]"
    );

    let inserted = ok(
        "INSERT INTO web VALUES ('2026-11-26 10:00:00', 'c-1', 10), \
                       ('2026-11-26 10:00:01', 'c-2', 99), ('2026-11-26 10:01:00', 'c-1', 2.5)",
    );
    assert_eq!(inserted["tag"], "INSERT 0 3");
    let mut rows = Vec::new();
    while rows.len() < 2 {
        let line = lines.next().expect("an event").unwrap();
        if let Some(data) = line.strip_prefix("data: ") {
            rows.push(data.to_string());
        }
    }
    assert_eq!(
        rows,
        [
            "[\"c-1\",\"1\",\"10\",\"2026-11-26 10:00:00\"]",
            "[\"c-1\",\"2\",\"12.5\",\"2026-11-26 10:01:00\"]"
        ]
    );
    let _ = events.kill();
    let _ = events.wait();

    let read = ok("SELECT card, n, total FROM web_card ORDER BY card");
    assert_eq!(read["columns"], serde_json::json!(["card", "n", "total"]));
    assert_eq!(
        read["rows"],
        serde_json::json!([["c-1", "2", "12.5"], ["c-2", "1", "99"]])
    );
    assert_eq!(read["tag"], "SELECT 2");

    // Errors are PostgreSQL's, and the next statement still runs.
    let (status, e) = sql(&base, None, "SELECT * FROM nowhere");
    assert_eq!(
        (status, e["error"]["sqlstate"].as_str()),
        (400, Some("42P01")),
        "{e}"
    );
    let (status, e) = sql(&base, None, "COPY web FROM STDIN");
    assert_eq!(
        (status, e["error"]["sqlstate"].as_str()),
        (400, Some("0A000")),
        "{e}"
    );
    let (status, e) = curl(&[&format!("{base}/api/subscribe?q=SELECT%201")]);
    assert_eq!(status, 400, "{e}");
    assert!(e.contains("EMIT CHANGES"), "{e}");
    assert_eq!(ok("SELECT 1 AS one")["rows"], serde_json::json!([["1"]]));

    // The page itself, and the metrics beside it.
    let (status, page) = curl(&[&format!("{base}/")]);
    assert_eq!(status, 200);
    assert!(page.contains("<html"), "{page}");
    let (_, metrics) = curl(&[&format!("{base}/metrics")]);
    for line in [
        "eddy_statement_duration_seconds_count{kind=\"insert\"} 1",
        "eddy_ingest_duration_seconds_count 1",
        "eddy_task_events_total{stream=\"web\",partitioner=\"0\",partition=\"0\"}",
    ] {
        assert!(metrics.contains(line), "no {line} in\n{metrics}");
    }
    eddy.terminate();
}

#[test]
fn with_a_password_the_console_takes_basic_logins() {
    let dir = temp_dir("console-auth");
    let http = free_port();
    let http_addr = format!("127.0.0.1:{http}");
    let (eddy, _port) = spawn_eddy_env(
        &dir,
        &["--http-addr", &http_addr],
        &[("EDDY_PASSWORD", "console-pw")],
    );
    let base = format!("http://{http_addr}");
    let (status, _) = sql(&base, None, "SELECT 1");
    assert_eq!(status, 401);
    let (status, _) = sql(&base, Some("eddy:wrong"), "SELECT 1");
    assert_eq!(status, 401);
    let (status, page) = curl(&[&format!("{base}/")]);
    assert_eq!(status, 401, "{page}");
    let (status, value) = sql(
        &base,
        Some("eddy:console-pw"),
        "CREATE ROLE viewer LOGIN PASSWORD 'v-pw'",
    );
    assert_eq!(status, 200, "{value}");
    sql(
        &base,
        Some("eddy:console-pw"),
        "CREATE STREAM sec (ts TIMESTAMP NOT NULL, v BIGINT) WITH (event_time = 'ts')",
    );
    // A role runs as itself: without a grant, 42501 (403).
    let (status, value) = sql(
        &base,
        Some("viewer:v-pw"),
        "INSERT INTO sec VALUES ('2026-11-26 10:00:00', 1)",
    );
    assert_eq!(status, 403, "{value}");
    assert_eq!(value["error"]["sqlstate"], "42501");
    let (status, value) = sql(&base, Some("viewer:v-pw"), "SELECT 1 AS one");
    assert_eq!(status, 200, "{value}");
    // /metrics stays open, as for Prometheus.
    let (status, _) = curl(&[&format!("{base}/metrics")]);
    assert_eq!(status, 200);
    eddy.terminate();
}
