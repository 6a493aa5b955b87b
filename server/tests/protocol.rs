//! Protocol-level tests against an in-process server: a scripted psql session compared
//! with its expected output, tokio-postgres on the extended protocol (typed binary
//! parameters, RETURNING, errors), CancelRequest, and the catalog surviving a restart.

use std::process::Command;
use std::time::Duration;

mod common;

use eddy_server::serve::Server;

use common::{connect, repo, simple_rows, start, temp_dir};

/// Runs `clients/psql/NAME.sql` with `psql` against a fresh server and compares what it
/// prints with `NAME.expected` (`NAME.psql17.expected` for psql 17; `EDDY_BLESS=1`
/// rewrites the expectation).
async fn psql_script_matches_expected_output(name: &str, psql: Psql) {
    let dir = temp_dir(&format!("psql-{name}-{}", psql.suffix()));
    let server = start(&dir).await;
    let script_dir = repo().join("clients/psql");
    let port = server.addr.port().to_string();
    let script = format!("{name}.sql");
    let program = psql.program();
    let output = tokio::task::spawn_blocking(move || {
        Command::new(&program)
            .args([
                "-X",
                "-h",
                "127.0.0.1",
                "-p",
                &port,
                "-U",
                "eddy",
                "-d",
                "eddy",
                "-f",
            ])
            .arg(script)
            .current_dir(&script_dir)
            .env("PGAPPNAME", "psql")
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"))
    })
    .await
    .unwrap();
    let got = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let expected_path = repo().join(format!("clients/psql/{name}{}.expected", psql.suffix()));
    if std::env::var("EDDY_BLESS").is_ok() {
        std::fs::write(&expected_path, &got).unwrap();
    }
    let expected = std::fs::read_to_string(&expected_path).unwrap();
    assert_eq!(
        got,
        expected,
        "psql output differs from {}",
        expected_path.display()
    );
    server.stop().await;
}

/// Which psql runs a script: Debian 12's psql 15, or psql 17 as `.ci/psql17` provides it
/// (newer psql sends other catalog queries).
#[derive(Clone, Copy)]
enum Psql {
    V15,
    V17,
}

