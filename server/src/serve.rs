//! `eddy serve`: binds the PostgreSQL listener and runs until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::sync::Arc;

use pgwire::api::ConnectionManager;
use tokio::net::TcpListener;
use tracing::Instrument;

use crate::sql::db::Db;
use crate::wire::auth::Handlers;
use crate::wire::Door;

pub use crate::ops::config::{default_io_threads, Config, COMMIT_DELAY_MS};

/// Stack of every thread that may plan SQL (session threads, the I/O runtime's workers):
/// DataFusion's planner recurses over the statement, and the release build compiles it
/// unoptimized (Cargo.toml), whose frames are larger. Only the pages touched are memory.
pub const PLANNING_STACK_BYTES: usize = 8 << 20;

/// A running server: its bound address and the handle to stop it.
pub struct Server {
    pub addr: SocketAddr,
    pub http_addr: Option<SocketAddr>,
    pub db: Arc<Db>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(config: &Config) -> anyhow::Result<Server> {
        // Before anything in the directory is read or written.
        let lock = crate::sql::db::DirLock::take(&config.data_dir)?;
        let secrets =
            crate::wire::auth::Secrets::load(&config.data_dir, config.password.as_deref())?;
        if secrets.is_none() && !config.pg_addr.ip().is_loopback() {
            anyhow::bail!(
                "refusing to listen on {} without a password: anyone who reaches it could \
                 read and write everything. Set EDDY_PASSWORD or --password-file (clients \
                 then authenticate with SCRAM-SHA-256), or listen on 127.0.0.1",
                config.pg_addr
            );
        }
        let (tls, http_tls) = match &config.tls {
            Some((cert, key)) => (
                Some(crate::wire::tls_acceptor(cert, key, b"postgresql")?),
                Some(crate::wire::tls_acceptor(cert, key, b"http/1.1")?),
            ),
            None if config.tls_required => {
                anyhow::bail!("--tls-required needs a certificate: give --tls-cert and --tls-key")
            }
            None => (None, None),
        };
        let db = Db::open(lock, config).await?;
        crate::sql::cluster::follow_catalog(&db);
        let listener = TcpListener::bind(config.pg_addr).await?;
        let addr = listener.local_addr()?;
        let http = match config.http_addr {
            Some(a) => Some(TcpListener::bind(a).await.map_err(|e| {
                anyhow::anyhow!("cannot listen for /metrics on {a}: {e} (set --http-addr)")
            })?),
            None => None,
        };
        let http_addr = http.as_ref().map(|l| l.local_addr()).transpose()?;
        let sessions = SessionThreads::start(config.session_threads, config.busy_poll)?;
        let manager = Arc::new(ConnectionManager::new());
        let door = Arc::new(Door::new(tls, config.tls_required, db.limits().clone()));
        let _ = db.door.set(door.clone());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let accept_db = db.clone();
        let metrics_db = db.clone();
        let http_secrets = secrets.clone();
        let node = tracing::info_span!("node", id = %node_name(config));
        let accepting = node.clone();
        let task = tokio::spawn(async move {
            // Every connection's task, so that stopping ends them all.
            let mut open = tokio::task::JoinSet::new();
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    Some(Ok((socket, peer))) = async {
                        match &http {
                            Some(l) => Some(l.accept().await),
                            None => std::future::pending().await,
                        }
                    } => {
                        let context = crate::ops::http::Context {
                            db: metrics_db.clone(),
                            secrets: http_secrets.clone(),
                            peer: Some(peer),
                        };
                        match http_tls.clone() {
                            // With a certificate, the HTTP port is HTTPS too.
                            Some(tls) => open.spawn(async move {
                                let handshake = tokio::time::timeout(
                                    std::time::Duration::from_secs(5),
                                    tls.accept(socket),
                                );
                                if let Ok(Ok(socket)) = handshake.await {
                                    crate::ops::http::serve(socket, context).await;
                                }
                            }),
                            None => open.spawn(crate::ops::http::serve(socket, context)),
                        };
                    }
                    accepted = listener.accept() => {
                        let Ok((socket, _)) = accepted else { continue };
                        // Registered again with the session thread's own reactor there.
                        let Ok(socket) = socket.into_std() else { continue };
                        let db = accept_db.clone();
                        let manager = manager.clone();
                        let secrets = secrets.clone();
                        let door = door.clone();
                        let client = socket.peer_addr().map(|a| a.to_string()).unwrap_or_default();
                        let session = tracing::info_span!(parent: &node, "session", client);
                        open.spawn_on(async move {
                            let Ok(socket) = tokio::net::TcpStream::from_std(socket) else {
                                return;
                            };
                            let _ = socket.set_nodelay(true);
                            let handlers =
                                Handlers::new(db, manager, peer_of(&socket), secrets.as_ref());
                            crate::wire::serve(door, socket, handlers).await;
                        }.instrument(session), sessions.next());
                    }
                    Some(_) = open.join_next(), if !open.is_empty() => {}
                }
            }
            open.shutdown().await;
            sessions.stop().await;
        }.instrument(accepting));
        Ok(Server {
            addr,
            http_addr,
            db,
            stop,
            task,
        })
    }

    /// Stops the node: closes the listeners and every open connection, takes the last
    /// checkpoint, stops the shards and closes the state store. When it returns, nothing
    /// of this server touches its data directory any more.
    pub async fn stop(self) {
        if let Err(e) = self.shutdown().await {
            tracing::error!("{e}");
        }
    }

    /// `stop`, failing when the last checkpoint failed (a full disk, say): the data
    /// directory is closed all the same, and the next start replays from the log what
    /// that checkpoint would have covered.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        // In a cluster, the node's tasks move to their replicas while it still answers.
        if let Some(kafka) = self.db.engine().log_as::<eddy_cluster::Kafka>() {
            let started = std::time::Instant::now();
            match kafka.hand_over().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(
                    "handed over {n} tasks to their replicas in {} ms",
                    started.elapsed().as_millis()
                ),
                Err(e) => tracing::warn!("handing over the tasks: {e}"),
            }
        }
        let _ = self.stop.send(true);
        let _ = self.task.await;
        let checkpoint = self.db.engine().last_checkpoint().await;
        // The directory stays locked until the state store is closed.
        let (engine, lock) = match sole(self.db).await {
            Ok(db) => {
                let (engine, lock) = db.into_engine();
                (sole(engine).await, Some(lock))
            }
            Err(db) => (Err(db.engine().clone()), None),
        };
        let closed = tokio::task::spawn_blocking(move || match engine {
            Ok(engine) => engine.shutdown(),
            // Still shared (a stuck blocking call): quiet what can be quieted.
            Err(engine) => {
                tracing::warn!("the engine is still in use 10 s into the shutdown");
                engine.close()
            }
        });
        let _ = closed.await;
        drop(lock);
        checkpoint.map(|_| ()).map_err(|e| {
            anyhow::anyhow!(
                "the checkpoint at shutdown failed: {e}; the next start replays the log \
                 from the last checkpoint that succeeded"
            )
        })
    }
}

