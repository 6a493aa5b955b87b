//! Producing events and gathering their answers: events go to their tasks' topics with
//! headers that name this node's reply topic, and the reply thread fills each waiting
//! statement's slots from what the tasks answer there (seed 002 §3.1).
//!
//! Invariant: a statement is acknowledged only once Kafka acknowledged every record
//! (acks=all, idempotent producer) and every task answered for its events. A statement
//! with more than one record sends them in one transaction (`txn`): all are applied or
//! none.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::ToBytes;
use rdkafka::message::{Header, Headers, Message, OwnedHeaders};
use rdkafka::producer::{BaseRecord, DeliveryResult, Producer, ProducerContext};
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use tokio::sync::oneshot;

use eddy_planner::catalog::StreamDef;
use eddy_planner::codec::{self, Reader};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use super::config::{kafka_error, wait_until, watermarks, KafkaConfig};
use super::consume::Dispatch;
use super::polled::Polled;
use super::txn::{self, Transactions};
use super::KafkaStats;
use crate::command::{Answer, Answers};
use crate::exec::events::{Outcome, Row};
use crate::format;
use crate::log::Turn;
use crate::route::TaskId;

const REPLY_HEADER: &str = "eddy-reply";
const SLOT_HEADER: &str = "eddy-slot";
/// A reply's header: the generation of the newest plan its node had read when it
/// answered (`lease`), little-endian.
const PLAN_HEADER: &str = "eddy-plan";

/// The headers that ask an event's task to answer on `reply_topic`, as slot `slot` of
/// request `request` (the reply record's key is the request id, little-endian), with the
/// event's metric values if `values`. Any Kafka client may send them (seed 002 §3.1).
pub fn reply_headers(reply_topic: &str, request: u64, slot: u32, values: bool) -> OwnedHeaders {
    let mut tag = Vec::with_capacity(13);
    tag.extend_from_slice(&request.to_le_bytes());
    tag.extend_from_slice(&slot.to_le_bytes());
    tag.push(values as u8);
    OwnedHeaders::new_with_capacity(2)
        .insert(Header {
            key: REPLY_HEADER,
            value: Some(reply_topic.as_bytes()),
        })
        .insert(Header {
            key: SLOT_HEADER,
            value: Some(&tag),
        })
}
/// `headers` with the record's format added (`crate::format`); a format-1 record goes
/// untagged, as the builds before format versions wrote it (no header at all is the same
/// record on the wire as an empty list).
pub(super) fn tagged(headers: OwnedHeaders, format: u32) -> OwnedHeaders {
    if format <= 1 {
        return headers;
    }
    headers.insert(Header {
        key: format::HEADER,
        value: Some(format::header_value(format).as_bytes()),
    })
}

/// The headers of a record that carries nothing but its format.
pub(super) fn format_headers(format: u32) -> OwnedHeaders {
    tagged(OwnedHeaders::new_with_capacity(1), format)
}

/// The format of a record read from Kafka: its header's, or 1 without one.
pub(super) fn format_of<M: Message>(m: &M) -> u32 {
    m.headers()
        .and_then(|hs| {
            hs.iter()
                .find(|h| h.key == format::HEADER)
                .map(|h| format::of_header(h.value))
        })
        .unwrap_or(1)
}

/// How long a replica keeps the answers it did not send.
pub(super) const REPLY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a statement waits for Kafka to take its events when it sets no
/// `statement_timeout`. (It then waits two session timeouts more for its tasks' answers:
/// long enough for a dead node's replicas to take its tasks over and answer.)
pub(super) const APPEND_TIMEOUT: Duration = Duration::from_secs(5);

/// The error of a statement whose outcome is not known (40003).
fn unknown(what: &str, hint: &str) -> Error {
    Error::new(eddy_planner::ErrorKind::CompletionUnknown, what).with_hint(hint)
}
/// A statement waiting for its answers, one per (event, partitioner) slot.
struct Gather {
    answers: Vec<Option<Answer>>,
    /// Per slot, the generation of the plan that made its task's active copy active, as
    /// the asker knew it when it sent the event: an answer from a node that had not read
    /// that plan is refused (`deliver_reply`).
    floors: Vec<u64>,
    missing: usize,
    done: Option<oneshot::Sender<Result<Vec<Answer>>>>,
}

/// Where to answer an event: the reply topic, the statement and the slot in it.
#[derive(Clone)]
pub struct ReplyTo {
    topic: Arc<str>,
    request: u64,
    slot: u32,
    pub(super) values: bool,
}

