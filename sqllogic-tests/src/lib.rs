//! Runs sqllogictest (.slt) files against a running Eddy server over the PostgreSQL wire protocol.
//!
//! Each file gets its own [`sqllogictest::Runner`] and a fresh connection (`connection NAME`
//! records in a file open further connections on demand). Values come back in text format:
//! `NULL` for SQL NULL, `(empty)` for the empty string. Errors display as
//! `<SQLSTATE> <message>`, so `statement error 42P01` matches by regex. A query's type string
//! (`query IT`) must have one character per result column (or be empty); the characters
//! themselves are not checked, since the simple-query protocol does not report column types.
//! Every file gets the runner variables `EDDY_PG_HOST` and `EDDY_PG_PORT` (see
//! [`connection_vars`]): after `control substitution on`, a `system ok` record can reach the
//! server with `psql -h $EDDY_PG_HOST -p $EDDY_PG_PORT -U eddy -d eddy`, e.g. to feed COPY data.

pub mod db;
pub mod files;

use std::path::{Path, PathBuf};

use sqllogictest::{default_normalizer, default_validator, DefaultColumnType, Runner, TestError};

pub use db::{EddyDb, PgError};
pub use files::{collect_slt_files, DiscoverError};

/// Files shorter than this are checked instead of rewritten (see [`run_file`]).
const MIN_REWRITE_LEN: usize = 16;

/// What to do with each file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Run the file and compare against its expected output.
    Check,
    /// Run the file and rewrite its expected output (results, errors, counts) in place.
    Rewrite,
}

