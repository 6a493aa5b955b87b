//! Broken and hostile clients against the real binary: every named limit gives its
//! SQLSTATE and leaves the session (or the node) usable, and an attack of idle sockets,
//! half-sent messages, random bytes, slow logins and clients that never read costs
//! bounded memory while a normal client's inserts all succeed. The normal client's
//! latency before and during the attack is printed (`--nocapture`), never judged.

mod common;

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use common::{
    connect_as, connect_port, fails as code, frontend_message as message, psql, simple_rows,
    spawn_eddy, startup_message as startup, temp_dir,
};

fn query(text: &[u8]) -> Vec<u8> {
    let mut body = text.to_vec();
    body.push(0);
    message(b'Q', &body)
}

/// The next backend message (`None`: the server closed the connection).
async fn next(s: &mut TcpStream) -> Option<(u8, Vec<u8>)> {
    let kind = s.read_u8().await.ok()?;
    let len = s.read_u32().await.ok()? as usize;
    let mut body = vec![0; len.checked_sub(4)?];
    s.read_exact(&mut body).await.ok()?;
    Some((kind, body))
}

/// The SQLSTATE of an ErrorResponse's body.
fn code_of(body: &[u8]) -> String {
    body.split(|b| *b == 0)
        .find_map(|f| f.strip_prefix(b"C"))
        .map(|c| String::from_utf8_lossy(c).into_owned())
        .unwrap_or_default()
}

/// Reads up to ReadyForQuery; the SQLSTATEs of the errors on the way.
async fn until_ready(s: &mut TcpStream) -> Option<Vec<String>> {
    let mut errors = Vec::new();
    loop {
        let (kind, body) = next(s).await?;
        match kind {
            b'E' => errors.push(code_of(&body)),
            b'Z' => return Some(errors),
            _ => {}
        }
    }
}

async fn logged_in(port: u16, user: &str) -> TcpStream {
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    s.write_all(&startup(user)).await.unwrap();
    assert_eq!(until_ready(&mut s).await, Some(Vec::new()));
    s
}

fn psql_copy(port: u16, data: &str) -> std::process::Output {
    let conninfo = format!("host=127.0.0.1 port={port} user=eddy dbname=eddy");
    psql(&conninfo, "COPY pay FROM STDIN WITH (FORMAT csv)", data)
}

