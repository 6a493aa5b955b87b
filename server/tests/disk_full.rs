//! A full disk, for real: `eddy` runs on a size-limited tmpfs mounted in a private mount
//! namespace (`unshare`), and a ballast file leaves exactly the free space a case needs,
//! so that each kind of file is the one that meets ENOSPC first:
//! - the log (a COPY's own append);
//! - a reservoir segment (a seal of events the log already holds);
//! - RocksDB (the background flush of a full memtable, as events arrive);
//! - a checkpoint (its flush), and a shutdown on a disk still full.
//!
//! In every case: a statement that fails says 53100 and applied nothing; nothing stops
//! for good, and once the ballast goes, ingestion and checkpoints resume without a
//! restart; after SIGTERM and a restart every acknowledged event counts exactly once.
//! A last case checks the reserve: below it events are refused while reads go on.
//!
//! The cases that meet ENOSPC on the log's own writes set `EDDY_TEST_DISK_ADMISSION=off`,
//! the test switch that lets a statement past the reserve check.

mod common;

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use futures::SinkExt;

use common::{connect_port, simple_rows, spawn_eddy_in, Eddy};

/// A tmpfs of a fixed size, mounted in a mount namespace of its own, kept alive by a
/// holder process; eddy and the shell commands here enter it with `nsenter`.
struct SmallDisk {
    dir: PathBuf,
    holder: Child,
}

impl SmallDisk {
    fn new(name: &str, mib: u64) -> SmallDisk {
        let dir =
            std::env::temp_dir().join(format!("eddy-test-full-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let script = format!(
            "mount -t tmpfs -o size={mib}m eddy-full {} && echo ready && exec sleep 100000",
            dir.display()
        );
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("unshare (util-linux) runs");
        let mut line = String::new();
        use std::io::BufRead;
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "could not mount a tmpfs in a private mount namespace (the test runs as root)"
        );
        SmallDisk { dir, holder }
    }

    /// The command prefix that runs a program in the disk's mount namespace.
    fn enter(&self) -> Vec<String> {
        ["nsenter", "-t", &self.holder.id().to_string(), "-m", "--"]
            .map(String::from)
            .to_vec()
    }

