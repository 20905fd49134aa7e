//! The Kubernetes registry source (`spear::registry::kube`) against the real test control plane:
//! it follows creates, updates and deletes within a second, keeps serving through an API server
//! outage and resyncs after it, survives a 410 Gone in the middle of a watch, and works with no
//! more than the agent's RBAC. `spearlet run` is exercised in-process on top of it.

use std::collections::HashMap;
use std::fs;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::routing::get;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use kube::api::{Api, DeleteParams, GetParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use prometheus_client::registry::Registry;
use serde_json::json;
use spear::agent::{Agent, AgentOptions, AuditSink};
use spear::agent::{AgentConfig, AuditTarget, PodConfig, run_in_pod};
use spear::api::{McpProfile, McpServer};
use spear::chat::UpstreamOverride;
use spear::mcp::config::Mode;
use spear::mcp::{Pool, PoolOptions};
use spear::operator::rbac::{agent_cluster_role, agent_role_binding};
use spear::registry::snapshot::Snapshot;
use spear::registry::{KubeSource, KubeWatch, RegistryView};
use spear::telemetry::RegistryMetrics;
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use spear::testing::mcp_servers;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// What the issue asks of a change's propagation.
const PROPAGATION_BUDGET: Duration = Duration::from_secs(1);
/// Longest wait for anything else (first sync, recovery): kube-runtime's backoff reaches 30 s.
const PATIENCE: Duration = Duration::from_secs(90);
/// An http server nobody listens on: the agent's pool fails fast on it, which is all these tests need.
const NOBODY: u16 = 9;

/// Waits until the source publishes a snapshot meeting `condition`; returns how long it took.
async fn wait_until(
    rx: &mut watch::Receiver<Arc<Snapshot>>,
    limit: Duration,
    what: &str,
    condition: impl Fn(&Snapshot) -> bool,
) -> Duration {
    let begun = Instant::now();
    let waited = tokio::time::timeout(limit, rx.wait_for(|s| condition(s))).await.map(|r| r.map(drop));
    match waited {
        Ok(Ok(())) => begun.elapsed(),
        Ok(Err(_)) => panic!("the source stopped while waiting for {what}"),
        Err(_) => panic!("{what} did not show within {limit:?}; last snapshot: {:#?}", rx.borrow()),
    }
}

fn version_of(snapshot: &Snapshot, server: &str) -> Option<String> {
    snapshot.server(server).map(|s| s.resource_version.clone())
}

async fn start_source(client: Client, namespace: &str, profile: &str) -> KubeWatch {
    let watch = KubeSource::watch(client, namespace, profile, &CancellationToken::new()).expect("valid names");
    tokio::time::timeout(PATIENCE, watch.ready())
        .await
        .unwrap_or_else(|_| panic!("no first sync within {PATIENCE:?}: {:?}", watch.snapshot().problems()))
        .expect("the watch runs");
    watch
}

#[tokio::test]
async fn snapshot_follows_creates_updates_and_deletes_within_a_second() {
    let ns = ControlPlane::shared().namespace("kube-follow").await;
    let (servers, profiles) = (ns.api::<McpServer>(), ns.api::<McpProfile>());
    servers
        .create(&PostParams::default(), &McpServer::test("fs").http_at(NOBODY).allowing(["*"]))
        .await
        .expect("create fs");
    profiles.create(&PostParams::default(), &McpProfile::test("p").servers(["fs", "git"])).await.expect("create p");
    // Another namespace's objects and another profile are not this pod's.
    profiles.create(&PostParams::default(), &McpProfile::test("other").servers(["fs"])).await.expect("create other");

    let source = start_source(ns.client.clone(), &ns.name, "p").await;
    let first = source.snapshot();
    assert!(!first.is_degraded(), "{:?}", first.problems());
    assert_eq!(first.servers().keys().collect::<Vec<_>>(), ["fs"]);
    assert_eq!(first.profiles().keys().collect::<Vec<_>>(), ["p"], "only the pod's own profile is watched");
    let mut rx = source.watch();
    let mut report = Vec::new();
    let mut check = |step: &str, api: Duration, seen: Duration| {
        report.push(format!("{step:<16} api {:>6.1} ms   snapshot {:>6.1} ms", ms(api), ms(seen)));
        assert!(seen <= PROPAGATION_BUDGET, "{step}: the snapshot followed after {seen:?}");
    };

    let t0 = Instant::now();
    let created = servers
        .create(&PostParams::default(), &McpServer::test("git").http_at(NOBODY).allowing(["*"]))
        .await
        .expect("create git");
    let api = t0.elapsed();
    let version = created.resource_version();
    wait_until(&mut rx, PATIENCE, "the created server", |s| version_of(s, "git") == version).await;
    check("create server", api, t0.elapsed());

    let t0 = Instant::now();
    let patch = Patch::Merge(json!({"spec": {"allowedTools": ["read_*"]}}));
    let updated = servers.patch("fs", &PatchParams::default(), &patch).await.expect("update fs");
    let api = t0.elapsed();
    let version = updated.resource_version();
    wait_until(&mut rx, PATIENCE, "the updated server", |s| version_of(s, "fs") == version).await;
    check("update server", api, t0.elapsed());
    assert_eq!(rx.borrow().server("fs").map(|s| s.object.spec.allowed_tools.clone()), Some(vec!["read_*".into()]));

    let t0 = Instant::now();
    servers.delete("git", &DeleteParams::default()).await.expect("delete git");
    let api = t0.elapsed();
    wait_until(&mut rx, PATIENCE, "the deleted server gone", |s| s.server("git").is_none()).await;
    check("delete server", api, t0.elapsed());

    let t0 = Instant::now();
    let patch = Patch::Merge(json!({"spec": {"toolDenylist": ["write_*"]}}));
    let updated = profiles.patch("p", &PatchParams::default(), &patch).await.expect("update p");
    let api = t0.elapsed();
    let version = updated.resource_version();
    wait_until(&mut rx, PATIENCE, "the updated profile", |s| {
        s.profile("p").map(|p| p.resource_version.clone()) == version
    })
    .await;
    check("update profile", api, t0.elapsed());

    let t0 = Instant::now();
    profiles.delete("p", &DeleteParams::default()).await.expect("delete p");
    let api = t0.elapsed();
    wait_until(&mut rx, PATIENCE, "the deleted profile gone", |s| s.profile("p").is_none()).await;
    check("delete profile", api, t0.elapsed());

    let t0 = Instant::now();
    profiles.create(&PostParams::default(), &McpProfile::test("p").servers(["fs"])).await.expect("re-create p");
    let api = t0.elapsed();
    wait_until(&mut rx, PATIENCE, "the re-created profile", |s| s.profile("p").is_some()).await;
    check("create profile", api, t0.elapsed());

    assert!(!rx.borrow().is_degraded(), "{:?}", rx.borrow().problems());
    assert!(rx.borrow().profile("other").is_none());
    println!("kube source propagation (write → new snapshot, budget {PROPAGATION_BUDGET:?}):\n{}", report.join("\n"));
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

// === an API server outage ===

/// A second kube-apiserver over the shared control plane's etcd, with the shared one's flags
/// (read from its command line) except its port and cert dir, so one test can stop and restart
/// it (an API outage; etcd stays up) without disturbing the others. It exits with the test
/// binary, as the shared one does (its stdin is the lifeline).
struct SecondApiServer {
    binary: PathBuf,
    args: Vec<String>,
    dir: tempfile::TempDir,
    port: u16,
    process: Option<(Child, ChildStdin)>,
}

impl SecondApiServer {
    fn start() -> Self {
        let shared = ControlPlane::shared();
        let cmdline = fs::read(format!("/proc/{}/cmdline", shared.apiserver_pid()))
            .expect("the shared kube-apiserver's command line must be readable (Linux /proc)");
        let mut words: Vec<String> = cmdline
            .split(|b| *b == 0)
            .filter(|w| !w.is_empty())
            .map(|w| String::from_utf8_lossy(w).into_owned())
            .collect();
        let binary = PathBuf::from(words.remove(0));
        let dir = tempfile::Builder::new().prefix("spear-apiserver-2-").tempdir().expect("a temp dir");
        let port = mcp_servers::free_port();
        let args = words
            .into_iter()
            .filter(|w| !w.starts_with("--secure-port=") && !w.starts_with("--cert-dir="))
            .chain([format!("--secure-port={port}"), format!("--cert-dir={}", dir.path().display())])
            .collect();
        let mut server = SecondApiServer { binary, args, dir, port, process: None };
        server.spawn();
        server
    }

    fn spawn(&mut self) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log())
            .expect("the second API server's log must open");
        let mut child = Command::new(&self.binary)
            .args(&self.args)
            .current_dir(self.dir.path())
            .env("SPEAR_EXIT_ON_STDIN_EOF", "1")
            .stdin(Stdio::piped())
            .stdout(log.try_clone().expect("log handle"))
            .stderr(log)
            .spawn()
            .expect("the kube-apiserver binary must start");
        let lifeline = child.stdin.take().expect("stdin is piped");
        self.process = Some((child, lifeline));
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("kube-apiserver.log")
    }

    /// An admin client of this API server.
    fn client(&self) -> Client {
        let mut config = ControlPlane::shared().config();
        config.cluster_url = format!("https://127.0.0.1:{}", self.port).parse().expect("a loopback URL");
        Client::try_from(config).expect("the admin config must build a client")
    }

    /// Waits until `/readyz` answers ok.
    async fn wait_ready(&self) {
        let client = self.client();
        let readyz = || kube::core::Request::new("").get("readyz", &GetParams::default()).expect("GET /readyz");
        let deadline = Instant::now() + PATIENCE;
        loop {
            if let Ok(Ok(body)) = tokio::time::timeout(Duration::from_secs(2), client.request_text(readyz())).await
                && body.trim() == "ok"
            {
                return;
            }
            assert!(Instant::now() < deadline, "the second API server was not ready; see {}", self.log().display());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// SIGKILL: the abrupt end of an API server (connections reset, nothing drained).
    fn kill(&mut self) {
        if let Some((mut child, _lifeline)) = self.process.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for SecondApiServer {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The value of an unlabelled gauge in Prometheus text.
fn gauge(metrics: &Registry, name: &str) -> Option<i64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, metrics).expect("metrics encode");
    text.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).and_then(|v| v.trim().parse().ok())
}

async fn wait_gauge(metrics: &Registry, name: &str, value: i64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while gauge(metrics, name) != Some(value) {
        assert!(Instant::now() < deadline, "{name} did not become {value}: {:?}", gauge(metrics, name));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn an_api_server_outage_keeps_the_last_snapshot_serving_and_resyncs_after() {
    let ns = ControlPlane::shared().namespace("kube-outage").await;
    let (servers, profiles) = (ns.api::<McpServer>(), ns.api::<McpProfile>());
    for id in ["fs", "gone"] {
        servers
            .create(&PostParams::default(), &McpServer::test(id).http_at(NOBODY).allowing(["*"]))
            .await
            .expect("create server");
    }
    profiles
        .create(&PostParams::default(), &McpProfile::test("p").servers(["fs", "gone", "added"]))
        .await
        .expect("create p");

    let mut apiserver = tokio::task::spawn_blocking(SecondApiServer::start).await.expect("start");
    apiserver.wait_ready().await;
    let source = start_source(apiserver.client(), &ns.name, "p").await;
    let mut rx = source.watch();
    let before = source.snapshot();
    assert!(!before.is_degraded() && before.server("gone").is_some(), "{before:?}");

    // The agent over the source, to see what it reports while the API is gone.
    let mut metrics = Registry::default();
    let mut options = AgentOptions::new("p");
    options.audit = AuditSink::disabled();
    options.registry_metrics = RegistryMetrics::register(&mut metrics);
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let pool = Pool::new(PoolOptions {
        mode: Mode::sidecar(socket_dir.path().to_path_buf()),
        idle_timeout: None,
        ..PoolOptions::default()
    });
    let agent = Agent::new(options, source.view(), pool);
    let stop_agent = CancellationToken::new();
    let agent_task = tokio::spawn(agent.clone().run(stop_agent.clone()));
    tokio::time::timeout(PATIENCE, agent.ready()).await.expect("agent ready");
    wait_gauge(&metrics, "mcp_registry_degraded", 0).await;

    let outage = Instant::now();
    apiserver.kill();
    let noticed = wait_until(&mut rx, Duration::from_secs(10), "the outage", Snapshot::is_degraded).await;
    let during = source.snapshot();
    assert_eq!(during.revision(), before.revision(), "the last snapshot keeps serving");
    assert!(during.server("gone").is_some() && during.profile("p").is_some());
    let problem = during.problems().iter().find(|p| p.field == "watch").expect("a watch problem");
    assert!(problem.message.starts_with("kubernetes API unreachable: "), "{problem}");
    wait_gauge(&metrics, "mcp_registry_degraded", 1).await;
    assert!(agent.is_ready(), "the agent keeps serving");
    assert!(agent.state().snapshot.server("fs").is_some());

    // Changes made meanwhile through the other API server (etcd is up) must show afterwards.
    servers
        .create(&PostParams::default(), &McpServer::test("added").http_at(NOBODY).allowing(["*"]))
        .await
        .expect("create added");
    servers.delete("gone", &DeleteParams::default()).await.expect("delete gone");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(source.snapshot().revision(), before.revision(), "nothing changes while the API is gone");

    let restarted = Instant::now();
    apiserver.spawn();
    apiserver.wait_ready().await;
    let api_back = restarted.elapsed();
    let resynced = wait_until(&mut rx, PATIENCE, "the resync", |s| {
        !s.is_degraded() && s.server("added").is_some() && s.server("gone").is_none()
    })
    .await;
    wait_gauge(&metrics, "mcp_registry_degraded", 0).await;
    println!(
        "kube source outage: noticed in {:.0} ms; API server ready {:.1} s after restart; snapshot in sync {:.1} s \
         after that (kube-runtime backoff); outage {:.1} s in all",
        ms(noticed),
        api_back.as_secs_f64(),
        resynced.as_secs_f64(),
        outage.elapsed().as_secs_f64()
    );
    stop_agent.cancel();
    let _ = agent_task.await;
}

// === 410 Gone in the middle of a watch ===

/// Requests the scripted API server saw, as `list` / `watch rv=<n>`.
type Seen = Arc<Mutex<Vec<String>>>;

const BASE: &str = "/apis/mcp.spear.dev/v1alpha1/namespaces/ns";

fn item(kind: &str, name: &str, version: &str) -> serde_json::Value {
    let spec = match kind {
        "McpServer" => json!({"transport": "streamableHttp", "http": {"url": "http://127.0.0.1:9/mcp"}}),
        _ => json!({"servers": ["fs"]}),
    };
    json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": kind,
           "metadata": {"name": name, "namespace": "ns", "resourceVersion": version}, "spec": spec})
}

fn list(kind: &str, version: &str, items: Vec<serde_json::Value>) -> String {
    json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": format!("{kind}List"),
           "metadata": {"resourceVersion": version}, "items": items})
    .to_string()
}

