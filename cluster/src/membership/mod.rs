//! Who is in the cluster and which node runs each task (seed 002 §3.2–3.3): the facts
//! each node announces, the plan the leader publishes, and what a node reads from them.
//! This part is pure; `log::kafka::members` carries it over Kafka.
//!
//! The design:
//! - **Liveness** is the Kafka group protocol, sped up by beats. Every node is a member of
//!   the consumer group `<cluster>-members`. A node that dies leaves it when its session
//!   times out (`--session-timeout`, 6 s by default), and one that stops cleanly leaves
//!   at once. A member whose beats stopped a lease ago (`lease::Handover::silent`) counts
//!   as gone before that: it can no longer answer for any task.
//! - **Facts and plans** are records of one compacted topic, `<cluster>-cluster`, which
//!   every node reads from its beginning. `member/<node>` holds a node's host, processors,
//!   addresses and the tasks it has a checkpoint of. `plan` holds the current plan.
//! - **The leader** is the live member with the smallest node id, as the group describes
//!   itself once stable. Only the leader runs the assignor, when the live members, their
//!   facts or the catalog's tasks change, and it publishes the plan with the next epoch.
//! - **Applying a plan.** Every node applies the newest plan it has read. It consumes the
//!   partitions of the tasks the plan gives it (active or replica, by manual assignment,
//!   from each task's own position), and it answers only for the tasks it holds active.
//!
//! Invariant: a node's roles come only from the newest plan record it read. If two nodes
//! lead for a moment, both publish, and the later record wins on every node.

pub mod lease;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::assign::{assign, Facts, Held, Member, Placement};
use crate::route::TaskId;

/// What a node announces about itself when it starts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeFacts {
    pub node: String,
    /// The physical machine: no two copies of a task share one.
    pub host: String,
    pub processors: u32,
    /// Where clients reach it (PostgreSQL protocol).
    pub pg_addr: String,
    /// Where peers reach it (gRPC).
    pub peer_addr: String,
    /// Tasks it has a checkpoint of: the assignor prefers it for them.
    pub stale: Vec<TaskId>,
    /// Set by a node stopping with SIGTERM: plans give it nothing, so its tasks move to
    /// their replicas before it leaves.
    #[serde(default)]
    pub leaving: bool,
    /// The highest format it reads (`crate::format`); a node from before format versions
    /// announces none: format 1.
    #[serde(default = "crate::format::oldest")]
    pub format: u32,
}

/// The leader's plan: where each task's active copy and replicas run.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterPlan {
    /// One more than the plan it replaced.
    pub epoch: u64,
    pub leader: String,
    /// The live members it was made for, sorted.
    pub members: Vec<String>,
    pub tasks: Vec<(TaskId, Placement)>,
}

impl ClusterPlan {
    pub fn placement(&self, task: &TaskId) -> Option<&Placement> {
        self.tasks
            .binary_search_by(|(t, _)| t.cmp(task))
            .ok()
            .map(|i| &self.tasks[i].1)
    }

    /// The tasks `node` holds, each with whether it is the active copy.
    pub fn roles_of(&self, node: &str) -> BTreeMap<TaskId, bool> {
        self.tasks
            .iter()
            .filter_map(|(t, p)| {
                if p.active == node {
                    Some((t.clone(), true))
                } else {
                    p.replicas
                        .iter()
                        .any(|r| r == node)
                        .then(|| (t.clone(), false))
                }
            })
            .collect()
    }

    /// Whether the plan counts `node` in and places exactly `tasks` (in task order), so
    /// no plan made for another catalog is still on its way.
    pub fn covers<'a>(&self, node: &str, tasks: impl Iterator<Item = &'a TaskId>) -> bool {
        self.members.iter().any(|m| m == node) && self.tasks.iter().map(|(t, _)| t).eq(tasks)
    }
}

/// What a node knows of the cluster.
#[derive(Clone, Debug, Default)]
pub struct View {
    /// Every node's latest facts, live or not.
    pub facts: BTreeMap<String, NodeFacts>,
    /// The live members, as the group last described itself when stable, less those
    /// whose beats stopped a lease ago; sorted.
    pub alive: Vec<String>,
    /// The newest plan read.
    pub plan: Arc<ClusterPlan>,
    /// Its generation: the offset of its record on the cluster topic (`lease`).
    pub generation: u64,
    /// Per task, the generation of the plan that made its active copy active where it
    /// is: the first plan read, 0 (its history is unknown). A reply answered under an
    /// older plan is refused (`log::kafka::produce::deliver_reply`).
    pub moved: BTreeMap<TaskId, u64>,
    /// The tasks of this node's catalog.
    pub tasks: BTreeSet<TaskId>,
}

