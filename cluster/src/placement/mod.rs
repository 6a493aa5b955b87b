//! Where shards run: the machine as hwloc sees it, and a plan that puts one shard on
//! each chosen processing unit (PU), pinned, with its memory from its NUMA node.
//!
//! - `Machine` is a plain model (NUMA nodes with their memory and distances, cores, PUs)
//!   read from hwloc: this machine, an hwloc synthetic description, or an XML file
//!   (`--topology`), so plans can be made and tested for machines we do not have.
//! - `plan` is a pure function from a machine to the shards' places: one shard per core
//!   (SMT siblings only when asked for more shards than cores), dealt to NUMA nodes in
//!   turn, so shard i and shard i + 1 sit on different nodes when there are several.
//!   `route::shard_of` deals a stream's partitions to consecutive shards, so they spread
//!   over as many nodes as there are, and each node gets its share of tasks.
//! - `Pinning` binds a shard thread to its PU and its memory policy to its node.
//!
//! Invariant: a plan depends only on the machine and the shard count, so every restart
//! on the same machine gives each shard the same place.

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::memory::binding::{MemoryBindingFlags, MemoryBindingPolicy};
use hwlocality::memory::nodeset::NodeSet;
use hwlocality::object::types::ObjectType;
use hwlocality::Topology;

/// Cores kept for the log, IO, checkpoint and network threads on machines with at least
/// this many cores (one per `SERVICE_CORE_PER` cores); smaller ones share every core.
const SERVICE_CORES_FROM: usize = 4;
const SERVICE_CORE_PER: usize = 8;

#[derive(Clone, Debug, PartialEq)]
pub struct NumaNode {
    pub os_index: usize,
    pub memory_bytes: u64,
}

/// A processing unit (hardware thread).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pu {
    pub os_index: usize,
    /// The core's logical index (hwloc's order).
    pub core: usize,
    /// The NUMA node's index in `Machine::numa`.
    pub numa: usize,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Machine {
    /// Where the description came from: `this machine`, or the `--topology` given.
    pub source: String,
    pub numa: Vec<NumaNode>,
    /// `distances[i][j]`: the relative cost of node i reading node j's memory (10 is
    /// local), from the machine's ACPI SLIT or the XML; 10 and 20 when it has none.
    pub distances: Vec<Vec<u64>>,
    /// In hwloc's logical order: a core's PUs together, a node's cores together.
    pub pus: Vec<Pu>,
}

impl Machine {
    pub fn cores(&self) -> usize {
        self.pus.iter().map(|p| p.core + 1).max().unwrap_or(0)
    }

    /// The machine of a loaded hwloc topology.
    pub fn of(topology: &Topology, source: &str) -> Result<Machine, String> {
        let mut numa: Vec<(NumaNode, CpuSet)> = topology
            .objects_with_type(ObjectType::NUMANode)
            .map(|n| {
                let node = NumaNode {
                    os_index: n.os_index().unwrap_or(n.logical_index()),
                    memory_bytes: n.total_memory(),
                };
                (
                    node,
                    n.cpuset().map(|c| c.clone_target()).unwrap_or_default(),
                )
            })
            .collect();
        if numa.is_empty() {
            // A machine without NUMA information is one node holding every PU.
            let all = topology.cpuset().clone_target();
            numa.push((
                NumaNode {
                    os_index: 0,
                    memory_bytes: 0,
                },
                all,
            ));
        }
        let mut pus = Vec::new();
        for (core, c) in topology.objects_with_type(ObjectType::Core).enumerate() {
            let Some(cpuset) = c.cpuset() else { continue };
            for os_index in cpuset.iter_set() {
                let os_index = usize::from(os_index);
                let node = numa
                    .iter()
                    .position(|(_, set)| set.is_set(os_index))
                    .unwrap_or(0);
                pus.push(Pu {
                    os_index,
                    core,
                    numa: node,
                });
            }
        }
        if pus.is_empty() {
            return Err(format!("{source}: hwloc found no cores"));
        }
        let n = numa.len();
        let mut distances: Vec<Vec<u64>> = (0..n)
            .map(|i| (0..n).map(|j| if i == j { 10 } else { 20 }).collect())
            .collect();
        let matrices = topology
            .distances(None)
            .map_err(|e| format!("{source}: {e}"))?;
        if let Some(d) = matrices.iter().find(|d| {
            d.num_objects() == n
                && d.objects()
                    .all(|o| o.is_some_and(|o| o.object_type() == ObjectType::NUMANode))
        }) {
            let index_of = |o: Option<&hwlocality::object::TopologyObject>| {
                let os = o.and_then(|o| o.os_index())?;
                numa.iter().position(|(node, _)| node.os_index == os)
            };
            let objects: Vec<Option<usize>> = d.objects().map(index_of).collect();
            for (a, from) in objects.iter().enumerate() {
                for (b, to) in objects.iter().enumerate() {
                    if let (Some(i), Some(j)) = (from, to) {
                        distances[*i][*j] = d.distances()[a * n + b];
                    }
                }
            }
        }
        Ok(Machine {
            source: source.to_string(),
            numa: numa.into_iter().map(|(node, _)| node).collect(),
            distances,
            pus,
        })
    }
}

