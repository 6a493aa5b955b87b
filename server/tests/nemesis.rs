//! A nemesis test in the Jepsen style (issue 57), on real processes: a KRaft broker of
//! its own (`.ci/kafka`), three `eddy` nodes (two copies of every task, a 4 s session
//! timeout), each reaching the broker only through a TCP proxy in this test. Writers
//! insert with RETURNING and readers look metric rows up through every node while
//! faults, drawn from a printed seed, hit the cluster:
//! - a node paused past its session timeout (SIGSTOP, then SIGCONT);
//! - a node killed with kill -9, restarted later on its data;
//! - the broker killed with kill -9 and restarted on its data;
//! - a node killed and restarted at once under its own id;
//! - a node cut from the broker at its proxy, then healed.
//!
//! A checker per card (each card is one task's group) holds every answer against a
//! model: RETURNING values form one history (each count once, each sum the previous
//! one plus the event), every read includes each write acknowledged before it was sent
//! and shows a state of that history, and at the end every acknowledged event is applied
//! exactly once and nothing else is. Each fault's unavailability is printed two ways: the
//! longest time a card went without an acknowledged write, and the longest time a writer
//! went from sending a statement that failed to its next success (the measure).
//! `EDDY_NEMESIS_TRACE` also prints every write of a fault that failed or took over
//! 200 ms, with its port and error. `EDDY_NEMESIS_SEED` replays a run,
//! `EDDY_NEMESIS_SECONDS` sets how long faults are injected (120 by default), and
//! `EDDY_NEMESIS_REPORT` names a file the unavailability per fault is appended to
//! (`bench/nemesis.sh`). The nodes' output goes to files in the temporary directory when
//! the check fails, or always with `EDDY_NEMESIS_LOGS` set.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Write as _;
use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use tokio::net::{TcpListener, TcpStream};

use common::{ci_kafka, repo, spawn_eddy_env, temp_dir, TempDir};

const SESSION: u64 = 4;
const NODES: usize = 3;
const CARDS: usize = 24;
const WRITERS: usize = 4;
const READERS: usize = 2;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The test's own broker, with one listener per node that tells clients to come back
/// through that node's proxy.
struct Broker {
    dir: TempDir,
}

/// Runs `.ci/kafka ARGS DIR` with a small heap, and fails the test if it fails.
fn kafka_script(args: &[&str], dir: &std::path::Path, env: &[(&str, &str)]) {
    ci_kafka(args, dir, "512m", env);
}

impl Broker {
    fn start(listeners: &[(u16, u16)]) -> Broker {
        let dir = temp_dir("nemesis-kafka");
        std::fs::create_dir_all(&*dir).unwrap();
        let extra: Vec<String> = listeners
            .iter()
            .enumerate()
            .map(|(i, (port, proxy))| format!("N{i}={port}>{proxy}"))
            .collect();
        kafka_script(
            &["start"],
            &dir,
            &[
                ("KAFKA_EXTRA_LISTENERS", &extra.join(" ")),
                // Sessions shorter than the broker's default minimum of 6 s.
                (
                    "KAFKA_EXTRA_PROPERTIES",
                    "group.min.session.timeout.ms=1000",
                ),
            ],
        );
        Broker { dir }
    }

    fn pid(&self) -> String {
        std::fs::read_to_string(self.dir.join("kafka.pid"))
            .unwrap()
            .trim()
            .to_string()
    }

