//! One client connection, from its first byte to its last: TLS, the connection limits,
//! the time allowed to log in, and a guard under pgwire's decoder that checks every
//! message's length before it is read and every query's text for UTF-8.
//!
//! pgwire decodes and dispatches the messages (`process_message`); this module owns the
//! socket around it, because the limits must hold before pgwire allocates anything:
//! - a message longer than `max_message_bytes` is refused from its 5-byte header, with a
//!   FATAL 54000, as PostgreSQL refuses an invalid message length;
//! - a query (`Q`) or a statement to prepare (`P`) whose text is not UTF-8 gets 22021,
//!   and the session goes on (pgwire would read the bytes as U+FFFD and run them);
//! - a client that has not logged in within `authentication_timeout` is dropped;
//! - past `max_connections` sessions, or `max_connections_per_role` for its role, a
//!   client gets FATAL 53300 in answer to its startup message; past
//!   `max_pending_connections` still logging in, a new socket is closed at once;
//! - with `--tls-required`, a plaintext client gets FATAL 28000.

pub mod auth;
pub mod busy;
pub mod scram;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::{SinkExt, StreamExt};
use pgwire::api::{ClientInfo, DefaultClient, PgWireConnectionState, PgWireServerHandlers};
use pgwire::error::{ErrorInfo, PgWireError};
use pgwire::messages::{PgWireBackendMessage, PgWireFrontendMessage};
use pgwire::tokio::server::{process_error, process_message, PgWireMessageServerCodec};
use pgwire::tokio::tokio_rustls::server::TlsStream;
use pgwire::tokio::TlsAcceptor;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
use tokio_util::codec::Framed;

use crate::ops::limits::{Limit, Limits};

const SSL_REQUEST: u32 = 80877103;
const GSSENC_REQUEST: u32 = 80877104;
/// The longest startup message PostgreSQL reads.
const STARTUP_BYTES_MAX: u64 = 10_000;

/// The node's front door: TLS, and the connections it lets in.
pub struct Door {
    tls: Option<TlsAcceptor>,
    tls_required: bool,
    limits: Arc<Limits>,
    /// Connections still logging in, and sessions.
    pending: AtomicUsize,
    sessions: AtomicUsize,
    per_role: Mutex<HashMap<String, usize>>,
}

impl Door {
    /// Connections still logging in, and sessions, for `/metrics`.
    pub fn counts(&self) -> (usize, usize) {
        (
            self.pending.load(Ordering::Relaxed),
            self.sessions.load(Ordering::Relaxed),
        )
    }

    pub fn new(tls: Option<TlsAcceptor>, tls_required: bool, limits: Arc<Limits>) -> Door {
        Door {
            tls,
            tls_required,
            limits,
            pending: AtomicUsize::new(0),
            sessions: AtomicUsize::new(0),
            per_role: Mutex::new(HashMap::new()),
        }
    }
}

/// One connection's place in the counts, given back when it closes.
struct Ticket<'a> {
    door: &'a Door,
    /// The role it was admitted as (`None`: still logging in).
    role: Option<String>,
}