/// Loads the topology `spec` names: an XML file (a path that exists or ends in `.xml`),
/// an hwloc synthetic description (`pack:2 numa:1 core:8 pu:2`), or, without one, this
/// machine.
pub fn load_topology(spec: Option<&str>) -> Result<Topology, String> {
    let builder = Topology::builder();
    let builder = match spec {
        None => builder,
        Some(s) if s.ends_with(".xml") || std::path::Path::new(s).is_file() => builder
            .from_xml_file(s)
            .map_err(|e| format!("--topology {s}: {e}"))?,
        Some(s) => builder.from_synthetic(s).map_err(|e| {
            format!("--topology {s}: not an XML file or an hwloc synthetic description: {e}")
        })?,
    };
    builder
        .build()
        .map_err(|e| format!("--topology {}: {e}", spec.unwrap_or("(this machine)")))
}

/// Where one shard runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    pub pu: usize,
    pub core: usize,
    /// The node's index in `Machine::numa`.
    pub numa: usize,
}

/// The shards' places and the PUs kept for the other threads (none: they float).
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub shards: Vec<Place>,
    pub service: Vec<Place>,
}

/// Cores `--shards auto` leaves to the log, IO, checkpoint and network threads.
pub fn service_cores(cores: usize) -> usize {
    if cores < SERVICE_CORES_FROM {
        0
    } else {
        cores.div_ceil(SERVICE_CORE_PER)
    }
}

/// Places `shards` shards on `machine` (`None`: one per core, less the service cores).
/// Shards go to NUMA nodes in turn, one core each, the first PU of a core before its
/// SMT siblings; the service cores are each node's last ones, dealt the same way.
pub fn plan(machine: &Machine, shards: Option<usize>) -> Plan {
    let cores = machine.cores();
    let service = match shards {
        None => service_cores(cores),
        Some(n) => service_cores(cores).min(cores.saturating_sub(n)),
    };
    // Per node, its cores in order, each with its PUs in order.
    let mut per_node: Vec<Vec<Vec<Pu>>> = vec![Vec::new(); machine.numa.len()];
    for pu in &machine.pus {
        let node = &mut per_node[pu.numa];
        match node.last_mut() {
            Some(core) if core[0].core == pu.core => core.push(*pu),
            _ => node.push(vec![*pu]),
        }
    }
    let place = |pu: &Pu| Place {
        pu: pu.os_index,
        core: pu.core,
        numa: pu.numa,
    };
    // Service cores: taken from the end of the nodes, in turn.
    let mut service_places = Vec::new();
    let mut taken = vec![0usize; per_node.len()];
    // A node keeps at least one core for shards; a round that takes none ends it.
    'rounds: while service_places.len() < service {
        let before = service_places.len();
        for (n, cores) in per_node.iter().enumerate() {
            let cores_left = cores.len() - taken[n];
            if cores_left > 1 {
                taken[n] += 1;
                service_places.push(place(&cores[cores_left - 1][0]));
                if service_places.len() == service {
                    break 'rounds;
                }
            }
        }
        if service_places.len() == before {
            break;
        }
    }
    let shards = shards.unwrap_or(cores - service_places.len()).max(1);
    // Shard PUs: round after round (SMT level 0, then 1, …), node after node, core by
    // core within a node.
    let mut order = Vec::new();
    let smt = per_node.iter().flatten().map(Vec::len).max().unwrap_or(1);
    for level in 0..smt {
        let mut next = vec![0usize; per_node.len()];
        loop {
            let before = order.len();
            for (n, cores) in per_node.iter().enumerate() {
                let usable = cores.len() - taken[n];
                while next[n] < usable {
                    let core = &cores[next[n]];
                    next[n] += 1;
                    if let Some(pu) = core.get(level) {
                        order.push(place(pu));
                        break;
                    }
                }
            }
            if order.len() == before {
                break;
            }
        }
    }
    if order.is_empty() {
        order.push(place(&machine.pus[0]));
    }
    // More shards than PUs: deal them over the PUs again.
    let shards = (0..shards).map(|i| order[i % order.len()]).collect();
    Plan {
        shards,
        service: service_places,
    }
}