/// Threads that run client sessions, each a single-threaded runtime of its own, with
/// sessions dealt to them in turn. A session stays on its thread: a statement's reads,
/// writes and continuations wake no other thread of the runtime, where a work-stealing
/// runtime hands readiness between its workers. Measured with pgbench point lookups
/// (`-c 2`, `strace -c`): `futex` calls per lookup went from 0.82 to 0.015, and the rate
/// from 43–52 k to 73 k TPS. The other runtime (accept loop, HTTP, the cluster's
/// background work) is the caller's.
struct SessionThreads {
    handles: Vec<tokio::runtime::Handle>,
    turn: std::sync::atomic::AtomicUsize,
    stops: Vec<tokio::sync::oneshot::Sender<()>>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

impl SessionThreads {
    fn start(n: usize, busy_poll: std::time::Duration) -> std::io::Result<SessionThreads> {
        let mut out = SessionThreads {
            handles: Vec::new(),
            turn: std::sync::atomic::AtomicUsize::new(0),
            stops: Vec::new(),
            threads: Vec::new(),
        };
        for i in 0..n.max(1) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            out.handles.push(runtime.handle().clone());
            if !busy_poll.is_zero() {
                runtime.spawn(crate::wire::busy::poll(busy_poll));
            }
            out.stops.push(stop);
            out.threads.push(
                std::thread::Builder::new()
                    .name(format!("eddy-session-{i}"))
                    .stack_size(PLANNING_STACK_BYTES)
                    .spawn(move || {
                        let _ = runtime.block_on(stopped);
                        // Sessions still open end here, with their runtime.
                        runtime.shutdown_timeout(std::time::Duration::from_secs(1));
                    })?,
            );
        }
        Ok(out)
    }

