//! External topics (`WITH (kafka_topic = …)`): one consumer per stream turns each JSON
//! record into an event published to the stream's task topics; a record that does not
//! fit goes to the stream's dead-letter topic, with its error and origin.
//!
//! Invariant: a source commits its offsets only once Kafka has the events they became,
//! so a crash redelivers (at least once) and `event_id` makes the effect exactly once.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::message::{Header, Message, OwnedHeaders, OwnedMessage};
use rdkafka::producer::BaseRecord;
use rdkafka::{Offset, TopicPartitionList};

use eddy_planner::bind::row_from_json;
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::{Error, Result};

use super::config::kafka_error;
use super::produce::send;
use super::{Kafka, POLL_BATCH_MAX};
use crate::exec::events::Row;
use crate::exec::task::Task;
use crate::route::{dir_name, route, TaskId};

/// External records per decoding job.
const DECODE_PIECE: usize = 512;

/// A running consumer of a stream's external topic.
pub(super) struct SourceRun {
    stream: Arc<StreamDef>,
    stop: Arc<AtomicBool>,
    pub(super) thread: JoinHandle<()>,
}

/// The consumers of external topics, and what they sent to dead-letter topics.
#[derive(Default)]
pub(super) struct Sources {
    /// Consumers of external topics, by stream.
    pub(super) runs: Mutex<HashMap<String, SourceRun>>,
    /// External records sent to a dead-letter topic, by stream.
    dead_letters: Mutex<BTreeMap<String, u64>>,
}

