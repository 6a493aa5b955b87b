//! `eddy serve`: binds the PostgreSQL listener and runs until SIGINT or SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use pgwire::api::ConnectionManager;
use tokio::net::TcpListener;

use crate::db::Db;
use crate::pg::Handlers;

/// Settings of one server.
#[derive(Clone, Debug)]
pub struct Config {
    pub pg_addr: SocketAddr,
    pub data_dir: PathBuf,
    pub shards: usize,
}

/// A running server: its bound address and the handle to stop it.
pub struct Server {
    pub addr: SocketAddr,
    pub db: Arc<Db>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Server {
    pub async fn start(config: &Config) -> anyhow::Result<Server> {
        let db = Db::open(&config.data_dir, config.shards).await?;
        let listener = TcpListener::bind(config.pg_addr).await?;
        let addr = listener.local_addr()?;
        let manager = Arc::new(ConnectionManager::new());
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let accept_db = db.clone();
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.changed() => break,
                    accepted = listener.accept() => {
                        let Ok((socket, _)) = accepted else { continue };
                        let _ = socket.set_nodelay(true);
                        let handlers =
                            Handlers::new(accept_db.clone(), manager.clone(), peer_of(&socket));
                        tokio::spawn(async move {
                            let _ = pgwire::tokio::process_socket(socket, None, handlers).await;
                        });
                    }
                }
            }
        });
        Ok(Server {
            addr,
            db,
            stop,
            task,
        })
    }

    /// Stops accepting connections.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
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

/// Runs until a signal, then stops cleanly.
pub async fn run(config: Config) -> anyhow::Result<()> {
    let server = Server::start(&config).await?;
    eprintln!(
        "eddy: listening on {} (PostgreSQL protocol), data dir {}, {} shard{}",
        server.addr,
        config.data_dir.display(),
        config.shards,
        if config.shards == 1 { "" } else { "s" }
    );
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    eprintln!("eddy: shutting down");
    server.stop().await;
    Ok(())
}
