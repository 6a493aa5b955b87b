//! The assignor: a pure function from what the cluster knows (its members, its tasks, and
//! who holds or held each task) to a plan: each task's active copy and its replicas.
//!
//! It keeps two invariants, whatever the facts:
//! - no two copies of a task are on one host;
//! - no member holds more than `budget × processors` copies, where the budget per processor
//!   is ⌈tasks × replicas / processors of all members⌉.
//!
//! Each member is held to its fair share, ⌈copies × its processors / all processors⌉,
//! which is within the budget; only where the hosts make that impossible (fewer copies
//! would be placed) does the plan use the whole budget. So a member that joins takes its
//! share, and the plan says which caps it kept (`Plan::caps`).
//!
//! Within them it moves as little as it can. In order:
//! 1. a task's active copy stays where it is, while its member has budget;
//! 2. a replica stays where it is, while its member has budget;
//! 3. a task without an active copy promotes one of its replicas (the least loaded), else
//!    takes a member with a stale copy (the least loaded), else the member with the most
//!    free budget;
//! 4. missing replicas go, one round over all tasks at a time, to members with a stale
//!    copy, then to the members with the most free budget;
//! 5. a replica that still has no place, because every member with room shares a host
//!    with a copy of its task, takes the place of another task's replica on a full member,
//!    and that replica moves to a member with room.
//!
//! A task gets `replicas` copies where the hosts and budgets allow, and fewer otherwise:
//! the shortfall is in `Plan::missing`, never a broken invariant. Ties go to the lower
//! member id, so every node computes the same plan from the same facts.

use std::collections::{BTreeMap, BTreeSet};

use crate::route::TaskId;

/// A node of the cluster, as the group protocol announces it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: String,
    /// The physical machine; copies of one task never share one.
    pub host: String,
    /// Processors the node runs shards on; its budget grows with them.
    pub processors: u32,
}

/// Who held a task before this plan.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    pub active: Option<String>,
    pub replicas: Vec<String>,
    /// Members with an older checkpoint of the task (delta recovery is cheaper there).
    pub stale: Vec<String>,
}

/// What the assignor is given.
#[derive(Clone, Debug, Default)]
pub struct Facts {
    pub members: Vec<Member>,
    pub tasks: Vec<TaskId>,
    /// Copies wanted of each task, the active one included (at least 1).
    pub replicas: usize,
    pub held: BTreeMap<TaskId, Held>,
}

/// Where one task runs.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Placement {
    pub active: String,
    pub replicas: Vec<String>,
}

impl Placement {
    /// Every member holding a copy, the active one first.
    pub fn copies(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.active).chain(&self.replicas)
    }
}

/// The assignor's answer.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Plan {
    pub tasks: BTreeMap<TaskId, Placement>,
    /// Copies that neither hosts nor budgets allowed, by task.
    pub missing: BTreeMap<TaskId, usize>,
    /// The most copies each member could take: its share, or its whole budget.
    pub caps: BTreeMap<String, usize>,
}

impl Plan {
    /// Copies per member.
    pub fn load(&self) -> BTreeMap<&str, usize> {
        let mut load = BTreeMap::new();
        for p in self.tasks.values() {
            for m in p.copies() {
                *load.entry(m.as_str()).or_insert(0) += 1;
            }
        }
        load
    }
}

/// Copies a member may hold: the per-processor budget times its processors.
pub fn budgets(facts: &Facts) -> BTreeMap<&str, usize> {
    let processors: u64 = facts
        .members
        .iter()
        .map(|m| m.processors.max(1) as u64)
        .sum();
    let copies = (facts.tasks.len() * facts.replicas.max(1)) as u64;
    let per_processor = match processors {
        0 => 0,
        p => copies.div_ceil(p),
    };
    facts
        .members
        .iter()
        .map(|m| {
            (
                m.id.as_str(),
                (per_processor * m.processors.max(1) as u64) as usize,
            )
        })
        .collect()
}

/// Each member's fair share of the copies the hosts allow: ⌈copies × its processors /
/// all processors⌉, never above its budget.
pub fn shares(facts: &Facts) -> BTreeMap<&str, usize> {
    let hosts: BTreeSet<&str> = facts.members.iter().map(|m| m.host.as_str()).collect();
    let copies = (facts.tasks.len() * facts.replicas.max(1).min(hosts.len())) as u64;
    let processors: u64 = facts
        .members
        .iter()
        .map(|m| m.processors.max(1) as u64)
        .sum();
    let budget = budgets(facts);
    facts
        .members
        .iter()
        .map(|m| {
            let share = (copies * m.processors.max(1) as u64).div_ceil(processors.max(1));
            (m.id.as_str(), (share as usize).min(budget[m.id.as_str()]))
        })
        .collect()
}

