//! eddy-server: the `eddy` binary's library — the PostgreSQL front end, sessions, the
//! catalog file, COPY, and DataFusion for ad-hoc SELECT.
//!
//! Architecture invariant: this is the only crate that knows pgwire. It binds statements
//! through the planner and hands rows to the engine; it never reaches into operator state.

pub mod auth;
pub mod busy;
pub mod cells;
pub mod cluster;
pub mod config;
pub mod copy;
pub mod db;
pub mod deferred;
pub mod histogram;
pub mod http;
pub mod limits;
pub mod log;
pub mod pg;
pub mod pg_catalog;
pub mod prepared;
pub mod query;
pub mod scram;
pub mod serve;
pub mod session_settings;
pub mod settings;
pub mod subscribe;
pub mod wire;
