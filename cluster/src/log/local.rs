//! The event log tasks read from. `LocalLog` is the embedded default: one `TaskLog` per
//! task under `DATA_DIR/log/`, written by one thread that commits in groups — every
//! statement waiting when an fsync starts shares it. Kafka plays the same role in cluster
//! mode.
//!
//! An append is either durable (`synchronous_commit = on`: its continuation runs after
//! the fsync that covers it) or written (`off`: its continuation runs once its records are
//! in the files' OS buffers, and an fsync follows within the commit delay).
//!
//! Invariants: continuations run on the writer thread in append order — so whatever they
//! hand to the tasks reaches them in log order — and a durable append's continuation runs
//! only once every record it was given is durable; a task's log replays exactly the
//! records appended to it; `sync` returns once every record appended before it is
//! durable (a checkpoint calls it before it commits, so it never covers a record a crash
//! could still lose).

use std::any::Any;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use eddy_planner::{Error, Result};
use eddy_storage::log::{TaskLog, SEGMENT_BYTES_MAX};

use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::codec;

use crate::command::reply_to_caller;
use crate::log::{Answers, EventLog, LogFuture, TaskBatch};
use crate::node::shards::{tasks_of, Shards};
use crate::route::{dir_name, TaskId};

/// What runs after an append is durable (or failed), on the writer thread. It gets each
/// batch's task log end: the offset after the batch's last record.
pub type AfterAppend = Box<dyn FnOnce(Result<Vec<u64>>) + Send>;

enum Request {
    Append {
        batches: Vec<(TaskId, Vec<Vec<u8>>)>,
        durable: bool,
        after: AfterAppend,
    },
    Sync {
        reply: oneshot::Sender<Result<()>>,
    },
    DropStream {
        stream: String,
        reply: oneshot::Sender<Result<()>>,
    },
    Truncate {
        task: TaskId,
        before: u64,
    },
}

/// Counters of the log writer, for SHOW STORAGE and /metrics.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Statements (append calls) made durable.
    pub appends: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    /// fsync rounds: each makes every append waiting at that moment durable.
    pub commits: AtomicU64,
    pub commit_micros: AtomicU64,
}

/// The embedded log of a node.
pub struct LocalLog {
    dir: PathBuf,
    stats: Arc<LogStats>,
    requests: Option<mpsc::Sender<Request>>,
    thread: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLog").field("dir", &self.dir).finish()
    }
}

fn storage_error(e: eddy_storage::LogError) -> Error {
    Error::new(eddy_planner::ErrorKind::Internal, e.to_string())
}

fn task_dir(root: &Path, task: &TaskId) -> PathBuf {
    root.join(dir_name(&task.stream))
        .join(format!("{}-{}", task.partitioner, task.partition))
}

