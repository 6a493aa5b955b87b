//! The disk-backed reservoir: recent events in memory, older ones in immutable,
//! compressed chunk files, read back through a byte-bounded cache that an IO thread fills
//! ahead of the readers.
//!
//! Layout: `<dir>/<first chunk number>.seg` segment files, each a run of chunks
//! (`chunk.rs`). Chunks are numbered in the order they were sealed; a segment rolls over
//! at `segment_bytes_max`.
//!
//! Invariants:
//! - every sealed event's key is below every key in the open (in-memory) region, and
//!   chunks are in key order, so a range read is chunks then the open region;
//! - the in-memory index holds one small entry per chunk, never per event, so memory does
//!   not grow with what is stored;
//! - the event path never waits for a disk read it could have foreseen: reading chunk i
//!   asks the IO thread for chunk i + 1, which is where a window edge goes next;
//! - the event path never encodes, compresses or writes a chunk: sealing hands the
//!   chunk's events to the IO thread, which writes chunks in number order, and reads take
//!   them from memory until the write is done (at most `UNWRITTEN_MAX` chunks wait);
//! - a checkpoint mark names exactly the chunks written before it, and holds the events
//!   of the ones still on their way as open events; reopening with it cuts everything
//!   written later (the log replays those events), and a file is deleted only
//!   when a checkpoint that no longer needs it has been committed.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc, Mutex};

use crate::chunk::{
    check_payload, decode_batch, encode_chunk, ChunkHeader, Compression, Compressor, Key,
    HEADER_BYTES,
};
use crate::reservoir::{
    ChunkCodec, Durable, MemReservoir, Owed, PendingMark, Reservoir, ReservoirError,
    ReservoirStats, Timed,
};

#[derive(Clone, Copy, Debug)]
pub struct ReservoirConfig {
    /// Approximate in-memory bytes of the events sealed into one chunk.
    pub chunk_bytes_max: usize,
    pub segment_bytes_max: u64,
    /// Bytes of decoded chunks kept in memory: by default `CACHED_CHUNKS` chunks.
    pub cache_bytes_max: usize,
    /// Bytes of decoded chunks the reservoirs of a node may keep beyond their own
    /// `cache_bytes_max`, together (`SharedCache`): by default `SHARED_CACHE_BYTES`.
    pub shared_cache_bytes_max: usize,
    /// Whether chunks are compressed with LZ4: by default where it pays.
    pub compression: Compression,
}

/// Chunks the default cache holds. A delayed window reads with two scans, its head and
/// its tail, each in its chunk and `PREFETCH_CHUNKS` ahead, while the newest written
/// chunk is cached too. At four, the read-ahead pushed out the chunk both scans were
/// in, and the tail missed nearly every chunk (`a_delayed_windows_scans_find_their_chunks`).
const CACHED_CHUNKS: usize = 8;

/// The default of `ReservoirConfig::shared_cache_bytes_max`. A 1-day window of the
/// memory bench (`bench/memory.sh`: 5 M events over 30 days, 100 k keys) holds about
/// 30 MB of events, which its tail then finds decoded; a longer window keeps this much
/// of what its tail reaches next. The node's peak RSS grows by at most this much, with
/// any number of tasks and any window.
pub const SHARED_CACHE_BYTES: usize = 48 << 20;

impl Default for ReservoirConfig {
    fn default() -> Self {
        let chunk_bytes_max = 512 << 10;
        ReservoirConfig {
            chunk_bytes_max,
            segment_bytes_max: 64 << 20,
            cache_bytes_max: CACHED_CHUNKS * chunk_bytes_max,
            shared_cache_bytes_max: SHARED_CACHE_BYTES,
            compression: Compression::Auto,
        }
    }
}

type Job = Box<dyn FnOnce() + Send>;

/// A background thread that runs reads and chunk writes for reservoirs (one per node),
/// and the cache they share.
#[derive(Clone)]
pub struct IoThread {
    jobs: mpsc::Sender<Job>,
    shared: Arc<SharedCache>,
}

/// Bytes of decoded chunks that the reservoirs of one node keep beyond their own cache
/// (`ReservoirConfig::cache_bytes_max`), first come, first served. A reservoir borrows
/// for chunks a scan will still read (`Cached::victim_rank`), never for one every scan
/// passed, and gives the bytes back as it drops chunks: so a long window's tail finds
/// decoded the chunks written within the last tens of megabytes, while memory stays
/// bounded by the node, not by the number of tasks or their windows.
struct SharedCache {
    max: usize,
    used: std::sync::atomic::AtomicUsize,
}

impl SharedCache {
    /// Takes `bytes` if they are free.
    fn borrow(&self, bytes: usize) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.used
            .fetch_update(Relaxed, Relaxed, |used| {
                (used + bytes <= self.max).then_some(used + bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: usize) {
        self.used
            .fetch_sub(bytes, std::sync::atomic::Ordering::Relaxed);
    }
}

impl IoThread {
    /// Starts the thread, with no cache to share; it ends when the last handle is dropped.
    pub fn start(name: &str) -> IoThread {
        IoThread::sharing(name, 0)
    }

    /// Starts the thread, with `shared_cache_bytes` for its reservoirs to share.
    pub fn sharing(name: &str, shared_cache_bytes: usize) -> IoThread {
        let (jobs, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                while let Ok(job) = rx.recv() {
                    job();
                }
            })
            .expect("spawn IO thread");
        IoThread {
            jobs,
            shared: Arc::new(SharedCache {
                max: shared_cache_bytes,
                used: Default::default(),
            }),
        }
    }

    /// Queues `job`; gives it back when the thread is gone.
    fn run(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|e| e.0)
    }
}

fn err(message: impl Into<String>) -> ReservoirError {
    ReservoirError(message.into())
}

fn io_err(path: &Path, e: std::io::Error) -> ReservoirError {
    err(format!("{}: {e}", path.display()))
}

#[derive(Clone, Debug)]
struct ChunkRef {
    number: u64,
    first: Key,
    last: Key,
    rows: u32,
    /// Where it is written; `None` while its write is on the way (its events are in
    /// `DiskReservoir::unwritten`).
    placed: Option<Placed>,
}

/// A chunk's place in its segment file.
#[derive(Clone, Copy, Debug)]
struct Placed {
    /// The id of the segment holding it (its first chunk number).
    segment: u64,
    offset: u64,
    header: ChunkHeader,
}

/// A sealed chunk whose write is not done: its events serve reads meanwhile.
struct Unwritten<E> {
    number: u64,
    events: Arc<Vec<E>>,
    bytes: usize,
    /// Whether a write of it is queued (a full disk sends it back to be tried again).
    submitted: bool,
}

/// Chunks sealed but not yet written, at most: sealing waits for the oldest beyond it,
/// so memory stays bounded when the disk is slower than the events.
const UNWRITTEN_MAX: usize = 4;

/// The segment file chunks are appended to. Only the IO thread writes through it (or
/// the shard, without an IO thread); a checkpoint takes a handle to sync.
struct SegmentWriter {
    dir: PathBuf,
    segment_bytes_max: u64,
    file: Option<File>,
    /// The id of the segment `file` is, and its bytes.
    segment: u64,
    bytes: u64,
    /// The number of the next chunk to write: chunks reach the disk in order, so after a
    /// failed one the later ones wait for it.
    next: u64,
}

/// A chunk the IO thread wrote.
struct Written {
    segment: u64,
    offset: u64,
    header: ChunkHeader,
}

impl Written {
    /// Bytes the chunk takes in its segment.
    fn len(&self) -> u64 {
        HEADER_BYTES as u64 + self.header.payload_len as u64
    }
}

enum WriteError {
    /// An earlier chunk is not written yet; this one goes again after it.
    Skipped,
    /// The disk is full: the chunk stays in memory and is written later.
    Full(PathBuf, std::io::Error),
    Failed(String),
}

type WriteResult = Result<Written, WriteError>;

