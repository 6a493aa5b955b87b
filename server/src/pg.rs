//! The PostgreSQL protocol front end (pgwire): sessions, the simple and extended query
//! protocols, COPY, notices, cancel, and the mapping of errors to SQLSTATEs.
//!
//! Invariant: an error ends only the statement that raised it; the session and the
//! connection stay usable.

use std::fmt::Debug;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::{stream, Sink, SinkExt};
use pgwire::api::auth::noop::NoopStartupHandler;
use pgwire::api::cancel::DefaultCancelHandler;
use pgwire::api::copy::CopyHandler;
use pgwire::api::portal::{Format, Portal};
use pgwire::api::query::{ExtendedQueryHandler, SimpleQueryHandler};
use pgwire::api::results::{
    CopyResponse, DescribePortalResponse, DescribeStatementResponse, FieldFormat, QueryResponse,
    Response, Tag,
};
use pgwire::api::stmt::{QueryParser, StoredStatement};
use pgwire::api::store::PortalStore;
use pgwire::api::{ClientInfo, ClientPortalStore, ConnectionManager, PgWireServerHandlers, Type};
use pgwire::error::{ErrorInfo, PgWireError, PgWireResult, SEVERITY_ERROR, SEVERITY_NOTICE};
use pgwire::messages::copy::{CopyData, CopyDone, CopyFail};
use pgwire::messages::response::NoticeResponse;
use pgwire::messages::PgWireBackendMessage;
use postgres_types::FromSql;

use eddy_planner::aggregate::ResultType;
use eddy_planner::sql::{self, quote_literal, Statement};
use eddy_planner::types::format_timestamp;
use eddy_planner::{Error, ErrorKind};

use crate::cells::{
    encode_rows, fields, pg_type, pg_type_of_arrow, timestamp_from_pg_binary, Column,
};
use crate::copy::CopyIn;
use crate::db::{Db, Executed, Output};
use crate::query;

/// The SQLSTATE of an Eddy error.
pub fn sqlstate(kind: ErrorKind) -> &'static str {
    match kind {
        ErrorKind::Syntax => "42601",
        ErrorKind::UndefinedTable => "42P01",
        ErrorKind::UndefinedObject => "42704",
        ErrorKind::DuplicateObject => "42P07",
        ErrorKind::UndefinedColumn => "42703",
        ErrorKind::UndefinedFunction => "42883",
        ErrorKind::Grouping => "42803",
        ErrorKind::DatatypeMismatch => "42804",
        ErrorKind::NotNullViolation => "23502",
        ErrorKind::InvalidText => "22P02",
        ErrorKind::BadCopyFormat => "22P04",
        ErrorKind::NumericOutOfRange => "22003",
        ErrorKind::Unsupported => "0A000",
        ErrorKind::DependentObjects => "2BP01",
        ErrorKind::InvalidParameter => "22023",
        ErrorKind::ResourcesExhausted => "53000",
        ErrorKind::Internal => "XX000",
    }
}

pub fn error_info(e: &Error) -> ErrorInfo {
    let mut info = ErrorInfo::new(
        SEVERITY_ERROR.to_string(),
        sqlstate(e.kind).to_string(),
        e.message.clone(),
    );
    info.detail = e.detail.clone();
    info.hint = e.hint.clone();
    info
}

fn user_error(e: &Error) -> PgWireError {
    PgWireError::UserError(Box::new(error_info(e)))
}

async fn send_notices<C>(client: &mut C, notices: &[String]) -> PgWireResult<()>
where
    C: Sink<PgWireBackendMessage> + Unpin + Send,
    C::Error: Debug,
    PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
{
    for n in notices {
        let info = ErrorInfo::new(SEVERITY_NOTICE.to_string(), "00000".to_string(), n.clone());
        client
            .send(PgWireBackendMessage::NoticeResponse(NoticeResponse::from(
                info,
            )))
            .await?;
    }
    Ok(())
}

/// Per-connection state shared by the handlers of one connection.
pub struct Session {
    db: Arc<Db>,
    manager: Arc<ConnectionManager>,
    copy: Mutex<Option<CopyIn>>,
    parser: Arc<EddyParser>,
}

/// The handlers of one connection.
pub struct Handlers {
    session: Arc<Session>,
    cancel: Arc<DefaultCancelHandler>,
}

impl Handlers {
    pub fn new(db: Arc<Db>, manager: Arc<ConnectionManager>) -> Handlers {
        Handlers {
            cancel: Arc::new(DefaultCancelHandler::new(manager.clone())),
            session: Arc::new(Session {
                db,
                manager,
                copy: Mutex::new(None),
                parser: Arc::new(EddyParser),
            }),
        }
    }
}

impl PgWireServerHandlers for Handlers {
    fn simple_query_handler(&self) -> Arc<impl SimpleQueryHandler> {
        self.session.clone()
    }

    fn extended_query_handler(&self) -> Arc<impl ExtendedQueryHandler> {
        self.session.clone()
    }

    fn startup_handler(&self) -> Arc<impl pgwire::api::auth::StartupHandler> {
        self.session.clone()
    }

