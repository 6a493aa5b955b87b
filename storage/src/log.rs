//! The embedded log: one append-only log per task, the local stand-in for a Kafka
//! partition. Records are opaque bytes with offsets 0, 1, 2, … .
//!
//! On disk a task's log is a directory of segment files named by their first offset
//! (`00000000000000000000.log`), each a sequence of records `[len u32][crc32 u32][bytes]`
//! (little endian, CRC over the bytes). A segment rolls over at `segment_bytes_max`.
//!
//! A task's log (`TaskLog::open`) copies its records into its segment through a shared
//! mapping (`mapped.rs`): an append makes no system call, and what it wrote is in the
//! page cache, where a crash of the process leaves it, as with write(2). Its segments
//! grow by allocated steps, so the bytes past its records are zeros, which end them.
//!
//! A preallocated log (`TaskLog::open_preallocated`, for a log fsynced on every commit)
//! writes each new segment full of zeros first and then writes its records over them,
//! as PostgreSQL does with its WAL segments: the file's size never changes while records
//! go in, so an fdatasync writes the data alone, not the inode (here 111–120 µs against
//! 142–162 µs for a growing file, 120-byte writes). A zero header ends a segment's
//! records, so a preallocated log takes no empty record; it must be opened preallocated
//! every time. At open, the last segment is cut at the end of its valid records (unless it
//! holds none): what a crash left past them (zeros, or pages of a torn write that reached
//! the disk out of order) is never read as records later.
//!
//! Invariants:
//! - a record is acknowledged only after `sync` returned: every acknowledged record is
//!   read back after a crash;
//! - opening a log validates every record: a torn record at the very end of the last
//!   segment (a crash mid-write) is cut off; any other bad record is an error naming the
//!   file and offset, never skipped.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mapped::MappedFile;

/// Where a log ended at one moment (`TaskLog::end`), to go back to (`TaskLog::rewind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogEnd {
    next: u64,
    segments: usize,
    active_bytes: u64,
}

/// Bytes of a record's header: length and CRC.
const HEADER_BYTES: usize = 8;
/// Largest record accepted (a sanity bound that also catches corrupt lengths).
pub const RECORD_BYTES_MAX: usize = 64 << 20;
/// Default segment size before a new segment file starts.
pub const SEGMENT_BYTES_MAX: u64 = 128 << 20;

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: corrupt record at byte {position} (offset {offset}): {why}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        offset: u64,
        why: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> LogError + '_ {
    move |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Records framed as a log stores them, in one buffer: the caller encodes each record in
/// place, so an append copies nothing per record and allocates nothing.
#[derive(Debug, Default, Clone)]
pub struct Records {
    bytes: Vec<u8>,
    count: usize,
}

impl Records {
    /// Room for `bytes` of records (without their headers) before growing.
    pub fn with_capacity(count: usize, bytes: usize) -> Records {
        Records {
            bytes: Vec::with_capacity(count * HEADER_BYTES + bytes),
            count: 0,
        }
    }

    /// Appends one record, the bytes `write` appends to the buffer it is given.
    pub fn push_with(&mut self, write: impl FnOnce(&mut Vec<u8>)) {
        let start = self.bytes.len();
        self.bytes.extend_from_slice(&[0; HEADER_BYTES]);
        write(&mut self.bytes);
        let body = &self.bytes[start + HEADER_BYTES..];
        assert!(body.len() <= RECORD_BYTES_MAX, "record too large");
        let header = [
            (body.len() as u32).to_le_bytes(),
            crc32fast::hash(body).to_le_bytes(),
        ];
        self.bytes[start..start + HEADER_BYTES].copy_from_slice(header.as_flattened());
        self.count += 1;
    }

    /// The number of records.
    pub fn len(&self) -> usize {
        self.count
    }

    pub fn is_empty(&self) -> bool {
        self.count == 0
    }

    /// Their size in the log, headers included.
    pub fn framed_bytes(&self) -> usize {
        self.bytes.len()
    }

    /// The records as the log stores them, headers included.
    pub fn framed(&self) -> &[u8] {
        &self.bytes
    }

