//! The one HTTP server loop of both binaries (the agent's HTTP door and admin port, the webhook,
//! the operator's metrics port), with the limits `axum::serve` does not have.
//!
//! ```text
//! Listener::accept ──▶ over max_connections? ── yes ─▶ closed at once (counted)
//!                          │ no: a permit, held by the connection's task
//!                          ▼
//!   hyper-util auto (HTTP/1.1 + h2) ─▶ the router (ConnectInfo<addr> in every request)
//!      · HTTP/1: the whole request head within header_read_timeout, which hyper also applies
//!        to an idle keep-alive connection waiting for its next request
//!      · h2: keep-alive pings; a peer that does not answer within the timeout is dropped
//! shutdown ──▶ stop accepting; each connection finishes its in-flight requests (graceful)
//! ```
//!
//! Why: without a timer a client that sends a request head one byte a minute (slowloris), or
//! opens connections and never writes, holds a task and a socket each forever; enough of them
//! exhaust file descriptors and stop `/healthz`, so the kubelet restarts a pod that was only
//! being attacked. The limits are per listener, so a flood on one port never starves another.
//! Refusing at the cap (rather than waiting for a slot) keeps the accept queue moving: a
//! legitimate client retries, and the header timeout frees slotted attackers within seconds.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::ConnectInfo;
use axum::serve::Listener;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

/// How long a client may take to send a request head, and how long a keep-alive connection may
/// sit idle: 10 s covers any real client on a slow link (nginx's `client_header_timeout` is 60 s,
/// but its clients are browsers on phones; ours are pods, the API server and scrapers).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Open connections per listener: far above what one pod's app or the API server opens (the
/// benches peak at 64), far below the default fd limit (1,024 soft; each connection is one fd).
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;
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

/// Serves `router` on `listener` until `shutdown`; then stops accepting and returns once every
/// connection has finished its in-flight requests (callers bound that with their grace period).
/// Every request carries `ConnectInfo<L::Addr>`, as `into_make_service_with_connect_info` gives.
pub async fn serve<L>(mut listener: L, router: Router, limits: ConnectionLimits, shutdown: CancellationToken)
where
    L: Listener,
    L::Addr: Clone + Send + Sync + std::fmt::Debug + 'static,
{
    let slots = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = GracefulShutdown::new();
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
            drop(io);
            continue;
        };
        let service = router.clone().map_request(move |mut request: axum::http::Request<Incoming>| {
            request.extensions_mut().insert(ConnectInfo(peer.clone()));
            request
        });
        let service = hyper::service::service_fn(move |request| {
            let service = service.clone();
            async move { Ok::<_, Infallible>(service.oneshot(request).await.unwrap_or_else(|never| match never {})) }
        });
        let connection = builder.serve_connection_with_upgrades(TokioIo::new(io), service).into_owned();
        let connection = graceful.watch(connection);
        tokio::spawn(async move {
            // Errors are the peer's doing (reset, timeout, malformed request): nothing to act on.
            if let Err(error) = connection.await {
                tracing::trace!(%error, "connection ended with an error");
            }
            drop(permit);
        });
    }
    drop(listener);
    graceful.shutdown().await;
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