const SCHEMA: &str =
    "CREATE STREAM pay (card TEXT, amount BIGINT, ts TIMESTAMP) WITH (event_time = 'ts');
     CREATE METRIC spend AS SELECT card, COUNT(*) AS n FROM pay WINDOW INFINITE GROUP BY card;";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_limit_gives_its_error_and_the_session_goes_on() {
    let dir = temp_dir("limits");
    let (server, port) = spawn_eddy(&dir);
    let admin = connect_port(port).await;
    admin.batch_execute(SCHEMA).await.unwrap();
    for (name, value) in [
        ("max_statement_bytes", "'4kB'"),
        ("max_insert_rows", "10"),
        ("max_copy_row_bytes", "'1kB'"),
        ("session_memory_bytes", "'64kB'"),
        ("max_subscriptions", "1"),
        ("max_message_bytes", "'64kB'"),
        ("authentication_timeout", "'1s'"),
        ("max_connections_per_role", "3"),
    ] {
        admin
            .batch_execute(&format!("ALTER SYSTEM SET {name} = {value}"))
            .await
            .unwrap();
    }
    let events = || async { simple_rows(&admin, "SELECT SUM(n) FROM spend").await };
    admin
        .batch_execute("INSERT INTO pay VALUES ('c0', 1, '2026-01-01 00:00:00')")
        .await
        .unwrap();

    // One statement too long, one INSERT with too many rows: 54000, and nothing applied.
    let long = format!("SELECT 1 -- {}", "x".repeat(5000));
    assert_eq!(code(&admin, &long).await.as_deref(), Some("54000"));
    let rows: Vec<String> = (0..11)
        .map(|i| format!("('c{i}', 1, '2026-01-01 00:00:00')"))
        .collect();
    let insert = format!("INSERT INTO pay VALUES {}", rows.join(", "));
    assert_eq!(code(&admin, &insert).await.as_deref(), Some("54000"));
    assert_eq!(
        code(
            &admin,
            &insert.replace(", ('c10', 1, '2026-01-01 00:00:00')", "")
        )
        .await,
        None
    );
    assert_eq!(events().await, [[Some("11".to_string())]]);

    // A result larger than a session may hold.
    assert_eq!(
        code(&admin, "SELECT repeat('x', 100000)").await.as_deref(),
        Some("54000")
    );

    // COPY: a row too long, and more data than a session may hold.
    let long_row = format!(
        "c1,1,2026-01-01 00:00:00\n{},1,2026-01-01 00:00:00\n",
        "y".repeat(2000)
    );
    let out = psql_copy(port, &long_row);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("max_copy_row_bytes"),
        "{out:?}"
    );
    let many: String = (0..5000)
        .map(|i| format!("c{},1,2026-01-01 00:00:00\n", i % 50))
        .collect();
    let out = psql_copy(port, &many);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("session_memory_bytes"),
        "{out:?}"
    );
    assert_eq!(events().await, [[Some("11".to_string())]]);
    let some: String = many.lines().take(500).map(|l| format!("{l}\n")).collect();
    let out = psql_copy(port, &some);
    assert!(out.status.success(), "{out:?}");

    // One subscription on the node; a second waits for the first to close.
    let first = connect_port(port).await;
    let second = connect_port(port).await;
    let declare = "BEGIN; DECLARE c CURSOR FOR SELECT * FROM spend EMIT CHANGES";
    assert_eq!(code(&first, declare).await, None);
    assert_eq!(code(&second, declare).await.as_deref(), Some("54000"));
    second.batch_execute("ROLLBACK").await.unwrap();
    first.batch_execute("CLOSE c; COMMIT").await.unwrap();
    assert_eq!(code(&second, declare).await, None);
    second.batch_execute("CLOSE c; COMMIT").await.unwrap();

    // Connections of one role, then of the node.
    let mut limited = Vec::new();
    for _ in 0..3 {
        limited.push(connect_as(port, "limited", None).await.unwrap());
    }
    let refused = connect_as(port, "limited", None).await.err().unwrap();
    assert_eq!(refused.code().map(|c| c.code()), Some("53300"), "{refused}");
    drop(limited);
    tokio::time::sleep(Duration::from_millis(200)).await;
    connect_as(port, "limited", None)
        .await
        .expect("a place came free");
    admin
        .batch_execute("ALTER SYSTEM SET max_connections = 6")
        .await
        .unwrap();
    let mut open = Vec::new();
    let refused = loop {
        match connect_as(port, &format!("u{}", open.len()), None).await {
            Ok(c) => open.push(c),
            Err(e) => break e,
        }
        assert!(open.len() < 10, "max_connections did not hold");
    };
    assert_eq!(refused.code().map(|c| c.code()), Some("53300"), "{refused}");
    drop(open);
    admin
        .batch_execute("ALTER SYSTEM RESET max_connections")
        .await
        .unwrap();

    // A client that does not log in in time is dropped.
    let mut silent = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let started = Instant::now();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(10), silent.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    assert!(started.elapsed() < Duration::from_secs(5));

    // A message longer than max_message_bytes is refused from its header (FATAL), and a
    // startup message claiming 1 GiB is refused before anything is read.
    let mut s = logged_in(port, "raw1").await;
    let mut header = vec![b'Q'];
    header.extend_from_slice(&(1u32 << 30).to_be_bytes());
    s.write_all(&header).await.unwrap();
    let (kind, body) = next(&mut s).await.expect("an error");
    assert_eq!((kind, code_of(&body)), (b'E', "54000".to_string()));
    assert!(next(&mut s).await.is_none(), "the connection closes");
    let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    let mut huge = (1u32 << 30).to_be_bytes().to_vec();
    huge.extend_from_slice(&196608u32.to_be_bytes());
    s.write_all(&huge).await.unwrap();
    while next(&mut s).await.is_some() {}

    // Text that is not UTF-8: 22021, and the session goes on, in both protocols.
    let mut s = logged_in(port, "raw2").await;
    s.write_all(&query(b"SELECT '\xff\xfe'")).await.unwrap();
    assert_eq!(until_ready(&mut s).await, Some(vec!["22021".to_string()]));
    let mut parse = b"\0SELECT '\xc3\x28'\0".to_vec();
    parse.extend_from_slice(&0u16.to_be_bytes());
    let mut pipeline = message(b'P', &parse);
    pipeline.extend(message(b'S', b""));
    pipeline.extend(query("SELECT 'ünïcode'".as_bytes()));
    s.write_all(&pipeline).await.unwrap();
    assert_eq!(until_ready(&mut s).await, Some(vec!["22021".to_string()]));
    let (kind, _) = next(&mut s).await.unwrap();
    assert_eq!(kind, b'T', "the valid query after it runs");
    assert_eq!(until_ready(&mut s).await, Some(Vec::new()));

    assert_eq!(code(&admin, "SELECT 1").await, None);
    drop(admin);
    server.terminate();
}

