//! Change capture for continuous queries: what a task hands to the readers of a metric
//! or a stream after each accepted event.
//!
//! Invariants: a watcher is called only on the shard thread that owns the task, once per
//! ingested batch, and must never block (readers that lag coalesce or fail on their own
//! side); a metric change names its group by its packed key, so a reader can keep only
//! the newest row per group.

use eddy_planner::Error;

/// Identifies one subscription across every task and shard it watches.
pub type WatchId = u64;

/// What a subscription reads.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchTarget {
    /// One row per group whose values changed: group-by values, aggregate values.
    Metric(String),
    /// Every accepted event: the stream's columns.
    Stream,
}

/// One changed row: the target's columns, then `changed_at` (stream time, as a
/// `Value::Timestamp`). `key` is the packed group key (empty for streams).
#[derive(Clone, Debug, PartialEq)]
pub struct Change {
    pub key: Box<[u8]>,
    pub row: Vec<eddy_planner::types::Value>,
}

/// The reading side of a subscription, called from shard threads.
pub trait Watcher: Send + Sync {
    /// Hands over changed rows in event order (shared by every watch of the same metric
    /// or stream). Returns false when the reader is gone, which detaches the watch.
    fn deliver(&self, changes: &[Change]) -> bool;

    /// The watch cannot go on (its metric or stream was dropped).
    fn end(&self, error: Error);
}