impl ReplyTo {
    /// The asker's reply topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// The asker's number for the statement (`reply_headers`' `request`).
    pub fn request(&self) -> u64 {
        self.request
    }
}

/// The reply producer's context: delivery reports arrive on its own polling thread, and
/// only a failure does anything (it is logged and counted).
pub(super) struct ReplyContext {
    stats: Arc<KafkaStats>,
}

impl ClientContext for ReplyContext {}

impl ProducerContext for ReplyContext {
    type DeliveryOpaque = ();

    fn delivery(&self, result: &DeliveryResult<'_>, _: ()) {
        if let Err((e, _)) = result {
            self.stats.replies_failed.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("kafka: replying: {e}");
        }
    }
}

pub(super) type Replier = Polled<ReplyContext>;

/// A producer of events (or catalog records, dead letters): each record's delivery report
/// goes to its sender (`Taken`), on the producer's own polling thread.
pub(super) type Events = Polled<Acks>;

/// Once Kafka took a record: its offset, or why Kafka did not take it.
pub(super) type Taken = oneshot::Receiver<std::result::Result<i64, KafkaError>>;
/// Where a record's delivery report goes: the sender of its `Taken`.
pub(super) type Report = Box<oneshot::Sender<std::result::Result<i64, KafkaError>>>;

/// The events producer's context. Once the task consumer runs, a record Kafka took is
/// handed to its task here before its sender hears of it, when the task is held here
/// and the record is next at its position (`Dispatch::records`): one of this node's own
/// statements is applied without waiting for the broker's fetch and the consumer's hop
/// (one client, pgbench, two nodes side by side on one warm broker: 1 395–1 523 →
/// 1 454–1 772 statements/s). Delivery reports come in offset order per partition, so a
/// run of statements to one task is applied in order. Transactional producers have none:
/// their records may be applied only once committed, and the consumer reads them then.
#[derive(Default)]
pub(super) struct Acks {
    dispatch: Mutex<Option<Arc<Dispatch>>>,
}

impl ClientContext for Acks {}

impl ProducerContext for Acks {
    type DeliveryOpaque = Report;

    fn delivery(&self, result: &DeliveryResult<'_>, taken: Self::DeliveryOpaque) {
        if let Ok(m) = result {
            let dispatch = self.dispatch.lock().expect("dispatch lock").clone();
            if let Some(d) = dispatch {
                d.records(vec![m.detach()], true);
            }
        }
        let _ = taken.send(
            result
                .as_ref()
                .map(|m| m.offset())
                .map_err(|(e, _)| e.clone()),
        );
    }
}

/// The first request id of this process: the time in ns, so a node restarted under its
/// own id (and reply topic) never takes an answer meant for its earlier life's request
/// (a task replaying old records answers them again) for one of its own.
fn first_request() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// The node's producers and its reply topic.
pub(super) struct Publisher {
    config: KafkaConfig,
    pub(super) producer: Events,
    /// Tasks answer through it from their shard threads, without waiting for Kafka.
    pub(super) answerer: Answerer,
    /// The producers of statements whose events go to more than one partition.
    transactions: Transactions,
    next_request: AtomicU64,
    stats: Arc<KafkaStats>,
}

impl Publisher {
    pub(super) fn new(config: &KafkaConfig, stats: Arc<KafkaStats>) -> Result<Publisher> {
        // An event Kafka has not taken within 10 s is dropped: a statement that gave up
        // on it (40003) does not see it applied much later.
        let producer: Events = config
            .statement_producer()
            .set("message.timeout.ms", "10000")
            .create_with_context(Acks::default())
            .map_err(|e| kafka_error("creating the producer", e))?;
        // An answer's delivery matters only when it fails (`ReplyContext`): librdkafka
        // reports nothing else, which spares it and the polling thread a report per batch.
        let replier: Replier = config
            .statement_producer()
            .set("delivery.report.only.error", "true")
            .create_with_context(ReplyContext {
                stats: stats.clone(),
            })
            .map_err(|e| kafka_error("creating the reply producer", e))?;
        // Until the membership view says what the live members read, this node writes
        // and persists what every build reads (`format::writes`).
        format::settle(format::OLDEST);
        Ok(Publisher {
            config: config.clone(),
            producer,
            answerer: Answerer {
                replier,
                stats: stats.clone(),
                here: Arc::new(Here {
                    reply_topic: format!("{}-replies.{}", config.cluster, config.node),
                    pending: Mutex::default(),
                }),
            },
            transactions: {
                let t = Transactions::new(config);
                t.warm();
                t
            },
            next_request: AtomicU64::new(first_request()),
            stats,
        })
    }