/// A watch response that stays open and quiet, as a real one between changes.
fn quiet_watch() -> Body {
    Body::from_stream(futures::stream::pending::<Result<Bytes, std::io::Error>>())
}

/// The servers collection: first list → watch that sends a change then 410 Gone → the relist
/// must show the state after what was missed → a quiet watch.
async fn scripted_servers(State(seen): State<Seen>, Query(query): Query<HashMap<String, String>>) -> Body {
    let watching = query.get("watch").is_some_and(|w| w == "true");
    let version = query.get("resourceVersion").cloned().unwrap_or_default();
    let round = {
        let mut seen = seen.lock();
        seen.push(if watching { format!("watch rv={version}") } else { "list".to_string() });
        seen.iter().filter(|s| s.starts_with(if watching { "watch" } else { "list" })).count()
    };
    match (watching, round) {
        (false, 1) => {
            list("McpServer", "11", vec![item("McpServer", "fs", "10"), item("McpServer", "gone", "11")]).into()
        }
        (true, 1) => {
            let modified = json!({"type": "MODIFIED", "object": item("McpServer", "fs", "12")});
            let expired = json!({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "metadata": {},
                "status": "Failure", "message": "too old resource version: 12 (14)", "reason": "Expired", "code": 410}});
            format!("{modified}\n{expired}\n").into()
        }
        (false, _) => {
            list("McpServer", "14", vec![item("McpServer", "fs", "12"), item("McpServer", "new", "14")]).into()
        }
        (true, _) => quiet_watch(),
    }
}

