//! The task executor: one (stream, partitioner, partition) running its slice of the
//! stream's shared-prefix DAG over its own reservoir, single-threaded.
//!
//! Invariants (the semantics of docs/sql.md, "Semantics"):
//! - stream time T is the largest accepted event time; it never moves back;
//! - a duplicate `event_id` is never applied twice; an event older than T − lateness is
//!   late and not applied;
//! - every window holds exactly the events with tail < ts ≤ head for its edges at T: its
//!   edges only move forward, and each event enters and leaves at most once;
//! - a group whose window holds no event has no entry (sliding) or a stale epoch
//!   (tumbling), and is never shown;
//! - with watches attached, every group whose values an event changed (by entering,
//!   expiring or a tumbling window moving on) is handed to the metric's watchers once
//!   for that event, with its values after the event.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use hashbrown::HashMap;

use eddy_planner::aggregate::{AggFunc, AggState};
use eddy_planner::catalog::{EventTimeUnit, MetricDef, StreamDef};
use eddy_planner::dag::{AggKey, FilterKey, GroupKey, WindowKey};
use eddy_planner::filter::{rows_to_batch, stream_schema, stream_types, Filter};
use eddy_planner::types::{ColumnType, Value};
use eddy_planner::window::WindowSpec;
use eddy_planner::{Error, Result};
use eddy_storage::{MemReservoir, Reservoir, Timed};

use crate::key::{pack, unpack, PackedKey};
use crate::watch::{Change, WatchId, WatchTarget, Watcher};

/// An event's column values in the stream's column order.
pub type Row = Arc<[Value]>;

/// How long event ids are remembered beyond the lateness, in stream time.
pub const DEDUP_EXTRA_US: i64 = 3_600_000_000;
/// Events between two retention sweeps of the reservoir.
const RETENTION_SWEEP_EVENTS: u32 = 4096;
/// Events per Arrow batch when a new filter is evaluated over stored events.
const BACKFILL_BATCH_ROWS: usize = 8192;
/// Filters with a predicate per task: each owns one bit of an event's mask.
pub const FILTERS_PER_TASK_MAX: usize = 64;

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

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskStats {
    pub accepted: u64,
    pub late: u64,
    pub duplicates: u64,
}

struct AggSlot {
    key: AggKey,
    func: AggFunc,
    arg: Option<usize>,
    arg_type: Option<ColumnType>,
}

struct GroupState {
    count: i64,
    epoch: i64,
    states: Vec<AggState>,
}

struct GroupExec {
    key: GroupKey,
    aggs: Vec<AggSlot>,
    table: HashMap<PackedKey, GroupState>,
    /// A metric on this group has watchers: record the keys each event changes.
    watched: bool,
    touched: Vec<Box<[u8]>>,
}

/// A subscription attached to this task.
struct TaskWatch {
    id: WatchId,
    target: WatchTarget,
    /// The metric's slot in `Task::metrics` (metric targets).
    slot: usize,
    watcher: Arc<dyn Watcher>,
}

/// Which changed rows a watch reads: a metric's (by slot) or the stream's.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Feed {
    Metric(usize),
    Stream,
}

impl TaskWatch {
    fn feed(&self) -> Feed {
        match self.target {
            WatchTarget::Metric(_) => Feed::Metric(self.slot),
            WatchTarget::Stream => Feed::Stream,
        }
    }
}

struct FilterExec {
    key: FilterKey,
    predicate: Option<Filter>,
    /// The mask bit this filter's result occupies in stored events.
    bit: Option<u32>,
    groups: Vec<GroupExec>,
}

struct WindowExec {
    key: WindowKey,
    /// Events with ts ≤ head have entered (unless ts ≤ tail).
    head: i64,
    /// Events with ts ≤ tail have left or never entered.
    tail: i64,
    /// Tumbling windows empty lazily: a group with another epoch is empty.
    epoch: i64,
    filters: Vec<FilterExec>,
}

