//! Every limit a client meets, named, with its default, in one place. `ALTER SYSTEM SET
//! name = value` changes one while the node runs and keeps it in `eddy.auto.conf`;
//! `SHOW name` reads it.
//!
//! A limit one statement or message reaches fails it with 54000 (program_limit_exceeded);
//! a connection limit refuses the connection with 53300 (too_many_connections), as
//! PostgreSQL does. The session goes on after a 54000; nothing of the statement applies.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use eddy_planner::{Error, ErrorKind};

/// One limit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Limit {
    /// Sessions: connections that sent their startup message.
    Connections,
    /// Connections still logging in (each is dropped after `authentication_timeout`).
    PendingConnections,
    /// Open connections that log in as one role.
    ConnectionsPerRole,
    /// One protocol message (a query, a COPY data message, a bind), checked from its
    /// length header before it is read.
    MessageBytes,
    /// The text of one query string or prepared statement.
    StatementBytes,
    /// Rows of one INSERT.
    InsertRows,
    /// One row of COPY FROM.
    CopyRowBytes,
    /// Open continuous queries on the node (`EMIT CHANGES`).
    Subscriptions,
    /// What one session holds for a statement in progress: the data of a COPY, which
    /// applies all or nothing at its end, or the result of a query.
    SessionMemoryBytes,
    /// Time from connecting to being logged in; a client slower than this is dropped.
    AuthenticationTimeout,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Unit {
    Count,
    Bytes,
    Seconds,
}

struct Spec {
    limit: Limit,
    name: &'static str,
    default: u64,
    unit: Unit,
    what: &'static str,
}

const MIB: u64 = 1 << 20;

/// The limits, their names and defaults.
const SPECS: [Spec; 10] = [
    Spec {
        limit: Limit::Connections,
        name: "max_connections",
        default: 500,
        unit: Unit::Count,
        what: "sessions: connections that sent their startup message (53300)",
    },
    Spec {
        limit: Limit::PendingConnections,
        name: "max_pending_connections",
        default: 4096,
        unit: Unit::Count,
        what: "connections still logging in; past it new sockets are closed at once",
    },
    Spec {
        limit: Limit::ConnectionsPerRole,
        name: "max_connections_per_role",
        default: 500,
        unit: Unit::Count,
        what: "open connections of one role (53300)",
    },
    Spec {
        limit: Limit::MessageBytes,
        name: "max_message_bytes",
        default: 64 * MIB,
        unit: Unit::Bytes,
        what: "one protocol message, checked from its header (54000, FATAL)",
    },
    Spec {
        limit: Limit::StatementBytes,
        name: "max_statement_bytes",
        default: 16 * MIB,
        unit: Unit::Bytes,
        what: "the text of one query string or prepared statement (54000)",
    },
    Spec {
        limit: Limit::InsertRows,
        name: "max_insert_rows",
        default: 100_000,
        unit: Unit::Count,
        what: "rows of one INSERT (54000)",
    },
    Spec {
        limit: Limit::CopyRowBytes,
        name: "max_copy_row_bytes",
        default: MIB,
        unit: Unit::Bytes,
        what: "one row of COPY FROM (54000)",
    },
    Spec {
        limit: Limit::Subscriptions,
        name: "max_subscriptions",
        default: 1_000,
        unit: Unit::Count,
        what: "open EMIT CHANGES queries on the node (54000)",
    },
    Spec {
        limit: Limit::SessionMemoryBytes,
        name: "session_memory_bytes",
        default: 1024 * MIB,
        unit: Unit::Bytes,
        what: "what a session holds for a statement in progress: a COPY's data, a query's result (54000)",
    },
    Spec {
        limit: Limit::AuthenticationTimeout,
        name: "authentication_timeout",
        default: 10,
        unit: Unit::Seconds,
        what: "time to log in before the connection is dropped",
    },
];

fn spec(limit: Limit) -> &'static Spec {
    SPECS
        .iter()
        .find(|s| s.limit == limit)
        .expect("every limit has a spec")
}