/// Members' loads against their budgets while a plan is built.
struct Ledger<'a> {
    host: BTreeMap<&'a str, &'a str>,
    budget: BTreeMap<&'a str, usize>,
    load: BTreeMap<&'a str, usize>,
}

impl<'a> Ledger<'a> {
    fn has_room(&self, member: &str) -> bool {
        self.load.get(member).copied().unwrap_or(0) < self.budget.get(member).copied().unwrap_or(0)
    }

    /// Whether `member` may take a copy of a task whose copies are on `taken`.
    fn fits(&self, member: &str, taken: &[&'a str]) -> bool {
        self.has_room(member) && self.apart(member, taken)
    }

    /// Whether `member` is on another host than every copy on `taken`.
    fn apart(&self, member: &str, taken: &[&'a str]) -> bool {
        let Some(host) = self.host.get(member) else {
            return false;
        };
        taken
            .iter()
            .all(|other| *other != member && self.host.get(other) != Some(host))
    }

    /// Load over budget, for "least loaded" (compared as fractions), then the id.
    fn least_loaded<'b>(&self, candidates: impl Iterator<Item = &'b str>) -> Option<&'b str> {
        candidates.min_by(|a, b| {
            let (la, ba) = (self.load[a] as u128, self.budget[a].max(1) as u128);
            let (lb, bb) = (self.load[b] as u128, self.budget[b].max(1) as u128);
            (la * bb).cmp(&(lb * ba)).then(a.cmp(b))
        })
    }

