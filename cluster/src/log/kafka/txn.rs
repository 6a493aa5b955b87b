//! A statement's events in one Kafka transaction: a statement whose events go to more
//! than one partition is applied whole or not at all.
//!
//! The tasks read with `isolation.level = read_committed` (librdkafka's default), so no
//! event of a transaction reaches a task before its commit marker is written, and none
//! of an aborted one ever does.
//!
//! Invariant: until `commit_transaction` is called, nothing of the statement can be
//! applied. A transaction that is never committed is aborted: by us, by the next
//! producer of its `transactional.id` (`init_transactions` fences the earlier one), or
//! by the broker once `transaction.timeout.ms` passes. So a statement that gives up
//! before its commit reports that nothing was applied; one whose commit's outcome is not
//! known reports 40003, and even then all or none of it is applied.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::error::KafkaError;
use rdkafka::producer::Producer;
use tokio::sync::{Mutex, OwnedMutexGuard};

use eddy_planner::{Error, ErrorKind, Result};

use super::config::KafkaConfig;
use super::produce::{Acks, Events};

/// How many transactions a node runs at once: one per producer, each with its own
/// `transactional.id`. A statement waits for a free one.
const PRODUCERS: usize = 4;

/// How long the broker keeps a transaction open without a word from its producer: the
/// partitions it wrote to are read no further than its first record until it ends, so a
/// node that dies in one holds its readers this long at most. Must not be below the
/// producer's `message.timeout.ms`.
const TRANSACTION_TIMEOUT: Duration = Duration::from_secs(10);

/// The node's transactional producers, readied at start in the background (`warm`).
pub(super) struct Transactions {
    config: KafkaConfig,
    slots: Vec<Arc<Mutex<Option<Slot>>>>,
    next: AtomicUsize,
}

/// A producer, and whether `init_transactions` has completed for it. One that timed out
/// is kept and asked again: librdkafka resumes where it stopped.
struct Slot {
    producer: Events,
    ready: bool,
}

/// One producer, held by one statement; its transaction is open once `begin` returned.
pub(super) struct Held {
    slot: OwnedMutexGuard<Option<Slot>>,
}

impl Transactions {
    pub(super) fn new(config: &KafkaConfig) -> Transactions {
        Transactions {
            config: config.clone(),
            slots: (0..PRODUCERS).map(|_| Arc::default()).collect(),
            next: AtomicUsize::new(0),
        }
    }

    /// Readies every producer on a thread of its own. `init_transactions` aborts what
    /// the node's earlier life left open under each `transactional.id`, at once: left
    /// to the broker's `transaction.timeout.ms`, a transaction of a killed node would
    /// hold its partitions' readers, this node's catch-up among them, for 10 to 20 s.
    /// (Kafka also creates its transaction log on first use, which can take longer
    /// than a statement waits.)
    pub(super) fn warm(&self) {
        let slots = self.slots.clone();
        let config = self.config.clone();
        let warmed = std::thread::Builder::new()
            .name("eddy-kafka-txn".into())
            .spawn(move || {
                for (i, slot) in slots.into_iter().enumerate() {
                    let mut slot = slot.blocking_lock_owned();
                    if let Err(e) = ready(&config, i, &mut slot, Duration::from_secs(60)) {
                        tracing::warn!("{}", e.message);
                    }
                }
            });
        if let Err(e) = warmed {
            tracing::warn!("kafka: could not start a thread: {e}");
        }
    }

    /// A producer in an open transaction, by `by`; past it, the statement fails having
    /// sent nothing.
    pub(super) async fn begin(&self, by: Instant) -> Result<Held> {
        let first = self.next.fetch_add(1, Ordering::Relaxed);
        let free = (0..PRODUCERS)
            .map(|i| (first + i) % PRODUCERS)
            .find_map(|i| Some((i, self.slots[i].clone().try_lock_owned().ok()?)));
        let (i, slot) = match free {
            Some(held) => held,
            None => {
                let i = first % PRODUCERS;
                let wait = self.slots[i].clone().lock_owned();
                match tokio::time::timeout_at(by.into(), wait).await {
                    Ok(slot) => (i, slot),
                    Err(_) => return Err(not_applied("no Kafka transaction became free in time")),
                }
            }
        };
        let config = self.config.clone();
        let left = by.saturating_duration_since(Instant::now());
        let mut slot = tokio::task::spawn_blocking(move || {
            let mut slot = slot;
            ready(&config, i, &mut slot, left).map(|()| slot)
        })
        .await
        .map_err(|_| Error::internal("kafka: starting transactions panicked"))??;
        let producer = &slot.as_ref().expect("ready").producer;
        if let Err(e) = producer.begin_transaction() {
            // A producer in a state that allows no new transaction is replaced.
            *slot = None;
            return Err(not_applied(&format!("kafka: beginning a transaction: {e}")));
        }
        Ok(Held { slot })
    }
}

