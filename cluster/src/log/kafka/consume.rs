//! The task consumer: one consumer per node, assigned by hand the partitions of the tasks
//! the newest plan gives this node (`membership`). It hands each partition's records to
//! its task's shard, in offset order. A task the node holds active answers on the reply
//! topics the records name; a replica applies the same records and keeps its answers for
//! a while, to send them if it is promoted before the asker gave up.
//!
//! Invariant: a task applies its partition's records in offset order, each at most once:
//! the consumer dispatches a partition from `positions` (the next offset to apply), which
//! starts at the task's checkpointed log end and only moves forward. Records of a task
//! this node does not hold are not applied, and its position stays.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use eddy_planner::catalog::StreamDef;
use eddy_planner::codec;
use eddy_planner::{Error, Result};

use super::config::kafka_error;
use super::fence::{unavailable, Fence};
use super::produce::{format_of, reply_to, Answerer, ReplyTo, REPLY_TIMEOUT};
use super::{Kafka, KafkaStats, POLL_BATCH_MAX, POLL_BYTES_MAX};
use crate::command::{IngestReply, Reply};
use crate::membership::ClusterPlan;
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

/// Records a task new to this node and active here replays from its own checkpoint
/// rather than take a peer's newer one. A peer's checkpoint would skip the records
/// below it, and only the node that applies a record as its active copy answers it: a
/// node restarted under its own id that took a replica's checkpoint never answered the
/// statements sent while it was down, and their askers waited out their time
/// (`REPLY_TIMEOUT`). Replayed, each recent record is answered again (an asker takes
/// the first answer and drops the rest). Replaying this many costs well under a second.
const REPLAY_OVER_PEER: u64 = 10_000;

/// Answered events a replica keeps, per task, at most.
const UNSENT_MAX: usize = 100_000;

/// Answers a replica did not send: (when, the asks, their answers in ask order).
type Unsent = (Instant, Vec<(usize, ReplyTo)>, IngestReply);

/// A held task's role: active (it answers) or replica (it keeps its answers a while).
/// An active task answers only while it is open (no other node answers for it any more,
/// `membership::lease`) and the node holds its lease; until then it keeps its answers as
/// a replica does, and sends them when it may.
#[derive(Default)]
pub(super) struct Role {
    state: Mutex<RoleState>,
    /// The next offset handed to the task's shard: a read queued behind it sees every
    /// record below it applied.
    delivered: AtomicI64,
}

#[derive(Default)]
struct RoleState {
    active: bool,
    /// Taken over: no other node answers for the task.
    open: bool,
    /// Reads wait until the records below this offset were handed to the shard: the
    /// partition's end when the task was opened, past every answer an earlier owner gave.
    ready: i64,
    unsent: VecDeque<Unsent>,
    unsent_events: usize,
}

impl RoleState {
    fn answers(&self, fence: &Fence) -> bool {
        self.active && self.open && fence.held()
    }

    /// Sends what was kept and is still awaited.
    fn flush(&mut self, send: &mut impl FnMut(Unsent)) {
        self.unsent_events = 0;
        for unsent in std::mem::take(&mut self.unsent) {
            if unsent.0.elapsed() <= REPLY_TIMEOUT {
                send(unsent);
            }
        }
    }
}

impl Role {
    /// An applied batch's answers: sent if the task answers now, kept otherwise.
    fn answer(
        &self,
        asks: Vec<(usize, ReplyTo)>,
        result: IngestReply,
        fence: &Fence,
        send: impl FnOnce(Unsent),
    ) {
        let mut s = self.state.lock().expect("role lock");
        if s.answers(fence) {
            drop(s);
            send((Instant::now(), asks, result));
            return;
        }
        // Only the asked events' answers are kept, renumbered.
        let result = result.map(|answers| {
            let mut answers: Vec<Option<_>> = answers.into_iter().map(Some).collect();
            asks.iter()
                .map(|(i, _)| answers[*i].take().expect("one answer per event"))
                .collect()
        });
        let asks: Vec<(usize, ReplyTo)> = asks
            .into_iter()
            .enumerate()
            .map(|(j, (_, r))| (j, r))
            .collect();
        s.unsent_events += asks.len();
        s.unsent.push_back((Instant::now(), asks, result));
        while s
            .unsent
            .front()
            .is_some_and(|(at, _, _)| at.elapsed() > REPLY_TIMEOUT)
            || s.unsent_events > UNSENT_MAX
        {
            let Some((_, gone, _)) = s.unsent.pop_front() else {
                break;
            };
            s.unsent_events -= gone.len();
        }
    }

