//! A metric's past: its values just after each stored event, replayed from a task's
//! reservoir by a fresh in-memory task that runs that metric alone.
//!
//! Invariants:
//! - the replay applies the stored events in the order the task applied them (arrival
//!   sequence), so stream time, window edges and every value are the ones
//!   `INSERT … RETURNING` gave (or would have given) live;
//! - reads are in event-time order, in pages, and the replay holds back only the events
//!   whose predecessors may still be unread: an accepted event is at most `lateness`
//!   older than every event before it, so once the read passed `ts + lateness`, nothing
//!   applied before it is left to read;
//! - a row is given only where its window's events are all still stored: from one
//!   window reach past the retention horizon (`History::start`).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use eddy_planner::catalog::{MetricDef, StreamDef};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::exec::events::{Outcome, Row};
use crate::exec::task::Task;

/// Events a history page holds at most (a page never splits one event time).
pub const PAGE_EVENTS: usize = 16 * 1024;

/// Events the replay applies in one batch.
const APPLY_BATCH: usize = 1024;

/// A page of a task's stored events, read for a history.
#[derive(Clone, Debug, Default)]
pub struct HistoryPage {
    /// (event time µs, arrival sequence, row), in (ts, seq) order.
    pub events: Vec<(i64, u64, Row)>,
    /// Every stored event with `ts <= through` past the page's start is in the page.
    pub through: i64,
    /// The task's stream time (`None`: no event yet).
    pub time: Option<i64>,
    /// The arrival sequence of the task's last accepted event.
    pub seq: u64,
    /// Events the task stores.
    pub stored: usize,
    /// Events at or before this time may have left the reservoir (retention).
    pub horizon: i64,
}

/// Where a history read of `metric` must start reading so that a row at `from` is
/// exact: one window reach earlier (everything stored, for windows without a reach).
pub fn read_from(metric: &MetricDef, from: i64) -> i64 {
    match metric.window.reach_us() {
        Some(reach) => from.saturating_sub(reach),
        None => i64::MIN,
    }
}

/// The first event time whose row is exact, given the task's retention horizon: one
/// window reach past it (at it, for windows without a reach: their values count the
/// events still stored, as a metric created now would).
pub fn start(metric: &MetricDef, horizon: i64) -> i64 {
    horizon.saturating_add(metric.window.reach_us().unwrap_or(0))
}

/// The stream columns a history row of `metric` starts with: the stream's event-id and
/// event-time columns, then the metric's group-by columns (each column once). Its
/// aggregates follow, named as `SELECT *` names them.
pub fn columns(stream: &StreamDef, metric: &MetricDef) -> Vec<usize> {
    let mut out: Vec<usize> = stream.event_id.into_iter().collect();
    for c in [stream.event_time]
        .into_iter()
        .chain(metric.group_by.iter().copied())
    {
        if !out.contains(&c) {
            out.push(c);
        }
    }
    out
}

/// A question to a replay: the metric's state as it stood when the task's stream time
/// was `t`, that is after the last event applied before the first one later than `t`.
#[derive(Clone, Debug)]
pub struct Probe {
    pub t: i64,
    pub ask: Ask,
    /// The asker's number for the answer.
    pub tag: usize,
}

#[derive(Clone, Debug)]
pub enum Ask {
    /// The metric's rows (group-by values, then its values), as `SELECT * FROM metric`
    /// gives them: every group with events, or the one of these group-by values.
    Rows(Option<Vec<Value>>),
    /// The metric's values for the group of this stream row, as RETURNING gives them (a
    /// group with no event has COUNT 0 and NULL for the rest).
    Values(Row),
}

/// The group every probe asks for, by stream column, when there is one and its values
/// compare as its group key does (no float column: -0 and 0 are one group).
fn one_group(
    stream: &StreamDef,
    metric: &MetricDef,
    probes: &[Probe],
) -> Option<Vec<(usize, Value)>> {
    let Some(Probe {
        ask: Ask::Rows(Some(key)),
        ..
    }) = probes.first()
    else {
        return None;
    };
    let same = probes
        .iter()
        .all(|p| matches!(&p.ask, Ask::Rows(Some(k)) if k == key));
    let exact = metric
        .group_by
        .iter()
        .all(|&c| !stream.columns[c].ty.is_float());
    (same && exact && key.len() == metric.group_by.len() && key.iter().all(|v| !v.is_null())).then(
        || {
            metric
                .group_by
                .iter()
                .copied()
                .zip(key.iter().cloned())
                .collect()
        },
    )
}

