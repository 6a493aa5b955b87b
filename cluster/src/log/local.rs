//! The event log tasks read from. `LocalLog` is the embedded default: one `TaskLog` per
//! task under `DATA_DIR/log/`. Callers write their records themselves, under the log's
//! lock, and commit in groups: every statement waiting when an fsync starts shares it. A
//! durable append that finds no commit running and nothing queued leads one itself, on
//! its own thread; appends meanwhile queue for the committer thread, which takes them
//! once the leader's continuation ran. Kafka plays the same role in cluster mode.
//!
//! An append is either durable (`synchronous_commit = on`: its continuation runs after
//! the fsync that covers it, on its leader or the committer) or written (`off`: its
//! continuation runs at once, on the caller, and an fsync follows within the commit
//! delay). A written append that finds continuations still queued waits behind them, so
//! it takes no thread hop unless an earlier one needs one.
//!
//! A durable append also writes its records to the node's journal (`DIR/node-journal`),
//! one journal record per task batch. A commit fsyncs the journal, and of the task logs
//! only those holding written appends not yet synced: with durable appends alone, one
//! file, however many task logs the group wrote (here one fdatasync takes 0.2–0.3 ms; the
//! four task logs of a 4-partition stream took 0.8–1.0 ms one after another). A written
//! append skips the journal, a write(2) less per statement: the fsync the commit delay owes
//! it goes to its task log. `sync` fsyncs every task log and then drops the journal's older
//! segments. Opening the log first copies into each task log the records the journal
//! holds past its end, which a machine crash may have taken from the task log but not
//! from the synced journal. It stops at a gap: a task log that lost written records the
//! journal never held. No record past such a gap was acknowledged as durable, since the
//! commit it waited for fsynced that task log too.
//!
//! Invariants: continuations run in append order — so whatever they hand to the tasks
//! reaches them in log order — and a durable append's continuation runs only once every
//! record it was given is durable; a task's log replays exactly the records appended to
//! it; `sync` returns once every record appended before it is durable (a checkpoint
//! calls it before it commits, so it never covers a record a crash could still lose).

use std::any::Any;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

use eddy_planner::{Error, Result};
use eddy_storage::log::{LogEnd, Records, TaskLog, Unsynced, SEGMENT_BYTES_MAX};

use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::codec;

use crate::command::reply_to_caller;
use crate::log::{Answers, EventLog, LogFuture, TaskBatch, Turn};
use crate::node::shards::{tasks_of, Shards};
use crate::route::{dir_name, TaskId};

/// What runs once an append is durable (or written, or failed). It gets each batch's
/// task log end: the offset after the batch's last record.
pub type AfterAppend = Box<dyn FnOnce(Result<Vec<u64>>) + Send>;

/// Counters of the log, for SHOW STORAGE and /metrics.
#[derive(Debug, Default)]
pub struct LogStats {
    /// Statements (append calls) written.
    pub appends: AtomicU64,
    pub records: AtomicU64,
    pub bytes: AtomicU64,
    /// fsync rounds: each makes every append written before it started durable.
    pub commits: AtomicU64,
    pub commit_micros: AtomicU64,
}

/// The embedded log of a node.
pub struct LocalLog {
    dir: PathBuf,
    shared: Arc<Shared>,
    committer: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for LocalLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalLog").field("dir", &self.dir).finish()
    }
}

/// What callers and the committer share.
struct Shared {
    files: Mutex<Files>,
    /// Wakes the committer: a continuation queued, or the log closing.
    work: Condvar,
    stats: LogStats,
    commit_delay: Duration,
}

/// A continuation waiting for the committer, with its append's result.
struct Waiting {
    /// Runs only after an fsync that covers its records.
    durable: bool,
    after: AfterAppend,
    result: Result<Vec<u64>>,
}

/// The journal's directory under the log's, a name no stream's directory has
/// (`route::dir_name` gives plain lower-case names or `x-…`).
const JOURNAL_DIR: &str = "node-journal";

/// The journal's segments: `sync` drops those before its start, so it holds little more
/// than the records since the last checkpoint.
const JOURNAL_SEGMENT_BYTES: u64 = 16 << 20;

