//! Executing one task: its events, its shared-prefix DAG of metrics, its group states
//! and their caches, and the subscriptions that watch it. Everything here runs on the
//! one shard thread that owns the task, and knows nothing of shards, logs or nodes.

pub mod checkpoint;
mod dedup;
pub mod events;
pub mod groups;
pub mod history;
pub mod key;
pub mod passes;
pub mod recent;
pub mod split;
pub mod task;
pub mod watch;
