//! The `eddy` binary: `eddy serve` starts the embedded single-node database.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, Subcommand};

use eddy_cluster::placement::{describe, Pinning};
use eddy_cluster::{CacheConfig, KafkaConfig, Reserve, StorageConfig};
use eddy_server::ops::config;
use eddy_server::ops::limits::LimitLayers;
use eddy_server::serve::{default_io_threads, run_on, Config};
use eddy_server::session::settings::Setting;
use eddy_storage::chunk::Compression;
use eddy_storage::{ReservoirConfig, RocksConfig};

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
    /// Start the server (embedded single node, or a cluster node with --kafka).
    Serve(ServeArgs),
    /// Print the configuration `eddy serve` would run with, given the same flags, as an
    /// eddy.toml: every setting and limit with its value and where the value came from.
    Config(ServeArgs),
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
    /// Back up a running node into a new directory on its machine (`BACKUP TO`, through
    /// a connection); `eddy serve --data-dir DIR` restores it.
    Backup {
        /// The directory to write: an absolute path, new or empty.
        dir: String,
        #[arg(long, env = "PGHOST", default_value = "127.0.0.1")]
        host: String,
        #[arg(long, env = "PGPORT", default_value_t = 5433)]
        port: u16,
        /// A superuser (`PGPASSWORD` gives the password).
        #[arg(long, env = "PGUSER", default_value = "eddy")]
        user: String,
    },
}

/// `eddy backup`: runs `BACKUP TO` and prints its row.
fn backup(dir: &str, host: &str, port: u16, user: &str) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let mut config = tokio_postgres::Config::new();
        config.host(host).port(port).user(user).dbname("eddy");
        if let Ok(password) = std::env::var("PGPASSWORD") {
            config.password(password);
        }
        let (client, connection) = config.connect(tokio_postgres::NoTls).await?;
        tokio::spawn(connection);
        let sql = format!("BACKUP TO '{}'", dir.replace('\'', "''"));
        let messages = client
            .simple_query(&sql)
            .await
            .map_err(|e| match e.as_db_error() {
                Some(db) => anyhow::anyhow!(
                    "{}: {}{}",
                    db.code().code(),
                    db.message(),
                    db.hint().map(|h| format!(" ({h})")).unwrap_or_default()
                ),
                None => e.into(),
            })?;
        for m in messages {
            if let tokio_postgres::SimpleQueryMessage::Row(row) = m {
                for (i, column) in row.columns().iter().enumerate() {
                    println!("{}: {}", column.name(), row.get(i).unwrap_or(""));
                }
            }
        }
        Ok(())
    })
}

