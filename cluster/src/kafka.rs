//! Kafka as the node's log (cluster mode, `eddy serve --kafka`): seed 002 §3.1–3.3.
//!
//! Topics (all created by Eddy, all named after the cluster, `eddy` by default, so
//! several clusters can share brokers):
//! - `<cluster>.<stream>.<partitioner>`: one per partitioner of a stream (`all` for a stream
//!   without one), `partitions` partitions; a task is one (topic, partition). Records
//!   are keyed by the partitioner value's text, so a plain Kafka producer keyed the same
//!   way lands on the same task.
//! - `<cluster>-replies.<node>`: the node's reply topic. An event record names it in a header
//!   with its (request, slot); the task that applies the event answers there, and the
//!   node gathers the answers of every partitioner into one reply per statement.
//! - `<cluster>-catalog`: compacted; one record per object (`stream/<name>`, `metric/<name>`)
//!   holding its creating statement, a tombstone once dropped.
//! - `<cluster>.<stream>.dead-letters`: external records that could not be ingested.
//!
//! Consumer groups: `<cluster>` for the tasks, `<cluster>-source.<stream>` for each
//! external topic.
//!
//! Invariants:
//! - a statement is acknowledged only once Kafka acknowledged every record (acks=all,
//!   idempotent producer) and every task answered for its events;
//! - a task applies its partition's records in offset order, each at most once: the
//!   consumer dispatches a partition from `positions` (the next offset to apply), which
//!   starts at the task's checkpointed log end and only moves forward;
//! - every client's settings come from `KafkaConfig`, the one place they are made.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{
    BaseRecord, DeliveryResult, FutureProducer, FutureRecord, Producer, ProducerContext,
    ThreadedProducer,
};
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::{mpsc, oneshot};

use eddy_planner::bind::row_from_json;
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::codec::{self, Reader};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::command::{Command, Reply};
use crate::events::{Outcome, Row};
use crate::route::{dir_name, route, shard_of, TaskId};
use crate::task::{MetricValues, Task};

const REPLY_HEADER: &str = "eddy-reply";
const SLOT_HEADER: &str = "eddy-slot";

/// The headers that ask an event's task to answer on `reply_topic`, as slot `slot` of
/// request `request` (the reply record's key is the request id, little-endian), with the
/// event's metric values if `values`. Any Kafka client may send them (seed 002 §3.1).
pub fn reply_headers(reply_topic: &str, request: u64, slot: u32, values: bool) -> OwnedHeaders {
    let mut tag = Vec::with_capacity(13);
    tag.extend_from_slice(&request.to_le_bytes());
    tag.extend_from_slice(&slot.to_le_bytes());
    tag.push(values as u8);
    OwnedHeaders::new_with_capacity(2)
        .insert(Header {
            key: REPLY_HEADER,
            value: Some(reply_topic.as_bytes()),
        })
        .insert(Header {
            key: SLOT_HEADER,
            value: Some(&tag),
        })
}
/// How long a statement waits for its tasks' answers.
const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// Records dispatched to tasks per consumer round.
const POLL_BATCH_MAX: usize = 4096;

fn kafka_error(what: &str, e: impl std::fmt::Display) -> Error {
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
    /// librdkafka properties set on every client Eddy makes, after its own (TLS, SASL,
    /// batching): `--kafka-property KEY=VALUE`.
    pub properties: Vec<(String, String)>,
}

impl KafkaConfig {
    fn base(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers)
            .set("client.id", format!("eddy-{}", self.node))
            .set("broker.address.family", "v4")
            .set("allow.auto.create.topics", "false");
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
    fn client(&self) -> ClientConfig {
        self.with_properties(self.base())
    }

    /// Cluster and node names become topic names: letters, digits, `_` and `-`.
    fn check(&self) -> Result<()> {
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

    /// Event and reply producers: every record acknowledged by all in-sync replicas,
    /// no duplicates on retry, batches sent within a millisecond.
    fn producer(&self) -> ClientConfig {
        let mut c = self.base();
        c.set("acks", "all")
            .set("enable.idempotence", "true")
            .set("linger.ms", "1")
            .set("message.timeout.ms", "30000");
        self.with_properties(c)
    }

    /// Consumers: offsets are Eddy's (in checkpoints), never committed automatically.
    fn consumer(&self, group: &str) -> ClientConfig {
        let mut c = self.base();
        c.set("group.id", group)
            .set("topic.metadata.refresh.interval.ms", "5000")
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("auto.offset.reset", "earliest")
            .set("fetch.wait.max.ms", "5");
        self.with_properties(c)
    }

    /// Consumers that subscribe in a group (tasks, external topics). Static members: a
    /// restarted node takes its partitions back at once instead of waiting for the
    /// session of its previous life to time out, so the session can be long enough to
    /// ride out a broker busy creating or deleting a thousand partitions.
    fn member(&self, group: &str) -> ClientConfig {
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
}

/// Counters for SHOW STORAGE and /metrics.
#[derive(Debug, Default)]
pub struct KafkaStats {
    pub published: AtomicU64,
    pub consumed: AtomicU64,
    pub replies_sent: AtomicU64,
    /// Replies Kafka did not take (their askers time out).
    pub replies_failed: AtomicU64,
    pub replies_received: AtomicU64,
    /// Records below a task's position, skipped (redelivered after a rebalance).
    pub skipped: AtomicU64,
    pub dead_letters: AtomicU64,
    /// Assignments the task consumer received: one per rebalance of the group.
    pub assignments: AtomicU64,
}

/// One task answer: an event's outcome and, if asked, its metric values.
pub type Answer = (Outcome, MetricValues);

/// A statement waiting for its answers, one per (event, partitioner) slot.
struct Gather {
    answers: Vec<Option<Answer>>,
    missing: usize,
    done: Option<oneshot::Sender<Result<Vec<Answer>>>>,
}

/// Where to answer an event: the reply topic, the statement and the slot in it.
struct ReplyTo {
    topic: String,
    request: u64,
    slot: u32,
    values: bool,
}

type Positions = Arc<Mutex<HashMap<(String, i32), i64>>>;

/// A stream's topic for one partitioner: each partition is a task.
struct TaskTopic {
    name: String,
    stream: String,
    partitioner: usize,
    partitions: u32,
}
type Routes = Arc<RwLock<HashMap<String, (String, usize)>>>;

/// The reply producer's context: delivery reports arrive on its own polling thread, and
/// only a failure does anything (it is logged and counted).
struct ReplyContext {
    stats: Arc<KafkaStats>,
}

impl ClientContext for ReplyContext {}

impl ProducerContext for ReplyContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.stats.replies_failed.fetch_add(1, Ordering::Relaxed);
            eprintln!("eddy: kafka: replying: {e}");
        }
    }
}

