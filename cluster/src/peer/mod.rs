//! The peer service (gRPC, tonic; `proto/peer.proto`): what one node of a cluster asks
//! another. A read of a task that another node holds active goes there: a point lookup
//! to the one task's active node, a full scan to every node with active tasks.
//!
//! A node given a task it lacks (or holds only a stale copy of) asks the task's other
//! holders for their last checkpoint of it (`node::transfer`), replicas first, and
//! installs the first complete, checked one that is newer than its own; the partition
//! then replays from the checkpoint's offset. When no peer has one, or every transfer
//! failed, the partition replays from the node's own offset.
//!
//! Invariant: a node answers a peer only from its own tasks, never by asking a further
//! peer, so a read crosses at most one hop and cannot loop.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use eddy_planner::codec::{self, Reader};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::engine::{Engine, PeerAt, Remote};
use crate::exec::events::Row;
use crate::exec::history::HistoryPage;
use crate::log::kafka::fence::{unavailable, Fence};
use crate::log::{Kafka, LogFuture};
use crate::membership::View;
use crate::route::TaskId;

#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("eddy.peer");
}

use proto::peer_client::PeerClient;
use proto::peer_server::{Peer, PeerServer};
use proto::{
    CheckpointRequest, HistoryPageReply, HistoryPageRequest, MetricRowsRequest, Rows,
    StreamRowsRequest, WatchRequest,
};

use crate::exec::watch::{Change, WatchId, WatchTarget, Watcher};

use crate::log::kafka::Recover;
use crate::node::transfer::{family_of, Fault, Have, Piece};

/// How long a peer has to answer a read.
const PEER_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves the peer service on the socket the Kafka log bound, and lets the engine read
/// tasks active elsewhere through it. Does nothing without Kafka.
pub fn start(engine: &Arc<Engine>) -> Result<()> {
    let Some(kafka) = engine.log_as::<Kafka>() else {
        return Ok(());
    };
    let Some(listener) = kafka.take_peer_listener() else {
        return Ok(());
    };
    let io = |e: std::io::Error| Error::internal(format!("the peer service: {e}"));
    listener.set_nonblocking(true).map_err(io)?;
    let listener = tokio::net::TcpListener::from_std(listener).map_err(io)?;
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
    let fault = std::env::var("EDDY_TRANSFER_FAULT")
        .ok()
        .and_then(|f| Fault::parse(&f));
    let service = PeerServer::new(Service {
        engine: Arc::downgrade(engine),
        fault,
    })
    .max_decoding_message_size(64 << 20)
    .max_encoding_message_size(1 << 30);
    tokio::spawn(async move {
        let served = tonic::transport::Server::builder()
            .tcp_nodelay(true)
            .add_service(service)
            .serve_with_incoming(incoming)
            .await;
        if let Err(e) = served {
            tracing::warn!("the peer service stopped: {e}");
        }
    });
    let peers = Arc::new(Peers {
        me: kafka.config().node.clone(),
        view: kafka.view_handle(),
        kafka: kafka.weak(),
        clients: Mutex::default(),
    });
    engine.set_remote(peers.clone());
    if engine.storage().is_some() && std::env::var("EDDY_PEER_RECOVERY").as_deref() != Ok("off") {
        kafka.set_recovery(Arc::new(Recovery {
            peers,
            engine: Arc::downgrade(engine),
            runtime: tokio::runtime::Handle::current(),
        }));
    }
    Ok(())
}

struct Service {
    engine: Weak<Engine>,
    /// A fault to inject into checkpoints sent (`EDDY_TRANSFER_FAULT`, for tests).
    fault: Option<Fault>,
}

impl Service {
    fn engine(&self) -> std::result::Result<Arc<Engine>, Status> {
        self.engine
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))
    }
}

/// Admits a peer's read of some tasks made under plan `plan`: this node applies that
/// plan, holds its lease, and answers for every one of the tasks now.
fn admit(
    engine: &Engine,
    plan: u64,
    stream: &str,
    partitioner: usize,
    partitions: &[u32],
) -> std::result::Result<(), Status> {
    let Some(kafka) = engine.log_as::<Kafka>() else {
        return Ok(());
    };
    let generation = kafka.fence().generation();
    if plan != generation {
        return Err(Status::unavailable(format!(
            "the read was routed by plan {plan}, and this node applies plan {generation}"
        )));
    }
    for &partition in partitions {
        let task = TaskId {
            stream: stream.to_string(),
            partitioner,
            partition,
        };
        kafka
            .serves(&task)
            .map_err(|e| Status::unavailable(e.message))?;
    }
    Ok(())
}

