//! A cluster of real `eddy` processes on the real broker of `make test`
//! (`EDDY_TEST_KAFKA`): three nodes standing for three hosts, two copies of every task.
//! Writers insert through every node while one node is killed with kill -9, restarted
//! on its stale data directory, and joined by a fresh fourth node. At the end every
//! acknowledged event was applied exactly once, as every node reads it.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};

use common::{connect_port, kafka_addr, simple_rows, spawn_eddy_with, temp_dir, TempDir};

/// A node of the test cluster: its process, port and data directory.
struct Node {
    eddy: Option<common::Eddy>,
    port: u16,
    dir: TempDir,
    id: String,
}

fn start_node(cluster: &str, id: &str, dir: TempDir) -> Node {
    let kafka = kafka_addr();
    let host = format!("host-{id}");
    let (eddy, port) = spawn_eddy_with(
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
        ],
    );
    Node {
        eddy: Some(eddy),
        port,
        dir,
        id: id.to_string(),
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

/// Inserts events `ids` through the nodes on `ports` (starting at `first`), moving to the
/// next node and retrying the same event (same id) when a statement fails.
async fn write(ports: Arc<Mutex<Vec<u16>>>, first: usize, ids: Vec<i64>, acked: Acked) {
    let mut at = first;
    let mut client: Option<tokio_postgres::Client> = None;
    for id in ids {
        let card = format!("c{}", id % 17);
        let amount = id % 100;
        let sql = format!(
            "INSERT INTO pay VALUES ({id}, '2026-01-01 10:00:00', '{card}', {amount})"
        );
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            assert!(Instant::now() < deadline, "event {id} never went in");
            if client.is_none() {
                let port = {
                    let ports = ports.lock().unwrap();
                    ports[at % ports.len()]
                };
                let conn = format!(
                    "host=127.0.0.1 port={port} user=eddy dbname=eddy connect_timeout=2"
                );
                match tokio_postgres::connect(&conn, tokio_postgres::NoTls).await {
                    Ok((c, connection)) => {
                        tokio::spawn(connection);
                        client = Some(c);
                    }
                    Err(_) => {
                        at += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                }
            }
            let c = client.as_ref().unwrap();
            match tokio::time::timeout(Duration::from_secs(90), c.simple_query(&sql)).await {
                Ok(Ok(_)) => {
                    acked.lock().unwrap().insert(id, (card, amount));
                    break;
                }
                // In doubt: the same event again, through the next node.
                _ => {
                    client = None;
                    at += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }
}

/// Writes `ids` split over three writers, one starting at each node.
async fn write_all(ports: &Arc<Mutex<Vec<u16>>>, ids: std::ops::Range<i64>, acked: &Acked) {
    let mut writers = Vec::new();
    for w in 0..3 {
        let mine: Vec<i64> = ids.clone().filter(|i| i % 3 == w).collect();
        writers.push(tokio::spawn(write(
            ports.clone(),
            w as usize,
            mine,
            acked.clone(),
        )));
    }
    for w in writers {
        w.await.unwrap();
    }
}

/// Every node answers every group exactly as the acknowledged events say.
async fn check_every_node(ports: &[u16], acked: &Acked) {
    let mut want: BTreeMap<String, (i64, i64)> = BTreeMap::new();
    for (card, amount) in acked.lock().unwrap().values() {
        let e = want.entry(card.clone()).or_default();
        e.0 += 1;
        e.1 += amount;
    }
    let want: Vec<Vec<Option<String>>> = want
        .into_iter()
        .map(|(card, (n, s))| vec![Some(card), Some(n.to_string()), Some(s.to_string())])
        .collect();
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
                            tokio_postgres::SimpleQueryMessage::Row(r) => {
                                Some(common::text_row(r))
                            }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_killed_under_load_loses_nothing_and_applies_nothing_twice() {
    let cluster = format!("failover{}", std::process::id());
    let mut nodes: Vec<Node> = ["n1", "n2", "n3"]
        .iter()
        .map(|id| start_node(&cluster, id, temp_dir(&format!("cluster-{id}"))))
        .collect();
    let client = connect_port(nodes[0].port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', \
             partitions = 6); \
             CREATE METRIC total AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay \
             WINDOW INFINITE GROUP BY card;",
        )
        .await
        .unwrap();
    // DDL made on one node reaches the others while they run.
    for n in &nodes {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let c = connect_port(n.port).await;
            if simple_rows(&c, "SHOW METRICS").await.len() == 1 {
                break;
            }
            assert!(Instant::now() < deadline, "{} never learned the metric", n.id);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    await_members(nodes[0].port, &["n1", "n2", "n3"]).await;

    let ports = Arc::new(Mutex::new(nodes.iter().map(|n| n.port).collect::<Vec<_>>()));
    let acked: Acked = Arc::default();
    let seed = rand::rng().random::<u64>();
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    eprintln!("cluster test seed {seed}");

    // Load through all three nodes; n2 dies with kill -9 at a random moment.
    let kill_after = Duration::from_millis(rng.random_range(200..1500));
    let load = {
        let (ports, acked) = (ports.clone(), acked.clone());
        tokio::spawn(async move { write_all(&ports, 0..600, &acked).await })
    };
    tokio::time::sleep(kill_after).await;
    let mut killed = nodes[1].eddy.take().unwrap();
    killed.0.kill().unwrap();
    let _ = killed.0.wait();
    load.await.unwrap();
    await_members(nodes[0].port, &["n1", "n3"]).await;
    check_every_node(&[nodes[0].port, nodes[2].port], &acked).await;

    // n2 comes back on its stale data directory, then a fresh n4 joins.
    let dir = std::mem::replace(&mut nodes[1].dir, temp_dir("cluster-n2-unused"));
    nodes[1] = start_node(&cluster, "n2", dir);
    await_members(nodes[0].port, &["n1", "n2", "n3"]).await;
    nodes.push(start_node(&cluster, "n4", temp_dir("cluster-n4")));
    *ports.lock().unwrap() = nodes.iter().map(|n| n.port).collect();
    write_all(&ports, 600..900, &acked).await;
    await_members(nodes[0].port, &["n1", "n2", "n3", "n4"]).await;

    let all: Vec<u16> = nodes.iter().map(|n| n.port).collect();
    check_every_node(&all, &acked).await;
    assert_eq!(acked.lock().unwrap().len(), 900);
    // Each task has two copies on two hosts.
    let client = connect_port(nodes[3].port).await;
    for row in simple_rows(&client, "SHOW TASKS").await {
        let (active, replicas) = (row[3].clone().unwrap(), row[4].clone().unwrap());
        assert!(
            !replicas.is_empty() && !replicas.split(',').any(|r| r == active),
            "{row:?}"
        );
    }
    for n in nodes {
        if let Some(e) = n.eddy {
            e.terminate();
        }
    }
}
