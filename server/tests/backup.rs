//! `BACKUP TO` while clients insert, and restores from it: a node started on the copy holds
//! every event acknowledged before the backup began, none that was never sent, and every
//! group of every metric equals what exactly the events it holds give. `eddy backup` (the
//! command line) makes the same copy through a connection.

mod common;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{connect_port, simple_rows, spawn_eddy_with, temp_dir};

const SCHEMA: &str = "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, \
     card TEXT NOT NULL, amount BIGINT NOT NULL) WITH (event_time = 'ts', event_id = 'id', \
     partition_by = 'card', partitions = 4, lateness = '1 hour'); \
     CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
     MIN(amount) AS low, MAX(amount) AS high FROM s \
     WINDOW SLIDING (SIZE INTERVAL '7 days') GROUP BY card";

fn event(id: i64) -> (String, i64) {
    (format!("c{}", id % 37), (id * 7919) % 1000 - 300)
}

fn insert_sql(id: i64) -> String {
    let (card, amount) = event(id);
    let base = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let ts = base + chrono::Duration::milliseconds(id * 10);
    format!(
        "INSERT INTO s VALUES ({id}, '{}', '{card}', {amount})",
        ts.format("%Y-%m-%d %H:%M:%S%.3f")
    )
}

/// The metric's rows, by card: (n, total, low, high) as text.
async fn metric_rows(client: &tokio_postgres::Client) -> BTreeMap<String, Vec<String>> {
    simple_rows(client, "SELECT card, n, total, low, high FROM m")
        .await
        .into_iter()
        .map(|r| {
            let r: Vec<String> = r.into_iter().map(|c| c.unwrap_or_default()).collect();
            (r[0].clone(), r[1..].to_vec())
        })
        .collect()
}

/// What the metric's rows are for exactly the events `ids`.
fn model(ids: &HashSet<i64>) -> BTreeMap<String, Vec<String>> {
    let mut groups: BTreeMap<String, (i64, i64, i64, i64)> = BTreeMap::new();
    for &id in ids {
        let (card, amount) = event(id);
        let g = groups.entry(card).or_insert((0, 0, i64::MAX, i64::MIN));
        g.0 += 1;
        g.1 += amount;
        g.2 = g.2.min(amount);
        g.3 = g.3.max(amount);
    }
    groups
        .into_iter()
        .map(|(card, (n, total, low, high))| {
            (card, [n, total, low, high].map(|v| v.to_string()).to_vec())
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_under_load_restores_exactly_what_it_holds() {
    let dir = temp_dir("backup-src");
    let copies = temp_dir("backup-copies");
    std::fs::create_dir_all(&*copies).unwrap();
    let first = copies.join("first");
    let (source, port) = spawn_eddy_with(&dir, &[]);
    let client = connect_port(port).await;
    client.batch_execute(SCHEMA).await.unwrap();

    // Four clients insert one event a statement, until told to stop.
    let next = Arc::new(AtomicI64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let acked: Arc<Mutex<Vec<(i64, Instant)>>> = Arc::default();
    let mut loaders = Vec::new();
    for _ in 0..4 {
        let (next, stop, acked) = (next.clone(), stop.clone(), acked.clone());
        let c = connect_port(port).await;
        loaders.push(tokio::spawn(async move {
            while !stop.load(Ordering::SeqCst) {
                let id = next.fetch_add(1, Ordering::SeqCst);
                c.batch_execute(&insert_sql(id)).await.unwrap();
                acked.lock().unwrap().push((id, Instant::now()));
            }
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let began = Instant::now();
    let row = simple_rows(&client, &format!("BACKUP TO '{}'", first.display())).await;
    assert_eq!(row.len(), 1);
    assert_eq!(row[0][0].as_deref(), Some(first.to_str().unwrap()));
    let files: i64 = row[0][1].as_deref().unwrap().parse().unwrap();
    assert!(files > 3, "{row:?}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::SeqCst);
    for l in loaders {
        l.await.unwrap();
    }
    let sent = next.load(Ordering::SeqCst);
    let acked = acked.lock().unwrap().clone();
    let before: HashSet<i64> = acked
        .iter()
        .filter(|(_, at)| *at < began)
        .map(|(id, _)| *id)
        .collect();
    assert!(before.len() > 100, "the load ran: {} events", before.len());

    // A second backup, from the command line, of the node at rest.
    let second = copies.join("second");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_eddy"))
        .args([
            "backup",
            second.to_str().unwrap(),
            "--port",
            &port.to_string(),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("checkpoint: "), "{said}");
    // Refused: not empty, and not absolute.
    let e = client
        .batch_execute(&format!("BACKUP TO '{}'", second.display()))
        .await
        .unwrap_err();
    assert_eq!(common::sqlstate(&e), "42P07", "{e}");
    let e = client
        .batch_execute("BACKUP TO 'relative'")
        .await
        .unwrap_err();
    assert_eq!(common::sqlstate(&e), "22023", "{e}");
    let at_rest = metric_rows(&client).await;
    drop(client);
    source.terminate();

    // The copy taken under load: a prefix of what was acknowledged while it ran.
    let (restored, port) = spawn_eddy_with(&first, &[]);
    let client = connect_port(port).await;
    let held: HashSet<i64> = simple_rows(&client, "SELECT id FROM s")
        .await
        .into_iter()
        .map(|r| r[0].as_deref().unwrap().parse().unwrap())
        .collect();
    let missing: Vec<_> = before.difference(&held).take(5).collect();
    assert!(
        missing.is_empty(),
        "acknowledged before the backup, lost: {missing:?}"
    );
    assert!(held.iter().all(|id| *id < sent), "an event never sent");
    assert_eq!(metric_rows(&client).await, model(&held));
    // It takes new events.
    client.batch_execute(&insert_sql(sent)).await.unwrap();
    drop(client);
    restored.terminate();

    // The copy of the node at rest equals it, group for group.
    let (restored, port) = spawn_eddy_with(&second, &[]);
    let client = connect_port(port).await;
    assert_eq!(metric_rows(&client).await, at_rest);
    let all: HashSet<i64> = acked.iter().map(|(id, _)| *id).collect();
    assert_eq!(at_rest, model(&all));
    drop(client);
    restored.terminate();
}