    fn kill(&self) {
        let pid = self.pid();
        Command::new("kill").args(["-KILL", &pid]).status().unwrap();
        while Command::new("kill")
            .args(["-0", &pid])
            .stderr(std::process::Stdio::null())
            .status()
            .unwrap()
            .success()
        {
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn restart(&self) {
        kafka_script(&["restart"], &self.dir, &[]);
    }
}

impl Drop for Broker {
    fn drop(&mut self) {
        let _ = Command::new(repo().join(".ci/kafka"))
            .arg("stop")
            .arg(&*self.dir)
            .output();
    }
}

/// A TCP proxy between one node and the broker; `cut` drops every connection and
/// refuses new ones until `heal`.
struct Proxy {
    cut: Arc<AtomicBool>,
    links: Arc<Mutex<Vec<tokio::task::AbortHandle>>>,
}

impl Proxy {
    async fn start(listen: u16, upstream: u16) -> Proxy {
        let listener = TcpListener::bind(("127.0.0.1", listen)).await.unwrap();
        let cut = Arc::new(AtomicBool::new(false));
        let links: Arc<Mutex<Vec<tokio::task::AbortHandle>>> = Arc::default();
        let (c, l) = (cut.clone(), links.clone());
        tokio::spawn(async move {
            while let Ok((mut down, _)) = listener.accept().await {
                if c.load(Ordering::Acquire) {
                    continue; // dropped: refused
                }
                let link = tokio::spawn(async move {
                    let Ok(mut up) = TcpStream::connect(("127.0.0.1", upstream)).await else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
                });
                let mut links = l.lock().unwrap();
                links.retain(|h| !h.is_finished());
                links.push(link.abort_handle());
            }
        });
        Proxy { cut, links }
    }

    fn cut(&self) {
        self.cut.store(true, Ordering::Release);
        for link in self.links.lock().unwrap().drain(..) {
            link.abort();
        }
    }

    fn heal(&self) {
        self.cut.store(false, Ordering::Release);
    }
}

/// A node: its process (while it runs), its data and the proxy it reaches Kafka by.
struct Node {
    id: String,
    eddy: Option<common::Eddy>,
    dir: TempDir,
    kafka: String,
}

fn spawn_node(cluster: &str, id: &str, dir: &std::path::Path, kafka: &str) -> (common::Eddy, u16) {
    let host = format!("host-{id}");
    let session = SESSION.to_string();
    spawn_eddy_env(
        dir,
        &[
            "--kafka",
            kafka,
            "--cluster",
            cluster,
            "--node-id",
            id,
            "--host-id",
            &host,
            "--replicas",
            "2",
            "--session-timeout",
            &session,
        ],
        &[],
    )
}

/// What clients share: each node's port (`None` while it is down), the next event id,
/// and when to stop.
#[derive(Default)]
struct Shared {
    ports: Mutex<Vec<Option<u16>>>,
    /// Nodes a client of the pool could not connect to, and when: writers pass over
    /// them for `HOST_RECHECK`, as pgjdbc's multi-host pool does (its
    /// `GlobalHostStatusTracker` and `hostRecheckSeconds`). A node that answers again is
    /// taken off. Readers still ask every node, so a node that lost its tasks is asked.
    down: Mutex<HashMap<u16, Instant>>,
    next_id: AtomicI64,
    stop: AtomicBool,
}

/// How long a writer passes over a node it could not connect to.
const HOST_RECHECK: Duration = Duration::from_secs(10);

/// One write: its event, when it was sent, and its outcome.
#[derive(Clone, Debug)]
struct Write {
    /// The failure and the port it came through.
    error: Option<String>,
    writer: usize,
    sent: Instant,
    ended: Instant,
    id: i64,
    card: usize,
    amount: i64,
    /// (acknowledged at, RETURNING n, s); `None`: failed or timed out (in doubt).
    acked: Option<(Instant, i64, i64)>,
}

/// One read of a card: when it was sent, and what it returned.
#[derive(Clone, Debug)]
struct Read {
    card: usize,
    sent: Instant,
    node: u16,
    got: Option<(i64, i64)>,
}

struct History {
    start: Instant,
    /// What happened when, for the report of a violation.
    faults: Vec<String>,
    writes: Vec<Write>,
    reads: Vec<Read>,
    /// Failed statements by SQLSTATE (or "timeout", "connection").
    errors: BTreeMap<String, usize>,
}

fn card_name(card: usize) -> String {
    format!("c{card}")
}

async fn connect(port: u16) -> Option<tokio_postgres::Client> {
    let conn = format!("host=127.0.0.1 port={port} user=eddy dbname=eddy connect_timeout=2");
    let (client, connection) = tokio::time::timeout(
        Duration::from_secs(3),
        tokio_postgres::connect(&conn, tokio_postgres::NoTls),
    )
    .await
    .ok()?
    .ok()?;
    tokio::spawn(connection);
    Some(client)
}

fn error_name(e: &tokio_postgres::Error) -> String {
    e.code()
        .map(|c| c.code().to_string())
        .unwrap_or_else(|| "connection".to_string())
}

/// Runs a statement through some live node (the client's current one, else the next).
struct Client {
    at: usize,
    conn: Option<(u16, tokio_postgres::Client)>,
    /// Whether it passes over the nodes the pool could not connect to (`Shared::down`).
    skip_down: bool,
}

impl Client {
    async fn query(
        &mut self,
        shared: &Shared,
        sql: &str,
        timeout: Duration,
    ) -> (u16, Result<Vec<tokio_postgres::SimpleQueryMessage>, String>) {
        if self.conn.is_none() {
            let port = {
                let ports = shared.ports.lock().unwrap();
                if self.skip_down {
                    let down = shared.down.lock().unwrap();
                    let up = |at: &usize| {
                        ports[at % ports.len()].is_some_and(|p| {
                            down.get(&p)
                                .is_none_or(|since| since.elapsed() > HOST_RECHECK)
                        })
                    };
                    // The next node the pool thinks is up, else the next one.
                    if let Some(at) = (self.at..self.at + ports.len()).find(up) {
                        self.at = at;
                    }
                }
                ports[self.at % ports.len()]
            };
            let Some(port) = port else {
                self.at += 1;
                return (0, Err("connection".into()));
            };
            match connect(port).await {
                Some(c) => {
                    shared.down.lock().unwrap().remove(&port);
                    self.conn = Some((port, c))
                }
                None => {
                    shared.down.lock().unwrap().insert(port, Instant::now());
                    self.at += 1;
                    return (port, Err("connection".into()));
                }
            }
        }
        let (port, client) = self.conn.as_ref().unwrap();
        let port = *port;
        let result = match tokio::time::timeout(timeout, client.simple_query(sql)).await {
            Ok(Ok(rows)) => Ok(rows),
            Ok(Err(e)) => Err(error_name(&e)),
            Err(_) => Err("timeout".into()),
        };
        if result.is_err() {
            // The next statement goes through the next node.
            self.conn = None;
            self.at += 1;
        }
        (port, result)
    }
}

fn first_row(rows: &[tokio_postgres::SimpleQueryMessage]) -> Option<(i64, i64)> {
    rows.iter().find_map(|m| match m {
        tokio_postgres::SimpleQueryMessage::Row(r) => Some((
            r.get(0).unwrap().parse().unwrap(),
            r.get(1).unwrap().parse().unwrap(),
        )),
        _ => None,
    })
}

async fn writer(w: usize, shared: Arc<Shared>, history: Arc<Mutex<History>>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (w as u64 + 1));
    let mut client = Client {
        at: w,
        conn: None,
        skip_down: true,
    };
    while !shared.stop.load(Ordering::Acquire) {
        let id = shared.next_id.fetch_add(1, Ordering::AcqRel);
        let card = w + WRITERS * rng.random_range(0..CARDS / WRITERS);
        let amount = rng.random_range(1..1000);
        let sql = format!(
            "INSERT INTO pay VALUES ({id}, '2026-01-01 10:00:00', '{}', {amount}) RETURNING total.n, total.s",
            card_name(card)
        );
        // A client gives a node 3 s, then tries the next: a paused node cannot answer.
        let sent = Instant::now();
        let (port, result) = client.query(&shared, &sql, Duration::from_secs(3)).await;
        let acked = match &result {
            Ok(rows) => {
                let (n, s) = first_row(rows).expect("RETURNING gives a row");
                Some((Instant::now(), n, s))
            }
            Err(_) => None,
        };
        {
            let mut h = history.lock().unwrap();
            let error = result.err().map(|e| format!("{e} at port {port}"));
            if let Some(e) = &error {
                *h.errors
                    .entry(format!("write {}", e.split(' ').next().unwrap()))
                    .or_default() += 1;
            }
            h.writes.push(Write {
                error,
                writer: w,
                sent,
                ended: Instant::now(),
                id,
                card,
                amount,
                acked,
            });
        }
        tokio::time::sleep(Duration::from_millis(if acked.is_some() {
            20
        } else {
            100
        }))
        .await;
    }
}

async fn reader(r: usize, shared: Arc<Shared>, history: Arc<Mutex<History>>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ (100 + r as u64));
    let mut client = Client {
        at: r,
        conn: None,
        skip_down: false,
    };
    while !shared.stop.load(Ordering::Acquire) {
        let card = rng.random_range(0..CARDS);
        // Every node in turn, so a node that lost its tasks is asked too.
        client.at = rng.random_range(0..NODES);
        client.conn = None;
        let sql = format!("SELECT n, s FROM total WHERE card = '{}'", card_name(card));
        let sent = Instant::now();
        let (node, result) = client.query(&shared, &sql, Duration::from_secs(3)).await;
        {
            let mut h = history.lock().unwrap();
            match result {
                Ok(rows) => h.reads.push(Read {
                    card,
                    sent,
                    node,
                    got: first_row(&rows),
                }),
                Err(e) => *h.errors.entry(format!("read {e}")).or_default() += 1,
            }
        }
        tokio::time::sleep(Duration::from_millis(30)).await;
    }
}

