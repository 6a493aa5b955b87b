//! The node's fence: its lease, the plan generation it applies and whether the broker
//! answers, shared with every thread that answers for a task. The membership thread
//! renews it from the beats it reads back (`membership::lease` has the design); the
//! shards, the reply path and the peer service only read it.
//!
//! Invariant: `held` is true only before the end of a lease taken from a beat this node
//! read back, so a node cut off or stopped answers for no task once that time passed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use eddy_planner::{Error, ErrorKind, Result};

#[derive(Debug)]
pub struct Fence {
    origin: Instant,
    /// The lease's end, in ns after `origin` (0: no lease).
    until: AtomicU64,
    /// When a beat was last read back, in ns after `origin` (0: never).
    heard: AtomicU64,
    /// The generation of the newest plan applied.
    generation: AtomicU64,
    /// How long the broker may be silent before it counts as unreachable.
    silence: Duration,
}

impl Fence {
    pub fn new(silence: Duration) -> Fence {
        Fence {
            origin: Instant::now(),
            until: AtomicU64::new(0),
            heard: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            silence,
        }
    }

    fn nanos(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.origin).as_nanos() as u64 + 1
    }

    /// Whether this node holds its lease now.
    pub fn held(&self) -> bool {
        self.nanos(Instant::now()) < self.until.load(Ordering::Acquire)
    }

    /// How long the lease still runs (zero: lapsed).
    pub fn remaining(&self) -> Duration {
        let now = self.nanos(Instant::now());
        Duration::from_nanos(self.until.load(Ordering::Acquire).saturating_sub(now))
    }

    /// Extends the lease to `until`, and records that the broker answered. Returns
    /// whether the lease had lapsed before.
    pub(super) fn renew(&self, until: Instant) -> bool {
        let lapsed = !self.held();
        self.until.fetch_max(self.nanos(until), Ordering::AcqRel);
        self.heard
            .store(self.nanos(Instant::now()), Ordering::Release);
        lapsed
    }

    /// Ends the lease for good (the node stops).
    pub(super) fn revoke(&self) {
        self.until.store(0, Ordering::Release);
    }

    /// Whether a beat came back from the broker lately.
    pub fn reachable(&self) -> bool {
        let heard = self.heard.load(Ordering::Acquire);
        heard != 0 && self.nanos(Instant::now()) - heard < self.silence.as_nanos() as u64
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    pub(super) fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Release);
    }

    /// `Ok` while the lease is held; else the retryable error a read gets.
    pub fn check(&self) -> Result<()> {
        if self.held() {
            return Ok(());
        }
        Err(unavailable(if self.reachable() {
            "this node has not renewed its lease yet"
        } else {
            "this node cannot reach Kafka, so its lease on its tasks has lapsed"
        }))
    }
}

/// The retryable error (57P03) of a read or reply this node may not answer now.
pub fn unavailable(why: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{why}; it answers for no task until it knows the current plan"),
    )
    .with_hint(
        "Retry: the statement applied nothing, and another node answers once it holds the task.",
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_runs_until_its_end_and_a_renewal_only_extends_it() {
        let fence = Fence::new(Duration::from_secs(1));
        assert!(!fence.held() && !fence.reachable());
        assert!(fence.check().is_err());
        assert!(fence.renew(Instant::now() + Duration::from_secs(60)));
        assert!(fence.held() && fence.reachable());
        assert!(!fence.renew(Instant::now()), "it was held");
        assert!(fence.held(), "an earlier end does not shorten it");
        let past = Fence::new(Duration::from_secs(1));
        past.renew(Instant::now() - Duration::from_millis(1));
        assert!(!past.held());
        assert_eq!(past.check().unwrap_err().kind.sqlstate(), "57P03");
    }
}