    pub(super) fn reply_topic(&self) -> &str {
        &self.answerer.here.reply_topic
    }

    /// Sets (or, with `None`, clears) where the events producer hands the records Kafka
    /// took to their tasks (`Acks`).
    pub(super) fn dispatch_at_ack(&self, dispatch: Option<Arc<Dispatch>>) {
        *self
            .producer
            .context()
            .dispatch
            .lock()
            .expect("dispatch lock") = dispatch;
    }

    /// otherwise look unknown to it, and the first INSERT would fail.
    pub(super) async fn await_metadata(&self, topics: &[(String, u32, bool)]) -> Result<()> {
        for (topic, partitions, _) in topics {
            let ready = || -> Result<bool> {
                let meta = self
                    .producer
                    .client()
                    .fetch_metadata(Some(topic), Duration::from_secs(5))
                    .map_err(|e| kafka_error("reading topic metadata", e))?;
                Ok(meta.topics().iter().any(|t| {
                    t.name() == topic
                        && t.error().is_none()
                        && t.partitions().len() == *partitions as usize
                        && t.partitions()
                            .iter()
                            .all(|p| p.error().is_none() && p.leader() >= 0)
                }))
            };
            wait_until(30, ready, || {
                kafka_error(
                    "creating topics",
                    format!("{topic} did not become available"),
                )
            })
            .await?;
        }
        Ok(())
    }

    /// `events` are (task, event) in slot order, and `floors` the generation of the plan
    /// that made each one's task active where it is (see `Gather`). Kafka must take them
    /// by `deadline.0` and their tasks answer by `deadline.1`; past either the
    /// statement's outcome is unknown (40003). They go once the statement before in
    /// `turn`'s sequence was taken, and the next may go once these were.
    pub(super) async fn publish(
        &self,
        stream: &StreamDef,
        events: Vec<(TaskId, Row)>,
        floors: Vec<u64>,
        values: bool,
        deadline: (std::time::Instant, std::time::Instant),
        mut turn: Turn,
    ) -> Result<Vec<Answer>> {
        if !turn.wait().await {
            return Err(Error::new(
                eddy_planner::ErrorKind::Unavailable,
                "an earlier part of the statement did not reach Kafka, so this part was not sent",
            )
            .with_hint("The parts before it that Kafka took stay applied."));
        }
        // Each task's events take consecutive slots, so one record carries them
        // (`records`); `order` puts the answers back in the statement's order.
        let format = format::writes();
        let (events, floors, order) = if format >= format::PACKED {
            by_task(events, floors)
        } else {
            (events, floors, None)
        };
        let request = self.next_request.fetch_add(1, Ordering::Relaxed);
        let (done, answered) = oneshot::channel();
        self.answerer
            .here
            .pending
            .lock()
            .expect("pending lock")
            .insert(
                request,
                Gather {
                    answers: vec![None; events.len()],
                    floors,
                    missing: events.len(),
                    done: Some(done),
                },
            );
        let forget = || {
            let mut pending = self.answerer.here.pending.lock().expect("pending lock");
            pending.remove(&request)
        };
        let ask = Some((request, values));
        let records = self.records(stream, &events, ask, format);
        // One record is applied whole by itself; more need a transaction.
        let taken = if records.len() > 1 {
            self.send_whole(records, events.len(), deadline.0).await
        } else {
            let sent = self.send_records(records, events.len());
            match tokio::time::timeout_at(deadline.0.into(), sent).await {
                Ok(taken) => taken,
                Err(_) => Err(unknown(
                    "kafka did not acknowledge the statement's event in time",
                    "Kafka may still take it: it applies at most once. Retry only if an \
                     event applied twice does no harm, or check its effect first.",
                )),
            }
        };
        if let Err(e) = taken {
            forget();
            return Err(e);
        }
        turn.taken();
        match tokio::time::timeout_at(deadline.1.into(), answered).await {
            Ok(Ok(answers)) => answers.map(|a| match order {
                Some(order) => unsort(a, &order),
                None => a,
            }),
            Ok(Err(_)) => Err(Error::internal("kafka: the reply consumer stopped")),
            Err(_) => {
                forget();
                Err(unknown(
                    "the statement's tasks did not answer in time",
                    "Its events are durable in Kafka and will be applied exactly once; \
                     read the metrics to see their effect.",
                ))
            }
        }
    }