impl Psql {
    fn suffix(self) -> &'static str {
        match self {
            Psql::V15 => "",
            Psql::V17 => ".psql17",
        }
    }

    fn program(self) -> String {
        match self {
            Psql::V15 => "psql".into(),
            Psql::V17 => std::env::var("EDDY_PSQL17").unwrap_or_else(|_| {
                let home = std::env::var("HOME").expect("HOME");
                let path = format!("{home}/.cache/eddy-psql17/bin/psql");
                assert!(
                    std::path::Path::new(&path).exists(),
                    "psql 17 is missing: run .ci/psql17 (make test does)"
                );
                path
            }),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_session_matches_expected_output() {
    psql_script_matches_expected_output("tour", Psql::V15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_describe_commands_match_expected_output() {
    psql_script_matches_expected_output("describe", Psql::V15).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql17_describe_commands_match_expected_output() {
    psql_script_matches_expected_output("describe", Psql::V17).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_with_binary_parameters() {
    let dir = temp_dir("extended");
    let server = start(&dir).await;
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, k TEXT NOT NULL, x DOUBLE PRECISION, n INTEGER) \
             WITH (event_time = 'ts', event_id = 'id', partition_by = 'k', partitions = 3); \
             CREATE METRIC m AS SELECT k, COUNT(*) AS c, SUM(x) AS sx, SUM(n) AS sn, MIN(ts) AS first \
             FROM s WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY k",
        )
        .await
        .unwrap();
    let insert = client
        .prepare("INSERT INTO s VALUES ($1, $2, $3, $4, $5) RETURNING m.c, m.sx, m.sn")
        .await
        .unwrap();
    let base = chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .unwrap()
        .naive_utc();
    let mut sum = 0.0;
    for i in 0..5i64 {
        let ts = base + chrono::Duration::seconds(i);
        let x = 0.1 * (i + 1) as f64;
        sum += x;
        let row = client
            .query_one(&insert, &[&i, &ts, &"a", &x, &(i as i32)])
            .await
            .unwrap();
        assert_eq!(row.get::<_, i64>(0), i + 1);
        let sx: f64 = row.get(1);
        assert!((sx - sum).abs() < 1e-12, "{sx} vs {sum}");
        let sn: rust_decimal::Decimal = row.get(2);
        assert_eq!(sn, rust_decimal::Decimal::from((0..=i).sum::<i64>()));
    }
    let lookup = client
        .prepare("SELECT c, first FROM m WHERE k = $1")
        .await
        .unwrap();
    let rows = client.query(&lookup, &[&"a"]).await.unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].get::<_, i64>(0), 5);
    assert_eq!(rows[0].get::<_, chrono::NaiveDateTime>(1), base);
    assert!(client.query(&lookup, &[&"zz"]).await.unwrap().is_empty());

    let err = client
        .simple_query("INSERT INTO s VALUES (9, 'x', 'a', 1, 1)")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22P02");
    let err = client.query("SELECT * FROM nope", &[]).await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "42P01");
    let row = client
        .query_one("SELECT 1::BIGINT AS one", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    server.stop().await;
}

/// A result's bytes as the server sent them, whatever its type.
struct Raw(Vec<u8>);

impl<'a> postgres_types::FromSql<'a> for Raw {
    fn from_sql(
        _: &postgres_types::Type,
        raw: &'a [u8],
    ) -> Result<Raw, Box<dyn std::error::Error + Sync + Send>> {
        Ok(Raw(raw.to_vec()))
    }
    fn accepts(_: &postgres_types::Type) -> bool {
        true
    }
}

/// Times of day and intervals are sent as TIME and INTERVAL, not as text: a driver reads
/// them as its time and interval types, in binary (PostgreSQL's forms) as in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_and_intervals_have_their_types_in_binary_and_text() {
    use tokio_postgres::types::Type;
    let dir = temp_dir("time-interval-types");
    let server = start(&dir).await;
    let client = connect(&server).await;
    let sql = "SELECT time '10:11:12.25' AS t, interval '1 year 2 mons 3 days 04:05:06.5' AS i, \
               timestamp '2024-01-02' - timestamp '2024-01-01 01:00' AS d, \
               interval '-1 day' + interval '2 hours' AS n";
    // The extended protocol, results in binary.
    let row = client.query_one(sql, &[]).await.unwrap();
    let types: Vec<Type> = row.columns().iter().map(|c| c.type_().clone()).collect();
    assert_eq!(
        types,
        [Type::TIME, Type::INTERVAL, Type::INTERVAL, Type::INTERVAL]
    );
    assert_eq!(
        row.get::<_, chrono::NaiveTime>(0),
        chrono::NaiveTime::from_hms_micro_opt(10, 11, 12, 250_000).unwrap()
    );
    // An interval's binary form: its microseconds, days and months.
    let interval = |micros: i64, days: i32, months: i32| {
        [
            &micros.to_be_bytes()[..],
            &days.to_be_bytes(),
            &months.to_be_bytes(),
        ]
        .concat()
    };
    assert_eq!(
        row.get::<_, Raw>(1).0,
        interval(14_706_500_000, 3, 14),
        "1 year 2 mons 3 days 04:05:06.5"
    );
    assert_eq!(row.get::<_, Raw>(2).0, interval(82_800_000_000, 0, 0));
    assert_eq!(row.get::<_, Raw>(3).0, interval(7_200_000_000, -1, 0));
    // The simple protocol, in text.
    let text = simple_rows(&client, sql).await;
    let want = [
        "10:11:12.25",
        "1 year 2 mons 3 days 04:05:06.5",
        "23:00:00",
        "-1 days +02:00:00",
    ];
    assert_eq!(text, [want.map(|t| Some(t.to_string())).to_vec()]);
    let typeof_ = "SELECT pg_typeof(time '10:00'), pg_typeof(interval '1 day')";
    assert_eq!(
        simple_rows(&client, typeof_).await,
        [vec![
            Some("time without time zone".to_string()),
            Some("interval".to_string())
        ]]
    );
    server.stop().await;
}

/// A bytea is sent as BYTEA: its bytes in binary, `\x` and hex in text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bytea_has_its_type_in_binary_and_text() {
    use tokio_postgres::types::Type;
    let dir = temp_dir("bytea-type");
    let server = start(&dir).await;
    let client = connect(&server).await;
    let sql = "SELECT 'a\\000b'::bytea AS b";
    let row = client.query_one(sql, &[]).await.unwrap();
    assert_eq!(*row.columns()[0].type_(), Type::BYTEA);
    assert_eq!(row.get::<_, Vec<u8>>(0), b"a\0b");
    assert_eq!(
        simple_rows(&client, sql).await,
        [vec![Some("\\x610062".to_string())]]
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_request_stops_a_running_query() {
    let dir = temp_dir("cancel");
    let server = start(&dir).await;
    let client = connect(&server).await;
    let token = client.cancel_token();
    let mut running = tokio::spawn(async move {
        client
            .simple_query("SELECT count(*) FROM generate_series(1, 100000000000)")
            .await
    });
    // Cancel until the query ends: a cancel that arrives before the query started is
    // a no-op in PostgreSQL's protocol, so one attempt could race with the start.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let result = loop {
        tokio::select! {
            done = &mut running => break done.unwrap(),
            _ = tokio::time::sleep(Duration::from_millis(100)) => {
                assert!(tokio::time::Instant::now() < deadline, "the query did not end after cancel");
                token.cancel_query(tokio_postgres::NoTls).await.unwrap();
            }
        }
    };
    let err = result.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "57014", "{err}");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn catalog_survives_restart() {
    let dir = temp_dir("restart");
    let server = start(&dir).await;
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE STREAM r (ts TIMESTAMP NOT NULL, k TEXT) WITH (event_time = 'ts'); \
             CREATE METRIC rm AS SELECT k, COUNT(*) AS c FROM r WINDOW INFINITE GROUP BY k; \
             CREATE METRIC gone AS SELECT k, COUNT(*) AS c FROM r WINDOW INFINITE GROUP BY k; \
             DROP METRIC gone",
        )
        .await
        .unwrap();
    // Stopping ends open connections too: nothing of the old node may still run when
    // the new one opens the same directory.
    server.stop().await;
    assert!(client.simple_query("SHOW METRICS").await.is_err());
    let server = start(&dir).await;
    let client = connect(&server).await;
    let rows = client.simple_query("SHOW METRICS").await.unwrap();
    let names: Vec<String> = rows
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().to_string()),
            _ => None,
        })
        .collect();
    assert_eq!(names, vec!["rm".to_string()]);
    client
        .batch_execute("INSERT INTO r VALUES ('2026-01-01 00:00:00', 'a')")
        .await
        .unwrap();
    let row = client
        .query_one("SELECT c FROM rm WHERE k = 'a'", &[])
        .await
        .unwrap();
    assert_eq!(row.get::<_, i64>(0), 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_is_observable_in_sql_and_over_http() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let dir = temp_dir("observe");
    let server = start(&dir).await;
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE STREAM obs (id BIGINT, ts TIMESTAMP NOT NULL, card TEXT NOT NULL) \
             WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 2); \
             INSERT INTO obs VALUES (1, '2026-01-01 00:00:00', 'a'), (2, '2026-01-01 00:00:01', 'b'); \
             INSERT INTO obs VALUES (1, '2026-01-01 00:00:02', 'a');",
        )
        .await
        .unwrap();
    let rows = client.query("SHOW STORAGE", &[]).await.unwrap();
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.get::<_, String>("stream"), "obs");
    assert_eq!(r.get::<_, i32>("tasks"), 2);
    assert_eq!(r.get::<_, i64>("events"), 2);
    assert_eq!(r.get::<_, i64>("duplicates"), 1);
    assert_eq!(r.get::<_, i64>("stored_events"), 2);
    assert!(r.get::<_, i64>("log_bytes") > 0);

    let http = server.http_addr.expect("metrics listener");
    let mut socket = tokio::net::TcpStream::connect(http).await.unwrap();
    socket
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: eddy\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    socket.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 200 OK"), "{body}");
    for line in [
        "eddy_events_total{stream=\"obs\"} 2",
        "eddy_duplicate_events_total{stream=\"obs\"} 1",
        "eddy_log_records_total 3",
        "eddy_log_appends_total 2",
        "eddy_subscriptions 0",
    ] {
        assert!(body.lines().any(|l| l == line), "no {line:?} in\n{body}");
    }
    // Prometheus' own parser and linter take the page, and no family comes twice.
    let page = body.split("\r\n\r\n").nth(1).unwrap();
    let mut families: Vec<&str> = page
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next())
        .collect();
    let all = families.len();
    families.sort_unstable();
    families.dedup();
    assert_eq!(families.len(), all, "a family twice in\n{page}");
    for name in [
        "eddy_build_info",
        "process_resident_memory_bytes",
        "eddy_connections",
    ] {
        assert!(families.contains(&name), "no {name} in\n{page}");
    }
    let mut promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; .ci/setup installs it)");
    use std::io::Write as _;
    promtool
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let checked = promtool.wait_with_output().unwrap();
    assert!(
        checked.status.success() && checked.stdout.is_empty() && checked.stderr.is_empty(),
        "promtool check metrics: {}{}\n{page}",
        String::from_utf8_lossy(&checked.stdout),
        String::from_utf8_lossy(&checked.stderr)
    );
    let mut socket = tokio::net::TcpStream::connect(http).await.unwrap();
    socket
        .write_all(b"GET /nothing HTTP/1.1\r\nHost: eddy\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = String::new();
    socket.read_to_string(&mut body).await.unwrap();
    assert!(body.starts_with("HTTP/1.1 404"), "{body}");
    server.stop().await;
}

