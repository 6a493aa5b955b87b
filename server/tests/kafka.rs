//! Cluster mode on the real Kafka broker of `make test` (`EDDY_TEST_KAFKA`): a real
//! `eddy serve --kafka` process, driven over the PostgreSQL protocol, and checked from
//! the Kafka side with a plain Kafka client. Each test names its own cluster, so the
//! tests share the broker without seeing each other's topics.

mod common;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{Offset, TopicPartitionList};

use common::{
    connect_port, kafka_addr, refused_start, simple_rows, spawn_eddy_env, spawn_eddy_with, temp_dir,
};
use eddy_cluster::route::partition_for;
use eddy_planner::types::Value;

fn cluster(name: &str) -> String {
    format!("{name}{}", std::process::id())
}

/// `eddy serve --kafka` in `cluster`, with its PostgreSQL port and its HTTP address.
fn spawn_kafka_eddy(dir: &std::path::Path, cluster: &str) -> (common::Eddy, u16, String) {
    spawn_kafka_eddy_env(dir, cluster, &[])
}

/// `spawn_kafka_eddy` with more environment variables.
fn spawn_kafka_eddy_env(
    dir: &std::path::Path,
    cluster: &str,
    env: &[(&str, &str)],
) -> (common::Eddy, u16, String) {
    let http = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let kafka = kafka_addr();
    let (eddy, port) = spawn_eddy_env(
        dir,
        &[
            "--kafka",
            &kafka,
            "--cluster",
            cluster,
            "--http-addr",
            &http,
        ],
        env,
    );
    (eddy, port, http)
}

fn ts(i: i64) -> String {
    format!("2026-01-01 00:{:02}:{:02}", i / 60 % 60, i % 60)
}

/// A record read back: (partition, key, payload, headers).
type Record = (i32, String, Vec<u8>, HashMap<String, String>);

/// Every record of a topic.
fn read_topic(topic: &str) -> Vec<Record> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", kafka_addr())
        .set("group.id", format!("test-reader-{}", std::process::id()))
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .create()
        .unwrap();
    let meta = consumer
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .unwrap();
    let partitions = meta.topics()[0].partitions().len() as i32;
    assert!(partitions > 0, "topic {topic} does not exist");
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition_offset(topic, p, Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&tpl).unwrap();
    // Read to each partition's end (`enable.partition.eof`): offsets do not count
    // records, since transaction markers take offsets too.
    let mut out = Vec::new();
    let mut at_end = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while at_end.len() < partitions as usize && Instant::now() < deadline {
        if let Some(m) = consumer.poll(Duration::from_millis(100)) {
            let m = match m {
                Err(rdkafka::error::KafkaError::PartitionEOF(p)) => {
                    at_end.insert(p);
                    continue;
                }
                m => m.unwrap(),
            };
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            let v = String::from_utf8_lossy(h.value.unwrap_or_default());
                            (h.key.to_string(), v.into_owned())
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push((
                m.partition(),
                String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned(),
                m.payload().unwrap_or_default().to_vec(),
                headers,
            ));
        }
    }
    out
}

/// The events of a task record: one after another (a lone event, or a statement's run
/// of events for one task packed in one record).
fn events_of(payload: &[u8]) -> Vec<Vec<Value>> {
    let mut r = eddy_planner::codec::Reader(payload);
    let mut events = Vec::new();
    while !r.is_empty() {
        events.push(eddy_planner::codec::read_row(&mut r).expect("an event"));
    }
    assert!(!events.is_empty(), "a record without events");
    events
}

