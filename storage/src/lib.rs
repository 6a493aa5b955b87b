//! eddy-storage: where a task's events and aggregate state live.
//!
//! Architecture invariant: storage knows no SQL. It stores opaque timed events and
//! opaque state bytes behind two narrow traits, `Reservoir` and `StateStore`, so the
//! disk-backed implementations can replace the in-memory ones without touching the
//! planner or the executor.

pub mod chunk;
pub mod disk;
pub mod log;
pub mod reservoir;
pub mod state;

pub use disk::{DiskReservoir, IoThread, ReservoirConfig};
pub use log::{LogError, Records, TaskLog};
pub use reservoir::{
    ChunkCodec, MemReservoir, PendingMark, Reservoir, ReservoirError, ReservoirStats, Timed,
};
pub use state::{
    Family, FrozenStore, MemStateStore, OwnedPut, RocksConfig, RocksStore, StateError, StateStore,
    StoreWriter,
};
