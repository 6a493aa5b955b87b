//! Prepared statements: parsed once at Parse, bound once per catalog, then executed
//! from their parameters without parsing or planning SQL again.
//!
//! Invariant: a fast path gives exactly the rows the general path (parameters
//! substituted as literals, parsed and run) would give; whenever it cannot tell, it
//! declines and the general path runs.

use std::sync::{Arc, Mutex};

use pgwire::api::Type;

use eddy_planner::bind::InsertTemplate;
use eddy_planner::catalog::Catalog;
use eddy_planner::sql::Statement;

use crate::session::cells::Column;
use crate::sql::query::PointLookup;

/// A statement of the extended protocol, as the client prepared it.
#[derive(Debug)]
pub struct Prepared {
    pub text: String,
    /// Parsed at Parse; `$n` are still in it.
    pub stmt: Statement,
    bound: Mutex<Option<Arc<Bound>>>,
}

/// What a prepared statement is against one catalog version.
#[derive(Debug)]
pub struct Bound {
    pub catalog: Arc<Catalog>,
    /// Parameter types and result columns (Describe).
    pub shape: (Vec<Type>, Vec<Column>),
    pub fast: Fast,
}

/// How a prepared statement executes without SQL.
#[derive(Debug)]
pub enum Fast {
    /// `INSERT … VALUES ($1, …) [RETURNING …]`: rows straight from the parameters.
    Insert(Arc<InsertTemplate>),
    /// `SELECT cols FROM metric WHERE key = expr(…$n…)`: one group, read directly.
    Lookup(Arc<PointLookup>),
    /// Everything else: parameters substituted as literals, then parsed and run.
    General,
}

impl Prepared {
    pub fn new(text: String, stmt: Statement) -> Arc<Prepared> {
        Arc::new(Prepared {
            text,
            stmt,
            bound: Mutex::new(None),
        })
    }

    /// Whether the statement's shape and fast path are worth keeping per catalog: they
    /// depend on the catalog alone (not on cursors or session state).
    pub fn cacheable(&self) -> bool {
        matches!(self.stmt, Statement::Insert(_) | Statement::Query(_))
    }

    /// The binding kept, if `current` says its catalog is still the current one.
    pub fn bound(&self, current: impl Fn(&Arc<Catalog>) -> bool) -> Option<Arc<Bound>> {
        let bound = self.bound.lock().expect("prepared lock");
        bound.as_ref().filter(|b| current(&b.catalog)).cloned()
    }

    /// Keeps a binding for the executions to come (while its catalog is current).
    pub fn keep(&self, bound: Bound) -> Arc<Bound> {
        let b = Arc::new(bound);
        *self.bound.lock().expect("prepared lock") = Some(b.clone());
        b
    }
}