impl LocalLog {
    /// Opens the log under `dir` and starts its writer thread. Appends that are not
    /// durable are fsynced at most `commit_delay` after they were written.
    pub fn open(dir: &Path, commit_delay: Duration) -> Result<LocalLog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::internal(format!("could not create {}: {e}", dir.display())))?;
        let (tx, rx) = mpsc::channel();
        let root = dir.to_path_buf();
        let stats = Arc::new(LogStats::default());
        let writer_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-log".into())
            .spawn(move || Writer::new(root, writer_stats, commit_delay).run(rx))
            .map_err(|e| Error::internal(format!("could not start the log thread: {e}")))?;
        Ok(LocalLog {
            dir: dir.to_path_buf(),
            stats,
            requests: Some(tx),
            thread: Some(thread),
        })
    }

    pub fn stats(&self) -> &LogStats {
        &self.stats
    }

    /// Bytes of a stream's logs on disk.
    pub fn disk_bytes(&self, stream: &str) -> u64 {
        fn walk(dir: &Path) -> u64 {
            let Ok(entries) = std::fs::read_dir(dir) else {
                return 0;
            };
            entries
                .filter_map(|e| e.ok())
                .map(|e| match e.metadata() {
                    Ok(m) if m.is_dir() => walk(&e.path()),
                    Ok(m) => m.len(),
                    Err(_) => 0,
                })
                .sum()
        }
        walk(&self.dir.join(dir_name(stream)))
    }

    fn closed() -> Error {
        Error::internal("the log is closed")
    }

    /// Appends records to the logs of tasks; `after` runs on the writer thread once all
    /// of them are durable (`durable`) or written, after the continuations of earlier
    /// appends.
    pub fn append(&self, batches: Vec<(TaskId, Vec<Vec<u8>>)>, durable: bool, after: AfterAppend) {
        let sent = self.requests.as_ref().map(|r| {
            r.send(Request::Append {
                batches,
                durable,
                after,
            })
        });
        match sent {
            Some(Ok(())) => {}
            Some(Err(mpsc::SendError(Request::Append { after, .. }))) => after(Err(Self::closed())),
            _ => {}
        }
    }

    /// Returns once every record appended before the call is durable.
    pub async fn sync(&self) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        self.requests
            .as_ref()
            .and_then(|r| r.send(Request::Sync { reply }).ok())
            .ok_or_else(Self::closed)?;
        rx.await.map_err(|_| Self::closed())?
    }

    /// Deletes every task log of a stream (after DROP STREAM).
    pub async fn drop_stream(&self, stream: &str) -> Result<()> {
        let (reply, rx) = oneshot::channel();
        let stream = stream.to_string();
        self.requests
            .as_ref()
            .and_then(|r| r.send(Request::DropStream { stream, reply }).ok())
            .ok_or_else(Self::closed)?;
        rx.await.map_err(|_| Self::closed())?
    }

    /// Deletes a task's log segments that end before `before` (a committed checkpoint
    /// covers them).
    pub fn truncate(&self, task: &TaskId, before: u64) {
        if let Some(r) = &self.requests {
            let _ = r.send(Request::Truncate {
                task: task.clone(),
                before,
            });
        }
    }

    /// Calls `f` with each record of a task's log from `offset` on. Call before the task
    /// takes appends (at start): a torn tail is cut here.
    pub fn replay(
        &self,
        task: &TaskId,
        offset: u64,
        f: &mut dyn FnMut(u64, Vec<u8>),
    ) -> Result<u64> {
        let dir = task_dir(&self.dir, task);
        if !dir.exists() {
            return Ok(0);
        }
        let log = TaskLog::open(&dir, SEGMENT_BYTES_MAX).map_err(storage_error)?;
        log.read_from(offset, f).map_err(storage_error)?;
        Ok(log.next_offset())
    }
}

/// Events replayed per batch handed to a task at start.
const REPLAY_BATCH_ROWS: usize = 8192;