/// Polls `sql` until its rows equal `want` (the node applies Kafka records on its own
/// schedule); fails after 60 s with the last rows seen.
async fn eventually(client: &tokio_postgres::Client, sql: &str, want: &[Vec<Option<String>>]) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got = simple_rows(client, sql).await;
        if got == want {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{sql}: got {got:?}, want {want:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn row(cells: &[&str]) -> Vec<Option<String>> {
    cells.iter().map(|c| Some(c.to_string())).collect()
}

/// INSERT … RETURNING goes out to one topic per partitioner, keyed like Kafka's default
/// partitioner, and the answers of both partitioners' tasks come back as one row.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn insert_returning_gathers_every_partitioner_through_kafka() {
    let dir = temp_dir("kafka-returning");
    let cluster = cluster("ret");
    let kafka = kafka_addr();
    let (eddy, port) = spawn_eddy_with(&dir, &["--kafka", &kafka, "--cluster", &cluster]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             merchant TEXT NOT NULL, amount BIGINT) WITH (event_time = 'ts', \
             partition_by = 'card, merchant', partitions = 3); \
             CREATE METRIC by_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS total \
             FROM pay WINDOW INFINITE GROUP BY card; \
             CREATE METRIC by_merchant AS SELECT merchant, COUNT(*) AS n \
             FROM pay WINDOW INFINITE GROUP BY merchant;",
        )
        .await
        .unwrap();
    let mut by_card: HashMap<String, (i64, i64)> = HashMap::new();
    let mut by_merchant: HashMap<String, i64> = HashMap::new();
    for i in 0..60i64 {
        let (card, merchant, amount) = (format!("c{}", i % 7), format!("m{}", i % 4), i * 3);
        let got = simple_rows(
            &client,
            &format!(
                "INSERT INTO pay VALUES ({i}, '{}', '{card}', '{merchant}', {amount}) \
                 RETURNING id, by_card.n, by_card.total, by_merchant.n",
                ts(i)
            ),
        )
        .await;
        let c = by_card.entry(card.clone()).or_default();
        c.0 += 1;
        c.1 += amount;
        let m = by_merchant.entry(merchant.clone()).or_default();
        *m += 1;
        let want = row(&[
            &i.to_string(),
            &c.0.to_string(),
            &c.1.to_string(),
            &m.to_string(),
        ]);
        assert_eq!(got, vec![want], "event {i}");
    }
    // A multi-row statement: one answer per event, in VALUES order.
    let got = simple_rows(
        &client,
        "INSERT INTO pay VALUES (100, '2026-01-01 01:00:00', 'c0', 'm0', 1), \
         (101, '2026-01-01 01:00:01', 'c0', 'm1', 1) RETURNING id, by_card.n",
    )
    .await;
    let n0 = by_card["c0"].0;
    assert_eq!(
        got,
        vec![
            row(&["100", &(n0 + 1).to_string()]),
            row(&["101", &(n0 + 2).to_string()])
        ]
    );
    // Bad input fails the statement and leaves the connection usable.
    let err = client
        .simple_query("INSERT INTO pay VALUES (102, NULL, 'c1', 'm1', 1)")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "23502", "{err}");
    let err = client
        .simple_query("CREATE STREAM bad (ts TIMESTAMP) WITH (event_time = 'ts', format = 'avro')")
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "22023", "{err}");
    eventually(&client, "SELECT count(*) FROM pay", &[row(&["62"])]).await;

    // The Kafka side: every event once in each partitioner's topic, on the partition
    // Kafka's default partitioner picks for its partitioner value. A lone event is keyed
    // by that value; the multi-row statement's two events share one record, unkeyed,
    // where they go to one task (both of card c0; merchants m0 and m1 if they do).
    let together = |a: &str, b: &str| {
        partition_for(&Value::Text(a.into()), 3) == partition_for(&Value::Text(b.into()), 3)
    };
    for (topic, col, records_want) in [
        (format!("{cluster}.pay.card"), 2, 61),
        (
            format!("{cluster}.pay.merchant"),
            3,
            62 - together("m0", "m1") as usize,
        ),
    ] {
        let records = read_topic(&topic);
        assert_eq!(records.len(), records_want, "{topic}");
        let mut events = 0;
        for (partition, key, payload, headers) in records {
            let packed = events_of(&payload);
            for event in &packed {
                let value = event[col].to_text().unwrap();
                if packed.len() == 1 {
                    assert_eq!(value, key);
                } else {
                    assert_eq!(key, "", "a packed record has no key");
                }
                assert_eq!(
                    partition as u32,
                    partition_for(&Value::Text(value.as_str().into()), 3)
                );
            }
            events += packed.len();
            assert_eq!(
                headers["eddy-reply"],
                format!("{cluster}-replies.{}", node_id(&dir))
            );
        }
        assert_eq!(events, 62, "{topic}");
    }
    drop(eddy);
}