type Replier = ThreadedProducer<ReplyContext>;

pub struct Kafka {
    config: KafkaConfig,
    producer: FutureProducer,
    /// Tasks answer through it from their shard threads, without waiting for Kafka.
    replier: Replier,
    admin: AdminClient<DefaultClientContext>,
    reply_topic: String,
    next_request: AtomicU64,
    pending: Arc<Mutex<HashMap<u64, Gather>>>,
    /// Topic → (stream, partitioner) of the current catalog.
    routes: Routes,
    positions: Positions,
    /// Set when the topic list changed: the consumer subscribes again.
    resubscribe: Arc<AtomicBool>,
    /// The partitions the task consumer holds now.
    assigned: Arc<Mutex<HashSet<(String, i32)>>>,
    /// Whether the task consumer runs (it starts after recovery).
    consuming: AtomicBool,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Consumers of external topics, by stream.
    sources: Mutex<HashMap<String, SourceRun>>,
    /// External records sent to a dead-letter topic, by stream.
    dead_letters: Mutex<BTreeMap<String, u64>>,
    pub stats: Arc<KafkaStats>,
}

/// A running consumer of a stream's external topic.
struct SourceRun {
    stream: Arc<StreamDef>,
    stop: Arc<AtomicBool>,
    thread: JoinHandle<()>,
}

impl std::fmt::Debug for Kafka {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Kafka")
            .field("brokers", &self.config.brokers)
            .field("node", &self.config.node)
            .finish()
    }
}