    /// Makes the task active or a replica. A promoted task waits to be opened.
    fn set_active(&self, active: bool) {
        let mut s = self.state.lock().expect("role lock");
        if active != s.active {
            s.open = false;
        }
        s.active = active;
    }

    /// Whether the task is active but not yet opened.
    fn waiting(&self) -> bool {
        let s = self.state.lock().expect("role lock");
        s.active && !s.open
    }

    /// Opens an active task: it answers, and serves reads once `ready` was delivered.
    fn open(&self, ready: i64, fence: &Fence, mut send: impl FnMut(Unsent)) {
        let mut s = self.state.lock().expect("role lock");
        if !s.active {
            return;
        }
        s.open = true;
        s.ready = ready;
        if s.answers(fence) {
            s.flush(&mut send);
        }
    }

    /// Whether reads of the task may be answered here now (the lease aside).
    fn serves(&self) -> std::result::Result<(), &'static str> {
        let s = self.state.lock().expect("role lock");
        if !s.active {
            Err("this node holds only a replica of the task")
        } else if !s.open {
            Err("the task is being taken over by this node")
        } else if self.delivered.load(Ordering::Acquire) < s.ready {
            Err("the task is catching up with its partition")
        } else {
            Ok(())
        }
    }
}

/// The events of a task record: one, or (from format `PACKED`) one or more, one
/// encoded row after another. `None` if the value is not that.
fn events_of(payload: &[u8], format: u32) -> Option<Vec<crate::exec::events::Row>> {
    if format < crate::format::PACKED {
        return codec::decode_row(payload).map(|row| vec![row]);
    }
    let mut r = codec::Reader(payload);
    let mut rows = Vec::new();
    while !r.is_empty() {
        rows.push(codec::read_row(&mut r)?.into());
    }
    (!rows.is_empty()).then_some(rows)
}

/// Whether a record was written within `REPLY_TIMEOUT` (by its timestamp), so its asker
/// may still wait for the answer.
fn recent(m: &rdkafka::message::OwnedMessage) -> bool {
    let Some(at) = m.timestamp().to_millis() else {
        return true;
    };
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64);
    now - at <= REPLY_TIMEOUT.as_millis() as i64
}

/// How a node given a task it lacks gets the task's checkpoint from a peer (`peer`).
pub trait Recover: Send + Sync {
    /// Brings `task` up to a peer's checkpoint newer than offset `after` if there is
    /// one, then calls `done` with the offset it resumes from: `Some` after an install,
    /// `None` to replay the partition from where it stands here. Returns false, and
    /// drops `done`, when no other node may have a checkpoint of it.
    fn recover(&self, task: TaskId, after: u64, done: Box<dyn FnOnce(Option<u64>) + Send>) -> bool;
}

/// Where the task consumer stands: the routes of the current catalog, each partition's
/// next offset, and the tasks this node holds.
#[derive(Default)]
pub(super) struct TaskConsumer {
    /// Topic → (stream, partitioner) of the current catalog.
    routes: Routes,
    positions: Positions,
    /// The tasks the newest plan gives this node, with their roles.
    held: Mutex<HashMap<TaskId, Arc<Role>>>,
    /// Assignments asked for (a new plan or catalog) and made by the consumer thread.
    reassigns_asked: AtomicU64,
    reassigns_made: Arc<AtomicU64>,
    /// Whether the task consumer runs (it starts after recovery).
    consuming: AtomicBool,
    /// Held tasks waiting for a peer's checkpoint: their partitions are not read yet.
    recovering: Mutex<HashSet<TaskId>>,
    /// How tasks new to this node are recovered from peers (none: replayed).
    recovery: RwLock<Option<Arc<dyn Recover>>>,
    /// Held from a position's move to its batch's hand-over (`Dispatch`), and while
    /// `note_delivered` reads the positions: hand-overs of one partition reach its shard
    /// in offset order, and a position counts as delivered only once its records were
    /// handed over. Taken first by whatever holds the positions and `held` (or
    /// `recovering`) together, which `Dispatch` does in the other order on two threads.
    order: Mutex<()>,
    /// Wakes the consumer thread from a quiet pause (`QUIET`).
    quiet: Quiet,
}

