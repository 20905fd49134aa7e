//! The one HTTP server loop of both binaries (the agent's HTTP door, gRPC door and admin port, the
//! webhook, the operator's metrics port), with the limits `axum::serve` does not have.
//!
//! ```text
//! Listener::accept ──▶ over max_connections, or over its source's share? ── yes ─▶ closed (no answer)
//!                          │ no: a permit (and a source slot), held by the connection's task
//!                          ▼
//!   hyper-util auto (HTTP/1.1 + h2) ─▶ the router (ConnectInfo<addr> in every request)
//!      · HTTP/1: the whole request head within header_read_timeout
//!      · every connection, h2 included: no request in flight for header_read_timeout ─▶ closed
//!        gracefully (h2: GOAWAY); a request is in flight until its response body ends, so a
//!        stream (gRPC Watch, SSE) keeps its connection open however quiet it is
//!      · h2: keep-alive pings; a peer that does not answer within the timeout is dropped
//! shutdown ──▶ stop accepting; each connection finishes its in-flight requests (graceful)
//! ```
//!
//! Why: a client that sends a head one byte a minute (slowloris), or opens connections and
//! never asks anything (an h2 peer answers pings and so is never "dead"), would hold a task and
//! a socket each forever, and enough of them stop `/healthz`, so the kubelet restarts a pod that
//! was only being attacked. The limits are per listener (a flood on one port never starves
//! another) and per source address (one remote peer never takes more than a quarter of a port;
//! loopback peers, all of a pod's own callers, share the whole listener).
//! Refusing at the cap rather than waiting keeps the accept queue moving.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::Poll;
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::{Frame, Incoming, SizeHint};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use parking_lot::Mutex;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a client may take to send a request head, and how long a connection may sit with no
/// request in flight: 10 s covers any real client on a slow link (nginx's
/// `client_header_timeout` is 60 s, but its clients are browsers on phones; ours are pods, the
/// API server and scrapers).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections per listener: far above what one pod's app or the API server opens (the
/// benches peak at 64), far below the default fd limit (1,024 soft; each connection is one fd).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
/// One source address may hold this share of a listener's connections (1/4: the kubelet's
/// probes and the API server always find room beside one noisy peer).
const PER_SOURCE_DIVISOR: usize = 4;
/// h2 keep-alive: a ping every 20 s, and a peer silent for 10 s more is gone.
const H2_KEEPALIVE_INTERVAL: Duration = Duration::from_secs(20);
const H2_KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// Limits of one listener.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// See [`DEFAULT_HEADER_READ_TIMEOUT`].
    pub header_read_timeout: Duration,
    /// See [`DEFAULT_MAX_CONNECTIONS`].
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT, max_connections: DEFAULT_MAX_CONNECTIONS }
    }
}

impl ConnectionLimits {
    /// The connections `source` may hold. The host's own address (`127.0.0.1`, `::1`) shares the
    /// whole listener: in a pod every caller of the doors (the app, its clients' pools, sidecars)
    /// comes from it, so a share could not tell them apart and would cap the app itself at a
    /// quarter.
    fn share_for(&self, source: IpAddr) -> usize {
        let own = match source.to_canonical() {
            IpAddr::V4(v4) => v4 == std::net::Ipv4Addr::LOCALHOST,
            IpAddr::V6(v6) => v6 == std::net::Ipv6Addr::LOCALHOST,
        };
        if own { self.max_connections } else { (self.max_connections / PER_SOURCE_DIVISOR).max(1) }
    }
}

/// Open connections per source address; a slot gives its place back when dropped.
#[derive(Default)]
struct Sources(Mutex<HashMap<IpAddr, usize>>);

struct SourceSlot {
    sources: Arc<Sources>,
    ip: IpAddr,
}

impl Sources {
    fn take(self: &Arc<Self>, ip: IpAddr, cap: usize) -> Option<SourceSlot> {
        let mut open = self.0.lock();
        let count = open.entry(ip).or_default();
        if *count >= cap {
            return None;
        }
        *count += 1;
        Some(SourceSlot { sources: self.clone(), ip })
    }
}

