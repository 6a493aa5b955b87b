//! A node's disk: the RocksDB state store, task reservoirs, and checkpoints.
//!
//! Layout under the data directory: `state/` (the live RocksDB database),
//! `reservoir/<stream>/<partitioner>-<partition>/` (each task's chunk files),
//! `checkpoints/<n>/` (RocksDB checkpoints) and `checkpoints/CURRENT` (the name of the
//! last committed one, replaced atomically).
//!
//! Invariants: the live database may run ahead of the last checkpoint (write-through
//! caches write whenever they evict), so at start it is thrown away and rebuilt from
//! the committed checkpoint — or started empty when there is none, and the log replays
//! from its beginning; a checkpoint is committed only once `CURRENT` names it.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use eddy_planner::{Error, Result};
use eddy_storage::{Family, IoThread, ReservoirConfig, RocksConfig, RocksStore};

use crate::exec::groups::CacheConfig;
use crate::exec::task::{stable_hash, TaskStorage};
use crate::node::space::{DiskSpace, Reserve};
use crate::route::{dir_name, TaskId};

const STATE_DIR: &str = "state";
const RESERVOIR_DIR: &str = "reservoir";
const CHECKPOINT_DIR: &str = "checkpoints";
const CURRENT: &str = "CURRENT";
const TRANSFERS_DIR: &str = "transfers";

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| match eddy_storage::is_disk_full(&e) {
        true => Error::disk_full(format!("{}: {e}", path.display())),
        false => Error::internal(format!("{}: {e}", path.display())),
    }
}

/// 53100 for a store that found the disk full, XX000 otherwise.
pub fn state_error(e: eddy_storage::StateError) -> Error {
    match e.is_disk_full() {
        true => Error::disk_full(e.to_string()),
        false => Error::internal(e.to_string()),
    }
}

#[derive(Clone, Copy, Debug, Default)]
pub struct StorageConfig {
    pub reservoir: ReservoirConfig,
    pub cache: CacheConfig,
    pub rocks: RocksConfig,
    /// Space kept free on the data directory's filesystem (`node::space`).
    pub reserve: Reserve,
}

/// A node's transfer counters, for `/metrics`.
#[derive(Debug, Default)]
pub struct TransferStats {
    /// Bytes of checkpoints sent to peers.
    pub sent_bytes: std::sync::atomic::AtomicU64,
    /// Bytes received from peers, and bytes of files the node had and kept.
    pub received_bytes: std::sync::atomic::AtomicU64,
    pub reused_bytes: std::sync::atomic::AtomicU64,
    /// Checkpoints installed, and transfers rejected (checksum, order, or cut short).
    pub installed: std::sync::atomic::AtomicU64,
    pub rejected: std::sync::atomic::AtomicU64,
}

pub struct NodeStorage {
    root: PathBuf,
    pub store: Arc<RocksStore>,
    pub io: IoThread,
    pub config: StorageConfig,
    /// The number of the last committed checkpoint.
    current: std::sync::Mutex<Option<u64>>,
    /// Checkpoints sent to and received from peers.
    pub transfers: TransferStats,
    /// Free space on the data directory, and the reserve new events may not use.
    pub space: DiskSpace,
}

impl std::fmt::Debug for NodeStorage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeStorage")
            .field("root", &self.root)
            .finish()
    }
}

pub(super) fn copy_checkpoint(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        fs::remove_dir_all(to).map_err(io(to))?;
    }
    fs::create_dir_all(to).map_err(io(to))?;
    for entry in fs::read_dir(from).map_err(io(from))? {
        let path = entry.map_err(io(from))?.path();
        let target = to.join(path.file_name().expect("a file name"));
        // Table files are immutable: share them; copy the rest.
        if path.extension().is_some_and(|e| e == "sst") {
            fs::hard_link(&path, &target).map_err(io(&target))?;
        } else {
            fs::copy(&path, &target).map_err(io(&target))?;
        }
    }
    Ok(())
}