impl SegmentWriter {
    /// Appends chunk `number`'s bytes to the segment, or to a new one when it would grow
    /// past its size. All or nothing: a failed write is cut off again (and a segment it
    /// started is removed), so the chunk can be written later.
    fn write(&mut self, number: u64, header: ChunkHeader, bytes: &[u8]) -> WriteResult {
        if number != self.next {
            return Err(WriteError::Skipped);
        }
        let failed = |path: &Path, e: std::io::Error| match crate::is_disk_full(&e) {
            true => WriteError::Full(path.to_path_buf(), e),
            false => WriteError::Failed(format!("{}: {e}", path.display())),
        };
        let len = bytes.len() as u64;
        let roll =
            self.file.is_none() || (self.bytes > 0 && self.bytes + len > self.segment_bytes_max);
        if roll {
            if let Some(f) = &self.file {
                f.sync_data().map_err(|e| failed(&self.dir, e))?;
            }
            let path = segment_path(&self.dir, number);
            let file = OpenOptions::new()
                .create(true)
                .truncate(true)
                .write(true)
                .open(&path)
                .map_err(|e| failed(&path, e))?;
            (self.file, self.segment, self.bytes) = (Some(file), number, 0);
        }
        let path = segment_path(&self.dir, self.segment);
        let file = self.file.as_mut().expect("a segment file");
        if let Err(e) = file.write_all(bytes) {
            // Back to where the chunk began; the next write goes there too.
            let cut = file
                .set_len(self.bytes)
                .and_then(|()| file.seek(SeekFrom::Start(self.bytes)).map(|_| ()));
            if let Err(cut) = cut {
                tracing::error!("{}: could not cut a failed write: {cut}", path.display());
            }
            if roll {
                // The segment before it is written no more: the next write rolls again.
                self.file = None;
                let _ = fs::remove_file(&path);
            }
            return Err(failed(&path, e));
        }
        let offset = self.bytes;
        self.bytes += len;
        self.next += 1;
        Ok(Written {
            segment: self.segment,
            offset,
            header,
        })
    }
}

/// Chunk `events` (in key order) as a header and the bytes written to a segment.
fn encode_events<E: Timed>(
    events: &[E],
    codec: &dyn ChunkCodec<E>,
    compressor: &Compressor,
) -> Result<(ChunkHeader, Vec<u8>), String> {
    let (Some(first), Some(last)) = (events.first(), events.last()) else {
        return Err("an empty chunk".into());
    };
    let refs: Vec<&E> = events.iter().collect();
    let batch = codec.encode(&refs)?;
    encode_chunk(
        &batch,
        compressor,
        codec.schema_id(),
        first.key(),
        last.key(),
    )
}

#[derive(Debug)]
struct Segment {
    id: u64,
    path: PathBuf,
    bytes: u64,
}

struct Cached<E> {
    events: Arc<Vec<E>>,
    bytes: usize,
    used: u64,
    /// Read ahead and not used yet: given up last. Newly written chunks would otherwise
    /// push a long window's read-ahead chunks out before its tail reaches them.
    ahead: bool,
}

impl<E> Cached<E> {
    /// Where chunk `number` comes in the order the cache gives chunks up (the least
    /// first), with scans stopped in the chunks `scans` (`DiskReservoir::hints`).
    ///
    /// A window's scans move forward through the chunks at the pace events arrive, so the
    /// chunk read again last is the one farthest ahead of the nearest scan before it: the
    /// cache gives that one up first (as the optimal policy does), and first of all a
    /// chunk with no scan before it, least recently used first. So a long window's tail
    /// finds the oldest chunks written still decoded (the newest are given up instead,
    /// where least recently used gave up exactly the ones it reached next), and a delayed
    /// window keeps the chunks its head reaches next rather than those it read, which
    /// its tail reaches only a window later. `false` in the second place: no scan will
    /// read it.
    fn victim_rank(&self, number: u64, scans: &[u64]) -> (bool, bool, u64, u64) {
        let ahead_of_scan = scans
            .iter()
            .filter(|s| **s <= number)
            .map(|s| number - s)
            .min();
        match ahead_of_scan {
            None => (self.ahead, false, 0, self.used),
            Some(d) => (self.ahead, true, u64::MAX - d, self.used),
        }
    }
}

type Loaded<E> = (u64, u64, Result<(Arc<Vec<E>>, usize), String>);

/// What a checkpoint of the reservoir records.
struct Mark {
    next_chunk: u64,
    last_segment: u64,
    last_segment_bytes: u64,
    floor: i64,
    open: Vec<u8>,
}

const MARK_VERSION: u8 = 1;

/// `DiskReservoir::sealable` before anything was measured.
const UNMEASURED: (usize, usize, i64) = (0, 0, i64::MIN);

impl Mark {
    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(33 + self.open.len());
        b.push(MARK_VERSION);
        b.extend_from_slice(&self.next_chunk.to_le_bytes());
        b.extend_from_slice(&self.last_segment.to_le_bytes());
        b.extend_from_slice(&self.last_segment_bytes.to_le_bytes());
        b.extend_from_slice(&self.floor.to_le_bytes());
        b.extend_from_slice(&self.open);
        b
    }

    fn decode(b: &[u8]) -> Option<Mark> {
        if b.len() < 33 || b[0] != MARK_VERSION {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        Some(Mark {
            next_chunk: u64_at(1),
            last_segment: u64_at(9),
            last_segment_bytes: u64_at(17),
            floor: u64_at(25) as i64,
            open: b[33..].to_vec(),
        })
    }
}

pub struct DiskReservoir<E> {
    dir: PathBuf,
    config: ReservoirConfig,
    codec: Arc<dyn ChunkCodec<E>>,
    compressor: Arc<Compressor>,
    /// Bumped when the codec changes: decodes from an older codec are discarded.
    generation: u64,
    chunks: VecDeque<ChunkRef>,
    next_chunk: u64,
    segments: VecDeque<Segment>,
    writer: Arc<Mutex<SegmentWriter>>,
    /// Sealed chunks whose writes are not done, oldest first: the newest chunks.
    unwritten: VecDeque<Unwritten<E>>,
    /// Writes queued whose results have not come back.
    writes_inflight: usize,
    written_tx: mpsc::Sender<(u64, WriteResult)>,
    written_rx: mpsc::Receiver<(u64, WriteResult)>,
    /// A write that failed for a reason other than a full disk: every later seal and
    /// checkpoint reports it.
    write_failure: Option<String>,
    open: MemReservoir<E>,
    /// `size_of` summed over the open region.
    open_bytes: usize,
    /// The open region's leading events at or below the last `seal_through` bound, already
    /// measured: (count, bytes, bound). No event is inserted among them any more, so the
    /// next call measures on from there.
    sealable: (usize, usize, i64),
    /// Events with `ts <= floor` have expired.
    floor: i64,
    sealed_events: u64,
    raw_bytes: u64,
    /// Bytes of the live chunks (headers and payloads) in their segment files.
    chunk_bytes: u64,
    cache: HashMap<u64, Cached<E>>,
    cache_bytes: usize,
    /// Of `cache_bytes`, what is borrowed from the node's `SharedCache`.
    borrowed: usize,
    /// The chunk the latest scan entered last: a scan the cache keeps chunks for
    /// (`fit_cache`) while it has no hint (one in progress took it from `hints`, and one
    /// that ended with its chunk left none).
    scanned: Option<u64>,
    tick: u64,
    io: Option<IoThread>,
    inflight: HashSet<u64>,
    loaded_tx: mpsc::Sender<Loaded<E>>,
    loaded_rx: mpsc::Receiver<Loaded<E>>,
    /// Segments no longer read, deleted once a checkpoint without them is committed.
    dead: Vec<PathBuf>,
    /// Segments dead before the last checkpoint: safe to delete at the next one.
    dead_at_checkpoint: Vec<PathBuf>,
    /// Whether files changed since the last checkpoint synced them: an idle task's
    /// checkpoint costs no fsync.
    unsynced: bool,
    /// When a chunk last found the disk full: sealing waits `SEAL_RETRY` before trying
    /// again, and the open region holds the events meanwhile.
    seal_blocked: Option<std::time::Instant>,
    /// Set when the fsyncs a checkpoint handed out failed: the next one syncs again.
    sync_failed: Arc<std::sync::atomic::AtomicBool>,
    hits: u64,
    misses: u64,
    prefetched: u64,
    /// Where the last scans that ended inside a chunk stopped, oldest first: a window's
    /// tail edge scans on from there, so an event that leaves costs no search, no cache
    /// lookup and no reference count.
    hints: Vec<ScanHint<E>>,
}

/// How long sealing rests after a chunk found the disk full.
const SEAL_RETRY: std::time::Duration = std::time::Duration::from_millis(500);

/// Scan hints kept: the tail edges of a few windows.
const SCAN_HINTS: usize = 4;

/// Chunks past the one a scan enters that the IO thread reads ahead. One was too few:
/// queued behind chunk writes on a busy machine, the next chunk's read often came after
/// the tail reached it.
const PREFETCH_CHUNKS: usize = 2;

/// A scan's stopping place: the first event above `bound`, at `index` of chunk `number`
/// (whose events it holds: chunks never change, and a hint is used only after checking
/// that the chunk is still live, the codec the same, and the events around it).
struct ScanHint<E> {
    bound: i64,
    number: u64,
    generation: u64,
    index: usize,
    events: Arc<Vec<E>>,
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("{id:020}.seg"))
}