    /// The member with the most free budget that fits, ties to the lower id.
    fn most_free(&self, taken: &[&'a str]) -> Option<&'a str> {
        self.most_free_but(taken, &[])
    }

    /// As `most_free`, never one of `not`.
    fn most_free_but(&self, taken: &[&'a str], not: &[String]) -> Option<&'a str> {
        self.budget
            .keys()
            .copied()
            .filter(|m| self.fits(m, taken) && !not.iter().any(|n| n == m))
            .max_by(|a, b| {
                let free = |m: &str| self.budget[m] - self.load[m];
                free(a).cmp(&free(b)).then(b.cmp(a))
            })
    }

    fn take(&mut self, member: &'a str) {
        *self.load.get_mut(member).expect("a member") += 1;
    }
}

/// The plan for `facts`. See the module docs for what it keeps and prefers.
pub fn assign(facts: &Facts) -> Plan {
    let fair = assign_within(facts, shares(facts));
    let short = |p: &Plan| p.missing.values().sum::<usize>();
    if fair.missing.is_empty() {
        return fair;
    }
    let full = assign_within(facts, budgets(facts));
    if short(&full) < short(&fair) {
        full
    } else {
        fair
    }
}

/// The plan that holds each member to `caps` copies.
fn assign_within<'a>(facts: &'a Facts, caps: BTreeMap<&'a str, usize>) -> Plan {
    let mut ledger = Ledger {
        host: facts
            .members
            .iter()
            .map(|m| (m.id.as_str(), m.host.as_str()))
            .collect(),
        budget: caps,
        load: facts.members.iter().map(|m| (m.id.as_str(), 0)).collect(),
    };
    let hosts: BTreeSet<&str> = facts.members.iter().map(|m| m.host.as_str()).collect();
    let wanted = facts.replicas.max(1).min(hosts.len());
    let none = Held::default();
    let held = |t: &TaskId| facts.held.get(t).unwrap_or(&none);
    // The member ids of `Facts`, borrowed for as long as the ledger.
    let member = |id: &str| {
        facts
            .members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.id.as_str())
    };
    // In task order, whatever order the facts list them in.
    let tasks: BTreeSet<&TaskId> = facts.tasks.iter().collect();
    let mut active: BTreeMap<&TaskId, &str> = BTreeMap::new();
    let mut replicas: BTreeMap<&TaskId, Vec<&str>> = BTreeMap::new();
    if ledger.budget.is_empty() {
        return Plan {
            tasks: BTreeMap::new(),
            missing: tasks.iter().map(|t| ((*t).clone(), wanted)).collect(),
            caps: BTreeMap::new(),
        };
    }
    // 1. Active copies stay.
    for &t in &tasks {
        if let Some(m) = held(t).active.as_deref().and_then(member) {
            if ledger.fits(m, &[]) {
                ledger.take(m);
                active.insert(t, m);
            }
        }
    }
    // 2. Replicas stay.
    for &t in &tasks {
        let mut kept: Vec<&str> = Vec::new();
        for m in held(t).replicas.iter().filter_map(|r| member(r)) {
            let mut taken = kept.clone();
            taken.extend(active.get(t));
            if taken.len() < wanted && ledger.fits(m, &taken) {
                ledger.take(m);
                kept.push(m);
            }
        }
        replicas.insert(t, kept);
    }
    // 3. Every task gets an active copy: a replica, a stale holder, or the most free.
    for &t in &tasks {
        if active.contains_key(t) {
            continue;
        }
        let kept = replicas.get_mut(t).expect("every task");
        if let Some(promoted) = ledger.least_loaded(kept.iter().copied()) {
            kept.retain(|m| *m != promoted);
            active.insert(t, promoted);
            continue;
        }
        let stale = held(t).stale.iter().filter_map(|s| member(s));
        let chosen = ledger
            .least_loaded(stale.filter(|m| ledger.fits(m, &[])))
            .or_else(|| ledger.most_free(&[]));
        if let Some(m) = chosen {
            ledger.take(m);
            active.insert(t, m);
        }
    }
    // 4. Missing replicas, one round over the tasks at a time, so shortfalls spread.
    for _ in 1..wanted {
        for &t in &tasks {
            let Some(&a) = active.get(t) else { continue };
            let kept = replicas.get_mut(t).expect("every task");
            if kept.len() + 1 >= wanted {
                continue;
            }
            let mut taken = kept.clone();
            taken.push(a);
            let stale = held(t).stale.iter().filter_map(|s| member(s));
            let chosen = ledger
                .least_loaded(stale.filter(|m| ledger.fits(m, &taken)))
                .or_else(|| ledger.most_free(&taken));
            if let Some(m) = chosen {
                ledger.take(m);
                kept.push(m);
            }
        }
    }
    // 5. A replica still missing because every member with room shares a host with a
    //    copy of the task: a full member on another host hands one of its replicas of
    //    another task to a member with room (where that task allows), and takes this one.
    for &t in &tasks {
        while replicas[t].len() + 1 < wanted {
            let Some(&a) = active.get(t) else { break };
            let mut taken = replicas[t].clone();
            taken.push(a);
            // `x`, on another host, is full (step 4 found no room): it gives up its
            // replica of a task `u` to `y`, which has room, is apart from `u`'s other
            // copies, and held no replica of `u` before (it would have been kept).
            let swap = ledger
                .budget
                .keys()
                .copied()
                .filter(|x| ledger.apart(x, &taken))
                .find_map(|x| {
                    tasks.iter().copied().filter(|u| *u != t).find_map(|u| {
                        let at = replicas[u].iter().position(|m| *m == x)?;
                        let mut others: Vec<&str> =
                            replicas[u].iter().copied().filter(|m| *m != x).collect();
                        others.push(active.get(u)?);
                        let y = ledger.most_free_but(&others, &held(u).replicas)?;
                        Some((x, u, at, y))
                    })
                });
            let Some((x, u, at, y)) = swap else { break };
            ledger.take(y);
            replicas.get_mut(u).expect("every task")[at] = y;
            // A former replica of `t` comes before an active copy `t` had nowhere.
            let before = held(t);
            let fresh =
                before.active.as_deref() != Some(a) && !before.replicas.iter().any(|r| r == a);
            if fresh && before.replicas.iter().any(|r| r == x) {
                active.insert(t, x);
                replicas.get_mut(t).expect("every task").push(a);
            } else {
                replicas.get_mut(t).expect("every task").push(x);
            }
        }
    }
    let mut plan = Plan {
        caps: ledger
            .budget
            .iter()
            .map(|(m, c)| (m.to_string(), *c))
            .collect(),
        ..Plan::default()
    };
    for &t in &tasks {
        let kept = replicas.remove(t).unwrap_or_default();
        let copies = active.contains_key(t) as usize + kept.len();
        if copies < facts.replicas.max(1) {
            plan.missing
                .insert(t.clone(), facts.replicas.max(1) - copies);
        }
        if let Some(a) = active.get(t) {
            plan.tasks.insert(
                t.clone(),
                Placement {
                    active: a.to_string(),
                    replicas: kept.into_iter().map(str::to_string).collect(),
                },
            );
        }
    }
    plan
}

/// What `plan` says each member held: the facts for the next plan, given who is still
/// there. Stale copies are kept where members still have them.
pub fn held_after(plan: &Plan, previous: &BTreeMap<TaskId, Held>) -> BTreeMap<TaskId, Held> {
    let mut next = BTreeMap::new();
    for (t, p) in &plan.tasks {
        let mut stale: Vec<String> = previous
            .get(t)
            .map(|h| {
                h.active
                    .iter()
                    .chain(&h.replicas)
                    .chain(&h.stale)
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        stale.retain(|m| !p.copies().any(|c| c == m));
        stale.sort();
        stale.dedup();
        next.insert(
            t.clone(),
            Held {
                active: Some(p.active.clone()),
                replicas: p.replicas.clone(),
                stale,
            },
        );
    }
    next
}

#[cfg(test)]
mod tests;