/// Why one file did not pass.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The first connection for the file could not be opened.
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        /// The server address.
        addr: String,
        /// What went wrong.
        source: PgError,
    },
    /// The file's path is not valid UTF-8 (the sqllogictest parser needs a `str`).
    #[error("path is not valid UTF-8")]
    NonUtf8Path,
    /// The file cannot be read as UTF-8 text (checked up front: the parser would panic).
    #[error("cannot read file: {0}")]
    Read(#[source] std::io::Error),
    /// A record failed (parse error, wrong result, unexpected error, ...).
    #[error("{}", .0.display(false).to_string().trim_end())]
    Test(#[from] TestError),
    /// Rewriting the file failed.
    #[error("rewrite failed: {0}")]
    Rewrite(String),
}

/// The result of one file.
#[derive(Debug)]
pub struct FileOutcome {
    /// The .slt file.
    pub path: PathBuf,
    /// `Ok` if the file passed (or was rewritten).
    pub result: Result<(), FileError>,
}

impl FileOutcome {
    /// Whether the file passed.
    pub fn passed(&self) -> bool {
        self.result.is_ok()
    }

    /// The report for this file: `ok   PATH`, or `FAIL PATH` followed by the error, indented.
    pub fn report(&self, shown_path: &Path) -> String {
        match &self.result {
            Ok(()) => format!("ok   {}", shown_path.display()),
            Err(err) => {
                let mut out = format!("FAIL {}", shown_path.display());
                for line in err.to_string().lines() {
                    out.push_str("\n     ");
                    out.push_str(line);
                }
                out
            }
        }
    }
}

/// Column check used when running: the `query` type string must be empty or name exactly one
/// type per result column. (Types are all `Any` on our side, so characters are not compared.)
#[allow(clippy::ptr_arg)] // signature fixed by `sqllogictest::ColumnTypeValidator`
pub fn column_count_validator(
    actual: &Vec<DefaultColumnType>,
    expected: &Vec<DefaultColumnType>,
) -> bool {
    expected.is_empty() || actual.len() == expected.len()
}

/// Column check used when rewriting: keep the file's type string if it has the right length,
/// otherwise replace it (with one `?` per column).
#[allow(clippy::ptr_arg)] // signature fixed by `sqllogictest::ColumnTypeValidator`
pub fn rewrite_column_validator(
    actual: &Vec<DefaultColumnType>,
    expected: &Vec<DefaultColumnType>,
) -> bool {
    !expected.is_empty() && actual.len() == expected.len()
}

/// Host variable set for every file: `$EDDY_PG_HOST` in records run with `control substitution on`.
pub const HOST_VAR: &str = "EDDY_PG_HOST";
/// Port variable set for every file: `$EDDY_PG_PORT` in records run with `control substitution on`.
pub const PORT_VAR: &str = "EDDY_PG_PORT";

/// The runner variables that tell `system` records where the server is, so a file can pipe data
/// into `psql -h $EDDY_PG_HOST -p $EDDY_PG_PORT` (COPY data cannot travel over the runner's own
/// connection). Empty if `addr` does not parse (the connection attempt reports that).
pub fn connection_vars(addr: &str) -> Vec<(String, String)> {
    let Ok(config) = db::pg_config(addr) else {
        return Vec::new();
    };
    let host = config.get_hosts().iter().find_map(|h| match h {
        tokio_postgres::config::Host::Tcp(name) => Some(name.clone()),
        #[allow(unreachable_patterns)]
        _ => None,
    });
    match (host, config.get_ports().first()) {
        (Some(host), Some(port)) => vec![
            (HOST_VAR.to_owned(), host),
            (PORT_VAR.to_owned(), port.to_string()),
        ],
        _ => Vec::new(),
    }
}

/// Runs (or rewrites) one .slt file against the server at `addr` on fresh connections.
///
/// In [`Mode::Rewrite`], the file's expected output is replaced in place by what the server
/// returned (files under 16 bytes are only checked). Rewriting does not report mismatches.
pub async fn run_file(addr: &str, path: &Path, mode: Mode) -> Result<(), FileError> {
    if path.to_str().is_none() {
        return Err(FileError::NonUtf8Path);
    }
    let text = std::fs::read_to_string(path).map_err(FileError::Read)?;
    // sqllogictest's rewriter panics when its output is shorter than 8 bytes; such a file holds
    // no record worth rewriting, so just check it.
    let mode = if text.len() < MIN_REWRITE_LEN {
        Mode::Check
    } else {
        mode
    };
    // Connect up front so an unreachable server is reported as such, not as a failed record.
    let first = EddyDb::connect(addr)
        .await
        .map_err(|source| FileError::Connect {
            addr: addr.to_owned(),
            source,
        })?;
    let mut first = Some(first);
    let addr_owned = addr.to_owned();
    let mut runner = Runner::new(move || {
        let ready = first.take();
        let addr = addr_owned.clone();
        async move {
            match ready {
                Some(db) => Ok(db),
                None => EddyDb::connect(&addr).await,
            }
        }
    });
    runner.with_column_validator(column_count_validator);
    for (key, value) in connection_vars(addr) {
        runner.set_var(key, value);
    }

    let result = match mode {
        Mode::Check => runner.run_file_async(path).await.map_err(FileError::from),
        Mode::Rewrite => runner
            .update_test_file(
                path,
                " ",
                default_validator,
                default_normalizer,
                rewrite_column_validator,
            )
            .await
            .map_err(|e| FileError::Rewrite(e.to_string())),
    };
    runner.shutdown_async().await;
    result
}

/// Runs `files` one after another, calling `on_done` as each finishes, and returns all outcomes.
pub async fn run_files(
    addr: &str,
    files: &[PathBuf],
    mode: Mode,
    mut on_done: impl FnMut(&FileOutcome),
) -> Vec<FileOutcome> {
    let mut outcomes = Vec::with_capacity(files.len());
    for path in files {
        let outcome = FileOutcome {
            path: path.clone(),
            result: run_file(addr, path, mode).await,
        };
        on_done(&outcome);
        outcomes.push(outcome);
    }
    outcomes
}

/// The closing line for a run: `N passed, N failed`.
pub fn summary(outcomes: &[FileOutcome]) -> String {
    let passed = outcomes.iter().filter(|o| o.passed()).count();
    format!("{passed} passed, {} failed", outcomes.len() - passed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_validators() {
        use DefaultColumnType::{Any, Integer, Text};
        let two = vec![Any, Any];
        assert!(column_count_validator(&two, &vec![]));
        assert!(column_count_validator(&two, &vec![Integer, Text]));
        assert!(!column_count_validator(&two, &vec![Integer]));
        assert!(!rewrite_column_validator(&two, &vec![]));
        assert!(rewrite_column_validator(&two, &vec![Integer, Text]));
    }

    #[test]
    fn connection_vars_name_host_and_port() {
        assert_eq!(
            connection_vars("127.0.0.1:5433"),
            vec![
                (HOST_VAR.to_owned(), "127.0.0.1".to_owned()),
                (PORT_VAR.to_owned(), "5433".to_owned())
            ]
        );
        assert_eq!(
            connection_vars("[::1]:5433")[0],
            (HOST_VAR.to_owned(), "::1".to_owned())
        );
        assert!(connection_vars("nonsense").is_empty());
    }

    #[test]
    fn report_format() {
        let ok = FileOutcome {
            path: "a.slt".into(),
            result: Ok(()),
        };
        assert_eq!(ok.report(Path::new("a.slt")), "ok   a.slt");
        let failed = FileOutcome {
            path: "b.slt".into(),
            result: Err(FileError::Rewrite("x\ny".into())),
        };
        assert_eq!(
            failed.report(Path::new("b.slt")),
            "FAIL b.slt\n     rewrite failed: x\n     y"
        );
        assert_eq!(summary(&[ok, failed]), "1 passed, 1 failed");
    }
}
