//! Progress on stderr with indicatif: a spinner for a step of unknown length, a bar for a
//! step that counts events. Both draw only on a terminal (indicatif hides them otherwise);
//! the suite prints one line per finished step either way.

use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

/// A spinner with `msg` and the time spent, ticking by itself.
pub fn spinner(msg: &str) -> ProgressBar {
    let pb = ProgressBar::new_spinner();
    pb.set_style(
        ProgressStyle::with_template("{spinner} {msg} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
    );
    pb.set_message(msg.to_string());
    pb.enable_steady_tick(Duration::from_millis(120));
    pb
}

/// A bar of `len` events with `msg`, the rate and the time spent.
pub fn bar(len: u64, msg: &str) -> ProgressBar {
    let pb = ProgressBar::new(len);
    pb.set_style(
        ProgressStyle::with_template("{msg:32} [{bar:30}] {pos}/{len} {per_sec} [{elapsed}]")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(msg.to_string());
    pb
}
