//! The database: catalog, engine and the execution of every statement kind.
//!
//! Invariants: DDL is serialised (`ddl` lock) and swaps in a whole new catalog only after
//! the shards installed it and the catalog file was rewritten; a statement that fails
//! before reaching the engine has applied nothing.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::time::Instant;

use pgwire::api::Type;

use eddy_cluster::{
    Engine, EventLog, Kafka, LocalLog, NodeStorage, Outcome, Row, Sequence, Task, TaskId, Turn,
};
use eddy_planner::access::{Need, SUPERUSER};
use eddy_planner::aggregate::ResultType;
use eddy_planner::bind::{no_parameter, InsertPlan, InsertTemplate, ReturningItem};
use eddy_planner::catalog::{Catalog, StreamDef};
use eddy_planner::dag::StreamDag;
use eddy_planner::ddl::{self, DdlOutcome};
use eddy_planner::filter::batch_to_rows;
use eddy_planner::sql::{self, Statement};
use eddy_planner::types::format_duration_us;
use eddy_planner::{Error, ErrorKind, Result};
use futures::stream::{FuturesOrdered, StreamExt};

use crate::ops::histogram::Timings;
use crate::ops::limits::{Limit, Limits};
use crate::session::cells::{cell_of, pg_type, Cell, Column};
use crate::session::copy::{CopyIn, CopyLines};
use crate::session::settings::{ServerDefaults, Setting};
use crate::session::subscribe::{
    self, ContinuousQuery, Opening, Registry, Subscription, SubscriptionHandle,
};
use crate::sql::history::Notice;
use crate::sql::query;

/// The catalog's CREATE statements, in the data directory.
const CATALOG_FILE: &str = "catalog.sql";
/// The data directory's lock file: held (flock) by the one server that uses the
/// directory, with its PID inside.
const LOCK_FILE: &str = "eddy.pid";
/// The embedded log's directory under the data directory.
const LOG_DIR: &str = "log";
/// Separates statements in the catalog file (a line of its own).
const CATALOG_SEPARATOR: &str = eddy_planner::catalog::STATEMENT_END;

/// The lock on a data directory, held for the server's life. The OS lets go of it when
/// the process ends however it ends (kill -9 included), so no stale lock outlives it.
pub struct DirLock {
    _file: std::fs::File,
}

impl DirLock {
    /// Takes `data_dir` (made if missing) for this process, or says which process has it:
    /// two servers on one directory would each remove what the other still reads.
    pub fn take(data_dir: &Path) -> anyhow::Result<DirLock> {
        use std::io::{Read, Seek, Write};
        std::fs::create_dir_all(data_dir)?;
        let path = data_dir.join(LOCK_FILE);
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)?;
        match file.try_lock() {
            Ok(()) => {}
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                anyhow::bail!(
                    "the data directory {} is in use by another eddy (PID {}): stop it first, \
                     or give this one another --data-dir",
                    data_dir.display(),
                    pid.trim()
                );
            }
            Err(std::fs::TryLockError::Error(e)) => {
                anyhow::bail!("could not lock {}: {e}", path.display())
            }
        }
        file.set_len(0)?;
        file.rewind()?;
        writeln!(file, "{}", std::process::id())?;
        Ok(DirLock { _file: file })
    }
}

/// What a statement produced.
pub enum Output {
    Rows {
        columns: Vec<Column>,
        rows: Vec<Vec<Cell>>,
        tag: &'static str,
    },
    Command {
        tag: &'static str,
        rows: Option<usize>,
    },
    CopyIn(CopyIn),
    /// `COPY (query) TO STDOUT`: the lines to send, one per row.
    CopyOut {
        columns: usize,
        /// Made as they are sent: a COPY holds a batch of rows, not its result.
        lines: futures::stream::BoxStream<'static, Result<Vec<u8>>>,
    },
    Begin,
    /// COMMIT or ROLLBACK, with its tag.
    Commit(&'static str),
    Empty,
}

/// A statement's output and the notices to send before it.
pub struct Executed {
    pub output: Output,
    pub notices: Vec<Notice>,
}

impl Executed {
    fn new(output: Output) -> Executed {
        Executed {
            output,
            notices: Vec::new(),
        }
    }

    pub fn command(tag: &'static str) -> Executed {
        Executed::new(Output::Command { tag, rows: None })
    }

    pub fn rows(columns: Vec<Column>, rows: Vec<Vec<Cell>>) -> Executed {
        Executed::new(Output::Rows {
            columns,
            rows,
            tag: "SHOW",
        })
    }

    /// The rows of a SELECT (tagged `SELECT n`).
    pub fn selected(columns: Vec<Column>, rows: Vec<Vec<Cell>>) -> Executed {
        Executed::new(Output::Rows {
            columns,
            rows,
            tag: "SELECT",
        })
    }

