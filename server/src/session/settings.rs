//! The settings a session reads and changes with `SET`, `SHOW` and `RESET`, and where a
//! session's starting values come from. From the weakest:
//!
//! 1. the server's default: the built-in one, then `eddy.toml`, `ALTER SYSTEM`, the
//!    environment and the command line (`--synchronous-commit`, `--statement-timeout`);
//! 2. the role's (`ALTER ROLE name SET setting = value`);
//! 3. the client's startup message: a parameter of the setting's name, or
//!    `options=-c name=value` (what `PGOPTIONS`, libpq's `options` and pgjdbc's
//!    `options` property send);
//! 4. `SET` in the session.
//!
//! `RESET name` goes back to the value the session started with (1 to 3), as in
//! PostgreSQL. A value is checked, and kept in the form `SHOW` gives, wherever it is set.

use std::collections::BTreeMap;
use std::time::Duration;

use eddy_planner::{Error, ErrorKind};

/// A setting a session has.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    /// `on`: a statement is acknowledged once its events are fsynced; `off`: once they
    /// are written, with the fsync within the commit delay.
    SynchronousCommit,
    /// The longest a statement may run before it is cancelled with 57014 (0: no limit).
    StatementTimeout,
    /// The zone TIMESTAMPTZ values are shown in.
    TimeZone,
    ApplicationName,
    /// The rows a continuous query's queue holds before it coalesces or fails.
    SubscriptionRowsMax,
}

impl Setting {
    pub const ALL: [Setting; 5] = [
        Setting::SynchronousCommit,
        Setting::StatementTimeout,
        Setting::TimeZone,
        Setting::ApplicationName,
        Setting::SubscriptionRowsMax,
    ];

    /// The setting a name (in any case) stands for.
    pub fn named(name: &str) -> Option<Setting> {
        Setting::ALL
            .into_iter()
            .find(|s| s.name().eq_ignore_ascii_case(name))
    }

    /// The setting a name stands for, or 42704 naming those there are.
    pub fn parse(name: &str) -> Result<Setting, Error> {
        Setting::named(name).ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
            .with_hint(format!(
                "The session settings are {}.",
                Setting::ALL.map(|s| s.name()).join(", ")
            ))
        })
    }

    /// Its name, as `SHOW` titles its column.
    pub fn name(self) -> &'static str {
        match self {
            Setting::SynchronousCommit => "synchronous_commit",
            Setting::StatementTimeout => "statement_timeout",
            Setting::TimeZone => "TimeZone",
            Setting::ApplicationName => "application_name",
            Setting::SubscriptionRowsMax => "subscription_rows_max",
        }
    }

    /// The built-in default.
    pub fn default_value(self) -> &'static str {
        match self {
            Setting::SynchronousCommit => "on",
            Setting::StatementTimeout => "0",
            Setting::TimeZone => "UTC",
            Setting::ApplicationName => "",
            Setting::SubscriptionRowsMax => "10000",
        }
    }

    /// Whether the server's configuration and `ALTER SYSTEM` give it a default.
    pub fn server_wide(self) -> bool {
        matches!(self, Setting::SynchronousCommit | Setting::StatementTimeout)
    }

    /// The value as `SHOW` gives it, or 22023 naming the setting and what it takes.
    pub fn canonical(self, value: &str) -> Result<String, Error> {
        let text = value.trim();
        let found = match self {
            Setting::SynchronousCommit => {
                on_off(text).map(|on| if on { "on" } else { "off" }.into())
            }
            Setting::StatementTimeout => parse_millis(text).map(show_millis),
            Setting::TimeZone => {
                crate::session::cells::time_zone(text).map(|z| z.name().to_string())
            }
            Setting::ApplicationName => Some(value.to_string()),
            Setting::SubscriptionRowsMax => text
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .map(|n| n.to_string()),
        };
        found.ok_or_else(|| {
            Error::new(
                ErrorKind::InvalidParameter,
                format!(
                    "invalid value for parameter \"{}\": \"{value}\"",
                    self.name()
                ),
            )
            .with_hint(match self {
                Setting::SynchronousCommit => "Available values: on, off.",
                Setting::StatementTimeout => {
                    "A time: milliseconds, or a number with ms, s, min or h; 0 turns it off."
                }
                Setting::TimeZone => "A time zone name such as 'UTC' or 'Europe/Paris'.",
                Setting::ApplicationName => "",
                Setting::SubscriptionRowsMax => "A positive number of rows.",
            })
        })
    }
}

