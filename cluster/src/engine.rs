//! The engine: the handle the front end uses to run statements on the node's shards,
//! through its log, and to take checkpoints.
//!
//! Invariant: every event reaches a task through the log (`EventLog::ingest`), so what a
//! task applied is always a prefix of its log, and a checkpoint covers only what the log
//! holds durably.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio::sync::{mpsc, oneshot};

use eddy_planner::catalog::{Catalog, MetricDef, StreamDef};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::command::{Answers, Command, Job, PendingMeta, TaskReport};
use crate::exec::events::{Outcome, Row};
use crate::exec::history::{self, Ask, HistoryPage, Probe, Replay, PAGE_EVENTS};
use crate::exec::passes::Passes;
use crate::exec::task::MetricValues;
use crate::exec::watch::{WatchId, WatchTarget, Watcher};
use crate::log::{EventLog, LogFuture, TaskBatch, Turn};
use crate::node::durable::NodeStorage;
use crate::node::shards::{engine_gone, Shards};
use crate::node::transfer::Staged;
use crate::placement::{Pinning, Place};
use crate::route::{partition_for, route, TaskId};
use smallvec::SmallVec;

/// The reply for one inserted event: each partitioner's outcome, and the values of every
/// metric of the stream (creation order) for the event's groups.
#[derive(Clone, Debug, Default)]
pub struct EventReply {
    /// Inline: most streams have one or two partitioners.
    pub outcomes: SmallVec<[Outcome; 2]>,
    pub metrics: MetricValues,
}

/// One shard, for SHOW SHARDS.
#[derive(Clone, Debug)]
pub struct ShardReport {
    pub shard: usize,
    pub place: Option<Place>,
    pub tasks: usize,
    /// Events its tasks accepted (a stream with two partitioners counts twice).
    pub events: u64,
    pub queue_depth: usize,
}

/// Checkpoint counters, for SHOW STORAGE and /metrics.
#[derive(Debug, Default)]
pub struct CheckpointStats {
    pub count: AtomicU64,
    /// The synchronous stage (until every shard has paused in turn: L1 flush, task records).
    pub last_sync_micros: AtomicU64,
    pub last_total_micros: AtomicU64,
    pub sync_micros_total: AtomicU64,
    pub total_micros_total: AtomicU64,
    /// Checkpoints that failed (a full disk, say): the log keeps what they would have
    /// covered, and the next one tries again.
    pub failed: AtomicU64,
    /// Whether the last checkpoint failed.
    pub last_failed: std::sync::atomic::AtomicBool,
    /// Called with the duration of every checkpoint taken or tried (`/metrics`' histogram).
    pub on_done: std::sync::OnceLock<CheckpointHook>,
}

/// What the node calls after each checkpoint, with its duration.
pub struct CheckpointHook(pub Box<dyn Fn(std::time::Duration) + Send + Sync>);

impl std::fmt::Debug for CheckpointHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CheckpointHook")
    }
}

/// A subscription's watcher on a node of a cluster: past the node's lease it ends the
/// subscription (57P03) rather than deliver changes the node may no longer answer for.
struct Fenced {
    inner: Arc<dyn Watcher>,
    remote: Arc<dyn Remote>,
}

impl Watcher for Fenced {
    fn deliver(&self, changes: &[crate::exec::watch::Change]) -> bool {
        if let Err(e) = self.remote.lease() {
            self.inner.end(e);
            return false;
        }
        self.inner.deliver(changes)
    }

    fn end(&self, error: eddy_planner::Error) {
        self.inner.end(error)
    }
}

/// A peer to read tasks from: its address, and the generation of the plan that makes
/// them active there (the peer refuses a read made under another plan).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PeerAt {
    pub addr: String,
    pub generation: u64,
}

/// Partitions to read by the peer they are active on.
type ByPeer = BTreeMap<PeerAt, Vec<u32>>;

/// How long a read retries while its tasks change hands or this node renews its lease.
const READ_RETRY: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs a read again while it fails with a retryable error (57P03), for at most
/// `READ_RETRY`.
async fn retried<T, F, Fut>(mut read: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = std::time::Instant::now() + READ_RETRY;
    loop {
        match read().await {
            Err(e)
                if e.kind == eddy_planner::ErrorKind::Unavailable
                    && std::time::Instant::now() < deadline =>
            {
                tokio::time::sleep(std::time::Duration::from_millis(25)).await
            }
            done => return done,
        }
    }
}

/// Reads of tasks active on other nodes (cluster mode); `peer` implements it.
pub trait Remote: Send + Sync {
    /// Where a read of `task` goes: `None` to this node, which may answer it now, or the
    /// node it is active on. Past this node's lease, or while the task changes hands, a
    /// retryable error (57P03).
    fn owner(&self, task: &TaskId) -> Result<Option<PeerAt>>;

    /// `Ok` while this node holds its lease (it may answer for the tasks it holds).
    fn lease(&self) -> Result<()>;

    /// A metric's rows in some of a peer's tasks (all groups, or the one of `key`).
    fn metric_rows<'a>(
        &'a self,
        peer: PeerAt,
        stream: &'a str,
        partitioner: usize,
        partitions: Vec<u32>,
        metric: &'a str,
        key: Option<&'a [Value]>,
    ) -> LogFuture<'a, Vec<Vec<Value>>>;

    /// A stream's stored events in some of a peer's tasks (partitioner 0).
    fn stream_rows<'a>(
        &'a self,
        peer: PeerAt,
        stream: &'a str,
        partitions: Vec<u32>,
    ) -> LogFuture<'a, Vec<Row>>;

    /// A page of a peer's task for a history read (`Task::history_page`).
    fn history_page<'a>(
        &'a self,
        peer: PeerAt,
        task: &'a TaskId,
        after: i64,
        upto: i64,
        max: usize,
    ) -> LogFuture<'a, HistoryPage>;

    /// Whether this node holds a copy (active or replica) of `task`.
    fn holds(&self, task: &TaskId) -> bool;

    /// Feeds `watcher` the changes of a metric's tasks this node holds no copy of, from
    /// the nodes they are active on, following the plan, until it is aborted or the
    /// watcher goes away.
    fn watch(
        &self,
        stream: String,
        partitioner: usize,
        metric: String,
        watcher: Arc<dyn Watcher>,
    ) -> tokio::task::AbortHandle;
}

/// Task `partition` of the partitioner that runs `metric`.
fn metric_task(stream: &StreamDef, metric: &MetricDef, partition: u32) -> TaskId {
    TaskId {
        stream: stream.name.clone(),
        partitioner: metric.partitioner,
        partition,
    }
}

/// The time now, in µs since 1970.
pub fn wall_clock_us() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}

