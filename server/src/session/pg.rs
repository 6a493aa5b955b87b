//! The PostgreSQL protocol front end (pgwire): sessions, the simple and extended query
//! protocols, COPY, notices, cancel, and the mapping of errors to SQLSTATEs.
//!
//! Invariant: an error ends only the statement that raised it; the session and the
//! connection stay usable.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal, PortalExecutionState};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    CopyResponse, DescribePortalResponse, DescribeStatementResponse, FieldFormat, FieldInfo,
    QueryResponse, Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::{Entry, PortalStore};
use pgwire::api::{
    ClientInfo, ClientPortalStore, ConnectionHandle, ConnectionManager, PgWireConnectionState,
    Type, DEFAULT_NAME,
};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult, SEVERITY_ERROR, SEVERITY_NOTICE};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail, CopyOutResponse};
use pgwire::messages::extendedquery::{Bind, BindComplete, Describe, Execute, PortalSuspended};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::response::TransactionStatus;
use pgwire::messages::PgWireBackendMessage;
use pgwire::types::format::FormatOptions;
use postgres_types::FromSql;
use tracing::Instrument;

use eddy_planner::aggregate::ResultType;
use eddy_planner::bind::InsertPlan;
use eddy_planner::sql::{self, quote_literal, CopyOut, Fetch, Statement};
use eddy_planner::types::format_timestamp;
use eddy_planner::{Error, ErrorKind};

use crate::ops::histogram::Kind;
use crate::ops::limits::{Limit, Limits};
use crate::session::cells::{
    encode_rows, fields, pg_type, pg_type_of_arrow, timestamp_from_pg_binary, Cell, Column,
};
use crate::session::copy::{CopyIn, CopyLines};
use crate::session::deferred::Deferred;
use crate::session::prepared::{Bound, Fast, Prepared};
use crate::session::settings::{self, Setting};
use crate::session::subscribe::{Client, Opening, SubscriptionHandle, SUBSCRIPTION_ROWS_MAX};
use crate::sql::db::{Db, Executed, Output};
use crate::sql::history::Notice;
use crate::sql::query;
use eddy_planner::access::Need;

/// The most rows one Execute returns before `PortalSuspended`, whatever the client asks.
const EXECUTE_ROWS_MAX: i32 = 1 << 16;

pub fn error_info(e: &Error) -> ErrorInfo {
    crate::ops::metrics::count_error(e.kind.sqlstate());
    let mut info = ErrorInfo::new(
        SEVERITY_ERROR.to_string(),
        e.kind.sqlstate().to_string(),
        e.message.clone(),
    );
    info.detail = e.detail.clone();
    info.hint = e.hint.clone();
    info
}

fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

async fn send_notices<C>(client: &mut C, notices: &[Notice]) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    for n in notices {
        let mut info = ErrorInfo::new(
            SEVERITY_NOTICE.to_string(),
            "00000".to_string(),
            n.message.clone(),
        );
        info.hint = n.hint.clone();
        client
            .send(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                info,
            )))
            .await?;
    }
    Ok(())
}

/// A cursor of this session: its columns and where its rows come from.
struct Cursor {
    columns: Vec<Column>,
    rows: CursorRows,
}

enum CursorRows {
    /// `DECLARE … FOR SELECT … EMIT CHANGES`: rows as they change.
    Live(Arc<SubscriptionHandle>),
    /// An ordinary query's rows, made batch by batch as FETCH asks for them.
    Query(QueryRows),
}

/// The rows of an ordinary query's cursor: those made and not fetched yet, and the rest
/// of the query's result.
#[derive(Default)]
struct QueryRows {
    ready: VecDeque<Vec<Cell>>,
    rest: Option<crate::sql::query::BatchStream>,
}

impl QueryRows {
    /// The next `count` rows (all of them without a count), fewer at the end.
    async fn take(&mut self, count: Option<usize>) -> eddy_planner::Result<Vec<Vec<Cell>>> {
        use futures::StreamExt;
        while count.is_none_or(|n| self.ready.len() < n) {
            let Some(rest) = &mut self.rest else {
                break;
            };
            match rest.next().await {
                Some(batch) => self
                    .ready
                    .extend(crate::session::cells::rows_of_batches(&[batch?])),
                None => self.rest = None,
            }
        }
        let n = count.map_or(self.ready.len(), |n| n.min(self.ready.len()));
        Ok(self.ready.drain(..n).collect())
    }
}

/// A portal running a continuous query (extended protocol): its subscription, owned by
/// the portal's state so that closing or re-binding the portal ends it.
struct LivePortal {
    state: Arc<tokio::sync::Mutex<PortalExecutionState>>,
    sub: Weak<SubscriptionHandle>,
    columns: Vec<Column>,
    copy: Option<CopyOut>,
}

/// Per-connection state shared by the handlers of one connection.
pub struct Session {
    db: Arc<Db>,
    manager: Arc<ConnectionManager>,
    /// A COPY FROM in progress, and when its `statement_timeout` runs out.
    copy: Mutex<Option<(CopyIn, Option<Instant>)>>,
    parser: Arc<EddyParser>,
    cursors: Mutex<HashMap<String, Cursor>>,
    /// `PREPARE name AS …`: each statement's parameter types as written and its text.
    /// (The extended protocol's statements are pgwire's, a namespace of their own.)
    sql_prepared: Mutex<HashMap<String, (Vec<String>, String)>>,
    live_portals: Mutex<HashMap<String, LivePortal>>,
    /// The session's settings (`session::settings`), the ones statements read in
    /// atomics. `SET subscription_rows_max`:
    rows_max: AtomicUsize,
    /// Inside BEGIN … COMMIT (tracked here: pgwire learns it only after a whole query
    /// string ran).
    in_block: std::sync::atomic::AtomicBool,
    /// `SET synchronous_commit`: on (the default) acknowledges a statement once its
    /// events are fsynced; off once they are written, with the fsync within the commit
    /// delay.
    synchronous_commit: std::sync::atomic::AtomicBool,
    /// `SET statement_timeout`, in milliseconds (0: none).
    statement_timeout: std::sync::atomic::AtomicU64,
    /// `SET application_name` (pgjdbc sets it after startup).
    application_name: Mutex<Option<String>>,
    /// Each setting as the session started with it: what `RESET` goes back to.
    started: Mutex<BTreeMap<Setting, String>>,
    /// How values are written, with `SET TimeZone` (TIMESTAMPTZ is shown in it).
    format: Mutex<Arc<FormatOptions>>,
    /// A second handle on the client's socket, to notice a disconnect while a continuous
    /// query waits for rows (pgwire reads the socket only between messages).
    peer: Option<tokio::net::TcpStream>,
    /// The name the client logged in with.
    login: std::sync::OnceLock<String>,
    /// The node has no password: any name not a role's acts as the superuser.
    trusted: bool,
}

impl Session {
    /// A new connection's session; `trusted`: the node has no password, and any name
    /// not a role's acts as the superuser.
    pub fn new(
        db: Arc<Db>,
        manager: Arc<ConnectionManager>,
        peer: Option<tokio::net::TcpStream>,
        trusted: bool,
    ) -> Arc<Session> {
        let limits = db.limits().clone();
        Arc::new(Session {
            db,
            manager,
            copy: Mutex::new(None),
            parser: Arc::new(EddyParser(limits)),
            cursors: Mutex::new(HashMap::new()),
            sql_prepared: Mutex::new(HashMap::new()),
            live_portals: Mutex::new(HashMap::new()),
            rows_max: AtomicUsize::new(SUBSCRIPTION_ROWS_MAX),
            in_block: std::sync::atomic::AtomicBool::new(false),
            synchronous_commit: std::sync::atomic::AtomicBool::new(true),
            statement_timeout: std::sync::atomic::AtomicU64::new(0),
            application_name: Mutex::new(None),
            started: Mutex::new(BTreeMap::new()),
            format: Mutex::new(Arc::new({
                let mut options = FormatOptions::default();
                options.time_zone = "UTC".to_string();
                options
            })),
            peer,
            login: std::sync::OnceLock::new(),
            trusted,
        })
    }
}

#[async_trait]
impl NoopStartupHandler for Session {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.manager.clone())
    }

    /// The session's settings as its startup gives them (see `session::settings`), which
    /// the client then learns: its TimeZone is reported back.
    async fn post_startup<C>(
        &self,
        client: &mut C,
        _message: pgwire::messages::PgWireFrontendMessage,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        if let Some(zone) = self.start_settings(client.metadata()) {
            client
                .feed(PgWireBackendMessage::ParameterStatus(
                    pgwire::messages::startup::ParameterStatus::new("TimeZone".into(), zone),
                ))
                .await?;
        }
        Ok(())
    }
}

