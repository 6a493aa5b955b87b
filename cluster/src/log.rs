//! The event log tasks read from. `LocalLog` is the embedded default: one `TaskLog` per
//! task under `DATA_DIR/log/`, written by one thread that commits in groups — every
//! statement waiting when an fsync starts shares it. Kafka plays the same role in cluster
//! mode.
//!
//! Invariants: an append's continuation runs only once every record it was given is
//! durable, on the writer thread, in append order — so whatever it hands to the tasks
//! reaches them in log order; a task's log replays exactly the records appended to it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::oneshot;

use eddy_planner::{Error, Result};
use eddy_storage::log::{TaskLog, SEGMENT_BYTES_MAX};

use crate::engine::TaskId;

/// What runs after an append is durable (or failed), on the writer thread. It gets each
/// batch's task log end: the offset after the batch's last record.
pub type AfterAppend = Box<dyn FnOnce(Result<Vec<u64>>) + Send>;

enum Request {
    Append {
        batches: Vec<(TaskId, Vec<Vec<u8>>)>,
        after: AfterAppend,
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

/// A file-name-safe form of a stream name.
pub(crate) fn dir_name(stream: &str) -> String {
    let plain = !stream.is_empty()
        && stream
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if plain {
        stream.to_string()
    } else {
        let hex: String = stream.bytes().map(|b| format!("{b:02x}")).collect();
        format!("x-{hex}")
    }
}

fn task_dir(root: &Path, task: &TaskId) -> PathBuf {
    root.join(dir_name(&task.stream))
        .join(format!("{}-{}", task.partitioner, task.partition))
}

impl LocalLog {
    /// Opens the log under `dir` and starts its writer thread.
    pub fn open(dir: &Path) -> Result<LocalLog> {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::internal(format!("could not create {}: {e}", dir.display())))?;
        let (tx, rx) = mpsc::channel();
        let root = dir.to_path_buf();
        let stats = Arc::new(LogStats::default());
        let writer_stats = stats.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-log".into())
            .spawn(move || Writer::new(root, writer_stats).run(rx))
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
    /// of them are durable, after the continuations of earlier appends.
    pub fn append(&self, batches: Vec<(TaskId, Vec<Vec<u8>>)>, after: AfterAppend) {
        let sent = self
            .requests
            .as_ref()
            .map(|r| r.send(Request::Append { batches, after }));
        match sent {
            Some(Ok(())) => {}
            Some(Err(mpsc::SendError(Request::Append { after, .. }))) => after(Err(Self::closed())),
            _ => {}
        }
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

impl Drop for LocalLog {
    fn drop(&mut self) {
        drop(self.requests.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The writer thread's state: the open task logs.
struct Writer {
    root: PathBuf,
    logs: HashMap<TaskId, TaskLog>,
    stats: Arc<LogStats>,
}

impl Writer {
    fn new(root: PathBuf, stats: Arc<LogStats>) -> Writer {
        Writer {
            root,
            logs: HashMap::new(),
            stats,
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

    fn run(mut self, rx: mpsc::Receiver<Request>) {
        while let Ok(first) = rx.recv() {
            // Group commit: everything that queued up while the last fsync ran.
            let mut batch = vec![first];
            while let Ok(more) = rx.try_recv() {
                batch.push(more);
            }
            let mut waiting = Vec::new();
            let mut dirty: Vec<TaskId> = Vec::new();
            for req in batch {
                match req {
                    Request::Append { batches, after } => {
                        let mut result = Ok(Vec::with_capacity(batches.len()));
                        self.stats.appends.fetch_add(1, Ordering::Relaxed);
                        for (task, records) in batches {
                            self.stats
                                .records
                                .fetch_add(records.len() as u64, Ordering::Relaxed);
                            self.stats.bytes.fetch_add(
                                records.iter().map(|r| r.len() as u64 + 8).sum(),
                                Ordering::Relaxed,
                            );
                            let appended = self.log(&task).and_then(|l| {
                                l.append(&records).map_err(storage_error)?;
                                Ok(l.next_offset())
                            });
                            match (appended, &mut result) {
                                (Ok(end), Ok(ends)) => ends.push(end),
                                (Err(e), _) => {
                                    result = Err(e);
                                    break;
                                }
                                _ => {}
                            }
                            if !dirty.contains(&task) {
                                dirty.push(task);
                            }
                        }
                        waiting.push((after, result));
                    }
                    Request::DropStream { stream, reply } => {
                        self.logs.retain(|t, _| t.stream != stream);
                        dirty.retain(|t| t.stream != stream);
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
            let mut synced = Ok(());
            let started = Instant::now();
            if !dirty.is_empty() {
                self.stats.commits.fetch_add(1, Ordering::Relaxed);
            }
            for task in &dirty {
                if let Some(log) = self.logs.get_mut(task) {
                    if let Err(e) = log.sync() {
                        synced = Err(storage_error(e));
                    }
                }
            }
            self.stats
                .commit_micros
                .fetch_add(started.elapsed().as_micros() as u64, Ordering::Relaxed);
            for (after, result) in waiting {
                after(synced.clone().and(result));
            }
        }
    }
}