/// The settings of `eddy serve`. Each is a flag, an environment variable, and a key of
/// eddy.toml (`config.rs`), strongest first.
#[derive(clap::Args)]
struct ServeArgs {
    /// A TOML file of settings (keys as the flags, without dashes) and a [limits] table.
    #[arg(long, env = eddy_server::ops::config::ENV)]
    config: Option<PathBuf>,

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
    /// without a wake-up (tens of microseconds on a virtual machine). No thread polls
    /// while more than one session waits for its fsync, nor after a durable statement's
    /// answer, nor after any answer while more sessions are active than half the cores.
    /// 0: never.
    #[arg(long, env = "EDDY_BUSY_POLL", default_value_t = eddy_server::wire::busy::DEFAULT_US)]
    busy_poll: u64,
    /// Seconds between checkpoints (state flushed, log truncated).
    #[arg(long, env = "EDDY_CHECKPOINT_INTERVAL", default_value_t = 10.0)]
    checkpoint_interval: f64,
    /// With `synchronous_commit = off`, the longest (milliseconds) an acknowledged
    /// event waits for the fsync that makes it durable (as PostgreSQL's
    /// `wal_writer_delay`, whose default is also 200).
    #[arg(long, env = "EDDY_COMMIT_DELAY", default_value_t = eddy_server::serve::COMMIT_DELAY_MS)]
    commit_delay: u64,
    /// Sessions' default `synchronous_commit` (on: a statement is acknowledged once its
    /// events are fsynced; off: once written, with the fsync within the commit delay).
    /// A role's `ALTER ROLE … SET`, a client's startup options and `SET` override it.
    #[arg(long, env = "EDDY_SYNCHRONOUS_COMMIT", default_value = "on", value_parser = synchronous_commit)]
    synchronous_commit: String,
    /// Sessions' default `statement_timeout` (milliseconds, or with ms, s, min or h; 0:
    /// none). A statement past it is cancelled with 57014 before it applies anything.
    #[arg(long, env = "EDDY_STATEMENT_TIMEOUT", default_value = "0", value_parser = statement_timeout)]
    statement_timeout: String,
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
    /// Where the other nodes dial this node's peer service, as HOST:PORT (a name such as
    /// `eddy1:7000` in a container network). Needed when --peer-addr binds 0.0.0.0.
    #[arg(long, env = "EDDY_PEER_ADVERTISE", value_parser = host_port)]
    peer_advertise: Option<String>,
    /// Replication factor of the topics Eddy creates.
    #[arg(long, env = "EDDY_KAFKA_REPLICATION", default_value_t = 1)]
    kafka_replication: i32,
    /// The fewest events a COPY puts in one Kafka transaction (cluster mode): its parse
    /// batches of 256 KiB each are joined until they hold that many.
    #[arg(long, env = "EDDY_KAFKA_STATEMENT_EVENTS", default_value_t = eddy_cluster::log::kafka::STATEMENT_EVENTS_MIN,
          value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    kafka_statement_events: u64,
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
    /// Log lines as `text` or `json` (one object per line, with span fields).
    #[arg(long, env = "EDDY_LOG_FORMAT", default_value = "text",
          value_parser = ["text", "json"])]
    log_format: String,
    /// What to log: a level (`error`, `warn`, `info`, `debug`, `trace`) or a tracing
    /// filter (`info,eddy_cluster=debug`).
    #[arg(long, env = "EDDY_LOG", default_value = "info")]
    log: String,
    /// Statements that take longer (milliseconds) are logged, with their text and
    /// session; 0 logs every statement, -1 none.
    #[arg(long, env = "EDDY_SLOW_STATEMENT_MS", default_value_t = 1000,
          allow_hyphen_values = true, value_parser = clap::value_parser!(i64).range(-1..))]
    slow_statement_ms: i64,
    /// Approximate in-memory bytes of the events sealed into one reservoir chunk.
    #[arg(long, env = "EDDY_CHUNK_BYTES_MAX", default_value = "512kB", value_parser = bytes)]
    chunk_bytes_max: usize,
    /// Bytes of one reservoir segment file.
    #[arg(long, env = "EDDY_SEGMENT_BYTES_MAX", default_value = "64MB", value_parser = bytes)]
    segment_bytes_max: usize,
    /// Bytes of decoded chunks each task keeps in memory.
    #[arg(long, env = "EDDY_CHUNK_CACHE_BYTES", default_value = "4MB", value_parser = bytes)]
    chunk_cache_bytes: usize,
    /// Bytes of decoded chunks the tasks of the node keep beyond their own, together: the
    /// chunks long windows read next.
    #[arg(long, env = "EDDY_CHUNK_CACHE_SHARED_BYTES", default_value = "48MB", value_parser = bytes)]
    chunk_cache_shared_bytes: usize,
    /// LZ4 for reservoir chunks: auto (where it at least halves a chunk), lz4 or none.
    #[arg(long, env = "EDDY_RESERVOIR_COMPRESSION", default_value = "auto")]
    reservoir_compression: Compression,
    /// Group states in the write-back cache (L1), per GroupBy node of a task.
    #[arg(long, env = "EDDY_L1_ENTRIES", default_value_t = CacheConfig::default().l1_entries as u64,
          value_parser = clap::value_parser!(u64).range(1..))]
    l1_entries: u64,
    /// Group states in the write-through cache (L2), per GroupBy node of a task (0: none).
    #[arg(long, env = "EDDY_L2_ENTRIES", default_value_t = CacheConfig::default().l2_entries)]
    l2_entries: usize,
    /// Bytes of one RocksDB memtable (each column family has at most two).
    #[arg(long, env = "EDDY_ROCKSDB_WRITE_BUFFER_BYTES", default_value = "16MB", value_parser = bytes)]
    rocksdb_write_buffer_bytes: usize,
    /// Bytes of the RocksDB block cache all column families share.
    #[arg(long, env = "EDDY_ROCKSDB_BLOCK_CACHE_BYTES", default_value = "32MB", value_parser = bytes)]
    rocksdb_block_cache_bytes: usize,
    /// Space kept free on the data directory's filesystem, in bytes (`256MB`) or percent
    /// of it (`1%`); below it new events are refused (53100) while reads, checkpoints
    /// and shutdown go on. `default`: the smaller of 1% and 256MB.
    #[arg(long, env = "EDDY_DISK_RESERVE", default_value = "default", value_parser = disk_reserve)]
    disk_reserve: Reserve,
}

