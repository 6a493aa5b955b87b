//! How a task's events are stored in reservoir chunks: the stream's columns (Int32 and
//! Float32 widened, so every value reads back bit for bit) plus the event's key.
//!
//! Filter bits are not stored: they are derived data, recomputed with the task's current
//! filters whenever a chunk is decoded, so a metric created later needs no rewrite.
//! Columns are matched by name, so chunks written before `ALTER STREAM … ADD COLUMN`
//! read the new column as NULL.

use std::sync::Arc;

use datafusion::arrow::array::{ArrayRef, Int64Array, RecordBatch, UInt64Array};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};

use eddy_planner::aggregate::ResultType;
use eddy_planner::catalog::StreamDef;
use eddy_planner::filter::{
    column_values, columns_to_rows, rows_to_batch, stream_schema, stream_types, Filter,
};
use eddy_planner::types::{ColumnType, Value};
use eddy_storage::{ChunkCodec, Timed};

pub use eddy_planner::types::Row;

/// A stored event: its key, the filter bits computed when it arrived, and its row.
#[derive(Clone, Debug)]
pub struct Event {
    pub ts: i64,
    pub seq: u64,
    pub mask: u64,
    pub row: Row,
}

impl Timed for Event {
    fn key(&self) -> (i64, u64) {
        (self.ts, self.seq)
    }
}

/// What the task did with one event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Accepted,
    Late,
    Duplicate,
}

const TS: &str = "__eddy_ts";
const SEQ: &str = "__eddy_seq";

/// Bytes an event costs in memory beyond its values.
const EVENT_OVERHEAD_BYTES: usize = 64;

fn stored_type(ty: ColumnType) -> ColumnType {
    match ty {
        ColumnType::Int32 => ColumnType::Int64,
        ColumnType::Float32 => ColumnType::Float64,
        other => other,
    }
}

pub struct EventCodec {
    stream: Arc<StreamDef>,
    schema: SchemaRef,
    types: Vec<ResultType>,
    /// The task's filters with their mask bits.
    filters: Vec<(Filter, u32)>,
}

impl EventCodec {
    pub fn new(stream: Arc<StreamDef>, filters: Vec<(Filter, u32)>) -> EventCodec {
        let types: Vec<ResultType> = stream
            .columns
            .iter()
            .map(|c| ResultType::Column(stored_type(c.ty)))
            .collect();
        let schema = Arc::new(Schema::new(
            stream
                .columns
                .iter()
                .map(|c| Field::new(&c.name, stored_type(c.ty).arrow(), true))
                .collect::<Vec<_>>(),
        ));
        EventCodec {
            stream,
            schema,
            types,
            filters,
        }
    }

    /// The filter bits of rows under this codec's filters.
    pub fn masks(&self, rows: &[Row]) -> Result<Vec<u64>, String> {
        let mut masks = vec![0u64; rows.len()];
        if self.filters.is_empty() || rows.is_empty() {
            return Ok(masks);
        }
        let batch = rows_to_batch(
            stream_schema(&self.stream),
            &stream_types(&self.stream),
            rows,
        )
        .map_err(|e| e.to_string())?;
        for (filter, bit) in &self.filters {
            for (m, pass) in masks
                .iter_mut()
                .zip(filter.evaluate(&batch).map_err(|e| e.to_string())?)
            {
                if pass {
                    *m |= 1u64 << bit;
                }
            }
        }
        Ok(masks)
    }
}

impl ChunkCodec<Event> for EventCodec {
    fn schema_id(&self) -> u32 {
        self.stream.columns.len() as u32
    }

    fn encode(&self, events: &[&Event]) -> Result<RecordBatch, String> {
        let rows: Vec<&[Value]> = events.iter().map(|e| &*e.row).collect();
        let values =
            rows_to_batch(self.schema.clone(), &self.types, &rows).map_err(|e| e.to_string())?;
        let mut fields: Vec<Field> = self.schema.fields().iter().map(|f| (**f).clone()).collect();
        fields.push(Field::new(TS, DataType::Int64, false));
        fields.push(Field::new(SEQ, DataType::UInt64, false));
        let mut columns: Vec<ArrayRef> = values.columns().to_vec();
        columns.push(Arc::new(Int64Array::from_iter_values(
            events.iter().map(|e| e.ts),
        )));
        columns.push(Arc::new(UInt64Array::from_iter_values(
            events.iter().map(|e| e.seq),
        )));
        RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).map_err(|e| e.to_string())
    }

    fn decode(&self, batch: &RecordBatch) -> Result<Vec<Event>, String> {
        let n = batch.num_rows();
        let column = |name: &str| batch.column_by_name(name).cloned();
        let ts = column(TS).ok_or("no event time column")?;
        let ts = ts
            .as_any()
            .downcast_ref::<Int64Array>()
            .ok_or("bad event time column")?;
        let seq = column(SEQ).ok_or("no sequence column")?;
        let seq = seq
            .as_any()
            .downcast_ref::<UInt64Array>()
            .ok_or("bad sequence column")?;
        let mut columns = Vec::with_capacity(self.stream.columns.len());
        for c in &self.stream.columns {
            columns.push(match column(&c.name) {
                Some(a) => column_values(&a).map_err(|e| e.to_string())?,
                None => vec![Value::Null; n],
            });
        }
        let rows: Vec<Row> = columns_to_rows(columns, n);
        let masks = self.masks(&rows)?;
        Ok(rows
            .into_iter()
            .zip(masks)
            .enumerate()
            .map(|(i, (row, mask))| Event {
                ts: ts.value(i),
                seq: seq.value(i),
                mask,
                row,
            })
            .collect())
    }

    fn size_of(&self, e: &Event) -> usize {
        EVENT_OVERHEAD_BYTES
            + e.row
                .iter()
                .map(|v| match v {
                    // A short text lives inside its value; only a longer one has a heap copy.
                    Value::Text(s) if !s.is_inline() => 32 + s.len(),
                    _ => 32,
                })
                .sum::<usize>()
    }
}