impl Session {
    /// Gives the session its starting settings: the server's defaults, then its role's
    /// (`ALTER ROLE … SET`), then the startup message's (`wire` refused bad values
    /// before the login). Returns the TimeZone when it is not the server's.
    pub(crate) fn start_settings(&self, metadata: &HashMap<String, String>) -> Option<String> {
        let catalog = self.db.catalog();
        let mut values: BTreeMap<Setting, String> = Setting::ALL
            .into_iter()
            .map(|s| (s, self.db.session_default(s)))
            .collect();
        for (name, value) in catalog.access.settings_of(self.role_in(&catalog)) {
            if let Some(setting) = Setting::named(name) {
                values.insert(setting, value.to_string());
            }
        }
        values.extend(settings::from_startup(metadata).unwrap_or_default());
        for (setting, value) in &values {
            self.apply(*setting, value);
        }
        let zone = values
            .get(&Setting::TimeZone)
            .filter(|z| *z != "UTC")
            .cloned();
        *self.started.lock().expect("session lock") = values;
        zone
    }

    /// Makes a checked (canonical) value the setting's.
    /// `SELECT set_config(name, value, is_local)` (`settings::set_config_call`): `SET`
    /// unless local (outside a transaction block, `SET LOCAL` changes nothing); answers
    /// the value.
    fn set_config(&self, (name, value, local): (String, String, bool)) -> Result<Executed, Error> {
        match Setting::named(&name) {
            Some(setting) => {
                let canonical = setting.canonical(&value)?;
                if !local {
                    self.apply(setting, &canonical);
                }
            }
            None => settings::check_other(&name)?,
        }
        Ok(Executed::rows(
            vec![Column::text("set_config")],
            vec![vec![Cell::text(value)]],
        ))
    }

    fn apply(&self, setting: Setting, value: &str) {
        match setting {
            Setting::SynchronousCommit => self
                .synchronous_commit
                .store(settings::is_on(value), Ordering::Relaxed),
            Setting::StatementTimeout => self.statement_timeout.store(
                settings::parse_millis(value).unwrap_or(0),
                Ordering::Relaxed,
            ),
            Setting::TimeZone => self.set_time_zone(value),
            Setting::ApplicationName => {
                *self.application_name.lock().expect("session lock") = Some(value.to_string())
            }
            Setting::SubscriptionRowsMax => self.rows_max.store(
                value.parse().unwrap_or(SUBSCRIPTION_ROWS_MAX),
                Ordering::Relaxed,
            ),
        }
    }

    /// A setting's value now, as `SHOW` gives it.
    fn current<C: ClientInfo>(&self, client: &C, setting: Setting) -> String {
        match setting {
            Setting::SynchronousCommit => if self.durable() { "on" } else { "off" }.into(),
            Setting::StatementTimeout => {
                settings::show_millis(self.statement_timeout.load(Ordering::Relaxed))
            }
            Setting::TimeZone => self.format().time_zone.clone(),
            Setting::ApplicationName => self.application_name(client),
            Setting::SubscriptionRowsMax => self.rows_max.load(Ordering::Relaxed).to_string(),
        }
    }

    /// The session's settings for a query whose text names `current_setting` (the
    /// rewrite reads them: `query::session_setting`); an empty list for the others, with
    /// no scan of an INSERT's text.
    fn settings_for<C: ClientInfo>(
        &self,
        client: &C,
        stmt: &Statement,
        text: &str,
    ) -> Arc<Vec<(String, String)>> {
        static NONE: std::sync::LazyLock<Arc<Vec<(String, String)>>> =
            std::sync::LazyLock::new(Arc::default);
        // The functions that read the session: `current_setting`, and those of its role.
        const NAMES: [&[u8]; 5] = [
            b"current_setting",
            b"current_user",
            b"session_user",
            b"current_role",
            b"has_table_privilege",
        ];
        // Found by the underscore, a statement has few.
        let bytes = text.as_bytes();
        let names = matches!(stmt, Statement::Query(_))
            && bytes.iter().enumerate().any(|(i, b)| {
                *b == b'_'
                    && NAMES.iter().any(|name| {
                        let at = name.iter().position(|c| *c == b'_').unwrap_or(0);
                        i >= at
                            && bytes
                                .get(i - at..i - at + name.len())
                                .is_some_and(|w| w.eq_ignore_ascii_case(name))
                    })
            });
        if !names {
            return NONE.clone();
        }
        Arc::new(
            Setting::ALL
                .iter()
                .map(|s| (s.name().to_ascii_lowercase(), self.current(client, *s)))
                .chain([("session_authorization".to_string(), self.role())])
                .collect(),
        )
    }

    /// `RESET name` (`RESET ALL`: `None`): back to the value the session started with.
    fn reset(&self, setting: Option<Setting>) {
        let started = self.started.lock().expect("session lock").clone();
        for s in Setting::ALL {
            if setting.is_none_or(|one| one == s) {
                let value = started
                    .get(&s)
                    .cloned()
                    .unwrap_or_else(|| s.default_value().to_string());
                self.apply(s, &value);
            }
        }
    }

    /// When a statement that starts now must end (`statement_timeout`).
    fn deadline(&self) -> Option<Instant> {
        match self.statement_timeout.load(Ordering::Relaxed) {
            0 => None,
            ms => Some(Instant::now() + Duration::from_millis(ms)),
        }
    }

    /// Runs `f` in the session's TimeZone (`query::SESSION_FORMAT`).
    fn in_time_zone<F: std::future::Future>(
        &self,
        f: F,
    ) -> impl std::future::Future<Output = F::Output> {
        crate::sql::query::SESSION_FORMAT.scope(self.format(), f)
    }

    fn format(&self) -> Arc<FormatOptions> {
        self.format.lock().expect("session lock").clone()
    }

    /// Makes `zone` (canonical: `Setting::canonical` checked it) the session's TimeZone.
    fn set_time_zone(&self, zone: &str) {
        let mut format = self.format.lock().expect("session lock");
        let mut options = (**format).clone();
        options.time_zone = zone.to_string();
        *format = Arc::new(options);
    }

    /// Turns an executed statement into a protocol response.
    fn respond(&self, executed: Executed, format_for: &dyn Fn(usize) -> FieldFormat) -> Response {
        match executed.output {
            Output::Rows { columns, rows, tag } => {
                let f = fields(&columns, format_for, &self.format());
                let data = encode_rows(&f, rows);
                let mut resp = QueryResponse::new(f, stream::iter(data));
                if tag == "INSERT" {
                    resp.set_command_tag("INSERT 0");
                } else {
                    resp.set_command_tag(tag);
                }
                Response::Query(resp)
            }
            Output::Command { tag, rows } => {
                let mut t = Tag::new(tag);
                if tag == "INSERT" {
                    t = t.with_oid(0);
                }
                if let Some(n) = rows {
                    t = t.with_rows(n);
                }
                Response::Execution(t)
            }
            Output::CopyOut { columns, lines } => Response::CopyOut(CopyResponse::new(
                0,
                columns,
                futures::StreamExt::map(lines, |l| match l {
                    Ok(l) => Ok(CopyData::new(l.into())),
                    Err(e) => Err(PgWireError::UserError(Box::new(error_info(&e)))),
                }),
            )),
            Output::CopyIn(copy) => {
                let columns = copy.columns();
                *self.copy.lock().expect("copy lock") = Some((copy, self.deadline()));
                Response::CopyIn(CopyResponse::new(0, columns, stream::empty()))
            }
            Output::Begin => Response::TransactionStart(Tag::new("BEGIN")),
            Output::Commit(tag) => Response::TransactionEnd(Tag::new(tag)),
            Output::Empty => Response::EmptyQuery,
        }
    }
}

/// 57014, as PostgreSQL cancels a statement past `statement_timeout`.
fn statement_timeout() -> Error {
    Error::new(
        ErrorKind::QueryCanceled,
        "canceling statement due to statement timeout",
    )
    .with_hint("Nothing of the statement was applied. SET statement_timeout = 0 removes the limit.")
}

fn client_of<C: ClientInfo>(client: &C, application_name: String) -> Client {
    Client {
        pid: client.pid_and_secret_key().0,
        user: client.metadata().get("user").cloned().unwrap_or_default(),
        application_name,
        addr: client.socket_addr().to_string(),
    }
}

