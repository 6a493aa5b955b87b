//! Continuous queries (`SELECT … EMIT CHANGES`) through real clients: tokio-postgres
//! streaming on the simple and the extended protocol, psql with `COPY … TO STDOUT`,
//! DECLARE/FETCH with and without a timeout, cancel and disconnect, a reader that never
//! reads, and every received metric row checked against a brute-force model.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use futures::{SinkExt, StreamExt};
use tokio_postgres::{SimpleQueryMessage, SimpleQueryStream};

use common::{conn_string, connect, simple_rows, start, temp_dir, text_row, TextRow};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;
use eddy_server::serve::Server;

const WAIT: Duration = Duration::from_secs(10);

/// 2026-01-01 00:00:00 plus `secs`, as a timestamp literal's text.
fn ts(secs: i64) -> String {
    let base = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    (base + chrono::Duration::seconds(secs))
        .format("%Y-%m-%d %H:%M:%S")
        .to_string()
}

async fn setup(client: &tokio_postgres::Client, partitions: u32) {
    client
        .batch_execute(&format!(
            "CREATE STREAM pay (id BIGINT, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = {partitions}); \
             CREATE METRIC card_1m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
             MAX(amount) AS top FROM pay WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY card;"
        ))
        .await
        .unwrap();
}

async fn insert(client: &tokio_postgres::Client, events: &[(i64, i64, &str, i64)]) {
    let values: Vec<String> = events
        .iter()
        .map(|(id, t, card, amount)| format!("({id}, '{}', '{card}', {amount})", ts(*t)))
        .collect();
    client
        .batch_execute(&format!("INSERT INTO pay VALUES {}", values.join(", ")))
        .await
        .unwrap();
}

fn row(cells: &[&str]) -> TextRow {
    cells
        .iter()
        .map(|c| (*c != "NULL").then(|| c.to_string()))
        .collect()
}

/// The next `n` rows of a streamed simple query, or a panic after `WAIT`.
async fn next_rows(stream: &mut std::pin::Pin<Box<SimpleQueryStream>>, n: usize) -> Vec<TextRow> {
    let mut out = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(WAIT, stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} rows arrived: {out:?}", out.len()))
            .expect("the stream ended")
            .expect("the stream failed");
        if let SimpleQueryMessage::Row(r) = msg {
            out.push(text_row(&r));
        }
    }
    out
}

/// Open subscriptions, as SHOW SUBSCRIPTIONS lists them.
async fn subscriptions(client: &tokio_postgres::Client) -> Vec<TextRow> {
    client
        .simple_query("SHOW SUBSCRIPTIONS")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(text_row(r)),
            _ => None,
        })
        .collect()
}

