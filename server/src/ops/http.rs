//! The HTTP port (hyper): `GET /metrics` in Prometheus' text format, the web console
//! (`GET /`, one page, `console.html`), and the console's API:
//! - `POST /api/sql`: one statement as the body; its rows as JSON, or its error;
//! - `GET /api/subscribe?q=SELECT … EMIT CHANGES`: the continuous query's rows as
//!   server-sent events (`event: columns` first, then one `data:` array per row).
//!
//! Without a password the console and its API answer loopback clients only, as the
//! PostgreSQL port does; with one they take HTTP Basic credentials of a login role,
//! checked against its SCRAM verifier, and run as that role. `/metrics` is open.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::header::{self, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use serde_json::json;

use eddy_planner::access::SUPERUSER;
use eddy_planner::sql::{self, Statement};
use eddy_planner::{Error, ErrorKind};

use crate::ops::limits::Limit;
use crate::session::subscribe::{Client, Opening, SUBSCRIPTION_ROWS_MAX};
use crate::sql::db::{Db, Output};
use crate::wire::auth::Secrets;

type Body = BoxBody<Bytes, Infallible>;

/// The console page, served as it is.
const CONSOLE: &str = include_str!("console.html");

/// How often an idle event stream sends a comment, so proxies and browsers keep it.
const KEEPALIVE: Duration = Duration::from_secs(10);

/// What every request of one connection shares.
#[derive(Clone)]
pub struct Context {
    pub db: Arc<Db>,
    pub secrets: Option<Arc<Secrets>>,
    pub peer: Option<SocketAddr>,
}

/// Serves one HTTP/1.1 connection until the client closes it.
pub async fn serve<S>(socket: S, context: Context)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |request| {
        let context = context.clone();
        async move { Ok::<_, Infallible>(answer(request, &context).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(Duration::from_secs(5))
        .serve_connection(TokioIo::new(socket), service)
        .await;
}

fn full(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    full(status, "application/json", value.to_string())
}

fn error_json(e: &Error) -> serde_json::Value {
    json!({"sqlstate": e.kind.sqlstate(), "message": e.message, "hint": e.hint})
}

/// A failed statement: 400, or 403 for a permission, with the PostgreSQL error.
fn failed(e: &Error) -> Response<Body> {
    let status = match e.kind {
        ErrorKind::InsufficientPrivilege => StatusCode::FORBIDDEN,
        _ => StatusCode::BAD_REQUEST,
    };
    json_response(status, json!({ "error": error_json(e) }))
}

async fn answer(request: Request<Incoming>, context: &Context) -> Response<Body> {
    let path = request.uri().path().to_string();
    match (request.method(), path.as_str()) {
        (&Method::GET, "/metrics") => match context.db.metrics_text().await {
            Ok(text) => full(
                StatusCode::OK,
                "text/plain; version=0.0.4; charset=utf-8",
                text,
            ),
            Err(e) => full(
                StatusCode::INTERNAL_SERVER_ERROR,
                "text/plain",
                format!("{e}\n"),
            ),
        },
        (&Method::GET, "/" | "/console") => match login(&request, context) {
            Ok(_) => full(StatusCode::OK, "text/html; charset=utf-8", CONSOLE),
            Err(refusal) => *refusal,
        },
        (&Method::POST, "/api/sql") => match login(&request, context) {
            Ok(role) => run_sql(request, context, &role).await,
            Err(refusal) => *refusal,
        },
        (&Method::GET, "/api/subscribe") => match login(&request, context) {
            Ok(role) => subscribe(&request, context, &role).await,
            Err(refusal) => *refusal,
        },
        (_, "/metrics" | "/" | "/console" | "/api/sql" | "/api/subscribe") => full(
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET /metrics, GET / (the console), POST /api/sql, GET /api/subscribe?q=\n",
        ),
        _ => full(
            StatusCode::NOT_FOUND,
            "text/plain",
            "eddy serves GET /metrics, GET / (the console), POST /api/sql, GET /api/subscribe?q=\n",
        ),
    }
}

/// The role a request runs as, or the answer that refuses it.
fn login(request: &Request<Incoming>, context: &Context) -> Result<String, Box<Response<Body>>> {
    let Some(secrets) = &context.secrets else {
        return match context.peer {
            Some(peer) if peer.ip().is_loopback() => Ok(SUPERUSER.to_string()),
            _ => Err(Box::new(full(
                StatusCode::FORBIDDEN,
                "text/plain",
                "eddy has no password: the console answers loopback clients only \
                 (set EDDY_PASSWORD or --password-file)\n",
            ))),
        };
    };
    let challenge = || {
        let mut refusal = full(
            StatusCode::UNAUTHORIZED,
            "text/plain",
            "log in as a role of eddy\n",
        );
        refusal.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Basic realm=\"eddy\", charset=\"UTF-8\""),
        );
        refusal
    };
    let credentials = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|b64| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .ok()
        })
        .and_then(|raw| String::from_utf8(raw).ok());
    let Some((user, password)) = credentials.as_deref().and_then(|c| c.split_once(':')) else {
        return Err(Box::new(challenge()));
    };
    let verified = if user == SUPERUSER {
        secrets.accepts(password)
    } else {
        let catalog = context.db.catalog();
        catalog.access.roles.get(user).is_some_and(|role| {
            role.login
                && role
                    .verifier
                    .as_deref()
                    .and_then(crate::wire::scram::Verifier::parse)
                    .is_some_and(|v| v.accepts(password))
        })
    };
    if verified {
        Ok(user.to_string())
    } else {
        tracing::warn!(user, client = ?context.peer, "HTTP password authentication failed");
        Err(Box::new(challenge()))
    }
}