/// A prepared statement's row as text, for the column types the test uses.
fn row_text(row: &tokio_postgres::Row) -> Vec<Option<String>> {
    use tokio_postgres::types::Type;
    (0..row.len())
        .map(|i| match *row.columns()[i].type_() {
            Type::INT8 => row.get::<_, Option<i64>>(i).map(|v| v.to_string()),
            Type::INT4 => row.get::<_, Option<i32>>(i).map(|v| v.to_string()),
            Type::NUMERIC => row
                .get::<_, Option<rust_decimal::Decimal>>(i)
                .map(|v| v.to_string()),
            Type::TEXT => row.get::<_, Option<String>>(i),
            ref other => panic!("untested type {other}"),
        })
        .collect()
}

/// A server (and its directory) with a client, and stream `s` partitioned by `k` and by
/// `g`, with metrics of both partitioners: `by_k` (COUNT and SUM of `n` per `k` over a
/// sliding minute), `by_g` (COUNT and MAX per `g`) and `by_kg` (SUM per `k`, `g`).
async fn with_stream_s(name: &str) -> (common::TempDir, Server, tokio_postgres::Client) {
    let dir = temp_dir(name);
    let server = start(&dir).await;
    let client = connect(&server).await;
    client
        .batch_execute(
            "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, k TEXT NOT NULL, \
             g INTEGER NOT NULL, n INTEGER) \
             WITH (event_time = 'ts', event_id = 'id', partition_by = 'k, g', partitions = 3); \
             CREATE METRIC by_k AS SELECT k, COUNT(*) AS c, SUM(n) AS sn \
             FROM s WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY k; \
             CREATE METRIC by_g AS SELECT g, COUNT(*) AS c, MAX(n) AS mx \
             FROM s WINDOW INFINITE GROUP BY g; \
             CREATE METRIC by_kg AS SELECT k, g, SUM(n) AS sn \
             FROM s WINDOW INFINITE GROUP BY k, g",
        )
        .await
        .unwrap();
    (dir, server, client)
}