fn status(e: Error) -> Status {
    Status::failed_precondition(e.to_string())
}

type PieceStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = std::result::Result<proto::Piece, Status>> + Send>,
>;

/// A piece as the wire carries it; a header says the transfer's `format`.
fn to_proto(piece: Piece, format: u32) -> proto::Piece {
    use proto::piece::Piece as P;
    let piece = match piece {
        Piece::Header { meta, log_end } => P::Header(proto::Header {
            meta,
            log_end,
            format,
        }),
        Piece::Entries { family, pairs } => P::Entries(proto::Entries {
            family: eddy_storage::Family::ALL
                .iter()
                .position(|f| *f == family)
                .unwrap_or(0) as u32,
            pairs,
        }),
        Piece::StateEnd { entries, crc } => P::StateEnd(proto::StateEnd { entries, crc }),
        Piece::Data {
            name,
            offset,
            bytes,
        } => P::Data(proto::FileData {
            name,
            offset,
            bytes,
        }),
        Piece::FileEnd { name, len, crc } => P::FileEnd(proto::FileEnd { name, len, crc }),
        Piece::Done { files } => P::Done(proto::Done { files }),
    };
    proto::Piece { piece: Some(piece) }
}

fn from_proto(piece: proto::Piece) -> Option<Piece> {
    use proto::piece::Piece as P;
    Some(match piece.piece? {
        P::Header(h) => Piece::Header {
            meta: h.meta,
            log_end: h.log_end,
        },
        P::Entries(e) => Piece::Entries {
            family: family_of(u8::try_from(e.family).ok()?)?,
            pairs: e.pairs,
        },
        P::StateEnd(e) => Piece::StateEnd {
            entries: e.entries,
            crc: e.crc,
        },
        P::Data(d) => Piece::Data {
            name: d.name,
            offset: d.offset,
            bytes: d.bytes,
        },
        P::FileEnd(f) => Piece::FileEnd {
            name: f.name,
            len: f.len,
            crc: f.crc,
        },
        P::Done(d) => Piece::Done { files: d.files },
    })
}

type ChangeStream = std::pin::Pin<
    Box<dyn tokio_stream::Stream<Item = std::result::Result<proto::Changes, Status>> + Send>,
>;

/// Changes a remote watch has not sent yet, at most (in messages); a reader further
/// behind is cut off and subscribes again.
const WATCH_BACKLOG: usize = 256;

/// Forwards a task's changes to a peer's subscription; never blocks the shard. Past
/// this node's lease it ends the stream, and the asker subscribes again where the tasks
/// are active then.
struct Forward {
    tx: tokio::sync::mpsc::Sender<std::result::Result<proto::Changes, Status>>,
    fence: Option<Arc<Fence>>,
}

impl Watcher for Forward {
    fn deliver(&self, changes: &[Change]) -> bool {
        if let Some(Err(e)) = self.fence.as_ref().map(|f| f.check()) {
            self.end(e);
            return false;
        }
        self.tx
            .try_send(Ok(proto::Changes {
                changes: encode_changes(changes),
            }))
            .is_ok()
    }

    fn end(&self, error: Error) {
        let _ = self
            .tx
            .try_send(Err(Status::failed_precondition(error.to_string())));
    }
}

fn encode_changes(changes: &[Change]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(changes.len() as u32).to_le_bytes());
    for c in changes {
        out.extend_from_slice(&(c.key.len() as u32).to_le_bytes());
        out.extend_from_slice(&c.key);
        codec::encode_row(&c.row, &mut out);
    }
    out
}

fn decode_changes(bytes: &[u8]) -> Option<Vec<Change>> {
    let mut r = Reader(bytes);
    let n = r.u32()? as usize;
    let mut out = Vec::with_capacity(n.min(1 << 16));
    for _ in 0..n {
        let k = r.u32()? as usize;
        let key = r.take(k)?.to_vec().into_boxed_slice();
        out.push(Change {
            key,
            row: codec::read_row(&mut r)?,
        });
    }
    Some(out)
}