/// A node in a cluster of its own, with a stream `pay` of `partitions` partitions by card
/// and a metric `by_card` counting each card's events; its data directory, PostgreSQL
/// port, HTTP address and cluster name.
async fn counting_node(
    name: &str,
    partitions: u32,
) -> (common::TempDir, common::Eddy, u16, String, String) {
    let dir = temp_dir(&format!("kafka-{name}"));
    let cluster = cluster(name);
    let (eddy, port, http) = spawn_kafka_eddy(&dir, &cluster);
    connect_port(port)
        .await
        .batch_execute(&format!(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = {partitions}); \
             CREATE METRIC by_card AS SELECT card, COUNT(*) AS n FROM pay \
             WINDOW INFINITE GROUP BY card;"
        ))
        .await
        .unwrap();
    (dir, eddy, port, http, cluster)
}

/// A single-record statement is applied on its own node as Kafka acknowledges it, not
/// only once the task consumer reads it back (`Acks`), and the consumer skips it then.
/// With clients racing on shared cards, both paths hand records over: each event is
/// still applied exactly once and in offset order, so the counts the statements got
/// back for a card are exactly 1..=n, and n is the card's count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn own_statements_apply_at_acknowledgement_exactly_once() {
    let (_dir, eddy, port, http, _) = counting_node("ack", 2).await;
    let client = connect_port(port).await;
    let (clients, each, cards) = (6i64, 40i64, 5i64);
    let mut runs = Vec::new();
    for c in 0..clients {
        let client = connect_port(port).await;
        runs.push(tokio::spawn(async move {
            let insert = client
                .prepare("INSERT INTO pay VALUES ($1, $2, $3) RETURNING card, by_card.n")
                .await
                .unwrap();
            let mut got = Vec::new();
            for i in 0..each {
                let id = c * each + i;
                let card = format!("c{}", id % cards);
                // One time for all: no event is late, in whatever order they land.
                let at = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
                let row = client.query_one(&insert, &[&id, &at, &card]).await.unwrap();
                got.push((row.get::<_, String>(0), row.get::<_, i64>(1)));
            }
            got
        }));
    }
    let mut by_card: HashMap<String, Vec<i64>> = HashMap::new();
    for run in runs {
        for (card, n) in run.await.unwrap() {
            by_card.entry(card).or_default().push(n);
        }
    }
    for (card, mut ns) in by_card {
        ns.sort();
        let want: Vec<i64> = (1..=ns.len() as i64).collect();
        assert_eq!(ns, want, "the counts card {card}'s statements got back");
    }
    let total = clients * each;
    eventually(
        &client,
        "SELECT sum(n) FROM by_card",
        &[row(&[&total.to_string()])],
    )
    .await;
    let metrics = reqwest_metrics(&http).await;
    let at_ack = counter(&metrics, "eddy_kafka_applied_at_ack_total");
    let consumed = counter(&metrics, "eddy_kafka_consumed_total");
    assert!(at_ack > 0, "{metrics}");
    assert_eq!(at_ack + consumed, total as u64, "{metrics}");
    drop(eddy);
}

