//! How the node reaches Kafka: every client's settings come from `KafkaConfig`, the one
//! place they are made, and every topic's name from its naming methods. Also the small
//! waits and checks the other parts share.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::RDKafkaErrorCode;
use rdkafka::ClientContext;

use eddy_planner::catalog::StreamDef;
use eddy_planner::{Error, Result};

use crate::route::dir_name;

pub(crate) fn kafka_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::internal(format!("kafka: {what}: {e}"))
}

/// How the node reaches Kafka.
#[derive(Clone, Debug)]
pub struct KafkaConfig {
    /// `bootstrap.servers`.
    pub brokers: String,
    /// The cluster: the prefix of its topics and its task consumer group.
    pub cluster: String,
    /// This node's id: its reply topic and its static group membership.
    pub node: String,
    /// Replication factor of the topics Eddy creates.
    pub replication: i32,
    /// The fewest events a COPY puts in one statement (`EventLog::statement_events_min`).
    pub statement_events: usize,
    /// librdkafka properties set on every client Eddy makes, after its own (TLS, SASL,
    /// batching): `--kafka-property KEY=VALUE`.
    pub properties: Vec<(String, String)>,
    /// The physical machine (`--host-id`): no two copies of a task share one.
    pub host: String,
    /// Copies of each task, the active one included (`--replicas`).
    pub replicas: usize,
    /// The node's processors (its shards): its share of the tasks grows with them.
    pub processors: u32,
    /// How long a silent node stays in the group (`--session-timeout`): a dead node's
    /// tasks move to their replicas once it has passed.
    pub session_timeout: Duration,
    /// Where clients reach this node, as it tells the others.
    pub pg_addr: String,
    /// Where the peer service listens (`--peer-addr`; port 0: any free port).
    pub peer_addr: SocketAddr,
    /// Where the other nodes dial the peer service (`--peer-advertise HOST:PORT`; `None`:
    /// the bound address, which must then be a specific one).
    pub peer_advertise: Option<String>,
}

impl KafkaConfig {
    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", format!("eddy-{}", self.node))
            .set("broker.address.family", "v4")
            .set("allow.auto.create.topics", "false")
            // A broker back after a restart is reconnected to within a second.
            .set("reconnect.backoff.max.ms", "1000");
        c
    }

    /// The user's properties, over Eddy's.
    fn with_properties(&self, mut c: ClientConfig) -> ClientConfig {
        for (k, v) in &self.properties {
            c.set(k, v);
        }
        c
    }

    /// The admin client.
    pub(super) fn client(&self) -> ClientConfig {
        self.with_properties(self.base())
    }

    /// Cluster and node names become topic names: letters, digits, `_` and `-`.
    pub(super) fn check(&self) -> Result<()> {
        for (what, name) in [("cluster", &self.cluster), ("node id", &self.node)] {
            let ok = !name.is_empty()
                && name.len() <= 100
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(Error::new(
                    eddy_planner::ErrorKind::InvalidParameter,
                    format!("invalid {what} \"{name}\": use letters, digits, '_' and '-'"),
                ));
            }
        }
        Ok(())
    }

    /// Bulk producers (transactions, the cluster's own topics): every record acknowledged
    /// by all in-sync replicas, no duplicates on retry, batches sent within a millisecond.
    pub(crate) fn producer(&self) -> ClientConfig {
        self.producer_with(&[("linger.ms", "1")])
    }

    /// Producers a waiting statement goes through (a single event, and the tasks'
    /// answers): as `producer`, but a record is sent at once, and records batch only
    /// while the request before is in flight (one at a time), so a lone statement waits
    /// for no linger and many still share requests. Measured in Kafka mode with pgbench,
    /// durable (`bench/kafka-rate.sh`), against a 1 ms linger: 1 client 471–507 →
    /// 1 112–1 411/s, 16 clients 5.6–6.3 k → 6.4–6.7 k/s, 64 clients 13.8–16.8 k → 16.2 k/s.
    pub(crate) fn statement_producer(&self) -> ClientConfig {
        self.producer_with(&[
            ("linger.ms", "0"),
            ("max.in.flight.requests.per.connection", "1"),
        ])
    }

    fn producer_with(&self, batching: &[(&str, &str)]) -> ClientConfig {
        let mut c = self.base();
        c.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("message.timeout.ms", "30000");
        for (k, v) in batching {
            c.set(*k, *v);
        }
        self.with_properties(c)
    }

    /// Consumers: offsets are Eddy's (in checkpoints), never committed automatically.
    pub(crate) fn consumer(&self, group: &str) -> ClientConfig {
        let mut c = self.base();
        c.set("group.id", group)
            .set("topic.metadata.refresh.interval.ms", "5000")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "5");
        self.with_properties(c)
    }

    /// Consumers of topics written seldom: the reply topic, and the cluster and catalog
    /// topics (the cluster reader, the live-node group). A record that reaches the broker
    /// while a fetch waits there answers that fetch at once, so a long wait delays
    /// nothing; it only spares the idle fetches, which cost the broker CPU: one node left
    /// idle with four partitions cost it 90 ticks in 8 s with every consumer at 5 ms, and
    /// 68 with these at 100 ms (the broker alone: 14).
    pub(crate) fn reader(&self, group: &str) -> ClientConfig {
        let mut c = self.consumer(group);
        c.set("fetch.wait.max.ms", "100");
        self.with_properties(c)
    }

    /// Consumers that subscribe in a group (tasks, external topics). Static members: a
    /// restarted node takes its partitions back at once instead of waiting for the
    /// session of its previous life to time out, so the session can be long enough to
    /// ride out a broker busy creating or deleting a thousand partitions.
    pub(super) fn member(&self, group: &str) -> ClientConfig {
        let mut c = self.consumer(group);
        c.set("group.instance.id", &self.node)
            .set("session.timeout.ms", "30000")
            .set("heartbeat.interval.ms", "3000");
        self.with_properties(c)
    }
}