/// The open task logs, and what is written but not yet durable.
struct Files {
    root: PathBuf,
    logs: HashMap<TaskId, TaskLog>,
    /// Every task batch of a durable append, in write order (see the module's header).
    journal: TaskLog,
    /// Task logs written by appends that were not journaled, not yet fsynced: the next
    /// commit fsyncs them.
    unjournaled: HashSet<TaskId>,
    /// A `sync` waits: the next commit fsyncs the task logs as well as the journal.
    sync_all: bool,
    /// When the oldest write not yet durable was made.
    owed_since: Option<Instant>,
    /// Continuations for the committer, in append order.
    waiting: VecDeque<Waiting>,
    /// The committer took continuations from `waiting`, or a caller leads a commit
    /// (`LocalLog::append`), and has yet to run them: appends wait behind them. (An
    /// fsync owed to the commit delay alone holds nobody up.)
    running: bool,
    /// The last commit covered at most one durable append: the next may lead its own
    /// (`LocalLog::append`). Under load, groups form and the committer takes them, so a
    /// caller's thread, which serves other sessions too, never waits on an fsync.
    alone: bool,
    closed: bool,
}

/// 53100 for a full disk (nothing of the append stays), XX000 otherwise.
fn storage_error(e: eddy_storage::LogError) -> Error {
    match &e {
        eddy_storage::LogError::Io { source, .. } if eddy_storage::is_disk_full(source) => {
            Error::disk_full(format!("could not write the log: {e}"))
        }
        _ => Error::internal(e.to_string()),
    }
}

fn task_dir(root: &Path, task: &TaskId) -> PathBuf {
    root.join(dir_name(&task.stream))
        .join(format!("{}-{}", task.partitioner, task.partition))
}