/// While every record the task consumer reads is one its node already applied as Kafka
/// acknowledged it, the consumer pauses its fetching (`consume::QUIET`), and still
/// applies what another producer writes into the task's partition: before the node's
/// next statement of its own (whose acknowledgement finds the record ahead of it and
/// wakes the consumer), so that statement counts it; and, with none after it, on its own
/// within a pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quiet_task_consumer_still_applies_other_writers_records() {
    let dir = temp_dir("kafka-quiet");
    let cluster = cluster("quiet");
    let (eddy, port, http) = spawn_kafka_eddy(&dir, &cluster);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 1); \
             CREATE METRIC by_card AS SELECT card, COUNT(*) AS n FROM pay \
             WINDOW INFINITE GROUP BY card;",
        )
        .await
        .unwrap();
    let insert = client
        .prepare("INSERT INTO pay VALUES ($1, $2, $3) RETURNING by_card.n")
        .await
        .unwrap();
    let at = std::time::UNIX_EPOCH + Duration::from_secs(1_767_225_600);
    let card = "c0".to_string();
    let mut id = 0i64;
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", kafka_addr())
        .create()
        .unwrap();
    let topic = format!("{cluster}.pay.card");
    // Another writer's event: a record it puts straight into the task's partition.
    let send_other = |id: i64| {
        let mut payload = Vec::new();
        eddy_planner::codec::encode_row(
            &[
                Value::Int(id),
                Value::Timestamp(1_767_225_600_000_000),
                Value::Text("c0".into()),
            ],
            &mut payload,
        );
        let (producer, topic) = (&producer, &topic);
        async move {
            let record = FutureRecord::to(topic)
                .partition(0)
                .key("c0")
                .payload(&payload);
            producer
                .send(record, Duration::from_secs(10))
                .await
                .unwrap();
        }
    };
    // One of the node's own events; its card's count.
    let own = |id: i64| {
        let (client, insert, at, card) = (&client, &insert, &at, &card);
        async move {
            let row = client.query_one(insert, &[&id, at, card]).await.unwrap();
            row.get::<_, i64>(0)
        }
    };
    let mut n = 0;
    for _ in 0..200 {
        n += 1;
        id += 1;
        assert_eq!(own(id).await, n);
    }
    let metrics = reqwest_metrics(&http).await;
    assert!(
        counter(&metrics, "eddy_kafka_quiet_pauses_total") > 0,
        "{metrics}"
    );
    // Another writer's record, then one of the node's own: its count includes the other.
    for round in 0..5 {
        send_other(1_000_000 + round).await;
        n += 2;
        id += 1;
        assert_eq!(own(id).await, n, "round {round}");
    }
    // Another writer's record with none of the node's own after it.
    send_other(2_000_000).await;
    n += 1;
    eventually(
        &client,
        "SELECT n FROM by_card WHERE card = 'c0'",
        &[row(&[&n.to_string()])],
    )
    .await;
    drop(eddy);
}

