//! Helpers shared by the server's integration tests: an in-process server on a free
//! loopback port, a data directory that removes itself, and tokio-postgres clients.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use eddy_server::serve::{Config, Server};

pub fn repo() -> PathBuf {
    // Read at run time: a test binary built from another checkout sharing the target
    // directory would carry that checkout's path.
    let dir =
        std::env::var("CARGO_MANIFEST_DIR").unwrap_or_else(|_| env!("CARGO_MANIFEST_DIR").into());
    Path::new(&dir).parent().unwrap().to_path_buf()
}

/// Runs `.ci/kafka ARGS… DIR` (a broker or cluster of the test's own) with a JVM heap of
/// `heap` and more environment `env`, and returns what it printed (the bootstrap
/// addresses on `start`).
#[allow(dead_code)]
pub fn ci_kafka(args: &[&str], dir: &Path, heap: &str, env: &[(&str, &str)]) -> String {
    let out = Command::new(repo().join(".ci/kafka"))
        .args(args)
        .arg(dir)
        .env("KAFKA_HEAP_OPTS", format!("-Xms{heap} -Xmx{heap}"))
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        ".ci/kafka {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub async fn start(dir: &Path) -> Server {
    Server::start(&Config {
        http_addr: Some("127.0.0.1:0".parse().unwrap()),
        shards: 2,
        checkpoint_interval: std::time::Duration::from_millis(300),
        session_threads: 2,
        ..Config::embedded(dir.to_path_buf())
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
    connect_as(port, "eddy", None).await.unwrap()
}

/// A client that logs in as `user`, with `password` if given.
pub async fn connect_as(
    port: u16,
    user: &str,
    password: Option<&str>,
) -> Result<tokio_postgres::Client, tokio_postgres::Error> {
    let mut config = format!("host=127.0.0.1 port={port} user={user} dbname=eddy");
    if let Some(p) = password {
        config.push_str(&format!(" password='{p}'"));
    }
    let (client, conn) = tokio_postgres::connect(&config, tokio_postgres::NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// The SQLSTATE of an error (or what it says, without one).
pub fn sqlstate(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| format!("no SQLSTATE: {e}"))
}

/// The SQLSTATE a simple query fails with (`None`: it ran).
pub async fn fails(client: &tokio_postgres::Client, sql: &str) -> Option<String> {
    client.batch_execute(sql).await.err().map(|e| sqlstate(&e))
}

/// psql on `conninfo` running `sql`, with `stdin` as its input (COPY data).
pub fn psql(conninfo: &str, sql: &str, stdin: &str) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new("psql")
        .args(["-X", "-v", "ON_ERROR_STOP=1", "-Atc", sql, conninfo])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("psql runs");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(stdin.as_bytes())
        .unwrap();
    child.wait_with_output().unwrap()
}

/// Runs `eddy serve` on `dir` with `args` (on free loopback ports unless they say
/// `--pg-addr`), which must make it refuse to start; what it said.
pub fn refused_start(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_eddy"));
    command.arg("serve").arg("--data-dir").arg(dir).args(args);
    if !args.contains(&"--pg-addr") {
        command.args(["--pg-addr", "127.0.0.1:0"]);
    }
    let out = command
        .args(["--http-addr", "127.0.0.1:0"])
        .envs(env.iter().copied())
        .env_remove("EDDY_PASSWORD")
        .output()
        .expect("eddy runs");
    assert!(!out.status.success(), "eddy started with {args:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A startup message of protocol 3.0 for `user`, as clients send it first.
pub fn startup_message(user: &str) -> Vec<u8> {
    let params = format!("user\0{user}\0database\0eddy\0\0");
    let mut out = ((8 + params.len()) as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&196608u32.to_be_bytes());
    out.extend_from_slice(params.as_bytes());
    out
}

/// A frontend message: its type byte, length and body.
pub fn frontend_message(kind: u8, body: &[u8]) -> Vec<u8> {
    let mut out = vec![kind];
    out.extend_from_slice(&((body.len() + 4) as u32).to_be_bytes());
    out.extend_from_slice(body);
    out
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
        .unwrap_or_else(|e| match e.as_db_error() {
            Some(db) => panic!("{sql}: {} {}", db.code().code(), db.message()),
            None => panic!("{sql}: {e}"),
        })
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(text_row(r)),
            _ => None,
        })
        .collect()
}

/// A child process killed when dropped, so a failing test leaves no server behind.
pub struct Eddy(pub Child, Arc<Mutex<Vec<String>>>);

#[allow(dead_code)]
impl Eddy {
    /// What the server wrote to stderr so far.
    pub fn output(&self) -> Vec<String> {
        self.1.lock().unwrap().clone()
    }

    /// Stops the server with SIGTERM (a clean shutdown) and waits for it; returns what
    /// it wrote to stderr.
    pub fn terminate(self) -> Vec<String> {
        let (status, said) = self.terminate_status();
        assert!(
            status.success(),
            "eddy exited with {status}:\n{}",
            said.join("\n")
        );
        said
    }

    /// Stops the server with SIGTERM and waits for it; returns how it exited and what
    /// it wrote to stderr.
    pub fn terminate_status(mut self) -> (std::process::ExitStatus, Vec<String>) {
        let pid = self.0.id().to_string();
        let status = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(status.success());
        let status = self.0.wait().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
        (status, self.output())
    }
}

impl Drop for Eddy {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `eddy serve` on a free port; returns the process and its port.
#[allow(dead_code)]
pub fn spawn_eddy(dir: &std::path::Path) -> (Eddy, u16) {
    spawn_eddy_with(dir, &[])
}

/// `spawn_eddy` with more arguments (`--kafka …`).
#[allow(dead_code)]
pub fn spawn_eddy_with(dir: &std::path::Path, args: &[&str]) -> (Eddy, u16) {
    spawn_eddy_env(dir, args, &[])
}

/// `spawn_eddy_with` with more environment variables.
#[allow(dead_code)]
pub fn spawn_eddy_env(dir: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> (Eddy, u16) {
    spawn_eddy_in(&[], dir, args, env)
}

/// `spawn_eddy_env`, the binary run by the command `wrapper` (`nsenter …`; empty: none).
#[allow(dead_code)]
pub fn spawn_eddy_in(
    wrapper: &[String],
    dir: &std::path::Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Eddy, u16) {
    let mut command = match wrapper.split_first() {
        None => Command::new(env!("CARGO_BIN_EXE_eddy")),
        Some((program, rest)) => {
            let mut c = Command::new(program);
            c.args(rest).arg(env!("CARGO_BIN_EXE_eddy"));
            c
        }
    };
    command.envs(env.iter().copied());
    command
        .args(["serve", "--pg-addr", "127.0.0.1:0", "--data-dir"])
        .arg(dir);
    // Two shards unless the test says how many; `--shards kept`: no flag, so the node
    // runs what ALTER SYSTEM kept in its data directory.
    match args.iter().position(|a| *a == "--shards") {
        None => command.args(["--shards", "2"]).args(args),
        Some(i) if args.get(i + 1) == Some(&"kept") => {
            command.args(&args[..i]).args(&args[i + 2..])
        }
        Some(_) => command.args(args),
    };
    if !args.contains(&"--http-addr") {
        command.args(["--http-addr", "127.0.0.1:0"]);
    }
    let mut child = command
        // Tiny chunks and caches and frequent checkpoints: chunks are sealed, states are
        // evicted and written through, and checkpoints are taken all the time.
        .env("EDDY_CHUNK_BYTES_MAX", "2048")
        .env("EDDY_CHUNK_CACHE_BYTES", "8192")
        .env("EDDY_SEGMENT_BYTES_MAX", "16384")
        .env("EDDY_L1_ENTRIES", "2")
        .env("EDDY_L2_ENTRIES", "4")
        .env("EDDY_CHECKPOINT_INTERVAL", "0.2")
        .stderr(Stdio::piped())
        .spawn()
        .expect("eddy starts");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = Vec::new();
    let port = loop {
        let Some(Ok(line)) = lines.next() else {
            panic!("eddy exited before it listened:\n{}", said.join("\n"));
        };
        said.push(line.clone());
        if let Some(rest) = line.split("listening on 127.0.0.1:").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let said = Arc::new(Mutex::new(said));
    let keep = said.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap().push(line);
        }
    });
    (Eddy(child, said), port)
}

/// The bootstrap address of the Kafka broker `make test` starts (`.ci/kafka start`).
#[allow(dead_code)]
pub fn kafka_addr() -> String {
    std::env::var("EDDY_TEST_KAFKA").expect(
        "EDDY_TEST_KAFKA is not set: start a broker with `.ci/kafka start DIR` and set it \
         to the address printed (make test does both)",
    )
}