impl EventLog for LocalLog {
    /// Durable first: the writer thread hands the events to the tasks after the fsync,
    /// in log order, so a task applies exactly its log's sequence.
    fn ingest<'a>(
        &'a self,
        shards: &'a Shards,
        _stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        durable: bool,
    ) -> LogFuture<'a, Vec<Answers>> {
        Box::pin(async move {
            let mut records = Vec::with_capacity(batches.len());
            let mut waits = Vec::with_capacity(batches.len());
            let mut deliveries = Vec::with_capacity(batches.len());
            for (task, rows) in batches {
                let encoded = rows
                    .iter()
                    .map(|r| {
                        let mut b = Vec::with_capacity(64);
                        codec::encode_row(r, &mut b);
                        b
                    })
                    .collect();
                records.push((task.clone(), encoded));
                let (reply, rx) = reply_to_caller();
                deliveries.push((task, rows, reply));
                waits.push(rx);
            }
            // The caller waits for the tasks' answers alone: a failed append answers each
            // batch with its error, so no second wake-up says that the append is done.
            let shards = shards.clone();
            self.append(
                records,
                durable,
                Box::new(move |result| match result {
                    Ok(ends) => {
                        for ((task, rows, reply), end) in deliveries.into_iter().zip(ends) {
                            shards.deliver(task, rows, values, end, reply);
                        }
                    }
                    Err(e) => {
                        for (_, _, reply) in deliveries {
                            reply(Err(e.clone()));
                        }
                    }
                }),
            );
            Shards::answers(waits).await
        })
    }

    fn recover<'a>(
        &'a self,
        shards: &'a Shards,
        catalog: &'a Catalog,
        applied: BTreeMap<TaskId, u64>,
    ) -> LogFuture<'a, u64> {
        Box::pin(async move {
            let mut replayed = 0;
            let mut applying = Vec::new();
            for (_, task) in tasks_of(catalog) {
                let from = applied.get(&task).copied().unwrap_or(0);
                let mut rows = Vec::new();
                let mut bad = None;
                self.replay(
                    &task,
                    from,
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
                let mut end = from;
                for chunk in rows.chunks(REPLAY_BATCH_ROWS) {
                    end += chunk.len() as u64;
                    let rx = shards
                        .ingest(task.clone(), chunk.to_vec(), false, Some(end))
                        .await?;
                    applying.push(rx);
                }
            }
            Shards::answers(applying).await?;
            Ok(replayed)
        })
    }

    fn install<'a>(&'a self, current: &'a Catalog, next: &'a Catalog) -> LogFuture<'a, ()> {
        Box::pin(async move {
            for (name, stream) in &current.streams {
                if !next.stream(name).is_some_and(|s| s.same_as(stream)) {
                    self.drop_stream(name).await?;
                }
            }
            for name in next.streams.keys() {
                if current.stream(name).is_none() {
                    self.drop_stream(name).await?;
                }
            }
            Ok(())
        })
    }

    fn sync(&self) -> LogFuture<'_, ()> {
        Box::pin(LocalLog::sync(self))
    }

    fn truncate(&self, task: &TaskId, end: u64) {
        LocalLog::truncate(self, task, end)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for LocalLog {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread's state: the open task logs, and what is written but not yet
/// durable.
struct Writer {
    root: PathBuf,
    logs: HashMap<TaskId, TaskLog>,
    stats: Arc<LogStats>,
    commit_delay: Duration,
    /// Logs written since their last fsync.
    dirty: Vec<TaskId>,
    /// When the oldest write not yet durable was made.
    owed_since: Option<Instant>,
}

impl Writer {
    fn new(root: PathBuf, stats: Arc<LogStats>, commit_delay: Duration) -> Writer {
        Writer {
            root,
            logs: HashMap::new(),
            stats,
            commit_delay,
            dirty: Vec::new(),
            owed_since: None,
        }
    }

    fn log(&mut self, task: &TaskId) -> Result<&mut TaskLog> {
        if !self.logs.contains_key(task) {
            let log = TaskLog::open(&task_dir(&self.root, task), SEGMENT_BYTES_MAX)
                .map_err(storage_error)?;
            self.logs.insert(task.clone(), log);
        }
        Ok(self.logs.get_mut(task).expect("inserted"))
    }

    /// Writes one append's records; the task log end after each batch.
    fn write(&mut self, batches: Vec<(TaskId, Vec<Vec<u8>>)>) -> Result<Vec<u64>> {
        self.stats.appends.fetch_add(1, Ordering::Relaxed);
        let mut ends = Vec::with_capacity(batches.len());
        for (task, records) in batches {
            self.stats
                .records
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            self.stats.bytes.fetch_add(
                records.iter().map(|r| r.len() as u64 + 8).sum(),
                Ordering::Relaxed,
            );
            let log = self.log(&task)?;
            log.append(&records).map_err(storage_error)?;
            ends.push(log.next_offset());
            if !self.dirty.contains(&task) {
                self.dirty.push(task);
            }
            self.owed_since.get_or_insert_with(Instant::now);
        }
        Ok(ends)
    }

    /// fsyncs every log written since the last sync.
    fn sync(&mut self) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let mut synced = Ok(());
        for task in std::mem::take(&mut self.dirty) {
            if let Some(log) = self.logs.get_mut(&task) {
                if let Err(e) = log.sync() {
                    synced = Err(storage_error(e));
                }
            }
        }
        self.owed_since = None;
        self.stats
            .commit_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        synced
    }

    /// The next request, or `None` when the commit delay of a written append ran out
    /// (`Err` once every sender is gone).
    fn next(&self, rx: &mpsc::Receiver<Request>) -> std::result::Result<Option<Request>, ()> {
        match self.owed_since {
            None => rx.recv().map(Some).map_err(|_| ()),
            Some(since) => {
                let left = self.commit_delay.saturating_sub(since.elapsed());
                match rx.recv_timeout(left) {
                    Ok(r) => Ok(Some(r)),
                    Err(mpsc::RecvTimeoutError::Timeout) => Ok(None),
                    Err(mpsc::RecvTimeoutError::Disconnected) => Err(()),
                }
            }
        }
    }

    fn run(mut self, rx: mpsc::Receiver<Request>) {
        loop {
            let first = match self.next(&rx) {
                Ok(Some(r)) => r,
                Ok(None) => {
                    // The commit delay ran out: what was written becomes durable. A
                    // failure here is met again by the next durable append or sync.
                    let _ = self.sync();
                    continue;
                }
                Err(()) => break,
            };
            // Group commit: everything that queued up while the last fsync ran.
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            // Continuations wait here, in order, once one of them needs the fsync.
            let mut waiting: Vec<(AfterAppend, Result<Vec<u64>>)> = Vec::new();
            let mut syncs = Vec::new();
            for req in batch {
                match req {
                    Request::Append {
                        batches,
                        durable,
                        after,
                    } => {
                        let result = self.write(batches);
                        if durable || !waiting.is_empty() || !syncs.is_empty() {
                            waiting.push((after, result));
                        } else {
                            after(result);
                        }
                    }
                    Request::Sync { reply } => syncs.push(reply),
                    Request::DropStream { stream, reply } => {
                        self.logs.retain(|t, _| t.stream != stream);
                        self.dirty.retain(|t| t.stream != stream);
                        let dir = self.root.join(dir_name(&stream));
                        let result = match std::fs::remove_dir_all(&dir) {
                            Ok(()) => Ok(()),
                            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                            Err(e) => Err(Error::internal(format!(
                                "could not remove {}: {e}",
                                dir.display()
                            ))),
                        };
                        let _ = reply.send(result);
                    }
                    Request::Truncate { task, before } => {
                        // A failure leaves the files; the next checkpoint tries again.
                        if let Ok(log) = self.log(&task) {
                            let _ = log.truncate_before(before);
                        }
                    }
                }
            }
            let past_delay = self
                .owed_since
                .is_some_and(|since| since.elapsed() >= self.commit_delay);
            if waiting.is_empty() && syncs.is_empty() && !past_delay {
                continue;
            }
            let synced = self.sync();
            for (after, result) in waiting {
                after(synced.clone().and(result));
            }
            for reply in syncs {
                let _ = reply.send(synced.clone());
            }
        }
        // The last writes become durable before the thread ends.
        let _ = self.sync();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(partition: u32) -> TaskId {
        TaskId {
            stream: "s".into(),
            partitioner: 0,
            partition,
        }
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("eddy-locallog-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        dir
    }

    /// Appends and waits for the continuation; returns the log ends and the number of
    /// fsync rounds made by the time it ran.
    fn append(log: &LocalLog, partition: u32, records: &[&str], durable: bool) -> (Vec<u64>, u64) {
        let (tx, rx) = mpsc::channel();
        let stats_commits = {
            let stats = log.stats.clone();
            move || stats.commits.load(Ordering::SeqCst)
        };
        log.append(
            vec![(
                task(partition),
                records.iter().map(|r| r.as_bytes().to_vec()).collect(),
            )],
            durable,
            Box::new(move |r| {
                let commits = stats_commits();
                tx.send((r.unwrap(), commits)).unwrap();
            }),
        );
        rx.recv().unwrap()
    }

    #[test]
    fn written_appends_continue_before_the_fsync_and_become_durable_within_the_delay() {
        let dir = temp("async");
        // A delay no test run reaches: the fsync comes from `sync` or the next durable
        // append, never from the clock.
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        let (ends, commits) = append(&log, 0, &["a", "b"], false);
        assert_eq!(
            (ends, commits),
            (vec![2], 0),
            "acknowledged before any fsync"
        );
        let (ends, _) = append(&log, 1, &["c"], false);
        assert_eq!(ends, vec![1]);
        // A durable append waits for the fsync that covers everything before it.
        let (ends, commits) = append(&log, 0, &["d"], true);
        assert_eq!((ends, commits), (vec![3], 1));
        let (_, commits) = append(&log, 1, &["e"], false);
        assert_eq!(commits, 1);
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(log.sync())
            .unwrap();
        assert_eq!(log.stats.commits.load(Ordering::SeqCst), 2);
        drop(log);

        // With a short delay the clock makes written appends durable on its own.
        let log = LocalLog::open(&dir, Duration::from_millis(5)).unwrap();
        let mut seen = Vec::new();
        log.replay(&task(0), 0, &mut |_, r| seen.push(r)).unwrap();
        log.replay(&task(1), 0, &mut |_, r| seen.push(r)).unwrap();
        assert_eq!(seen, [b"a", b"b", b"d", b"c", b"e"].map(|r| r.to_vec()));
        append(&log, 0, &["f"], false);
        let deadline = Instant::now() + Duration::from_secs(30);
        while log.stats.commits.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no fsync after the commit delay");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
