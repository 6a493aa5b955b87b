//! The engine: shard threads that own tasks, and the handle the front end uses to reach
//! them through bounded queues.
//!
//! Invariants: a task lives on exactly one shard (`shard_of`), and only that shard's
//! thread touches it, so the event path takes no lock; every queue is bounded
//! (`SHARD_QUEUE_MAX`), so a flood of statements waits instead of growing memory.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::thread::JoinHandle;

use tokio::sync::{mpsc, oneshot};

use eddy_planner::catalog::{Catalog, MetricDef, StreamDef};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::log::LocalLog;
use crate::route::{murmur2, partition_for};
use crate::task::{MetricValues, Outcome, Row, Task, TaskStats};
use crate::watch::{WatchId, WatchTarget, Watcher};
use eddy_planner::codec;

/// Commands waiting per shard before senders wait.
pub const SHARD_QUEUE_MAX: usize = 1024;

/// A task: (stream, partitioner, partition).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct TaskId {
    pub stream: String,
    pub partitioner: usize,
    pub partition: u32,
}

/// The reply for one inserted event: each partitioner's outcome, and the values of every
/// metric of the stream (creation order) for the event's groups.
#[derive(Clone, Debug, Default)]
pub struct EventReply {
    pub outcomes: Vec<Outcome>,
    pub metrics: MetricValues,
}

/// Per-task counters for SHOW STREAMS.
#[derive(Clone, Debug)]
pub struct TaskReport {
    pub task: TaskId,
    pub stats: TaskStats,
    pub stored_events: usize,
    pub time: Option<i64>,
}

type IngestReply = Result<Vec<(Outcome, MetricValues)>>;

enum Command {
    Catalog(Arc<Catalog>, oneshot::Sender<Result<()>>),
    Ingest {
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
        reply: oneshot::Sender<IngestReply>,
    },
    MetricRows {
        task: TaskId,
        metric: String,
        key: Option<Vec<Value>>,
        reply: oneshot::Sender<Vec<Vec<Value>>>,
    },
    StreamRows {
        stream: String,
        reply: oneshot::Sender<Vec<Row>>,
    },
    Report(oneshot::Sender<Vec<TaskReport>>),
    Watch {
        stream: String,
        partitioner: usize,
        id: WatchId,
        target: WatchTarget,
        watcher: Arc<dyn Watcher>,
        reply: oneshot::Sender<()>,
    },
    Unwatch(WatchId),
}

/// The shard owning a task: stable across restarts and nodes.
pub fn shard_of(task: &TaskId, shards: usize) -> usize {
    let key = format!("{}/{}/{}", task.stream, task.partitioner, task.partition);
    (murmur2(key.as_bytes()) & 0x7fff_ffff) as usize % shards
}

pub struct Engine {
    queues: Vec<mpsc::Sender<Command>>,
    threads: Vec<JoinHandle<()>>,
    /// Where events are made durable before tasks apply them (`None`: in memory only).
    log: Option<Arc<LocalLog>>,
}

/// Events replayed per engine call at start.
const REPLAY_BATCH_ROWS: usize = 8192;

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("shards", &self.queues.len())
            .finish()
    }
}

fn engine_gone() -> Error {
    Error::internal("the engine is shutting down")
}

impl Engine {
    /// Starts `shards` shard threads; with a log, every ingested event is appended to
    /// its tasks' logs (and durable) before a task applies it.
    pub fn start(shards: usize, log: Option<Arc<LocalLog>>) -> Engine {
        assert!(shards > 0);
        let mut queues = Vec::with_capacity(shards);
        let mut threads = Vec::with_capacity(shards);
        for index in 0..shards {
            let (tx, rx) = mpsc::channel(SHARD_QUEUE_MAX);
            queues.push(tx);
            let thread = std::thread::Builder::new()
                .name(format!("eddy-shard-{index}"))
                .spawn(move || Shard::new(index, shards).run(rx))
                .expect("spawn shard thread");
            threads.push(thread);
        }
        Engine {
            queues,
            threads,
            log,
        }
    }

    pub fn log(&self) -> Option<&Arc<LocalLog>> {
        self.log.as_ref()
    }

