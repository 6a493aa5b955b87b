//! eddy-cluster: tasks, the shards that run them, and how events are routed to them.
//!
//! Architecture invariant: no pgwire and no SQL text here. The front end hands over bound
//! rows; a task is touched only by the shard thread that owns it.

pub mod checkpoint;
pub mod command;
pub mod durable;
pub mod engine;
pub mod events;
pub mod groups;
pub mod kafka;
pub mod key;
pub mod log;
pub mod route;
pub mod split;
pub mod task;
pub mod watch;

pub use command::TaskReport;
pub use durable::{NodeStorage, StorageConfig};
pub use engine::{Engine, EventReply, Log};
pub use events::{Event, Outcome, Row};
pub use kafka::{Kafka, KafkaConfig};
pub use log::{LocalLog, LogStats};
pub use route::TaskId;
pub use task::{Task, TaskStorage};
pub use watch::{Change, WatchId, WatchTarget, Watcher};
