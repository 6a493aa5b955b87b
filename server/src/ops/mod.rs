//! Running a node: its configuration (`config`, `settings` for what `ALTER SYSTEM` keeps),
//! the named limits, logging, latency histograms, the HTTP port (metrics, console) and
//! the allocator's purge delay (`memory`).

pub mod backup;
pub mod config;
pub mod histogram;
pub mod http;
pub mod limits;
pub mod log;
pub mod memory;
pub mod metrics;
pub mod settings;
