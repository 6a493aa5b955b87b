//! Membership over Kafka (the design is in `membership`): the group member that proves
//! this node alive, the reader of the cluster topic (facts and plans) and of the catalog
//! topic's changes, and, while this node leads, the plans it publishes.
//!
//! It also beats: every `beat_every` it writes `beat/<node>` to the cluster topic, and
//! the beats it reads back renew its lease (`fence`), while the others' beats tell it
//! when a task it was made active for is no longer answered elsewhere
//! (`membership::lease`).
//!
//! Invariant: a plan takes effect on this node only when it is read back from the cluster
//! topic, so the leader and every other node apply plans in one order.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer};
use rdkafka::{Offset, TopicPartitionList};

use eddy_planner::catalog::Catalog;
use eddy_planner::{Error, Result};

use super::catalog::{live_statements, Latest};
use super::config::{kafka_error, wait_until};
use super::polled::Polled;
use super::produce::{format_headers, format_of};
use super::Kafka;
use crate::membership::lease::{lease_for, Beat, Beats, Handover};
use crate::membership::{ClusterPlan, NodeFacts, View};
use crate::node::shards::tasks_of;
use crate::route::TaskId;

/// How often the group is described and, on the leader, the plan checked.
const DESCRIBE_EVERY: Duration = Duration::from_millis(100);
/// A plan published but not read back within this is published again.
const REPUBLISH_AFTER: Duration = Duration::from_secs(5);

/// How often a node beats: a sixteenth of the session timeout, within 50 and 500 ms. (A
/// silent node is known a lease after its last beat, once this node's own next beat is
/// read back: the shorter the beat, the sooner.)
fn beat_every(session: Duration) -> Duration {
    (session / 16).clamp(Duration::from_millis(50), Duration::from_millis(500))
}

/// How long the broker may be silent (no beat read back) before it counts as unreachable.
pub(super) fn silence(session: Duration) -> Duration {
    (session * 3 / 8).max(Duration::from_millis(500))
}

/// This node's membership state, shared with its threads.
#[derive(Default)]
pub(super) struct Members {
    pub(super) view: Arc<RwLock<View>>,
    /// Catalog records read since start: another node's DDL shows up here.
    pub(super) catalog_records: Arc<AtomicU64>,
    /// One past the highest catalog offset read, and one past the highest this node
    /// published: until the first reaches the second, what was read is older than this
    /// node's own DDL, and must not be adopted over it.
    pub(super) catalog_read: AtomicI64,
    pub(super) catalog_published: AtomicI64,
    /// The catalog topic as read so far: its last record per key.
    catalog: Mutex<Latest>,
    /// Whether the membership thread runs.
    pub(super) started: std::sync::atomic::AtomicBool,
    /// What this node announced about itself.
    announced: Mutex<Option<NodeFacts>>,
}

impl Kafka {
    /// What this node knows of the cluster.
    pub fn view(&self) -> View {
        self.members.view.read().expect("view lock").clone()
    }

    /// The live view, for readers that must see each new plan (the peer reads).
    pub fn view_handle(&self) -> Arc<RwLock<View>> {
        self.members.view.clone()
    }

    /// Catalog records read since start; it changes when any node's DDL does.
    pub fn catalog_records(&self) -> u64 {
        self.members.catalog_records.load(Ordering::Acquire)
    }

    /// The catalog's statements as the cluster reader has read its topic so far (as
    /// `read_catalog` returns them, without reading the topic again); `None` while the
    /// reader has yet to read back this node's own last publication (a catalog older
    /// than the node's).
    pub fn followed_catalog(&self) -> Option<Vec<String>> {
        let m = &self.members;
        if m.catalog_read.load(Ordering::Acquire) < m.catalog_published.load(Ordering::Acquire) {
            return None;
        }
        Some(live_statements(&m.catalog.lock().expect("catalog lock")))
    }