impl KafkaConfig {
    /// The topic of a stream's partitioner.
    pub fn topic_of(&self, stream: &StreamDef, partitioner: usize) -> String {
        let by = match stream.partitioners.get(partitioner) {
            Some(&col) => dir_name(&stream.columns[col].name),
            None => "all".to_string(),
        };
        format!("{}.{}.{by}", self.cluster, dir_name(&stream.name))
    }

    /// The dead-letter topic of a stream's external records.
    pub fn dead_letter_topic(&self, stream: &str) -> String {
        format!("{}.{}.dead-letters", self.cluster, dir_name(stream))
    }

    pub fn catalog_topic(&self) -> String {
        format!("{}-catalog", self.cluster)
    }

    /// The compacted topic of members' facts and the leader's plans.
    pub fn cluster_topic(&self) -> String {
        format!("{}-cluster", self.cluster)
    }

    /// The consumer group whose members are the live nodes.
    pub fn members_group(&self) -> String {
        format!("{}-members", self.cluster)
    }

    /// The group member of the live-node group: its session is the failure detector.
    pub(crate) fn liveness(&self) -> ClientConfig {
        let session = self.session_timeout.as_millis().max(1000);
        let mut c = self.reader(&self.members_group());
        c.set("session.timeout.ms", session.to_string())
            .set("heartbeat.interval.ms", (session / 12).max(100).to_string());
        self.with_properties(c)
    }
}

/// (with the wait appended).
pub(super) async fn wait_until(
    secs: u64,
    mut done: impl FnMut() -> Result<bool>,
    late: impl FnOnce() -> Error,
) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !done()? {
        if Instant::now() > deadline {
            let mut e = late();
            e.message.push_str(&format!(" after {secs} s"));
            return Err(e);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// wanted) counts as success.
pub(super) fn admin_results(
    results: Vec<rdkafka::admin::TopicResult>,
    fine: RDKafkaErrorCode,
    what: &str,
) -> Result<()> {
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, code)) if code == fine => {}
            Err((name, code)) => return Err(kafka_error(&format!("{what} {name}"), code)),
        }
    }
    Ok(())
}

/// client for a while: that is retried for 30 s.
pub(crate) fn watermarks<C: ClientContext>(
    client: &rdkafka::client::Client<C>,
    topic: &str,
    partition: i32,
) -> Result<(i64, i64)> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        match client.fetch_watermarks(topic, partition, Duration::from_secs(10)) {
            Ok(w) => return Ok(w),
            Err(e) if Instant::now() > deadline => {
                return Err(kafka_error(&format!("reading the offsets of {topic}"), e))
            }
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}