impl Kafka {
    /// stream's task count as partitions) and its dead-letter topic if missing.
    pub(super) async fn install_sources(&self, next: &Catalog) -> Result<()> {
        let stale: Vec<SourceRun> = {
            let mut sources = self.sources.runs.lock().expect("sources lock");
            let names: Vec<String> = sources
                .iter()
                .filter(|(name, run)| next.stream(name) != Some(&run.stream))
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| sources.remove(n)).collect()
        };
        for run in stale {
            run.stop.store(true, Ordering::Release);
            let _ = tokio::task::spawn_blocking(move || run.thread.join()).await;
        }
        for stream in next.streams.values() {
            let Some(source) = &stream.source else {
                continue;
            };
            if self
                .sources
                .runs
                .lock()
                .expect("sources lock")
                .contains_key(&stream.name)
            {
                continue;
            }
            for (topic, partitions) in [
                (source.topic.clone(), stream.tasks_per_partitioner()),
                (self.config.dead_letter_topic(&stream.name), 1),
            ] {
                if self.admin.partition_count(&topic)?.is_none() {
                    self.admin
                        .create_topic_if_missing(&topic, partitions)
                        .await?;
                }
            }
            let stop = Arc::new(AtomicBool::new(false));
            let me = self.me()?;
            let def = stream.clone();
            let flag = stop.clone();
            let runtime = tokio::runtime::Handle::current();
            let thread = std::thread::Builder::new()
                .name("eddy-kafka-source".into())
                .spawn(move || me.run_source(def, flag, runtime))
                .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
            self.sources.runs.lock().expect("sources lock").insert(
                stream.name.clone(),
                SourceRun {
                    stream: stream.clone(),
                    stop,
                    thread,
                },
            );
        }
        Ok(())
    }

    /// crash redelivers (at least once); `event_id` makes the effect exactly once.
    fn run_source(
        self: Arc<Self>,
        stream: Arc<StreamDef>,
        stop: Arc<AtomicBool>,
        runtime: tokio::runtime::Handle,
    ) {
        let Some(source) = stream.source.clone() else {
            return;
        };
        let group = format!("{}-source.{}", self.config.cluster, dir_name(&stream.name));
        let consumer: BaseConsumer = match self.config.member(&group).create() {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!("kafka: the consumer of {}: {e}", source.topic);
                return;
            }
        };
        if let Err(e) = consumer.subscribe(&[&source.topic]) {
            tracing::warn!("kafka: subscribing to {}: {e}", source.topic);
            return;
        }
        let stopped = || stop.load(Ordering::Acquire) || self.stop.load(Ordering::Acquire);
        let mut batch = Vec::new();
        while !stopped() {
            let mut wait = Duration::from_millis(50);
            while batch.len() < POLL_BATCH_MAX {
                match consumer.poll(wait) {
                    Some(Ok(m)) => batch.push(m.detach()),
                    Some(Err(e)) => {
                        tracing::warn!("kafka: consuming {}: {e}", source.topic);
                        break;
                    }
                    None => break,
                }
                wait = Duration::ZERO;
            }
            if batch.is_empty() {
                continue;
            }
            let mut rows: Vec<Row> = Vec::with_capacity(batch.len());
            for (m, row) in batch.iter().zip(self.decode(&stream, &batch)) {
                let payload = m.payload().unwrap_or_default();
                match row {
                    Ok(r) => rows.push(r),
                    Err(e) => {
                        let origin = format!("{}/{}@{}", m.topic(), m.partition(), m.offset());
                        let sent = runtime.block_on(self.dead_letter(
                            &stream.name,
                            payload,
                            &e.to_string(),
                            &origin,
                        ));
                        if let Err(e) = sent {
                            tracing::warn!("kafka: {e}");
                        }
                    }
                }
            }
            let events: Vec<(TaskId, Row)> = route(&stream, &rows)
                .into_iter()
                .flat_map(|(_, task, _, rows)| rows.into_iter().map(move |r| (task.clone(), r)))
                .collect();
            while let Err(e) = runtime.block_on(self.publisher.send_events(&stream, &events)) {
                tracing::warn!("kafka: ingesting {}: {e}; retrying", source.topic);
                if stopped() {
                    return;
                }
                std::thread::sleep(Duration::from_secs(1));
            }
            let mut ends: BTreeMap<(String, i32), i64> = BTreeMap::new();
            for m in batch.drain(..) {
                ends.insert((m.topic().to_string(), m.partition()), m.offset() + 1);
            }
            let mut tpl = TopicPartitionList::new();
            for ((topic, partition), end) in ends {
                let _ = tpl.add_partition_offset(&topic, partition, Offset::Offset(end));
            }
            if let Err(e) = consumer.commit(&tpl, CommitMode::Async) {
                tracing::warn!("kafka: committing {}: {e}", source.topic);
            }
        }
    }

    /// The rows of external records (or why each does not fit), in order. The JSON is
    /// decoded on the shards, round-robin, in pieces of `DECODE_PIECE` records: stateless
    /// work, off this consumer's thread.
    fn decode(&self, stream: &Arc<StreamDef>, batch: &[OwnedMessage]) -> Vec<Result<Row>> {
        let decode = |stream: &StreamDef, payload: &[u8]| {
            let row = row_from_json(stream, payload)?;
            Task::event_time(stream, &row)?;
            Ok(Row::from(row))
        };
        let Some(shards) = self.shards.get() else {
            return batch
                .iter()
                .map(|m| decode(stream, m.payload().unwrap_or_default()))
                .collect();
        };
        let waits: Vec<_> = batch
            .chunks(DECODE_PIECE)
            .map(|piece| {
                let payloads: Vec<Vec<u8>> = piece
                    .iter()
                    .map(|m| m.payload().unwrap_or_default().to_vec())
                    .collect();
                let (tx, rx) = std::sync::mpsc::channel();
                let stream = stream.clone();
                shards.run_anywhere(Box::new(move || {
                    let rows: Vec<Result<Row>> =
                        payloads.iter().map(|p| decode(&stream, p)).collect();
                    let _ = tx.send(rows);
                }));
                (piece.len(), rx)
            })
            .collect();
        waits
            .into_iter()
            .flat_map(|(n, rx)| {
                rx.recv().unwrap_or_else(|_| {
                    (0..n)
                        .map(|_| Err(Error::internal("a decoding job was dropped")))
                        .collect()
                })
            })
            .collect()
    }

    /// External records sent to dead-letter topics, by stream.
    pub fn dead_letters(&self) -> BTreeMap<String, u64> {
        self.sources
            .dead_letters
            .lock()
            .expect("dead letters lock")
            .clone()
    }

    /// where it came from (`topic/partition@offset`).
    async fn dead_letter(
        &self,
        stream: &str,
        payload: &[u8],
        error: &str,
        origin: &str,
    ) -> Result<()> {
        let topic = self.config.dead_letter_topic(stream);
        let headers = OwnedHeaders::new()
            .insert(Header {
                key: "eddy-error",
                value: Some(error.as_bytes()),
            })
            .insert(Header {
                key: "eddy-origin",
                value: Some(origin.as_bytes()),
            });
        send(&self.publisher.producer, |taken| {
            BaseRecord::<[u8], [u8], _>::with_opaque_to(&topic, taken)
                .payload(payload)
                .headers(headers)
        })?
        .await
        .map_err(|_| kafka_error("publishing a dead letter", "the producer went away"))?
        .map_err(|e| kafka_error("publishing a dead letter", e))?;
        self.stats.dead_letters.fetch_add(1, Ordering::Relaxed);
        *self
            .sources
            .dead_letters
            .lock()
            .expect("dead letters lock")
            .entry(stream.to_string())
            .or_default() += 1;
        Ok(())
    }
}
