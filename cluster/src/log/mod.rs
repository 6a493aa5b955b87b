//! The node's log: where events become durable before their tasks apply them.
//!
//! `EventLog` is the one seam between the engine and its log. It has three
//! implementations: `MemoryLog` (no log, for benchmarks and tests), `LocalLog` (the
//! embedded default, group-committed files) and `Kafka` (cluster mode). Each one does three
//! things:
//! - **append with a continuation.** `ingest` makes a statement's task batches durable (or
//!   only written, with `synchronous_commit = off`). Once they are, the log continues by
//!   handing each batch to its task, and the statement resumes with the answers.
//! - **deliver in order.** A task receives its log's records in offset order, each once, and
//!   its `log_end` moves with them.
//! - **replay from an offset.** At start, `recover` brings every task from the offset
//!   its checkpoint recorded up to the log's end.
//!
//! Invariant: a statement is acknowledged only after the log has its events and every task
//! has answered for them. A task applies exactly its log's sequence, from its checkpoint
//! on.

pub mod kafka;
pub mod local;

use std::any::Any;
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;

use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::Result;

use crate::exec::events::Row;
use crate::exec::passes::Passes;
use crate::node::shards::Shards;
use crate::route::TaskId;

pub use kafka::{Kafka, KafkaConfig};
pub use local::{LocalLog, LogStats};

tokio::task_local! {
    /// When the statement being run must end (its `statement_timeout`), for a log that
    /// waits on a broker: set by the session around each statement.
    pub static STATEMENT_DEADLINE: Option<std::time::Instant>;
}

/// The running statement's deadline, if it has one.
pub fn statement_deadline() -> Option<std::time::Instant> {
    STATEMENT_DEADLINE.try_with(|d| *d).ok().flatten()
}

/// A future a log returns; logs are used as trait objects.
pub type LogFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

pub use crate::command::{Answer, Answers};

/// One task's events of a statement, with their WHERE results when the stateless stage
/// computed them (the embedded logs hand them to the task; Kafka's tasks evaluate).
pub struct TaskBatch {
    pub task: TaskId,
    pub rows: Vec<Row>,
    pub passes: Option<Passes>,
}

/// Where events are made durable before tasks apply them. See the module docs.
pub trait EventLog: Send + Sync + std::fmt::Debug + Any {
    /// Appends each task's batch, and once the log has it (`durable`: fsynced or
    /// acknowledged by every in-sync replica), has the task apply it. Returns each
    /// batch's answers, in `batches` order.
    ///
    /// Ordering: a log takes the batches when `ingest` is called (`LocalLog` appends
    /// before it returns) or, at the latest, when the future is first polled (the others).
    /// So a caller may call again before the first future is done (a pipelined COPY):
    /// as long as it polls the futures in call order, the batches keep that order.
    fn ingest<'a>(
        &'a self,
        shards: &'a Shards,
        stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        durable: bool,
    ) -> LogFuture<'a, Vec<Answers>>;

    /// Replays each task of `catalog` from `applied` (its checkpointed log end) to the
    /// log's end; returns how many events were replayed.
    fn recover<'a>(
        &'a self,
        shards: &'a Shards,
        catalog: &'a Catalog,
        applied: BTreeMap<TaskId, u64>,
    ) -> LogFuture<'a, u64>;

    /// Brings the log in line with a new catalog (after DDL): logs of dropped or
    /// re-created streams go, so a later stream of the same name starts empty.
    fn install<'a>(&'a self, current: &'a Catalog, next: &'a Catalog) -> LogFuture<'a, ()>;

    /// Returns once everything appended before the call is durable. A checkpoint calls
    /// it before it commits, so it never covers an event a crash could still lose.
    fn sync(&self) -> LogFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }

    /// A committed checkpoint covers `task`'s records before `end`: the log may drop them.
    fn truncate(&self, _task: &TaskId, _end: u64) {}

    /// Stops the log's background work (at shutdown, after the last checkpoint).
    fn close(&self) {}

    /// The concrete log, for what only one kind has (counters, the catalog topic).
    fn as_any(&self) -> &dyn Any;
}

/// No log: tasks apply events at once, in memory only; nothing is replayed.
#[derive(Debug, Default)]
pub struct MemoryLog;

impl EventLog for MemoryLog {
    fn ingest<'a>(
        &'a self,
        shards: &'a Shards,
        _stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        _durable: bool,
    ) -> LogFuture<'a, Vec<Answers>> {
        Box::pin(async move {
            let mut waits = Vec::with_capacity(batches.len());
            for b in batches {
                waits.push(
                    shards
                        .ingest(b.task, b.rows, values, None, b.passes)
                        .await?,
                );
            }
            Shards::answers(waits).await
        })
    }

    fn recover<'a>(
        &'a self,
        _: &'a Shards,
        _: &'a Catalog,
        _: BTreeMap<TaskId, u64>,
    ) -> LogFuture<'a, u64> {
        Box::pin(async { Ok(0) })
    }

    fn install<'a>(&'a self, _: &'a Catalog, _: &'a Catalog) -> LogFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}
