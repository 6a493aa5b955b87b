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

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use eddy_planner::aggregate::{AggFunc, AggState};
use eddy_planner::catalog::{EventTimeUnit, MetricDef, StreamDef};
use eddy_planner::dag::{AggKey, FilterKey, GroupKey, WindowKey};
use eddy_planner::filter::{rows_to_batch, stream_schema, stream_types, Filter};
use eddy_planner::prefetch;
use eddy_planner::types::{ColumnType, Value};
use eddy_planner::window::WindowSpec;
use eddy_planner::{Error, Result};
use eddy_storage::{
    DiskReservoir, IoThread, MemReservoir, PendingMark, Reservoir, ReservoirConfig, ReservoirError,
    ReservoirStats, StateStore,
};

use crate::exec::checkpoint::{Checkpoint, TaskStats};
use crate::exec::dedup::SeenIds;
use crate::exec::events::{Event, EventCodec, Outcome, Row};
use smallvec::SmallVec;

use crate::exec::groups::{Backing, CacheConfig, CacheStats, GroupState, GroupTable, States};
use crate::exec::history::HistoryPage;
use crate::exec::key::{pack, unpack, Hashed, KeyRef};
use crate::exec::passes::Passes;
use crate::exec::recent::{HeldRow, Pushed};
use crate::exec::watch::{Change, WatchId, WatchTarget, Watcher};

/// A task's checkpoint record as the task was when it was taken, encoded off the event
/// path once its reservoir's mark is finished.
pub struct PendingRecord {
    record: Checkpoint,
    reservoir: PendingMark,
}

impl PendingRecord {
    /// Runs the fsyncs the reservoir owes and encodes the record.
    pub fn finish(self) -> Result<Vec<u8>> {
        let mut record = self.record;
        record.reservoir = self
            .reservoir
            .finish()
            .map_err(|e| Error::internal(e.to_string()))?;
        Ok(record.encode())
    }
}

/// How long event ids are remembered beyond the lateness, in stream time.
pub const DEDUP_EXTRA_US: i64 = 3_600_000_000;
/// Events of a batch between asking for an event id's dedup lines and looking it up.
const IDS_AHEAD: usize = 8;
/// Events between two retention sweeps of the reservoir.
const RETENTION_SWEEP_EVENTS: u32 = 4096;
/// Events per Arrow batch when a new filter is evaluated over stored events.
const BACKFILL_BATCH_ROWS: usize = 8192;
/// Filters with a predicate per task: each owns one bit of an event's mask.
pub const FILTERS_PER_TASK_MAX: usize = 64;

struct AggSlot {
    key: AggKey,
    func: AggFunc,
    arg: Option<usize>,
    arg_type: Option<ColumnType>,
}

struct GroupExec {
    key: GroupKey,
    aggs: Vec<AggSlot>,
    table: GroupTable,
    /// A metric on this group has watchers: record the keys each event changes.
    watched: bool,
    touched: Vec<Box<[u8]>>,
    /// Its states keep a multiset on the heap (`keeps_multiset`), as of the last
    /// `set_metrics`.
    multiset: bool,
}

impl GroupExec {
    /// Whether its states keep a multiset on the heap: every multiset is MIN's state
    /// (`AggFunc::state_func`).
    fn keeps_multiset(&self) -> bool {
        self.aggs.iter().any(|a| a.func == AggFunc::Min)
    }
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
    /// The key hashes of the batch moving (`move_events`), kept for the next.
    batch: BatchKeys,
}

/// Where a metric's values live in the task's DAG.
struct MetricSlot {
    /// Shared with every value list the task answers (a clone per event, not a copy).
    name: Arc<str>,
    window: usize,
    filter: usize,
    group: usize,
    /// Per aggregate of the metric: its state's slot in the group node (`None`: COUNT(*),
    /// which reads the group's event count), and its function (which may read a state
    /// another function keeps, e.g. AVG a SUM's).
    aggs: Vec<Option<usize>>,
    funcs: Vec<AggFunc>,
}

/// Metric values for one event: per metric of the task (creation order), its aggregates.
pub type MetricValues = Vec<(Arc<str>, Vec<Value>)>;

/// An event's answer from its task: its outcome, and its metric values if asked.
pub type Answer = (Outcome, MetricValues);

/// The answers to one task batch, one per event: inline for a batch of one event (a
/// client scoring one event per statement), so that answer costs no allocation.
pub type Answers = SmallVec<[Answer; 1]>;

/// What `Task::admit` decided about an event.
enum Admitted {
    Event(Event),
    Rejected(Outcome),
}

pub struct Task {
    stream: Arc<StreamDef>,
    partitioner: usize,
    time: Option<i64>,
    seq: u64,
    /// Remembered event ids (hashbrown's seeded foldhash: SipHash was 5% of a shard).
    seen_ids: SeenIds,
    reservoir: Box<dyn Reservoir<Event>>,
    windows: Vec<WindowExec>,
    metrics: Vec<MetricSlot>,
    used_bits: u64,
    since_sweep: u32,
    /// Events placed since the windows last moved (`LAG_EVENTS_MAX`); `settle` moves
    /// them before anything reads the state.
    lagging: usize,
    key_buf: Vec<u8>,
    watches: Vec<TaskWatch>,
    /// Changed rows collected during a batch, once per feed, shared by its watches.
    feeds: Vec<(Feed, Vec<Change>)>,
    /// Installing a checkpoint's metrics: state is in the store, nothing to backfill.
    restoring: bool,
    /// The metrics the task runs, in creation order (recorded in checkpoints).
    defs: Vec<Arc<MetricDef>>,
    storage: Option<TaskStorage>,
    /// A storage error stopped the task: every later call fails with it.
    failed: Option<Error>,
    /// The task's log offset after the last applied record (replay starts there).
    pub log_end: u64,
    pub stats: TaskStats,
}

/// Where a task keeps its events and group state: the node's disk.
#[derive(Clone)]
pub struct TaskStorage {
    /// The task's reservoir directory.
    pub dir: std::path::PathBuf,
    pub reservoir: ReservoirConfig,
    pub io: IoThread,
    pub store: Arc<dyn StateStore>,
    pub cache: CacheConfig,
    /// Prefix of the task's keys in the store.
    pub prefix: Vec<u8>,
}

/// A stable 64-bit hash of text (FNV-1a), for store key prefixes.
pub fn stable_hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

fn window_hash(key: &WindowKey) -> u64 {
    stable_hash(&format!("{key:?}"))
}

/// Where a GroupBy node's states live in the store: the task's prefix and a hash of the
/// node's structural key.
fn backing_of(storage: Option<&TaskStorage>, key: &GroupKey) -> Option<Backing> {
    storage.map(|s| {
        let mut prefix = s.prefix.clone();
        prefix.extend_from_slice(&stable_hash(&format!("{key:?}")).to_be_bytes());
        Backing {
            store: s.store.clone(),
            prefix,
            config: s.cache,
        }
    })
}

fn storage_failure(e: impl std::fmt::Display) -> Error {
    Error::internal(format!("storage failure, the task stopped: {e}"))
}

impl Task {
    /// A task kept in memory only.
    pub fn new(stream: Arc<StreamDef>, partitioner: usize) -> Task {
        Task {
            stream,
            partitioner,
            time: None,
            seq: 0,
            seen_ids: SeenIds::default(),
            reservoir: Box::new(MemReservoir::default()),
            windows: Vec::new(),
            metrics: Vec::new(),
            used_bits: 0,
            since_sweep: 0,
            lagging: 0,
            key_buf: Vec::new(),
            watches: Vec::new(),
            feeds: Vec::new(),
            restoring: false,
            defs: Vec::new(),
            storage: None,
            failed: None,
            log_end: 0,
            stats: TaskStats::default(),
        }
    }

