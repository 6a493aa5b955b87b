//! eddy-server: the `eddy` binary's library — the PostgreSQL front end, sessions, the
//! catalog file, COPY, and DataFusion for ad-hoc SELECT. Its folders are its layers, each
//! using the ones below it: `wire` (connections), `session` (what a connection runs),
//! `sql` (statements against the database), `ops` (configuration, limits, HTTP);
//! `serve` puts them together.
//!
//! Architecture invariant: this is the only crate that knows pgwire. It binds statements
//! through the planner and hands rows to the engine; it never reaches into operator state.

pub mod ops;
pub mod serve;
pub mod session;
pub mod sql;
pub mod wire;
