//! The Kubernetes API client of the agent and the operator: kube's own stack over a connection
//! that speaks HTTP/2 when the API server offers it.
//!
//! kube 5 builds an HTTP/1.1-only client, so every watch holds a TLS connection of its own, and
//! the API server pays for each (about 110 KiB per watch, BENCHMARKS.md "propagation"). Here TLS
//! offers `h2` then `http/1.1` by ALPN, as client-go does: on an API server that picks `h2`, an
//! agent's watches and requests share one connection; one that does not (or a plain `http://`
//! URL) gets HTTP/1.1 as before.
//!
//! - The rest of the stack is kube's: the same TLS configuration (CA, client certificate, server
//!   name, the reloading CA verifier), auth (tokens re-read as they rotate), base URI, extra
//!   headers, retries of 429/503/504, connect/read/write timeouts. Left out: kube's per-request
//!   debug spans (`tower-http` tracing), which nothing here reads.
//! - HTTP/2 pings every 30 s (15 s to answer), idle or not, notice a dead connection under a
//!   quiet watch, as client-go's `ReadIdleTimeout`/`PingTimeout` do; HTTP/1.1 watches rely on
//!   the server's watch timeout instead.
//! - A proxy (`proxy-url` in the kubeconfig) keeps kube's own HTTP/1.1 client: its tunnels are
//!   kube's to build. So does anything that upgrades to a WebSocket (port-forward, exec), which
//!   HTTP/2 cannot carry here.

use std::time::Duration;

use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use kube::client::{Body, ConfigExt};
use kube::{Client, Config};
use tower::ServiceBuilder;
use tower::retry::RetryLayer;

/// How often an HTTP/2 connection is pinged, busy or idle.
const PING_INTERVAL: Duration = Duration::from_secs(30);
/// How long a ping may go unanswered before the connection is closed (its watches then restart).
const PING_TIMEOUT: Duration = Duration::from_secs(15);

/// A client for `config`, on HTTP/2 where the API server speaks it (see the module header).
///
/// # Errors
/// The configuration's TLS material or auth cannot be loaded (the same errors as
/// `kube::Client::try_from`).
pub fn client(config: Config) -> Result<Client, kube::Error> {
    if config.proxy_url.is_some() {
        return Client::try_from(config);
    }
    let mut http = HttpConnector::new();
    http.enforce_http(false);
    // A request is written as several small frames (HEADERS, DATA); with Nagle's algorithm on, the
    // second waits for the API server's delayed ACK of the first, about 40 ms per request
    // (BENCHMARKS.md "gateway": a TokenReview took 44 ms). Watches never noticed; requests do.
    http.set_nodelay(true);
    let tls = config.rustls_client_config()?;
    let mut https = hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(tls).https_or_http();
    if let Some(name) = config.tls_server_name.as_ref() {
        let name = rustls::pki_types::ServerName::try_from(name.clone())
            .map_err(|e| kube::Error::RustlsTls(kube::client::RustlsTlsError::InvalidServerName(e)))?;
        https = https.with_server_name_resolver(hyper_rustls::FixedServerNameResolver::new(name));
    }
    let https = https.enable_all_versions().wrap_connector(http);
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let http_client: hyper_util::client::legacy::Client<_, Body> =
        hyper_util::client::legacy::Builder::new(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .http2_keep_alive_interval(PING_INTERVAL)
            .http2_keep_alive_timeout(PING_TIMEOUT)
            .http2_keep_alive_while_idle(true)
            .build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.default_retry.then(|| RetryLayer::new(kube::client::retry::RetryPolicy::server_retry())))
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        .map_err(tower::BoxError::from)
        .service(http_client);
    Ok(Client::new(service, config.default_namespace))
}
