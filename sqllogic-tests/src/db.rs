//! The sqllogictest [`AsyncDB`] driver for Eddy: one tokio-postgres connection, simple-query protocol.

use std::fmt;
use std::process::{Command, Output};
use std::time::Duration;

use async_trait::async_trait;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};
use tokio::task::JoinHandle;
use tokio_postgres::tls::NoTlsStream;
use tokio_postgres::{Client, Config, Connection, NoTls, SimpleQueryMessage, Socket};

/// User name the runner logs in with.
pub const USER: &str = "eddy";
/// Database name the runner connects to.
pub const DBNAME: &str = "eddy";
/// How a SQL `NULL` value is rendered in result rows.
pub const NULL_TEXT: &str = "NULL";
/// How an empty string is rendered in result rows (an empty cell would vanish in .slt text).
pub const EMPTY_TEXT: &str = "(empty)";
/// Engine name reported to sqllogictest; usable as `onlyif eddy` / `skipif eddy`.
pub const ENGINE_NAME: &str = "eddy";

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// An error from the server or the client library.
///
/// `Display` is exactly `<SQLSTATE> <message>` for errors the server sent (for example
/// `42P01 metric or stream "foo" does not exist`), so a test can write
/// `statement error 42P01` or `query error 22P02 invalid input` and have the inline regex match.
/// Client-side errors (connection refused, connection closed, ...) carry no SQLSTATE and display
/// as the plain error chain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PgError {
    sqlstate: Option<String>,
    message: String,
}

impl PgError {
    /// Builds an error from its parts; `sqlstate` is `None` for client-side errors.
    pub fn new(sqlstate: Option<String>, message: impl Into<String>) -> Self {
        Self {
            sqlstate,
            message: message.into(),
        }
    }

    /// The five-character SQLSTATE code, if the server sent one.
    pub fn sqlstate(&self) -> Option<&str> {
        self.sqlstate.as_deref()
    }