/// Ids of watches peers open here: the top bit set, apart from local subscriptions'.
fn remote_watch_id() -> WatchId {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    (1 << 63) | NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[tonic::async_trait]
impl Peer for Service {
    type CheckpointStream = PieceStream;
    type WatchStream = ChangeStream;

    async fn watch(
        &self,
        request: Request<WatchRequest>,
    ) -> std::result::Result<Response<ChangeStream>, Status> {
        let r = request.into_inner();
        let engine = self.engine()?;
        admit(
            &engine,
            r.plan,
            &r.stream,
            r.partitioner as usize,
            &r.partitions,
        )?;
        let (tx, rx) = tokio::sync::mpsc::channel(WATCH_BACKLOG);
        let id = remote_watch_id();
        let forward = Arc::new(Forward {
            tx: tx.clone(),
            fence: engine.log_as::<Kafka>().map(|k| k.fence().clone()),
        });
        engine
            .watch_partitions(
                &r.stream,
                r.partitioner as usize,
                Some(r.partitions),
                Vec::new(),
                WatchTarget::Metric(r.metric),
                id,
                forward,
            )
            .await
            .map_err(status)?;
        // Detached once the asker goes (or was cut off).
        let weak = Arc::downgrade(&engine);
        tokio::spawn(async move {
            tx.closed().await;
            if let Some(engine) = weak.upgrade() {
                engine.unwatch(id).await;
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn checkpoint(
        &self,
        request: Request<CheckpointRequest>,
    ) -> std::result::Result<Response<PieceStream>, Status> {
        let r = request.into_inner();
        let engine = self.engine()?;
        let storage = engine
            .storage()
            .cloned()
            .ok_or_else(|| Status::failed_precondition("this node keeps no checkpoints"))?;
        let task = TaskId {
            stream: r.stream,
            partitioner: r.partitioner as usize,
            partition: r.partition,
        };
        let have: Vec<Have> = r
            .have
            .into_iter()
            .map(|h| Have {
                name: h.name,
                len: h.len,
                crc: h.crc,
            })
            .collect();
        // The transfer in the lowest format both read. Its files are as they were
        // written: group states in the format this node wrote them (`format::writes`, the
        // lowest its live members read), so an asker that is a live member reads them.
        let format = crate::format::own().min(r.format.max(crate::format::OLDEST));
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        let fault = self.fault;
        tokio::task::spawn_blocking(move || {
            let export = match storage.export(&task) {
                Ok(Some(export)) if export.log_end() > r.after => export,
                // Nothing newer than what the asker has: an empty answer.
                Ok(_) => return,
                Err(e) => {
                    let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
                    return;
                }
            };
            let sent = &storage.transfers.sent_bytes;
            let result = export.send(&have, fault, &mut |piece| {
                sent.fetch_add(piece.bytes() as u64, std::sync::atomic::Ordering::Relaxed);
                tx.blocking_send(Ok(to_proto(piece, format))).is_ok()
            });
            if let Err(e) = result {
                let _ = tx.blocking_send(Err(Status::internal(e.to_string())));
            }
        });
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(rx),
        )))
    }

    async fn metric_rows(
        &self,
        request: Request<MetricRowsRequest>,
    ) -> std::result::Result<Response<Rows>, Status> {
        let r = request.into_inner();
        let key = match &r.key {
            Some(bytes) => Some(
                codec::read_row(&mut Reader(bytes))
                    .ok_or_else(|| Status::invalid_argument("an unreadable key"))?,
            ),
            None => None,
        };
        let engine = self.engine()?;
        admit(
            &engine,
            r.plan,
            &r.stream,
            r.partitioner as usize,
            &r.partitions,
        )?;
        let rows = engine
            .local_metric_rows(
                &r.stream,
                r.partitioner as usize,
                &r.partitions,
                &r.metric,
                key,
            )
            .await
            .map_err(status)?;
        Ok(Response::new(Rows {
            rows: encode_rows(rows.iter().map(|r| &r[..])),
        }))
    }

    async fn stream_rows(
        &self,
        request: Request<StreamRowsRequest>,
    ) -> std::result::Result<Response<Rows>, Status> {
        let r = request.into_inner();
        let engine = self.engine()?;
        admit(&engine, r.plan, &r.stream, 0, &r.partitions)?;
        let rows = engine
            .local_stream_rows(&r.stream, Some(&r.partitions))
            .await
            .map_err(status)?;
        Ok(Response::new(Rows {
            rows: encode_rows(rows.iter().map(|r| &r[..])),
        }))
    }

    async fn history_page(
        &self,
        request: Request<HistoryPageRequest>,
    ) -> std::result::Result<Response<HistoryPageReply>, Status> {
        let r = request.into_inner();
        let engine = self.engine()?;
        let partitioner = r.partitioner as usize;
        admit(&engine, r.plan, &r.stream, partitioner, &[r.partition])?;
        let task = TaskId {
            stream: r.stream,
            partitioner,
            partition: r.partition,
        };
        let page = engine
            .local_history_page(&task, r.after, r.upto, r.max as usize)
            .await
            .map_err(status)?;
        Ok(Response::new(HistoryPageReply {
            rows: encode_rows(page.events.iter().map(|e| &e.2[..])),
            times: page.events.iter().map(|e| e.0).collect(),
            seqs: page.events.iter().map(|e| e.1).collect(),
            through: page.through,
            time: page.time,
            seq: page.seq,
            stored: page.stored as u64,
            horizon: page.horizon,
        }))
    }
}

fn encode_rows<'a>(rows: impl ExactSizeIterator<Item = &'a [Value]>) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for row in rows {
        codec::encode_row(row, &mut out);
    }
    out
}