/// The limits from the places a start takes them, weakest first; `ALTER SYSTEM`'s kept
/// values go between `file` and `env`.
#[derive(Clone, Debug, Default)]
pub struct LimitLayers {
    pub file: BTreeMap<String, String>,
    /// `EDDY_<NAME>` variables.
    pub env: BTreeMap<String, String>,
}

/// The variable that overrides the limit `name`.
pub fn limit_env(name: &str) -> String {
    format!("EDDY_{}", name.to_ascii_uppercase())
}

impl LimitLayers {
    /// The file's limits and the environment's.
    pub fn of(file: Option<&BTreeMap<String, String>>) -> anyhow::Result<LimitLayers> {
        let mut env = BTreeMap::new();
        for name in Limits::names() {
            if let Ok(value) = std::env::var(limit_env(name)) {
                Limits::default()
                    .set(name, Some(&value))
                    .map_err(|e| anyhow::anyhow!("{}: {}", limit_env(name), reason(&e)))?;
                env.insert(name.to_string(), value);
            }
        }
        Ok(LimitLayers {
            file: file.cloned().unwrap_or_default(),
            env,
        })
    }
}

/// An error's message with its hint, for a line of the log or of a refused start.
pub fn reason(e: &eddy_planner::Error) -> String {
    match &e.hint {
        Some(hint) => format!("{} ({hint})", e.message),
        None => e.message.clone(),
    }
}

/// The node's current limits.
#[derive(Debug)]
pub struct Limits {
    values: [AtomicU64; SPECS.len()],
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            values: std::array::from_fn(|i| AtomicU64::new(SPECS[i].default)),
        }
    }
}

impl Limits {
    /// The defaults, then the file's limits, the ones `ALTER SYSTEM` kept (`kept`; those
    /// that do not parse are reported and skipped), then the environment's.
    pub fn from_layers(layers: &LimitLayers, kept: &BTreeMap<String, String>) -> Limits {
        let limits = Limits::default();
        for (name, value) in layers.file.iter().chain(kept).chain(&layers.env) {
            if Limits::is_limit(name) {
                if let Err(e) = limits.set(name, Some(value)) {
                    tracing::warn!(
                        "ignoring {name} in {}: {}",
                        crate::ops::settings::AUTO_CONF,
                        e.message
                    );
                }
            }
        }
        limits
    }

    /// Every limit's name.
    pub fn names() -> impl Iterator<Item = &'static str> {
        SPECS.iter().map(|s| s.name)
    }

    pub fn get(&self, limit: Limit) -> u64 {
        self.values[index(limit)].load(Ordering::Relaxed)
    }

    pub fn timeout(&self, limit: Limit) -> Duration {
        Duration::from_secs(self.get(limit))
    }

    pub fn is_limit(name: &str) -> bool {
        SPECS.iter().any(|s| s.name == name)
    }

    /// Sets the limit `name` from its text (`None`: back to the default).
    pub fn set(&self, name: &str, value: Option<&str>) -> Result<(), Error> {
        let (i, spec) = SPECS
            .iter()
            .enumerate()
            .find(|(_, s)| s.name == name)
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::UndefinedObject,
                    format!("unrecognized configuration parameter \"{name}\""),
                )
            })?;
        let n = match value {
            None => spec.default,
            Some(text) => parse(spec.unit, text).ok_or_else(|| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    format!("invalid value for parameter \"{name}\": \"{text}\""),
                )
                .with_hint(match spec.unit {
                    Unit::Count => "A positive whole number.",
                    Unit::Bytes => "A positive size: bytes, or a number with kB, MB or GB.",
                    Unit::Seconds => "A positive time: seconds, or a number with ms, s, min or h.",
                })
            })?,
        };
        self.values[i].store(n, Ordering::Relaxed);
        Ok(())
    }

    /// `SHOW name`: the value as PostgreSQL shows its settings, or `None` for a name
    /// that is not a limit.
    pub fn show(&self, name: &str) -> Option<String> {
        let spec = SPECS.iter().find(|s| s.name == name)?;
        let n = self.get(spec.limit);
        Some(match spec.unit {
            Unit::Count => n.to_string(),
            Unit::Bytes if n.is_multiple_of(1 << 30) => format!("{}GB", n >> 30),
            Unit::Bytes if n.is_multiple_of(MIB) => format!("{}MB", n >> 20),
            Unit::Bytes if n.is_multiple_of(1024) => format!("{}kB", n >> 10),
            Unit::Bytes => format!("{n}B"),
            Unit::Seconds => format!("{n}s"),
        })
    }

    /// Every limit: name, setting, default and what it bounds (`SHOW LIMITS`).
    pub fn table(&self) -> Vec<Vec<String>> {
        let defaults = Limits::default();
        SPECS
            .iter()
            .map(|s| {
                vec![
                    s.name.to_string(),
                    self.show(s.name).unwrap_or_default(),
                    defaults.show(s.name).unwrap_or_default(),
                    s.what.to_string(),
                ]
            })
            .collect()
    }

    /// Fails with 54000 when `got` passes the limit.
    pub fn check(&self, limit: Limit, got: u64, what: &str) -> Result<(), Error> {
        let max = self.get(limit);
        if got <= max {
            return Ok(());
        }
        let spec = spec(limit);
        Err(Error::new(
            ErrorKind::ProgramLimitExceeded,
            format!("{what} ({got}) exceeds {} ({max})", spec.name),
        )
        .with_hint(format!(
            "Split the work into smaller pieces, or raise the limit with ALTER SYSTEM SET {} = ….",
            spec.name
        )))
    }
}