/// The value `SHOW` and `current_setting` give for a PostgreSQL parameter Eddy holds
/// fixed (`name` in lower case).
pub fn fixed_parameter(name: &str) -> Option<&'static str> {
    Some(match name {
        "server_version" => "16.6",
        "server_version_num" => "160006",
        "server_encoding" | "client_encoding" => "UTF8",
        "datestyle" => "ISO, MDY",
        "intervalstyle" => "postgres",
        "integer_datetimes" | "standard_conforming_strings" => "on",
        "transaction_isolation" | "default_transaction_isolation" => "read committed",
        "transaction_read_only" | "default_transaction_read_only" => "off",
        "search_path" => "\"$user\", public",
        "max_identifier_length" => "63",
        "bytea_output" => "hex",
        // Floats print in their shortest exact form, as at PostgreSQL's default of 1.
        "extra_float_digits" => "1",
        "lc_collate" | "lc_ctype" | "lc_messages" | "lc_monetary" | "lc_numeric" | "lc_time" => {
            "C.UTF-8"
        }
        _ => return None,
    })
}

/// PostgreSQL 15's parameters, each with its context, as `pg_settings` lists them (and
/// `role`, `session_authorization` and `seed`, which it does not list).
const POSTGRESQL_PARAMETERS: &str = include_str!("pg_settings.txt");

/// A PostgreSQL parameter's name as PostgreSQL spells it (`DateStyle` for `datestyle`),
/// which `SHOW` gives its column.
pub fn postgres_name(name: &str) -> Option<&'static str> {
    parameter(name).map(|(n, _)| n)
}

/// A PostgreSQL parameter of any spelling: its name as PostgreSQL spells it, and its
/// context (who may set it: `user`, `superuser`, `internal`, `postmaster`, …).
fn parameter(name: &str) -> Option<(&'static str, &'static str)> {
    POSTGRESQL_PARAMETERS
        .lines()
        .filter_map(|line| line.split_once(' '))
        .find(|(n, _)| n.eq_ignore_ascii_case(name))
}

/// `SELECT set_config('name', 'value', is_local)` alone, as `(name, value, is_local)`:
/// the session runs it as `SET` (or, local, as `SET LOCAL` outside a transaction block,
/// which changes nothing) and answers the value.
pub fn set_config_call(sql: &str) -> Option<(String, String, bool)> {
    use datafusion::sql::sqlparser::ast::{
        Expr, FunctionArg, FunctionArgExpr, FunctionArguments, SelectItem, SetExpr, Statement,
        Value,
    };
    use datafusion::sql::sqlparser::dialect::PostgreSqlDialect;
    use datafusion::sql::sqlparser::parser::Parser;
    let named = sql
        .as_bytes()
        .windows(b"set_config".len())
        .any(|w| w.eq_ignore_ascii_case(b"set_config"));
    if !named {
        return None;
    }
    let statements = Parser::parse_sql(&PostgreSqlDialect {}, sql).ok()?;
    let [Statement::Query(q)] = statements.as_slice() else {
        return None;
    };
    let SetExpr::Select(select) = q.body.as_ref() else {
        return None;
    };
    let ([item], true) = (select.projection.as_slice(), select.from.is_empty()) else {
        return None;
    };
    let (SelectItem::UnnamedExpr(Expr::Function(f))
    | SelectItem::ExprWithAlias {
        expr: Expr::Function(f),
        ..
    }) = item
    else {
        return None;
    };
    let FunctionArguments::List(list) = &f.args else {
        return None;
    };
    if !f.name.to_string().eq_ignore_ascii_case("set_config") {
        return None;
    }
    let values: Vec<&Value> = list
        .args
        .iter()
        .filter_map(|a| match a {
            FunctionArg::Unnamed(FunctionArgExpr::Expr(Expr::Value(v))) => Some(&v.value),
            _ => None,
        })
        .collect();
    match values.as_slice() {
        [Value::SingleQuotedString(name), Value::SingleQuotedString(value), Value::Boolean(local)] => {
            Some((name.to_ascii_lowercase(), value.clone(), *local))
        }
        _ => None,
    }
}