    /// Sends the events (in as few records as `records` packs them into) and waits until
    /// Kafka took them all. No event asks for an answer: external records go so.
    pub(super) async fn send_events(
        &self,
        stream: &StreamDef,
        events: &[(TaskId, Row)],
    ) -> Result<()> {
        let records = self.records(stream, events, None, format::writes());
        self.send_records(records, events.len()).await
    }

    /// Sends `records`, holding `events` events, and waits until Kafka took them all.
    async fn send_records(&self, records: Vec<Record>, events: usize) -> Result<()> {
        let deliveries = queue(&self.producer, records)?;
        taken(deliveries).await?;
        self.stats
            .published
            .fetch_add(events as u64, Ordering::Relaxed);
        Ok(())
    }

    /// As `send_records`, in one Kafka transaction (`txn`): all of the events are applied
    /// or none, and none if `by` passes before the commit.
    async fn send_whole(
        &self,
        records: Vec<Record>,
        events: usize,
        by: std::time::Instant,
    ) -> Result<()> {
        let held = self.transactions.begin(by).await?;
        let deliveries = match queue(held.producer(), records) {
            Ok(d) => d,
            Err(e) => {
                held.abort();
                return Err(txn::not_applied(&e.message));
            }
        };
        match tokio::time::timeout_at(by.into(), taken(deliveries)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                held.abort();
                return Err(txn::not_applied(&e.message));
            }
            Err(_) => {
                held.abort();
                return Err(txn::too_late());
            }
        }
        held.commit(by).await?;
        self.stats
            .published
            .fetch_add(events as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The records of `events` in `format`, to their tasks' partitions. In `PACKED` a run of
    /// events for one task goes in one record (up to `PACK_BYTES_MAX`), unkeyed; else,
    /// as a plain Kafka producer would send it, one record per event, keyed by the
    /// partitioner's value. With `answer`, the event in slot i asks its task to answer
    /// slot i of the request on the reply topic: a record names its first event's slot,
    /// and the others follow it.
    fn records(
        &self,
        stream: &StreamDef,
        events: &[Event],
        answer: Option<(u64, bool)>,
        format: u32,
    ) -> Vec<Record> {
        let pack = format >= format::PACKED;
        let topics: Vec<String> = (0..stream.partitioner_count())
            .map(|p| self.config.topic_of(stream, p))
            .collect();
        let mut records = Vec::new();
        let mut i = 0;
        while i < events.len() {
            let (first, task) = (i, &events[i].0);
            let mut payload = Vec::with_capacity(64);
            loop {
                codec::encode_row(&events[i].1, &mut payload);
                i += 1;
                let more = i < events.len() && events[i].0 == *task;
                if !(pack && more && payload.len() < PACK_BYTES_MAX) {
                    break;
                }
            }
            let key = match (i - first, stream.partitioners.get(task.partitioner)) {
                (1, Some(&col)) => Some(events[first].1[col].to_text().unwrap_or_default()),
                (1, None) => Some(String::new()),
                _ => None,
            };
            let headers = match answer {
                Some((request, values)) => {
                    reply_headers(self.reply_topic(), request, first as u32, values)
                }
                None => OwnedHeaders::new_with_capacity(1),
            };
            records.push(Record {
                topic: topics[task.partitioner].clone(),
                partition: task.partition as i32,
                key,
                payload,
                headers: tagged(headers, format),
            });
        }
        records
    }

    /// Starts the thread that reads the reply topic from its current end.
    pub(super) fn start_replies(&self, stop: Arc<AtomicBool>) -> Result<JoinHandle<()>> {
        let consumer: BaseConsumer = self
            .config
            .reader(&format!("eddy-replies.{}", self.config.node))
            .create()
            .map_err(|e| kafka_error("creating the reply consumer", e))?;
        let (_, high) = watermarks(consumer.client(), self.reply_topic(), 0)?;
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(self.reply_topic(), 0, Offset::Offset(high))
            .map_err(|e| kafka_error("reading the reply topic", e))?;
        consumer
            .assign(&tpl)
            .map_err(|e| kafka_error("reading the reply topic", e))?;
        let here = self.answerer.here.clone();
        let stats = self.stats.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-kafka-replies".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Some(Ok(m)) = consumer.poll(Duration::from_millis(50)) else {
                        continue;
                    };
                    stats.replies_received.fetch_add(1, Ordering::Relaxed);
                    let refused = deliver_reply(
                        &here.pending,
                        format_of(&m),
                        plan_of(&m),
                        m.key(),
                        m.payload(),
                    );
                    stats.replies_refused.fetch_add(refused, Ordering::Relaxed);
                }
            })
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        Ok(thread)
    }
}