impl NodeStorage {
    /// Opens the node's storage, rebuilding the live database from the last committed
    /// checkpoint.
    pub fn open(root: &Path, config: StorageConfig) -> Result<NodeStorage> {
        let checkpoints = root.join(CHECKPOINT_DIR);
        fs::create_dir_all(&checkpoints).map_err(io(&checkpoints))?;
        let current = match fs::read_to_string(checkpoints.join(CURRENT)) {
            Ok(text) => Some(text.trim().parse::<u64>().map_err(|_| {
                Error::internal(format!(
                    "{}: unreadable",
                    checkpoints.join(CURRENT).display()
                ))
            })?),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io(&checkpoints)(e)),
        };
        let state = root.join(STATE_DIR);
        match current {
            Some(n) => copy_checkpoint(&checkpoint_dir(root, n), &state)?,
            None => {
                if state.exists() {
                    fs::remove_dir_all(&state).map_err(io(&state))?;
                }
            }
        }
        // Transfers that never finished.
        let transfers = root.join(TRANSFERS_DIR);
        if transfers.exists() {
            fs::remove_dir_all(&transfers).map_err(io(&transfers))?;
        }
        // Checkpoints that never got committed.
        for entry in fs::read_dir(&checkpoints).map_err(io(&checkpoints))? {
            let path = entry.map_err(io(&checkpoints))?.path();
            let n = path
                .file_name()
                .and_then(|n| n.to_str()?.parse::<u64>().ok());
            if n.is_some() && n != current {
                fs::remove_dir_all(&path).map_err(io(&path))?;
            }
        }
        let store = RocksStore::open_with(&state, config.rocks)
            .map_err(|e| Error::internal(e.to_string()))?;
        Ok(NodeStorage {
            root: root.to_path_buf(),
            store: Arc::new(store),
            io: IoThread::sharing("eddy-io", config.reservoir.shared_cache_bytes_max),
            config,
            current: std::sync::Mutex::new(current),
            transfers: Default::default(),
            space: DiskSpace::new(root, config.reserve),
        })
    }

    /// The storage of `task`, whose state shard `shard` writes.
    pub fn task_storage(&self, task: &TaskId, shard: usize) -> TaskStorage {
        TaskStorage {
            dir: self.reservoir_dir(task),
            reservoir: self.config.reservoir,
            io: self.io.clone(),
            store: Arc::new(self.store.writer(shard)),
            cache: self.config.cache,
            prefix: task_prefix(task),
        }
    }

    /// Where transfers of checkpoints between nodes are staged.
    pub(super) fn transfers_dir(&self) -> PathBuf {
        self.root.join(TRANSFERS_DIR)
    }

    /// The number of the last committed checkpoint, locked: no commit happens meanwhile.
    pub(super) fn current_lock(&self) -> std::sync::MutexGuard<'_, Option<u64>> {
        self.current.lock().expect("checkpoint lock")
    }

    pub(super) fn checkpoint_path(&self, n: u64) -> PathBuf {
        checkpoint_dir(&self.root, n)
    }

    /// Makes `staged` (a directory of segment files) the task's reservoir directory.
    pub fn replace_reservoir(&self, task: &TaskId, staged: &Path) -> Result<()> {
        let dir = self.reservoir_dir(task);
        match fs::remove_dir_all(&dir) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(io(&dir)(e)),
        }
        if let Some(parent) = dir.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        fs::rename(staged, &dir).map_err(io(&dir))
    }

    pub(super) fn reservoir_dir(&self, task: &TaskId) -> PathBuf {
        self.root
            .join(RESERVOIR_DIR)
            .join(dir_name(&task.stream))
            .join(format!("{}-{}", task.partitioner, task.partition))
    }

    /// Deletes a stream's reservoirs (after DROP STREAM).
    pub fn drop_stream(&self, stream: &str) -> Result<()> {
        let dir = self.root.join(RESERVOIR_DIR).join(dir_name(stream));
        match fs::remove_dir_all(&dir) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io(&dir)(e)),
        }
    }

    /// Bytes under the reservoir directory of a stream.
    pub fn reservoir_bytes(&self, stream: &str) -> u64 {
        fn walk(p: &Path) -> u64 {
            fs::read_dir(p)
                .map(|d| {
                    d.filter_map(|e| e.ok())
                        .map(|e| match e.metadata() {
                            Ok(m) if m.is_dir() => walk(&e.path()),
                            Ok(m) => m.len(),
                            Err(_) => 0,
                        })
                        .sum()
                })
                .unwrap_or(0)
        }
        walk(&self.root.join(RESERVOIR_DIR).join(dir_name(stream)))
    }

    /// Takes a RocksDB checkpoint as number `current + 1` (not yet committed).
    pub fn snapshot(&self, records: &[(Vec<u8>, Vec<u8>)]) -> Result<u64> {
        let n = self
            .current
            .lock()
            .expect("checkpoint lock")
            .map_or(1, |c| c + 1);
        let dir = checkpoint_dir(&self.root, n);
        if dir.exists() {
            fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        let records: Vec<_> = records
            .iter()
            .map(|(k, v)| (Family::Meta, k.as_slice(), Some(v.as_slice())))
            .collect();
        self.store.checkpoint(&dir, &records).map_err(state_error)?;
        Ok(n)
    }

    /// Makes checkpoint `n` the one recovery starts from, and deletes older ones.
    pub fn commit(&self, n: u64) -> Result<()> {
        let checkpoints = self.root.join(CHECKPOINT_DIR);
        let tmp = checkpoints.join("CURRENT.tmp");
        let write = || -> std::io::Result<()> {
            use std::io::Write;
            let mut f = fs::File::create(&tmp)?;
            f.write_all(format!("{n}\n").as_bytes())?;
            f.sync_all()?;
            fs::rename(&tmp, checkpoints.join(CURRENT))?;
            fs::File::open(&checkpoints)?.sync_all()
        };
        write().map_err(io(&checkpoints))?;
        let previous = self.current.lock().expect("checkpoint lock").replace(n);
        if let Some(p) = previous {
            let dir = checkpoint_dir(&self.root, p);
            fs::remove_dir_all(&dir).map_err(io(&dir))?;
        }
        Ok(())
    }

    pub fn current_checkpoint(&self) -> Option<u64> {
        *self.current.lock().expect("checkpoint lock")
    }
}