impl LocalLog {
    /// Opens the log under `dir` and starts its committer thread. Appends that are not
    /// durable are fsynced at most `commit_delay` after they were written.
    pub fn open(dir: &Path, commit_delay: Duration) -> Result<LocalLog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::internal(format!("could not create {}: {e}", dir.display())))?;
        let journal = TaskLog::open_preallocated(&dir.join(JOURNAL_DIR), JOURNAL_SEGMENT_BYTES)
            .map_err(storage_error)?;
        let journal = restore_from_journal(dir, journal)?;
        let shared = Arc::new(Shared {
            files: Mutex::new(Files {
                root: dir.to_path_buf(),
                logs: HashMap::new(),
                journal,
                unjournaled: HashSet::new(),
                sync_all: false,
                owed_since: None,
                waiting: VecDeque::new(),
                running: false,
                alone: true,
                closed: false,
            }),
            work: Condvar::new(),
            stats: LogStats::default(),
            commit_delay,
        });
        let committer = {
            let shared = shared.clone();
            std::thread::Builder::new()
                .name("eddy-log".into())
                .spawn(move || shared.commit_loop())
                .map_err(|e| Error::internal(format!("could not start the log thread: {e}")))?
        };
        Ok(LocalLog {
            dir: dir.to_path_buf(),
            shared,
            committer: Some(committer),
        })
    }

    pub fn stats(&self) -> &LogStats {
        &self.shared.stats
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

    /// Writes records to the logs of tasks, on the calling thread. `after` runs once all
    /// of them are durable (`durable`) or written (at once, on this thread, unless
    /// earlier continuations still wait), after the continuations of earlier appends.
    /// A durable append that finds the committer idle, nothing queued and the last commit
    /// alone (`Files::alone`) commits on this thread (it leads the group: appends
    /// meanwhile queue for the committer); otherwise its continuation runs on the
    /// committer after the fsync that covers it.
    pub fn append(&self, batches: Vec<(TaskId, Records)>, durable: bool, after: AfterAppend) {
        let mut files = self.shared.lock();
        if files.closed {
            drop(files);
            return after(Err(Self::closed()));
        }
        let first_owed = files.owed_since.is_none();
        let result = files.write(batches, durable, &self.shared.stats);
        // A `sync` (it fsyncs every task log) is left to the committer: its caller does
        // not block on it.
        let lead = files.alone && !files.sync_all;
        if durable && lead && files.waiting.is_empty() && !files.running {
            let owed = files.unsynced();
            files.running = true;
            drop(files);
            let mut files = self
                .shared
                .commit_then(owed, |synced| after(synced.clone().and(result)));
            files.running = false;
            // Appends that queued behind this one go to the committer (and a closing
            // log's committer waits for this one to end).
            files.alone = files.waiting.is_empty();
            let queued = !files.waiting.is_empty() || files.closed;
            drop(files);
            if queued {
                self.shared.work.notify_one();
            }
            return;
        }
        if !durable && files.waiting.is_empty() && !files.running {
            // Under the lock: the next append's continuation cannot overtake this one.
            after(result);
            drop(files);
            if first_owed {
                // The committer sleeps without a deadline while nothing is owed.
                self.shared.work.notify_one();
            }
            return;
        }
        files.waiting.push_back(Waiting {
            durable,
            after,
            result,
        });
        drop(files);
        self.shared.work.notify_one();
    }

    /// Returns once every record appended before the call is durable, in its task's log
    /// itself (the journal's older records then go).
    pub async fn sync(&self) -> Result<()> {
        self.shared.lock().sync_all = true;
        let (reply, rx) = oneshot::channel();
        self.append(
            Vec::new(),
            true,
            Box::new(move |r| {
                let _ = reply.send(r.map(|_| ()));
            }),
        );
        rx.await.map_err(|_| Self::closed())?
    }

    /// Deletes every task log of a stream (after DROP STREAM), and makes the journal
    /// forget it: the other task logs are fsynced and the journal starts anew, so that no
    /// record of the stream comes back into a stream of the same name.
    pub fn drop_stream(&self, stream: &str) -> Result<()> {
        let mut files = self.shared.lock();
        files.logs.retain(|t, _| t.stream != stream);
        files.forget_journal()?;
        let dir = files.root.join(dir_name(stream));
        match std::fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::internal(format!(
                "could not remove {}: {e}",
                dir.display()
            ))),
        }
    }

    /// Deletes a task's log segments that end before `before` (a committed checkpoint
    /// covers them).
    pub fn truncate(&self, task: &TaskId, before: u64) {
        // A failure leaves the files; the next checkpoint tries again.
        if let Ok(log) = self.shared.lock().log(task) {
            let _ = log.truncate_before(before);
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

/// A journal record: the task's directory (under the log's), the offset of the batch's
/// first record in its task log, and the batch as the task log frames it.
fn encode_entry(out: &mut Vec<u8>, task: &TaskId, first: u64, records: &Records) {
    let dir = format!(
        "{}/{}-{}",
        dir_name(&task.stream),
        task.partitioner,
        task.partition
    );
    out.extend_from_slice(&(dir.len() as u16).to_le_bytes());
    out.extend_from_slice(dir.as_bytes());
    out.extend_from_slice(&first.to_le_bytes());
    out.extend_from_slice(records.framed());
}

/// A journal record's task directory, first offset and record bodies.
fn decode_entry(bytes: &[u8]) -> Option<(&str, u64, Vec<&[u8]>)> {
    let len = u16::from_le_bytes(bytes.get(..2)?.try_into().ok()?) as usize;
    let dir = std::str::from_utf8(bytes.get(2..2 + len)?).ok()?;
    let first = u64::from_le_bytes(bytes.get(2 + len..10 + len)?.try_into().ok()?);
    let records = Records::bodies(bytes.get(10 + len..)?)?;
    Some((dir, first, records))
}

/// Copies into each task log the records the journal holds past the log's end, and
/// fsyncs what it wrote (see the module's header). A task log that ends before a
/// journal record's first offset lost written records the journal never held: nothing
/// of it from there on was acknowledged as durable, and its restore stops. Then, with
/// every task log it names synced, the journal starts anew (returned): its records past a
/// gap must not come back once new appends fill the task log past that point.
fn restore_from_journal(root: &Path, journal: TaskLog) -> Result<TaskLog> {
    let mut entries = Vec::new();
    journal
        .read_from(0, &mut |offset, bytes| entries.push((offset, bytes)))
        .map_err(storage_error)?;
    let mut logs: HashMap<String, TaskLog> = HashMap::new();
    let mut gaps: HashSet<String> = HashSet::new();
    for (offset, bytes) in &entries {
        let (dir, first, records) = decode_entry(bytes).ok_or_else(|| {
            Error::internal(format!(
                "the log journal holds an unreadable record at offset {offset}"
            ))
        })?;
        if gaps.contains(dir) {
            continue;
        }
        let path = root.join(dir);
        let log = match logs.entry(dir.to_string()) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            // The journal names no dropped stream (`drop_stream` starts it anew), so a
            // missing directory is one a crash took: made again.
            std::collections::hash_map::Entry::Vacant(e) => {
                e.insert(TaskLog::open(&path, SEGMENT_BYTES_MAX).map_err(storage_error)?)
            }
        };
        let end = log.next_offset();
        if end >= first + records.len() as u64 {
            continue;
        }
        if end < first {
            tracing::info!(
                "the log of {} ends at offset {end}, before the journal's next record at \
                 {first}: records written without being made durable were lost, and what \
                 follows them was never acknowledged",
                path.display()
            );
            gaps.insert(dir.to_string());
            continue;
        }
        let missing: Records = records[(end - first) as usize..].iter().collect();
        log.append(&missing).map_err(storage_error)?;
        tracing::info!(
            "restored {} records of {} from the log journal",
            missing.len(),
            path.display()
        );
    }
    if entries.is_empty() {
        return Ok(journal);
    }
    for log in logs.values_mut() {
        log.sync().map_err(storage_error)?;
    }
    journal.destroy().map_err(storage_error)?;
    let dir = root.join(JOURNAL_DIR);
    let journal = TaskLog::open_preallocated(&dir, JOURNAL_SEGMENT_BYTES).map_err(storage_error)?;
    eddy_storage::log::sync_dir(root).map_err(storage_error)?;
    Ok(journal)
}

/// Events replayed per batch handed to a task at start.
const REPLAY_BATCH_ROWS: usize = 8192;

impl EventLog for LocalLog {
    /// Durable first: the writer thread hands the events to the tasks after the fsync,
    /// in log order, so a task applies exactly its log's sequence. The batches are
    /// appended before this returns; the future only waits for the answers.
    fn ingest<'a>(
        &'a self,
        shards: &'a Shards,
        _stream: &'a StreamDef,
        batches: Vec<TaskBatch>,
        values: bool,
        durable: bool,
        turn: Turn,
    ) -> LogFuture<'a, Vec<Answers>> {
        let mut records = Vec::with_capacity(batches.len());
        let mut waits = Vec::with_capacity(batches.len());
        let mut deliveries = Vec::with_capacity(batches.len());
        for TaskBatch { task, rows, passes } in batches {
            let mut encoded = Records::with_capacity(rows.len(), rows.len() * 64);
            for r in &rows {
                encoded.push_with(|b| codec::encode_row(r, b));
            }
            records.push((task.clone(), encoded));
            let (reply, rx) = reply_to_caller();
            deliveries.push((task, rows, passes, reply));
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
                    for ((task, rows, passes, reply), end) in deliveries.into_iter().zip(ends) {
                        shards.deliver(task, rows, values, end, passes, reply);
                    }
                }
                Err(e) => {
                    for (_, _, _, reply) in deliveries {
                        reply(Err(e.clone()));
                    }
                }
            }),
        );
        // Appended in call order: the caller's next statement may go.
        turn.taken();
        Box::pin(Shards::answers(waits))
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
                        .ingest(task.clone(), chunk.to_vec(), false, Some(end), None)
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
                    self.drop_stream(name)?;
                }
            }
            for name in next.streams.keys() {
                if current.stream(name).is_none() {
                    self.drop_stream(name)?;
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
        self.shared.lock().closed = true;
        self.shared.work.notify_one();
        if let Some(t) = self.committer.take() {
            let _ = t.join();
        }
    }
}