/// The PUs the log, IO, checkpoint and network threads run on: the plan's service cores,
/// or, when it keeps none, the PUs carrying the fewest shards (every PU when they carry
/// as many: the OS then picks the least busy).
pub fn service_pus(machine: &Machine, plan: &Plan) -> Vec<usize> {
    if !plan.service.is_empty() {
        return plan.service.iter().map(|p| p.pu).collect();
    }
    let load = |pu: usize| plan.shards.iter().filter(|s| s.pu == pu).count();
    let least = machine
        .pus
        .iter()
        .map(|p| load(p.os_index))
        .min()
        .unwrap_or(0);
    machine
        .pus
        .iter()
        .map(|p| p.os_index)
        .filter(|&pu| load(pu) == least)
        .collect()
}

/// Binds threads to their places on the machine the topology describes.
pub struct Pinning {
    topology: std::sync::Arc<Topology>,
    pub machine: Machine,
    pub plan: Plan,
}

impl std::fmt::Debug for Pinning {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pinning").field("plan", &self.plan).finish()
    }
}

impl Pinning {
    /// The plan for `shards` shards (`None`: `--shards auto`) on the machine `spec`
    /// describes (`load_topology`; `None`: this machine).
    pub fn load(spec: Option<&str>, shards: Option<usize>) -> Result<Pinning, String> {
        let topology = load_topology(spec)?;
        let machine = Machine::of(&topology, spec.unwrap_or("this machine"))?;
        let plan = plan(&machine, shards);
        Ok(Pinning {
            topology: std::sync::Arc::new(topology),
            machine,
            plan,
        })
    }

    /// The plan for another shard count on the same machine.
    pub fn with_shards(&self, shards: Option<usize>) -> Pinning {
        Pinning {
            topology: self.topology.clone(),
            machine: self.machine.clone(),
            plan: plan(&self.machine, shards),
        }
    }

    /// Binds the calling thread (and the threads it starts from now on, which inherit
    /// its binding) to the service PUs; with `every_thread`, every thread of the process,
    /// shards included, which then bind themselves again.
    pub fn pin_service(&self, every_thread: bool) -> Result<(), String> {
        let mut cpus = CpuSet::new();
        for pu in service_pus(&self.machine, &self.plan) {
            cpus.set(pu);
        }
        let flags = match every_thread {
            true => CpuBindingFlags::PROCESS,
            false => CpuBindingFlags::THREAD,
        };
        self.topology
            .bind_cpu(&cpus, flags)
            .map_err(|e| format!("binding the service threads to PUs {cpus}: {e}"))
    }

    /// Whether the plan is for the machine this process runs on (threads can be bound).
    pub fn is_this_machine(&self) -> bool {
        self.topology.is_this_system()
    }

    /// Binds the calling thread to shard `index`'s PU, and its memory policy to the PU's
    /// NUMA node. A failure (a container that forbids it) leaves the thread where the
    /// OS puts it, and is returned for the caller to report.
    pub fn pin_shard(&self, index: usize) -> Result<(), String> {
        let place = self.plan.shards[index];
        let mut cpus = CpuSet::new();
        cpus.set(place.pu);
        self.topology
            .bind_cpu(&cpus, CpuBindingFlags::THREAD)
            .map_err(|e| format!("binding a shard to PU {}: {e}", place.pu))?;
        let node = self.machine.numa[place.numa].os_index;
        if self.machine.numa.len() > 1 {
            let mut nodes = NodeSet::new();
            nodes.set(node);
            self.topology
                .bind_memory(
                    &nodes,
                    MemoryBindingPolicy::Bind,
                    MemoryBindingFlags::THREAD,
                )
                .map_err(|e| format!("binding a shard's memory to NUMA node {node}: {e}"))?;
        }
        Ok(())
    }
}