/// The most bytes of events one record packs (format `PACKED`): well below the 1 MB a
/// broker takes by default, and enough that a record's own cost is spread thin.
const PACK_BYTES_MAX: usize = 256 * 1024;

/// An event of a statement, with its task.
type Event = (TaskId, Row);

/// A record to send to a task's partition.
struct Record {
    topic: String,
    partition: i32,
    /// The partitioner's value of a lone event (`None` for packed events).
    key: Option<String>,
    payload: Vec<u8>,
    headers: OwnedHeaders,
}

/// `events` and their `floors` with each task's events together, in the order they came
/// (a stable sort), and where each went: `order[i]` is the first place of the event
/// now i-th. `None` when nothing moved.
fn by_task(events: Vec<Event>, floors: Vec<u64>) -> (Vec<Event>, Vec<u64>, Option<Vec<usize>>) {
    if events.windows(2).all(|w| w[0].0 <= w[1].0) {
        return (events, floors, None);
    }
    let mut order: Vec<usize> = (0..events.len()).collect();
    order.sort_by(|&a, &b| events[a].0.cmp(&events[b].0));
    let floors = order.iter().map(|&i| floors[i]).collect();
    let mut slots: Vec<Option<Event>> = events.into_iter().map(Some).collect();
    let events = order
        .iter()
        .map(|&i| slots[i].take().expect("each event once"))
        .collect();
    (events, floors, Some(order))
}

/// Answers in slot order put back in the statement's order (`by_task`'s `order`).
fn unsort(answers: Vec<Answer>, order: &[usize]) -> Vec<Answer> {
    let mut back: Vec<Option<Answer>> = vec![None; answers.len()];
    for (answer, &i) in answers.into_iter().zip(order) {
        back[i] = Some(answer);
    }
    back.into_iter()
        .map(|a| a.expect("an answer per slot"))
        .collect()
}

/// Queues `records` on `producer`.
fn queue(producer: &Events, records: Vec<Record>) -> Result<Vec<Taken>> {
    let mut deliveries = Vec::with_capacity(records.len());
    for r in records {
        deliveries.push(send(producer, |taken| {
            let record = BaseRecord::with_opaque_to(&r.topic, taken)
                .partition(r.partition)
                .payload(&r.payload[..])
                .headers(r.headers);
            match &r.key {
                Some(key) => record.key(key.as_bytes()),
                None => record,
            }
        })?);
    }
    Ok(deliveries)
}

/// Queues the record `record` makes (given its delivery report's sender), waiting while
/// the producer's queue is full.
pub(super) fn send<'a, K: ToBytes + ?Sized + 'a, P: ToBytes + ?Sized + 'a>(
    producer: &Events,
    record: impl FnOnce(Report) -> BaseRecord<'a, K, P, Report>,
) -> Result<Taken> {
    let (tx, rx) = oneshot::channel();
    let mut record = record(Box::new(tx));
    loop {
        match producer.send(record) {
            Ok(()) => return Ok(rx),
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                std::thread::sleep(Duration::from_millis(1));
            }
            Err((e, _)) => return Err(kafka_error("publishing events", e)),
        }
    }
}

/// Once Kafka took every queued record.
async fn taken(deliveries: Vec<Taken>) -> Result<()> {
    for d in deliveries {
        d.await
            .map_err(|_| kafka_error("publishing events", "the producer went away"))?
            .map_err(|e| kafka_error("publishing events", e))?;
    }
    Ok(())
}

impl ReplyTo {
    /// Where the event `n` places after this one (in a packed record) is answered.
    pub(super) fn nth(&self, n: usize) -> ReplyTo {
        ReplyTo {
            slot: self.slot + n as u32,
            ..self.clone()
        }
    }
}

/// Where `m` (its first event, for a packed record) asks to be answered, from the
/// headers `reply_headers` gave it.
pub fn reply_to(m: &impl Message) -> Option<ReplyTo> {
    let headers = m.headers()?;
    let mut topic = None;
    let mut tag = None;
    for h in headers.iter() {
        match h.key {
            REPLY_HEADER => topic = h.value,
            SLOT_HEADER => tag = h.value,
            _ => {}
        }
    }
    let mut r = Reader(tag?);
    Some(ReplyTo {
        topic: std::str::from_utf8(topic?).ok()?.into(),
        request: r.u64()?,
        slot: r.u32()?,
        values: r.u8()? != 0,
    })
}

