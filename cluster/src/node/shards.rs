//! The shards: one thread each, owning its tasks, and `Shards`, the handle that reaches
//! them through bounded queues.
//!
//! Invariants: a task lives on exactly one shard (`shard_of`). A shard's thread holds the
//! shard's lock while it works through its queue, so the event path takes one lock per
//! wake-up, never contended by another writer; the only other taker is a point read
//! (`Shards::read_group`), which borrows an idle shard with `try_lock` instead of
//! queueing, to spare two thread hops — and queues when the shard is busy or has work
//! queued, so it never overtakes a record handed to the shard before it. A small
//! delivery in log order (`Shards::deliver`) borrows it the same way, when nothing sent
//! earlier is still pending (`Shards::pending`), so it cannot overtake. Every queue
//! is bounded (`SHARD_QUEUE_MAX`), so a flood of statements waits instead of growing
//! memory.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};

use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};
use eddy_storage::{Family, StateStore};

use crate::command::{
    reply_to_caller, Answers, CheckpointReply, Command, Given, IngestReply, Job, PendingMeta,
    Reply, TaskReport,
};
use crate::exec::events::Row;
use crate::exec::history::HistoryPage;
use crate::exec::passes::Passes;
use crate::exec::task::Task;
use crate::node::durable::{task_meta_key, task_prefix, NodeStorage, TaskMeta};
use crate::node::transfer::{Staged, STATE_FAMILIES};
use crate::placement::Pinning;
use crate::route::{shard_of, TaskId};

/// Commands waiting per shard before senders wait.
pub const SHARD_QUEUE_MAX: usize = 1024;

pub(crate) fn engine_gone() -> Error {
    Error::internal("the engine is shutting down")
}

/// The queues of a node's shards: how the engine, and a log delivering events, reach a
/// task's shard. Clones share one set of shards, which `reshard` can change.
#[derive(Clone)]
pub struct Shards {
    inner: Arc<Inner>,
}

struct Inner {
    /// The shards now. A sender picks its shard and queues its command under this read
    /// lock, so once `reshard` holds it for writing, every command routed by the old set
    /// is in its shard's queue, ahead of the reshard's own.
    set: RwLock<Arc<Set>>,
    /// Shared by commands to every shard, exclusive for `reshard`: a broadcast reaches
    /// every shard of one set.
    broadcast: tokio::sync::RwLock<()>,
    storage: Option<Arc<NodeStorage>>,
    /// The round-robin balancer's next shard.
    next: AtomicUsize,
    /// The running shard threads, by index.
    threads: Mutex<Vec<std::thread::JoinHandle<()>>>,
}

/// One set of shards: their queues, counters and cells by index.
struct Set {
    queues: Vec<mpsc::Sender<Command>>,
    /// Per shard, commands sent and not yet handled: counted up before a command is
    /// queued and down by the shard once it handled it, under its lock. Zero under the
    /// lock means nothing sent earlier is still to come.
    pending: Vec<Arc<AtomicUsize>>,
    /// The shards themselves, for reads that borrow an idle one.
    cells: Vec<Arc<Mutex<Shard>>>,
    /// Where each shard's thread is pinned (`None`: where the OS puts it).
    pinning: Option<Arc<Pinning>>,
}

impl Set {
    fn new(pinning: Option<Arc<Pinning>>) -> Set {
        Set {
            queues: Vec::new(),
            pending: Vec::new(),
            cells: Vec::new(),
            pinning,
        }
    }

    /// Adds a started shard as the next one; returns its thread.
    fn push(&mut self, started: Started) -> std::thread::JoinHandle<()> {
        self.queues.push(started.queue);
        self.pending.push(started.pending);
        self.cells.push(started.cell);
        started.thread
    }

    fn count(&self) -> usize {
        self.queues.len()
    }

    /// The shard running `task`; `None` once the shards stopped.
    fn shard_of(&self, task: &TaskId) -> Option<usize> {
        (self.count() > 0).then(|| shard_of(task, self.count()))
    }