/// How long the task consumer stops fetching after a round whose every record this node
/// had already applied as Kafka acknowledged it (its own statements', `Acks`): `QUIET`
/// after the first such round, doubled after each next one up to `QUIET_MAX`, and back to
/// `QUIET` once a round holds any other record or an acknowledgement wakes it. Without
/// the pause the consumer fetched each of the producer's requests back at once, a fetch
/// round trip, a broker request and two thread wake-ups per request, only to skip what it
/// read. Measured (pgbench, 16 clients, durable, one node on a warm broker, alternated):
/// no pause 8.1–10.0 k statements/s, a fixed 5 ms 10.9–11.7 k, a fixed 20 ms 11.9–12.2 k.
///
/// A record the producer's acknowledgement finds behind a gap (one this node did not
/// send, before its own) wakes the consumer at once (`Quiet::wake`); one after the node's
/// own records, with none of the node's own following it, waits at most the pause.
/// Rounds with any record of another writer (external producers, other nodes) never
/// pause, so a topic others write does not wait.
pub(super) const QUIET: Duration = Duration::from_millis(5);
const QUIET_MAX: Duration = Duration::from_millis(20);

/// A pause of the task consumer, ended early by `wake`.
#[derive(Default)]
struct Quiet {
    woken: Mutex<bool>,
    cv: std::sync::Condvar,
}

impl Quiet {
    /// Ends the pause now (or the next one at once, if none runs).
    fn wake(&self) {
        *self.woken.lock().expect("quiet lock") = true;
        self.cv.notify_one();
    }

    /// Waits up to `most`, or until `wake`; returns whether it was woken.
    fn wait(&self, most: Duration) -> bool {
        let woken = self.woken.lock().expect("quiet lock");
        let (mut woken, _) = self
            .cv
            .wait_timeout_while(woken, most, |woken| !*woken)
            .expect("quiet lock");
        std::mem::take(&mut *woken)
    }

    /// Forgets a wake that came while no pause ran: the round that follows reads it.
    fn clear(&self) {
        *self.woken.lock().expect("quiet lock") = false;
    }
}

impl TaskConsumer {
    fn reassign(&self) -> u64 {
        self.reassigns_asked.fetch_add(1, Ordering::AcqRel) + 1
    }

    /// The task of a partition and its role, if this node holds it and reads it now
    /// (not while a peer's checkpoint comes first). Called under the positions lock.
    fn reading(&self, topic: &str, partition: i32) -> Option<(TaskId, Arc<Role>)> {
        let (stream, partitioner) = self
            .routes
            .read()
            .expect("routes lock")
            .get(topic)
            .cloned()?;
        let task = TaskId {
            stream,
            partitioner,
            partition: partition as u32,
        };
        // Not held: a later plan took it away.
        let role = self.held.lock().expect("held lock").get(&task).cloned()?;
        let recovering = self
            .recovering
            .lock()
            .expect("recovering lock")
            .contains(&task);
        (!recovering).then_some((task, role))
    }
}

impl Kafka {
    /// Returns once the task consumer has made the assignment asked for last, so a
    /// dropped stream's topics are released before they are deleted.
    pub(super) async fn await_assignment(&self) {
        let asked = self.tasks.reassign();
        if !self.tasks.consuming.load(Ordering::Acquire) {
            return;
        }
        let made = self.tasks.reassigns_made.clone();
        let done = || Ok(made.load(Ordering::Acquire) >= asked);
        let late = || Error::internal("kafka: the task consumer did not follow the catalog");
        if let Err(e) = super::config::wait_until(60, done, late).await {
            tracing::warn!("{e}");
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

    /// Makes `topics` the ones the task consumer reads (of the tasks it holds) and, once
    /// it runs, waits until it has been assigned again.
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
            self.await_assignment().await;
        }
    }

    /// Sets how tasks new to this node are recovered from peers.
    pub fn set_recovery(&self, recovery: Arc<dyn Recover>) {
        *self.tasks.recovery.write().expect("recovery lock") = Some(recovery);
    }