    /// The rows of a FETCH (tagged `FETCH n`).
    pub fn fetched(columns: Vec<Column>, rows: Vec<Vec<Cell>>) -> Executed {
        Executed::new(Output::Rows {
            columns,
            rows,
            tag: "FETCH",
        })
    }
}

/// Query contexts of the current catalog, by session time zone.
type QueryContexts = HashMap<Arc<str>, datafusion::prelude::SessionContext>;

/// What `Db::is_current` compares: a catalog's address.
fn address(catalog: &Arc<Catalog>) -> usize {
    Arc::as_ptr(catalog) as usize
}

pub struct Db {
    /// Read with `catalog`, replaced with `set_catalog`.
    catalog: RwLock<Arc<Catalog>>,
    /// The address of the current catalog, for `is_current`: a prepared statement checks
    /// its binding against it at every execution, which the lock and the reference count
    /// would make a cache line shared by every session thread.
    current_catalog: std::sync::atomic::AtomicUsize,
    /// The DataFusion contexts of the current catalog, built once per catalog change and
    /// time zone.
    query_ctx: std::sync::Mutex<Option<(Arc<Catalog>, QueryContexts)>>,
    pub(crate) engine: Arc<Engine>,
    pub(crate) data_dir: PathBuf,
    pub(crate) ddl: tokio::sync::Mutex<()>,
    subscriptions: Arc<Registry>,
    /// The limits clients meet (`limits`), as `ALTER SYSTEM` last set them.
    pub(crate) limits: Arc<Limits>,
    /// The server's defaults of `synchronous_commit` and `statement_timeout`.
    session_defaults: ServerDefaults,
    timings: Arc<Timings>,
    /// The front door, for its connection counts in `/metrics`.
    pub(crate) door: std::sync::OnceLock<Arc<crate::wire::Door>>,
    /// Statements running now.
    pub(crate) running: std::sync::atomic::AtomicI64,
    lock: DirLock,
}

impl Db {
    /// Opens the data directory, replays the catalog file and starts the shards.
    /// With `kafka`, Kafka is the log and the catalog topic the catalog's source.
    pub async fn open(
        lock: DirLock,
        config: &crate::ops::config::Config,
    ) -> anyhow::Result<Arc<Db>> {
        let data_dir = config.data_dir.as_path();
        let kafka = config.kafka.clone();
        std::fs::create_dir_all(data_dir)?;
        eddy_cluster::format::open_dir(data_dir).map_err(|e| anyhow::anyhow!(e))?;
        check_log_kind(data_dir, kafka.is_some())?;
        let storage = NodeStorage::open(data_dir, config.storage)
            .map_err(|e| anyhow::anyhow!("opening the state store: {e}"))?;
        let path = data_dir.join(CATALOG_FILE);
        let mut statements: Vec<String> = if path.exists() {
            std::fs::read_to_string(&path)?
                .split(CATALOG_SEPARATOR)
                .filter(|s| !s.trim().is_empty())
                .map(str::to_string)
                .collect()
        } else {
            Vec::new()
        };
        let mut publish = false;
        let log: Arc<dyn EventLog> = match kafka {
            None => Arc::new(LocalLog::open(
                &data_dir.join(LOG_DIR),
                config.commit_delay,
            )?),
            Some(config) => {
                let kafka = Kafka::connect(config)
                    .await
                    .map_err(|e| anyhow::anyhow!("connecting to Kafka: {e}"))?;
                let published = kafka
                    .read_catalog()
                    .map_err(|e| anyhow::anyhow!("reading the catalog topic: {e}"))?;
                // The catalog topic is the truth; a node that has one nobody published
                // (its first start in cluster mode) publishes it.
                if published.is_empty() {
                    publish = !statements.is_empty();
                } else {
                    statements = published;
                }
                kafka
            }
        };
        let engine = Arc::new(Engine::start_pinned(
            config.shards,
            config.pinning.clone(),
            log,
            Some(Arc::new(storage)),
        ));
        // Every checkpoint, whoever asks for it, in the histogram.
        let timings = Arc::new(Timings::default());
        let hook = {
            let timings = timings.clone();
            move |took| timings.checkpoint.record(took)
        };
        let _ = engine
            .checkpoints
            .on_done
            .set(eddy_cluster::engine::CheckpointHook(Box::new(hook)));
        eddy_cluster::peer::start(&engine)
            .map_err(|e| anyhow::anyhow!("starting the peer service: {e}"))?;
        let catalog =
            catalog_of(&statements).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        persist(data_dir, &catalog)?;
        if let (Some(kafka), true) = (engine.log_as::<Kafka>(), publish) {
            kafka
                .publish_catalog(&Catalog::default(), &catalog)
                .await
                .map_err(|e| anyhow::anyhow!("publishing the catalog: {e}"))?;
        }
        let catalog = Arc::new(catalog);
        engine
            .apply_catalog(catalog.clone())
            .await
            .map_err(|e| anyhow::anyhow!("installing the catalog: {e}"))?;
        let replayed = engine
            .recover(&catalog)
            .await
            .map_err(|e| anyhow::anyhow!("replaying the log: {e}"))?;
        if replayed > 0 {
            tracing::info!("replayed {replayed} logged events");
        }
        // What was recovered becomes the new base: the replayed log can go. On a full
        // disk the log stays, and a later checkpoint tries again.
        match engine.checkpoint().await {
            Ok(_) => {}
            Err(e) if e.kind == eddy_planner::ErrorKind::DiskFull => {
                tracing::warn!("checkpointing after recovery: {e}; the log is kept")
            }
            Err(e) => anyhow::bail!("checkpointing after recovery: {e}"),
        }
        // What ALTER SYSTEM kept, under the limits and the session defaults alike.
        let kept = crate::ops::settings::load(data_dir)?;
        let db = Arc::new(Db {
            current_catalog: std::sync::atomic::AtomicUsize::new(address(&catalog)),
            catalog: RwLock::new(catalog),
            query_ctx: std::sync::Mutex::new(None),
            engine,
            data_dir: data_dir.to_path_buf(),
            ddl: tokio::sync::Mutex::new(()),
            subscriptions: Arc::new(Registry::default()),
            timings,
            door: Default::default(),
            running: Default::default(),
            limits: Arc::new(Limits::from_layers(&config.limits, &kept)),
            session_defaults: session_defaults(config, &kept)?,
            lock,
        });
        let weak = Arc::downgrade(&db);
        let checkpoint_interval = config.checkpoint_interval;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(checkpoint_interval).await;
                let Some(db) = weak.upgrade() else { break };
                match db.engine.checkpoint().await {
                    Ok(_) => {}
                    Err(_) if db.engine.is_closing() => break,
                    Err(e) => tracing::warn!("checkpoint failed: {e}"),
                }
            }
        });
        Ok(db)
    }

    /// Takes a checkpoint now (clean shutdown, tests).
    pub async fn checkpoint(&self) -> Result<(std::time::Duration, std::time::Duration)> {
        self.engine.checkpoint().await
    }

    pub fn catalog(&self) -> Arc<Catalog> {
        self.catalog.read().expect("catalog lock").clone()
    }

    /// Makes `next` the catalog statements run against.
    pub(crate) fn set_catalog(&self, next: Arc<Catalog>) {
        let mut current = self.catalog.write().expect("catalog lock");
        self.current_catalog
            .store(address(&next), std::sync::atomic::Ordering::SeqCst);
        *current = next;
    }

    /// Whether `catalog` is the current one, with no lock taken and no reference
    /// counted. (Its holder keeps it alive, so no other catalog can have its address.)
    pub fn is_current(&self, catalog: &Arc<Catalog>) -> bool {
        self.current_catalog
            .load(std::sync::atomic::Ordering::SeqCst)
            == address(catalog)
    }

    /// Counts a statement as running until the guard goes (`eddy_connections`).
    pub fn running(&self) -> Running<'_> {
        self.running
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Running(&self.running)
    }

    /// Counts a statement's time in its histogram, and logs it when slow.
    pub fn statement_done(&self, kind: crate::ops::histogram::Kind, sql: &str, started: Instant) {
        let elapsed = started.elapsed();
        self.timings.statement(kind, elapsed);
        crate::ops::log::statement_done(sql, elapsed);
    }

    pub fn limits(&self) -> &Arc<Limits> {
        &self.limits
    }

    pub fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }

    /// The engine and the data directory's lock, with everything else of the database
    /// (its query context's tables hold the engine too) dropped.
    pub fn into_engine(self) -> (Arc<Engine>, DirLock) {
        (self.engine, self.lock)
    }

    /// A DataFusion context with every stream and metric of the current catalog as a
    /// table, in the running statement's session time zone; cached until the catalog
    /// changes (each query still gets its own state).
    pub fn query_context(&self) -> Result<datafusion::prelude::SessionContext> {
        let catalog = self.catalog();
        query::with_session_time_zone(|zone| {
            let mut cached = self.query_ctx.lock().expect("query context lock");
            let contexts = match cached.as_mut() {
                Some((c, contexts)) if Arc::ptr_eq(c, &catalog) => contexts,
                _ => &mut cached.insert((catalog.clone(), HashMap::new())).1,
            };
            if let Some(ctx) = contexts.get(zone) {
                return Ok(ctx.clone());
            }
            let ctx = query::context(&catalog, &self.engine, zone)?;
            contexts.insert(Arc::from(zone), ctx.clone());
            Ok(ctx)
        })
    }

    /// Starts a continuous query (`sql` without `EMIT CHANGES`). DDL waits meanwhile,
    /// so the target cannot vanish between planning and attaching.
    pub async fn subscribe(&self, sql: &str, opening: Opening) -> Result<SubscriptionHandle> {
        let _guard = self.ddl.lock().await;
        let query = ContinuousQuery::plan(&self.catalog(), sql).await?;
        let open = self.subscriptions.open_count() as u64;
        self.limits
            .check(Limit::Subscriptions, open + 1, "open subscriptions")?;
        subscribe::open(&self.subscriptions, &self.engine, query, opening).await
    }

    /// Executes one statement's text.
    pub async fn execute(&self, text: &str) -> Result<Executed> {
        self.execute_statement(sql::parse_statement(text)?).await
    }

    /// Executes a parsed statement as the superuser. Cursors and continuous queries
    /// belong to a session and are run there (`pg::Session`).
    pub async fn execute_statement(&self, stmt: Statement) -> Result<Executed> {
        self.execute_by(SUPERUSER, stmt).await
    }

    /// Fails with 42501 unless `role` may run `stmt`. DDL is judged when it runs
    /// (`ddl`), against the catalog it makes.
    pub async fn authorize(&self, role: &str, stmt: &Statement) -> Result<()> {
        let catalog = self.catalog();
        if catalog.access.is_superuser(role) {
            return Ok(());
        }
        let needs = match stmt {
            Statement::Insert(insert) => {
                let template = eddy_planner::bind::InsertTemplate::new(&catalog, insert)?;
                vec![Need::Insert(template.stream.name.clone())]
            }
            Statement::Copy(copy) => {
                vec![Need::Insert(
                    CopyIn::bind(&catalog, copy)?.stream.name.clone(),
                )]
            }
            Statement::Query(q) | Statement::Subscribe(q) => self.reads(q).await?,
            Statement::Declare { query, .. } => self.reads(query).await?,
            Statement::CopyOut(copy) => self.reads(&copy.query).await?,
            Statement::AlterSystem { .. } | Statement::Checkpoint | Statement::Backup(_) => {
                vec![Need::Superuser]
            }
            _ => Vec::new(),
        };
        catalog.access.check(catalog.as_ref(), role, &needs)
    }

    /// SELECT on every stream and metric a query reads.
    async fn reads(&self, sql: &str) -> Result<Vec<Need>> {
        let ctx = self.query_context()?;
        let (plan, _, _) = query::describe(&ctx, sql).await?;
        Ok(query::tables_read(&plan)
            .into_iter()
            .map(Need::Select)
            .collect())
    }

    /// Executes a parsed statement for `role`, which `authorize` let run it (DDL is
    /// judged here).
    pub async fn execute_by(&self, role: &str, stmt: Statement) -> Result<Executed> {
        match stmt {
            Statement::CreateStream { .. }
            | Statement::CreateMetric(_)
            | Statement::DropStream { .. }
            | Statement::DropMetric { .. }
            | Statement::AlterStreamAddColumn { .. }
            | Statement::Access(_) => self.ddl(role, stmt).await,
            Statement::ShowStreams => self.show_streams().await,
            Statement::ShowMetrics => Ok(self.show_metrics()),
            Statement::Describe(name) => self.describe(&name),
            Statement::ExplainStream(name, dot) => {
                let catalog = self.catalog();
                let stream = catalog
                    .stream(&name)
                    .ok_or_else(|| eddy_planner::bind::undefined_stream(&name))?;
                let dag = StreamDag::new(&catalog, stream);
                if dot {
                    return Ok(plan_rows(dag.dot(None)));
                }
                let mut lines = dag.explain_stream();
                lines.extend(where_it_runs(&catalog, stream, self.engine.shards()));
                Ok(plan_rows(lines))
            }
            Statement::ExplainMetric(name, dot) => {
                let catalog = self.catalog();
                let metric = catalog
                    .metric(&name)
                    .ok_or_else(|| undefined_metric(&name))?;
                let stream = catalog
                    .stream(&metric.stream)
                    .ok_or_else(|| Error::internal("metric without stream"))?;
                let dag = StreamDag::new(&catalog, stream);
                Ok(plan_rows(if dot {
                    dag.dot(Some(&name))
                } else {
                    dag.explain_metric(&name)
                }))
            }
            Statement::Insert(insert) => {
                let plan = self.bind_insert(&insert).await?;
                self.insert(plan, true).await
            }
            Statement::Copy(copy) => {
                let catalog = self.catalog();
                let mut copy = CopyIn::bind(&catalog, &copy)?;
                copy.limit(self.limits.clone());
                // Parsing and checking rows is stateless: any shard, in turn.
                let engine = self.engine.clone();
                copy.parse_with(Arc::new(move |job| engine.run_anywhere(job)));
                Ok(Executed::new(Output::CopyIn(copy)))
            }
            Statement::Query(sql) => {
                let ctx = self.query_context()?;
                let (result, notices) =
                    crate::sql::history::noticed(query::run_within(&ctx, &sql, &self.limits)).await;
                let (columns, rows) = result?;
                Ok(Executed {
                    notices,
                    ..Executed::new(Output::Rows {
                        columns,
                        rows,
                        tag: "SELECT",
                    })
                })
            }
            Statement::CopyOut(copy) if !copy.subscribe => {
                let ctx = self.query_context()?;
                let (result, notices) =
                    crate::sql::history::noticed(query::run_stream(&ctx, &copy.query)).await;
                let (columns, rows) = result?;
                let mut encoder = CopyLines::new(&columns, &copy);
                let header = encoder.header().map(Ok);
                use futures::StreamExt;
                let lines = futures::stream::iter(header)
                    // A batch's lines in one CopyData message.
                    .chain(rows.map(move |batch| batch.map(|b| encoder.batch(&b))))
                    .boxed();
                Ok(Executed {
                    notices,
                    ..Executed::new(Output::CopyOut {
                        columns: columns.len(),
                        lines,
                    })
                })
            }
            Statement::ShowSubscriptions => Ok(self.show_subscriptions()),
            Statement::ShowStorage => self.show_storage().await,
            Statement::Backup(dir) => self.backup(&dir).await,
            Statement::Checkpoint => {
                self.engine.checkpoint().await?;
                Ok(Executed::new(Output::Command {
                    tag: "CHECKPOINT",
                    rows: None,
                }))
            }
            Statement::ShowCluster => Ok(self.show_cluster()),
            Statement::ShowTasks => self.show_tasks().await,
            Statement::ShowShards => self.show_shards().await,
            Statement::AlterSystem { name, value } => {
                self.alter_system(&name, value.as_deref()).await
            }
            Statement::Subscribe(_)
            | Statement::CopyOut(_)
            | Statement::Declare { .. }
            | Statement::Fetch(_)
            | Statement::Close(_)
            | Statement::Prepare { .. }
            | Statement::Execute { .. }
            | Statement::Deallocate(_) => Err(Error::internal(
                "cursors, prepared statements and continuous queries run in a session",
            )),
            // A PostgreSQL parameter Eddy has no use for is accepted, as drivers set many.
            Statement::SetVariable { name, .. } if Setting::named(&name).is_none() => {
                crate::session::settings::check_other(&name)?;
                Ok(Executed::new(Output::Command {
                    tag: "SET",
                    rows: None,
                }))
            }
            Statement::Set | Statement::SetVariable { .. } | Statement::Reset(_) => {
                Ok(Executed::new(Output::Command {
                    tag: "SET",
                    rows: None,
                }))
            }
            Statement::ShowVariable(name) if name == "limits" => Ok(Executed::rows(
                ["name", "setting", "default", "what it bounds"]
                    .into_iter()
                    .map(Column::text)
                    .collect(),
                self.limits
                    .table()
                    .into_iter()
                    .map(|row| row.into_iter().map(Cell::text).collect())
                    .collect(),
            )),
            Statement::ShowVariable(name) => match self.limits.show(&name) {
                Some(value) => Ok(Executed::rows(
                    vec![Column::text(&name)],
                    vec![vec![Cell::text(value)]],
                )),
                None => show_variable(&name, role),
            },
            Statement::Begin => Ok(Executed::new(Output::Begin)),
            Statement::Commit => Ok(Executed::new(Output::Commit("COMMIT"))),
            Statement::Rollback => Ok(Executed::new(Output::Commit("ROLLBACK"))),
            Statement::Empty => Ok(Executed::new(Output::Empty)),
        }
    }

    async fn ddl(&self, role: &str, mut stmt: Statement) -> Result<Executed> {
        // Only a verifier of a password reaches the catalog.
        if let Statement::Access(access) = &mut stmt {
            if let Some(password) = access.password_mut() {
                *password = crate::wire::scram::verifier_of(password)?;
            }
            // A role's session default is checked, and kept as SHOW gives it.
            if let eddy_planner::access::AccessStatement::RoleSetting {
                name: Some(name),
                value,
                ..
            } = access
            {
                let setting = Setting::parse(name)?;
                *name = setting.name().to_ascii_lowercase();
                if let Some(value) = value {
                    *value = setting.canonical(value)?;
                }
            }
        }
        let _guard = self.ddl.lock().await;
        let current = self.catalog();
        let (
            mut next,
            DdlOutcome {
                tag,
                notice,
                changed,
            },
        ) = ddl::apply(&current, &stmt)?;
        let needs = ddl::needs(&current, &next, role, &stmt);
        current.access.check(current.as_ref(), role, &needs)?;
        // What a role other than a superuser creates is its own.
        if !current.access.is_superuser(role) {
            let created = match &stmt {
                Statement::CreateStream { create, .. } => Some(sql::object_name(&create.name)),
                Statement::CreateMetric(m) => Some(m.name.clone()),
                _ => None,
            };
            if let Some(name) = created.filter(|_| changed) {
                next.access.owners.insert(name, role.to_string());
            }
        }
        let external = next.streams.values().find(|s| s.source.is_some());
        if let (Some(s), None) = (external, self.engine.log_as::<Kafka>()) {
            return Err(Error::new(
                ErrorKind::Unsupported,
                format!(
                    "stream \"{}\" reads a Kafka topic, but this node has no Kafka",
                    s.name
                ),
            )
            .with_hint("Start eddy with --kafka host:port (cluster mode), or drop kafka_topic."));
        }
        if changed {
            let next = Arc::new(next);
            // The shards first, then the file: if either fails, the shards go back to the
            // current catalog, so a failed statement leaves nothing behind.
            let applied = match self.engine.apply_catalog(next.clone()).await {
                // The log follows: logs of dropped or re-created streams go, so a
                // later stream of the same name starts empty; Kafka's catalog topic
                // gets the change.
                Ok(()) => match self.engine.install_log(&current, &next).await {
                    Ok(()) => persist(&self.data_dir, &next),
                    Err(e) => Err(e),
                },
                Err(e) => Err(e),
            };
            if let Err(e) = applied {
                self.engine.apply_catalog(current).await?;
                return Err(e);
            }
            self.set_catalog(next);
            // Recovery restarts from a checkpoint that already has the new metrics.
            self.engine.checkpoint().await?;
        }
        Ok(Executed {
            output: Output::Command { tag, rows: None },
            notices: notice.into_iter().map(Notice::from).collect(),
        })
    }

    /// Ingests a bound INSERT and answers it (with RETURNING, each row's values).
    pub async fn insert(
        &self,
        plan: eddy_planner::bind::InsertPlan,
        durable: bool,
    ) -> Result<Executed> {
        let mut inserting = self.inserting(&plan, durable)?;
        let mut rows = Vec::with_capacity(plan.returning.as_ref().map_or(0, |_| plan.rows.len()));
        while let Some(part) = inserting.next_part().await? {
            rows.extend(part);
        }
        Ok(inserting.finish(plan.returning.is_some().then_some(rows)))
    }

    /// Submits a bound INSERT to the engine; its answers come part by part
    /// (`Inserting::next_part`).
    ///
    /// A statement of more than `INSERT_PART_ROWS` rows goes to the engine in parts, all
    /// submitted (logged, in order) before the first is awaited: the shards apply one
    /// part while the caller answers the one before. Every check that can fail on a
    /// row runs before the first part is submitted.
    pub fn inserting<'a>(
        &'a self,
        plan: &'a eddy_planner::bind::InsertPlan,
        durable: bool,
    ) -> Result<Inserting<'a>> {
        let n = plan.rows.len();
        self.limits
            .check(Limit::InsertRows, n as u64, "rows in the INSERT")?;
        for row in &plan.rows {
            Task::event_time(&plan.stream, row)?;
        }
        let values = (n * plan.stream.columns.len()) as u64 * 16;
        self.engine
            .admit(log_bytes(&plan.stream, values, n as u64, durable))?;
        let want = plan.returning.is_some();
        let polling = (durable && self.engine.log().poll_while_durable())
            .then(crate::wire::busy::Committing::start);
        let started = Instant::now();
        let parts = plan
            .rows
            .chunks(INSERT_PART_ROWS)
            .map(|part| -> (&[Row], PartReplies<'a>) {
                let replies = self.engine.submit(
                    &plan.stream,
                    part.to_vec(),
                    None,
                    want,
                    durable,
                    Turn::alone(),
                );
                (part, Box::pin(replies))
            })
            .collect();
        Ok(Inserting {
            db: self,
            plan,
            parts,
            skipped: Skipped::default(),
            at: vec![0; plan.returning.as_ref().map_or(0, Vec::len)],
            started,
            _polling: polling,
        })
    }

    /// Parses and applies a finished COPY; nothing is applied if any row is bad, or if
    /// the disk has no room for all of it.
    pub async fn finish_copy(&self, copy: CopyIn, durable: bool) -> Result<Executed> {
        // Every check that can fail ran before the first row reaches a task.
        let copy = copy.finish().await?;
        let stream = copy.stream;
        // Room for the whole COPY before its first batch: one refused for space applies
        // nothing.
        let values: usize = copy
            .batches
            .iter()
            .flat_map(|(b, _)| b.columns())
            .map(|c| c.to_data().get_slice_memory_size().unwrap_or(0))
            .sum();
        self.engine
            .admit(log_bytes(&stream, values as u64, copy.rows as u64, durable))?;
        let mut skipped = Skipped::default();
        // `COPY_IN_FLIGHT` batches at once: the shards apply one while this thread makes
        // the rows of the next, so neither waits for the other. The batches take their
        // turns in input order (`Sequence`), and while the oldest one's answers are
        // awaited the later ones are polled too: a log that takes a batch only when its
        // future runs (Kafka) sends them meanwhile.
        let mut order = Sequence::default();
        let mut in_flight = FuturesOrdered::new();
        let mut applied = |(started, replies): (Instant, Result<Vec<eddy_cluster::EventReply>>)| {
            self.timings.ingest.record(started.elapsed());
            replies.map(|rs| rs.iter().for_each(|r| skipped.count(&r.outcomes)))
        };
        // Each batch is dropped once its rows are made: the engine's state grows as the
        // parsed COPY shrinks, so the two do not peak together. A log whose statements
        // cost much gets several batches in one.
        let least = self.engine.log().statement_events_min();
        let mut batches = copy.batches.into_iter();
        while let Some((batch, mut passes)) = batches.next() {
            let mut rows: Vec<Row> = batch_to_rows(&batch)?;
            drop(batch);
            while rows.len() < least {
                let Some((batch, more)) = batches.next() else {
                    break;
                };
                rows.extend(batch_to_rows(&batch)?);
                passes = passes.zip(more).map(|(mut p, more)| {
                    p.append(&more);
                    p
                });
            }
            let replies =
                self.engine
                    .submit(&stream, rows, passes.as_ref(), false, durable, order.turn());
            let started = Instant::now();
            in_flight.push_back(async move { (started, replies.await) });
            if in_flight.len() == COPY_IN_FLIGHT {
                applied(in_flight.next().await.expect("a batch in flight"))?;
            }
        }
        while let Some(done) = in_flight.next().await {
            applied(done)?;
        }
        Ok(Executed {
            output: Output::Command {
                tag: "COPY",
                rows: Some(copy.rows),
            },
            notices: skipped.notices(&stream),
        })
    }

    async fn show_streams(&self) -> Result<Executed> {
        let catalog = self.catalog();
        let report = self.engine.report().await?;
        let columns = vec![
            Column::text("name"),
            Column::text("event_time"),
            Column::text("partition_by"),
            Column::new("partitions", Type::INT4),
            Column::text("lateness"),
            Column::text("retention"),
            Column::new("metrics", Type::INT8),
            Column::new("events", Type::INT8),
            Column::new("late", Type::INT8),
            Column::new("duplicates", Type::INT8),
            Column::new("stored", Type::INT8),
        ];
        let rows = catalog
            .streams
            .values()
            .map(|s| {
                // Every partitioner sees every event; count them once, from the first.
                let first: Vec<_> = report
                    .iter()
                    .filter(|r| r.task.stream == s.name && r.task.partitioner == 0)
                    .collect();
                let sum = |f: &dyn Fn(&eddy_cluster::TaskReport) -> u64,
                           rs: &[&eddy_cluster::TaskReport]| {
                    rs.iter().map(|r| f(r)).sum::<u64>() as i64
                };
                vec![
                    Cell::text(s.name.as_str()),
                    Cell::text(s.columns[s.event_time].name.as_str()),
                    Cell::text(
                        s.partitioners
                            .iter()
                            .map(|p| s.columns[*p].name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
                    Cell::I32(s.tasks_per_partitioner() as i32),
                    Cell::text(duration_text(s.lateness_us)),
                    Cell::text(duration_text(s.retention_us)),
                    Cell::I64(catalog.metrics_of(&s.name).len() as i64),
                    Cell::I64(sum(&|r| r.stats.accepted, &first)),
                    Cell::I64(sum(&|r| r.stats.late, &first)),
                    Cell::I64(sum(&|r| r.stats.duplicates, &first)),
                    Cell::I64(sum(&|r| r.stored_events as u64, &first)),
                ]
            })
            .collect();
        Ok(Executed::new(Output::Rows {
            columns,
            rows,
            tag: "SHOW",
        }))
    }

    /// Per stream: what its tasks hold and what its log holds on disk.
    /// Each shard: the PU, core and NUMA node it is pinned to (NULL when unpinned), its
    /// tasks, the events they accepted, and the commands waiting in its queue.
    async fn show_shards(&self) -> Result<Executed> {
        let columns = vec![
            Column::new("shard", Type::INT4),
            Column::new("pu", Type::INT4),
            Column::new("core", Type::INT4),
            Column::new("numa_node", Type::INT4),
            Column::new("tasks", Type::INT4),
            Column::new("events", Type::INT8),
            Column::new("queue_depth", Type::INT4),
        ];
        let int = |v: Option<usize>| v.map_or(Cell::Null, |v| Cell::I32(v as i32));
        let rows = self
            .engine
            .shard_report()
            .await?
            .into_iter()
            .map(|s| {
                vec![
                    Cell::I32(s.shard as i32),
                    int(s.place.map(|p| p.pu)),
                    int(s.place.map(|p| p.core)),
                    int(s.place.map(|p| p.numa)),
                    Cell::I32(s.tasks as i32),
                    Cell::I64(s.events as i64),
                    Cell::I32(s.queue_depth as i32),
                ]
            })
            .collect();
        Ok(Executed::rows(columns, rows))
    }

    /// `BACKUP TO '/dir'` (`ops::backup`): one row, what was written and the checkpoint
    /// it restores to.
    async fn backup(&self, dir: &str) -> Result<Executed> {
        let dest = crate::ops::backup::check_destination(&self.data_dir, dir)?;
        // No DDL meanwhile: DROP STREAM deletes logs and reservoirs.
        let _ddl = self.ddl.lock().await;
        let started = Instant::now();
        let data_dir = self.data_dir.clone();
        let taken_at = chrono::Utc::now();
        let (copied, checkpoint) = self
            .engine
            .checkpoint_then(move |n| {
                crate::ops::backup::copy_data_dir(&data_dir, &dest, n).map(|c| (c, n))
            })
            .await?;
        tracing::info!(
            "backup to {dir}: {} files, {} bytes copied, checkpoint {checkpoint}, in {} ms",
            copied.files,
            copied.bytes,
            started.elapsed().as_millis()
        );
        Ok(Executed::rows(
            vec![
                Column::text("directory"),
                Column::new("files", Type::INT8),
                Column::new("bytes", Type::INT8),
                Column::new("checkpoint", Type::INT8),
                Column::text("recovery_point"),
            ],
            vec![vec![
                Cell::text(dir),
                Cell::I64(copied.files as i64),
                Cell::I64(copied.bytes as i64),
                Cell::I64(checkpoint as i64),
                Cell::text(taken_at.format("%Y-%m-%d %H:%M:%S%.6f+00").to_string()),
            ]],
        ))
    }

    async fn show_storage(&self) -> Result<Executed> {
        let catalog = self.catalog();
        let report = self.engine.report().await?;
        let columns = vec![
            Column::text("stream"),
            Column::new("tasks", Type::INT4),
            Column::new("events", Type::INT8),
            Column::new("late", Type::INT8),
            Column::new("duplicates", Type::INT8),
            Column::new("stored_events", Type::INT8),
            Column::new("log_bytes", Type::INT8),
            Column::new("reservoir_bytes", Type::INT8),
            Column::new("chunks", Type::INT8),
            Column::new("compression_ratio", Type::FLOAT8),
            Column::new("chunk_cache_hits", Type::INT8),
            Column::new("chunk_cache_misses", Type::INT8),
            Column::new("l1_hits", Type::INT8),
            Column::new("l2_hits", Type::INT8),
            Column::new("state_reads", Type::INT8),
            Column::new("disk_free_bytes", Type::INT8),
            Column::new("disk_reserve_bytes", Type::INT8),
        ];
        let (free, reserve) = match self.engine.storage() {
            Some(s) => (
                Cell::I64(s.space.read().free as i64),
                Cell::I64(s.space.reserve_bytes() as i64),
            ),
            None => (Cell::Null, Cell::Null),
        };
        let rows = catalog
            .streams
            .values()
            .map(|s| {
                let tasks: Vec<_> = report.iter().filter(|r| r.task.stream == s.name).collect();
                let first = tasks.iter().filter(|r| r.task.partitioner == 0);
                let (mut events, mut late, mut dups, mut stored) = (0u64, 0u64, 0u64, 0u64);
                for r in first {
                    events += r.stats.accepted;
                    late += r.stats.late;
                    dups += r.stats.duplicates;
                    stored += r.stored_events as u64;
                }
                let log_bytes = self
                    .engine
                    .log_as::<LocalLog>()
                    .map_or(0, |l| l.disk_bytes(&s.name));
                let sum = |f: &dyn Fn(&eddy_cluster::TaskReport) -> u64| -> i64 {
                    tasks.iter().map(|r| f(r)).sum::<u64>() as i64
                };
                let disk = sum(&|r| r.reservoir.disk_bytes);
                let raw = sum(&|r| r.reservoir.raw_bytes);
                let chunk = sum(&|r| r.reservoir.chunk_bytes);
                vec![
                    Cell::text(s.name.as_str()),
                    Cell::I32(tasks.len() as i32),
                    Cell::I64(events as i64),
                    Cell::I64(late as i64),
                    Cell::I64(dups as i64),
                    Cell::I64(stored as i64),
                    Cell::I64(log_bytes as i64),
                    Cell::I64(disk),
                    Cell::I64(sum(&|r| r.reservoir.chunks)),
                    if chunk > 0 {
                        Cell::F64(raw as f64 / chunk as f64)
                    } else {
                        Cell::Null
                    },
                    Cell::I64(sum(&|r| r.reservoir.cache_hits)),
                    Cell::I64(sum(&|r| r.reservoir.cache_misses)),
                    Cell::I64(sum(&|r| r.cache.l1_hits)),
                    Cell::I64(sum(&|r| r.cache.l2_hits)),
                    Cell::I64(sum(&|r| r.cache.misses)),
                    free.clone(),
                    reserve.clone(),
                ]
            })
            .collect();
        Ok(Executed::rows(columns, rows))
    }

    /// The node's counters in Prometheus' text format (`GET /metrics`).
    pub async fn metrics_text(&self) -> Result<String> {
        use crate::ops::metrics::{Families, Labels};
        let mut families = Families::default();
        let catalog = self.catalog();
        let report = self.engine.report().await?;
        // Per stream, summed over its tasks (`every_partitioner`) or over the first
        // partitioner's tasks only, which see each event once.
        let by_stream = |every_partitioner: bool,
                         f: &dyn Fn(&eddy_cluster::TaskReport) -> u64|
         -> Vec<(Labels, f64)> {
            catalog
                .streams
                .keys()
                .map(|name| {
                    let v: u64 = report
                        .iter()
                        .filter(|r| {
                            &r.task.stream == name && (every_partitioner || r.task.partitioner == 0)
                        })
                        .map(f)
                        .sum();
                    (vec![("stream", name.to_string())], v as f64)
                })
                .collect()
        };
        let per_stream = |f: &dyn Fn(&eddy_cluster::TaskReport) -> u64| by_stream(false, f);
        families.counter(
            "eddy_events_total",
            "Events accepted per stream.",
            per_stream(&|r| r.stats.accepted),
        );
        families.counter(
            "eddy_late_events_total",
            "Events older than stream time minus lateness, not applied.",
            per_stream(&|r| r.stats.late),
        );
        families.counter(
            "eddy_duplicate_events_total",
            "Events whose id was already applied, not applied again.",
            per_stream(&|r| r.stats.duplicates),
        );
        families.gauge(
            "eddy_stored_events",
            "Events held in the reservoirs of each stream.",
            per_stream(&|r| r.stored_events as u64),
        );
        if let Some(log) = self.engine.log_as::<LocalLog>() {
            let disk = catalog
                .streams
                .keys()
                .map(|n| (vec![("stream", n.to_string())], log.disk_bytes(n) as f64))
                .collect();
            families.gauge(
                "eddy_log_disk_bytes",
                "Bytes of each stream's embedded log on disk.",
                disk,
            );
            let s = log.stats();
            let get = |a: &std::sync::atomic::AtomicU64| {
                vec![(vec![], a.load(std::sync::atomic::Ordering::Relaxed) as f64)]
            };
            families.counter(
                "eddy_log_appends_total",
                "Statements made durable in the embedded log.",
                get(&s.appends),
            );
            families.counter(
                "eddy_log_records_total",
                "Event records appended to the embedded log.",
                get(&s.records),
            );
            families.counter(
                "eddy_log_bytes_total",
                "Bytes appended to the embedded log.",
                get(&s.bytes),
            );
            families.counter(
                "eddy_log_commits_total",
                "fsync rounds of the embedded log (group commits).",
                get(&s.commits),
            );
            families.counter(
                "eddy_log_commit_seconds_total",
                "Time spent in fsync rounds of the embedded log.",
                vec![(
                    vec![],
                    s.commit_micros.load(std::sync::atomic::Ordering::Relaxed) as f64 / 1e6,
                )],
            );
        }
        let all = |f: &dyn Fn(&eddy_cluster::TaskReport) -> u64| -> Vec<(Labels, f64)> {
            vec![(vec![], report.iter().map(f).sum::<u64>() as f64)]
        };
        families.gauge(
            "eddy_reservoir_disk_bytes",
            "Bytes of sealed event chunks on disk, per stream (all partitioners).",
            by_stream(true, &|r| r.reservoir.disk_bytes),
        );
        families.gauge(
            "eddy_reservoir_raw_bytes",
            "Uncompressed Arrow bytes of the sealed chunks.",
            all(&|r| r.reservoir.raw_bytes),
        );
        families.gauge(
            "eddy_reservoir_chunk_bytes",
            "Bytes of the live sealed chunks in their files (compression ratio = raw / chunk).",
            all(&|r| r.reservoir.chunk_bytes),
        );
        families.gauge(
            "eddy_reservoir_chunks",
            "Sealed event chunks.",
            all(&|r| r.reservoir.chunks),
        );
        families.counter(
            "eddy_chunk_cache_hits_total",
            "Chunk reads answered by the chunk cache (including chunks read ahead).",
            all(&|r| r.reservoir.cache_hits),
        );
        families.counter(
            "eddy_chunk_cache_misses_total",
            "Chunk reads that waited for the disk.",
            all(&|r| r.reservoir.cache_misses),
        );
        families.counter(
            "eddy_chunks_prefetched_total",
            "Chunks read ahead by the IO thread.",
            all(&|r| r.reservoir.prefetched),
        );
        families.counter(
            "eddy_state_l1_hits_total",
            "Group state lookups answered by the write-back cache (L1).",
            all(&|r| r.cache.l1_hits),
        );
        families.counter(
            "eddy_state_l2_hits_total",
            "Group state lookups answered by the write-through cache (L2).",
            all(&|r| r.cache.l2_hits),
        );
        families.counter(
            "eddy_state_misses_total",
            "Group state lookups that read RocksDB.",
            all(&|r| r.cache.misses),
        );
        families.counter(
            "eddy_state_writes_total",
            "Group states written to RocksDB (evictions and checkpoint flushes).",
            all(&|r| r.cache.writes),
        );
        if let Some(storage) = self.engine.storage() {
            let t = &storage.transfers;
            let load = |a: &std::sync::atomic::AtomicU64| {
                a.load(std::sync::atomic::Ordering::Relaxed) as f64
            };
            for (name, help, counter) in [
                (
                    "eddy_transfer_sent_bytes_total",
                    "Bytes of task checkpoints sent to peers.",
                    &t.sent_bytes,
                ),
                (
                    "eddy_transfer_received_bytes_total",
                    "Bytes of task checkpoints received from peers.",
                    &t.received_bytes,
                ),
                (
                    "eddy_transfer_reused_bytes_total",
                    "Bytes of segment files a recovering task already had, not sent again.",
                    &t.reused_bytes,
                ),
                (
                    "eddy_transfers_installed_total",
                    "Task checkpoints received from peers and installed.",
                    &t.installed,
                ),
                (
                    "eddy_transfers_rejected_total",
                    "Checkpoint transfers rejected (a checksum, order, or a transfer cut short).",
                    &t.rejected,
                ),
            ] {
                families.counter(name, help, vec![(vec![], load(counter))]);
            }
        }
        let c = &self.engine.checkpoints;
        let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
        families.counter(
            "eddy_checkpoints_total",
            "Checkpoints committed.",
            vec![(vec![], load(&c.count) as f64)],
        );
        families.counter("eddy_checkpoints_failed_total", "Checkpoints that failed (a full disk, say): the log keeps what they would have covered.",
            vec![(vec![], load(&c.failed) as f64)],
        );
        if let Some(storage) = self.engine.storage() {
            let space = &storage.space;
            let now = space.read();
            let dir: Labels = vec![("dir", space.dir().display().to_string())];
            families.gauge(
                "eddy_disk_free_bytes",
                "Bytes free on the data directory's filesystem.",
                vec![(dir.clone(), now.free as f64)],
            );
            families.gauge(
                "eddy_disk_size_bytes",
                "Size of the data directory's filesystem.",
                vec![(dir.clone(), now.total as f64)],
            );
            families.gauge(
                "eddy_disk_reserve_bytes",
                "Bytes the node keeps free: below them new events are refused (53100).",
                vec![(dir, space.reserve_bytes() as f64)],
            );
            families.counter(
                "eddy_disk_refused_statements_total",
                "Statements refused because the disk was below the reserve.",
                vec![(vec![], load(&space.refused) as f64)],
            );
        }
        families.gauge(
            "eddy_checkpoint_last_sync_seconds",
            "Synchronous stage of the last checkpoint (until every shard has its cut).",
            vec![(vec![], load(&c.last_sync_micros) as f64 / 1e6)],
        );
        families.gauge(
            "eddy_checkpoint_last_seconds",
            "Whole duration of the last checkpoint.",
            vec![(vec![], load(&c.last_total_micros) as f64 / 1e6)],
        );
        families.counter(
            "eddy_checkpoint_sync_seconds_total",
            "Synchronous stages of all checkpoints.",
            vec![(vec![], load(&c.sync_micros_total) as f64 / 1e6)],
        );
        if let Some(kafka) = self.engine.log_as::<Kafka>() {
            let k = &kafka.stats;
            for (name, help, counter) in [
                (
                    "eddy_kafka_published_total",
                    "Event records Kafka acknowledged.",
                    &k.published,
                ),
                (
                    "eddy_kafka_consumed_total",
                    "Event records handed to tasks.",
                    &k.consumed,
                ),
                (
                    "eddy_kafka_applied_at_ack_total",
                    "Event records of this node's statements applied as Kafka acknowledged them.",
                    &k.applied_at_ack,
                ),
                (
                    "eddy_kafka_skipped_total",
                    "Records below a task's position, skipped: applied at acknowledgement, or redelivered.",
                    &k.skipped,
                ),
                (
                    "eddy_kafka_quiet_pauses_total",
                    "Pauses of the task consumer's fetching after rounds of records already applied at acknowledgement.",
                    &k.quiet_pauses,
                ),
                (
                    "eddy_kafka_replies_sent_total",
                    "Reply records sent by tasks.",
                    &k.replies_sent,
                ),
                (
                    "eddy_kafka_replies_failed_total",
                    "Reply records Kafka did not take (their askers time out).",
                    &k.replies_failed,
                ),
                (
                    "eddy_kafka_replies_received_total",
                    "Reply records received by this node.",
                    &k.replies_received,
                ),
                (
                    "eddy_kafka_replies_local_total",
                    "Replies to this node's own statements, handed over in place of Kafka.",
                    &k.replies_local,
                ),
                (
                    "eddy_kafka_replies_refused_total",
                    "Reply slots refused: answered under an older plan than the one that made their task active where it is.",
                    &k.replies_refused,
                ),
                (
                    "eddy_kafka_assignments_total",
                    "Partition assignments the task consumer received (group rebalances).",
                    &k.assignments,
                ),
            ] {
                families.counter(name, help, vec![(vec![], load(counter) as f64)]);
            }
            let fence = kafka.fence();
            for (name, help, value) in [
                (
                    "eddy_kafka_reachable",
                    "1 while this node's beats come back from Kafka, 0 while the broker is unreachable.",
                    fence.reachable() as u8 as f64,
                ),
                (
                    "eddy_lease_remaining_seconds",
                    "How long this node's lease on its tasks still runs without a new beat (0: lapsed; it answers for no task).",
                    fence.remaining().as_secs_f64(),
                ),
                (
                    "eddy_plan_generation",
                    "The generation of the cluster plan this node applies.",
                    fence.generation() as f64,
                ),
            ] {
                families.gauge(name, help, vec![(vec![], value)]);
            }
            let roles = kafka.roles();
            let offsets: std::collections::HashMap<&eddy_cluster::TaskId, u64> =
                report.iter().map(|r| (&r.task, r.log_end)).collect();
            families.gauge(
                "eddy_task_active",
                "Tasks this node holds: 1 where it is the active copy, 0 where a replica.",
                roles
                    .iter()
                    .map(|(t, active)| (task_label(t), *active as u8 as f64))
                    .collect(),
            );
            families.gauge(
                "eddy_task_offset",
                "The next offset each held task applies from its partition.",
                roles
                    .keys()
                    .filter_map(|t| offsets.get(t).map(|o| (task_label(t), *o as f64)))
                    .collect(),
            );
            let engine = self.engine.clone();
            let progress = tokio::task::spawn_blocking(move || {
                engine
                    .log_as::<eddy_cluster::log::Kafka>()
                    .map(|k| k.progress())
                    .unwrap_or_default()
            })
            .await
            .unwrap_or_default();
            families.gauge(
                "eddy_task_lag",
                "Records of each held task's partition not applied yet.",
                progress
                    .iter()
                    .filter_map(|(t, (at, high))| {
                        Some((task_label(t), (high.as_ref()? - at).max(0) as f64))
                    })
                    .collect(),
            );
            families.counter(
                "eddy_dead_letters_total",
                "External records sent to a dead-letter topic.",
                kafka
                    .dead_letters()
                    .into_iter()
                    .map(|(stream, n)| (vec![("stream", stream.to_string())], n as f64))
                    .collect(),
            );
        }
        let per_task = |f: &dyn Fn(&eddy_cluster::TaskReport) -> u64| -> Vec<(Labels, f64)> {
            report
                .iter()
                .map(|r| (task_label(&r.task), f(r) as f64))
                .collect()
        };
        families.counter(
            "eddy_task_events_total",
            "Events each task of this node accepted.",
            per_task(&|r| r.stats.accepted),
        );
        families.gauge(
            "eddy_task_stored_events",
            "Events held in each task's reservoir.",
            per_task(&|r| r.stored_events as u64),
        );
        let subs = self.subscriptions.list();
        families.gauge(
            "eddy_subscriptions",
            "Open continuous queries.",
            vec![(vec![], subs.len() as f64)],
        );
        let mut per_metric = std::collections::BTreeMap::<String, f64>::new();
        for sub in &subs {
            let on = sub
                .query
                .metric
                .as_ref()
                .map_or(&sub.query.stream.name, |m| &m.name);
            *per_metric.entry(on.to_string()).or_default() += 1.0;
        }
        families.gauge(
            "eddy_metric_subscriptions",
            "Open continuous queries, by the metric (or stream) they read.",
            per_metric
                .into_iter()
                .map(|(on, n)| (vec![("metric", on)], n))
                .collect(),
        );
        let per_sub = |f: &dyn Fn(&Subscription) -> u64| -> Vec<(Labels, f64)> {
            subs.iter()
                .map(|s| (vec![("subscription", s.id.to_string())], f(s) as f64))
                .collect()
        };
        families.counter(
            "eddy_subscription_rows_sent_total",
            "Rows each open subscription sent to its client.",
            per_sub(&|s| s.rows_sent()),
        );
        families.gauge(
            "eddy_subscription_rows_queued",
            "Rows each open subscription holds for a reader that has not taken them yet.",
            per_sub(&|s| s.queued() as u64),
        );
        families.counter(
            "eddy_subscription_rows_coalesced_total",
            "Rows of open metric subscriptions replaced by newer ones while their reader lagged.",
            vec![(
                vec![],
                subs.iter().map(|s| s.rows_coalesced()).sum::<u64>() as f64,
            )],
        );
        self.timings.families(&mut families);
        families.gauge(
            "eddy_build_info",
            "The build this node runs (the value is 1).",
            vec![(
                vec![("version", env!("CARGO_PKG_VERSION").to_string())],
                1.0,
            )],
        );
        if let Some(door) = self.door.get() {
            let (pending, sessions) = door.counts();
            let running = (self
                .running
                .load(std::sync::atomic::Ordering::Relaxed)
                .max(0) as usize)
                .min(sessions);
            families.gauge(
                "eddy_connections",
                "Open client connections: logging in, running a statement, or idle.",
                vec![
                    (vec![("state", "authenticating".into())], pending as f64),
                    (vec![("state", "active".into())], running as f64),
                    (vec![("state", "idle".into())], (sessions - running) as f64),
                ],
            );
        }
        families.counter(
            "eddy_errors_total",
            "Errors sent to clients, by SQLSTATE class (the first two characters).",
            crate::ops::metrics::errors_by_class(),
        );
        families.process();
        Ok(families.text())
    }

    fn show_subscriptions(&self) -> Executed {
        let columns = vec![
            Column::new("id", Type::INT8),
            Column::new("pid", Type::INT4),
            Column::text("user"),
            Column::text("application_name"),
            Column::text("client"),
            Column::text("kind"),
            Column::text("target"),
            Column::text("query"),
            Column::new("started_at", Type::TIMESTAMP),
            Column::new("rows_sent", Type::INT8),
            Column::new("rows_coalesced", Type::INT8),
            Column::new("rows_queued", Type::INT8),
        ];
        let rows = self
            .subscriptions
            .list()
            .iter()
            .map(|s| {
                vec![
                    Cell::I64(s.id as i64),
                    Cell::I32(s.client.pid),
                    Cell::text(s.client.user.as_str()),
                    Cell::text(s.client.application_name.as_str()),
                    Cell::text(s.client.addr.as_str()),
                    Cell::text(s.kind.to_string()),
                    Cell::text(s.query.target().to_string()),
                    Cell::text(s.text.as_str()),
                    Cell::Timestamp(s.started_at),
                    Cell::I64(s.rows_sent() as i64),
                    Cell::I64(s.rows_coalesced() as i64),
                    Cell::I64(s.queued() as i64),
                ]
            })
            .collect();
        Executed::new(Output::Rows {
            columns,
            rows,
            tag: "SHOW",
        })
    }

    fn show_metrics(&self) -> Executed {
        let catalog = self.catalog();
        let columns = vec![
            Column::text("name"),
            Column::text("stream"),
            Column::text("window"),
            Column::text("filter"),
            Column::text("group_by"),
            Column::text("aggregates"),
        ];
        let rows = catalog
            .order
            .iter()
            .filter_map(|n| catalog.metric(n))
            .map(|m| {
                let s = catalog.stream(&m.stream).expect("metric's stream exists");
                vec![
                    Cell::text(m.name.as_str()),
                    Cell::text(m.stream.as_str()),
                    Cell::text(m.window.to_sql()),
                    m.filter.clone().map_or(Cell::Null, Cell::text),
                    Cell::text(
                        m.group_by
                            .iter()
                            .map(|c| s.columns[*c].name.as_str())
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
                    Cell::text(
                        m.aggregates
                            .iter()
                            .map(|a| format!("{} AS {}", a.to_sql(s), a.alias))
                            .collect::<Vec<_>>()
                            .join(", "),
                    ),
                ]
            })
            .collect();
        Executed::new(Output::Rows {
            columns,
            rows,
            tag: "SHOW",
        })
    }

    fn describe(&self, name: &str) -> Result<Executed> {
        let catalog = self.catalog();
        let columns = vec![
            Column::text("column"),
            Column::text("type"),
            Column::new("nullable", Type::BOOL),
            Column::text("role"),
        ];
        let type_name = |t: ResultType| match t {
            ResultType::Numeric => "NUMERIC".to_string(),
            ResultType::Column(c) => c.sql_name().to_string(),
        };
        let rows = if let Some(s) = catalog.stream(name) {
            s.columns
                .iter()
                .enumerate()
                .map(|(i, c)| {
                    let mut roles = Vec::new();
                    if i == s.event_time {
                        roles.push("event_time".to_string());
                    }
                    if s.event_id == Some(i) {
                        roles.push("event_id".to_string());
                    }
                    if let Some(p) = s.partitioners.iter().position(|x| *x == i) {
                        roles.push(format!("partitioner {}", p + 1));
                    }
                    vec![
                        Cell::text(c.name.as_str()),
                        Cell::text(c.ty.sql_name()),
                        Cell::Bool(!c.not_null),
                        if roles.is_empty() {
                            Cell::Null
                        } else {
                            Cell::text(roles.join(", "))
                        },
                    ]
                })
                .collect()
        } else if let Some(m) = catalog.metric(name) {
            let s = catalog
                .stream(&m.stream)
                .ok_or_else(|| Error::internal("metric without stream"))?;
            let mut rows: Vec<Vec<Cell>> = m
                .group_by
                .iter()
                .map(|c| {
                    let col = &s.columns[*c];
                    vec![
                        Cell::text(col.name.as_str()),
                        Cell::text(col.ty.sql_name()),
                        Cell::Bool(!col.not_null),
                        Cell::text("group key"),
                    ]
                })
                .collect();
            rows.extend(m.aggregates.iter().map(|a| {
                vec![
                    Cell::text(a.alias.as_str()),
                    Cell::text(type_name(a.result_type(s))),
                    Cell::Bool(true),
                    Cell::text(a.to_sql(s)),
                ]
            }));
            rows
        } else {
            return Err(Error::new(
                ErrorKind::UndefinedTable,
                format!("stream or metric \"{name}\" does not exist"),
            ));
        };
        Ok(Executed::new(Output::Rows {
            columns,
            rows,
            tag: "DESCRIBE",
        }))
    }
}

/// A Prometheus label value: backslash, quote and newline escaped.
/// Writes the catalog file atomically: temp file, fsync, rename.
/// The catalog the statements make, in order.
pub(crate) fn catalog_of(statements: &[String]) -> Result<Catalog> {
    let mut catalog = Catalog::default();
    // A record of the catalog topic may hold several statements (the access rules).
    let statements = statements
        .iter()
        .flat_map(|s| s.split(CATALOG_SEPARATOR))
        .filter(|s| !s.trim().is_empty());
    for stmt in statements {
        let parsed = sql::parse_statement(stmt).map_err(|e| in_statement(e, stmt))?;
        catalog = ddl::apply(&catalog, &parsed)
            .map_err(|e| in_statement(e, stmt))?
            .0;
    }
    Ok(catalog)
}

/// Batches of a COPY sent to the engine before the oldest one's answers are awaited.
const COPY_IN_FLIGHT: usize = 2;

fn in_statement(mut e: Error, stmt: &str) -> Error {
    e.message = format!("{}: {stmt}", e.message);
    e
}

pub(crate) fn persist(data_dir: &Path, catalog: &Catalog) -> Result<()> {
    let text: String = catalog
        .statements()
        .iter()
        .map(|s| format!("{s}{CATALOG_SEPARATOR}"))
        .collect();
    let path = data_dir.join(CATALOG_FILE);
    crate::ops::settings::replace_file(data_dir, CATALOG_FILE, text.as_bytes()).map_err(|e| {
        Error::new(
            ErrorKind::Internal,
            format!("could not write {}: {e}", path.display()),
        )
    })
}

/// A data directory belongs to one kind of log for life: its checkpoints hold offsets
/// of that log. Records the kind on first use and refuses the other one.
fn check_log_kind(data_dir: &Path, kafka: bool) -> anyhow::Result<()> {
    let path = data_dir.join("log.kind");
    let kind = if kafka { "kafka" } else { "local" };
    match std::fs::read_to_string(&path) {
        Ok(found) if found.trim() == kind => Ok(()),
        Ok(found) => anyhow::bail!(
            "{} holds a node whose log is {} (see {}); start it {} --kafka, or use another --data-dir",
            data_dir.display(),
            found.trim(),
            path.display(),
            if kafka { "without" } else { "with" }
        ),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            // A directory from before log kinds were recorded has a local log.
            let old = data_dir.join(LOG_DIR).exists();
            let kind = if old { "local" } else { kind };
            std::fs::write(&path, format!("{kind}\n"))?;
            if old && kafka {
                return check_log_kind(data_dir, kafka);
            }
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

fn undefined_metric(name: &str) -> Error {
    Error::new(
        ErrorKind::UndefinedTable,
        format!("metric \"{name}\" does not exist"),
    )
}

fn duration_text(us: i64) -> String {
    if us == 0 {
        "0".to_string()
    } else {
        format_duration_us(us).to_lowercase()
    }
}

/// `EXPLAIN STREAM`'s account of where each part of the stream's plan runs on this node:
/// the stateless part on any shard (round-robin), each task's DAG on its shard (route
/// by key), catalog changes on every shard (broadcast).
fn where_it_runs(catalog: &Catalog, stream: &StreamDef, shards: usize) -> Vec<String> {
    let mut lines = vec![
        format!(
            "Runs on {shards} shard{}",
            if shards == 1 { "" } else { "s" }
        ),
        "  Parse and check rows: COPY and Kafka JSON on any shard, round-robin; INSERT on \
         the session"
            .to_string(),
    ];
    if catalog
        .metrics_of(&stream.name)
        .iter()
        .any(|m| m.filter.is_some())
    {
        lines.push(
            "  WHERE clauses: evaluated with COPY's parsing, on any shard; for INSERT and \
             Kafka, in the task"
                .to_string(),
        );
    }
    for p in 0..stream.partitioner_count() {
        let by = match stream.partitioners.get(p) {
            Some(&col) => format!("hash of {}", stream.columns[col].name),
            None => "one task".to_string(),
        };
        let mut per_shard = vec![Vec::new(); shards.max(1)];
        for partition in 0..stream.tasks_per_partitioner() {
            let task = TaskId {
                stream: stream.name.clone(),
                partitioner: p,
                partition,
            };
            per_shard[eddy_cluster::route::shard_of(&task, shards.max(1))]
                .push(partition.to_string());
        }
        let spread: Vec<String> = per_shard
            .iter()
            .enumerate()
            .filter(|(_, tasks)| !tasks.is_empty())
            .map(|(shard, tasks)| format!("shard {shard}: {}", tasks.join(", ")))
            .collect();
        lines.push(format!(
            "  Route by key ({by}) to the task's shard, which runs Window, Filter, GroupBy \
             and Aggregators: tasks on {}",
            spread.join("; ")
        ));
    }
    lines.push("  Catalog changes: every shard, broadcast".to_string());
    lines
}

fn plan_rows(lines: Vec<String>) -> Executed {
    Executed::new(Output::Rows {
        columns: vec![Column::text("QUERY PLAN")],
        rows: lines.into_iter().map(|l| vec![Cell::text(l)]).collect(),
        tag: "EXPLAIN",
    })
}

/// Rows of an INSERT submitted to the engine at once (`Db::inserting`).
const INSERT_PART_ROWS: usize = 256;

/// A metric's values in an event's reply: at `*at`, where the last reply had them, or
/// found by name (and `*at` moved there).
fn metric_values<'r>(
    reply: &'r eddy_cluster::EventReply,
    name: &str,
    at: &mut usize,
) -> Option<&'r [eddy_planner::types::Value]> {
    let named = |i: &usize| reply.metrics.get(*i).filter(|(n, _)| **n == *name);
    if named(at).is_none() {
        *at = (0..reply.metrics.len()).find(|i| named(i).is_some())?;
    }
    Some(&reply.metrics[*at].1)
}

/// The replies of one part of an INSERT, in the engine.
type PartReplies<'a> =
    Pin<Box<dyn Future<Output = Result<Vec<eddy_cluster::EventReply>>> + Send + 'a>>;

/// An INSERT in the engine (`Db::inserting`): its parts answer in input order.
pub struct Inserting<'a> {
    db: &'a Db,
    plan: &'a eddy_planner::bind::InsertPlan,
    /// The parts not yet answered, first first: their rows and their replies.
    parts: VecDeque<(&'a [Row], PartReplies<'a>)>,
    skipped: Skipped,
    /// Where each RETURNING column's metric sits in a reply's list (the same in most).
    at: Vec<usize>,
    started: Instant,
    /// A durable statement's thread polls for its commit (`busy::Committing`).
    _polling: Option<crate::wire::busy::Committing>,
}

impl Inserting<'_> {
    /// The RETURNING columns (none without RETURNING).
    pub fn columns(&self) -> Vec<Column> {
        self.plan
            .returning
            .iter()
            .flatten()
            .map(|c| Column::new(c.name.clone(), pg_type(c.ty)))
            .collect()
    }

    /// The next part's RETURNING rows (empty without RETURNING), once the shards have
    /// applied it; `None` after the last part.
    pub async fn next_part(&mut self) -> Result<Option<Vec<Vec<Cell>>>> {
        let Some((rows, replies)) = self.parts.pop_front() else {
            return Ok(None);
        };
        let replies = replies.await?;
        replies.iter().for_each(|r| self.skipped.count(&r.outcomes));
        let Some(cols) = &self.plan.returning else {
            return Ok(Some(Vec::new()));
        };
        let at = &mut self.at;
        let out = rows.iter().zip(&replies).map(|(row, reply)| {
            cols.iter()
                .zip(at.iter_mut())
                .map(|(c, at)| match &c.item {
                    ReturningItem::Event(i) => cell_of(&row[*i], c.ty),
                    ReturningItem::Metric { metric, agg } => metric_values(reply, &metric.name, at)
                        .map_or(Cell::Null, |vals| cell_of(&vals[*agg], c.ty)),
                })
                .collect()
        });
        Ok(Some(out.collect()))
    }

    /// The statement's result once every part has answered: its RETURNING rows if
    /// `rows` has them, else its command tag; with notices of late and duplicate events.
    pub fn finish(self, rows: Option<Vec<Vec<Cell>>>) -> Executed {
        debug_assert!(self.parts.is_empty(), "every part answered");
        self.db.timings.ingest.record(self.started.elapsed());
        // The tag counts the events applied, as PostgreSQL's counts the rows an
        // INSERT … ON CONFLICT DO NOTHING inserted: not the late and duplicate ones.
        let n = self.plan.rows.len() - self.skipped.late - self.skipped.dup;
        let notices = self.skipped.notices(&self.plan.stream);
        let output = match rows {
            None => Output::Command {
                tag: "INSERT",
                rows: Some(n),
            },
            Some(rows) => Output::Rows {
                columns: self.columns(),
                rows,
                tag: "INSERT",
            },
        };
        Executed { output, notices }
    }
}

