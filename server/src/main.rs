//! The `eddy` binary: `eddy serve` starts the embedded single-node database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use eddy_cluster::placement::{describe, Pinning};
use eddy_cluster::KafkaConfig;
use eddy_server::serve::{default_io_threads, run, Config};

/// mimalloc: the engine allocates and frees across threads (the Kafka consumer thread
/// decodes, the shards drop), where glibc's arenas spent about a sixth of eddy's CPU.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(
    name = "eddy",
    version,
    about = "Eddy: exact real-time sliding-window SQL over the PostgreSQL protocol"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
#[allow(clippy::large_enum_variant)] // parsed once, at start
enum Command {
    /// Start the server (embedded single node).
    Serve {
        /// Address of the PostgreSQL protocol listener.
        #[arg(long, env = "EDDY_PG_ADDR", default_value = "127.0.0.1:5433")]
        pg_addr: SocketAddr,
        /// Address of the HTTP listener for `GET /metrics` (Prometheus text format).
        #[arg(long, env = "EDDY_HTTP_ADDR", default_value = "127.0.0.1:9464")]
        http_addr: SocketAddr,
        /// Directory for the catalog and data.
        #[arg(long, env = "EDDY_DATA_DIR", default_value = "data")]
        data_dir: PathBuf,
        /// Shard threads: a number, or `auto` for one per core less the cores kept for
        /// the log, IO and network threads on machines of 4 cores or more. Without it,
        /// what `ALTER SYSTEM SET shards` kept in the data directory, else `auto`.
        #[arg(long, env = "EDDY_SHARDS", value_parser = shard_count)]
        shards: Option<ShardCount>,
        /// Plan shards for the machine this hwloc synthetic description or XML file
        /// describes instead of this one (for trying plans; threads are then not pinned).
        #[arg(long, env = "EDDY_TOPOLOGY")]
        topology: Option<String>,
        /// Pin each shard thread to its own PU, with its memory on the PU's NUMA node.
        #[arg(long, env = "EDDY_PIN_SHARDS", default_value_t = true, action = clap::ArgAction::Set)]
        pin_shards: bool,
        /// Session threads, each a single-threaded runtime that runs its sessions' SQL,
        /// point reads and log writes; the background runtime gets as many (default: one
        /// per core).
        #[arg(long, env = "EDDY_IO_THREADS")]
        io_threads: Option<usize>,
        /// Microseconds a session thread keeps polling its sockets after it answers,
        /// before it sleeps: a client that sends its next statement within it is read
        /// without a wake-up (tens of microseconds on a virtual machine). 0: never.
        #[arg(long, env = "EDDY_BUSY_POLL", default_value_t = eddy_server::busy::DEFAULT_US)]
        busy_poll: u64,
        /// Seconds between checkpoints (state flushed, log truncated).
        #[arg(long, env = "EDDY_CHECKPOINT_INTERVAL", default_value_t = 10.0)]
        checkpoint_interval: f64,
        /// With `synchronous_commit = off`, the longest (milliseconds) an acknowledged
        /// event waits for the fsync that makes it durable.
        #[arg(long, env = "EDDY_COMMIT_DELAY", default_value_t = 10)]
        commit_delay: u64,
        /// Kafka bootstrap servers: Kafka becomes the log (cluster mode).
        #[arg(long, env = "EDDY_KAFKA")]
        kafka: Option<String>,
        /// This node's id in the cluster (default: generated once, kept in the data
        /// directory).
        #[arg(long, env = "EDDY_NODE_ID")]
        node_id: Option<String>,
        /// The cluster's name: the prefix of its Kafka topics and its consumer group.
        #[arg(long, env = "EDDY_CLUSTER", default_value = "eddy")]
        cluster: String,
        /// The physical machine this node runs on (default: the hostname). No two copies
        /// of a task go to one host, so several nodes on one machine can stand for
        /// several machines in tests.
        #[arg(long, env = "EDDY_HOST_ID")]
        host_id: Option<String>,
        /// Copies of each task in cluster mode, the active one included (1: no replicas).
        #[arg(long, env = "EDDY_REPLICAS", default_value_t = 2,
              value_parser = clap::value_parser!(u32).range(1..=16))]
        replicas: u32,
        /// Seconds a silent node stays a member (cluster mode): a dead node's tasks move
        /// to their replicas once it has passed. At least 6 (Kafka's default minimum).
        #[arg(long, env = "EDDY_SESSION_TIMEOUT", default_value_t = 6.0)]
        session_timeout: f64,
        /// Where the peer service (gRPC) listens, in cluster mode; port 0: any free port.
        #[arg(long, env = "EDDY_PEER_ADDR", default_value = "127.0.0.1:0")]
        peer_addr: SocketAddr,
        /// Replication factor of the topics Eddy creates.
        #[arg(long, env = "EDDY_KAFKA_REPLICATION", default_value_t = 1)]
        kafka_replication: i32,
        /// A librdkafka property for every Kafka client of the node, over Eddy's own
        /// (repeatable; in the environment, comma-separated): TLS, SASL, batching.
        #[arg(
            long = "kafka-property",
            value_name = "KEY=VALUE",
            env = "EDDY_KAFKA_PROPERTIES",
            value_delimiter = ',',
            value_parser = key_value
        )]
        kafka_properties: Vec<(String, String)>,
        /// A file whose first line is the superuser `eddy`'s password (or the
        /// `EDDY_PASSWORD` environment variable): clients then authenticate with
        /// SCRAM-SHA-256. It replaces the secret kept in the data directory; without
        /// either, the kept one applies, and with none Eddy trusts loopback clients only.
        #[arg(long, env = "EDDY_PASSWORD_FILE")]
        password_file: Option<PathBuf>,
        /// A PEM file with the server's certificate chain: clients that ask (psql
        /// `sslmode=require`, pgjdbc `ssl=true`) get TLS. Needs --tls-key.
        #[arg(long, env = "EDDY_TLS_CERT", requires = "tls_key")]
        tls_cert: Option<PathBuf>,
        /// A PEM file with the certificate's private key.
        #[arg(long, env = "EDDY_TLS_KEY", requires = "tls_cert")]
        tls_key: Option<PathBuf>,
        /// Refuse clients that do not use TLS (FATAL 28000).
        #[arg(long, env = "EDDY_TLS_REQUIRED")]
        tls_required: bool,
    },
    /// Print the machine as hwloc sees it, where the shards would run, and what a hop
    /// between NUMA nodes costs.
    Topology {
        /// An hwloc synthetic description (`pack:2 numa:1 core:8 pu:2`) or an XML file
        /// (default: this machine).
        #[arg(long, env = "EDDY_TOPOLOGY")]
        topology: Option<String>,
        /// Shards to plan: a number, or `auto`.
        #[arg(long, default_value = "auto", value_parser = shard_count)]
        shards: ShardCount,
        /// Tasks to deal over the shards, as a stream's partitions are.
        #[arg(long, default_value_t = 0)]
        tasks: usize,
    },
}

