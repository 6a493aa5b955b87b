//! Leases: when a node may answer for a task (issue 57). Pure bookkeeping; the Kafka
//! membership thread feeds it and `log::kafka::fence` holds its result for the hot path.
//!
//! The design:
//! - **Beats.** Every node writes a beat (`beat/<node>`: a sequence number and the
//!   generation of the plan it applies) to the cluster topic, the one partition the plans
//!   are on, every `beat_every`. A plan's generation is its record's offset there, so it is
//!   unique and grows in the order every node reads plans.
//! - **A node's own lease.** When a node reads its own beat back, it has read every plan
//!   written before that beat, so its roles were current when the beat was sent. Its lease
//!   then lasts until the beat's send time plus the session timeout, less a margin, on its
//!   monotonic clock (which keeps running while the process is stopped).
//! - **Taking a task over.** A node made active for a task by a plan answers for it only
//!   once every other node a plan made active for it is known not to answer any more:
//!   its newest beat says it applies a plan that does not make it active, or its lease
//!   from its last beat has surely run out. By this node's clock that is one session
//!   timeout after it read that beat. By the broker's append times it is a lease (and a
//!   margin) after that beat, once this node has read back a beat of its own appended
//!   that much later: the topic is one ordered partition, so it has then read every
//!   later beat the other node could hold a lease from.
//! - **Silent nodes.** The same reasoning tells the leader that a node still listed in
//!   the group answers for nothing any more: its beats stopped a lease ago, by the
//!   broker's clock, while this node kept reading its own back. The leader plans without
//!   it then, before the group's session timeout ends, so a dead or paused node's tasks
//!   move within a lease (`View::alive`).
//!
//! Invariant: a node answers for a task only while it holds a lease from a beat read back
//! after the newest plan that made another node active for it, so no two nodes answer
//! for one task at one time.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use super::ClusterPlan;
use crate::route::TaskId;

/// A node's beat on the cluster topic.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Beat {
    /// Drawn at random when the process starts: a later (or earlier) process under the
    /// same node id never takes this one's beats for its own.
    #[serde(default)]
    pub life: u64,
    pub seq: u64,
    /// The generation of the plan the node applied when it sent the beat.
    pub plan: u64,
}

/// The last beat read from a node.
#[derive(Clone, Copy, Debug)]
struct Seen {
    /// When this node read it.
    read: Instant,
    /// The broker's append time (ms), if the topic records it.
    broker_ms: Option<i64>,
    plan: u64,
}

/// How long a lease lasts past its beat's send time: the session timeout less a fifth.
pub fn lease_for(session: Duration) -> Duration {
    session - session / 5
}

/// Added to a lease measured on the broker's clock, for the drift between its clock and
/// the nodes' monotonic ones, and for an answer a node began just before its lease ended.
const BROKER_MARGIN_MS: i64 = 200;

/// What a node knows of the others' beats and of which plans made whom active.
#[derive(Debug)]
pub struct Handover {
    session: Duration,
    beats: HashMap<String, Seen>,
    /// Per task, per node: the generation of the newest plan that made it active.
    actives: HashMap<TaskId, BTreeMap<String, u64>>,
    /// The broker's append time of this node's newest beat read back.
    own_broker_ms: Option<i64>,
    /// Since when (broker's time) this node has read its own beats back without a gap
    /// longer than `gap`: it has watched the others' beats for that long.
    own_since_ms: Option<i64>,
    gap: Duration,
}

impl Handover {
    /// The bookkeeping of a node whose session timeout is `session`, and which counts
    /// its own beats as interrupted after `gap` without one.
    pub fn new(session: Duration, gap: Duration) -> Handover {
        Handover {
            session,
            beats: HashMap::new(),
            actives: HashMap::new(),
            own_broker_ms: None,
            own_since_ms: None,
            gap,
        }
    }

    /// The span of a lease on the broker's clock, margin included (ms).
    fn lease_ms(&self) -> i64 {
        lease_for(self.session).as_millis() as i64 + BROKER_MARGIN_MS
    }

    /// Another node's beat, read now.
    pub fn beat(&mut self, node: &str, beat: Beat, broker_ms: Option<i64>, now: Instant) {
        self.beats.insert(
            node.to_string(),
            Seen {
                read: now,
                broker_ms,
                plan: beat.plan,
            },
        );
    }