    // A full queue hands the command back, whatever its size.
    #[allow(clippy::result_large_err)]
    fn try_send(&self, shard: usize, cmd: Command) -> Result<(), TrySendError<Command>> {
        self.pending[shard].fetch_add(1, Ordering::AcqRel);
        let sent = self.queues[shard].try_send(cmd);
        if sent.is_err() {
            self.pending[shard].fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }

    async fn send(&self, shard: usize, cmd: Command) -> Result<()> {
        self.pending[shard].fetch_add(1, Ordering::AcqRel);
        let sent = self.queues[shard].send(cmd).await;
        if sent.is_err() {
            self.pending[shard].fetch_sub(1, Ordering::AcqRel);
        }
        sent.map_err(|_| engine_gone())
    }

    /// Queues `cmd`, waiting while the queue is full, from a thread that may block
    /// (on a runtime thread, handing that thread's other work on first). False once the
    /// shard is gone.
    fn blocking_send(&self, shard: usize, cmd: Command) -> bool {
        use tokio::runtime::{Handle, RuntimeFlavor};
        let cmd = match self.try_send(shard, cmd) {
            Ok(()) => return true,
            Err(TrySendError::Closed(_)) => return false,
            Err(TrySendError::Full(cmd)) => cmd,
        };
        let (queue, pending) = (&self.queues[shard], &self.pending[shard]);
        pending.fetch_add(1, Ordering::AcqRel);
        let sent = match Handle::try_current().map(|h| h.runtime_flavor()) {
            Err(_) => queue.blocking_send(cmd).is_ok(),
            Ok(RuntimeFlavor::MultiThread) => {
                tokio::task::block_in_place(|| queue.blocking_send(cmd).is_ok())
            }
            // A single-threaded runtime cannot give its thread away: wait on another.
            Ok(_) => std::thread::scope(|s| {
                s.spawn(|| queue.blocking_send(cmd).is_ok())
                    .join()
                    .unwrap_or(false)
            }),
        };
        if !sent {
            pending.fetch_sub(1, Ordering::AcqRel);
        }
        sent
    }
}

/// Rows a delivery may apply on the deliverer's thread when the shard is idle; larger
/// batches go to the shard, so that the caller goes on parsing while shards apply.
const DELIVER_INLINE_ROWS_MAX: usize = 16;

impl std::fmt::Debug for Shards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shards")
            .field("count", &self.count())
            .finish()
    }
}

/// One shard's thread, its queue and its cell.
struct Started {
    queue: mpsc::Sender<Command>,
    pending: Arc<AtomicUsize>,
    cell: Arc<Mutex<Shard>>,
    thread: std::thread::JoinHandle<()>,
}

impl Started {
    /// Starts shard `shard` as one of `count`; with `pinning`, it binds itself to the
    /// plan's place `shard` first (a shard that cannot says so and runs unpinned).
    fn new(shard: Shard, pinning: Option<Arc<Pinning>>) -> Started {
        let index = shard.index;
        let (queue, rx) = mpsc::channel(SHARD_QUEUE_MAX);
        let cell = Arc::new(Mutex::new(shard));
        let pending = Arc::new(AtomicUsize::new(0));
        let (shard_cell, sent) = (cell.clone(), pending.clone());
        let thread = std::thread::Builder::new()
            .name(format!("eddy-shard-{index}"))
            .spawn(move || {
                pin(pinning.as_deref(), index);
                Shard::run(&shard_cell, rx, &sent)
            })
            .expect("spawn shard thread");
        Started {
            queue,
            pending,
            cell,
            thread,
        }
    }
}

/// Binds the calling shard thread to its place, or says why it cannot.
fn pin(pinning: Option<&Pinning>, index: usize) {
    if let Some(Err(e)) = pinning.map(|p| p.pin_shard(index)) {
        tracing::warn!("shard {index} runs unpinned: {e}");
    }
}

impl Shards {
    /// Starts `count` shard threads; with `pinning`, shard i binds itself to the plan's
    /// place i.
    pub(crate) fn start(
        count: usize,
        storage: Option<Arc<NodeStorage>>,
        pinning: Option<Arc<Pinning>>,
    ) -> Shards {
        assert!(count > 0);
        let mut set = Set::new(pinning.clone());
        let mut threads = Vec::with_capacity(count);
        for index in 0..count {
            let shard = Shard::new(index, count, storage.clone(), Arc::default(), false);
            threads.push(set.push(Started::new(shard, pinning.clone())));
        }
        Shards {
            inner: Arc::new(Inner {
                set: RwLock::new(Arc::new(set)),
                broadcast: tokio::sync::RwLock::new(()),
                storage,
                next: AtomicUsize::new(0),
                threads: Mutex::new(threads),
            }),
        }
    }

