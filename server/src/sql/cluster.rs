//! The cluster as the front end sees it: DDL made on other nodes, adopted while the node
//! runs, and `SHOW CLUSTER` and `SHOW TASKS`.
//!
//! Invariant: a catalog adopted from the catalog topic changes the shards and the log
//! exactly as local DDL does, but is not published again.

use std::sync::Arc;
use std::time::Duration;

use pgwire::api::Type;

use eddy_cluster::{Kafka, TaskId};
use eddy_planner::catalog::Catalog;
use eddy_planner::Result;

use crate::session::cells::{Cell, Column};
use crate::sql::db::{catalog_of, persist, Db, Executed};

/// How often a node looks for other nodes' DDL.
const CATALOG_POLL: Duration = Duration::from_millis(200);

/// In cluster mode, adopts the catalog other nodes publish, within a moment of their DDL.
pub(crate) fn follow_catalog(db: &Arc<Db>) {
    if db.engine().log_as::<Kafka>().is_none() {
        return;
    }
    let weak = Arc::downgrade(db);
    tokio::spawn(async move {
        let mut seen = 0;
        loop {
            tokio::time::sleep(CATALOG_POLL).await;
            let Some(db) = weak.upgrade() else { break };
            if db.engine().is_closing() {
                break;
            }
            let Some(kafka) = db.engine().log_as::<Kafka>() else {
                break;
            };
            let records = kafka.catalog_records();
            if records == seen {
                continue;
            }
            seen = records;
            if let Err(e) = adopt(&db).await {
                tracing::warn!("adopting the cluster's catalog: {e}");
            }
        }
    });
}

/// Takes the catalog topic as the cluster reader has read it and, if it differs from this node's catalog, installs it.
async fn adopt(db: &Arc<Db>) -> Result<()> {
    let _guard = db.ddl.lock().await;
    // Not before this node's own last DDL is read back: what was read is older.
    let Some(statements) = db
        .engine()
        .log_as::<Kafka>()
        .and_then(|kafka| kafka.followed_catalog())
    else {
        return Ok(());
    };
    let next = catalog_of(&statements)?;
    let current = db.catalog();
    if same(&current, &next) {
        return Ok(());
    }
    let next = Arc::new(next);
    db.engine().apply_catalog(next.clone()).await?;
    if let Some(kafka) = db.engine().log_as::<Kafka>() {
        kafka.install(&current, &next).await?;
    }
    persist(&db.data_dir, &next)?;
    db.set_catalog(next);
    db.engine().checkpoint().await?;
    Ok(())
}

/// Whether two catalogs hold the same objects, made by the same statements.
fn same(a: &Catalog, b: &Catalog) -> bool {
    a.statements() == b.statements()
}

impl Db {
    /// `SHOW CLUSTER`: one row per node the cluster knows.
    pub(crate) fn show_cluster(&self) -> Executed {
        let columns = vec![
            Column::text("node_id"),
            Column::text("host_id"),
            Column::text("pg_addr"),
            Column::new("processors", Type::INT4),
            Column::new("alive", Type::BOOL),
            Column::new("active_tasks", Type::INT4),
            Column::new("replica_tasks", Type::INT4),
            Column::text("kafka"),
            Column::new("lease_ms", Type::INT8),
            Column::new("format", Type::INT4),
            Column::new("writes_format", Type::INT4),
        ];
        let rows = match self.engine().log_as::<Kafka>() {
            Some(kafka) => {
                let view = kafka.view();
                let fence = kafka.fence();
                let me = kafka.config().node.as_str();
                view.facts
                    .values()
                    .map(|f| {
                        let roles = view.plan.roles_of(&f.node);
                        let active = roles.values().filter(|a| **a).count();
                        // What this node knows of itself: whether the broker answers its
                        // beats, and how long its lease still runs.
                        let writes = if f.node == me {
                            Cell::I32(eddy_cluster::format::writes() as i32)
                        } else {
                            Cell::Null
                        };
                        let (kafka, lease) = if f.node == me {
                            let reachable = if fence.reachable() {
                                "reachable"
                            } else {
                                "unreachable"
                            };
                            (
                                Cell::text(reachable),
                                Cell::I64(fence.remaining().as_millis() as i64),
                            )
                        } else {
                            (Cell::Null, Cell::Null)
                        };
                        vec![
                            Cell::text(f.node.as_str()),
                            Cell::text(f.host.as_str()),
                            Cell::text(f.pg_addr.as_str()),
                            Cell::I32(f.processors as i32),
                            Cell::Bool(view.alive.contains(&f.node)),
                            Cell::I32(active as i32),
                            Cell::I32((roles.len() - active) as i32),
                            kafka,
                            lease,
                            Cell::I32(f.format as i32),
                            writes,
                        ]
                    })
                    .collect()
            }
            None => {
                let tasks = eddy_cluster::node::shards::tasks_of(&self.catalog()).count();
                vec![vec![
                    Cell::text("local"),
                    Cell::text(""),
                    Cell::text(""),
                    Cell::I32(self.engine().shards() as i32),
                    Cell::Bool(true),
                    Cell::I32(tasks as i32),
                    Cell::I32(0),
                    Cell::Null,
                    Cell::Null,
                    Cell::I32(eddy_cluster::format::own() as i32),
                    Cell::I32(eddy_cluster::format::own() as i32),
                ]]
            }
        };
        Executed::rows(columns, rows)
    }

