//! Changing the shard count of a running node: tasks move to their new shards with their
//! state while a client keeps inserting, and every event's answer, every metric row and
//! the state a restart recovers are exactly those of a node that never changed.

mod common;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use common::{catalog_of, tiny_chunks};
use eddy_cluster::{Engine, EventReply, LocalLog, NodeStorage, Row};
use eddy_planner::catalog::Catalog;
use eddy_planner::types::Value;

const DDL: [&str; 4] = [
    "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
     merchant TEXT NOT NULL, amount DOUBLE PRECISION) WITH (event_time = 'ts', \
     event_id = 'id', partition_by = 'card, merchant', partitions = 6, \
     lateness = '5 seconds')",
    "CREATE METRIC by_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, \
     MIN(amount) AS low, COUNT(DISTINCT merchant) AS merchants FROM pay \
     WINDOW SLIDING (SIZE 10 MINUTES) GROUP BY card",
    "CREATE METRIC by_merchant AS SELECT merchant, COUNT(*) AS n, MAX(amount) AS high \
     FROM pay WHERE amount > 10 WINDOW TUMBLING (SIZE 1 MINUTE) GROUP BY merchant",
    "CREATE METRIC cards AS SELECT card, AVG(amount) AS mean FROM pay \
     WINDOW INFINITE GROUP BY card",
];

fn catalog() -> Arc<Catalog> {
    catalog_of(&DDL)
}

struct Node {
    dir: PathBuf,
    engine: Option<Arc<Engine>>,
}

impl Node {
    /// A node on `dir` with `shards` shards, its embedded log and small chunks (so moved
    /// tasks read sealed chunks back from disk).
    async fn open(dir: PathBuf, shards: usize) -> Node {
        let storage =
            Arc::new(NodeStorage::open(&dir.join("state"), tiny_chunks()).expect("storage"));
        let log = LocalLog::open(&dir.join("log"), Duration::from_millis(1)).expect("log");
        let engine = Arc::new(Engine::start(shards, Arc::new(log), Some(storage)));
        let catalog = catalog();
        engine
            .apply_catalog(catalog.clone())
            .await
            .expect("catalog");
        engine.recover(&catalog).await.expect("recover");
        Node {
            dir,
            engine: Some(engine),
        }
    }

    fn engine(&self) -> &Arc<Engine> {
        self.engine.as_ref().expect("running")
    }

    /// Stops the shards (joining their threads) and keeps the directory.
    fn stop(mut self) -> PathBuf {
        let engine = self.engine.take().expect("running");
        Arc::try_unwrap(engine).expect("one handle").shutdown();
        self.dir.clone()
    }
}

fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("eddy-reshard-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Events `from..to`, 1.5 s apart, over 30 cards and 9 merchants; every 50th repeats an
/// id (a duplicate) and every 70th is late.
fn events(from: i64, to: i64) -> Vec<Row> {
    (from..to)
        .map(|i| {
            let id = if i % 50 == 49 { i - 1 } else { i };
            let t = if i % 70 == 69 { i - 40 } else { i };
            Row::from(vec![
                Value::Int(id),
                Value::Timestamp(1_790_000_000_000_000 + t * 1_500_000),
                Value::Text(format!("c-{}", (i * 7) % 30).into()),
                Value::Text(format!("m-{}", i % 9).into()),
                Value::Float(((i * 13) % 101) as f64 * 0.5),
            ])
        })
        .collect()
}

/// Inserts `rows` in statements of `batch` events; the replies, in order.
async fn ingest(engine: &Engine, rows: &[Row], batch: usize) -> Vec<EventReply> {
    let catalog = catalog();
    let stream = catalog.stream("pay").expect("stream");
    let mut replies = Vec::new();
    for chunk in rows.chunks(batch) {
        replies.extend(
            engine
                .ingest(stream, chunk.to_vec(), true, true)
                .await
                .expect("ingest"),
        );
    }
    replies
}

/// Every row of every metric, sorted.
async fn rows(engine: &Engine) -> Vec<Vec<Value>> {
    let catalog = catalog();
    let stream = catalog.stream("pay").expect("stream");
    let mut out = Vec::new();
    for name in ["by_card", "by_merchant", "cards"] {
        let metric = catalog.metric(name).expect("metric");
        let mut rows = engine
            .metric_rows(stream, metric, None)
            .await
            .expect("rows");
        rows.sort_by_key(|r| format!("{r:?}"));
        out.push(vec![Value::Text(name.into())]);
        out.extend(rows);
    }
    out
}

fn same_replies(got: &[EventReply], want: &[EventReply]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(
            (format!("{:?}", g.outcomes), format!("{:?}", g.metrics)),
            (format!("{:?}", w.outcomes), format!("{:?}", w.metrics)),
            "event {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tasks_move_with_their_state_while_events_arrive() {
    let all = events(0, 3000);
    let reference = Node::open(temp_dir("reference"), 2).await;
    let want = ingest(reference.engine(), &all, 25).await;
    let want_rows = rows(reference.engine()).await;
    let dir = reference.stop();
    let _ = std::fs::remove_dir_all(dir);

    let node = Node::open(temp_dir("moving"), 2).await;
    let engine = node.engine().clone();
    // One client inserts in small statements while the shard count changes under it.
    let inserting = {
        let engine = engine.clone();
        let all = all.clone();
        tokio::spawn(async move { ingest(&engine, &all, 10).await })
    };
    let mut counts = Vec::new();
    let mut midway = 0;
    for count in [3, 1, 4, 2, 5, 2] {
        tokio::time::sleep(Duration::from_millis(15)).await;
        counts.push(engine.reshard(Some(count)).await.expect("reshard"));
        let accepted: u64 = engine
            .report()
            .await
            .expect("report")
            .iter()
            .map(|t| t.stats.accepted)
            .sum();
        midway += usize::from(accepted > 0 && !inserting.is_finished());
        let shards = engine.shard_report().await.expect("shards");
        assert_eq!(shards.len(), count);
        // Every task is where `shard_of` says, and each shard has its share.
        assert_eq!(shards.iter().map(|s| s.tasks).sum::<usize>(), 12);
        for s in &shards {
            assert!(s.tasks >= 12 / count - 1, "{shards:?}");
        }
    }
    assert_eq!(counts, [3, 1, 4, 2, 5, 2]);
    assert!(
        midway >= 3,
        "only {midway} changes happened while events arrived"
    );
    let got = inserting.await.expect("inserting");
    same_replies(&got, &want);
    assert_eq!(rows(&engine).await, want_rows);

    // More events after the moves, a checkpoint, and a restart with another count:
    // the moved tasks' state was written through their new shards' writers.
    let more = events(3000, 3600);
    let reference = Node::open(temp_dir("reference-2"), 2).await;
    ingest(reference.engine(), &all, 500).await;
    let want_more = ingest(reference.engine(), &more, 40).await;
    let want_rows = rows(reference.engine()).await;
    let dir = reference.stop();
    let _ = std::fs::remove_dir_all(dir);

    engine.reshard(Some(3)).await.expect("reshard");
    let got_more = ingest(&engine, &more[..300], 40).await;
    engine.checkpoint().await.expect("checkpoint");
    engine.reshard(Some(1)).await.expect("reshard");
    let mut rest = ingest(&engine, &more[300..], 40).await;
    drop(engine);
    let dir = node.stop();
    let node = Node::open(dir, 3).await;
    assert_eq!(rows(node.engine()).await, want_rows);
    let mut all_more = got_more;
    all_more.append(&mut rest);
    same_replies(&all_more, &want_more);
    let dir = node.stop();
    let _ = std::fs::remove_dir_all(dir);
}