/// Segment files in `dir`, by id.
fn list_segments(dir: &Path) -> Result<Vec<(u64, PathBuf)>, ReservoirError> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).map_err(|e| io_err(dir, e))? {
        let path = entry.map_err(|e| io_err(dir, e))?.path();
        let id = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_suffix(".seg"))
            .and_then(|n| n.parse::<u64>().ok());
        if let Some(id) = id {
            out.push((id, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The segment files a reservoir checkpoint `mark` needs, each with the bytes of it
/// the mark covers, oldest first: what a peer recovering the task must receive. The
/// segments the checkpoint left for retention to delete are not among them.
pub fn checkpoint_files(dir: &Path, mark: &[u8]) -> Result<Vec<(PathBuf, u64)>, ReservoirError> {
    let mark = Mark::decode(mark).ok_or_else(|| {
        err(format!(
            "{}: unreadable reservoir checkpoint mark",
            dir.display()
        ))
    })?;
    if mark.next_chunk == 0 {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for (id, path) in list_segments(dir)? {
        if id > mark.last_segment {
            continue;
        }
        let len = if id == mark.last_segment {
            mark.last_segment_bytes
        } else {
            fs::metadata(&path).map_err(|e| io_err(&path, e))?.len()
        };
        // A segment whose newest chunk is at or below the floor holds nothing live.
        if id < mark.last_segment && last_key_of(&path, len)?.is_some_and(|t| t <= mark.floor) {
            continue;
        }
        out.push((path, len));
    }
    Ok(out)
}

/// The event time of the last chunk in the first `limit` bytes of a segment.
fn last_key_of(path: &Path, limit: u64) -> Result<Option<i64>, ReservoirError> {
    let mut file = File::open(path).map_err(|e| io_err(path, e))?;
    let mut header = [0u8; HEADER_BYTES];
    let (mut offset, mut last) = (0u64, None);
    while offset < limit {
        file.seek(SeekFrom::Start(offset))
            .map_err(|e| io_err(path, e))?;
        let h = file
            .read_exact(&mut header)
            .ok()
            .and_then(|_| ChunkHeader::decode(&header))
            .ok_or_else(|| {
                err(format!(
                    "{}: no valid chunk header at byte {offset}",
                    path.display()
                ))
            })?;
        last = Some(h.last.0);
        offset += HEADER_BYTES as u64 + h.payload_len as u64;
    }
    Ok(last)
}

/// Reads and checks chunk `number`'s payload, then decodes it.
fn read_chunk<E>(
    path: &Path,
    number: u64,
    chunk: &Placed,
    codec: &dyn ChunkCodec<E>,
) -> Result<(Arc<Vec<E>>, usize), String> {
    let mut file = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    file.seek(SeekFrom::Start(chunk.offset + HEADER_BYTES as u64))
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut payload = vec![0u8; chunk.header.payload_len as usize];
    file.read_exact(&mut payload)
        .map_err(|e| format!("{}: chunk {number} is cut short: {e}", path.display()))?;
    let batch = check_payload(&chunk.header, &payload).map_err(|e| {
        format!(
            "{}: chunk {number} at byte {}: {e}",
            path.display(),
            chunk.offset
        )
    })?;
    let events = codec
        .decode(&batch)
        .map_err(|e| format!("{}: chunk {number}: {e}", path.display()))?;
    let bytes = events.iter().map(|e| codec.size_of(e)).sum();
    Ok((Arc::new(events), bytes))
}

impl<E: Timed + Clone + Send + Sync + 'static> DiskReservoir<E> {
    /// Opens the reservoir in `dir`. Without a mark everything on disk is discarded (the
    /// log replays it); with the mark of a committed checkpoint the reservoir holds
    /// exactly what it held then.
    pub fn open(
        dir: &Path,
        config: ReservoirConfig,
        codec: Arc<dyn ChunkCodec<E>>,
        io: Option<IoThread>,
        mark: Option<&[u8]>,
    ) -> Result<DiskReservoir<E>, ReservoirError> {
        fs::create_dir_all(dir).map_err(|e| io_err(dir, e))?;
        let (loaded_tx, loaded_rx) = mpsc::channel();
        let (written_tx, written_rx) = mpsc::channel();
        let mut r = DiskReservoir {
            dir: dir.to_path_buf(),
            config,
            codec,
            compressor: Arc::new(Compressor::new(config.compression)),
            generation: 0,
            chunks: VecDeque::new(),
            next_chunk: 0,
            segments: VecDeque::new(),
            writer: Arc::new(Mutex::new(SegmentWriter {
                dir: dir.to_path_buf(),
                segment_bytes_max: config.segment_bytes_max,
                file: None,
                segment: 0,
                bytes: 0,
                next: 0,
            })),
            unwritten: VecDeque::new(),
            writes_inflight: 0,
            written_tx,
            written_rx,
            write_failure: None,
            open: MemReservoir::default(),
            open_bytes: 0,
            sealable: UNMEASURED,
            floor: i64::MIN,
            sealed_events: 0,
            raw_bytes: 0,
            chunk_bytes: 0,
            cache: HashMap::new(),
            cache_bytes: 0,
            borrowed: 0,
            scanned: None,
            tick: 0,
            io,
            inflight: HashSet::new(),
            loaded_tx,
            loaded_rx,
            dead: Vec::new(),
            dead_at_checkpoint: Vec::new(),
            unsynced: true,
            seal_blocked: None,
            sync_failed: Default::default(),
            hits: 0,
            misses: 0,
            prefetched: 0,
            hints: Vec::new(),
        };
        let files = list_segments(dir)?;
        let Some(mark) = mark else {
            for (_, path) in files {
                fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
            }
            return Ok(r);
        };
        let mark = Mark::decode(mark).ok_or_else(|| {
            err(format!(
                "{}: unreadable reservoir checkpoint mark",
                dir.display()
            ))
        })?;
        // Segments below the first one left were dropped by retention.
        r.next_chunk = files
            .iter()
            .find(|(id, _)| *id <= mark.last_segment)
            .map_or(0, |(id, _)| *id);
        for (id, path) in files {
            if id > mark.last_segment || mark.next_chunk == 0 {
                // Sealed after the checkpoint: the log replays these events.
                fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
                continue;
            }
            let mut file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            let len = file.metadata().map_err(|e| io_err(&path, e))?.len();
            let limit = if id == mark.last_segment {
                if len < mark.last_segment_bytes {
                    return Err(err(format!(
                        "{}: {len} bytes, but the checkpoint recorded {}",
                        path.display(),
                        mark.last_segment_bytes
                    )));
                }
                file.set_len(mark.last_segment_bytes)
                    .map_err(|e| io_err(&path, e))?;
                mark.last_segment_bytes
            } else {
                len
            };
            let mut offset = 0u64;
            let mut header = [0u8; HEADER_BYTES];
            while offset < limit {
                file.seek(SeekFrom::Start(offset))
                    .map_err(|e| io_err(&path, e))?;
                let header = file
                    .read_exact(&mut header)
                    .ok()
                    .and_then(|_| ChunkHeader::decode(&header))
                    .filter(|h| offset + HEADER_BYTES as u64 + h.payload_len as u64 <= limit)
                    .ok_or_else(|| {
                        err(format!(
                            "{}: no valid chunk header at byte {offset}",
                            path.display()
                        ))
                    })?;
                let number = r.next_chunk;
                if offset == 0 && number != id {
                    return Err(err(format!(
                        "{}: chunk {number} follows chunk {}",
                        path.display(),
                        r.next_chunk
                    )));
                }
                r.sealed_events += header.rows as u64;
                r.raw_bytes += header.raw_bytes;
                r.chunk_bytes += HEADER_BYTES as u64 + header.payload_len as u64;
                r.chunks.push_back(ChunkRef {
                    number,
                    first: header.first,
                    last: header.last,
                    rows: header.rows,
                    placed: Some(Placed {
                        segment: id,
                        offset,
                        header,
                    }),
                });
                r.next_chunk += 1;
                offset += HEADER_BYTES as u64 + header.payload_len as u64;
            }
            r.segments.push_back(Segment {
                id,
                path,
                bytes: limit,
            });
        }
        if r.next_chunk != mark.next_chunk {
            return Err(err(format!(
                "{}: {} chunks on disk, but the checkpoint recorded {}",
                dir.display(),
                r.next_chunk,
                mark.next_chunk
            )));
        }
        if let Some(last) = r.segments.back() {
            let file = OpenOptions::new()
                .append(true)
                .open(&last.path)
                .map_err(|e| io_err(&last.path, e))?;
            let mut w = r.writer.lock().expect("segment writer");
            (w.file, w.segment, w.bytes) = (Some(file), last.id, last.bytes);
        }
        r.writer.lock().expect("segment writer").next = r.next_chunk;
        if !mark.open.is_empty() {
            let batch = decode_batch(&mark.open)
                .map_err(|e| err(format!("{}: checkpointed events: {e}", dir.display())))?;
            for e in r.codec.decode(&batch).map_err(err)? {
                r.insert(e);
            }
        }
        r.expire_through(mark.floor)?;
        // The mark is committed, so nothing below its floor is needed any more.
        for path in r.dead.drain(..) {
            fs::remove_file(&path).map_err(|e| io_err(&path, e))?;
        }
        Ok(r)
    }

    /// Remembers a scan's place, forgetting the oldest past `SCAN_HINTS`.
    fn push_hint(&mut self, hint: ScanHint<E>) {
        if self.hints.len() == SCAN_HINTS {
            self.hints.remove(0);
        }
        self.hints.push(hint);
    }

    /// Takes the remembered place of the first event above `bound`, if it still is that,
    /// with the index of its chunk.
    fn take_hint(&mut self, bound: i64) -> Option<(usize, ScanHint<E>)> {
        let at = self.hints.iter().position(|h| h.bound == bound)?;
        let h = self.hints.remove(at);
        if h.generation != self.generation {
            return None;
        }
        // Chunks are numbered in order and leave from the front only.
        let i = h.number.checked_sub(self.chunks.front()?.number)? as usize;
        if self.chunks.get(i)?.number != h.number {
            return None;
        }
        let above = h.events.get(h.index)?.key().0 > bound;
        let before = h.index == 0 || h.events[h.index - 1].key().0 <= bound;
        (above && before).then_some((i, h))
    }

    /// Takes the decodes the IO thread finished.
    fn collect_loaded(&mut self) {
        while let Ok(loaded) = self.loaded_rx.try_recv() {
            self.take_loaded(loaded);
        }
    }

    /// Caches a decode the IO thread finished, if its chunk is still live and read by the
    /// same codec.
    fn take_loaded(&mut self, (number, generation, result): Loaded<E>) {
        self.inflight.remove(&number);
        let live = self.chunks.front().is_some_and(|c| c.number <= number);
        if let (true, true, Ok((events, bytes))) = (generation == self.generation, live, result) {
            self.prefetched += 1;
            self.cache_insert(number, events, bytes, true);
        }
    }

    /// Waits for the IO thread's read of chunk `number`, if one was asked for, rather than
    /// decoding it a second time on this thread: on a machine with few cores the decode
    /// it would repeat is the CPU the task needs. Returns once it arrived (cached, unless
    /// it failed or went stale meanwhile).
    fn await_loaded(&mut self, number: u64) {
        while self.inflight.contains(&number) {
            match self.loaded_rx.recv() {
                Ok(loaded) => self.take_loaded(loaded),
                // The IO thread is gone: the caller reads the chunk itself.
                Err(_) => {
                    self.inflight.clear();
                    return;
                }
            }
        }
    }

    fn cache_insert(&mut self, number: u64, events: Arc<Vec<E>>, bytes: usize, ahead: bool) {
        self.tick += 1;
        if let Some(old) = self.cache.insert(
            number,
            Cached {
                events,
                bytes,
                used: self.tick,
                ahead,
            },
        ) {
            self.cache_bytes -= old.bytes;
        }
        self.cache_bytes += bytes;
        self.fit_cache(number);
    }

    /// Drops cached chunks other than `keep` until the cache fits in its own bytes and
    /// what it may borrow from the node's shared cache, in `Cached::victim_rank`'s order;
    /// it borrows only for chunks a scan will still read. Then gives back what it no
    /// longer needs.
    fn fit_cache(&mut self, keep: u64) {
        // Where scans are; nothing here moves them.
        let scans: Vec<u64> = (self.hints.iter().map(|h| h.number))
            .chain(self.scanned)
            .collect();
        while self.cache_bytes > self.config.cache_bytes_max + self.borrowed {
            let over = self.cache_bytes - self.config.cache_bytes_max - self.borrowed;
            let victim = self
                .cache
                .iter()
                .filter(|(n, _)| **n != keep)
                .map(|(n, c)| (c.victim_rank(*n, &scans), *n))
                .min();
            // A chunk some scan will read is worth borrowing for; one none will is not.
            let useful = victim.is_none_or(|((ahead, read, _, _), _)| ahead || read);
            if useful && self.io.as_ref().is_some_and(|io| io.shared.borrow(over)) {
                self.borrowed += over;
                break;
            }
            // Only `keep` left: it stays, as the one chunk a cache always holds.
            let Some((_, victim)) = victim else { break };
            let c = self.cache.remove(&victim).expect("cached");
            self.cache_bytes -= c.bytes;
            self.drop_aside(c.events);
        }
        self.give_back_spare();
    }

    /// Gives back to the node's shared cache what this cache no longer holds.
    fn give_back_spare(&mut self) {
        let needed = self.cache_bytes.saturating_sub(self.config.cache_bytes_max);
        let spare = self.borrowed.saturating_sub(needed);
        if let (Some(io), true) = (&self.io, spare > 0) {
            io.shared.give_back(spare);
            self.borrowed -= spare;
        }
    }

    /// Drops `events` on the IO thread, which decoded most of them: freeing a chunk's
    /// rows one by one took a tenth of a shard's time under a 7-day window, on the
    /// shard's own thread.
    fn drop_aside(&self, events: Arc<Vec<E>>) {
        if let Some(io) = &self.io {
            // Gone only with the IO thread, when the job drops it here.
            let _ = io.run(Box::new(move || drop(events)));
        }
    }

    /// The events of the chunk at index `i`: from memory while its write is on the way,
    /// else from the cache or the disk; asks the IO thread for the next `PREFETCH_CHUNKS`.
    fn chunk_events(&mut self, i: usize) -> Result<Arc<Vec<E>>, ReservoirError> {
        self.collect_written();
        let number = self.chunks[i].number;
        self.await_loaded(number);
        if let Some(events) = self.events_at_hand(i) {
            return Ok(events);
        }
        let placed = self.chunks[i]
            .placed
            .expect("an unwritten chunk keeps its events");
        self.misses += 1;
        let path = segment_path(&self.dir, placed.segment);
        let (events, bytes) =
            read_chunk(&path, number, &placed, self.codec.as_ref()).map_err(err)?;
        self.cache_insert(number, events.clone(), bytes, false);
        self.read_ahead(i);
        Ok(events)
    }

    /// The events of the chunk at index `i` if they are in memory (on their way to disk,
    /// or decoded in the cache), with no wait and no read; the next chunks are then
    /// asked for (`PREFETCH_CHUNKS`).
    fn events_at_hand(&mut self, i: usize) -> Option<Arc<Vec<E>>> {
        self.collect_loaded();
        let number = self.chunks[i].number;
        let events = match self.chunks[i].placed {
            None => self
                .unwritten
                .iter()
                .find(|u| u.number == number)
                .map(|u| u.events.clone()),
            Some(_) => self.cache.get_mut(&number).map(|c| {
                self.tick += 1;
                c.used = self.tick;
                c.ahead = false;
                c.events.clone()
            }),
        }?;
        self.hits += 1;
        self.read_ahead(i);
        Some(events)
    }

    fn read_ahead(&mut self, i: usize) {
        for next in i + 1..=i + PREFETCH_CHUNKS {
            self.prefetch(next);
        }
    }

    /// Asks the IO thread to read and decode the chunk at index `i` into the cache, if
    /// it is on disk and neither cached nor asked for already.
    fn prefetch(&mut self, i: usize) {
        let Some((number, placed)) = self.chunks.get(i).and_then(|c| Some((c.number, c.placed?)))
        else {
            return;
        };
        let Some(io) = &self.io else { return };
        if self.cache.contains_key(&number) || self.inflight.contains(&number) {
            return;
        }
        let path = segment_path(&self.dir, placed.segment);
        let codec = self.codec.clone();
        let tx = self.loaded_tx.clone();
        let generation = self.generation;
        self.inflight.insert(number);
        let queued = io.run(Box::new(move || {
            let result = read_chunk(&path, number, &placed, codec.as_ref());
            let _ = tx.send((number, generation, result));
        }));
        if queued.is_err() {
            self.inflight.remove(&number);
        }
    }

    /// Makes `events` (in key order, all below the open region, `size` by the codec's
    /// measure) the next chunk, and queues its write.
    fn seal(&mut self, events: Vec<E>, size: usize) {
        let (Some(first), Some(last)) = (events.first(), events.last()) else {
            return;
        };
        let number = self.next_chunk;
        self.next_chunk += 1;
        self.sealed_events += events.len() as u64;
        self.chunks.push_back(ChunkRef {
            number,
            first: first.key(),
            last: last.key(),
            rows: events.len() as u32,
            placed: None,
        });
        self.unwritten.push_back(Unwritten {
            number,
            events: Arc::new(events),
            bytes: size,
            submitted: false,
        });
        self.submit(self.unwritten.len() - 1);
    }

    /// Queues the write of the unwritten chunk at index `k`: encoding, compression and
    /// the write run on the IO thread (here, without one).
    fn submit(&mut self, k: usize) {
        let u = &mut self.unwritten[k];
        u.submitted = true;
        let (number, events) = (u.number, u.events.clone());
        let (codec, writer) = (self.codec.clone(), self.writer.clone());
        let compressor = self.compressor.clone();
        let tx = self.written_tx.clone();
        let job: Job = Box::new(move || {
            let result = encode_events(&events, codec.as_ref(), &compressor)
                .map_err(WriteError::Failed)
                .and_then(|(header, bytes)| {
                    let mut w = writer.lock().unwrap_or_else(|p| p.into_inner());
                    w.write(number, header, &bytes)
                });
            let _ = tx.send((number, result));
        });
        self.writes_inflight += 1;
        let job = match &self.io {
            Some(io) => io.run(job).err(),
            None => Some(job),
        };
        if let Some(job) = job {
            job();
        }
    }

    /// Takes the results of the writes that are done.
    fn collect_written(&mut self) {
        while let Ok((number, result)) = self.written_rx.try_recv() {
            self.on_written(number, result);
        }
    }

    /// Waits for the next write's result.
    fn wait_written(&mut self) {
        if let Ok((number, result)) = self.written_rx.recv() {
            self.on_written(number, result);
        }
    }

    fn on_written(&mut self, number: u64, result: WriteResult) {
        self.writes_inflight -= 1;
        let w = match result {
            Ok(w) => w,
            // Its turn comes after the one that failed, which is sent again.
            Err(WriteError::Skipped) => return,
            Err(WriteError::Full(path, e)) => {
                if self.seal_blocked.is_none() {
                    tracing::warn!(
                        "{}: {e}; the reservoir keeps its events in memory until there is room",
                        path.display()
                    );
                }
                self.seal_blocked = Some(std::time::Instant::now());
                // This chunk and every later one go again, in order.
                for u in &mut self.unwritten {
                    u.submitted = false;
                }
                return;
            }
            Err(WriteError::Failed(e)) => {
                self.write_failure.get_or_insert(e);
                return;
            }
        };
        debug_assert_eq!(self.unwritten.front().map(|u| u.number), Some(number));
        let Some(u) = self.unwritten.pop_front() else {
            return;
        };
        self.seal_blocked = None;
        self.unsynced = true;
        if self.segments.back().is_none_or(|s| s.id != w.segment) {
            self.segments.push_back(Segment {
                id: w.segment,
                path: segment_path(&self.dir, w.segment),
                bytes: 0,
            });
        }
        self.segments.back_mut().expect("a segment").bytes = w.offset + w.len();
        // Unless retention dropped it meanwhile.
        let Some(front) = self.chunks.front().map(|c| c.number) else {
            return;
        };
        let Some(chunk) = number
            .checked_sub(front)
            .and_then(|i| self.chunks.get_mut(i as usize))
        else {
            return;
        };
        chunk.placed = Some(Placed {
            segment: w.segment,
            offset: w.offset,
            header: w.header,
        });
        self.raw_bytes += w.header.raw_bytes;
        self.chunk_bytes += w.len();
        // Short windows read the newest chunk soon, and long ones the oldest kept: keep it
        // decoded (`Cached::victim_rank`).
        self.cache_insert(number, u.events, u.bytes, false);
    }

    /// Waits until every queued write has come back (for tests, and before dropping).
    pub fn settle(&mut self) {
        while self.writes_inflight > 0 {
            self.wait_written();
        }
    }

    fn check_writes(&self) -> Result<(), ReservoirError> {
        match &self.write_failure {
            Some(e) => Err(err(e.clone())),
            None => Ok(()),
        }
    }
}

impl<E> Drop for DiskReservoir<E> {
    /// Writes still queued finish first, so nothing writes a segment file after its
    /// reservoir is gone (another may open the directory next).
    fn drop(&mut self) {
        while self.writes_inflight > 0 && self.written_rx.recv().is_ok() {
            self.writes_inflight -= 1;
        }
        if let Some(io) = &self.io {
            io.shared.give_back(self.borrowed);
        }
    }
}

impl<E: Timed + Clone + Send + Sync + 'static> Reservoir<E> for DiskReservoir<E> {
    fn insert(&mut self, event: E) {
        debug_assert!(self.chunks.back().is_none_or(|c| c.last < event.key()));
        self.open_bytes += self.codec.size_of(&event);
        if event.key().0 <= self.sealable.2 {
            self.sealable = UNMEASURED;
        }
        self.open.insert(event);
    }

    fn for_range(
        &mut self,
        after: i64,
        upto: i64,
        f: &mut dyn FnMut(&E),
    ) -> Result<(), ReservoirError> {
        let after = after.max(self.floor);
        if upto <= after {
            return Ok(());
        }
        let mut hinted = self.take_hint(after);
        let mut i = match &hinted {
            Some((i, _)) => *i,
            None => self.chunks.partition_point(|c| c.last.0 <= after),
        };
        while i < self.chunks.len() && self.chunks[i].first.0 <= upto {
            let (events, start) = match hinted.take() {
                Some((_, h)) => (h.events, h.index),
                None => {
                    self.scanned = Some(self.chunks[i].number);
                    let events = self.chunk_events(i)?;
                    let start = events.partition_point(|e| e.key().0 <= after);
                    (events, start)
                }
            };
            for (j, e) in events[start..].iter().enumerate() {
                if e.key().0 > upto {
                    // Every later event (the open region's too) is above `upto`.
                    self.push_hint(ScanHint {
                        bound: upto,
                        number: self.chunks[i].number,
                        generation: self.generation,
                        index: start + j,
                        events,
                    });
                    return Ok(());
                }
                f(e);
            }
            i += 1;
        }
        self.open.scan(after, upto, f);
        Ok(())
    }

    /// From the place a scan that stopped at `after` remembered in its chunk (no read,
    /// no search), else from the open region when every chunk is at or before `after`.
    fn upcoming(&mut self, after: i64, n: usize) -> &[E] {
        let hint = self
            .hints
            .iter()
            .rposition(|h| h.bound == after && h.generation == self.generation);
        match hint {
            Some(k) => {
                let h = &self.hints[k];
                let rest = h.events.get(h.index..).unwrap_or_default();
                &rest[..n.min(rest.len())]
            }
            // No scan stopped there (one ended with a chunk): the next chunk, if at hand,
            // is where the next scan starts, and it takes this place as its hint; past
            // every chunk, the open region. As `for_range` reads: nothing at or below
            // the floor.
            None => {
                let after = after.max(self.floor);
                let i = self.chunks.partition_point(|c| c.last.0 <= after);
                if i == self.chunks.len() {
                    return self.open.upcoming(after, n);
                }
                let Some(events) = self.events_at_hand(i) else {
                    return &[];
                };
                let index = events.partition_point(|e| e.key().0 <= after);
                self.push_hint(ScanHint {
                    bound: after,
                    number: self.chunks[i].number,
                    generation: self.generation,
                    index,
                    events,
                });
                let h = self.hints.last().expect("pushed");
                &h.events[h.index..(h.index + n).min(h.events.len())]
            }
        }
    }

    fn refresh(&mut self, codec: Option<Arc<dyn ChunkCodec<E>>>, f: &mut dyn FnMut(&mut E)) {
        if let Some(codec) = codec {
            self.codec = codec;
        }
        self.generation += 1;
        self.hints.clear();
        self.cache.clear();
        self.cache_bytes = 0;
        self.give_back_spare();
        self.sealable = UNMEASURED;
        // A write on the way keeps the events it took; what reads see from now is these.
        for u in &mut self.unwritten {
            Arc::make_mut(&mut u.events).iter_mut().for_each(&mut *f);
            let codec = &self.codec;
            u.bytes = u.events.iter().map(|e| codec.size_of(e)).sum();
        }
        self.open.refresh(None, f);
        // `f` may have changed the events (rows padded after ADD COLUMN), and the codec
        // may measure them differently: what sealing subtracts must be what was counted.
        let codec = &self.codec;
        self.open_bytes = self.open.iter().map(|e| codec.size_of(e)).sum();
    }

    fn seal_through(&mut self, upto: i64) -> Result<(), ReservoirError> {
        self.collect_written();
        self.check_writes()?;
        // A full disk: try again a little later, not on every event, and seal nothing
        // more until a write succeeds (the open region holds the events meanwhile).
        if let Some(at) = self.seal_blocked {
            if at.elapsed() >= SEAL_RETRY {
                for k in 0..self.unwritten.len() {
                    if !self.unwritten[k].submitted {
                        self.submit(k);
                    }
                }
            }
            return Ok(());
        }
        if upto < self.sealable.2 {
            self.sealable = UNMEASURED;
        }
        while self.open_bytes >= self.config.chunk_bytes_max {
            // Memory on the way to disk stays bounded: wait for the oldest write.
            while self.unwritten.len() >= UNWRITTEN_MAX {
                if self.writes_inflight == 0 || self.seal_blocked.is_some() {
                    return self.check_writes();
                }
                self.wait_written();
            }
            let (mut n, mut bytes, _) = self.sealable;
            for e in self.open.iter().skip(n) {
                if e.key().0 > upto || bytes >= self.config.chunk_bytes_max {
                    break;
                }
                bytes += self.codec.size_of(e);
                n += 1;
            }
            if bytes < self.config.chunk_bytes_max {
                self.sealable = (n, bytes, upto);
                return Ok(());
            }
            self.sealable = UNMEASURED;
            let events = self.open.pop_front(n);
            self.open_bytes -= bytes;
            self.seal(events, bytes);
        }
        Ok(())
    }

    fn expire_through(&mut self, upto: i64) -> Result<(), ReservoirError> {
        self.floor = self.floor.max(upto);
        while let Some(c) = self.chunks.front() {
            if c.last.0 > self.floor {
                break;
            }
            let c = self.chunks.pop_front().expect("front");
            self.sealed_events -= c.rows as u64;
            if let Some(p) = c.placed {
                self.raw_bytes -= p.header.raw_bytes;
                self.chunk_bytes -= HEADER_BYTES as u64 + p.header.payload_len as u64;
            }
            if let Some(cached) = self.cache.remove(&c.number) {
                self.cache_bytes -= cached.bytes;
            }
        }
        self.give_back_spare();
        let front = self.chunks.front().map(|c| c.number);
        self.hints.retain(|h| front.is_some_and(|f| f <= h.number));
        self.scanned = self.scanned.filter(|n| front.is_some_and(|f| f <= *n));
        // A segment is dead when no live chunk is in it and it is not being written.
        while self.segments.len() > 1
            && self
                .chunks
                .front()
                .and_then(|c| c.placed)
                .is_none_or(|p| p.segment != self.segments[0].id)
        {
            let s = self.segments.pop_front().expect("front");
            self.dead.push(s.path);
        }
        let codec = &self.codec;
        self.sealable = UNMEASURED;
        let mut dropped = 0;
        self.open
            .drain_through(self.floor, |e| dropped += codec.size_of(e));
        self.open_bytes -= dropped;
        Ok(())
    }

    fn len(&self) -> usize {
        self.sealed_events as usize + self.open.len()
    }

    fn stats(&self) -> ReservoirStats {
        ReservoirStats {
            events: self.len() as u64,
            chunks: self.chunks.len() as u64,
            segments: self.segments.len() as u64,
            disk_bytes: self.segments.iter().map(|s| s.bytes).sum(),
            raw_bytes: self.raw_bytes,
            chunk_bytes: self.chunk_bytes,
            cache_hits: self.hits,
            cache_misses: self.misses,
            prefetched: self.prefetched,
            cache_bytes: self.cache_bytes as u64,
        }
    }

    fn checkpoint(&mut self, previous_committed: bool) -> Result<PendingMark, ReservoirError> {
        self.collect_written();
        self.check_writes()?;
        let mut durable = Durable::default();
        if self.unsynced
            || self
                .sync_failed
                .swap(false, std::sync::atomic::Ordering::SeqCst)
        {
            durable = Durable(Some(Owed {
                // The segment being written; one it rolled over from was synced then.
                file: match &self.writer.lock().unwrap_or_else(|p| p.into_inner()).file {
                    Some(f) => Some(f.try_clone().map_err(|e| io_err(&self.dir, e))?),
                    None => None,
                },
                dir: self.dir.clone(),
                failed: self.sync_failed.clone(),
            }));
            self.unsynced = false;
        }
        // The previous checkpoint is committed: what it no longer needed can go. If it
        // failed, the one before it (which recovery would start from) may still read
        // them: they wait for a checkpoint that commits.
        if previous_committed {
            for path in std::mem::take(&mut self.dead_at_checkpoint) {
                match fs::remove_file(&path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&path, e)),
                }
                self.unsynced = true;
            }
        }
        let dead = std::mem::take(&mut self.dead);
        self.dead_at_checkpoint.extend(dead);
        let (last_segment, last_segment_bytes) =
            self.segments.back().map_or((0, 0), |s| (s.id, s.bytes));
        // The chunks written so far; the events of those on the way are open events.
        let mark = Mark {
            next_chunk: self.unwritten.front().map_or(self.next_chunk, |u| u.number),
            last_segment,
            last_segment_bytes,
            floor: self.floor,
            open: Vec::new(),
        };
        // The open events are shared, not copied; encoding them is the costly part.
        let unwritten = self.unwritten.iter().flat_map(|u| u.events.iter());
        let open: Vec<E> = unwritten.chain(self.open.iter()).cloned().collect();
        let (codec, compressor) = (self.codec.clone(), self.compressor.clone());
        Ok(PendingMark::new(durable, move || {
            let open = if open.is_empty() {
                Vec::new()
            } else {
                let open: Vec<&E> = open.iter().collect();
                compressor
                    .payload(&codec.encode(&open).map_err(err)?)
                    .map_err(err)?
            };
            Ok(Mark { open, ..mark }.encode())
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Array, Int64Array, RecordBatch, UInt64Array};

    #[derive(Debug, Clone, PartialEq)]
    struct Ev(i64, u64, i64);

    impl Timed for Ev {
        fn key(&self) -> (i64, u64) {
            (self.0, self.1)
        }
    }

    struct EvCodec;

    impl ChunkCodec<Ev> for EvCodec {
        fn schema_id(&self) -> u32 {
            1
        }
        fn encode(&self, events: &[&Ev]) -> Result<RecordBatch, String> {
            RecordBatch::try_from_iter(vec![
                (
                    "ts",
                    Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.0))) as _,
                ),
                (
                    "seq",
                    Arc::new(UInt64Array::from_iter_values(events.iter().map(|e| e.1))) as _,
                ),
                (
                    "v",
                    Arc::new(Int64Array::from_iter_values(events.iter().map(|e| e.2))) as _,
                ),
            ])
            .map_err(|e| e.to_string())
        }
        fn decode(&self, batch: &RecordBatch) -> Result<Vec<Ev>, String> {
            let col = |i: usize| batch.column(i).clone();
            let ts = col(0);
            let ts = ts.as_any().downcast_ref::<Int64Array>().ok_or("ts")?;
            let seq = col(1);
            let seq = seq.as_any().downcast_ref::<UInt64Array>().ok_or("seq")?;
            let v = col(2);
            let v = v.as_any().downcast_ref::<Int64Array>().ok_or("v")?;
            Ok((0..ts.len())
                .map(|i| Ev(ts.value(i), seq.value(i), v.value(i)))
                .collect())
        }
        fn size_of(&self, _: &Ev) -> usize {
            24
        }
    }

    fn config() -> ReservoirConfig {
        ReservoirConfig {
            chunk_bytes_max: 24 * 50,
            segment_bytes_max: 4096,
            cache_bytes_max: 24 * 200,
            ..ReservoirConfig::default()
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("eddy-disk-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn open(dir: &Path, io: &IoThread, mark: Option<&[u8]>) -> DiskReservoir<Ev> {
        open_with(dir, io, mark, Compression::default())
    }

    fn open_with(
        dir: &Path,
        io: &IoThread,
        mark: Option<&[u8]>,
        compression: Compression,
    ) -> DiskReservoir<Ev> {
        let config = ReservoirConfig {
            compression,
            ..config()
        };
        DiskReservoir::open(dir, config, Arc::new(EvCodec), Some(io.clone()), mark).unwrap()
    }

    fn collect(r: &mut DiskReservoir<Ev>, a: i64, b: i64) -> Vec<Ev> {
        let mut out = Vec::new();
        r.for_range(a, b, &mut |e| out.push(e.clone())).unwrap();
        out
    }

    /// Events 0 to 1999 of `Ev`, sealed and written: 40 chunks of 50 events. Returns the
    /// next event time.
    fn forty_chunks_on_disk(r: &mut DiskReservoir<Ev>) -> i64 {
        for t in 0..2000 {
            r.insert(Ev(t, t as u64, t));
        }
        r.seal_through(1999).unwrap();
        r.settle();
        2000
    }

    /// `forty_chunks_on_disk`, none of them cached: written long ago, or before a restart.
    fn forty_chunks_long_written(r: &mut DiskReservoir<Ev>) -> i64 {
        let t = forty_chunks_on_disk(r);
        r.cache.clear();
        r.cache_bytes = 0;
        r.give_back_spare();
        t
    }

    /// `EvCodec`, counting its decodes.
    #[derive(Default)]
    struct Counting(std::sync::atomic::AtomicUsize);

    impl Counting {
        fn decodes(&self) -> usize {
            self.0.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    impl ChunkCodec<Ev> for Counting {
        fn schema_id(&self) -> u32 {
            EvCodec.schema_id()
        }
        fn encode(&self, events: &[&Ev]) -> Result<RecordBatch, String> {
            EvCodec.encode(events)
        }
        fn decode(&self, batch: &RecordBatch) -> Result<Vec<Ev>, String> {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            EvCodec.decode(batch)
        }
        fn size_of(&self, e: &Ev) -> usize {
            EvCodec.size_of(e)
        }
    }

    /// A long window's tail reads chunks sealed long before. (a) When it reaches a chunk
    /// whose read ahead is still held up on the IO thread, it waits for that read rather
    /// than reading the chunk again on the task's thread. (b) While new chunks are sealed
    /// faster than it reads (five per chunk it reads) and go into the cache, the chunks
    /// read ahead stay cached until it reaches them. Either way, only its first chunk is
    /// a cache miss.
    #[test]
    fn a_long_windows_tail_finds_its_chunks_read_ahead() {
        let dir = temp_dir("ahead");
        let io = IoThread::start("test-io");
        let codec = Arc::new(Counting::default());
        let mut r =
            DiskReservoir::open(&dir, config(), codec.clone(), Some(io.clone()), None).unwrap();
        let ev = |t: i64| Ev(t, t as u64, t);
        let mut t = forty_chunks_long_written(&mut r);
        // (a) The IO thread is held while the tail enters chunk 0 (read here, a miss) and
        // asks for the chunks after it, then for 50 ms more.
        let (release, gate) = mpsc::channel::<()>();
        assert!(io
            .run(Box::new(move || {
                let _ = gate.recv();
            }))
            .is_ok());
        let mut seen = collect(&mut r, -1, 0);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(50));
            let _ = release.send(());
        });
        seen.extend(collect(&mut r, 0, 50));
        releaser.join().unwrap();
        assert_eq!(r.stats().cache_misses, 1, "{:?}", r.stats());
        // (b) The tail goes on, one event at a time, behind chunks sealed five times as fast.
        for tail in 51..500 {
            for _ in 0..5 {
                r.insert(ev(t));
                t += 1;
            }
            r.seal_through(t - 1).unwrap();
            seen.extend(collect(&mut r, tail - 1, tail));
        }
        assert_eq!(seen, (0..500).map(ev).collect::<Vec<_>>());
        let stats = r.stats();
        assert_eq!(stats.cache_misses, 1, "{stats:?}");
        // Ten chunks read, and at most the read-ahead past the last one: none twice.
        let decodes = codec.decodes();
        assert!(decodes <= 10 + PREFETCH_CHUNKS, "{decodes} decodes");
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A scan that ends with its chunk's last event leaves no place inside a chunk, yet
    /// the events after it are at hand once the read-ahead decoded the next chunk:
    /// `upcoming` offers them, and the next scan starts where they are, with no read.
    #[test]
    fn upcoming_crosses_into_a_chunk_read_ahead() {
        let dir = temp_dir("upcoming");
        let io = IoThread::start("test-io");
        let mut r = DiskReservoir::open(&dir, config(), Arc::new(EvCodec), Some(io), None).unwrap();
        let ev = |t: i64| Ev(t, t as u64, t);
        forty_chunks_long_written(&mut r);
        // Chunk 0 is events 0..=49: read here, a miss, which asks for chunks 1 and 2.
        assert_eq!(collect(&mut r, -1, 49), (0..50).map(ev).collect::<Vec<_>>());
        let next = r.chunks[1].number;
        r.await_loaded(next);
        assert_eq!(
            r.upcoming(49, 10),
            &(50..60).map(ev).collect::<Vec<_>>()[..]
        );
        assert_eq!(
            collect(&mut r, 49, 59),
            (50..60).map(ev).collect::<Vec<_>>()
        );
        // The scan stopped inside chunk 1: its place is the hint, as before.
        assert_eq!(r.upcoming(59, 3), &(60..63).map(ev).collect::<Vec<_>>()[..]);
        assert_eq!(r.stats().cache_misses, 1, "{:?}", r.stats());
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A delayed window's head and tail, 30 events apart, scan old chunks one event at a
    /// time while new events are sealed behind them at the same pace (each new chunk is
    /// cached as it is written). With the default cache of `CACHED_CHUNKS` chunks, only
    /// the first chunk read is a miss.
    #[test]
    fn a_delayed_windows_scans_find_their_chunks() {
        let dir = temp_dir("delayed");
        let io = IoThread::start("test-io");
        // 50 events of 24 bytes: a chunk just over its limit, as real chunks are.
        let chunk_bytes_max = 24 * 50 - 1;
        let config = ReservoirConfig {
            chunk_bytes_max,
            segment_bytes_max: 4096,
            cache_bytes_max: CACHED_CHUNKS * chunk_bytes_max,
            ..ReservoirConfig::default()
        };
        let mut r =
            DiskReservoir::open(&dir, config, Arc::new(EvCodec), Some(io.clone()), None).unwrap();
        let ev = |t: i64| Ev(t, t as u64, t);
        let mut t = forty_chunks_on_disk(&mut r);
        let (mut head, mut tail) = (Vec::new(), Vec::new());
        for edge in 0..1900 {
            head.extend(collect(&mut r, edge + 29, edge + 30));
            tail.extend(collect(&mut r, edge - 1, edge));
            r.insert(ev(t));
            t += 1;
            r.seal_through(t - 1).unwrap();
        }
        assert_eq!(head, (30..1930).map(ev).collect::<Vec<_>>());
        assert_eq!(tail, (0..1900).map(ev).collect::<Vec<_>>());
        assert_eq!(r.stats().cache_misses, 1, "{:?}", r.stats());
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }

    /// A long window's tail, 20 chunks behind its head, with room for `CACHED_CHUNKS` in
    /// the cache: new chunks are cached as they are written while there is room, and those
    /// kept are the oldest, which the tail reaches first. It then takes them from the
    /// cache rather than decoding them again: here 40–44 decodes for the 60 chunks it read.
    /// Keeping the newest instead (least recently used) evicted each before the tail
    /// came, and the tail decoded every chunk it read (62 decodes, some twice).
    #[test]
    fn a_long_windows_tail_finds_chunks_kept_from_their_write() {
        let dir = temp_dir("kept");
        let io = IoThread::start("test-io");
        let codec = Arc::new(Counting::default());
        let config = ReservoirConfig {
            cache_bytes_max: CACHED_CHUNKS * 24 * 50,
            ..config()
        };
        let mut r = DiskReservoir::open(&dir, config, codec.clone(), Some(io), None).unwrap();
        let ev = |t: i64| Ev(t, t as u64, t);
        let mut tail = Vec::new();
        for t in 0..4000 {
            r.insert(ev(t));
            r.seal_through(t).unwrap();
            if t >= 1000 {
                tail.extend(collect(&mut r, t - 1001, t - 1000));
            }
        }
        assert_eq!(tail, (0..3000).map(ev).collect::<Vec<_>>());
        // The tail read 60 chunks.
        let decodes = codec.decodes();
        assert!(
            decodes <= 50,
            "{decodes} decodes of 60 chunks: {:?}",
            r.stats()
        );
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }

    /// Two reservoirs share their IoThread's cache beyond their own. What they borrow
    /// never passes its bytes and comes back when they are dropped, and with it a long
    /// window's tail finds most of its chunks decoded: 20 chunks behind its head, with
    /// room for 4 of its own and 40 shared.
    #[test]
    fn reservoirs_share_the_node_cache_within_its_bytes() {
        let run = |shared: usize| {
            let dir = temp_dir(&format!("shared-{shared}"));
            let io = IoThread::sharing("test-io", shared);
            let codec = Arc::new(Counting::default());
            let mut r = DiskReservoir::open(
                &dir.join("a"),
                config(),
                codec.clone(),
                Some(io.clone()),
                None,
            )
            .unwrap();
            let mut other = DiskReservoir::open(
                &dir.join("b"),
                config(),
                Arc::new(EvCodec),
                Some(io.clone()),
                None,
            )
            .unwrap();
            let ev = |t: i64| Ev(t, t as u64, t);
            let (mut tail, mut peak) = (Vec::new(), 0);
            for t in 0..4000 {
                for r in [&mut r, &mut other] {
                    r.insert(ev(t));
                    r.seal_through(t).unwrap();
                }
                if t >= 1000 {
                    tail.extend(collect(&mut r, t - 1001, t - 1000));
                    collect(&mut other, t - 1001, t - 1000);
                }
                peak = peak.max(io.shared.used.load(std::sync::atomic::Ordering::Relaxed));
            }
            assert_eq!(tail, (0..3000).map(ev).collect::<Vec<_>>());
            assert!(peak <= shared, "{peak} bytes borrowed of {shared}");
            drop((r, other));
            assert_eq!(io.shared.used.load(std::sync::atomic::Ordering::Relaxed), 0);
            let _ = fs::remove_dir_all(&dir);
            (codec.decodes(), peak)
        };
        let (alone, none) = run(0);
        assert_eq!(none, 0);
        let (sharing, peak) = run(40 * 24 * 50);
        assert!(peak > 0);
        assert!(
            sharing * 3 < alone,
            "{sharing} decodes sharing, {alone} alone"
        );
    }

    /// Random inserts within a lateness, sealing, retention, range reads, checkpoints and
    /// reboots (with and without a mark), against a sorted Vec. Each reboot changes the
    /// compression, so chunks written each way are read by a reservoir set another way.
    #[test]
    fn matches_a_sorted_model_across_reboots() {
        let dir = temp_dir("model");
        let io = IoThread::start("test-io");
        let mut modes = [Compression::Auto, Compression::None, Compression::Lz4]
            .into_iter()
            .cycle();
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let mut r = open_with(&dir, &io, None, modes.next().unwrap());
        let mut model: Vec<Ev> = Vec::new();
        /// The model when a checkpoint was taken.
        struct Saved {
            model: Vec<Ev>,
            t: i64,
            seq: u64,
            floor: i64,
        }
        let mut checkpoint: Option<(Vec<u8>, Saved)> = None;
        // A checkpoint is finished a step after it was taken, after more inserts and seals.
        let mut pending: Option<(PendingMark, Saved)> = None;
        let (mut t, mut seq, mut floor) = (0i64, 0u64, i64::MIN);
        let mut last_end = 0i64;
        let mut offered = 0;
        let lateness = 40;
        for step in 0..20_000u64 {
            // Time moves on; some events arrive late (within the lateness).
            let ts = t + (next() % 20) as i64 - 8;
            seq += 1;
            if ts >= t - lateness {
                let e = Ev(ts, seq, (next() % 1000) as i64);
                r.insert(e.clone());
                model.push(e);
                model.sort_by_key(|e| e.key());
                t = t.max(ts);
                r.seal_through(t - lateness).unwrap();
            }
            if let Some((p, saved)) = pending.take() {
                checkpoint = Some((p.finish().unwrap(), saved));
            }
            match next() % 500 {
                0..=4 => {
                    floor = floor.max(t - 2000);
                    r.expire_through(floor).unwrap();
                    model.retain(|e| e.0 > floor);
                }
                5 => {
                    let saved = Saved {
                        model: model.clone(),
                        t,
                        seq,
                        floor,
                    };
                    pending = Some((r.checkpoint(true).unwrap(), saved));
                }
                6 => {
                    // Crash: back to the last checkpoint (or to nothing).
                    drop(r);
                    match &checkpoint {
                        Some((mark, saved)) => {
                            r = open_with(&dir, &io, Some(mark), modes.next().unwrap());
                            model = saved.model.clone();
                            (t, seq) = (saved.t, saved.seq);
                            // The mark keeps the floor: what had expired stays expired.
                            floor = saved.floor;
                        }
                        None => {
                            r = open_with(&dir, &io, None, modes.next().unwrap());
                            model.clear();
                            floor = i64::MIN;
                        }
                    }
                }
                _ => {}
            }
            // Half the reads go on from where the last one ended, as a window's edge does
            // (the scan hints), half start anywhere.
            let a = match next() % 2 {
                0 => last_end,
                _ => t - (next() % 3000) as i64,
            };
            let b = a + (next() % 400) as i64;
            last_end = b;
            let want: Vec<Ev> = model
                .iter()
                .filter(|e| e.0 > a && e.0 <= b)
                .cloned()
                .collect();
            assert_eq!(collect(&mut r, a, b), want, "step {step} range ({a}, {b}]");
            // What `upcoming` offers after a scan is the first events past its end.
            let next_ones = r.upcoming(b, 3).to_vec();
            let after: Vec<Ev> = model.iter().filter(|e| e.0 > b).take(3).cloned().collect();
            assert_eq!(
                next_ones[..],
                after[..next_ones.len()],
                "step {step} after {b}"
            );
            offered += next_ones.len();
        }
        assert!(offered > 1000, "{offered}");
        let stats = r.stats();
        assert!(stats.chunks > 10, "{stats:?}");
        assert!(stats.cache_hits + stats.cache_misses > 0);
        assert!(checkpoint.is_some());
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_damaged_chunk_is_an_error_naming_the_file() {
        let dir = temp_dir("damage");
        let io = IoThread::start("test-io");
        let mut r = open(&dir, &io, None);
        for i in 0..500u64 {
            r.insert(Ev(i as i64, i, 7));
        }
        r.seal_through(400).unwrap();
        r.settle();
        let mark = r.checkpoint(true).unwrap().finish().unwrap();
        // Bytes written after the checkpoint are cut when reopening.
        r.seal_through(500).unwrap();
        drop(r);
        let seg = list_segments(&dir).unwrap()[0].1.clone();
        let mut r = open(&dir, &io, Some(&mark));
        assert_eq!(collect(&mut r, -1, 1000).len(), 500);
        drop(r);
        let mut bytes = fs::read(&seg).unwrap();
        bytes[HEADER_BYTES + 20] ^= 0xff;
        fs::write(&seg, &bytes).unwrap();
        let mut r = open(&dir, &io, Some(&mark));
        let e = r.for_range(-1, 1000, &mut |_| {}).unwrap_err();
        assert!(e.0.contains(".seg") && e.0.contains("bad checksum"), "{e}");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Sealing does not wait for the disk: while the IO thread is held, the sealed chunks
    /// are read from memory, and a checkpoint taken then holds their events as open ones.
    /// A crash after the writes finished reopens at that mark: the chunks written after
    /// it are cut, and their events are all there.
    #[test]
    fn a_checkpoint_keeps_the_events_of_chunks_still_on_their_way() {
        let dir = temp_dir("on-the-way");
        let io = IoThread::start("test-io");
        let mut r = open(&dir, &io, None);
        let (release, gate) = mpsc::channel::<()>();
        assert!(io
            .run(Box::new(move || {
                let _ = gate.recv();
            }))
            .is_ok());
        let all: Vec<Ev> = (0..120).map(|i| Ev(i, i as u64, 7)).collect();
        for e in &all {
            r.insert(e.clone());
        }
        r.seal_through(100).unwrap();
        assert_eq!(r.stats().chunks, 2);
        assert_eq!(r.stats().disk_bytes, 0);
        assert_eq!(collect(&mut r, -1, 1000), all);
        let mark = r.checkpoint(true).unwrap().finish().unwrap();
        release.send(()).unwrap();
        r.settle();
        assert!(r.stats().disk_bytes > 0);
        assert_eq!(list_segments(&dir).unwrap().len(), 1);
        drop(r);
        let mut r = open(&dir, &io, Some(&mark));
        assert!(list_segments(&dir).unwrap().is_empty());
        assert_eq!(collect(&mut r, -1, 1000), all);
        r.seal_through(1000).unwrap();
        r.settle();
        assert_eq!(r.stats().chunks, 2);
        assert!(r.stats().disk_bytes > 0);
        assert_eq!(collect(&mut r, -1, 1000), all);
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }

    /// `EvCodec`, but an event's size grows with its value.
    struct GrowingCodec;

    impl ChunkCodec<Ev> for GrowingCodec {
        fn schema_id(&self) -> u32 {
            1
        }
        fn encode(&self, events: &[&Ev]) -> Result<RecordBatch, String> {
            EvCodec.encode(events)
        }
        fn decode(&self, batch: &RecordBatch) -> Result<Vec<Ev>, String> {
            EvCodec.decode(batch)
        }
        fn size_of(&self, e: &Ev) -> usize {
            24 + e.2 as usize
        }
    }

    /// A refresh that makes the open events larger (as padding rows after ADD COLUMN
    /// does) is counted: sealing later subtracts what it measures, and never more than
    /// the open region was said to hold.
    #[test]
    fn a_refresh_that_grows_events_is_counted() {
        let dir = temp_dir("grow");
        let io = IoThread::start("test-io");
        let mut r: DiskReservoir<Ev> = DiskReservoir::open(
            &dir,
            config(),
            Arc::new(GrowingCodec),
            Some(io.clone()),
            None,
        )
        .unwrap();
        // Exactly one chunk's worth as counted at insert; twice that once grown.
        for i in 0..50 {
            r.insert(Ev(i, i as u64, 0));
        }
        r.refresh(None, &mut |e| e.2 = 30);
        r.seal_through(i64::MAX).unwrap();
        assert_eq!(r.stats().chunks, 2);
        assert_eq!(collect(&mut r, i64::MIN, i64::MAX).len(), 50);
        assert!(collect(&mut r, i64::MIN, i64::MAX)
            .iter()
            .all(|e| e.2 == 30));
        drop(r);
        let _ = fs::remove_dir_all(&dir);
    }
}