/// `POST /api/sql`: one statement that needs no session (no COPY FROM STDIN, cursor or
/// continuous query).
async fn run_sql(request: Request<Incoming>, context: &Context, role: &str) -> Response<Body> {
    let db = &context.db;
    let max = db.limits().get(Limit::StatementBytes);
    let body = match Limited::new(request.into_body(), max as usize)
        .collect()
        .await
    {
        Ok(body) => body.to_bytes(),
        Err(_) => {
            return failed(&Error::new(
                ErrorKind::ProgramLimitExceeded,
                format!("the statement exceeds max_statement_bytes ({max})"),
            ))
        }
    };
    let Ok(text) = std::str::from_utf8(&body) else {
        return failed(&Error::new(
            ErrorKind::InvalidEncoding,
            "the statement is not UTF-8",
        ));
    };
    let stmt = match sql::parse_statement(text) {
        Ok(stmt) => stmt,
        Err(e) => return failed(&e),
    };
    if matches!(
        stmt,
        Statement::Copy(_)
            | Statement::CopyOut(_)
            | Statement::Subscribe(_)
            | Statement::Declare { .. }
            | Statement::Fetch(_)
            | Statement::Close(_)
            | Statement::Prepare { .. }
            | Statement::Execute { .. }
            | Statement::Deallocate(_)
    ) {
        return failed(
            &Error::unsupported("this statement needs a session")
                .with_hint("Run it over the PostgreSQL protocol; continuous queries also run at GET /api/subscribe?q=."),
        );
    }
    let started = std::time::Instant::now();
    let _running = db.running();
    let kind = crate::ops::histogram::Kind::of(&stmt);
    let executed = match db.authorize(role, &stmt).await {
        Ok(()) => db.execute_by(role, stmt).await,
        Err(e) => Err(e),
    };
    db.statement_done(kind, text, started);
    let executed = match executed {
        Ok(executed) => executed,
        Err(e) => return failed(&e),
    };
    let (columns, rows, tag) = match executed.output {
        Output::Rows { columns, rows, tag } => {
            let tag = format!("{tag} {}", rows.len());
            let names: Vec<&str> = columns.iter().map(|c| c.name.as_str()).collect();
            let rows: Vec<Vec<Option<String>>> = rows
                .iter()
                .map(|row| row.iter().map(|cell| cell.to_text()).collect())
                .collect();
            (json!(names), json!(rows), tag)
        }
        Output::Command { tag, rows } => {
            let tag = match rows {
                Some(n) if tag == "INSERT" => format!("INSERT 0 {n}"),
                Some(n) => format!("{tag} {n}"),
                None => tag.to_string(),
            };
            (json!([]), json!([]), tag)
        }
        Output::Begin => (json!([]), json!([]), "BEGIN".to_string()),
        Output::Commit(tag) => (json!([]), json!([]), tag.to_string()),
        Output::Empty => (json!([]), json!([]), String::new()),
        Output::CopyIn(_) | Output::CopyOut { .. } => {
            return failed(&Error::unsupported("this statement needs a session"))
        }
    };
    json_response(
        StatusCode::OK,
        json!({"columns": columns, "rows": rows, "tag": tag, "notices": executed.notices.iter().map(ToString::to_string).collect::<Vec<_>>()}),
    )
}