/// Where a metric's values live in the task's DAG.
struct MetricSlot {
    name: String,
    window: usize,
    filter: usize,
    group: usize,
    aggs: Vec<usize>,
}

/// Metric values for one event: per metric of the task (creation order), its aggregates.
pub type MetricValues = Vec<(String, Vec<Value>)>;

pub struct Task {
    stream: Arc<StreamDef>,
    partitioner: usize,
    time: Option<i64>,
    seq: u64,
    dedup_ids: HashSet<Value>,
    dedup_order: VecDeque<(i64, Value)>,
    reservoir: Box<dyn Reservoir<Event>>,
    windows: Vec<WindowExec>,
    metrics: Vec<MetricSlot>,
    used_bits: u64,
    since_sweep: u32,
    key_buf: Vec<u8>,
    watches: Vec<TaskWatch>,
    /// Changed rows collected during a batch, once per feed, shared by its watches.
    feeds: Vec<(Feed, Vec<Change>)>,
    pub stats: TaskStats,
}

impl Task {
    pub fn new(stream: Arc<StreamDef>, partitioner: usize) -> Task {
        Task {
            stream,
            partitioner,
            time: None,
            seq: 0,
            dedup_ids: HashSet::new(),
            dedup_order: VecDeque::new(),
            reservoir: Box::new(MemReservoir::default()),
            windows: Vec::new(),
            metrics: Vec::new(),
            used_bits: 0,
            since_sweep: 0,
            key_buf: Vec::new(),
            watches: Vec::new(),
            feeds: Vec::new(),
            stats: TaskStats::default(),
        }
    }

    pub fn stream(&self) -> &Arc<StreamDef> {
        &self.stream
    }

    /// Stream time T: the largest accepted event time.
    pub fn time(&self) -> Option<i64> {
        self.time
    }

    pub fn stored_events(&self) -> usize {
        self.reservoir.len()
    }

    /// Event time in microseconds of a row.
    pub fn event_time(stream: &StreamDef, row: &[Value]) -> Result<i64> {
        match (&row[stream.event_time], stream.event_time_unit) {
            (Value::Timestamp(us), EventTimeUnit::Timestamp) => Ok(*us),
            (Value::Int(ms), EventTimeUnit::Millis) => ms.checked_mul(1000).ok_or_else(|| {
                Error::new(
                    eddy_planner::ErrorKind::NumericOutOfRange,
                    "event time out of range",
                )
            }),
            _ => Err(Error::new(
                eddy_planner::ErrorKind::NotNullViolation,
                format!(
                    "null value in column \"{}\" of relation \"{}\" violates not-null constraint",
                    stream.columns[stream.event_time].name, stream.name
                ),
            )),
        }
    }

