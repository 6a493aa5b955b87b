//! Durability of the embedded log against `kill -9`: a real `eddy` process is killed
//! repeatedly while clients insert, and restarted on the same data directory. Every
//! acknowledged event must be applied exactly once, no event that was never sent may
//! appear, and every metric must equal a model computed from the applied events. The
//! server runs with tiny chunks and caches and checkpoints five times a second, so kills
//! land in every stage: sealing, eviction, write-through, checkpoints, log truncation.
//!
//! The same rounds run in cluster mode against the real Kafka broker of `make test`
//! (`EDDY_TEST_KAFKA`), on a stream without `event_id`: there, nothing but the offsets
//! kept in checkpoints stands between a restart and an event applied twice.

mod common;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::{connect_port, kafka_addr, refused_start, simple_rows, spawn_eddy_with, temp_dir};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

const PARTITIONS: u32 = 4;
/// Events acknowledged by the end of each round at least, whatever the machine's speed:
/// by the last restart their event time (10 ms an id) passes the stream's lateness (10 s)
/// by several seconds, so the restarts go through sealed chunks, not only the log.
const ACKED_PER_ROUND: usize = 600;

fn ts_text(id: i64) -> String {
    let base = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    (base + chrono::Duration::milliseconds(id * 10))
        .format("%Y-%m-%d %H:%M:%S%.3f")
        .to_string()
}

fn card_of(id: i64) -> String {
    format!("c{}", (id * 7919) % 13)
}