    fn set(&self) -> Arc<Set> {
        self.read().clone()
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Arc<Set>> {
        self.inner.set.read().expect("shard set lock")
    }

    pub fn count(&self) -> usize {
        self.read().count()
    }

    /// The placement the shards follow, if they are pinned.
    pub fn pinning(&self) -> Option<Arc<Pinning>> {
        self.read().pinning.clone()
    }

    /// Commands sent to shard `index` and not yet handled.
    pub fn queue_depth(&self, index: usize) -> usize {
        let set = self.read();
        set.pending
            .get(index)
            .map_or(0, |p| p.load(Ordering::Acquire))
    }

    /// Shard `index`'s count of commands queued, for tests that stand for a command the
    /// shard's thread has yet to take.
    #[cfg(test)]
    pub(crate) fn pending(&self, index: usize) -> Arc<AtomicUsize> {
        self.read().pending[index].clone()
    }

    /// Shard `index`'s cell, for tests that hold a shard busy.
    #[cfg(test)]
    pub(crate) fn cell(&self, index: usize) -> Arc<Mutex<Shard>> {
        self.read().cells[index].clone()
    }

    /// Sends a command to the shard running `task`, waiting while its queue is full.
    pub(crate) async fn send_to(&self, task: &TaskId, mut cmd: Command) -> Result<()> {
        loop {
            let queue = {
                let set = self.read();
                let shard = set.shard_of(task).ok_or_else(engine_gone)?;
                match set.try_send(shard, cmd) {
                    Ok(()) => return Ok(()),
                    Err(TrySendError::Closed(_)) => return Err(engine_gone()),
                    Err(TrySendError::Full(back)) => {
                        cmd = back;
                        set.queues[shard].clone()
                    }
                }
            };
            // Room in the queue, then the choice again: the set may have changed.
            drop(queue.reserve().await.map_err(|_| engine_gone())?);
        }
    }

    /// Sends a command to every shard, each with its own reply channel, and gathers the
    /// replies in shard order.
    pub(crate) async fn ask_all<T>(
        &self,
        mut command: impl FnMut(oneshot::Sender<T>) -> Command,
    ) -> Result<Vec<T>> {
        let _one_set = self.inner.broadcast.read().await;
        let set = self.set();
        let mut waits = Vec::with_capacity(set.count());
        for shard in 0..set.count() {
            let (tx, rx) = oneshot::channel();
            set.send(shard, command(tx)).await?;
            waits.push(rx);
        }
        let mut out = Vec::with_capacity(waits.len());
        for rx in waits {
            out.push(rx.await.map_err(|_| engine_gone())?);
        }
        Ok(out)
    }

    /// Runs stateless work on the next shard in turn whose queue has room (the
    /// round-robin balancer), or on the calling thread when every queue is full or the
    /// shards are gone, so a flood of work waits for the shards instead of queueing.
    pub fn run_anywhere(&self, job: Job) {
        let set = self.read();
        let count = set.count();
        let first = self.inner.next.fetch_add(1, Ordering::Relaxed);
        let mut cmd = Command::Run(job);
        for k in 0..count {
            match set.try_send((first + k) % count, cmd) {
                Ok(()) => return,
                Err(TrySendError::Full(back) | TrySendError::Closed(back)) => cmd = back,
            }
        }
        drop(set);
        if let Command::Run(job) = cmd {
            job();
        }
    }

    /// Sends a command that needs no answer to every shard.
    pub(crate) async fn tell_all(&self, command: impl Fn() -> Command) -> Result<()> {
        let _one_set = self.inner.broadcast.read().await;
        let set = self.set();
        for shard in 0..set.count() {
            set.send(shard, command()).await?;
        }
        Ok(())
    }

    /// Hands a batch to its task's shard; the receiver gets the task's answers. With a
    /// log, `log_end` is the task's log end after the batch.
    pub(crate) async fn ingest(
        &self,
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
        log_end: Option<u64>,
        passes: Option<Passes>,
    ) -> Result<oneshot::Receiver<IngestReply>> {
        let (reply, rx) = reply_to_caller();
        let to = task.clone();
        let cmd = Command::Ingest {
            task,
            rows,
            values,
            log_end,
            passes,
            reply,
        };
        self.send_to(&to, cmd).await?;
        Ok(rx)
    }

    /// As `ingest`, but not async: for a log delivering in log order, from its own
    /// thread or from a caller's under its lock. Waits while the shard's queue is full
    /// (on a runtime thread, handing that thread's other work on first). Returns false
    /// once the shards are gone.
    pub(crate) fn deliver(
        &self,
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
        log_end: u64,
        passes: Option<Passes>,
        reply: Reply,
    ) -> bool {
        let set = self.read();
        let Some(shard) = set.shard_of(&task) else {
            return false;
        };
        let inline = rows.len() <= DELIVER_INLINE_ROWS_MAX;
        let cmd = Command::Ingest {
            task,
            rows,
            values,
            log_end: Some(log_end),
            passes,
            reply,
        };
        // An idle shard with nothing sent before this is applied here, on the caller's
        // thread: the answer is ready when the caller looks, and no thread woke.
        if inline {
            if let Ok(mut idle) = set.cells[shard].try_lock() {
                if set.pending[shard].load(Ordering::Acquire) == 0 {
                    idle.handle(cmd);
                    return true;
                }
            }
        }
        set.blocking_send(shard, cmd)
    }

    /// The tasks' answers to batches handed over with `ingest`, in the same order.
    pub(crate) async fn answers(
        waits: Vec<oneshot::Receiver<IngestReply>>,
    ) -> Result<Vec<Answers>> {
        let mut out = Vec::with_capacity(waits.len());
        for rx in waits {
            out.push(rx.await.map_err(|_| engine_gone())??);
        }
        Ok(out)
    }

    /// The row of one group of a metric in a task, read on the calling thread when the
    /// task's shard is idle: unlocked, with nothing in its queue. `None` otherwise (send
    /// `Command::MetricRows` then, behind what is queued). The read sees every command
    /// handed to the shard before it: every statement acknowledged, and every record a
    /// log delivered, so a task that took over serves what its partition held.
    pub(crate) fn read_group(
        &self,
        task: &TaskId,
        metric: &str,
        key: &[Value],
    ) -> Option<Vec<Vec<Value>>> {
        let set = self.read();
        let index = set.shard_of(task)?;
        // Busy (or poisoned: its thread is gone, and the queue says so).
        let mut shard = set.cells[index].try_lock().ok()?;
        // Under the lock, the shard handles nothing: a command counted here is queued.
        if set.pending[index].load(Ordering::Acquire) != 0 {
            return None;
        }
        Some(shard.metric_rows(task, metric, Some(key)))
    }

    /// Counters of every task, per shard.
    pub async fn report_by_shard(&self) -> Result<Vec<Vec<TaskReport>>> {
        self.ask_all(Command::Report).await
    }

    /// Counters of every task, in task order.
    pub async fn report(&self) -> Result<Vec<TaskReport>> {
        let mut out: Vec<TaskReport> = self
            .report_by_shard()
            .await?
            .into_iter()
            .flatten()
            .collect();
        out.sort_by(|a, b| a.task.cmp(&b.task));
        Ok(out)
    }

    /// Each task's log end: the offset after the last record it applied.
    pub async fn log_ends(&self) -> Result<BTreeMap<TaskId, u64>> {
        Ok(self
            .report()
            .await?
            .into_iter()
            .map(|r| (r.task, r.log_end))
            .collect())
    }

    /// Changes the number of shards to `count` (`None`: one per core, as `--shards
    /// auto`), without a restart: new shards start, each task whose shard changes moves
    /// there with its state, then shards left without tasks stop. Every shard binds
    /// itself to the new plan's place, the other threads to its service PUs. Returns the
    /// new count. Call it between checkpoints: a moved task writes through its new
    /// shard's store writer from then on.
    ///
    /// Commands routed before go to the old shard, which handles them before it lets the
    /// task go; commands routed after wait until the task is on its new shard. So each
    /// task still applies its commands in the order they were sent.
    pub(crate) async fn reshard(&self, count: Option<usize>) -> Result<usize> {
        let _every_shard = self.inner.broadcast.write().await;
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.reshard_now(count))
            .await
            .map_err(|e| Error::internal(format!("resharding failed: {e}")))?
    }

