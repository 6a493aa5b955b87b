//! The catalog: definitions of streams and metrics, and the bound form the engine runs.
//!
//! Invariant: the catalog is a value; DDL produces a new catalog, and every other layer
//! works on an `Arc` snapshot of it, so a statement never sees a half-applied change.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::aggregate::{AggFunc, ResultType};
use crate::types::ColumnType;
use crate::window::WindowSpec;

#[derive(Clone, Debug, PartialEq)]
pub struct ColumnDef {
    pub name: String,
    pub ty: ColumnType,
    pub not_null: bool,
    /// `DEFAULT`: what an INSERT or COPY that leaves the column out stores (else NULL).
    pub default: Option<crate::types::Value>,
}

/// How the event-time column is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventTimeUnit {
    /// A TIMESTAMP column (microseconds).
    Timestamp,
    /// A BIGINT column holding milliseconds since the epoch.
    Millis,
}

#[derive(Clone, Debug, PartialEq)]
pub struct StreamDef {
    pub name: String,
    pub columns: Vec<ColumnDef>,
    pub event_time: usize,
    pub event_time_unit: EventTimeUnit,
    pub event_id: Option<usize>,
    /// Column indexes of the partitioners, in `partition_by` order.
    pub partitioners: Vec<usize>,
    pub partitions: u32,
    pub lateness_us: i64,
    pub retention_us: i64,
    /// An external Kafka topic the stream ingests (cluster mode).
    pub source: Option<Source>,
    /// The statement that created the stream, replayed when the catalog is loaded.
    pub sql: String,
}

/// An external topic whose records become a stream's events.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Source {
    pub topic: String,
    pub format: SourceFormat,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SourceFormat {
    /// One JSON object per record, keys naming columns.
    Json,
}

impl StreamDef {
    /// A row with every column at its `DEFAULT` (NULL without one): what an INSERT or a
    /// COPY starts from before it sets the columns it names.
    pub fn blank_row(&self) -> Vec<crate::types::Value> {
        self.columns
            .iter()
            .map(|c| c.default.clone().unwrap_or(crate::types::Value::Null))
            .collect()
    }

    pub fn column_index(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|c| c.name == name)
    }

    /// Whether `self` is `old` with columns added at the end (`ALTER STREAM … ADD
    /// COLUMN`): the same stream, whose tasks and stored events carry over.
    pub fn extends(&self, old: &StreamDef) -> bool {
        self.columns.len() > old.columns.len()
            && self.columns[..old.columns.len()] == old.columns[..]
            && self.name == old.name
            && self.event_time == old.event_time
            && self.event_time_unit == old.event_time_unit
            && self.event_id == old.event_id
            && self.partitioners == old.partitioners
            && self.partitions == old.partitions
            && self.lateness_us == old.lateness_us
            && self.retention_us == old.retention_us
            && self.source == old.source
    }

    /// The same stream as `old`, maybe with columns added.
    pub fn same_as(&self, old: &StreamDef) -> bool {
        self == old || self.extends(old)
    }

    /// The number of partitioner task sets: a stream without partitioners has one task.
    pub fn partitioner_count(&self) -> usize {
        self.partitioners.len().max(1)
    }

    /// Tasks per partitioner: one when the stream has no partitioner.
    pub fn tasks_per_partitioner(&self) -> u32 {
        if self.partitioners.is_empty() {
            1
        } else {
            self.partitions
        }
    }
}

/// One output column of a metric.
#[derive(Clone, Debug, PartialEq)]
pub struct AggDef {
    pub alias: String,
    pub func: AggFunc,
    /// The argument column (`None` for `COUNT(*)`).
    pub arg: Option<usize>,
}

impl AggDef {
    pub fn to_sql(&self, stream: &StreamDef) -> String {
        let arg = self.arg.map(|i| stream.columns[i].name.clone());
        match (self.func, arg) {
            (AggFunc::CountStar, _) => "COUNT(*)".to_string(),
            (AggFunc::CountDistinct, Some(a)) => format!("COUNT(DISTINCT {a})"),
            (f @ (AggFunc::PercentileCont(p) | AggFunc::PercentileDisc(p)), Some(a)) => {
                let order = if p.is_descending() { " DESC" } else { "" };
                format!(
                    "{}({}) WITHIN GROUP (ORDER BY {a}{order})",
                    f.sql_name(),
                    p.get()
                )
            }
            (f, Some(a)) => format!("{}({a})", f.sql_name()),
            (f, None) => format!("{}()", f.sql_name()),
        }
    }

    pub fn result_type(&self, stream: &StreamDef) -> ResultType {
        self.func
            .result_type(self.arg.map(|i| stream.columns[i].ty))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct MetricDef {
    pub name: String,
    pub stream: String,
    pub window: WindowSpec,
    /// The WHERE predicate in canonical SQL text, if any.
    pub filter: Option<String>,
    /// GROUP BY column indexes in the stream.
    pub group_by: Vec<usize>,
    pub aggregates: Vec<AggDef>,
    /// Which partitioner's tasks run the metric (index into `StreamDef::partitioners`).
    pub partitioner: usize,
    pub sql: String,
}

impl MetricDef {
    /// The metric's result columns and types: group-by columns, then aggregates.
    pub fn columns(&self, stream: &StreamDef) -> Vec<(String, ResultType)> {
        self.group_by
            .iter()
            .map(|c| {
                let col = &stream.columns[*c];
                (col.name.clone(), ResultType::Column(col.ty))
            })
            .chain(
                self.aggregates
                    .iter()
                    .map(|a| (a.alias.clone(), a.result_type(stream))),
            )
            .collect()
    }
}

/// All streams and metrics, with their creation order.
#[derive(Clone, Debug, Default)]
pub struct Catalog {
    pub streams: BTreeMap<String, Arc<StreamDef>>,
    pub metrics: BTreeMap<String, Arc<MetricDef>>,
    /// Object names in creation order; metrics appear in RETURNING * in this order.
    pub order: Vec<String>,
    /// Roles, owners and grants.
    pub access: crate::access::Access,
}

impl crate::access::Objects for Catalog {
    fn is_stream(&self, name: &str) -> bool {
        self.streams.contains_key(name)
    }

    fn is_metric(&self, name: &str) -> bool {
        self.metrics.contains_key(name)
    }
}

/// What ends each statement in the catalog file, and in a record of several statements
/// on the catalog topic.
pub const STATEMENT_END: &str = "\n-- eddy:end\n";

impl Catalog {
    pub fn stream(&self, name: &str) -> Option<&Arc<StreamDef>> {
        self.streams.get(name)
    }

    pub fn metric(&self, name: &str) -> Option<&Arc<MetricDef>> {
        self.metrics.get(name)
    }

    /// The metrics of a stream in creation order.
    pub fn metrics_of(&self, stream: &str) -> Vec<Arc<MetricDef>> {
        self.order
            .iter()
            .filter_map(|n| self.metrics.get(n))
            .filter(|m| m.stream == stream)
            .cloned()
            .collect()
    }

    /// Every object's creating statement in creation order, as the catalog file stores it.
    pub fn statements(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .order
            .iter()
            .filter_map(|n| {
                self.streams
                    .get(n)
                    .map(|s| s.sql.clone())
                    .or_else(|| self.metrics.get(n).map(|m| m.sql.clone()))
            })
            .collect();
        out.extend(self.access.statements(self));
        out
    }
}