impl<'a> Ticket<'a> {
    /// A place among the connections logging in, if there is one.
    fn new(door: &'a Door) -> Option<Ticket<'a>> {
        let pending = door.pending.fetch_add(1, Ordering::Relaxed);
        let ticket = Ticket { door, role: None };
        (pending < door.limits.get(Limit::PendingConnections) as usize).then_some(ticket)
    }

    /// Admits the connection as a session of `role`; the refusal when a limit is passed.
    fn admit(&mut self, role: &str) -> Result<(), Box<ErrorInfo>> {
        let limits = &self.door.limits;
        let mut per_role = self.door.per_role.lock().expect("door lock");
        if self.door.sessions.load(Ordering::Relaxed) as u64 >= limits.get(Limit::Connections) {
            return Err(Box::new(fatal(
                "53300",
                "sorry, too many clients already".to_string(),
            )));
        }
        let n = per_role.get(role).copied().unwrap_or(0);
        if n as u64 >= limits.get(Limit::ConnectionsPerRole) {
            return Err(Box::new(fatal(
                "53300",
                format!("too many connections for role \"{role}\""),
            )));
        }
        per_role.insert(role.to_string(), n + 1);
        self.door.sessions.fetch_add(1, Ordering::Relaxed);
        self.door.pending.fetch_sub(1, Ordering::Relaxed);
        self.role = Some(role.to_string());
        Ok(())
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let Some(role) = &self.role else {
            self.door.pending.fetch_sub(1, Ordering::Relaxed);
            return;
        };
        self.door.sessions.fetch_sub(1, Ordering::Relaxed);
        let mut per_role = self.door.per_role.lock().expect("door lock");
        if let Some(n) = per_role.get_mut(role) {
            *n -= 1;
            if *n == 0 {
                per_role.remove(role);
            }
        }
    }
}

fn fatal(code: &str, message: String) -> ErrorInfo {
    ErrorInfo::new("FATAL".to_string(), code.to_string(), message)
}

/// Serves one client until it leaves, breaks the protocol or passes a limit.
pub async fn serve<H: PgWireServerHandlers>(door: Arc<Door>, socket: TcpStream, handlers: H) {
    let Some(mut ticket) = Ticket::new(&door) else {
        return;
    };
    let login = tokio::time::sleep(door.limits.timeout(Limit::AuthenticationTimeout));
    tokio::pin!(login);
    let Ok(addr) = socket.peer_addr() else { return };
    let io = tokio::select! {
        _ = &mut login => return,
        io = negotiate(socket, door.tls.as_ref()) => match io {
            Ok(io) => io,
            Err(_) => return,
        },
    };
    let secure = matches!(io.stream, Stream::Tls(_));
    let codec = PgWireMessageServerCodec::new(DefaultClient::new(addr, secure));
    let mut socket = Framed::new(Guard::new(io, door.limits.clone()), codec);
    socket.set_state(PgWireConnectionState::AwaitingStartup);

    let startup_handler = handlers.startup_handler();
    let simple = handlers.simple_query_handler();
    let extended = handlers.extended_query_handler();
    let copy = handlers.copy_handler();
    let cancel = handlers.cancel_handler();
    let mut ordinal = 0u64;
    let mut active = crate::wire::busy::Active::default();
    loop {
        let logging_in = matches!(
            socket.state(),
            PgWireConnectionState::AwaitingStartup
                | PgWireConnectionState::AuthenticationInProgress
        );
        let next = if logging_in {
            tokio::select! {
                _ = &mut login => return,
                next = socket.next() => next,
            }
        } else {
            active.next(socket.next()).await
        };
        let message = match next {
            Some(Ok(message)) => message,
            Some(Err(e)) => {
                // The stream cannot be followed past a refused or malformed message.
                let info = refusal(&e).unwrap_or_else(|| {
                    let mut info = ErrorInfo::from(e);
                    info.severity = "FATAL".to_string();
                    info
                });
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse(info.into()))
                    .await;
                return;
            }
            None => return,
        };
        let this = ordinal;
        ordinal += 1;
        if matches!(message, PgWireFrontendMessage::Terminate(_)) {
            return;
        }
        if let PgWireFrontendMessage::Startup(startup) = &message {
            let user = startup.parameters.get("user").cloned().unwrap_or_default();
            let refused = if door.tls_required && !secure {
                Err(Box::new(fatal(
                    "28000",
                    format!("TLS is required: \"{user}\" may not connect without it"),
                )))
            } else {
                ticket.admit(&user).and_then(|()| {
                    // A setting the startup names with a bad value refuses the session,
                    // as PostgreSQL does.
                    crate::session::settings::from_startup(&startup.parameters)
                        .map(|_| ())
                        .map_err(|e| {
                            let mut info = fatal("22023", e.message);
                            info.hint = e.hint;
                            Box::new(info)
                        })
                })
            };
            if let Err(info) = refused {
                let _ = socket
                    .send(PgWireBackendMessage::ErrorResponse((*info).into()))
                    .await;
                return;
            }
        }
        let extended_query = match socket.state() {
            PgWireConnectionState::CopyInProgress(extended) => extended,
            _ => message.is_extended_query(),
        };
        if let Some(byte) = socket.get_mut().take_invalid(this) {
            let info = ErrorInfo::new(
                "ERROR".to_string(),
                "22021".to_string(),
                format!("invalid byte sequence for encoding \"UTF8\": 0x{byte:02x}"),
            );
            let e = PgWireError::UserError(Box::new(info));
            if process_error(&mut socket, e, extended_query).await.is_err() {
                return;
            }
            continue;
        }
        let cancelling = matches!(message, PgWireFrontendMessage::CancelRequest(_));
        let done = process_message(
            message,
            &mut socket,
            startup_handler.clone(),
            simple.clone(),
            extended.clone(),
            copy.clone(),
            cancel.clone(),
        )
        .await;
        if let Err(e) = done {
            let is_fatal = e.is_fatal();
            if process_error(&mut socket, e, extended_query).await.is_err() || is_fatal {
                return;
            }
        }
        if cancelling {
            return;
        }
    }
}