/// The task (partition) of `metric`'s group with these group-by values; `None`: every
/// task (no key, or one without the partitioner column).
fn key_partition(stream: &StreamDef, metric: &MetricDef, key: Option<&[Value]>) -> Option<u32> {
    match (key, stream.partitioners.get(metric.partitioner)) {
        (Some(k), Some(col)) => {
            let pos = metric.group_by.iter().position(|c| c == col);
            pos.map(|pos| partition_for(&k[pos], stream.partitions))
        }
        (Some(_), None) => Some(0),
        _ => None,
    }
}

/// What a replay reads of one task: the events with `after < ts <= end` that the task
/// had applied up to its event `last` when the read began, none of those past `needed`
/// lost to retention meanwhile.
#[derive(Clone)]
struct Read {
    after: i64,
    end: i64,
    last: u64,
    needed: i64,
    /// The first page's span of event time.
    span: i64,
}

/// Pages with fewer events are replayed on the reader's own thread.
const SMALL_PAGE: usize = 2048;

impl Read {
    /// The read that makes `metric`'s state exact from `first` on, up to `end` (never
    /// past the task's time), from the task as `now` found it.
    fn of(metric: &MetricDef, first: i64, end: i64, now: &HistoryPage, time: i64) -> Read {
        let after = history::read_from(metric, first);
        // The stored events span at most from the horizon to T.
        let stored = time.saturating_sub(now.horizon.max(after)).max(1) as i128;
        Read {
            after,
            end: end.min(time),
            last: now.seq,
            // Events at or before the horizon were gone already (`history::start`).
            needed: after.max(now.horizon),
            span: (stored * PAGE_EVENTS as i128 / now.stored.max(1) as i128)
                .clamp(1_000_000, i64::MAX as i128) as i64,
        }
    }
}

/// Where a metric's history stands, before it is read.
#[derive(Debug, Default)]
pub struct HistoryBounds {
    /// The latest event time (µs) from which every task's rows are given, when some
    /// task holds events before it whose windows reach past its retention horizon.
    pub starts: Option<i64>,
    /// The latest stream time among the tasks (`None`: no event yet).
    pub latest: Option<i64>,
}

pub struct Engine {
    shards: Shards,
    /// Where reads of tasks active elsewhere go (cluster mode).
    remote: std::sync::OnceLock<Arc<dyn Remote>>,
    log: Arc<dyn EventLog>,
    /// Where tasks keep events and state (`None`: in memory).
    storage: Option<Arc<NodeStorage>>,
    /// Held while a checkpoint runs.
    checkpointing: tokio::sync::Mutex<()>,
    /// Set by the last checkpoint (at shutdown): no other runs after it.
    closed: std::sync::atomic::AtomicBool,
    pub checkpoints: CheckpointStats,
    /// The catalog installed last.
    catalog: std::sync::Mutex<Arc<Catalog>>,
    /// Feeds of subscriptions from tasks active on other nodes (cluster mode).
    remote_watches: std::sync::Mutex<std::collections::HashMap<WatchId, tokio::task::AbortHandle>>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.shards.count())
            .field("log", &self.log)
            .finish()
    }
}

impl Engine {
    /// Starts `shards` shard threads. Every ingested event goes through `log` (made
    /// durable there, where the log keeps anything) before a task applies it.
    pub fn start(
        shards: usize,
        log: Arc<dyn EventLog>,
        storage: Option<Arc<NodeStorage>>,
    ) -> Engine {
        Engine::start_pinned(shards, None, log, storage)
    }

    /// `start`, with shard i pinned to `pinning`'s place i.
    pub fn start_pinned(
        shards: usize,
        pinning: Option<Arc<Pinning>>,
        log: Arc<dyn EventLog>,
        storage: Option<Arc<NodeStorage>>,
    ) -> Engine {
        let shards = Shards::start(shards, storage.clone(), pinning);
        Engine {
            shards,
            log,
            remote: std::sync::OnceLock::new(),
            storage,
            checkpointing: tokio::sync::Mutex::new(()),
            closed: Default::default(),
            checkpoints: CheckpointStats::default(),
            catalog: Default::default(),
            remote_watches: Default::default(),
        }
    }

    pub fn storage(&self) -> Option<&Arc<NodeStorage>> {
        self.storage.as_ref()
    }

    /// Takes a checkpoint of every task. The store is held; each shard in turn pauses,
    /// flushes its L1 caches into the held store, takes each task's record (log offset,
    /// window edges, reservoir mark), freezes its cut and goes on, without waiting for the
    /// other shards; then RocksDB takes the cuts and the records and snapshots itself; the
    /// checkpoint is committed, and the logs are truncated to what it covers. Returns
    /// (synchronous, total) time: the first until every shard has its cut. Fails once
    /// the node has taken its last checkpoint.
    pub async fn checkpoint(&self) -> Result<(std::time::Duration, std::time::Duration)> {
        self.checkpoint_unless_closed(false).await
    }

    /// Takes the node's last checkpoint (clean shutdown): no checkpoint runs after it,
    /// so nothing touches the state directory once it returns.
    pub async fn last_checkpoint(&self) -> Result<(std::time::Duration, std::time::Duration)> {
        self.checkpoint_unless_closed(true).await
    }

