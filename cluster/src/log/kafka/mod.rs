//! Kafka as the node's log (cluster mode, `eddy serve --kafka`): seed 002 §3.1–3.3.
//!
//! Topics (all created by Eddy, all named after the cluster, `eddy` by default, so
//! several clusters can share brokers):
//! - `<cluster>.<stream>.<partitioner>`: one per partitioner of a stream (`all` for a stream
//!   without one), `partitions` partitions; a task is one (topic, partition). A record
//!   holds one event keyed by the partitioner value's text, so a plain Kafka producer
//!   keyed the same way lands on the same task; or, from format 3 (`format::PACKED`), a
//!   statement's run of events for one task, unkeyed, one encoded row after another.
//! - `<cluster>-replies.<node>`: the node's reply topic. An event record names it in a header
//!   with its (request, slot); the task that applies the event answers there, and the
//!   node gathers the answers of every partitioner into one reply per statement.
//! - `<cluster>-catalog`: compacted; one record per object (`stream/<name>`, `metric/<name>`)
//!   holding its creating statement, a tombstone once dropped.
//! - `<cluster>.<stream>.dead-letters`: external records that could not be ingested.
//!
//! - `<cluster>-cluster`: compacted; every node's facts and the leader's plan
//!   (`membership`).
//!
//! Consumer groups: `<cluster>-members`, whose live members are the cluster's live nodes,
//! and `<cluster>-source.<stream>` for each external topic. Task partitions are assigned
//! by hand, as the plan says.
//!
//! The parts: `config` (settings and topic names), `admin` (topics), `produce` (events
//! out, answers back), `consume` (the task consumer), `members` (liveness, facts and
//! plans), `catalog` (the catalog topic) and `sources` (external topics). Each part states
//! its own invariants.

mod admin;
mod catalog;
mod config;
mod consume;
pub mod fence;
mod members;
mod polled;
mod produce;
mod sources;
mod txn;

use std::any::Any;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::{Error, Result};

use crate::log::{Answers, EventLog, LogFuture, TaskBatch, Turn};
use crate::node::shards::{tasks_of, Shards};
use crate::route::TaskId;

use admin::Admin;
use consume::TaskConsumer;
use members::Members;
use produce::Publisher;
use sources::Sources;

pub use config::KafkaConfig;
pub use consume::Recover;
pub use produce::{reply_headers, reply_to, ReplyTo};

/// Records dispatched to tasks per consumer round, and their values' bytes: a round
/// of packed records (format 3) stops at a few of them.
const POLL_BATCH_MAX: usize = 4096;
const POLL_BYTES_MAX: usize = 1 << 20;

/// `EventLog::statement_events_min` by default (`--kafka-statement-events`). A COPY of
/// 500 k events (one 256 KiB parse batch of about 5 300 a statement before) went from
/// 340–360 k to 620–810 k events/s; 16 384 gave 660–750 k, and 65 536 740–790 k.
pub const STATEMENT_EVENTS_MIN: u64 = 32_768;

/// Counters for SHOW STORAGE and /metrics.
#[derive(Debug, Default)]
pub struct KafkaStats {
    pub published: AtomicU64,
    pub consumed: AtomicU64,
    pub replies_sent: AtomicU64,
    /// Replies Kafka did not take (their askers time out).
    pub replies_failed: AtomicU64,
    pub replies_received: AtomicU64,
    /// Replies to this node's own statements, handed over in place of Kafka.
    pub replies_local: AtomicU64,
    /// Reply slots refused: answered under an older plan than the one that made their
    /// task active where it is (`produce::deliver_reply`).
    pub replies_refused: AtomicU64,
    /// Event records this node's producer sent, handed to their tasks here as Kafka
    /// acknowledged them (`consume::Dispatch`), before the consumer read them back.
    pub applied_at_ack: AtomicU64,
    /// Records below a task's position, skipped: applied as Kafka acknowledged them, or
    /// redelivered after a rebalance.
    pub skipped: AtomicU64,
    /// Pauses of the task consumer after a round of records all applied already
    /// (`consume::QUIET`).
    pub quiet_pauses: AtomicU64,
    pub dead_letters: AtomicU64,
    /// Assignments the task consumer received: one per rebalance of the group.
    pub assignments: AtomicU64,
}