/// A COPY of many batches sends the next batch to Kafka while the one before is applied
/// (`Sequence`), and still keeps input order: in every partition the events follow the
/// input, and with lateness 0 none of them is late. The tasks answer their own node in
/// place of the reply topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipelined_copy_keeps_input_order_through_kafka() {
    use futures::SinkExt;
    let dir = temp_dir("kafka-copy-order");
    let cluster = cluster("cpo");
    // Two parse batches to a statement: statements of about 3 000 events.
    let (eddy, port, http) =
        spawn_kafka_eddy_env(&dir, &cluster, &[("EDDY_KAFKA_STATEMENT_EVENTS", "2500")]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 3); \
             CREATE METRIC by_card AS SELECT card, COUNT(*) AS n, MAX(id) AS last \
             FROM pay WINDOW INFINITE GROUP BY card;",
        )
        .await
        .unwrap();
    // About 1 MB of CSV: four parse chunks of 256 KiB, with few events (the test
    // server's tiny caches make each one slow), made into two statements of two chunks
    // each, one Kafka transaction each, sent in turn.
    let rows = 6_000i64;
    let mut csv = String::new();
    for i in 0..rows {
        let at = 1_767_225_600 + i / 10; // 10 events a second, in input order
        let t = chrono_like(at, i % 10);
        csv.push_str(&format!("{i},{t},card-{}-{}\n", i % 37, "x".repeat(140)));
    }
    let sink = client
        .copy_in("COPY pay FROM STDIN (FORMAT csv)")
        .await
        .unwrap();
    futures::pin_mut!(sink);
    // In messages of 64 KiB, as psql sends: the server parses in chunks of 256 KiB.
    let csv = bytes::Bytes::from(csv);
    for at in (0..csv.len()).step_by(64 << 10) {
        let piece = csv.slice(at..(at + (64 << 10)).min(csv.len()));
        sink.send(piece).await.unwrap();
    }
    assert_eq!(sink.finish().await.unwrap(), rows as u64);
    eventually(
        &client,
        "SELECT sum(n), max(last) FROM by_card",
        &[row(&[&rows.to_string(), &(rows - 1).to_string()])],
    )
    .await;
    let streams = simple_rows(&client, "SHOW STREAMS").await;
    assert_eq!(
        streams[0][8].as_deref(),
        Some("0"),
        "late events: {streams:?}"
    );
    // A task's events of a statement share records, so the topic holds far fewer
    // records than events.
    let records = read_topic(&format!("{cluster}.pay.card"));
    assert!(
        records.len() < rows as usize / 10,
        "{} records",
        records.len()
    );
    let mut last: HashMap<i32, i64> = HashMap::new();
    let mut events = 0;
    for (partition, _, payload, _) in records {
        for event in events_of(&payload) {
            let Value::Int(id) = event[0] else {
                panic!("an id: {event:?}")
            };
            let before = last.insert(partition, id).unwrap_or(-1);
            assert!(id > before, "partition {partition}: {id} after {before}");
            events += 1;
        }
    }
    assert_eq!(events, rows);
    // The one node holds every task: each statement's answers were handed over in
    // place (one per task and statement), and no reply went through Kafka.
    let metrics = reqwest_metrics(&http).await;
    assert!(
        counter(&metrics, "eddy_kafka_replies_local_total") >= 6,
        "{metrics}"
    );
    assert_eq!(counter(&metrics, "eddy_kafka_replies_sent_total"), 0);
    drop(eddy);
}

/// `YYYY-MM-DD HH:MM:SS.d` of a Unix second and tenths.
fn chrono_like(unix: i64, tenth: i64) -> String {
    let days = unix / 86_400;
    let secs = unix % 86_400;
    // 2026-01-01 is day 20 454 of the Unix epoch; the test stays within January.
    assert!((20_454..20_454 + 31).contains(&days));
    format!(
        "2026-01-{:02} {:02}:{:02}:{:02}.{tenth}",
        days - 20_454 + 1,
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

fn node_id(dir: &std::path::Path) -> String {
    std::fs::read_to_string(dir.join("node.id"))
        .unwrap()
        .trim()
        .to_string()
}

/// A node started later, on an empty data directory, learns the catalog from the
/// compacted catalog topic and rebuilds the metrics from the stream topics; a DROP is
/// a tombstone there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_node_learns_catalog_and_state_from_kafka() {
    let cluster = cluster("later");
    let kafka = kafka_addr();
    let first = temp_dir("kafka-later-a");
    let (eddy, port) = spawn_eddy_with(&first, &["--kafka", &kafka, "--cluster", &cluster]);
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM pay (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partition_by = 'card', partitions = 2); \
             CREATE METRIC total AS SELECT card, SUM(amount) AS s FROM pay WINDOW INFINITE GROUP BY card; \
             CREATE METRIC gone AS SELECT card, COUNT(*) AS n FROM pay WINDOW INFINITE GROUP BY card; \
             ALTER STREAM pay ADD COLUMN note TEXT;",
        )
        .await
        .unwrap();
    let values: Vec<String> = (0..100)
        .map(|i| format!("('{}', 'c{}', {i}, NULL)", ts(i), i % 3))
        .collect();
    client
        .batch_execute(&format!("INSERT INTO pay VALUES {}", values.join(", ")))
        .await
        .unwrap();
    client.batch_execute("DROP METRIC gone").await.unwrap();
    let want = simple_rows(&client, "SELECT card, s FROM total ORDER BY card").await;
    assert_eq!(want.len(), 3);
    eddy.terminate();

    let second = temp_dir("kafka-later-b");
    let (eddy, port) = spawn_eddy_with(&second, &["--kafka", &kafka, "--cluster", &cluster]);
    let client = connect_port(port).await;
    let metrics: Vec<String> = simple_rows(&client, "SHOW METRICS")
        .await
        .into_iter()
        .map(|r| r[0].clone().unwrap())
        .collect();
    assert_eq!(metrics, vec!["total".to_string()]);
    let columns = simple_rows(&client, "DESCRIBE pay").await;
    assert_eq!(
        columns.len(),
        4,
        "the added column came with the catalog: {columns:?}"
    );
    eventually(&client, "SELECT card, s FROM total ORDER BY card", &want).await;
    drop(eddy);
}