    /// The bodies of records framed as `framed` gives them; `None` if a header or a
    /// checksum does not hold.
    pub fn bodies(framed: &[u8]) -> Option<Vec<&[u8]>> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < framed.len() {
            let header = framed.get(at..at + HEADER_BYTES)?;
            let len = u32::from_le_bytes(header[..4].try_into().ok()?) as usize;
            let crc = u32::from_le_bytes(header[4..].try_into().ok()?);
            let body = framed.get(at + HEADER_BYTES..at + HEADER_BYTES + len)?;
            if crc32fast::hash(body) != crc {
                return None;
            }
            out.push(body);
            at += HEADER_BYTES + len;
        }
        Some(out)
    }
}

impl<R: AsRef<[u8]>> FromIterator<R> for Records {
    fn from_iter<I: IntoIterator<Item = R>>(records: I) -> Records {
        let mut out = Records::default();
        for r in records {
            out.push_with(|b| b.extend_from_slice(r.as_ref()));
        }
        out
    }
}

struct Segment {
    base: u64,
    path: PathBuf,
}

/// One task's log.
pub struct TaskLog {
    dir: PathBuf,
    segments: Vec<Segment>,
    /// Records are copied into it (its file is shared with `Unsynced` handles, which
    /// fsync it outside the writer's lock).
    active: MappedFile,
    active_bytes: u64,
    next: u64,
    segment_bytes_max: u64,
    /// New segments are written full of zeros before records go in.
    preallocated: bool,
    dirty: bool,
}

fn segment_name(base: u64) -> String {
    format!("{base:020}.log")
}

/// Reads the records of one segment; stops at the end or at the first bad record, and
/// reports where the valid prefix ends.
struct SegmentScan {
    /// The file's size.
    len: u64,
    valid_bytes: u64,
    records: u64,
    bad: Option<String>,
}

/// Reads a segment's records; an all-zero header ends them (the rest of a segment
/// allocated ahead of its records).
fn scan(path: &Path, mut each: impl FnMut(Vec<u8>)) -> Result<SegmentScan, LogError> {
    let file = File::open(path).map_err(io_err(path))?;
    let len = file.metadata().map_err(io_err(path))?.len();
    let mut r = BufReader::with_capacity(1 << 20, file);
    let mut pos = 0u64;
    let mut records = 0;
    let mut header = [0u8; HEADER_BYTES];
    while pos < len {
        if len - pos < HEADER_BYTES as u64 {
            return Ok(SegmentScan {
                len,
                valid_bytes: pos,
                records,
                bad: Some("truncated header".into()),
            });
        }
        r.read_exact(&mut header).map_err(io_err(path))?;
        if header == [0; HEADER_BYTES] {
            break;
        }
        let n = u32::from_le_bytes(header[..4].try_into().expect("4 bytes")) as usize;
        let crc = u32::from_le_bytes(header[4..].try_into().expect("4 bytes"));
        if n > RECORD_BYTES_MAX || pos + (HEADER_BYTES + n) as u64 > len {
            return Ok(SegmentScan {
                len,
                valid_bytes: pos,
                records,
                bad: Some(format!("record of {n} bytes runs past the end")),
            });
        }
        let mut bytes = vec![0u8; n];
        r.read_exact(&mut bytes).map_err(io_err(path))?;
        if crc32fast::hash(&bytes) != crc {
            return Ok(SegmentScan {
                len,
                valid_bytes: pos,
                records,
                bad: Some("checksum mismatch".into()),
            });
        }
        each(bytes);
        pos += (HEADER_BYTES + n) as u64;
        records += 1;
    }
    Ok(SegmentScan {
        len,
        valid_bytes: pos,
        records,
        bad: None,
    })
}

/// The active segment of a log with records written but not yet durable (earlier
/// segments were synced when the log rolled past them).
pub struct Unsynced {
    file: Arc<File>,
    path: PathBuf,
}

impl Unsynced {
    pub fn sync(self) -> Result<(), LogError> {
        self.file.sync_data().map_err(io_err(&self.path))
    }
}

impl TaskLog {
    /// Opens (or creates) the log in `dir`, validating every record.
    pub fn open(dir: &Path, segment_bytes_max: u64) -> Result<TaskLog, LogError> {
        Self::open_with(dir, segment_bytes_max, false)
    }