    fn reshard_now(&self, count: Option<usize>) -> Result<usize> {
        let mut current = self.inner.set.write().expect("shard set lock");
        let old = current.clone();
        if old.count() == 0 {
            return Err(engine_gone());
        }
        let pinning = old.pinning.as_ref().map(|p| Arc::new(p.with_shards(count)));
        let count = match (&pinning, count) {
            (Some(p), _) => p.plan.shards.len(),
            (None, Some(n)) => n,
            (None, None) => std::thread::available_parallelism().map_or(1, |n| n.get()),
        }
        .max(1);
        if count == old.count() {
            return Ok(count);
        }
        // Every thread to the service PUs first; each shard then binds itself again.
        if let Some(Err(e)) = pinning.as_ref().map(|p| p.pin_service(true)) {
            tracing::warn!("the service threads run unpinned: {e}");
        }
        // Each shard lets go of the tasks it no longer runs, after the commands queued
        // before (nothing can be queued meanwhile: the set is locked).
        let mut waits = Vec::with_capacity(old.count());
        for shard in 0..old.count() {
            let (reply, rx) = oneshot::channel();
            let cmd = Command::Reshard {
                count,
                pinning: pinning.clone(),
                reply,
            };
            if !old.blocking_send(shard, cmd) {
                return Err(engine_gone());
            }
            waits.push(rx);
        }
        let mut moving = Vec::new();
        let mut catalog = Arc::default();
        for rx in waits {
            let given = rx.blocking_recv().map_err(|_| engine_gone())?;
            moving.extend(given.tasks);
            catalog = given.catalog;
        }
        let kept = count.min(old.count());
        let mut set = Set {
            queues: old.queues[..kept].to_vec(),
            pending: old.pending[..kept].to_vec(),
            cells: old.cells[..kept].to_vec(),
            pinning: pinning.clone(),
        };
        let mut threads = self.inner.threads.lock().expect("shard threads lock");
        for index in kept..count {
            let shard = Shard::new(
                index,
                count,
                self.inner.storage.clone(),
                catalog.clone(),
                true,
            );
            threads.push(set.push(Started::new(shard, pinning.clone())));
        }
        let mut per_shard: Vec<Vec<(TaskId, Task)>> = (0..count).map(|_| Vec::new()).collect();
        for (id, task) in moving {
            per_shard[shard_of(&id, count)].push((id, task));
        }
        let mut adopted = Vec::new();
        for (shard, tasks) in per_shard.into_iter().enumerate() {
            if tasks.is_empty() {
                continue;
            }
            let (reply, rx) = oneshot::channel();
            if !set.blocking_send(shard, Command::Adopt { tasks, reply }) {
                return Err(engine_gone());
            }
            adopted.push(rx);
        }
        for rx in adopted {
            rx.blocking_recv().map_err(|_| engine_gone())?;
        }
        *current = Arc::new(set);
        drop(current);
        // The shards past the new count hold no task; their queues close with the old
        // set, and they end.
        drop(old);
        let gone = threads.split_off(count);
        drop(threads);
        for thread in gone {
            let _ = thread.join();
        }
        Ok(count)
    }