/// `--shards`: a number of shards, or `auto` (`None`).
#[derive(Clone, Copy, Debug)]
struct ShardCount(Option<usize>);

fn shard_count(s: &str) -> Result<ShardCount, String> {
    eddy_server::settings::parse_shards(s).map(ShardCount)
}

/// `--shards`, else the count `ALTER SYSTEM` kept in the data directory, else `auto`.
fn shards_setting(
    flag: Option<ShardCount>,
    data_dir: &std::path::Path,
) -> anyhow::Result<ShardCount> {
    if let Some(flag) = flag {
        return Ok(flag);
    }
    let kept = eddy_server::settings::load(data_dir)?;
    match kept.get("shards") {
        Some(text) => shard_count(text).map_err(|e| {
            anyhow::anyhow!(
                "{}: shards: {e}",
                data_dir.join(eddy_server::settings::AUTO_CONF).display()
            )
        }),
        None => Ok(ShardCount(None)),
    }
}

/// The shard count and, unless `--pin-shards false` or a `--topology` of another
/// machine, the pinning of each shard. Without hwloc's view of this machine, the
/// shards run unpinned, one per core.
fn placement(
    shards: ShardCount,
    topology: Option<&str>,
    pin: bool,
) -> anyhow::Result<(usize, Option<Arc<Pinning>>)> {
    let cores = || std::thread::available_parallelism().map_or(1, |n| n.get());
    let pinning = match Pinning::load(topology, shards.0) {
        Ok(p) => p,
        Err(e) if topology.is_some() => anyhow::bail!(e),
        Err(e) => {
            eprintln!("eddy: cannot read this machine's topology ({e}); shards run unpinned");
            return Ok((shards.0.unwrap_or_else(cores), None));
        }
    };
    let count = pinning.plan.shards.len();
    if !pinning.is_this_machine() {
        eprintln!(
            "eddy: {count} shards planned for {}; they are not pinned on this machine",
            pinning.machine.source
        );
        return Ok((count, None));
    }
    Ok((count, pin.then(|| Arc::new(pinning))))
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Topology {
            topology,
            shards,
            tasks,
        } => {
            let pinning =
                Pinning::load(topology.as_deref(), shards.0).map_err(anyhow::Error::msg)?;
            print!("{}", describe(&pinning.machine, &pinning.plan, tasks));
            Ok(())
        }
        Command::Serve {
            pg_addr,
            http_addr,
            data_dir,
            shards,
            topology,
            pin_shards,
            io_threads,
            busy_poll,
            checkpoint_interval,
            commit_delay,
            kafka,
            node_id,
            cluster,
            kafka_replication,
            kafka_properties,
            host_id,
            replicas,
            session_timeout,
            peer_addr,
            password_file,
            tls_cert,
            tls_key,
            tls_required,
        } => {
            let password = match password_file {
                Some(path) => Some(
                    std::fs::read_to_string(&path)
                        .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                        .lines()
                        .next()
                        .unwrap_or_default()
                        .to_string(),
                ),
                None => std::env::var("EDDY_PASSWORD").ok(),
            };
            let shards = shards_setting(shards, &data_dir)?;
            let (shards, pinning) = placement(shards, topology.as_deref(), pin_shards)?;
            // The threads started from here on (the runtime's, the log's, RocksDB's)
            // inherit the service PUs; each shard binds itself to its own.
            if let Some(Err(e)) = pinning.as_ref().map(|p| p.pin_service(false)) {
                eprintln!("eddy: the service threads run unpinned: {e}");
            }
            let kafka = match kafka {
                Some(brokers) => Some(KafkaConfig {
                    brokers,
                    node: match node_id {
                        Some(id) => id,
                        None => node_id_of(&data_dir)?,
                    },
                    cluster,
                    replication: kafka_replication,
                    properties: kafka_properties,
                    host: host_id.unwrap_or_else(hostname),
                    replicas: replicas as usize,
                    processors: shards as u32,
                    session_timeout: std::time::Duration::from_secs_f64(session_timeout.max(1.0)),
                    pg_addr: pg_addr.to_string(),
                    peer_addr,
                }),
                None => None,
            };
            let io_threads = io_threads.unwrap_or_else(default_io_threads).max(1);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(io_threads)
                .enable_all()
                .thread_name("eddy-io")
                .build()?;
            runtime.block_on(run(Config {
                pg_addr,
                http_addr: Some(http_addr),
                data_dir,
                shards,
                pinning,
                checkpoint_interval: std::time::Duration::from_secs_f64(
                    checkpoint_interval.max(0.01),
                ),
                commit_delay: std::time::Duration::from_millis(commit_delay),
                kafka,
                session_threads: io_threads,
                busy_poll: std::time::Duration::from_micros(busy_poll),
                password,
                tls: tls_cert.zip(tls_key),
                tls_required,
            }))
        }
    }
}

fn key_value(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
        _ => Err(format!("expected KEY=VALUE, got \"{s}\"")),
    }
}

/// This machine's name, for `--host-id`.
fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// The node id kept in the data directory, made on first use.
fn node_id_of(data_dir: &std::path::Path) -> anyhow::Result<String> {
    let path = data_dir.join("node.id");
    if let Ok(id) = std::fs::read_to_string(&path) {
        return Ok(id.trim().to_string());
    }
    std::fs::create_dir_all(data_dir)?;
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_nanos() as u64;
    let id = format!(
        "node-{:012x}",
        (nanos ^ ((std::process::id() as u64) << 40)) & 0xffff_ffff_ffff
    );
    std::fs::write(&path, format!("{id}\n"))?;
    Ok(id)
}
