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
//!   from its last beat written before the plan has surely run out (one session timeout
//!   after this node read that beat, or after it by the broker's append times).
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

/// What a node knows of the others' beats and of which plans made whom active.
#[derive(Debug)]
pub struct Handover {
    session: Duration,
    beats: HashMap<String, Seen>,
    /// Per task, per node: the generation of the newest plan that made it active.
    actives: HashMap<TaskId, BTreeMap<String, u64>>,
    /// The broker's append time of this node's newest beat read back.
    own_broker_ms: Option<i64>,
}

impl Handover {
    pub fn new(session: Duration) -> Handover {
        Handover {
            session,
            beats: HashMap::new(),
            actives: HashMap::new(),
            own_broker_ms: None,
        }
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
        if broker_ms.is_some() {
            self.own_broker_ms = broker_ms;
        }
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
                            (Some(own), Some(its)) if own - its > self.session.as_millis() as i64)
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

    #[test]
    fn a_takeover_waits_for_the_old_owner_to_apply_the_plan_or_its_lease_to_end() {
        let s = Duration::from_secs(6);
        let t0 = Instant::now();
        let mut h = Handover::new(s);
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
        let mut h = Handover::new(s);
        h.plan(10, &plan("a"));
        // Read just now, while catching up, but appended long ago.
        h.beat("a", beat(1, 10), Some(1_000), now);
        h.plan(20, &plan("b"));
        assert!(!h.takeover("b", &task(), 20, now));
        h.own_beat(Some(1_000 + 6_001));
        assert!(h.takeover("b", &task(), 20, now));
    }

    #[test]
    fn a_node_whose_beat_follows_every_plan_that_made_it_active_is_no_threat() {
        let now = Instant::now();
        let mut h = Handover::new(Duration::from_secs(6));
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