async fn scripted_profiles(Query(query): Query<HashMap<String, String>>) -> Body {
    if query.get("watch").is_some_and(|w| w == "true") {
        return quiet_watch();
    }
    assert_eq!(query.get("fieldSelector").map(String::as_str), Some("metadata.name=p"));
    list("McpProfile", "5", vec![item("McpProfile", "p", "5")]).into()
}

/// Scripted on purpose, not the test control plane: the exact request sequence around the 410
/// is what is under test, and a real API server answers 410 only when its watch cache has moved on.
#[tokio::test]
async fn a_410_gone_mid_watch_relists_and_the_snapshot_is_right_afterwards() {
    let seen: Seen = Arc::default();
    let app = Router::new()
        .route(&format!("{BASE}/mcpservers"), get(scripted_servers))
        .route(&format!("{BASE}/mcpprofiles"), get(scripted_profiles))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.expect("bind");
    let addr: SocketAddr = listener.local_addr().expect("addr");
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let config = kube::Config::new(format!("http://{addr}").parse().expect("url"));
    let client = Client::try_from(config).expect("client");

    let source = start_source(client, "ns", "p").await;
    let mut rx = source.watch();
    let mut degraded_seen = false;
    let healed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let snapshot = rx.borrow_and_update().clone();
            degraded_seen |= snapshot.is_degraded();
            if snapshot.server("new").is_some() {
                return snapshot;
            }
            rx.changed().await.expect("the source runs");
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no relist after the 410; requests: {:?}", seen.lock()));

    assert_eq!(version_of(&healed, "fs").as_deref(), Some("12"));
    assert!(healed.server("gone").is_none(), "deleted while the watch was gone");
    assert!(healed.profile("p").is_some());
    assert!(!degraded_seen && !healed.is_degraded(), "a 410 is a relist, not an outage: {:?}", healed.problems());
    let expected = ["list", "watch rv=11", "list", "watch rv=14"];
    let deadline = Instant::now() + Duration::from_secs(5);
    while seen.lock().len() < expected.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(*seen.lock(), expected);
    server.abort();
}