    /// Re-applies every task's logged events (at start, after the catalog is installed).
    /// Returns how many events were replayed.
    pub async fn recover(&self, catalog: &Catalog) -> Result<u64> {
        let Some(log) = &self.log else {
            return Ok(0);
        };
        let mut replayed = 0;
        for stream in catalog.streams.values() {
            for p in 0..stream.partitioner_count() {
                for partition in 0..stream.tasks_per_partitioner() {
                    let task = TaskId {
                        stream: stream.name.clone(),
                        partitioner: p,
                        partition,
                    };
                    let mut rows = Vec::new();
                    let mut bad = None;
                    log.replay(
                        &task,
                        0,
                        &mut |offset, bytes| match codec::decode_row(&bytes) {
                            Some(row) => rows.push(row),
                            None => bad = bad.or(Some(offset)),
                        },
                    )?;
                    if let Some(offset) = bad {
                        return Err(Error::internal(format!(
                            "the log of task {task:?} holds an unreadable event at offset {offset}"
                        )));
                    }
                    replayed += rows.len() as u64;
                    for chunk in rows.chunks(REPLAY_BATCH_ROWS) {
                        self.ingest_task(task.clone(), chunk.to_vec(), false)
                            .await?;
                    }
                }
            }
        }
        Ok(replayed)
    }

    async fn ingest_task(
        &self,
        task: TaskId,
        rows: Vec<Row>,
        values: bool,
    ) -> Result<oneshot::Receiver<IngestReply>> {
        let (tx, rx) = oneshot::channel();
        let shard = shard_of(&task, self.shards());
        self.send(
            shard,
            Command::Ingest {
                task,
                rows,
                values,
                reply: tx,
            },
        )
        .await?;
        Ok(rx)
    }

    pub fn shards(&self) -> usize {
        self.queues.len()
    }

    async fn send(&self, shard: usize, cmd: Command) -> Result<()> {
        self.queues[shard]
            .send(cmd)
            .await
            .map_err(|_| engine_gone())
    }