    /// The tasks of a new catalog, for the plans this node makes while it leads.
    pub(super) fn set_tasks(&self, catalog: &Catalog) {
        self.members.view.write().expect("view lock").tasks =
            tasks_of(catalog).map(|(_, t)| t).collect();
    }

    /// Returns once the newest plan places this node and exactly the tasks of `catalog`.
    pub(super) async fn await_plan(&self, catalog: &Catalog) -> Result<()> {
        let tasks: std::collections::BTreeSet<TaskId> = tasks_of(catalog).map(|(_, t)| t).collect();
        let me = self.config.node.clone();
        let covered = || {
            Ok(self
                .members
                .view
                .read()
                .expect("view lock")
                .plan
                .covers(&me, tasks.iter()))
        };
        let late = || {
            Error::internal(format!(
                "kafka: no plan of the cluster places this node and the catalog's {} tasks",
                tasks.len()
            ))
        };
        wait_until(60, covered, late).await
    }

    /// Before a clean stop: announces that this node leaves, and waits (at most three
    /// session timeouts) until the plan gives it no task, so its active tasks move to
    /// their replicas while it still answers. Returns how many tasks it handed over.
    pub async fn hand_over(&self) -> Result<usize> {
        let Some(mut facts) = self
            .members
            .announced
            .lock()
            .expect("announced lock")
            .clone()
        else {
            return Ok(0);
        };
        let view = self.view();
        let held = view.plan.roles_of(&self.config.node).len();
        let others = view
            .alive
            .iter()
            .filter(|n| **n != self.config.node)
            .count();
        if held == 0 || others == 0 {
            return Ok(0);
        }
        facts.leaving = true;
        let producer: Polled<DefaultProducerContext> = self
            .config
            .producer()
            .create()
            .map_err(|e| kafka_error("creating the membership producer", e))?;
        let topic = self.config.cluster_topic();
        tokio::task::block_in_place(|| self.announce(&producer, &topic, &facts))?;
        let me = self.config.node.clone();
        let view = self.members.view.clone();
        let done = || {
            let v = view.read().expect("view lock");
            Ok(v.plan.roles_of(&me).is_empty())
        };
        let secs = (self.config.session_timeout.as_secs() * 3).max(10);
        let late = || Error::internal("the cluster did not take over this node's tasks");
        wait_until(secs, done, late).await?;
        Ok(held)
    }

    /// Announces this node on the cluster topic, joins the live-node group and starts the
    /// thread that follows the cluster. `stale`: the tasks it has checkpoints of.
    pub(super) fn start_members(self: &Arc<Self>, stale: Vec<TaskId>) -> Result<()> {
        let topic = self.config.cluster_topic();
        let producer: Polled<DefaultProducerContext> = self
            .config
            .producer()
            .create()
            .map_err(|e| kafka_error("creating the membership producer", e))?;
        let facts = NodeFacts {
            node: self.config.node.clone(),
            host: self.config.host.clone(),
            processors: self.config.processors,
            pg_addr: self.config.pg_addr.clone(),
            peer_addr: self.peer_advertised().to_string(),
            stale,
            leaving: false,
            format: crate::format::own(),
        };
        let tail: BaseConsumer = self
            .config
            .reader(&format!("eddy-cluster-reader.{}", self.config.node))
            .create()
            .map_err(|e| kafka_error("creating the cluster reader", e))?;
        let mut tpl = TopicPartitionList::new();
        for t in [&topic, &self.config.catalog_topic()] {
            tpl.add_partition_offset(t, 0, Offset::Beginning)
                .map_err(|e| kafka_error("reading the cluster topic", e))?;
        }
        tail.assign(&tpl)
            .map_err(|e| kafka_error("reading the cluster topic", e))?;
        // The reader connects and fetches in the background while the announce waits for
        // its acknowledgement, so a restarted node reads its plan sooner: a node restarted
        // on a one-broker cluster listened 0.6-0.7 s after its start, against 1.25-1.3 s
        // with the reader made after the announce (whose flush then took 600 ms, not 100).
        self.announce(&producer, &topic, &facts)?;
        *self.members.announced.lock().expect("announced lock") = Some(facts);
        let group: BaseConsumer = self
            .config
            .liveness()
            .create()
            .map_err(|e| kafka_error("joining the cluster", e))?;
        group
            .subscribe(&[&topic])
            .map_err(|e| kafka_error("joining the cluster", e))?;
        self.members
            .started
            .store(true, std::sync::atomic::Ordering::Release);
        let me = self.clone();
        let thread = std::thread::Builder::new()
            .name("eddy-members".into())
            .spawn(move || me.run_members(group, tail, producer))
            .map_err(|e| Error::internal(format!("could not start a thread: {e}")))?;
        self.threads.lock().expect("threads lock").push(thread);
        Ok(())
    }