    /// As `open`, for a log whose new segments are preallocated (see the module's
    /// header). Opening it again either way reads the same records.
    pub fn open_preallocated(dir: &Path, segment_bytes_max: u64) -> Result<TaskLog, LogError> {
        Self::open_with(dir, segment_bytes_max, true)
    }

    fn open_with(
        dir: &Path,
        segment_bytes_max: u64,
        preallocated: bool,
    ) -> Result<TaskLog, LogError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let mut bases: Vec<u64> = fs::read_dir(dir)
            .map_err(io_err(dir))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().into_string().ok()?;
                name.strip_suffix(".log")?.parse::<u64>().ok()
            })
            .collect();
        bases.sort_unstable();
        let mut segments = Vec::new();
        let mut next = bases.first().copied().unwrap_or(0);
        // Where the last segment's records end, and the next record goes.
        let mut active_bytes = 0;
        for (i, &base) in bases.iter().enumerate() {
            let path = dir.join(segment_name(base));
            if base != next {
                return Err(LogError::Corrupt {
                    path,
                    position: 0,
                    offset: base,
                    why: format!("segment starts at offset {base}, expected {next}"),
                });
            }
            let last = i + 1 == bases.len();
            let s = scan(&path, |_| {})?;
            if let (Some(why), false) = (&s.bad, last) {
                return Err(LogError::Corrupt {
                    path,
                    position: s.valid_bytes,
                    offset: base + s.records,
                    why: why.clone(),
                });
            }
            if last && s.len > s.valid_bytes {
                // A torn tail (the write in flight when the node stopped), or the unused
                // rest of a preallocated segment: a segment with no record is made anew.
                if preallocated && s.records == 0 {
                    create_segment(&path, Some(segment_bytes_max))?;
                } else {
                    let f = open_segment(&path)?;
                    f.set_len(s.valid_bytes).map_err(io_err(&path))?;
                    f.sync_all().map_err(io_err(&path))?;
                }
            }
            next = base + s.records;
            active_bytes = s.valid_bytes;
            segments.push(Segment { base, path });
        }
        if segments.is_empty() {
            let path = dir.join(segment_name(0));
            create_segment(&path, preallocated.then_some(segment_bytes_max))?;
            sync_dir(dir)?;
            segments.push(Segment { base: 0, path });
        }
        let path = &segments.last().expect("one segment").path;
        let active = segment_file(path, open_segment(path)?, preallocated)?;
        Ok(TaskLog {
            dir: dir.to_path_buf(),
            segments,
            active,
            active_bytes,
            next,
            segment_bytes_max,
            preallocated,
            dirty: false,
        })
    }

    /// The offset the next record gets.
    pub fn next_offset(&self) -> u64 {
        self.next
    }

    /// Writes records (not yet durable: call `sync`); returns the first one's offset.
    /// All or nothing: a failed append (a full disk) leaves the log as it was.
    pub fn append(&mut self, records: &Records) -> Result<u64, LogError> {
        let end = self.end();
        self.append_all(records).inspect_err(|_| {
            // What the write left is cut again; a failure here leaves a torn tail that
            // the next open cuts, and offsets that later appends write over.
            let _ = self.rewind(end);
        })
    }

    /// Where the log ends now: `rewind` goes back to it.
    pub fn end(&self) -> LogEnd {
        LogEnd {
            next: self.next,
            segments: self.segments.len(),
            active_bytes: self.active_bytes,
        }
    }

    /// Drops every record appended since `end` was taken (not yet acknowledged: an
    /// append of several logs that failed in one of them). Segments started since are
    /// deleted; the active one is cut back (a preallocated one keeps its size: zeros
    /// end its records again).
    pub fn rewind(&mut self, end: LogEnd) -> Result<(), LogError> {
        if self.segments.len() > end.segments {
            for s in self.segments.drain(end.segments..) {
                match fs::remove_file(&s.path) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                    Err(e) => return Err(io_err(&s.path)(e)),
                }
            }
            let path = &self.segments.last().expect("one segment").path;
            self.active = segment_file(path, open_segment(path)?, self.preallocated)?;
        }
        self.next = end.next;
        let path = self.segments.last().expect("one segment").path.clone();
        if self.preallocated {
            let file = self.active.file();
            let len = file.metadata().map_err(io_err(&path))?.len();
            let zeros = vec![0u8; (len.saturating_sub(end.active_bytes)).min(1 << 20) as usize];
            let mut at = end.active_bytes;
            while at < len {
                let n = zeros.len().min((len - at) as usize);
                if n == 0 {
                    break;
                }
                file.write_all_at(&zeros[..n], at).map_err(io_err(&path))?;
                at += n as u64;
            }
        } else {
            // Cut where it ended (the next write allocates again).
            self.active
                .set_len(end.active_bytes)
                .map_err(io_err(&path))?;
        }
        self.active_bytes = end.active_bytes;
        self.dirty = true;
        Ok(())
    }

    fn append_all(&mut self, records: &Records) -> Result<u64, LogError> {
        let first = self.next;
        let bytes = &records.bytes;
        if self.active_bytes + bytes.len() as u64 <= self.segment_bytes_max {
            self.write(bytes)?;
            self.next += records.count as u64;
            return Ok(first);
        }
        // Rolls at the first record boundary past the segment's size.
        let (mut written, mut at) = (0, 0);
        while at < bytes.len() {
            if self.active_bytes + (at - written) as u64 >= self.segment_bytes_max
                && self.active_bytes + (at - written) as u64 > 0
            {
                self.write(&bytes[written..at])?;
                written = at;
                self.roll()?;
            }
            let len = u32::from_le_bytes(bytes[at..at + 4].try_into().expect("4 bytes"));
            at += HEADER_BYTES + len as usize;
            self.next += 1;
        }
        self.write(&bytes[written..])?;
        Ok(first)
    }

    fn write(&mut self, buf: &[u8]) -> Result<(), LogError> {
        if buf.is_empty() {
            return Ok(());
        }
        let path = &self.segments.last().expect("one segment").path;
        self.active
            .write_at(buf, self.active_bytes)
            .map_err(io_err(path))?;
        self.active_bytes += buf.len() as u64;
        self.dirty = true;
        Ok(())
    }

    /// Starts a new segment at the next offset (preallocated: zeros to its size first).
    fn roll(&mut self) -> Result<(), LogError> {
        self.sync()?;
        let path = self.dir.join(segment_name(self.next));
        let size = self.preallocated.then_some(self.segment_bytes_max);
        self.active = segment_file(&path, create_segment(&path, size)?, self.preallocated)?;
        sync_dir(&self.dir)?;
        self.segments.push(Segment {
            base: self.next,
            path,
        });
        self.active_bytes = 0;
        Ok(())
    }

    /// Makes every appended record durable.
    pub fn sync(&mut self) -> Result<(), LogError> {
        match self.unsynced() {
            Some(u) => u.sync(),
            None => Ok(()),
        }
    }

    /// What `sync` would make durable, as a handle that can do it later and on another
    /// thread (so appends need not wait for an fsync); `None` when nothing is. The log
    /// counts as synced from here on: the caller owns the fsync, and its error.
    pub fn unsynced(&mut self) -> Option<Unsynced> {
        if !self.dirty {
            return None;
        }
        self.dirty = false;
        Some(Unsynced {
            file: self.active.file().clone(),
            path: self.segments.last().expect("one segment").path.clone(),
        })
    }

    /// Calls `f` with every record from `offset` on, in order.
    pub fn read_from(&self, offset: u64, f: &mut dyn FnMut(u64, Vec<u8>)) -> Result<(), LogError> {
        for (i, seg) in self.segments.iter().enumerate() {
            let end = self.segments.get(i + 1).map_or(self.next, |s| s.base);
            if end <= offset {
                continue;
            }
            let mut at = seg.base;
            let s = scan(&seg.path, |bytes| {
                if at >= offset {
                    f(at, bytes);
                }
                at += 1;
            })?;
            if let Some(why) = s.bad {
                return Err(LogError::Corrupt {
                    path: seg.path.clone(),
                    position: s.valid_bytes,
                    offset: seg.base + s.records,
                    why,
                });
            }
        }
        Ok(())
    }

    /// Deletes the segments whose records all come before `offset` (a checkpoint
    /// covers them); the active segment stays. Returns how many were deleted.
    pub fn truncate_before(&mut self, offset: u64) -> Result<usize, LogError> {
        let mut removed = 0;
        while self.segments.len() > 1 && self.segments[1].base <= offset {
            let s = self.segments.remove(0);
            fs::remove_file(&s.path).map_err(io_err(&s.path))?;
            removed += 1;
        }
        if removed > 0 {
            sync_dir(&self.dir)?;
        }
        Ok(removed)
    }

    /// Deletes the log's files.
    pub fn destroy(self) -> Result<(), LogError> {
        let dir = self.dir.clone();
        drop(self);
        fs::remove_dir_all(&dir).map_err(io_err(&dir))
    }
}