    /// This node's own beat, read back.
    pub fn own_beat(&mut self, broker_ms: Option<i64>) {
        let Some(now) = broker_ms else {
            return;
        };
        let gap = self.gap.as_millis() as i64;
        match (self.own_broker_ms, self.own_since_ms) {
            (Some(last), Some(_)) if now - last <= gap => {}
            _ => self.own_since_ms = Some(now),
        }
        self.own_broker_ms = Some(now);
    }

    /// Whether `node` surely answers for nothing any more, though it may still be listed
    /// in the group: its last beat is a lease older than one of this node's own, read
    /// back after this node had watched the topic for a lease without a gap. A node never
    /// heard from is not silent: the group's word stands for it.
    pub fn silent(&self, node: &str) -> bool {
        let (Some(own), Some(since)) = (self.own_broker_ms, self.own_since_ms) else {
            return false;
        };
        let Some(its) = self.beats.get(node).and_then(|seen| seen.broker_ms) else {
            return false;
        };
        own - its > self.lease_ms() && own - since > self.lease_ms()
    }

    /// A plan read, with its generation.
    pub fn plan(&mut self, generation: u64, plan: &ClusterPlan) {
        for (task, placement) in &plan.tasks {
            self.actives
                .entry(task.clone())
                .or_default()
                .insert(placement.active.clone(), generation);
        }
    }

    /// Whether `me`, active for `task` under the plan of `generation`, may answer for it:
    /// no other node a plan made active for it can still answer, as far as it knows. (It
    /// then catches up with its partition's end before it serves reads: an earlier owner,
    /// perhaps an earlier process of this node, may have answered for records up to it.)
    pub fn takeover(&self, me: &str, task: &TaskId, generation: u64, now: Instant) -> bool {
        let Some(actives) = self.actives.get(task) else {
            return true;
        };
        self.clear(me, actives, generation, now)
    }

    fn clear(
        &self,
        me: &str,
        actives: &BTreeMap<String, u64>,
        generation: u64,
        now: Instant,
    ) -> bool {
        actives
            .iter()
            .filter(|(node, _)| *node != me)
            .all(|(node, &made)| match self.beats.get(node) {
                // A node that never beat never held a lease.
                None => true,
                Some(seen) => {
                    // Every plan it can hold (its beat's or later) leaves it inactive.
                    made < seen.plan
                        || seen.plan >= generation
                        // Its lease from that beat is over, by this node's clock...
                        || now >= seen.read + self.session
                        // ...or by the broker's.
                        || matches!((self.own_broker_ms, seen.broker_ms),
                            (Some(own), Some(its)) if own - its > self.lease_ms())
                }
            })
    }
}

/// This node's own beats: when each was sent, until it is read back.
#[derive(Debug)]
pub struct Beats {
    life: u64,
    next: u64,
    sent: std::collections::VecDeque<(u64, Instant)>,
}

/// Beats remembered while not read back.
const SENT_MAX: usize = 1024;

impl Beats {
    /// The beats of a process whose life is `life` (a random number).
    pub fn new(life: u64) -> Beats {
        Beats {
            life,
            next: 0,
            sent: Default::default(),
        }
    }

    /// The next beat, sent at `now`, under plan `plan`.
    pub fn send(&mut self, plan: u64, now: Instant) -> Beat {
        self.next += 1;
        self.sent.push_back((self.next, now));
        if self.sent.len() > SENT_MAX {
            self.sent.pop_front();
        }
        Beat {
            life: self.life,
            seq: self.next,
            plan,
        }
    }