impl Drop for SourceSlot {
    fn drop(&mut self) {
        let mut open = self.sources.0.lock();
        if let Some(count) = open.get_mut(&self.ip) {
            *count -= 1;
            if *count == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

/// Requests in flight on one connection, and when the last one ended. Counting costs two atomic
/// operations and a clock read per request, and wakes nothing: the connection's task looks only
/// when a check is due (a notification per request start and end would wake it twice per
/// request, under a lock).
struct Activity {
    in_flight: AtomicUsize,
    /// When the connection started; `last_end_ms` counts from it.
    started: Instant,
    /// Milliseconds after `started` at which the last request ended (0: none yet, so idle since
    /// the connection began).
    last_end_ms: AtomicU64,
}

struct InFlight(Arc<Activity>);

impl Activity {
    fn new() -> Self {
        Activity { in_flight: AtomicUsize::new(0), started: Instant::now(), last_end_ms: AtomicU64::new(0) }
    }

    fn start(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    /// Returns once no request has been in flight for `timeout`: it sleeps until the earliest
    /// moment that could be true and looks again, so a busy connection costs one timer per
    /// `timeout`, not one per request.
    async fn idle_for(&self, timeout: Duration) {
        let mut check = Instant::now() + timeout;
        loop {
            tokio::time::sleep_until(check).await;
            let now = Instant::now();
            if self.in_flight.load(Ordering::Acquire) > 0 {
                check = now + timeout;
                continue;
            }
            let idle_since = self.started + Duration::from_millis(self.last_end_ms.load(Ordering::Acquire));
            if now >= idle_since + timeout {
                return;
            }
            check = idle_since + timeout;
        }
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let ended = u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // Before the decrement: whoever sees no request in flight sees when the last one ended.
        self.0.last_end_ms.store(ended, Ordering::Release);
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A response body that keeps its request counted in flight until its last frame.
struct CountedBody {
    body: Body,
    in_flight: Option<InFlight>,
}

impl hyper::body::Body for CountedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let polled = Pin::new(&mut self.body).poll_frame(cx);
        if matches!(polled, Poll::Ready(None) | Poll::Ready(Some(Err(_)))) {
            self.in_flight = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// Serves `router` on `listener` until `shutdown`; then stops accepting and returns once every
/// connection has finished its in-flight requests (callers bound that with their grace period).
/// Every request carries `ConnectInfo<SocketAddr>`, as `into_make_service_with_connect_info` gives.
pub async fn serve<L>(mut listener: L, router: Router, limits: ConnectionLimits, shutdown: CancellationToken)
where
    L: Listener<Addr = SocketAddr>,
{
    let max_connections = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max_connections));
    let sources = Arc::new(Sources::default());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder.http1().timer(TokioTimer::new()).header_read_timeout(limits.header_read_timeout);
    builder
        .http2()
        .timer(TokioTimer::new())
        .keep_alive_interval(H2_KEEPALIVE_INTERVAL)
        .keep_alive_timeout(H2_KEEPALIVE_TIMEOUT);
    loop {
        let (io, peer) = tokio::select! {
            () = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tracing::debug!(?peer, max = limits.max_connections, "connection refused: too many open connections");
            continue;
        };
        let share = limits.share_for(peer.ip());
        let Some(source) = sources.take(peer.ip(), share) else {
            tracing::debug!(?peer, max = share, "connection refused: too many from this source");
            continue;
        };
        let activity = Arc::new(Activity::new());
        let counted = activity.clone();
        let service = router.clone().map_request(move |mut request: axum::http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer));
            request
        });
        let service = hyper::service::service_fn(move |request| {
            let service = service.clone();
            let in_flight = counted.start();
            async move {
                let response = service.oneshot(request).await.unwrap_or_else(|never| match never {});
                // Counted until the body ends (or is dropped: the peer reset the stream).
                Ok::<_, Infallible>(response.map(|body| Body::new(CountedBody { body, in_flight: Some(in_flight) })))
            }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned();
        let (shutdown, idle_timeout) = (shutdown.clone(), limits.header_read_timeout);
        tokio::spawn(async move {
            tokio::pin!(connection);
            let mut closing = false;
            let ended = loop {
                tokio::select! {
                    ended = connection.as_mut() => break ended,
                    () = shutdown.cancelled(), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                    () = activity.idle_for(idle_timeout), if !closing => {
                        connection.as_mut().graceful_shutdown();
                        closing = true;
                    }
                }
            };
            // Errors are the peer's doing (reset, timeout, malformed request): nothing to act on.
            if let Err(error) = ended {
                tracing::trace!(%error, "connection ended with an error");
            }
            drop((permit, source));
        });
    }
    drop(listener);
    // Every connection holds a permit until it ends: all of them back means all ended.
    let _ = slots.acquire_many(u32::try_from(max_connections).unwrap_or(u32::MAX)).await;
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use axum::routing::get;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};

    use super::*;

    async fn start(limits: ConnectionLimits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let router = Router::new()
            .route("/peer", get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move { peer.ip().to_string() }));
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, router, limits, stop.clone()));
        (addr, stop, task)
    }