/// One task's replay of a metric.
pub struct Replay {
    task: Task,
    metric: String,
    /// The stream columns each row starts with (`columns`).
    head: Vec<usize>,
    lateness: i64,
    /// Rows are given for events with `from <= ts <= upto`.
    from: i64,
    upto: i64,
    /// Read events waiting for their predecessors, by arrival sequence.
    waiting: BinaryHeap<Reverse<Waiting>>,
    batch: Vec<Row>,
    times: Vec<i64>,
    /// Probes not answered yet, by time, and the answers so far.
    probes: std::collections::VecDeque<Probe>,
    answers: Vec<(usize, Vec<Vec<Value>>)>,
    /// How far back the window reaches (`None`: to the first event).
    reach: Option<i64>,
    /// Where a read must start for every answer so far to be exact: one reach before
    /// the stream time the replay had when it answered.
    reads_from: i64,
    /// When every probe asks for one group: its group-by values by stream column. Only
    /// that group's events are applied; the others only move the stream time.
    only: Option<Vec<(usize, Value)>>,
    /// The latest time of the events left out since the task's time last moved.
    skipped: Option<i64>,
}

struct Waiting {
    seq: u64,
    ts: i64,
    row: Row,
}

impl PartialEq for Waiting {
    fn eq(&self, other: &Self) -> bool {
        self.seq == other.seq
    }
}
impl Eq for Waiting {}
impl PartialOrd for Waiting {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Waiting {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.seq.cmp(&other.seq)
    }
}

impl Replay {
    /// A replay of `metric` over one task's events, giving rows for `from..=upto`.
    pub fn new(stream: &StreamDef, metric: &MetricDef, from: i64, upto: i64) -> Result<Replay> {
        Replay::probing(stream, metric, from, upto, Vec::new())
    }

    /// `new`, answering `probes` on the way (`answers`).
    pub fn probing(
        stream: &StreamDef,
        metric: &MetricDef,
        from: i64,
        upto: i64,
        mut probes: Vec<Probe>,
    ) -> Result<Replay> {
        probes.sort_by_key(|p| p.t);
        let only = one_group(stream, metric, &probes);
        // Every event it is given was accepted once, with its id unseen: no dedup here,
        // and nothing kept beyond what the window needs.
        let mut own = stream.clone();
        own.event_id = None;
        own.retention_us = 0;
        let mut task = Task::new(Arc::new(own), metric.partitioner);
        task.set_metrics(&[Arc::new(metric.clone())])?;
        Ok(Replay {
            task,
            metric: metric.name.clone(),
            head: columns(stream, metric),
            lateness: stream.lateness_us,
            from,
            upto,
            waiting: BinaryHeap::new(),
            batch: Vec::with_capacity(APPLY_BATCH),
            times: Vec::with_capacity(APPLY_BATCH),
            probes: probes.into(),
            answers: Vec::new(),
            reach: metric.window.reach_us(),
            reads_from: i64::MAX,
            only,
            skipped: None,
        })
    }

    /// Where the read must have started for every probe answered so far to be exact
    /// (probes see the state at the replay's stream time then, which may be well before
    /// their own time).
    pub fn reads_from(&self) -> i64 {
        self.reads_from
    }

    /// The probes answered so far, as (tag, rows).
    pub fn take_answers(&mut self) -> Vec<(usize, Vec<Vec<Value>>)> {
        std::mem::take(&mut self.answers)
    }

    /// Answers every probe earlier than the event at `next` (all, at the end) from the
    /// state as it stands.
    fn answer(&mut self, next: Option<i64>) -> Result<()> {
        // Called when a probe is due, or at the end: the time the others set first.
        self.catch_up()?;
        while self
            .probes
            .front()
            .is_some_and(|p| next.is_none_or(|ts| p.t < ts))
        {
            let p = self.probes.pop_front().expect("checked");
            let from = match (self.task.time(), self.reach) {
                (Some(t), Some(reach)) => t.saturating_sub(reach),
                _ => i64::MIN,
            };
            self.reads_from = self.reads_from.min(from);
            let rows = match &p.ask {
                Ask::Rows(key) => self.task.metric_rows(&self.metric, key.as_deref()),
                Ask::Values(row) => self
                    .task
                    .values_for(row)
                    .into_iter()
                    .map(|(_, values)| values)
                    .collect(),
            };
            self.answers.push((p.tag, rows));
        }
        Ok(())
    }

    /// Moves the task to the stream time the events left out set (`only`).
    fn catch_up(&mut self) -> Result<()> {
        match self.skipped.take() {
            Some(t) => self.task.advance_to(t),
            None => Ok(()),
        }
    }

