//! Moving a task's checkpoint from one node to another: the sender's `Export` (the
//! task's part of its last committed checkpoint, pinned) and the receiver's `Import`
//! (staged on disk, checked, then installed by the task's shard).
//!
//! What travels, in this order, as `Piece`s of at most `PIECE_BYTES`: the task's
//! checkpoint record and log offset; its group states (every store entry under its key
//! prefix); then each reservoir segment file the record needs, each closed by its length
//! and CRC-32; then the number of files. A receiver that already has a prefix of a file
//! (a stale copy of the task, or one it received before) says so, and gets only the
//! rest: segment files are append-only, and replicas write the same chunks.
//!
//! Invariants: memory stays bounded on both sides (pieces stream from and to disk);
//! nothing is installed until every piece arrived in order and every checksum matched; a
//! receiver never writes outside its staging directory (file names are checked).

use std::fs::{self, File};
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use eddy_planner::{Error, Result};
use eddy_storage::{Family, FrozenStore, OwnedPut, StateError};

use crate::exec::checkpoint::Checkpoint;
use crate::node::durable::{task_meta_key, task_prefix, NodeStorage, TaskMeta};
use crate::route::TaskId;

/// The most bytes one piece carries.
pub const PIECE_BYTES: usize = 1 << 20;

/// The families that hold a task's group states.
pub const STATE_FAMILIES: [Family; 2] = [Family::Aggregates, Family::Extremes];

/// One message of a transfer.
#[derive(Clone, Debug, PartialEq)]
pub enum Piece {
    /// The task's checkpoint record (`TaskMeta`) and the log offset it resumes from.
    Header { meta: Vec<u8>, log_end: u64 },
    /// Store entries of one family: `[key len u32][key][value len u32][value]`…
    Entries { family: Family, pairs: Vec<u8> },
    /// The number of entries sent, and the CRC-32 of the family bytes and pairs.
    StateEnd { entries: u64, crc: u32 },
    /// Bytes of a segment file from `offset`.
    Data {
        name: String,
        offset: u64,
        bytes: Vec<u8>,
    },
    /// A file's whole length and CRC-32 (including a prefix the receiver had).
    FileEnd { name: String, len: u64, crc: u32 },
    /// The number of files sent.
    Done { files: u64 },
}

impl Piece {
    /// The payload bytes it carries.
    pub fn bytes(&self) -> usize {
        match self {
            Piece::Header { meta, .. } => meta.len(),
            Piece::Entries { pairs, .. } => pairs.len(),
            Piece::Data { bytes, .. } => bytes.len(),
            _ => 0,
        }
    }
}

/// A file the receiver has already: its name, length and CRC-32.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Have {
    pub name: String,
    pub len: u64,
    pub crc: u32,
}

/// A fault a sender injects on purpose, to test that receivers reject it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// One byte of the first file's data is flipped after its checksum was taken (the
    /// state's checksum is, when no file data is sent).
    Flip,
    /// The transfer stops after the first file's data, as if the connection dropped
    /// (before the state's end, when no file data is sent).
    Cut,
}

impl Fault {
    pub fn parse(text: &str) -> Option<Fault> {
        match text.trim() {
            "flip" => Some(Fault::Flip),
            "cut" => Some(Fault::Cut),
            _ => None,
        }
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::internal(format!("{}: {e}", path.display()))
}

fn state_error(e: StateError) -> Error {
    Error::internal(e.to_string())
}

/// A family's number in a transfer: its place in `Family::ALL` (`family_of` reads it).
fn family_byte(f: Family) -> u8 {
    Family::ALL
        .iter()
        .position(|&x| x == f)
        .expect("every family is in Family::ALL") as u8
}

pub fn family_of(b: u8) -> Option<Family> {
    Family::ALL.get(b as usize).copied()
}

/// A segment file's name, as the reservoir writes it: twenty digits and `.seg`.
fn valid_name(name: &str) -> bool {
    name.len() == 24 && name.ends_with(".seg") && name[..20].bytes().all(|b| b.is_ascii_digit())
}

/// The CRC-32 of the first `len` bytes of a file.
fn crc_of(path: &Path, len: u64) -> std::io::Result<crc32fast::Hasher> {
    let mut hasher = crc32fast::Hasher::new();
    let mut file = BufReader::with_capacity(PIECE_BYTES, File::open(path)?.take(len));
    let mut buf = vec![0u8; 64 << 10];
    let mut read = 0;
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
        read += n as u64;
    }
    if read != len {
        return Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("{read} bytes, expected {len}"),
        ));
    }
    Ok(hasher)
}