    /// The thread the next session runs on.
    fn next(&self) -> &tokio::runtime::Handle {
        let turn = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.handles[turn % self.handles.len()]
    }

    /// Ends the threads, and every session still on them.
    async fn stop(self) {
        drop(self.stops);
        let threads = self.threads;
        let _ = tokio::task::spawn_blocking(move || {
            for t in threads {
                let _ = t.join();
            }
        })
        .await;
    }
}

/// The value behind `arc` once every other holder let go of it (the tasks of closed
/// connections end within moments), or `arc` back after 10 s.
async fn sole<T>(mut arc: Arc<T>) -> Result<T, Arc<T>> {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match Arc::try_unwrap(arc) {
            Ok(value) => return Ok(value),
            Err(shared) if tokio::time::Instant::now() < deadline => {
                arc = shared;
                tokio::time::sleep(std::time::Duration::from_millis(5)).await;
            }
            Err(shared) => return Err(shared),
        }
    }
}

/// A second handle on a client's socket, to watch for the client closing it.
fn peer_of(socket: &tokio::net::TcpStream) -> Option<tokio::net::TcpStream> {
    use std::os::fd::AsFd;
    let fd = socket.as_fd().try_clone_to_owned().ok()?;
    let std_stream = std::net::TcpStream::from(fd);
    std_stream.set_nonblocking(true).ok()?;
    tokio::net::TcpStream::from_std(std_stream).ok()
}

/// The node's name in the log: its cluster id, or `local` for the embedded node.
fn node_name(config: &Config) -> &str {
    config.kafka.as_ref().map_or("local", |k| k.node.as_str())
}

/// Runs the server on `runtime` until it is told to stop (`run`). The binary calls this
/// rather than `block_on(run(..))` itself, so the server's futures are compiled once,
/// here, and not again into the binary (release builds do not share generic instances).
pub fn run_on(runtime: &tokio::runtime::Runtime, config: Config) -> anyhow::Result<()> {
    runtime.block_on(run(config))
}

/// Runs until a signal, then stops cleanly. Private: a caller outside this crate would
/// compile its future again (`run_on`).
async fn run(config: Config) -> anyhow::Result<()> {
    let server = Server::start(&config).await?;
    // Handlers first: a supervisor may signal as soon as it reads where we listen.
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    let interrupt = tokio::signal::ctrl_c();
    if let Some(http) = server.http_addr {
        tracing::info!("metrics on http://{http}/metrics");
    }
    tracing::info!(
        "listening on {} (PostgreSQL protocol), data dir {}, {} shard{}",
        server.addr,
        config.data_dir.display(),
        config.shards,
        if config.shards == 1 { "" } else { "s" }
    );
    tokio::select! {
        _ = interrupt => {}
        _ = term.recv() => {}
    }
    tracing::info!("shutting down");
    // A stop that hangs (a broker gone away) must not keep the process alive forever.
    match tokio::time::timeout(std::time::Duration::from_secs(60), server.shutdown()).await {
        Err(_) => anyhow::bail!("the shutdown did not finish within 60 s"),
        Ok(done) => done,
    }
}
