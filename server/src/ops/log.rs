//! The node's log: `tracing` events on stderr, as text lines or one JSON object per line
//! (`--log-format json`), filtered by `--log` (a level or a tracing filter).
//!
//! Spans carry the context: `node` (the node's id, in cluster mode) around everything
//! the node logs from its runtime, `session` around a connection's statements, and
//! `statement` around the statement being run. Statements slower than
//! `--slow-statement-ms` are logged at `warn` with their text and duration.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// Milliseconds above which a statement is logged; negative: never.
static SLOW_MS: AtomicI64 = AtomicI64::new(1000);

/// Installs the subscriber for the process (once; later calls only set the threshold).
pub fn init(filter: &str, format: &str, slow_statement_ms: i64) -> anyhow::Result<()> {
    SLOW_MS.store(slow_statement_ms, Ordering::Relaxed);
    // A filter of targets and levels alone is a `Targets`, which costs nothing as a span
    // is entered and left. `EnvFilter` (needed only for span and field directives) reads
    // a lock that every thread shares at each enter and exit, and every session's future
    // runs inside its `session` span: at 16 clients that was a cache line bounced between
    // the session threads at every poll.
    let filter: Box<dyn Layer<Registry> + Send + Sync> = match filter.parse::<Targets>() {
        Ok(targets) => Box::new(targets),
        Err(_) => Box::new(EnvFilter::try_new(filter).map_err(|e| {
            anyhow::anyhow!(
                "--log {filter:?}: {e} (a level such as info, or a filter such as \
                 info,eddy_cluster=debug)"
            )
        })?),
    };
    let text = || {
        tracing_subscriber::fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(false)
    };
    let installed = match format {
        "json" => Registry::default()
            .with(filter)
            .with(text().json().with_current_span(true).with_span_list(true))
            .try_init(),
        _ => Registry::default().with(filter).with(text()).try_init(),
    };
    // A second server in one process (the tests) keeps the first subscriber.
    drop(installed);
    Ok(())
}

/// The threshold above which statements are logged (`None`: never).
pub fn slow_threshold() -> Option<Duration> {
    u64::try_from(SLOW_MS.load(Ordering::Relaxed))
        .ok()
        .map(Duration::from_millis)
}

/// Logs `sql` if it took longer than the threshold.
pub fn statement_done(sql: &str, elapsed: Duration) {
    if slow_threshold().is_some_and(|t| elapsed >= t) {
        tracing::warn!(
            duration_ms = elapsed.as_secs_f64() * 1e3,
            statement = sql,
            "slow statement: {:.3} ms",
            elapsed.as_secs_f64() * 1e3
        );
    }
}