    fn run_members(
        self: Arc<Self>,
        group: BaseConsumer,
        tail: BaseConsumer,
        producer: Polled<DefaultProducerContext>,
    ) {
        let (topic, catalog) = (self.config.cluster_topic(), self.config.catalog_topic());
        let session = self.config.session_timeout;
        let mut described = Instant::now() - DESCRIBE_EVERY;
        let mut published: Option<(Instant, ClusterPlan)> = None;
        let life = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64)
            ^ u64::from(std::process::id()).rotate_left(32);
        let mut beats = Beats::new(life);
        let mut handover = Handover::new(session, silence(session));
        let mut beaten = Instant::now() - beat_every(session);
        let beat_key = format!("beat/{}", self.config.node);
        while !self.stop.load(Ordering::Acquire) {
            // Serves the group's rebalances; its records are not needed.
            let _ = group.poll(Duration::ZERO);
            if beaten.elapsed() >= beat_every(session) {
                beaten = Instant::now();
                let beat = beats.send(self.fence.generation(), beaten);
                if let Ok(body) = serde_json::to_vec(&beat) {
                    let _ = producer.send(self.record(&topic, &beat_key, &body));
                }
            }
            let mut wait = Duration::from_millis(20);
            let mut newest = None;
            while let Some(Ok(m)) = tail.poll(wait) {
                wait = Duration::ZERO;
                let format = format_of(&m);
                if let Err(why) = crate::format::check(format, "a record of the cluster") {
                    tracing::error!("kafka: {}@{} not read: {why}", m.topic(), m.offset());
                    continue;
                }
                if m.topic() == catalog {
                    let key = String::from_utf8_lossy(m.key().unwrap_or_default()).into_owned();
                    let sql = m.payload().map(|p| String::from_utf8_lossy(p).into_owned());
                    let mut latest = self.members.catalog.lock().expect("catalog lock");
                    latest.insert(key, (m.offset(), sql));
                    drop(latest);
                    self.members
                        .catalog_read
                        .fetch_max(m.offset() + 1, Ordering::AcqRel);
                    self.members.catalog_records.fetch_add(1, Ordering::AcqRel);
                    continue;
                }
                let (Some(key), Some(body)) = (m.key(), m.payload()) else {
                    continue;
                };
                let broker_ms = match m.timestamp() {
                    rdkafka::Timestamp::LogAppendTime(ms) => Some(ms),
                    _ => None,
                };
                if let Some(node) = key.strip_prefix(b"beat/") {
                    let Ok(beat) = serde_json::from_slice::<Beat>(body) else {
                        continue;
                    };
                    if node == self.config.node.as_bytes() {
                        let Some(sent) = beats.read_back(&beat) else {
                            continue; // an earlier life's
                        };
                        handover.own_beat(broker_ms);
                        if self.fence.renew(sent + lease_for(session)) {
                            self.flush_unsent();
                        }
                    } else {
                        let node = String::from_utf8_lossy(node);
                        handover.beat(&node, beat, broker_ms, Instant::now());
                    }
                    continue;
                }
                if let Some(plan) = self.cluster_record(key, body, m.offset(), &mut handover) {
                    newest = Some(plan);
                }
            }
            // Only the newest of the plans read at once is taken: a node that starts
            // reads the plans of the cluster's whole past, and a task it held in one of
            // them would start recovering under a role it no longer has.
            if let Some(plan) = newest.take() {
                self.apply_plan(&plan);
                // Tell the others at once that this node applies the new plan.
                beaten = Instant::now() - beat_every(session);
            }
            self.open_takeovers(&handover, &tail);
            if described.elapsed() < DESCRIBE_EVERY {
                continue;
            }
            described = Instant::now();
            let Some((stable, mut listed)) = describe(&group, &self.config.members_group()) else {
                continue;
            };
            // A member whose beats stopped a lease ago answers for nothing: plans leave
            // it out before the group's session ends.
            listed.retain(|m| *m == self.config.node || !handover.silent(m));
            let next = {
                let mut view = self.members.view.write().expect("view lock");
                if stable {
                    view.alive = listed;
                } else {
                    // While the group rebalances, only departures count: a member whose
                    // session expired is gone at once, a joining one waits for stability.
                    view.alive.retain(|m| listed.binary_search(m).is_ok());
                }
                self.settle_format(&view);
                view.next_plan(&self.config.node, self.config.replicas)
            };
            let Some(plan) = next else {
                published = None;
                continue;
            };
            let again = published.as_ref().is_some_and(|(at, p)| {
                at.elapsed() < REPUBLISH_AFTER && p.tasks == plan.tasks && p.members == plan.members
            });
            if again {
                continue;
            }
            let Ok(body) = serde_json::to_vec(&plan) else {
                continue;
            };
            match producer.send(self.record(&topic, "plan", &body)) {
                Ok(()) => {
                    let _ = producer.flush(Duration::from_secs(5));
                    published = Some((Instant::now(), plan));
                }
                Err((e, _)) => tracing::warn!("kafka: publishing the plan: {e}"),
            }
        }
        // A last beat tells the others that this node answers for nothing any more, so
        // they take its tasks over without waiting for its lease to run out.
        self.fence.revoke();
        let farewell = Beat {
            life: 0,
            seq: 0,
            plan: u64::MAX,
        };
        if let Ok(body) = serde_json::to_vec(&farewell) {
            let _ = producer.send(self.record(&topic, &beat_key, &body));
            let _ = producer.flush(Duration::from_secs(2));
        }
        // Leaving the group at once, rather than when the session times out, moves this
        // node's tasks to their replicas right away.
        group.unsubscribe();
        drop(group);
    }

    /// A record of the cluster topic, tagged with the format this node writes.
    fn record<'a>(
        &self,
        topic: &'a str,
        key: &'a str,
        body: &'a [u8],
    ) -> BaseRecord<'a, str, [u8]> {
        BaseRecord::to(topic)
            .key(key)
            .payload(body)
            .headers(format_headers(crate::format::writes()))
    }

    /// Publishes a node's facts on the cluster topic and waits until Kafka has them.
    fn announce(
        &self,
        producer: &Polled<DefaultProducerContext>,
        topic: &str,
        facts: &NodeFacts,
    ) -> Result<()> {
        let body = serde_json::to_vec(facts).map_err(|e| Error::internal(e.to_string()))?;
        let key = format!("member/{}", facts.node);
        producer
            .send(self.record(topic, &key, &body))
            .map_err(|(e, _)| kafka_error("announcing the node", e))?;
        producer
            .flush(Duration::from_secs(30))
            .map_err(|e| kafka_error("announcing the node", e))
    }

    /// Keeps the format this node writes in step with the view: the lowest its live
    /// members read (`View::format`).
    fn settle_format(&self, view: &View) {
        let format = view.format(crate::format::own());
        if crate::format::settle(format) {
            tracing::info!("kafka: writing format {format}, the lowest the live members read");
        }
    }

    /// A record of the cluster topic at `offset`: a node's facts, or a plan, which it
    /// returns for the caller to apply.
    fn cluster_record(
        self: &Arc<Self>,
        key: &[u8],
        body: &[u8],
        offset: i64,
        handover: &mut Handover,
    ) -> Option<Arc<ClusterPlan>> {
        if let Some(node) = key.strip_prefix(b"member/") {
            if let Ok(facts) = serde_json::from_slice::<NodeFacts>(body) {
                let node = String::from_utf8_lossy(node).into_owned();
                let mut view = self.members.view.write().expect("view lock");
                view.facts.insert(node, facts);
                self.settle_format(&view);
            }
        } else if key == b"plan" {
            match serde_json::from_slice::<ClusterPlan>(body) {
                Ok(plan) => {
                    let generation = offset.max(0) as u64;
                    handover.plan(generation, &plan);
                    let plan = Arc::new(plan);
                    self.members
                        .view
                        .write()
                        .expect("view lock")
                        .take_plan(generation, plan.clone());
                    self.fence.set_generation(generation);
                    let active = plan
                        .roles_of(&self.config.node)
                        .into_iter()
                        .filter(|(_, active)| *active)
                        .map(|(t, _)| format!("{}/{}", t.stream, t.partition))
                        .collect::<Vec<_>>();
                    tracing::info!(
                        "kafka: plan {generation} (epoch {}, by {}): active here {active:?}",
                        plan.epoch,
                        plan.leader
                    );
                    return Some(plan);
                }
                Err(e) => tracing::warn!("kafka: an unreadable plan: {e}"),
            }
        }
        None
    }

    /// Opens the tasks this node was made active for once no other node answers for
    /// them: each then serves reads once it has applied what its partition held then
    /// (the ends of all of them asked for in one request).
    fn open_takeovers(&self, handover: &Handover, client: &BaseConsumer) {
        let generation = self.fence.generation();
        let now = Instant::now();
        let mut ends = TopicPartitionList::new();
        let mut later = Vec::new();
        for (task, role) in self.waiting_roles() {
            if !handover.takeover(&self.config.node, &task, generation, now) {
                continue;
            }
            let Some(topic) = self.topic_of_task(&task) else {
                continue;
            };
            let partition = task.partition as i32;
            if ends
                .add_partition_offset(&topic, partition, Offset::End)
                .is_ok()
            {
                later.push((topic, partition, role));
            }
        }
        if later.is_empty() || !self.fence.reachable() {
            return;
        }
        // Every answer an earlier owner gave was for a record below these ends.
        let Ok(ends) = client.offsets_for_times(ends, Duration::from_secs(2)) else {
            return;
        };
        for (topic, partition, role) in later {
            let end = ends
                .find_partition(&topic, partition)
                .filter(|e| e.error().is_ok())
                .and_then(|e| match e.offset() {
                    Offset::Offset(end) => Some(end),
                    _ => None,
                });
            if let Some(end) = end {
                tracing::info!(
                    "kafka: {topic}/{partition} taken over under plan {generation}: it answers now, and serves reads from offset {end}"
                );
                self.open_role(&role, end);
            }
        }
    }
}

/// The members of the group (node ids from the `eddy-<node>` client ids, sorted), and
/// whether the group is stable.
fn describe(group: &BaseConsumer, name: &str) -> Option<(bool, Vec<String>)> {
    let list = group
        .fetch_group_list(Some(name), Duration::from_secs(2))
        .ok()?;
    let g = list.groups().iter().find(|g| g.name() == name)?;
    if g.members().is_empty() {
        return None;
    }
    let mut alive: Vec<String> = g
        .members()
        .iter()
        .filter_map(|m| m.client_id().strip_prefix("eddy-").map(str::to_string))
        .collect();
    alive.sort();
    alive.dedup();
    Some((g.state() == "Stable", alive))
}