impl Files {
    fn log(&mut self, task: &TaskId) -> Result<&mut TaskLog> {
        if !self.logs.contains_key(task) {
            let log = TaskLog::open(&task_dir(&self.root, task), SEGMENT_BYTES_MAX)
                .map_err(storage_error)?;
            self.logs.insert(task.clone(), log);
        }
        Ok(self.logs.get_mut(task).expect("inserted"))
    }

    /// Writes one append's records to their task logs, and a durable one's to the
    /// journal too; the task log end after each batch.
    fn write(
        &mut self,
        batches: Vec<(TaskId, Records)>,
        durable: bool,
        stats: &LogStats,
    ) -> Result<Vec<u64>> {
        if batches.is_empty() {
            return Ok(Vec::new());
        }
        // All or nothing: a write that fails (a full disk) takes back what the append
        // wrote to the other logs, so no record of a failed statement is ever replayed.
        let mut written: Vec<(TaskId, LogEnd)> = Vec::with_capacity(batches.len());
        let result = self.write_all(batches, durable, stats, &mut written);
        if result.is_err() {
            for (task, end) in written.into_iter().rev() {
                if let Some(log) = self.logs.get_mut(&task) {
                    if let Err(e) = log.rewind(end) {
                        tracing::error!("could not take back a failed append: {e}");
                    }
                }
            }
            return result;
        }
        stats.appends.fetch_add(1, Ordering::Relaxed);
        self.owed_since.get_or_insert_with(Instant::now);
        result
    }