// === RBAC ===

/// The admin kubeconfig with its user swapped for a bound token (TokenRequest API) of service
/// account `namespace/name`, created here with no RBAC: same server, same CA.
pub(crate) async fn service_account_kubeconfig_yaml(admin: &Client, namespace: &str, name: &str) -> String {
    let accounts = Api::<ServiceAccount>::namespaced(admin.clone(), namespace);
    let account = ServiceAccount {
        metadata: kube::core::ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    };
    accounts.create(&PostParams::default(), &account).await.expect("create the service account");
    let request = TokenRequest {
        spec: Some(TokenRequestSpec { expiration_seconds: Some(600), ..Default::default() }),
        ..Default::default()
    };
    let token = accounts
        .create_token_request(name, &PostParams::default(), &request)
        .await
        .expect("the TokenRequest API must issue a token")
        .status
        .expect("an issued token has a status")
        .token
        .expect("an issued token has a token");
    let text = fs::read_to_string(ControlPlane::shared().kubeconfig_path()).expect("kubeconfig");
    let mut kubeconfig: serde_yaml::Value = serde_yaml::from_str(&text).expect("kubeconfig YAML");
    kubeconfig["users"][0]["user"] = serde_yaml::to_value(json!({"token": token})).expect("YAML");
    serde_yaml::to_string(&kubeconfig).expect("YAML")
}

