//! The shared-prefix DAG of a stream: Window → Filter → GroupBy → Aggregator.
//!
//! Invariant: node identity is structural (partitioner and window spec, then filter
//! text, group-by columns and aggregate), so two metrics with the same prefix share
//! nodes, and display ids (W1, F1, G1, A1, …) are numbered by first appearance over metrics in
//! creation order: the same catalog always prints the same plan.

use std::sync::Arc;

use crate::aggregate::AggFunc;
use crate::catalog::{Catalog, MetricDef, StreamDef};
use crate::types::format_duration_us;
use crate::window::WindowSpec;

/// Structural identity of a window node.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowKey {
    pub partitioner: usize,
    pub spec: WindowSpec,
}

/// Structural identity of a filter node (`None`: no WHERE).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FilterKey {
    pub window: WindowKey,
    pub predicate: Option<String>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupKey {
    pub filter: FilterKey,
    pub columns: Vec<usize>,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AggKey {
    pub group: GroupKey,
    pub func: AggFunc,
    pub arg: Option<usize>,
}

impl AggKey {
    pub fn of(metric: &MetricDef, agg: usize) -> AggKey {
        let a = &metric.aggregates[agg];
        AggKey {
            group: GroupKey::of(metric),
            func: a.func,
            arg: a.arg,
        }
    }

    /// The key of the state the aggregate reads (`AggFunc::state_func`): aggregates of
    /// one group node with equal state keys share one state. `None` for COUNT(*): it is
    /// the group's event count, which a group node keeps for every group anyway.
    pub fn state(&self) -> Option<AggKey> {
        (self.func != AggFunc::CountStar).then(|| AggKey {
            func: self.func.state_func(),
            ..self.clone()
        })
    }
}

impl GroupKey {
    pub fn of(metric: &MetricDef) -> GroupKey {
        GroupKey {
            filter: FilterKey {
                window: WindowKey {
                    partitioner: metric.partitioner,
                    spec: metric.window,
                },
                predicate: metric.filter.clone(),
            },
            columns: metric.group_by.clone(),
        }
    }
}

/// One node of the printed plan.
#[derive(Clone, Debug)]
struct Node {
    partitioner: usize,
    id: String,
    depth: usize,
    label: String,
    users: Vec<String>,
}

/// Visits the children of `parent` (its key `prefix`), depth-first in numbering order:
/// `visit(parent, node, depth)`.
fn walk(
    nodes: &[(Vec<String>, Node)],
    prefix: &[String],
    parent: Option<&Node>,
    only: Option<&str>,
    partitioner: usize,
    visit: &mut dyn FnMut(Option<&Node>, &Node, usize),
) {
    let depth = prefix.len();
    for (key, node) in nodes {
        let child = key.len() == depth + 1 && key[..depth] == *prefix;
        if !child || node.partitioner != partitioner || !node.used_by(only) {
            continue;
        }
        visit(parent, node, depth);
        if depth < 3 {
            walk(nodes, key, Some(node), only, partitioner, visit);
        }
    }
}

impl Node {
    /// Whether the metric `only` uses the node (every node is used when `None`).
    fn used_by(&self, only: Option<&str>) -> bool {
        only.is_none_or(|m| {
            self.users
                .iter()
                .any(|u| u == m || u.starts_with(&format!("{m}.")))
        })
    }

    /// Who uses the node: the metrics of a shared node, the result columns of an
    /// aggregator.
    fn users_text(&self) -> String {
        if self.depth == 3 {
            format!(" -> {}", self.users.join(", "))
        } else {
            format!("  [{}]", self.users.join(", "))
        }
    }
}

/// The DAG of one stream, in display order.
pub struct StreamDag {
    stream: Arc<StreamDef>,
    metrics: Vec<Arc<MetricDef>>,
}

impl StreamDag {
    pub fn new(catalog: &Catalog, stream: &Arc<StreamDef>) -> StreamDag {
        StreamDag {
            stream: stream.clone(),
            metrics: catalog.metrics_of(&stream.name),
        }
    }

    fn partitioner_label(&self, p: usize) -> String {
        let s = &self.stream;
        if s.partitioners.is_empty() {
            "Partitioner (none): 1 task".to_string()
        } else {
            format!(
                "Partitioner {}: {} task{}",
                s.columns[s.partitioners[p]].name,
                s.partitions,
                if s.partitions == 1 { "" } else { "s" }
            )
        }
    }

    /// Builds every node with its users, numbered by first appearance.
    fn nodes(&self) -> Vec<(Vec<String>, Node)> {
        // Each entry: the path of structural keys (as text) from the window down, and its node.
        let mut out: Vec<(Vec<String>, Node)> = Vec::new();
        let mut counters = [0usize; 4];
        let s = &self.stream;
        for m in &self.metrics {
            let gk = GroupKey::of(m);
            let path = [
                format!("{:?}", gk.filter.window),
                format!("{:?}", gk.filter),
                format!("{gk:?}"),
            ];
            let labels = [
                format!("Window {}", m.window.to_sql()),
                format!(
                    "Filter {}",
                    m.filter
                        .clone()
                        .unwrap_or_else(|| "(all events)".to_string())
                ),
                if m.group_by.is_empty() {
                    "GroupBy (no grouping)".to_string()
                } else {
                    format!(
                        "GroupBy {}",
                        m.group_by
                            .iter()
                            .map(|c| s.columns[*c].name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                },
            ];
            let prefixes = ["W", "F", "G"];
            for level in 0..3 {
                let key: Vec<String> = path[..=level].to_vec();
                match out.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, node)) => {
                        if !node.users.contains(&m.name) {
                            node.users.push(m.name.clone());
                        }
                    }
                    None => {
                        counters[level] += 1;
                        out.push((
                            key,
                            Node {
                                partitioner: m.partitioner,
                                id: format!("{}{}", prefixes[level], counters[level]),
                                depth: level,
                                label: labels[level].clone(),
                                users: vec![m.name.clone()],
                            },
                        ));
                    }
                }
            }
            for (i, a) in m.aggregates.iter().enumerate() {
                let ak = AggKey::of(m, i);
                let mut key = path.to_vec();
                key.push(format!("{ak:?}"));
                let user = format!("{}.{}", m.name, a.alias);
                match out.iter_mut().find(|(k, _)| *k == key) {
                    Some((_, node)) => node.users.push(user),
                    None => {
                        counters[3] += 1;
                        out.push((
                            key,
                            Node {
                                partitioner: m.partitioner,
                                id: format!("A{}", counters[3]),
                                depth: 3,
                                label: format!("Aggregator {}", a.to_sql(s)),
                                users: vec![user],
                            },
                        ));
                    }
                }
            }
        }
        out
    }

    /// Renders the nodes used by `only` (every node when `None`) as an indented tree.
    fn render(&self, only: Option<&str>) -> Vec<String> {
        let nodes = self.nodes();
        let mut lines = Vec::new();
        for p in 0..self.stream.partitioner_count() {
            let mut part = Vec::new();
            walk(&nodes, &[], None, only, p, &mut |_, node, depth| {
                part.push(format!(
                    "{}{} {}{}",
                    "  ".repeat(depth + 2),
                    node.id,
                    node.label,
                    node.users_text()
                ))
            });
            if only.is_none() || !part.is_empty() {
                lines.push(format!("  {}", self.partitioner_label(p)));
                lines.extend(part);
            }
        }
        lines
    }

    /// The DAG of the nodes used by `only` (every node when `None`) as a Graphviz
    /// digraph: the stream, its partitioners, then Window → Filter → GroupBy →
    /// Aggregator, each node labelled as in the text form (`EXPLAIN … (FORMAT dot)`).
    pub fn dot(&self, only: Option<&str>) -> Vec<String> {
        let nodes = self.nodes();
        let quote = |text: &str| {
            let text = text.replace('\\', "\\\\").replace('"', "\\\"");
            format!("\"{}\"", text.replace('\n', "\\n"))
        };
        let stream = format!("stream {}", self.stream.name);
        let mut lines = vec![
            format!("digraph {} {{", quote(&stream)),
            "  rankdir=TB;".to_string(),
            "  node [shape=box, style=rounded, fontname=\"Helvetica\"];".to_string(),
            format!(
                "  {} [label={}, shape=cylinder, style=solid];",
                quote(&stream),
                quote(&format!("Stream {}", self.stream.name))
            ),
        ];
        for p in 0..self.stream.partitioner_count() {
            let id = format!("P{}", p + 1);
            let mut part = Vec::new();
            walk(&nodes, &[], None, only, p, &mut |parent, node, _| {
                let shape = if node.depth == 3 {
                    ", shape=ellipse"
                } else {
                    ""
                };
                let label = format!("{} {}\n{}", node.id, node.label, node.users_text().trim());
                part.push(format!(
                    "  {} [label={}{shape}];",
                    quote(&node.id),
                    quote(&label)
                ));
                let from = parent.map_or(id.as_str(), |n| n.id.as_str());
                part.push(format!("  {} -> {};", quote(from), quote(&node.id)));
            });
            if only.is_none() || !part.is_empty() {
                lines.push(format!(
                    "  {} [label={}, shape=folder, style=solid];",
                    quote(&id),
                    quote(&self.partitioner_label(p))
                ));
                lines.push(format!("  {} -> {};", quote(&stream), quote(&id)));
                lines.extend(part);
            }
        }
        lines.push("}".to_string());
        lines
    }

    /// `EXPLAIN STREAM`: every metric's path through the shared DAG.
    pub fn explain_stream(&self) -> Vec<String> {
        let mut lines = vec![format!(
            "Stream {} ({} metric{})",
            self.stream.name,
            self.metrics.len(),
            if self.metrics.len() == 1 { "" } else { "s" }
        )];
        lines.extend(self.render(None));
        lines
    }

    /// `EXPLAIN METRIC`: the one path of `metric`, with the users of each shared node.
    pub fn explain_metric(&self, metric: &str) -> Vec<String> {
        let mut lines = vec![format!("Metric {metric} on stream {}", self.stream.name)];
        lines.extend(self.render(Some(metric)));
        if let Some(m) = self.metrics.iter().find(|m| m.name == metric) {
            if let WindowSpec::Hopping { hop_us, .. } = m.window {
                lines.push(format!(
                    "  Not exact per event: each result is the last completed hopping window, \
                     which ends up to {} before the event and leaves out the events since.",
                    format_duration_us(hop_us).to_lowercase()
                ));
            }
        }
        lines
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sql::parse_statement;

    #[test]
    fn shared_prefixes_share_ids() {
        let mut c = Catalog::default();
        for s in [
            "CREATE STREAM p (ts TIMESTAMP, card TEXT, amount DOUBLE) WITH (event_time = 'ts', partition_by = 'card', partitions = 2)",
            "CREATE METRIC a AS SELECT card, COUNT(*) AS n, SUM(amount) AS s FROM p WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
            "CREATE METRIC b AS SELECT card, COUNT(*) AS n, MAX(amount) AS m FROM p WINDOW SLIDING (SIZE 5 MINUTES) GROUP BY card",
            "CREATE METRIC c AS SELECT card, COUNT(*) AS n FROM p WINDOW SLIDING (SIZE 5 MINUTES) WHERE amount > 10 GROUP BY card",
        ] {
            c = crate::ddl::apply(&c, &parse_statement(s).unwrap()).unwrap().0;
        }
        let dag = StreamDag::new(&c, c.stream("p").unwrap());
        let text = dag.explain_stream().join("\n");
        let expected = "Stream p (3 metrics)
  Partitioner card: 2 tasks
    W1 Window SLIDING (SIZE 5 MINUTES)  [a, b, c]
      F1 Filter (all events)  [a, b]
        G1 GroupBy card  [a, b]
          A1 Aggregator COUNT(*) -> a.n, b.n
          A2 Aggregator SUM(amount) -> a.s
          A3 Aggregator MAX(amount) -> b.m
      F2 Filter amount > 10  [c]
        G2 GroupBy card  [c]
          A4 Aggregator COUNT(*) -> c.n";
        assert_eq!(text, expected);
        let m = dag.explain_metric("b").join("\n");
        assert!(m.contains("A3 Aggregator MAX(amount) -> b.m"), "{m}");
        assert!(!m.contains("A2"), "{m}");
        let dot = dag.dot(None);
        assert_eq!(dot[0], "digraph \"stream p\" {");
        assert_eq!(dot.last().unwrap(), "}");
        for line in [
            "  \"stream p\" -> \"P1\";",
            "  \"P1\" -> \"W1\";",
            "  \"W1\" -> \"F2\";",
            "  \"G1\" -> \"A3\";",
            "  \"F2\" [label=\"F2 Filter amount > 10\\n[c]\"];",
            "  \"A1\" [label=\"A1 Aggregator COUNT(*)\\n-> a.n, b.n\", shape=ellipse];",
        ] {
            assert!(dot.iter().any(|l| l == line), "no {line} in {dot:#?}");
        }
        let only_c = dag.dot(Some("c")).join("\n");
        assert!(
            only_c.contains("\"G2\" -> \"A4\"") && !only_c.contains("\"A1\""),
            "{only_c}"
        );
    }
}