/// An external topic of JSON records: good records become events, bad ones go to the
/// dead-letter topic with their error, and nothing blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_topic_is_ingested_and_bad_records_are_dead_lettered() {
    let dir = temp_dir("kafka-json");
    let cluster = cluster("json");
    let kafka = kafka_addr();
    let source = format!("{cluster}-payments-in");
    let (eddy, port, http) = spawn_kafka_eddy(&dir, &cluster);
    let client = connect_port(port).await;
    client
        .batch_execute(&format!(
            "CREATE STREAM ext (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount DOUBLE PRECISION) WITH (event_time = 'ts', event_id = 'id', \
             partition_by = 'card', partitions = 2, lateness = '1 hour', \
             kafka_topic = '{source}', format = 'json'); \
             CREATE METRIC per_card AS SELECT card, COUNT(*) AS n, SUM(amount) AS s \
             FROM ext WINDOW INFINITE GROUP BY card;"
        ))
        .await
        .unwrap();
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", &kafka)
        .create()
        .unwrap();
    let mut records: Vec<String> = Vec::new();
    for i in 0..40 {
        // Times as text and as epoch milliseconds; numbers as numbers and as text.
        let ts = if i % 2 == 0 {
            format!("\"{}\"", ts(i))
        } else {
            (1_767_225_600_000i64 + i * 1000).to_string()
        };
        let amount = if i % 3 == 0 {
            format!("\"{i}.5\"")
        } else {
            format!("{i}.5")
        };
        records.push(format!(
            r#"{{"id": {i}, "ts": {ts}, "card": "c{}", "amount": {amount}, "extra": true}}"#,
            i % 2
        ));
    }
    let bad = [
        "not json at all",
        r#"[1, 2, 3]"#,
        r#"{"id": 900, "ts": "2026-01-01 00:00:00", "amount": 1}"#,
        r#"{"id": 901, "ts": "2026-01-01 00:00:00", "card": "c0", "amount": "lots"}"#,
        r#"{"id": 902, "ts": "yesterday", "card": "c0", "amount": 1}"#,
    ];
    records.insert(5, bad[0].to_string());
    records.insert(12, bad[1].to_string());
    records.insert(20, bad[2].to_string());
    records.insert(30, bad[3].to_string());
    records.push(bad[4].to_string());
    // A duplicate of an event already sent is applied once (event_id).
    records.push(records[0].clone());
    for r in &records {
        producer
            .send(
                FutureRecord::<(), _>::to(&source).payload(r.as_str()),
                Duration::from_secs(10),
            )
            .await
            .unwrap();
    }
    let mut want = Vec::new();
    for card in 0..2 {
        let ids = (0..40).filter(|i| i % 2 == card);
        let n = ids.clone().count();
        let s: f64 = ids.map(|i| i as f64 + 0.5).sum();
        want.push(row(&[&format!("c{card}"), &n.to_string(), &s.to_string()]));
    }
    eventually(
        &client,
        "SELECT card, n, s FROM per_card ORDER BY card",
        &want,
    )
    .await;

    // The external topic has two partitions, so dead letters come in any order.
    let dead = read_topic(&format!("{cluster}.ext.dead-letters"));
    let mut payloads: Vec<String> = dead
        .iter()
        .map(|d| String::from_utf8_lossy(&d.2).into_owned())
        .collect();
    payloads.sort();
    let mut want_dead: Vec<String> = bad.iter().map(|b| b.to_string()).collect();
    want_dead.sort();
    assert_eq!(payloads, want_dead);
    for (_, _, payload, headers) in &dead {
        assert!(headers["eddy-origin"].starts_with(&source), "{headers:?}");
        let error = &headers["eddy-error"];
        if String::from_utf8_lossy(payload).contains("900") {
            assert!(error.contains("not-null"), "{error}");
        }
        assert!(!error.is_empty());
    }
    let metrics = reqwest_metrics(&http).await;
    assert!(
        metrics.contains("eddy_dead_letters_total{stream=\"ext\"} 5"),
        "{metrics}"
    );
    drop(eddy);
}