fn index(limit: Limit) -> usize {
    SPECS
        .iter()
        .position(|s| s.limit == limit)
        .expect("every limit has a spec")
}

/// A positive size in bytes: a number, or one with kB, MB or GB (`--chunk-cache-bytes`).
pub fn parse_bytes(text: &str) -> Result<usize, String> {
    parse(Unit::Bytes, text).map(|n| n as usize).ok_or_else(|| {
        format!("expected a positive size: bytes, or a number with kB, MB or GB, got \"{text}\"")
    })
}

/// A positive value in `unit`, with PostgreSQL's unit suffixes.
fn parse(unit: Unit, text: &str) -> Option<u64> {
    let text = text.trim();
    let digits = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let n: u64 = text[..digits].parse().ok()?;
    let scale = match (unit, text[digits..].trim()) {
        (_, "") => 1,
        (Unit::Bytes, "B") => 1,
        (Unit::Bytes, "kB") => 1 << 10,
        (Unit::Bytes, "MB") => 1 << 20,
        (Unit::Bytes, "GB") => 1 << 30,
        (Unit::Seconds, "s") => 1,
        (Unit::Seconds, "min") => 60,
        (Unit::Seconds, "h") => 3600,
        (Unit::Seconds, "ms") => return (n >= 1000).then_some(n / 1000),
        _ => return None,
    };
    n.checked_mul(scale).filter(|n| *n > 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_parse_with_units_and_refuse_nonsense() {
        let limits = Limits::default();
        assert_eq!(limits.get(Limit::StatementBytes), 16 << 20);
        limits.set("max_statement_bytes", Some("2MB")).unwrap();
        assert_eq!(limits.get(Limit::StatementBytes), 2 << 20);
        assert_eq!(limits.show("max_statement_bytes").as_deref(), Some("2MB"));
        limits.set("authentication_timeout", Some("2min")).unwrap();
        assert_eq!(
            limits.timeout(Limit::AuthenticationTimeout),
            Duration::from_secs(120)
        );
        for bad in ["0", "-1", "12 parsecs", "", "1.5GB"] {
            let e = limits.set("max_statement_bytes", Some(bad)).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidParameter, "{bad}");
        }
        let e = limits.set("max_nothing", Some("1")).unwrap_err();
        assert_eq!(e.kind, ErrorKind::UndefinedObject);
        limits.set("max_statement_bytes", None).unwrap();
        assert_eq!(limits.get(Limit::StatementBytes), 16 << 20);
        let e = limits
            .check(Limit::InsertRows, 100_001, "rows in the INSERT")
            .unwrap_err();
        assert_eq!(e.kind, ErrorKind::ProgramLimitExceeded);
        assert!(e.message.contains("max_insert_rows"), "{}", e.message);
        assert!(limits.check(Limit::InsertRows, 100_000, "rows").is_ok());
    }
}