    /// Takes a checkpoint and then, with no other checkpoint (nor task install or
    /// reshard) until it returns, runs `copy` with the checkpoint's number on a blocking
    /// thread: a backup, while nothing that checkpoint reads may be deleted.
    pub async fn checkpoint_then<T: Send + 'static>(
        &self,
        copy: impl FnOnce(u64) -> Result<T> + Send + 'static,
    ) -> Result<T> {
        let _one = self.checkpointing.lock().await;
        if self.is_closing() {
            return Err(Error::internal("the node took its last checkpoint"));
        }
        self.checkpoint_now().await?;
        let n = self
            .storage
            .as_ref()
            .and_then(|s| s.current_checkpoint())
            .ok_or_else(|| Error::internal("this engine keeps no state on disk"))?;
        tokio::task::spawn_blocking(move || copy(n))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
    }

    pub fn is_closing(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    async fn checkpoint_unless_closed(
        &self,
        last: bool,
    ) -> Result<(std::time::Duration, std::time::Duration)> {
        let _one = self.checkpointing.lock().await;
        let closed = match last {
            true => self.closed.swap(true, Ordering::SeqCst),
            false => self.is_closing(),
        };
        if closed {
            return Err(Error::internal("the node took its last checkpoint"));
        }
        self.checkpoint_now().await
    }

    async fn checkpoint_now(&self) -> Result<(std::time::Duration, std::time::Duration)> {
        let c = &self.checkpoints;
        let previous_committed = !c.last_failed.load(Ordering::SeqCst);
        let started = Instant::now();
        let result = self.checkpoint_attempt(previous_committed).await;
        if let Some(hook) = c.on_done.get() {
            (hook.0)(started.elapsed());
        }
        c.last_failed.store(result.is_err(), Ordering::SeqCst);
        if result.is_err() {
            c.failed.fetch_add(1, Ordering::Relaxed);
        }
        result
    }

    async fn checkpoint_attempt(
        &self,
        previous_committed: bool,
    ) -> Result<(std::time::Duration, std::time::Duration)> {
        let Some(storage) = &self.storage else {
            return Err(Error::internal("this engine keeps no state on disk"));
        };
        let started = Instant::now();
        // From here each shard writes to its part of the held store's overlay: what it
        // writes up to its pause (the L1 flush) becomes its cut, and RocksDB takes the cuts
        // in once every shard has one.
        storage.store.hold(self.shards());
        let paused = async {
            let replies = self
                .shards
                .ask_all(|reply| Command::Checkpoint {
                    previous_committed,
                    reply,
                })
                .await?;
            let (mut ends, mut records) = (Vec::new(), Vec::new());
            let mut failure = None;
            for reply in replies {
                match reply {
                    Ok((e, r)) => {
                        ends.extend(e);
                        records.extend(r);
                    }
                    Err(e) => failure = failure.or(Some(e)),
                }
            }
            failure.map_or(Ok((ends, records)), Err)
        };
        let (ends, records) = match paused.await {
            Ok(paused) => paused,
            Err(e) => {
                let _ = storage.store.release();
                return Err(e);
            }
        };
        // The shards go on while RocksDB copies itself: later writes wait in the overlay,
        // so the copy has exactly the state the task records describe.
        let sync = started.elapsed();
        // Below the shards' priority, the task records (with their reservoirs' fsyncs):
        // encoding the open events is the CPU-heavy part, and nothing waits for it.
        let records = in_background(move || {
            records
                .into_iter()
                .map(PendingMeta::finish)
                .collect::<Result<Vec<_>>>()
        })
        .await
        .and_then(|records| records);
        // What the cuts hold was written to the log before the shards took it; with
        // `synchronous_commit = off` it may not be durable yet, and the checkpoint must
        // not cover what a crash could still lose.
        let records = match records {
            Ok(records) => self.log.sync().await.map(|_| records),
            Err(e) => Err(e),
        };
        // At the shards' priority (they may wait for the store's locks meanwhile), off
        // the async threads: the snapshot, the release of the later writes (whatever
        // happened to the records), the commit.
        let storage = storage.clone();
        tokio::task::spawn_blocking(move || {
            let snapshot = records.and_then(|r| storage.snapshot(&r));
            let released = storage
                .store
                .release()
                .map_err(crate::node::durable::state_error);
            let n = snapshot?;
            released?;
            storage.commit(n)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        for (task, end) in &ends {
            self.log.truncate(task, *end);
        }
        let total = started.elapsed();
        let c = &self.checkpoints;
        c.count.fetch_add(1, Ordering::Relaxed);
        c.last_sync_micros
            .store(sync.as_micros() as u64, Ordering::Relaxed);
        c.last_total_micros
            .store(total.as_micros() as u64, Ordering::Relaxed);
        c.sync_micros_total
            .fetch_add(sync.as_micros() as u64, Ordering::Relaxed);
        c.total_micros_total
            .fetch_add(total.as_micros() as u64, Ordering::Relaxed);
        Ok((sync, total))
    }

    /// Replaces a task with a checkpoint received from a peer (`node::transfer`), on
    /// the task's shard, between checkpoints (the store must not be held meanwhile).
    /// Returns the log offset the task resumes from.
    pub async fn install_task(&self, task: &TaskId, staged: Staged) -> Result<u64> {
        let _one = self.checkpointing.lock().await;
        let (reply, rx) = tokio::sync::oneshot::channel();
        let cmd = Command::Install {
            task: task.clone(),
            staged,
            reply,
        };
        self.shards.send_to(task, cmd).await?;
        rx.await.map_err(|_| engine_gone())?
    }

    /// Changes the number of shards (`None`: one per core, as `--shards auto`) while
    /// the node runs: tasks move to their new shards with their state, between two
    /// checkpoints. Returns the new count.
    pub async fn reshard(&self, count: Option<usize>) -> Result<usize> {
        let _one = self.checkpointing.lock().await;
        if self.is_closing() {
            return Err(engine_gone());
        }
        self.shards.reshard(count).await
    }

    /// Runs stateless work (parsing and checking rows) on the next shard in turn: the
    /// round-robin balancer. Key-routed work goes through `ingest`; what every shard
    /// needs (a catalog) through `apply_catalog`: the two others.
    pub fn run_anywhere(&self, job: Job) {
        self.shards.run_anywhere(job)
    }

    /// The node's log.
    pub fn log(&self) -> &Arc<dyn EventLog> {
        &self.log
    }

    /// The node's log as its concrete kind, if it is one: `engine.log_as::<Kafka>()`.
    pub fn log_as<L: EventLog>(&self) -> Option<&L> {
        self.log.as_any().downcast_ref::<L>()
    }

    /// Brings every task up to its log's end, from its checkpoint (at start, after the
    /// catalog is installed). Returns how many events were replayed.
    pub async fn recover(&self, catalog: &Catalog) -> Result<u64> {
        let applied = self.shards.log_ends().await?;
        self.log.recover(&self.shards, catalog, applied).await
    }

    /// Brings the log in line with a new catalog (DDL), before the shards install it.
    pub async fn install_log(&self, current: &Catalog, next: &Catalog) -> Result<()> {
        self.log.install(current, next).await
    }

    pub fn shards(&self) -> usize {
        self.shards.count()
    }

    /// Installs a catalog on every shard: creates and drops tasks, adds and removes
    /// metric nodes (backfilling new ones). Returns when every shard is done.
    pub async fn apply_catalog(&self, catalog: Arc<Catalog>) -> Result<()> {
        let replies = self
            .shards
            .ask_all(|reply| Command::Catalog(catalog.clone(), reply))
            .await?;
        replies.into_iter().collect::<Result<()>>()?;
        *self.catalog.lock().expect("catalog lock") = catalog;
        Ok(())
    }

    /// Refuses (53100) events that would write about `bytes` to the log while the data
    /// directory's free space, less them, is below its reserve. Call before the first
    /// batch of a statement: a statement refused here applied nothing. (Kafka holds the
    /// log in cluster mode; the node's own disk still takes the state and reservoirs.)
    pub fn admit(&self, bytes: u64) -> Result<()> {
        match &self.storage {
            Some(s) => s.space.admit(bytes),
            None => Ok(()),
        }
    }

    /// Routes events to the tasks of every partitioner and gathers the replies per event.
    /// With the embedded log, `durable` waits for the fsync (`synchronous_commit = on`);
    /// otherwise the events are acknowledged once written, and fsynced within the commit
    /// delay.
    pub async fn ingest(
        &self,
        stream: &StreamDef,
        rows: Vec<Row>,
        values: bool,
        durable: bool,
    ) -> Result<Vec<EventReply>> {
        self.ingest_with(stream, rows, None, values, durable).await
    }

    /// `ingest`, with the rows' WHERE results when the stateless stage computed them
    /// (`passes`, one per row): each task takes its rows' share.
    pub async fn ingest_with(
        &self,
        stream: &StreamDef,
        rows: Vec<Row>,
        passes: Option<&Passes>,
        values: bool,
        durable: bool,
    ) -> Result<Vec<EventReply>> {
        self.submit(stream, rows, passes, values, durable, Turn::alone())
            .await
    }

    /// `ingest_with` in two steps: routes the rows and hands them to the log now (the
    /// embedded log appends them before this returns; see `EventLog::ingest`), and returns
    /// the future of their replies. A caller can prepare its next batch while the shards
    /// apply this one, and submit it before awaiting; futures awaited in submission order
    /// keep the batches in that order. With the turns of one `Sequence`, a later future
    /// may also be polled alongside an earlier one (`EventLog::ingest`).
    pub fn submit<'a>(
        &'a self,
        stream: &'a StreamDef,
        rows: Vec<Row>,
        passes: Option<&Passes>,
        values: bool,
        durable: bool,
        turn: Turn,
    ) -> impl Future<Output = Result<Vec<EventReply>>> + Send + 'a {
        let n = rows.len();
        let passes = passes.filter(|p| p.len() == n);
        let (places, batches): (Vec<_>, Vec<_>) = route(stream, &rows)
            .into_iter()
            .map(|(p, task, indexes, rows)| {
                let passes = passes.map(|all| all.select(&indexes));
                ((p, indexes), TaskBatch { task, rows, passes })
            })
            .unzip();
        let answers = self
            .log
            .ingest(&self.shards, stream, batches, values, durable, turn);
        async move {
            let answers = answers.await?;
            let mut replies = vec![EventReply::default(); n];
            // Partitioner order is kept so metric values come out in creation order.
            let mut per_partitioner: Vec<Vec<(usize, MetricValues)>> =
                vec![Vec::new(); stream.partitioner_count()];
            for ((p, indexes), answers) in places.into_iter().zip(answers) {
                for (i, (outcome, vals)) in indexes.into_iter().zip(answers) {
                    replies[i].outcomes.push(outcome);
                    per_partitioner[p].push((i, vals));
                }
            }
            for list in per_partitioner {
                for (i, vals) in list {
                    let metrics = &mut replies[i].metrics;
                    match metrics.is_empty() {
                        true => *metrics = vals,
                        false => metrics.extend(vals),
                    }
                }
            }
            Ok(replies)
        }
    }

    /// `ingest` for events already routed: each task's batch, in order; the answers per
    /// batch.
    pub async fn ingest_batches(
        &self,
        stream: &StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        durable: bool,
    ) -> Result<Vec<Answers>> {
        self.log
            .ingest(
                &self.shards,
                stream,
                batches,
                values,
                durable,
                Turn::alone(),
            )
            .await
    }

    /// Sends reads of tasks active on other nodes to them (cluster mode).
    pub fn set_remote(&self, remote: Arc<dyn Remote>) {
        let _ = self.remote.set(remote);
    }

    /// The partitions of `0..count` this node reads itself, and the others by the node
    /// they are active on.
    fn split_by_owner(
        &self,
        stream: &str,
        partitioner: usize,
        partitions: impl Iterator<Item = u32>,
    ) -> Result<(Vec<u32>, ByPeer)> {
        let mut local = Vec::new();
        let mut remote = ByPeer::new();
        for partition in partitions {
            let task = TaskId {
                stream: stream.to_string(),
                partitioner,
                partition,
            };
            match self
                .remote
                .get()
                .map(|r| r.owner(&task))
                .transpose()?
                .flatten()
            {
                Some(peer) => remote.entry(peer).or_default().push(partition),
                None => local.push(partition),
            }
        }
        Ok((local, remote))
    }

    /// The current rows of a metric; with `key` (all group-by values) only that group,
    /// read from the one task that owns it. In a cluster, each task is read where it is
    /// active; a read is retried while its tasks change hands.
    pub async fn metric_rows(
        &self,
        stream: &StreamDef,
        metric: &MetricDef,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        retried(|| self.metric_rows_once(stream, metric, key.clone())).await
    }

    async fn metric_rows_once(
        &self,
        stream: &StreamDef,
        metric: &MetricDef,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        let p = metric.partitioner;
        let partition = key_partition(stream, metric, key.as_deref());
        let parts = (0..stream.tasks_per_partitioner())
            .filter(|part| partition.is_none_or(|only| only == *part));
        let (local, elsewhere) = self.split_by_owner(&stream.name, p, parts)?;
        let mut rows = self
            .local_metric_rows(&stream.name, p, &local, &metric.name, key.clone())
            .await?;
        if let Some(remote) = self.remote.get() {
            for (peer, parts) in elsewhere {
                rows.extend(
                    remote
                        .metric_rows(peer, &stream.name, p, parts, &metric.name, key.as_deref())
                        .await?,
                );
            }
        }
        Ok(rows)
    }

    /// A metric's rows in some of this node's tasks (all groups, or the one of `key`).
    pub async fn local_metric_rows(
        &self,
        stream: &str,
        partitioner: usize,
        partitions: &[u32],
        metric: &str,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        let mut rows = Vec::new();
        let mut waits = Vec::new();
        for &partition in partitions {
            let task = TaskId {
                stream: stream.to_string(),
                partitioner,
                partition,
            };
            // A point read borrows the task's shard when it is idle: no thread hop.
            if let Some(found) = key
                .as_deref()
                .and_then(|key| self.shards.read_group(&task, metric, key))
            {
                rows.extend(found);
                continue;
            }
            let (tx, rx) = oneshot::channel();
            let cmd = Command::MetricRows {
                task: task.clone(),
                metric: metric.to_string(),
                key: key.clone(),
                reply: tx,
            };
            self.shards.send_to(&task, cmd).await?;
            waits.push(rx);
        }
        for rx in waits {
            rows.extend(rx.await.map_err(|_| engine_gone())?);
        }
        Ok(rows)
    }

    /// The events stored for a stream (from its first partitioner's tasks), each task's
    /// read where it is active.
    pub async fn stream_rows(&self, stream: &StreamDef) -> Result<Vec<Row>> {
        let Some(remote) = self.remote.get() else {
            return self.local_stream_rows(&stream.name, None).await;
        };
        retried(|| async {
            let (local, elsewhere) =
                self.split_by_owner(&stream.name, 0, 0..stream.tasks_per_partitioner())?;
            let mut rows = self.local_stream_rows(&stream.name, Some(&local)).await?;
            for (peer, parts) in elsewhere {
                rows.extend(remote.stream_rows(peer, &stream.name, parts).await?);
            }
            Ok(rows)
        })
        .await
    }

    /// The events stored in some of this node's tasks of a stream (`None`: all).
    pub async fn local_stream_rows(
        &self,
        stream: &str,
        partitions: Option<&[u32]>,
    ) -> Result<Vec<Row>> {
        let mut rows = Vec::new();
        for part in self
            .shards
            .ask_all(|reply| Command::StreamRows {
                stream: stream.to_string(),
                partitions: partitions.map(<[u32]>::to_vec),
                reply,
            })
            .await?
        {
            rows.extend(part?);
        }
        Ok(rows)
    }

    /// A metric's history (`exec::history`): for the events with `from <= ts <= upto`
    /// that its tasks stored before the read began, each event's row, each task's in the
    /// order it applied them. Rows come through the returned channel as they are made: a
    /// reader that stops reading holds the read (its memory is a page and a window), one
    /// that goes away ends it.
    pub fn history(
        self: &Arc<Self>,
        stream: Arc<StreamDef>,
        metric: Arc<MetricDef>,
        from: i64,
        upto: i64,
    ) -> mpsc::Receiver<Result<Vec<Vec<Value>>>> {
        let (tx, rx) = mpsc::channel(2);
        let engine = self.clone();
        tokio::spawn(async move {
            for partition in 0..stream.tasks_per_partitioner() {
                let task = metric_task(&stream, &metric, partition);
                let read = engine.task_history(&task, &stream, &metric, (from, upto), &tx);
                match read.await {
                    Ok(true) => {}
                    Ok(false) => return, // the reader went away
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                }
            }
        });
        rx
    }

    /// Where `metric`'s history starts and its tasks' time, for a read of the events
    /// from `from` on (`history`).
    pub async fn history_bounds(
        &self,
        stream: &StreamDef,
        metric: &MetricDef,
        from: i64,
    ) -> Result<HistoryBounds> {
        let mut bounds = HistoryBounds::default();
        for partition in 0..stream.tasks_per_partitioner() {
            let task = metric_task(stream, metric, partition);
            let now = self.task_now(&task).await?;
            bounds.latest = bounds.latest.max(now.time);
            let start = history::start(metric, now.horizon);
            if now.time.is_some() && from < start {
                let before = retried(|| self.history_page(&task, i64::MIN, start - 1, 1)).await?;
                if !before.events.is_empty() {
                    bounds.starts = bounds.starts.max(Some(start));
                }
            }
        }
        Ok(bounds)
    }

    /// One task's part of `history`; `false` once the reader went away.
    async fn task_history(
        &self,
        task: &TaskId,
        stream: &Arc<StreamDef>,
        metric: &Arc<MetricDef>,
        (from, upto): (i64, i64),
        tx: &mpsc::Sender<Result<Vec<Vec<Value>>>>,
    ) -> Result<bool> {
        let now = self.task_now(task).await?;
        let Some(time) = now.time else {
            return Ok(true); // the task has no event
        };
        let first = from.max(history::start(metric, now.horizon));
        let replay = Replay::new(stream, metric, first, upto)?;
        let read = Read::of(
            metric,
            first,
            upto.saturating_add(stream.lateness_us),
            &now,
            time,
        );
        Ok(self
            .replay_task(task, metric, read, replay, Some(tx))
            .await?
            .is_some())
    }

    /// Reads a task's stored events `read` covers into `replay`, page by page, sending
    /// the rows it gives to `tx`; `None` once the reader went away.
    async fn replay_task(
        &self,
        task: &TaskId,
        metric: &MetricDef,
        read: Read,
        mut replay: Replay,
        tx: Option<&mpsc::Sender<Result<Vec<Vec<Value>>>>>,
    ) -> Result<Option<Replay>> {
        // The first span: about a page at the task's mean density.
        let Read {
            mut after,
            end,
            last,
            needed,
            mut span,
        } = read;
        let page_at = |after: i64, span: i64| {
            let bound = after.saturating_add(span).min(end);
            retried(move || self.history_page(task, after, bound, PAGE_EVENTS))
        };
        let mut page = page_at(after, span).await?;
        loop {
            if page.horizon > after.max(needed) {
                return Err(Error::new(
                    eddy_planner::ErrorKind::NotInPrerequisiteState,
                    format!(
                        "the history of metric \"{}\" fell behind the stream's retention",
                        metric.name
                    ),
                )
                .with_hint("Read a shorter range, or give the stream a longer retention."));
            }
            let (n, through) = (page.events.len(), page.through);
            page.events.retain(|e| e.1 <= last);
            let done = through >= end;
            // The next span: about a page of events at this one's density.
            span = match n {
                0 => span.saturating_mul(4),
                n => ((through.saturating_sub(after).max(1) as i128 * PAGE_EVENTS as i128)
                    / n as i128)
                    .clamp(1, i64::MAX as i128) as i64,
            };
            after = through;
            let run = move |mut replay: Replay| {
                let mut rows = Vec::new();
                replay.push(page, &mut rows)?;
                if done {
                    replay.finish(&mut rows)?;
                }
                Ok::<_, Error>((replay, rows))
            };
            // The next page is read while this one replays; a long replay runs off the
            // caller's thread (a session's, which serves others).
            let next = async {
                match done {
                    true => Ok(None),
                    false => page_at(after, span).await.map(Some),
                }
            };
            let replayed = async {
                if n < SMALL_PAGE {
                    run(replay)
                } else {
                    tokio::task::spawn_blocking(move || run(replay))
                        .await
                        .map_err(|e| Error::internal(format!("history replay: {e}")))?
                }
            };
            let (next, replayed) = tokio::join!(next, replayed);
            let (back, rows) = replayed?;
            replay = back;
            if let Some(tx) = tx.filter(|_| !rows.is_empty()) {
                if tx.send(Ok(rows)).await.is_err() {
                    return Ok(None);
                }
            }
            match next? {
                Some(next) => page = next,
                None => return Ok(Some(replay)),
            }
        }
    }

    /// A metric's rows as they stood when its tasks' stream time was `t` (`AS OF`): every
    /// group with events, or the one of `key` (all group-by values), computed from the
    /// stored events. A time past the stream's is 22023.
    pub async fn metric_rows_as_of(
        &self,
        stream: &Arc<StreamDef>,
        metric: &Arc<MetricDef>,
        t: i64,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        let partition = key_partition(stream, metric, key.as_deref());
        let probe = Probe {
            t,
            ask: Ask::Rows(key),
            tag: 0,
        };
        let answers = self
            .probe(stream, metric, vec![(partition, probe)], true)
            .await?;
        Ok(answers.into_iter().flat_map(|(_, rows)| rows).collect())
    }

    /// The task (partition) of `metric` that holds the group of a stream row.
    pub fn task_of_row(stream: &StreamDef, metric: &MetricDef, row: &[Value]) -> u32 {
        match stream.partitioners.get(metric.partitioner) {
            Some(&col) => partition_for(&row[col], stream.partitions),
            None => 0,
        }
    }

    /// A metric's state at past times, computed from the stored events: each probe is
    /// answered by the task of its key's group (`None`: by every task), as
    /// `exec::history::Probe` says. With `past_only`, a time later than the stream time
    /// of every task asked is refused (22023). Answers come as (tag, rows), by tag.
    pub async fn probe(
        &self,
        stream: &Arc<StreamDef>,
        metric: &Arc<MetricDef>,
        probes: Vec<(Option<u32>, Probe)>,
        past_only: bool,
    ) -> Result<Vec<(usize, Vec<Vec<Value>>)>> {
        let mut by_task: BTreeMap<u32, Vec<Probe>> = BTreeMap::new();
        for (partition, p) in probes {
            match partition {
                Some(part) => by_task.entry(part).or_default().push(p),
                None => {
                    for part in 0..stream.tasks_per_partitioner() {
                        by_task.entry(part).or_default().push(p.clone());
                    }
                }
            }
        }
        let mut runs = Vec::new();
        let mut latest = None;
        for (partition, probes) in by_task {
            let task = metric_task(stream, metric, partition);
            let now = self.task_now(&task).await?;
            latest = latest.max(now.time);
            runs.push((task, probes, now));
        }
        let last_probe = runs.iter().flat_map(|r| &r.1).map(|p| p.t).max();
        if let (true, Some(t)) = (past_only, last_probe) {
            if latest.is_none_or(|l| t > l) && t > wall_clock_us() {
                let at = latest.map_or("it has no event yet".to_string(), |l| {
                    format!("its time is {}", Value::Timestamp(l))
                });
                return Err(Error::new(
                    eddy_planner::ErrorKind::InvalidParameter,
                    format!(
                        "{} is past the time of stream \"{}\": {at}",
                        Value::Timestamp(t),
                        stream.name
                    ),
                )
                .with_hint(
                    "AS OF reads the past: give a time no later than now or the stream's time.",
                ));
            }
        }
        let mut answers = Vec::new();
        for (task, probes, now) in runs {
            let first = probes.iter().map(|p| p.t).min().unwrap_or(i64::MAX);
            let end = probes.iter().map(|p| p.t).max().unwrap_or(i64::MIN);
            let Some(time) = now.time else {
                // No event: every probe sees the empty state.
                let mut replay = Replay::probing(stream, metric, i64::MAX, i64::MIN, probes)?;
                replay.finish(&mut Vec::new())?;
                answers.extend(replay.take_answers());
                continue;
            };
            let end = end.saturating_add(stream.lateness_us);
            let mut read = Read::of(metric, first, end, &now, time);
            // A probe sees the stream time of the last event before it, which is some
            // way before its own: the read starts a few dozen mean gaps between events
            // earlier, so one pass mostly does.
            let gap = time.saturating_sub(now.horizon.max(read.after)) / now.stored.max(1) as i64;
            let mut widen = gap.saturating_mul(64).max(1_000_000);
            read.after = read.after.saturating_sub(widen);
            loop {
                let again = read.clone();
                let replay = Replay::probing(stream, metric, i64::MAX, i64::MIN, probes.clone())?;
                let mut replay = self
                    .replay_task(&task, metric, read, replay, None)
                    .await?
                    .expect("no reader to lose");
                // Exact when every probe's window starts after the read did (the stream
                // time at each probe stays the same: earlier events are older); else
                // again from further back, where that window starts if the replay knew
                // a stream time, otherwise four times further back.
                let from = replay.reads_from();
                if from >= again.after || again.after <= now.horizon {
                    answers.extend(replay.take_answers());
                    break;
                }
                widen = widen.saturating_mul(4);
                read = again;
                read.after = match from {
                    i64::MIN => read.after.saturating_sub(widen),
                    from => from,
                };
                read.needed = read.after.max(now.horizon);
            }
        }
        answers.sort_by_key(|a| a.0);
        Ok(answers)
    }

    /// Where a task stands for a history read (its time, last event, horizon and
    /// stored events): an empty page of it.
    async fn task_now(&self, task: &TaskId) -> Result<HistoryPage> {
        retried(|| self.history_page(task, i64::MIN, i64::MIN, 1)).await
    }

    /// A page of a task's stored events, read where the task is active.
    async fn history_page(
        &self,
        task: &TaskId,
        after: i64,
        upto: i64,
        max: usize,
    ) -> Result<HistoryPage> {
        if let Some(peer) = self
            .remote
            .get()
            .map(|r| r.owner(task))
            .transpose()?
            .flatten()
        {
            let remote = self.remote.get().expect("asked");
            return remote.history_page(peer, task, after, upto, max).await;
        }
        self.local_history_page(task, after, upto, max).await
    }

    /// A page of one of this node's tasks (`Task::history_page`).
    pub async fn local_history_page(
        &self,
        task: &TaskId,
        after: i64,
        upto: i64,
        max: usize,
    ) -> Result<HistoryPage> {
        let (tx, rx) = oneshot::channel();
        let cmd = Command::HistoryPage {
            task: task.clone(),
            after,
            upto,
            max,
            reply: tx,
        };
        self.shards.send_to(task, cmd).await?;
        rx.await.map_err(|_| engine_gone())?
    }

    /// Counters of every task.
    pub async fn report(&self) -> Result<Vec<TaskReport>> {
        self.shards.report().await
    }

    /// Per shard: where it is pinned (if it is), its tasks' ids, and its queue depth.
    pub async fn shard_report(&self) -> Result<Vec<ShardReport>> {
        // Depths first: the report's own command counts in its shard's queue until the
        // shard is done with it, which may be after its answer arrives.
        let depths: Vec<usize> = (0..self.shards.count())
            .map(|i| self.shards.queue_depth(i))
            .collect();
        let reports = self.shards.report_by_shard().await?;
        let pinning = self.shards.pinning();
        Ok(reports
            .into_iter()
            .enumerate()
            .map(|(i, tasks)| ShardReport {
                shard: i,
                place: pinning.as_ref().and_then(|p| p.plan.shards.get(i).copied()),
                tasks: tasks.len(),
                events: tasks.iter().map(|t| t.stats.accepted).sum(),
                queue_depth: depths.get(i).copied().unwrap_or(0),
            })
            .collect())
    }

    /// Attaches a subscription to the tasks of `stream`'s `partitioner`: a metric watch
    /// (the metric runs in that partitioner's tasks) first receives each task's current
    /// rows; a stream watch uses partitioner 0 so each event is seen once. Returns once
    /// every task delivers to it.
    pub async fn watch(
        &self,
        stream: &str,
        partitioner: usize,
        target: WatchTarget,
        id: WatchId,
        watcher: Arc<dyn Watcher>,
    ) -> Result<()> {
        // In a cluster, tasks this node holds no copy of change elsewhere: a peer sends
        // their current rows and changes instead.
        let remote = self
            .remote
            .get()
            .filter(|_| matches!(target, WatchTarget::Metric(_)));
        let quiet: Vec<u32> = match remote {
            Some(r) => (0..self.partition_count(stream, partitioner))
                .filter(|&partition| {
                    !r.holds(&TaskId {
                        stream: stream.to_string(),
                        partitioner,
                        partition,
                    })
                })
                .collect(),
            None => Vec::new(),
        };
        // In a cluster, a subscription ends once this node loses its lease.
        let watcher: Arc<dyn Watcher> = match self.remote.get() {
            Some(remote) => Arc::new(Fenced {
                inner: watcher,
                remote: remote.clone(),
            }),
            None => watcher,
        };
        self.watch_partitions(
            stream,
            partitioner,
            None,
            quiet,
            target.clone(),
            id,
            watcher.clone(),
        )
        .await?;
        if let (Some(remote), WatchTarget::Metric(metric)) = (remote, target) {
            let feed = remote.watch(stream.to_string(), partitioner, metric, watcher);
            self.remote_watches
                .lock()
                .expect("remote watches lock")
                .insert(id, feed);
        }
        Ok(())
    }

    /// The tasks of one partitioner of a stream, as the installed catalog has them.
    fn partition_count(&self, stream: &str, partitioner: usize) -> u32 {
        let catalog = self.catalog.lock().expect("catalog lock").clone();
        catalog
            .stream(stream)
            .filter(|s| partitioner < s.partitioner_count())
            .map_or(0, |s| s.tasks_per_partitioner())
    }

    /// Attaches a watcher to some tasks of this node only (`only`: these partitions, or
    /// all), without the current rows of the `quiet` ones.
    #[allow(clippy::too_many_arguments)]
    pub async fn watch_partitions(
        &self,
        stream: &str,
        partitioner: usize,
        only: Option<Vec<u32>>,
        quiet: Vec<u32>,
        target: WatchTarget,
        id: WatchId,
        watcher: Arc<dyn Watcher>,
    ) -> Result<()> {
        self.shards
            .ask_all(|reply| Command::Watch {
                stream: stream.to_string(),
                partitioner,
                only: only.clone(),
                quiet: quiet.clone(),
                id,
                target: target.clone(),
                watcher: watcher.clone(),
                reply,
            })
            .await?;
        Ok(())
    }

    /// Detaches a subscription from every task.
    pub async fn unwatch(&self, id: WatchId) {
        if let Some(feed) = self
            .remote_watches
            .lock()
            .expect("remote watches lock")
            .remove(&id)
        {
            feed.abort();
        }
        let _ = self.shards.tell_all(|| Command::Unwatch(id)).await;
    }

    /// Quiets the node's background work at shutdown, after the last checkpoint: Kafka's
    /// consumers stop and RocksDB finishes its flushes and compactions.
    pub fn close(&self) {
        self.log.close();
        if let Some(storage) = &self.storage {
            storage.store.close();
        }
    }

    /// Stops the shard threads after they finish the commands already queued.
    pub fn shutdown(self) {
        self.log.close();
        self.shards.stop();
    }
}