    /// Makes the task run exactly `metrics` (this partitioner's, in creation order),
    /// keeping the state of nodes that stay and backfilling new nodes from the reservoir.
    pub fn set_metrics(&mut self, metrics: &[Arc<MetricDef>]) -> Result<()> {
        let metrics: Vec<&Arc<MetricDef>> = metrics
            .iter()
            .filter(|m| m.stream == self.stream.name && m.partitioner == self.partitioner)
            .collect();
        let wanted_aggs: HashSet<AggKey> = metrics
            .iter()
            .flat_map(|m| (0..m.aggregates.len()).map(|i| AggKey::of(m, i)))
            .collect();
        // Drop what no metric uses any more, from the leaves up.
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    let keep: Vec<bool> = g
                        .aggs
                        .iter()
                        .map(|a| wanted_aggs.contains(&a.key))
                        .collect();
                    if keep.iter().all(|k| *k) {
                        continue;
                    }
                    let mut i = 0;
                    g.aggs.retain(|_| {
                        i += 1;
                        keep[i - 1]
                    });
                    for state in g.table.values_mut() {
                        let mut j = 0;
                        state.states.retain(|_| {
                            j += 1;
                            keep[j - 1]
                        });
                    }
                }
                f.groups.retain(|g| !g.aggs.is_empty());
            }
            let used_bits = &mut self.used_bits;
            w.filters.retain(|f| {
                if f.groups.is_empty() {
                    if let Some(bit) = f.bit {
                        *used_bits &= !(1u64 << bit);
                    }
                    false
                } else {
                    true
                }
            });
        }
        self.windows.retain(|w| !w.filters.is_empty());

        // Add what is new; remember it for the backfill.
        let mut new_filters: Vec<(usize, usize)> = Vec::new();
        let mut new_groups: Vec<(usize, usize, usize)> = Vec::new();
        let mut new_aggs: Vec<(usize, usize, usize, usize)> = Vec::new();
        let t = self.time;
        for m in &metrics {
            let gk = GroupKey::of(m);
            let wi = match self.windows.iter().position(|w| w.key == gk.filter.window) {
                Some(i) => i,
                None => {
                    let spec = m.window;
                    self.windows.push(WindowExec {
                        key: gk.filter.window.clone(),
                        head: t.map_or(i64::MIN, |t| spec.head_bound(t)),
                        tail: t.map_or(i64::MIN, |t| spec.tail_bound(t).unwrap_or(i64::MIN)),
                        epoch: t.map_or(0, |t| spec.epoch(t)),
                        filters: Vec::new(),
                    });
                    self.windows.len() - 1
                }
            };
            let w = &mut self.windows[wi];
            let fi = match w.filters.iter().position(|f| f.key == gk.filter) {
                Some(i) => i,
                None => {
                    let (predicate, bit) = match &gk.filter.predicate {
                        Some(text) => {
                            let bit = (0..FILTERS_PER_TASK_MAX as u32)
                                .find(|b| self.used_bits & (1u64 << b) == 0)
                                .ok_or_else(|| {
                                    Error::new(
                                        eddy_planner::ErrorKind::ResourcesExhausted,
                                        format!(
                                            "stream \"{}\" has more than {FILTERS_PER_TASK_MAX} distinct WHERE clauses",
                                            self.stream.name
                                        ),
                                    )
                                })?;
                            self.used_bits |= 1u64 << bit;
                            (Some(Filter::compile(&self.stream, text)?), Some(bit))
                        }
                        None => (None, None),
                    };
                    w.filters.push(FilterExec {
                        key: gk.filter.clone(),
                        predicate,
                        bit,
                        groups: Vec::new(),
                    });
                    new_filters.push((wi, w.filters.len() - 1));
                    w.filters.len() - 1
                }
            };
            let f = &mut w.filters[fi];
            let gi = match f.groups.iter().position(|g| g.key == gk) {
                Some(i) => i,
                None => {
                    f.groups.push(GroupExec {
                        key: gk.clone(),
                        aggs: Vec::new(),
                        table: HashMap::new(),
                        watched: false,
                        touched: Vec::new(),
                    });
                    new_groups.push((wi, fi, f.groups.len() - 1));
                    f.groups.len() - 1
                }
            };
            let g = &mut f.groups[gi];
            for i in 0..m.aggregates.len() {
                let ak = AggKey::of(m, i);
                if g.aggs.iter().any(|a| a.key == ak) {
                    continue;
                }
                let arg_type = ak.arg.map(|c| self.stream.columns[c].ty);
                for state in g.table.values_mut() {
                    state.states.push(ak.func.new_state(arg_type));
                }
                g.aggs.push(AggSlot {
                    func: ak.func,
                    arg: ak.arg,
                    arg_type,
                    key: ak,
                });
                new_aggs.push((wi, fi, gi, g.aggs.len() - 1));
            }
        }

        // Backfill: filter bits first, then new groups whole, then new slots of old groups.
        for &(wi, fi) in &new_filters {
            self.evaluate_stored(wi, fi)?;
        }
        for &(wi, fi, gi) in &new_groups {
            self.backfill(wi, fi, gi, None);
        }
        for &(wi, fi, gi, ai) in &new_aggs {
            if !new_groups.contains(&(wi, fi, gi)) {
                self.backfill(wi, fi, gi, Some(ai));
            }
        }

        self.metrics = metrics
            .iter()
            .map(|m| {
                let gk = GroupKey::of(m);
                let wi = self
                    .windows
                    .iter()
                    .position(|w| w.key == gk.filter.window)
                    .expect("window added");
                let fi = self.windows[wi]
                    .filters
                    .iter()
                    .position(|f| f.key == gk.filter)
                    .expect("filter added");
                let g = &self.windows[wi].filters[fi];
                let gi = g
                    .groups
                    .iter()
                    .position(|g| g.key == gk)
                    .expect("group added");
                let aggs = (0..m.aggregates.len())
                    .map(|i| {
                        let ak = AggKey::of(m, i);
                        g.groups[gi]
                            .aggs
                            .iter()
                            .position(|a| a.key == ak)
                            .expect("aggregate added")
                    })
                    .collect();
                MetricSlot {
                    name: m.name.clone(),
                    window: wi,
                    filter: fi,
                    group: gi,
                    aggs,
                }
            })
            .collect();
        self.rebind_watches();
        Ok(())
    }

    /// Points every watch at its metric's slot again after the metrics changed; a watch
    /// whose metric is gone ends.
    fn rebind_watches(&mut self) {
        let metrics = &self.metrics;
        self.watches.retain_mut(|w| {
            let WatchTarget::Metric(name) = &w.target else {
                return true;
            };
            match metrics.iter().position(|m| &m.name == name) {
                Some(slot) => {
                    w.slot = slot;
                    true
                }
                None => {
                    w.watcher.end(Error::new(
                        eddy_planner::ErrorKind::UndefinedTable,
                        format!("metric \"{name}\" was dropped"),
                    ));
                    false
                }
            }
        });
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    g.watched = false;
                    g.touched.clear();
                }
            }
        }
        for watch in &self.watches {
            if let WatchTarget::Metric(_) = watch.target {
                let m = &self.metrics[watch.slot];
                self.windows[m.window].filters[m.filter].groups[m.group].watched = true;
            }
        }
    }

    /// Attaches a subscription. A metric watch first receives every current row of the
    /// metric in this task, stamped with the task's stream time.
    pub fn watch(&mut self, id: WatchId, target: WatchTarget, watcher: Arc<dyn Watcher>) {
        let slot = match &target {
            WatchTarget::Metric(name) => match self.metrics.iter().position(|m| &m.name == name) {
                Some(slot) => slot,
                None => return,
            },
            WatchTarget::Stream => 0,
        };
        if let (WatchTarget::Metric(_), Some(t)) = (&target, self.time) {
            let m = &self.metrics[slot];
            let w = &self.windows[m.window];
            let g = &w.filters[m.filter].groups[m.group];
            let snapshot: Vec<Change> = g
                .table
                .iter()
                .filter(|(_, s)| s.epoch == w.epoch && s.count > 0)
                .map(|(k, s)| change_row(g, m, k.as_bytes(), Some(s), t))
                .collect();
            if !snapshot.is_empty() && !watcher.deliver(&snapshot) {
                return;
            }
        }
        self.watches.push(TaskWatch {
            id,
            target,
            slot,
            watcher,
        });
        self.rebind_watches();
    }

    /// Detaches a subscription.
    pub fn unwatch(&mut self, id: WatchId) {
        self.watches.retain(|w| w.id != id);
        self.rebind_watches();
    }

    /// Ends every subscription attached to this task (the task goes away).
    pub fn end_watches(&mut self, error: &Error) {
        for w in self.watches.drain(..) {
            w.watcher.end(error.clone());
        }
    }

    pub fn watch_count(&self) -> usize {
        self.watches.len()
    }

    /// Computes a new filter's bit for every stored event, in Arrow batches.
    fn evaluate_stored(&mut self, wi: usize, fi: usize) -> Result<()> {
        let f = &self.windows[wi].filters[fi];
        let (Some(predicate), Some(bit)) = (f.predicate.clone(), f.bit) else {
            return Ok(());
        };
        let mut rows: Vec<Row> = Vec::with_capacity(self.reservoir.len());
        self.reservoir
            .for_range(i64::MIN, i64::MAX, &mut |e| rows.push(e.row.clone()));
        let schema = stream_schema(&self.stream);
        let types = stream_types(&self.stream);
        let mut passes = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BACKFILL_BATCH_ROWS) {
            let batch = rows_to_batch(schema.clone(), &types, chunk)?;
            passes.extend(predicate.evaluate(&batch)?);
        }
        let mut i = 0;
        self.reservoir.for_each_mut(&mut |e| {
            if passes[i] {
                e.mask |= 1u64 << bit;
            } else {
                e.mask &= !(1u64 << bit);
            }
            i += 1;
        });
        Ok(())
    }

    /// Applies the window's current contents to a new group (`slot == None`) or to one
    /// new aggregate slot of an existing group.
    fn backfill(&mut self, wi: usize, fi: usize, gi: usize, slot: Option<usize>) {
        let w = &mut self.windows[wi];
        let (head, tail, epoch) = (w.head, w.tail, w.epoch);
        let f = &mut w.filters[fi];
        let bit = f.bit;
        let g = &mut f.groups[gi];
        let key_buf = &mut self.key_buf;
        self.reservoir.for_range(tail, head, &mut |e| {
            if bit.is_some_and(|b| e.mask & (1u64 << b) == 0) {
                return;
            }
            fill_key(key_buf, &g.key.columns, &e.row);
            match slot {
                None => enter_group(g, key_buf, e, epoch),
                Some(s) => {
                    if let Some(state) = g.table.get_mut(key_buf.as_slice()) {
                        if state.epoch == epoch {
                            let a = &g.aggs[s];
                            let v = a.arg.map_or(&Value::Null, |c| &e.row[c]);
                            state.states[s].insert(a.func, v, e.ts, e.seq);
                        }
                    }
                }
            }
        });
    }

    /// Processes a batch of events in order. With `values`, returns after each event the
    /// values of every metric of the task for that event's group.
    pub fn ingest(&mut self, rows: &[Row], values: bool) -> Result<Vec<(Outcome, MetricValues)>> {
        // Evaluate every predicate once over the whole batch, vectorised.
        let mut bits = vec![0u64; rows.len()];
        let predicates: Vec<(Filter, u32)> = self
            .windows
            .iter()
            .flat_map(|w| w.filters.iter())
            .filter_map(|f| Some((f.predicate.clone()?, f.bit?)))
            .collect();
        if !predicates.is_empty() {
            let batch = rows_to_batch(
                stream_schema(&self.stream),
                &stream_types(&self.stream),
                rows,
            )?;
            for (predicate, bit) in predicates {
                for (i, pass) in predicate.evaluate(&batch)?.into_iter().enumerate() {
                    if pass {
                        bits[i] |= 1u64 << bit;
                    }
                }
            }
        }
        let mut out = Vec::with_capacity(rows.len());
        for (row, mask) in rows.iter().zip(bits) {
            let outcome = self.apply(row, mask);
            if !self.watches.is_empty() && matches!(outcome, Ok(Outcome::Accepted)) {
                self.collect_changes(row);
            }
            let vals = if values {
                self.values_for(row)
            } else {
                Vec::new()
            };
            match outcome {
                Ok(outcome) => out.push((outcome, vals)),
                Err(e) => {
                    self.deliver_changes();
                    return Err(e);
                }
            }
        }
        self.deliver_changes();
        Ok(out)
    }

    /// Turns what the last accepted event changed into rows for each watch.
    fn collect_changes(&mut self, row: &Row) {
        let Some(t) = self.time else { return };
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    if g.touched.len() > 1 {
                        g.touched.sort_unstable();
                        g.touched.dedup();
                    }
                }
            }
        }
        let mut wanted: Vec<Feed> = self.watches.iter().map(TaskWatch::feed).collect();
        wanted.sort_unstable_by_key(|f| match f {
            Feed::Metric(slot) => *slot,
            Feed::Stream => usize::MAX,
        });
        wanted.dedup();
        for feed in wanted {
            let at = match self.feeds.iter().position(|(f, _)| *f == feed) {
                Some(i) => i,
                None => {
                    self.feeds.push((feed, Vec::new()));
                    self.feeds.len() - 1
                }
            };
            let out = &mut self.feeds[at].1;
            match feed {
                Feed::Stream => {
                    let mut r = row.to_vec();
                    r.push(Value::Timestamp(t));
                    out.push(Change {
                        key: Box::default(),
                        row: r,
                    });
                }
                Feed::Metric(slot) => {
                    let m = &self.metrics[slot];
                    let w = &self.windows[m.window];
                    let g = &w.filters[m.filter].groups[m.group];
                    for key in &g.touched {
                        let state = g
                            .table
                            .get(&**key)
                            .filter(|s| s.epoch == w.epoch && s.count > 0);
                        out.push(change_row(g, m, key, state, t));
                    }
                }
            }
        }
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    g.touched.clear();
                }
            }
        }
    }

    /// Hands each watch what it collected during a batch; drops watches whose reader left.
    fn deliver_changes(&mut self) {
        if self.feeds.is_empty() {
            return;
        }
        let feeds = std::mem::take(&mut self.feeds);
        let before = self.watches.len();
        self.watches.retain(|w| {
            let feed = w.feed();
            feeds
                .iter()
                .find(|(f, _)| *f == feed)
                .is_none_or(|(_, changes)| changes.is_empty() || w.watcher.deliver(changes))
        });
        if self.watches.len() != before {
            self.rebind_watches();
        }
    }

    fn apply(&mut self, row: &Row, mask: u64) -> Result<Outcome> {
        let ts = Task::event_time(&self.stream, row)?;
        let id = self
            .stream
            .event_id
            .map(|c| row[c].clone())
            .filter(|v| !v.is_null());
        if let Some(id) = &id {
            if self.dedup_ids.contains(id) {
                self.stats.duplicates += 1;
                return Ok(Outcome::Duplicate);
            }
        }
        if let Some(t) = self.time {
            if ts < t.saturating_sub(self.stream.lateness_us) {
                self.stats.late += 1;
                return Ok(Outcome::Late);
            }
        }
        self.stats.accepted += 1;
        self.seq += 1;
        let event = Event {
            ts,
            seq: self.seq,
            mask,
            row: row.clone(),
        };
        if let Some(id) = id {
            self.dedup_ids.insert(id.clone());
            self.dedup_order.push_back((ts, id));
        }
        self.reservoir.insert(event.clone());
        let new_t = self.time.map_or(ts, |t| t.max(ts));
        self.time = Some(new_t);
        for w in &mut self.windows {
            let old_head = w.head;
            advance(w, new_t, self.reservoir.as_ref(), &mut self.key_buf);
            // An out-of-order event behind the old head edge enters directly; one beyond
            // it entered with the range scan, or enters later (delayed windows).
            if ts <= old_head && ts > w.tail {
                apply_event(w, &event, &mut self.key_buf, true);
            }
        }
        self.since_sweep += 1;
        if self.since_sweep >= RETENTION_SWEEP_EVENTS {
            self.since_sweep = 0;
            self.sweep(new_t);
        }
        Ok(Outcome::Accepted)
    }

    /// Drops events past retention (never inside a window) and old event ids.
    fn sweep(&mut self, t: i64) {
        // INFINITE windows never expire events, so they need nothing kept.
        let keep = self
            .windows
            .iter()
            .filter_map(|w| w.key.spec.reach_us())
            .fold(
                self.stream.retention_us.max(self.stream.lateness_us),
                i64::max,
            );
        self.reservoir.expire_through(t.saturating_sub(keep));
        let horizon = t
            .saturating_sub(self.stream.lateness_us)
            .saturating_sub(DEDUP_EXTRA_US);
        while let Some((ts, _)) = self.dedup_order.front() {
            if *ts >= horizon {
                break;
            }
            let (_, id) = self.dedup_order.pop_front().expect("front exists");
            self.dedup_ids.remove(&id);
        }
    }

    /// The values of every metric of the task for the group of `row`, as they stand.
    pub fn values_for(&mut self, row: &[Value]) -> MetricValues {
        let mut out = Vec::with_capacity(self.metrics.len());
        for m in &self.metrics {
            let w = &self.windows[m.window];
            let g = &w.filters[m.filter].groups[m.group];
            fill_key(&mut self.key_buf, &g.key.columns, row);
            let state = g
                .table
                .get(self.key_buf.as_slice())
                .filter(|s| s.epoch == w.epoch && s.count > 0);
            out.push((m.name.clone(), metric_values(g, m, state)));
        }
        out
    }

    /// Every non-empty group of `metric`: group-by values, then aggregate values.
    pub fn metric_rows(&self, metric: &str, key: Option<&[Value]>) -> Vec<Vec<Value>> {
        let Some(m) = self.metrics.iter().find(|m| m.name == metric) else {
            return Vec::new();
        };
        let w = &self.windows[m.window];
        let g = &w.filters[m.filter].groups[m.group];
        let live = |s: &&GroupState| s.epoch == w.epoch && s.count > 0;
        let row = |k: &[u8], s: &GroupState| {
            let mut r = unpack(k);
            r.extend(metric_values(g, m, Some(s)));
            r
        };
        match key {
            Some(k) => {
                let positions: Vec<usize> = (0..k.len()).collect();
                let mut packed = Vec::new();
                pack(&mut packed, &positions, k);
                g.table
                    .get(packed.as_slice())
                    .filter(live)
                    .map(|s| row(&packed, s))
                    .into_iter()
                    .collect()
            }
            None => g
                .table
                .iter()
                .filter(|(_, s)| live(s))
                .map(|(k, s)| row(k.as_bytes(), s))
                .collect(),
        }
    }

    /// The stored events, oldest first.
    pub fn events(&self) -> Vec<Row> {
        let mut out = Vec::with_capacity(self.reservoir.len());
        self.reservoir
            .for_range(i64::MIN, i64::MAX, &mut |e| out.push(e.row.clone()));
        out
    }
}