/// A prepared INSERT into `s` (id, ts, k, g, n) of the rows `values`, returning `returning`.
async fn prepare_insert(
    client: &tokio_postgres::Client,
    values: &[String],
    returning: &str,
) -> tokio_postgres::Statement {
    client
        .prepare(&format!(
            "INSERT INTO s (id, ts, k, g, n) VALUES {} RETURNING {returning}",
            values.join(", ")
        ))
        .await
        .unwrap()
}

/// The event time the large-INSERT tests start from.
fn t0() -> chrono::NaiveDateTime {
    chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .unwrap()
        .naive_utc()
}

/// A prepared INSERT with RETURNING sends each part's rows as the shards apply it: every
/// row still comes back in order, its notices (here of duplicates) still reach the client,
/// and an Execute with a row limit still gets its rows a few at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_insert_sends_its_notices_and_keeps_a_row_limit() {
    let (_dir, server, _) = with_stream_s("streamed-insert").await;
    let config = format!(
        "host=127.0.0.1 port={} user=eddy dbname=eddy",
        server.addr.port()
    );
    let (mut client, mut conn) = tokio_postgres::connect(&config, tokio_postgres::NoTls)
        .await
        .unwrap();
    let (notices, mut heard) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        while let Some(m) = futures::future::poll_fn(|cx| conn.poll_message(cx)).await {
            if let Ok(tokio_postgres::AsyncMessage::Notice(n)) = m {
                let _ = notices.send(n.message().to_string());
            }
        }
    });
    // Three parts (`INSERT_PART_ROWS` is 256).
    let rows = 600i64;
    let values: Vec<String> = (0..rows)
        .map(|i| format!("(${}, ${}, ${}, 1, 1)", 3 * i + 1, 3 * i + 2, 3 * i + 3))
        .collect();
    let insert = prepare_insert(&client, &values, "id, by_k.c").await;
    let base = t0();
    let params: Vec<(i64, chrono::NaiveDateTime, String)> = (0..rows)
        .map(|i| {
            (
                i,
                base + chrono::Duration::milliseconds(i),
                (i % 7).to_string(),
            )
        })
        .collect();
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = params
        .iter()
        .flat_map(|(id, ts, k)| {
            [
                id as &(dyn tokio_postgres::types::ToSql + Sync),
                ts as _,
                k as _,
            ]
        })
        .collect();
    let first = client.query(&insert, &refs).await.unwrap();
    assert!(heard.try_recv().is_err(), "no notice for new events");
    // The same ids again: every event is a duplicate, answered with its group's values.
    let again = client.query(&insert, &refs).await.unwrap();
    assert_eq!((first.len(), again.len()), (rows as usize, rows as usize));
    for (i, (a, b)) in (0..rows).zip(first.iter().zip(&again)) {
        assert_eq!((a.get::<_, i64>(0), b.get::<_, i64>(0)), (i, i));
        assert_eq!(a.get::<_, i64>(1), i / 7 + 1, "by_k.c of row {i}");
        assert_eq!(
            b.get::<_, i64>(1),
            (rows - 1 - i % 7) / 7 + 1,
            "by_k.c of row {i} again"
        );
    }
    assert_eq!(
        tokio::time::timeout(Duration::from_secs(10), heard.recv())
            .await
            .expect("a notice of the duplicates")
            .unwrap(),
        "600 duplicate events not applied again to stream \"s\""
    );
    // Five rows, two at a time, in a transaction's portal.
    let small = client
        .prepare(
            "INSERT INTO s (id, ts, k, g, n) VALUES ($1, $2, 'd', 1, 1), ($3, $2, 'd', 1, 1), \
             ($4, $2, 'd', 1, 1), ($5, $2, 'd', 1, 1), ($6, $2, 'd', 1, 1) RETURNING id, by_k.c",
        )
        .await
        .unwrap();
    let ts = base + chrono::Duration::seconds(1);
    let ids: Vec<i64> = (1000..1005).collect();
    let tx = client.transaction().await.unwrap();
    let portal = tx
        .bind(&small, &[&ids[0], &ts, &ids[1], &ids[2], &ids[3], &ids[4]])
        .await
        .unwrap();
    let mut got = Vec::new();
    for want in [2, 2, 1] {
        let part = tx.query_portal(&portal, 2).await.unwrap();
        assert_eq!(part.len(), want, "rows of one Execute");
        got.extend(
            part.iter()
                .map(|r| (r.get::<_, i64>(0), r.get::<_, i64>(1))),
        );
    }
    tx.commit().await.unwrap();
    assert_eq!(got, (1000..1005).zip(1..6).collect::<Vec<_>>());
    server.stop().await;
}