    /// Takes the roles the newest plan gives this node: tasks it no longer holds stop,
    /// new ones start from their positions (after a peer's newer checkpoint, if one
    /// has it), and a promoted replica sends what it kept.
    pub(super) fn apply_plan(self: &Arc<Self>, plan: &ClusterPlan) {
        let roles = plan.roles_of(&self.config.node);
        let recovery = self.tasks.recovery.read().expect("recovery lock").clone();
        let mut new = Vec::new();
        let changed = {
            let mut held = self.tasks.held.lock().expect("held lock");
            let changed = held.len() != roles.len() || roles.keys().any(|t| !held.contains_key(t));
            held.retain(|t, _| roles.contains_key(t));
            for (task, active) in roles {
                if !held.contains_key(&task) {
                    new.push((task.clone(), active));
                }
                let role = held.entry(task).or_default().clone();
                role.set_active(active);
            }
            changed
        };
        if let Some(recovery) = recovery {
            for (task, active) in new {
                let Some(topic) = self.topic_of_task(&task) else {
                    continue;
                };
                let key = (topic, task.partition as i32);
                let after = {
                    let positions = self.tasks.positions.lock().expect("positions lock");
                    positions.get(&key).copied().unwrap_or(0).max(0) as u64
                };
                // An active task replays what it can rather than skip records whose
                // askers may still wait (`REPLAY_OVER_PEER`).
                let newer_than = if active {
                    after.saturating_add(REPLAY_OVER_PEER)
                } else {
                    after
                };
                if !self
                    .tasks
                    .recovering
                    .lock()
                    .expect("recovering lock")
                    .insert(task.clone())
                {
                    continue;
                }
                let me = self.clone();
                let id = task.clone();
                let asked = recovery.recover(
                    task.clone(),
                    newer_than,
                    Box::new(move |end| me.recovered(&id, key, end)),
                );
                if !asked {
                    self.tasks
                        .recovering
                        .lock()
                        .expect("recovering lock")
                        .remove(&task);
                }
            }
        }
        // Only a change of the tasks held moves the consumer; a change of roles does not.
        if changed {
            self.tasks.reassign();
        }
    }

    /// A task's recovery from a peer ended: it resumes from `end` (after an install)
    /// or from where it was.
    fn recovered(&self, task: &TaskId, key: (String, i32), end: Option<u64>) {
        if let Some(end) = end {
            self.tasks
                .positions
                .lock()
                .expect("positions lock")
                .insert(key, end as i64);
        }
        self.tasks
            .recovering
            .lock()
            .expect("recovering lock")
            .remove(task);
        self.tasks.reassign();
    }

    /// The held tasks that are active but not yet opened.
    pub(super) fn waiting_roles(&self) -> Vec<(TaskId, Arc<Role>)> {
        let held = self.tasks.held.lock().expect("held lock");
        held.iter()
            .filter(|(_, r)| r.waiting())
            .map(|(t, r)| (t.clone(), r.clone()))
            .collect()
    }

    /// Opens an active task (`Role::open`); reads wait for `ready` to be delivered.
    pub(super) fn open_role(&self, role: &Role, ready: i64) {
        role.open(ready, &self.fence, |(_, asks, result)| {
            self.publisher
                .answerer
                .send(self.fence.generation(), asks, result)
        });
    }

    /// After the lease lapsed and came back: the open tasks send what they kept.
    pub(super) fn flush_unsent(&self) {
        let roles: Vec<Arc<Role>> = self
            .tasks
            .held
            .lock()
            .expect("held lock")
            .values()
            .cloned()
            .collect();
        for role in roles {
            let mut s = role.state.lock().expect("role lock");
            if s.answers(&self.fence) {
                let plan = self.fence.generation();
                s.flush(&mut |(_, asks, result)| self.publisher.answerer.send(plan, asks, result));
            }
        }
    }

    /// `Ok` when this node may answer a read of `task` now: it holds its lease, and the
    /// task is active here, opened and caught up. Else the retryable error (57P03).
    pub fn serves(&self, task: &TaskId) -> Result<()> {
        self.fence.check()?;
        let role = self
            .tasks
            .held
            .lock()
            .expect("held lock")
            .get(task)
            .cloned();
        match role {
            None => Err(unavailable("this node no longer holds the task")),
            Some(role) => role.serves().map_err(unavailable),
        }
    }