/// A client authenticated as `namespace/name` with a bound token from the TokenRequest API.
async fn service_account_client(admin: &Client, namespace: &str, name: &str) -> Client {
    let yaml = service_account_kubeconfig_yaml(admin, namespace, name).await;
    let kubeconfig = Kubeconfig::from_yaml(&yaml).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await.expect("config");
    Client::try_from(config).expect("client")
}

/// The agent ClusterRole (as the chart installs it), bound to `ns`'s service accounts as the
/// operator binds it in an injection-enabled namespace.
async fn grant_the_agent_role(ns: &TestNamespace) {
    Api::<ClusterRole>::all(ns.client.clone())
        .patch(
            &agent_cluster_role().name_any(),
            &PatchParams::apply("spear-test").force(),
            &Patch::Apply(agent_cluster_role()),
        )
        .await
        .expect("apply the agent ClusterRole");
    ns.api::<RoleBinding>().create(&PostParams::default(), &agent_role_binding(&ns.name)).await.expect("bind");
}

#[tokio::test]
async fn an_agent_with_the_agent_role_reads_its_namespace_and_is_refused_elsewhere() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("kube-rbac").await;
    let other = control_plane.namespace("kube-rbac-other").await;
    let admin = ns.client.clone();
    grant_the_agent_role(&ns).await;
    for namespace in [&ns, &other] {
        namespace
            .api::<McpServer>()
            .create(&PostParams::default(), &McpServer::test("fs").http_at(NOBODY).allowing(["*"]))
            .await
            .expect("fs");
        namespace
            .api::<McpProfile>()
            .create(&PostParams::default(), &McpProfile::test("p").servers(["fs"]))
            .await
            .expect("p");
    }
    let agent = service_account_client(&admin, &ns.name, "workload").await;

    let listed = Api::<McpServer>::namespaced(agent.clone(), &ns.name).list(&ListParams::default()).await;
    assert_eq!(listed.expect("the agent may list its namespace's servers").items.len(), 1);
    let refused = Api::<McpServer>::namespaced(agent.clone(), &other.name).list(&ListParams::default()).await;
    assert!(matches!(&refused, Err(kube::Error::Api(s)) if s.code == 403), "{refused:?}");
    let secrets = Api::<Secret>::namespaced(agent.clone(), &ns.name).list(&ListParams::default()).await;
    assert!(matches!(&secrets, Err(kube::Error::Api(s)) if s.code == 403), "the agent reads no Secret: {secrets:?}");

    let own = start_source(agent.clone(), &ns.name, "p").await;
    let snapshot = own.snapshot();
    assert!(!snapshot.is_degraded(), "{:?}", snapshot.problems());
    assert!(snapshot.server("fs").is_some() && snapshot.profile("p").is_some());

    let elsewhere = KubeSource::watch(agent, &other.name, "p", &CancellationToken::new()).expect("valid names");
    let mut rx = elsewhere.watch();
    wait_until(&mut rx, Duration::from_secs(10), "the refusal", |s| {
        s.problems().iter().any(|p| p.field == "watch" && p.message.contains("may not list and watch"))
    })
    .await;
    assert!(!elsewhere.is_ready() && elsewhere.snapshot().servers().is_empty());
}