/// The machine, the plan and what a hop between two shards' nodes costs, as `eddy
/// topology` prints it.
pub fn describe(machine: &Machine, plan: &Plan, tasks: usize) -> String {
    use std::fmt::Write;
    let mut out = String::new();
    let smt = machine.pus.len() as f64 / machine.cores().max(1) as f64;
    let _ = writeln!(
        out,
        "machine ({}): {} NUMA node{}, {} cores, {} PUs ({smt:.0} per core)",
        machine.source,
        machine.numa.len(),
        if machine.numa.len() == 1 { "" } else { "s" },
        machine.cores(),
        machine.pus.len(),
    );
    for (i, node) in machine.numa.iter().enumerate() {
        let cores: std::collections::BTreeSet<usize> = machine
            .pus
            .iter()
            .filter(|p| p.numa == i)
            .map(|p| p.core)
            .collect();
        let _ = writeln!(
            out,
            "  node {} (os {}): {} cores, {} MiB; distances {:?}",
            i,
            node.os_index,
            cores.len(),
            node.memory_bytes >> 20,
            machine.distances[i]
        );
    }
    let _ = writeln!(
        out,
        "plan: {} shard{}, {} service core{}",
        plan.shards.len(),
        if plan.shards.len() == 1 { "" } else { "s" },
        plan.service.len(),
        if plan.service.len() == 1 { "" } else { "s" },
    );
    let mut per_shard = vec![0usize; plan.shards.len()];
    for t in 0..tasks {
        per_shard[t % plan.shards.len()] += 1;
    }
    for (i, p) in plan.shards.iter().enumerate() {
        let _ = writeln!(
            out,
            "  shard {i}: pu {} core {} node {}{}",
            p.pu,
            p.core,
            p.numa,
            if tasks > 0 {
                format!(", {} tasks", per_shard[i])
            } else {
                String::new()
            }
        );
    }
    for p in &plan.service {
        let _ = writeln!(
            out,
            "  service: pu {} core {} node {}",
            p.pu, p.core, p.numa
        );
    }
    let hop = cross_node_cost(machine, plan);
    let _ = writeln!(
        out,
        "a hop between consecutive shards costs {:.1} on average (10 is local); shards on \
         one node: {:?}",
        hop,
        per_node_counts(machine, plan)
    );
    for (name, placed) in [("with placement", true), ("without placement", false)] {
        let t = traffic(machine, plan, placed);
        let _ = writeln!(
            out,
            "{name}: {:.1}% of state accesses cross nodes (mean distance {:.1}); \
             {:.1}% of event hand-offs to shards cross nodes (mean distance {:.1})",
            t.state_remote * 100.0,
            t.state_distance,
            t.handoff_remote * 100.0,
            t.handoff_distance,
        );
    }
    out
}

/// What crosses NUMA nodes, as a plan predicts it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Traffic {
    /// The share of a shard's accesses to its tasks' state that go to another node.
    pub state_remote: f64,
    /// The mean distance of those accesses, local ones included (10 is local).
    pub state_distance: f64,
    /// The share of events handed from a service thread (sessions, the log) to a shard
    /// on another node.
    pub handoff_remote: f64,
    pub handoff_distance: f64,
}

