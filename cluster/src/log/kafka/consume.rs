//! The task consumer: one group member per node that receives the task partitions Kafka
//! assigns it and hands each partition's records to its task's shard, in offset order,
//! answering on the reply topics the records name.
//!
//! Invariant: a task applies its partition's records in offset order, each at most once:
//! the consumer dispatches a partition from `positions` (the next offset to apply), which
//! starts at the task's checkpointed log end and only moves forward.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer, ConsumerContext};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};

use eddy_planner::catalog::StreamDef;
use eddy_planner::codec;
use eddy_planner::{Error, Result};

use super::config::{kafka_error, wait_until};
use super::produce::{reply_to, send_replies};
use super::{Kafka, KafkaStats, POLL_BATCH_MAX};
use crate::command::Reply;
use crate::node::shards::Shards;
use crate::route::TaskId;

pub(super) type Positions = Arc<Mutex<HashMap<(String, i32), i64>>>;

/// A stream's topic for one partitioner: each partition is a task.
pub(super) struct TaskTopic {
    pub(super) name: String,
    stream: String,
    partitioner: usize,
    pub(super) partitions: u32,
}
pub(super) type Routes = Arc<RwLock<HashMap<String, (String, usize)>>>;

/// Where the task consumer stands: the routes of the current catalog, each partition's
/// next offset, and what the group assigned it.
#[derive(Default)]
pub(super) struct TaskConsumer {
    /// Topic → (stream, partitioner) of the current catalog.
    routes: Routes,
    positions: Positions,
    /// Set when the topic list changed: the consumer subscribes again.
    resubscribe: Arc<AtomicBool>,
    /// The partitions the task consumer holds now.
    assigned: Arc<Mutex<HashSet<(String, i32)>>>,
    /// Whether the task consumer runs (it starts after recovery).
    consuming: AtomicBool,
}

impl Kafka {
    /// dropped stream's topics are released before they are deleted.
    pub(super) async fn await_assignment(&self, topics: &[TaskTopic]) {
        let wanted: HashSet<(String, i32)> = topics
            .iter()
            .flat_map(|t| (0..t.partitions as i32).map(move |p| (t.name.clone(), p)))
            .collect();
        let holds = || Ok(*self.tasks.assigned.lock().expect("assigned lock") == wanted);
        let late = || {
            Error::internal(format!(
                "kafka: the task consumer's assignment did not follow the catalog \
                 ({} partitions wanted)",
                wanted.len()
            ))
        };
        if let Err(e) = wait_until(60, holds, late).await {
            eprintln!("eddy: {e}");
        }
    }

    /// The task topics of some streams.
    pub(super) fn task_topics(&self, streams: Vec<&StreamDef>) -> Vec<TaskTopic> {
        streams
            .into_iter()
            .flat_map(|s| {
                (0..s.partitioner_count()).map(move |p| TaskTopic {
                    name: self.config.topic_of(s, p),
                    stream: s.name.clone(),
                    partitioner: p,
                    partitions: s.tasks_per_partitioner(),
                })
            })
            .collect()
    }

    /// changed) and, once it runs, waits until it holds exactly their partitions.
    pub(super) async fn follow(&self, topics: &[TaskTopic]) {
        let routes: HashMap<String, (String, usize)> = topics
            .iter()
            .map(|t| (t.name.clone(), (t.stream.clone(), t.partitioner)))
            .collect();
        let changed = {
            // Under the positions lock, as in `dispatch`: once this block ends, no record
            // of a dropped topic moves a position of a topic created again later.
            let mut positions = self.tasks.positions.lock().expect("positions lock");
            let mut current = self.tasks.routes.write().expect("routes lock");
            let changed =
                current.len() != routes.len() || routes.keys().any(|t| !current.contains_key(t));
            positions.retain(|(topic, _), _| routes.contains_key(topic));
            *current = routes;
            changed
        };
        if changed {
            self.tasks.resubscribe.store(true, Ordering::Release);
        }
        if self.tasks.consuming.load(Ordering::Acquire) {
            self.await_assignment(topics).await;
        }
    }

    /// Sets where each task resumes: its checkpointed log end.
    pub fn resume_at(&self, ends: impl IntoIterator<Item = (String, i32, i64)>) {
        let mut positions = self.tasks.positions.lock().expect("positions lock");
        for (topic, partition, end) in ends {
            let p = positions.entry((topic, partition)).or_insert(end);
            *p = (*p).max(end);
        }
    }

    /// The next offset to apply of each task partition.
    pub fn positions(&self) -> HashMap<(String, i32), i64> {
        self.tasks.positions.lock().expect("positions lock").clone()
    }

    /// partition's records to its task's shard from the task's position on.
    pub(crate) fn start_tasks(self: &Arc<Self>, shards: Shards) -> Result<()> {
        let context = TaskContext {
            positions: self.tasks.positions.clone(),
            assigned: self.tasks.assigned.clone(),
            stats: self.stats.clone(),
        };
        self.tasks.consuming.store(true, Ordering::Release);
        let consumer: BaseConsumer<TaskContext> = self
            .config
            .member(&self.config.cluster)
            .create_with_context(context)
            .map_err(|e| kafka_error("creating the task consumer", e))?;
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-kafka-tasks".into())
            .spawn(move || me.run_tasks(consumer, shards))
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        self.threads.lock().expect("threads lock").push(thread);
        Ok(())
    }