/// The SQLSTATE error of a message the guard refused.
fn refusal(e: &PgWireError) -> Option<ErrorInfo> {
    let PgWireError::IoError(io) = e else {
        return None;
    };
    let refused = io.get_ref()?.downcast_ref::<Refused>()?;
    let mut info = fatal(refused.code, refused.message.clone());
    info.hint = Some(refused.hint.clone());
    Some(info)
}

/// Answers SSLRequest (and GSSENCRequest, which Eddy declines), then starts TLS when the
/// client asked for it and the node has a certificate.
async fn negotiate(mut socket: TcpStream, tls: Option<&TlsAcceptor>) -> io::Result<Io> {
    let _ = socket.set_nodelay(true);
    loop {
        let mut head = [0u8; 8];
        socket.read_exact(&mut head).await?;
        let length = u32::from_be_bytes([head[0], head[1], head[2], head[3]]);
        let code = u32::from_be_bytes([head[4], head[5], head[6], head[7]]);
        match (length, code, tls) {
            (8, SSL_REQUEST, Some(tls)) => {
                socket.write_all(b"S").await?;
                let stream = tls.accept(socket).await?;
                return Ok(Io::new(Stream::Tls(Box::new(stream)), Vec::new()));
            }
            (8, SSL_REQUEST | GSSENC_REQUEST, _) => socket.write_all(b"N").await?,
            _ => return Ok(Io::new(Stream::Plain(socket), head.to_vec())),
        }
    }
}