fn checkpoint_dir(root: &Path, n: u64) -> PathBuf {
    root.join(CHECKPOINT_DIR).join(format!("{n:020}"))
}

/// What a task's checkpoint record holds: the statements of its stream and metrics
/// when it was taken, and the task's own record.
pub struct TaskMeta {
    pub stream_sql: String,
    pub metric_sqls: Vec<String>,
    pub checkpoint: Vec<u8>,
}

impl TaskMeta {
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::new();
        let text = |t: &str, b: &mut Vec<u8>| {
            b.extend_from_slice(&(t.len() as u32).to_le_bytes());
            b.extend_from_slice(t.as_bytes());
        };
        text(&self.stream_sql, &mut b);
        b.extend_from_slice(&(self.metric_sqls.len() as u32).to_le_bytes());
        for m in &self.metric_sqls {
            text(m, &mut b);
        }
        b.extend_from_slice(&self.checkpoint);
        b
    }

    pub fn decode(bytes: &[u8]) -> Option<TaskMeta> {
        let mut r = eddy_planner::codec::Reader(bytes);
        let text = |r: &mut eddy_planner::codec::Reader<'_>| -> Option<String> {
            let n = r.u32()? as usize;
            String::from_utf8(r.take(n)?.to_vec()).ok()
        };
        let stream_sql = text(&mut r)?;
        let n = r.u32()? as usize;
        let mut metric_sqls = Vec::with_capacity(n.min(1024));
        for _ in 0..n {
            metric_sqls.push(text(&mut r)?);
        }
        Some(TaskMeta {
            stream_sql,
            metric_sqls,
            checkpoint: r.0.to_vec(),
        })
    }
}

/// The key prefix of a task's entries in the store.
pub fn task_prefix(task: &TaskId) -> Vec<u8> {
    stable_hash(&format!(
        "{}/{}/{}",
        task.stream, task.partitioner, task.partition
    ))
    .to_be_bytes()
    .to_vec()
}

/// The store key of a task's checkpoint record (`Family::Meta`).
pub fn task_meta_key(task: &TaskId) -> Vec<u8> {
    format!(
        "task/{}/{}/{}",
        task.stream, task.partitioner, task.partition
    )
    .into_bytes()
}
