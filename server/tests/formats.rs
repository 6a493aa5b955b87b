//! Data directories written by earlier builds open in this one, with every metric value
//! they had. `server/tests/formats/<version>/` holds, per on-disk format version, a small
//! data directory written by the build that introduced it and `expected.txt`, the rows
//! each query gave on it (queries and rows as text, a blank line after each block).
//!
//! The directory was left by a kill -9, so a start replays the log past the last
//! checkpoint as well as loading the checkpoint, the sealed chunks and the open events.
//!
//! A build that changes a format writes a new version's directory with
//! `EDDY_WRITE_FORMAT_FIXTURE=v<N> cargo test -p eddy-server --test formats newest`
//! and keeps every older one: each must still open. Until it does, the newest fixture's
//! test fails: the newest fixture is always in the format this build writes.

mod common;

use std::path::{Path, PathBuf};

use common::{connect_port, simple_rows, spawn_eddy_with, temp_dir};

fn fixtures() -> PathBuf {
    common::repo().join("server/tests/formats")
}

/// The queries whose rows a fixture keeps.
const QUERIES: [&str; 7] = [
    "SELECT * FROM card_5m ORDER BY card",
    "SELECT * FROM card_day ORDER BY card",
    "SELECT * FROM card_last5 ORDER BY card",
    "SELECT * FROM card_merchant ORDER BY card, merchant",
    "SELECT * FROM page_views ORDER BY page",
    "SELECT count(*), sum(qty), min(ts), max(ts) FROM pay",
    "SELECT name, setting FROM pg_settings WHERE name = 'statement_timeout'",
];

const SCHEMA: &str = "
CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL,
    merchant TEXT, amount DOUBLE PRECISION, qty INTEGER, ok BOOLEAN, at TIMESTAMPTZ)
    WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', partitions = 3,
          lateness = '2 seconds');
CREATE METRIC card_5m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
    AVG(amount) AS mean, MIN(amount) AS low, MAX(amount) AS high, STDDEV(amount) AS sd,
    COUNT(DISTINCT merchant) AS merchants, LAST_VALUE(amount) AS last_amount
    FROM pay WINDOW SLIDING (SIZE 5 MINUTES) WHERE amount > 0 GROUP BY card;
CREATE METRIC card_day AS SELECT card, COUNT(*) AS n, SUM(qty) AS qty,
    MEDIAN(amount) AS median, PERCENTILE_DISC(0.9) WITHIN GROUP (ORDER BY qty) AS p90
    FROM pay WINDOW TUMBLING (SIZE 1 DAY) GROUP BY card;
CREATE METRIC card_last5 AS SELECT card, COUNT(*) AS n, SUM(amount) AS total,
    MAX(at) AS latest FROM pay WINDOW SLIDING (SIZE 5 EVENTS) GROUP BY card;
CREATE METRIC card_merchant AS SELECT card, merchant, COUNT(*) AS n, SUM(qty) AS qty
    FROM pay WINDOW INFINITE WHERE ok GROUP BY card, merchant;
CREATE STREAM clicks (ts TIMESTAMP NOT NULL, usr TEXT NOT NULL, page TEXT NOT NULL)
    WITH (event_time = 'ts', partition_by = 'page', partitions = 2);
CREATE METRIC page_views AS SELECT page, COUNT(*) AS n, COUNT(DISTINCT usr) AS users
    FROM clicks WINDOW SLIDING (SIZE 1 HOUR) GROUP BY page;
ALTER SYSTEM SET statement_timeout = '41s';
CREATE ROLE reader LOGIN;
GRANT SELECT ON METRIC card_5m TO reader;
";

fn pay_rows(from: i64, to: i64) -> String {
    let base = chrono::NaiveDate::from_ymd_opt(2026, 3, 1)
        .unwrap()
        .and_hms_opt(22, 0, 0)
        .unwrap();
    let mut out = String::new();
    for id in from..to {
        let ts = base + chrono::Duration::milliseconds(id * 2_400 + (id * 37) % 1_900);
        let merchant = match id % 9 {
            0 => "\\N".to_string(),
            m => format!("m{m}"),
        };
        let amount = ((id * 7919) % 20_000 - 2_000) as f64 / 100.0;
        let at = ts + chrono::Duration::seconds(id % 3);
        out.push_str(&format!(
            "{id}\t{}\tc{}\t{merchant}\t{amount}\t{}\t{}\t{}+00\n",
            ts.format("%Y-%m-%d %H:%M:%S%.3f"),
            (id * 31) % 40,
            id % 11,
            if id % 4 == 0 { "f" } else { "t" },
            at.format("%Y-%m-%d %H:%M:%S%.3f"),
        ));
    }
    out
}

fn click_rows(from: i64, to: i64) -> String {
    (from..to)
        .map(|i| {
            format!(
                "2026-03-01 23:{:02}:{:02}\tu{}\tp{}\n",
                (i / 60) % 60,
                i % 60,
                (i * 13) % 50,
                i % 6
            )
        })
        .collect()
}

async fn copy(client: &tokio_postgres::Client, stream: &str, rows: String) {
    use futures::SinkExt;
    let sink = client
        .copy_in(&format!("COPY {stream} FROM STDIN"))
        .await
        .unwrap();
    futures::pin_mut!(sink);
    sink.send(bytes::Bytes::from(rows)).await.unwrap();
    sink.finish().await.unwrap();
}