fn decode_rows(bytes: &[u8]) -> Result<Vec<Vec<Value>>> {
    let bad = || Error::internal("a peer sent unreadable rows");
    let mut r = Reader(bytes);
    let n = r.u32().ok_or_else(bad)? as usize;
    let mut rows = Vec::with_capacity(n.min(1 << 20));
    for _ in 0..n {
        rows.push(codec::read_row(&mut r).ok_or_else(bad)?);
    }
    Ok(rows)
}

/// The client side: where each task is active, and a channel per peer.
struct Peers {
    me: String,
    view: Arc<RwLock<View>>,
    kafka: Weak<Kafka>,
    clients: Mutex<HashMap<String, PeerClient<Channel>>>,
}

impl Peers {
    fn client(&self, addr: &str) -> Result<PeerClient<Channel>> {
        let mut clients = self.clients.lock().expect("peer clients lock");
        if let Some(c) = clients.get(addr) {
            return Ok(c.clone());
        }
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::internal(format!("peer address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .timeout(PEER_TIMEOUT)
            .tcp_nodelay(true);
        let client = PeerClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(1 << 30)
            .max_encoding_message_size(64 << 20);
        clients.insert(addr.to_string(), client.clone());
        Ok(client)
    }

    fn failed(&self, addr: &str, e: Status) -> Error {
        // A peer that failed may have moved: the next read connects afresh.
        self.clients.lock().expect("peer clients lock").remove(addr);
        Error::new(
            eddy_planner::ErrorKind::Unavailable,
            format!("the node at {addr} that runs part of this read did not answer: {}", e.message()),
        )
        .with_hint("A node may have just failed; its tasks move to their replicas within the session timeout. Retry.")
    }
}

/// A task that is aborted when dropped.
struct Feed(tokio::task::JoinHandle<()>);

impl Drop for Feed {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Peers {
    /// A channel for long-lived streams (no request timeout).
    fn stream_client(&self, addr: &str) -> Result<PeerClient<Channel>> {
        let endpoint = Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| Error::internal(format!("peer address {addr}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true);
        Ok(PeerClient::new(endpoint.connect_lazy()).max_decoding_message_size(64 << 20))
    }

    /// Where each of a metric's tasks that this node holds no copy of is active: peer
    /// address → partitions, with the plan's generation.
    fn sources(&self, stream: &str, partitioner: usize) -> (BTreeMap<String, Vec<u32>>, u64) {
        let view = self.view.read().expect("view lock");
        let mut out: BTreeMap<String, Vec<u32>> = BTreeMap::new();
        for (t, p) in &view.plan.tasks {
            if t.stream != stream
                || t.partitioner != partitioner
                || p.copies().any(|m| *m == self.me)
            {
                continue;
            }
            if let Some(f) = view
                .facts
                .get(&p.active)
                .filter(|f| !f.peer_addr.is_empty())
            {
                out.entry(f.peer_addr.clone())
                    .or_default()
                    .push(t.partition);
            }
        }
        (out, view.generation)
    }
}

/// Reads one peer's changes into `watcher` until the stream ends; false once the
/// watcher is gone.
async fn read_feed(
    client: Result<PeerClient<Channel>>,
    request: WatchRequest,
    watcher: Arc<dyn Watcher>,
) -> bool {
    let Ok(mut client) = client else {
        return true;
    };
    let Ok(response) = client.watch(request).await else {
        return true;
    };
    let mut stream = response.into_inner();
    while let Ok(Some(message)) = stream.message().await {
        let Some(changes) = decode_changes(&message.changes) else {
            return true;
        };
        if !watcher.deliver(&changes) {
            return false;
        }
    }
    true
}

/// How often a subscription's feeds follow the plan.
const FEED_EVERY: Duration = Duration::from_millis(200);

impl Remote for Peers {
    fn holds(&self, task: &TaskId) -> bool {
        let view = self.view.read().expect("view lock");
        view.plan
            .placement(task)
            .is_some_and(|p| p.copies().any(|m| *m == self.me))
    }

    fn watch(
        &self,
        stream: String,
        partitioner: usize,
        metric: String,
        watcher: Arc<dyn Watcher>,
    ) -> tokio::task::AbortHandle {
        let me = Peers {
            me: self.me.clone(),
            view: self.view.clone(),
            kafka: self.kafka.clone(),
            clients: Mutex::default(),
        };
        let task = tokio::spawn(async move {
            let gone = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let mut feeds: HashMap<String, (Vec<u32>, Feed)> = HashMap::new();
            while !gone.load(std::sync::atomic::Ordering::Acquire) {
                let (wanted, generation) = me.sources(&stream, partitioner);
                feeds.retain(|addr, (parts, feed)| {
                    wanted.get(addr) == Some(parts) && !feed.0.is_finished()
                });
                for (addr, parts) in wanted {
                    if feeds.contains_key(&addr) {
                        continue;
                    }
                    let request = WatchRequest {
                        stream: stream.clone(),
                        partitioner: partitioner as u32,
                        partitions: parts.clone(),
                        metric: metric.clone(),
                        plan: generation,
                    };
                    let (client, watcher, gone) =
                        (me.stream_client(&addr), watcher.clone(), gone.clone());
                    let feed = tokio::spawn(async move {
                        if !read_feed(client, request, watcher).await {
                            gone.store(true, std::sync::atomic::Ordering::Release);
                        }
                    });
                    feeds.insert(addr, (parts, Feed(feed)));
                }
                tokio::time::sleep(FEED_EVERY).await;
            }
        });
        task.abort_handle()
    }

    fn owner(&self, task: &TaskId) -> Result<Option<PeerAt>> {
        let kafka = self
            .kafka
            .upgrade()
            .ok_or_else(|| unavailable("this node is shutting down"))?;
        let (active, peer) = {
            let view = self.view.read().expect("view lock");
            let placement = view
                .plan
                .placement(task)
                .ok_or_else(|| unavailable("the task is not placed on any node yet"))?;
            let addr = view
                .facts
                .get(&placement.active)
                .map(|f| f.peer_addr.clone())
                .unwrap_or_default();
            (
                placement.active == self.me,
                PeerAt {
                    addr,
                    generation: view.generation,
                },
            )
        };
        // Without its lease this node does not know the plan is current, so it neither
        // answers nor routes.
        kafka.fence().check()?;
        if active {
            kafka.serves(task)?;
            return Ok(None);
        }
        Ok(Some(peer))
    }

    fn lease(&self) -> Result<()> {
        match self.kafka.upgrade() {
            Some(kafka) => kafka.fence().check(),
            None => Err(unavailable("this node is shutting down")),
        }
    }

    fn metric_rows<'a>(
        &'a self,
        peer: PeerAt,
        stream: &'a str,
        partitioner: usize,
        partitions: Vec<u32>,
        metric: &'a str,
        key: Option<&'a [Value]>,
    ) -> LogFuture<'a, Vec<Vec<Value>>> {
        Box::pin(async move {
            let addr = peer.addr;
            let request = MetricRowsRequest {
                plan: peer.generation,
                stream: stream.to_string(),
                partitioner: partitioner as u32,
                partitions,
                metric: metric.to_string(),
                key: key.map(|k| {
                    let mut out = Vec::new();
                    codec::encode_row(k, &mut out);
                    out
                }),
            };
            let reply = self
                .client(&addr)?
                .metric_rows(request)
                .await
                .map_err(|e| self.failed(&addr, e))?;
            decode_rows(&reply.into_inner().rows)
        })
    }

    fn history_page<'a>(
        &'a self,
        peer: PeerAt,
        task: &'a TaskId,
        after: i64,
        upto: i64,
        max: usize,
    ) -> LogFuture<'a, HistoryPage> {
        Box::pin(async move {
            let addr = peer.addr;
            let request = HistoryPageRequest {
                plan: peer.generation,
                stream: task.stream.clone(),
                partitioner: task.partitioner as u32,
                partition: task.partition,
                after,
                upto,
                max: max as u64,
            };
            let reply = self
                .client(&addr)?
                .history_page(request)
                .await
                .map_err(|e| self.failed(&addr, e))?
                .into_inner();
            let rows = decode_rows(&reply.rows)?;
            if rows.len() != reply.times.len() || rows.len() != reply.seqs.len() {
                return Err(Error::internal("a history page's columns differ in length"));
            }
            let events = (reply.times.into_iter().zip(reply.seqs))
                .zip(rows)
                .map(|((ts, seq), row)| (ts, seq, Row::from(row)))
                .collect();
            Ok(HistoryPage {
                events,
                through: reply.through,
                time: reply.time,
                seq: reply.seq,
                stored: reply.stored as usize,
                horizon: reply.horizon,
            })
        })
    }

    fn stream_rows<'a>(
        &'a self,
        peer: PeerAt,
        stream: &'a str,
        partitions: Vec<u32>,
    ) -> LogFuture<'a, Vec<Row>> {
        Box::pin(async move {
            let addr = peer.addr;
            let request = StreamRowsRequest {
                plan: peer.generation,
                stream: stream.to_string(),
                partitions,
            };
            let reply = self
                .client(&addr)?
                .stream_rows(request)
                .await
                .map_err(|e| self.failed(&addr, e))?;
            Ok(decode_rows(&reply.into_inner().rows)?
                .into_iter()
                .map(Row::from)
                .collect())
        })
    }
}