impl Kafka {
    /// Connects, creates the catalog and reply topics, and starts the reply consumer.
    pub async fn connect(config: KafkaConfig) -> Result<Arc<Kafka>> {
        config.check()?;
        let producer: FutureProducer = config
            .producer()
            .create()
            .map_err(|e| kafka_error("creating the producer", e))?;
        let admin: AdminClient<DefaultClientContext> = config
            .client()
            .create()
            .map_err(|e| kafka_error("creating the admin client", e))?;
        let stats: Arc<KafkaStats> = Arc::default();
        let replier: Replier = config
            .producer()
            .create_with_context(ReplyContext {
                stats: stats.clone(),
            })
            .map_err(|e| kafka_error("creating the reply producer", e))?;
        let kafka = Kafka {
            reply_topic: format!("{}-replies.{}", config.cluster, config.node),
            config,
            producer,
            replier,
            admin,
            next_request: AtomicU64::new(1),
            pending: Arc::default(),
            routes: Arc::default(),
            positions: Arc::default(),
            resubscribe: Arc::new(AtomicBool::new(true)),
            assigned: Arc::default(),
            consuming: AtomicBool::new(false),
            stop: Arc::new(AtomicBool::new(false)),
            threads: Mutex::new(Vec::new()),
            sources: Mutex::default(),
            dead_letters: Mutex::default(),
            stats,
        };
        kafka
            .create_topics(&[(kafka.config.catalog_topic(), 1, true)])
            .await?;
        kafka
            .create_topics(&[(kafka.reply_topic.clone(), 1, false)])
            .await?;
        let kafka = Arc::new(kafka);
        kafka.start_replies()?;
        Ok(kafka)
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// Creates topics (name, partitions, compacted) that do not exist yet; a topic that
    /// is still being deleted (a stream dropped and created again) is retried.
    async fn create_topics(&self, topics: &[(String, u32, bool)]) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let mut todo: Vec<&(String, u32, bool)> = topics.iter().collect();
        while !todo.is_empty() {
            let new: Vec<NewTopic<'_>> = todo
                .iter()
                .map(|(name, partitions, compacted)| {
                    let t = NewTopic::new(
                        name,
                        *partitions as i32,
                        TopicReplication::Fixed(self.config.replication),
                    );
                    if *compacted {
                        t.set("cleanup.policy", "compact")
                    } else {
                        t
                    }
                })
                .collect();
            let results = self
                .admin
                .create_topics(&new, &opts)
                .await
                .map_err(|e| kafka_error("creating topics", e))?;
            let mut again = Vec::new();
            for (result, topic) in results.into_iter().zip(&todo) {
                match result {
                    Ok(_) => {}
                    Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {
                        if !self.partitions_match(&topic.0, topic.1)? {
                            again.push(*topic);
                        }
                    }
                    Err((name, code)) => {
                        return Err(kafka_error(&format!("creating topic {name}"), code))
                    }
                }
            }
            if !again.is_empty() && Instant::now() > deadline {
                return Err(kafka_error(
                    "creating topics",
                    format!("{} still exists with another partition count", again[0].0),
                ));
            }
            if !again.is_empty() {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            todo = again;
        }
        Ok(())
    }

    /// Waits until the producer's metadata shows each topic with its partitions: a topic
    /// just created (or deleted and created again, as when a stream is re-created) may
    /// otherwise look unknown to it, and the first INSERT would fail.
    async fn await_metadata(&self, topics: &[(String, u32, bool)]) -> Result<()> {
        for (topic, partitions, _) in topics {
            let ready = || -> Result<bool> {
                let meta = self
                    .producer
                    .client()
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .map_err(|e| kafka_error("reading topic metadata", e))?;
                Ok(meta.topics().iter().any(|t| {
                    t.name() == topic
                        && t.error().is_none()
                        && t.partitions().len() == *partitions as usize
                        && t.partitions()
                            .iter()
                            .all(|p| p.error().is_none() && p.leader() >= 0)
                }))
            };
            wait_until(30, ready, || {
                kafka_error(
                    "creating topics",
                    format!("{topic} did not become available"),
                )
            })
            .await?;
        }
        Ok(())
    }

    /// Waits (at most a minute) until the task consumer holds exactly the partitions of
    /// `topics`: the first INSERT after a CREATE does not wait for the rebalance, and a
    /// dropped stream's topics are released before they are deleted.
    async fn await_assignment(&self, topics: &[TaskTopic]) {
        let wanted: HashSet<(String, i32)> = topics
            .iter()
            .flat_map(|t| (0..t.partitions as i32).map(move |p| (t.name.clone(), p)))
            .collect();
        let holds = || Ok(*self.assigned.lock().expect("assigned lock") == wanted);
        let late = || {
            Error::internal(format!(
                "kafka: the task consumer's assignment did not follow the catalog \
                 ({} partitions wanted)",
                wanted.len()
            ))
        };
        if let Err(e) = wait_until(60, holds, late).await {
            eprintln!("eddy: {e}");
        }
    }

    /// Whether an existing topic has `partitions` partitions.
    fn partitions_match(&self, topic: &str, partitions: u32) -> Result<bool> {
        Ok(self.partition_count(topic)? == Some(partitions as usize))
    }

    /// A topic's partitions, `None` if the broker does not know it.
    fn partition_count(&self, topic: &str) -> Result<Option<usize>> {
        let meta = self
            .admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(10))
            .map_err(|e| kafka_error("reading topic metadata", e))?;
        Ok(meta
            .topics()
            .iter()
            .find(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            .map(|t| t.partitions().len()))
    }

    async fn delete_topics(&self, topics: &[String]) -> Result<()> {
        if topics.is_empty() {
            return Ok(());
        }
        let names: Vec<&str> = topics.iter().map(String::as_str).collect();
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let results = self
            .admin
            .delete_topics(&names, &opts)
            .await
            .map_err(|e| kafka_error("deleting topics", e))?;
        admin_results(
            results,
            RDKafkaErrorCode::UnknownTopicOrPartition,
            "deleting topic",
        )?;
        // Gone from the metadata before this returns: a stream created again under the
        // same name must get a new, empty topic, never the old one's records.
        for topic in topics {
            let gone = || Ok(self.partition_count(topic)?.is_none());
            wait_until(30, gone, || {
                kafka_error("deleting topics", format!("{topic} is still there"))
            })
            .await?;
        }
        Ok(())
    }

    /// Brings topics, routes and positions in line with a new catalog: topics of new
    /// streams are created, those of dropped (or re-created) streams deleted.
    pub async fn install(self: &Arc<Self>, current: &Catalog, next: &Catalog) -> Result<()> {
        let kept = |name: &str, s: &StreamDef| {
            current
                .stream(name)
                .is_some_and(|old| s.same_as(old) || old.same_as(s))
        };
        let (staying, leaving): (Vec<&StreamDef>, Vec<&StreamDef>) = current
            .streams
            .values()
            .map(|s| &**s)
            .partition(|old| next.stream(&old.name).is_some_and(|s| kept(&old.name, s)));
        // A topic deleted while the consumer holds it leaves librdkafka with partitions it
        // can neither fetch nor release cleanly: stop consuming first, then delete.
        if !leaving.is_empty() {
            self.follow(&self.task_topics(staying)).await;
            let gone: Vec<String> = self
                .task_topics(leaving)
                .into_iter()
                .map(|t| t.name)
                .collect();
            self.delete_topics(&gone).await?;
        }
        let wanted = self.task_topics(next.streams.values().map(|s| &**s).collect());
        let specs: Vec<(String, u32, bool)> = wanted
            .iter()
            .map(|t| (t.name.clone(), t.partitions, false))
            .collect();
        self.create_topics(&specs).await?;
        self.await_metadata(&specs).await?;
        self.follow(&wanted).await;
        self.install_sources(next).await
    }

    /// The task topics of some streams.
    fn task_topics(&self, streams: Vec<&StreamDef>) -> Vec<TaskTopic> {
        streams
            .into_iter()
            .flat_map(|s| {
                (0..s.partitioner_count()).map(move |p| TaskTopic {
                    name: self.config.topic_of(s, p),
                    stream: s.name.clone(),
                    partitioner: p,
                    partitions: s.tasks_per_partitioner(),
                })
            })
            .collect()
    }

    /// Points the task consumer at exactly `topics` (subscribing again only when the set
    /// changed) and, once it runs, waits until it holds exactly their partitions.
    async fn follow(&self, topics: &[TaskTopic]) {
        let routes: HashMap<String, (String, usize)> = topics
            .iter()
            .map(|t| (t.name.clone(), (t.stream.clone(), t.partitioner)))
            .collect();
        let changed = {
            // Under the positions lock, as in `dispatch`: once this block ends, no record
            // of a dropped topic moves a position of a topic created again later.
            let mut positions = self.positions.lock().expect("positions lock");
            let mut current = self.routes.write().expect("routes lock");
            let changed =
                current.len() != routes.len() || routes.keys().any(|t| !current.contains_key(t));
            positions.retain(|(topic, _), _| routes.contains_key(topic));
            *current = routes;
            changed
        };
        if changed {
            self.resubscribe.store(true, Ordering::Release);
        }
        if self.consuming.load(Ordering::Acquire) {
            self.await_assignment(topics).await;
        }
    }

    /// Runs one consumer per stream with an external topic; creates the topic (with the
    /// stream's task count as partitions) and its dead-letter topic if missing.
    async fn install_sources(self: &Arc<Self>, next: &Catalog) -> Result<()> {
        let stale: Vec<SourceRun> = {
            let mut sources = self.sources.lock().expect("sources lock");
            let names: Vec<String> = sources
                .iter()
                .filter(|(name, run)| next.stream(name) != Some(&run.stream))
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| sources.remove(n)).collect()
        };
        for run in stale {
            run.stop.store(true, Ordering::Release);
            let _ = tokio::task::spawn_blocking(move || run.thread.join()).await;
        }
        for stream in next.streams.values() {
            let Some(source) = &stream.source else {
                continue;
            };
            if self
                .sources
                .lock()
                .expect("sources lock")
                .contains_key(&stream.name)
            {
                continue;
            }
            for (topic, partitions) in [
                (source.topic.clone(), stream.tasks_per_partitioner()),
                (self.config.dead_letter_topic(&stream.name), 1),
            ] {
                if self.partition_count(&topic)?.is_none() {
                    self.create_topic_if_missing(&topic, partitions).await?;
                }
            }
            let stop = Arc::new(AtomicBool::new(false));
            let me = self.clone();
            let def = stream.clone();
            let flag = stop.clone();
            let runtime = tokio::runtime::Handle::current();
            let thread = std::thread::Builder::new()
                .name("eddy-kafka-source".into())
                .spawn(move || me.run_source(def, flag, runtime))
                .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
            self.sources.lock().expect("sources lock").insert(
                stream.name.clone(),
                SourceRun {
                    stream: stream.clone(),
                    stop,
                    thread,
                },
            );
        }
        Ok(())
    }