fn disconnected() -> PgWireError {
    PgWireError::IoError(std::io::Error::new(
        std::io::ErrorKind::ConnectionAborted,
        "client disconnected",
    ))
}

/// How rows of a continuous query go on the wire.
enum Wire {
    Rows(Arc<Vec<FieldInfo>>),
    Copy(Box<CopyLines>),
}

impl Wire {
    fn encode(&mut self, rows: Vec<Vec<Cell>>) -> PgWireResult<Vec<PgWireBackendMessage>> {
        match self {
            Wire::Rows(fields) => encode_rows(fields, rows)
                .into_iter()
                .map(|r| r.map(PgWireBackendMessage::DataRow))
                .collect(),
            Wire::Copy(lines) => Ok(rows
                .into_iter()
                .map(|row| PgWireBackendMessage::CopyData(CopyData::new(lines.line(row).into())))
                .collect()),
        }
    }
}

/// A portal's placeholder row stream that owns its subscription.
fn holder(
    handle: Arc<SubscriptionHandle>,
) -> impl futures::Stream<Item = PgWireResult<pgwire::messages::data::DataRow>> + Send {
    stream::unfold(handle, |h| async move {
        let _owned = h;
        std::future::pending::<()>().await;
        None
    })
}

impl Session {
    pub(crate) fn db(&self) -> &Arc<Db> {
        &self.db
    }

    pub(crate) fn log_in_as(&self, user: String) {
        let _ = self.login.set(user);
    }

    /// The role the session acts as now.
    fn role(&self) -> String {
        self.role_in(&self.db.catalog()).to_string()
    }

    /// The role the session acts as under `catalog`.
    fn role_in(&self, catalog: &eddy_planner::catalog::Catalog) -> &str {
        let login = self.login.get().map_or("", String::as_str);
        catalog.access.acting(login, self.trusted)
    }

    /// Fails with 42501 unless the session's role may run the prepared statement's fast
    /// path (bound against the current catalog).
    fn may_run(&self, bound: &Bound) -> eddy_planner::Result<()> {
        let catalog = &bound.catalog;
        let role = self.role_in(catalog);
        if catalog.access.is_superuser(role) {
            return Ok(());
        }
        let need = match &bound.fast {
            Fast::Insert(template) => Need::Insert(template.stream.name.clone()),
            Fast::Lookup(lookup) => Need::Select(lookup.metric_name().to_string()),
            Fast::General => return Ok(()),
        };
        catalog.access.check(catalog.as_ref(), role, &[need])
    }

    /// Statements that belong to the session (cursors, settings, transaction ends), and
    /// everything else through the database.
    async fn run<C: ClientInfo>(
        &self,
        client: &C,
        stmt: Statement,
    ) -> eddy_planner::Result<Executed> {
        let role = self.role();
        self.db.authorize(&role, &stmt).await?;
        match stmt {
            Statement::Declare {
                name,
                query,
                subscribe,
            } => self.declare(client, name, &query, subscribe).await,
            Statement::Fetch(f) => self.fetch(f).await,
            Statement::Close(name) => {
                let mut cursors = self.cursors.lock().expect("cursors lock");
                match name {
                    None => cursors.clear(),
                    Some(name) => {
                        if cursors.remove(&name).is_none() {
                            return Err(undefined_cursor(&name));
                        }
                    }
                }
                Ok(Executed::command("CLOSE CURSOR"))
            }
            Statement::Prepare { name, types, body } => {
                let mut prepared = self.sql_prepared.lock().expect("prepared lock");
                if prepared.contains_key(&name) {
                    return Err(Error::new(
                        ErrorKind::DuplicatePreparedStatement,
                        format!("prepared statement \"{name}\" already exists"),
                    )
                    .with_hint("DEALLOCATE it first."));
                }
                prepared.insert(name, (types, body));
                Ok(Executed::command("PREPARE"))
            }
            Statement::Execute { name, args } => {
                let stmt = self.sql_prepared_with(&name, &args)?;
                Box::pin(self.run(client, stmt)).await
            }
            Statement::Deallocate(name) => {
                let mut prepared = self.sql_prepared.lock().expect("prepared lock");
                // A name PREPARE did not make may be a driver's protocol-level statement
                // (psycopg deallocates its own by name): nothing to do here.
                Ok(match name {
                    Some(name) => {
                        prepared.remove(&name);
                        Executed::command("DEALLOCATE")
                    }
                    None => {
                        prepared.clear();
                        Executed::command("DEALLOCATE ALL")
                    }
                })
            }
            Statement::SetVariable { name, value } if Setting::named(&name).is_some() => {
                let setting = Setting::named(&name).expect("named");
                self.apply(setting, &setting.canonical(&value)?);
                Ok(Executed::command("SET"))
            }
            Statement::ShowVariable(name) if Setting::named(&name).is_some() => {
                let setting = Setting::named(&name).expect("named");
                Ok(Executed::rows(
                    vec![Column::text(setting.name())],
                    vec![vec![Cell::text(self.current(client, setting))]],
                ))
            }
            Statement::Reset(name) => {
                let setting = name.as_deref().and_then(Setting::named);
                match (&name, setting) {
                    // Another parameter: as `SET` of it answers (`check_other`).
                    (Some(other), None) => crate::session::settings::check_other(other)?,
                    _ => self.reset(setting),
                }
                Ok(Executed::command("RESET"))
            }
            Statement::Insert(insert) => {
                let plan = self.db.bind_insert(&insert).await?;
                self.db.insert(plan, self.durable()).await
            }
            Statement::Begin => {
                self.in_block.store(true, Ordering::Relaxed);
                self.db.execute_statement(stmt).await
            }
            Statement::Commit | Statement::Rollback => {
                self.in_block.store(false, Ordering::Relaxed);
                self.end_transaction().await;
                self.db.execute_statement(stmt).await
            }
            Statement::Query(sql) if let Some(call) = settings::set_config_call(&sql) => {
                self.set_config(call)
            }
            // A query applies nothing, so it is cancelled wherever its time runs out.
            query @ Statement::Query(_) => match self.deadline() {
                None => self.db.execute_by(&role, query).await,
                Some(deadline) => {
                    tokio::time::timeout_at(deadline.into(), self.db.execute_by(&role, query))
                        .await
                        .unwrap_or_else(|_| Err(statement_timeout()))
                }
            },
            other => self.db.execute_by(&role, other).await,
        }
    }

    /// The statement `EXECUTE name (args)` runs: the prepared text with each `$n` the
    /// n-th value, cast to its declared type. 26000 for an unknown name, 42601 for a
    /// wrong count, as PostgreSQL.
    fn sql_prepared_with(&self, name: &str, args: &[String]) -> eddy_planner::Result<Statement> {
        let prepared = self.sql_prepared.lock().expect("prepared lock");
        let (types, body) = prepared.get(name).ok_or_else(|| {
            Error::new(
                ErrorKind::UndefinedPreparedStatement,
                format!("prepared statement \"{name}\" does not exist"),
            )
        })?;
        let expected = types.len().max(sql::count_params(body));
        if args.len() != expected {
            let mut e = Error::syntax(format!(
                "wrong number of parameters for prepared statement \"{name}\""
            ));
            e.detail = Some(format!(
                "Expected {expected} parameters but got {}.",
                args.len()
            ));
            return Err(e);
        }
        let values: Vec<String> = args
            .iter()
            .enumerate()
            .map(|(i, a)| match types.get(i) {
                Some(ty) => format!("({a})::{ty}"),
                None => format!("({a})"),
            })
            .collect();
        sql::parse_statement(&sql::substitute_params(body, &values)?)
    }

    /// Whether this session's statements wait for their events' fsync
    /// (`synchronous_commit`).
    fn durable(&self) -> bool {
        self.synchronous_commit.load(Ordering::Relaxed)
    }

    /// The client's application_name: as last SET, else as sent at startup.
    fn application_name<C: ClientInfo>(&self, client: &C) -> String {
        self.application_name
            .lock()
            .expect("session lock")
            .clone()
            .or_else(|| client.metadata().get("application_name").cloned())
            .unwrap_or_default()
    }

    /// A transaction ended: its cursors and continuous portals end with it.
    async fn end_transaction(&self) {
        self.cursors.lock().expect("cursors lock").clear();
        let portals: Vec<LivePortal> = self
            .live_portals
            .lock()
            .expect("portals lock")
            .drain()
            .map(|(_, p)| p)
            .collect();
        for p in portals {
            *p.state.lock().await = PortalExecutionState::Finished;
        }
    }