/// How long a transfer may wait for its next piece.
const PIECE_TIMEOUT: Duration = Duration::from_secs(30);

/// Recovers tasks new to this node from the checkpoints of their other holders.
struct Recovery {
    peers: Arc<Peers>,
    engine: Weak<Engine>,
    runtime: tokio::runtime::Handle,
}

impl Recover for Recovery {
    fn recover(&self, task: TaskId, after: u64, done: Box<dyn FnOnce(Option<u64>) + Send>) -> bool {
        if holders(&self.peers, &task).is_empty() {
            return false;
        }
        let (peers, engine) = (self.peers.clone(), self.engine.clone());
        self.runtime.spawn(async move {
            let end = match engine.upgrade() {
                Some(engine) => recover_task(&peers, &engine, &task, after).await,
                None => None,
            };
            done(end);
        });
        true
    }
}

/// The nodes that may have a checkpoint of `task`, best first: its replicas, its active
/// copy, then the nodes that announced a stale copy; live ones only, without this node.
/// A node with nothing newer answers with nothing, at the cost of one call.
fn holders(peers: &Peers, task: &TaskId) -> Vec<(String, String)> {
    let view = peers.view.read().expect("view lock");
    let mut nodes: Vec<&String> = Vec::new();
    if let Some(p) = view.plan.placement(task) {
        nodes.extend(&p.replicas);
        nodes.push(&p.active);
    }
    for (node, facts) in &view.facts {
        if facts.stale.contains(task) {
            nodes.push(node);
        }
    }
    let mut out: Vec<(String, String)> = Vec::new();
    for node in nodes {
        // Live as the plan's leader saw them (a node that just started may not have
        // described the group itself yet).
        let live = view.plan.members.contains(node) || view.alive.contains(node);
        if *node == peers.me || !live || out.iter().any(|(n, _)| n == node) {
            continue;
        }
        if let Some(f) = view.facts.get(node).filter(|f| !f.peer_addr.is_empty()) {
            out.push((node.clone(), f.peer_addr.clone()));
        }
    }
    out
}