    fn copy_handler(&self) -> Arc<impl CopyHandler> {
        self.session.clone()
    }

    fn cancel_handler(&self) -> Arc<impl pgwire::api::cancel::CancelHandler> {
        self.cancel.clone()
    }
}

impl NoopStartupHandler for Session {
    fn connection_manager(&self) -> Option<Arc<ConnectionManager>> {
        Some(self.manager.clone())
    }
}

impl Session {
    /// Turns an executed statement into a protocol response.
    fn respond(&self, executed: Executed, format_for: &dyn Fn(usize) -> FieldFormat) -> Response {
        match executed.output {
            Output::Rows { columns, rows, tag } => {
                let f = fields(&columns, format_for);
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
            Output::CopyIn(copy) => {
                let columns = copy.columns();
                *self.copy.lock().expect("copy lock") = Some(copy);
                Response::CopyIn(CopyResponse::new(0, columns, stream::empty()))
            }
            Output::Begin => Response::TransactionStart(Tag::new("BEGIN")),
            Output::Commit(tag) => Response::TransactionEnd(Tag::new(tag)),
            Output::Empty => Response::EmptyQuery,
        }
    }
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
        let statements = match sql::split_statements(query) {
            Ok(s) => s,
            Err(e) => return Ok(vec![Response::Error(Box::new(error_info(&e)))]),
        };
        let mut out = Vec::new();
        for text in statements {
            match self.db.execute(&text).await {
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

/// Parses at Parse time so syntax errors surface there, as in PostgreSQL.
pub struct EddyParser;

#[async_trait]
impl QueryParser for EddyParser {
    type Statement = String;

    async fn parse_sql<C>(
        &self,
        _client: &C,
        sql: &str,
        _types: &[Option<Type>],
    ) -> PgWireResult<Option<String>>
    where
        C: ClientInfo + Unpin + Send + Sync,
    {
        let statements = sql::split_statements(sql).map_err(|e| user_error(&e))?;
        match statements.len() {
            0 => Ok(None),
            1 => {
                sql::parse_statement(&statements[0]).map_err(|e| user_error(&e))?;
                Ok(Some(statements[0].clone()))
            }
            _ => Err(user_error(&Error::syntax(
                "cannot insert multiple commands into a prepared statement",
            ))),
        }
    }

    fn get_parameter_types(&self, _stmt: &String) -> PgWireResult<Vec<Type>> {
        Ok(Vec::new())
    }

    fn get_result_schema(
        &self,
        _stmt: &String,
        _column_format: Option<&Format>,
    ) -> PgWireResult<Vec<pgwire::api::results::FieldInfo>> {
        Ok(Vec::new())
    }
}

impl Session {
    /// Parameter types and result columns of a statement, without running it.
    async fn shape(&self, sql_text: &str) -> eddy_planner::Result<(Vec<Type>, Vec<Column>)> {
        let stmt = sql::parse_statement(sql_text)?;
        let catalog = self.db.catalog();
        match stmt {
            Statement::Query(q) => {
                let ctx = self.db.query_context()?;
                let (columns, params) = query::describe(&ctx, &q).await?;
                let params = params
                    .iter()
                    .map(|t| t.as_ref().map_or(Type::TEXT, pg_type_of_arrow))
                    .collect();
                Ok((params, columns))
            }
            Statement::Insert(insert) => {
                let (params, returning) = eddy_planner::bind::insert_shape(&catalog, &insert)?;
                let params = params
                    .into_iter()
                    .map(|t| t.map_or(Type::TEXT, |c| pg_type(ResultType::Column(c))))
                    .collect();
                let columns = returning
                    .unwrap_or_default()
                    .into_iter()
                    .map(|c| Column::new(c.name, pg_type(c.ty)))
                    .collect();
                Ok((params, columns))
            }
            Statement::ShowStreams
            | Statement::ShowMetrics
            | Statement::Describe(_)
            | Statement::ExplainStream(_)
            | Statement::ExplainMetric(_)
            | Statement::ShowVariable(_) => match self.db.execute(sql_text).await?.output {
                Output::Rows { columns, .. } => Ok((Vec::new(), columns)),
                _ => Ok((Vec::new(), Vec::new())),
            },
            _ => Ok((Vec::new(), Vec::new())),
        }
    }

    /// The SQL text of a portal with its parameters substituted as literals.
    async fn bound_sql(&self, portal: &Portal<String>) -> eddy_planner::Result<String> {
        let sql_text = &portal.statement.statement;
        if portal.parameters.is_empty() {
            return Ok(sql_text.clone());
        }
        let declared = &portal.statement.parameter_types;
        let needs_inference = (0..portal.parameters.len()).any(|i| {
            portal.parameter_format.is_binary(i)
                && declared
                    .get(i)
                    .cloned()
                    .flatten()
                    .is_none_or(|t| t == Type::UNKNOWN)
        });
        let inferred = if needs_inference {
            self.shape(sql_text).await?.0
        } else {
            Vec::new()
        };
        let mut literals = Vec::with_capacity(portal.parameters.len());
        for (i, p) in portal.parameters.iter().enumerate() {
            let ty = declared
                .get(i)
                .cloned()
                .flatten()
                .filter(|t| *t != Type::UNKNOWN)
                .or_else(|| inferred.get(i).cloned())
                .unwrap_or(Type::TEXT);
            literals.push(match p {
                None => "NULL".to_string(),
                Some(bytes) if !portal.parameter_format.is_binary(i) => {
                    let text = std::str::from_utf8(bytes).map_err(|_| {
                        Error::new(ErrorKind::InvalidText, "parameter is not valid UTF-8")
                    })?;
                    quote_literal(text)
                }
                Some(bytes) => binary_literal(&ty, bytes)?,
            });
        }
        sql::substitute_params(sql_text, &literals)
    }
}

/// A SQL literal for a binary-format parameter of type `ty`.
fn binary_literal(ty: &Type, bytes: &[u8]) -> eddy_planner::Result<String> {
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
        Type::INT2 => i16::from_be_bytes([
            bytes.first().copied().unwrap_or(0),
            bytes.get(1).copied().unwrap_or(0),
        ])
        .to_string(),
        Type::INT4 => (i64::from_be_bytes(num(bytes, 4)?) as u32 as i32).to_string(),
        Type::INT8 => i64::from_be_bytes(num(bytes, 8)?).to_string(),
        Type::FLOAT4 | Type::FLOAT8 => {
            let v = if *ty == Type::FLOAT4 {
                f32::from_bits(u64::from_be_bytes(num(bytes, 4)?) as u32) as f64
            } else {
                f64::from_bits(u64::from_be_bytes(num(bytes, 8)?))
            };
            if v.is_finite() {
                format!("{v:?}")
            } else {
                quote_literal(&eddy_planner::types::format_float(v))
            }
        }
        Type::BOOL => if bytes.first() == Some(&1) {
            "TRUE"
        } else {
            "FALSE"
        }
        .to_string(),
        Type::TIMESTAMP | Type::TIMESTAMPTZ => {
            let us = i64::from_be_bytes(num(bytes, 8)?);
            quote_literal(&format_timestamp(timestamp_from_pg_binary(us)))
        }
        Type::NUMERIC => {
            let d = rust_decimal::Decimal::from_sql(ty, bytes).map_err(|_| bad("numeric"))?;
            d.to_string()
        }
        _ => {
            let text = std::str::from_utf8(bytes).map_err(|_| bad(ty.name()))?;
            quote_literal(text)
        }
    })
}

#[async_trait]
impl ExtendedQueryHandler for Session {
    type Statement = String;
    type QueryParser = EddyParser;

    fn query_parser(&self) -> Arc<Self::QueryParser> {
        self.parser.clone()
    }

    async fn do_describe_statement<C>(
        &self,
        _client: &mut C,
        target: &StoredStatement<String>,
    ) -> PgWireResult<DescribeStatementResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (inferred, columns) = self
            .shape(&target.statement)
            .await
            .map_err(|e| user_error(&e))?;
        let n = inferred.len().max(target.parameter_types.len());
        let params = (0..n)
            .map(|i| {
                target
                    .parameter_types
                    .get(i)
                    .cloned()
                    .flatten()
                    .filter(|t| *t != Type::UNKNOWN)
                    .or_else(|| inferred.get(i).cloned())
                    .unwrap_or(Type::TEXT)
            })
            .collect();
        let f = fields(&columns, &|_| FieldFormat::Text);
        Ok(DescribeStatementResponse::new(params, f.as_ref().clone()))
    }

    async fn do_describe_portal<C>(
        &self,
        _client: &mut C,
        target: &Portal<String>,
    ) -> PgWireResult<DescribePortalResponse>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let (_, columns) = self
            .shape(&target.statement.statement)
            .await
            .map_err(|e| user_error(&e))?;
        let f = fields(&columns, &|i| target.result_column_format.format_for(i));
        Ok(DescribePortalResponse::new(f.as_ref().clone()))
    }

    async fn do_query<C>(
        &self,
        client: &mut C,
        portal: &Portal<String>,
        _max_rows: usize,
    ) -> PgWireResult<Response>
    where
        C: ClientInfo + ClientPortalStore + Sink<PgWireBackendMessage> + Unpin + Send + Sync,
        C::PortalStore: PortalStore<Statement = String>,
        C::Error: Debug,
        PgWireError: From<<C as Sink<PgWireBackendMessage>>::Error>,
    {
        let result = match self.bound_sql(portal).await {
            Ok(text) => self.db.execute(&text).await,
            Err(e) => Err(e),
        };
        match result {
            Ok(executed) => {
                send_notices(client, &executed.notices).await?;
                Ok(self.respond(executed, &|i| portal.result_column_format.format_for(i)))
            }
            Err(e) => Err(user_error(&e)),
        }
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
            Some(copy) => copy.push(&copy_data.data).map_err(|e| {
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
        let Some(copy) = copy else {
            return Err(user_error(&Error::internal("COPY done without COPY")));
        };
        let executed = self
            .db
            .finish_copy(copy)
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
