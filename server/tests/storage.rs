//! The disk-backed default across clean restarts: sealed chunks, group state in RocksDB
//! behind tiny caches, a column added between chunks, chunks written under one
//! `--reservoir-compression` and read under another, and a damaged chunk.

mod common;

use common::{connect_port, simple_rows, spawn_eddy, spawn_eddy_with, temp_dir, TextRow};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

/// The real `eddy` binary, with chunks of about fifteen events and group caches of a few
/// entries (see `spawn_eddy`), stopped cleanly with SIGTERM and started again: first
/// writing its chunks uncompressed, then reading them with LZ4 on, then by default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn state_and_chunks_survive_restarts_and_damage_is_reported() {
    let dir = temp_dir("storage");
    let (server, port) = spawn_eddy_with(&dir, &["--reservoir-compression", "none"]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', \
             partitions = 2);
             CREATE METRIC card_1h AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
             MAX(amount) AS top, PERCENTILE_DISC(0.5) WITHIN GROUP (ORDER BY amount) AS mid \
             FROM pay WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card;
             CREATE METRIC card_last AS SELECT card, COUNT(*) AS n, SUM(amount) AS total \
             FROM pay WINDOW SLIDING (SIZE 5 EVENTS) GROUP BY card;",
        )
        .await
        .unwrap();
    let insert = |from: i64, to: i64, country: bool| {
        let values: Vec<String> = (from..to)
            .map(|i| {
                let extra = if country {
                    format!(", '{}'", ["FR", "DE", "IT"][i as usize % 3])
                } else {
                    String::new()
                };
                let ts = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
                    .unwrap()
                    .and_hms_opt(0, 0, 0)
                    .unwrap()
                    + chrono::Duration::seconds(i * 4);
                format!("({i}, '{ts}', 'c{}', {}{extra})", i % 7, i % 100)
            })
            .collect();
        format!("INSERT INTO pay VALUES {}", values.join(", "))
    };
    for from in (0..1000).step_by(100) {
        client
            .batch_execute(&insert(from, from + 100, false))
            .await
            .unwrap();
    }
    client
        .batch_execute("ALTER STREAM pay ADD COLUMN country TEXT")
        .await
        .unwrap();
    for from in (1000..1500).step_by(100) {
        client
            .batch_execute(&insert(from, from + 100, true))
            .await
            .unwrap();
    }
    client
        .batch_execute(
            "CREATE METRIC by_country AS SELECT card, country, COUNT(*) AS n FROM pay \
             WINDOW SLIDING (SIZE 1 HOUR) GROUP BY card, country",
        )
        .await
        .unwrap();

    let read = |client: tokio_postgres::Client| async move {
        let mut card = simple_rows(&client, "SELECT card, n, total, top, mid FROM card_1h").await;
        card.sort();
        let mut country = simple_rows(&client, "SELECT card, country, n FROM by_country").await;
        country.sort();
        let mut last = simple_rows(&client, "SELECT card, n, total FROM card_last").await;
        last.sort();
        country.extend(last);
        let events = simple_rows(
            &client,
            "SELECT count(*), count(country), sum(amount) FROM pay",
        )
        .await;
        (card, country, events, client)
    };
    let (card, country, events, client) = read(client).await;
    // The model: per task (stream time is per task), the events of the last hour.
    let part = |i: i64| partition_for(&Value::Text(format!("c{}", i % 7).into()), 2);
    let mut task_time = [0i64; 2];
    for i in 0..1500i64 {
        task_time[part(i) as usize] = task_time[part(i) as usize].max(i * 4);
    }
    let mut want: std::collections::BTreeMap<String, Vec<i64>> = Default::default();
    for i in 0..1500i64 {
        if i * 4 > task_time[part(i) as usize] - 3600 {
            want.entry(format!("c{}", i % 7)).or_default().push(i % 100);
        }
    }
    let want: Vec<TextRow> = want
        .into_iter()
        .map(|(c, mut amounts)| {
            amounts.sort();
            // PERCENTILE_DISC(0.5): the value at rank ceil(n / 2).
            let mid = amounts[amounts.len().div_ceil(2) - 1];
            vec![
                Some(c),
                Some(amounts.len().to_string()),
                Some(amounts.iter().sum::<i64>().to_string()),
                Some(amounts.iter().max().unwrap().to_string()),
                Some(mid.to_string()),
            ]
        })
        .collect();
    assert_eq!(card, want);
    // card_last: each card's five newest events (the events arrive in time order).
    for c in 0..7 {
        let newest: Vec<i64> = (0..1500i64).filter(|i| i % 7 == c).rev().take(5).collect();
        let row = vec![
            Some(format!("c{c}")),
            Some("5".to_string()),
            Some(newest.iter().map(|i| i % 100).sum::<i64>().to_string()),
        ];
        assert!(country.contains(&row), "card_last {row:?} in {country:?}");
    }
    assert_eq!(events[0][0].as_deref(), Some("1500"));
    assert_eq!(events[0][1].as_deref(), Some("500"));
    assert!(country.iter().any(|r| r[1].is_none()), "{country:?}");
    assert!(
        country.iter().any(|r| r[1].as_deref() == Some("FR")),
        "{country:?}"
    );
    let storage = simple_rows(&client, "SHOW STORAGE").await;
    let chunks: i64 = storage[0][8].as_deref().unwrap().parse().unwrap();
    assert!(chunks > 20, "{:?}", storage[0]);
    drop(client);

    // A clean restart: everything comes back from the checkpoint taken at shutdown.
    server.terminate();
    let payloads = chunk_payloads(&dir);
    assert!(payloads.len() > 20, "{}", payloads.len());
    assert!(
        payloads.iter().all(|p| p.starts_with(&[0xff; 4])),
        "under `none` every chunk is the Arrow IPC stream alone"
    );
    let (server, port) = spawn_eddy_with(&dir, &["--reservoir-compression", "lz4"]);
    let (card2, country2, events2, client) = read(connect_port(port).await).await;
    assert_eq!((&card2, &country2, &events2), (&card, &country, &events));
    drop(client);
    server.terminate();

    // A damaged chunk is an error naming its file, not a wrong answer.
    let segments: Vec<std::path::PathBuf> = walk(&dir.join("reservoir"))
        .into_iter()
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    assert!(!segments.is_empty());
    for seg in &segments {
        let mut bytes = std::fs::read(seg).unwrap();
        if bytes.len() > 100 {
            bytes[80] ^= 0x5a;
            std::fs::write(seg, &bytes).unwrap();
        }
    }
    let (server, port) = spawn_eddy(&dir);
    let client = connect_port(port).await;
    let err = client
        .simple_query("SELECT count(*) FROM pay")
        .await
        .unwrap_err();
    let db = err.as_db_error().expect("a database error");
    assert_eq!(db.code().code(), "XX000", "{db:?}");
    assert!(
        db.message().contains(".seg") && db.message().contains("bad checksum"),
        "{}",
        db.message()
    );
    // The connection stays usable.
    assert_eq!(
        simple_rows(&client, "SELECT 1").await[0][0].as_deref(),
        Some("1")
    );
    drop(server);
}

/// The payload of every chunk in the reservoir's segment files.
fn chunk_payloads(dir: &std::path::Path) -> Vec<Vec<u8>> {
    use eddy_storage::chunk::{ChunkHeader, HEADER_BYTES};
    let mut out = Vec::new();
    for seg in walk(&dir.join("reservoir")) {
        if seg.extension().is_none_or(|e| e != "seg") {
            continue;
        }
        let bytes = std::fs::read(&seg).unwrap();
        let mut at = 0;
        while let Some(h) = bytes.get(at..).and_then(ChunkHeader::decode) {
            let start = at + HEADER_BYTES;
            at = start + h.payload_len as usize;
            out.push(bytes[start..at].to_vec());
        }
    }
    out
}

fn walk(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}