    /// Installs a catalog on every shard: creates and drops tasks, adds and removes
    /// metric nodes (backfilling new ones). Returns when every shard is done.
    pub async fn apply_catalog(&self, catalog: Arc<Catalog>) -> Result<()> {
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(shard, Command::Catalog(catalog.clone(), tx))
                .await?;
            waits.push(rx);
        }
        for rx in waits {
            rx.await.map_err(|_| engine_gone())??;
        }
        Ok(())
    }

    /// Routes events to the tasks of every partitioner and gathers the replies per event.
    pub async fn ingest(
        &self,
        stream: &StreamDef,
        rows: Vec<Row>,
        values: bool,
    ) -> Result<Vec<EventReply>> {
        let mut replies = vec![EventReply::default(); rows.len()];
        let mut routed = Vec::new();
        for p in 0..stream.partitioner_count() {
            let mut per_task: BTreeMap<u32, (Vec<usize>, Vec<Row>)> = BTreeMap::new();
            for (i, row) in rows.iter().enumerate() {
                let partition = match stream.partitioners.get(p) {
                    Some(col) => partition_for(&row[*col], stream.partitions),
                    None => 0,
                };
                let entry = per_task.entry(partition).or_default();
                entry.0.push(i);
                entry.1.push(row.clone());
            }
            for (partition, (indexes, task_rows)) in per_task {
                let task = TaskId {
                    stream: stream.name.clone(),
                    partitioner: p,
                    partition,
                };
                routed.push((p, task, indexes, task_rows));
            }
        }
        let mut waits = Vec::new();
        match &self.log {
            // Durable first: the log thread hands the events to the tasks after the fsync,
            // in log order, so a task applies exactly its log's sequence.
            Some(log) => {
                let mut batches = Vec::with_capacity(routed.len());
                let mut commands = Vec::with_capacity(routed.len());
                for (p, task, indexes, task_rows) in routed {
                    let records = task_rows
                        .iter()
                        .map(|r| {
                            let mut b = Vec::with_capacity(64);
                            codec::encode_row(r, &mut b);
                            b
                        })
                        .collect();
                    batches.push((task.clone(), records));
                    let (tx, rx) = oneshot::channel();
                    let shard = shard_of(&task, self.shards());
                    commands.push((
                        shard,
                        Command::Ingest {
                            task,
                            rows: task_rows,
                            values,
                            reply: tx,
                        },
                    ));
                    waits.push((p, indexes, rx));
                }
                let queues = self.queues.clone();
                let (durable, appended) = oneshot::channel();
                log.append(
                    batches,
                    Box::new(move |result| {
                        if result.is_ok() {
                            for (shard, cmd) in commands {
                                let _ = queues[shard].blocking_send(cmd);
                            }
                        }
                        let _ = durable.send(result);
                    }),
                );
                appended.await.map_err(|_| engine_gone())??;
            }
            None => {
                for (p, task, indexes, task_rows) in routed {
                    let rx = self.ingest_task(task, task_rows, values).await?;
                    waits.push((p, indexes, rx));
                }
            }
        }
        // Partitioner order is kept so metric values come out in creation order.
        let mut per_partitioner: Vec<Vec<(usize, MetricValues)>> =
            vec![Vec::new(); stream.partitioner_count()];
        for (p, indexes, rx) in waits {
            let results = rx.await.map_err(|_| engine_gone())??;
            for (i, (outcome, vals)) in indexes.into_iter().zip(results) {
                replies[i].outcomes.push(outcome);
                per_partitioner[p].push((i, vals));
            }
        }
        for list in per_partitioner {
            for (i, vals) in list {
                replies[i].metrics.extend(vals);
            }
        }
        Ok(replies)
    }

    /// The current rows of a metric; with `key` (all group-by values) only that group,
    /// read from the one task that owns it.
    pub async fn metric_rows(
        &self,
        stream: &StreamDef,
        metric: &MetricDef,
        key: Option<Vec<Value>>,
    ) -> Result<Vec<Vec<Value>>> {
        let p = metric.partitioner;
        let partition = match (&key, stream.partitioners.get(p)) {
            (Some(k), Some(col)) => {
                let pos = metric.group_by.iter().position(|c| c == col);
                pos.map(|pos| partition_for(&k[pos], stream.partitions))
            }
            (Some(_), None) => Some(0),
            _ => None,
        };
        let mut waits = Vec::new();
        for part in 0..stream.tasks_per_partitioner() {
            if partition.is_some_and(|only| only != part) {
                continue;
            }
            let task = TaskId {
                stream: stream.name.clone(),
                partitioner: p,
                partition: part,
            };
            let (tx, rx) = oneshot::channel();
            self.send(
                shard_of(&task, self.shards()),
                Command::MetricRows {
                    task,
                    metric: metric.name.clone(),
                    key: key.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        let mut rows = Vec::new();
        for rx in waits {
            rows.extend(rx.await.map_err(|_| engine_gone())?);
        }
        Ok(rows)
    }

    /// The events stored for a stream (from its first partitioner's tasks).
    pub async fn stream_rows(&self, stream: &StreamDef) -> Result<Vec<Row>> {
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(
                shard,
                Command::StreamRows {
                    stream: stream.name.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        let mut rows = Vec::new();
        for rx in waits {
            rows.extend(rx.await.map_err(|_| engine_gone())?);
        }
        Ok(rows)
    }

    /// Counters of every task.
    pub async fn report(&self) -> Result<Vec<TaskReport>> {
        let mut out = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(shard, Command::Report(tx)).await?;
            out.extend(rx.await.map_err(|_| engine_gone())?);
        }
        out.sort_by(|a, b| a.task.cmp(&b.task));
        Ok(out)
    }

    /// Attaches a subscription to the tasks of `stream`'s `partitioner`: a metric watch
    /// (the metric runs in that partitioner's tasks) first receives each task's current
    /// rows; a stream watch uses partitioner 0 so each event is seen once. Returns once
    /// every task delivers to it.
    pub async fn watch(
        &self,
        stream: &str,
        partitioner: usize,
        target: WatchTarget,
        id: WatchId,
        watcher: Arc<dyn Watcher>,
    ) -> Result<()> {
        let mut waits = Vec::new();
        for shard in 0..self.shards() {
            let (tx, rx) = oneshot::channel();
            self.send(
                shard,
                Command::Watch {
                    stream: stream.to_string(),
                    partitioner,
                    id,
                    target: target.clone(),
                    watcher: watcher.clone(),
                    reply: tx,
                },
            )
            .await?;
            waits.push(rx);
        }
        for rx in waits {
            rx.await.map_err(|_| engine_gone())?;
        }
        Ok(())
    }

    /// Detaches a subscription from every task.
    pub async fn unwatch(&self, id: WatchId) {
        for shard in 0..self.shards() {
            let _ = self.send(shard, Command::Unwatch(id)).await;
        }
    }

    /// Stops the shard threads after they finish the commands already queued.
    pub fn shutdown(self) {
        drop(self.queues);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// One shard thread's state: the tasks it owns.
struct Shard {
    index: usize,
    shards: usize,
    tasks: BTreeMap<TaskId, Task>,
}

impl Shard {
    fn new(index: usize, shards: usize) -> Shard {
        Shard {
            index,
            shards,
            tasks: BTreeMap::new(),
        }
    }

    fn run(mut self, mut rx: mpsc::Receiver<Command>) {
        while let Some(cmd) = rx.blocking_recv() {
            match cmd {
                Command::Catalog(catalog, reply) => {
                    let _ = reply.send(self.apply_catalog(&catalog));
                }
                Command::Ingest {
                    task,
                    rows,
                    values,
                    reply,
                } => {
                    let result = match self.tasks.get_mut(&task) {
                        Some(t) => t.ingest(&rows, values),
                        None => Err(Error::internal(format!(
                            "task {task:?} is not on this shard"
                        ))),
                    };
                    let _ = reply.send(result);
                }
                Command::MetricRows {
                    task,
                    metric,
                    key,
                    reply,
                } => {
                    let rows = self
                        .tasks
                        .get(&task)
                        .map(|t| t.metric_rows(&metric, key.as_deref()))
                        .unwrap_or_default();
                    let _ = reply.send(rows);
                }
                Command::StreamRows { stream, reply } => {
                    let rows = self
                        .tasks
                        .iter()
                        .filter(|(id, _)| id.stream == stream && id.partitioner == 0)
                        .flat_map(|(_, t)| t.events())
                        .collect();
                    let _ = reply.send(rows);
                }
                Command::Watch {
                    stream,
                    partitioner,
                    id,
                    target,
                    watcher,
                    reply,
                } => {
                    for (_, task) in self
                        .tasks
                        .iter_mut()
                        .filter(|(t, _)| t.stream == stream && t.partitioner == partitioner)
                    {
                        task.watch(id, target.clone(), watcher.clone());
                    }
                    let _ = reply.send(());
                }
                Command::Unwatch(id) => {
                    for task in self.tasks.values_mut() {
                        task.unwatch(id);
                    }
                }
                Command::Report(reply) => {
                    let report = self
                        .tasks
                        .iter()
                        .map(|(id, t)| TaskReport {
                            task: id.clone(),
                            stats: t.stats,
                            stored_events: t.stored_events(),
                            time: t.time(),
                        })
                        .collect();
                    let _ = reply.send(report);
                }
            }
        }
    }

    fn apply_catalog(&mut self, catalog: &Catalog) -> Result<()> {
        // Tasks of dropped (or re-created) streams go away with their state.
        self.tasks.retain(|id, task| {
            let keep = catalog
                .stream(&id.stream)
                .is_some_and(|s| Arc::ptr_eq(s, task.stream()) || **s == **task.stream());
            if !keep {
                task.end_watches(&Error::new(
                    eddy_planner::ErrorKind::UndefinedTable,
                    format!("stream \"{}\" was dropped", id.stream),
                ));
            }
            keep
        });
        for stream in catalog.streams.values() {
            let metrics = catalog.metrics_of(&stream.name);
            for p in 0..stream.partitioner_count() {
                for partition in 0..stream.tasks_per_partitioner() {
                    let id = TaskId {
                        stream: stream.name.clone(),
                        partitioner: p,
                        partition,
                    };
                    if shard_of(&id, self.shards) != self.index {
                        continue;
                    }
                    let task = self
                        .tasks
                        .entry(id)
                        .or_insert_with(|| Task::new(stream.clone(), p));
                    task.set_metrics(&metrics)?;
                }
            }
        }
        Ok(())
    }
}