    /// `write`'s writes, noting in `written` where each log it wrote to ended before.
    fn write_all(
        &mut self,
        batches: Vec<(TaskId, Records)>,
        durable: bool,
        stats: &LogStats,
        written: &mut Vec<(TaskId, LogEnd)>,
    ) -> Result<Vec<u64>> {
        let mut ends = Vec::with_capacity(batches.len());
        // Allocated for a durable append alone: a written one skips the journal.
        let mut journal = Records::default();
        let mut unjournaled = Vec::new();
        for (task, records) in batches {
            let log = self.log(&task)?;
            let before = log.end();
            let first = log.append(&records).map_err(storage_error)?;
            written.push((task.clone(), before));
            ends.push(log.next_offset());
            stats
                .records
                .fetch_add(records.len() as u64, Ordering::Relaxed);
            stats
                .bytes
                .fetch_add(records.framed_bytes() as u64, Ordering::Relaxed);
            if durable {
                journal.push_with(|b| encode_entry(b, &task, first, &records));
            } else {
                unjournaled.push(task);
            }
        }
        if durable {
            self.journal.append(&journal).map_err(storage_error)?;
        }
        self.unjournaled.extend(unjournaled);
        Ok(ends)
    }

    /// What an fsync must cover to make every record written so far durable: the
    /// journal and the task logs written by unjournaled appends, and with `sync_all`
    /// every task log holding writes not yet synced. With them, the journal offset the
    /// fsync covers, before which its segments may go.
    fn unsynced(&mut self) -> (Vec<Unsynced>, Option<u64>) {
        self.owed_since = None;
        let mut out: Vec<Unsynced> = self.journal.unsynced().into_iter().collect();
        let unjournaled = std::mem::take(&mut self.unjournaled);
        if !std::mem::take(&mut self.sync_all) {
            for task in unjournaled {
                out.extend(self.logs.get_mut(&task).and_then(TaskLog::unsynced));
            }
            return (out, None);
        }
        out.extend(self.logs.values_mut().filter_map(TaskLog::unsynced));
        (out, Some(self.journal.next_offset()))
    }

    /// fsyncs every task log and starts the journal anew (under the lock: nothing is
    /// written meanwhile).
    fn forget_journal(&mut self) -> Result<()> {
        for log in self.logs.values_mut() {
            log.sync().map_err(storage_error)?;
        }
        self.unjournaled.clear();
        let dir = self.root.join(JOURNAL_DIR);
        let _ = std::fs::remove_dir_all(&dir);
        self.journal =
            TaskLog::open_preallocated(&dir, JOURNAL_SEGMENT_BYTES).map_err(storage_error)?;
        eddy_storage::log::sync_dir(&self.root).map_err(storage_error)
    }