    /// Stops the shard threads after the commands already queued, and waits for them.
    pub(crate) fn stop(&self) {
        let empty = Arc::new(Set::new(None));
        drop(std::mem::replace(
            &mut *self.inner.set.write().expect("shard set lock"),
            empty,
        ));
        let threads = std::mem::take(&mut *self.inner.threads.lock().expect("shard threads lock"));
        for thread in threads {
            let _ = thread.join();
        }
    }
}

/// Every task of a catalog, with its stream.
pub fn tasks_of(catalog: &Catalog) -> impl Iterator<Item = (&Arc<StreamDef>, TaskId)> {
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

/// One shard thread's state: the tasks it owns.
pub(crate) struct Shard {
    index: usize,
    shards: usize,
    tasks: BTreeMap<TaskId, Task>,
    storage: Option<Arc<NodeStorage>>,
    /// The first catalog installed restores tasks from the last checkpoint.
    restored: bool,
    /// The catalog installed last.
    catalog: Arc<Catalog>,
}

impl Shard {
    fn new(
        index: usize,
        shards: usize,
        storage: Option<Arc<NodeStorage>>,
        catalog: Arc<Catalog>,
        restored: bool,
    ) -> Shard {
        Shard {
            index,
            shards,
            tasks: BTreeMap::new(),
            storage,
            restored,
            catalog,
        }
    }

    /// Runs as one of `count` shards from now on: binds itself to its new place and
    /// gives up the tasks another shard runs now.
    fn reshard(&mut self, count: usize, pinning: Option<&Pinning>) -> Given {
        self.shards = count;
        if self.index < count {
            pin(pinning, self.index);
        }
        let leaving: Vec<TaskId> = self
            .tasks
            .keys()
            .filter(|id| shard_of(id, count) != self.index)
            .cloned()
            .collect();
        let tasks = leaving
            .into_iter()
            .map(|id| {
                let task = self.tasks.remove(&id).expect("listed");
                (id, task)
            })
            .collect();
        Given {
            tasks,
            catalog: self.catalog.clone(),
        }
    }

    /// Takes tasks another shard gave up; they write their state through this shard's
    /// store writer from now on.
    fn adopt(&mut self, tasks: Vec<(TaskId, Task)>) {
        for (id, mut task) in tasks {
            if let Some(storage) = &self.storage {
                task.set_store(Arc::new(storage.store.writer(self.index)));
            }
            self.tasks.insert(id, task);
        }
    }

    /// Flushes every task's group states, takes its checkpoint record, and freezes the
    /// shard's cut of the held store: its later writes are not in this checkpoint.
    fn checkpoint(&mut self, previous_committed: bool) -> CheckpointReply {
        let Some(storage) = self.storage.clone() else {
            return Ok((Vec::new(), Vec::new()));
        };
        let taken = self.take_records(previous_committed);
        storage.store.freeze(self.index);
        taken
    }

    fn take_records(&mut self, previous_committed: bool) -> CheckpointReply {
        let mut records = Vec::new();
        let mut ends = Vec::new();
        for (id, task) in &mut self.tasks {
            let Some(record) = task.checkpoint(previous_committed)? else {
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
        };
        match self.open_from(id, stream, p, meta.as_deref()) {
            Ok(task) => Ok(task),
            // Its files do not match its record (a crash during a transfer from a peer):
            // the task starts empty, and its log (or a peer) brings it back.
            Err(e) if meta.is_some() => {
                tracing::warn!(task = ?id, "the task starts empty: {e}");
                self.open_from(id, stream, p, None)
            }
            Err(e) => Err(e),
        }
    }

    /// A task on disk, as the checkpoint record `meta` left it (with its state already
    /// in the store and its segment files in place), or empty.
    fn open_from(
        &self,
        id: &TaskId,
        stream: &Arc<StreamDef>,
        p: usize,
        meta: Option<&[u8]>,
    ) -> Result<Task> {
        let storage = self.storage.as_ref().expect("a task on disk");
        let task_storage = storage.task_storage(id, self.index);
        let meta = meta
            .map(|bytes| {
                TaskMeta::decode(bytes).ok_or_else(|| {
                    Error::internal(format!("unreadable checkpoint record of task {id:?}"))
                })
            })
            .transpose()?;
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

    /// Replaces a task with a checkpoint received from a peer: its group states, its
    /// segment files, then the task as the record left it, running the current metrics,
    /// with its subscriptions moved over. Returns the log offset it resumes from; after
    /// a failure once the old state was removed, the task is empty and that is 0.
    fn install(&mut self, id: &TaskId, staged: Staged) -> Result<u64> {
        let storage = self
            .storage
            .clone()
            .ok_or_else(|| Error::internal("no storage"))?;
        let catalog = self.catalog.clone();
        let stream = catalog
            .stream(&id.stream)
            .filter(|_| self.tasks.contains_key(id))
            .cloned()
            .ok_or_else(|| Error::internal(format!("task {id:?} is not on this shard")))?;
        let mut batches = staged.batches()?;
        let mut old = self.tasks.remove(id).expect("checked");
        let watches = old.take_watches();
        drop(old);
        let installed = (|| {
            storage
                .store
                .replace_prefix(&STATE_FAMILIES, &task_prefix(id), &mut batches)
                .map_err(|e| Error::internal(e.to_string()))?;
            storage.replace_reservoir(id, &staged.reservoir())?;
            self.open_from(id, &stream, id.partitioner, Some(&staged.meta))
        })();
        let mut task = match installed {
            Ok(task) => task,
            Err(e) => {
                tracing::warn!(task = ?id, "installing a checkpoint failed, the task starts empty: {e}");
                let _ =
                    storage
                        .store
                        .replace_prefix(&STATE_FAMILIES, &task_prefix(id), &mut || Ok(None));
                self.open_from(id, &stream, id.partitioner, None)?
            }
        };
        task.set_stream(stream.clone());
        task.set_metrics(&catalog.metrics_of(&stream.name))?;
        for (wid, target, watcher) in watches {
            task.watch(wid, target, watcher);
        }
        let end = task.log_end;
        self.tasks.insert(id.clone(), task);
        Ok(end)
    }

    /// Commands one wake-up handles under the lock before it lets a reader in.
    const COMMANDS_PER_LOCK: usize = 64;

    fn run(cell: &Mutex<Shard>, mut rx: mpsc::Receiver<Command>, pending: &AtomicUsize) {
        while let Some(first) = rx.blocking_recv() {
            // A panic under the lock ends the shard: readers then see it poisoned and
            // queue, and find the queue gone.
            let mut shard = cell.lock().expect("a shard panicked");
            shard.handle(first);
            pending.fetch_sub(1, Ordering::AcqRel);
            for _ in 1..Self::COMMANDS_PER_LOCK {
                match rx.try_recv() {
                    Ok(cmd) => {
                        shard.handle(cmd);
                        pending.fetch_sub(1, Ordering::AcqRel);
                    }
                    Err(_) => break,
                }
            }
        }
    }

    fn metric_rows(
        &mut self,
        task: &TaskId,
        metric: &str,
        key: Option<&[Value]>,
    ) -> Vec<Vec<Value>> {
        self.tasks
            .get_mut(task)
            .map(|t| t.metric_rows(metric, key))
            .unwrap_or_default()
    }

    fn handle(&mut self, cmd: Command) {
        match cmd {
            Command::Catalog(catalog, reply) => {
                let _ = reply.send(self.apply_catalog(&catalog));
            }
            Command::Ingest {
                task,
                rows,
                values,
                log_end,
                passes,
                reply,
            } => {
                let result = match self.tasks.get_mut(&task) {
                    Some(t) => {
                        let result = t.ingest_with(&rows, values, passes.as_ref());
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
            Command::Install {
                task,
                staged,
                reply,
            } => {
                let _ = reply.send(self.install(&task, staged));
            }
            Command::Reshard {
                count,
                pinning,
                reply,
            } => {
                let _ = reply.send(self.reshard(count, pinning.as_deref()));
            }
            Command::Run(job) => job(),
            Command::Adopt { tasks, reply } => {
                self.adopt(tasks);
                let _ = reply.send(());
            }
            Command::Checkpoint {
                previous_committed,
                reply,
            } => {
                let _ = reply.send(self.checkpoint(previous_committed));
            }
            Command::MetricRows {
                task,
                metric,
                key,
                reply,
            } => {
                let _ = reply.send(self.metric_rows(&task, &metric, key.as_deref()));
            }
            Command::StreamRows {
                stream,
                partitions,
                reply,
            } => {
                let mut rows = Ok(Vec::new());
                let wanted = |p: u32| partitions.as_ref().is_none_or(|ps| ps.contains(&p));
                for (_, t) in self.tasks.iter_mut().filter(|(id, _)| {
                    id.stream == stream && id.partitioner == 0 && wanted(id.partition)
                }) {
                    match (t.events(), &mut rows) {
                        (Ok(events), Ok(rows)) => rows.extend(events),
                        (Err(e), _) => rows = Err(e),
                        _ => {}
                    }
                }
                let _ = reply.send(rows);
            }
            Command::HistoryPage {
                task,
                after,
                upto,
                max,
                reply,
            } => {
                let page = match self.tasks.get_mut(&task) {
                    Some(t) => t.history_page(after, upto, max),
                    // No event reached the task yet.
                    None => Ok(HistoryPage {
                        through: upto,
                        horizon: i64::MIN,
                        ..HistoryPage::default()
                    }),
                };
                let _ = reply.send(page);
            }
            Command::Watch {
                stream,
                partitioner,
                only,
                quiet,
                id,
                target,
                watcher,
                reply,
            } => {
                let wanted = |p: u32| only.as_ref().is_none_or(|ps| ps.contains(&p));
                for (t, task) in self.tasks.iter_mut().filter(|(t, _)| {
                    t.stream == stream && t.partitioner == partitioner && wanted(t.partition)
                }) {
                    task.watch_as(
                        id,
                        target.clone(),
                        watcher.clone(),
                        !quiet.contains(&t.partition),
                    );
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

    fn apply_catalog(&mut self, catalog: &Arc<Catalog>) -> Result<()> {
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
        self.catalog = catalog.clone();
        Ok(())
    }
}