fn rss_mib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap();
    kb / 1024
}

/// Latencies of `n` one-row inserts, in microseconds, sorted; every insert must succeed.
async fn inserts(client: &tokio_postgres::Client, n: usize, from: usize) -> Vec<u64> {
    let statement = client
        .prepare("INSERT INTO pay VALUES ($1, 1, '2026-01-01 00:00:00')")
        .await
        .unwrap();
    let mut out = Vec::with_capacity(n);
    for i in from..from + n {
        let card = format!("c{}", i % 1000);
        let started = Instant::now();
        client
            .execute(&statement, &[&card])
            .await
            .expect("a normal insert succeeds");
        out.push(started.elapsed().as_micros() as u64);
    }
    out.sort_unstable();
    out
}

/// Waits until the server has used no more than 5% of a core for half a second.
async fn settle(pid: u32) {
    let cpu = || {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let fields: Vec<u64> = stat
            .rsplit(')')
            .next()
            .unwrap()
            .split_whitespace()
            .skip(11)
            .take(2)
            .map(|f| f.parse().unwrap())
            .collect();
        fields[0] + fields[1]
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = cpu();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = cpu();
        // Clock ticks are 10 ms: at most 2-3 ticks in half a second.
        if now - last <= 3 {
            return;
        }
        last = now;
    }
    panic!("the server never went quiet");
}

fn quantile(sorted: &[u64], q: f64) -> u64 {
    sorted[((sorted.len() - 1) as f64 * q) as usize]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_clients_cost_bounded_memory_and_leave_others_alone() {
    let dir = temp_dir("hostile");
    let (server, port) = spawn_eddy(&dir);
    let pid = server.0.id();
    let normal = connect_port(port).await;
    normal.batch_execute(SCHEMA).await.unwrap();
    let before = inserts(&normal, 2000, 0).await;
    let rss_before = rss_mib(pid);

    let mut held = Vec::new();
    // Idle sockets that never say anything.
    for _ in 0..2000 {
        held.push(TcpStream::connect(("127.0.0.1", port)).await.unwrap());
    }
    // Slow logins: half a startup message.
    for _ in 0..100 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        s.write_all(&startup("slow")[..9]).await.unwrap();
        held.push(s);
    }
    // Half-sent messages after logging in: a header that promises more than comes.
    for _ in 0..100 {
        let mut s = logged_in(port, "eddy").await;
        s.write_all(&[b'Q', 0, 0, 0x10, 0, b'S', b'E'])
            .await
            .unwrap();
        held.push(s);
    }
    // Random bytes after logging in: each is refused or fails, and closes.
    let mut state = 0x2545F4914F6CDD1Du64;
    for _ in 0..100 {
        let mut s = logged_in(port, "eddy").await;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            })
            .collect();
        let _ = s.write_all(&noise).await;
        held.push(s);
    }
    // Clients that never read: queries whose answers pile up, and a subscription to
    // every event.
    for _ in 0..5 {
        let mut s = logged_in(port, "eddy").await;
        for _ in 0..200 {
            if s.write_all(&query(b"SELECT * FROM spend")).await.is_err() {
                break;
            }
        }
        held.push(s);
    }
    let mut subscriber = logged_in(port, "eddy").await;
    subscriber
        .write_all(&query(b"SELECT * FROM pay EMIT CHANGES"))
        .await
        .unwrap();
    held.push(subscriber);

    // The attack in place: the queries of the clients that never read ran until their
    // sockets filled, and the server is quiet again.
    settle(pid).await;
    let during = inserts(&normal, 2000, 2000).await;
    let rss_during = rss_mib(pid);
    println!(
        "normal client, one-row prepared INSERT: before the attack p50 {} µs, p99 {} µs; \
         during it p50 {} µs, p99 {} µs. Server RSS {} MiB before, {} MiB during.",
        quantile(&before, 0.5),
        quantile(&before, 0.99),
        quantile(&during, 0.5),
        quantile(&during, 0.99),
        rss_before,
        rss_during
    );
    assert!(
        rss_during < rss_before + 512,
        "the attack grew the server from {rss_before} MiB to {rss_during} MiB"
    );
    assert_eq!(
        simple_rows(&normal, "SELECT SUM(n) FROM spend").await,
        [[Some("4000".to_string())]],
        "every insert counts once"
    );
    drop(held);
    drop(normal);
    server.terminate();
}