/// The client's bytes, in the clear or through TLS.
enum Stream {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A stream with bytes already read from it to give back first.
struct Io {
    stream: Stream,
    replay: Vec<u8>,
}

impl Io {
    fn new(stream: Stream, replay: Vec<u8>) -> Io {
        Io { stream, replay }
    }
}

impl AsyncRead for Io {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if !self.replay.is_empty() {
            let n = self.replay.len().min(buf.remaining());
            buf.put_slice(&self.replay[..n]);
            self.replay.drain(..n);
            return Poll::Ready(Ok(()));
        }
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match &mut self.stream {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// A message the guard refused, carried as the io error that ends the stream.
#[derive(Debug)]
struct Refused {
    code: &'static str,
    message: String,
    hint: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Refused {}

/// The client's stream, with its framing followed as it is read.
struct Guard {
    io: Io,
    frames: Frames,
}

impl Guard {
    fn new(io: Io, limits: Arc<Limits>) -> Guard {
        Guard {
            io,
            frames: Frames::new(limits),
        }
    }

    /// The first bad byte of message `n`'s text, if it was not UTF-8.
    fn take_invalid(&mut self, n: u64) -> Option<u8> {
        self.frames.take_invalid(n)
    }
}

/// Follows the message framing of the bytes read: refuses an oversized message from its
/// header, finds query texts that are not UTF-8, and refuses a malformed message of the
/// extended protocol (whose body it copies) before pgwire decodes it.
struct Frames {
    limits: Arc<Limits>,
    /// The messages read so far; the first (startup) has no type byte.
    messages: u64,
    header: [u8; 5],
    header_len: usize,
    /// The current message's type, and the bytes of its body still to come.
    body: Option<(u8, u64)>,
    text: Utf8Check,
    /// Messages (by number) whose text is not UTF-8, with the first bad byte.
    invalid: VecDeque<(u64, u8)>,
    /// The body so far of a message whose structure is checked (`STRUCTURED`).
    structured: Vec<u8>,
    /// In a query: a NUL came before its last byte.
    early_nul: bool,
}

/// Messages whose structure pgwire's decoder trusts (it panics on counts and lengths
/// that run past the body, and reads the next message from where it stopped): Parse,
/// Bind, Describe, Execute, Close, FunctionCall, Sync, Flush, Terminate, CopyDone,
/// CopyFail, and the first message (startup). A query (`Q`) is checked as it streams:
/// its text ends at its last byte.
const STRUCTURED: &[u8] = b"PBDECFSHXcf";

impl Frames {
    fn new(limits: Arc<Limits>) -> Frames {
        Frames {
            limits,
            messages: 0,
            header: [0; 5],
            header_len: 0,
            body: None,
            text: Utf8Check::default(),
            invalid: VecDeque::new(),
            structured: Vec::new(),
            early_nul: false,
        }
    }

    /// The first bad byte of message `n`'s text, if it was not UTF-8.
    fn take_invalid(&mut self, n: u64) -> Option<u8> {
        while let Some(&(m, byte)) = self.invalid.front() {
            if m > n {
                break;
            }
            self.invalid.pop_front();
            if m == n {
                return Some(byte);
            }
        }
        None
    }

    fn scan(&mut self, mut bytes: &[u8]) -> Result<(), Refused> {
        while !bytes.is_empty() {
            match &mut self.body {
                None => {
                    let typed = self.messages > 0;
                    let want = if typed { 5 } else { 4 };
                    let take = (want - self.header_len).min(bytes.len());
                    self.header[self.header_len..self.header_len + take]
                        .copy_from_slice(&bytes[..take]);
                    self.header_len += take;
                    bytes = &bytes[take..];
                    if self.header_len < want {
                        break;
                    }
                    let (kind, len) = if typed {
                        let h = &self.header;
                        (h[0], u32::from_be_bytes([h[1], h[2], h[3], h[4]]))
                    } else {
                        let h = &self.header;
                        (0, u32::from_be_bytes([h[0], h[1], h[2], h[3]]))
                    };
                    self.header_len = 0;
                    let len = u64::from(len);
                    let max = if typed {
                        self.limits.get(Limit::MessageBytes)
                    } else {
                        STARTUP_BYTES_MAX
                    };
                    if len < 4 || len - 4 > max {
                        let what = if typed {
                            format!("message of type '{}'", kind as char)
                        } else {
                            "startup message".to_string()
                        };
                        return Err(Refused {
                            code: "54000",
                            message: format!(
                                "{what} of {len} bytes exceeds max_message_bytes ({max})"
                            ),
                            hint: "Send smaller statements, or COPY in smaller rows.".to_string(),
                        });
                    }
                    self.text = Utf8Check::for_kind(kind);
                    self.body = Some((kind, len - 4));
                    self.structured.clear();
                    self.early_nul = kind == b'Q' && len == 4;
                    self.end_if_empty()?;
                }
                Some((kind, left)) => {
                    let take = (*left).min(bytes.len() as u64) as usize;
                    *left -= take as u64;
                    if self.messages == 0 || STRUCTURED.contains(kind) {
                        self.structured.extend_from_slice(&bytes[..take]);
                    }
                    if *kind == b'Q' && self.messages > 0 {
                        let last = if *left == 0 {
                            take.checked_sub(1)
                        } else {
                            None
                        };
                        let nul = bytes[..take].iter().position(|b| *b == 0);
                        self.early_nul |= nul.is_some_and(|i| Some(i) != last)
                            || (last.is_some() && nul.is_none());
                    }
                    self.text.feed(&bytes[..take]);
                    bytes = &bytes[take..];
                    self.end_if_empty()?;
                }
            }
        }
        Ok(())
    }

    fn end_if_empty(&mut self) -> Result<(), Refused> {
        let Some((kind, 0)) = self.body else {
            return Ok(());
        };
        let checked = self.messages == 0 || STRUCTURED.contains(&kind);
        let query = self.messages > 0 && kind == b'Q';
        if (checked && !well_formed(kind, &self.structured)) || (query && self.early_nul) {
            return Err(Refused {
                code: "08P01",
                message: format!(
                    "invalid message format: a malformed message of type '{}'",
                    kind as char
                ),
                hint: "The client broke the protocol; the connection cannot go on.".to_string(),
            });
        }
        if let Some(byte) = self.text.bad() {
            self.invalid.push_back((self.messages, byte));
        }
        self.body = None;
        self.messages += 1;
        Ok(())
    }
}

/// Whether a message body of type `kind` holds what its counts and lengths say.
fn well_formed(kind: u8, body: &[u8]) -> bool {
    let mut r = Cursor(body);
    let ok = match kind {
        // The first message: a startup (protocol, then name-value pairs up to an empty
        // name), a cancel request, or an SSL or GSS request.
        0 => match r.int(4) {
            Some(80877102) => r.take(r.0.len().min(260)),
            Some(80877103 | 80877104) => true,
            Some(_) => {
                while r.0.first().is_some_and(|b| *b != 0) {
                    if !(r.cstring() && r.cstring()) {
                        return false;
                    }
                }
                r.take(1)
            }
            None => false,
        },
        b'P' => r.cstring() && r.cstring() && r.counted(|r| r.take(4)),
        b'B' => {
            r.cstring()
                && r.cstring()
                && r.counted(|r| r.take(2))
                && r.counted(|r| r.value())
                && r.counted(|r| r.take(2))
        }
        b'D' | b'C' => r.take(1) && r.cstring(),
        b'E' => r.cstring() && r.take(4),
        b'f' => r.cstring(),
        b'F' => r.take(4) && r.counted(|r| r.take(2)) && r.counted(|r| r.value()) && r.take(2),
        _ => true,
    };
    ok && r.0.is_empty()
}

/// Reads a message body from the front.
struct Cursor<'a>(&'a [u8]);

impl Cursor<'_> {
    fn take(&mut self, n: usize) -> bool {
        match self.0.get(n..) {
            Some(rest) => {
                self.0 = rest;
                true
            }
            None => false,
        }
    }

    fn cstring(&mut self) -> bool {
        match self.0.iter().position(|b| *b == 0) {
            Some(end) => self.take(end + 1),
            None => false,
        }
    }

    fn int(&mut self, n: usize) -> Option<i64> {
        let bytes = self.0.get(..n)?;
        self.0 = &self.0[n..];
        Some(match n {
            2 => i64::from(i16::from_be_bytes([bytes[0], bytes[1]])),
            _ => i64::from(i32::from_be_bytes([bytes[0], bytes[1], bytes[2], bytes[3]])),
        })
    }

    /// An int16 count, then that many items.
    fn counted(&mut self, mut item: impl FnMut(&mut Self) -> bool) -> bool {
        match self.int(2) {
            Some(n) if n >= 0 => (0..n).all(|_| item(self)),
            _ => false,
        }
    }

    /// An int32 length (-1: NULL), then that many bytes.
    fn value(&mut self) -> bool {
        match self.int(4) {
            Some(-1) => true,
            Some(n) if n >= 0 => self.take(n as usize),
            _ => false,
        }
    }
}

/// Reads `bytes` as a client's, from its startup message on, the way `serve` does: each
/// message passes the guard before pgwire decodes it. For the fuzz tests; the number of
/// messages decoded.
pub fn decode_as_served(bytes: &[u8]) -> usize {
    use pgwire::messages::{DecodeContext, ProtocolVersion};
    let mut frames = Frames::new(Arc::new(Limits::default()));
    let mut ctx = DecodeContext::new(ProtocolVersion::PROTOCOL3_0);
    ctx.awaiting_frontend_ssl = false;
    let mut buf = bytes::BytesMut::new();
    let mut decoded = 0;
    // In odd pieces, as reads come.
    for piece in bytes.chunks(7) {
        if frames.scan(piece).is_err() {
            break;
        }
        buf.extend_from_slice(piece);
        loop {
            match PgWireFrontendMessage::decode(&mut buf, &ctx) {
                Ok(Some(_)) => {
                    decoded += 1;
                    ctx.awaiting_frontend_startup = false;
                }
                Ok(None) => break,
                Err(_) => return decoded,
            }
        }
    }
    decoded
}

impl AsyncRead for Guard {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {}
            other => return other,
        }
        let this = &mut *self;
        match this.frames.scan(&buf.filled()[before..]) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(refused) => Poll::Ready(Err(io::Error::new(io::ErrorKind::InvalidData, refused))),
        }
    }
}