    async fn get_peer(addr: SocketAddr) -> String {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        stream.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let mut body = String::new();
        stream.read_to_string(&mut body).await.expect("read");
        body
    }

    /// Slowloris: connections that never finish their request head are closed after the header
    /// timeout, which frees their slots for real clients.
    #[tokio::test]
    async fn slow_request_heads_are_cut_off_and_their_slots_freed() {
        let limits = ConnectionLimits { header_read_timeout: Duration::from_millis(300), max_connections: 4 };
        let (addr, stop, task) = start(limits).await;
        let mut slow = Vec::new();
        for _ in 0..4 {
            let mut s = TcpStream::connect(addr).await.expect("connect");
            s.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n").await.expect("partial head");
            slow.push(s);
        }
        // The cap is reached: one more is closed at once.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut refused = TcpStream::connect(addr).await.expect("connect");
        let mut buf = [0u8; 1];
        let closed = tokio::time::timeout(Duration::from_millis(250), refused.read(&mut buf)).await;
        assert!(matches!(closed, Ok(Ok(0)) | Ok(Err(_))), "over the cap: closed without an answer, got {closed:?}");
        // Each slow client is closed by the server (EOF or reset) once the timeout passes.
        for s in &mut slow {
            let read = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf)).await;
            assert!(matches!(read, Ok(Ok(_)) | Ok(Err(_))), "the server must close a slow request head: {read:?}");
        }
        assert!(get_peer(addr).await.contains("127.0.0.1"), "a real client is served once the slots are free");
        stop.cancel();
        task.await.expect("serve returns after shutdown");
    }

    /// An HTTP/2 peer that answers pings but never asks anything (prior knowledge, as a
    /// plain-text client may) is closed after the idle timeout like an HTTP/1 one, and its slot
    /// freed; a connection with a request in flight is not.
    #[tokio::test]
    async fn idle_http2_connections_are_closed_and_their_slots_freed() {
        let limits = ConnectionLimits { header_read_timeout: Duration::from_millis(300), max_connections: 8 };
        let (addr, stop, task) = start(limits).await;
        let mut idle = Vec::new();
        for _ in 0..2 {
            let io = TokioIo::new(TcpStream::connect(addr).await.expect("connect"));
            let (sender, connection) =
                hyper::client::conn::http2::handshake::<_, _, axum::body::Body>(TokioExecutor::new(), io)
                    .await
                    .expect("h2 handshake");
            // The connection task answers pings and settings; nothing is ever sent.
            idle.push((sender, tokio::spawn(connection)));
        }
        for (_sender, connection) in idle {
            let ended = tokio::time::timeout(Duration::from_secs(5), connection).await;
            assert!(ended.is_ok(), "an idle h2 connection must be closed by the server");
        }
        assert!(get_peer(addr).await.contains("127.0.0.1"), "the slots are free again");
        stop.cancel();
        task.await.expect("serve returns after shutdown");
    }

    /// A response that streams for longer than the idle timeout (a gRPC Watch, an SSE stream)
    /// keeps its request in flight: the connection is not closed under it and takes another
    /// request meanwhile; once the stream has ended, the idle timeout applies again.
    #[tokio::test]
    async fn a_streaming_response_keeps_its_h2_connection_open() {
        let limits = ConnectionLimits { header_read_timeout: Duration::from_millis(300), max_connections: 8 };
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let stream = || async {
            let ticks = futures::stream::unfold(0u32, |n| async move {
                if n == 10 {
                    return None;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                Some((Ok::<_, Infallible>(Bytes::from_static(b"tick\n")), n + 1))
            });
            Body::from_stream(ticks)
        };
        let router = Router::new().route("/stream", get(stream)).route("/ok", get(|| async { "ok" }));
        let stop = CancellationToken::new();
        let task = tokio::spawn(serve(listener, router, limits, stop.clone()));
        let io = TokioIo::new(TcpStream::connect(addr).await.expect("connect"));
        let (mut sender, connection) =
            hyper::client::conn::http2::handshake::<_, _, Body>(TokioExecutor::new(), io).await.expect("h2 handshake");
        let connection = tokio::spawn(connection);
        let request = |path: &str| {
            axum::http::Request::builder().uri(format!("http://{addr}{path}")).body(Body::empty()).expect("request")
        };
        let streaming = sender.send_request(request("/stream")).await.expect("the stream's head");
        // Twice the idle timeout into the stream, the connection still takes a request.
        tokio::time::sleep(Duration::from_millis(700)).await;
        let ok = sender.send_request(request("/ok")).await.expect("a request beside the open stream");
        assert_eq!(ok.status(), 200);
        let body = axum::body::to_bytes(Body::new(streaming.into_body()), 1 << 16).await.expect("the whole stream");
        assert_eq!(body.len(), 50, "every tick arrived");
        let closed = tokio::time::timeout(Duration::from_secs(5), connection).await;
        assert!(closed.is_ok(), "idle again after the stream: closed");
        stop.cancel();
        task.await.expect("serve returns after shutdown");
    }

    /// A connection from `source` to `addr` with a partial request head (it holds its slot).
    async fn hold_from(source: &str, addr: SocketAddr) -> TcpStream {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(format!("{source}:0").parse().expect("addr")).expect("bind the source");
        let mut stream = socket.connect(addr).await.expect("connect");
        stream.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n").await.expect("partial head");
        stream
    }

    /// Whether `stream` was closed by the server without an answer.
    async fn closed(stream: &mut TcpStream) -> bool {
        let mut buf = [0u8; 1];
        let read = tokio::time::timeout(Duration::from_millis(500), stream.read(&mut buf)).await;
        matches!(read, Ok(Ok(0)) | Ok(Err(_)))
    }

    /// One source address holds at most a quarter of a listener's connections: the rest of the
    /// port stays open to others (here: the cap of 8 leaves a source 2). The host's own address
    /// is every in-pod caller at once and shares the whole listener.
    #[tokio::test]
    async fn one_source_takes_at_most_its_share_of_the_connections() {
        let limits = ConnectionLimits { header_read_timeout: Duration::from_secs(5), max_connections: 8 };
        let (addr, stop, _task) = start(limits).await;
        let mut held = vec![hold_from("127.0.0.2", addr).await, hold_from("127.0.0.2", addr).await];
        tokio::time::sleep(Duration::from_millis(50)).await;
        let mut third = hold_from("127.0.0.2", addr).await;
        assert!(closed(&mut third).await, "over its share: closed at once");
        // Another source still gets in.
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind("127.0.0.3:0".parse().expect("addr")).expect("bind 127.0.0.3");
        let mut other = socket.connect(addr).await.expect("connect from 127.0.0.3");
        other.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").await.expect("write");
        let mut body = String::new();
        other.read_to_string(&mut body).await.expect("read");
        assert!(body.contains("127.0.0.3"), "{body}");
        // 127.0.0.1 takes what is left of the listener (8 - 2), not a share of 2.
        for _ in 0..6 {
            held.push(hold_from("127.0.0.1", addr).await);
        }
        for stream in &mut held {
            assert!(!closed(stream).await, "within the listener's cap: kept open");
        }
        let mut ninth = hold_from("127.0.0.1", addr).await;
        assert!(closed(&mut ninth).await, "over the listener's cap: closed at once");
        stop.cancel();
    }

    /// An idle keep-alive connection is closed too (hyper starts the header timer again after
    /// each response).
    #[tokio::test]
    async fn an_idle_keep_alive_connection_is_closed() {
        let limits = ConnectionLimits { header_read_timeout: Duration::from_millis(300), max_connections: 4 };
        let (addr, stop, _task) = start(limits).await;
        let mut s = TcpStream::connect(addr).await.expect("connect");
        s.write_all(b"GET /peer HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("request");
        let mut response = vec![0u8; 4096];
        let n = s.read(&mut response).await.expect("response");
        assert!(String::from_utf8_lossy(&response[..n]).starts_with("HTTP/1.1 200"));
        let rest = tokio::time::timeout(Duration::from_secs(5), s.read(&mut response)).await;
        assert!(matches!(rest, Ok(Ok(0)) | Ok(Err(_))), "idle connection closed by the server: {rest:?}");
        stop.cancel();
    }
}
