//! Finding .slt files: explicit files as given, directories searched recursively, in sorted order.

use std::collections::HashSet;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// Extension of sqllogictest files.
pub const SLT_EXTENSION: &str = "slt";

/// Why the list of test files could not be built.
#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    /// A path given on the command line does not exist.
    #[error("{0}: no such file or directory")]
    NotFound(PathBuf),
    /// Reading a directory or an entry's metadata failed.
    #[error("{path}: {source}")]
    Io {
        /// The path being read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
}

/// Expands `paths` into the list of .slt files to run.
///
/// A file is taken as it is, whatever its extension. A directory contributes every `*.slt`
/// file below it (symlinked directories are not followed), sorted by path so the order is
/// deterministic. A file reached twice is listed once, at its first position.
pub fn collect_slt_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, DiscoverError> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for path in paths {
        let meta = fs::metadata(path).map_err(|source| {
            if source.kind() == io::ErrorKind::NotFound {
                DiscoverError::NotFound(path.clone())
            } else {
                DiscoverError::Io {
                    path: path.clone(),
                    source,
                }
            }
        })?;
        let mut found = Vec::new();
        if meta.is_dir() {
            walk(path, &mut found)?;
            found.sort();
        } else {
            found.push(path.clone());
        }
        for file in found {
            if seen.insert(file.clone()) {
                out.push(file);
            }
        }
    }
    Ok(out)
}

fn walk(dir: &Path, found: &mut Vec<PathBuf>) -> Result<(), DiscoverError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DiscoverError::Io { path, source }
    };
    for entry in fs::read_dir(dir).map_err(io_err(dir))? {
        let entry = entry.map_err(io_err(dir))?;
        let path = entry.path();
        let file_type = entry.file_type().map_err(io_err(&path))?;
        if file_type.is_dir() {
            walk(&path, found)?;
        } else if path.extension().is_some_and(|ext| ext == SLT_EXTENSION)
            && (file_type.is_file() || fs::metadata(&path).is_ok_and(|m| m.is_file()))
        {
            found.push(path);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_slt_files_recursively_and_sorted() {
        let root = std::env::temp_dir().join(format!("eddy-slt-files-{}", std::process::id()));
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(root.join("b/nested")).expect("mkdir");
        fs::create_dir_all(root.join("a")).expect("mkdir");
        for f in [
            "b/nested/z.slt",
            "b/y.slt",
            "a/x.slt",
            "a/notes.txt",
            "top.slt",
        ] {
            fs::write(root.join(f), "").expect("write");
        }
        let found = collect_slt_files(&[root.clone(), root.join("top.slt")]).expect("collect");
        let rel: Vec<_> = found
            .iter()
            .map(|p| {
                p.strip_prefix(&root)
                    .expect("under root")
                    .to_string_lossy()
                    .replace('\\', "/")
            })
            .collect();
        assert_eq!(rel, ["a/x.slt", "b/nested/z.slt", "b/y.slt", "top.slt"]);
        assert!(matches!(
            collect_slt_files(&[root.join("missing")]),
            Err(DiscoverError::NotFound(_))
        ));
        let _ = fs::remove_dir_all(&root);
    }
}