impl AsyncWrite for Guard {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

/// Checks, piece by piece, that the text of a message is UTF-8: all of a query's (`Q`),
/// and the name and query of a Parse (`P`), which end at its second NUL (the parameter
/// types after them are binary).
#[derive(Default)]
struct Utf8Check {
    /// NULs that end the text (`None`: the message has no text to check).
    nuls_left: Option<u8>,
    /// An incomplete character from the previous piece.
    pending: [u8; 4],
    pending_len: usize,
    bad: Option<u8>,
}

impl Utf8Check {
    fn for_kind(kind: u8) -> Utf8Check {
        Utf8Check {
            nuls_left: match kind {
                b'Q' => Some(1),
                b'P' => Some(2),
                _ => None,
            },
            ..Utf8Check::default()
        }
    }

    fn feed(&mut self, mut bytes: &[u8]) {
        let Some(nuls) = self.nuls_left.as_mut() else {
            return;
        };
        if *nuls == 0 || self.bad.is_some() {
            return;
        }
        // Only the text up to the last NUL that ends it.
        let mut end = bytes.len();
        let mut seen = 0;
        for (i, &b) in bytes.iter().enumerate() {
            if b == 0 {
                seen += 1;
                if seen == *nuls {
                    end = i;
                    break;
                }
            }
        }
        *nuls -= seen.min(*nuls);
        bytes = &bytes[..end];
        if self.pending_len > 0 {
            let first = self.pending[0];
            let width = utf8_width(first);
            let take = (width - self.pending_len).min(bytes.len());
            self.pending[self.pending_len..self.pending_len + take].copy_from_slice(&bytes[..take]);
            self.pending_len += take;
            bytes = &bytes[take..];
            if self.pending_len < width {
                if self.nuls_left == Some(0) {
                    self.bad = Some(first);
                }
                return;
            }
            if std::str::from_utf8(&self.pending[..width]).is_err() {
                self.bad = Some(first);
                return;
            }
            self.pending_len = 0;
        }
        if let Err(e) = std::str::from_utf8(bytes) {
            let tail = &bytes[e.valid_up_to()..];
            if e.error_len().is_some() || utf8_width(tail[0]) == 0 || self.nuls_left == Some(0) {
                self.bad = Some(tail[0]);
            } else {
                self.pending[..tail.len()].copy_from_slice(tail);
                self.pending_len = tail.len();
            }
        }
    }