/// The cross-node traffic of `plan`, `placed` (shards pinned, their memory on their
/// node, service threads on the service PUs) or not (threads where the OS puts them,
/// memory where a thread first touched it: any node, in proportion to its PUs).
pub fn traffic(machine: &Machine, plan: &Plan, placed: bool) -> Traffic {
    let nodes = machine.numa.len();
    let d = |a: usize, b: usize| machine.distances[a][b] as f64;
    // Where threads run when nothing pins them: each node by its share of PUs.
    let mut share = vec![0.0; nodes];
    for pu in &machine.pus {
        share[pu.numa] += 1.0 / machine.pus.len() as f64;
    }
    let spread = |pairs: &mut dyn Iterator<Item = (usize, usize, f64)>| {
        let (mut remote, mut distance) = (0.0, 0.0);
        for (a, b, weight) in pairs {
            remote += weight * f64::from(u8::from(a != b));
            distance += weight * d(a, b);
        }
        (remote, distance)
    };
    let anywhere = || (0..nodes).flat_map(|a| (0..nodes).map(move |b| (a, b)));
    let (state_remote, state_distance) = match placed {
        true => (0.0, 10.0),
        false => spread(&mut anywhere().map(|(a, b)| (a, b, share[a] * share[b]))),
    };
    let senders: Vec<usize> = match (placed, plan.service.is_empty()) {
        (true, false) => plan.service.iter().map(|p| p.numa).collect(),
        _ => Vec::new(),
    };
    let (handoff_remote, handoff_distance) = if placed && !senders.is_empty() {
        let weight = 1.0 / (senders.len() * plan.shards.len()) as f64;
        spread(
            &mut senders
                .iter()
                .flat_map(|&a| plan.shards.iter().map(move |s| (a, s.numa, weight))),
        )
    } else if placed {
        // Service threads share every PU: senders anywhere, shards where the plan says.
        let weight = 1.0 / plan.shards.len() as f64;
        spread(&mut (0..nodes).flat_map(|a| {
            let share = share[a];
            plan.shards.iter().map(move |s| (a, s.numa, share * weight))
        }))
    } else {
        spread(&mut anywhere().map(|(a, b)| (a, b, share[a] * share[b])))
    };
    Traffic {
        state_remote,
        state_distance,
        handoff_remote,
        handoff_distance,
    }
}

/// Shards per NUMA node.
pub fn per_node_counts(machine: &Machine, plan: &Plan) -> Vec<usize> {
    let mut counts = vec![0; machine.numa.len()];
    for p in &plan.shards {
        counts[p.numa] += 1;
    }
    counts
}