    fn sh(&self, script: &str) -> String {
        let prefix = self.enter();
        let out = Command::new(&prefix[0])
            .args(&prefix[1..])
            .args(["sh", "-c", script])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{script}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Grows the ballast until about `bytes` stay free.
    fn leave_free(&self, bytes: u64) {
        let ballast = self.dir.join("ballast");
        self.sh(&format!("rm -f {}", ballast.display()));
        // The server writes meanwhile: a ballast that no longer fits is made smaller.
        let script = format!(
            "take=$(( $(stat -f -c '%a * %S' {dir}) - {bytes} )); \
             while [ $take -gt 0 ] && ! fallocate -l $take {b} 2>/dev/null; do \
               take=$((take - 65536)); done",
            dir = self.dir.display(),
            b = ballast.display()
        );
        self.sh(&script);
    }

    /// Removes the ballast: space is back.
    fn free_all(&self) {
        self.sh(&format!("rm -f {}", self.dir.join("ballast").display()));
    }

    fn data(&self) -> PathBuf {
        self.dir.join("data")
    }

    fn spawn(&self, args: &[&str], env: &[(&str, &str)]) -> (Eddy, u16) {
        spawn_eddy_in(&self.enter(), &self.data(), args, env)
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// What the acknowledged statements applied: the metric's total count and sum of ids.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Totals {
    n: i64,
    ids: i64,
}

/// Rows to COPY and what they add.
struct Rows {
    text: String,
    totals: Totals,
}

/// `count` events from id `first` on, 10 ms apart from `base_ms`, each its own card
/// (`distinct`) or one of 50, with `pad` bytes of random hex (barely compressible).
fn rows(first: i64, count: i64, base_ms: i64, distinct: bool, pad: usize) -> Rows {
    use rand::Rng;
    let base = chrono::NaiveDate::from_ymd_opt(2026, 1, 1)
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap();
    let mut rng = rand::rng();
    let mut text = String::new();
    let mut totals = Totals::default();
    for id in first..first + count {
        let ts = base + chrono::Duration::milliseconds(base_ms + (id - first) * 10);
        let card = if distinct { id } else { id % 50 };
        let hex: String = (0..pad)
            .map(|_| char::from_digit(rng.random_range(0..16), 16).unwrap())
            .collect();
        text.push_str(&format!(
            "{id}\t{}\tc{card}\t{hex}\n",
            ts.format("%Y-%m-%d %H:%M:%S%.3f")
        ));
        totals.n += 1;
        totals.ids += id;
    }
    Rows { text, totals }
}

struct Node {
    eddy: Eddy,
    client: tokio_postgres::Client,
}

impl Node {
    async fn start(disk: &SmallDisk, args: &[&str], env: &[(&str, &str)]) -> Node {
        let (eddy, port) = disk.spawn(args, env);
        let client = connect_port(port).await;
        Node { eddy, client }
    }

    /// COPYs the rows; adds them to `model` when acknowledged.
    async fn copy(&self, rows: &Rows, model: &mut Totals) -> Result<(), String> {
        let sent = async {
            let sink = self.client.copy_in("COPY s FROM STDIN").await?;
            futures::pin_mut!(sink);
            sink.send(bytes::Bytes::from(rows.text.clone())).await?;
            sink.finish().await
        };
        match sent.await {
            Ok(_) => {
                model.n += rows.totals.n;
                model.ids += rows.totals.ids;
                Ok(())
            }
            Err(e) => Err(error_text(&e)),
        }
    }

    async fn totals(&self) -> Totals {
        let rows = simple_rows(
            &self.client,
            "SELECT COALESCE(SUM(n), 0), COALESCE(SUM(total), 0) FROM m",
        )
        .await;
        let n = |i: usize| rows[0][i].as_deref().unwrap().parse::<i64>().unwrap();
        Totals { n: n(0), ids: n(1) }
    }

    fn said(&self) -> String {
        self.eddy.output().join("\n")
    }
}

const SCHEMA: &str = "CREATE STREAM s (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, \
     card TEXT NOT NULL, pad TEXT) WITH (event_time = 'ts', event_id = 'id', \
     partition_by = 'card', partitions = 2, lateness = '1 hour'); \
     CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(id) AS total FROM s \
     WINDOW SLIDING (SIZE INTERVAL '7 days') GROUP BY card";

/// Retries `f` on 53100 until it succeeds, for at most 30 s: ingestion and checkpoints
/// resume on their own once there is room.
async fn until_resumed<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match f().await {
            Ok(()) => return,
            Err(e) if e.starts_with("53100") && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("{what} did not resume: {e}"),
        }
    }
}

async fn checkpoint(node: &Node) -> Result<(), String> {
    node.client
        .batch_execute("CHECKPOINT")
        .await
        .map_err(|e| error_text(&e))
}

/// "SQLSTATE message".
fn error_text(e: &tokio_postgres::Error) -> String {
    let message = e
        .as_db_error()
        .map_or(e.to_string(), |d| d.message().to_string());
    format!("{} {message}", common::sqlstate(e))
}