    /// Brings `delivered` of tasks waiting to serve reads up to their positions: under
    /// the order lock, every record below a position was handed to the shard.
    fn note_delivered(&self) {
        let _order = self.tasks.order.lock().expect("order lock");
        let held = self.tasks.held.lock().expect("held lock");
        let mut waiting: Vec<(&TaskId, &Arc<Role>)> = held
            .iter()
            .filter(|(_, r)| {
                let ready = r.state.lock().expect("role lock").ready;
                r.delivered.load(Ordering::Acquire) < ready
            })
            .collect();
        if waiting.is_empty() {
            return;
        }
        let positions = self.tasks.positions.lock().expect("positions lock");
        let routes = self.tasks.routes.read().expect("routes lock");
        for (topic, (stream, partitioner)) in routes.iter() {
            waiting.retain(|(t, role)| {
                if t.stream != *stream || t.partitioner != *partitioner {
                    return true;
                }
                if let Some(&at) = positions.get(&(topic.clone(), t.partition as i32)) {
                    role.delivered.fetch_max(at, Ordering::AcqRel);
                }
                false
            });
        }
    }

    /// The topic of a task under the current catalog.
    pub(super) fn topic_of_task(&self, task: &TaskId) -> Option<String> {
        let routes = self.tasks.routes.read().expect("routes lock");
        routes
            .iter()
            .find(|(_, (stream, p))| *stream == task.stream && *p == task.partitioner)
            .map(|(topic, _)| topic.clone())
    }

    /// Each held task's next offset and its partition's end (one request to the
    /// broker per task; its lag is the difference).
    pub fn progress(&self) -> BTreeMap<TaskId, (i64, Option<i64>)> {
        let held: Vec<TaskId> = self
            .tasks
            .held
            .lock()
            .expect("held lock")
            .keys()
            .cloned()
            .collect();
        let positions = self.positions();
        held.into_iter()
            .filter_map(|task| {
                let key = (self.topic_of_task(&task)?, task.partition as i32);
                let at = positions.get(&key).copied().unwrap_or(0);
                Some((task, (at, self.high_watermark(&key.0, key.1).ok())))
            })
            .collect()
    }