/// `GET /api/subscribe?q=…`: the continuous query's rows as server-sent events, until
/// the client goes away (the subscription ends with the response).
async fn subscribe(request: &Request<Incoming>, context: &Context, role: &str) -> Response<Body> {
    let query = request.uri().query().unwrap_or_default();
    let Some(text) = form_urlencoded::parse(query.as_bytes())
        .find(|(k, _)| k == "q")
        .map(|(_, v)| v.into_owned())
    else {
        return failed(&Error::syntax("expected ?q=SELECT … EMIT CHANGES"));
    };
    let stmt = match sql::parse_statement(&text) {
        Ok(stmt) => stmt,
        Err(e) => return failed(&e),
    };
    let Statement::Subscribe(query) = &stmt else {
        return failed(
            &Error::unsupported("GET /api/subscribe runs continuous queries only")
                .with_hint("End the query with EMIT CHANGES; POST other statements to /api/sql."),
        );
    };
    let db = &context.db;
    if let Err(e) = db.authorize(role, &stmt).await {
        return failed(&e);
    }
    let opening = Opening {
        text: text.clone(),
        kind: "console",
        client: Client {
            pid: 0,
            user: role.to_string(),
            application_name: "eddy console".to_string(),
            addr: context.peer.map(|p| p.to_string()).unwrap_or_default(),
        },
        rows_max: SUBSCRIPTION_ROWS_MAX,
    };
    let handle = match db.subscribe(query, opening).await {
        Ok(handle) => handle,
        Err(e) => return failed(&e),
    };
    let names: Vec<&str> = handle
        .sub
        .query
        .columns
        .iter()
        .map(|c| c.name.as_str())
        .collect();
    let first = Bytes::from(format!("event: columns\ndata: {}\n\n", json!(names)));
    let events = futures::stream::unfold(Some(handle), |handle| async move {
        let handle = handle?;
        let woke = tokio::time::timeout(KEEPALIVE, handle.sub.wait()).await;
        if woke.is_err() {
            return Some((Bytes::from_static(b": keepalive\n\n"), Some(handle)));
        }
        match handle.sub.take(0) {
            Ok(rows) => {
                let mut out = String::new();
                for row in rows {
                    let values: Vec<Option<String>> = row.iter().map(|c| c.to_text()).collect();
                    out.push_str(&format!("data: {}\n\n", json!(values)));
                }
                Some((Bytes::from(out), Some(handle)))
            }
            Err(e) => {
                let event = format!("event: error\ndata: {}\n\n", error_json(&e));
                Some((Bytes::from(event), None))
            }
        }
    });
    let body = futures::stream::once(async move { first })
        .chain(events)
        .map(|bytes| Ok::<_, Infallible>(Frame::data(bytes)));
    let mut response = Response::new(BodyExt::boxed(StreamBody::new(body)));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    response
}