/// The value of an unlabelled counter in a `/metrics` body.
fn counter(metrics: &str, name: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{metrics}"))
}

/// DDL moves the task consumer's assignment only when the set of topics changes: a
/// metric does not rebalance the group, and a dropped stream's topics are released
/// before they are deleted, so the stream created again under the same name (with a
/// thousand partitions) starts empty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ddl_rebalances_only_when_topics_change() {
    let dir = temp_dir("kafka-ddl");
    let cluster = cluster("ddl");
    let (eddy, port, http) = spawn_kafka_eddy(&dir, &cluster);
    let client = connect_port(port).await;
    for round in 1..=2 {
        client
            .batch_execute(
                "CREATE STREAM wide (ts TIMESTAMP NOT NULL, k TEXT NOT NULL) \
                 WITH (event_time = 'ts', partition_by = 'k', partitions = 1024)",
            )
            .await
            .unwrap();
        let before = settled_assignments(&http, "wide").await;
        client
            .batch_execute(
                "CREATE METRIC wide_n AS SELECT k, COUNT(*) AS n FROM wide WINDOW INFINITE GROUP BY k; \
                 CREATE METRIC wide_all AS SELECT k, COUNT(DISTINCT ts) AS n FROM wide WINDOW INFINITE GROUP BY k; \
                 DROP METRIC wide_all;",
            )
            .await
            .unwrap();
        let after = counter(
            &reqwest_metrics(&http).await,
            "eddy_kafka_assignments_total",
        );
        assert_eq!(
            before, after,
            "round {round}: a metric rebalanced the group"
        );
        // Round 1 answers at once instead of behind a rebalance; round 2 gets a new,
        // empty topic, not the dropped one's records.
        let got = simple_rows(
            &client,
            "INSERT INTO wide VALUES ('2026-01-01 10:00:00', 'a'), ('2026-01-01 10:00:00', 'b'), \
             ('2026-01-01 10:00:00', 'a') RETURNING k, wide_n.n",
        )
        .await;
        assert_eq!(
            got,
            vec![row(&["a", "1"]), row(&["b", "1"]), row(&["a", "2"])],
            "round {round}"
        );
        client
            .batch_execute("DROP STREAM wide CASCADE")
            .await
            .unwrap();
    }
    drop(eddy);
}