/// Creates an empty segment file; with `preallocate`, full of zeros to that size, synced.
fn create_segment(path: &Path, preallocate: Option<u64>) -> Result<File, LogError> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))?;
    if let Some(size) = preallocate {
        let zeros = vec![0u8; 1 << 20];
        let mut at = 0;
        while at < size {
            let n = zeros.len().min((size - at) as usize);
            file.write_all_at(&zeros[..n], at).map_err(io_err(path))?;
            at += n as u64;
        }
        file.sync_all().map_err(io_err(path))?;
    }
    Ok(file)
}

/// The active segment's file, written through a mapping unless it was preallocated (see
/// `mapped`).
fn segment_file(path: &Path, file: File, preallocated: bool) -> Result<MappedFile, LogError> {
    if preallocated {
        return Ok(MappedFile::written(file));
    }
    MappedFile::new(file).map_err(io_err(path))
}

/// Opens a segment to write its records (read too: a mapping needs both).
fn open_segment(path: &Path) -> Result<File, LogError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(io_err(path))
}

/// Makes a directory's entries (new or removed files) durable.
pub fn sync_dir(dir: &Path) -> Result<(), LogError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err(dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("eddy-log-{name}-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn all(log: &TaskLog) -> Vec<(u64, Vec<u8>)> {
        let mut out = Vec::new();
        log.read_from(0, &mut |o, b| out.push((o, b))).unwrap();
        out
    }

    #[test]
    fn appends_roll_and_reopen() {
        let dir = temp("roll");
        let mut log = TaskLog::open(&dir, 100).unwrap();
        let records: Vec<Vec<u8>> = (0..50u8).map(|i| vec![i; i as usize % 7 + 1]).collect();
        for chunk in records.chunks(3) {
            log.append(&chunk.iter().collect()).unwrap();
            log.sync().unwrap();
        }
        assert!(log.segments.len() > 3);
        let got = all(&log);
        assert_eq!(got.len(), 50);
        drop(log);
        let log = TaskLog::open(&dir, 100).unwrap();
        assert_eq!(log.next_offset(), 50);
        let got2 = all(&log);
        assert_eq!(got, got2);
        for (i, (o, b)) in got2.iter().enumerate() {
            assert_eq!((*o, b), (i as u64, &records[i]));
        }
        let mut tail = Vec::new();
        log.read_from(47, &mut |o, _| tail.push(o)).unwrap();
        assert_eq!(tail, vec![47, 48, 49]);
        log.destroy().unwrap();
    }

    /// What a failed append of several logs takes back is gone, at once and after a
    /// reopen, and the next append takes its offsets, rolled segments or not.
    #[test]
    fn a_rewind_takes_back_appends_across_segments() {
        for preallocated in [false, true] {
            let dir = temp(&format!("rewind-{preallocated}"));
            let open = |dir: &Path| match preallocated {
                false => TaskLog::open(dir, 100).unwrap(),
                true => TaskLog::open_preallocated(dir, 100).unwrap(),
            };
            let mut log = open(&dir);
            let records: Vec<Vec<u8>> = (0..20u8).map(|i| vec![i + 1; 9]).collect();
            log.append(&records[..5].iter().collect()).unwrap();
            let end = log.end();
            let segments = log.segments.len();
            log.append(&records[5..].iter().collect()).unwrap();
            assert!(log.segments.len() > segments, "the append rolled");
            log.rewind(end).unwrap();
            assert_eq!(log.next_offset(), 5);
            assert_eq!(all(&log).len(), 5);
            // Same-sized records over the taken-back ones: none of those comes back.
            log.append(&records[10..12].iter().collect()).unwrap();
            log.sync().unwrap();
            drop(log);
            let log = open(&dir);
            let want: Vec<(u64, Vec<u8>)> = records[..5]
                .iter()
                .chain(&records[10..12])
                .cloned()
                .enumerate()
                .map(|(i, r)| (i as u64, r))
                .collect();
            assert_eq!(all(&log), want, "preallocated: {preallocated}");
            log.destroy().unwrap();
        }
    }

    #[test]
    fn a_preallocated_log_writes_over_zeros_and_reads_back_what_it_wrote() {
        let dir = temp("prealloc");
        let size = 64;
        let mut log = TaskLog::open_preallocated(&dir, size).unwrap();
        let first = dir.join(segment_name(0));
        assert_eq!(fs::metadata(&first).unwrap().len(), size, "zeros first");
        log.append(&[b"one", b"two"].into_iter().collect()).unwrap();
        log.sync().unwrap();
        assert_eq!(fs::metadata(&first).unwrap().len(), size, "written over");
        assert_eq!(all(&log).len(), 2);
        // Rolls into another preallocated segment.
        let records: Vec<Vec<u8>> = (1..20u8).map(|i| vec![i; 10]).collect();
        for r in &records {
            log.append(&[r].into_iter().collect()).unwrap();
        }
        log.sync().unwrap();
        assert!(log.segments.len() > 2);
        // (A segment ends at the first record boundary past its size: a record may run
        // past the zeros, growing the file.)
        let last = log.segments.last().unwrap().path.clone();
        assert!(fs::metadata(&last).unwrap().len() >= size);
        let before = all(&log);
        assert_eq!(before.len(), 21);
        drop(log);
        // A crash left a torn write's later page past the zeros after the last record:
        // reopening cuts the segment at its records, so new records never run into it.
        let valid = scan(&last, |_| {}).unwrap().valid_bytes;
        let f = OpenOptions::new().write(true).open(&last).unwrap();
        f.write_all_at(&[7; 8], valid + HEADER_BYTES as u64)
            .unwrap();
        drop(f);
        let mut log = TaskLog::open_preallocated(&dir, size).unwrap();
        assert_eq!(all(&log), before);
        assert_eq!(
            fs::metadata(&last).unwrap().len(),
            valid,
            "cut at its records"
        );
        log.append(&[b"three"].into_iter().collect()).unwrap();
        log.sync().unwrap();
        drop(log);
        let log = TaskLog::open_preallocated(&dir, size).unwrap();
        assert_eq!(all(&log).len(), 22);
        assert_eq!(all(&log).last().unwrap().1, b"three");
        log.destroy().unwrap();
    }

    #[test]
    fn a_torn_tail_is_cut_and_other_damage_is_an_error() {
        let dir = temp("torn");
        let mut log = TaskLog::open(&dir, 1 << 20).unwrap();
        log.append(&[b"one", b"two"].into_iter().collect()).unwrap();
        log.sync().unwrap();
        drop(log);
        let path = dir.join(segment_name(0));
        // Half a record at the end, as a crash mid-write leaves it.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(&[9, 0, 0, 0, 1, 2]).unwrap();
        drop(f);
        let mut log = TaskLog::open(&dir, 1 << 20).unwrap();
        assert_eq!(log.next_offset(), 2);
        log.append(&[b"three"].into_iter().collect()).unwrap();
        log.sync().unwrap();
        assert_eq!(all(&log).len(), 3);
        drop(log);
        // A flipped byte inside an earlier segment is not a torn tail.
        let mut log = TaskLog::open(&dir, 16).unwrap();
        log.append(&[&b"four"[..], b"five"].into_iter().collect())
            .unwrap();
        log.sync().unwrap();
        drop(log);
        let mut bytes = fs::read(&path).unwrap();
        bytes[HEADER_BYTES] ^= 0xff;
        fs::write(&path, bytes).unwrap();
        let err = TaskLog::open(&dir, 16).err().expect("corruption detected");
        let text = err.to_string();
        assert!(
            text.contains("checksum mismatch") && text.contains(".log"),
            "{text}"
        );
        let _ = fs::remove_dir_all(&dir);
    }
}