/// Checks the history against the model of each card; `last` is each card's final
/// (n, s) as every node reads it once the faults are over, and `ids` the events the
/// stream holds. Returns the violations.
fn check(h: &History, last: &BTreeMap<usize, (i64, i64)>, ids: &[i64]) -> Vec<String> {
    let mut bad = Vec::new();
    for card in 0..CARDS {
        let writes: Vec<&Write> = h.writes.iter().filter(|w| w.card == card).collect();
        // The history RETURNING values show: count → (sum, event).
        let mut chain: BTreeMap<i64, (i64, &Write)> = BTreeMap::new();
        for w in writes.iter().filter(|w| w.acked.is_some()) {
            let (_, n, s) = w.acked.unwrap();
            if let Some((s0, w0)) = chain.insert(n, (s, w)) {
                bad.push(format!(
                    "card {card}: events {} and {} both returned count {n} (sums {s0} and {s})",
                    w0.id, w.id
                ));
            }
        }
        for (n, (s, w)) in &chain {
            if let Some((prev, _)) = chain.get(&(n - 1)) {
                if s - w.amount != *prev {
                    bad.push(format!(
                        "card {card}: event {} returned ({n}, {s}), but count {} had sum {prev}",
                        w.id,
                        n - 1
                    ));
                }
            }
        }
        let mut acked_at: Vec<Instant> = writes
            .iter()
            .filter_map(|w| w.acked.map(|(at, _, _)| at))
            .collect();
        acked_at.sort();
        for r in h.reads.iter().filter(|r| r.card == card) {
            let (n, s) = r.got.unwrap_or((0, 0));
            let before = acked_at.partition_point(|at| *at < r.sent) as i64;
            if n < before {
                let late = acked_at[n.max(0) as usize..before as usize]
                    .iter()
                    .map(|at| format!("{}", at.duration_since(h.start).as_millis()))
                    .collect::<Vec<_>>()
                    .join(", ");
                bad.push(format!(
                    "card {card}: a read through port {} sent at {} ms returned count {n}, but {before} writes were acknowledged before it was sent (the last ones at {late} ms); faults: {}",
                    r.node,
                    r.sent.duration_since(h.start).as_millis(),
                    h.faults.join("; ")
                ));
            }
            if let Some((want, _)) = chain.get(&n) {
                if *want != s {
                    bad.push(format!(
                        "card {card}: a read through port {} returned ({n}, {s}), a state the task was never in (count {n} had sum {want})",
                        r.node
                    ));
                }
            }
        }
        let acked = writes.iter().filter(|w| w.acked.is_some()).count() as i64;
        let doubt = writes.len() as i64 - acked;
        let (n, s) = last.get(&card).copied().unwrap_or((0, 0));
        if n < acked || n > acked + doubt {
            bad.push(format!(
                "card {card}: {n} events applied at the end, with {acked} acknowledged and {doubt} in doubt"
            ));
        }
        if let Some((want, _)) = chain.get(&n) {
            if *want != s {
                bad.push(format!(
                    "card {card}: ends at ({n}, {s}), but count {n} had sum {want}"
                ));
            }
        }
        if chain.keys().next_back().is_some_and(|top| *top > n) {
            bad.push(format!(
                "card {card}: a RETURNING count is above the final {n}"
            ));
        }
    }
    // Every acknowledged event is stored once; nothing never sent is.
    let sent: HashMap<i64, bool> = h.writes.iter().map(|w| (w.id, w.acked.is_some())).collect();
    let mut seen = BTreeSet::new();
    for id in ids {
        if !seen.insert(*id) {
            bad.push(format!("event {id} is stored twice"));
        }
        if !sent.contains_key(id) {
            bad.push(format!("event {id} is stored but was never sent"));
        }
    }
    for (id, acked) in &sent {
        if *acked && !seen.contains(id) {
            bad.push(format!("acknowledged event {id} is lost"));
        }
    }
    bad
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Fault {
    Pause,
    Kill,
    Broker,
    FastRestart,
    Cut,
}

struct Cluster {
    name: String,
    /// The output of each node's earlier lives.
    logs: Vec<Vec<String>>,
    nodes: Vec<Node>,
    proxies: Vec<Proxy>,
    broker: Arc<Broker>,
    shared: Arc<Shared>,
}

impl Cluster {
    fn set_port(&self, i: usize, port: Option<u16>) {
        self.shared.ports.lock().unwrap()[i] = port;
    }

    async fn restart(&mut self, i: usize) {
        let (cluster, id, dir, kafka) = (
            self.name.clone(),
            self.nodes[i].id.clone(),
            self.nodes[i].dir.to_path_buf(),
            self.nodes[i].kafka.clone(),
        );
        let (eddy, port) =
            tokio::task::spawn_blocking(move || spawn_node(&cluster, &id, &dir, &kafka))
                .await
                .unwrap();
        self.nodes[i].eddy = Some(eddy);
        self.set_port(i, Some(port));
    }

    fn kill(&mut self, i: usize) {
        self.set_port(i, None);
        if let Some(eddy) = self.nodes[i].eddy.take() {
            let said = eddy.output();
            drop(eddy);
            self.logs[i].extend(said);
            self.logs[i].push("---- killed ----".into());
        }
    }

    /// Every node's output, each life's in turn, to files named after the seed.
    fn dump_logs(&self, seed: u64) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for (i, node) in self.nodes.iter().enumerate() {
            let path = std::env::temp_dir().join(format!("eddy-nemesis-{seed}-{}.log", node.id));
            let mut lines = self.logs[i].clone();
            if let Some(eddy) = &node.eddy {
                lines.extend(eddy.output());
            }
            std::fs::write(&path, lines.join("\n")).unwrap();
            out.push(path);
        }
        out
    }

    fn signal(&self, i: usize, signal: &str) {
        let pid = self.nodes[i].eddy.as_ref().unwrap().0.id().to_string();
        Command::new("kill").args([signal, &pid]).status().unwrap();
    }

    /// Waits until every node sees all three alive with every task placed on them.
    async fn settle(&self, within: Duration) {
        let deadline = Instant::now() + within;
        let ids: BTreeSet<String> = self.nodes.iter().map(|n| n.id.clone()).collect();
        loop {
            let ports: Vec<Option<u16>> = self.shared.ports.lock().unwrap().clone();
            let mut settled = true;
            for port in &ports {
                let Some(port) = port else {
                    settled = false;
                    break;
                };
                let Some(c) = connect(*port).await else {
                    settled = false;
                    break;
                };
                let alive: BTreeSet<String> = match c.simple_query("SHOW CLUSTER").await {
                    Ok(rows) => rows
                        .iter()
                        .filter_map(|m| match m {
                            tokio_postgres::SimpleQueryMessage::Row(r) if r.get(4) == Some("t") => {
                                Some(r.get(0).unwrap().to_string())
                            }
                            _ => None,
                        })
                        .collect(),
                    Err(_) => BTreeSet::new(),
                };
                let placed = match c.simple_query("SHOW TASKS").await {
                    Ok(rows) => rows.iter().all(|m| match m {
                        tokio_postgres::SimpleQueryMessage::Row(r) => {
                            r.get(3).is_some_and(|a| ids.contains(a))
                                && r.get(4).is_some_and(|rs| {
                                    !rs.is_empty() && rs.split(',').all(|x| ids.contains(x))
                                })
                        }
                        _ => true,
                    }),
                    Err(_) => false,
                };
                if alive != ids || !placed {
                    settled = false;
                    break;
                }
            }
            if settled {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the cluster did not settle within {within:?} after a fault"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Injects one fault on node `i` and heals it; returns when it was healed (the
    /// broker or the node back).
    async fn inject(&mut self, fault: Fault, i: usize) -> Instant {
        let past_session = Duration::from_secs(SESSION + 2);
        match fault {
            Fault::Pause => {
                self.signal(i, "-STOP");
                tokio::time::sleep(past_session).await;
                self.signal(i, "-CONT");
            }
            Fault::Kill => {
                self.kill(i);
                tokio::time::sleep(past_session).await;
                self.restart(i).await;
            }
            Fault::Broker => {
                let broker = self.broker.clone();
                tokio::task::spawn_blocking(move || broker.kill())
                    .await
                    .unwrap();
                tokio::time::sleep(Duration::from_secs(2)).await;
                let broker = self.broker.clone();
                tokio::task::spawn_blocking(move || broker.restart())
                    .await
                    .unwrap();
            }
            Fault::FastRestart => {
                self.kill(i);
                self.restart(i).await;
            }
            Fault::Cut => {
                self.proxies[i].cut();
                tokio::time::sleep(past_session + Duration::from_secs(1)).await;
                self.proxies[i].heal();
            }
        }
        Instant::now()
    }
}

/// The longest time one card (one task's group) went without an acknowledged write in
/// `[from, to]`.
fn unavailability(h: &History, from: Instant, to: Instant) -> Duration {
    let mut worst = Duration::ZERO;
    for card in 0..CARDS {
        let mut acks: Vec<Instant> = h
            .writes
            .iter()
            .filter(|w| w.card == card)
            .filter_map(|w| w.acked.map(|(at, _, _)| at))
            .filter(|at| *at >= from && *at <= to)
            .collect();
        acks.sort();
        let mut prev = from;
        for at in acks.into_iter().chain(std::iter::once(to)) {
            worst = worst.max(at - prev);
            prev = at;
        }
    }
    worst
}

/// The measure: the longest time a writer went from sending a statement that
/// failed (an error or its 3 s timeout) in `[from, to]` to its next acknowledged one.
fn outage(h: &History, from: Instant, to: Instant) -> Duration {
    let mut worst = Duration::ZERO;
    for w in 0..WRITERS {
        let mut failed: Option<Instant> = None;
        for write in h
            .writes
            .iter()
            .filter(|x| x.writer == w && x.sent >= from && x.sent <= to)
        {
            match (write.acked, failed) {
                (None, None) => failed = Some(write.sent),
                (Some((at, _, _)), Some(first)) => {
                    worst = worst.max(at - first);
                    failed = None;
                }
                _ => {}
            }
        }
        if let Some(first) = failed {
            worst = worst.max(to - first);
        }
    }
    worst
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_cost_seconds_and_never_correctness() {
    let seed = std::env::var("EDDY_NEMESIS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| rand::rng().random::<u64>());
    let seconds: u64 = std::env::var("EDDY_NEMESIS_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(120);
    let _ = writeln!(
        std::io::stderr(),
        "nemesis seed {seed} (EDDY_NEMESIS_SEED={seed} replays it), {seconds} s of faults"
    );
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);

    let listeners: Vec<(u16, u16)> = (0..NODES).map(|_| (free_port(), free_port())).collect();
    let broker = Arc::new(
        tokio::task::spawn_blocking({
            let l = listeners.clone();
            move || Broker::start(&l)
        })
        .await
        .unwrap(),
    );
    let mut proxies = Vec::new();
    for (port, proxy) in &listeners {
        proxies.push(Proxy::start(*proxy, *port).await);
    }
    let name = format!("nemesis{}", std::process::id());
    let shared = Arc::new(Shared {
        ports: Mutex::new(vec![None; NODES]),
        ..Shared::default()
    });
    let mut nodes = Vec::new();
    for (i, (_, proxy)) in listeners.iter().enumerate() {
        let id = format!("n{}", i + 1);
        let dir = temp_dir(&format!("nemesis-{id}"));
        let kafka = format!("127.0.0.1:{proxy}");
        let (eddy, port) = {
            let (name, id, dir, kafka) =
                (name.clone(), id.clone(), dir.to_path_buf(), kafka.clone());
            tokio::task::spawn_blocking(move || spawn_node(&name, &id, &dir, &kafka))
                .await
                .unwrap()
        };
        shared.ports.lock().unwrap()[i] = Some(port);
        nodes.push(Node {
            id,
            eddy: Some(eddy),
            dir,
            kafka,
        });
    }
    let mut cluster = Cluster {
        name,
        logs: vec![Vec::new(); NODES],
        nodes,
        proxies,
        broker,
        shared: shared.clone(),
    };
    let first = shared.ports.lock().unwrap()[0].unwrap();
    let admin = connect(first).await.expect("node 1 answers");
    admin
        .batch_execute(
            "CREATE STREAM pay (id BIGINT NOT NULL, ts TIMESTAMP NOT NULL, card TEXT NOT NULL, \
             amount BIGINT) WITH (event_time = 'ts', event_id = 'id', partition_by = 'card', \
             partitions = 6); \
             CREATE METRIC total AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM pay \
             WINDOW INFINITE GROUP BY card;",
        )
        .await
        .unwrap();
    drop(admin);
    cluster.settle(Duration::from_secs(90)).await;

    let history = Arc::new(Mutex::new(History {
        start: Instant::now(),
        faults: Vec::new(),
        writes: Vec::new(),
        reads: Vec::new(),
        errors: BTreeMap::new(),
    }));
    let mut clients = Vec::new();
    for w in 0..WRITERS {
        clients.push(tokio::spawn(writer(
            w,
            shared.clone(),
            history.clone(),
            seed,
        )));
    }
    for r in 0..READERS {
        clients.push(tokio::spawn(reader(
            r,
            shared.clone(),
            history.clone(),
            seed,
        )));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;

    // Every kind once, in the seed's order, then more at random while time is left.
    const KINDS: [Fault; 5] = [
        Fault::Pause,
        Fault::Kill,
        Fault::Broker,
        Fault::FastRestart,
        Fault::Cut,
    ];
    let mut plan = KINDS;
    plan.shuffle(&mut rng);
    let started = Instant::now();
    let mut costs: Vec<(Fault, String, Duration, Duration, Duration)> = Vec::new();
    let mut k = 0;
    while k < plan.len() || started.elapsed() < Duration::from_secs(seconds) {
        let fault = match plan.get(k) {
            Some(f) => *f,
            None => *KINDS.choose(&mut rng).unwrap(),
        };
        k += 1;
        let i = rng.random_range(0..NODES);
        let target = if fault == Fault::Broker {
            "the broker".to_string()
        } else {
            cluster.nodes[i].id.clone()
        };
        let from = Instant::now();
        let healed = cluster.inject(fault, i).await;
        cluster.settle(Duration::from_secs(90)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let mut h = history.lock().unwrap();
        let cost = unavailability(&h, from, Instant::now());
        let after = unavailability(&h, healed, Instant::now());
        let failing = outage(&h, from, Instant::now());
        if std::env::var_os("EDDY_NEMESIS_TRACE").is_some() {
            let slow = |w: &&Write| {
                w.acked
                    .is_none_or(|(at, _, _)| at - w.sent > Duration::from_millis(200))
            };
            for w in h.writes.iter().filter(|w| w.sent >= from).filter(slow) {
                let _ = writeln!(
                    std::io::stderr(),
                    "  trace writer {} card {} sent +{} ms: {}",
                    w.writer,
                    w.card,
                    (w.sent - from).as_millis(),
                    match w.acked {
                        Some((at, _, _)) => format!("acked after {} ms", (at - w.sent).as_millis()),
                        None => format!(
                            "failed after {} ms: {}",
                            (w.ended - w.sent).as_millis(),
                            w.error.as_deref().unwrap_or("")
                        ),
                    }
                );
            }
        }
        let ports = shared.ports.lock().unwrap().clone();
        let (at, back) = (
            from.duration_since(h.start).as_millis(),
            healed.duration_since(h.start).as_millis(),
        );
        h.faults.push(format!(
            "{fault:?} on {target} at {at} ms, healed at {back} ms, ports then {ports:?}"
        ));
        drop(h);
        // Straight to stderr, past the test harness's capture: `make test` shows it.
        let _ = writeln!(
            std::io::stderr(),
            "nemesis fault {k}: {fault:?} on {target}: a card went {} ms without an acknowledged write, {} ms after the heal; {} ms from a failed statement to the next success",
            cost.as_millis(),
            after.as_millis(),
            failing.as_millis()
        );
        costs.push((fault, target, cost, after, failing));
    }
    shared.stop.store(true, Ordering::Release);
    for c in clients {
        c.await.unwrap();
    }

    // The final state, as every node reads it, once every answer in flight is in.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut last: BTreeMap<usize, (i64, i64)> = BTreeMap::new();
    let ports: Vec<u16> = shared
        .ports
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.unwrap())
        .collect();
    for (k, port) in ports.iter().enumerate() {
        let c = connect(*port).await.expect("a node answers at the end");
        for card in 0..CARDS {
            let rows = c
                .simple_query(&format!(
                    "SELECT n, s FROM total WHERE card = '{}'",
                    card_name(card)
                ))
                .await
                .unwrap();
            let got = first_row(&rows).unwrap_or((0, 0));
            if k == 0 {
                last.insert(card, got);
            } else {
                assert_eq!(
                    last[&card], got,
                    "card {card}: the nodes disagree at the end"
                );
            }
        }
    }
    let c = connect(ports[0]).await.unwrap();
    let ids: Vec<i64> = c
        .simple_query("SELECT id FROM pay")
        .await
        .unwrap()
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap().parse().unwrap()),
            _ => None,
        })
        .collect();

    let h = history.lock().unwrap();
    let acked = h.writes.iter().filter(|w| w.acked.is_some()).count();
    eprintln!(
        "{} writes ({acked} acknowledged, {} in doubt), {} reads; failed statements: {:?}",
        h.writes.len(),
        h.writes.len() - acked,
        h.reads.len(),
        h.errors
    );
    if let Ok(path) = std::env::var("EDDY_NEMESIS_REPORT") {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(PathBuf::from(path))
            .unwrap();
        for (fault, target, cost, after, failing) in &costs {
            writeln!(
                f,
                "{fault:?}\t{target}\t{}\t{}\t{}",
                cost.as_millis(),
                after.as_millis(),
                failing.as_millis()
            )
            .unwrap();
        }
    }
    let bad = check(&h, &last, &ids);
    if !bad.is_empty() || std::env::var_os("EDDY_NEMESIS_LOGS").is_some() {
        let paths = cluster.dump_logs(seed);
        eprintln!("the nodes' output: {paths:?}");
        if !bad.is_empty() {
            // Where the files are not kept (CI), the nodes' plans, takeovers and
            // recoveries go with the failure.
            for path in &paths {
                let text = std::fs::read_to_string(path).unwrap_or_default();
                eprintln!("== {}", path.display());
                for line in text.lines().filter(|l| {
                    l.contains("eddy_cluster") || l.contains("----") || l.contains("ERROR")
                }) {
                    eprintln!("{line}");
                }
            }
        }
    }
    assert!(
        bad.is_empty(),
        "seed {seed}: {} violations, the first ones:\n{}",
        bad.len(),
        bad.iter().take(20).cloned().collect::<Vec<_>>().join("\n")
    );
    assert!(acked > 100, "too few writes were acknowledged: {acked}");
}
