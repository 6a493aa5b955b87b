//! `eddy.toml`: every setting of `eddy serve` and every named limit, in one file.
//!
//! A setting's key is its flag without the dashes (`pg_addr` for `--pg-addr`); the
//! limits sit in a `[limits]` table under their `SHOW` names. From the strongest: the
//! command line, the environment (`EDDY_PG_ADDR`, `EDDY_MAX_CONNECTIONS`), what
//! `ALTER SYSTEM` kept in the data directory (shards and the limits), the file, the
//! built-in default.
//!
//! The file's settings become the defaults of the command's arguments, each checked by
//! the argument's own parser first, so a value means the same in the file as on the
//! command line, and a bad one fails the start with its key and the reason.

use std::collections::BTreeMap;
use std::ffi::{OsStr, OsString};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{anyhow, bail, Context};
use clap::error::{ContextKind, ErrorKind};
use clap::parser::ValueSource;
use clap::{ArgAction, ArgMatches, Command};

use crate::ops::limits::{limit_env, reason, LimitLayers, Limits};

/// The environment variable that names the file when `--config` does not.
pub const ENV: &str = "EDDY_CONFIG";

/// A parsed `eddy.toml`.
#[derive(Clone, Debug, Default)]
pub struct File {
    pub path: PathBuf,
    /// Top-level keys, as the text the command line would give (several for a list).
    settings: BTreeMap<String, Vec<String>>,
    /// The `[limits]` table.
    limits: BTreeMap<String, String>,
}

impl File {
    /// The `[limits]` table, as text.
    pub fn limits(&self) -> &BTreeMap<String, String> {
        &self.limits
    }
}

/// The file `--config FILE` (or `--config=FILE`) names in `args`, else `EDDY_CONFIG`.
pub fn path_in(args: &[OsString]) -> Option<PathBuf> {
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        if arg == "--" {
            break;
        }
        if arg == "--config" {
            return args.next().map(PathBuf::from);
        }
        if let Some(path) = arg.to_str().and_then(|a| a.strip_prefix("--config=")) {
            return Some(PathBuf::from(path));
        }
    }
    std::env::var_os(ENV).map(PathBuf::from)
}

/// Reads and checks the shape of `path`: scalars and lists of scalars at the top, and a
/// `[limits]` table whose every value is a valid limit.
pub fn load(path: &Path) -> anyhow::Result<File> {
    let text = std::fs::read_to_string(path).with_context(|| path.display().to_string())?;
    let table: toml::Table = text
        .parse()
        .map_err(|e: toml::de::Error| anyhow!("{}: {}", path.display(), e.to_string().trim()))?;
    let mut file = File {
        path: path.to_path_buf(),
        ..File::default()
    };
    for (key, value) in table {
        let at = |what: String| anyhow!("{}: {key}: {what}", path.display());
        match value {
            toml::Value::Table(limits) if key == "limits" => {
                for (name, value) in limits {
                    let text = scalar(&value).map_err(|e| at(format!("{name}: {e}")))?;
                    Limits::default().set(&name, Some(&text)).map_err(|e| {
                        anyhow!(
                            "{}: limits.{name} = {value}: {}",
                            path.display(),
                            reason(&e)
                        )
                    })?;
                    file.limits.insert(name, text);
                }
            }
            toml::Value::Table(_) => {
                return Err(at("unknown table (the only table is [limits])".into()))
            }
            toml::Value::Array(items) => {
                let items = items.iter().map(scalar).collect::<Result<Vec<_>, _>>();
                file.settings
                    .insert(key.clone(), items.map_err(|e| at(e.to_string()))?);
            }
            value => {
                let text = scalar(&value).map_err(|e| at(e.to_string()))?;
                file.settings.insert(key, vec![text]);
            }
        }
    }
    Ok(file)
}

/// A TOML value as the text of a flag's value.
fn scalar(value: &toml::Value) -> anyhow::Result<String> {
    Ok(match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        _ => bail!("expected a string, number or boolean, got {value}"),
    })
}

/// The setting `key` names among `command`'s arguments (`pg_addr` or `pg-addr`).
fn argument<'a>(command: &'a Command, key: &str) -> Option<&'a clap::Arg> {
    let id = key.replace('-', "_");
    command
        .get_arguments()
        .find(|a| a.get_id() == id.as_str() && a.get_long().is_some() && id != "config")
}