/// Events a statement did not apply: late ones, and duplicates of applied ones.
#[derive(Default)]
struct Skipped {
    late: usize,
    dup: usize,
}

impl Skipped {
    /// Counts an event by its outcomes (one per partitioner).
    fn count(&mut self, outcomes: &[Outcome]) {
        if outcomes.contains(&Outcome::Late) {
            self.late += 1;
        } else if outcomes.contains(&Outcome::Duplicate) {
            self.dup += 1;
        }
    }

    /// The statement's notices of them.
    fn notices(&self, stream: &StreamDef) -> Vec<Notice> {
        let (late, dup) = (self.late, self.dup);
        let mut out = Vec::new();
        if late > 0 {
            out.push(Notice {
                message: format!(
                    "{late} late event{} not applied to stream \"{}\" (older than stream time \
                     minus lateness {})",
                    if late == 1 { "" } else { "s" },
                    stream.name,
                    duration_text(stream.lateness_us)
                ),
                // The default lateness drops every out-of-order event: say how to keep them.
                hint: (stream.lateness_us == 0).then(|| {
                    "With lateness 0, every event older than one its task already applied is late. \
                     A stream created WITH (lateness = '…') accepts events out of order by up to that much."
                        .to_string()
                }),
            });
        }
        if dup > 0 {
            out.push(Notice::from(format!(
                "{dup} duplicate event{} not applied again to stream \"{}\"",
                if dup == 1 { "" } else { "s" },
                stream.name
            )));
        }
        out
    }
}

