//! eddy-planner: the SQL dialect, the catalog, the shared-prefix DAG and the pure
//! compute of windows and aggregates.
//!
//! Architecture invariant: this crate does no IO. It knows nothing of sockets, threads,
//! files, pgwire or storage engines; everything here is a function from facts to values.

pub mod access;
pub mod aggregate;
pub mod arith;
pub mod bind;
pub mod catalog;
pub mod codec;
pub mod dag;
pub mod ddl;
pub mod error;
pub mod exact;
pub mod filter;
pub mod prefetch;
pub mod ranked;
pub mod sql;
pub mod types;
pub mod window;

pub use error::{Error, ErrorKind, Result};