    /// How long the committer may sleep before written records are owed an fsync.
    fn owed_in(&self, delay: Duration) -> Option<Duration> {
        self.owed_since
            .map(|since| delay.saturating_sub(since.elapsed()))
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Files> {
        // A panic under the lock leaves files the next append still checks as it writes.
        self.files.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// fsyncs what was taken from the files, outside the lock (nothing: no commit).
    fn commit(&self, unsynced: Vec<Unsynced>) -> Result<()> {
        if unsynced.is_empty() {
            return Ok(());
        }
        let started = Instant::now();
        self.stats.commits.fetch_add(1, Ordering::Relaxed);
        let mut synced = Ok(());
        for u in unsynced {
            if let Err(e) = u.sync() {
                synced = Err(storage_error(e));
            }
        }
        self.stats
            .commit_micros
            .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
        synced
    }

    /// Commits what `Files::unsynced` took (outside the lock), runs `then` with the
    /// result, and takes the lock again: once every task log holds what the journal held
    /// before the offset it gave, those segments go (a failure leaves them; the next
    /// sync tries again).
    fn commit_then(
        &self,
        (unsynced, journal_done): (Vec<Unsynced>, Option<u64>),
        then: impl FnOnce(&Result<()>),
    ) -> MutexGuard<'_, Files> {
        let synced = self.commit(unsynced);
        then(&synced);
        let mut files = self.lock();
        if let (Ok(()), Some(offset)) = (&synced, journal_done) {
            let _ = files.journal.truncate_before(offset);
        }
        files
    }

    /// The committer: fsyncs what continuations wait for (group commit: one fsync for
    /// every append written before it starts) or what the commit delay owes, then runs
    /// the continuations in order.
    fn commit_loop(&self) {
        let mut files = self.lock();
        loop {
            let owed = files.owed_in(self.commit_delay);
            // A caller leading a commit runs its continuation first, and wakes the
            // committer for whatever queued behind it (`append`).
            let led = files.running;
            if led || (files.waiting.is_empty() && owed != Some(Duration::ZERO)) {
                if files.closed && !led {
                    break;
                }
                files = match owed.filter(|_| !led) {
                    None => self.work.wait(files).unwrap_or_else(|e| e.into_inner()),
                    Some(left) => {
                        self.work
                            .wait_timeout(files, left)
                            .unwrap_or_else(|e| e.into_inner())
                            .0
                    }
                };
                continue;
            }
            let waiting = std::mem::take(&mut files.waiting);
            let needs_fsync = owed == Some(Duration::ZERO) || waiting.iter().any(|w| w.durable);
            let unsynced = if needs_fsync {
                files.unsynced()
            } else {
                (Vec::new(), None)
            };
            // With none to run (an fsync the delay owed), a caller may lead meanwhile.
            let runs = !waiting.is_empty();
            files.alone = waiting.iter().filter(|w| w.durable).count() <= 1;
            files.running = runs;
            drop(files);
            files = self.commit_then(unsynced, |synced| {
                for w in waiting {
                    (w.after)(synced.clone().and(w.result));
                }
            });
            if runs {
                files.running = false;
            }
        }
        // The last writes become durable before the thread ends.
        files.sync_all = true;
        let (unsynced, _) = files.unsynced();
        drop(files);
        let _ = self.commit(unsynced);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

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
            let shared = log.shared.clone();
            move || shared.stats.commits.load(Ordering::SeqCst)
        };
        log.append(
            vec![(
                task(partition),
                records.iter().map(|r| r.as_bytes()).collect(),
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
        assert_eq!(log.stats().commits.load(Ordering::SeqCst), 2);
        drop(log);

        // With a short delay the clock makes written appends durable on its own.
        let log = LocalLog::open(&dir, Duration::from_millis(5)).unwrap();
        let mut seen = Vec::new();
        log.replay(&task(0), 0, &mut |_, r| seen.push(r)).unwrap();
        log.replay(&task(1), 0, &mut |_, r| seen.push(r)).unwrap();
        assert_eq!(seen, [b"a", b"b", b"d", b"c", b"e"].map(|r| r.to_vec()));
        append(&log, 0, &["f"], false);
        let deadline = Instant::now() + Duration::from_secs(30);
        while log.stats().commits.load(Ordering::SeqCst) == 0 {
            assert!(Instant::now() < deadline, "no fsync after the commit delay");
            std::thread::sleep(Duration::from_millis(1));
        }
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// The task logs' records of partitions 0 and 1, in order.
    fn replayed(log: &LocalLog) -> Vec<Vec<u8>> {
        let mut seen = Vec::new();
        log.replay(&task(0), 0, &mut |_, r| seen.push(r)).unwrap();
        log.replay(&task(1), 0, &mut |_, r| seen.push(r)).unwrap();
        seen
    }

    /// The segment files of a task's log.
    fn segments(dir: &Path, partition: u32) -> Vec<PathBuf> {
        let mut files: Vec<PathBuf> = std::fs::read_dir(task_dir(dir, &task(partition)))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_commit_fsyncs_the_journal_alone_and_the_journal_restores_lost_task_log_tails() {
        let dir = temp("journal");
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        append(&log, 0, &["a", "b"], true);
        append(&log, 1, &["c"], true);
        // A durable commit fsyncs only the journal: the task logs still owe theirs.
        {
            let mut files = log.shared.lock();
            let owed = files
                .logs
                .values_mut()
                .filter_map(TaskLog::unsynced)
                .count();
            assert_eq!(owed, 2, "task logs are not fsynced by a commit");
        }
        append(&log, 0, &["d"], true);
        append(&log, 1, &["e", "f"], true);
        drop(log);
        // A machine crash takes the task logs' unsynced tails (here: everything of
        // partition 1, and the last record of partition 0); the synced journal has them.
        lose_task_log(&dir, 1);
        let seg0 = segments(&dir, 0).pop().unwrap();
        let len = std::fs::metadata(&seg0).unwrap().len();
        std::fs::OpenOptions::new()
            .write(true)
            .open(&seg0)
            .unwrap()
            .set_len(len - 9)
            .unwrap();
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        let all = [b"a", b"b", b"d", b"c", b"e", b"f"].map(|r| r.to_vec());
        assert_eq!(replayed(&log), all);
        // Restoring twice changes nothing; new appends follow the restored ones.
        drop(log);
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        assert_eq!(replayed(&log), all);
        let (ends, _) = append(&log, 1, &["g"], false);
        assert_eq!(ends, vec![4]);
        // `sync` puts everything in the task logs, and the journal's older segments go.
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(log.sync())
            .unwrap();
        assert!(log
            .shared
            .lock()
            .logs
            .values_mut()
            .all(|l| l.unsynced().is_none()));
        // A dropped stream's records never come back from the journal.
        log.drop_stream("s").unwrap();
        drop(log);
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        assert!(replayed(&log).is_empty());
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Cuts a task log's segments to nothing, as a machine crash may before an fsync.
    fn lose_task_log(dir: &Path, partition: u32) {
        for seg in segments(dir, partition) {
            std::fs::OpenOptions::new()
                .write(true)
                .open(&seg)
                .unwrap()
                .set_len(0)
                .unwrap();
        }
    }

    #[test]
    fn written_appends_skip_the_journal_and_a_commit_fsyncs_their_task_logs() {
        let dir = temp("unjournaled");
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        append(&log, 0, &["a"], false);
        assert_eq!(log.shared.lock().journal.next_offset(), 0, "not journaled");
        // A durable append elsewhere: its commit fsyncs partition 0's log too, so no
        // durable record can follow a written one a crash could still take.
        append(&log, 1, &["b"], true);
        {
            let mut files = log.shared.lock();
            assert!(files.logs.get_mut(&task(0)).unwrap().unsynced().is_none());
            assert!(files.unjournaled.is_empty());
        }
        drop(log);

        // A crash took a written record the journal never held, and the durable one
        // after it (unacknowledged: its commit would have fsynced the task log). The
        // restore stops at the gap, and the journal starts anew, so that the durable
        // record never lands at another offset once new appends fill the log.
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        append(&log, 0, &["c"], false);
        append(&log, 0, &["d"], true);
        drop(log);
        lose_task_log(&dir, 0);
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        assert_eq!(replayed(&log), [b"b".to_vec()], "nothing past the gap");
        let (ends, _) = append(&log, 0, &["e"], true);
        assert_eq!(ends, vec![1]);
        drop(log);
        lose_task_log(&dir, 0);
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        assert_eq!(replayed(&log), [b"e".to_vec(), b"b".to_vec()]);
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn appends_continue_on_their_caller_unless_earlier_continuations_wait() {
        let dir = temp("order");
        let log = LocalLog::open(&dir, Duration::from_secs(3600)).unwrap();
        let ran = Arc::new(Mutex::new(Vec::new()));
        let record = |name: &'static str, pause: Duration| -> AfterAppend {
            let ran = ran.clone();
            Box::new(move |r| {
                std::thread::sleep(pause);
                ran.lock()
                    .unwrap()
                    .push((name, std::thread::current().id(), r.unwrap()));
            })
        };
        let rec = |r: &str| vec![(task(0), [r].into_iter().collect())];
        let caller = std::thread::current().id();
        // A durable append with nothing before it leads its commit on its own thread, and
        // its continuation is slow; a written and a durable append meanwhile wait their
        // turn behind it and go to the committer, so the tasks would see all three in log
        // order.
        let (started, leading) = std::sync::mpsc::channel();
        let leader = std::thread::scope(|s| {
            let leader = s.spawn(|| {
                let slow = record("leader", Duration::from_millis(50));
                log.append(
                    rec("a"),
                    true,
                    Box::new(move |r| {
                        let _ = started.send(());
                        slow(r)
                    }),
                );
                std::thread::current().id()
            });
            leading.recv().unwrap();
            log.append(rec("b"), false, record("behind", Duration::ZERO));
            log.append(rec("c"), true, record("queued", Duration::ZERO));
            leader.join().unwrap()
        });
        let deadline = Instant::now() + Duration::from_secs(30);
        while ran.lock().unwrap().len() < 3 {
            assert!(Instant::now() < deadline, "the continuations never ran");
            std::thread::sleep(Duration::from_millis(1));
        }
        // Nothing waits now: a written append continues at once, on this thread.
        log.append(rec("d"), false, record("alone", Duration::ZERO));
        let ran = ran.lock().unwrap().clone();
        let order: Vec<_> = ran.iter().map(|(n, _, ends)| (*n, ends.clone())).collect();
        assert_eq!(
            order,
            [
                ("leader", vec![1]),
                ("behind", vec![2]),
                ("queued", vec![3]),
                ("alone", vec![4])
            ]
        );
        assert_eq!(
            ran[0].1, leader,
            "the leader's continuation runs on its caller"
        );
        for queued in &ran[1..3] {
            assert!(
                queued.1 != caller && queued.1 != leader,
                "{} ran on the committer",
                queued.0
            );
        }
        assert_eq!(ran[3].1, caller, "a written append takes no thread hop");
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_fsync_owed_to_the_delay_holds_no_written_append_up() {
        let dir = temp("delay");
        // A 1 ms delay: the committer fsyncs all through the loop, with no continuation
        // of its own to run; written appends go on past it, on the caller's thread.
        let log = LocalLog::open(&dir, Duration::from_millis(1)).unwrap();
        let caller = std::thread::current().id();
        let started = Instant::now();
        let mut appends = 0u64;
        while started.elapsed() < Duration::from_millis(300)
            || log.stats().commits.load(Ordering::SeqCst) < 20
        {
            let (tx, rx) = mpsc::channel();
            log.append(
                vec![(task(0), [[b'x'; 64]].into_iter().collect())],
                false,
                Box::new(move |r| tx.send((r, std::thread::current().id())).unwrap()),
            );
            let (r, ran_on) = rx
                .try_recv()
                .expect("the continuation ran before append returned");
            r.unwrap();
            assert_eq!(ran_on, caller);
            appends += 1;
        }
        assert!(appends > 0);
        drop(log);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