    /// The tasks this node holds now, each with whether it is active.
    pub fn roles(&self) -> BTreeMap<TaskId, bool> {
        self.tasks
            .held
            .lock()
            .expect("held lock")
            .iter()
            .map(|(t, r)| (t.clone(), r.state.lock().expect("role lock").active))
            .collect()
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

    /// Starts the task consumer's thread: it reads the partitions of the tasks this node
    /// holds and hands their records to the tasks' shards. From then on a record of this
    /// node's events producer is also handed over as Kafka acknowledges it (`Dispatch`).
    pub(crate) fn start_tasks(self: &Arc<Self>, shards: Shards) -> Result<()> {
        let consumer: BaseConsumer = self
            .config
            .consumer(&format!(
                "{}-tasks.{}",
                self.config.cluster, self.config.node
            ))
            .create()
            .map_err(|e| kafka_error("creating the task consumer", e))?;
        let dispatch = Arc::new(Dispatch {
            tasks: self.tasks.clone(),
            answerer: self.publisher.answerer.clone(),
            fence: self.fence.clone(),
            stats: self.stats.clone(),
            shards,
        });
        self.publisher.dispatch_at_ack(Some(dispatch.clone()));
        self.tasks.consuming.store(true, Ordering::Release);
        self.tasks.reassign();
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-kafka-tasks".into())
            .spawn(move || me.run_tasks(consumer, dispatch))
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        self.threads.lock().expect("threads lock").push(thread);
        Ok(())
    }

    /// Assigns the consumer the partitions of the held tasks whose topics the catalog
    /// has, each from its position, and notes those in `returned` (in place of what it
    /// held). With `replan` (a new plan or catalog asked for it) the topics' metadata is
    /// fetched first (a topic created a moment ago must not look unknown), and the
    /// assignment is counted; without it (the end of a quiet pause, `pause_fetching`)
    /// neither. Returns whether the consumer took the assignment.
    fn assign_held(
        &self,
        consumer: &BaseConsumer,
        returned: &mut HashMap<(String, i32), i64>,
        replan: bool,
    ) -> bool {
        let asked = self.tasks.reassigns_asked.load(Ordering::Acquire);
        let mut tpl = TopicPartitionList::new();
        returned.clear();
        {
            let _order = self.tasks.order.lock().expect("order lock");
            let held = self.tasks.held.lock().expect("held lock");
            let recovering = self.tasks.recovering.lock().expect("recovering lock");
            let positions = self.tasks.positions.lock().expect("positions lock");
            let routes = self.tasks.routes.read().expect("routes lock");
            for (topic, (stream, partitioner)) in routes.iter() {
                for task in held.keys().filter(|t| {
                    &t.stream == stream && t.partitioner == *partitioner && !recovering.contains(t)
                }) {
                    let partition = task.partition as i32;
                    // Offset 0 rather than `Beginning`, which costs one ListOffsets round
                    // trip per partition; where retention removed it,
                    // `auto.offset.reset` moves to the start.
                    let at = positions
                        .get(&(topic.clone(), partition))
                        .copied()
                        .unwrap_or(0);
                    let _ = tpl.add_partition_offset(topic, partition, Offset::Offset(at));
                    returned.insert((topic.clone(), partition), at);
                }
            }
        }
        let result = if tpl.count() == 0 {
            consumer.unassign()
        } else {
            if replan {
                let elements = tpl.elements();
                let topics: std::collections::BTreeSet<&str> =
                    elements.iter().map(|e| e.topic()).collect();
                for topic in topics {
                    let _ = consumer.fetch_metadata(Some(topic), Duration::from_secs(5));
                }
            }
            consumer.assign(&tpl)
        };
        match result {
            Ok(()) => {
                if replan {
                    self.stats.assignments.fetch_add(1, Ordering::Relaxed);
                }
                self.tasks.reassigns_made.fetch_max(asked, Ordering::AcqRel);
                true
            }
            Err(e) => {
                tracing::warn!("kafka: assigning partitions: {e}");
                false
            }
        }
    }

    fn run_tasks(self: Arc<Self>, consumer: BaseConsumer, dispatch: Arc<Dispatch>) {
        let mut batch: Vec<rdkafka::message::OwnedMessage> = Vec::new();
        // Per assigned partition, the offset after the last record the consumer returned
        // (or where it was assigned to start).
        let mut returned: HashMap<(String, i32), i64> = HashMap::new();
        let mut made = 0;
        let mut quiet = QUIET;
        while !self.stop.load(Ordering::Acquire) {
            let asked = self.tasks.reassigns_asked.load(Ordering::Acquire);
            if asked > made {
                let _ = self.assign_held(&consumer, &mut returned, true);
                made = asked;
            }
            let mut wait = Duration::from_millis(20);
            let mut idle = false;
            let mut bytes = 0;
            while batch.len() < POLL_BATCH_MAX && bytes < POLL_BYTES_MAX {
                match consumer.poll(wait) {
                    Some(Ok(m)) => {
                        returned.insert((m.topic().to_string(), m.partition()), m.offset() + 1);
                        bytes += m.payload_len();
                        batch.push(m.detach());
                    }
                    // A dropped stream's topic, until the next assignment drops it.
                    Some(Err(KafkaError::MessageConsumption(
                        RDKafkaErrorCode::UnknownTopicOrPartition,
                    ))) => break,
                    Some(Err(e)) => {
                        tracing::warn!("kafka: consuming: {e}");
                        break;
                    }
                    None => {
                        idle = true;
                        break;
                    }
                }
                wait = Duration::ZERO;
            }
            let read = batch.len();
            // A wake before this round's records were read is for one of them.
            self.tasks.quiet.clear();
            let skipped = if read == 0 {
                Some(0)
            } else {
                dispatch.records(std::mem::take(&mut batch), false)
            };
            let Some(skipped) = skipped else { return };
            if idle && !dispatch.step_over_unreturned(&consumer, &mut returned) {
                return;
            }
            self.note_delivered();
            if read > 0 && skipped == read {
                let woken = self.pause_fetching(&consumer, &mut returned, quiet, made);
                quiet = if woken {
                    QUIET
                } else {
                    (quiet * 2).min(QUIET_MAX)
                };
            } else if read > skipped {
                quiet = QUIET;
            }
        }
    }

    /// Stops fetching for `most`, or until an acknowledgement finds a gap (see `QUIET`),
    /// by giving up the assignment, then assigns the held tasks' partitions again from
    /// their positions: past what was applied at acknowledgement, so the node's own
    /// records are not fetched back at all.
    ///
    /// Not `pause` and `resume`: librdkafka's broker thread, with nothing to fetch, sleeps
    /// up to a second and a resume does not wake it. Measured, rounds came once a second,
    /// and a record of another writer could wait that long. An assignment wakes it.
    /// `made`: the assignments asked for that the loop has made. Returns whether an
    /// acknowledgement woke it.
    fn pause_fetching(
        &self,
        consumer: &BaseConsumer,
        returned: &mut HashMap<(String, i32), i64>,
        most: Duration,
        made: u64,
    ) -> bool {
        if let Err(e) = consumer.unassign() {
            tracing::warn!("kafka: pausing the task consumer: {e}");
            return true;
        }
        self.stats.quiet_pauses.fetch_add(1, Ordering::Relaxed);
        let woken = self.tasks.quiet.wait(most);
        // An assignment asked for meanwhile (a new plan or catalog) is made next by the
        // loop, with fresh metadata. One that fails is asked for again.
        let asked = self.tasks.reassigns_asked.load(Ordering::Acquire);
        if asked <= made && !self.assign_held(consumer, returned, false) {
            self.tasks.reassign();
        }
        woken
    }
}

/// Hands records to their tasks' shards: the task consumer's thread with what it reads,
/// and the events producer's delivery reports with what Kafka acknowledged (its own
/// statements' records, applied here without waiting for the consumer to fetch them).
pub(super) struct Dispatch {
    tasks: Arc<TaskConsumer>,
    answerer: Answerer,
    fence: Arc<Fence>,
    stats: Arc<KafkaStats>,
    shards: Shards,
}

impl Dispatch {
    /// Moves each task past the offsets its consumer read but never returns: a
    /// transaction's commit or abort marker, and an aborted transaction's records
    /// (`txn`). Without this a task's position would stop short of its partition's end,
    /// and a task waiting to serve reads, or a node catching up, would wait for ever.
    ///
    /// Only a partition whose every returned record was handed over moves: one whose
    /// records were passed over (its task recovering, or not held) keeps its position
    /// until it is assigned again. Returns false once the shards are gone.
    fn step_over_unreturned(
        &self,
        consumer: &BaseConsumer,
        returned: &mut HashMap<(String, i32), i64>,
    ) -> bool {
        let Ok(read) = consumer.position() else {
            return true;
        };
        for e in read.elements() {
            let Offset::Offset(read_to) = e.offset() else {
                continue;
            };
            let key = (e.topic().to_string(), e.partition());
            let Some(&last) = returned.get(&key) else {
                continue;
            };
            if read_to <= last {
                continue;
            }
            let _order = self.tasks.order.lock().expect("order lock");
            let (task, role) = {
                let mut positions = self.tasks.positions.lock().expect("positions lock");
                let Some((task, role)) = self.tasks.reading(&key.0, key.1) else {
                    continue;
                };
                let at = positions.entry(key.clone()).or_insert(0);
                if *at != last {
                    continue;
                }
                *at = read_to;
                (task, role)
            };
            // An empty batch: the task's log end moves, and its checkpoint with it.
            if !self.shards.deliver(
                task,
                Vec::new(),
                false,
                read_to as u64,
                None,
                Box::new(|_| {}),
            ) {
                return false;
            }
            role.delivered.fetch_max(read_to, Ordering::AcqRel);
            // The task is where the consumer is: the next marker steps it again.
            returned.insert(key, read_to);
        }
        true
    }