/// A task's labels in `/metrics`.
fn task_label(t: &eddy_cluster::TaskId) -> crate::ops::metrics::Labels {
    vec![
        ("stream", t.stream.clone()),
        ("partitioner", t.partitioner.to_string()),
        ("partition", t.partition.to_string()),
    ]
}

/// `ALTER SYSTEM SET shards = n | auto | DEFAULT`, `ALTER SYSTEM RESET shards | ALL`.
impl Db {
    /// Binds an INSERT without parameters, its VALUES expressions evaluated first (by
    /// DataFusion, `query::evaluate`): an error there applies nothing.
    pub async fn bind_insert(
        &self,
        insert: &datafusion::sql::sqlparser::ast::Insert,
    ) -> Result<InsertPlan> {
        let template = InsertTemplate::new(&self.catalog(), insert)?;
        let computed = if template.exprs.is_empty() {
            Vec::new()
        } else {
            query::evaluate(&self.query_context()?, &template.exprs).await?
        };
        template.bind_with(&mut no_parameter, &computed)
    }

    /// The server's default of a session setting (the built-in one for the settings it
    /// does not give).
    pub fn session_default(&self, setting: Setting) -> String {
        self.session_defaults.get(setting)
    }

    async fn alter_system(&self, name: &str, value: Option<&str>) -> Result<Executed> {
        if Limits::is_limit(name) {
            self.limits.set(name, value)?;
            return self.keep_setting(name, value);
        }
        if let Some(setting) = Setting::named(name).filter(|s| s.server_wide()) {
            let value = value.map(|v| setting.canonical(v)).transpose()?;
            self.session_defaults.set(setting, value.clone());
            return self.keep_setting(setting.name(), value.as_deref());
        }
        if name != "shards" && !(name == "all" && value.is_none()) {
            return Err(Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
            .with_hint(
                "ALTER SYSTEM sets shards, synchronous_commit, statement_timeout and the limits \
                 (see SHOW LIMITS).",
            ));
        }
        if name == "all" {
            for (kept, _) in crate::ops::settings::load(&self.data_dir).unwrap_or_default() {
                if Limits::is_limit(&kept) {
                    self.limits.set(&kept, None)?;
                    self.keep_setting(&kept, None)?;
                }
                if let Some(setting) = Setting::named(&kept).filter(|s| s.server_wide()) {
                    self.session_defaults.set(setting, None);
                    self.keep_setting(&kept, None)?;
                }
            }
        }
        let count = match value {
            None => None,
            Some(v) => crate::ops::settings::parse_shards(v).map_err(|e| {
                Error::new(
                    ErrorKind::InvalidParameter,
                    format!("invalid value for parameter \"shards\": \"{v}\""),
                )
                .with_hint(e)
            })?,
        };
        // One change at a time, and none during DDL.
        let _ddl = self.ddl.lock().await;
        self.engine.reshard(count).await?;
        self.keep_setting("shards", count.map(|n| n.to_string()).as_deref())
    }