    /// A task on disk. With a checkpoint (taken while the task ran `metrics_then`), the
    /// task comes back exactly as it was then; the caller installs the current metrics
    /// and replays the log from `log_end`.
    pub fn open(
        stream: Arc<StreamDef>,
        partitioner: usize,
        storage: TaskStorage,
        checkpoint: Option<(&[u8], &[Arc<MetricDef>])>,
    ) -> Result<Task> {
        let mut task = Task::new(stream, partitioner);
        task.storage = Some(storage.clone());
        let mut mark = None;
        if let Some((bytes, metrics_then)) = checkpoint {
            let cp = Checkpoint::decode(bytes)
                .ok_or_else(|| storage_failure("an unreadable task checkpoint"))?;
            task.restoring = true;
            let installed = task.set_metrics(metrics_then);
            task.restoring = false;
            installed?;
            task.time = cp.time;
            task.seq = cp.seq;
            task.stats = cp.stats;
            task.log_end = cp.log_end;
            for w in &mut task.windows {
                let key = window_hash(&w.key);
                let Some(&(_, head, tail, epoch)) = cp.windows.iter().find(|c| c.0 == key) else {
                    return Err(storage_failure(
                        "the checkpoint's windows do not match its metrics",
                    ));
                };
                (w.head, w.tail, w.epoch) = (head, tail, epoch);
            }
            for (ts, id) in cp.dedup {
                task.seen_ids.restore(ts, id);
            }
            mark = Some(cp.reservoir);
        }
        let reservoir = DiskReservoir::open(
            &storage.dir,
            storage.reservoir,
            task.codec(),
            Some(storage.io.clone()),
            mark.as_deref(),
        )
        .map_err(storage_failure)?;
        task.reservoir = Box::new(reservoir);
        Ok(task)
    }

    /// How the task's events are written to and read from chunks, with its filters.
    fn codec(&self) -> Arc<EventCodec> {
        let filters = self
            .windows
            .iter()
            .flat_map(|w| w.filters.iter())
            .filter_map(|f| Some((f.predicate.clone()?, f.bit?)))
            .collect();
        Arc::new(EventCodec::new(self.stream.clone(), filters))
    }

    /// Goes on writing its state through `store`: the task moved to another shard, whose
    /// writer it must use (a checkpoint freezes each shard's writes apart). Call it
    /// between checkpoints, when the writers differ only in name.
    pub fn set_store(&mut self, store: Arc<dyn StateStore>) {
        let Some(storage) = &mut self.storage else {
            return;
        };
        storage.store = store.clone();
        for group in self
            .windows
            .iter_mut()
            .flat_map(|w| &mut w.filters)
            .flat_map(|f| &mut f.groups)
        {
            group.table.set_store(store.clone());
        }
    }

