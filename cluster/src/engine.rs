//! The engine: shard threads that own tasks, and the handle the front end uses to reach
//! them through bounded queues.
//!
//! Invariants: a task lives on exactly one shard (`shard_of`), and only that shard's
//! thread touches it, so the event path takes no lock; every queue is bounded
//! (`SHARD_QUEUE_MAX`), so a flood of statements waits instead of growing memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use eddy_planner::catalog::{Catalog, MetricDef, StreamDef};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::command::{
    reply_to_caller, CheckpointReply, Command, IngestReply, PendingMeta, TaskReport,
};
use crate::durable::{task_meta_key, NodeStorage, TaskMeta};
use crate::events::{Outcome, Row};
use crate::kafka::Kafka;
use crate::log::LocalLog;
use crate::route::{partition_for, route, shard_of, TaskId};
use crate::task::{MetricValues, Task};
use crate::watch::{WatchId, WatchTarget, Watcher};
use eddy_planner::codec;
use eddy_storage::{Family, StateStore};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Commands waiting per shard before senders wait.
pub const SHARD_QUEUE_MAX: usize = 1024;

/// The reply for one inserted event: each partitioner's outcome, and the values of every
/// metric of the stream (creation order) for the event's groups.
#[derive(Clone, Debug, Default)]
pub struct EventReply {
    pub outcomes: Vec<Outcome>,
    pub metrics: MetricValues,
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
}

/// Every task of a catalog, with its stream.
fn tasks_of(catalog: &Catalog) -> impl Iterator<Item = (&Arc<StreamDef>, TaskId)> {
    catalog.streams.values().flat_map(|stream| {
        (0..stream.partitioner_count()).flat_map(move |partitioner| {
            (0..stream.tasks_per_partitioner()).map(move |partition| {
                let task = TaskId {
                    stream: stream.name.clone(),
                    partitioner,
                    partition,
                };
                (stream, task)
            })
        })
    })
}

/// Where events are made durable before tasks apply them.
#[derive(Clone, Debug)]
pub enum Log {
    /// None: tasks apply events at once, in memory only.
    Memory,
    /// The embedded log: fsynced, then handed to the tasks by the log thread.
    Local(Arc<LocalLog>),
    /// Kafka: published, then consumed by the node's task consumer, which answers
    /// through the node's reply topic.
    Kafka(Arc<Kafka>),
}

pub struct Engine {
    queues: Vec<mpsc::Sender<Command>>,
    threads: Vec<JoinHandle<()>>,
    log: Log,
    /// Where tasks keep events and state (`None`: in memory).
    storage: Option<Arc<NodeStorage>>,
    /// Held while a checkpoint runs.
    checkpointing: tokio::sync::Mutex<()>,
    /// Set by the last checkpoint (at shutdown): no other runs after it.
    closed: std::sync::atomic::AtomicBool,
    pub checkpoints: CheckpointStats,
}

/// Events replayed per engine call at start.
const REPLAY_BATCH_ROWS: usize = 8192;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.queues.len())
            .finish()
    }
}

fn engine_gone() -> Error {
    Error::internal("the engine is shutting down")
}

