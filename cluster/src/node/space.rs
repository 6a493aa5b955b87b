//! Free space on the data directory's filesystem, and the reserve kept there.
//!
//! Below the reserve a node refuses new events (53100) while reads, checkpoints and a
//! clean shutdown go on: the reserve is the room those writes need. Every write past the
//! log (reservoir chunks, state, checkpoints) that still finds the disk full is kept in
//! memory and tried again later, so a statement the log took is never taken back, and one
//! it refused applied nothing.
//!
//! The free bytes come from `statvfs`, read at most every `FRESH` on the statement path
//! (one clock read otherwise).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eddy_planner::{Error, Result};

/// How old a reading of the free bytes may be when a statement is admitted.
const FRESH: Duration = Duration::from_millis(50);

/// The reserve's default: the smaller of 1 % of the filesystem and 256 MiB.
const DEFAULT_PERCENT: f64 = 1.0;
const DEFAULT_BYTES_MAX: u64 = 256 << 20;

/// How much of the filesystem a node keeps free.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum Reserve {
    /// The smaller of 1 % of the filesystem and 256 MiB.
    #[default]
    Default,
    Bytes(u64),
    /// A share of the filesystem's size, in percent.
    Percent(f64),
}

impl Reserve {
    /// `256MB`, `1%`, `0` or `default`.
    pub fn parse(
        text: &str,
        bytes: impl Fn(&str) -> std::result::Result<u64, String>,
    ) -> std::result::Result<Reserve, String> {
        let text = text.trim();
        if text.eq_ignore_ascii_case("default") {
            return Ok(Reserve::Default);
        }
        if text == "0" {
            return Ok(Reserve::Bytes(0));
        }
        if let Some(p) = text.strip_suffix('%') {
            let p: f64 = p
                .trim()
                .parse()
                .map_err(|_| format!("\"{text}\" is not a percentage"))?;
            if !(0.0..=50.0).contains(&p) {
                return Err(format!("a reserve of {p}% is outside 0% to 50%"));
            }
            return Ok(Reserve::Percent(p));
        }
        bytes(text).map(Reserve::Bytes)
    }

    /// Bytes kept free on a filesystem of `total` bytes.
    pub fn bytes_of(self, total: u64) -> u64 {
        let share = |p: f64| (total as f64 * p / 100.0) as u64;
        match self {
            Reserve::Default => share(DEFAULT_PERCENT).min(DEFAULT_BYTES_MAX),
            Reserve::Bytes(b) => b,
            Reserve::Percent(p) => share(p),
        }
    }
}

impl std::fmt::Display for Reserve {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reserve::Default => write!(f, "default"),
            Reserve::Bytes(b) => write!(f, "{b}"),
            Reserve::Percent(p) => write!(f, "{p}%"),
        }
    }
}

/// A filesystem's size and free bytes (those an unprivileged writer may use).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Space {
    pub total: u64,
    pub free: u64,
}

/// Reads `statvfs` of `path`.
pub fn space_of(path: &Path) -> std::io::Result<Space> {
    let st = rustix::fs::statvfs(path)?;
    Ok(Space {
        total: st.f_blocks.saturating_mul(st.f_frsize),
        free: st.f_bavail.saturating_mul(st.f_frsize),
    })
}

/// The free space of a node's data directory, as statements see it.
#[derive(Debug)]
pub struct DiskSpace {
    dir: PathBuf,
    reserve: Reserve,
    started: Instant,
    /// Microseconds after `started` of the last reading (0: never).
    read_at: AtomicU64,
    total: AtomicU64,
    free: AtomicU64,
    /// Statements refused for space.
    pub refused: AtomicU64,
    /// `EDDY_TEST_DISK_ADMISSION=off`, for tests alone: statements are never refused,
    /// so that a full disk meets the log's own writes.
    unguarded: bool,
}

