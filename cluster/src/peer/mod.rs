//! The peer service (gRPC, tonic; `proto/peer.proto`): what one node of a cluster asks
//! another. A read of a task that another node holds active goes there: a point lookup
//! to the one task's active node, a full scan to every node with active tasks.
//!
//! Invariant: a node answers a peer only from its own tasks, never by asking a further
//! peer, so a read crosses at most one hop and cannot loop.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use eddy_planner::codec::{self, Reader};
use eddy_planner::types::Value;
use eddy_planner::{Error, Result};

use crate::engine::{Engine, Remote};
use crate::exec::events::Row;
use crate::log::{Kafka, LogFuture};
use crate::membership::View;
use crate::route::TaskId;

#[allow(clippy::all, missing_docs)]
pub mod proto {
    tonic::include_proto!("eddy.peer");
}

use proto::peer_client::PeerClient;
use proto::peer_server::{Peer, PeerServer};
use proto::{MetricRowsRequest, Rows, StreamRowsRequest};

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
    let service = PeerServer::new(Service {
        engine: Arc::downgrade(engine),
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
            eprintln!("eddy: the peer service stopped: {e}");
        }
    });
    engine.set_remote(Arc::new(Peers {
        me: kafka.config().node.clone(),
        view: kafka.view_handle(),
        clients: Mutex::default(),
    }));
    Ok(())
}

struct Service {
    engine: Weak<Engine>,
}

impl Service {
    fn engine(&self) -> std::result::Result<Arc<Engine>, Status> {
        self.engine
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))
    }
}

fn status(e: Error) -> Status {
    Status::failed_precondition(e.to_string())
}

#[tonic::async_trait]
impl Peer for Service {
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
        let rows = self
            .engine()?
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
        let rows = self
            .engine()?
            .local_stream_rows(&r.stream, Some(&r.partitions))
            .await
            .map_err(status)?;
        Ok(Response::new(Rows {
            rows: encode_rows(rows.iter().map(|r| &r[..])),
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

impl Remote for Peers {
    fn elsewhere(&self, task: &TaskId) -> Option<String> {
        let view = self.view.read().expect("view lock");
        let placement = view.plan.placement(task)?;
        if placement.active == self.me {
            return None;
        }
        Some(
            view.facts
                .get(&placement.active)
                .map(|f| f.peer_addr.clone())
                .unwrap_or_default(),
        )
    }

    fn metric_rows<'a>(
        &'a self,
        addr: String,
        stream: &'a str,
        partitioner: usize,
        partitions: Vec<u32>,
        metric: &'a str,
        key: Option<&'a [Value]>,
    ) -> LogFuture<'a, Vec<Vec<Value>>> {
        Box::pin(async move {
            let request = MetricRowsRequest {
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

    fn stream_rows<'a>(
        &'a self,
        addr: String,
        stream: &'a str,
        partitions: Vec<u32>,
    ) -> LogFuture<'a, Vec<Row>> {
        Box::pin(async move {
            let request = StreamRowsRequest {
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