/// How tasks answer on the askers' reply topics, from their shard threads: the reply
/// producer, its counters, and this node's own askers. It writes in `format::writes`.
#[derive(Clone)]
pub(super) struct Answerer {
    replier: Replier,
    stats: Arc<KafkaStats>,
    here: Arc<Here>,
}

/// The statements of this node waiting for answers (`Publisher::publish` adds them, the
/// reply consumer and `Answerer::send` fill them), and the reply topic they ask on:
/// a task active on the asker's own node answers it in place, with the reply it would
/// have sent, checked as one read back from the topic (`deliver_reply`). That spares two
/// broker requests a statement, a reply and its fetch.
struct Here {
    reply_topic: String,
    pending: Mutex<HashMap<u64, Gather>>,
}

impl Answerer {
    /// Sends a batch's answers, one record per asking statement:
    /// `[0][n] (slot, outcome, metrics)*`, or `[1] message` when the task failed; each
    /// with the generation of the newest plan this node has read (`PLAN_HEADER`).
    /// A statement of this node gets its record in place of Kafka.
    pub(super) fn send(&self, plan: u64, asks: Vec<(usize, ReplyTo)>, result: Result<Answers>) {
        let format = format::writes();
        // (reply topic, request) → (slot, values wanted, the event's index in the batch)
        type Slots = Vec<(u32, bool, usize)>;
        let mut by_request: BTreeMap<(Arc<str>, u64), Slots> = BTreeMap::new();
        for (i, r) in asks {
            by_request
                .entry((r.topic, r.request))
                .or_default()
                .push((r.slot, r.values, i));
        }
        for ((topic, request), slots) in by_request {
            let out = reply_body(&slots, &result);
            let key = request.to_le_bytes();
            if *topic == *self.here.reply_topic {
                let refused = deliver_reply(
                    &self.here.pending,
                    format,
                    Some(plan),
                    Some(&key),
                    Some(&out),
                );
                self.stats.replies_local.fetch_add(1, Ordering::Relaxed);
                self.stats
                    .replies_refused
                    .fetch_add(refused, Ordering::Relaxed);
                continue;
            }
            let record = BaseRecord::to(&topic)
                .key(&key[..])
                .payload(&out)
                .headers(reply_record_headers(format, plan));
            match self.replier.send(record) {
                Ok(()) => {
                    self.stats.replies_sent.fetch_add(1, Ordering::Relaxed);
                }
                Err((e, _)) => {
                    self.stats.replies_failed.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!("kafka: replying: {e}");
                }
            }
        }
    }
}

/// A reply's headers: its format and the plan generation it was answered under.
fn reply_record_headers(format: u32, plan: u64) -> OwnedHeaders {
    format_headers(format).insert(Header {
        key: PLAN_HEADER,
        value: Some(&plan.to_le_bytes()[..]),
    })
}

/// The plan generation a reply was answered under (`PLAN_HEADER`); `None` from a node
/// that does not send it.
fn plan_of<M: Message>(m: &M) -> Option<u64> {
    let headers = m.headers()?;
    let h = headers.iter().find(|h| h.key == PLAN_HEADER)?;
    Some(u64::from_le_bytes(h.value?.try_into().ok()?))
}

/// A reply record's value for `slots` (slot, values wanted, the event's index in the
/// batch): `[0][n] (slot, outcome, metrics)*`, or `[1][n] slot* message`.
fn reply_body(slots: &[(u32, bool, usize)], result: &Result<Answers>) -> Vec<u8> {
    let mut out = Vec::with_capacity(16 + slots.len() * 16);
    match result {
        Ok(answers) => {
            out.push(0);
            out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
            for &(slot, values, i) in slots {
                let (outcome, metrics) = &answers[i];
                out.extend_from_slice(&slot.to_le_bytes());
                out.push(match outcome {
                    Outcome::Accepted => 0,
                    Outcome::Late => 1,
                    Outcome::Duplicate => 2,
                });
                let metrics: &[(Arc<str>, Vec<Value>)] = if values { metrics } else { &[] };
                out.extend_from_slice(&(metrics.len() as u32).to_le_bytes());
                for (name, vals) in metrics {
                    out.extend_from_slice(&(name.len() as u32).to_le_bytes());
                    out.extend_from_slice(name.as_bytes());
                    codec::encode_row(vals, &mut out);
                }
            }
        }
        Err(e) => {
            out.push(1);
            out.extend_from_slice(&(slots.len() as u32).to_le_bytes());
            for (slot, _, _) in slots {
                out.extend_from_slice(&slot.to_le_bytes());
            }
            out.extend_from_slice(e.to_string().as_bytes());
        }
    }
    out
}

