//! Running a node: its configuration (`config`, `settings` for what `ALTER SYSTEM` keeps),
//! the named limits, logging, latency histograms and the HTTP port (metrics, console).

pub mod backup;
pub mod config;
pub mod histogram;
pub mod http;
pub mod limits;
pub mod log;
pub mod metrics;
pub mod settings;