    async fn declare<C: ClientInfo>(
        &self,
        client: &C,
        name: String,
        query: &str,
        subscribe: bool,
    ) -> eddy_planner::Result<Executed> {
        let in_block = self.in_block.load(Ordering::Relaxed)
            || client.transaction_status() != TransactionStatus::Idle;
        if !in_block {
            return Err(Error::new(
                ErrorKind::NoActiveTransaction,
                "DECLARE CURSOR can only be used in transaction blocks",
            )
            .with_hint("Run BEGIN first; the cursor ends with COMMIT or ROLLBACK."));
        }
        if self
            .cursors
            .lock()
            .expect("cursors lock")
            .contains_key(&name)
        {
            return Err(Error::new(
                ErrorKind::DuplicateCursor,
                format!("cursor \"{name}\" already exists"),
            ));
        }
        let cursor = if subscribe {
            let handle = self.subscribe(client, query, "cursor").await?;
            Cursor {
                columns: handle.query.columns.clone(),
                rows: CursorRows::Live(Arc::new(handle)),
            }
        } else {
            let ctx = self.db.query_context()?;
            let (columns, rows) = query::run_stream(&ctx, query).await?;
            Cursor {
                columns,
                rows: CursorRows::Query(QueryRows {
                    ready: VecDeque::new(),
                    rest: Some(rows),
                }),
            }
        };
        self.cursors
            .lock()
            .expect("cursors lock")
            .insert(name, cursor);
        Ok(Executed::command("DECLARE CURSOR"))
    }

    /// FETCH: from a live cursor, waits for the first row (at most the timeout), then
    /// returns what is queued, up to the count.
    async fn fetch(&self, f: Fetch) -> eddy_planner::Result<Executed> {
        let (columns, live) = {
            let mut cursors = self.cursors.lock().expect("cursors lock");
            let cursor = cursors
                .get_mut(&f.cursor)
                .ok_or_else(|| undefined_cursor(&f.cursor))?;
            match &mut cursor.rows {
                CursorRows::Query(rows) => (cursor.columns.clone(), Err(std::mem::take(rows))),
                CursorRows::Live(h) => (cursor.columns.clone(), Ok(h.clone())),
            }
        };
        let live = match live {
            Ok(live) => live,
            Err(mut rows) => {
                // Out of the lock while the query makes rows; back in it after.
                let out = rows.take(f.count.map(|c| c as usize)).await;
                let mut cursors = self.cursors.lock().expect("cursors lock");
                if let Some(Cursor {
                    rows: CursorRows::Query(place),
                    ..
                }) = cursors.get_mut(&f.cursor)
                {
                    *place = rows;
                }
                return Ok(Executed::fetched(columns, out?));
            }
        };
        if f.count == Some(0) {
            return Ok(Executed::fetched(columns, Vec::new()));
        }
        let max = f.count.map_or(0, |c| c as usize);
        let mut rows = live.take(max)?;
        if rows.is_empty() {
            let wait = async {
                tokio::select! {
                    _ = live.wait() => {}
                    _ = self.peer_closed() => {}
                }
            };
            match f.timeout_us {
                Some(us) => {
                    let _ = tokio::time::timeout(Duration::from_micros(us as u64), wait).await;
                }
                None => wait.await,
            }
            rows = live.take(max)?;
        }
        Ok(Executed::fetched(columns, rows))
    }

    async fn subscribe<C: ClientInfo>(
        &self,
        client: &C,
        query: &str,
        kind: &'static str,
    ) -> eddy_planner::Result<SubscriptionHandle> {
        let opening = Opening {
            text: format!("{query} EMIT CHANGES"),
            kind,
            client: client_of(client, self.application_name(client)),
            rows_max: self.rows_max.load(Ordering::Relaxed),
        };
        let stmt = Statement::Subscribe(query.to_string());
        self.db.authorize(&self.role(), &stmt).await?;
        self.db.subscribe(query, opening).await
    }

    /// Resolves when the client has closed its connection.
    async fn peer_closed(&self) {
        let Some(peer) = &self.peer else {
            return std::future::pending().await;
        };
        let mut buf = [0u8; 1];
        loop {
            match peer.peek(&mut buf).await {
                Ok(0) | Err(_) => return,
                // The client sent something pgwire will read later; look again shortly.
                Ok(_) => tokio::time::sleep(Duration::from_millis(50)).await,
            }
        }
    }

    /// Sends a continuous query's rows as they come: with `max_rows`, returns after at
    /// least one and at most `max_rows` rows, once nothing more is queued; without, only
    /// ends with an error (the subscription failed, or the client left).
    async fn pump<C>(
        &self,
        client: &mut C,
        sub: &SubscriptionHandle,
        wire: &mut Wire,
        max_rows: usize,
    ) -> PgWireResult<usize>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut sent = 0;
        loop {
            let want = if max_rows == 0 { 0 } else { max_rows - sent };
            let rows = sub.take(want).map_err(|e| user_error(&e))?;
            if rows.is_empty() {
                client.flush().await?;
                if max_rows > 0 && sent > 0 {
                    return Ok(sent);
                }
                tokio::select! {
                    _ = sub.wait() => {}
                    _ = self.peer_closed() => return Err(disconnected()),
                }
                continue;
            }
            sent += rows.len();
            for m in wire.encode(rows)? {
                client.feed(m).await?;
            }
            if max_rows > 0 && sent >= max_rows {
                client.flush().await?;
                return Ok(sent);
            }
        }
    }

    /// A continuous query on the simple protocol: a row description (or a COPY
    /// header), then rows until the client cancels or leaves.
    async fn stream_simple<C>(
        &self,
        client: &mut C,
        query: &str,
        copy: Option<CopyOut>,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let kind = if copy.is_some() { "copy" } else { "rows" };
        let sub = self
            .subscribe(client, query, kind)
            .await
            .map_err(|e| user_error(&e))?;
        let mut wire = match copy {
            Some(c) => {
                let mut lines = CopyLines::new(&sub.query.columns, &c);
                start_copy_out(client, sub.query.columns.len(), lines.header()).await?;
                Wire::Copy(Box::new(lines))
            }
            None => {
                if self.application_name(client).starts_with("psql") {
                    let mut info = ErrorInfo::new(
                        SEVERITY_NOTICE.to_string(),
                        "00000".to_string(),
                        "psql shows a result only when the query ends, and a continuous query does not end".to_string(),
                    );
                    info.hint = Some(format!(
                        "To see rows as they change, run COPY ({query} EMIT CHANGES) TO STDOUT; Ctrl-C stops it."
                    ));
                    client
                        .send(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                            info,
                        )))
                        .await?;
                }
                let f = fields(&sub.query.columns, &|_| FieldFormat::Text, &self.format());
                client
                    .send(PgWireBackendMessage::RowDescription(
                        pgwire::messages::data::RowDescription::new(
                            f.iter().map(Into::into).collect(),
                        ),
                    ))
                    .await?;
                Wire::Rows(f)
            }
        };
        self.pump(client, &sub, &mut wire, 0).await.map(|_| ())
    }
}

fn undefined_cursor(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedCursor,
        format!("cursor \"{name}\" does not exist"),
    )
}

async fn start_copy_out<C>(
    client: &mut C,
    columns: usize,
    header: Option<Vec<u8>>,
) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    client
        .feed(PgWireBackendMessage::CopyOutResponse(CopyOutResponse::new(
            0,
            columns as i16,
            vec![0; columns],
        )))
        .await?;
    if let Some(h) = header {
        client
            .feed(PgWireBackendMessage::CopyData(CopyData::new(h.into())))
            .await?;
    }
    client.flush().await?;
    Ok(())
}