    /// Takes a page of events and adds to `out` the rows of every event whose
    /// predecessors have all been read (the read reached `page.through`).
    pub fn push(&mut self, page: HistoryPage, out: &mut Vec<Vec<Value>>) -> Result<()> {
        let through = page.through;
        // An event whose arrival precedes every other event read and not applied, and
        // whose predecessors have all been read, is applied at once: no heap for events
        // that arrived in time order. `later[i]`: the least sequence after event i.
        let mut later = vec![u64::MAX; page.events.len()];
        for i in (1..page.events.len()).rev() {
            later[i - 1] = later[i].min(page.events[i].1);
        }
        for ((ts, seq, row), later) in page.events.into_iter().zip(later) {
            let first = self.waiting.peek().is_none_or(|w| seq < w.0.seq) && seq < later;
            if first && ts.saturating_add(self.lateness) <= through {
                self.stage(Waiting { seq, ts, row }, out)?;
            } else {
                self.waiting.push(Reverse(Waiting { seq, ts, row }));
            }
        }
        while let Some(Reverse(w)) = self.waiting.peek() {
            if w.ts.saturating_add(self.lateness) > through {
                break;
            }
            let Reverse(w) = self.waiting.pop().expect("peeked");
            self.stage(w, out)?;
        }
        self.apply(out)
    }

    /// Applies every event still waiting: the read has reached the end.
    pub fn finish(&mut self, out: &mut Vec<Vec<Value>>) -> Result<()> {
        while let Some(Reverse(w)) = self.waiting.pop() {
            self.stage(w, out)?;
        }
        self.apply(out)?;
        self.answer(None)
    }

    fn stage(&mut self, w: Waiting, out: &mut Vec<Vec<Value>>) -> Result<()> {
        // The first event later than a probe's time: the probe sees the state before it.
        if self.probes.front().is_some_and(|p| w.ts > p.t) {
            self.apply(out)?;
            self.answer(Some(w.ts))?;
        }
        if let Some(only) = &self.only {
            if !only.iter().all(|(c, v)| w.row.get(*c) == Some(v)) {
                self.skipped = self.skipped.max(Some(w.ts));
                return Ok(());
            }
            // The group's event comes at the stream time the others moved it to.
            if self.skipped.is_some() {
                self.apply(out)?;
                self.catch_up()?;
            }
        }
        self.batch.push(w.row);
        self.times.push(w.ts);
        if self.batch.len() == APPLY_BATCH {
            self.apply(out)?;
        }
        Ok(())
    }

    fn apply(&mut self, out: &mut Vec<Vec<Value>>) -> Result<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        // Without rows to give, only the probes read the state.
        let values = self.from <= self.upto;
        let answers = self.task.ingest(&self.batch, values)?;
        for ((row, &ts), (outcome, values)) in self.batch.iter().zip(&self.times).zip(answers) {
            if outcome != Outcome::Accepted {
                return Err(Error::internal(format!(
                    "a stored event was {outcome:?} on replay"
                )));
            }
            if ts < self.from || ts > self.upto {
                continue;
            }
            let mut r: Vec<Value> = self.head.iter().map(|&c| row[c].clone()).collect();
            if let Some((_, v)) = values.into_iter().next() {
                r.extend(v);
            }
            out.push(r);
        }
        self.batch.clear();
        self.times.clear();
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_planner::ddl::catalog_of;

