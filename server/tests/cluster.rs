//! A cluster of real `eddy` processes on the real broker of `make test`
//! (`EDDY_TEST_KAFKA`): three nodes standing for three hosts, two copies of every task.
//! Writers insert through every node while one node is killed with kill -9, restarted
//! on its stale data directory, and joined by a fresh fourth node; a cluster is upgraded
//! node by node from format 1; a node restored from its backup rejoins; a node restarted
//! under its own id answers the statements sent while it was down. At the end every
//! acknowledged event was applied exactly once, as every node reads it.
//!
//! On three brokers with three copies of every topic (min.insync.replicas 2, acks=all):
//! `EDDY_TEST_KAFKA=$(.ci/kafka start-cluster DIR) EDDY_TEST_KAFKA_REPLICATION=3
//! cargo test -p eddy-server --test cluster`.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use common::{
    connect_as, connect_port, fails, kafka_addr, simple_rows, spawn_eddy_env, temp_dir, TempDir,
};

/// A node of the test cluster: its process, port and data directory.
struct Node {
    eddy: Option<common::Eddy>,
    port: u16,
    dir: TempDir,
    id: String,
}

fn start_node(cluster: &str, id: &str, dir: TempDir) -> Node {
    start_node_env(cluster, id, dir, &[])
}

fn start_node_env(cluster: &str, id: &str, dir: TempDir, env: &[(&str, &str)]) -> Node {
    let kafka = kafka_addr();
    let host = format!("host-{id}");
    // With three brokers (`.ci/kafka start-cluster`), topics get three copies.
    let replication = std::env::var("EDDY_TEST_KAFKA_REPLICATION").unwrap_or_else(|_| "1".into());
    let (eddy, port) = spawn_eddy_env(
        &dir,
        &[
            "--kafka",
            &kafka,
            "--cluster",
            cluster,
            "--node-id",
            id,
            "--host-id",
            &host,
            "--replicas",
            "2",
            "--kafka-replication",
            &replication,
        ],
        env,
    );
    Node {
        eddy: Some(eddy),
        port,
        dir,
        id: id.to_string(),
    }
}

/// Stops every node still running, with SIGTERM; each data directory goes after its
/// node has stopped.
fn stop_all(nodes: Vec<Node>) {
    for mut n in nodes {
        if let Some(e) = n.eddy.take() {
            e.terminate();
        }
    }
}

/// `SHOW CLUSTER` through `port`: the live node ids.
async fn alive(port: u16) -> BTreeSet<String> {
    let client = connect_port(port).await;
    simple_rows(&client, "SHOW CLUSTER")
        .await
        .into_iter()
        .filter(|r| r[4].as_deref() == Some("t"))
        .map(|r| r[0].clone().unwrap())
        .collect()
}