/// Runs `work` on a thread of its own at a lower CPU priority than the shards (nice 10):
/// on a busy node, a checkpoint's CPU-heavy finish (encoding the reservoirs' open events)
/// waits for the events rather than delaying them. Never give it work that holds a lock
/// the shards take: they would wait for a thread that yields to everything else.
async fn in_background<T: Send + 'static>(work: impl FnOnce() -> T + Send + 'static) -> Result<T> {
    let (tx, rx) = oneshot::channel();
    std::thread::Builder::new()
        .name("eddy-checkpoint".into())
        .spawn(move || {
            // SAFETY: setpriority has no memory effects; on Linux, PRIO_PROCESS with
            // who = 0 sets the calling thread's nice value only. A failure keeps the
            // thread at the node's priority, which is still correct.
            #[allow(unsafe_code)]
            unsafe {
                libc::setpriority(libc::PRIO_PROCESS, 0, 10)
            };
            let _ = tx.send(work());
        })
        .map_err(|e| Error::internal(format!("cannot start a checkpoint thread: {e}")))?;
    rx.await
        .map_err(|_| Error::internal("the checkpoint thread panicked"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An engine of one shard with stream `p` (one task, returned) and one metric over it:
    /// `CREATE METRIC m AS SELECT card, {aggregates} FROM p WINDOW INFINITE GROUP BY card`.
    async fn one_task(aggregates: &str) -> (Arc<Catalog>, Engine, TaskId) {
        one_task_on(Arc::new(crate::MemoryLog), aggregates).await
    }

    /// `one_task` with the engine on `log`.
    async fn one_task_on(
        log: Arc<dyn EventLog>,
        aggregates: &str,
    ) -> (Arc<Catalog>, Engine, TaskId) {
        let mut catalog = Catalog::default();
        for sql in [
            "CREATE STREAM p (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partitions = 1)"
                .to_string(),
            format!(
                "CREATE METRIC m AS SELECT card, {aggregates} FROM p WINDOW INFINITE GROUP BY card"
            ),
        ] {
            let stmt = eddy_planner::sql::parse_statement(&sql).unwrap();
            catalog = eddy_planner::ddl::apply(&catalog, &stmt).unwrap().0;
        }
        let catalog = Arc::new(catalog);
        let engine = Engine::start(1, log, None);
        engine.apply_catalog(catalog.clone()).await.unwrap();
        let task = TaskId {
            stream: "p".into(),
            partitioner: 0,
            partition: 0,
        };
        (catalog, engine, task)
    }

    /// Runs `attempt` until it gives a value: a shard answers before it lets go of its
    /// lock, so right after an answer it may still hold it for a moment.
    fn once_idle<T>(mut attempt: impl FnMut() -> Option<T>) -> T {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            if let Some(v) = attempt() {
                return v;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the shard stayed busy with nothing to do"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
    }

    /// A checkpoint's background work runs at nice 10, below the shards.
    #[tokio::test]
    async fn background_work_yields_to_the_shards() {
        let stat = in_background(|| std::fs::read_to_string("/proc/thread-self/stat"))
            .await
            .unwrap()
            .unwrap();
        // Field 19 is the nice value; the command name (field 2) ends with ')'.
        let after_name = &stat[stat.rfind(')').unwrap() + 2..];
        let nice: i32 = after_name.split(' ').nth(16).unwrap().parse().unwrap();
        assert_eq!(nice, 10, "{stat}");
    }

    /// A small delivery in log order is applied on the caller's thread when its shard is
    /// idle with nothing pending; one that meets a busy shard queues, and a later one
    /// queues behind it (it must not overtake), so the task applies them in order.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_small_delivery_borrows_an_idle_shard_and_never_overtakes() {
        let (catalog, engine, task) = one_task("LAST_VALUE(amount) AS last").await;
        let event = |i: i64| {
            Row::from(vec![
                Value::Timestamp(1_790_000_000_000_000),
                Value::Text("a".to_string().into()),
                Value::Int(i),
            ])
        };
        let (tx, rx) = std::sync::mpsc::channel();
        let deliver = |i: i64| {
            let tx = tx.clone();
            let reply: crate::command::Reply = Box::new(move |r| {
                let _ = tx.send((i, std::thread::current().id(), r.is_ok()));
            });
            assert!(engine.shards.deliver(
                task.clone(),
                vec![event(i)],
                false,
                i as u64,
                None,
                reply
            ));
        };
        // Idle (once the shard let go of its lock after the catalog): here, at once.
        once_idle(|| engine.shards.cell(0).try_lock().ok().map(drop));
        deliver(1);
        let (i, thread, ok) = rx.try_recv().expect("applied before deliver returned");
        assert_eq!((i, thread, ok), (1, std::thread::current().id(), true));
        // Busy: 2 queues; 3 finds the shard idle a moment later but 2 pending, so it
        // queues too; both are applied on the shard's thread, in order.
        {
            let cell = engine.shards.cell(0);
            let _busy = cell.lock().unwrap();
            deliver(2);
            assert!(rx.try_recv().is_err(), "applied while the shard was held");
        }
        deliver(3);
        let mut order = Vec::new();
        for _ in 0..2 {
            let (i, thread, ok) = rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
            assert!(ok);
            if i == 2 {
                assert_ne!(thread, std::thread::current().id());
            }
            order.push(i);
        }
        assert_eq!(order, vec![2, 3]);
        let key = [Value::Text("a".to_string().into())];
        let stream = catalog.stream("p").unwrap();
        let metric = catalog.metric("m").unwrap();
        let rows = engine
            .metric_rows(stream, metric, Some(key.to_vec()))
            .await
            .unwrap();
        assert_eq!(rows, vec![vec![key[0].clone(), Value::Int(3)]]);
    }

    /// `submit` appends to the embedded log before it returns, so a caller (COPY) can
    /// submit its next batch while the shards apply one; awaited in submission order, the
    /// batches reach the task in that order.
    #[tokio::test]
    async fn submitted_batches_are_logged_at_once_and_applied_in_order() {
        let dir = std::env::temp_dir().join(format!("eddy-engine-submit-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let log =
            Arc::new(crate::LocalLog::open(&dir, std::time::Duration::from_secs(3600)).unwrap());
        let (catalog, engine, task) = one_task_on(log.clone(), "LAST_VALUE(amount) AS last").await;
        let stream = catalog.stream("p").unwrap();
        let card = Value::Text("a".to_string().into());
        // One event time: arrival order alone decides the last value.
        let batch = |from: i64| -> Vec<Row> {
            (from..from + 3)
                .map(|i| {
                    Row::from(vec![
                        Value::Timestamp(1_790_000_000_000_000),
                        card.clone(),
                        Value::Int(i),
                    ])
                })
                .collect()
        };
        let first = engine.submit(stream, batch(0), None, false, true, Turn::alone());
        let second = engine.submit(stream, batch(3), None, false, true, Turn::alone());
        let mut logged = 0;
        log.replay(&task, 0, &mut |_, _| logged += 1).unwrap();
        assert_eq!(
            logged, 6,
            "both batches are logged before either is awaited"
        );
        assert_eq!(first.await.unwrap().len(), 3);
        assert_eq!(second.await.unwrap().len(), 3);
        let metric = catalog.metric("m").unwrap();
        let rows = engine
            .metric_rows(stream, metric, Some(vec![card.clone()]))
            .await
            .unwrap();
        assert_eq!(rows, vec![vec![card, Value::Int(5)]]);
        let amounts: Vec<Value> = engine
            .local_stream_rows("p", None)
            .await
            .unwrap()
            .into_iter()
            .map(|r| r[2].clone())
            .collect();
        assert_eq!(amounts, (0..6).map(Value::Int).collect::<Vec<_>>());
        drop(engine);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// A point read borrows the task's shard when it is idle, sees every acknowledged
    /// statement, and declines (so the lookup queues) while the shard is at work.
    #[tokio::test(flavor = "multi_thread", worker_threads = 1)]
    async fn a_point_read_borrows_an_idle_shard() {
        let (catalog, engine, task) = one_task("COUNT(*) AS n, SUM(amount) AS total").await;
        let stream = catalog.stream("p").unwrap();
        let event = |i: i64, card: &str| {
            Row::from(vec![
                Value::Timestamp(1_790_000_000_000_000 + i),
                Value::Text(card.to_string().into()),
                Value::Int(i),
            ])
        };
        let key = [Value::Text("a".to_string().into())];
        let row = |n: i64, total: i128| {
            vec![vec![
                key[0].clone(),
                Value::Int(n),
                Value::Numeric(total.into()),
            ]]
        };
        for (i, n, total) in [(1, 1, 1), (2, 2, 3)] {
            let rows = vec![event(i, "a"), event(i, "b")];
            engine.ingest(stream, rows, false, true).await.unwrap();
            let read = once_idle(|| engine.shards.read_group(&task, "m", &key));
            assert_eq!(read, row(n, total), "read on the caller, up to date");
        }
        {
            let cell = engine.shards.cell(0);
            let _busy = cell.lock().unwrap();
            assert_eq!(engine.shards.read_group(&task, "m", &key), None);
        }
        let metric = catalog.metric("m").unwrap();
        let queued = engine
            .metric_rows(stream, metric, Some(key.to_vec()))
            .await
            .unwrap();
        assert_eq!(queued, row(2, 3));
        // A command queued and not yet taken by the shard's thread (the lock is free
        // between two wake-ups): records a log delivered to a task that took over. The
        // read declines, and queues behind them.
        let pending = engine.shards.pending(0);
        pending.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        assert_eq!(engine.shards.read_group(&task, "m", &key), None);
        pending.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        assert_eq!(
            once_idle(|| engine.shards.read_group(&task, "m", &key)),
            row(2, 3)
        );
    }
}
