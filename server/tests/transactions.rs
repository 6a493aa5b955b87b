//! A statement whose events go to several Kafka partitions is applied whole or not at
//! all, even when Kafka takes some of its events and not the others.
//!
//! Three brokers of the test's own (`.ci/kafka start-cluster`); Kafka's and Eddy's own
//! topics have three copies, but the stream's topic is made beforehand with one copy
//! per partition, its partitions spread over the three brokers. Once one broker is
//! killed, a statement over every partition can reach only two thirds of them: it
//! fails at its `statement_timeout`, and none of its events may ever be applied, not
//! even after the broker is back.

mod common;

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;

use common::{
    ci_kafka, connect_port, repo, simple_rows, spawn_eddy_with, sqlstate, temp_dir, TempDir,
};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

const PARTITIONS: u32 = 6;

/// The test's brokers, stopped by PID when dropped.
struct Brokers {
    dir: TempDir,
    addrs: String,
}

fn kafka_script(args: &[&str], dir: &std::path::Path) -> String {
    ci_kafka(args, dir, "384m", &[])
}

impl Brokers {
    fn start() -> Brokers {
        let dir = temp_dir("txn-kafka");
        std::fs::create_dir_all(&*dir).unwrap();
        let addrs = kafka_script(&["start-cluster"], &dir);
        Brokers { dir, addrs }
    }

    /// Broker `id` (1, 2 or 3) killed with kill -9.
    fn kill(&self, id: u32) {
        let pid = std::fs::read_to_string(self.dir.join(format!("b{id}/kafka.pid"))).unwrap();
        let status = Command::new("kill")
            .args(["-KILL", pid.trim()])
            .status()
            .unwrap();
        assert!(status.success());
    }

    fn restart(&self, id: u32) {
        kafka_script(&["restart"], &self.dir.join(format!("b{id}")));
    }
}

impl Drop for Brokers {
    fn drop(&mut self) {
        let _ = Command::new(repo().join(".ci/kafka"))
            .arg("stop")
            .arg(&*self.dir)
            .output();
    }
}

/// Two cards per partition of the stream's topic.
fn cards() -> Vec<String> {
    let mut per_partition: BTreeMap<u32, Vec<String>> = BTreeMap::new();
    for i in 0.. {
        let card = format!("c{i}");
        let p = partition_for(&Value::Text(card.as_str().into()), PARTITIONS);
        let cards = per_partition.entry(p).or_default();
        if cards.len() < 2 {
            cards.push(card);
        }
        if per_partition.len() == PARTITIONS as usize
            && per_partition.values().all(|c| c.len() == 2)
        {
            break;
        }
    }
    per_partition.into_values().flatten().collect()
}

/// One INSERT of an event per card, ids from `first`.
fn insert(cards: &[String], first: i64) -> String {
    let rows: Vec<String> = cards
        .iter()
        .enumerate()
        .map(|(i, card)| format!("({}, '2026-01-01 10:00:00', '{card}', 1)", first + i as i64))
        .collect();
    format!(
        "INSERT INTO pay VALUES {} RETURNING card, total.n",
        rows.join(", ")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_kafka_takes_in_part_is_applied_whole_or_not_at_all() {
    let brokers = Brokers::start();
    let cluster = format!("txn{}", std::process::id());
    // The stream's topic: partition p on broker p % 3 + 1 only.
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", &brokers.addrs)
        .create()
        .unwrap();
    let placement: Vec<Vec<i32>> = (0..PARTITIONS as i32).map(|p| vec![p % 3 + 1]).collect();
    let placement: Vec<&[i32]> = placement.iter().map(|v| v.as_slice()).collect();
    let topic = format!("{cluster}.pay.card");
    let made = admin
        .create_topics(
            &[NewTopic::new(
                &topic,
                PARTITIONS as i32,
                TopicReplication::Variable(&placement),
            )],
            &AdminOptions::new().operation_timeout(Some(Duration::from_secs(10))),
        )
        .await
        .unwrap();
    assert!(made[0].is_ok(), "{made:?}");

    let dir = temp_dir("txn-node");
    let (eddy, port) = spawn_eddy_with(
        &dir,
        &[
            "--kafka",
            &brokers.addrs,
            "--cluster",
            &cluster,
            "--kafka-replication",
            "3",
        ],
    );
    let client = connect_port(port).await;
    client
        .batch_execute(&format!(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', partition_by = 'card', \
             partitions = {PARTITIONS}); \
             CREATE METRIC total AS SELECT card, COUNT(*) AS n FROM pay \
             WINDOW INFINITE GROUP BY card;"
        ))
        .await
        .unwrap();
    let cards = cards();

    // All brokers up: the statement is applied whole, one answer per event.
    let rows = simple_rows(&client, &insert(&cards, 0)).await;
    assert_eq!(rows.len(), cards.len());
    assert!(
        rows.iter().all(|r| r[1].as_deref() == Some("1")),
        "{rows:?}"
    );

    // Broker 3 gone: a third of the partitions cannot take their events. The statement
    // fails at its timeout (57014); while the node has not yet seen the broker's loss
    // handled (57P03, nothing sent), it is tried again.
    brokers.kill(3);
    client
        .batch_execute("SET statement_timeout = '3s'")
        .await
        .unwrap();
    let started = Instant::now();
    let mut next = 100;
    let mut codes = Vec::new();
    loop {
        let sql = insert(&cards, next);
        next += 100;
        let err = match client.simple_query(&sql).await {
            Ok(_) => panic!("a statement over a dead broker's partitions succeeded"),
            Err(e) => e,
        };
        let code = sqlstate(&err);
        codes.push(code.clone());
        if code == "57014" {
            break;
        }
        assert_eq!(code, "57P03", "{err:?}");
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no statement reached its timeout: {codes:?}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    eprintln!("failed statements while broker 3 was down: {codes:?}");

    // Broker 3 back: statements succeed again, and the failed ones never show.
    brokers.restart(3);
    client
        .batch_execute("SET statement_timeout = '10s'")
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let sql = insert(&cards, next);
        next += 100;
        match client.simple_query(&sql).await {
            Ok(_) => break,
            Err(e) => {
                eprintln!("after the restart: {e}");
                assert!(started.elapsed() < Duration::from_secs(90), "{e}");
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
    }
    // Two statements succeeded; each card has two events, whatever the failed ones did.
    let want: Vec<Vec<Option<String>>> = {
        let mut sorted = cards.clone();
        sorted.sort();
        sorted
            .into_iter()
            .map(|c| vec![Some(c), Some("2".to_string())])
            .collect()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut got = Vec::new();
    while Instant::now() < deadline {
        got = simple_rows(&client, "SELECT card, n FROM total ORDER BY card").await;
        if got == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(got, want, "a failed statement was applied in part");
    // And it stays so: an aborted transaction's events never come later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rows = simple_rows(&client, "SELECT card, n FROM total ORDER BY card").await;
    assert_eq!(rows, want);
    drop(eddy);
}