// === spearlet run, in-process ===

fn free_addr() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, mcp_servers::free_port()))
}

/// The doors of an in-process `spearlet run`, on free loopback ports.
fn agent_config(admin_addr: SocketAddr) -> AgentConfig {
    AgentConfig {
        // The test's servers listen on loopback, which an agent in a pod denies by default.
        egress: Some(spear::egress::AddressDenyList::AGENT_LOCAL.parse().expect("the local list parses")),
        http_addr: free_addr(),
        grpc_addr: free_addr(),
        admin_addr,
        shutdown_grace: Duration::from_secs(1),
        allowed_hosts: vec!["127.0.0.1".into()],
        allowed_origins: Vec::new(),
        upstream: UpstreamOverride::default(),
        audit: AuditTarget::Off,
        audit_arguments: false,
        connection_limits: Default::default(),
        mcp_session_idle: Duration::from_secs(300),
        api_key: None,
        pool: Default::default(),
    }
}

/// `spearlet run` for profile `p` in `ns`, out of cluster through the test kubeconfig.
pub(crate) fn run_config(
    control_plane: &ControlPlane,
    ns: &str,
    socket_dir: &Path,
    admin_addr: SocketAddr,
    sidecar_servers: Option<Vec<String>>,
) -> PodConfig {
    PodConfig {
        pod_name: None,
        profile: Some("p".into()),
        namespace: Some(ns.to_string()),
        socket_dir: socket_dir.to_path_buf(),
        sidecar_servers,
        secret_refs: None,
        granted_destinations: None,
        kubeconfig: Some(control_plane.kubeconfig_path().as_os_str().to_owned()),
        agent: agent_config(admin_addr),
    }
}