/// Fills a waiting statement's slots from one reply record, answered under plan
/// generation `plan`. Returns how many of its slots were refused: answered by a node
/// that had not read the plan that made their task active where it is, as the asker
/// knew it when it sent them. That node had lost the task, or was about to; the task's
/// current active copy answers them instead when it opens (a replica keeps its answers),
/// or the statement's time runs out (40003). A node's lease already keeps it from
/// answering once another may (`lease`); this is the asker's own check of it.
fn deliver_reply(
    pending: &Mutex<HashMap<u64, Gather>>,
    format: u32,
    plan: Option<u64>,
    key: Option<&[u8]>,
    value: Option<&[u8]>,
) -> u64 {
    let (Some(key), Some(value)) = (key, value) else {
        return 0;
    };
    let Some(request) = key.try_into().ok().map(u64::from_le_bytes) else {
        return 0;
    };
    let mut pending = pending.lock().expect("pending lock");
    let Some(gather) = pending.get_mut(&request) else {
        return 0; // a statement of an earlier life of the node, or one that timed out
    };
    if let Err(why) = format::check(format, "a reply") {
        if let Some(done) = pending.remove(&request).and_then(|mut g| g.done.take()) {
            let _ = done.send(Err(Error::internal(why)));
        }
        return 0;
    }
    // A node of a build before plan generations (a rolling upgrade) is not checked.
    let stale = |gather: &Gather, slot: u32| {
        plan.is_some_and(|p| gather.floors.get(slot as usize).is_some_and(|f| p < *f))
    };
    let mut r = Reader(value);
    type Failed = (Vec<u32>, String);
    let parsed = (|| -> Option<std::result::Result<Vec<(u32, Answer)>, Failed>> {
        let failed = r.u8()? == 1;
        let n = r.u32()? as usize;
        if failed {
            let mut slots = Vec::with_capacity(n);
            for _ in 0..n {
                slots.push(r.u32()?);
            }
            return Some(Err((slots, String::from_utf8_lossy(r.0).into_owned())));
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let slot = r.u32()?;
            let outcome = match r.u8()? {
                0 => Outcome::Accepted,
                1 => Outcome::Late,
                _ => Outcome::Duplicate,
            };
            let m = r.u32()? as usize;
            let mut metrics = Vec::with_capacity(m);
            for _ in 0..m {
                let len = r.u32()? as usize;
                let name: Arc<str> = std::str::from_utf8(r.take(len)?).ok()?.into();
                let vals = codec::read_row(&mut r)?;
                metrics.push((name, vals));
            }
            out.push((slot, (outcome, metrics)));
        }
        Some(Ok(out))
    })();
    let answers = match parsed {
        Some(Ok(a)) => a,
        Some(Err((slots, message))) => {
            let refused = slots.iter().filter(|s| stale(gather, **s)).count() as u64;
            if refused == 0 {
                if let Some(done) = pending.remove(&request).and_then(|mut g| g.done.take()) {
                    let _ = done.send(Err(Error::internal(message)));
                }
            }
            return refused;
        }
        None => {
            if let Some(done) = pending.remove(&request).and_then(|mut g| g.done.take()) {
                let _ = done.send(Err(Error::internal("kafka: an unreadable reply")));
            }
            return 0;
        }
    };
    let mut refused = 0;
    for (slot, answer) in answers {
        if stale(gather, slot) {
            refused += 1;
            continue;
        }
        if let Some(s) = gather.answers.get_mut(slot as usize) {
            if s.is_none() {
                gather.missing -= 1;
            }
            *s = Some(answer);
        }
    }
    if gather.missing == 0 {
        if let Some(mut g) = pending.remove(&request) {
            let answers = g
                .answers
                .into_iter()
                .map(|a| a.expect("answered"))
                .collect();
            if let Some(done) = g.done.take() {
                let _ = done.send(Ok(answers));
            }
        }
    }
    refused
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::OwnedMessage;
    use rdkafka::Timestamp;

    fn read_back(headers: Option<OwnedHeaders>) -> OwnedMessage {
        OwnedMessage::new(
            None,
            None,
            "t".into(),
            Timestamp::NotAvailable,
            0,
            0,
            headers,
        )
    }

    #[test]
    fn a_record_names_its_format_and_format_one_goes_untagged() {
        assert_eq!(format_headers(1).count(), 0);
        assert_eq!(format_of(&read_back(None)), 1);
        assert_eq!(format_of(&read_back(Some(format_headers(1)))), 1);
        let asks = reply_headers("replies", 7, 3, true);
        let m = read_back(Some(tagged(asks, format::FORMAT)));
        assert_eq!(format_of(&m), format::FORMAT);
        let reply = reply_to(&m).expect("the reply headers stay");
        assert_eq!((reply.request, reply.slot, reply.values), (7, 3, true));
        let newer = OwnedHeaders::new().insert(Header {
            key: format::HEADER,
            value: Some("99"),
        });
        assert!(format::check(format_of(&read_back(Some(newer))), "a record").is_err());
    }

    /// A statement of two events whose first task moved at plan 5: a reply answered
    /// under plan 4 fills only the second slot, one under plan 5 completes it, and a
    /// failure from plan 4 fails nothing.
    #[test]
    fn a_reply_answered_under_an_older_plan_than_its_tasks_move_is_refused() {
        let pending = Mutex::new(HashMap::new());
        let (done, mut answered) = oneshot::channel();
        pending.lock().unwrap().insert(
            7,
            Gather {
                answers: vec![None, None],
                floors: vec![5, 0],
                missing: 2,
                done: Some(done),
            },
        );
        let key = 7u64.to_le_bytes();
        let answers: Answers = (0..2).map(|_| (Outcome::Accepted, Vec::new())).collect();
        let both = reply_body(&[(0, false, 0), (1, false, 1)], &Ok(answers.clone()));
        let format = format::FORMAT;
        let deliver =
            |plan, body: &[u8]| deliver_reply(&pending, format, plan, Some(&key), Some(body));

        let failed = reply_body(&[(0, false, 0)], &Err(Error::internal("gone")));
        assert_eq!(deliver(Some(4), &failed), 1);
        assert_eq!(deliver(Some(4), &both), 1);
        assert_eq!(pending.lock().unwrap()[&7].missing, 1);
        assert!(answered.try_recv().is_err(), "not complete yet");
        let first = reply_body(&[(0, false, 0)], &Ok(answers));
        assert_eq!(deliver(Some(5), &first), 0);
        assert_eq!(answered.try_recv().unwrap().unwrap().len(), 2);
        assert!(pending.lock().unwrap().is_empty());
    }

    /// A statement's events go to their tasks together, each task's in the order they
    /// came, their floors with them; the answers come back in the statement's order.
    #[test]
    fn events_sorted_by_task_answer_in_the_statement_order() {
        let task = |partition| TaskId {
            stream: "s".into(),
            partitioner: 0,
            partition,
        };
        let tasks = [2, 0, 2, 1, 0];
        let events: Vec<(TaskId, Row)> = tasks
            .iter()
            .enumerate()
            .map(|(i, &p)| (task(p), Row::from(vec![Value::Int(i as i64)])))
            .collect();
        let floors = vec![10, 11, 12, 13, 14];
        let (sorted, floors, order) = by_task(events, floors);
        let ids: Vec<(u32, Value)> = sorted
            .iter()
            .map(|(t, r)| (t.partition, r[0].clone()))
            .collect();
        let want = [(0, 1), (0, 4), (1, 3), (2, 0), (2, 2)];
        assert_eq!(
            ids,
            want.map(|(p, i)| (p, Value::Int(i))).to_vec(),
            "each task's events together, in order"
        );
        assert_eq!(floors, vec![11, 14, 13, 10, 12]);
        let order = order.expect("the events moved");
        let answers: Vec<Answer> = sorted
            .iter()
            .map(|(_, r)| (Outcome::Accepted, vec![("m".into(), vec![r[0].clone()])]))
            .collect();
        let back: Vec<Value> = unsort(answers, &order)
            .into_iter()
            .map(|(_, m)| m[0].1[0].clone())
            .collect();
        assert_eq!(back, (0..5).map(Value::Int).collect::<Vec<_>>());
        // Already together: nothing moves.
        let (_, _, order) = by_task(
            vec![(task(0), Row::from(vec![])), (task(1), Row::from(vec![]))],
            vec![0, 0],
        );
        assert!(order.is_none());
    }

    #[test]
    fn a_reply_carries_the_plan_it_was_answered_under() {
        let headers = reply_record_headers(format::FORMAT, 42);
        assert_eq!(plan_of(&read_back(Some(headers))), Some(42));
        // A node of an older build sends none, and is not checked.
        assert_eq!(
            plan_of(&read_back(Some(format_headers(format::FORMAT)))),
            None
        );
    }
}