fn disk_reserve(s: &str) -> Result<Reserve, String> {
    Reserve::parse(s, |b| bytes(b).map(|n| n as u64))
}

/// `HOST:PORT`, the port not 0.
fn host_port(s: &str) -> Result<String, String> {
    match s.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) => {
            Ok(s.to_string())
        }
        _ => Err(format!(
            "expected HOST:PORT with a port from 1 to 65535, got \"{s}\""
        )),
    }
}

fn bytes(s: &str) -> Result<usize, String> {
    eddy_server::ops::limits::parse_bytes(s)
}

fn synchronous_commit(s: &str) -> Result<String, String> {
    session_setting(Setting::SynchronousCommit, s)
}

fn statement_timeout(s: &str) -> Result<String, String> {
    session_setting(Setting::StatementTimeout, s)
}

fn session_setting(setting: Setting, s: &str) -> Result<String, String> {
    setting
        .canonical(s)
        .map_err(|e| eddy_server::ops::limits::reason(&e))
}

/// `--shards`: a number of shards, or `auto` (`None`).
#[derive(Clone, Copy, Debug)]
struct ShardCount(Option<usize>);

fn shard_count(s: &str) -> Result<ShardCount, String> {
    eddy_server::ops::settings::parse_shards(s).map(ShardCount)
}

/// `--shards` (or `EDDY_SHARDS`), else the count `ALTER SYSTEM` kept in the data
/// directory, else eddy.toml's (`from_file`), else `auto`.
fn shards_setting(
    given: Option<ShardCount>,
    from_file: bool,
    data_dir: &std::path::Path,
) -> anyhow::Result<ShardCount> {
    if let (Some(given), false) = (given, from_file) {
        return Ok(given);
    }
    let kept = eddy_server::ops::settings::load(data_dir)?;
    match kept.get("shards") {
        Some(text) => shard_count(text).map_err(|e| {
            anyhow::anyhow!(
                "{}: shards: {e}",
                data_dir
                    .join(eddy_server::ops::settings::AUTO_CONF)
                    .display()
            )
        }),
        None => Ok(given.unwrap_or(ShardCount(None))),
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
            tracing::warn!("cannot read this machine's topology ({e}); shards run unpinned");
            return Ok((shards.0.unwrap_or_else(cores), None));
        }
    };
    let count = pinning.plan.shards.len();
    if !pinning.is_this_machine() {
        tracing::warn!(
            "{count} shards planned for {}; they are not pinned on this machine",
            pinning.machine.source
        );
        return Ok((count, None));
    }
    Ok((count, pin.then(|| Arc::new(pinning))))
}

fn main() -> anyhow::Result<()> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let file = match config::path_in(&args) {
        Some(path) => Some(config::load(&path)?),
        None => None,
    };
    let mut command = Cli::command();
    if let Some(file) = &file {
        command = config::apply(command, &["serve", "config"], file)?;
    }
    let matches = command.clone().get_matches_from(&args);
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let limits = LimitLayers::of(file.as_ref().map(config::File::limits))?;
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
        Command::Backup {
            dir,
            host,
            port,
            user,
        } => backup(&dir, &host, port, &user),
        Command::Config(args) => {
            let (name, sub) = matches.subcommand().expect("a subcommand was parsed");
            let kept = eddy_server::ops::settings::load(&args.data_dir)?;
            // The declared order: the file's defaults moved its arguments to the end.
            let declared = Cli::command();
            let command = declared
                .find_subcommand(name)
                .expect("the parsed subcommand");
            print!("{}", config::describe(command, sub, file.as_ref(), &kept));
            Ok(())
        }
        Command::Serve(args) => {
            eddy_server::ops::memory::return_freed_memory_sooner();
            let serve_matches = matches.subcommand_matches("serve");
            let source = |id: &str| serve_matches.and_then(|m| m.value_source(id));
            let shards_from_file =
                source("shards") == Some(clap::parser::ValueSource::DefaultValue);
            // The command line and the environment beat what ALTER SYSTEM kept.
            let given = Setting::ALL
                .into_iter()
                .filter(|s| s.server_wide())
                .filter(|s| {
                    matches!(
                        source(s.name()),
                        Some(
                            clap::parser::ValueSource::CommandLine
                                | clap::parser::ValueSource::EnvVariable
                        )
                    )
                })
                .collect();
            serve(args, shards_from_file, given, limits)
        }
    }
}