    /// Hands each partition's new records to its task's shard, in offset order; the
    /// task answers the events that ask for it once it applied them, if it is active.
    /// With `at_ack` (records Kafka just acknowledged to this node's producer) a record
    /// is handed over only if it is next at its position, and else left to the consumer,
    /// which reads the records before it first (woken, if it pauses). Returns how many
    /// records were skipped as already applied, or `None` once the shards are gone.
    pub(super) fn records(
        &self,
        records: Vec<rdkafka::message::OwnedMessage>,
        at_ack: bool,
    ) -> Option<usize> {
        let mut skipped = 0;
        let mut by_partition: BTreeMap<(String, i32), Vec<rdkafka::message::OwnedMessage>> =
            BTreeMap::new();
        for m in records {
            by_partition
                .entry((m.topic().to_string(), m.partition()))
                .or_default()
                .push(m);
        }
        let _order = self.tasks.order.lock().expect("order lock");
        for ((topic, partition), msgs) in by_partition {
            let mut rows = Vec::with_capacity(msgs.len());
            let mut asks = Vec::new();
            let (task, end, role) = {
                let mut positions = self.tasks.positions.lock().expect("positions lock");
                let Some((task, role)) = self.tasks.reading(&topic, partition) else {
                    continue;
                };
                let key = (topic.clone(), partition);
                let next = match positions.get_mut(&key) {
                    Some(next) => next,
                    // At an acknowledgement, a task with no position yet is left to the
                    // consumer.
                    None if at_ack => {
                        self.tasks.quiet.wake();
                        continue;
                    }
                    None => positions.entry(key).or_insert(0),
                };
                for m in &msgs {
                    if at_ack && m.offset() != *next {
                        if m.offset() > *next {
                            self.tasks.quiet.wake();
                        }
                        continue;
                    }
                    if m.offset() < *next {
                        self.stats.skipped.fetch_add(1, Ordering::Relaxed);
                        skipped += 1;
                        continue;
                    }
                    *next = m.offset() + 1;
                    let format = format_of(m);
                    if let Err(why) = crate::format::check(format, "an event") {
                        tracing::error!(
                            "kafka: {topic}/{partition}@{} not applied: {why}",
                            m.offset()
                        );
                        continue;
                    }
                    let Some(events) = m.payload().and_then(|p| events_of(p, format)) else {
                        tracing::warn!(
                            "kafka: an unreadable event at {topic}/{partition}@{}",
                            m.offset()
                        );
                        continue;
                    };
                    // A record older than any asker waits (a replay) is not answered.
                    if let Some(reply) = reply_to(m).filter(|_| recent(m)) {
                        asks.extend((0..events.len()).map(|n| (rows.len() + n, reply.nth(n))));
                    }
                    rows.extend(events);
                }
                (task, *next, role)
            };
            if rows.is_empty() {
                role.delivered.fetch_max(end, Ordering::AcqRel);
                continue;
            }
            let count = if at_ack {
                &self.stats.applied_at_ack
            } else {
                &self.stats.consumed
            };
            count.fetch_add(rows.len() as u64, Ordering::Relaxed);
            let values = asks.iter().any(|(_, r)| r.values);
            let reply: Reply = if asks.is_empty() {
                Box::new(|_| {})
            } else {
                let answerer = self.answerer.clone();
                let (role, fence) = (role.clone(), self.fence.clone());
                Box::new(move |result| {
                    role.answer(asks, result, &fence, |(_, asks, result)| {
                        answerer.send(fence.generation(), asks, result)
                    })
                })
            };
            if !self
                .shards
                .deliver(task, rows, values, end as u64, None, reply)
            {
                return None;
            }
            role.delivered.fetch_max(end, Ordering::AcqRel);
        }
        Some(skipped)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use eddy_planner::types::Value;

    /// From format 3 a record holds one event or many, one after another; before, a
    /// record is exactly one event (bytes after it make it unreadable).
    #[test]
    fn a_packed_record_holds_its_events_in_order() {
        let rows: Vec<Vec<Value>> = (0..3)
            .map(|i| vec![Value::Int(i), Value::Text(format!("c{i}").into())])
            .collect();
        let mut packed = Vec::new();
        for r in &rows {
            codec::encode_row(r, &mut packed);
        }
        let read = events_of(&packed, crate::format::PACKED).expect("three events");
        let read: Vec<Vec<Value>> = read.iter().map(|r| r.to_vec()).collect();
        assert_eq!(read, rows);
        assert!(events_of(&packed, crate::format::PACKED - 1).is_none());
        let mut one = Vec::new();
        codec::encode_row(&rows[0], &mut one);
        for format in [1, crate::format::PACKED] {
            assert_eq!(events_of(&one, format).map(|r| r.len()), Some(1));
        }
        assert!(events_of(&packed[..packed.len() - 1], crate::format::PACKED).is_none());
        assert!(events_of(&[], crate::format::PACKED).is_none());
    }
}