#[async_trait]
impl SimpleQueryHandler for Session {
    async fn do_query<C>(&self, client: &mut C, query: &str) -> PgWireResult<Vec<Response>>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statements = match self
            .db
            .limits()
            .check(
                Limit::StatementBytes,
                query.len() as u64,
                "the query string",
            )
            .and_then(|_| sql::split_statements(query))
        {
            Ok(s) => s,
            Err(e) => return Ok(vec![Response::Error(Box::new(error_info(&e)))]),
        };
        let mut out = Vec::new();
        let count = statements.len();
        for text in statements {
            let stmt = match sql::parse_statement(&text) {
                Ok(stmt) => stmt,
                Err(e) => {
                    out.push(Response::Error(Box::new(error_info(&e))));
                    break;
                }
            };
            let continuous = match &stmt {
                Statement::Subscribe(q) => Some((q.clone(), None)),
                Statement::CopyOut(c) if c.subscribe => Some((c.query.clone(), Some(c.clone()))),
                _ => None,
            };
            if let Some((query, copy)) = continuous {
                if count > 1 {
                    let e = Error::unsupported(
                        "a continuous query must be the only statement of its query string",
                    );
                    return Ok(vec![Response::Error(Box::new(error_info(&e)))]);
                }
                return self
                    .stream_simple(client, &query, copy)
                    .await
                    .map(|_| Vec::new());
            }
            let (kind, started) = (Kind::of(&stmt), Instant::now());
            let _running = self.db.running();
            let span = tracing::debug_span!("statement", sql = %text);
            let settings = self.settings_for(&*client, &stmt, &text);
            let result = eddy_cluster::log::STATEMENT_DEADLINE
                .scope(
                    self.deadline(),
                    crate::sql::query::SESSION_SETTINGS.scope(
                        settings,
                        self.in_time_zone(self.run(client, stmt).instrument(span)),
                    ),
                )
                .await;
            self.db.statement_done(kind, &text, started);
            match result {
                Ok(executed) => {
                    send_notices(client, &executed.notices).await?;
                    let is_copy = matches!(executed.output, Output::CopyIn(_));
                    out.push(self.respond(executed, &|_| FieldFormat::Text));
                    if is_copy {
                        break;
                    }
                }
                Err(e) => {
                    out.push(Response::Error(Box::new(error_info(&e))));
                    break;
                }
            }
        }
        if out.is_empty() {
            out.push(Response::EmptyQuery);
        }
        Ok(out)
    }
}

/// Parses at Parse time so syntax errors surface there, as in PostgreSQL; the parsed
/// statement is kept for every execution.
pub struct EddyParser(Arc<Limits>);

#[async_trait]
impl QueryParser for EddyParser {
    type Statement = Arc<Prepared>;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<Arc<Prepared>>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        self.0
            .check(Limit::StatementBytes, sql.len() as u64, "the statement")
            .map_err(|e| user_error(&e))?;
        let mut statements = sql::split_statements(sql).map_err(|e| user_error(&e))?;
        match statements.len() {
            0 => Ok(None),
            1 => {
                let text = statements.remove(0);
                let stmt = sql::parse_statement(&text).map_err(|e| user_error(&e))?;
                Ok(Some(Prepared::new(text, stmt)))
            }
            _ => Err(user_error(&Error::syntax(
                "cannot insert multiple commands into a prepared statement",
            ))),
        }
    }

    fn get_parameter_types(&self, _stmt: &Arc<Prepared>) -> PgWireResult<Vec<Type>> {
        Ok(Vec::new())
    }

    fn get_result_schema(
        &self,
        _stmt: &Arc<Prepared>,
        _column_format: Option<&Format>,
    ) -> PgWireResult<Vec<pgwire::api::results::FieldInfo>> {
        Ok(Vec::new())
    }
}

impl Session {
    /// A prepared statement against the current catalog: its shape and how it runs.
    /// INSERTs and queries are bound once per catalog version; their fast path comes
    /// from the same binding as their shape (the INSERT's template, the query's plan).
    async fn bind(&self, prepared: &Prepared) -> eddy_planner::Result<Arc<Bound>> {
        match prepared.bound(|c| self.db.is_current(c)) {
            Some(b) => Ok(b),
            // Boxed: planning is a large state machine (14 KiB), which every statement's
            // future would otherwise carry, and copy, whether it plans or not.
            None => Box::pin(self.bind_anew(prepared)).await,
        }
    }

    /// `bind` for a statement not yet bound against the current catalog.
    async fn bind_anew(&self, prepared: &Prepared) -> eddy_planner::Result<Arc<Bound>> {
        let catalog = self.db.catalog();
        let (shape, fast) = match &prepared.stmt {
            Statement::Insert(insert) => {
                let template = eddy_planner::bind::InsertTemplate::new(&catalog, insert)?;
                let params = template
                    .params
                    .iter()
                    .map(|c| {
                        c.as_ref()
                            .map_or(Type::TEXT, |c| pg_type(ResultType::Column(c.ty)))
                    })
                    .collect();
                let columns = template
                    .returning
                    .iter()
                    .flatten()
                    .map(|c| Column::new(c.name.clone(), pg_type(c.ty)))
                    .collect();
                // Expressions are evaluated with their parameters as literals (General).
                let fast = if template.exprs.is_empty() {
                    Fast::Insert(Arc::new(template))
                } else {
                    Fast::General
                };
                ((params, columns), fast)
            }
            Statement::Query(q) => {
                let ctx = self.db.query_context()?;
                let (plan, columns, params) = query::describe(&ctx, q).await?;
                let fast = match query::PointLookup::recognise(&plan, &params, &ctx.state()) {
                    Some(lookup) => Fast::Lookup(Arc::new(lookup)),
                    None => Fast::General,
                };
                ((pg_types(&params), columns), fast)
            }
            other => {
                // Depends on session state (cursors) or runs the statement: not kept.
                let shape = self.shape(&prepared.text, other).await?;
                return Ok(Arc::new(Bound {
                    catalog,
                    shape,
                    fast: Fast::General,
                }));
            }
        };
        Ok(prepared.keep(Bound {
            catalog,
            shape,
            fast,
        }))
    }

    /// Parameter types and result columns of a statement that is not bound once per
    /// catalog (INSERTs and queries are, in `bind`), without running it.
    async fn shape(
        &self,
        sql_text: &str,
        stmt: &Statement,
    ) -> eddy_planner::Result<(Vec<Type>, Vec<Column>)> {
        let catalog = self.db.catalog();
        match stmt {
            Statement::Subscribe(q) => {
                let (columns, params) =
                    crate::session::subscribe::ContinuousQuery::describe(&catalog, q).await?;
                Ok((pg_types(&params), columns))
            }
            Statement::Fetch(f) => {
                let cursors = self.cursors.lock().expect("cursors lock");
                let cursor = cursors
                    .get(&f.cursor)
                    .ok_or_else(|| undefined_cursor(&f.cursor))?;
                Ok((Vec::new(), cursor.columns.clone()))
            }
            // A session setting is the session's: its column is its name.
            Statement::ShowVariable(name) if Setting::named(name).is_some() => {
                let setting = Setting::named(name).expect("named");
                Ok((Vec::new(), vec![Column::text(setting.name())]))
            }
            Statement::ShowSubscriptions
            | Statement::ShowStorage
            | Statement::ShowCluster
            | Statement::ShowTasks
            | Statement::ShowShards
            | Statement::ShowStreams
            | Statement::ShowMetrics
            | Statement::Describe(_)
            | Statement::ExplainStream(..)
            | Statement::ExplainMetric(..)
            | Statement::ShowVariable(_) => match self.db.execute(sql_text).await?.output {
                Output::Rows { columns, .. } => Ok((Vec::new(), columns)),
                _ => Ok((Vec::new(), Vec::new())),
            },
            _ => Ok((Vec::new(), Vec::new())),
        }
    }

    /// The type of each parameter of a portal: as the client declared it, else as
    /// inferred from the statement.
    async fn parameter_types(
        &self,
        portal: &Portal<Arc<Prepared>>,
    ) -> eddy_planner::Result<Vec<Type>> {
        let declared = &portal.statement.parameter_types;
        let n = portal.parameters.len();
        let needs_inference = (0..n).any(|i| {
            portal.parameter_format.is_binary(i)
                && declared
                    .get(i)
                    .cloned()
                    .flatten()
                    .is_none_or(|t| t == Type::UNKNOWN)
        });
        let inferred = if needs_inference {
            self.bind(&portal.statement.statement)
                .await?
                .shape
                .0
                .clone()
        } else {
            Vec::new()
        };
        Ok((0..n)
            .map(|i| parameter_type(declared, &inferred, i))
            .collect())
    }

    /// Each parameter of a portal as text (`None` for NULL), as a text-format
    /// parameter would have sent it.
    async fn parameter_texts(
        &self,
        portal: &Portal<Arc<Prepared>>,
    ) -> eddy_planner::Result<Vec<Option<String>>> {
        let types = self.parameter_types(portal).await?;
        portal
            .parameters
            .iter()
            .enumerate()
            .map(|(i, p)| match p {
                None => Ok(None),
                Some(bytes) => param_text(&types[i], bytes, portal.parameter_format.is_binary(i))
                    .map(|(text, _)| Some(text)),
            })
            .collect()
    }