/// A metric's row for one group as a change: group-by values, aggregates, `changed_at`.
fn change_row(
    g: &GroupExec,
    m: &MetricSlot,
    key: &[u8],
    state: Option<&GroupState>,
    t: i64,
) -> Change {
    let mut row = unpack(key);
    row.extend(metric_values(g, m, state));
    row.push(Value::Timestamp(t));
    Change {
        key: key.into(),
        row,
    }
}

fn metric_values(g: &GroupExec, m: &MetricSlot, state: Option<&GroupState>) -> Vec<Value> {
    m.aggs
        .iter()
        .map(|&a| match state {
            Some(s) => s.states[a].result(g.aggs[a].func),
            None => match g.aggs[a].func {
                AggFunc::CountStar | AggFunc::Count | AggFunc::CountDistinct => Value::Int(0),
                _ => Value::Null,
            },
        })
        .collect()
}

fn fill_key(buf: &mut Vec<u8>, columns: &[usize], row: &[Value]) {
    pack(buf, columns, row);
}

/// Moves a window's edges to stream time `t`: events past the tail leave, then events
/// that reached the head enter, both in event-time order.
fn advance(w: &mut WindowExec, t: i64, reservoir: &dyn Reservoir<Event>, key_buf: &mut Vec<u8>) {
    let spec = w.key.spec;
    let new_head = spec.head_bound(t);
    let new_tail = spec.tail_bound(t).unwrap_or(i64::MIN);
    let (old_head, old_tail) = (w.head, w.tail);
    match spec {
        WindowSpec::Tumbling { .. } => {
            let epoch = spec.epoch(t);
            if epoch != w.epoch {
                // Every group live in the old epoch is empty now.
                let old = w.epoch;
                for f in &mut w.filters {
                    for g in f.groups.iter_mut().filter(|g| g.watched) {
                        g.touched.extend(
                            g.table
                                .iter()
                                .filter(|(_, s)| s.epoch == old && s.count > 0)
                                .map(|(k, _)| Box::<[u8]>::from(k.as_bytes())),
                        );
                    }
                }
                w.epoch = epoch;
            }
        }
        WindowSpec::Sliding { .. } if new_tail > old_tail => {
            let upto = new_tail.min(old_head);
            reservoir.for_range(old_tail, upto, &mut |e| apply_event(w, e, key_buf, false));
        }
        _ => {}
    }
    w.tail = new_tail.max(old_tail);
    if new_head > old_head {
        reservoir.for_range(old_head.max(w.tail), new_head, &mut |e| {
            apply_event(w, e, key_buf, true)
        });
        w.head = new_head;
    }
}