    fn run_tasks(self: Arc<Self>, consumer: BaseConsumer<TaskContext>, shards: Shards) {
        let mut batch: Vec<rdkafka::message::OwnedMessage> = Vec::new();
        while !self.stop.load(Ordering::Acquire) {
            if self.tasks.resubscribe.swap(false, Ordering::AcqRel) {
                let topics: Vec<String> = self
                    .tasks
                    .routes
                    .read()
                    .expect("routes lock")
                    .keys()
                    .cloned()
                    .collect();
                let names: Vec<&str> = topics.iter().map(String::as_str).collect();
                // Fresh metadata first: a topic created (again) a moment ago must not look
                // unknown to the group's assignment.
                for topic in &names {
                    let _ = consumer.fetch_metadata(Some(topic), Duration::from_secs(5));
                }
                let result = if names.is_empty() {
                    consumer.unsubscribe();
                    Ok(())
                } else {
                    consumer.subscribe(&names)
                };
                if let Err(e) = result {
                    eprintln!("eddy: kafka: subscribing: {e}");
                }
            }
            let mut wait = Duration::from_millis(20);
            while batch.len() < POLL_BATCH_MAX {
                match consumer.poll(wait) {
                    Some(Ok(m)) => batch.push(m.detach()),
                    // A dropped stream's topic, until the next subscription drops it.
                    Some(Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::UnknownTopicOrPartition,
                    ))) => break,
                    Some(Err(e)) => {
                        eprintln!("eddy: kafka: consuming: {e}");
                        break;
                    }
                    None => break,
                }
                wait = Duration::ZERO;
            }
            if !batch.is_empty() {
                self.dispatch(std::mem::take(&mut batch), &shards);
            }
        }
    }

    /// answers the events that ask for it once their task applied them.
    fn dispatch(&self, records: Vec<rdkafka::message::OwnedMessage>, shards: &Shards) {
        let mut by_partition: BTreeMap<(String, i32), Vec<rdkafka::message::OwnedMessage>> =
            BTreeMap::new();
        for m in records {
            by_partition
                .entry((m.topic().to_string(), m.partition()))
                .or_default()
                .push(m);
        }
        for ((topic, partition), msgs) in by_partition {
            let mut rows = Vec::with_capacity(msgs.len());
            let mut asks = Vec::new();
            let (task, end) = {
                let mut positions = self.tasks.positions.lock().expect("positions lock");
                let route = self
                    .tasks
                    .routes
                    .read()
                    .expect("routes lock")
                    .get(&topic)
                    .cloned();
                let Some((stream, partitioner)) = route else {
                    continue;
                };
                let task = TaskId {
                    stream,
                    partitioner,
                    partition: partition as u32,
                };
                let next = positions.entry((topic.clone(), partition)).or_insert(0);
                for m in &msgs {
                    if m.offset() < *next {
                        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        continue;
                    }
                    *next = m.offset() + 1;
                    let Some(row) = m.payload().and_then(codec::decode_row) else {
                        eprintln!(
                            "eddy: kafka: an unreadable event at {topic}/{partition}@{}",
                            m.offset()
                        );
                        continue;
                    };
                    if let Some(reply) = reply_to(m) {
                        asks.push((rows.len(), reply));
                    }
                    rows.push(row);
                }
                (task, *next)
            };
            if rows.is_empty() {
                continue;
            }
            self.stats
                .consumed
                .fetch_add(rows.len() as u64, Ordering::Relaxed);
            let values = asks.iter().any(|(_, r)| r.values);
            let reply: Reply = if asks.is_empty() {
                Box::new(|_| {})
            } else {
                let (replier, stats) = (self.publisher.replier.clone(), self.stats.clone());
                Box::new(move |result| send_replies(&replier, &stats, asks, result))
            };
            if !shards.deliver(task, rows, values, end as u64, reply) {
                return;
            }
        }
    }
}

/// beginning of the topic.
pub(super) struct TaskContext {
    positions: Positions,
    assigned: Arc<Mutex<HashSet<(String, i32)>>>,
    stats: Arc<KafkaStats>,
}

impl ClientContext for TaskContext {}

impl ConsumerContext for TaskContext {
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => {
                let positions = self.positions.lock().expect("positions lock").clone();
                let wanted: Vec<(String, i32, Offset)> = tpl
                    .elements()
                    .iter()
                    .map(|e| {
                        let key = (e.topic().to_string(), e.partition());
                        // Offset 0 rather than `Beginning`, which costs one ListOffsets
                        // round trip per partition (seconds for a thousand of them); where
                        // retention removed it, `auto.offset.reset` moves to the start.
                        let offset = Offset::Offset(positions.get(&key).copied().unwrap_or(0));
                        (key.0, key.1, offset)
                    })
                    .collect();
                for (topic, partition, offset) in wanted {
                    let _ = tpl.set_partition_offset(&topic, partition, offset);
                }
                self.stats.assignments.fetch_add(1, Ordering::Relaxed);
                match consumer.assign(tpl) {
                    Ok(()) => {
                        *self.assigned.lock().expect("assigned lock") = tpl
                            .elements()
                            .iter()
                            .map(|e| (e.topic().to_string(), e.partition()))
                            .collect();
                    }
                    Err(e) => eprintln!("eddy: kafka: assigning partitions: {e}"),
                }
            }
            _ => {
                self.assigned.lock().expect("assigned lock").clear();
                let _ = consumer.unassign();
            }
        }
    }
}
