//! A file written through a shared memory mapping, for the log's records: a write is a
//! copy into the operating system's page cache, with no system call. The bytes are where
//! write(2) would have put them: an fsync of the file makes them durable, reads of the
//! file see them, and they stay when the process dies (`kill -9` loses nothing written).
//!
//! The mapping is a window of the file (`WINDOW_BYTES`, moved as writes go past it), so
//! a log adds at most that to the process's resident memory however long it grows.
//!
//! A byte is written only once the file has a block for it: the file is allocated ahead
//! of the writes (`posix_fallocate`, `ALLOCATE_BYTES` at a time). So a full disk is an
//! error of the allocation, before anything is copied, never a fault on a page the
//! filesystem has no room for (which would end the process with SIGBUS).
//!
//! A file written full of zeros first (a preallocated log's segment, see `log.rs`) is
//! written with write(2) instead (`MappedFile::written`): here an fdatasync after a write
//! through a mapping of such a file took 2.9–3.6 ms, against 0.2–0.3 ms after a
//! write(2), and the same 0.2–0.3 ms after a write through a mapping of allocated
//! blocks (`bench/fsync-mapped.py`).
//!
//! The unsafe code of the mapping is in this module alone.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::ptr::NonNull;
use std::sync::{Arc, OnceLock};

/// The mapped window's size (at least: a larger write maps a larger one).
const WINDOW_BYTES: u64 = 1 << 20;
/// What a file is grown by when a write passes its allocated end: small, so that a log
/// near a full disk does not claim much more than it writes.
const ALLOCATE_BYTES: u64 = 64 << 10;

/// A file written through a moving mapping, or with write(2) (`mapping` is `None`).
pub(crate) struct MappedFile {
    file: Arc<File>,
    mapping: Option<Mapping>,
}

/// What a file written through a mapping has allocated, and its window.
struct Mapping {
    /// Bytes the file has blocks for (its length: allocation extends it).
    allocated: u64,
    window: Option<Window>,
}

impl MappedFile {
    /// Writes will go to `file` through a mapping; its length now is what it has
    /// allocated.
    pub(crate) fn new(file: File) -> io::Result<MappedFile> {
        let allocated = file.metadata()?.len();
        Ok(MappedFile {
            file: Arc::new(file),
            mapping: Some(Mapping {
                allocated,
                window: None,
            }),
        })
    }

    /// Writes will go to `file` with write(2) (see the module's header).
    pub(crate) fn written(file: File) -> MappedFile {
        MappedFile {
            file: Arc::new(file),
            mapping: None,
        }
    }

    pub(crate) fn file(&self) -> &Arc<File> {
        &self.file
    }

    /// Copies `buf` into the file at `at`, allocating what it needs first. Nothing is
    /// written when the allocation fails (a full disk).
    pub(crate) fn write_at(&mut self, buf: &[u8], at: u64) -> io::Result<()> {
        if buf.is_empty() {
            return Ok(());
        }
        let Some(mapping) = &mut self.mapping else {
            return self.file.write_all_at(buf, at);
        };
        let end = at + buf.len() as u64;
        if end > mapping.allocated {
            let to = end.div_ceil(ALLOCATE_BYTES) * ALLOCATE_BYTES;
            allocate(&self.file, mapping.allocated, to - mapping.allocated)?;
            mapping.allocated = to;
        }
        let window = match mapping.window.take() {
            Some(w) if w.covers(at, buf.len()) => w,
            old => {
                drop(old);
                Window::map(&self.file, at, buf.len())?
            }
        };
        // Within the window (checked above) and below `allocated`.
        window.copy_in(at, buf);
        mapping.window = Some(window);
        Ok(())
    }

    /// Cuts the file to `len` bytes.
    pub(crate) fn set_len(&mut self, len: u64) -> io::Result<()> {
        if let Some(mapping) = &mut self.mapping {
            // Unmapped first: no window may cover bytes the cut takes away.
            mapping.window = None;
            mapping.allocated = len;
        }
        self.file.set_len(len)
    }
}