/// `SET name` or `RESET name` of a parameter that is not one of Eddy's settings
/// (`Setting`): as PostgreSQL answers it. One a PostgreSQL session may set (or a
/// `prefix.name` placeholder) is accepted and has no effect in Eddy; one only the server
/// sets is 55P02; any other name is 42704.
pub fn check_other(name: &str) -> Result<(), Error> {
    if name.contains('.') {
        return Ok(());
    }
    let context = parameter(name).map(|(_, context)| context);
    let why = match context {
        Some("user" | "superuser") => return Ok(()),
        Some("internal") => "cannot be changed",
        Some("postmaster") => "cannot be changed without restarting the server",
        Some("sighup") => "cannot be changed now",
        Some(_) => "cannot be set after connection start",
        None => {
            return Err(Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
            .with_hint(format!(
                "The session settings are {}.",
                Setting::ALL.map(|s| s.name()).join(", ")
            )))
        }
    };
    Err(Error::new(
        ErrorKind::CantChangeParameter,
        format!("parameter \"{}\" {why}", name.to_ascii_lowercase()),
    ))
}

/// `synchronous_commit`'s words; the levels between `local` and `remote_apply` are all
/// "on" for a single node's log.
fn on_off(text: &str) -> Option<bool> {
    match text.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" | "1" | "local" | "remote_write" | "remote_apply" => Some(true),
        "off" | "false" | "no" | "0" => Some(false),
        _ => None,
    }
}

/// A time in milliseconds, as PostgreSQL reads `statement_timeout`: a bare number is
/// milliseconds; `us`, `ms`, `s`, `min`, `h` and `d` are units.
pub fn parse_millis(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let number: f64 = number.parse().ok()?;
    let scale = match unit.trim() {
        "" | "ms" => 1.0,
        "us" => 0.001,
        "s" => 1_000.0,
        "min" => 60_000.0,
        "h" => 3_600_000.0,
        "d" => 86_400_000.0,
        _ => return None,
    };
    let millis = (number * scale).round();
    (millis.is_finite() && (0.0..=i32::MAX as f64).contains(&millis)).then_some(millis as u64)
}

/// Milliseconds in the largest unit that holds them whole, as `SHOW` gives them.
pub fn show_millis(ms: u64) -> String {
    match ms {
        0 => "0".into(),
        ms if ms % 3_600_000 == 0 => format!("{}h", ms / 3_600_000),
        ms if ms % 60_000 == 0 => format!("{}min", ms / 60_000),
        ms if ms % 1_000 == 0 => format!("{}s", ms / 1_000),
        ms => format!("{ms}ms"),
    }
}

/// A canonical `statement_timeout` as a duration (`None`: no limit).
pub fn timeout_of(canonical: &str) -> Option<Duration> {
    parse_millis(canonical)
        .filter(|ms| *ms > 0)
        .map(Duration::from_millis)
}

/// A canonical `synchronous_commit` as a flag.
pub fn is_on(canonical: &str) -> bool {
    on_off(canonical).unwrap_or(true)
}

/// Every `name=value` in a startup message's `options`, as PostgreSQL reads them:
/// `-c name=value`, `-cname=value` or `--name=value`, separated by spaces (a space inside
/// a value is written `\ `). Dashes in names are underscores.
pub fn startup_options(options: &str) -> Vec<(String, String)> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut chars = options.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => word.extend(chars.next()),
            c if c.is_whitespace() => {
                if !word.is_empty() {
                    words.push(std::mem::take(&mut word));
                }
            }
            c => word.push(c),
        }
    }
    if !word.is_empty() {
        words.push(word);
    }
    let mut out = Vec::new();
    let mut words = words.into_iter();
    while let Some(w) = words.next() {
        let setting = match w.as_str() {
            "-c" => words.next(),
            w => w
                .strip_prefix("--")
                .or_else(|| w.strip_prefix("-c"))
                .map(str::to_string),
        };
        if let Some((k, v)) = setting.as_deref().and_then(|s| s.split_once('=')) {
            out.push((k.replace('-', "_"), v.to_string()));
        }
    }
    out
}

/// The settings a client's startup message gives, checked: its parameters named as a
/// setting, then its `options` (which win). Names Eddy does not know are left alone, as
/// drivers send many; a known setting with a bad value is the error.
pub fn from_startup<'a>(
    parameters: impl IntoIterator<Item = (&'a String, &'a String)>,
) -> Result<BTreeMap<Setting, String>, Error> {
    let mut named = Vec::new();
    let mut options = Vec::new();
    for (k, v) in parameters {
        match k.as_str() {
            "options" => options.extend(startup_options(v)),
            _ => named.push((k.clone(), v.clone())),
        }
    }
    let mut out = BTreeMap::new();
    for (name, value) in named.into_iter().chain(options) {
        if let Some(setting) = Setting::named(&name) {
            out.insert(setting, setting.canonical(&value)?);
        }
    }
    Ok(out)
}

