//! Helpers shared by the server's integration tests: an in-process server on a free
//! loopback port, a data directory that removes itself, and tokio-postgres clients.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use eddy_server::serve::{Config, Server};

pub fn repo() -> PathBuf {
    // Read at run time: a test binary built from another checkout sharing the target
    // directory would carry that checkout's path.
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&dir).parent().unwrap().to_path_buf()
}

pub async fn start(dir: &Path) -> Server {
    Server::start(&Config {
        pg_addr: "127.0.0.1:0".parse().unwrap(),
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        data_dir: dir.to_path_buf(),
        shards: 2,
    })
    .await
    .unwrap()
}

/// A fresh data directory, removed when the test ends (pass or fail).
pub struct TempDir(PathBuf);

impl std::ops::Deref for TempDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn temp_dir(name: &str) -> TempDir {
    let dir = std::env::temp_dir().join(format!("eddy-test-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    TempDir(dir)
}

pub fn conn_string(server: &Server) -> String {
    format!(
        "host=127.0.0.1 port={} user=eddy dbname=eddy",
        server.addr.port()
    )
}

pub async fn connect(server: &Server) -> tokio_postgres::Client {
    connect_port(server.addr.port()).await
}

/// A client of the server listening on loopback `port`.
pub async fn connect_port(port: u16) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(
        &format!("host=127.0.0.1 port={port} user=eddy dbname=eddy"),
        tokio_postgres::NoTls,
    )
    .await
    .unwrap();
    tokio::spawn(conn);
    client
}

/// A result row in text form (`None` for NULL).
pub type TextRow = Vec<Option<String>>;

pub fn text_row(row: &tokio_postgres::SimpleQueryRow) -> TextRow {
    (0..row.len())
        .map(|i| row.get(i).map(str::to_string))
        .collect()
}

/// The rows of a simple query, in text form.
pub async fn simple_rows(client: &tokio_postgres::Client, sql: &str) -> Vec<TextRow> {
    client
        .simple_query(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(text_row(r)),
            _ => None,
        })
        .collect()
}