async fn recover_task(
    peers: &Peers,
    engine: &Arc<Engine>,
    task: &TaskId,
    after: u64,
) -> Option<u64> {
    let storage = engine.storage()?.clone();
    let stats = &storage.transfers;
    for (node, addr) in holders(peers, task) {
        let staged = match fetch(peers, &storage, &addr, task, after).await {
            Ok(Some(staged)) => staged,
            Ok(None) => continue,
            Err(e) => {
                stats
                    .rejected
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::warn!(task = ?task, node = %node, "recovering the task from a peer: {e}");
                continue;
            }
        };
        let (received, reused) = (staged.received, staged.reused);
        match engine.install_task(task, staged).await {
            Ok(end) => {
                stats
                    .installed
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                tracing::info!(
                    task = ?task,
                    "task {}/{}/{} recovered from node {node}: offset {end}, {received} bytes received, {reused} kept",
                    task.stream, task.partitioner, task.partition
                );
                return Some(end);
            }
            Err(e) => {
                tracing::warn!(task = ?task, node = %node, "installing the task from a peer: {e}")
            }
        }
    }
    None
}

/// Receives a peer's checkpoint of `task` if it is newer than `after`, staged and
/// checked; `None` when the peer has nothing newer.
async fn fetch(
    peers: &Peers,
    storage: &Arc<crate::node::durable::NodeStorage>,
    addr: &str,
    task: &TaskId,
    after: u64,
) -> Result<Option<crate::node::transfer::Staged>> {
    let have = {
        let (storage, task) = (storage.clone(), task.clone());
        tokio::task::spawn_blocking(move || storage.have(&task))
            .await
            .map_err(|e| Error::internal(e.to_string()))?
    };
    let request = CheckpointRequest {
        stream: task.stream.clone(),
        partitioner: task.partitioner as u32,
        partition: task.partition,
        after,
        have: have
            .into_iter()
            .map(|h| proto::FileHave {
                name: h.name,
                len: h.len,
                crc: h.crc,
            })
            .collect(),
        format: crate::format::own(),
    };
    let mut stream = peers
        .client(addr)?
        .checkpoint(request)
        .await
        .map_err(|e| Error::internal(format!("the peer at {addr}: {}", e.message())))?
        .into_inner();
    let mut import: Option<crate::node::transfer::Import> = None;
    let received = &storage.transfers.received_bytes;
    loop {
        let next = tokio::time::timeout(PIECE_TIMEOUT, stream.message())
            .await
            .map_err(|_| Error::internal(format!("the peer at {addr} stopped sending")))?
            .map_err(|e| Error::internal(format!("the peer at {addr}: {}", e.message())))?;
        let Some(piece) = next else {
            break;
        };
        if let Some(proto::piece::Piece::Header(h)) = &piece.piece {
            let transfer = format!("the transfer from the peer at {addr}");
            crate::format::check(h.format.max(crate::format::OLDEST), &transfer)
                .map_err(Error::internal)?;
        }
        let piece = from_proto(piece).ok_or_else(|| Error::internal("an unreadable piece"))?;
        received.fetch_add(piece.bytes() as u64, std::sync::atomic::Ordering::Relaxed);
        let import = match &mut import {
            Some(i) => i,
            None => import.insert(storage.import(task)?),
        };
        import.accept(piece)?;
    }
    let Some(import) = import else {
        return Ok(None);
    };
    let reused = import.reused;
    let staged = import.finish()?;
    storage
        .transfers
        .reused_bytes
        .fetch_add(reused, std::sync::atomic::Ordering::Relaxed);
    Ok(Some(staged))
}