/// Whether `value` is one the argument takes, by its own parser: the reason if not.
fn check(command: &Command, arg: &clap::Arg, value: &str) -> Result<(), String> {
    if matches!(arg.get_action(), ArgAction::SetTrue | ArgAction::SetFalse) {
        return value
            .parse::<bool>()
            .map(drop)
            .map_err(|_| format!("expected true or false, got {value:?}"));
    }
    let long = format!("--{}", arg.get_long().unwrap_or_default());
    let parsed = command
        .clone()
        .try_get_matches_from(["eddy".to_string(), format!("{long}={value}")]);
    match parsed {
        Err(e)
            if matches!(
                e.kind(),
                ErrorKind::InvalidValue | ErrorKind::ValueValidation
            ) && e
                .get(ContextKind::InvalidArg)
                .is_some_and(|a| a.to_string().starts_with(&long)) =>
        {
            let text = e.to_string();
            let first = text.lines().next().unwrap_or_default();
            Err(first.trim_start_matches("error: ").to_string())
        }
        // Another setting's trouble (a bad variable, a flag it requires) is not this one's.
        _ => Ok(()),
    }
}

/// Makes `file`'s settings the defaults of the arguments of `subcommands` of `cli`, after
/// checking each value with the argument's parser.
pub fn apply(mut cli: Command, subcommands: &[&str], file: &File) -> anyhow::Result<Command> {
    let Some(model) = subcommands.first().and_then(|s| cli.find_subcommand(s)) else {
        return Ok(cli);
    };
    let model = model.clone();
    for (key, values) in &file.settings {
        let arg = argument(&model, key).ok_or_else(|| {
            let known: Vec<String> = model
                .get_arguments()
                .filter(|a| a.get_long().is_some() && a.get_id() != "config")
                .map(|a| a.get_id().to_string())
                .collect();
            anyhow!(
                "{}: unknown setting \"{key}\" (settings: {}; limits go in [limits])",
                file.path.display(),
                known.join(", ")
            )
        })?;
        for value in values {
            check(&model, arg, value).map_err(|reason| {
                anyhow!("{}: {key} = {value:?}: {reason}", file.path.display())
            })?;
        }
    }
    for name in subcommands {
        cli = cli.mut_subcommand(*name, |mut sub| {
            for (key, values) in &file.settings {
                let id = argument(&sub, key).map(|a| a.get_id().clone());
                if let Some(id) = id {
                    let values: Vec<clap::builder::OsStr> =
                        values.iter().map(|v| v.clone().into()).collect();
                    sub = sub.mut_arg(id, |a| a.default_values(values));
                }
            }
            sub
        });
    }
    Ok(cli)
}

/// Where a setting's value came from, for `eddy config`.
fn source(matches: &ArgMatches, id: &str, env: Option<&OsStr>, file: Option<&File>) -> String {
    match matches.value_source(id) {
        Some(ValueSource::CommandLine) => "command line".into(),
        Some(ValueSource::EnvVariable) => {
            format!("environment {}", env.unwrap_or_default().to_string_lossy())
        }
        _ if file.is_some_and(|f| f.settings.contains_key(id)) => file
            .map(|f| f.path.display().to_string())
            .unwrap_or_default(),
        _ => "default".into(),
    }
}

/// A value as TOML writes it.
fn toml_value(text: &str) -> String {
    let bare = text.parse::<i64>().is_ok()
        || text
            .parse::<f64>()
            .is_ok_and(|x| x.is_finite() && text.contains('.'))
        || text == "true"
        || text == "false";
    if bare {
        text.to_string()
    } else {
        toml::Value::String(text.to_string()).to_string()
    }
}