impl DiskSpace {
    pub fn new(dir: &Path, reserve: Reserve) -> DiskSpace {
        let space = DiskSpace {
            dir: dir.to_path_buf(),
            reserve,
            started: Instant::now(),
            read_at: AtomicU64::new(0),
            total: AtomicU64::new(0),
            free: AtomicU64::new(u64::MAX),
            refused: AtomicU64::new(0),
            unguarded: std::env::var("EDDY_TEST_DISK_ADMISSION").as_deref() == Ok("off"),
        };
        space.read();
        space
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn reserve_setting(&self) -> Reserve {
        self.reserve
    }

    /// Reads the filesystem now. A failed reading keeps the last one.
    pub fn read(&self) -> Space {
        if let Ok(s) = space_of(&self.dir) {
            self.total.store(s.total, Ordering::Relaxed);
            self.free.store(s.free, Ordering::Relaxed);
        }
        let at = self.started.elapsed().as_micros() as u64;
        self.read_at.store(at.max(1), Ordering::Relaxed);
        self.last()
    }

    /// The last reading.
    pub fn last(&self) -> Space {
        Space {
            total: self.total.load(Ordering::Relaxed),
            free: self.free.load(Ordering::Relaxed),
        }
    }

    /// A reading at most `FRESH` old.
    pub fn current(&self) -> Space {
        let now = self.started.elapsed().as_micros() as u64;
        let at = self.read_at.load(Ordering::Relaxed);
        if at == 0 || now.saturating_sub(at) >= FRESH.as_micros() as u64 {
            return self.read();
        }
        self.last()
    }

    /// Bytes kept free.
    pub fn reserve_bytes(&self) -> u64 {
        self.reserve.bytes_of(self.last().total)
    }

    /// Refuses (53100) a statement that would write about `bytes` while the free space,
    /// less them, is below the reserve. Nothing has been written when it refuses.
    pub fn admit(&self, bytes: u64) -> Result<()> {
        let space = self.current();
        let reserve = self.reserve.bytes_of(space.total);
        if self.unguarded || space.free >= reserve.saturating_add(bytes) {
            return Ok(());
        }
        self.refused.fetch_add(1, Ordering::Relaxed);
        Err(Error::disk_full(format!(
            "could not write the events: {} has {} bytes free, and the node keeps {} free \
             (about {} more were needed)",
            self.dir.display(),
            space.free,
            reserve,
            bytes
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bytes(s: &str) -> std::result::Result<u64, String> {
        s.strip_suffix("MB")
            .unwrap_or(s)
            .parse::<u64>()
            .map(|n| if s.ends_with("MB") { n << 20 } else { n })
            .map_err(|e| e.to_string())
    }

    #[test]
    fn reserves_parse_and_size() {
        assert_eq!(Reserve::parse("default", bytes), Ok(Reserve::Default));
        assert_eq!(Reserve::parse("2%", bytes), Ok(Reserve::Percent(2.0)));
        assert_eq!(Reserve::parse("4MB", bytes), Ok(Reserve::Bytes(4 << 20)));
        assert_eq!(
            Reserve::parse("0", |_| Err("no".into())),
            Ok(Reserve::Bytes(0))
        );
        assert!(Reserve::parse("90%", bytes).is_err());
        assert!(Reserve::parse("x%", bytes).is_err());
        // 1 % of a small filesystem, 256 MiB of a large one.
        assert_eq!(Reserve::Default.bytes_of(100 << 20), (1 << 20));
        assert_eq!(Reserve::Default.bytes_of(1 << 40), 256 << 20);
        assert_eq!(Reserve::Percent(10.0).bytes_of(1000), 100);
    }

    #[test]
    fn admits_above_the_reserve_only() {
        let dir = std::env::temp_dir();
        let free = space_of(&dir).unwrap().free;
        let space = DiskSpace::new(&dir, Reserve::Bytes(0));
        space.admit(0).unwrap();
        let space = DiskSpace::new(&dir, Reserve::Bytes(free.saturating_mul(2).max(1 << 40)));
        let e = space.admit(0).unwrap_err();
        assert_eq!(e.kind.sqlstate(), "53100");
        assert_eq!(space.refused.load(Ordering::Relaxed), 1);
    }
}