    /// A beat of this node read back: when it was sent (`None`: one of another life of
    /// this node id, or forgotten).
    pub fn read_back(&mut self, beat: &Beat) -> Option<Instant> {
        if beat.life != self.life {
            return None;
        }
        let seq = beat.seq;
        while let Some(&(s, at)) = self.sent.front() {
            if s > seq {
                break;
            }
            self.sent.pop_front();
            if s == seq {
                return Some(at);
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::assign::Placement;

    fn task() -> TaskId {
        TaskId {
            stream: "s".into(),
            partitioner: 0,
            partition: 0,
        }
    }

    fn plan(active: &str) -> ClusterPlan {
        ClusterPlan {
            tasks: vec![(
                task(),
                Placement {
                    active: active.into(),
                    replicas: vec![],
                },
            )],
            ..ClusterPlan::default()
        }
    }

    fn beat(seq: u64, plan: u64) -> Beat {
        Beat { life: 1, seq, plan }
    }

    const GAP: Duration = Duration::from_millis(750);

    #[test]
    fn a_takeover_waits_for_the_old_owner_to_apply_the_plan_or_its_lease_to_end() {
        let s = Duration::from_secs(6);
        let t0 = Instant::now();
        let mut h = Handover::new(s, GAP);
        h.plan(10, &plan("a"));
        h.beat("a", beat(1, 10), Some(1_000), t0);
        h.plan(20, &plan("b"));
        // "a" may still answer under plan 10.
        assert!(!h.takeover("b", &task(), 20, t0 + Duration::from_secs(1)));
        // Its lease from the beat read at t0 ends within a session timeout.
        assert!(h.takeover("b", &task(), 20, t0 + s));
        // Or "a" says it applies plan 20.
        h.beat("a", beat(2, 20), Some(2_000), t0);
        assert!(h.takeover("b", &task(), 20, t0));
    }

    #[test]
    fn the_brokers_clock_ends_an_old_lease_read_late() {
        let s = Duration::from_secs(6);
        let now = Instant::now();
        let mut h = Handover::new(s, GAP);
        h.plan(10, &plan("a"));
        // Read just now, while catching up, but appended long ago.
        h.beat("a", beat(1, 10), Some(1_000), now);
        h.plan(20, &plan("b"));
        assert!(!h.takeover("b", &task(), 20, now));
        // A lease (4.8 s) and the margin after its beat, a beat of this node's own was
        // appended and read back: every later beat of "a" was read before it.
        h.own_beat(Some(1_000 + 5_000));
        assert!(!h.takeover("b", &task(), 20, now));
        h.own_beat(Some(1_000 + 5_001));
        assert!(h.takeover("b", &task(), 20, now));
    }

    #[test]
    fn a_node_is_silent_once_its_beats_stop_for_a_lease_while_ours_come_back() {
        let s = Duration::from_secs(6);
        let now = Instant::now();
        let mut h = Handover::new(s, GAP);
        // Never heard from: the group's word stands.
        assert!(!h.silent("a"));
        h.beat("a", beat(1, 10), Some(1_000), now);
        let mut own = 500;
        while own <= 1_000 + 5_000 {
            h.own_beat(Some(own));
            own += 500;
        }
        assert!(!h.silent("a"), "a lease and its margin have not passed");
        h.own_beat(Some(own));
        assert!(h.silent("a"));
        // A beat of "a" read later makes it heard again.
        h.beat("a", beat(2, 10), Some(own - 10), now);
        assert!(!h.silent("a"));
    }

    #[test]
    fn after_a_gap_in_its_own_beats_a_node_watches_a_lease_before_it_calls_others_silent() {
        let s = Duration::from_secs(6);
        let now = Instant::now();
        let mut h = Handover::new(s, GAP);
        h.beat("a", beat(1, 10), Some(1_000), now);
        h.own_beat(Some(1_000));
        // The broker was away for 9 s: "a" may not have reached it again yet either.
        h.own_beat(Some(10_000));
        assert!(!h.silent("a"));
        let mut own = 10_000;
        while own <= 10_000 + 5_000 {
            h.own_beat(Some(own));
            own += 500;
        }
        assert!(!h.silent("a"));
        h.own_beat(Some(own));
        assert!(h.silent("a"));
    }

    #[test]
    fn a_node_whose_beat_follows_every_plan_that_made_it_active_is_no_threat() {
        let now = Instant::now();
        let mut h = Handover::new(Duration::from_secs(6), GAP);
        h.plan(10, &plan("a"));
        h.plan(20, &plan("b"));
        h.beat("a", beat(5, 20), None, now);
        h.plan(30, &plan("c"));
        // "a" applied plan 20, after the last plan that made it active; "b" never beat.
        assert!(h.takeover("c", &task(), 30, now));
        h.beat("b", beat(1, 20), None, now);
        assert!(!h.takeover("c", &task(), 30, now));
    }

    #[test]
    fn own_beats_give_their_send_times_back() {
        let t0 = Instant::now();
        let mut b = Beats::new(7);
        let one = b.send(1, t0);
        let two = b.send(1, t0 + Duration::from_millis(5));
        let other_life = Beat { life: 8, ..two };
        assert_eq!(b.read_back(&other_life), None);
        assert_eq!(b.read_back(&one), Some(t0));
        assert_eq!(b.read_back(&one), None);
        assert_eq!(b.read_back(&two), Some(t0 + Duration::from_millis(5)));
        assert_eq!(b.read_back(&Beat { seq: 99, ..two }), None);
    }
}