    /// The SQL text of a portal with its parameters substituted as literals.
    async fn bound_sql(&self, portal: &Portal<Arc<Prepared>>) -> eddy_planner::Result<String> {
        let sql_text = &portal.statement.statement.text;
        if portal.parameters.is_empty() {
            return Ok(sql_text.clone());
        }
        let types = self.parameter_types(portal).await?;
        let mut literals = Vec::with_capacity(portal.parameters.len());
        for (i, p) in portal.parameters.iter().enumerate() {
            literals.push(match p {
                None => "NULL".to_string(),
                Some(bytes) => {
                    let (text, bare) =
                        param_text(&types[i], bytes, portal.parameter_format.is_binary(i))?;
                    if bare {
                        text
                    } else {
                        quote_literal(&text)
                    }
                }
            });
        }
        sql::substitute_params(sql_text, &literals)
    }

    /// Runs a portal's statement: through its fast path when it has one, else with its
    /// parameters substituted, parsed and run. A prepared INSERT is only bound
    /// (`Ran::Insert`): the caller runs it, sending RETURNING rows as they come.
    async fn execute_portal<C: ClientInfo>(
        &self,
        client: &C,
        portal: &Portal<Arc<Prepared>>,
    ) -> eddy_planner::Result<Ran> {
        let prepared = &portal.statement.statement;
        if prepared.cacheable() {
            let bound = self.bind(prepared).await?;
            self.may_run(&bound)?;
            match &bound.fast {
                Fast::Insert(template) => {
                    let types = self.parameter_types(portal).await?;
                    let plan = template.bind(&mut |i, col| match portal.parameters.get(i) {
                        Some(Some(bytes)) => {
                            let binary = portal.parameter_format.is_binary(i);
                            param_into(&types[i], bytes, binary, col)
                        }
                        Some(None) => Ok(eddy_planner::types::Value::Null),
                        None => Err(Error::new(
                            ErrorKind::InvalidParameter,
                            format!("there is no parameter ${}", i + 1),
                        )),
                    })?;
                    return Ok(Ran::Insert(plan));
                }
                Fast::Lookup(lookup) => {
                    let texts = self.parameter_texts(portal).await?;
                    if let Some(rows) = lookup.run(&texts).await? {
                        return Ok(Ran::Executed(Executed::selected(
                            bound.shape.1.clone(),
                            rows,
                        )));
                    }
                }
                Fast::General => {}
            }
        }
        let stmt = sql::parse_statement(&self.bound_sql(portal).await?)?;
        Box::pin(self.run(client, stmt)).await.map(Ran::Executed)
    }

    /// Runs an INSERT with RETURNING, sending each part's rows as soon as the shards
    /// have applied it: the client reads one part while the next is applied and
    /// encoded. Its notices (late and duplicate events) follow the rows, and its
    /// command tag comes back to be sent.
    async fn insert_streaming<C>(
        &self,
        client: &mut C,
        plan: &InsertPlan,
        format_for: &(dyn Fn(usize) -> FieldFormat + Sync),
    ) -> PgWireResult<Executed>
    where
        C: Sink<PgWireBackendMessage> + Unpin + Send,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut inserting = self
            .db
            .inserting(plan, self.durable())
            .map_err(|e| user_error(&e))?;
        let f = fields(&inserting.columns(), format_for, &self.format());
        while let Some(rows) = inserting.next_part().await.map_err(|e| user_error(&e))? {
            for row in encode_rows(&f, rows) {
                client.feed(PgWireBackendMessage::DataRow(row?)).await?;
            }
        }
        Ok(inserting.finish(None))
    }
}

/// The PostgreSQL types of the parameters DataFusion inferred (text where it could not).
fn pg_types(params: &[Option<datafusion::arrow::datatypes::DataType>]) -> Vec<Type> {
    params
        .iter()
        .map(|t| t.as_ref().map_or(Type::TEXT, pg_type_of_arrow))
        .collect()
}

/// The type of parameter `i`: as the client declared it, else as inferred, else text.
fn parameter_type(declared: &[Option<Type>], inferred: &[Type], i: usize) -> Type {
    declared
        .get(i)
        .cloned()
        .flatten()
        .filter(|t| *t != Type::UNKNOWN)
        .or_else(|| inferred.get(i).cloned())
        .unwrap_or(Type::TEXT)
}

/// A parameter as the value of the column it fills: text as sent is the column's input,
/// read in place; a binary one of the column's own type is read straight into the value
/// (`param_value`); any other goes through its text (`param_text`), as in SQL.
fn param_into(
    ty: &Type,
    bytes: &[u8],
    binary: bool,
    col: &eddy_planner::catalog::ColumnDef,
) -> eddy_planner::Result<eddy_planner::types::Value> {
    if !binary {
        return eddy_planner::bind::value_from_text(utf8_param(bytes)?, col);
    }
    match param_value(ty, bytes, col) {
        Some(value) => Ok(value),
        None => {
            let text = param_text(ty, bytes, true)?.0;
            // A typed number is assigned, as in SQL: into an integer it rounds.
            if matches!(*ty, Type::FLOAT4 | Type::FLOAT8 | Type::NUMERIC) {
                eddy_planner::bind::value_from_number(&text, col)
            } else {
                eddy_planner::bind::value_from_text(&text, col)
            }
        }
    }
}

fn utf8_param(bytes: &[u8]) -> eddy_planner::Result<&str> {
    std::str::from_utf8(bytes)
        .map_err(|_| Error::new(ErrorKind::InvalidText, "parameter is not valid UTF-8"))
}

/// A binary parameter read straight into the value of a column of its own type, as the
/// text path (`param_text`, then the column's input) would read it; `None` for every
/// other pairing, and for values the text path may refuse (an INT8 out of an INTEGER's
/// range, a float that is not finite, a timestamp outside years 1–9999), which then
/// take the text path and its error.
fn param_value(
    ty: &Type,
    bytes: &[u8],
    col: &eddy_planner::catalog::ColumnDef,
) -> Option<eddy_planner::types::Value> {
    use eddy_planner::types::{ColumnType, Value};
    // 0001-01-01 and 10000-01-01, in microseconds since 1970.
    const TIMESTAMP_US: std::ops::Range<i64> = -62_135_596_800_000_000..253_402_300_800_000_000;
    let int = match (ty, bytes.len()) {
        (&Type::INT2, 2) => Some(i16::from_be_bytes(bytes.try_into().ok()?) as i64),
        (&Type::INT4, 4) => Some(i32::from_be_bytes(bytes.try_into().ok()?) as i64),
        (&Type::INT8, 8) => Some(i64::from_be_bytes(bytes.try_into().ok()?)),
        _ => None,
    };
    match col.ty {
        ColumnType::Int64 => int.map(Value::Int),
        ColumnType::Int32 => int.filter(|v| i32::try_from(*v).is_ok()).map(Value::Int),
        ColumnType::Float64 if *ty == Type::FLOAT8 && bytes.len() == 8 => {
            let v = f64::from_be_bytes(bytes.try_into().ok()?);
            v.is_finite().then_some(Value::Float(v))
        }
        ColumnType::Timestamp | ColumnType::TimestampTz
            if (*ty == Type::TIMESTAMP || *ty == Type::TIMESTAMPTZ) && bytes.len() == 8 =>
        {
            let us = timestamp_from_pg_binary(i64::from_be_bytes(bytes.try_into().ok()?));
            TIMESTAMP_US.contains(&us).then_some(Value::Timestamp(us))
        }
        ColumnType::Boolean if *ty == Type::BOOL && bytes.len() == 1 => {
            Some(Value::Bool(bytes[0] == 1))
        }
        ColumnType::Text if *ty == Type::TEXT || *ty == Type::VARCHAR => std::str::from_utf8(bytes)
            .ok()
            .map(|t| Value::Text(t.into())),
        _ => None,
    }
}

