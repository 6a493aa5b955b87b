//! `BACKUP TO '/dir'`: a copy of the node's data directory, taken while it serves, that
//! `eddy serve --data-dir /dir` starts from.
//!
//! The copy is made right after a checkpoint, with no other checkpoint until it is done
//! (`Engine::checkpoint_then`), so nothing that checkpoint reads is deleted meanwhile:
//! its RocksDB copy, the reservoir segments its marks name, and the log from its offsets
//! on. What the copy holds is that checkpoint and whatever the logs held when each was
//! copied: every event acknowledged before the backup began, and, per task, a prefix of
//! those acknowledged while it ran (a record torn by the copy is cut when the backup is
//! opened, as after a crash).
//!
//! Left out: the live RocksDB database (`state/`, rebuilt from the checkpoint at start),
//! older checkpoints, staged transfers, the log's journal (its records are in the task
//! logs) and the directory lock. Table files are hard-linked when the backup is on the
//! same filesystem (they never change); everything else is copied, and every file and
//! directory is fsynced before the statement returns.

use std::fs;
use std::path::{Path, PathBuf};

use eddy_planner::{Error, Result};

/// What a backup wrote.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub bytes: u64,
}

/// Names under the data directory a backup leaves out.
const SKIPPED: [&str; 3] = ["eddy.pid", "state", "transfers"];

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| match eddy_storage::is_disk_full(&e) {
        true => Error::disk_full(format!("backup: {}: {e}", path.display())),
        false => Error::internal(format!("backup: {}: {e}", path.display())),
    }
}

/// Checks that `dest` can take a backup: an absolute path, not inside the data
/// directory, that does not exist or is an empty directory.
pub fn check_destination(data_dir: &Path, dest: &str) -> Result<PathBuf> {
    let dest = PathBuf::from(dest);
    if !dest.is_absolute() {
        return Err(Error::new(
            eddy_planner::ErrorKind::InvalidParameter,
            format!(
                "backup directory \"{}\" is not an absolute path",
                dest.display()
            ),
        ));
    }
    let inside = |d: &Path| {
        fs::canonicalize(data_dir)
            .ok()
            .zip(d.parent().and_then(|p| fs::canonicalize(p).ok()))
            .is_some_and(|(data, parent)| parent.starts_with(data))
    };
    if inside(&dest) {
        return Err(Error::new(
            eddy_planner::ErrorKind::InvalidParameter,
            format!(
                "backup directory \"{}\" is inside the data directory",
                dest.display()
            ),
        ));
    }
    match fs::read_dir(&dest).map(|mut entries| entries.next().is_some()) {
        Ok(true) => Err(Error::new(
            eddy_planner::ErrorKind::DuplicateObject,
            format!("backup directory \"{}\" is not empty", dest.display()),
        )
        .with_hint("Back up into a new directory, or an empty one.")),
        Ok(false) => Ok(dest),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(dest),
        Err(e) => Err(io(&dest)(e)),
    }
}

/// Copies the data directory `from` to `to` for checkpoint `checkpoint` (see the module's
/// header), and fsyncs what it wrote.
pub fn copy_data_dir(from: &Path, to: &Path, checkpoint: u64) -> Result<Copied> {
    let keep = |relative: &Path| -> bool {
        let mut parts = relative
            .components()
            .map(|c| c.as_os_str().to_string_lossy());
        let Some(first) = parts.next() else {
            return true;
        };
        if SKIPPED.contains(&first.as_ref()) {
            return false;
        }
        if first == "log" && parts.next().is_some_and(|p| p == "node-journal") {
            return false;
        }
        // Of the checkpoints, the pointer and the one it names.
        if first == "checkpoints" {
            return match parts.next() {
                None => true,
                Some(name) => name == "CURRENT" || name == format!("{checkpoint:020}"),
            };
        }
        true
    };
    let mut copied = Copied::default();
    copy_tree(from, to, Path::new(""), &keep, &mut copied)?;
    if let Some(parent) = to.parent() {
        sync_dir(parent)?;
    }
    Ok(copied)
}