impl View {
    /// Takes the plan of record `generation` as the newest, and notes where it moved a
    /// task's active copy (`moved`).
    pub fn take_plan(&mut self, generation: u64, plan: Arc<ClusterPlan>) {
        let first = self.plan.epoch == 0;
        for (task, placement) in &plan.tasks {
            let before = self.plan.placement(task).map(|p| p.active.as_str());
            if first {
                self.moved.insert(task.clone(), 0);
            } else if before != Some(placement.active.as_str()) {
                self.moved.insert(task.clone(), generation);
            }
        }
        self.moved.retain(|task, _| plan.placement(task).is_some());
        self.plan = plan;
        self.generation = generation;
    }

    /// The format a node that reads up to `own` writes: the lowest any live member reads.
    /// A member whose facts are not read yet, or no members known yet, count as the
    /// oldest format.
    pub fn format(&self, own: u32) -> u32 {
        if self.alive.is_empty() {
            return crate::format::OLDEST;
        }
        self.alive
            .iter()
            .map(|m| {
                self.facts
                    .get(m)
                    .map_or(crate::format::OLDEST, |f| f.format)
            })
            .fold(own, u32::min)
    }

    /// The node that computes plans: the live member with the smallest id.
    pub fn leader(&self) -> Option<&str> {
        self.alive.first().map(String::as_str)
    }

    /// The assignor's facts: live members, this node's tasks, and who holds each task by
    /// the current plan (live members only) or has a checkpoint of it.
    pub fn assignor_facts(&self, replicas: usize) -> Option<Facts> {
        let mut members = Vec::with_capacity(self.alive.len());
        for id in &self.alive {
            let f = self.facts.get(id)?;
            if f.leaving {
                continue;
            }
            members.push(Member {
                id: id.clone(),
                host: f.host.clone(),
                processors: f.processors,
            });
        }
        let live = |m: &String| {
            self.alive.binary_search(m).is_ok() && !self.facts.get(m).is_some_and(|f| f.leaving)
        };
        let mut held: BTreeMap<TaskId, Held> = BTreeMap::new();
        for (t, p) in &self.plan.tasks {
            held.insert(
                t.clone(),
                Held {
                    active: Some(p.active.clone()).filter(live),
                    replicas: p.replicas.iter().filter(|r| live(r)).cloned().collect(),
                    stale: Vec::new(),
                },
            );
        }
        for id in self.alive.iter().filter(|id| live(id)) {
            for t in &self.facts[id].stale {
                let h = held.entry(t.clone()).or_default();
                if h.active.as_ref() != Some(id) && !h.replicas.contains(id) {
                    h.stale.push(id.clone());
                }
            }
        }
        Some(Facts {
            members,
            tasks: self.tasks.iter().cloned().collect(),
            replicas,
            held,
        })
    }

