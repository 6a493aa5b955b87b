//! Format versions of what a node writes that has no version of its own: the data
//! directory's files (log and journal records, group states in RocksDB, the catalog file,
//! `eddy.auto.conf`), one version for the directory in `DATA_DIR/FORMAT`; Kafka records
//! (task topics, replies, catalog, cluster topic), a header on each; and peer transfers, a
//! field of the request and of the transfer's header. Task checkpoints, reservoir chunks
//! and marks carry versions of their own.
//!
//! Format 1 is what builds before format versions wrote: nothing tagged. Format 2 is the
//! same bytes, tagged, so a format-1 reader reads format-2 records (it ignores a header it
//! does not know, and protobuf ignores an unknown field). Format 3 (`PACKED`) lets one
//! task record carry many events, so a format-2 reader must not see one: it would read
//! only the first event, or refuse the record. Format 4 (`HELD_BASE`) writes a count
//! window's held events against a base event in group states, about a third of their
//! size, so a format-3 reader must not be sent such a state.
//!
//! Invariants:
//! - a node reads every format from `OLDEST` to `FORMAT`, and refuses a higher one with an
//!   error that names both, never reading it as something else;
//! - in a cluster a node writes the lowest format its live members read (each announces
//!   its own in its facts; a member whose facts it has not read counts as `OLDEST`), so
//!   nodes one version apart read each other's records and transfers while a cluster is
//!   restarted node by node.
//!
//! `EDDY_WRITE_FORMAT=1` makes a node read and write as the builds before format versions
//! did: the rolling-upgrade test starts its "old" nodes so.

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

/// The format this build writes.
pub const FORMAT: u32 = 4;
/// The first format whose task records may pack many events (`log::kafka::produce`):
/// a record's value is one encoded row after another.
pub const PACKED: u32 = 3;
/// The first format whose group states may hold a count window's events written against
/// a base event (`exec::recent`), not each whole.
pub const HELD_BASE: u32 = 4;
/// The oldest format this build reads.
pub const OLDEST: u32 = 1;

/// `OLDEST`, for serde's defaults.
pub fn oldest() -> u32 {
    OLDEST
}

/// The Kafka header that carries a record's format (absent: format 1).
pub const HEADER: &str = "eddy-format";

/// The data directory's format file.
const FILE: &str = "FORMAT";

/// The format this node announces and writes at most: `FORMAT`, or what
/// `EDDY_WRITE_FORMAT` asks for (between `OLDEST` and `FORMAT`).
pub fn own() -> u32 {
    static OWN: OnceLock<u32> = OnceLock::new();
    *OWN.get_or_init(|| {
        std::env::var("EDDY_WRITE_FORMAT")
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .map_or(FORMAT, |v| v.clamp(OLDEST, FORMAT))
    })
}

/// What `writes` gives once set; 0 until a cluster view says (`settle`).
static WRITES: AtomicU32 = AtomicU32::new(0);

/// The format this node writes what it persists and sends now: `own()`, or in a cluster
/// the lowest format its live members read (`settle`; the oldest until the node knows
/// them). Kafka records and group states follow it, since a task's checkpoint may move to
/// any member.
pub fn writes() -> u32 {
    match WRITES.load(Ordering::Relaxed) {
        0 => own(),
        format => format,
    }
}

/// Sets what `writes` gives: `format`, within what this node writes at most; whether
/// that changed it.
pub fn settle(format: u32) -> bool {
    let to = format.clamp(OLDEST, own());
    match WRITES.swap(to, Ordering::Relaxed) {
        0 => own() != to,
        was => was != to,
    }
}

/// Whether this build reads `found`; if not, why, naming `what` holds it.
pub fn check(found: u32, what: &str) -> Result<(), String> {
    if (OLDEST..=FORMAT).contains(&found) {
        Ok(())
    } else {
        Err(format!(
            "{what} is in format {found}, and this build of Eddy reads formats {OLDEST} to \
             {FORMAT}: run the newer build that wrote it"
        ))
    }
}

/// A format as a Kafka header value (decimal text).
pub fn header_value(format: u32) -> String {
    format.to_string()
}

/// The format a Kafka header value names; `None` when the record has no such header
/// (format 1). An unreadable value counts as a format no build reads.
pub fn of_header(value: Option<&[u8]>) -> u32 {
    value
        .and_then(|v| std::str::from_utf8(v).ok())
        .and_then(|v| v.parse().ok())
        .unwrap_or(u32::MAX)
}

/// Opens `data_dir`'s format: refuses one this build does not read, and records the
/// format this node writes once it is newer (nothing in format 1 needs rewriting for
/// format 2). A directory without the file was written in format 1. Returns the format
/// the directory was in.
pub fn open_dir(data_dir: &Path) -> Result<u32, String> {
    let path = data_dir.join(FILE);
    let found = match std::fs::read_to_string(&path) {
        Ok(text) => text.trim().parse::<u32>().unwrap_or(u32::MAX),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => OLDEST,
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    check(found, &format!("the data directory {}", data_dir.display()))?;
    if own() > found {
        let tmp = data_dir.join("FORMAT.tmp");
        let write = || -> std::io::Result<()> {
            std::fs::write(&tmp, format!("{}\n", own()))?;
            std::fs::File::open(&tmp)?.sync_all()?;
            std::fs::rename(&tmp, &path)?;
            std::fs::File::open(data_dir)?.sync_all()
        };
        write().map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("eddy-format-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_directory_without_a_format_is_format_one_and_is_marked_on_open() {
        let dir = scratch("one");
        assert_eq!(open_dir(&dir), Ok(1));
        assert_eq!(
            std::fs::read_to_string(dir.join(FILE)).unwrap(),
            format!("{FORMAT}\n")
        );
        assert_eq!(open_dir(&dir), Ok(FORMAT));
    }

    #[test]
    fn a_newer_format_is_refused_and_left_as_it_is() {
        let dir = scratch("newer");
        std::fs::write(dir.join(FILE), format!("{}\n", FORMAT + 1)).unwrap();
        let e = open_dir(&dir).unwrap_err();
        assert!(e.contains(&format!("format {}", FORMAT + 1)), "{e}");
        assert!(e.contains(&format!("reads formats 1 to {FORMAT}")), "{e}");
        assert_eq!(
            std::fs::read_to_string(dir.join(FILE)).unwrap(),
            format!("{}\n", FORMAT + 1)
        );
    }

    #[test]
    fn headers_name_their_format() {
        assert_eq!(of_header(Some(header_value(2).as_bytes())), 2);
        assert_eq!(of_header(Some(b"x")), u32::MAX);
        assert!(check(of_header(Some(b"x")), "a record").is_err());
        assert!(check(1, "a record").is_ok() && check(FORMAT, "a record").is_ok());
        assert!(check(0, "a record").is_err());
    }
}