    /// Creates a topic another client may create first: any partition count will do.
    async fn create_topic_if_missing(&self, topic: &str, partitions: u32) -> Result<()> {
        let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
        let new = NewTopic::new(
            topic,
            partitions as i32,
            TopicReplication::Fixed(self.config.replication),
        );
        let results = self
            .admin
            .create_topics([&new], &opts)
            .await
            .map_err(|e| kafka_error("creating topics", e))?;
        admin_results(
            results,
            RDKafkaErrorCode::TopicAlreadyExists,
            "creating topic",
        )
    }

    /// Consumes a stream's external topic: each JSON record becomes an event published
    /// to the stream's task topics; a record that does not fit goes to the dead-letter
    /// topic with its error. Offsets are committed once Kafka has the events, so a
    /// crash redelivers (at least once); `event_id` makes the effect exactly once.
    fn run_source(
        self: Arc<Self>,
        stream: Arc<StreamDef>,
        stop: Arc<AtomicBool>,
        runtime: tokio::runtime::Handle,
    ) {
        let Some(source) = stream.source.clone() else {
            return;
        };
        let group = format!("{}-source.{}", self.config.cluster, dir_name(&stream.name));
        let consumer: BaseConsumer = match self.config.member(&group).create() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("eddy: kafka: the consumer of {}: {e}", source.topic);
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&source.topic]) {
            eprintln!("eddy: kafka: subscribing to {}: {e}", source.topic);
            return;
        }
        let stopped = || stop.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire);
        let mut batch = Vec::new();
        while !stopped() {
            let mut wait = Duration::from_millis(50);
            while batch.len() < POLL_BATCH_MAX {
                match consumer.poll(wait) {
                    Some(Ok(m)) => batch.push(m.detach()),
                    Some(Err(e)) => {
                        eprintln!("eddy: kafka: consuming {}: {e}", source.topic);
                        break;
                    }
                    None => break,
                }
                wait = Duration::ZERO;
            }
            if batch.is_empty() {
                continue;
            }
            let mut rows: Vec<Row> = Vec::with_capacity(batch.len());
            for m in &batch {
                let payload = m.payload().unwrap_or_default();
                let row = row_from_json(&stream, payload).and_then(|r| {
                    Task::event_time(&stream, &r)?;
                    Ok(r)
                });
                match row {
                    Ok(r) => rows.push(Row::from(r)),
                    Err(e) => {
                        let origin = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
                        let sent = runtime.block_on(self.dead_letter(
                            &stream.name,
                            payload,
                            &e.to_string(),
                            &origin,
                        ));
                        if let Err(e) = sent {
                            eprintln!("eddy: kafka: {e}");
                        }
                    }
                }
            }
            let events: Vec<(TaskId, Row)> = route(&stream, &rows)
                .into_iter()
                .flat_map(|(_, task, _, rows)| rows.into_iter().map(move |r| (task.clone(), r)))
                .collect();
            while let Err(e) = runtime.block_on(self.send_events(&stream, &events, None)) {
                eprintln!("eddy: kafka: ingesting {}: {e}; retrying", source.topic);
                if stopped() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
            for m in batch.drain(..) {
                ends.insert((m.topic().to_string(), m.partition()), m.offset() + 1);
            }
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), end) in ends {
                let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(end));
            }
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                eprintln!("eddy: kafka: committing {}: {e}", source.topic);
            }
        }
    }

    /// External records sent to dead-letter topics, by stream.
    pub fn dead_letters(&self) -> BTreeMap<String, u64> {
        self.dead_letters.lock().expect("dead letters lock").clone()
    }

    /// Publishes the objects that differ between two catalogs to the catalog topic.
    pub async fn publish_catalog(&self, current: &Catalog, next: &Catalog) -> Result<()> {
        let mut records: Vec<(String, Option<String>)> = Vec::new();
        for (name, s) in &next.streams {
            if current.stream(name).map(|o| &o.sql) != Some(&s.sql) {
                records.push((format!("stream/{name}"), Some(s.sql.clone())));
            }
        }
        for (name, m) in &next.metrics {
            if current.metric(name).map(|o| &o.sql) != Some(&m.sql) {
                records.push((format!("metric/{name}"), Some(m.sql.clone())));
            }
        }
        for name in current.streams.keys().filter(|n| next.stream(n).is_none()) {
            records.push((format!("stream/{name}"), None));
        }
        for name in current.metrics.keys().filter(|n| next.metric(n).is_none()) {
            records.push((format!("metric/{name}"), None));
        }
        let catalog = self.config.catalog_topic();
        let mut deliveries = Vec::new();
        for (key, sql) in &records {
            let mut record = FutureRecord::to(&catalog).key(key.as_str());
            if let Some(sql) = sql {
                record = record.payload(sql.as_str());
            }
            let delivery = self
                .producer
                .send_result(record)
                .map_err(|(e, _)| kafka_error("publishing the catalog", e))?;
            deliveries.push(delivery);
        }
        for d in deliveries {
            d.await
                .map_err(|_| kafka_error("publishing the catalog", "the producer went away"))?
                .map_err(|(e, _)| kafka_error("publishing the catalog", e))?;
        }
        Ok(())
    }

    /// The catalog as the catalog topic holds it: the creating statements of live
    /// objects, streams first, each kind in the order it was last written.
    pub fn read_catalog(&self) -> Result<Vec<String>> {
        let consumer: BaseConsumer = self
            .config
            .consumer(&format!("eddy-catalog-reader.{}", self.config.node))
            .create()
            .map_err(|e| kafka_error("creating the catalog reader", e))?;
        let catalog = self.config.catalog_topic();
        let (low, high) = watermarks(consumer.client(), &catalog, 0)?;
        let mut latest: HashMap<String, (i64, Option<String>)> = HashMap::new();
        if high > low {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(&catalog, 0, Offset::Beginning)
                .map_err(|e| kafka_error("reading the catalog topic", e))?;
            consumer
                .assign(&tpl)
                .map_err(|e| kafka_error("reading the catalog topic", e))?;
            let deadline = Instant::now() + Duration::from_secs(30);
            let mut next = low;
            while next < high {
                if Instant::now() > deadline {
                    return Err(kafka_error("reading the catalog topic", "timed out"));
                }
                let Some(m) = consumer.poll(Duration::from_millis(100)) else {
                    continue;
                };
                let m = m.map_err(|e| kafka_error("reading the catalog topic", e))?;
                next = m.offset() + 1;
                let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                let sql = m.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                latest.insert(key, (m.offset(), sql));
            }
        }
        let mut live: Vec<(bool, i64, String)> = latest
            .into_iter()
            .filter_map(|(key, (offset, sql))| Some((!key.starts_with("stream/"), offset, sql?)))
            .collect();
        live.sort();
        Ok(live.into_iter().map(|(_, _, sql)| sql).collect())
    }

    /// Publishes events to their tasks' topics and waits for every task's answer.
    /// `events` are (task, event) in slot order.
    pub async fn publish(
        &self,
        stream: &StreamDef,
        events: Vec<(TaskId, Row)>,
        values: bool,
    ) -> Result<Vec<Answer>> {
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (done, answered) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(
            request,
            Gather {
                answers: vec![None; events.len()],
                missing: events.len(),
                done: Some(done),
            },
        );
        let result = self
            .send_events(stream, &events, Some((request, values)))
            .await;
        if let Err(e) = result {
            self.pending.lock().expect("pending lock").remove(&request);
            return Err(e);
        }
        match tokio::time::timeout(REPLY_TIMEOUT, answered).await {
            Ok(Ok(answers)) => answers,
            Ok(Err(_)) => Err(Error::internal("kafka: the reply consumer stopped")),
            Err(_) => {
                self.pending.lock().expect("pending lock").remove(&request);
                Err(Error::internal(format!(
                    "kafka: no answer from the tasks within {} s; the events are durable in Kafka and will be applied",
                    REPLY_TIMEOUT.as_secs()
                )))
            }
        }
    }

    /// Sends events to their tasks' topics, keyed by the partitioner value, and waits
    /// until Kafka acknowledged them all. With `answer` = (request, values), each
    /// record asks its task to answer slot i of the request on the reply topic.
    async fn send_events(
        &self,
        stream: &StreamDef,
        events: &[(TaskId, Row)],
        answer: Option<(u64, bool)>,
    ) -> Result<()> {
        let topics: Vec<String> = (0..stream.partitioner_count())
            .map(|p| self.config.topic_of(stream, p))
            .collect();
        let mut deliveries = Vec::with_capacity(events.len());
        for (slot, (task, row)) in events.iter().enumerate() {
            let mut payload = Vec::with_capacity(64);
            codec::encode_row(row, &mut payload);
            let key = match stream.partitioners.get(task.partitioner) {
                Some(&col) => row[col].to_text().unwrap_or_default(),
                None => String::new(),
            };
            let mut record = FutureRecord::to(&topics[task.partitioner])
                .partition(task.partition as i32)
                .key(key.as_bytes())
                .payload(&payload);
            if let Some((request, values)) = answer {
                record = record.headers(reply_headers(
                    &self.reply_topic,
                    request,
                    slot as u32,
                    values,
                ));
            }
            deliveries.push(self.send(record)?);
        }
        for d in deliveries {
            d.await
                .map_err(|_| kafka_error("publishing events", "the producer went away"))?
                .map_err(|(e, _)| kafka_error("publishing events", e))?;
        }
        self.stats
            .published
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Queues a record, waiting while the producer's queue is full.
    fn send(
        &self,
        mut record: FutureRecord<'_, [u8], Vec<u8>>,
    ) -> Result<rdkafka::producer::DeliveryFuture> {
        loop {
            match self.producer.send_result(record) {
                Ok(d) => return Ok(d),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                    record = r;
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err((e, _)) => return Err(kafka_error("publishing events", e)),
            }
        }
    }

    /// Publishes an external record that did not fit the stream, with its error and
    /// where it came from (`topic/partition@offset`).
    async fn dead_letter(
        &self,
        stream: &str,
        payload: &[u8],
        error: &str,
        origin: &str,
    ) -> Result<()> {
        let topic = self.config.dead_letter_topic(stream);
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "eddy-error",
                value: Some(error.as_bytes()),
            })
            .insert(Header {
                key: "eddy-origin",
                value: Some(origin.as_bytes()),
            });
        let record: FutureRecord<'_, [u8], [u8]> =
            FutureRecord::to(&topic).payload(payload).headers(headers);
        self.producer
            .send_result(record)
            .map_err(|(e, _)| kafka_error("publishing a dead letter", e))?
            .await
            .map_err(|_| kafka_error("publishing a dead letter", "the producer went away"))?
            .map_err(|(e, _)| kafka_error("publishing a dead letter", e))?;
        self.stats.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self
            .dead_letters
            .lock()
            .expect("dead letters lock")
            .entry(stream.to_string())
            .or_default() += 1;
        Ok(())
    }

    /// Starts the thread that reads the reply topic from its current end.
    fn start_replies(self: &Arc<Self>) -> Result<()> {
        let consumer: BaseConsumer = self
            .config
            .consumer(&format!("eddy-replies.{}", self.config.node))
            .create()
            .map_err(|e| kafka_error("creating the reply consumer", e))?;
        let (_, high) = watermarks(consumer.client(), &self.reply_topic, 0)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(&self.reply_topic, 0, Offset::Offset(high))
            .map_err(|e| kafka_error("reading the reply topic", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| kafka_error("reading the reply topic", e))?;
        let pending = self.pending.clone();
        let stop = self.stop.clone();
        let stats = self.stats.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-kafka-replies".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    stats.replies_received.fetch_add(1, Ordering::Relaxed);
                    deliver_reply(&pending, m.key(), m.payload());
                }
            })
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        self.threads.lock().expect("threads lock").push(thread);
        Ok(())
    }

    /// Sets where each task resumes: its checkpointed log end.
    pub fn resume_at(&self, ends: impl IntoIterator<Item = (String, i32, i64)>) {
        let mut positions = self.positions.lock().expect("positions lock");
        for (topic, partition, end) in ends {
            let p = positions.entry((topic, partition)).or_insert(end);
            *p = (*p).max(end);
        }
    }

    /// The next offset to apply of each task partition.
    pub fn positions(&self) -> HashMap<(String, i32), i64> {
        self.positions.lock().expect("positions lock").clone()
    }

    /// The end of a topic partition (the offset its next record will get).
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64> {
        Ok(watermarks(self.admin.inner(), topic, partition)?.1)
    }

    /// Starts the task consumer: it joins the group, and dispatches each assigned
    /// partition's records to its task's shard from the task's position on.
    pub(crate) fn start_tasks(self: &Arc<Self>, queues: Vec<mpsc::Sender<Command>>) -> Result<()> {
        let context = TaskContext {
            positions: self.positions.clone(),
            assigned: self.assigned.clone(),
            stats: self.stats.clone(),
        };
        self.consuming.store(true, Ordering::Release);
        let consumer: BaseConsumer<TaskContext> = self
            .config
            .member(&self.config.cluster)
            .create_with_context(context)
            .map_err(|e| kafka_error("creating the task consumer", e))?;
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-kafka-tasks".into())
            .spawn(move || me.run_tasks(consumer, queues))
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        self.threads.lock().expect("threads lock").push(thread);
        Ok(())
    }

    fn run_tasks(
        self: Arc<Self>,
        consumer: BaseConsumer<TaskContext>,
        queues: Vec<mpsc::Sender<Command>>,
    ) {
        let mut batch: Vec<rdkafka::message::OwnedMessage> = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            if self.resubscribe.swap(false, Ordering::AcqRel) {
                let topics: Vec<String> = self
                    .routes
                    .read()
                    .expect("routes lock")
                    .keys()
                    .cloned()
                    .collect();
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                // Fresh metadata first: a topic created (again) a moment ago must not look
                // unknown to the group's assignment.
                for topic in &names {
                    let _ = consumer.fetch_metadata(Some(topic), Duration::from_secs(5));
                }
                let result = if names.is_empty() {
                    consumer.unsubscribe();
                    Ok(())
                } else {
                    consumer.subscribe(&names)
                };
                if let Err(e) = result {
                    eprintln!("eddy: kafka: subscribing: {e}");
                }
            }
            let mut wait = Duration::from_millis(20);
            while batch.len() < POLL_BATCH_MAX {
                match consumer.poll(wait) {
                    Some(Ok(m)) => batch.push(m.detach()),
                    // A dropped stream's topic, until the next subscription drops it.
                    Some(Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::UnknownTopicOrPartition,
                    ))) => break,
                    Some(Err(e)) => {
                        eprintln!("eddy: kafka: consuming: {e}");
                        break;
                    }
                    None => break,
                }
                wait = Duration::ZERO;
            }
            if !batch.is_empty() {
                self.dispatch(std::mem::take(&mut batch), &queues);
            }
        }
    }

    /// Hands polled records to their tasks, a batch per partition in offset order, and
    /// answers the events that ask for it once their task applied them.
    fn dispatch(
        &self,
        records: Vec<rdkafka::message::OwnedMessage>,
        queues: &[mpsc::Sender<Command>],
    ) {
        let mut by_partition: BTreeMap<(String, i32), Vec<rdkafka::message::OwnedMessage>> =
            BTreeMap::new();
        for m in records {
            by_partition
                .entry((m.topic().to_string(), m.partition()))
                .or_default()
                .push(m);
        }
        for ((topic, partition), msgs) in by_partition {
            let mut rows = Vec::with_capacity(msgs.len());
            let mut asks = Vec::new();
            let (task, end) = {
                let mut positions = self.positions.lock().expect("positions lock");
                let route = self
                    .routes
                    .read()
                    .expect("routes lock")
                    .get(&topic)
                    .cloned();
                let Some((stream, partitioner)) = route else {
                    continue;
                };
                let task = TaskId {
                    stream,
                    partitioner,
                    partition: partition as u32,
                };
                let next = positions.entry((topic.clone(), partition)).or_insert(0);
                for m in &msgs {
                    if m.offset() < *next {
                        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    *next = m.offset() + 1;
                    let Some(row) = m.payload().and_then(codec::decode_row) else {
                        eprintln!(
                            "eddy: kafka: an unreadable event at {topic}/{partition}@{}",
                            m.offset()
                        );
                        continue;
                    };
                    if let Some(reply) = reply_to(m) {
                        asks.push((rows.len(), reply));
                    }
                    rows.push(row);
                }
                (task, *next)
            };
            if rows.is_empty() {
                continue;
            }
            self.stats
                .consumed
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
            let values = asks.iter().any(|(_, r)| r.values);
            let reply: Reply = if asks.is_empty() {
                Box::new(|_| {})
            } else {
                let (replier, stats) = (self.replier.clone(), self.stats.clone());
                Box::new(move |result| send_replies(&replier, &stats, asks, result))
            };
            let shard = shard_of(&task, queues.len());
            let cmd = Command::Ingest {
                task,
                rows,
                values,
                log_end: Some(end as u64),
                reply,
            };
            if queues[shard].blocking_send(cmd).is_err() {
                return;
            }
        }
    }

    /// Stops the consumer threads.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let mut threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        let sources = std::mem::take(&mut *self.sources.lock().expect("sources lock"));
        threads.extend(sources.into_values().map(|run| run.thread));
        // librdkafka can wait forever to destroy a consumer (a partition reference it
        // never releases); the node's state is checkpointed by now, so it does not wait.
        let deadline = Instant::now() + Duration::from_secs(20);
        while threads.iter().any(|t| !t.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        for t in threads {
            if t.is_finished() {
                let _ = t.join();
            } else {
                eprintln!("eddy: kafka: a consumer did not close within 20 s; not waiting");
            }
        }
    }
}