/// Space back: ingestion and checkpoints resume without a restart, and a restart after
/// SIGTERM finds exactly `model`.
async fn recover(disk: &SmallDisk, node: Node, args: &[&str], mut model: Totals, next: i64) {
    disk.free_all();
    // Later than every event so far (none is late).
    let more = rows(next, 500, 12 * 3_600_000, false, 100);
    until_resumed("ingestion", || {
        let mut m = model;
        let node = &node;
        let more = &more;
        async move { node.copy(more, &mut m).await }
    })
    .await;
    model.n += more.totals.n;
    model.ids += more.totals.ids;
    until_resumed("checkpoints", || checkpoint(&node)).await;
    assert_eq!(node.totals().await, model, "{}", node.said());
    node.eddy.terminate();
    let node = Node::start(disk, args, &[]).await;
    assert_eq!(
        node.totals().await,
        model,
        "after the restart:\n{}",
        node.said()
    );
    node.eddy.terminate();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_fills_first() {
    let disk = SmallDisk::new("log", 96);
    let args = ["--disk-reserve", "0"];
    let node = Node::start(&disk, &args, &[("EDDY_TEST_DISK_ADMISSION", "off")]).await;
    node.client.batch_execute(SCHEMA).await.unwrap();
    let mut model = Totals::default();
    node.copy(&rows(0, 2000, 0, false, 100), &mut model)
        .await
        .unwrap();
    disk.leave_free(64 << 10);
    // About 500 kB of log: the append fails part way and is taken back.
    let e = node
        .copy(&rows(2000, 2000, 20_000, false, 200), &mut model)
        .await
        .expect_err("the log is full");
    assert!(e.starts_with("53100"), "{e}");
    assert!(e.contains("could not write the log"), "{e}");
    assert_eq!(
        node.totals().await,
        model,
        "the failed COPY applied nothing"
    );
    recover(&disk, node, &args, model, 10_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reservoir_segment_fills_first() {
    let disk = SmallDisk::new("segment", 96);
    let args = [
        "--disk-reserve",
        "0",
        "--checkpoint-interval",
        "3600",
        "--chunk-bytes-max",
        "128kB",
        "--segment-bytes-max",
        "64MB",
    ];
    let node = Node::start(&disk, &args, &[]).await;
    node.client.batch_execute(SCHEMA).await.unwrap();
    let mut model = Totals::default();
    // Within the lateness (1 hour) nothing is sealed: about 3 MB of events wait open.
    for i in 0..4 {
        node.copy(&rows(i * 2000, 2000, i * 20_000, false, 400), &mut model)
            .await
            .unwrap();
    }
    disk.leave_free(256 << 10);
    // Two hours later: every open event is sealable, and its chunks find no room.
    // (With RETURNING the windows move at once, and the seal follows the statement.)
    node.client
        .batch_execute(
            "INSERT INTO s VALUES (8000, '2026-01-01 02:00:00', 'c0', 'x') RETURNING m.n",
        )
        .await
        .unwrap();
    model.n += 1;
    model.ids += 8000;
    assert_eq!(node.totals().await, model);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !node
        .said()
        .contains("the reservoir keeps its events in memory")
    {
        assert!(
            Instant::now() < deadline,
            "no seal met the full disk:\n{}",
            node.said()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    recover(&disk, node, &args, model, 10_000).await;
}

/// RocksDB's own flush of a full memtable, in the background, while events arrive: the
/// states it could not write wait in memory, where reads find them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rocksdb_fills_first() {
    let disk = SmallDisk::new("rocksdb", 96);
    let args = [
        "--disk-reserve",
        "0",
        "--checkpoint-interval",
        "3600",
        "--rocksdb-write-buffer-bytes",
        "1MB",
    ];
    let node = Node::start(&disk, &args, &[("EDDY_TEST_DISK_ADMISSION", "off")]).await;
    node.client.batch_execute(SCHEMA).await.unwrap();
    // Three group states a (new) event, each written through the tiny test caches: a
    // memtable fills every few hundred events, a few kB of log.
    node.client
        .batch_execute(
            "CREATE METRIC by_id AS SELECT card, id, COUNT(*) AS n FROM s \
             WINDOW SLIDING (SIZE INTERVAL '7 days') GROUP BY card, id; \
             CREATE METRIC by_ts AS SELECT card, ts, COUNT(*) AS n FROM s \
             WINDOW SLIDING (SIZE INTERVAL '7 days') GROUP BY card, ts",
        )
        .await
        .unwrap();
    let mut model = Totals::default();
    node.copy(&rows(0, 2000, 0, true, 0), &mut model)
        .await
        .unwrap();
    // The checkpoint flushes the memtables: the next flush is a whole memtable away.
    checkpoint(&node).await.unwrap();
    disk.leave_free(256 << 10);
    let mut next = 2000;
    while !node.said().contains("state writes wait in memory") {
        assert!(
            next < 2000 + 60 * 200,
            "no flush met the full disk:\n{}",
            node.said()
        );
        node.copy(&rows(next, 200, next * 10, true, 0), &mut model)
            .await
            .unwrap_or_else(|e| panic!("the log filled before RocksDB did: {e}"));
        next += 200;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        node.said().contains(".sst: No space left on device"),
        "{}",
        node.said()
    );
    assert_eq!(node.totals().await, model);
    let e = checkpoint(&node)
        .await
        .expect_err("no room for a checkpoint");
    assert!(e.starts_with("53100"), "{e}");
    recover(&disk, node, &args, model, 100_000).await;
}

/// The checkpoint's own flush fills the disk, and a shutdown while it is still full
/// says so and exits non-zero: the next start replays the log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_fills_first_and_shutdown_says_so() {
    let disk = SmallDisk::new("checkpoint", 96);
    // Tiny caches (the test default) write the states through as events arrive, while
    // there is room; the checkpoint then has little to write to RocksDB's log, and a
    // memtable of 8 MB to flush into a table file.
    let args = [
        "--disk-reserve",
        "0",
        "--checkpoint-interval",
        "3600",
        "--rocksdb-write-buffer-bytes",
        "8MB",
    ];
    let node = Node::start(&disk, &args, &[]).await;
    node.client.batch_execute(SCHEMA).await.unwrap();
    let mut model = Totals::default();
    // Two hours apart: all but the last events are sealed (past the lateness), so
    // the checkpoint's task records stay small.
    for i in 0..4 {
        node.copy(&rows(i * 5000, 5000, i * 7_200_000, true, 0), &mut model)
            .await
            .unwrap();
    }
    node.client
        .batch_execute(
            "INSERT INTO s VALUES (20000, '2026-01-01 10:00:00', 'c0', 'x') RETURNING m.n",
        )
        .await
        .unwrap();
    model.n += 1;
    model.ids += 20000;
    disk.leave_free(128 << 10);
    let e = checkpoint(&node)
        .await
        .expect_err("no room for the checkpoint");
    assert!(e.starts_with("53100"), "{e}");
    assert!(e.contains(".sst: No space left on device"), "{e}");
    assert_eq!(node.totals().await, model);
    let (status, said) = node.eddy.terminate_status();
    assert!(!status.success(), "a failed last checkpoint exits non-zero");
    assert!(
        said.join("\n")
            .contains("the checkpoint at shutdown failed"),
        "{}",
        said.join("\n")
    );
    disk.free_all();
    let node = Node::start(&disk, &args, &[]).await;
    assert_eq!(
        node.totals().await,
        model,
        "the log replayed:\n{}",
        node.said()
    );
    recover(&disk, node, &args, model, 100_000).await;
}

/// Below the reserve new events are refused with 53100 and a hint, reads and SHOW
/// STORAGE go on, and ingestion resumes once space is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn below_the_reserve_events_are_refused_and_reads_go_on() {
    let disk = SmallDisk::new("reserve", 96);
    let args = ["--disk-reserve", "16MB"];
    let node = Node::start(&disk, &args, &[]).await;
    node.client.batch_execute(SCHEMA).await.unwrap();
    let mut model = Totals::default();
    node.copy(&rows(0, 1000, 0, false, 50), &mut model)
        .await
        .unwrap();
    disk.leave_free(12 << 20);
    // The node reads the free space at most every 50 ms.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let e = node
        .client
        .batch_execute("INSERT INTO s VALUES (5000, '2026-01-01 01:00:00', 'c1', 'x')")
        .await
        .expect_err("below the reserve");
    assert_eq!(common::sqlstate(&e), "53100", "{e}");
    let db = e.as_db_error().unwrap();
    assert!(
        db.message().contains("keeps 16777216 free"),
        "{}",
        db.message()
    );
    assert!(
        db.hint().is_some_and(|h| h.contains("Free space")),
        "{db:?}"
    );
    assert_eq!(node.totals().await, model);
    let storage = simple_rows(&node.client, "SELECT 1").await;
    assert_eq!(storage.len(), 1);
    let show = node.client.simple_query("SHOW STORAGE").await.unwrap();
    let row = show
        .iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r),
            _ => None,
        })
        .unwrap();
    let free: u64 = row.get("disk_free_bytes").unwrap().parse().unwrap();
    let reserve: u64 = row.get("disk_reserve_bytes").unwrap().parse().unwrap();
    assert!(free < reserve, "{free} {reserve}");
    recover(&disk, node, &args, model, 10_000).await;
}