/// The server's defaults for the settings it gives (`Setting::server_wide`): those it
/// started with, and those in force, which `ALTER SYSTEM` changes while the node runs.
#[derive(Debug)]
pub struct ServerDefaults {
    started: BTreeMap<Setting, String>,
    now: std::sync::RwLock<BTreeMap<Setting, String>>,
}

impl ServerDefaults {
    pub fn new(values: BTreeMap<Setting, String>) -> ServerDefaults {
        ServerDefaults {
            now: std::sync::RwLock::new(values.clone()),
            started: values,
        }
    }

    /// The server's value of `setting` (the built-in default when none is set).
    pub fn get(&self, setting: Setting) -> String {
        self.now
            .read()
            .expect("defaults lock")
            .get(&setting)
            .cloned()
            .unwrap_or_else(|| setting.default_value().to_string())
    }

    /// Sets the server's value, already canonical (`None`: back to the configuration's).
    pub fn set(&self, setting: Setting, value: Option<String>) {
        let mut now = self.now.write().expect("defaults lock");
        match value.or_else(|| self.started.get(&setting).cloned()) {
            Some(v) => now.insert(setting, v),
            None => now.remove(&setting),
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_options_name_settings_as_postgresql_reads_them() {
        let opts = |o: &str| startup_options(o);
        assert_eq!(
            opts("-c TimeZone=Asia/Tokyo -csynchronous_commit=off --statement-timeout=5s"),
            [
                ("TimeZone".to_string(), "Asia/Tokyo".to_string()),
                ("synchronous_commit".into(), "off".into()),
                ("statement_timeout".into(), "5s".into())
            ]
        );
        assert_eq!(
            opts(r"-c application_name=my\ app"),
            [("application_name".to_string(), "my app".to_string())]
        );
        assert!(opts("-c").is_empty());
        assert!(opts("-c geqo").is_empty());
    }

    #[test]
    fn values_are_checked_and_shown_as_postgresql_shows_them() {
        let c = |s: Setting, v: &str| s.canonical(v).map_err(|e| e.kind);
        assert_eq!(c(Setting::SynchronousCommit, "OFF"), Ok("off".into()));
        assert_eq!(c(Setting::SynchronousCommit, "local"), Ok("on".into()));
        assert_eq!(
            c(Setting::SynchronousCommit, "maybe"),
            Err(ErrorKind::InvalidParameter)
        );
        assert_eq!(c(Setting::StatementTimeout, "5000"), Ok("5s".into()));
        assert_eq!(c(Setting::StatementTimeout, "1500"), Ok("1500ms".into()));
        assert_eq!(c(Setting::StatementTimeout, "2min"), Ok("2min".into()));
        assert_eq!(c(Setting::StatementTimeout, "0"), Ok("0".into()));
        assert_eq!(
            c(Setting::StatementTimeout, "-1"),
            Err(ErrorKind::InvalidParameter)
        );
        assert_eq!(
            c(Setting::StatementTimeout, "5 parsecs"),
            Err(ErrorKind::InvalidParameter)
        );
        assert_eq!(timeout_of("1500ms"), Some(Duration::from_millis(1500)));
        assert_eq!(timeout_of("0"), None);
        assert_eq!(
            c(Setting::SubscriptionRowsMax, "0"),
            Err(ErrorKind::InvalidParameter)
        );
        assert_eq!(Setting::named("timezone"), Some(Setting::TimeZone));
    }

    #[test]
    fn a_startup_message_sets_what_it_names_and_refuses_bad_values() {
        let params = |pairs: &[(&str, &str)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect::<BTreeMap<_, _>>()
        };
        let got = from_startup(&params(&[
            ("user", "eddy"),
            ("application_name", "psql"),
            ("options", "-c synchronous_commit=off -c geqo=off"),
        ]))
        .unwrap();
        assert_eq!(got.get(&Setting::SynchronousCommit).unwrap(), "off");
        assert_eq!(got.get(&Setting::ApplicationName).unwrap(), "psql");
        assert_eq!(got.len(), 2);
        let bad = from_startup(&params(&[("options", "-c statement_timeout=soon")]));
        assert_eq!(bad.unwrap_err().kind, ErrorKind::InvalidParameter);
    }
}
