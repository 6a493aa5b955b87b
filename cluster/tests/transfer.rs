//! Checkpoint transfers between two nodes' real storage (RocksDB, segment files): a task
//! sent whole, then only what changed; a flipped byte and a transfer cut short are
//! rejected and change nothing; an installed task answers and goes on exactly as the
//! sender's.

mod common;

use std::path::PathBuf;
use std::sync::Arc;

use common::{catalog_of, tiny_chunks};
use eddy_cluster::node::transfer::{Fault, Have, Piece};
use eddy_cluster::{Engine, MemoryLog, NodeStorage, Row, TaskId};
use eddy_planner::catalog::Catalog;
use eddy_planner::types::Value;

const DDL: [&str; 2] = [
    "CREATE STREAM payments (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
     merchant TEXT, amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
     partitions = 1, lateness = '5 seconds')",
    "CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS total, MIN(amount) AS low, \
     COUNT(DISTINCT merchant) AS merchants FROM payments WINDOW SLIDING (SIZE 1 HOUR) \
     GROUP BY card",
];

struct Node {
    dir: PathBuf,
    storage: Arc<NodeStorage>,
    engine: Arc<Engine>,
}

impl Node {
    /// Joins the node's shard threads before its directory goes: a shard still holding
    /// RocksDB when the process exits aborts it.
    fn stop(self) {
        let Node {
            dir,
            storage,
            engine,
        } = self;
        if let Ok(engine) = Arc::try_unwrap(engine) {
            engine.shutdown();
        }
        drop(storage);
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn catalog() -> Arc<Catalog> {
    catalog_of(&DDL)
}

async fn node(name: &str) -> Node {
    let dir = std::env::temp_dir().join(format!("eddy-transfer-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let storage = Arc::new(NodeStorage::open(&dir, tiny_chunks()).expect("storage"));
    let engine = Arc::new(Engine::start(1, Arc::new(MemoryLog), Some(storage.clone())));
    engine.apply_catalog(catalog()).await.expect("catalog");
    Node {
        dir,
        storage,
        engine,
    }
}

/// Events `from..to`: one a second, over 40 cards and 7 merchants.
fn events(from: i64, to: i64) -> Vec<Row> {
    (from..to)
        .map(|i| {
            Row::from(vec![
                Value::Int(i),
                Value::Timestamp(1_790_000_000_000_000 + i * 1_000_000),
                Value::Text(format!("c-{}", i % 40).into()),
                Value::Text(format!("m-{}", i % 7).into()),
                Value::Float((i % 97) as f64 * 0.25),
            ])
        })
        .collect()
}

async fn ingest(node: &Node, rows: Vec<Row>) {
    let catalog = catalog();
    let stream = catalog.stream("payments").expect("stream");
    for batch in rows.chunks(500) {
        node.engine
            .ingest(stream, batch.to_vec(), false, true)
            .await
            .expect("ingest");
    }
}

async fn rows(node: &Node) -> Vec<Vec<Value>> {
    let catalog = catalog();
    let stream = catalog.stream("payments").expect("stream");
    let metric = catalog.metric("m").expect("metric");
    let mut rows = node
        .engine
        .metric_rows(stream, metric, None)
        .await
        .expect("rows");
    rows.sort_by_key(|r| format!("{r:?}"));
    rows
}

fn task() -> TaskId {
    TaskId {
        stream: "payments".into(),
        partitioner: 0,
        partition: 0,
    }
}

/// Sends `from`'s last checkpoint to `to` (with what `to` has, and a fault), and
/// returns the staged result.
fn transfer(
    from: &Node,
    to: &Node,
    have: &[Have],
    fault: Option<Fault>,
) -> eddy_planner::Result<eddy_cluster::node::transfer::Staged> {
    let export = from.storage.export(&task())?.expect("a checkpoint");
    let mut pieces = Vec::new();
    export.send(have, fault, &mut |p| {
        pieces.push(p);
        true
    })?;
    let mut import = to.storage.import(&task())?;
    for p in pieces {
        import.accept(p)?;
    }
    import.finish()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_moves_with_its_checkpoint_and_faults_are_rejected() {
    let a = node("a").await;
    let b = node("b").await;
    // Two hours of events, so the one-hour window has expired chunks behind it.
    ingest(&a, events(0, 7_200)).await;
    a.engine.checkpoint().await.expect("checkpoint");
    let at_checkpoint = rows(&a).await;
    assert_eq!(at_checkpoint.len(), 40);
    // Later events are not in the checkpoint.
    ingest(&a, events(7_200, 7_500)).await;

    // A flipped byte and a cut transfer are rejected.
    let flipped = transfer(&a, &b, &[], Some(Fault::Flip)).expect_err("a flipped byte");
    assert!(flipped.to_string().contains("checksum"), "{flipped}");
    let cut = transfer(&a, &b, &[], Some(Fault::Cut)).expect_err("a cut transfer");
    assert!(cut.to_string().contains("ended early"), "{cut}");
    // Out of order: file data before the state.
    let mut import = b.storage.import(&task()).expect("import");
    let export = a
        .storage
        .export(&task())
        .expect("export")
        .expect("checkpoint");
    let mut first = Vec::new();
    export
        .send(&[], None, &mut |p| {
            first.push(p);
            first.len() < 2
        })
        .expect("send");
    assert!(import.accept(first.remove(1)).is_err());
    // A name that would leave the staging directory.
    let mut import = b.storage.import(&task()).expect("import");
    import.accept(first.remove(0)).expect("header");
    assert!(
        import
            .accept(Piece::StateEnd { entries: 0, crc: 0 })
            .is_err()
            || import
                .accept(Piece::Data {
                    name: "../../x.seg".into(),
                    offset: 0,
                    bytes: vec![1],
                })
                .is_err()
    );
    // Nothing changed on b.
    assert!(rows(&b).await.is_empty());

    // The whole task, then installed: b answers as a did at the checkpoint.
    let staged = transfer(&a, &b, &[], None).expect("a clean transfer");
    assert_eq!(staged.reused, 0);
    let full = staged.received;
    assert!(full > 16 << 10, "several segments travel: {full} bytes");
    b.engine
        .install_task(&task(), staged)
        .await
        .expect("install");
    assert_eq!(rows(&b).await, at_checkpoint);

    // b takes the same later events as a, and stays equal.
    ingest(&b, events(7_200, 7_500)).await;
    assert_eq!(rows(&b).await, rows(&a).await);

    // A newer checkpoint of a reaches b's stale copy as a delta: the segment files b
    // has a prefix of are not sent again.
    ingest(&a, events(7_500, 8_000)).await;
    a.engine.checkpoint().await.expect("checkpoint");
    let expected = rows(&a).await;
    let have = b.storage.have(&task());
    assert!(!have.is_empty());
    let staged = transfer(&a, &b, &have, None).expect("a delta transfer");
    assert!(staged.reused > 0, "nothing was reused");
    assert!(
        staged.received < full,
        "{} of {full} bytes sent again",
        staged.received
    );
    b.engine
        .install_task(&task(), staged)
        .await
        .expect("install");
    assert_eq!(rows(&b).await, expected);

    // A flipped byte in a delta is rejected too.
    ingest(&a, events(8_000, 8_300)).await;
    a.engine.checkpoint().await.expect("checkpoint");
    let have = b.storage.have(&task());
    assert!(transfer(&a, &b, &have, Some(Fault::Flip)).is_err());
    assert_eq!(rows(&b).await, expected);
    a.stop();
    b.stop();
}
