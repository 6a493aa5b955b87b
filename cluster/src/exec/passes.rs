//! WHERE results computed ahead of the task, by the stateless stage that parsed the rows
//! (a COPY's parse jobs, on any shard): per predicate, whether each row passes. A task
//! takes them for its filters with the same predicate text and evaluates any other one
//! itself, so a result never depends on where a predicate ran.

use std::sync::Arc;

use datafusion::arrow::record_batch::RecordBatch;
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::filter::Filter;
use eddy_planner::Result;

/// The distinct WHERE predicates of a stream's metrics, compiled.
pub struct Predicates {
    texts: Arc<[String]>,
    filters: Vec<Filter>,
}

impl Predicates {
    /// The predicates of `stream`'s metrics in `catalog`: the first 64 (one bit each of a
    /// row's word; a task evaluates any other itself).
    pub fn of(catalog: &Catalog, stream: &StreamDef) -> Result<Predicates> {
        let mut texts: Vec<String> = Vec::new();
        for metric in catalog.metrics_of(&stream.name) {
            if let Some(text) = &metric.filter {
                if !texts.contains(text) && texts.len() < u64::BITS as usize {
                    texts.push(text.clone());
                }
            }
        }
        let filters = texts
            .iter()
            .map(|t| Filter::compile(stream, t))
            .collect::<Result<_>>()?;
        Ok(Predicates {
            texts: texts.into(),
            filters,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.texts.is_empty()
    }

    /// Evaluates every predicate over `batch` (rows of the stream's schema).
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<Passes> {
        let mut bits = vec![0u64; batch.num_rows()];
        for (i, filter) in self.filters.iter().enumerate() {
            for (row, pass) in filter.evaluate(batch)?.into_iter().enumerate() {
                if pass {
                    bits[row] |= 1 << i;
                }
            }
        }
        Ok(Passes {
            texts: self.texts.clone(),
            bits,
        })
    }
}

/// For each row of a batch, whether it passes each predicate of `texts` (one bit each).
#[derive(Clone, Debug)]
pub struct Passes {
    texts: Arc<[String]>,
    bits: Vec<u64>,
}

impl Passes {
    pub fn len(&self) -> usize {
        self.bits.len()
    }

    pub fn is_empty(&self) -> bool {
        self.bits.is_empty()
    }

    /// The results of rows `indexes`, in that order (a task's share of a statement).
    pub fn select(&self, indexes: &[usize]) -> Passes {
        Passes {
            texts: self.texts.clone(),
            bits: indexes.iter().map(|&i| self.bits[i]).collect(),
        }
    }

    /// Adds the results of rows that follow, for the same predicates (a COPY's batches
    /// made into one statement).
    pub fn append(&mut self, more: &Passes) {
        debug_assert_eq!(self.texts, more.texts);
        self.bits.extend_from_slice(&more.bits);
    }

    /// Which rows pass `predicate`, if it was evaluated here.
    pub fn of(&self, predicate: &str) -> Option<impl Iterator<Item = bool> + '_> {
        let i = self.texts.iter().position(|t| t == predicate)?;
        Some(self.bits.iter().map(move |b| b & (1 << i) != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::events::Row;
    use crate::exec::task::Task;
    use eddy_planner::filter::{rows_to_batch, stream_schema, stream_types};
    use eddy_planner::types::Value;

    fn catalog() -> Catalog {
        eddy_planner::ddl::catalog_of([
            "CREATE STREAM p (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partitions = 1)",
            "CREATE METRIC big AS SELECT card, COUNT(*) AS n FROM p WINDOW INFINITE \
             WHERE amount > 10 GROUP BY card",
            "CREATE METRIC odd AS SELECT card, SUM(amount) AS s FROM p WINDOW INFINITE \
             WHERE amount % 2 = 1 GROUP BY card",
        ])
        .unwrap()
    }

    /// The rows of every metric after `rows`, with `passes` handed to the task.
    fn run(rows: &[Row], passes: Option<&Passes>) -> Vec<Vec<Value>> {
        let c = catalog();
        let stream = c.stream("p").unwrap();
        let mut task = Task::new(stream.clone(), 0);
        task.set_metrics(&c.metrics_of("p")).unwrap();
        task.ingest_with(rows, false, passes).unwrap();
        let mut out = task.metric_rows("big", None);
        out.extend(task.metric_rows("odd", None));
        out.sort_by_key(|r| format!("{r:?}"));
        out
    }

    #[test]
    fn tasks_take_the_results_given_and_evaluate_the_rest() {
        let c = catalog();
        let stream = c.stream("p").unwrap();
        let rows: Vec<Row> = (0..40)
            .map(|i| {
                Row::from(vec![
                    Value::Timestamp(1_000_000 * i),
                    Value::Text(format!("c{}", i % 3).into()),
                    Value::Int(i),
                ])
            })
            .collect();
        let plain: Vec<Vec<Value>> = rows.iter().map(|r| r.to_vec()).collect();
        let batch = rows_to_batch(stream_schema(stream), &stream_types(stream), &plain).unwrap();
        let predicates = Predicates::of(&c, stream).unwrap();
        let passes = predicates.evaluate(&batch).unwrap();
        let evaluated_here = run(&rows, None);
        assert_eq!(run(&rows, Some(&passes)), evaluated_here);
        // A task's share of the rows: the same results.
        let share: Vec<usize> = (0..40).filter(|i| i % 4 != 1).collect();
        let some: Vec<Row> = share.iter().map(|&i| rows[i].clone()).collect();
        assert_eq!(run(&some, Some(&passes.select(&share))), run(&some, None));
        // Results for a predicate the task does not run are ignored; one it runs and is
        // not given, it evaluates.
        let only_big = Passes {
            texts: vec!["amount > 10".to_string(), "amount < 0".to_string()].into(),
            bits: passes.bits.iter().map(|b| b & 1).collect(),
        };
        assert_eq!(run(&rows, Some(&only_big)), evaluated_here);
        // What is given is what counts: every row failing `amount > 10` leaves `big` empty.
        let none_big = Passes {
            texts: passes.texts.clone(),
            bits: passes.bits.iter().map(|b| b & !1).collect(),
        };
        let rows_of = |metric_rows: Vec<Vec<Value>>| metric_rows.len();
        assert_eq!(rows_of(run(&rows, Some(&none_big))), 3);
        assert_eq!(rows_of(evaluated_here), 6);
    }
}