    /// The plan `me` publishes, when it leads, knows every live member's facts, and the
    /// current plan no longer fits (members or placements changed).
    pub fn next_plan(&self, me: &str, replicas: usize) -> Option<ClusterPlan> {
        if self.leader() != Some(me) {
            return None;
        }
        let facts = self.assignor_facts(replicas)?;
        let tasks: Vec<(TaskId, Placement)> = assign(&facts).tasks.into_iter().collect();
        if tasks == self.plan.tasks && self.alive == self.plan.members {
            return None;
        }
        Some(ClusterPlan {
            epoch: self.plan.epoch + 1,
            leader: me.to_string(),
            members: self.alive.clone(),
            tasks,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(p: u32) -> TaskId {
        TaskId {
            stream: "s".into(),
            partitioner: 0,
            partition: p,
        }
    }

    fn facts(node: &str, host: &str, stale: Vec<TaskId>) -> NodeFacts {
        NodeFacts {
            node: node.into(),
            host: host.into(),
            processors: 2,
            pg_addr: String::new(),
            peer_addr: String::new(),
            stale,
            leaving: false,
            format: crate::format::FORMAT,
        }
    }

    fn view(alive: &[&str], tasks: u32) -> View {
        View {
            facts: alive
                .iter()
                .map(|n| (n.to_string(), facts(n, &format!("h-{n}"), Vec::new())))
                .collect(),
            alive: alive.iter().map(|s| s.to_string()).collect(),
            plan: Arc::default(),
            generation: 0,
            moved: BTreeMap::new(),
            tasks: (0..tasks).map(task).collect(),
        }
    }

    #[test]
    fn only_the_smallest_live_member_plans() {
        let v = view(&["a", "b", "c"], 6);
        assert!(v.next_plan("b", 2).is_none());
        let plan = v.next_plan("a", 2).expect("the leader plans");
        assert_eq!(plan.epoch, 1);
        assert_eq!(plan.members, ["a", "b", "c"]);
        assert_eq!(plan.tasks.len(), 6);
        for (_, p) in &plan.tasks {
            assert_eq!(p.replicas.len(), 1);
            assert_ne!(p.active, p.replicas[0]);
        }
    }

    #[test]
    fn the_cluster_writes_the_lowest_format_its_live_members_read() {
        let mut v = view(&["a", "b", "c"], 2);
        let newest = crate::format::FORMAT;
        assert_eq!(v.format(newest), newest);
        v.facts.get_mut("b").unwrap().format = 1;
        assert_eq!(v.format(newest), 1, "b reads format 1 only");
        v.alive.retain(|m| m != "b");
        assert_eq!(v.format(newest), newest, "b left");
        v.alive.push("d".into());
        assert_eq!(v.format(newest), 1, "d's facts are not read yet");
        assert_eq!(View::default().format(newest), 1, "no members known yet");
        let old: NodeFacts = serde_json::from_str(
            r#"{"node":"x","host":"h","processors":2,"pg_addr":"","peer_addr":"","stale":[]}"#,
        )
        .unwrap();
        assert_eq!(old.format, 1, "facts from before format versions");
    }

    #[test]
    fn a_plan_that_still_fits_is_not_published_again() {
        let mut v = view(&["a", "b"], 4);
        v.plan = Arc::new(v.next_plan("a", 2).unwrap());
        assert!(v.next_plan("a", 2).is_none());
    }

    #[test]
    fn a_dead_members_tasks_go_to_their_replicas() {
        let mut v = view(&["a", "b", "c"], 6);
        let before = v.next_plan("a", 2).unwrap();
        v.plan = Arc::new(before.clone());
        v.alive = vec!["a".into(), "c".into()];
        let after = v.next_plan("a", 2).unwrap();
        assert_eq!(after.epoch, 2);
        for ((t, old), (t2, new)) in before.tasks.iter().zip(&after.tasks) {
            assert_eq!(t, t2);
            if old.active == "b" {
                assert_eq!(new.active, old.replicas[0], "{t:?}: the replica takes over");
            } else {
                assert_eq!(new.active, old.active, "{t:?}: a live active copy stays");
            }
            assert!(new.copies().all(|m| m != "b"));
        }
    }

    #[test]
    fn a_leaving_member_hands_its_tasks_to_their_replicas() {
        let mut v = view(&["a", "b", "c"], 6);
        let before = v.next_plan("a", 2).unwrap();
        v.plan = Arc::new(before.clone());
        // The leader itself leaves: it still plans, for the others.
        v.facts.get_mut("a").unwrap().leaving = true;
        let after = v.next_plan("a", 2).unwrap();
        for ((t, old), (_, new)) in before.tasks.iter().zip(&after.tasks) {
            assert!(new.copies().all(|m| m != "a"), "{t:?}: {new:?}");
            if old.active == "a" {
                assert_eq!(new.active, old.replicas[0], "{t:?}: the replica takes over");
            }
        }
        assert!(after.roles_of("a").is_empty());
    }

    #[test]
    fn the_leader_waits_for_every_members_facts() {
        let mut v = view(&["a", "b"], 2);
        v.facts.remove("b");
        assert!(v.next_plan("a", 2).is_none());
    }

    #[test]
    fn stale_checkpoints_are_preferred_for_new_copies() {
        let mut v = view(&["a", "b", "c"], 1);
        v.facts.get_mut("c").unwrap().stale = vec![task(0)];
        let plan = v.next_plan("a", 1).unwrap();
        assert_eq!(plan.tasks[0].1.active, "c");
    }

    #[test]
    fn a_task_is_moved_by_the_plan_that_changes_its_active_copy() {
        let v = view(&["a", "b"], 2);
        let first = v.next_plan("a", 2).unwrap();
        let mut seen = View::default();
        // Nothing is known of the history before the first plan read.
        seen.take_plan(5, Arc::new(first.clone()));
        assert!(seen.moved.values().all(|g| *g == 0));
        // The same placements again move nothing.
        seen.take_plan(9, Arc::new(first.clone()));
        assert!(seen.moved.values().all(|g| *g == 0));
        let mut next = first.clone();
        next.epoch += 1;
        let swapped = &mut next.tasks[1].1;
        let old = swapped.active.clone();
        swapped.active = swapped.replicas[0].clone();
        swapped.replicas[0] = old;
        seen.take_plan(12, Arc::new(next.clone()));
        assert_eq!(seen.moved[&next.tasks[1].0], 12);
        assert_eq!(seen.moved[&next.tasks[0].0], 0);
        // A task no plan holds any more is forgotten.
        next.tasks.truncate(1);
        seen.take_plan(15, Arc::new(next));
        assert_eq!(seen.moved.len(), 1);
        assert_eq!(seen.generation, 15);
    }

    #[test]
    fn plans_travel_as_json() {
        let v = view(&["a", "b"], 3);
        let plan = v.next_plan("a", 2).unwrap();
        let text = serde_json::to_string(&plan).unwrap();
        assert_eq!(serde_json::from_str::<ClusterPlan>(&text).unwrap(), plan);
        let roles = plan.roles_of("a");
        assert_eq!(roles.len(), 3);
        assert!(plan.covers("b", v.tasks.iter()));
        assert!(!plan.covers("z", v.tasks.iter()));
        assert!(!plan.covers("b", v.tasks.iter().take(2)));
    }
}