    /// `SHOW TASKS`: one row per task, with where it runs and how far this node's copy
    /// is (offset and lag are shown where this node holds a copy).
    pub(crate) async fn show_tasks(&self) -> Result<Executed> {
        let columns = vec![
            Column::text("stream"),
            Column::text("partitioner"),
            Column::new("partition", Type::INT4),
            Column::text("active"),
            Column::text("replicas"),
            Column::new("offset", Type::INT8),
            Column::new("lag", Type::INT8),
        ];
        let catalog = self.catalog();
        let report = self.engine().report().await?;
        let log_end = |t: &TaskId| report.iter().find(|r| &r.task == t).map(|r| r.log_end);
        let kafka = self.engine().log_as::<Kafka>();
        let view = kafka.map(Kafka::view);
        let roles = kafka.map(Kafka::roles).unwrap_or_default();
        let tasks: Vec<_> = eddy_cluster::node::shards::tasks_of(&catalog).collect();
        // The partitions' ends, for the lag of the copies this node holds.
        let asked: Vec<(String, i32)> = match kafka {
            Some(k) => tasks
                .iter()
                .filter(|(_, t)| roles.contains_key(t))
                .map(|(s, t)| (k.config().topic_of(s, t.partitioner), t.partition as i32))
                .collect(),
            None => Vec::new(),
        };
        let engine = self.engine().clone();
        let highs: Vec<Option<i64>> = tokio::task::spawn_blocking(move || {
            let k = engine.log_as::<Kafka>();
            asked
                .iter()
                .map(|(topic, p)| k.and_then(|k| k.high_watermark(topic, *p).ok()))
                .collect()
        })
        .await
        .unwrap_or_default();
        let mut highs = highs.into_iter();
        let mut rows = Vec::new();
        for (stream, task) in tasks {
            let partitioner = match stream.partitioners.get(task.partitioner) {
                Some(&col) => stream.columns[col].name.clone(),
                None => "all".to_string(),
            };
            let (active, replicas, offset, lag) = match &view {
                Some(view) => {
                    let placement = view.plan.placement(&task);
                    let (offset, lag) = if roles.contains_key(&task) {
                        let end = log_end(&task);
                        let high = highs.next().flatten();
                        let lag = match (end, high) {
                            (Some(end), Some(h)) => Some((h.max(0) as u64).saturating_sub(end)),
                            _ => None,
                        };
                        (end, lag)
                    } else {
                        (None, None)
                    };
                    (
                        placement.map(|p| p.active.clone()),
                        placement.map(|p| p.replicas.join(",")),
                        offset,
                        lag,
                    )
                }
                None => (
                    Some("local".to_string()),
                    Some(String::new()),
                    log_end(&task),
                    Some(0),
                ),
            };
            let opt_text = |v: Option<String>| v.map_or(Cell::Null, Cell::text);
            let opt_int = |v: Option<u64>| v.map_or(Cell::Null, |v| Cell::I64(v as i64));
            rows.push(vec![
                Cell::text(stream.name.as_str()),
                Cell::text(partitioner),
                Cell::I32(task.partition as i32),
                opt_text(active),
                opt_text(replicas),
                opt_int(offset),
                opt_int(lag),
            ]);
        }
        Ok(Executed::rows(columns, rows))
    }
}