/// Gives the file blocks for `len` bytes from `from` (extending it), or says why not.
fn allocate(file: &File, from: u64, len: u64) -> io::Result<()> {
    let (from, len) = (from as libc::off_t, len as libc::off_t);
    // SAFETY: a plain system call on an open descriptor.
    match unsafe { libc::posix_fallocate(file.as_raw_fd(), from, len) } {
        0 => Ok(()),
        errno => Err(io::Error::from_raw_os_error(errno)),
    }
}

fn page_bytes() -> u64 {
    static PAGE: OnceLock<u64> = OnceLock::new();
    // SAFETY: sysconf reads a constant of the system.
    *PAGE.get_or_init(|| match unsafe { libc::sysconf(libc::_SC_PAGESIZE) } {
        n if n > 0 => n as u64,
        _ => 4096,
    })
}

/// A shared, writable mapping of the file's bytes `[at, at + len)`.
struct Window {
    at: u64,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping belongs to this window alone, and is written through `&self` only
// by its owner (`MappedFile` holds it, and is itself written through `&mut`).
unsafe impl Send for Window {}

impl Window {
    /// Maps a window that covers `len` bytes from `from`.
    fn map(file: &File, from: u64, len: usize) -> io::Result<Window> {
        let at = from / page_bytes() * page_bytes();
        let need = (from - at) + len as u64;
        let size = need.div_ceil(page_bytes()) * page_bytes();
        let size = size.max(WINDOW_BYTES) as usize;
        // SAFETY: a new mapping of an open descriptor, at a page-aligned offset; it
        // overlaps no memory Rust owns.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                size,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                at as libc::off_t,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        Ok(Window { at, ptr, len: size })
    }

    fn covers(&self, from: u64, len: usize) -> bool {
        from >= self.at && from - self.at + len as u64 <= self.len as u64
    }

    /// Copies `buf` to the file's byte `from`, which the window covers and the file has
    /// allocated (the caller's checks).
    fn copy_in(&self, from: u64, buf: &[u8]) {
        assert!(self.covers(from, buf.len()), "a write outside the window");
        // SAFETY: in bounds of the mapping (asserted); the file has blocks for these
        // bytes, so the pages are there to fault in; `buf` is not in the mapping.
        unsafe {
            std::ptr::copy_nonoverlapping(
                buf.as_ptr(),
                self.ptr.as_ptr().add((from - self.at) as usize),
                buf.len(),
            );
        }
    }
}

impl Drop for Window {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once; nothing points into it.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::OpenOptions;

    /// Writes across windows, and one larger than a window, read back by plain reads of
    /// the file; the file grows by allocation steps, not past the last one needed.
    #[test]
    fn writes_land_in_the_file_across_windows() {
        let path = std::env::temp_dir().join(format!("eddy-mapped-{}", std::process::id()));
        let file = OpenOptions::new()
            .create(true)
            .truncate(true)
            .read(true)
            .write(true)
            .open(&path)
            .unwrap();
        let mut mapped = MappedFile::new(file).unwrap();
        let mut want = Vec::new();
        for i in 0..3000u32 {
            let piece: Vec<u8> = (0..1000u32).map(|j| (i * 7 + j) as u8 | 1).collect();
            mapped.write_at(&piece, want.len() as u64).unwrap();
            want.extend_from_slice(&piece);
        }
        let big = vec![0xabu8; 2 * WINDOW_BYTES as usize + 123];
        mapped.write_at(&big, want.len() as u64).unwrap();
        want.extend_from_slice(&big);
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(
            len,
            (want.len() as u64).div_ceil(ALLOCATE_BYTES) * ALLOCATE_BYTES
        );
        let got = std::fs::read(&path).unwrap();
        assert_eq!(&got[..want.len()], &want[..]);
        assert!(
            got[want.len()..].iter().all(|b| *b == 0),
            "allocated ahead as zeros"
        );
        // Cut back, then written again over the cut.
        mapped.set_len(1500).unwrap();
        mapped.write_at(b"again", 1500).unwrap();
        drop(mapped);
        let got = std::fs::read(&path).unwrap();
        assert_eq!(&got[..1500], &want[..1500]);
        assert_eq!(&got[1500..1505], b"again");
        std::fs::remove_file(&path).unwrap();
    }
}