/// GET `path` on the admin port: (status, body), or None while nothing listens.
async fn admin_get(admin_addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let response = reqwest::get(format!("http://{admin_addr}{path}")).await.ok()?;
    Some((response.status().as_u16(), response.text().await.unwrap_or_default()))
}

/// McpServer `fs` (HTTP, nothing listening: its first list fails at once) and McpProfile `p`
/// naming it.
async fn create_unreachable_fs_and_profile(ns: &TestNamespace) {
    ns.api::<McpServer>()
        .create(&PostParams::default(), &McpServer::test("fs").http_at(NOBODY).allowing(["*"]))
        .await
        .expect("fs");
    ns.api::<McpProfile>().create(&PostParams::default(), &McpProfile::test("p").servers(["fs"])).await.expect("p");
}

#[tokio::test]
async fn spearlet_run_serves_the_namespace_registry() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("kube-run").await;
    create_unreachable_fs_and_profile(&ns).await;
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let admin_addr = free_addr();
    let config = run_config(control_plane, &ns.name, socket_dir.path(), admin_addr, None);
    let cancel = CancellationToken::new();
    let run = tokio::spawn(run_in_pod(config, cancel.clone()));

    let get = |path: &'static str| admin_get(admin_addr, path);
    let deadline = Instant::now() + PATIENCE;
    while get("/readyz").await.map(|(status, _)| status) != Some(200) {
        assert!(Instant::now() < deadline && !run.is_finished(), "spearlet run did not become ready");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (_, metrics) = get("/metrics").await.expect("metrics");
    assert!(metrics.lines().any(|l| l == "mcp_registry_degraded 0"), "{metrics}");
    let (status, effective) = get("/debug/effective").await.expect("effective");
    assert_eq!(status, 200, "{effective}");
    assert!(effective.contains("\"fs\""), "the profile's server is effective: {effective}");

    cancel.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run).await.expect("stops in time").expect("no panic");
    assert!(outcome.is_ok(), "{outcome:?}");
}

#[tokio::test]
async fn spearlet_run_without_a_profile_names_the_flag_and_env() {
    let config = PodConfig {
        pod_name: None,
        profile: None,
        namespace: Some("ns".into()),
        socket_dir: "/spear/run".into(),
        sidecar_servers: None,
        secret_refs: None,
        granted_destinations: None,
        kubeconfig: None,
        agent: agent_config(free_addr()),
    };
    let error = run_in_pod(config, CancellationToken::new()).await.expect_err("no profile");
    assert!(error.is_usage(), "{error}");
    assert!(error.to_string().contains("--profile (env SPEAR_PROFILE)"), "{error}");
}

#[tokio::test]
async fn spearlet_run_reports_a_stdio_server_that_joined_the_profile_after_the_pod_started() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("kube-late").await;
    let servers = ns.api::<McpServer>();
    for id in ["early", "late"] {
        servers
            .create(
                &PostParams::default(),
                &McpServer::test(id).running(&mcp_servers::fixture_stdio(&[])).allowing(["*"]),
            )
            .await
            .expect(id);
    }
    ns.api::<McpProfile>()
        .create(&PostParams::default(), &McpProfile::test("p").servers(["early", "late"]))
        .await
        .expect("p");
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let admin_addr = free_addr();
    // As the webhook left it when the profile only had `early`.
    let config = run_config(control_plane, &ns.name, socket_dir.path(), admin_addr, Some(vec!["early".into()]));
    let grpc_addr = config.agent.grpc_addr;
    let cancel = CancellationToken::new();
    let run = tokio::spawn(run_in_pod(config, cancel.clone()));

    let flagged = "mcp_server_restart_required{server_id=\"late\"} 1";
    let deadline = Instant::now() + PATIENCE;
    let metrics = loop {
        if let Some((200, metrics)) = admin_get(admin_addr, "/metrics").await
            && metrics.lines().any(|l| l == flagged)
        {
            break metrics;
        }
        assert!(Instant::now() < deadline && !run.is_finished(), "no {flagged} within {PATIENCE:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(!metrics.contains("mcp_server_restart_required{server_id=\"early\"}"), "{metrics}");
    // Why its tools are missing, in the operator's words.
    let (_, effective) = admin_get(admin_addr, "/debug/effective").await.expect("effective");
    assert!(effective.contains("has no sidecar in this pod") && effective.contains("restart the pod"), "{effective}");
    // A call is refused at once with that reason (no start can succeed), not after the tool
    // timeout with "its last tools/list failed".
    let said = tokio::task::spawn_blocking(move || {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "call", "late/echo", "--args", r#"{"text":"x"}"#, "--grpc-addr", &grpc_addr.to_string()])
            .output()
            .expect("spearlet tools call");
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    })
    .await
    .expect("join");
    assert!(said.contains("server 'late' cannot be used") && said.contains("restart the pod"), "{said}");
    assert!(!said.contains("last tools/list failed"), "{said}");

    cancel.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run).await.expect("stops in time").expect("no panic");
    assert!(outcome.is_ok(), "{outcome:?}");
}