/// Waits until `port`'s node sees exactly `want` alive and a plan that places every task
/// on them.
async fn await_members(port: u16, want: &[&str]) {
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let seen = alive(port).await;
        let client = connect_port(port).await;
        let tasks = simple_rows(&client, "SHOW TASKS").await;
        let placed = tasks.iter().all(|r| {
            r[3].as_ref().is_some_and(|a| want.contains(a))
                && r[4]
                    .as_deref()
                    .unwrap_or("")
                    .split(',')
                    .filter(|s| !s.is_empty())
                    .all(|s| want.contains(s))
        });
        if seen == want && placed {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the cluster did not settle on {want:?}: alive {seen:?}, tasks {tasks:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// One acknowledged event: (card, amount).
type Acked = Arc<Mutex<BTreeMap<i64, (String, i64)>>>;

/// What the writers share: the next event id, when to stop, and the node killed (whose
/// statements may fail; a live node's may not).
#[derive(Default)]
struct Load {
    next: AtomicI64,
    stop: AtomicBool,
    killed: Mutex<Option<u16>>,
    ports: Mutex<Vec<u16>>,
    acked: Acked,
}

/// Inserts events one per statement through the nodes (starting at `first`) until told to
/// stop. A statement whose node was killed is in doubt: the same event (same id) goes
/// again through the next node, and a retry of an applied event is a duplicate. A
/// statement a live node fails, or leaves unanswered for 45 s (a reply lost in a
/// failover), fails the test.
async fn write(load: Arc<Load>, first: usize) {
    let mut at = first;
    let mut client: Option<(u16, tokio_postgres::Client)> = None;
    while !load.stop.load(Ordering::Acquire) {
        let id = load.next.fetch_add(1, Ordering::AcqRel);
        let card = format!("c{}", id % 17);
        let amount = id % 100;
        let sql =
            format!("INSERT INTO pay VALUES ({id}, '2026-01-01 10:00:00', '{card}', {amount})");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(Instant::now() < deadline, "event {id} never went in");
            if client.is_none() {
                let port = {
                    let ports = load.ports.lock().unwrap();
                    ports[at % ports.len()]
                };
                let conn =
                    format!("host=127.0.0.1 port={port} user=eddy dbname=eddy connect_timeout=2");
                match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(connection);
                        client = Some((port, c));
                    }
                    Err(_) => {
                        at += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            let (port, c) = client.as_ref().unwrap();
            let result = tokio::time::timeout(Duration::from_secs(45), c.simple_query(&sql)).await;
            if let Ok(Ok(_)) = result {
                load.acked.lock().unwrap().insert(id, (card, amount));
                break;
            }
            let dead = *load.killed.lock().unwrap() == Some(*port);
            assert!(
                dead,
                "event {id}: the live node on port {port} failed the statement: {result:?}"
            );
            // In doubt: the same event again, through the next node.
            client = None;
            at += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Starts three writers, one beginning at each node.
fn start_writers(load: &Arc<Load>) -> Vec<tokio::task::JoinHandle<()>> {
    load.stop.store(false, Ordering::Release);
    (0..3)
        .map(|w| tokio::spawn(write(load.clone(), w)))
        .collect()
}

async fn stop_writers(load: &Arc<Load>, writers: Vec<tokio::task::JoinHandle<()>>) {
    load.stop.store(true, Ordering::Release);
    for w in writers {
        w.await.unwrap();
    }
}

/// The metric's rows the acknowledged events make: (card, n, s), by card.
fn model(acked: &Acked) -> Vec<Vec<Option<String>>> {
    let mut want: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (card, amount) in acked.lock().unwrap().values() {
        let e = want.entry(card.clone()).or_default();
        e.0 += 1;
        e.1 += amount;
    }
    want.into_iter()
        .map(|(card, (n, s))| vec![Some(card), Some(n.to_string()), Some(s.to_string())])
        .collect()
}

/// The next `n` rows of a subscription.
async fn next_rows(
    stream: &mut std::pin::Pin<Box<tokio_postgres::SimpleQueryStream>>,
    n: usize,
) -> Vec<Vec<Option<String>>> {
    use futures::StreamExt;
    let mut out = Vec::new();
    while out.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .unwrap_or_else(|_| panic!("only {} of {n} rows arrived: {out:?}", out.len()))
            .expect("the subscription ended")
            .expect("the subscription failed");
        if let tokio_postgres::SimpleQueryMessage::Row(r) = msg {
            // The columns asked for; `changed_at` follows them.
            out.push(common::text_row(&r)[..3].to_vec());
        }
    }
    out
}

/// Every node answers every group exactly as the acknowledged events say.
async fn check_every_node(ports: &[u16], acked: &Acked) {
    let want = model(acked);
    for &port in ports {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let client = connect_port(port).await;
            let got = client
                .simple_query("SELECT card, n, s FROM total ORDER BY card")
                .await
                .map(|m| {
                    m.iter()
                        .filter_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(r) => Some(common::text_row(r)),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                });
            match got {
                Ok(got) if got == want => break,
                other => assert!(
                    Instant::now() < deadline,
                    "node on port {port} reads {other:?}, the acknowledged events say {want:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
}

/// Creates the test's stream and metric through the first node, and waits until every
/// node learned them (DDL made on one node reaches the others while they run).
async fn create_and_learn(nodes: &[Node]) {
    let client = connect_port(nodes[0].port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', \
             partitions = 12); \
             CREATE METRIC total AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay \
             WINDOW INFINITE GROUP BY card; \
             CREATE ROLE watcher LOGIN; GRANT SELECT ON METRIC total TO watcher;",
        )
        .await
        .unwrap();
    // Roles and grants reach every node too: `watcher` reads the metric, not the stream
    // (the role and its grant come in two catalog changes).
    for n in nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = connect_port(n.port).await;
            let learned = simple_rows(&c, "SHOW METRICS").await.len() == 1 && {
                let watcher = connect_as(n.port, "watcher", None).await.unwrap();
                fails(&watcher, "SELECT * FROM pay").await.as_deref() == Some("42501")
                    && fails(&watcher, "SELECT * FROM total").await.is_none()
            };
            if learned {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} never learned the metric and its grant",
                n.id
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Two nodes that send corrupt checkpoints (one flips a byte, one cuts the transfer
/// short); a third joins and recovers its tasks from them. Every transfer is rejected,
/// the partitions replay from Kafka instead, and once a faulty node is killed, the new
/// node's copies answer exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_or_cut_transfers_are_rejected_and_recovery_still_succeeds() {
    let cluster = format!("faults{}", std::process::id());
    let mut nodes = vec![
        start_node_env(
            &cluster,
            "n1",
            temp_dir("faults-n1"),
            &[("EDDY_TRANSFER_FAULT", "flip")],
        ),
        start_node_env(
            &cluster,
            "n2",
            temp_dir("faults-n2"),
            &[("EDDY_TRANSFER_FAULT", "cut")],
        ),
    ];
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &["n1", "n2"]).await;
    let load = Arc::new(Load::default());
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    let writers = start_writers(&load);
    tokio::time::sleep(Duration::from_secs(3)).await;
    stop_writers(&load, writers).await;
    // Checkpoints every 0.2 s: both nodes have the events in one by now.
    tokio::time::sleep(Duration::from_secs(1)).await;

    nodes.push(start_node(&cluster, "n3", temp_dir("faults-n3")));
    await_members(nodes[0].port, &["n1", "n2", "n3"]).await;
    let all: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    check_every_node(&all, &load.acked).await;
    let said = nodes[2].eddy.as_ref().unwrap().output().join("\n");
    assert!(
        said.contains("checksum does not match"),
        "n3 did not reject a flipped byte:\n{said}"
    );
    assert!(
        said.contains("ended early"),
        "n3 did not reject a cut transfer:\n{said}"
    );
    assert!(
        !said.contains("recovered from node"),
        "n3 installed a faulty transfer:\n{said}"
    );

    // n1 dies: its tasks go to their other copies, some of them n3's replayed ones.
    let mut killed = nodes[0].eddy.take().unwrap();
    killed.0.kill().unwrap();
    let _ = killed.0.wait();
    await_members(nodes[1].port, &["n2", "n3"]).await;
    check_every_node(&all[1..], &load.acked).await;
    let client = connect_port(nodes[2].port).await;
    let active_on_n3 = simple_rows(&client, "SHOW TASKS")
        .await
        .iter()
        .filter(|r| r[3].as_deref() == Some("n3"))
        .count();
    assert!(active_on_n3 > 0, "n3 took over nothing");
    stop_all(nodes);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_and_applies_nothing_twice() {
    let cluster = format!("failover{}", std::process::id());
    let mut nodes: Vec<Node> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| start_node(&cluster, id, temp_dir(&format!("cluster-{id}"))))
        .collect();
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &["n1", "n2", "n3"]).await;

    let load = Arc::new(Load::default());
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    let seed = rand::rng().random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    eprintln!("cluster test seed {seed}");

    // Load through all three nodes; n2 dies with kill -9 at a random moment, and the load
    // goes on past the session timeout, through the failover.
    let writers = start_writers(&load);
    tokio::time::sleep(Duration::from_millis(rng.random_range(300..2000))).await;
    *load.killed.lock().unwrap() = Some(nodes[1].port);
    let mut killed = nodes[1].eddy.take().unwrap();
    killed.0.kill().unwrap();
    let _ = killed.0.wait();
    let before = load.acked.lock().unwrap().len();
    tokio::time::sleep(Duration::from_secs(10)).await;
    stop_writers(&load, writers).await;
    let during = load.acked.lock().unwrap().len() - before;
    eprintln!("acknowledged: {before} before the kill, {during} after");
    assert!(during > 0, "nothing was acknowledged after the kill");
    await_members(nodes[0].port, &["n1", "n3"]).await;
    check_every_node(&[nodes[0].port, nodes[2].port], &load.acked).await;

    // n2 comes back on its stale data directory, then a fresh n4 joins, under load.
    let dir = std::mem::replace(&mut nodes[1].dir, temp_dir("cluster-n2-unused"));
    nodes[1] = start_node(&cluster, "n2", dir);
    *load.killed.lock().unwrap() = None;
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    let writers = start_writers(&load);
    await_members(nodes[0].port, &["n1", "n2", "n3"]).await;
    nodes.push(start_node(&cluster, "n4", temp_dir("cluster-n4")));
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    await_members(nodes[0].port, &["n1", "n2", "n3", "n4"]).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    // n1, the leader, stops with SIGTERM under load: its tasks move to their replicas
    // before it leaves. (Statements on its own connections may fail as it closes them.)
    *load.killed.lock().unwrap() = Some(nodes[0].port);
    let n1 = nodes[0].eddy.take().unwrap();
    let said = tokio::task::spawn_blocking(move || n1.terminate())
        .await
        .unwrap();
    assert!(
        said.iter().any(|l| l.contains("handed over")),
        "n1 did not hand its tasks over:\n{}",
        said.join("\n")
    );
    *load.ports.lock().unwrap() = nodes[1..].iter().map(|n| n.port).collect();
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_writers(&load, writers).await;
    await_members(nodes[1].port, &["n2", "n3", "n4"]).await;

    let all: Vec<u16> = nodes[1..].iter().map(|n| n.port).collect();
    check_every_node(&all, &load.acked).await;

    // A subscription through n4, which holds a copy of only some tasks, sees every group
    // once: the other tasks' rows and changes come from the nodes they are active on.
    let sub = connect_port(nodes[3].port).await;
    let mut changes = Box::pin(
        sub.simple_query_raw("SELECT card, n, s FROM total EMIT CHANGES")
            .await
            .unwrap(),
    );
    let want = model(&load.acked);
    let mut snapshot = next_rows(&mut changes, want.len()).await;
    snapshot.sort();
    assert_eq!(snapshot, want, "the subscription's first rows");
    let writer = connect_port(nodes[1].port).await;
    for card in want.iter().map(|r| r[0].clone().unwrap()) {
        let id = load.next.fetch_add(1, Ordering::AcqRel);
        writer
            .simple_query(&format!(
                "INSERT INTO pay VALUES ({id}, '2026-01-01 10:00:00', '{card}', 1)"
            ))
            .await
            .unwrap();
        load.acked.lock().unwrap().insert(id, (card, 1));
    }
    let mut changed = next_rows(&mut changes, want.len()).await;
    changed.sort();
    assert_eq!(
        changed,
        model(&load.acked),
        "one change per group, with its new values"
    );
    // n4 got its tasks' checkpoints from peers (with nothing of its own to start from).
    let said = nodes[3].eddy.as_ref().unwrap().output();
    let recovered: Vec<&String> = said
        .iter()
        .filter(|l| l.contains("recovered from node"))
        .collect();
    eprintln!(
        "n4: {}",
        recovered
            .iter()
            .map(|l| l.as_str())
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert!(
        !recovered.is_empty(),
        "n4 recovered nothing from a peer:\n{}",
        said.join("\n")
    );
    // n2 came back stale: peers had newer checkpoints of its tasks, and it took them
    // (with the segment files it still had kept, where they match).
    let said = nodes[1].eddy.as_ref().unwrap().output();
    let recovered: Vec<&String> = said
        .iter()
        .filter(|l| l.contains("recovered from node"))
        .collect();
    for line in &recovered {
        eprintln!("n2: {line}");
    }
    assert!(
        !recovered.is_empty(),
        "n2 recovered nothing from a peer:\n{}",
        said.join("\n")
    );
    let issued = load.next.load(Ordering::Acquire) as usize;
    assert_eq!(
        load.acked.lock().unwrap().len(),
        issued,
        "every event was acknowledged"
    );
    // Each task has two copies on two hosts, once the last rebalance has settled (a
    // copy being recovered is not listed until it holds the task).
    let client = connect_port(nodes[3].port).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let rows = simple_rows(&client, "SHOW TASKS").await;
        let bad = rows.iter().find(|row| {
            let active = row[3].clone().unwrap_or_default();
            let replicas = row[4].clone().unwrap_or_default();
            active.is_empty() || replicas.is_empty() || replicas.split(',').any(|r| r == active)
        });
        match bad {
            None => break,
            Some(row) if Instant::now() > deadline => panic!("a task without two copies: {row:?}"),
            Some(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    stop_all(nodes);
}

/// `SHOW CLUSTER` through `port`: (the format each live node reads, by node id; the format
/// the node on `port` writes).
async fn formats(port: u16) -> (BTreeMap<String, i32>, i32) {
    let client = connect_port(port).await;
    let rows = simple_rows(&client, "SHOW CLUSTER").await;
    let number = |c: &Option<String>| c.as_deref().and_then(|v| v.parse::<i32>().ok());
    let reads = rows
        .iter()
        .filter(|r| r[4].as_deref() == Some("t"))
        .map(|r| (r[0].clone().unwrap(), number(&r[9]).expect("format")))
        .collect();
    let writes = rows
        .iter()
        .find_map(|r| number(&r[10]))
        .expect("writes_format");
    (reads, writes)
}

/// A rolling upgrade under load. Three nodes start as the builds before format versions
/// did (`EDDY_WRITE_FORMAT=1`: no record or transfer tagged, no `FORMAT` file), and each in
/// turn stops with SIGTERM and starts again on its data directory as this build, while
/// writers insert through every node. While an old node lives the new ones write format 1,
/// which it reads; once every node is new, all write this build's format (`FORMAT`). Every
/// acknowledged event counts exactly once on every node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rolling_upgrade_under_load_loses_nothing_and_applies_nothing_twice() {
    let cluster = format!("rolling{}", std::process::id());
    let ids = ["n1", "n2", "n3"];
    let old = [("EDDY_WRITE_FORMAT", "1")];
    let mut nodes: Vec<Node> = ids
        .iter()
        .map(|id| start_node_env(&cluster, id, temp_dir(&format!("rolling-{id}")), &old))
        .collect();
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &ids).await;
    assert_eq!(
        formats(nodes[0].port).await.1,
        1,
        "an old node writes format 1"
    );

    let load = Arc::new(Load::default());
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    let writers = start_writers(&load);
    tokio::time::sleep(Duration::from_secs(1)).await;
    for i in 0..nodes.len() {
        // The node's own connections may fail as it stops (the writers retry elsewhere).
        *load.killed.lock().unwrap() = Some(nodes[i].port);
        let stopping = nodes[i].eddy.take().unwrap();
        tokio::task::spawn_blocking(move || stopping.terminate())
            .await
            .unwrap();
        let unused = temp_dir(&format!("rolling-unused-{i}"));
        let dir = std::mem::replace(&mut nodes[i].dir, unused);
        nodes[i] = start_node(&cluster, ids[i], dir);
        *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
        await_members(nodes[i].port, &ids).await;
        let (reads, writes) = formats(nodes[i].port).await;
        eprintln!("after upgrading {}: formats read {reads:?}", ids[i]);
        if i + 1 < nodes.len() {
            assert_eq!(writes, 1, "{} writes format 1 while old nodes live", ids[i]);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stop_writers(&load, writers).await;

    let all: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    check_every_node(&all, &load.acked).await;
    let issued = load.next.load(Ordering::Acquire) as usize;
    assert_eq!(
        load.acked.lock().unwrap().len(),
        issued,
        "every event was acknowledged"
    );
    let newest = eddy_cluster::format::FORMAT as i32;
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (reads, writes) = formats(n.port).await;
            if writes == newest && reads.values().all(|&f| f == newest) {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{} writes format {writes} with every node new: {reads:?}",
                n.id
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let marked = std::fs::read_to_string(n.dir.join("FORMAT")).unwrap();
        assert_eq!(
            marked.trim(),
            newest.to_string(),
            "{}'s data directory",
            n.id
        );
    }
    stop_all(nodes);
}

/// A node restored from its own backup joins its cluster. Under load, n2 takes a backup,
/// goes on for a while, dies with kill -9 and loses its data directory; it starts again on
/// the backup, catches up from Kafka and its peers, and holds copies of tasks again. Every
/// node then answers exactly what the acknowledged events say.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restored_from_its_backup_rejoins_its_cluster() {
    let cluster = format!("restore{}", std::process::id());
    let ids = ["n1", "n2", "n3"];
    let mut nodes: Vec<Node> = ids
        .iter()
        .map(|id| start_node(&cluster, id, temp_dir(&format!("restore-{id}"))))
        .collect();
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &ids).await;

    let load = Arc::new(Load::default());
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    let writers = start_writers(&load);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let backup = temp_dir("restore-backup");
    let client = connect_port(nodes[1].port).await;
    let row = simple_rows(&client, &format!("BACKUP TO '{}'", backup.display())).await;
    let files: u64 = row[0][1].as_deref().unwrap().parse().unwrap();
    assert!(files > 0, "the backup wrote no file: {row:?}");
    drop(client);
    // Events acknowledged after the backup are in Kafka only, as far as n2 is concerned.
    tokio::time::sleep(Duration::from_secs(2)).await;
    *load.killed.lock().unwrap() = Some(nodes[1].port);
    let mut killed = nodes[1].eddy.take().unwrap();
    killed.0.kill().unwrap();
    let _ = killed.0.wait();
    await_members(nodes[0].port, &["n1", "n3"]).await;
    // Its data directory is gone; it starts on the backup.
    drop(std::mem::replace(
        &mut nodes[1].dir,
        temp_dir("restore-unused"),
    ));
    nodes[1] = start_node(&cluster, "n2", backup);
    *load.ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    await_members(nodes[1].port, &ids).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    stop_writers(&load, writers).await;

    let all: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    check_every_node(&all, &load.acked).await;
    let client = connect_port(nodes[1].port).await;
    let held = simple_rows(&client, "SHOW TASKS")
        .await
        .iter()
        .filter(|r| {
            r[3].as_deref() == Some("n2")
                || r[4].as_deref().unwrap_or("").split(',').any(|n| n == "n2")
        })
        .count();
    assert!(held > 0, "the restored n2 holds no task");
    stop_all(nodes);
}

/// A node killed with kill -9 and restarted under its own id before its session ends
/// keeps its tasks (static membership). Statements sent through the other node for those
/// tasks while it was down are applied by the other node's replicas, which checkpoint
/// them; the restarted node must still answer them, not resume past them from that
/// checkpoint and leave them waiting until they fail with 40003.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_sent_while_a_node_restarts_under_its_own_id_are_answered() {
    let cluster = format!("restart{}", std::process::id());
    // A long session, so the leader never counts n1 gone while it restarts: only n1's
    // restarted process can answer for its tasks.
    let session = [("EDDY_SESSION_TIMEOUT", "30")];
    let mut nodes: Vec<Node> = ["n1", "n2"]
        .iter()
        .map(|id| start_node_env(&cluster, id, temp_dir(&format!("restart-{id}")), &session))
        .collect();
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &["n1", "n2"]).await;
    let client = connect_port(nodes[1].port).await;
    let on_n1 = simple_rows(&client, "SHOW TASKS")
        .await
        .iter()
        .filter(|r| r[3].as_deref() == Some("n1"))
        .count();
    assert!(on_n1 > 0, "n1 is active for no task");

    let mut killed = nodes[0].eddy.take().unwrap();
    killed.0.kill().unwrap();
    let _ = killed.0.wait();
    // One statement per card through n2: 48 cards reach most of the 12 tasks.
    let mut sent = Vec::new();
    for card in 0..48 {
        let port = nodes[1].port;
        sent.push(tokio::spawn(async move {
            let c = connect_port(port).await;
            let sql = format!(
                "INSERT INTO pay VALUES ({}, '2026-01-01 10:00:00', 'r{card}', 7) RETURNING total.n",
                1_000_000 + card
            );
            (card, c.simple_query(&sql).await.map_err(|e| format!("{e:?}")))
        }));
    }
    // n2's copies apply them and checkpoint (every 0.2 s) before n1 comes back.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let dir = std::mem::replace(&mut nodes[0].dir, temp_dir("restart-n1-unused"));
    nodes[0] = start_node_env(&cluster, "n1", dir, &session);
    for s in sent {
        let (card, result) = s.await.unwrap();
        let rows = result.unwrap_or_else(|e| panic!("the insert of card r{card}: {e}"));
        let n = rows.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        });
        assert_eq!(n.as_deref(), Some("1"), "card r{card}'s count");
    }
    stop_all(nodes);
}

/// A metric's history and AS OF read through either node of two: each task's part is
/// read on the node where it is active, and equals what RETURNING gave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_is_read_where_each_task_is_active() {
    let cluster = format!("history{}", std::process::id());
    let nodes: Vec<Node> = ["n1", "n2"]
        .iter()
        .map(|id| start_node(&cluster, id, temp_dir(&format!("history-{id}"))))
        .collect();
    create_and_learn(&nodes).await;
    await_members(nodes[0].port, &["n1", "n2"]).await;
    let tasks = simple_rows(&connect_port(nodes[0].port).await, "SHOW TASKS").await;
    for id in ["n1", "n2"] {
        assert!(
            tasks.iter().any(|r| r[3].as_deref() == Some(id)),
            "{id} is active for no task: {tasks:?}"
        );
    }
    let client = connect_port(nodes[0].port).await;
    // Per card (each card's task applies its events in this order): (id, ts, n, s).
    let mut expected: BTreeMap<String, Vec<Vec<Option<String>>>> = BTreeMap::new();
    for chunk in 0..6i64 {
        let values: Vec<String> = (chunk * 100..chunk * 100 + 100)
            .map(|i| {
                format!(
                    "({i}, '2026-01-01 10:{:02}:{:02}', 'h{}', {i})",
                    i / 60,
                    i % 60,
                    i % 40
                )
            })
            .collect();
        let sql = format!("INSERT INTO pay VALUES {} RETURNING *", values.join(", "));
        for row in simple_rows(&client, &sql).await {
            let card = row[2].clone().unwrap();
            expected.entry(card.clone()).or_default().push(vec![
                row[0].clone(),
                row[1].clone(),
                Some(card),
                row[4].clone(),
                row[5].clone(),
            ]);
        }
    }
    for node in &nodes {
        let c = connect_port(node.port).await;
        let mut got: BTreeMap<String, Vec<Vec<Option<String>>>> = BTreeMap::new();
        for row in simple_rows(&c, "SELECT * FROM history('total')").await {
            got.entry(row[2].clone().unwrap()).or_default().push(row);
        }
        assert_eq!(got, expected, "history through {}", node.id);
        // At 10:05:00, T = 10:05:00 (event 300 is the last applied before 10:05:01).
        let rows = simple_rows(
            &c,
            "SELECT card, n, s FROM total AS OF TIMESTAMP '2026-01-01 10:05:00' ORDER BY card",
        )
        .await;
        assert_eq!(rows.len(), 40, "AS OF through {}", node.id);
        for r in rows {
            let card = r[0].as_deref().unwrap();
            let k: i64 = card[1..].parse().unwrap();
            let ids: Vec<i64> = (0..=300).filter(|i| i % 40 == k).collect();
            assert_eq!(
                r[1],
                Some(ids.len().to_string()),
                "{card} through {}",
                node.id
            );
            assert_eq!(r[2], Some(ids.iter().sum::<i64>().to_string()), "{card}");
        }
    }
    stop_all(nodes);
}