fn unique() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    format!(
        "{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory removed when dropped.
#[derive(Debug)]
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// A task's part of the last committed checkpoint, pinned by hard links so that newer
/// checkpoints can go on meanwhile.
pub struct Export {
    store: FrozenStore,
    prefix: Vec<u8>,
    meta: Vec<u8>,
    log_end: u64,
    /// Segment files (linked) and the bytes of each the checkpoint covers.
    files: Vec<(PathBuf, u64)>,
    /// Removed once the store above is closed (fields drop in order).
    _scratch: Scratch,
}

impl NodeStorage {
    /// Pins the task's part of the last committed checkpoint for sending; `None` when
    /// there is no checkpoint, or it has no record of the task.
    pub fn export(&self, task: &TaskId) -> Result<Option<Export>> {
        let scratch = Scratch(self.transfers_dir().join(format!("out-{}", unique())));
        let state = scratch.0.join("state");
        let reservoir = scratch.0.join("reservoir");
        fs::create_dir_all(&reservoir).map_err(io(&reservoir))?;
        // Under the checkpoint lock, the committed checkpoint and the segment files it
        // needs all exist: a commit deletes the older checkpoint only after taking the
        // lock, and chunk files outlive the checkpoint after the one that dropped them.
        {
            let current = self.current_lock();
            let Some(n) = *current else {
                return Ok(None);
            };
            super::durable::copy_checkpoint(&self.checkpoint_path(n), &state)?;
            let dir = self.reservoir_dir(task);
            if let Ok(entries) = fs::read_dir(&dir) {
                for entry in entries {
                    let path = entry.map_err(io(&dir))?.path();
                    let Some(name) = path.file_name() else {
                        continue;
                    };
                    if path.extension().is_some_and(|e| e == "seg") {
                        let to = reservoir.join(name);
                        fs::hard_link(&path, &to).map_err(io(&to))?;
                    }
                }
            }
        }
        let store = FrozenStore::open(&state).map_err(state_error)?;
        let Some(meta) = store
            .get(Family::Meta, &task_meta_key(task))
            .map_err(state_error)?
        else {
            return Ok(None);
        };
        let record = TaskMeta::decode(&meta)
            .and_then(|m| Checkpoint::decode(&m.checkpoint))
            .ok_or_else(|| Error::internal(format!("unreadable checkpoint record of {task:?}")))?;
        let files = eddy_storage::disk::checkpoint_files(&reservoir, &record.reservoir)
            .map_err(|e| Error::internal(e.to_string()))?;
        Ok(Some(Export {
            _scratch: scratch,
            store,
            prefix: task_prefix(task),
            meta,
            log_end: record.log_end,
            files,
        }))
    }

    /// The segment files the node has of a task, for asking a peer only for the rest.
    pub fn have(&self, task: &TaskId) -> Vec<Have> {
        let dir = self.reservoir_dir(task);
        let Ok(entries) = fs::read_dir(&dir) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                continue;
            };
            if !valid_name(name) {
                continue;
            }
            let Ok(len) = entry.metadata().map(|m| m.len()) else {
                continue;
            };
            if let Ok(h) = crc_of(&path, len) {
                out.push(Have {
                    name: name.to_string(),
                    len,
                    crc: h.finalize(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }
}

impl Export {
    /// The log offset the checkpoint resumes from.
    pub fn log_end(&self) -> u64 {
        self.log_end
    }

    /// Bytes the transfer would carry to a receiver with nothing.
    pub fn file_bytes(&self) -> u64 {
        self.files.iter().map(|(_, len)| len).sum()
    }

    /// Hands every piece to `send`, in order, until it returns false (the receiver
    /// left). Files the receiver has a prefix of are sent from there.
    pub fn send(
        &self,
        have: &[Have],
        fault: Option<Fault>,
        send: &mut dyn FnMut(Piece) -> bool,
    ) -> Result<()> {
        if !send(Piece::Header {
            meta: self.meta.clone(),
            log_end: self.log_end,
        }) {
            return Ok(());
        }
        let (mut entries, mut crc) = (0u64, crc32fast::Hasher::new());
        let mut stopped = false;
        for family in STATE_FAMILIES {
            let mut pairs = Vec::new();
            let mut emit = |pairs: &mut Vec<u8>, crc: &mut crc32fast::Hasher| {
                let pairs = std::mem::take(pairs);
                crc.update(&[family_byte(family)]);
                crc.update(&pairs);
                send(Piece::Entries { family, pairs })
            };
            let mut failed = false;
            self.store
                .for_prefix(family, &self.prefix, &mut |k, v| {
                    pairs.extend_from_slice(&(k.len() as u32).to_le_bytes());
                    pairs.extend_from_slice(k);
                    pairs.extend_from_slice(&(v.len() as u32).to_le_bytes());
                    pairs.extend_from_slice(v);
                    entries += 1;
                    if pairs.len() >= PIECE_BYTES && !emit(&mut pairs, &mut crc) {
                        failed = true;
                    }
                    !failed
                })
                .map_err(state_error)?;
            if failed || (!pairs.is_empty() && !emit(&mut pairs, &mut crc)) {
                stopped = true;
                break;
            }
        }
        // The receiver's prefix of a file counts if it is what we have.
        let mut starts = Vec::with_capacity(self.files.len());
        for (path, len) in &self.files {
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            let (mut start, mut crc) = (0, crc32fast::Hasher::new());
            if let Some(h) = have.iter().find(|h| h.name == name && h.len <= *len) {
                let prefix = crc_of(path, h.len).map_err(io(path))?;
                if prefix.clone().finalize() == h.crc {
                    (start, crc) = (h.len, prefix);
                }
            }
            starts.push((name, start, crc));
        }
        // A fault goes into the first file's data; a transfer without file data takes it
        // in its state instead, so an injected fault always reaches the receiver.
        let data = self
            .files
            .iter()
            .zip(&starts)
            .any(|((_, len), (_, start, _))| start < len);
        let mut fault = fault;
        let mut crc = crc.finalize();
        if !data {
            match fault.take() {
                Some(Fault::Flip) => crc ^= 1,
                Some(Fault::Cut) => return Ok(()),
                None => {}
            }
        }
        if stopped || !send(Piece::StateEnd { entries, crc }) {
            return Ok(());
        }
        for ((path, len), (name, start, mut crc)) in self.files.iter().zip(starts) {
            let mut file = File::open(path).map_err(io(path))?;
            file.seek(SeekFrom::Start(start)).map_err(io(path))?;
            let mut file = file.take(len - start);
            let mut offset = start;
            let mut sent = false;
            loop {
                let mut bytes = vec![0u8; PIECE_BYTES];
                let mut filled = 0;
                while filled < bytes.len() {
                    let n = file.read(&mut bytes[filled..]).map_err(io(path))?;
                    if n == 0 {
                        break;
                    }
                    filled += n;
                }
                if filled == 0 && sent {
                    break;
                }
                sent = true;
                bytes.truncate(filled);
                crc.update(&bytes);
                let n = bytes.len() as u64;
                match fault {
                    Some(Fault::Flip) if filled > 0 => {
                        bytes[filled / 2] ^= 0x40;
                        fault = None;
                    }
                    Some(Fault::Cut) => {
                        send(Piece::Data {
                            name,
                            offset,
                            bytes,
                        });
                        return Ok(());
                    }
                    _ => {}
                }
                if !send(Piece::Data {
                    name: name.clone(),
                    offset,
                    bytes,
                }) {
                    return Ok(());
                }
                offset += n;
            }
            if offset != *len {
                return Err(Error::internal(format!(
                    "{}: {offset} bytes, the checkpoint needs {len}",
                    path.display()
                )));
            }
            if !send(Piece::FileEnd {
                name,
                len: *len,
                crc: crc.finalize(),
            }) {
                return Ok(());
            }
        }
        send(Piece::Done {
            files: self.files.len() as u64,
        });
        Ok(())
    }
}

/// The receiving side of a transfer: pieces are checked and staged on disk.
pub struct Import {
    scratch: Scratch,
    /// The node's own reservoir directory of the task, for the prefixes it had.
    local: PathBuf,
    state: BufWriter<File>,
    header: Option<(Vec<u8>, u64)>,
    entries: u64,
    crc: crc32fast::Hasher,
    state_done: bool,
    file: Option<Receiving>,
    files: u64,
    done: bool,
    /// Bytes received, and bytes of files the node had already.
    pub received: u64,
    pub reused: u64,
}

struct Receiving {
    name: String,
    out: BufWriter<File>,
    crc: crc32fast::Hasher,
    len: u64,
}

fn rejected(why: impl std::fmt::Display) -> Error {
    Error::internal(format!("a checkpoint transfer was rejected: {why}"))
}

impl NodeStorage {
    /// Starts receiving a task's checkpoint, staged in a directory of its own.
    pub fn import(&self, task: &TaskId) -> Result<Import> {
        let scratch = Scratch(self.transfers_dir().join(format!("in-{}", unique())));
        let reservoir = scratch.0.join("reservoir");
        fs::create_dir_all(&reservoir).map_err(io(&reservoir))?;
        let path = scratch.0.join("state.bin");
        let state = File::create(&path).map_err(io(&path))?;
        Ok(Import {
            scratch,
            local: self.reservoir_dir(task),
            state: BufWriter::with_capacity(PIECE_BYTES, state),
            header: None,
            entries: 0,
            crc: crc32fast::Hasher::new(),
            state_done: false,
            file: None,
            files: 0,
            done: false,
            received: 0,
            reused: 0,
        })
    }
}

impl Import {
    /// Takes the next piece; any piece out of order, or a checksum that does not match,
    /// rejects the transfer.
    pub fn accept(&mut self, piece: Piece) -> Result<()> {
        self.received += piece.bytes() as u64;
        if self.done {
            return Err(rejected("a piece after the end"));
        }
        match piece {
            Piece::Header { meta, log_end } => {
                if self.header.is_some() {
                    return Err(rejected("a second header"));
                }
                TaskMeta::decode(&meta)
                    .and_then(|m| Checkpoint::decode(&m.checkpoint))
                    .filter(|c| c.log_end == log_end)
                    .ok_or_else(|| rejected("an unreadable checkpoint record"))?;
                self.header = Some((meta, log_end));
            }
            Piece::Entries { family, pairs } => {
                if self.header.is_none() || self.state_done || family == Family::Meta {
                    return Err(rejected("store entries out of order"));
                }
                let n = count_pairs(&pairs).ok_or_else(|| rejected("unreadable entries"))?;
                self.entries += n;
                self.crc.update(&[family_byte(family)]);
                self.crc.update(&pairs);
                let path = self.scratch.0.join("state.bin");
                let mut write = || -> std::io::Result<()> {
                    self.state.write_all(&[family_byte(family)])?;
                    self.state.write_all(&(pairs.len() as u32).to_le_bytes())?;
                    self.state.write_all(&pairs)
                };
                write().map_err(io(&path))?;
            }
            Piece::StateEnd { entries, crc } => {
                if self.header.is_none() || self.state_done {
                    return Err(rejected("the end of the state out of order"));
                }
                let ours = std::mem::replace(&mut self.crc, crc32fast::Hasher::new()).finalize();
                if entries != self.entries || crc != ours {
                    return Err(rejected(format!(
                        "the state's checksum does not match ({} entries, {entries} sent)",
                        self.entries
                    )));
                }
                self.state_done = true;
            }
            Piece::Data {
                name,
                offset,
                bytes,
            } => {
                if !self.state_done || !valid_name(&name) {
                    return Err(rejected("file data out of order"));
                }
                let file = match &mut self.file {
                    Some(f) if f.name == name => f,
                    Some(_) => return Err(rejected("a file that was not closed")),
                    None => {
                        let f = self.open_file(&name, offset)?;
                        self.file.insert(f)
                    }
                };
                if offset != file.len {
                    return Err(rejected(format!(
                        "{name}: data at {offset}, expected {}",
                        file.len
                    )));
                }
                file.crc.update(&bytes);
                file.len += bytes.len() as u64;
                let path = self.scratch.0.join(&name);
                file.out.write_all(&bytes).map_err(io(&path))?;
            }
            Piece::FileEnd { name, len, crc } => {
                let file = match self.file.take() {
                    Some(f) if f.name == name => f,
                    _ => return Err(rejected("the end of a file that was not sent")),
                };
                if file.len != len || file.crc.finalize() != crc {
                    return Err(rejected(format!("{name}: the checksum does not match")));
                }
                let path = self.scratch.0.join("reservoir").join(&name);
                let mut out = file
                    .out
                    .into_inner()
                    .map_err(|e| io(&path)(e.into_error()))?;
                out.flush().map_err(io(&path))?;
                self.files += 1;
            }
            Piece::Done { files } => {
                if !self.state_done || self.file.is_some() || files != self.files {
                    return Err(rejected("the transfer ended early"));
                }
                self.done = true;
            }
        }
        Ok(())
    }

    /// A staged file, starting with the node's own first `offset` bytes of it.
    fn open_file(&mut self, name: &str, offset: u64) -> Result<Receiving> {
        let path = self.scratch.0.join("reservoir").join(name);
        let mut crc = crc32fast::Hasher::new();
        if offset > 0 {
            let local = self.local.join(name);
            crc = crc_of(&local, offset)
                .map_err(|e| rejected(format!("{name}: the prefix sent for is gone: {e}")))?;
            fs::copy(&local, &path).map_err(io(&path))?;
            let f = fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(io(&path))?;
            f.set_len(offset).map_err(io(&path))?;
            self.reused += offset;
        }
        let out = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(io(&path))?;
        Ok(Receiving {
            name: name.to_string(),
            out: BufWriter::with_capacity(PIECE_BYTES, out),
            crc,
            len: offset,
        })
    }

    /// The staged checkpoint, once every piece arrived and checked.
    pub fn finish(mut self) -> Result<Staged> {
        if !self.done {
            return Err(rejected("the transfer ended early"));
        }
        let path = self.scratch.0.join("state.bin");
        self.state.flush().map_err(io(&path))?;
        let (meta, log_end) = self.header.take().expect("checked");
        Ok(Staged {
            meta,
            log_end,
            entries: self.entries,
            received: self.received,
            reused: self.reused,
            scratch: self.scratch,
        })
    }
}

fn count_pairs(pairs: &[u8]) -> Option<u64> {
    let mut r = eddy_planner::codec::Reader(pairs);
    let mut n = 0;
    while !r.0.is_empty() {
        let k = r.u32()? as usize;
        r.take(k)?;
        let v = r.u32()? as usize;
        r.take(v)?;
        n += 1;
    }
    Some(n)
}

/// A checked checkpoint on disk, waiting for its task's shard to install it.
#[derive(Debug)]
pub struct Staged {
    pub meta: Vec<u8>,
    pub log_end: u64,
    pub entries: u64,
    pub received: u64,
    pub reused: u64,
    scratch: Scratch,
}

impl Staged {
    /// The staged segment files.
    pub fn reservoir(&self) -> PathBuf {
        self.scratch.0.join("reservoir")
    }

    /// The staged store entries, in batches of about `PIECE_BYTES`.
    pub fn batches(
        &self,
    ) -> Result<impl FnMut() -> std::result::Result<Option<Vec<OwnedPut>>, StateError>> {
        let path = self.scratch.0.join("state.bin");
        let mut file = BufReader::with_capacity(PIECE_BYTES, File::open(&path).map_err(io(&path))?);
        Ok(move || {
            let bad = |e: std::io::Error| StateError(format!("a staged transfer: {e}"));
            let mut head = [0u8; 5];
            match file.read_exact(&mut head) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
                Err(e) => return Err(bad(e)),
            }
            let family = family_of(head[0]).ok_or_else(|| StateError("a staged family".into()))?;
            let len = u32::from_le_bytes(head[1..].try_into().expect("4 bytes")) as usize;
            let mut pairs = vec![0u8; len];
            file.read_exact(&mut pairs).map_err(bad)?;
            let mut r = eddy_planner::codec::Reader(&pairs);
            let mut batch = Vec::new();
            while !r.0.is_empty() {
                let entry = (|| {
                    let k = r.u32()? as usize;
                    let k = r.take(k)?.to_vec();
                    let v = r.u32()? as usize;
                    let v = r.take(v)?.to_vec();
                    Some((family, k, Some(v)))
                })()
                .ok_or_else(|| StateError("a staged entry".into()))?;
                batch.push(entry);
            }
            Ok(Some(batch))
        })
    }
}
