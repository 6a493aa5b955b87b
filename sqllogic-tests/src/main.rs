//! `eddy-slt`: command-line sqllogictest runner for a running Eddy server.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::Parser;
use eddy_sqllogictest::{collect_slt_files, run_files, summary, Mode};

/// Run sqllogictest (.slt) files against a running Eddy server, one fresh connection per file.
#[derive(Debug, Parser)]
#[command(name = "eddy-slt", version)]
struct Args {
    /// host:port of Eddy's PostgreSQL endpoint (user `eddy`, database `eddy`, no TLS).
    #[arg(long, env = "EDDY_PG_ADDR", value_name = "HOST:PORT")]
    addr: String,

    /// Rewrite each file's expected output in place with what the server returns.
    #[arg(long)]
    rewrite: bool,

    /// .slt files, or directories searched recursively for *.slt.
    #[arg(required = true, value_name = "PATH")]
    paths: Vec<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    let args = Args::parse();
    let files = collect_slt_files(&args.paths).context("collecting .slt files")?;
    if files.is_empty() {
        bail!("no .slt files found under the given paths");
    }
    let mode = if args.rewrite {
        Mode::Rewrite
    } else {
        Mode::Check
    };
    let outcomes = run_files(&args.addr, &files, mode, |outcome| {
        println!("{}", outcome.report(&outcome.path));
    })
    .await;
    let label = match mode {
        Mode::Check => "slt",
        Mode::Rewrite => "rewrite",
    };
    println!("{label}: {}", summary(&outcomes));
    Ok(if outcomes.iter().all(|o| o.passed()) {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
