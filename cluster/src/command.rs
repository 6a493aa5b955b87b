//! What the engine's handle and the Kafka consumer send a shard, and how a shard answers.
//!
//! Invariant: a command names its task by `TaskId`; the shard that owns the task (and only
//! it) runs it, and answers through the command's reply without blocking.

use std::sync::Arc;

use tokio::sync::oneshot;

use eddy_planner::catalog::Catalog;
use eddy_planner::types::Value;
use eddy_planner::Result;
use eddy_storage::ReservoirStats;

use crate::exec::checkpoint::TaskStats;
use crate::exec::events::Row;
use crate::exec::groups::CacheStats;
use crate::exec::history::HistoryPage;
use crate::exec::passes::Passes;
use crate::exec::task::{PendingRecord, Task};
use crate::exec::watch::{WatchId, WatchTarget, Watcher};
use crate::node::durable::TaskMeta;
use crate::node::transfer::Staged;
use crate::placement::Pinning;
use crate::route::TaskId;

/// Per-task counters for SHOW STREAMS.
#[derive(Clone, Debug)]
pub struct TaskReport {
    pub task: TaskId,
    pub stats: TaskStats,
    pub stored_events: usize,
    pub time: Option<i64>,
    pub reservoir: ReservoirStats,
    pub cache: CacheStats,
    pub log_end: u64,
}

/// What a shard reports once its tasks' group states are flushed: each task's log end
/// at the checkpoint, and its record, to finish off the event path.
pub(crate) type CheckpointReply = Result<(Vec<(TaskId, u64)>, Vec<PendingMeta>)>;

/// A task's checkpoint record under its key, before it is encoded.
pub(crate) struct PendingMeta {
    pub(crate) key: Vec<u8>,
    pub(crate) stream_sql: String,
    pub(crate) metric_sqls: Vec<String>,
    pub(crate) record: PendingRecord,
}

impl PendingMeta {
    /// The record's key and bytes, once its reservoir's fsyncs are done.
    pub(crate) fn finish(self) -> Result<(Vec<u8>, Vec<u8>)> {
        let meta = TaskMeta {
            stream_sql: self.stream_sql,
            metric_sqls: self.metric_sqls,
            checkpoint: self.record.finish()?,
        };
        Ok((self.key, meta.encode()))
    }
}

pub use crate::exec::task::{Answer, Answers};

pub(crate) type IngestReply = Result<Answers>;

/// What the shard does with an ingest's outcome, on its own thread: hand it to a waiting
/// caller, or (Kafka tasks) answer on the reply topics right away. It must not block.
pub(crate) type Reply = Box<dyn FnOnce(IngestReply) + Send>;

/// A `Reply` that hands the outcome to whoever holds the receiver.
pub(crate) fn reply_to_caller() -> (Reply, oneshot::Receiver<IngestReply>) {
    let (tx, rx) = oneshot::channel();
    (
        Box::new(move |r| {
            let _ = tx.send(r);
        }),
        rx,
    )
}

/// Stateless work for any shard; it answers through what it captured.
pub type Job = Box<dyn FnOnce() + Send>;

pub(crate) enum Command {
    Catalog(Arc<Catalog>, oneshot::Sender<Result<()>>),
    Ingest {
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
        /// The task's log end after these rows (with a log).
        log_end: Option<u64>,
        /// Their WHERE results, when the stateless stage computed them.
        passes: Option<Passes>,
        reply: Reply,
    },
    /// Flush and record every task, freeze the shard's cut of the held store, answer,
    /// and go on: the shard's part of a checkpoint's synchronous stage.
    Checkpoint {
        /// Whether the node's checkpoint before this one committed.
        previous_committed: bool,
        reply: oneshot::Sender<CheckpointReply>,
    },
    MetricRows {
        task: TaskId,
        metric: String,
        key: Option<Vec<Value>>,
        reply: oneshot::Sender<Vec<Vec<Value>>>,
    },
    StreamRows {
        stream: String,
        /// Only these partitions (of partitioner 0); `None`: all.
        partitions: Option<Vec<u32>>,
        reply: oneshot::Sender<Result<Vec<Row>>>,
    },
    /// A page of a task's stored events for a history read (`Task::history_page`).
    HistoryPage {
        task: TaskId,
        after: i64,
        upto: i64,
        max: usize,
        reply: oneshot::Sender<Result<HistoryPage>>,
    },
    /// Replace a task with a checkpoint received from a peer; answers the log offset
    /// it resumes from.
    Install {
        task: TaskId,
        staged: Staged,
        reply: oneshot::Sender<Result<u64>>,
    },
    Report(oneshot::Sender<Vec<TaskReport>>),
    Watch {
        stream: String,
        partitioner: usize,
        /// Only these partitions (`None`: all); and those whose current rows are not
        /// sent first (tasks this node holds no copy of: a peer sends theirs).
        only: Option<Vec<u32>>,
        quiet: Vec<u32>,
        id: WatchId,
        target: WatchTarget,
        watcher: Arc<dyn Watcher>,
        reply: oneshot::Sender<()>,
    },
    Unwatch(WatchId),
    /// Run stateless work (parsing and checking rows) that any shard may run: the
    /// round-robin balancer's commands.
    Run(Job),
    /// Run as one of `count` shards, bound to `pinning`'s place: answer with the tasks
    /// another shard runs now.
    Reshard {
        count: usize,
        pinning: Option<Arc<Pinning>>,
        reply: oneshot::Sender<Given>,
    },
    /// Run these tasks, given up by other shards.
    Adopt {
        tasks: Vec<(TaskId, Task)>,
        reply: oneshot::Sender<()>,
    },
}

/// What a shard gives up when the shard count changes: its tasks that move, and the
/// catalog it runs (for the shards that start).
pub(crate) struct Given {
    pub(crate) tasks: Vec<(TaskId, Task)>,
    pub(crate) catalog: Arc<Catalog>,
}