    /// Keeps a setting that already applies for the next start.
    fn keep_setting(&self, name: &str, value: Option<&str>) -> Result<Executed> {
        crate::ops::settings::save(&self.data_dir, name, value).map_err(|e| {
            Error::internal(format!(
                "{name} changed, but keeping the setting for the next start failed: {e}"
            ))
        })?;
        Ok(Executed::command("ALTER SYSTEM"))
    }
}

/// The server's session defaults: the configuration's, below what `ALTER SYSTEM` kept
/// unless the command line or the environment gave the setting.
fn session_defaults(
    config: &crate::ops::config::Config,
    kept: &BTreeMap<String, String>,
) -> anyhow::Result<ServerDefaults> {
    let defaults = ServerDefaults::new(config.session_defaults.clone());
    for (name, value) in kept {
        let Some(setting) = Setting::named(name).filter(|s| s.server_wide()) else {
            continue;
        };
        if config.session_given.contains(&setting) {
            continue;
        }
        let value = setting.canonical(value).map_err(|e| {
            anyhow::anyhow!(
                "{}: {}",
                config
                    .data_dir
                    .join(crate::ops::settings::AUTO_CONF)
                    .display(),
                e.message
            )
        })?;
        defaults.set(setting, Some(value));
    }
    Ok(defaults)
}