/// Checks `done` every 20 ms until it holds; after `secs` seconds, the error `late` makes
/// (with the wait appended).
async fn wait_until(
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

/// Checks the per-topic results of an admin call; `fine` (the topic already being as
/// wanted) counts as success.
fn admin_results(
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

/// A partition's (low, high) offsets. A topic created a moment ago may be unknown to a
/// client for a while: that is retried for 30 s.
fn watermarks<C: ClientContext>(
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

fn reply_to(m: &rdkafka::message::OwnedMessage) -> Option<ReplyTo> {
    let headers = m.headers()?;
    let mut topic = None;
    let mut tag = None;
    for h in headers.iter() {
        match h.key {
            REPLY_HEADER => topic = h.value,
            SLOT_HEADER => tag = h.value,
            _ => {}
        }
    }
    let mut r = Reader(tag?);
    Some(ReplyTo {
        topic: String::from_utf8(topic?.to_vec()).ok()?,
        request: r.u64()?,
        slot: r.u32()?,
        values: r.u8()? != 0,
    })
}

/// Answers each statement of a task batch with one record on its node's reply topic:
/// `[0][n] (slot, outcome, metrics)*`, or `[1] message` when the task failed.
fn send_replies(
    replier: &Replier,
    stats: &KafkaStats,
    asks: Vec<(usize, ReplyTo)>,
    result: Result<Vec<Answer>>,
) {
    // (reply topic, request) → (slot, values wanted, the event's index in the batch)
    type Slots = Vec<(u32, bool, usize)>;
    let mut by_request: BTreeMap<(String, u64), Slots> = BTreeMap::new();
    for (i, r) in asks {
        by_request
            .entry((r.topic, r.request))
            .or_default()
            .push((r.slot, r.values, i));
    }
    for ((topic, request), slots) in by_request {
        let mut out = Vec::with_capacity(16 + slots.len() * 16);
        match &result {
            Ok(answers) => {
                out.push(0);
                out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
                for (slot, values, i) in slots {
                    let (outcome, metrics) = &answers[i];
                    out.extend_from_slice(&slot.to_le_bytes());
                    out.push(match outcome {
                        Outcome::Accepted => 0,
                        Outcome::Late => 1,
                        Outcome::Duplicate => 2,
                    });
                    let metrics: &[(String, Vec<Value>)] = if values { metrics } else { &[] };
                    out.extend_from_slice(&(metrics.len() as u32).to_le_bytes());
                    for (name, vals) in metrics {
                        out.extend_from_slice(&(name.len() as u32).to_le_bytes());
                        out.extend_from_slice(name.as_bytes());
                        codec::encode_row(vals, &mut out);
                    }
                }
            }
            Err(e) => {
                out.push(1);
                out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
                for (slot, _, _) in &slots {
                    out.extend_from_slice(&slot.to_le_bytes());
                }
                out.extend_from_slice(e.to_string().as_bytes());
            }
        }
        let key = request.to_le_bytes();
        let record = BaseRecord::to(&topic).key(&key[..]).payload(&out);
        match replier.send(record) {
            Ok(()) => {
                stats.replies_sent.fetch_add(1, Ordering::Relaxed);
            }
            Err((e, _)) => {
                stats.replies_failed.fetch_add(1, Ordering::Relaxed);
                eprintln!("eddy: kafka: replying: {e}");
            }
        }
    }
}

/// Fills a waiting statement's slots from one reply record.
fn deliver_reply(pending: &Mutex<HashMap<u64, Gather>>, key: Option<&[u8]>, value: Option<&[u8]>) {
    let (Some(key), Some(value)) = (key, value) else {
        return;
    };
    let Some(request) = key.try_into().ok().map(u64::from_le_bytes) else {
        return;
    };
    let mut pending = pending.lock().expect("pending lock");
    let Some(gather) = pending.get_mut(&request) else {
        return; // a statement of an earlier life of the node, or one that timed out
    };
    let mut r = Reader(value);
    let parsed = (|| -> Option<std::result::Result<Vec<(u32, Answer)>, String>> {
        let failed = r.u8()? == 1;
        let n = r.u32()? as usize;
        if failed {
            for _ in 0..n {
                r.u32()?;
            }
            return Some(Err(String::from_utf8_lossy(r.0).into_owned()));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let slot = r.u32()?;
            let outcome = match r.u8()? {
                0 => Outcome::Accepted,
                1 => Outcome::Late,
                _ => Outcome::Duplicate,
            };
            let m = r.u32()? as usize;
            let mut metrics = Vec::with_capacity(m);
            for _ in 0..m {
                let len = r.u32()? as usize;
                let name = String::from_utf8(r.take(len)?.to_vec()).ok()?;
                let vals = codec::read_row(&mut r)?;
                metrics.push((name, vals));
            }
            out.push((slot, (outcome, metrics)));
        }
        Some(Ok(out))
    })();
    let answers = match parsed {
        Some(Ok(a)) => a,
        Some(Err(message)) => {
            if let Some(done) = pending.remove(&request).and_then(|mut g| g.done.take()) {
                let _ = done.send(Err(Error::internal(message)));
            }
            return;
        }
        None => {
            if let Some(done) = pending.remove(&request).and_then(|mut g| g.done.take()) {
                let _ = done.send(Err(Error::internal("kafka: an unreadable reply")));
            }
            return;
        }
    };
    for (slot, answer) in answers {
        if let Some(s) = gather.answers.get_mut(slot as usize) {
            if s.is_none() {
                gather.missing -= 1;
            }
            *s = Some(answer);
        }
    }
    if gather.missing == 0 {
        if let Some(mut g) = pending.remove(&request) {
            let answers = g
                .answers
                .into_iter()
                .map(|a| a.expect("answered"))
                .collect();
            if let Some(done) = g.done.take() {
                let _ = done.send(Ok(answers));
            }
        }
    }
}

/// The task consumer's context: an assigned partition starts at its task's position
/// (its checkpointed log end, or what this process already applied), else at the
/// beginning of the topic.
struct TaskContext {
    positions: Positions,
    assigned: Arc<Mutex<HashSet<(String, i32)>>>,
    stats: Arc<KafkaStats>,
}

impl ClientContext for TaskContext {}

impl ConsumerContext for TaskContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let positions = self.positions.lock().expect("positions lock").clone();
                let wanted: Vec<(String, i32, Offset)> = tpl
                    .elements()
                    .iter()
                    .map(|e| {
                        let key = (e.topic().to_string(), e.partition());
                        // Offset 0 rather than `Beginning`, which costs one ListOffsets
                        // round trip per partition (seconds for a thousand of them); where
                        // retention removed it, `auto.offset.reset` moves to the start.
                        let offset = Offset::Offset(positions.get(&key).copied().unwrap_or(0));
                        (key.0, key.1, offset)
                    })
                    .collect();
                for (topic, partition, offset) in wanted {
                    let _ = tpl.set_partition_offset(&topic, partition, offset);
                }
                self.stats.assignments.fetch_add(1, Ordering::Relaxed);
                match consumer.assign(tpl) {
                    Ok(()) => {
                        *self.assigned.lock().expect("assigned lock") = tpl
                            .elements()
                            .iter()
                            .map(|e| (e.topic().to_string(), e.partition()))
                            .collect();
                    }
                    Err(e) => eprintln!("eddy: kafka: assigning partitions: {e}"),
                }
            }
            _ => {
                self.assigned.lock().expect("assigned lock").clear();
                let _ = consumer.unassign();
            }
        }
    }
}