pub struct Kafka {
    config: KafkaConfig,
    admin: Admin,
    publisher: Publisher,
    tasks: Arc<TaskConsumer>,
    sources: Sources,
    members: Members,
    /// The node's lease and what it knows of the broker (`fence`).
    pub(super) fence: Arc<fence::Fence>,
    /// The peer service's socket, bound at connect, until the node serves it.
    peer_listener: Mutex<Option<std::net::TcpListener>>,
    peer_addr: std::net::SocketAddr,
    /// Where the other nodes dial it (`--peer-advertise`, else `peer_addr`).
    peer_advertised: String,
    /// This node's handle to itself, for the threads it starts.
    me: Weak<Kafka>,
    stop: Arc<AtomicBool>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// The node's shards, once recovery starts: external records are decoded on them.
    shards: std::sync::OnceLock<Shards>,
    pub stats: Arc<KafkaStats>,
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
        let stats: Arc<KafkaStats> = Arc::default();
        let admin = Admin::new(&config)?;
        let publisher = Publisher::new(&config, stats.clone())?;
        admin
            .create_topics(&[(config.catalog_topic(), 1, true)])
            .await?;
        admin
            .create_topics(&[(publisher.reply_topic().to_string(), 1, false)])
            .await?;
        admin
            .create_topics(&[(config.cluster_topic(), 1, true)])
            .await?;
        let peer_listener = std::net::TcpListener::bind(config.peer_addr).map_err(|e| {
            Error::internal(format!(
                "cannot listen for peers on {}: {e} (set --peer-addr)",
                config.peer_addr
            ))
        })?;
        let peer_addr = peer_listener
            .local_addr()
            .map_err(|e| Error::internal(e.to_string()))?;
        let peer_advertised = match &config.peer_advertise {
            Some(advertised) => advertised.clone(),
            None if peer_addr.ip().is_unspecified() => {
                return Err(Error::internal(format!(
                    "the peer service listens on {peer_addr}, which other nodes cannot dial: \
                     set --peer-advertise HOST:PORT to where they reach it"
                )))
            }
            None => peer_addr.to_string(),
        };
        let stop = Arc::new(AtomicBool::new(false));
        let replies = publisher.start_replies(stop.clone())?;
        let fence = Arc::new(fence::Fence::new(members::silence(config.session_timeout)));
        Ok(Arc::new_cyclic(|me| Kafka {
            config,
            admin,
            publisher,
            tasks: Arc::default(),
            sources: Sources::default(),
            members: Members::default(),
            fence,
            peer_listener: Mutex::new(Some(peer_listener)),
            peer_addr,
            peer_advertised,
            me: me.clone(),
            stop,
            threads: Mutex::new(vec![replies]),
            shards: std::sync::OnceLock::new(),
            stats,
        }))
    }

    fn me(&self) -> Result<Arc<Kafka>> {
        self.me
            .upgrade()
            .ok_or_else(|| Error::internal("kafka: the node is shutting down"))
    }

    pub fn config(&self) -> &KafkaConfig {
        &self.config
    }

    /// A handle that does not keep the node alive.
    pub fn weak(&self) -> Weak<Kafka> {
        self.me.clone()
    }

    /// The node's lease (`fence`).
    pub fn fence(&self) -> &Arc<fence::Fence> {
        &self.fence
    }

    /// Where the peer service listens.
    pub fn peer_addr(&self) -> std::net::SocketAddr {
        self.peer_addr
    }

    /// Where the other nodes dial the peer service.
    pub fn peer_advertised(&self) -> &str {
        &self.peer_advertised
    }

    /// The peer service's socket, once: whoever serves it takes it.
    pub fn take_peer_listener(&self) -> Option<std::net::TcpListener> {
        self.peer_listener
            .lock()
            .expect("peer listener lock")
            .take()
    }

    /// The end of a topic partition (the offset its next record will get).
    pub fn high_watermark(&self, topic: &str, partition: i32) -> Result<i64> {
        self.admin.high_watermark(topic, partition)
    }

    /// Brings topics, routes and positions in line with a new catalog: topics of new
    /// streams are created, those of dropped (or re-created) streams deleted.
    pub async fn install(&self, current: &Catalog, next: &Catalog) -> Result<()> {
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
            self.admin.delete_topics(&gone).await?;
        }
        let wanted = self.task_topics(next.streams.values().map(|s| &**s).collect());
        let specs: Vec<(String, u32, bool)> = wanted
            .iter()
            .map(|t| (t.name.clone(), t.partitions, false))
            .collect();
        self.admin.create_topics(&specs).await?;
        self.publisher.await_metadata(&specs).await?;
        self.follow(&wanted).await;
        self.set_tasks(next);
        self.install_sources(next).await
    }

    /// Stops the consumer threads.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        self.publisher.dispatch_at_ack(None);
        let mut threads = std::mem::take(&mut *self.threads.lock().expect("threads lock"));
        let sources = std::mem::take(&mut *self.sources.runs.lock().expect("sources lock"));
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
                tracing::warn!("kafka: a consumer did not close within 20 s; not waiting");
            }
        }
    }

    /// Recovery: this node joins the cluster and waits for a plan that places every task;
    /// each task it holds resumes consuming at its checkpointed offset. Returns once each
    /// of them has applied what its partition held when the plan came.
    async fn catch_up(
        &self,
        shards: &Shards,
        catalog: &Catalog,
        applied: BTreeMap<TaskId, u64>,
    ) -> Result<u64> {
        let _ = self.shards.set(shards.clone());
        self.install(&Catalog::default(), catalog).await?;
        let mut ends = Vec::new();
        for (stream, task) in tasks_of(catalog) {
            let topic = self.config.topic_of(stream, task.partitioner);
            let from = applied.get(&task).copied().unwrap_or(0);
            ends.push((topic, task.partition as i32, from as i64));
        }
        self.resume_at(ends);
        let stale = applied
            .iter()
            .filter(|(_, end)| **end > 0)
            .map(|(t, _)| t.clone())
            .collect();
        let me = self.me()?;
        me.start_members(stale)?;
        self.await_plan(catalog).await?;
        me.start_tasks(shards.clone())?;
        let held = self.roles();
        let mut targets = Vec::new();
        for (stream, task) in tasks_of(catalog).filter(|(_, t)| held.contains_key(t)) {
            let topic = self.config.topic_of(stream, task.partitioner);
            let from = applied.get(&task).copied().unwrap_or(0);
            let high = self.high_watermark(&topic, task.partition as i32)?;
            targets.push((task, from, high.max(0) as u64));
        }
        let started = Instant::now();
        loop {
            let applied = shards.log_ends().await?;
            // A task a newer plan took away from this node (it is not read here any
            // more) has nothing to catch up with.
            let held = self.roles();
            let behind = targets
                .iter()
                .filter(|(t, _, high)| {
                    held.contains_key(t) && applied.get(t).copied().unwrap_or(0) < *high
                })
                .count();
            if behind == 0 {
                break;
            }
            if started.elapsed() > Duration::from_secs(300) {
                return Err(Error::internal(format!(
                    "kafka: {behind} tasks did not catch up with their partitions within 300 s"
                )));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Ok(targets
            .iter()
            .map(|(_, from, high)| high.saturating_sub(*from))
            .sum())
    }

    /// Whether the membership thread runs (after recovery began).
    fn in_cluster(&self) -> bool {
        self.members.started.load(Ordering::Acquire)
    }
}

impl EventLog for Kafka {
    /// Publishes the events to their tasks' topics; whichever node holds a task applies
    /// them and answers on this node's reply topic (in place when it is this node). The
    /// statement goes to Kafka once the one before it in `turn`'s sequence is committed
    /// there; its answers are awaited after `turn` passes to the next.
    fn ingest<'a>(
        &'a self,
        _shards: &'a Shards,
        stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        _durable: bool,
        turn: Turn,
    ) -> LogFuture<'a, Vec<Answers>> {
        Box::pin(async move {
            // The tasks evaluate their WHERE themselves: results do not travel through Kafka.
            let sizes: Vec<usize> = batches.iter().map(|b| b.rows.len()).collect();
            let events: Vec<(TaskId, crate::exec::events::Row)> = batches
                .into_iter()
                .flat_map(|b| {
                    let task = b.task;
                    b.rows.into_iter().map(move |r| (task.clone(), r))
                })
                .collect();
            // While no beat comes back, the broker cannot take the events either: the
            // statement fails at once, having sent nothing.
            if self.in_cluster() && !self.fence.reachable() {
                return Err(Error::new(
                    eddy_planner::ErrorKind::Unavailable,
                    "kafka is unreachable from this node: nothing of the statement was sent",
                )
                .with_hint("Retry once the broker is back; SHOW CLUSTER shows it."));
            }
            let deadline = match crate::log::statement_deadline() {
                Some(at) => (at, at),
                None => {
                    let appended = Instant::now() + produce::APPEND_TIMEOUT;
                    (appended, appended + self.config.session_timeout * 2)
                }
            };
            let floors = {
                let view = self.members.view.read().expect("view lock");
                events
                    .iter()
                    .map(|(task, _)| view.moved.get(task).copied().unwrap_or(0))
                    .collect()
            };
            let mut answers = self
                .publisher
                .publish(stream, events, floors, values, deadline, turn)
                .await?
                .into_iter();
            Ok(sizes
                .into_iter()
                .map(|n| answers.by_ref().take(n).collect())
                .collect())
        })
    }

    fn recover<'a>(
        &'a self,
        shards: &'a Shards,
        catalog: &'a Catalog,
        applied: BTreeMap<TaskId, u64>,
    ) -> LogFuture<'a, u64> {
        Box::pin(self.catch_up(shards, catalog, applied))
    }

    /// Topics follow the catalog, and the catalog topic gets the change.
    fn install<'a>(&'a self, current: &'a Catalog, next: &'a Catalog) -> LogFuture<'a, ()> {
        Box::pin(async move {
            Kafka::install(self, current, next).await?;
            self.publish_catalog(current, next).await?;
            // The new tasks run once the leader (perhaps another node, which learns the
            // catalog from its topic) has placed them.
            if self.in_cluster() {
                if let Err(e) = self.await_plan(next).await {
                    tracing::warn!("{e}");
                }
            }
            Ok(())
        })
    }

    fn close(&self) {
        self.shutdown();
    }

    /// A statement of more than one record is a transaction: begun, sent and committed
    /// one after another in a COPY's sequence, a few milliseconds each.
    fn statement_events_min(&self) -> usize {
        self.config.statement_events
    }

    /// A statement waits for the broker's answer and the librdkafka threads that carry
    /// it: a session thread that polls meanwhile takes the core they need. One durable
    /// pgbench client, two nodes side by side on one warm broker, `--busy-poll 0`
    /// against 100: 2 325–2 488 against 1 604–1 924 statements/s.
    fn poll_while_durable(&self) -> bool {
        false
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