    fn bad(&self) -> Option<u8> {
        self.bad
            .or((self.pending_len > 0).then_some(self.pending[0]))
    }
}

/// The length of the UTF-8 character that starts with `first` (0: none does).
fn utf8_width(first: u8) -> usize {
    match first {
        0xC2..=0xDF => 2,
        0xE0..=0xEF => 3,
        0xF0..=0xF4 => 4,
        _ => 0,
    }
}

/// The TLS acceptor for a certificate chain and key in PEM files, for clients of the
/// application protocol `alpn` (`postgresql`, or `http/1.1` for /metrics).
pub fn tls_acceptor(
    cert: &std::path::Path,
    key: &std::path::Path,
    alpn: &[u8],
) -> anyhow::Result<TlsAcceptor> {
    use pgwire::tokio::tokio_rustls::rustls;
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    let certs = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .map_err(|e| anyhow::anyhow!("reading the certificate {}: {e}", cert.display()))?;
    if certs.is_empty() {
        anyhow::bail!("{} holds no certificate", cert.display());
    }
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| anyhow::anyhow!("reading the private key {}: {e}", key.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs, key)?;
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(kind: u8, pieces: &[&[u8]]) -> Option<u8> {
        let mut c = Utf8Check::for_kind(kind);
        for p in pieces {
            c.feed(p);
        }
        c.bad()
    }

    #[test]
    fn texts_are_checked_across_pieces() {
        let euro = "SELECT '€'\0".as_bytes();
        for cut in 0..euro.len() {
            assert_eq!(
                check(b'Q', &[&euro[..cut], &euro[cut..]]),
                None,
                "cut at {cut}"
            );
        }
        assert_eq!(check(b'Q', &[b"SELECT '\xff'\0"]), Some(0xff));
        assert_eq!(check(b'Q', &[b"SELECT '\xe2\x82", b"'\0"]), Some(0xe2));
        // A truncated character at the end of the text.
        assert_eq!(check(b'Q', &[b"SELECT \xe2\x82\0"]), Some(0xe2));
        // Parse: name, query, then binary parameter types that are not text.
        assert_eq!(
            check(b'P', &[b"s1\0SELECT $1\0\x00\x01\xff\xff\xff\xff"]),
            None
        );
        assert_eq!(
            check(b'P', &[b"s1\0SELECT '\xc3\x28'\0\x00\x00"]),
            Some(0xc3)
        );
        // Other messages carry binary data.
        assert_eq!(check(b'd', &[b"\xff\xfe"]), None);
    }

    #[test]
    fn oversized_messages_are_refused_from_their_header() {
        let limits = Arc::new(Limits::default());
        limits.set("max_message_bytes", Some("1kB")).unwrap();
        let mut guard = Frames::new(limits);
        // Startup (untyped), then a query of 100 bytes, then one of 2 kB.
        let mut startup = 13u32.to_be_bytes().to_vec();
        startup.extend_from_slice(&[0, 3, 0, 0, b'u', 0, b'x', 0, 0]);
        guard.scan(&startup).unwrap();
        let mut q = vec![b'Q'];
        q.extend_from_slice(&104u32.to_be_bytes());
        q.extend(std::iter::repeat_n(b'x', 99));
        q.push(0);
        guard.scan(&q).unwrap();
        let mut big = vec![b'Q'];
        big.extend_from_slice(&2052u32.to_be_bytes());
        let e = guard
            .scan(&big[..3])
            .and_then(|_| guard.scan(&big[3..]))
            .unwrap_err();
        assert!(e.message.contains("max_message_bytes"), "{}", e.message);
        assert_eq!(guard.messages, 2);
    }
}