/// The task consumer's assignments once `stream`'s tasks are held and the count has
/// not moved for a second: the plan that gives a new stream's tasks to this node comes
/// after CREATE STREAM returns, and its assignment with it.
async fn settled_assignments(http: &str, stream: &str) -> u64 {
    let held = format!("eddy_task_active{{stream=\"{stream}\"");
    let (mut last, mut still) = (None, 0);
    for _ in 0..300 {
        let metrics = reqwest_metrics(http).await;
        let now = counter(&metrics, "eddy_kafka_assignments_total");
        if metrics.contains(&held) && last == Some(now) {
            still += 1;
            if still == 5 {
                return now;
            }
        } else {
            still = 0;
        }
        last = Some(now);
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("{stream}'s tasks were not assigned within a minute");
}

/// `GET /metrics` over a plain TCP connection. Asked again when the connection closes
/// with no answer: under `make test`'s load (a 1 024-partition stream being created
/// beside the other tests) the HTTP port once did, as its 5 s header timeout does with
/// a request it did not read in time.
async fn reqwest_metrics(addr: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    for _ in 0..5 {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: eddy\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        s.read_to_string(&mut body).await.unwrap();
        if !body.is_empty() {
            return body;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    panic!("GET /metrics at {addr}: closed with no answer five times");
}

/// A stream with an external topic needs cluster mode: the embedded node refuses it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_topic_needs_kafka() {
    let dir = temp_dir("kafka-none");
    let (eddy, port) = spawn_eddy_with(&dir, &[]);
    let client = connect_port(port).await;
    let err = client
        .simple_query(
            "CREATE STREAM ext (ts TIMESTAMP NOT NULL) WITH (event_time = 'ts', kafka_topic = 'x')",
        )
        .await
        .unwrap_err();
    assert_eq!(err.code().unwrap().code(), "0A000", "{err}");
    assert_eq!(simple_rows(&client, "SELECT 1").await, vec![row(&["1"])]);
    drop(eddy);
}

/// `--kafka-property` reaches librdkafka: a property it does not know stops the node at
/// start with its message, and valid ones (comma-separated) leave the node working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kafka_properties_reach_the_clients() {
    let dir = temp_dir("kafka-property");
    let kafka = kafka_addr();
    let cluster = cluster("prop");
    let said = refused_start(
        &dir,
        &[
            "--kafka",
            &kafka,
            "--cluster",
            &cluster,
            "--kafka-property",
            "no.such.property=1",
        ],
        &[],
    );
    assert!(
        said.contains("No such configuration property") && said.contains("no.such.property"),
        "{said}"
    );
    // A peer service bound to every interface needs an address the others can dial.
    let said = refused_start(
        &dir,
        &[
            "--kafka",
            &kafka,
            "--cluster",
            &cluster,
            "--peer-addr",
            "0.0.0.0:0",
        ],
        &[],
    );
    assert!(said.contains("set --peer-advertise HOST:PORT"), "{said}");
    let said = refused_start(&dir, &["--peer-advertise", "eddy1"], &[]);
    assert!(said.contains("expected HOST:PORT"), "{said}");
    let (eddy, port) = spawn_eddy_with(
        &dir,
        &[
            "--kafka",
            &kafka,
            "--cluster",
            &cluster,
            "--kafka-property",
            "linger.ms=0,fetch.wait.max.ms=20",
        ],
    );
    let client = connect_port(port).await;
    client
        .batch_execute(
            "CREATE STREAM p (ts TIMESTAMP NOT NULL, k TEXT NOT NULL) WITH (event_time = 'ts'); \
             CREATE METRIC pm AS SELECT k, COUNT(*) AS n FROM p WINDOW INFINITE GROUP BY k;",
        )
        .await
        .unwrap();
    let got = simple_rows(
        &client,
        "INSERT INTO p VALUES ('2026-01-01 00:00:00', 'a') RETURNING pm.n",
    )
    .await;
    assert_eq!(got, vec![row(&["1"])]);
    eddy.terminate();
}