    /// Every metric's history, read back in small pages, is the live RETURNING values of
    /// the accepted events, in the order they were applied.
    #[test]
    fn replays_the_live_values() {
        let windows = [
            "SLIDING (SIZE 10 SECONDS)",
            "SLIDING (SIZE 10 SECONDS, DELAY 3 SECONDS)",
            "TUMBLING (SIZE 7 SECONDS)",
            "SLIDING (SIZE 3 EVENTS)",
            "INFINITE",
        ];
        for (i, window) in windows.iter().enumerate() {
            let c = catalog_of([
                "CREATE STREAM p (id BIGINT, ts TIMESTAMP, card TEXT, amount DOUBLE PRECISION) \
                 WITH (event_time = 'ts', event_id = 'id', lateness = '5 seconds', partitions = 1)"
                    .to_string(),
                format!(
                    "CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s, \
                     MAX(amount) AS hi FROM p WINDOW {window} WHERE amount > 1 GROUP BY card"
                ),
            ])
            .unwrap();
            let stream = c.stream("p").unwrap().clone();
            let metric = c.metric("m").unwrap().clone();
            let mut live = Task::new(stream.clone(), 0);
            live.set_metrics(std::slice::from_ref(&metric)).unwrap();
            let mut expected = Vec::new();
            let mut seed = 7u64 + i as u64;
            let mut next = move || {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                seed
            };
            let base = 1_700_000_000_000_000i64;
            // (probe time, the rows as they stood then), taken before an event moved T.
            let mut snapshots: Vec<(i64, Vec<Vec<Value>>)> = Vec::new();
            for n in 0..3000i64 {
                // Jitter within and beyond the lateness, and re-sent ids.
                let ts = base + n * 100_000 - (next() % 8_000_000) as i64;
                let id = if next() % 20 == 0 { n - 1 } else { n };
                let row: Row = vec![
                    Value::Int(id),
                    Value::Timestamp(ts),
                    Value::Text(format!("c{}", next() % 5).into()),
                    Value::Float((next() % 40) as f64 / 4.0),
                ]
                .into();
                let before = live.time();
                let rows_before = (n % 7 == 0).then(|| live.metric_rows("m", None));
                let (outcome, values) = live
                    .ingest(std::slice::from_ref(&row), true)
                    .unwrap()
                    .remove(0);
                if let (Some(t), Some(mut rows)) = (before, rows_before) {
                    if live.time() != before {
                        rows.sort_by_key(|r| format!("{r:?}"));
                        // Any time from T up to (not including) the event's.
                        let at = t + (ts - t) / 2;
                        snapshots.push((at, rows));
                    }
                }
                if outcome == Outcome::Accepted {
                    let mut r = vec![row[0].clone(), row[1].clone(), row[2].clone()];
                    r.extend(values.into_iter().next().unwrap().1);
                    expected.push(r);
                }
            }
            assert!(expected.len() > 2000, "{window}: {}", expected.len());
            let mut replay = Replay::new(&stream, &metric, i64::MIN, i64::MAX).unwrap();
            let mut got = Vec::new();
            let mut after = i64::MIN;
            loop {
                let page = live.history_page(after, i64::MAX, 100).unwrap();
                let done = page.events.is_empty();
                after = page.through;
                replay.push(page, &mut got).unwrap();
                if done {
                    break;
                }
            }
            replay.finish(&mut got).unwrap();
            assert_eq!(got.len(), expected.len(), "{window}");
            assert!(got == expected, "{window}: the replay differs");

            // Probes see the state as it stood at their time.
            assert!(snapshots.len() > 30, "{window}: {}", snapshots.len());
            let probes = snapshots
                .iter()
                .enumerate()
                .map(|(tag, (t, _))| Probe {
                    t: *t,
                    ask: Ask::Rows(None),
                    tag,
                })
                .collect();
            let mut replay = Replay::probing(&stream, &metric, i64::MAX, i64::MIN, probes).unwrap();
            let mut none = Vec::new();
            let page = live.history_page(i64::MIN, i64::MAX, usize::MAX).unwrap();
            replay.push(page, &mut none).unwrap();
            replay.finish(&mut none).unwrap();
            assert!(none.is_empty());
            let mut answers = replay.take_answers();
            answers.sort_by_key(|a| a.0);
            assert_eq!(answers.len(), snapshots.len());
            for ((tag, mut rows), (t, want)) in answers.into_iter().zip(&snapshots) {
                rows.sort_by_key(|r| format!("{r:?}"));
                assert_eq!(&rows, want, "{window}: probe {tag} at {t}");
            }

            // Probes of one group apply only its events, and see the same state.
            for card in ["c0", "c3"] {
                let key = vec![Value::Text(card.into())];
                let probes = snapshots
                    .iter()
                    .enumerate()
                    .map(|(tag, (t, _))| Probe {
                        t: *t,
                        ask: Ask::Rows(Some(key.clone())),
                        tag,
                    })
                    .collect();
                let mut replay =
                    Replay::probing(&stream, &metric, i64::MAX, i64::MIN, probes).unwrap();
                assert!(replay.only.is_some());
                let page = live.history_page(i64::MIN, i64::MAX, usize::MAX).unwrap();
                replay.push(page, &mut none).unwrap();
                replay.finish(&mut none).unwrap();
                let mut answers = replay.take_answers();
                answers.sort_by_key(|a| a.0);
                for ((tag, rows), (t, all)) in answers.into_iter().zip(&snapshots) {
                    let want: Vec<_> = all.iter().filter(|r| r[0] == key[0]).cloned().collect();
                    assert_eq!(rows, want, "{window}: {card} probe {tag} at {t}");
                }
            }
        }
    }
}