/// A parameter under a cast in VALUES has the cast's type, as PostgreSQL infers it:
/// `$2::text::timestamp` is text though its column is a TIMESTAMP, and `$4::bigint`
/// is a bigint in an INTEGER column; the cell is then converted as an expression. A
/// cast to the column's own type keeps the prepared fast path's typing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cast_parameter_in_values_has_the_casts_type() {
    use tokio_postgres::types::Type;
    let (_dir, server, client) = with_stream_s("castparams").await;
    let cast = client
        .prepare(
            "INSERT INTO s (id, ts, k, g, n) \
             VALUES ($1, $2::text::timestamp, $3::text, $4::bigint, $5) \
             RETURNING id, by_k.c, by_g.c",
        )
        .await
        .unwrap();
    assert_eq!(
        cast.params(),
        [Type::INT8, Type::TEXT, Type::TEXT, Type::INT8, Type::INT4]
    );
    for (id, want) in [(1i64, 1i64), (2, 2)] {
        let row = client
            .query_one(&cast, &[&id, &"2027-01-01 00:00:05", &"c-1", &7i64, &3i32])
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, i64>(0),
                row.get::<_, i64>(1),
                row.get::<_, i64>(2)
            ),
            (id, want, want)
        );
    }
    let own = client
        .prepare("INSERT INTO s (id, ts, k, g, n) VALUES ($1, $2::timestamp, $3, $4::int, $5)")
        .await
        .unwrap();
    assert_eq!(
        own.params(),
        [
            Type::INT8,
            Type::TIMESTAMP,
            Type::TEXT,
            Type::INT4,
            Type::INT4
        ]
    );
    server.stop().await;
}