/// Applies (`enter`) or removes one event to every group under the window.
fn apply_event(w: &mut WindowExec, e: &Event, key_buf: &mut Vec<u8>, enter: bool) {
    let epoch = w.epoch;
    for f in &mut w.filters {
        if f.bit.is_some_and(|b| e.mask & (1u64 << b) == 0) {
            continue;
        }
        for g in &mut f.groups {
            fill_key(key_buf, &g.key.columns, &e.row);
            if enter {
                enter_group(g, key_buf, e, epoch);
            } else {
                leave_group(g, key_buf, e);
            }
        }
    }
}

fn enter_group(g: &mut GroupExec, key: &[u8], e: &Event, epoch: i64) {
    if g.watched {
        g.touched.push(key.into());
    }
    let state = match g.table.get_mut(key) {
        Some(s) => s,
        None => g
            .table
            .entry(PackedKey::new(key))
            .or_insert_with(|| GroupState {
                count: 0,
                epoch,
                states: Vec::new(),
            }),
    };
    if state.epoch != epoch || state.states.len() != g.aggs.len() {
        // A tumbling window moved on (or the group is new): start empty.
        state.count = 0;
        state.epoch = epoch;
        state.states = g
            .aggs
            .iter()
            .map(|a| a.func.new_state(a.arg_type))
            .collect();
    }
    state.count += 1;
    for (a, s) in g.aggs.iter().zip(state.states.iter_mut()) {
        let v = a.arg.map_or(&Value::Null, |c| &e.row[c]);
        s.insert(a.func, v, e.ts, e.seq);
    }
}

fn leave_group(g: &mut GroupExec, key: &[u8], e: &Event) {
    if g.watched {
        g.touched.push(key.into());
    }
    let Some(state) = g.table.get_mut(key) else {
        panic!("an event left a group it never entered");
    };
    state.count -= 1;
    assert!(state.count >= 0);
    if state.count == 0 {
        g.table.remove(key);
        return;
    }
    for (a, s) in g.aggs.iter().zip(state.states.iter_mut()) {
        let v = a.arg.map_or(&Value::Null, |c| &e.row[c]);
        s.remove(a.func, v);
    }
}