/// The mean distance between consecutive shards (i, i + 1): what a stream's
/// partitions, dealt to consecutive shards, pay when they exchange data.
pub fn cross_node_cost(machine: &Machine, plan: &Plan) -> f64 {
    let pairs: Vec<u64> = plan
        .shards
        .windows(2)
        .map(|w| machine.distances[w[0].numa][w[1].numa])
        .collect();
    if pairs.is_empty() {
        return 10.0;
    }
    pairs.iter().sum::<u64>() as f64 / pairs.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn synthetic(spec: &str) -> Machine {
        Machine::of(&load_topology(Some(spec)).unwrap(), spec).unwrap()
    }

    fn bullion() -> Machine {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/src/placement/bullion-s16.xml");
        Machine::of(&load_topology(Some(path)).unwrap(), "bullion").unwrap()
    }

    /// Every shard on its own PU while there are PUs, and no node with two shards more
    /// than another.
    fn check_balanced(m: &Machine, p: &Plan) {
        let pus: std::collections::HashSet<usize> = p.shards.iter().map(|s| s.pu).collect();
        assert_eq!(pus.len(), p.shards.len().min(m.pus.len() - p.service.len()));
        let counts = per_node_counts(m, p);
        let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
        assert!(hi - lo <= 1, "unbalanced: {counts:?}");
        for s in &p.shards {
            assert!(
                !p.service.iter().any(|v| v.core == s.core),
                "{s:?} on a service core"
            );
        }
    }

    #[test]
    fn machines_load_from_hwloc_descriptions() {
        let m = synthetic("core:2 pu:1");
        assert_eq!((m.numa.len(), m.cores(), m.pus.len()), (1, 2, 2));
        let m = synthetic("pack:2 numa:1 core:8 pu:1");
        assert_eq!((m.numa.len(), m.cores(), m.pus.len()), (2, 16, 16));
        assert_eq!(m.distances, vec![vec![10, 20], vec![20, 10]]);
        let m = synthetic("pack:4 numa:1 core:16 pu:2");
        assert_eq!((m.numa.len(), m.cores(), m.pus.len()), (4, 64, 128));
        let m = bullion();
        assert_eq!((m.numa.len(), m.cores(), m.pus.len()), (16, 288, 288));
        // Seed 003's Figure 2: 10 local, 15 to the node paired with it, 40 elsewhere.
        for i in 0..16 {
            for j in 0..16 {
                let want = match (i, j) {
                    _ if i == j => 10,
                    _ if i / 2 == j / 2 => 15,
                    _ => 40,
                };
                assert_eq!(m.distances[i][j], want, "{i} → {j}");
            }
        }
        assert!(load_topology(Some("no such thing:3")).is_err());
    }

    #[test]
    fn plans_spread_shards_over_nodes_and_keep_service_cores() {
        // 1 × 2: two shards, nothing kept.
        let m = synthetic("core:2 pu:1");
        let p = plan(&m, None);
        assert_eq!(p.shards.len(), 2);
        // One core per node: no node can spare one for the service threads.
        let single = synthetic("pack:4 numa:1 core:1 pu:1");
        let p = plan(&single, None);
        assert_eq!((p.shards.len(), p.service.len()), (4, 0));
        check_balanced(&single, &p);
        let p = plan(&m, None);
        assert!(p.service.is_empty());
        check_balanced(&m, &p);
        // 2 × 8: one core kept per 8, from the nodes' ends; shards alternate nodes.
        let m = synthetic("pack:2 numa:1 core:8 pu:1");
        let p = plan(&m, None);
        assert_eq!((p.shards.len(), p.service.len()), (14, 2));
        check_balanced(&m, &p);
        assert!(p.shards.windows(2).all(|w| w[0].numa != w[1].numa));
        // 4 × 16 with SMT: first PUs of cores before any sibling.
        let m = synthetic("pack:4 numa:1 core:16 pu:2");
        let p = plan(&m, None);
        assert_eq!((p.shards.len(), p.service.len()), (56, 8));
        check_balanced(&m, &p);
        let cores: std::collections::HashSet<usize> = p.shards.iter().map(|s| s.core).collect();
        assert_eq!(cores.len(), 56, "no two shards on SMT siblings");
        let p = plan(&m, Some(100));
        assert_eq!(p.shards.len(), 100);
        check_balanced(&m, &p);
        // Seed 003's machine.
        let m = bullion();
        let p = plan(&m, None);
        assert_eq!((p.shards.len(), p.service.len()), (252, 36));
        check_balanced(&m, &p);
        let p = plan(&m, Some(16));
        assert_eq!(per_node_counts(&m, &p), vec![1; 16]);
    }

    #[test]
    fn service_threads_go_where_shards_are_fewest() {
        let m = synthetic("core:2 pu:1");
        assert_eq!(service_pus(&m, &plan(&m, Some(1))), vec![1]);
        assert_eq!(service_pus(&m, &plan(&m, Some(2))), vec![0, 1]);
        assert_eq!(service_pus(&m, &plan(&m, Some(3))), vec![1]);
        let m = synthetic("pack:2 numa:1 core:8 pu:1");
        let p = plan(&m, None);
        let kept: Vec<usize> = p.service.iter().map(|s| s.pu).collect();
        assert_eq!(service_pus(&m, &p), kept);
        assert!(p.shards.iter().all(|s| !kept.contains(&s.pu)));
    }

    /// Seed 003's machine: placed, a shard's state is always local; unplaced, 15 of 16
    /// accesses cross nodes, at a mean distance of (10 + 15 + 14 × 40) / 16.
    #[test]
    fn placement_keeps_state_on_its_node() {
        let m = bullion();
        let p = plan(&m, None);
        let placed = traffic(&m, &p, true);
        assert_eq!((placed.state_remote, placed.state_distance), (0.0, 10.0));
        let unplaced = traffic(&m, &p, false);
        assert!(
            (unplaced.state_remote - 15.0 / 16.0).abs() < 1e-9,
            "{unplaced:?}"
        );
        assert!(
            (unplaced.state_distance - 36.5625).abs() < 1e-9,
            "{unplaced:?}"
        );
        // Service cores sit on every node, so hand-offs cross as often either way.
        assert!(
            (placed.handoff_remote - 15.0 / 16.0).abs() < 0.002,
            "{placed:?}"
        );
        let one = synthetic("core:2 pu:1");
        let t = traffic(&one, &plan(&one, None), false);
        assert_eq!((t.state_remote, t.handoff_remote), (0.0, 0.0));
    }

    /// Adding a shard moves no other shard: shard i's place depends on i alone.
    #[test]
    fn plans_are_stable_when_a_shard_is_added() {
        for spec in [
            "core:2 pu:1",
            "pack:2 numa:1 core:8 pu:1",
            "pack:4 numa:1 core:16 pu:2",
        ] {
            let m = synthetic(spec);
            for n in 1..m.pus.len() / 2 {
                let a = plan(&m, Some(n));
                let b = plan(&m, Some(n + 1));
                if a.service == b.service {
                    assert_eq!(a.shards[..], b.shards[..n], "{spec}: {n} → {}", n + 1);
                }
            }
            assert_eq!(plan(&m, None), plan(&m, None));
        }
    }
}