/// Prepared INSERTs bind their parameters without SQL, and prepared point lookups read
/// the group directly: both must answer exactly as the same statement with its
/// parameters written as literals, run through the simple protocol.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepared_fast_paths_answer_as_the_general_path() {
    let (_dir, server, client) = with_stream_s("fastpaths").await;
    // An expression in VALUES takes the general path (its parameters written into it).
    let with_expr = client
        .prepare(
            "INSERT INTO s (id, ts, k, g, n) VALUES ($1, $2, 'c-' || 'x', $3, $4), \
             ($5, '2027-01-01 00:00:00', $6, 7, NULL) RETURNING id, k, by_k.c, by_k.sn, by_g.mx",
        )
        .await
        .unwrap();
    let t = chrono::DateTime::from_timestamp(1_799_999_000, 0)
        .unwrap()
        .naive_utc();
    let rows = client
        .query(&with_expr, &[&9000i64, &t, &1i32, &2i32, &9001i64, &"c-y"])
        .await
        .unwrap();
    let ks: Vec<String> = rows.iter().map(|r| r.get(1)).collect();
    assert_eq!(ks, ["c-x", "c-y"]);
    assert_eq!(rows[0].get::<_, i64>(2), 1);
    let insert = client
        .prepare(
            "INSERT INTO s (id, ts, k, g, n) VALUES ($1, $2, $3, $4, $5), \
             ($6, '2027-01-01 00:00:00', $7, 7, NULL) RETURNING id, k, by_k.c, by_k.sn, by_g.mx",
        )
        .await
        .unwrap();
    let base = chrono::DateTime::from_timestamp(1_800_000_000, 0)
        .unwrap()
        .naive_utc();
    for i in 0..20i64 {
        let ts = base + chrono::Duration::seconds(i);
        let k = format!("c-{}", i % 4);
        let rows = client
            .query(
                &insert,
                &[
                    &(2 * i),
                    &ts,
                    &k,
                    &((i % 3) as i32),
                    &(i as i32),
                    &(2 * i + 1),
                    &k,
                ],
            )
            .await
            .unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].get::<_, i64>(0), 2 * i);
        assert_eq!(rows[1].get::<_, String>(1), k);
        assert_eq!(rows[1].get::<_, i64>(0), 2 * i + 1);
    }
    // The same statement through the general path (literals, simple protocol).
    client
        .simple_query(
            "INSERT INTO s (id, ts, k, g, n) VALUES (1000, '2027-01-01 00:00:01', 'c-9', 1, 5)",
        )
        .await
        .unwrap();
    let err = client
        .query(
            &insert,
            &[&1i64, &base, &None::<&str>, &1i32, &1i32, &2i64, &"a"],
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23502", "{err}");

    // Lookups: (prepared text, its parameters, the same query with literals).
    type P = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;
    let cases: Vec<(&str, Vec<P>, String)> = vec![
        (
            "SELECT * FROM by_k WHERE k = $1",
            vec![Box::new("c-1")],
            "SELECT * FROM by_k WHERE k = 'c-1'".into(),
        ),
        (
            "SELECT sn, k FROM by_k WHERE $1 = k",
            vec![Box::new("c-2")],
            "SELECT sn, k FROM by_k WHERE 'c-2' = k".into(),
        ),
        (
            "SELECT c FROM by_k WHERE k = 'c-' || $1",
            vec![Box::new("3")],
            "SELECT c FROM by_k WHERE k = 'c-' || '3'".into(),
        ),
        (
            "SELECT k, c FROM by_k WHERE k = $1 || '-' || $2",
            vec![Box::new("c"), Box::new("2")],
            "SELECT k, c FROM by_k WHERE k = 'c' || '-' || '2'".into(),
        ),
        (
            "SELECT c FROM by_k WHERE k = 'c-' || $1",
            vec![Box::new(None::<String>)],
            "SELECT c FROM by_k WHERE k = 'c-' || NULL".into(),
        ),
        (
            "SELECT * FROM by_k WHERE k = $1",
            vec![Box::new("nope")],
            "SELECT * FROM by_k WHERE k = 'nope'".into(),
        ),
        (
            "SELECT * FROM by_k WHERE k = $1",
            vec![Box::new(None::<String>)],
            "SELECT * FROM by_k WHERE k = NULL".into(),
        ),
        (
            "SELECT * FROM by_g WHERE g = $1",
            vec![Box::new(2i32)],
            "SELECT * FROM by_g WHERE g = 2".into(),
        ),
        (
            "SELECT mx, c FROM by_g WHERE g = $1 + 1",
            vec![Box::new(0i64)],
            "SELECT mx, c FROM by_g WHERE g = 0 + 1".into(),
        ),
        (
            "SELECT * FROM by_kg WHERE k = $1 AND g = $2",
            vec![Box::new("c-9"), Box::new(1i32)],
            "SELECT * FROM by_kg WHERE k = 'c-9' AND g = 1".into(),
        ),
        (
            "SELECT * FROM by_kg WHERE g = $2 AND k = $1",
            vec![Box::new("c-0"), Box::new(0i32)],
            "SELECT * FROM by_kg WHERE g = 0 AND k = 'c-0'".into(),
        ),
        // Not lookups: a key left free, another condition, an ORDER BY.
        (
            "SELECT * FROM by_kg WHERE k = $1 ORDER BY g",
            vec![Box::new("c-1")],
            "SELECT * FROM by_kg WHERE k = 'c-1' ORDER BY g".into(),
        ),
        (
            "SELECT * FROM by_k WHERE k = $1 AND c > 100",
            vec![Box::new("c-1")],
            "SELECT * FROM by_k WHERE k = 'c-1' AND c > 100".into(),
        ),
    ];
    for round in 0..2 {
        for (sql, params, literal) in &cases {
            let stmt = client.prepare(sql).await.unwrap();
            let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> =
                params.iter().map(|p| p.as_ref() as _).collect();
            let fast: Vec<_> = client
                .query(&stmt, &refs)
                .await
                .unwrap_or_else(|e| panic!("{sql}: {e:?}"))
                .iter()
                .map(row_text)
                .collect();
            let general: Vec<Vec<Option<String>>> = simple_rows(&client, literal).await;
            assert_eq!(fast, general, "{sql} (round {round})");
            // Twice through the same statement: the second time from its cached binding.
            let again: Vec<_> = client
                .query(&stmt, &refs)
                .await
                .unwrap()
                .iter()
                .map(row_text)
                .collect();
            assert_eq!(again, general, "{sql} again (round {round})");
        }
        // A catalog change: statements bind again against the new catalog.
        client
            .batch_execute(
                &format!(
                "CREATE METRIC extra{round} AS SELECT k, COUNT(*) AS c FROM s WINDOW INFINITE GROUP BY k"
            ))
            .await
            .unwrap();
    }
    let found = client
        .query("SELECT c FROM by_k WHERE k = $1", &[&"c-1"])
        .await
        .unwrap();
    assert_eq!(found[0].get::<_, i64>(0), 5);

    // synchronous_commit is a session setting with PostgreSQL's values.
    client
        .batch_execute("SET synchronous_commit = off")
        .await
        .unwrap();
    let shown = simple_rows(&client, "SHOW synchronous_commit").await;
    assert_eq!(shown[0][0].as_deref(), Some("off"));
    client
        .query(
            &insert,
            &[&5000i64, &base, &"z", &1i32, &1i32, &5001i64, &"z"],
        )
        .await
        .unwrap();
    let err = client
        .batch_execute("SET synchronous_commit = sometimes")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22023");
    client
        .batch_execute("SET synchronous_commit TO 'on'")
        .await
        .unwrap();
    let shown = simple_rows(&client, "SHOW synchronous_commit").await;
    assert_eq!(shown[0][0].as_deref(), Some("on"));
    server.stop().await;
}

