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
use tokio::sync::oneshot;

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

/// One caller's statements, kept in call order by a log that takes a statement only
/// once its future runs (Kafka). A pipelining caller (COPY) hands each statement the next
/// `turn`, and may then poll a statement's future alongside the one before it: the later
/// statement goes to the log only once the earlier one was taken whole, so the log holds
/// them in call order, and never the later without the earlier.
#[derive(Debug, Default)]
pub struct Sequence {
    last: Option<oneshot::Receiver<()>>,
}

impl Sequence {
    /// The place of the caller's next statement.
    pub fn turn(&mut self) -> Turn {
        let (taken, next) = oneshot::channel();
        Turn {
            after: self.last.replace(next),
            taken: Some(taken),
        }
    }
}

/// A statement's place in its caller's `Sequence`.
#[derive(Debug)]
pub struct Turn {
    after: Option<oneshot::Receiver<()>>,
    /// `None` for a statement nothing follows (`alone`): no channel to make.
    taken: Option<oneshot::Sender<()>>,
}

impl Turn {
    /// The turn of a statement that follows none and that none follows (every statement
    /// but a COPY's batches): it costs nothing.
    pub fn alone() -> Turn {
        Turn {
            after: None,
            taken: None,
        }
    }

    /// Waits until the statement before this one was taken whole; false if it never
    /// will be (it failed, or its caller gave up on it).
    pub async fn wait(&mut self) -> bool {
        match self.after.take() {
            Some(before) => before.await.is_ok(),
            None => true,
        }
    }

    /// The log has taken the statement whole: the next one may go.
    pub fn taken(self) {
        if let Some(taken) = self.taken {
            let _ = taken.send(());
        }
    }
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
    /// as long as it polls the futures in call order, the batches keep that order. A log
    /// that takes them later also waits for the statement before in `turn`'s `Sequence`
    /// to be taken, so a caller may poll a later future alongside an earlier one; each
    /// log marks `turn` taken once it has the batches (`Turn::alone()`: none before).
    fn ingest<'a>(
        &'a self,
        shards: &'a Shards,
        stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        durable: bool,
        turn: Turn,
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

    /// The fewest events a caller with many (a COPY) should put in one statement, for
    /// a log whose cost per statement is high (Kafka: a transaction each); 0 when a
    /// statement costs little, so a caller may pipeline small ones.
    fn statement_events_min(&self) -> usize {
        0
    }

    /// Whether a session waiting for its durable statement should keep its thread polling
    /// (`busy::Committing` in the server): yes for a wait on the disk, which needs no
    /// core; no where the wait is other processes' and threads' work on the same cores
    /// (Kafka: the broker's, and the client's).
    fn poll_while_durable(&self) -> bool {
        true
    }

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
        mut turn: Turn,
    ) -> LogFuture<'a, Vec<Answers>> {
        Box::pin(async move {
            if !turn.wait().await {
                return Err(eddy_planner::Error::internal(
                    "the statement before this one was not applied",
                ));
            }
            let mut waits = Vec::with_capacity(batches.len());
            for b in batches {
                waits.push(
                    shards
                        .ingest(b.task, b.rows, values, None, b.passes)
                        .await?,
                );
            }
            turn.taken();
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

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_turn_waits_for_the_one_before_and_stops_if_it_is_never_taken() {
        let mut order = Sequence::default();
        let mut first = order.turn();
        let mut second = order.turn();
        let mut third = order.turn();
        assert!(first.wait().await, "the first turn follows nothing");
        let waiting = tokio::spawn(async move { second.wait().await.then_some(second) });
        tokio::task::yield_now().await;
        assert!(
            !waiting.is_finished(),
            "the second turn waits for the first"
        );
        first.taken();
        let second = waiting.await.unwrap().expect("the first was taken");
        // The second gives up (its statement failed before the log took it): the third
        // must not go.
        drop(second);
        assert!(!third.wait().await);
        assert!(Turn::alone().wait().await);
    }
}
