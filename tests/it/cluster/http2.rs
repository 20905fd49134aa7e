//! The agent's Kubernetes client (`spear::kube_client`) against the real test control plane,
//! behind a TLS front that counts connections: on an API server offering HTTP/2 an agent's two
//! watches and its requests share one connection; behind a front offering only HTTP/1.1 (a
//! load balancer that does not speak h2) the same agent falls back and still follows edits.
//!
//! The front terminates the client's TLS with its own certificate and ALPN list, and opens one
//! upstream connection per client connection, as the admin, with the protocol the client
//! negotiated; bytes pass through unchanged.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::client::ConfigExt;
use parking_lot::Mutex;
use spear::api::{McpProfile, McpServer};
use spear::registry::{KubeSource, KubeWatch, RegistryView};
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

const H2: &[u8] = b"h2";
const HTTP1: &[u8] = b"http/1.1";
const PATIENCE: Duration = Duration::from_secs(60);

/// A TLS front before the shared control plane's API server.
struct Front {
    addr: SocketAddr,
    ca_der: Vec<u8>,
    /// Client connections open now.
    open: Arc<AtomicUsize>,
    /// The protocol each client connection negotiated.
    negotiated: Arc<Mutex<Vec<String>>>,
}

impl Front {
    async fn start(offered: &[&[u8]]) -> Front {
        let control_plane = ControlPlane::shared();
        let upstream_addr = {
            let url = control_plane.config().cluster_url;
            let port = url.port_u16().expect("the test control plane's URL has a port");
            SocketAddr::from((Ipv4Addr::LOCALHOST, port))
        };
        let upstream_tls = control_plane.config().rustls_client_config().expect("the admin's TLS config");
        let certified = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("a front certificate");
        let ca_der = certified.cert.der().to_vec();
        let key = rustls::pki_types::PrivateKeyDer::try_from(certified.signing_key.serialize_der())
            .expect("the front's key in DER");
        let mut server_tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(vec![certified.cert.der().clone()], key)
            .expect("the front's TLS config");
        server_tls.alpn_protocols = offered.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(server_tls));
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind the front");
        let addr = listener.local_addr().expect("the front's address");
        let (open, negotiated) = (Arc::new(AtomicUsize::new(0)), Arc::new(Mutex::new(Vec::new())));
        let (open_count, negotiated_log) = (open.clone(), negotiated.clone());
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, open, negotiated) = (acceptor.clone(), open_count.clone(), negotiated_log.clone());
                let mut upstream_tls = upstream_tls.clone();
                tokio::spawn(async move {
                    let Ok(mut downstream) = acceptor.accept(tcp).await else { return };
                    let alpn = downstream.get_ref().1.alpn_protocol().map(<[u8]>::to_vec);
                    negotiated
                        .lock()
                        .push(alpn.as_deref().map(String::from_utf8_lossy).unwrap_or_default().into_owned());
                    upstream_tls.alpn_protocols = alpn.into_iter().collect();
                    let connector = tokio_rustls::TlsConnector::from(Arc::new(upstream_tls));
                    let Ok(tcp) = TcpStream::connect(upstream_addr).await else { return };
                    let name = rustls::pki_types::ServerName::IpAddress(Ipv4Addr::LOCALHOST.into());
                    let Ok(mut upstream) = connector.connect(name, tcp).await else { return };
                    open.fetch_add(1, Ordering::SeqCst);
                    let _ = tokio::io::copy_bidirectional(&mut downstream, &mut upstream).await;
                    open.fetch_sub(1, Ordering::SeqCst);
                });
            }
        });
        Front { addr, ca_der, open, negotiated }
    }

    /// A client configuration that reaches the API server through this front (the front
    /// authenticates upstream as the admin).
    fn client_config(&self, namespace: &str) -> kube::Config {
        let url = format!("https://{}", self.addr).parse().expect("a loopback URL");
        let mut config = kube::Config::new(url);
        config.root_cert = Some(vec![self.ca_der.clone()]);
        config.default_namespace = namespace.to_string();
        config
    }

    fn open(&self) -> usize {
        self.open.load(Ordering::SeqCst)
    }

    /// Waits until `open` connections remain (a connection hyper drops closes at once, but
    /// asynchronously); the last count seen if it does not come to that.
    async fn settle_at(&self, open: usize) -> usize {
        let begun = Instant::now();
        while self.open() != open && begun.elapsed() < Duration::from_secs(5) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.open()
    }
}