/// Makes producer `i` ready for transactions within `timeout` (blocking): created if
/// need be, its earlier life's open transaction aborted (`init_transactions`).
fn ready(config: &KafkaConfig, i: usize, slot: &mut Option<Slot>, timeout: Duration) -> Result<()> {
    if slot.is_none() {
        let id = format!("eddy-{}-{}-{i}", config.cluster, config.node);
        // No `Acks::dispatch`: a transaction's records are applied once committed, by the
        // task consumer.
        let producer: Events = config
            .producer()
            .set("transactional.id", &id)
            .set(
                "transaction.timeout.ms",
                TRANSACTION_TIMEOUT.as_millis().to_string(),
            )
            .set("message.timeout.ms", "10000")
            .create_with_context(Acks::default())
            .map_err(|e| not_applied(&format!("kafka: creating a transactional producer: {e}")))?;
        *slot = Some(Slot {
            producer,
            ready: false,
        });
    }
    let s = slot.as_mut().expect("created");
    if s.ready {
        return Ok(());
    }
    match s.producer.init_transactions(timeout) {
        Ok(()) => {
            s.ready = true;
            Ok(())
        }
        Err(e) => {
            let again = matches!(&e, KafkaError::Transaction(t) if t.is_retriable());
            if !again {
                *slot = None;
            }
            Err(not_applied(&format!("kafka: starting transactions: {e}")))
        }
    }
}

impl Held {
    pub(super) fn producer(&self) -> &Events {
        &self.slot.as_ref().expect("a held producer").producer
    }

    /// Commits by `by`. Ok: every event is taken, and the tasks will read them. An error
    /// says whether nothing was applied (the commit failed and the transaction was
    /// aborted) or the outcome is unknown (40003: all or none of it).
    pub(super) async fn commit(mut self, by: Instant) -> Result<()> {
        let producer = self.producer().clone();
        let left = by.saturating_duration_since(Instant::now());
        let committed = tokio::task::spawn_blocking(move || producer.commit_transaction(left))
            .await
            .map_err(|_| Error::internal("kafka: committing panicked"))?;
        let Err(e) = committed else {
            return Ok(());
        };
        let abortable =
            matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort() && !t.is_fatal());
        if abortable {
            self.abort();
            return Err(not_applied(&format!(
                "kafka refused the statement's events: {e}"
            )));
        }
        // The commit may have reached the coordinator: the next life of this
        // `transactional.id` completes it or aborts it, whole.
        *self.slot = None;
        Err(Error::new(
            ErrorKind::CompletionUnknown,
            format!("kafka did not confirm the statement's transaction in time: {e}"),
        )
        .with_hint(
            "All of the statement's events are applied or none are, each at most once; \
             read the metrics to see which.",
        ))
    }

    /// Aborts the transaction in the background and frees the producer when it is done;
    /// a producer that cannot abort is dropped, and its next life fences the transaction.
    pub(super) fn abort(mut self) {
        let Some(producer) = self.slot.as_ref().map(|s| s.producer.clone()) else {
            return;
        };
        tokio::spawn(async move {
            let aborted = tokio::task::spawn_blocking(move || {
                producer.abort_transaction(TRANSACTION_TIMEOUT)
            })
            .await;
            if !matches!(aborted, Ok(Ok(()))) {
                tracing::warn!("kafka: a transaction did not abort; its producer is replaced");
                *self.slot = None;
            }
        });
    }
}

/// The error of a statement of which nothing was applied.
pub(super) fn not_applied(why: &str) -> Error {
    Error::new(
        ErrorKind::Unavailable,
        format!("{why}: nothing of the statement was applied"),
    )
    .with_hint("Retry the statement: its transaction was not committed.")
}

/// The error of a statement whose time ran out before its transaction's commit: 57014
/// past its `statement_timeout`, else 57P03.
pub(super) fn too_late() -> Error {
    if crate::log::statement_deadline().is_some() {
        return Error::new(
            ErrorKind::QueryCanceled,
            "canceling statement due to statement timeout",
        )
        .with_hint("Nothing of the statement was applied: its Kafka transaction was aborted.");
    }
    not_applied("kafka did not take the statement's events in time")
}