fn copy_tree(
    root: &Path,
    to_root: &Path,
    relative: &Path,
    keep: &dyn Fn(&Path) -> bool,
    copied: &mut Copied,
) -> Result<()> {
    let from = root.join(relative);
    let to = to_root.join(relative);
    fs::create_dir_all(&to).map_err(io(&to))?;
    let mut entries: Vec<_> = fs::read_dir(&from)
        .map_err(io(&from))?
        .filter_map(|e| e.ok())
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let name = relative.join(entry.file_name());
        if !keep(&name) {
            continue;
        }
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            copy_tree(root, to_root, &name, keep, copied)?;
        } else if kind.is_file() {
            copy_file(&root.join(&name), &to_root.join(&name), copied)?;
        }
    }
    sync_dir(&to)
}

fn copy_file(from: &Path, to: &Path, copied: &mut Copied) -> Result<()> {
    let immutable = from.extension().is_some_and(|e| e == "sst");
    if immutable && fs::hard_link(from, to).is_ok() {
        copied.files += 1;
        return Ok(());
    }
    match fs::copy(from, to) {
        Ok(bytes) => copied.bytes += bytes,
        // Gone since it was listed (a segment a task dropped): not part of the checkpoint.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(io(to)(e)),
    }
    copied.files += 1;
    fs::File::open(to)
        .and_then(|f| f.sync_all())
        .map_err(io(to))
}

fn sync_dir(dir: &Path) -> Result<()> {
    fs::File::open(dir)
        .and_then(|f| f.sync_all())
        .map_err(io(dir))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_what_a_start_needs_and_nothing_else() {
        let base = std::env::temp_dir().join(format!("eddy-backup-unit-{}", std::process::id()));
        let _ = fs::remove_dir_all(&base);
        let data = base.join("data");
        for (path, body) in [
            ("catalog.sql", "x"),
            ("eddy.pid", "1"),
            ("state/000001.sst", "live"),
            ("checkpoints/CURRENT", "2\n"),
            ("checkpoints/00000000000000000001/000001.sst", "old"),
            ("checkpoints/00000000000000000002/000002.sst", "new"),
            ("checkpoints/00000000000000000002/MANIFEST-1", "m"),
            ("log/node-journal/00000000000000000000.log", "j"),
            ("log/s/0-0/00000000000000000000.log", "records"),
            ("reservoir/s/0-0/00000000000000000000.seg", "chunks"),
        ] {
            let p = data.join(path);
            fs::create_dir_all(p.parent().unwrap()).unwrap();
            fs::write(&p, body).unwrap();
        }
        let dest = check_destination(&data, base.join("copy").to_str().unwrap()).unwrap();
        let copied = copy_data_dir(&data, &dest, 2).unwrap();
        let mut found = Vec::new();
        fn walk(dir: &Path, root: &Path, out: &mut Vec<String>) {
            for e in fs::read_dir(dir).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    walk(&p, root, out);
                } else {
                    out.push(p.strip_prefix(root).unwrap().display().to_string());
                }
            }
        }
        walk(&dest, &dest, &mut found);
        found.sort();
        assert_eq!(
            found,
            [
                "catalog.sql",
                "checkpoints/00000000000000000002/000002.sst",
                "checkpoints/00000000000000000002/MANIFEST-1",
                "checkpoints/CURRENT",
                "log/s/0-0/00000000000000000000.log",
                "reservoir/s/0-0/00000000000000000000.seg",
            ]
        );
        assert_eq!(copied.files, 6);
        // A second backup into the same, now full, directory is refused.
        let again = check_destination(&data, dest.to_str().unwrap()).unwrap_err();
        assert_eq!(again.kind.sqlstate(), "42P07");
        assert!(check_destination(&data, "relative/dir").is_err());
        assert!(check_destination(&data, data.join("inside").to_str().unwrap()).is_err());
        let _ = fs::remove_dir_all(&base);
    }
}
