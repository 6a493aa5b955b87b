//! One node's shard threads, which run its tasks, and its state store with its
//! checkpoints. Logs deliver events through `shards::Shards`; the engine
//! (`crate::engine`) puts a log and the shards together.

pub mod durable;
pub mod shards;
pub mod space;
pub mod transfer;