    /// Stops the task if a storage error happened.
    #[inline]
    fn check_storage(&mut self) -> Result<()> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        // Only a store fails; the in-memory engine has none.
        if self.storage.is_none() {
            return Ok(());
        }
        self.take_store_failure()
    }

    /// Stops the task if one of its group tables met a store error.
    fn take_store_failure(&mut self) -> Result<()> {
        let mut failure = None;
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    if let Some(e) = g.table.take_failure() {
                        failure.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = failure {
            let e = storage_failure(e);
            self.failed = Some(e.clone());
            return Err(e);
        }
        Ok(())
    }

    fn fail(&mut self, e: impl std::fmt::Display) -> Error {
        let e = storage_failure(e);
        self.failed = Some(e.clone());
        e
    }

    /// The synchronous stage of a checkpoint: writes every dirty group state to the
    /// store and returns the record that restores the rest of the task, to be finished
    /// off the event path. `None` for a task in memory.
    /// `previous_committed`: whether the node's checkpoint before this one committed.
    pub fn checkpoint(&mut self, previous_committed: bool) -> Result<Option<PendingRecord>> {
        if self.storage.is_none() {
            return Ok(None);
        }
        self.settle()?;
        self.check_storage()?;
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    g.table.flush();
                }
            }
        }
        self.check_storage()?;
        let reservoir = self
            .reservoir
            .checkpoint(previous_committed)
            .map_err(|e| self.fail(e))?;
        let record = Checkpoint {
            time: self.time,
            seq: self.seq,
            stats: self.stats,
            log_end: self.log_end,
            windows: self
                .windows
                .iter()
                .map(|w| (window_hash(&w.key), w.head, w.tail, w.epoch))
                .collect(),
            dedup: self.seen_ids.entries().cloned().collect(),
            reservoir: Vec::new(),
        };
        Ok(Some(PendingRecord { record, reservoir }))
    }

    /// Deletes the task's group states and events from disk (its stream was dropped).
    pub fn destroy(mut self) -> Result<()> {
        self.failed = None;
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    g.table.clear();
                }
            }
        }
        self.check_storage()?;
        self.reservoir = Box::new(MemReservoir::default());
        if let Some(s) = &self.storage {
            match std::fs::remove_dir_all(&s.dir) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(storage_failure(format!("{}: {e}", s.dir.display()))),
            }
        }
        Ok(())
    }

    /// Takes a new definition of the task's stream that adds columns: stored events read
    /// the new columns as NULL.
    pub fn set_stream(&mut self, stream: Arc<StreamDef>) {
        // A failure stops the task; its next statement reports it.
        let _ = self.settle();
        if Arc::ptr_eq(&stream, &self.stream) || *stream == *self.stream {
            self.stream = stream;
            return;
        }
        let n = stream.columns.len();
        self.stream = stream;
        // A stream subscription's rows would change shape under it.
        let name = self.stream.name.clone();
        self.watches.retain(|w| {
            if w.target != WatchTarget::Stream {
                return true;
            }
            w.watcher.end(Error::unsupported(format!(
                "stream \"{name}\" gained a column; subscribe again to see it"
            )));
            false
        });
        self.rebind_watches();
        let codec: Arc<dyn eddy_storage::ChunkCodec<Event>> = self.codec();
        self.reservoir.refresh(Some(codec), &mut |e| {
            if e.row.len() < n {
                e.row = pad_row(&e.row, n);
            }
        });
    }

    /// The definitions of the metrics the task runs.
    pub fn metric_defs(&self) -> &[Arc<MetricDef>] {
        &self.defs
    }

    pub fn reservoir_stats(&self) -> ReservoirStats {
        self.reservoir.stats()
    }

    pub fn cache_stats(&self) -> CacheStats {
        let mut total = CacheStats::default();
        for w in &self.windows {
            for f in &w.filters {
                for g in &f.groups {
                    total += g.table.stats();
                }
            }
        }
        total
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
    #[inline]
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
        self.settle()?;
        let metrics: Vec<&Arc<MetricDef>> = metrics
            .iter()
            .filter(|m| m.stream == self.stream.name && m.partitioner == self.partitioner)
            .collect();
        let wanted_aggs: HashSet<AggKey> = metrics
            .iter()
            .flat_map(|m| (0..m.aggregates.len()).filter_map(|i| AggKey::of(m, i).state()))
            .collect();
        let wanted_groups: HashSet<GroupKey> = metrics.iter().map(|m| GroupKey::of(m)).collect();
        // Drop what no metric uses any more, from the leaves up.
        let filters_before = self.used_bits;
        for w in &mut self.windows {
            for f in &mut w.filters {
                for g in &mut f.groups {
                    if !wanted_groups.contains(&g.key) {
                        g.aggs.clear();
                        g.table.clear();
                        continue;
                    }
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
                    g.table.rewrite(&mut |state| {
                        let mut j = 0;
                        state.states.retain(|_| {
                            j += 1;
                            keep[j - 1]
                        });
                    });
                }
                f.groups.retain(|g| wanted_groups.contains(&g.key));
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
        let mut new_aggs: Vec<(usize, usize, usize, AggKey)> = Vec::new();
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
                        batch: BatchKeys::default(),
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
                        table: GroupTable::new(backing_of(self.storage.as_ref(), &gk)),
                        watched: false,
                        touched: Vec::new(),
                        multiset: false,
                    });
                    new_groups.push((wi, fi, f.groups.len() - 1));
                    f.groups.len() - 1
                }
            };
            let g = &mut f.groups[gi];
            for i in 0..m.aggregates.len() {
                let Some(ak) = AggKey::of(m, i).state() else {
                    continue;
                };
                if g.aggs.iter().any(|a| a.key == ak) {
                    continue;
                }
                let arg_type = ak.arg.map(|c| self.stream.columns[c].ty);
                if !self.restoring {
                    g.table.rewrite(&mut |state| {
                        let mut slot = ak.func.new_state(arg_type);
                        // A count window's group holds its events however old (retention
                        // may have let the reservoir drop them): a new slot starts from
                        // exactly those, and is not backfilled.
                        if let Some(recent) = &state.recent {
                            recent.for_each(&mut |ts, seq, row| {
                                // A row kept from before ALTER STREAM … ADD COLUMN is shorter.
                                let v = ak.arg.and_then(|c| row.get(c)).unwrap_or(&Value::Null);
                                slot.insert(ak.func, v, ts, seq);
                            });
                        }
                        state.states.push(slot);
                    });
                }
                g.aggs.push(AggSlot {
                    func: ak.func,
                    arg: ak.arg,
                    arg_type,
                    key: ak,
                });
                new_aggs.push((wi, fi, gi, g.aggs[g.aggs.len() - 1].key.clone()));
            }
        }
        self.order_slots(&metrics);
        for g in self
            .windows
            .iter_mut()
            .flat_map(|w| &mut w.filters)
            .flat_map(|f| &mut f.groups)
        {
            g.table.set_states(g.aggs.len());
            g.multiset = g.keeps_multiset();
        }

        // Backfill: filter bits first, then new groups whole, then new slots of old groups.
        if self.used_bits != filters_before || !new_filters.is_empty() {
            self.refresh_filters(&new_filters)?;
        }
        if !self.restoring {
            for &(wi, fi, gi) in &new_groups {
                self.backfill(wi, fi, gi, None)?;
            }
            for (wi, fi, gi, key) in &new_aggs {
                let (wi, fi, gi) = (*wi, *fi, *gi);
                let counted = self.windows[wi].key.spec.keep().is_some();
                if !new_groups.contains(&(wi, fi, gi)) && !counted {
                    let g = &self.windows[wi].filters[fi].groups[gi];
                    let ai = g.aggs.iter().position(|a| a.key == *key);
                    self.backfill(wi, fi, gi, Some(ai.expect("slot added")))?;
                }
            }
        }
        self.defs = metrics.iter().map(|m| (*m).clone()).collect();

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
                        let ak = AggKey::of(m, i).state()?;
                        let slot = g.groups[gi].aggs.iter().position(|a| a.key == ak);
                        Some(slot.expect("aggregate added"))
                    })
                    .collect();
                MetricSlot {
                    name: m.name.as_str().into(),
                    window: wi,
                    filter: fi,
                    group: gi,
                    aggs,
                    funcs: m.aggregates.iter().map(|a| a.func).collect(),
                }
            })
            .collect();
        self.rebind_watches();
        Ok(())
    }

    /// Puts each group node's slots (and its states) in the order a restart builds them:
    /// by first use in the metrics' creation order. Shared slots outlive the metric that
    /// made them, so without this a checkpoint's states would not line up after a DROP.
    fn order_slots(&mut self, metrics: &[&Arc<MetricDef>]) {
        let mut order: HashMap<GroupKey, Vec<AggKey>> = HashMap::new();
        for m in metrics {
            let slots = order.entry(GroupKey::of(m)).or_default();
            for ak in (0..m.aggregates.len()).filter_map(|i| AggKey::of(m, i).state()) {
                if !slots.contains(&ak) {
                    slots.push(ak);
                }
            }
        }
        for g in self
            .windows
            .iter_mut()
            .flat_map(|w| w.filters.iter_mut())
            .flat_map(|f| f.groups.iter_mut())
        {
            let Some(want) = order.get(&g.key) else {
                continue;
            };
            if g.aggs.iter().map(|a| &a.key).eq(want.iter()) {
                continue;
            }
            let from: Vec<usize> = want
                .iter()
                .filter_map(|k| g.aggs.iter().position(|a| a.key == *k))
                .collect();
            let mut old: Vec<Option<AggSlot>> =
                std::mem::take(&mut g.aggs).into_iter().map(Some).collect();
            g.aggs = from.iter().filter_map(|&i| old[i].take()).collect();
            g.table.rewrite(&mut |state| {
                let mut old: Vec<Option<AggState>> = std::mem::take(&mut state.states)
                    .into_iter()
                    .map(Some)
                    .collect();
                state.states = from.iter().filter_map(|&i| old[i].take()).collect();
            });
        }
    }

    /// Points every watch at its metric's slot again after the metrics changed; a watch
    /// whose metric is gone ends.
    fn rebind_watches(&mut self) {
        let metrics = &self.metrics;
        self.watches.retain_mut(|w| {
            let WatchTarget::Metric(name) = &w.target else {
                return true;
            };
            match metrics.iter().position(|m| *m.name == **name) {
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
        self.watch_as(id, target, watcher, true)
    }

    /// `watch`, with or without the current rows first.
    pub fn watch_as(
        &mut self,
        id: WatchId,
        target: WatchTarget,
        watcher: Arc<dyn Watcher>,
        snapshot: bool,
    ) {
        // From here on each event's changes go to the watch, from the state as it stands
        // (a failure stops the task; its next statement reports it).
        let _ = self.settle();
        let slot = match &target {
            WatchTarget::Metric(name) => {
                match self.metrics.iter().position(|m| *m.name == **name) {
                    Some(slot) => slot,
                    None => return,
                }
            }
            WatchTarget::Stream => 0,
        };
        if let (WatchTarget::Metric(_), Some(t), true) = (&target, self.time, snapshot) {
            let m = &self.metrics[slot];
            let w = &mut self.windows[m.window];
            let epoch = w.epoch;
            let g = &mut w.filters[m.filter].groups[m.group];
            let snapshot: Vec<Change> = g
                .table
                .entries(false)
                .into_iter()
                .filter(|(_, s)| s.epoch == epoch && s.count > 0)
                .map(|(k, s)| change_row(m, &k, Some(&s), t))
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

    /// Detaches every subscription, to attach them to the task that replaces this one.
    pub fn take_watches(&mut self) -> Vec<(WatchId, WatchTarget, Arc<dyn Watcher>)> {
        let taken = self
            .watches
            .drain(..)
            .map(|w| (w.id, w.target, w.watcher))
            .collect();
        self.rebind_watches();
        taken
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

    /// Gives stored events the bits of new filters, and makes events read back from
    /// disk get the current filters' bits.
    fn refresh_filters(&mut self, new_filters: &[(usize, usize)]) -> Result<()> {
        let fresh: Vec<(Filter, u32)> = new_filters
            .iter()
            .filter_map(|&(wi, fi)| {
                let f = &self.windows[wi].filters[fi];
                Some((f.predicate.clone()?, f.bit?))
            })
            .collect();
        let clear: u64 = fresh.iter().fold(0, |m, (_, bit)| m | (1u64 << bit));
        let mut masks = Vec::new();
        if !fresh.is_empty() {
            let mut rows: Vec<Row> = Vec::new();
            self.reservoir
                .refresh(None, &mut |e| rows.push(e.row.clone()));
            let only_new = EventCodec::new(self.stream.clone(), fresh);
            for chunk in rows.chunks(BACKFILL_BATCH_ROWS) {
                masks.extend(only_new.masks(chunk).map_err(Error::internal)?);
            }
        }
        let codec: Arc<dyn eddy_storage::ChunkCodec<Event>> = self.codec();
        let mut i = 0;
        self.reservoir.refresh(Some(codec), &mut |e| {
            if let Some(m) = masks.get(i) {
                e.mask = (e.mask & !clear) | m;
            }
            i += 1;
        });
        Ok(())
    }

    /// Applies the window's current contents to a new group (`slot == None`) or to one
    /// new aggregate slot of an existing group (not under a count window: such a slot
    /// starts from the events its group holds, `set_metrics`).
    fn backfill(&mut self, wi: usize, fi: usize, gi: usize, slot: Option<usize>) -> Result<()> {
        let w = &mut self.windows[wi];
        let (head, tail, epoch) = (w.head, w.tail, w.epoch);
        let keep = w.key.spec.keep();
        let f = &mut w.filters[fi];
        let bit = f.bit;
        let g = &mut f.groups[gi];
        let key_buf = &mut self.key_buf;
        let read = self.reservoir.for_range(tail, head, &mut |e| {
            if bit.is_some_and(|b| e.mask & (1u64 << b) == 0) {
                return;
            }
            let key = KeyRef::of(key_buf, &g.key.columns, &e.row).hashed();
            match slot {
                None => enter_group(g, key, e, epoch, keep),
                Some(s) => {
                    let a = &g.aggs[s];
                    let (func, arg) = (a.func, a.arg);
                    if let Some(state) = g.table.get_mut(key) {
                        if state.epoch == epoch {
                            let v = arg.map_or(&Value::Null, |c| &e.row[c]);
                            state.states[s].insert(func, v, e.ts, e.seq);
                        }
                    }
                }
            }
        });
        read.map_err(|e| self.fail(e))?;
        self.check_storage()
    }

    /// Processes a batch of events in order. With `values`, returns after each event the
    /// values of every metric of the task for that event's group.
    pub fn ingest(&mut self, rows: &[Row], values: bool) -> Result<Answers> {
        self.ingest_with(rows, values, None)
    }

    /// `ingest`, taking the rows' WHERE results from `passes` where it has them (the
    /// stateless stage computed them on another shard).
    pub fn ingest_with(
        &mut self,
        rows: &[Row],
        values: bool,
        passes: Option<&Passes>,
    ) -> Result<Answers> {
        if let Some(e) = &self.failed {
            return Err(e.clone());
        }
        if rows.is_empty() {
            return Ok(Answers::default()); // a log end moved past no event (a Kafka marker)
        }
        // Rows logged before ALTER STREAM … ADD COLUMN are shorter.
        let n = self.stream.columns.len();
        let padded: Vec<Row>;
        let rows = if rows.iter().any(|r| r.len() < n) {
            padded = rows.iter().map(|r| pad_row(r, n)).collect();
            &padded[..]
        } else {
            rows
        };
        // Evaluate every predicate once over the whole batch, vectorised.
        let mut bits: SmallVec<[u64; 8]> = SmallVec::new();
        let has_predicates = self
            .windows
            .iter()
            .flat_map(|w| w.filters.iter())
            .any(|f| f.predicate.is_some() && f.bit.is_some());
        if has_predicates {
            bits.resize(rows.len(), 0);
            let passes = passes.filter(|p| p.len() == rows.len());
            let mut batch = None;
            for f in self.windows.iter().flat_map(|w| w.filters.iter()) {
                let (Some(predicate), Some(bit)) = (&f.predicate, f.bit) else {
                    continue;
                };
                let given = f.key.predicate.as_deref().and_then(|p| passes?.of(p));
                let results: Vec<bool> = match given {
                    Some(given) => given.collect(),
                    None => {
                        let batch = match &batch {
                            Some(b) => b,
                            None => batch.insert(rows_to_batch(
                                stream_schema(&self.stream),
                                &stream_types(&self.stream),
                                rows,
                            )?),
                        };
                        predicate.evaluate(batch)?
                    }
                };
                for (i, pass) in results.into_iter().enumerate() {
                    if pass {
                        bits[i] |= 1u64 << bit;
                    }
                }
            }
        }
        let mut out = Answers::with_capacity(rows.len());
        let mask = |i: usize| bits.get(i).copied().unwrap_or(0);
        // A batch of a stream with ids asks for each id's dedup lines `IDS_AHEAD` events
        // before it looks the id up (one event alone has nothing to overlap them with).
        let ids = self.stream.event_id.filter(|_| rows.len() > 1);
        if let Some(c) = ids {
            for row in rows.iter().take(IDS_AHEAD) {
                self.seen_ids.prefetch(&row[c]);
            }
        }
        // Nobody asks for a state between two events: the windows move once for many
        // (`LAG_EVENTS_MAX`), a statement's or several single events'.
        if !values && self.watches.is_empty() {
            for (i, row) in rows.iter().enumerate() {
                self.prefetch_id(ids, rows.get(i + IDS_AHEAD));
                match self.admit(row, mask(i)) {
                    Ok(Admitted::Event(e)) => {
                        self.place(e);
                        out.push((Outcome::Accepted, Vec::new()));
                    }
                    Ok(Admitted::Rejected(outcome)) => out.push((outcome, Vec::new())),
                    Err(e) => {
                        // The events placed before it still count.
                        self.settle()?;
                        return Err(e);
                    }
                }
            }
            if self.lagging >= LAG_EVENTS_MAX {
                self.catch_up()?;
            }
            return self.finish_batch(out);
        }
        self.settle()?;
        if let Some(first) = rows.first() {
            self.prefetch_probes(first, mask(0));
            self.prefetch_groups(first, mask(0));
        }
        for (i, row) in rows.iter().enumerate() {
            // The next event's groups arrive in cache while this one is applied (and
            // this one's while its window's leaving events are removed), found through
            // control bytes asked for an event earlier.
            if let Some(later) = rows.get(i + 2) {
                self.prefetch_probes(later, mask(i + 2));
            }
            if let Some(next) = rows.get(i + 1) {
                self.prefetch_groups(next, mask(i + 1));
            }
            self.prefetch_id(ids, rows.get(i + IDS_AHEAD));
            let outcome = self.apply(row, mask(i));
            if !self.watches.is_empty() && matches!(outcome, Ok(Outcome::Accepted)) {
                self.collect_changes(row);
            }
            let vals = if values && outcome.is_ok() {
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
        self.finish_batch(out)
    }

    /// Ends a batch: a store error in it fails the statement and stops the task before
    /// any change reaches a subscriber (checked once per batch, not per event), and
    /// events no later one can precede move to disk in whole chunks.
    fn finish_batch(&mut self, out: Answers) -> Result<Answers> {
        self.check_storage()?;
        self.deliver_changes();
        // Events the windows have yet to take stay in memory until they do.
        if let (Some(t), 0) = (self.time, self.lagging) {
            self.reservoir
                .seal_through(t.saturating_sub(self.stream.lateness_us))
                .map_err(|e| self.fail(e))?;
        }
        Ok(out)
    }

    /// Asks for the lines the dedup lookup of `row`'s event id (column `ids`) will read
    /// (`SeenIds::prefetch`).
    #[inline(always)]
    fn prefetch_id(&self, ids: Option<usize>, row: Option<&Row>) {
        if let (Some(c), Some(row)) = (ids, row) {
            self.seen_ids.prefetch(&row[c]);
        }
    }

    /// Asks for the control bytes the lookups of the groups `row` will enter read first:
    /// the first of two stages (`GroupTable::prefetch_probe`), `prefetch_groups` the
    /// second, which reads them.
    fn prefetch_probes(&mut self, row: &Row, mask: u64) {
        for w in &self.windows {
            each_key(&w.filters, row, mask, &mut self.key_buf, |g, key| {
                g.table.prefetch_probe(key.hash())
            });
        }
    }

    /// Asks for the cache lines of the group entries `row` will enter, without waiting
    /// for them: an event's cost is mostly these misses, and this way they overlap with
    /// other work.
    fn prefetch_groups(&mut self, row: &Row, mask: u64) {
        for w in &self.windows {
            each_key(&w.filters, row, mask, &mut self.key_buf, |g, key| {
                g.table.prefetch(key.hash())
            });
        }
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
                    let w = &mut self.windows[m.window];
                    let epoch = w.epoch;
                    let g = &mut w.filters[m.filter].groups[m.group];
                    let touched = std::mem::take(&mut g.touched);
                    for key in &touched {
                        let state = g
                            .table
                            .get(KeyRef::Packed(key).hashed())
                            .filter(|s| s.epoch == epoch && s.count > 0)
                            .cloned();
                        out.push(change_row(m, key, state.as_ref(), t));
                    }
                    g.touched = touched;
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

    /// Decides an event's outcome. An accepted event is numbered, its id remembered and
    /// the stream time moved to it; the windows have not moved yet.
    // Inlined into both paths: out of line it cost the event-by-event path about 90
    // instructions an event (callgrind).
    #[inline(always)]
    fn admit(&mut self, row: &Row, mask: u64) -> Result<Admitted> {
        let ts = Task::event_time(&self.stream, row)?;
        let id = self
            .stream
            .event_id
            .map(|c| row[c].clone())
            .filter(|v| !v.is_null());
        let mut id_hash = 0;
        if let Some(id) = &id {
            let (seen, hash) = self.seen_ids.seen(id);
            if seen {
                self.stats.duplicates += 1;
                return Ok(Admitted::Rejected(Outcome::Duplicate));
            }
            id_hash = hash;
        }
        if let Some(t) = self.time {
            if ts < t.saturating_sub(self.stream.lateness_us) {
                self.stats.late += 1;
                return Ok(Admitted::Rejected(Outcome::Late));
            }
        }
        self.stats.accepted += 1;
        self.seq += 1;
        if let Some(id) = id {
            self.seen_ids.record(id_hash, ts, id);
        }
        self.time = Some(self.time.map_or(ts, |t| t.max(ts)));
        self.since_sweep += 1;
        Ok(Admitted::Event(Event {
            ts,
            seq: self.seq,
            mask,
            row: row.clone(),
        }))
    }

    /// Applies one event: the windows move to the stream time it sets.
    fn apply(&mut self, row: &Row, mask: u64) -> Result<Outcome> {
        // Every stored event is at or before the stream time before this one.
        let stored = match self.time {
            Some(t) => Some(t),
            None => self.reservoir.is_empty().then_some(i64::MIN),
        };
        let event = match self.admit(row, mask)? {
            Admitted::Event(e) => e,
            Admitted::Rejected(outcome) => return Ok(outcome),
        };
        let (ts, new_t) = (event.ts, self.time.expect("set by an accepted event"));
        let mut read = Ok(());
        match stored.filter(|&t| ts > t) {
            // The newest event: the windows take it before the reservoir does, so no
            // head range has to be read back to find it.
            Some(stored) => {
                for w in &mut self.windows {
                    let fresh = Some((&event, stored));
                    read = advance(
                        w,
                        new_t,
                        self.reservoir.as_mut(),
                        &mut self.key_buf,
                        fresh,
                        false,
                    );
                    if read.is_err() {
                        break;
                    }
                }
                self.reservoir.insert(event);
            }
            // An out-of-order event behind a window's head edge enters that window
            // directly; one beyond it enters with the head range, or later (delayed
            // windows).
            None => {
                let behind = self
                    .windows
                    .iter()
                    .any(|w| ts <= w.head)
                    .then(|| event.clone());
                self.reservoir.insert(event);
                for w in &mut self.windows {
                    let old_head = w.head;
                    read = advance(
                        w,
                        new_t,
                        self.reservoir.as_mut(),
                        &mut self.key_buf,
                        None,
                        false,
                    );
                    if read.is_err() {
                        break;
                    }
                    if let Some(event) = behind.as_ref().filter(|_| ts <= old_head && ts > w.tail) {
                        apply_event(w, event, &mut self.key_buf, true, None);
                    }
                }
            }
        }
        read.map_err(|e| self.fail(e))?;
        self.sweep_if_due(new_t)?;
        Ok(Outcome::Accepted)
    }

    /// Stores an admitted event without moving the windows (`catch_up` moves them): it
    /// enters at once the windows whose edges it sits between, as the events they hold
    /// did; the others take it when their head passes it (`move_events`).
    fn place(&mut self, event: Event) {
        self.lagging += 1;
        for w in &mut self.windows {
            if event.ts <= w.head && event.ts > w.tail {
                apply_event(w, &event, &mut self.key_buf, true, None);
            }
        }
        self.reservoir.insert(event);
    }

    /// Moves every window to the stream time once, after a batch of `place`d events.
    fn catch_up(&mut self) -> Result<()> {
        self.lagging = 0;
        let Some(t) = self.time else { return Ok(()) };
        let mut read = Ok(());
        for w in &mut self.windows {
            read = advance(w, t, self.reservoir.as_mut(), &mut self.key_buf, None, true);
            if read.is_err() {
                break;
            }
        }
        read.map_err(|e| self.fail(e))?;
        self.sweep_if_due(t)
    }

    /// Moves the windows to the stream time if events were placed since they last
    /// moved: every read of the state, and every event whose values or changes are
    /// wanted, comes after this.
    fn settle(&mut self) -> Result<()> {
        match self.lagging {
            0 => Ok(()),
            _ => self.catch_up(),
        }
    }

    /// Moves the stream time to `t`, if later, as an event at `t` would move it, with no
    /// event: the windows move, and what leaves them leaves. For a replay that applies
    /// one group's events only (`exec::history`), and so must move the time the others
    /// set: a window's edges read only the stored events, so that group's state is the
    /// one the whole stream gives.
    pub fn advance_to(&mut self, t: i64) -> Result<()> {
        if self.time.is_some_and(|now| now >= t) {
            return Ok(());
        }
        self.settle()?;
        self.time = Some(t);
        self.catch_up()
    }

    #[inline(always)]
    fn sweep_if_due(&mut self, t: i64) -> Result<()> {
        if self.since_sweep >= RETENTION_SWEEP_EVENTS {
            self.since_sweep = 0;
            self.sweep(t).map_err(|e| self.fail(e))?;
        }
        Ok(())
    }

    /// Drops events past retention (never inside a window) and old event ids; moves
    /// events no later event can precede to disk.
    fn sweep(&mut self, t: i64) -> std::result::Result<(), ReservoirError> {
        let keep = self.keep_us();
        self.reservoir.expire_through(t.saturating_sub(keep))?;
        let horizon = t
            .saturating_sub(self.stream.lateness_us)
            .saturating_sub(DEDUP_EXTRA_US);
        self.seen_ids.forget_before(horizon);
        Ok(())
    }

    /// The values of every metric of the task for the group of `row`, as they stand.
    pub fn values_for(&mut self, row: &[Value]) -> MetricValues {
        // As in `metric_rows`.
        let _ = self.settle();
        let mut out = Vec::with_capacity(self.metrics.len());
        for m in &self.metrics {
            let w = &mut self.windows[m.window];
            let epoch = w.epoch;
            let g = &mut w.filters[m.filter].groups[m.group];
            let key = KeyRef::of(&mut self.key_buf, &g.key.columns, row).hashed();
            let state = g.table.get(key).filter(|s| s.epoch == epoch && s.count > 0);
            let values = metric_values(m, state);
            out.push((m.name.clone(), values));
        }
        out
    }

    /// Every non-empty group of `metric`: group-by values, then aggregate values.
    pub fn metric_rows(&mut self, metric: &str, key: Option<&[Value]>) -> Vec<Vec<Value>> {
        // A failure stops the task (its next statement reports it), as one while
        // ingesting does; the rows are then the state as it stands.
        let _ = self.settle();
        let Some(m) = self.metrics.iter().find(|m| &*m.name == metric) else {
            return Vec::new();
        };
        let w = &mut self.windows[m.window];
        let epoch = w.epoch;
        let g = &mut w.filters[m.filter].groups[m.group];
        let live = |s: &GroupState| s.epoch == epoch && s.count > 0;
        let row = |k: &[u8], s: &GroupState| {
            let mut r = unpack(k);
            r.extend(metric_values(m, Some(s)));
            r
        };
        match key {
            Some(k) => {
                let positions: Vec<usize> = (0..k.len()).collect();
                let mut packed = Vec::new();
                pack(&mut packed, &positions, k);
                g.table
                    .get(KeyRef::Packed(&packed).hashed())
                    .filter(|s| live(s))
                    .map(|s| row(&packed, s))
                    .into_iter()
                    .collect()
            }
            None => g
                .table
                .entries(false)
                .iter()
                .filter(|(_, s)| live(s))
                .map(|(k, s)| row(k, s))
                .collect(),
        }
    }

    /// A page of the stored events for a history read (`exec::history`): those with
    /// `after < ts <= upto`, in (ts, seq) order, at most `max` of them but never part of
    /// one event time. `through` says how far the page reached.
    pub fn history_page(&mut self, after: i64, upto: i64, max: usize) -> Result<HistoryPage> {
        self.settle()?;
        let mut events: Vec<(i64, u64, Row)> = Vec::new();
        let mut cut = None;
        self.reservoir
            .for_range(after, upto, &mut |e| match cut {
                Some(ts) if e.ts > ts => {}
                _ => {
                    if events.len() + 1 == max {
                        cut = Some(e.ts);
                    }
                    events.push((e.ts, e.seq, e.row.clone()));
                }
            })
            .map_err(|e| self.fail(e))?;
        Ok(HistoryPage {
            events,
            through: cut.unwrap_or(upto),
            time: self.time,
            seq: self.seq,
            stored: self.reservoir.len(),
            horizon: self
                .time
                .map_or(i64::MIN, |t| t.saturating_sub(self.keep_us())),
        })
    }

    /// How far back from T the reservoir keeps events: retention, lateness, and every
    /// window's reach.
    fn keep_us(&self) -> i64 {
        // INFINITE windows never expire events, so they need nothing kept.
        self.windows
            .iter()
            .filter_map(|w| w.key.spec.reach_us())
            .fold(
                self.stream.retention_us.max(self.stream.lateness_us),
                i64::max,
            )
    }

    /// The stored events, oldest first.
    pub fn events(&mut self) -> Result<Vec<Row>> {
        let mut out = Vec::with_capacity(self.reservoir.len());
        self.reservoir
            .for_range(i64::MIN, i64::MAX, &mut |e| out.push(e.row.clone()))
            .map_err(|e| self.fail(e))?;
        Ok(out)
    }
}

/// A row with NULLs for the columns it lacks.
fn pad_row(row: &[Value], n: usize) -> Row {
    let mut r = row.to_vec();
    r.resize(n, Value::Null);
    r.into()
}

/// A metric's row for one group as a change: group-by values, aggregates, `changed_at`.
fn change_row(m: &MetricSlot, key: &[u8], state: Option<&GroupState>, t: i64) -> Change {
    let mut row = unpack(key);
    row.extend(metric_values(m, state));
    row.push(Value::Timestamp(t));
    Change {
        key: key.into(),
        row,
    }
}

fn metric_values(m: &MetricSlot, state: Option<&GroupState>) -> Vec<Value> {
    m.aggs
        .iter()
        .zip(&m.funcs)
        .map(|(&a, &func)| match (state, a) {
            (Some(s), Some(a)) => s.states[a].result(func),
            (Some(s), None) => Value::Int(s.count),
            (None, _) => match func {
                AggFunc::CountStar | AggFunc::Count | AggFunc::CountDistinct => Value::Int(0),
                _ => Value::Null,
            },
        })
        .collect()
}

/// Moves a window's edges to stream time `t`: events past the tail leave, then events
/// that reached the head enter, both in event-time order. `ahead`: many events move (a
/// task catching up), a batch of them at a time with their lines asked for first
/// (`move_events`); else few do, one event's worth (`prefetch_leaving`).
fn advance(
    w: &mut WindowExec,
    t: i64,
    reservoir: &mut dyn Reservoir<Event>,
    key_buf: &mut Vec<u8>,
    fresh: Option<(&Event, i64)>,
    ahead: bool,
) -> std::result::Result<(), ReservoirError> {
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
                        let live = g.table.entries(false);
                        g.touched.extend(
                            live.into_iter()
                                .filter(|(_, s)| s.epoch == old && s.count > 0)
                                .map(|(k, _)| k.into_boxed_slice()),
                        );
                    }
                }
                w.epoch = epoch;
            }
        }
        WindowSpec::Sliding { .. } | WindowSpec::Hopping { .. } if new_tail > old_tail => {
            let upto = new_tail.min(old_head);
            move_events(w, reservoir, key_buf, old_tail, upto, false, ahead)?;
        }
        _ => {}
    }
    w.tail = new_tail.max(old_tail);
    // A tail that did not move has the same events ahead, asked for already.
    if !ahead && matches!(spec, WindowSpec::Sliding { .. }) && w.tail > old_tail {
        prefetch_leaving(w, reservoir, key_buf);
    }
    if new_head > old_head {
        let from = old_head.max(w.tail);
        // `fresh` is an event the reservoir does not hold yet, newer than every event it
        // does (`stored` and before); it enters after them, in key order.
        if fresh.is_none_or(|(_, stored)| stored > from) {
            move_events(w, reservoir, key_buf, from, new_head, true, ahead)?;
        }
        if let Some((e, _)) = fresh.filter(|(e, _)| e.ts > from && e.ts <= new_head) {
            apply_event(w, e, key_buf, true, None);
        }
        w.head = new_head;
    }
    Ok(())
}

/// Events past a sliding window's tail edge whose cache lines are asked for ahead, in
/// stages, each reading what the one after it asked for at an earlier event: the next
/// event to leave has what its groups' states keep on the heap asked for (a multiset's
/// values), the second its group entries, the third the control bytes their lookups
/// read first (its key is read from its row and text), the fourth the text its values
/// point to, and the fifth its row.
const LEAVING_AHEAD: usize = 5;

/// Asks for the lines of the events that leave `w` next, one stage each
/// (`LEAVING_AHEAD`). An event leaving every so often then finds its row, its text,
/// its groups and their states in cache.
fn prefetch_leaving(w: &WindowExec, reservoir: &mut dyn Reservoir<Event>, key_buf: &mut Vec<u8>) {
    for (stage, e) in reservoir.upcoming(w.tail, LEAVING_AHEAD).iter().enumerate() {
        let (filters, row, mask) = (&w.filters[..], &e.row[..], e.mask);
        match stage {
            // Only a multiset keeps anything on the heap.
            0 => each_key(filters, row, mask, key_buf, |g, key| {
                if g.multiset {
                    g.table.prefetch_states(key.hash())
                }
            }),
            1 => each_key(filters, row, mask, key_buf, |g, key| {
                g.table.prefetch(key.hash())
            }),
            2 => each_key(filters, row, mask, key_buf, |g, key| {
                g.table.prefetch_probe(key.hash())
            }),
            3 => prefetch::texts(&e.row),
            _ => prefetch::lines(&e.row[..]),
        }
    }
}

/// Events a task places (stores, its windows not moved) before it moves its windows,
/// while nothing reads its state between events: no RETURNING and no subscriber. The
/// windows then move once for many events (a statement's rows, however many), whose
/// lines are asked for together (`move_events`). A read, a checkpoint or a metric
/// change first moves them (`Task::settle`), so what anyone sees is exact. 64 events of
/// catching up cost tens of microseconds.
const LAG_EVENTS_MAX: usize = 64;

/// Events moved at a time when a window catches up (`move_events`): enough for their
/// misses to overlap, few enough that their lines are still in cache when they move.
const AHEAD_BATCH: usize = 64;

/// Enters (`enter`) or removes the events with `after < ts <= upto` into `w`, in key
/// order. With `ahead`, `AHEAD_BATCH` at a time: each batch's lines are asked for
/// first, in passes (`prefetch_batch`), so its events miss in cache together rather
/// than one after another. Where the reservoir offers no events ahead
/// (`Reservoir::upcoming` is only a hint), the rest moves without.
fn move_events(
    w: &mut WindowExec,
    reservoir: &mut dyn Reservoir<Event>,
    key_buf: &mut Vec<u8>,
    mut after: i64,
    upto: i64,
    enter: bool,
    ahead: bool,
) -> std::result::Result<(), ReservoirError> {
    // The window's, lent for the call: a new one grew its two vectors again for every
    // move, 120 instructions an event when single events arrive (callgrind).
    let mut batch = std::mem::take(&mut w.batch);
    while ahead && after < upto {
        let events = reservoir.upcoming(after, AHEAD_BATCH);
        let n = events.partition_point(|e| e.ts <= upto);
        let Some(last) = events[..n].last() else {
            break;
        };
        // An event past `upto` among them: they are all the range holds.
        let step = if n < events.len() { upto } else { last.ts };
        prefetch_batch(
            &w.filters,
            &events[..n],
            key_buf,
            &mut batch,
            w.key.spec.keep().is_some(),
        );
        let moved = reservoir.for_range(after, step, &mut |e| {
            let hashes = batch.take(e);
            apply_event(w, e, key_buf, enter, hashes)
        });
        if moved.is_err() {
            w.batch = batch;
            return moved;
        }
        after = step;
    }
    w.batch = batch;
    reservoir.for_range(after, upto, &mut |e| {
        apply_event(w, e, key_buf, enter, None)
    })
}

/// The key hashes of a batch's group lookups: made once as its lines are asked for
/// (`prefetch_batch`), then taken by each event as it moves (`apply_event`), in
/// `each_group`'s order. An event the batch was not made for (`Reservoir::upcoming` is
/// only a hint) hashes its keys itself.
#[derive(Default)]
struct BatchKeys {
    /// Per event: its sequence number, its row's address, where its hashes start.
    events: Vec<(u64, usize, usize)>,
    hashes: Vec<u64>,
    /// The next event to take.
    next: usize,
}

impl BatchKeys {
    fn clear(&mut self) {
        self.events.clear();
        self.hashes.clear();
        self.next = 0;
    }

    /// Starts the hashes of `e`, which the caller pushes next.
    fn start(&mut self, e: &Event) {
        let row = e.row.as_ptr() as usize;
        self.events.push((e.seq, row, self.hashes.len()));
    }

    /// The hashes of `e`'s groups, if it is the batch's next event (the same event: its
    /// number and its row).
    fn take(&mut self, e: &Event) -> Option<&[u64]> {
        let &(seq, row, start) = self.events.get(self.next)?;
        if seq != e.seq || row != e.row.as_ptr() as usize {
            return None;
        }
        self.next += 1;
        let end = self
            .events
            .get(self.next)
            .map_or(self.hashes.len(), |n| n.2);
        Some(&self.hashes[start..end])
    }
}

/// Asks for the lines a batch of events reads as it moves, in passes over them, each
/// reading what the one before asked for: their rows, then their text, then their
/// groups' control bytes, then their group entries, then the multisets those entries
/// point to; under a count window, then the events their groups keep, in two passes
/// (`GroupTable::prefetch_recent`). The first pass to read a key hashes it, into `keys`,
/// and every later pass and the move itself take that hash.
fn prefetch_batch(
    filters: &[FilterExec],
    events: &[Event],
    key_buf: &mut Vec<u8>,
    keys: &mut BatchKeys,
    count_window: bool,
) {
    events.iter().for_each(|e| prefetch::lines(&e.row[..]));
    events.iter().for_each(|e| prefetch::texts(&e.row));
    keys.clear();
    for e in events {
        keys.start(e);
        each_key(filters, &e.row, e.mask, key_buf, |g, key| {
            let hash = key.hash();
            g.table.prefetch_probe(hash);
            keys.hashes.push(hash);
        });
    }
    // Each pass below takes the hashes the first one made, in the same order.
    let pass = |f: &mut dyn FnMut(&GroupExec, u64)| {
        let mut hashes = keys.hashes.iter();
        for e in events {
            each_group(filters, e.mask, |g| {
                f(g, *hashes.next().expect("a hash per group of each event"))
            });
        }
    };
    pass(&mut |g, hash| g.table.prefetch(hash));
    if filters.iter().flat_map(|f| &f.groups).any(|g| g.multiset) {
        pass(&mut |g, hash| {
            if g.multiset {
                g.table.prefetch_states(hash);
            }
        });
    }
    if count_window {
        for stage in 0..2 {
            pass(&mut |g, hash| g.table.prefetch_recent(hash, stage));
        }
    }
}

/// Calls `f` on each group node an event of `row` with filter bits `mask` is in
/// (`each_group`), with its key in that group (packed into `key_buf` if need be): the
/// per-event prefetches, which hash it only where they use it.
#[inline(always)]
fn each_key(
    filters: &[FilterExec],
    row: &[Value],
    mask: u64,
    key_buf: &mut Vec<u8>,
    mut f: impl FnMut(&GroupExec, KeyRef<'_>),
) {
    each_group(filters, mask, |g| {
        f(g, KeyRef::of(key_buf, &g.key.columns, row))
    });
}

/// Calls `f` on the group nodes an event with filter bits `mask` is in: those under the
/// filters it passes. Plain loops: a chained `flat_map` here cost about 30 instructions
/// more a call (callgrind), and these run several times an event.
#[inline(always)]
fn each_group(filters: &[FilterExec], mask: u64, mut f: impl FnMut(&GroupExec)) {
    for filter in filters {
        if filter.bit.is_none_or(|b| mask & (1u64 << b) != 0) {
            filter.groups.iter().for_each(&mut f);
        }
    }
}

/// Applies (`enter`) or removes one event to every group under the window.
/// `hashes`, where a batch made them (`BatchKeys`), are the hashes of its groups' keys
/// in `each_group`'s order.
// Inlined into the moves' closures: out of line, its call was about 9 instructions an
// event and 4-6 % of the engine's batched rate (callgrind, alternated runs).
#[inline(always)]
fn apply_event(
    w: &mut WindowExec,
    e: &Event,
    key_buf: &mut Vec<u8>,
    enter: bool,
    hashes: Option<&[u64]>,
) {
    let epoch = w.epoch;
    let keep = w.key.spec.keep();
    let mut hashes = hashes.map(|h| h.iter());
    for f in &mut w.filters {
        if f.bit.is_some_and(|b| e.mask & (1u64 << b) == 0) {
            continue;
        }
        for g in &mut f.groups {
            let key = KeyRef::of(key_buf, &g.key.columns, &e.row);
            let key = match hashes.as_mut().and_then(Iterator::next) {
                Some(&hash) => Hashed { key, hash },
                None => key.hashed(),
            };
            if enter {
                enter_group(g, key, e, epoch, keep);
            } else {
                leave_group(g, key, e);
            }
        }
    }
}

/// Enters an event into its group; under a count window that keeps `keep` events, the
/// group's oldest event leaves when it overflows (or the event itself, if older than all).
fn enter_group(g: &mut GroupExec, key: Hashed<'_>, e: &Event, epoch: i64, keep: Option<usize>) {
    if g.watched {
        g.touched.push(key.key.to_vec().into());
    }
    let state = g.table.entry(key, || GroupState {
        count: 0,
        epoch,
        states: States::new(),
        recent: None,
    });
    if state.epoch != epoch || state.states.len() != g.aggs.len() {
        // A tumbling window moved on (or the group is new): start empty.
        state.count = 0;
        state.epoch = epoch;
        state.states = g
            .aggs
            .iter()
            .map(|a| a.func.new_state(a.arg_type))
            .collect();
        state.recent = None;
    }
    if let Some(n) = keep {
        let recent = state.recent.get_or_insert_with(Default::default);
        let mut old = HeldRow::new();
        match recent.push(e.ts, e.seq, &e.row, n, &mut old) {
            Pushed::Refused => return,
            Pushed::Placed => {}
            Pushed::Displaced => {
                state.count -= 1;
                for (a, s) in g.aggs.iter().zip(state.states.iter_mut()) {
                    // A row kept from before ALTER STREAM … ADD COLUMN is shorter.
                    s.remove(
                        a.func,
                        a.arg.and_then(|c| old.get(c)).unwrap_or(&Value::Null),
                    );
                }
            }
        }
    }
    state.count += 1;
    for (a, s) in g.aggs.iter().zip(state.states.iter_mut()) {
        let v = a.arg.map_or(&Value::Null, |c| &e.row[c]);
        s.insert(a.func, v, e.ts, e.seq);
    }
}

fn leave_group(g: &mut GroupExec, key: Hashed<'_>, e: &Event) {
    if g.watched {
        g.touched.push(key.key.to_vec().into());
    }
    let Some(state) = g.table.get_mut(key) else {
        g.table.fail("an event left a group it never entered");
        return;
    };
    state.count -= 1;
    if state.count <= 0 {
        g.table.remove(key);
        return;
    }
    for (a, s) in g.aggs.iter().zip(state.states.iter_mut()) {
        let v = a.arg.map_or(&Value::Null, |c| &e.row[c]);
        s.remove(a.func, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_planner::ddl::catalog_of;

    fn task() -> Task {
        let c = catalog_of([
            "CREATE STREAM p (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partitions = 1)",
            "CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM p \
             WINDOW SLIDING (SIZE INTERVAL '10 seconds') GROUP BY card",
        ])
        .unwrap();
        let mut task = Task::new(c.stream("p").unwrap().clone(), 0);
        task.set_metrics(&c.metrics_of("p")).unwrap();
        task
    }

    /// Event `i`: second `i`, card `c{i % 3}`, amount `i`.
    fn event(i: i64) -> Row {
        event_of(i, 1)
    }

    /// Event `i` of `per_second` a second: second `i / per_second`, card `c{i % 3}`,
    /// amount `i`.
    fn event_of(i: i64, per_second: i64) -> Row {
        Row::from(vec![
            Value::Timestamp(1_000_000 * (i / per_second)),
            Value::Text(format!("c{}", i % 3).into()),
            Value::Int(i),
        ])
    }

    /// (card, COUNT, SUM) of the 10-second window at event `last` (`event`), by counting.
    fn expected(last: i64) -> Vec<Vec<Value>> {
        expected_of(last, 1)
    }

    /// The same, of `per_second` events a second (`event_of`).
    fn expected_of(last: i64, per_second: i64) -> Vec<Vec<Value>> {
        let second = last / per_second;
        let mut rows: Vec<Vec<Value>> = (0..3)
            .filter_map(|c| {
                let live: Vec<i64> = (0..=last)
                    .filter(|i| i % 3 == c && i / per_second > second - 10)
                    .collect();
                (!live.is_empty()).then(|| {
                    vec![
                        Value::Text(format!("c{c}").into()),
                        Value::Int(live.len() as i64),
                        Value::Numeric((live.iter().sum::<i64>() as i128).into()),
                    ]
                })
            })
            .collect();
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    }

    fn rows(task: &mut Task) -> Vec<Vec<Value>> {
        let mut rows = task.metric_rows("m", None);
        rows.sort_by_key(|r| format!("{r:?}"));
        rows
    }

    /// A metric that adds aggregates to a count window's existing groups takes every
    /// event those groups hold, however old: here the stream's retention has let them go
    /// from the reservoir (the backfill once read them there, and missed them).
    #[test]
    fn a_count_windows_new_aggregates_take_the_groups_own_events() {
        let stream = "CREATE STREAM p (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
                      WITH (event_time = 'ts', partitions = 1, retention = '1 minute')";
        let n = "CREATE METRIC n AS SELECT card, COUNT(*) AS n FROM p \
                 WINDOW SLIDING (SIZE 3 EVENTS) GROUP BY card";
        let c = catalog_of([stream, n]).unwrap();
        let mut task = Task::new(c.stream("p").unwrap().clone(), 0);
        task.set_metrics(&c.metrics_of("p")).unwrap();
        let row = |second: i64, card: &str, amount: i64| {
            Row::from(vec![
                Value::Timestamp(1_000_000 * second),
                Value::Text(card.into()),
                Value::Int(amount),
            ])
        };
        let old = [row(0, "old", 4), row(1, "old", 8), row(2, "old", 8)];
        task.ingest(&old, false).unwrap();
        let new: Vec<Row> = (0..2 * RETENTION_SWEEP_EVENTS as i64)
            .map(|i| row(1_000 + i, "new", i))
            .collect();
        task.ingest(&new, false).unwrap();
        assert!(
            task.reservoir.len() < new.len(),
            "retention let the old events go"
        );

        let m = "CREATE METRIC m AS SELECT card, COUNT(*) AS n, COUNT(DISTINCT amount) AS d, \
                 MAX(amount) AS hi, SUM(amount) AS s FROM p \
                 WINDOW SLIDING (SIZE 3 EVENTS) GROUP BY card";
        let c = catalog_of([stream, n, m]).unwrap();
        task.set_metrics(&c.metrics_of("p")).unwrap();
        let of = |task: &mut Task, card: &str| {
            task.metric_rows("m", None)
                .into_iter()
                .find(|r| matches!(&r[0], Value::Text(t) if t == card))
                .expect("the group")
        };
        let int = Value::Int;
        let sum = |v: i64| Value::Numeric(i128::from(v).into());
        assert_eq!(of(&mut task, "old")[1..], [int(3), int(2), int(8), sum(20)]);
        let last = new.len() as i64 - 1;
        assert_eq!(
            of(&mut task, "new")[1..],
            [int(3), int(3), int(last), sum(3 * last - 3)]
        );
        // The oldest leaves the new aggregates as it leaves COUNT(*).
        task.ingest(&[row(50_000, "old", 16)], false).unwrap();
        assert_eq!(
            of(&mut task, "old")[1..],
            [int(3), int(2), int(16), sum(32)]
        );
    }

    /// A statement's many rows move the windows once, `AHEAD_BATCH` events at a time
    /// (`move_events`): every event enters and leaves once, even where events of
    /// one time straddle two batches, and where a statement spans more than a window.
    #[test]
    fn a_large_batch_moves_every_event_once_in_steps() {
        let mut task = task();
        // Seven events a second, so batches of 64 split the events of one second.
        let mut next = 0;
        // 1,000 rows span 143 seconds: most enter and leave within one statement;
        // 300 rows, 43 seconds; 50, fewer than a step.
        for size in [1_000, 300, 50, 1_000, 377] {
            let batch: Vec<Row> = (next..next + size).map(|i| event_of(i, 7)).collect();
            task.ingest(&batch, false).unwrap();
            next += size;
            assert_eq!(
                rows(&mut task),
                expected_of(next - 1, 7),
                "after event {}",
                next - 1
            );
        }
    }

    /// A batch moves its events with the key hashes it made as it asked for their lines
    /// (`BatchKeys`), one per group an event is in: with filters that pass some events
    /// only, and keys of one and of two columns, its states are those the same events
    /// give one at a time (which hash their keys as they move).
    #[test]
    fn a_batch_moves_with_its_hashes_as_single_events_do() {
        let c = catalog_of([
            "CREATE STREAM p (ts TIMESTAMP NOT NULL, card TEXT NOT NULL, amount BIGINT) \
             WITH (event_time = 'ts', partitions = 1)",
            "CREATE METRIC m AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM p \
             WHERE amount % 4 = 1 WINDOW SLIDING (SIZE INTERVAL '10 seconds') GROUP BY card",
            "CREATE METRIC both AS SELECT card, amount, COUNT(*) AS n FROM p \
             WINDOW SLIDING (SIZE INTERVAL '10 seconds') GROUP BY card, amount",
            "CREATE METRIC odd AS SELECT amount, COUNT(*) AS n FROM p \
             WHERE amount % 2 = 1 WINDOW SLIDING (SIZE INTERVAL '10 seconds') GROUP BY amount",
        ])
        .unwrap();
        let open = || {
            let mut task = Task::new(c.stream("p").unwrap().clone(), 0);
            task.set_metrics(&c.metrics_of("p")).unwrap();
            task
        };
        let (mut batched, mut single) = (open(), open());
        // Seven events a second: a batch of 64 ends inside a second's events.
        let row = |i: i64| {
            Row::from(vec![
                Value::Timestamp(1_000_000 * (i / 7)),
                Value::Text(format!("c{}", i % 5).into()),
                Value::Int(i % 9),
            ])
        };
        let rows = |task: &mut Task, metric: &str| {
            let mut rows = task.metric_rows(metric, None);
            rows.sort_by_key(|r| format!("{r:?}"));
            rows
        };
        let mut next = 0;
        for size in [700, 64, 1_000, 5] {
            let batch: Vec<Row> = (next..next + size).map(row).collect();
            batched.ingest(&batch, false).unwrap();
            for r in &batch {
                single.ingest(std::slice::from_ref(r), true).unwrap();
            }
            next += size;
            for metric in ["m", "both", "odd"] {
                let want = rows(&mut single, metric);
                assert!(!want.is_empty());
                assert_eq!(rows(&mut batched, metric), want, "{metric} after {next}");
            }
        }
    }

    /// A batch's hashes serve only the events they were made for, in order.
    #[test]
    fn batch_keys_serve_only_their_own_events() {
        let event = |seq: u64| Event {
            ts: 1,
            seq,
            mask: 0,
            row: event(seq as i64),
        };
        let (a, b) = (event(1), event(2));
        let mut keys = BatchKeys::default();
        keys.start(&a);
        keys.hashes.extend([10, 11]);
        keys.start(&b);
        keys.hashes.push(20);
        // Another event with a's number (another row) is not a.
        assert_eq!(keys.take(&event(1)), None);
        assert_eq!(keys.take(&b), None);
        assert_eq!(keys.take(&a), Some(&[10, 11][..]));
        assert_eq!(keys.take(&a), None);
        assert_eq!(keys.take(&b), Some(&[20][..]));
        assert_eq!(keys.take(&b), None);
    }

    #[test]
    fn unobserved_events_move_the_windows_later_and_every_read_sees_them() {
        let mut task = task();
        // Single events nobody reads between: stored, the windows not moved.
        for i in 0..40 {
            task.ingest(&[event(i)], false).unwrap();
        }
        assert_eq!(task.lagging, 40);
        // A read moves them first.
        assert_eq!(rows(&mut task), expected(39));
        assert_eq!(task.lagging, 0);
        // After `LAG_EVENTS_MAX` events they move without a read.
        for i in 40..40 + LAG_EVENTS_MAX as i64 {
            task.ingest(&[event(i)], false).unwrap();
        }
        assert_eq!(task.lagging, 0);
        // An event with RETURNING sees every event before it.
        for i in 104..110 {
            task.ingest(&[event(i)], false).unwrap();
        }
        let answers = task.ingest(&[event(110)], true).unwrap();
        let (outcome, values) = &answers[0];
        assert_eq!(*outcome, Outcome::Accepted);
        let c2 = expected(110).remove(2);
        assert_eq!(values[0].1, c2[1..].to_vec(), "card c2 at second 110");
        assert_eq!(rows(&mut task), expected(110));
        // So does a metric added later: its backfill starts from moved windows.
        for i in 111..120 {
            task.ingest(&[event(i)], false).unwrap();
        }
        let metrics = task.metric_defs().to_vec();
        task.set_metrics(&metrics).unwrap();
        assert_eq!(task.lagging, 0);
        assert_eq!(rows(&mut task), expected(119));
    }
}