/// While `spearlet run` waits for its first registry list (here: no RoleBinding yet) the admin
/// port already answers: `/healthz` ok, since the kubelet's liveness probe runs from the
/// container's start, and `/readyz` 503 with the reason. `spearlet wait-ready`, the injected
/// agent's postStart hook, fails at its timeout with that reason, and returns once the agent is
/// ready (after the binding is made), which is when the kubelet starts the pod's app.
#[tokio::test]
async fn spearlet_run_is_alive_while_it_waits_for_the_registry_and_wait_ready_returns_once_it_is_ready() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("kube-wait").await;
    create_unreachable_fs_and_profile(&ns).await;
    let kubeconfig = tempfile::NamedTempFile::new().expect("kubeconfig file");
    let yaml = service_account_kubeconfig_yaml(&ns.client, &ns.name, "workload").await;
    fs::write(kubeconfig.path(), yaml).expect("write the kubeconfig");
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let admin_addr = free_addr();
    let mut config = run_config(control_plane, &ns.name, socket_dir.path(), admin_addr, None);
    config.kubeconfig = Some(kubeconfig.path().as_os_str().to_owned());
    let cancel = CancellationToken::new();
    let run = tokio::spawn(run_in_pod(config, cancel.clone()));

    let deadline = Instant::now() + PATIENCE;
    // Bounded: before the fix a connection sat in the listen backlog unanswered.
    let healthz = || tokio::time::timeout(Duration::from_secs(2), admin_get(admin_addr, "/healthz"));
    while healthz().await.ok().flatten().map(|(status, _)| status) != Some(200) {
        assert!(Instant::now() < deadline && !run.is_finished(), "no /healthz while waiting for the registry");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = admin_get(admin_addr, "/readyz").await.expect("/readyz");
    assert_eq!(
        (status, body.as_str()),
        (503, "not ready: waiting for the first list of McpServers and the McpProfile\n")
    );
    let wait_ready = move |timeout: &str| {
        Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["wait-ready", "--admin-addr", &admin_addr.to_string(), "--timeout", timeout])
            .stderr(Stdio::piped())
            .spawn()
            .expect("spearlet wait-ready")
    };
    let refused = tokio::task::spawn_blocking(move || wait_ready("1").wait_with_output()).await.expect("join");
    let refused = refused.expect("wait-ready's output");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "{said}");
    assert!(said.contains("was not ready within 1 s") && said.contains("waiting for the first list"), "{said}");

    let waiting = wait_ready("60");
    grant_the_agent_role(&ns).await;
    let ready = tokio::task::spawn_blocking(move || waiting.wait_with_output()).await.expect("join");
    let ready = ready.expect("wait-ready's output");
    assert!(ready.status.success(), "{}", String::from_utf8_lossy(&ready.stderr));
    let (status, body) = admin_get(admin_addr, "/readyz").await.expect("/readyz");
    assert_eq!(status, 200, "ready when the hook returned: {body}");
    let (status, _) = admin_get(admin_addr, "/metrics").await.expect("/metrics");
    assert_eq!(status, 200, "the agent's own admin server took the port over");

    cancel.cancel();
    let outcome = tokio::time::timeout(Duration::from_secs(20), run).await.expect("stops in time").expect("no panic");
    assert!(outcome.is_ok(), "{outcome:?}");
}