/// A parameter's value as text, with whether it may stand in SQL unquoted (a number or
/// a boolean). Text-format parameters are their text; binary ones are decoded by type.
fn param_text(ty: &Type, bytes: &[u8], binary: bool) -> eddy_planner::Result<(String, bool)> {
    if !binary {
        return Ok((utf8_param(bytes)?.to_string(), false));
    }
    let bad = |what: &str| {
        Error::new(
            ErrorKind::InvalidText,
            format!("invalid binary {what} parameter"),
        )
    };
    let num = |b: &[u8], n: usize| -> eddy_planner::Result<[u8; 8]> {
        if b.len() != n {
            return Err(bad(ty.name()));
        }
        let mut out = [0u8; 8];
        out[8 - n..].copy_from_slice(b);
        Ok(out)
    };
    Ok(match *ty {
        Type::INT2 => (
            i16::from_be_bytes([
                bytes.first().copied().unwrap_or(0),
                bytes.get(1).copied().unwrap_or(0),
            ])
            .to_string(),
            true,
        ),
        Type::INT4 => (
            (i64::from_be_bytes(num(bytes, 4)?) as u32 as i32).to_string(),
            true,
        ),
        Type::INT8 => (i64::from_be_bytes(num(bytes, 8)?).to_string(), true),
        Type::FLOAT4 | Type::FLOAT8 => {
            let v = if *ty == Type::FLOAT4 {
                f32::from_bits(u64::from_be_bytes(num(bytes, 4)?) as u32) as f64
            } else {
                f64::from_bits(u64::from_be_bytes(num(bytes, 8)?))
            };
            if v.is_finite() {
                (format!("{v:?}"), true)
            } else {
                (eddy_planner::types::format_float(v), false)
            }
        }
        Type::BOOL => (
            if bytes.first() == Some(&1) {
                "TRUE"
            } else {
                "FALSE"
            }
            .to_string(),
            true,
        ),
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let us = i64::from_be_bytes(num(bytes, 8)?);
            (format_timestamp(timestamp_from_pg_binary(us)), false)
        }
        Type::NUMERIC => {
            let d = rust_decimal::Decimal::from_sql(ty, bytes).map_err(|_| bad("numeric"))?;
            (d.to_string(), true)
        }
        _ => {
            let text = std::str::from_utf8(bytes).map_err(|_| bad(ty.name()))?;
            (text.to_string(), false)
        }
    })
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = Arc<Prepared>;
    type QueryParser = EddyParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    /// Continuous queries get their own Execute: rows as they come, and with a row
    /// limit (pgjdbc's fetch size) at least one row, then `PortalSuspended`.
    async fn on_execute<C>(&self, client: &mut C, message: Execute) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let name = message
            .name
            .clone()
            .unwrap_or_else(|| DEFAULT_NAME.to_string());
        let portal = match client.portal_store().get_portal(&name) {
            Some(Entry::Value(p)) if is_continuous(&p.statement.statement.stmt) => p,
            _ => {
                // pgwire sizes its row buffer by the row limit: a negative one means none
                // (as in PostgreSQL), and a huge one is served in pieces.
                let mut message = message;
                message.max_rows = match message.max_rows {
                    n if n < 0 => 0,
                    n => n.min(EXECUTE_ROWS_MAX),
                };
                // Answers wait for Sync, except a COPY's, which the client waits for.
                let result = self._on_execute(&mut Deferred(client), message).await;
                if matches!(client.state(), PgWireConnectionState::CopyInProgress(_)) {
                    client.flush().await?;
                }
                return result;
            }
        };
        if !matches!(client.state(), PgWireConnectionState::ReadyForQuery) {
            return Err(PgWireError::NotReadyForQuery);
        }
        client.set_state(PgWireConnectionState::QueryInProgress);
        let result = self
            .execute_continuous(client, &name, &portal, message.max_rows.max(0) as usize)
            .await;
        if result.is_err() {
            // The subscription ends with the statement; the portal stays, finished.
            *portal.state().lock().await = PortalExecutionState::Finished;
            self.live_portals
                .lock()
                .expect("portals lock")
                .remove(&name);
        }
        if !matches!(client.state(), PgWireConnectionState::AwaitingSync) {
            client.set_state(PgWireConnectionState::ReadyForQuery);
        }
        result
    }

    /// As pgwire's, with BindComplete left for Sync to flush.
    async fn on_bind<C>(&self, client: &mut C, mut message: Bind) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let statement_name = message.statement_name.as_deref().unwrap_or(DEFAULT_NAME);
        let portal_name = message.portal_name.as_deref().unwrap_or(DEFAULT_NAME);
        match client.portal_store().get_statement(statement_name) {
            Some(Entry::Value(statement)) => {
                // The parameters move into the portal (pgwire's `try_new` copies them).
                let parameters = std::mem::take(&mut message.parameters);
                let mut portal = Portal::try_new(&message, statement)?;
                portal.parameters = parameters;
                client.portal_store().put_portal(Arc::new(portal));
            }
            Some(Entry::Empty) => {
                if !message.parameters.is_empty() {
                    return Err(PgWireError::UserError(Box::new(ErrorInfo::new(
                        SEVERITY_ERROR.to_owned(),
                        "08P01".to_owned(),
                        format!(
                            "bind message supplies {} parameters, but prepared statement \"{statement_name}\" requires 0",
                            message.parameters.len(),
                        ),
                    ))));
                }
                client.portal_store().put_empty_portal(portal_name);
            }
            None => return Err(PgWireError::StatementNotFound(statement_name.to_owned())),
        }
        client
            .feed(PgWireBackendMessage::BindComplete(BindComplete::new()))
            .await?;
        Ok(())
    }

    /// As pgwire's, with the answer left for Sync to flush.
    async fn on_describe<C>(&self, client: &mut C, message: Describe) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Self::Statement>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self._on_describe(&mut Deferred(client), message).await
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<Arc<Prepared>>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let bound = self
            .bind(&target.statement)
            .await
            .map_err(|e| user_error(&e))?;
        let (inferred, columns) = &bound.shape;
        let n = inferred.len().max(target.parameter_types.len());
        let params = (0..n)
            .map(|i| parameter_type(&target.parameter_types, inferred, i))
            .collect();
        let f = fields(columns, &|_| FieldFormat::Text, &self.format());
        Ok(DescribeStatementResponse::new(
            params,
            Arc::unwrap_or_clone(f),
        ))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        target: &Portal<Arc<Prepared>>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let bound = self
            .bind(&target.statement.statement)
            .await
            .map_err(|e| user_error(&e))?;
        let f = fields(
            &bound.shape.1,
            &|i| target.result_column_format.format_for(i),
            &self.format(),
        );
        Ok(DescribePortalResponse::new(Arc::unwrap_or_clone(f)))
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<Arc<Prepared>>,
        max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = Arc<Prepared>>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let prepared = &portal.statement.statement;
        let (kind, started) = (Kind::of(&prepared.stmt), Instant::now());
        let _running = self.db.running();
        let span = tracing::debug_span!("statement", sql = %prepared.text);
        let settings = self.settings_for(&*client, &prepared.stmt, &prepared.text);
        let format_for = |i| portal.result_column_format.format_for(i);
        let result = async {
            match self.execute_portal(client, portal).await {
                Ok(Ran::Executed(executed)) => Ok(executed),
                // Under a row limit (`max_rows`) pgwire pages the rows, suspending the
                // portal: they are collected first.
                Ok(Ran::Insert(plan)) if plan.returning.is_some() && max_rows == 0 => {
                    self.insert_streaming(client, &plan, &format_for).await
                }
                Ok(Ran::Insert(plan)) => self
                    .db
                    .insert(plan, self.durable())
                    .await
                    .map_err(|e| user_error(&e)),
                Err(e) => Err(user_error(&e)),
            }
        }
        .instrument(span);
        // Boxed once: each scope below wraps it by value, and moving the statement's whole
        // state machine at every wrap took `memmove` to 6 % of the CPU at 16 clients (3 %
        // boxed). It is small because the rare paths inside it box their own state where
        // they start (`bind_anew`, `run`, a lookup `AS OF`): 15 KiB before they did, and
        // `memmove` went from 4.3 % to 1.8 % of the CPU (pgbench, 16 clients, commit off).
        let result = Box::pin(result);
        let result = eddy_cluster::log::STATEMENT_DEADLINE
            .scope(
                self.deadline(),
                crate::sql::query::SESSION_SETTINGS.scope(settings, self.in_time_zone(result)),
            )
            .await;
        self.db.statement_done(kind, &prepared.text, started);
        let executed = result?;
        send_notices(client, &executed.notices).await?;
        Ok(self.respond(executed, &format_for))
    }
}

/// What `execute_portal` did: ran the statement, or bound an INSERT for its caller to
/// run (streaming RETURNING rows, `Session::insert_streaming`).
enum Ran {
    Executed(Executed),
    Insert(InsertPlan),
}

/// Whether a statement is a continuous query.
fn is_continuous(stmt: &Statement) -> bool {
    matches!(
        stmt,
        Statement::Subscribe(_)
            | Statement::CopyOut(CopyOut {
                subscribe: true,
                ..
            })
    )
}

