//! eddy-storage: where a task's events and aggregate state live.
//!
//! Architecture invariant: storage knows no SQL. It stores opaque timed events and
//! opaque state bytes behind two narrow traits, `Reservoir` and `StateStore`, so the
//! disk-backed implementations can replace the in-memory ones without touching the
//! planner or the executor.

pub mod chunk;
pub mod disk;
pub mod log;
mod mapped;
pub mod reservoir;
pub mod state;

/// Whether an IO error says the filesystem (or the user's quota) is full: a write that
/// may succeed once space is freed.
pub fn is_disk_full(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded
    )
}

pub use disk::{DiskReservoir, IoThread, ReservoirConfig};
pub use log::{LogEnd, LogError, Records, TaskLog};
pub use reservoir::{
    ChunkCodec, MemReservoir, PendingMark, Reservoir, ReservoirError, ReservoirStats, Timed,
};
pub use state::{
    Family, FrozenStore, MemStateStore, OwnedPut, RocksConfig, RocksStore, StateError, StateStore,
    StoreWriter,
};