/// `eddy config`: the effective configuration as an `eddy.toml`, each value with where it
/// came from. `kept` is what `ALTER SYSTEM` kept in the data directory.
pub fn describe(
    command: &Command,
    matches: &ArgMatches,
    file: Option<&File>,
    kept: &BTreeMap<String, String>,
) -> String {
    let mut out = String::from("# The effective configuration of `eddy serve` (eddy config).\n");
    if let Some(file) = file {
        out.push_str(&format!("# File: {}\n", file.path.display()));
    }
    out.push('\n');
    for arg in command.get_arguments() {
        let id = arg.get_id().as_str();
        if arg.get_long().is_none() || id == "config" {
            continue;
        }
        let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
        let help = help
            .split(". ")
            .next()
            .unwrap_or_default()
            .trim_end_matches('.');
        out.push_str(&format!("# {help}.\n"));
        let values: Vec<String> = matches
            .get_raw(id)
            .map(|v| v.map(|s| s.to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        let mut from = source(matches, id, arg.get_env(), file);
        let kept_value = kept.get(id).filter(|_| {
            !matches!(
                matches.value_source(id),
                Some(ValueSource::CommandLine | ValueSource::EnvVariable)
            )
        });
        let values = match kept_value {
            Some(v) => {
                from = "ALTER SYSTEM".into();
                vec![v.clone()]
            }
            None => values,
        };
        match values.as_slice() {
            [] => out.push_str(&format!("# {id} =   (unset)\n\n")),
            [one] if !matches!(arg.get_action(), ArgAction::Append) => {
                out.push_str(&format!("{id} = {}   # {from}\n\n", toml_value(one)))
            }
            many => {
                let items: Vec<String> = many.iter().map(|v| toml_value(v)).collect();
                out.push_str(&format!("{id} = [{}]   # {from}\n\n", items.join(", ")))
            }
        }
    }
    out.push_str("[limits]\n");
    let layers = LimitLayers::of(file.map(File::limits)).unwrap_or_default();
    let limits = Limits::from_layers(&layers, kept);
    for row in limits.table() {
        let name = &row[0];
        let from = if layers.env.contains_key(name) {
            format!("environment {}", limit_env(name))
        } else if kept.contains_key(name) {
            "ALTER SYSTEM".into()
        } else if layers.file.contains_key(name) {
            file.map(|f| f.path.display().to_string())
                .unwrap_or_default()
        } else {
            "default".into()
        };
        out.push_str(&format!(
            "# {}.\n{name} = {}   # {from}\n",
            row[3],
            toml_value(&row[1])
        ));
    }
    out
}

/// Settings of one server.
#[derive(Clone, Debug)]
pub struct Config {
    pub pg_addr: SocketAddr,
    /// Where `GET /metrics` answers in Prometheus' text format (`None`: nowhere).
    pub http_addr: Option<SocketAddr>,
    pub data_dir: PathBuf,
    pub shards: usize,
    /// Where the shards are pinned (`None`: where the OS puts them).
    pub pinning: Option<Arc<eddy_cluster::placement::Pinning>>,
    /// Time between periodic checkpoints.
    pub checkpoint_interval: std::time::Duration,
    /// With `synchronous_commit = off`, the longest a written event waits for its fsync.
    pub commit_delay: std::time::Duration,
    /// Kafka as the log (cluster mode); `None`: the embedded local log.
    pub kafka: Option<eddy_cluster::KafkaConfig>,
    /// Threads that run client sessions (`SessionThreads`), at least one.
    pub session_threads: usize,
    /// How long a session thread keeps polling its sockets after it answers, before it
    /// sleeps (`busy.rs`); zero: never.
    pub busy_poll: std::time::Duration,
    /// The superuser's password, replacing the one kept (`None`: the kept one, or trust
    /// on loopback only when there is none).
    pub password: Option<String>,
    /// A certificate chain and its private key, in PEM files: clients that ask get TLS.
    pub tls: Option<(PathBuf, PathBuf)>,
    /// Refuse clients that do not use TLS.
    pub tls_required: bool,
    /// The bounds of the state store's caches and the reservoirs' chunks.
    pub storage: eddy_cluster::StorageConfig,
    /// The limits from `eddy.toml` and the environment (`ALTER SYSTEM`'s go between).
    pub limits: crate::ops::limits::LimitLayers,
    /// The server's defaults of session settings (`synchronous_commit`,
    /// `statement_timeout`), canonical; `ALTER SYSTEM`'s kept values replace them,
    /// except for those in `session_given` (from the command line or the environment).
    pub session_defaults: std::collections::BTreeMap<crate::session::settings::Setting, String>,
    pub session_given: std::collections::BTreeSet<crate::session::settings::Setting>,
}

impl Config {
    /// An embedded node on `data_dir` with `eddy serve`'s defaults, listening on a free
    /// loopback port and nowhere for HTTP (for servers started in-process).
    pub fn embedded(data_dir: PathBuf) -> Config {
        Config {
            pg_addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            http_addr: None,
            data_dir,
            shards: 1,
            pinning: None,
            checkpoint_interval: std::time::Duration::from_secs(10),
            commit_delay: std::time::Duration::from_millis(COMMIT_DELAY_MS),
            kafka: None,
            session_threads: default_io_threads(),
            busy_poll: std::time::Duration::from_micros(crate::wire::busy::DEFAULT_US),
            password: None,
            tls: None,
            tls_required: false,
            storage: Default::default(),
            limits: Default::default(),
            session_defaults: Default::default(),
            session_given: Default::default(),
        }
    }
}

/// The default `--commit-delay`, in milliseconds: with `synchronous_commit = off`, the
/// longest a written event waits for its fsync. PostgreSQL's WAL writer flushes every
/// `wal_writer_delay` (200 ms by default), and so does this log. Each flush fsyncs every
/// task log written since the last, and ext4 commits its journal for each: at 10 ms a
/// 4-partition stream made about 400 fdatasyncs a second, and pgbench at 16 clients
/// (`INSERT … RETURNING`, commit off, alternated runs) did 64–67 k/s at 17.1–17.8 µs of CPU
/// a statement, against 68–91 k/s at 13.2–16.9 µs with 200 ms.
pub const COMMIT_DELAY_MS: u64 = 200;

/// Session threads when none are asked for: one per core. Point lookups borrow idle
/// shards and so run on these threads: with one thread, two pgbench clients share one
/// core.
pub fn default_io_threads() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Arg;

    fn cli() -> Command {
        Command::new("eddy").subcommand(
            Command::new("serve")
                .arg(
                    Arg::new("pg_addr")
                        .long("pg-addr")
                        .env("EDDY_TEST_CONFIG_PG")
                        .default_value("127.0.0.1:5433")
                        .value_parser(clap::value_parser!(std::net::SocketAddr)),
                )
                .arg(
                    Arg::new("replicas")
                        .long("replicas")
                        .default_value("2")
                        .value_parser(clap::value_parser!(u32).range(1..=16)),
                )
                .arg(Arg::new("tags").long("tags").action(ArgAction::Append)),
        )
    }

    fn file(text: &str) -> anyhow::Result<File> {
        let dir = std::env::temp_dir().join(format!("eddy-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!(
            "{:x}.toml",
            text.len() * 7919 + text.bytes().map(u64::from).sum::<u64>() as usize
        ));
        std::fs::write(&path, text).unwrap();
        load(&path)
    }

    #[test]
    fn the_file_gives_defaults_that_the_command_line_overrides() {
        let f = file("replicas = 3\npg_addr = \"127.0.0.1:7000\"\ntags = [\"a\", \"b\"]\n[limits]\nmax_connections = 7\n").unwrap();
        let cli = apply(cli(), &["serve"], &f).unwrap();
        let m = cli
            .clone()
            .try_get_matches_from(["eddy", "serve", "--pg-addr", "127.0.0.1:7001"])
            .unwrap();
        let (_, m) = m.subcommand().unwrap();
        assert_eq!(m.get_one::<u32>("replicas"), Some(&3));
        assert_eq!(
            m.get_one::<std::net::SocketAddr>("pg_addr").unwrap().port(),
            7001
        );
        let tags: Vec<&String> = m.get_many("tags").unwrap().collect();
        assert_eq!(tags, ["a", "b"]);
        let text = describe(
            cli.find_subcommand("serve").unwrap(),
            m,
            Some(&f),
            &BTreeMap::new(),
        );
        assert!(text.contains("replicas = 3   # "), "{text}");
        assert!(
            text.contains("pg_addr = \"127.0.0.1:7001\"   # command line"),
            "{text}"
        );
        assert!(text.contains("max_connections = 7   # "), "{text}");
        assert!(
            text.contains("max_insert_rows = 100000   # default"),
            "{text}"
        );
        let layers = LimitLayers::of(Some(f.limits())).unwrap();
        assert_eq!(
            layers.file.get("max_connections").map(String::as_str),
            Some("7")
        );
    }

    #[test]
    fn bad_settings_name_their_key_and_reason() {
        let err = |text: &str| match file(text).and_then(|f| apply(cli(), &["serve"], &f)) {
            Ok(_) => panic!("{text} was accepted"),
            Err(e) => e.to_string(),
        };
        let e = err("replicas = 40\n");
        assert!(
            e.contains("replicas = \"40\"") && e.contains("not in 1..=16"),
            "{e}"
        );
        let e = err("pg_adr = \"x\"\n");
        assert!(
            e.contains("unknown setting \"pg_adr\"") && e.contains("pg_addr"),
            "{e}"
        );
        let e = err("pg_addr = \"nowhere\"\n");
        assert!(e.contains("pg_addr = \"nowhere\": invalid value"), "{e}");
        let e = err("[limits]\nmax_connections = \"lots\"\n");
        assert!(
            e.contains("limits.max_connections") && e.contains("positive whole number"),
            "{e}"
        );
        let e = err("[storage]\nx = 1\n");
        assert!(e.contains("storage: unknown table"), "{e}");
        let e = err("replicas = \n");
        assert!(
            e.contains("TOML") || e.contains("expected") || e.contains("invalid"),
            "{e}"
        );
    }

    #[test]
    fn the_path_comes_from_the_flag_else_the_environment() {
        let args = |a: &[&str]| a.iter().map(OsString::from).collect::<Vec<_>>();
        assert_eq!(
            path_in(&args(&["eddy", "serve", "--config", "a.toml"])),
            Some("a.toml".into())
        );
        assert_eq!(
            path_in(&args(&["eddy", "config", "--config=b.toml"])),
            Some("b.toml".into())
        );
    }
}