impl Session {
    async fn execute_continuous<C>(
        &self,
        client: &mut C,
        name: &str,
        portal: &Arc<Portal<Arc<Prepared>>>,
        max_rows: usize,
    ) -> PgWireResult<()>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let initial = matches!(*portal.state().lock().await, PortalExecutionState::Initial);
        let (sub, columns, copy) = if initial {
            let text = self.bound_sql(portal).await.map_err(|e| user_error(&e))?;
            let (query, copy) = match sql::parse_statement(&text).map_err(|e| user_error(&e))? {
                Statement::Subscribe(q) => (q, None),
                Statement::CopyOut(c) => (c.query.clone(), Some(c)),
                _ => return Err(user_error(&Error::internal("not a continuous query"))),
            };
            let kind = if copy.is_some() { "copy" } else { "portal" };
            let sub = Arc::new(
                self.subscribe(client, &query, kind)
                    .await
                    .map_err(|e| user_error(&e))?,
            );
            let columns = sub.query.columns.clone();
            let f = fields(
                &columns,
                &|i| portal.result_column_format.format_for(i),
                &self.format(),
            );
            portal
                .start(QueryResponse::new(f, holder(sub.clone())))
                .await;
            {
                let mut live = self.live_portals.lock().expect("portals lock");
                live.retain(|_, p| p.sub.strong_count() > 0);
                live.insert(
                    name.to_string(),
                    LivePortal {
                        state: portal.state(),
                        sub: Arc::downgrade(&sub),
                        columns: columns.clone(),
                        copy: copy.clone(),
                    },
                );
            }
            if let Some(c) = &copy {
                let mut lines = CopyLines::new(&columns, c);
                start_copy_out(client, columns.len(), lines.header()).await?;
            }
            (sub, columns, copy)
        } else {
            let found = self
                .live_portals
                .lock()
                .expect("portals lock")
                .get(name)
                .and_then(|p| Some((p.sub.upgrade()?, p.columns.clone(), p.copy.clone())));
            match found {
                Some(found) => found,
                None => {
                    // A finished portal has no more rows.
                    client
                        .send(PgWireBackendMessage::CommandComplete(
                            Tag::new("SELECT").with_rows(0).into(),
                        ))
                        .await?;
                    return Ok(());
                }
            }
        };
        let mut wire = match &copy {
            Some(c) => Wire::Copy(Box::new(CopyLines::new(&columns, c))),
            None => Wire::Rows(fields(
                &columns,
                &|i| portal.result_column_format.format_for(i),
                &self.format(),
            )),
        };
        // A COPY streams until it ends; rows honour the Execute's row limit.
        let limit = if copy.is_some() { 0 } else { max_rows };
        let cancel = match client.session_extensions().get::<Arc<ConnectionHandle>>() {
            Some(handle) => Some(handle.start_query().await),
            None => None,
        };
        let pumped = {
            let pump = self.pump(client, &sub, &mut wire, limit);
            match cancel {
                Some(cancel) => tokio::select! {
                    r = pump => r,
                    _ = cancel => Err(PgWireError::QueryCanceled),
                },
                None => pump.await,
            }
        };
        pumped?;
        client
            .send(PgWireBackendMessage::PortalSuspended(PortalSuspended::new()))
            .await?;
        Ok(())
    }
}

#[async_trait]
impl CopyHandler for Session {
    async fn on_copy_data<C>(&self, _client: &mut C, copy_data: CopyData) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let mut guard = self.copy.lock().expect("copy lock");
        match guard.as_mut() {
            // Past its time the COPY ends, and none of it applies.
            Some((_, Some(deadline))) if Instant::now() >= *deadline => {
                *guard = None;
                Err(user_error(&statement_timeout()))
            }
            Some((copy, _)) => copy.push(&copy_data.data).map_err(|e| {
                *guard = None;
                user_error(&e)
            }),
            None => Err(user_error(&Error::internal("COPY data without COPY"))),
        }
    }

    async fn on_copy_done<C>(&self, client: &mut C, _done: CopyDone) -> PgWireResult<()>
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let copy = self.copy.lock().expect("copy lock").take();
        let Some((copy, deadline)) = copy else {
            return Err(user_error(&Error::internal("COPY done without COPY")));
        };
        // The last moment a COPY can be cancelled: nothing of it has applied yet.
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(user_error(&statement_timeout()));
        }
        let executed = self
            .db
            .finish_copy(copy, self.durable())
            .await
            .map_err(|e| user_error(&e))?;
        send_notices(client, &executed.notices).await?;
        if let Output::Command { rows, .. } = executed.output {
            let tag = Tag::new("COPY").with_rows(rows.unwrap_or(0));
            client
                .send(PgWireBackendMessage::CommandComplete(tag.into()))
                .await?;
        }
        Ok(())
    }

    async fn on_copy_fail<C>(&self, _client: &mut C, fail: CopyFail) -> PgWireError
    where
        C: ClientInfo + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        self.copy.lock().expect("copy lock").take();
        PgWireError::UserError(Box::new(ErrorInfo::new(
            SEVERITY_ERROR.to_string(),
            "57014".to_string(),
            format!("COPY from stdin failed: {}", fail.message),
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_planner::catalog::ColumnDef;
    use eddy_planner::types::ColumnType;

    /// A binary parameter read straight into a column's value gives exactly what the
    /// text path gives, and declines whatever the text path might refuse or read
    /// otherwise.
    #[test]
    fn binary_parameters_read_as_the_text_path_reads_them() {
        let col = |ty| ColumnDef {
            name: "c".into(),
            ty,
            not_null: false,
            default: None,
        };
        let pg_2000 = |unix_us: i64| (unix_us - timestamp_from_pg_binary(0)).to_be_bytes();
        let cases: Vec<(Type, Vec<u8>, ColumnType, bool)> = vec![
            (
                Type::INT2,
                (-7i16).to_be_bytes().to_vec(),
                ColumnType::Int32,
                true,
            ),
            (
                Type::INT4,
                i32::MIN.to_be_bytes().to_vec(),
                ColumnType::Int64,
                true,
            ),
            (
                Type::INT8,
                i64::MAX.to_be_bytes().to_vec(),
                ColumnType::Int64,
                true,
            ),
            (
                Type::INT8,
                (1i64 << 40).to_be_bytes().to_vec(),
                ColumnType::Int32,
                false,
            ),
            (
                Type::INT8,
                12i64.to_be_bytes().to_vec(),
                ColumnType::Int32,
                true,
            ),
            (
                Type::FLOAT8,
                (-0.0f64).to_be_bytes().to_vec(),
                ColumnType::Float64,
                true,
            ),
            (
                Type::FLOAT8,
                0.1f64.to_be_bytes().to_vec(),
                ColumnType::Float64,
                true,
            ),
            (
                Type::FLOAT8,
                f64::NAN.to_be_bytes().to_vec(),
                ColumnType::Float64,
                false,
            ),
            (
                Type::FLOAT8,
                2.5f64.to_be_bytes().to_vec(),
                ColumnType::Int64,
                false,
            ),
            (Type::BOOL, vec![1], ColumnType::Boolean, true),
            (Type::BOOL, vec![0], ColumnType::Boolean, true),
            (Type::TEXT, b"caf\xc3\xa9".to_vec(), ColumnType::Text, true),
            (Type::TEXT, vec![0xff], ColumnType::Text, false),
            (Type::TEXT, b"12".to_vec(), ColumnType::Int64, false),
            (
                Type::TIMESTAMP,
                pg_2000(1_800_000_000_123_456).to_vec(),
                ColumnType::Timestamp,
                true,
            ),
            (
                Type::TIMESTAMP,
                pg_2000(-62_135_596_800_000_000).to_vec(),
                ColumnType::Timestamp,
                true,
            ),
            (
                Type::TIMESTAMPTZ,
                pg_2000(0).to_vec(),
                ColumnType::Timestamp,
                true,
            ),
            (
                Type::TIMESTAMP,
                i64::MAX.to_be_bytes().to_vec(),
                ColumnType::Timestamp,
                false,
            ),
        ];
        for (ty, bytes, column, direct) in cases {
            let c = col(column);
            let fast = param_value(&ty, &bytes, &c);
            assert_eq!(fast.is_some(), direct, "{ty} into {column:?}");
            if let Some(fast) = fast {
                let (text, _) = param_text(&ty, &bytes, true).unwrap();
                let slow = eddy_planner::bind::value_from_text(&text, &c).unwrap();
                assert_eq!(fast, slow, "{ty} into {column:?}: {text}");
            }
        }
    }
}