/// Starts a source for profile `p` in `ns` with `client`, makes three lists with the same
/// client, then checks that the admin's edit of `fs` reaches the source.
async fn follow_an_edit_through(client: kube::Client, ns: &TestNamespace) -> (CancellationToken, KubeWatch) {
    let namespace = ns.name.as_str();
    let cancel = CancellationToken::new();
    let source = KubeSource::watch(client.clone(), namespace, "p", &cancel).expect("valid names");
    tokio::time::timeout(PATIENCE, source.ready()).await.expect("the source syncs in time").expect("the source runs");
    let servers: Api<McpServer> = Api::namespaced(client, namespace);
    for _ in 0..3 {
        servers.list(&ListParams::default()).await.expect("a list through the same client");
    }
    let patch = Patch::Apply(McpServer::test("fs").http_at(9).allowing(["edited"]));
    let edited = ns
        .api::<McpServer>()
        .patch("fs", &PatchParams::apply("spear-test").force(), &patch)
        .await
        .expect("the edit applies");
    let version = edited.resource_version();
    let mut rx = source.watch();
    tokio::time::timeout(PATIENCE, rx.wait_for(|s| s.server("fs").map(|v| v.resource_version.clone()) == version))
        .await
        .expect("the edit reaches the source in time")
        .expect("the source runs");
    (cancel, source)
}

async fn namespace_with_fs_and_p(prefix: &str) -> TestNamespace {
    let ns = ControlPlane::shared().namespace(prefix).await;
    ns.api::<McpServer>()
        .create(&PostParams::default(), &McpServer::test("fs").http_at(9).allowing(["*"]))
        .await
        .expect("create fs");
    ns.api::<McpProfile>()
        .create(&PostParams::default(), &McpProfile::test("p").servers(["fs"]))
        .await
        .expect("create p");
    ns
}

#[tokio::test]
async fn an_agents_watches_and_requests_share_one_http2_connection() {
    let ns = namespace_with_fs_and_p("h2-one-conn").await;
    let front = Front::start(&[H2, HTTP1]).await;
    let client = spear::kube_client::client(front.client_config(&ns.name)).expect("a client");
    let (cancel, _source) = follow_an_edit_through(client, &ns).await;
    assert_eq!(
        front.settle_at(1).await,
        1,
        "two watches and three lists must share one connection; negotiated: {:?}",
        front.negotiated.lock()
    );
    assert!(front.negotiated.lock().iter().all(|p| p == "h2"), "{:?}", front.negotiated.lock());

    // kube's own client, the same way, holds a connection per watch: what this client saves.
    let front_for_kube = Front::start(&[H2, HTTP1]).await;
    let kube_default = kube::Client::try_from(front_for_kube.client_config(&ns.name)).expect("kube's client");
    let (cancel_default, _default_source) = follow_an_edit_through(kube_default, &ns).await;
    assert!(front_for_kube.open() >= 2, "kube's HTTP/1.1 client: {} connections", front_for_kube.open());
    cancel.cancel();
    cancel_default.cancel();
}

#[tokio::test]
async fn behind_a_front_without_http2_the_agent_falls_back_to_http1() {
    let ns = namespace_with_fs_and_p("h2-fallback").await;
    let front = Front::start(&[HTTP1]).await;
    let client = spear::kube_client::client(front.client_config(&ns.name)).expect("a client");
    let (cancel, _source) = follow_an_edit_through(client, &ns).await;
    let negotiated = front.negotiated.lock().clone();
    assert!(!negotiated.is_empty() && negotiated.iter().all(|p| p == "http/1.1"), "{negotiated:?}");
    assert!(front.open() >= 2, "one HTTP/1.1 connection per watch: {} open", front.open());
    cancel.cancel();
}