/// Waits until SHOW SUBSCRIPTIONS lists exactly `n` subscriptions.
async fn await_subscriptions(client: &tokio_postgres::Client, n: usize) {
    let deadline = Instant::now() + WAIT;
    loop {
        let open = subscriptions(client).await;
        if open.len() == n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "expected {n} subscriptions, SHOW SUBSCRIPTIONS lists {open:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres_streams_rows_on_both_protocols() {
    let dir = temp_dir("sub-stream");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 1).await;
    insert(&admin, &[(1, 0, "a", 10), (2, 10, "b", 5)]).await;

    // Simple protocol: the current rows first, then each change.
    let simple = connect(&server).await;
    let mut all = Box::pin(
        simple
            .simple_query_raw("SELECT * FROM card_1m EMIT CHANGES")
            .await
            .unwrap(),
    );
    let mut snapshot = next_rows(&mut all, 2).await;
    snapshot.sort();
    let t10 = ts(10);
    assert_eq!(
        snapshot,
        vec![
            row(&["a", "1", "10", "10", &t10]),
            row(&["b", "1", "5", "5", &t10])
        ]
    );

    // Extended protocol with a parameter, a projection and a WHERE.
    let extended = connect(&server).await;
    let card: &str = "a";
    let mut only_a = Box::pin(
        extended
            .query_raw(
                "SELECT card, total, changed_at FROM card_1m WHERE card = $1 EMIT CHANGES",
                [card],
            )
            .await
            .unwrap(),
    );
    let first = tokio::time::timeout(WAIT, only_a.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first.get::<_, String>(0), "a");
    assert_eq!(
        first.get::<_, rust_decimal::Decimal>(1),
        rust_decimal::Decimal::from(10)
    );

    // A stream subscription starts at the present and sees only matching events.
    let stream_sub = connect(&server).await;
    let mut big = Box::pin(
        stream_sub
            .query_raw(
                "SELECT id, amount FROM pay WHERE amount > 100 EMIT CHANGES",
                std::iter::empty::<&str>(),
            )
            .await
            .unwrap(),
    );

    // The extended protocol returns before the server runs Execute: wait until the
    // subscription is attached (SHOW SUBSCRIPTIONS lists it from then on).
    let deadline = std::time::Instant::now() + WAIT;
    while !simple_rows(&admin, "SHOW SUBSCRIPTIONS")
        .await
        .iter()
        .any(|r| r.iter().flatten().any(|c| c.contains("amount > 100")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the stream subscription never attached"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // At T = 70 s, a's event at 0 s and b's at 10 s leave the 1-minute window; the new
    // event enters a: both groups change, b to its empty-set values.
    insert(&admin, &[(3, 70, "a", 1)]).await;
    let mut changed = next_rows(&mut all, 2).await;
    changed.sort();
    let t70 = ts(70);
    assert_eq!(
        changed,
        vec![
            row(&["a", "1", "1", "1", &t70]),
            row(&["b", "0", "NULL", "NULL", &t70])
        ]
    );
    let next = tokio::time::timeout(WAIT, only_a.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(
        next.get::<_, rust_decimal::Decimal>(1),
        rust_decimal::Decimal::from(1)
    );
    assert_eq!(
        next.get::<_, chrono::NaiveDateTime>(2).to_string(),
        format!("{t70}")
    );

    insert(&admin, &[(4, 71, "c", 500), (5, 72, "c", 1)]).await;
    let event = tokio::time::timeout(WAIT, big.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((event.get::<_, i64>(0), event.get::<_, i64>(1)), (4, 500));
    let changed_at: chrono::NaiveDateTime = event.get(2);
    assert_eq!(changed_at.to_string(), ts(71));
    assert_eq!(subscriptions(&admin).await.len(), 3);

    // Dropping a metric ends its subscriptions with an error that says why.
    admin.batch_execute("DROP METRIC card_1m").await.unwrap();
    let err = loop {
        match tokio::time::timeout(WAIT, all.next()).await.unwrap() {
            Some(Ok(_)) => continue,
            Some(Err(e)) => break e,
            None => panic!("the subscription ended without an error"),
        }
    };
    let message = err.as_db_error().map(|e| e.message().to_string());
    assert!(
        message
            .as_deref()
            .is_some_and(|m| m.contains("was dropped")),
        "{err:?}"
    );
    server.stop().await;
}

/// Reads a child's output lines on a thread.
fn lines_of(reader: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(reader).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

fn psql(server: &Server, sql: &str) -> std::process::Child {
    // psql writes COPY data with stdio: line-buffer it so each row shows at once.
    Command::new("stdbuf")
        .args([
            "-oL",
            "psql",
            "-X",
            "-q",
            "-h",
            "127.0.0.1",
            "-U",
            "eddy",
            "-d",
            "eddy",
        ])
        .args(["-p", &server.addr.port().to_string(), "-c", sql])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql runs")
}

fn signal(child: &std::process::Child, sig: &str) {
    let status = Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_copy_prints_rows_as_they_happen_and_ctrl_c_ends_it() {
    let dir = temp_dir("sub-psql");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 2).await;
    insert(&admin, &[(1, 0, "a", 10)]).await;

    let mut child = psql(
        &server,
        "COPY (SELECT card, n, total FROM card_1m EMIT CHANGES) TO STDOUT (FORMAT csv, HEADER)",
    );
    let out = lines_of(child.stdout.take().unwrap());
    let recv = |what: &str| {
        out.recv_timeout(WAIT)
            .unwrap_or_else(|_| panic!("psql printed no {what}"))
    };
    assert_eq!(recv("header"), "card,n,total,changed_at");
    assert_eq!(recv("snapshot row"), format!("a,1,10,{}", ts(0)));
    for (i, amount) in [5, 7, 9].into_iter().enumerate() {
        let id = 2 + i as i64;
        insert(&admin, &[(id, id, "a", amount)]).await;
        let line = recv("change");
        assert!(
            line.starts_with(&format!("a,{}", id)),
            "event {id}: psql printed {line:?}"
        );
    }
    await_subscriptions(&admin, 1).await;

    // Ctrl-C: psql sends a CancelRequest; the COPY ends with 57014.
    signal(&child, "-INT");
    let status = child.wait().unwrap();
    assert!(!status.success());
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(
        err.contains("canceling statement due to user request"),
        "{err}"
    );
    await_subscriptions(&admin, 0).await;

    // A plain SELECT … EMIT CHANGES from psql gets a NOTICE pointing at COPY; killing
    // psql (no goodbye on the wire) ends the subscription too.
    let mut child = psql(&server, "SELECT * FROM card_1m EMIT CHANGES");
    let err = lines_of(child.stderr.take().unwrap());
    let notice = err.recv_timeout(WAIT).expect("psql printed the notice");
    assert!(notice.starts_with("NOTICE:"), "{notice}");
    let hint = err.recv_timeout(WAIT).expect("psql printed the hint");
    assert!(
        hint.contains("COPY (SELECT * FROM card_1m EMIT CHANGES) TO STDOUT"),
        "{hint}"
    );
    await_subscriptions(&admin, 1).await;
    signal(&child, "-KILL");
    child.wait().unwrap();
    await_subscriptions(&admin, 0).await;
    server.stop().await;
}

fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code().map(|c| c.code().to_string()).unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn declare_and_fetch_wait_for_rows() {
    let dir = temp_dir("sub-fetch");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 2).await;
    insert(&admin, &[(1, 0, "a", 10), (2, 1, "b", 20)]).await;
    let c = connect(&server).await;

    let err = c
        .simple_query("DECLARE c CURSOR FOR SELECT * FROM card_1m EMIT CHANGES")
        .await
        .unwrap_err();
    assert_eq!(sqlstate(&err), "25P01", "{err}");

    c.batch_execute("BEGIN; DECLARE c CURSOR FOR SELECT card, n FROM card_1m EMIT CHANGES")
        .await
        .unwrap();
    let mut first = simple_rows(&c, "FETCH 10 FROM c").await;
    first.sort();
    assert_eq!(first.len(), 2);
    assert_eq!(first[0][..2], row(&["a", "1"])[..]);

    // Nothing new: the timeout returns no rows once it passes.
    let started = Instant::now();
    let none = simple_rows(&c, "FETCH 10 FROM c WITH (timeout = '300 milliseconds')").await;
    assert!(none.is_empty(), "{none:?}");
    assert!(started.elapsed() >= Duration::from_millis(250));

    // Without a timeout FETCH waits for the first row.
    let writer = {
        let server_port = server.addr.port();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let (w, conn) = tokio_postgres::connect(
                &format!("host=127.0.0.1 port={server_port} user=eddy dbname=eddy"),
                tokio_postgres::NoTls,
            )
            .await
            .unwrap();
            tokio::spawn(conn);
            insert(&w, &[(3, 2, "a", 1)]).await;
        })
    };
    let started = Instant::now();
    let waited = simple_rows(&c, "FETCH 10 FROM c").await;
    assert!(started.elapsed() >= Duration::from_millis(250));
    assert_eq!(waited, vec![row(&["a", "2", &ts(2)])]);
    writer.await.unwrap();

    // The extended protocol describes FETCH with the cursor's columns.
    insert(&admin, &[(4, 3, "b", 1)]).await;
    let rows = c
        .query("FETCH ALL FROM c WITH (timeout = '2 seconds')", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 1);
    assert_eq!(
        (rows[0].get::<_, String>(0), rows[0].get::<_, i64>(1)),
        ("b".to_string(), 2)
    );

    // An ordinary query works as a cursor too.
    c.batch_execute("DECLARE d CURSOR FOR SELECT card FROM card_1m ORDER BY card")
        .await
        .unwrap();
    assert_eq!(simple_rows(&c, "FETCH 1 FROM d").await, vec![row(&["a"])]);
    assert_eq!(simple_rows(&c, "FETCH ALL FROM d").await, vec![row(&["b"])]);

    c.batch_execute("CLOSE c").await.unwrap();
    let err = c.simple_query("FETCH 1 FROM c").await.unwrap_err();
    assert_eq!(sqlstate(&err), "34000", "{err}");
    await_subscriptions(&admin, 0).await;

    // COMMIT ends the transaction's cursors.
    c.batch_execute("DECLARE e CURSOR FOR SELECT * FROM pay EMIT CHANGES")
        .await
        .unwrap();
    await_subscriptions(&admin, 1).await;
    c.batch_execute("COMMIT").await.unwrap();
    await_subscriptions(&admin, 0).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_and_disconnect_end_subscriptions() {
    let dir = temp_dir("sub-cancel");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 2).await;
    insert(&admin, &[(1, 0, "a", 10)]).await;

    let client = connect(&server).await;
    let mut rows = Box::pin(
        client
            .query_raw(
                "SELECT * FROM card_1m EMIT CHANGES",
                std::iter::empty::<&str>(),
            )
            .await
            .unwrap(),
    );
    tokio::time::timeout(WAIT, rows.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    await_subscriptions(&admin, 1).await;
    client
        .cancel_token()
        .cancel_query(tokio_postgres::NoTls)
        .await
        .unwrap();
    let err = tokio::time::timeout(WAIT, rows.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap_err();
    assert_eq!(sqlstate(&err), "57014", "{err}");
    await_subscriptions(&admin, 0).await;
    assert_eq!(simple_rows(&client, "SELECT 1").await, vec![row(&["1"])]);

    // A client that goes away mid-subscription.
    let (gone, conn) = tokio_postgres::connect(&conn_string(&server), tokio_postgres::NoTls)
        .await
        .unwrap();
    let conn = tokio::spawn(conn);
    let mut stream = Box::pin(
        gone.simple_query_raw("SELECT * FROM pay EMIT CHANGES")
            .await
            .unwrap(),
    );
    let _ = tokio::time::timeout(Duration::from_millis(200), stream.next()).await;
    await_subscriptions(&admin, 1).await;
    conn.abort();
    let _ = conn.await;
    await_subscriptions(&admin, 0).await;
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_that_never_reads_does_not_hold_up_ingestion() {
    let dir = temp_dir("sub-slow");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 2).await;
    let reader = connect(&server).await;
    reader
        .batch_execute(
            "SET subscription_rows_max = 50; BEGIN; \
             DECLARE m CURSOR FOR SELECT card, n, total, changed_at FROM card_1m EMIT CHANGES; \
             DECLARE s CURSOR FOR SELECT * FROM pay EMIT CHANGES",
        )
        .await
        .unwrap();

    // 20,000 events over 100 cards while neither cursor is read.
    let cards = 100;
    let events = 20_000;
    let sink = admin
        .copy_in("COPY pay FROM STDIN (FORMAT csv)")
        .await
        .unwrap();
    let mut sink = Box::pin(sink);
    let mut data = String::new();
    for i in 0..events {
        data.push_str(&format!("{i},{},c{},{}\n", ts(i / 10), i % cards, i % 7));
    }
    sink.send(bytes::Bytes::from(data)).await.unwrap();
    let copied = tokio::time::timeout(Duration::from_secs(120), sink.as_mut().finish())
        .await
        .expect("COPY finished while the reader slept")
        .unwrap();
    assert_eq!(copied, events as u64);

    // The metric cursor kept at most its bound plus one row per group, newest values.
    let listed = subscriptions(&admin).await;
    let metric = listed
        .iter()
        .find(|r| r[6].as_deref() == Some("card_1m"))
        .expect("the metric cursor is listed");
    let queued: usize = metric[11].as_deref().unwrap().parse().unwrap();
    let coalesced: u64 = metric[10].as_deref().unwrap().parse().unwrap();
    assert!(queued <= 50 + cards as usize, "{queued} rows queued");
    assert!(coalesced > 0, "nothing was coalesced: {metric:?}");
    let fetched = simple_rows(&reader, "FETCH ALL FROM m").await;
    let mut newest: HashMap<String, TextRow> = HashMap::new();
    for r in fetched {
        newest.insert(r[0].clone().unwrap(), r);
    }
    let current = simple_rows(&admin, "SELECT card, n, total FROM card_1m").await;
    assert_eq!(current.len(), cards as usize);
    for r in current {
        let got = &newest[r[0].as_deref().unwrap()];
        assert_eq!(got[..3], r[..], "the newest queued row of {:?}", r[0]);
    }

    // The stream cursor could not keep every event: it hands over what it queued, then
    // ends, and says why.
    let kept = simple_rows(&reader, "FETCH ALL FROM s").await;
    assert!(kept.len() <= 50, "{} rows", kept.len());
    let err = reader.simple_query("FETCH ALL FROM s").await.unwrap_err();
    assert_eq!(sqlstate(&err), "53400", "{err}");
    assert!(
        err.as_db_error()
            .unwrap()
            .message()
            .contains("50 rows behind"),
        "{err}"
    );
    reader.batch_execute("ROLLBACK").await.unwrap();
    await_subscriptions(&admin, 0).await;
    server.stop().await;
}

/// The model of `card_1m`: COUNT, SUM and MAX over a 1-minute sliding window per card,
/// where stream time belongs to the card's task.
struct Model {
    partitions: u32,
    events: Vec<(i64, String, i64)>,
    task_time: HashMap<u32, i64>,
}

impl Model {
    fn task(&self, card: &str) -> u32 {
        partition_for(&Value::Text(card.into()), self.partitions)
    }

    /// (n, total, max) of `card` when its task's stream time is `t`.
    fn values(&self, card: &str, t: i64, upto_event: usize) -> (i64, Option<i64>, Option<i64>) {
        let in_window: Vec<i64> = self.events[..upto_event]
            .iter()
            .filter(|(ts, c, _)| c == card && *ts > t - 60 && *ts <= t)
            .map(|(_, _, a)| *a)
            .collect();
        if in_window.is_empty() {
            return (0, None, None);
        }
        (
            in_window.len() as i64,
            Some(in_window.iter().sum()),
            in_window.iter().max().copied(),
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_received_row_matches_the_model() {
    let dir = temp_dir("sub-model");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    let partitions = 4;
    setup(&admin, partitions).await;
    let cards: Vec<String> = (0..12).map(|i| format!("k{i}")).collect();
    // Some history before the subscription starts.
    insert(&admin, &[(1_000_000, 0, "k0", 3), (1_000_001, 5, "k1", 4)]).await;
    let mut model = Model {
        partitions,
        events: vec![(0, "k0".into(), 3), (5, "k1".into(), 4)],
        task_time: HashMap::new(),
    };
    for (t, c, _) in &model.events.clone() {
        let task = model.task(c);
        let e = model.task_time.entry(task).or_insert(*t);
        *e = (*e).max(*t);
    }

    let sub = connect(&server).await;
    let mut all = Box::pin(
        sub.simple_query_raw("SELECT card, n, total, top, changed_at FROM card_1m EMIT CHANGES")
            .await
            .unwrap(),
    );
    let filtered = connect(&server).await;
    let mut busy = Box::pin(
        filtered
            .query_raw(
                "SELECT card, n, changed_at FROM card_1m WHERE n >= 3 EMIT CHANGES",
                std::iter::empty::<&str>(),
            )
            .await
            .unwrap(),
    );

    // In-order events per task (so each row's changed_at names one moment), with gaps
    // that empty windows; the expected changes are what differs after each event.
    let mut seed = 0x5eed_u64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut expected: Vec<(String, i64)> = Vec::new();
    let mut last: HashMap<String, (i64, Option<i64>, Option<i64>)> = HashMap::new();
    for card in &cards {
        let task = model.task(card);
        let t = model.task_time.get(&task).copied().unwrap_or(i64::MIN);
        last.insert(card.clone(), model.values(card, t, model.events.len()));
    }
    let mut clock = 10;
    let mut id = 1;
    for _ in 0..60 {
        let mut batch = Vec::new();
        for _ in 0..(1 + rand(12)) {
            clock += if rand(10) == 0 {
                40 + rand(60) as i64
            } else {
                1 + rand(3) as i64
            };
            let card = cards[rand(cards.len() as u64) as usize].clone();
            let amount = rand(100) as i64 - 20;
            batch.push((id, clock, card.clone(), amount));
            id += 1;
            model.events.push((clock, card.clone(), amount));
            let task = model.task(&card);
            let t = model.task_time.entry(task).or_insert(clock);
            *t = (*t).max(clock);
            let t = *t;
            for other in cards.iter().filter(|c| model.task(c) == task) {
                let now = model.values(other, t, model.events.len());
                if last[other] != now {
                    expected.push((other.clone(), t));
                    last.insert(other.clone(), now);
                }
            }
        }
        let refs: Vec<(i64, i64, &str, i64)> = batch
            .iter()
            .map(|(i, t, c, a)| (*i, *t, c.as_str(), *a))
            .collect();
        insert(&admin, &refs).await;
    }

    // Every change arrives, and every received row is the model's value at its time.
    let check = |card: &str, n: i64, at: &str| -> (i64, Option<i64>, Option<i64>) {
        let t = (chrono::NaiveDateTime::parse_from_str(at, "%Y-%m-%d %H:%M:%S").unwrap()
            - chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap())
        .num_seconds();
        // The events applied by then: all events of the card's task up to time t.
        let task = model.task(card);
        let upto = model
            .events
            .iter()
            .rposition(|(ts, c, _)| model.task(c) == task && *ts == t)
            .map_or(model.events.len(), |p| p + 1);
        let v = model.values(card, t, upto);
        assert_eq!(v.0, n, "card {card} at {at}");
        v
    };
    let mut pending: std::collections::HashSet<(String, i64)> = expected.iter().cloned().collect();
    // The snapshot rows come first and are checked like the others.
    let mut received = 0;
    while !pending.is_empty() {
        let r = next_rows(&mut all, 1).await.remove(0);
        received += 1;
        let card = r[0].clone().unwrap();
        let at = r[4].clone().unwrap();
        let n: i64 = r[1].as_deref().unwrap().parse().unwrap();
        let v = check(&card, n, &at);
        let parse = |c: &Option<String>| c.as_deref().map(|s| s.parse::<i64>().unwrap());
        assert_eq!(
            (parse(&r[2]), parse(&r[3])),
            (v.1, v.2),
            "card {card} at {at}"
        );
        let t = (chrono::NaiveDateTime::parse_from_str(&at, "%Y-%m-%d %H:%M:%S").unwrap()
            - chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
                .unwrap()
                .and_hms_opt(0, 0, 0)
                .unwrap())
        .num_seconds();
        pending.remove(&(card, t));
    }
    assert!(received >= expected.len());

    // The filtered subscription got exactly the changed rows with n ≥ 3.
    let busy_expected = expected
        .iter()
        .filter(|(card, t)| {
            let task = model.task(card);
            let upto = model
                .events
                .iter()
                .rposition(|(ts, c, _)| model.task(c) == task && *ts == *t)
                .map_or(model.events.len(), |p| p + 1);
            model.values(card, *t, upto).0 >= 3
        })
        .count();
    assert!(busy_expected > 10, "the generator made too few busy groups");
    for _ in 0..busy_expected {
        let r = tokio::time::timeout(WAIT, busy.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        let card: String = r.get(0);
        let n: i64 = r.get(1);
        assert!(n >= 3);
        let at: chrono::NaiveDateTime = r.get(2);
        check(&card, n, &at.format("%Y-%m-%d %H:%M:%S").to_string());
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundreds_of_subscriptions_each_get_every_change() {
    let dir = temp_dir("sub-many");
    let server = start(&dir).await;
    let admin = connect(&server).await;
    setup(&admin, 4).await;
    let n = 300;
    let mut clients = Vec::new();
    let mut streams = Vec::new();
    for i in 0..n {
        let c = connect(&server).await;
        // Half the subscribers read the metric, half the stream.
        let sql = if i % 2 == 0 {
            "SELECT card, n FROM card_1m EMIT CHANGES"
        } else {
            "SELECT id, card FROM pay EMIT CHANGES"
        };
        streams.push(Box::pin(c.simple_query_raw(sql).await.unwrap()));
        clients.push(c);
    }
    await_subscriptions(&admin, n).await;
    insert(&admin, &[(1, 0, "a", 10), (2, 1, "b", 20)]).await;
    for (i, s) in streams.iter_mut().enumerate() {
        let mut rows = next_rows(s, 2).await;
        rows.sort();
        let want = if i % 2 == 0 {
            vec![row(&["a", "1", &ts(0)]), row(&["b", "1", &ts(1)])]
        } else {
            vec![row(&["1", "a", &ts(0)]), row(&["2", "b", &ts(1)])]
        };
        assert_eq!(rows, want, "subscriber {i}");
    }
    drop(streams);
    drop(clients);
    server.stop().await;
}