/// `SHOW` of a server parameter clients read (the session's own settings are the
/// session's); any other name is 42704, as in PostgreSQL.
fn show_variable(name: &str, role: &str) -> Result<Executed> {
    let lower = name.to_ascii_lowercase();
    let value = match lower.as_str() {
        "timezone" => "UTC",
        "session_authorization" => return Ok(Executed::rows(
            vec![Column::text("session_authorization")],
            vec![vec![Cell::text(role.to_string())]],
        )),
        other => match crate::session::settings::fixed_parameter(other) {
            Some(value) => value,
            None => return Err(Error::new(
                ErrorKind::UndefinedObject,
                format!("unrecognized configuration parameter \"{name}\""),
            )
            .with_hint("SHOW LIMITS lists the server's limits; the session settings are synchronous_commit, statement_timeout, TimeZone, application_name and subscription_rows_max.")),
        },
    };
    let column = crate::session::settings::postgres_name(name).unwrap_or(name);
    Ok(Executed::new(Output::Rows {
        columns: vec![Column::text(column)],
        rows: vec![vec![Cell::text(value.to_string())]],
        tag: "SHOW",
    }))
}

/// About the bytes a statement's events take in the log: each partitioner logs every
/// event, and a durable append writes it to the node's journal too.
fn log_bytes(stream: &StreamDef, values: u64, rows: u64, durable: bool) -> u64 {
    let copies = stream.partitioner_count() as u64 * if durable { 2 } else { 1 };
    values.saturating_add(rows * 16).saturating_mul(copies)
}

/// A statement running (`Db::running`).
pub struct Running<'a>(&'a std::sync::atomic::AtomicI64);

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}