impl Engine {
    /// Starts `shards` shard threads; with a log, every ingested event is appended to
    /// its tasks' logs (and durable) before a task applies it.
    pub fn start(shards: usize, log: Log, storage: Option<Arc<NodeStorage>>) -> Engine {
        assert!(shards > 0);
        let mut queues = Vec::with_capacity(shards);
        let mut threads = Vec::with_capacity(shards);
        for index in 0..shards {
            let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
            queues.push(tx);
            let shard = Shard::new(index, shards, storage.clone());
            let thread = std::thread::Builder::new()
                .name(format!("eddy-shard-{index}"))
                .spawn(move || shard.run(rx))
                .expect("spawn shard thread");
            threads.push(thread);
        }
        Engine {
            queues,
            threads,
            log,
            storage,
            checkpointing: tokio::sync::Mutex::new(()),
            closed: Default::default(),
            checkpoints: CheckpointStats::default(),
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
        let Some(storage) = &self.storage else {
            return Err(Error::internal("this engine keeps no state on disk"));
        };
        let started = Instant::now();
        // From here each shard writes to its part of the held store's overlay: what it
        // writes up to its pause (the L1 flush) becomes its cut, and RocksDB takes the cuts
        // in once every shard has one.
        storage.store.hold(self.shards());
        let paused = async {
            let mut waits = Vec::new();
            for shard in 0..self.shards() {
                let (tx, rx) = oneshot::channel();
                self.send(shard, Command::Checkpoint { reply: tx }).await?;
                waits.push(rx);
            }
            let (mut ends, mut records) = (Vec::new(), Vec::new());
            let mut failure = None;
            for rx in waits {
                match rx.await.map_err(|_| engine_gone()).and_then(|r| r) {
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
        let records = match (&self.log, records) {
            (Log::Local(log), Ok(records)) => log.sync().await.map(|_| records),
            (_, records) => records,
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
                .map_err(|e| Error::internal(e.to_string()));
            let n = snapshot?;
            released?;
            storage.commit(n)
        })
        .await
        .map_err(|e| Error::internal(e.to_string()))??;
        if let Log::Local(log) = &self.log {
            for (task, end) in &ends {
                log.truncate(task, *end);
            }
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

    /// The embedded log, if events go there.
    pub fn log(&self) -> Option<&Arc<LocalLog>> {
        match &self.log {
            Log::Local(log) => Some(log),
            _ => None,
        }
    }

    /// Kafka, if events go there.
    pub fn kafka(&self) -> Option<&Arc<Kafka>> {
        match &self.log {
            Log::Kafka(kafka) => Some(kafka),
            _ => None,
        }
    }

    /// Each task's log end: the offset after the last record it applied.
    async fn log_ends(&self) -> Result<BTreeMap<TaskId, u64>> {
        Ok(self
            .report()
            .await?
            .into_iter()
            .map(|r| (r.task, r.log_end))
            .collect())
    }

    /// Kafka mode's recovery: every task resumes consuming at its checkpointed offset;
    /// returns once each has applied what its partition held when this began.
    async fn catch_up(&self, kafka: &Arc<Kafka>, catalog: &Catalog) -> Result<u64> {
        let ends = self.log_ends().await?;
        kafka.install(&Catalog::default(), catalog).await?;
        let mut targets = Vec::new();
        for (stream, task) in tasks_of(catalog) {
            let topic = kafka.config().topic_of(stream, task.partitioner);
            let from = ends.get(&task).copied().unwrap_or(0);
            let high = kafka.high_watermark(&topic, task.partition as i32)?;
            targets.push((task, topic, from, high.max(0) as u64));
        }
        kafka.resume_at(
            targets
                .iter()
                .map(|(t, topic, from, _)| (topic.clone(), t.partition as i32, *from as i64)),
        );
        kafka.start_tasks(self.queues.clone())?;
        let started = Instant::now();
        loop {
            let applied = self.log_ends().await?;
            let behind = targets
                .iter()
                .filter(|(t, _, _, high)| applied.get(t).copied().unwrap_or(0) < *high)
                .count();
            if behind == 0 {
                break;
            }
            if started.elapsed() > std::time::Duration::from_secs(300) {
                return Err(Error::internal(format!(
                    "kafka: {behind} tasks did not catch up with their partitions within 300 s"
                )));
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Ok(targets
            .iter()
            .map(|(_, _, from, high)| high.saturating_sub(*from))
            .sum())
    }

    /// Re-applies every task's logged events (at start, after the catalog is installed).
    /// Returns how many events were replayed.
    pub async fn recover(&self, catalog: &Catalog) -> Result<u64> {
        let log = match &self.log {
            Log::Memory => return Ok(0),
            Log::Kafka(kafka) => return self.catch_up(kafka, catalog).await,
            Log::Local(log) => log,
        };
        let ends = self.log_ends().await?;
        let mut replayed = 0;
        for (_, task) in tasks_of(catalog) {
            let from = ends.get(&task).copied().unwrap_or(0);
            let mut rows = Vec::new();
            let mut bad = None;
            log.replay(
                &task,
                from,
                &mut |offset, bytes| match codec::decode_row(&bytes) {
                    Some(row) => rows.push(row),
                    None => bad = bad.or(Some(offset)),
                },
            )?;
            if let Some(offset) = bad {
                return Err(Error::internal(format!(
                    "the log of task {task:?} holds an unreadable event at offset {offset}"
                )));
            }
            replayed += rows.len() as u64;
            let mut end = from;
            for chunk in rows.chunks(REPLAY_BATCH_ROWS) {
                end += chunk.len() as u64;
                self.ingest_task(task.clone(), chunk.to_vec(), false, Some(end))
                    .await?;
            }
        }
        Ok(replayed)
    }

    async fn ingest_task(
        &self,
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
        log_end: Option<u64>,
    ) -> Result<oneshot::Receiver<IngestReply>> {
        let (reply, rx) = reply_to_caller();
        let shard = shard_of(&task, self.shards());
        self.send(
            shard,
            Command::Ingest {
                task,
                rows,
                values,
                log_end,
                reply,
            },
        )
        .await?;
        Ok(rx)
    }

    pub fn shards(&self) -> usize {
        self.queues.len()
    }

    async fn send(&self, shard: usize, cmd: Command) -> Result<()> {
        self.queues[shard]
            .send(cmd)
            .await
            .map_err(|_| engine_gone())
    }

    /// Installs a catalog on every shard: creates and drops tasks, adds and removes
    /// metric nodes (backfilling new ones). Returns when every shard is done.
    pub async fn apply_catalog(&self, catalog: Arc<Catalog>) -> Result<()> {
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(shard, Command::Catalog(catalog.clone(), tx))
                .await?;
            waits.push(rx);
        }
        for rx in waits {
            rx.await.map_err(|_| engine_gone())??;
        }
        Ok(())
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
        let mut replies = vec![EventReply::default(); rows.len()];
        let routed = route(stream, &rows);
        let mut waits = Vec::new();
        let mut answers = Vec::new();
        match &self.log {
            Log::Kafka(kafka) => {
                let mut events = Vec::with_capacity(rows.len() * stream.partitioner_count());
                let mut slots = Vec::with_capacity(events.capacity());
                for (p, task, indexes, task_rows) in routed {
                    for (i, row) in indexes.into_iter().zip(task_rows) {
                        events.push((task.clone(), row));
                        slots.push((p, i));
                    }
                }
                let replies = kafka.publish(stream, events, values).await?;
                answers.extend(
                    slots
                        .into_iter()
                        .zip(replies)
                        .map(|((p, i), (outcome, vals))| (p, i, outcome, vals)),
                );
            }
            // Durable first: the log thread hands the events to the tasks after the fsync,
            // in log order, so a task applies exactly its log's sequence.
            Log::Local(log) => {
                let mut batches = Vec::with_capacity(routed.len());
                let mut commands = Vec::with_capacity(routed.len());
                for (p, task, indexes, task_rows) in routed {
                    let records = task_rows
                        .iter()
                        .map(|r| {
                            let mut b = Vec::with_capacity(64);
                            codec::encode_row(r, &mut b);
                            b
                        })
                        .collect();
                    batches.push((task.clone(), records));
                    let (reply, rx) = reply_to_caller();
                    let shard = shard_of(&task, self.shards());
                    commands.push((
                        shard,
                        Command::Ingest {
                            task,
                            rows: task_rows,
                            values,
                            log_end: None,
                            reply,
                        },
                    ));
                    waits.push((p, indexes, rx));
                }
                let queues = self.queues.clone();
                let (done, appended) = oneshot::channel();
                log.append(
                    batches,
                    durable,
                    Box::new(move |result| {
                        if let Ok(ends) = &result {
                            for ((shard, mut cmd), end) in commands.into_iter().zip(ends) {
                                if let Command::Ingest { log_end, .. } = &mut cmd {
                                    *log_end = Some(*end);
                                }
                                let _ = queues[shard].blocking_send(cmd);
                            }
                        }
                        let _ = done.send(result.map(|_| ()));
                    }),
                );
                appended.await.map_err(|_| engine_gone())??;
            }
            Log::Memory => {
                for (p, task, indexes, task_rows) in routed {
                    let rx = self.ingest_task(task, task_rows, values, None).await?;
                    waits.push((p, indexes, rx));
                }
            }
        }
        // Partitioner order is kept so metric values come out in creation order.
        let mut per_partitioner: Vec<Vec<(usize, MetricValues)>> =
            vec![Vec::new(); stream.partitioner_count()];
        for (p, indexes, rx) in waits {
            let results = rx.await.map_err(|_| engine_gone())??;
            for (i, (outcome, vals)) in indexes.into_iter().zip(results) {
                answers.push((p, i, outcome, vals));
            }
        }
        for (p, i, outcome, vals) in answers {
            replies[i].outcomes.push(outcome);
            per_partitioner[p].push((i, vals));
        }
        for list in per_partitioner {
            for (i, vals) in list {
                replies[i].metrics.extend(vals);
            }
        }
        Ok(replies)
    }

    /// The current rows of a metric; with `key` (all group-by values) only that group,
    /// read from the one task that owns it.
    pub async fn metric_rows(
        &self,
        stream: &StreamDef,
        metric: &MetricDef,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        let p = metric.partitioner;
        let partition = match (&key, stream.partitioners.get(p)) {
            (Some(k), Some(col)) => {
                let pos = metric.group_by.iter().position(|c| c == col);
                pos.map(|pos| partition_for(&k[pos], stream.partitions))
            }
            (Some(_), None) => Some(0),
            _ => None,
        };
        let mut waits = Vec::new();
        for part in 0..stream.tasks_per_partitioner() {
            if partition.is_some_and(|only| only != part) {
                continue;
            }
            let task = TaskId {
                stream: stream.name.clone(),
                partitioner: p,
                partition: part,
            };
            let (tx, rx) = oneshot::channel();
            self.send(
                shard_of(&task, self.shards()),
                Command::MetricRows {
                    task,
                    metric: metric.name.clone(),
                    key: key.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        let mut rows = Vec::new();
        for rx in waits {
            rows.extend(rx.await.map_err(|_| engine_gone())?);
        }
        Ok(rows)
    }

    /// The events stored for a stream (from its first partitioner's tasks).
    pub async fn stream_rows(&self, stream: &StreamDef) -> Result<Vec<Row>> {
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(
                shard,
                Command::StreamRows {
                    stream: stream.name.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        let mut rows = Vec::new();
        for rx in waits {
            rows.extend(rx.await.map_err(|_| engine_gone())??);
        }
        Ok(rows)
    }

    /// Counters of every task.
    pub async fn report(&self) -> Result<Vec<TaskReport>> {
        let mut out = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(shard, Command::Report(tx)).await?;
            out.extend(rx.await.map_err(|_| engine_gone())?);
        }
        out.sort_by(|a, b| a.task.cmp(&b.task));
        Ok(out)
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
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(
                shard,
                Command::Watch {
                    stream: stream.to_string(),
                    partitioner,
                    id,
                    target: target.clone(),
                    watcher: watcher.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        for rx in waits {
            rx.await.map_err(|_| engine_gone())?;
        }
        Ok(())
    }

    /// Detaches a subscription from every task.
    pub async fn unwatch(&self, id: WatchId) {
        for shard in 0..self.shards() {
            let _ = self.send(shard, Command::Unwatch(id)).await;
        }
    }

    /// Quiets the node's background work at shutdown, after the last checkpoint: Kafka's
    /// consumers stop and RocksDB finishes its flushes and compactions.
    pub fn close(&self) {
        if let Log::Kafka(kafka) = &self.log {
            kafka.shutdown();
        }
        if let Some(storage) = &self.storage {
            storage.store.close();
        }
    }

    /// Stops the shard threads after they finish the commands already queued.
    pub fn shutdown(self) {
        if let Log::Kafka(kafka) = &self.log {
            kafka.shutdown();
        }
        drop(self.queues);
        for t in self.threads {
            let _ = t.join();
        }
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

/// One shard thread's state: the tasks it owns.
struct Shard {
    index: usize,
    shards: usize,
    tasks: BTreeMap<TaskId, Task>,
    storage: Option<Arc<NodeStorage>>,
    /// The first catalog installed restores tasks from the last checkpoint.
    restored: bool,
}

impl Shard {
    fn new(index: usize, shards: usize, storage: Option<Arc<NodeStorage>>) -> Shard {
        Shard {
            index,
            shards,
            tasks: BTreeMap::new(),
            storage,
            restored: false,
        }
    }

    /// Flushes every task's group states, takes its checkpoint record, and freezes the
    /// shard's cut of the held store: its later writes are not in this checkpoint.
    fn checkpoint(&mut self) -> CheckpointReply {
        let Some(storage) = self.storage.clone() else {
            return Ok((Vec::new(), Vec::new()));
        };
        let taken = self.take_records();
        storage.store.freeze(self.index);
        taken
    }

    fn take_records(&mut self) -> CheckpointReply {
        let mut records = Vec::new();
        let mut ends = Vec::new();
        for (id, task) in &mut self.tasks {
            let Some(record) = task.checkpoint()? else {
                continue;
            };
            records.push(PendingMeta {
                key: task_meta_key(id),
                stream_sql: task.stream().sql.clone(),
                metric_sqls: task.metric_defs().iter().map(|m| m.sql.clone()).collect(),
                record,
            });
            ends.push((id.clone(), task.log_end));
        }
        Ok((ends, records))
    }

    /// A task of a new stream, or — at start — the task as its last checkpoint left it.
    fn open_task(&self, id: &TaskId, stream: &Arc<StreamDef>, p: usize) -> Result<Task> {
        let Some(storage) = &self.storage else {
            return Ok(Task::new(stream.clone(), p));
        };
        let task_storage = storage.task_storage(id, self.index);
        let meta = if self.restored {
            None
        } else {
            storage
                .store
                .writer(self.index)
                .multi_get(Family::Meta, &[&task_meta_key(id)])
                .map_err(|e| Error::internal(e.to_string()))?
                .pop()
                .flatten()
                .map(|bytes| {
                    TaskMeta::decode(&bytes).ok_or_else(|| {
                        Error::internal(format!("unreadable checkpoint record of task {id:?}"))
                    })
                })
                .transpose()?
        };
        let Some(meta) = meta else {
            return Task::open(stream.clone(), p, task_storage, None);
        };
        // The stream and metrics as they were at the checkpoint.
        let mut then = Catalog::default();
        for text in std::iter::once(&meta.stream_sql).chain(&meta.metric_sqls) {
            let stmt = eddy_planner::sql::parse_statement(text)?;
            then = eddy_planner::ddl::apply(&then, &stmt)?.0;
        }
        let Some(old) = then.stream(&stream.name).filter(|old| stream.same_as(old)) else {
            // The stream was re-created since: its log starts over too.
            return Task::open(stream.clone(), p, task_storage, None);
        };
        let metrics = then.metrics_of(&stream.name);
        Task::open(
            old.clone(),
            p,
            task_storage,
            Some((&meta.checkpoint, &metrics)),
        )
    }

    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(cmd) = rx.blocking_recv() {
            match cmd {
                Command::Catalog(catalog, reply) => {
                    let _ = reply.send(self.apply_catalog(&catalog));
                }
                Command::Ingest {
                    task,
                    rows,
                    values,
                    log_end,
                    reply,
                } => {
                    let result = match self.tasks.get_mut(&task) {
                        Some(t) => {
                            let result = t.ingest(&rows, values);
                            if let (Ok(_), Some(end)) = (&result, log_end) {
                                t.log_end = end;
                            }
                            result
                        }
                        None => Err(Error::internal(format!(
                            "task {task:?} is not on this shard"
                        ))),
                    };
                    reply(result);
                }
                Command::Checkpoint { reply } => {
                    let _ = reply.send(self.checkpoint());
                }
                Command::MetricRows {
                    task,
                    metric,
                    key,
                    reply,
                } => {
                    let rows = self
                        .tasks
                        .get_mut(&task)
                        .map(|t| t.metric_rows(&metric, key.as_deref()))
                        .unwrap_or_default();
                    let _ = reply.send(rows);
                }
                Command::StreamRows { stream, reply } => {
                    let mut rows = Ok(Vec::new());
                    for (_, t) in self
                        .tasks
                        .iter_mut()
                        .filter(|(id, _)| id.stream == stream && id.partitioner == 0)
                    {
                        match (t.events(), &mut rows) {
                            (Ok(events), Ok(rows)) => rows.extend(events),
                            (Err(e), _) => rows = Err(e),
                            _ => {}
                        }
                    }
                    let _ = reply.send(rows);
                }
                Command::Watch {
                    stream,
                    partitioner,
                    id,
                    target,
                    watcher,
                    reply,
                } => {
                    for (_, task) in self
                        .tasks
                        .iter_mut()
                        .filter(|(t, _)| t.stream == stream && t.partitioner == partitioner)
                    {
                        task.watch(id, target.clone(), watcher.clone());
                    }
                    let _ = reply.send(());
                }
                Command::Unwatch(id) => {
                    for task in self.tasks.values_mut() {
                        task.unwatch(id);
                    }
                }
                Command::Report(reply) => {
                    let report = self
                        .tasks
                        .iter()
                        .map(|(id, t)| TaskReport {
                            task: id.clone(),
                            stats: t.stats,
                            stored_events: t.stored_events(),
                            time: t.time(),
                            reservoir: t.reservoir_stats(),
                            cache: t.cache_stats(),
                            log_end: t.log_end,
                        })
                        .collect();
                    let _ = reply.send(report);
                }
            }
        }
    }

    fn apply_catalog(&mut self, catalog: &Catalog) -> Result<()> {
        // Tasks of dropped (or re-created) streams go away with their state.
        let gone: Vec<TaskId> = self
            .tasks
            .iter()
            .filter(|(id, task)| {
                !catalog
                    .stream(&id.stream)
                    .is_some_and(|s| Arc::ptr_eq(s, task.stream()) || s.same_as(task.stream()))
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in gone {
            let mut task = self.tasks.remove(&id).expect("listed");
            task.end_watches(&Error::new(
                eddy_planner::ErrorKind::UndefinedTable,
                format!("stream \"{}\" was dropped", id.stream),
            ));
            task.destroy()?;
            if let Some(storage) = &self.storage {
                storage
                    .store
                    .writer(self.index)
                    .write(&[(Family::Meta, &task_meta_key(&id), None)])
                    .map_err(|e| Error::internal(e.to_string()))?;
            }
        }
        for (stream, id) in tasks_of(catalog) {
            if shard_of(&id, self.shards) != self.index {
                continue;
            }
            if !self.tasks.contains_key(&id) {
                let task = self.open_task(&id, stream, id.partitioner)?;
                self.tasks.insert(id.clone(), task);
            }
            let task = self.tasks.get_mut(&id).expect("opened");
            task.set_stream(stream.clone());
            task.set_metrics(&catalog.metrics_of(&stream.name))?;
        }
        self.restored = true;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A stream's partitions spread evenly over the shards, whatever its name.
    #[test]
    fn a_streams_tasks_spread_over_every_shard() {
        for (stream, partitions, shards) in [("a", 2, 2), ("lat_1", 2, 2), ("s", 5, 2), ("x", 7, 3)]
        {
            let mut per_shard = vec![0; shards];
            for partition in 0..partitions {
                let task = TaskId {
                    stream: stream.into(),
                    partitioner: 0,
                    partition,
                };
                per_shard[shard_of(&task, shards)] += 1;
            }
            let (min, max) = (per_shard.iter().min(), per_shard.iter().max());
            assert!(max.unwrap() - min.unwrap() <= 1, "{stream}: {per_shard:?}");
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
}