fn serve(
    args: ServeArgs,
    shards_from_file: bool,
    session_given: std::collections::BTreeSet<Setting>,
    limits: LimitLayers,
) -> anyhow::Result<()> {
    eddy_server::ops::log::init(&args.log, &args.log_format, args.slow_statement_ms)?;
    let password = match &args.password_file {
        Some(path) => Some(
            std::fs::read_to_string(path)
                .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?
                .lines()
                .next()
                .unwrap_or_default()
                .to_string(),
        ),
        None => std::env::var("EDDY_PASSWORD").ok(),
    };
    let data_dir = args.data_dir;
    let shards = shards_setting(args.shards, shards_from_file, &data_dir)?;
    let (shards, pinning) = placement(shards, args.topology.as_deref(), args.pin_shards)?;
    // The threads started from here on (the runtime's, the log's, RocksDB's) inherit the
    // service PUs; each shard binds itself to its own.
    if let Some(Err(e)) = pinning.as_ref().map(|p| p.pin_service(false)) {
        tracing::warn!("the service threads run unpinned: {e}");
    }
    let kafka = match args.kafka {
        Some(brokers) => Some(KafkaConfig {
            brokers,
            node: match args.node_id {
                Some(id) => id,
                None => node_id_of(&data_dir)?,
            },
            cluster: args.cluster,
            replication: args.kafka_replication,
            statement_events: args.kafka_statement_events as usize,
            properties: args.kafka_properties,
            host: args.host_id.unwrap_or_else(hostname),
            replicas: args.replicas as usize,
            processors: shards as u32,
            session_timeout: Duration::from_secs_f64(args.session_timeout.max(1.0)),
            pg_addr: args.pg_addr.to_string(),
            peer_addr: args.peer_addr,
            peer_advertise: args.peer_advertise,
        }),
        None => None,
    };
    let storage = StorageConfig {
        reservoir: ReservoirConfig {
            chunk_bytes_max: args.chunk_bytes_max,
            segment_bytes_max: args.segment_bytes_max as u64,
            cache_bytes_max: args.chunk_cache_bytes,
            shared_cache_bytes_max: args.chunk_cache_shared_bytes,
            compression: args.reservoir_compression,
        },
        cache: CacheConfig {
            l1_entries: args.l1_entries as usize,
            l2_entries: args.l2_entries,
        },
        rocks: RocksConfig {
            write_buffer_bytes: args.rocksdb_write_buffer_bytes.max(1 << 16),
            block_cache_bytes: args.rocksdb_block_cache_bytes,
        },
        reserve: args.disk_reserve,
    };
    let io_threads = args.io_threads.unwrap_or_else(default_io_threads).max(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(io_threads)
        .thread_stack_size(eddy_server::serve::PLANNING_STACK_BYTES)
        .enable_all()
        .thread_name("eddy-io")
        .build()?;
    run_on(
        &runtime,
        Config {
            pg_addr: args.pg_addr,
            http_addr: Some(args.http_addr),
            data_dir,
            shards,
            pinning,
            checkpoint_interval: Duration::from_secs_f64(args.checkpoint_interval.max(0.01)),
            commit_delay: Duration::from_millis(args.commit_delay),
            kafka,
            session_threads: io_threads,
            busy_poll: Duration::from_micros(args.busy_poll),
            password,
            tls: args.tls_cert.zip(args.tls_key),
            tls_required: args.tls_required,
            storage,
            limits,
            session_defaults: [
                (Setting::SynchronousCommit, args.synchronous_commit),
                (Setting::StatementTimeout, args.statement_timeout),
            ]
            .into(),
            session_given,
        },
    )
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