/// A multi-row INSERT larger than one part (`Db::insert` hands 256 rows at a time to the
/// engine) answers every row in input order, each with its metrics' values after it,
/// from metrics of two partitioners; a bad row anywhere fails it before any row applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_large_insert_answers_every_row_in_order() {
    let (_dir, server, client) = with_stream_s("large-insert").await;
    let rows = 700i64;
    let values: Vec<String> = (0..rows)
        .map(|i| {
            let p = 4 * i;
            format!(
                "(${}, ${}, ${}, ${}, ${})",
                p + 1,
                p + 2,
                p + 3,
                p + 4,
                4 * rows + 1
            )
        })
        .collect();
    let insert = prepare_insert(&client, &values, "id, k, by_k.c, by_k.sn, by_g.c").await;
    let base = t0();
    let params = |bad: Option<i64>| {
        let mut p: Vec<P> = Vec::new();
        for i in 0..rows {
            p.push(Box::new(i));
            // 700 events in 35 s: none leaves by_k's sliding minute.
            let ts = base + chrono::Duration::milliseconds(50 * i);
            p.push(Box::new((bad != Some(i)).then_some(ts)));
            p.push(Box::new(format!("c-{}", i % 5)));
            p.push(Box::new((i % 3) as i32));
        }
        p.push(Box::new(1i32));
        p
    };
    type P = Box<dyn tokio_postgres::types::ToSql + Sync + Send>;
    fn refs(p: &[P]) -> Vec<&(dyn tokio_postgres::types::ToSql + Sync)> {
        p.iter()
            .map(|b| b.as_ref() as &(dyn tokio_postgres::types::ToSql + Sync))
            .collect()
    }
    // A NULL event time in the last part: nothing of the statement applies.
    let bad = params(Some(rows - 10));
    let err = client.query(&insert, &refs(&bad)).await.unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23502", "{err}");
    let good = params(None);
    let answered = client.query(&insert, &refs(&good)).await.unwrap();
    assert_eq!(answered.len(), rows as usize);
    for (i, row) in (0..rows).zip(&answered) {
        // Every n is 1: a card's count and sum are the events of it so far.
        let seen = i / 5 + 1;
        assert_eq!(row.get::<_, i64>(0), i);
        assert_eq!(row.get::<_, String>(1), format!("c-{}", i % 5));
        assert_eq!(row.get::<_, i64>(2), seen, "by_k.c of row {i}");
        assert_eq!(
            row.get::<_, rust_decimal::Decimal>(3),
            rust_decimal::Decimal::from(seen),
            "by_k.sn of row {i}"
        );
        assert_eq!(row.get::<_, i64>(4), i / 3 + 1, "by_g.c of row {i}");
    }
    server.stop().await;
}
