//! The `eddy` binary: `eddy serve` starts the embedded single-node database.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

use eddy_server::serve::{run, Config};

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
        /// Shard threads (default: the number of cores).
        #[arg(long, env = "EDDY_SHARDS")]
        shards: Option<usize>,
        /// Seconds between checkpoints (state flushed, log truncated).
        #[arg(long, env = "EDDY_CHECKPOINT_INTERVAL", default_value_t = 10.0)]
        checkpoint_interval: f64,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve {
            pg_addr,
            http_addr,
            data_dir,
            shards,
            checkpoint_interval,
        } => {
            let shards = shards
                .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
                .max(1);
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .enable_all()
                .thread_name("eddy-io")
                .build()?;
            runtime.block_on(run(Config {
                pg_addr,
                http_addr: Some(http_addr),
                data_dir,
                shards,
                checkpoint_interval: std::time::Duration::from_secs_f64(
                    checkpoint_interval.max(0.01),
                ),
            }))
        }
    }
}