    /// The primary message, without the SQLSTATE.
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl fmt::Display for PgError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.sqlstate {
            Some(code) => write!(f, "{code} {}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

impl std::error::Error for PgError {}

impl From<tokio_postgres::Error> for PgError {
    fn from(err: tokio_postgres::Error) -> Self {
        if let Some(db) = err.as_db_error() {
            return Self::new(Some(db.code().code().to_owned()), db.message());
        }
        let mut message = err.to_string();
        let mut source = std::error::Error::source(&err);
        while let Some(cause) = source {
            message.push_str(": ");
            message.push_str(&cause.to_string());
            source = cause.source();
        }
        Self::new(None, message)
    }
}

/// Builds the connection configuration for `addr` (`host:port`, IPv6 as `[::1]:port`):
/// the equivalent of `host=HOST port=PORT user=eddy dbname=eddy`, without TLS.
pub fn pg_config(addr: &str) -> Result<Config, PgError> {
    let bad = |why: &str| PgError::new(None, format!("invalid address {addr:?}: {why}"));
    let (host, port) = addr
        .trim()
        .rsplit_once(':')
        .ok_or_else(|| bad("expected host:port"))?;
    let host = host
        .strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host);
    if host.is_empty() {
        return Err(bad("empty host"));
    }
    let port: u16 = port.parse().map_err(|_| bad("port is not a number"))?;
    let mut config = Config::new();
    config
        .host(host)
        .port(port)
        .user(USER)
        .dbname(DBNAME)
        .connect_timeout(CONNECT_TIMEOUT);
    Ok(config)
}

/// Renders one text-format value the way .slt files spell it.
pub fn render_value(value: Option<&str>) -> String {
    match value {
        None => NULL_TEXT.to_owned(),
        Some("") => EMPTY_TEXT.to_owned(),
        Some(text) => text.to_owned(),
    }
}

/// Turns the messages of one simple query into sqllogictest output.
///
/// Anything that sent a `RowDescription` (even with zero rows) is a row set, with one
/// [`DefaultColumnType::Any`] per column: the simple-query protocol does not expose column type
/// OIDs through tokio-postgres. Otherwise it is `StatementComplete` with the row count of the last
/// `CommandComplete`.
pub fn messages_to_output(messages: Vec<SimpleQueryMessage>) -> DBOutput<DefaultColumnType> {
    let mut columns: Option<usize> = None;
    let mut rows: Vec<Vec<String>> = Vec::new();
    let mut count = 0;
    for message in messages {
        match message {
            SimpleQueryMessage::RowDescription(cols) => columns = Some(cols.len()),
            SimpleQueryMessage::Row(row) => {
                columns.get_or_insert(row.len());
                rows.push((0..row.len()).map(|i| render_value(row.get(i))).collect());
            }
            SimpleQueryMessage::CommandComplete(n) => count = n,
            _ => {}
        }
    }
    match columns {
        Some(n) => DBOutput::Rows {
            types: vec![DefaultColumnType::Any; n],
            rows,
        },
        None => DBOutput::StatementComplete(count),
    }
}

/// One connection to Eddy, as a sqllogictest database.
pub struct EddyDb {
    client: Option<Client>,
    driver: Option<JoinHandle<()>>,
}

impl EddyDb {
    /// Opens a fresh connection to the server at `addr` (`host:port`).
    pub async fn connect(addr: &str) -> Result<Self, PgError> {
        let (client, connection) = pg_config(addr)?.connect(NoTls).await?;
        let driver = tokio::spawn(drive(connection));
        Ok(Self {
            client: Some(client),
            driver: Some(driver),
        })
    }

    /// Runs one SQL string with the simple-query protocol.
    pub async fn query(&self, sql: &str) -> Result<DBOutput<DefaultColumnType>, PgError> {
        let client = self
            .client
            .as_ref()
            .ok_or_else(|| PgError::new(None, "connection already shut down"))?;
        let messages = client.simple_query(sql).await?;
        Ok(messages_to_output(messages))
    }

    /// Closes the connection and waits (briefly) for its driver task to finish.
    pub async fn close(&mut self) {
        // Dropping the client makes the connection send Terminate and end.
        self.client = None;
        if let Some(mut driver) = self.driver.take() {
            if tokio::time::timeout(SHUTDOWN_TIMEOUT, &mut driver)
                .await
                .is_err()
            {
                driver.abort();
            }
        }
    }
}

/// Polls the connection until it ends. NOTICE and NOTIFY messages are dropped on purpose: the
/// tests only look at query results and errors.
async fn drive(mut connection: Connection<Socket, NoTlsStream>) {
    // Ends on `None` (closed) or `Some(Err(_))`; a broken connection then shows up as
    // "connection closed" on the next query.
    while let Some(Ok(_notice_or_notification)) =
        std::future::poll_fn(|cx| connection.poll_message(cx)).await
    {}
}

#[async_trait]
impl AsyncDB for EddyDb {
    type Error = PgError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, PgError> {
        self.query(sql).await
    }

    async fn shutdown(&mut self) {
        self.close().await;
    }

    fn engine_name(&self) -> &str {
        ENGINE_NAME
    }

    async fn sleep(dur: Duration) {
        tokio::time::sleep(dur).await;
    }

    async fn run_command(mut command: Command) -> std::io::Result<Output> {
        tokio::task::spawn_blocking(move || command.output())
            .await
            .map_err(std::io::Error::other)?
    }

    fn error_sql_state(err: &PgError) -> Option<String> {
        err.sqlstate.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_sqlstate_space_message() {
        let err = PgError::new(
            Some("42P01".into()),
            "metric or stream \"foo\" does not exist",
        );
        assert_eq!(
            err.to_string(),
            "42P01 metric or stream \"foo\" does not exist"
        );
        let client = PgError::new(None, "connection closed");
        assert_eq!(client.to_string(), "connection closed");
    }

    #[test]
    fn values_render_null_and_empty() {
        assert_eq!(render_value(None), "NULL");
        assert_eq!(render_value(Some("")), "(empty)");
        assert_eq!(render_value(Some("a b")), "a b");
    }

    #[test]
    fn addresses_parse() {
        let config = pg_config("127.0.0.1:5433").expect("valid address");
        assert_eq!(config.get_ports(), &[5433]);
        assert_eq!(config.get_user(), Some(USER));
        assert_eq!(config.get_dbname(), Some(DBNAME));
        assert!(pg_config("[::1]:5433").is_ok());
        assert!(pg_config("127.0.0.1").is_err());
        assert!(pg_config(":5433").is_err());
        assert!(pg_config("localhost:port").is_err());
    }
}