/// Each query's rows, as `expected.txt` keeps them.
async fn answers(client: &tokio_postgres::Client) -> String {
    let mut out = String::new();
    for q in QUERIES {
        out.push_str(q);
        out.push('\n');
        for row in simple_rows(client, q).await {
            let cells: Vec<String> = row
                .into_iter()
                .map(|c| c.unwrap_or_else(|| "NULL".into()))
                .collect();
            out.push_str(&cells.join("|"));
            out.push('\n');
        }
        out.push('\n');
    }
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The fixtures' directories, oldest first (`v1`, `v2`, …, `v10`).
fn versions() -> Vec<PathBuf> {
    let mut versions: Vec<PathBuf> = std::fs::read_dir(fixtures())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("expected.txt").exists())
        .collect();
    let number = |p: &PathBuf| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        name.trim_start_matches('v').parse::<u32>().unwrap_or(0)
    };
    versions.sort_by_key(number);
    assert!(
        !versions.is_empty(),
        "no fixtures in {}",
        fixtures().display()
    );
    versions
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_format_version_opens_with_its_values() {
    for version in versions() {
        let name = version.file_name().unwrap().to_string_lossy().into_owned();
        let dir = temp_dir(&format!("formats-{name}"));
        copy_dir(&version.join("data"), &dir);
        let (eddy, port) = spawn_eddy_with(&dir, &["--checkpoint-interval", "3600"]);
        let client = connect_port(port).await;
        let expected = std::fs::read_to_string(version.join("expected.txt")).unwrap();
        assert_eq!(answers(&client).await, expected, "format {name}");
        // It goes on: new events, a checkpoint, a restart.
        copy(&client, "pay", pay_rows(100_000, 100_010)).await;
        client.batch_execute("CHECKPOINT").await.unwrap();
        drop(client);
        eddy.terminate();
        let (eddy, port) = spawn_eddy_with(&dir, &[]);
        let client = connect_port(port).await;
        let n = simple_rows(&client, "SELECT count(*) FROM pay").await;
        assert!(n[0][0].is_some(), "format {name}");
        drop(client);
        eddy.terminate();
        // Opened, the directory is marked with this build's format (`eddy_cluster::format`).
        let marked = std::fs::read_to_string(dir.join("FORMAT")).unwrap();
        assert_eq!(
            marked.trim(),
            eddy_cluster::format::FORMAT.to_string(),
            "format {name}"
        );
    }
}

/// A data directory in a format newer than this build reads is refused before anything
/// in it is touched, with the versions named, and left as it was.
#[test]
fn a_newer_format_is_refused() {
    let dir = temp_dir("formats-newer");
    std::fs::create_dir_all(&*dir).unwrap();
    let newer = eddy_cluster::format::FORMAT + 1;
    std::fs::write(dir.join("FORMAT"), format!("{newer}\n")).unwrap();
    let said = common::refused_start(&dir, &[], &[]);
    assert!(
        said.contains(&format!(
            "is in format {newer}, and this build of Eddy reads formats 1 to"
        )),
        "{said}"
    );
    assert!(
        !dir.join("log").exists() && !dir.join("state").exists(),
        "it touched the directory"
    );
    let marked = std::fs::read_to_string(dir.join("FORMAT")).unwrap();
    assert_eq!(marked.trim(), newer.to_string());
}

/// This build writes the newest fixture's format, and gives its answers on the same
/// events. With `EDDY_WRITE_FORMAT_FIXTURE=<version>` it writes that fixture instead
/// (see the module's header).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_newest_fixture_is_in_this_builds_format() {
    let dir = temp_dir("formats-write");
    let (eddy, port) = spawn_eddy_with(&dir, &["--checkpoint-interval", "3600"]);
    let client = connect_port(port).await;
    client.batch_execute(SCHEMA).await.unwrap();
    copy(&client, "pay", pay_rows(0, 2_000)).await;
    copy(&client, "clicks", click_rows(0, 1_500)).await;
    client.batch_execute("CHECKPOINT").await.unwrap();
    // Past the checkpoint: these are in the log alone.
    copy(&client, "pay", pay_rows(2_000, 3_000)).await;
    copy(&client, "clicks", click_rows(1_500, 2_000)).await;
    let expected = answers(&client).await;
    drop(client);
    drop(eddy); // kill -9: the log's tail is replayed at the next start
    let written = std::fs::read_to_string(dir.join("FORMAT")).unwrap();
    assert_eq!(written.trim(), eddy_cluster::format::FORMAT.to_string());
    let Ok(version) = std::env::var("EDDY_WRITE_FORMAT_FIXTURE") else {
        let newest = versions().pop().unwrap();
        let name = newest.display();
        let format = std::fs::read_to_string(newest.join("data/FORMAT")).unwrap_or_default();
        assert_eq!(
            format.trim(),
            written.trim(),
            "{name} is not in this build's format: write its fixture (see the module's header)"
        );
        let answered = std::fs::read_to_string(newest.join("expected.txt")).unwrap();
        assert_eq!(
            answered, expected,
            "{name} answered otherwise when it was written"
        );
        return;
    };
    let out = fixtures().join(&version);
    let _ = std::fs::remove_dir_all(&out);
    copy_dir(&dir, &out.join("data"));
    // What a start rebuilds or makes anew: the live database, the journal (its records
    // are in the task logs), the lock.
    for skip in ["state", "log/node-journal", "eddy.pid"] {
        let p = out.join("data").join(skip);
        let _ = std::fs::remove_dir_all(&p);
        let _ = std::fs::remove_file(&p);
    }
    std::fs::write(out.join("expected.txt"), expected).unwrap();
}
