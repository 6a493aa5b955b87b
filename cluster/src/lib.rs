//! eddy-cluster: tasks, the shards that run them, the log that feeds them, and how events
//! are routed to them.
//!
//! Layers, each using only those above it:
//! - `route` and `command`: how tasks are named and found, and what a shard is asked;
//! - `exec`: one task, on one thread;
//! - `node`: the shards of a node, and its state store with its checkpoints;
//! - `log`: where events become durable before the shards get them (the `EventLog`
//!   trait: memory, local files, Kafka);
//! - `engine`: the handle the front end uses, a log and the shards put together;
//! - `assign`: the assignor, a pure function from the cluster's members and tasks to
//!   where each task's active copy and replicas run;
//! - `membership`: the facts nodes announce and the plans the leader publishes (pure;
//!   carried over Kafka by `log::kafka::members`);
//! - `peer`: the gRPC service nodes call on each other (reads of tasks active elsewhere);
//! - `format`: the format versions of what a node writes, and which it reads.
//!
//! Architecture invariant: no pgwire and no SQL text here. The front end hands over bound
//! rows; a task is touched only by the shard thread that owns it.

pub mod assign;
pub mod command;
pub mod engine;
pub mod exec;
pub mod format;
pub mod log;
pub mod membership;
pub mod node;
pub mod peer;
pub mod placement;
pub mod route;

pub use command::TaskReport;
pub use engine::{wall_clock_us, Engine, EventReply, HistoryBounds};
pub use exec::events::{Event, Outcome, Row};
pub use exec::groups::CacheConfig;
pub use exec::task::{Task, TaskStorage};
pub use exec::watch::{Change, WatchId, WatchTarget, Watcher};
pub use log::{EventLog, Kafka, KafkaConfig, LocalLog, LogStats, MemoryLog, Sequence, Turn};
pub use node::durable::{NodeStorage, StorageConfig};
pub use node::space::{DiskSpace, Reserve};
pub use route::TaskId;