/// A second server on a data directory in use refuses to start before it touches it
/// (two would each remove checkpoints the other still reads), and the lock goes with
/// the first server, even when it is killed with -9.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_server_per_data_directory() {
    let dir = temp_dir("crash-lock");
    let (first, port) = spawn_eddy_with(&dir, &[]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL) \
             WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 2); \
             CREATE METRIC m AS SELECT card, COUNT(*) AS n FROM s WINDOW INFINITE GROUP BY card; \
             INSERT INTO s VALUES (1, '2026-01-01 00:00:00', 'a'), (2, '2026-01-01 00:00:01', 'b')",
        )
        .await
        .unwrap();
    let pid = first.0.id();
    let said = refused_start(&dir, &[], &[]);
    assert!(
        said.contains(&format!("is in use by another eddy (PID {pid})")),
        "{said}"
    );
    // The first server goes on, its checkpoints untouched.
    tokio::time::sleep(Duration::from_millis(500)).await;
    client
        .batch_execute("INSERT INTO s VALUES (3, '2026-01-01 00:00:02', 'a')")
        .await
        .unwrap();
    let rows = simple_rows(&client, "SELECT card, n FROM m ORDER BY card").await;
    assert_eq!(
        rows,
        [
            [Some("a".into()), Some("2".into())],
            [Some("b".into()), Some("1".into())]
        ]
    );
    drop(client);
    drop(first); // kill -9
    let (_second, port) = spawn_eddy_with(&dir, &[]);
    let client = connect_port(port).await;
    let rows = simple_rows(&client, "SELECT card, n FROM m ORDER BY card").await;
    assert_eq!(
        rows,
        [
            [Some("a".into()), Some("2".into())],
            [Some("b".into()), Some("1".into())]
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_loses_no_acknowledged_event() {
    kill_9_rounds("crash", &[], true, true, 3).await;
}

/// 64 clients insert durably at once (group commit shares each fsync among them): every
/// acknowledged event is applied exactly once after each restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_under_64_durable_clients_applies_every_acknowledged_event_once() {
    kill_9_rounds("crash-64", &[], true, true, 64).await;
}

/// With `synchronous_commit = off` a statement is acknowledged once its events are in
/// the log's OS buffers: a killed process (the kernel lives on) still loses nothing, and
/// checkpoints, which fsync the log before they commit, never cover an event twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_synchronous_commit_off_loses_nothing() {
    kill_9_rounds("crash-async", &["--commit-delay", "50"], true, false, 3).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_on_kafka_applies_every_event_once() {
    let kafka = kafka_addr();
    let cluster = format!("crash{}", std::process::id());
    let args = ["--kafka", kafka.as_str(), "--cluster", cluster.as_str()];
    kill_9_rounds("crash-kafka", &args, false, true, 3).await;
}

/// Six rounds of inserting and `kill -9`, then a restart compared against the model.
/// `writers` clients run with `synchronous_commit` on or off (`durable`).
async fn kill_9_rounds(name: &str, args: &[&str], event_id: bool, durable: bool, writers: usize) {
    let dir = temp_dir(name);
    let id_option = if event_id { "event_id = 'id', " } else { "" };
    let sent: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let acked: Arc<Mutex<HashSet<i64>>> = Arc::default();
    let next_id = Arc::new(std::sync::atomic::AtomicI64::new(1));
    let mut seed = 0x9e37_79b9_u64;
    let mut rand = move |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };

    for round in 0..6 {
        let (child, port) = spawn_eddy_with(&dir, args);
        let admin = connect_port(port).await;
        if round == 0 {
            admin
                .batch_execute(&format!(
                    "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, \
                     card TEXT NOT NULL, amount BIGINT) WITH (event_time = 'ts', \
                     {id_option}partition_by = 'card', partitions = {PARTITIONS}, \
                     lateness = '10 seconds', retention = '30 days'); \
                     CREATE METRIC card_all AS SELECT card, COUNT(*) AS n, SUM(amount) AS total \
                     FROM pay WINDOW INFINITE GROUP BY card; \
                     CREATE METRIC card_1m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total \
                     FROM pay WINDOW SLIDING (SIZE 1 MINUTE) GROUP BY card;"
                ))
                .await
                .unwrap();
        }
        // Writers insert until the process dies under them.
        let mut tasks = Vec::new();
        for _ in 0..writers {
            let client = connect_port(port).await;
            if !durable {
                client
                    .batch_execute("SET synchronous_commit = off")
                    .await
                    .unwrap();
            }
            let (sent, acked, next_id) = (sent.clone(), acked.clone(), next_id.clone());
            tasks.push(tokio::spawn(async move {
                let mut k = 0u64;
                loop {
                    k += 1;
                    let n = 1 + (k * 2_654_435_761 % 9) as i64;
                    let first = next_id.fetch_add(n, std::sync::atomic::Ordering::SeqCst);
                    let ids: Vec<i64> = (first..first + n).collect();
                    sent.lock().unwrap().extend(&ids);
                    let values: Vec<String> = ids
                        .iter()
                        .map(|id| {
                            format!(
                                "({id}, '{}', '{}', {})",
                                ts_text(*id),
                                card_of(*id),
                                id % 100
                            )
                        })
                        .collect();
                    let sql = format!("INSERT INTO pay VALUES {}", values.join(", "));
                    if client.batch_execute(&sql).await.is_err() {
                        return;
                    }
                    acked.lock().unwrap().extend(&ids);
                }
            }));
        }
        tokio::time::sleep(Duration::from_millis(150 + rand(600))).await;
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while acked.lock().unwrap().len() < (round + 1) * ACKED_PER_ROUND
            && std::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        drop(child); // SIGKILL: no shutdown, no flush
        for w in tasks {
            let _ = tokio::time::timeout(Duration::from_secs(10), w).await;
        }
    }

    let (child, port) = spawn_eddy_with(&dir, args);
    let client = connect_port(port).await;
    let sent = sent.lock().unwrap().clone();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() > 100,
        "only {} events were acknowledged",
        acked.len()
    );

    let ids: Vec<i64> = simple_rows(&client, "SELECT id FROM pay")
        .await
        .into_iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    let applied: HashSet<i64> = ids.iter().copied().collect();
    assert_eq!(ids.len(), applied.len(), "an event was applied twice");
    let lost: Vec<_> = acked.difference(&applied).collect();
    assert!(
        lost.is_empty(),
        "{} acknowledged events lost: {lost:?}",
        lost.len()
    );
    assert!(
        applied.is_subset(&sent),
        "an event that was never sent appeared"
    );

    // The metrics against a model of the applied events.
    let mut all: HashMap<String, (i64, i64)> = HashMap::new();
    let mut task_time: HashMap<u32, i64> = HashMap::new();
    let task = |card: &str| partition_for(&Value::Text(card.into()), PARTITIONS);
    for id in &applied {
        let e = all.entry(card_of(*id)).or_default();
        e.0 += 1;
        e.1 += id % 100;
        let t = task_time.entry(task(&card_of(*id))).or_insert(0);
        *t = (*t).max(id * 10);
    }
    let mut got_all = HashMap::new();
    for r in simple_rows(&client, "SELECT card, n, total FROM card_all").await {
        let n: i64 = r[1].as_deref().unwrap().parse().unwrap();
        let total: i64 = r[2].as_deref().unwrap().parse().unwrap();
        got_all.insert(r[0].clone().unwrap(), (n, total));
    }
    assert_eq!(got_all, all, "card_all after recovery");
    let mut window: HashMap<String, (i64, i64)> = HashMap::new();
    for id in &applied {
        let card = card_of(*id);
        let t = task_time[&task(&card)];
        let ms = id * 10;
        if ms > t - 60_000 && ms <= t {
            let e = window.entry(card).or_default();
            e.0 += 1;
            e.1 += id % 100;
        }
    }
    let mut got_window = HashMap::new();
    for r in simple_rows(&client, "SELECT card, n, total FROM card_1m").await {
        let n: i64 = r[1].as_deref().unwrap().parse().unwrap();
        let total: i64 = r[2].as_deref().unwrap().parse().unwrap();
        got_window.insert(r[0].clone().unwrap(), (n, total));
    }
    assert_eq!(got_window, window, "card_1m after recovery");

    // The restarts went through checkpoints and sealed chunks, not only the log.
    let storage = simple_rows(&client, "SHOW STORAGE").await;
    let num = |i: usize| -> f64 { storage[0][i].as_deref().unwrap_or("0").parse().unwrap() };
    let (reservoir_bytes, chunks, state_reads) = (num(7), num(8), num(14));
    assert!(
        reservoir_bytes > 0.0 && chunks > 0.0 && state_reads > 0.0,
        "SHOW STORAGE: {:?}",
        storage[0]
    );
    assert!(dir.join("checkpoints/CURRENT").exists());

    if !event_id {
        drop(child);
        return;
    }
    // Duplicates of acknowledged events are still recognised after the restarts.
    let dup = *acked.iter().next().unwrap();
    client
        .batch_execute(&format!(
            "INSERT INTO pay VALUES ({dup}, '{}', '{}', 1)",
            ts_text(dup),
            card_of(dup)
        ))
        .await
        .unwrap();
    let count = simple_rows(&client, "SELECT count(*) FROM pay").await;
    assert_eq!(
        count[0][0].as_deref(),
        Some(applied.len().to_string().as_str())
    );
    drop(child);
}
