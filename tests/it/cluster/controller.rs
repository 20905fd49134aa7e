//! The operator's controllers (`spear::operator::controller`) against the real test control
//! plane: status of both kinds, probes of real MCP servers, Events, the agent RoleBinding,
//! one write per change, and leader election between two controllers.
//!
//! Each test runs its own controller in-process, scoped to its own namespace
//! (`Scope::Namespace`), so the tests of this binary run in parallel without seeing each
//! other's objects.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, RoleBinding};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use spear::api::{McpProfile, McpServer, PinMode};
use spear::operator::controller::{self, ControllerConfig, ControllerMetrics};
use spear::operator::leader::LeaderConfig;
use spear::operator::probe::{AddressDenyList, ProbeConfig, ProbeNamespaces};
use spear::operator::scope::Scope;
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Longest wait for the controller to reach a state; generous for a loaded 2-core CI box.
const SETTLE: Duration = Duration::from_secs(30);
/// How long an object must stay untouched after it settled.
const QUIET: Duration = Duration::from_secs(4);
const POLL: Duration = Duration::from_millis(100);

// === harness ===

/// A controller running in this test's runtime; cancelled when dropped.
struct Running {
    token: CancellationToken,
    task: Option<JoinHandle<Result<(), controller::Error>>>,
    metrics: ControllerMetrics,
}

impl Running {
    fn start(client: Client, config: ControllerConfig) -> Running {
        let token = CancellationToken::new();
        let metrics = config.metrics.clone();
        let task = tokio::spawn(controller::run(client, config, token.clone()));
        Running { token, task: Some(task), metrics }
    }

    /// Cancels and waits for a graceful end (reconciles drained, Lease released).
    async fn stop(mut self) {
        self.token.cancel();
        let task = self.task.take().expect("a running controller has its task");
        let result = tokio::time::timeout(SETTLE, task)
            .await
            .expect("the controller must stop within the settle time after cancellation")
            .expect("the controller task must not panic");
        result.expect("the controller must end without error");
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// A config scoped to `ns`, probing quickly so failures retry within a test. The test servers
/// listen on loopback in unlabelled namespaces, so this probes every namespace and address; the
/// defaults (injection-enabled namespaces, loopback and link-local denied) have their own tests.
fn config(ns: &TestNamespace) -> ControllerConfig {
    let mut config = ControllerConfig::new(Scope::Namespace(ns.name.clone()));
    config.probe = ProbeConfig {
        interval: Duration::from_secs(60),
        min_retry: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        namespaces: ProbeNamespaces::All,
        deny: AddressDenyList::none(),
    };
    config
}

/// Polls `check` until it returns `Some`, panicking with `what` and the last state after SETTLE.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + SETTLE;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => panic!("{what} did not happen within {SETTLE:?}; last: {last}"),
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}

/// Waits until the object `name` satisfies `ok`, and returns it.
async fn wait_for<K>(api: &Api<K>, name: &str, what: &str, ok: impl Fn(&K) -> bool) -> K
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    eventually(&format!("{name}: {what}"), || async {
        match api.get_opt(name).await {
            Ok(Some(obj)) if ok(&obj) => Ok(obj),
            Ok(other) => Err(format!("{other:?}")),
            Err(e) => Err(e.to_string()),
        }
    })
    .await
}

fn condition<'a>(conditions: &'a [Condition], type_: &str) -> Option<&'a Condition> {
    conditions.iter().find(|c| c.type_ == type_)
}

fn server_condition(server: &McpServer, type_: &str) -> Option<Condition> {
    server.status.as_ref().and_then(|s| condition(&s.conditions, type_).cloned())
}

fn profile_condition(profile: &McpProfile, type_: &str) -> Option<Condition> {
    profile.status.as_ref().and_then(|s| condition(&s.conditions, type_).cloned())
}

/// Whether the server's status describes its current generation and has `type_` = `status`.
fn server_has(server: &McpServer, type_: &str, status: &str) -> bool {
    let current = server.status.as_ref().is_some_and(|s| s.observed_generation == server.metadata.generation);
    current && server_condition(server, type_).is_some_and(|c| c.status == status)
}

/// A valid stdio server (never started: the operator does not run stdio servers).
fn stdio(name: &str) -> McpServer {
    McpServer::test(name)
        .stdio("npx", ["-y", "@modelcontextprotocol/server-everything"])
        .image("node:22")
        .allowing(["*"])
}

/// The in-process rmcp echo server (one tool, `echo`) on a loopback port; aborted on drop.
struct EchoServer {
    url: String,
    task: JoinHandle<std::io::Result<()>>,
}

impl EchoServer {
    async fn start() -> EchoServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0 must succeed");
        let port = listener.local_addr().expect("a bound listener has an address").port();
        let task = tokio::spawn(spear::testing::echo::serve_http(listener));
        EchoServer { url: format!("http://127.0.0.1:{port}/mcp"), task }
    }
}

impl Drop for EchoServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: Resource + Clone + serde::Serialize + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.create(&PostParams::default(), obj).await.unwrap_or_else(|e| panic!("creating {} failed: {e}", obj.name_any()))
}

// === McpServer ===

#[tokio::test]
async fn a_valid_stdio_server_is_accepted_at_its_generation_and_runs_as_a_sidecar() {
    let ns = ControlPlane::shared().namespace("ctl-valid").await;
    let api = ns.api::<McpServer>();
    create(&api, &stdio("everything")).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let server = wait_for(&api, "everything", "Accepted=True", |s| server_has(s, "Accepted", "True")).await;
    let status = server.status.clone().expect("a settled server has a status");
    assert_eq!(status.observed_generation, Some(1));
    let accepted = server_condition(&server, "Accepted").expect("Accepted is set");
    assert_eq!((accepted.reason.as_str(), accepted.observed_generation), ("Valid", Some(1)));
    let ready = server_condition(&server, "Ready").expect("Ready is set for stdio servers too");
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("Unknown", "RunsAsSidecar"));
    assert!(
        status.last_probe_time.is_none() && status.tool_count.is_none(),
        "stdio servers are never probed: {status:?}"
    );

    // A spec change moves the generation; the status follows it.
    let patch = serde_json::json!({"spec": {"allowedTools": ["echo"]}});
    api.patch("everything", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patching the spec");
    let server = wait_for(&api, "everything", "observedGeneration 2", |s| {
        s.status.as_ref().is_some_and(|st| st.observed_generation == Some(2))
    })
    .await;
    assert!(server_has(&server, "Accepted", "True"));
}

#[tokio::test]
async fn a_server_only_validate_refuses_is_rejected_naming_the_field_with_an_event() {
    let ns = ControlPlane::shared().namespace("ctl-invalid").await;
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/invalid/09-command-is-a-shell-line.yaml");
    let text = std::fs::read_to_string(path).expect("the fixture must be readable");
    let server: McpServer = serde_yaml::from_str(&text).expect("the fixture is an McpServer the API server accepts");
    let api = ns.api::<McpServer>();
    create(&api, &server).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let server = wait_for(&api, "fs", "Accepted=False", |s| server_has(s, "Accepted", "False")).await;
    let accepted = server_condition(&server, "Accepted").expect("Accepted is set");
    assert_eq!(accepted.reason, "Invalid");
    assert!(accepted.message.contains("spec.stdio.command"), "the message names the field: {}", accepted.message);

    let events: Api<Event> = ns.api();
    let event = eventually("a Warning Event on the rejected server", || async {
        let list = events.list(&ListParams::default()).await.map_err(|e| e.to_string())?;
        list.items
            .into_iter()
            .find(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("fs"))
            .ok_or_else(|| "no Event regarding fs yet".to_string())
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));
    assert_eq!(event.reason.as_deref(), Some("Invalid"));
    assert_eq!(event.reporting_controller.as_deref(), Some("spear-operator"));
    let note = event.note.unwrap_or_default();
    assert!(note.contains("spec.stdio.command"), "the Event names the field: {note}");
    let regarding = event.regarding.expect("the Event regards the server");
    assert_eq!(regarding.kind.as_deref(), Some("McpServer"));
}

#[tokio::test]
async fn a_running_http_server_is_probed_ready_with_its_tools_and_server_info() {
    let ns = ControlPlane::shared().namespace("ctl-http").await;
    let echo = EchoServer::start().await;
    let api = ns.api::<McpServer>();
    create(&api, &McpServer::test("echo").http(&echo.url).allowing(["*"])).await;
    let controller = Running::start(ns.client.clone(), config(&ns));

    let server = wait_for(&api, "echo", "Ready=True", |s| server_has(s, "Ready", "True")).await;
    let status = server.status.clone().expect("a probed server has a status");
    assert_eq!(status.tools, ["echo"]);
    assert_eq!(status.tool_count, Some(1));
    let info = status.server_info.expect("initialize's answer is kept");
    assert!(info.name.is_some_and(|n| !n.is_empty()), "the server names itself");
    assert!(status.last_probe_time.is_some());
    assert_eq!(status.last_error, None);
    assert!(server_has(&server, "Accepted", "True"));
    assert_eq!(server_condition(&server, "Ready").map(|c| c.reason), Some("ProbeSucceeded".to_string()));
    assert_eq!(controller.metrics.probes("succeeded"), 1, "one probe per change, the next after the interval");
}

/// A probed server with `spec.pinning` whose tool differs from its pin: `ToolsPinned=False`
/// names the tool, so the registry's owner sees it before any pod withholds it.
#[tokio::test]
async fn a_probed_servers_tool_that_differs_from_its_pin_is_named_in_tools_pinned() {
    let ns = ControlPlane::shared().namespace("ctl-pins").await;
    let echo = EchoServer::start().await;
    let api = ns.api::<McpServer>();
    let stale_pin = format!("sha256:{}", "0".repeat(64));
    let pinned =
        McpServer::test("echo").http(&echo.url).allowing(["*"]).pinning(PinMode::Enforce, [("echo", stale_pin)]);
    create(&api, &pinned).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let server = wait_for(&api, "echo", "ToolsPinned=False", |s| server_has(s, "ToolsPinned", "False")).await;
    let condition = server_condition(&server, "ToolsPinned").expect("ToolsPinned is set");
    assert_eq!(condition.reason, "PinMismatch");
    assert!(condition.message.contains("echo (pin_mismatch)"), "{}", condition.message);
    assert!(server_has(&server, "Ready", "True"), "the server itself is reachable");
}

#[tokio::test]
async fn an_unreachable_http_server_is_not_ready_with_the_error_and_is_retried() {
    let ns = ControlPlane::shared().namespace("ctl-down").await;
    let port = spear::testing::mcp_servers::free_port();
    // A secret-backed header: the operator cannot send it and says so; it never sees the value.
    let remote =
        McpServer::test("remote").http_at(port).secret_header("Authorization", "remote-token", "token").allowing(["*"]);
    let api = ns.api::<McpServer>();
    create(&api, &remote).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let server = wait_for(&api, "remote", "Ready=False", |s| server_has(s, "Ready", "False")).await;
    let status = server.status.clone().expect("a probed server has a status");
    let error = status.last_error.clone().expect("a failed probe sets lastError");
    assert!(!error.is_empty());
    assert!(error.contains("probed without header Authorization"), "the withheld header is named: {error}");
    let ready = server_condition(&server, "Ready").expect("Ready is set");
    assert_eq!(ready.reason, "ProbeFailed");
    assert_eq!(ready.message, error);
    assert_eq!(status.tool_count, None);
    let first = status.last_probe_time.expect("a failed probe has a time");

    // Failures are retried (1 s, then backing off): the probe time moves on its own.
    wait_for(&api, "remote", "a retried probe", |s| {
        s.status.as_ref().and_then(|st| st.last_probe_time.as_ref()).is_some_and(|t| t.0 > first.0)
    })
    .await;
}

/// The probe as an SSRF vector: whoever may write an McpServer in any namespace points it at an
/// address only the operator can reach. By default neither happens: an McpServer outside the
/// injection-enabled namespaces is not probed (and says why), and once its namespace is enabled
/// a loopback URL is refused without a connection; the status never names the address.
#[tokio::test]
async fn the_operator_probes_only_injection_enabled_namespaces_and_never_a_denied_address() {
    let ns = ControlPlane::shared().namespace("ctl-ssrf").await;
    let echo = EchoServer::start().await;
    let probes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    // A second server counting connections, at `localhost` (the resolver's path).
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let counter = probes.clone();
    let accept = tokio::spawn(async move {
        while let Ok(_conn) = listener.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    });
    let api = ns.api::<McpServer>();
    create(&api, &McpServer::test("inside").http(format!("http://localhost:{port}/mcp")).allowing(["*"])).await;
    create(&api, &McpServer::test("echo").http(&echo.url).allowing(["*"])).await;
    let mut secure = config(&ns);
    secure.probe.namespaces = ProbeNamespaces::InjectionEnabled;
    secure.probe.deny = AddressDenyList::default();
    let controller = Running::start(ns.client.clone(), secure);

    let skipped = |s: &McpServer| server_condition(s, "Ready").is_some_and(|c| c.reason == "ProbeSkipped");
    let server = wait_for(&api, "inside", "Ready=Unknown/ProbeSkipped", skipped).await;
    let ready = server_condition(&server, "Ready").expect("Ready is set");
    assert_eq!(ready.status, "Unknown");
    assert!(ready.message.contains("is not labelled mcp.spear.dev/injection=enabled"), "{}", ready.message);
    wait_for(&api, "echo", "Ready=Unknown/ProbeSkipped", skipped).await;
    assert_eq!(controller.metrics.probes("succeeded") + controller.metrics.probes("failed"), 0);

    // The namespace opts in: both are reconciled at once (not at a requeue), and both loopback
    // URLs are refused by the default deny list without a connection.
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let label = serde_json::json!({"metadata": {"labels": {"mcp.spear.dev/injection": "enabled"}}});
    namespaces.patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelling the namespace");
    for name in ["inside", "echo"] {
        let server = wait_for(&api, name, "Ready=False", |s| server_has(s, "Ready", "False")).await;
        let error = server.status.and_then(|s| s.last_error).expect("a refused probe sets lastError");
        assert!(error.contains("in a range the operator does not probe"), "{name}: {error}");
        assert!(!error.contains("127.0.0.1") && !error.contains("localhost"), "{name}: {error}");
    }
    assert_eq!(probes.load(std::sync::atomic::Ordering::SeqCst), 0, "no connection reached the loopback listener");
    accept.abort();
}

// === McpProfile ===

#[tokio::test]
async fn a_profile_resolves_its_servers_and_follows_servers_appearing_and_going() {
    let ns = ControlPlane::shared().namespace("ctl-profile").await;
    let echo = EchoServer::start().await;
    let profiles = ns.api::<McpProfile>();
    let servers = ns.api::<McpServer>();
    create(&profiles, &McpProfile::test("assistant").servers(["echo", "later"])).await;
    create(&servers, &McpServer::test("echo").http(&echo.url).allowing(["*"])).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let settled = |p: &McpProfile| {
        p.status.as_ref().is_some_and(|s| s.observed_generation == p.metadata.generation && !s.tool_preview.is_empty())
    };
    let found = wait_for(&profiles, "assistant", "resolved with a tool preview", settled).await;
    let status = found.status.clone().expect("settled");
    assert_eq!(status.resolved_servers, ["echo"]);
    assert_eq!(status.missing_servers, ["later"]);
    assert_eq!(status.tool_preview, ["mcp__echo__echo"]);
    let refs = profile_condition(&found, "ResolvedRefs").expect("ResolvedRefs is set");
    assert_eq!((refs.status.as_str(), refs.reason.as_str()), ("False", "MissingServers"));
    assert!(refs.message.contains("later"), "{}", refs.message);
    assert_eq!(profile_condition(&found, "Accepted").map(|c| c.status), Some("True".into()));

    // The missing server appears: the profile is reconciled again without being touched.
    create(&servers, &stdio("later")).await;
    let found = wait_for(&profiles, "assistant", "ResolvedRefs=True", |p| {
        profile_condition(p, "ResolvedRefs").is_some_and(|c| c.status == "True")
    })
    .await;
    let status = found.status.expect("settled");
    assert_eq!(status.resolved_servers, ["echo", "later"]);
    assert!(status.missing_servers.is_empty());

    // And when it goes, the profile says so again.
    servers.delete("later", &DeleteParams::default()).await.expect("deleting a server");
    let found = wait_for(&profiles, "assistant", "ResolvedRefs=False again", |p| {
        profile_condition(p, "ResolvedRefs").is_some_and(|c| c.status == "False")
    })
    .await;
    assert_eq!(found.status.expect("settled").missing_servers, ["later"]);
}

/// Security review N1: a profile shows, before any pod is created, which of its servers ask for
/// the pod's ServiceAccount identity that its `spec.identity` does not grant (here the API
/// server's audience, which a `*` grant does not cover), and stops once the grant names it.
#[tokio::test]
async fn a_profile_reports_a_server_asking_for_the_pods_identity_it_does_not_grant() {
    use spear::api::{HttpAuth, ServiceAccountTokenAuth};
    let ns = ControlPlane::shared().namespace("ctl-identity").await;
    let profiles = ns.api::<McpProfile>();
    let auth = HttpAuth {
        service_account_token: Some(ServiceAccountTokenAuth {
            audience: "https://kubernetes.default.svc".into(),
            expiration_seconds: None,
        }),
        ..HttpAuth::default()
    };
    let notes = McpServer::test("notes").http("http://127.0.0.1:9/mcp").allowing(["*"]).auth(auth);
    create(&ns.api::<McpServer>(), &notes).await;
    create(&profiles, &McpProfile::test("dev").servers(["notes"]).granting_tokens(["*"], ["*"])).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let found = wait_for(&profiles, "dev", "ResolvedRefs=False, RefNotPermitted", |p| {
        profile_condition(p, "ResolvedRefs").is_some_and(|c| c.reason == "RefNotPermitted")
    })
    .await;
    let refs = profile_condition(&found, "ResolvedRefs").expect("set");
    assert_eq!(refs.status, "False");
    assert!(refs.message.contains("\"notes\"") && refs.message.contains("literally"), "{}", refs.message);

    let literal = serde_json::json!({"spec": {"identity": {"audiences": ["https://kubernetes.default.svc"]}}});
    profiles.patch("dev", &PatchParams::default(), &Patch::Merge(&literal)).await.expect("granting it literally");
    wait_for(&profiles, "dev", "ResolvedRefs=True", |p| {
        profile_condition(p, "ResolvedRefs").is_some_and(|c| c.status == "True")
    })
    .await;
}

/// `GrantReady` of a server whose person's grant lives in a Secret, from the Secret's
/// annotations (what the login and the agents write): no Secret, a stored grant, a refused one;
/// and `spearlet explain` in the cluster shows it. The Secret's data is never needed.
#[tokio::test]
async fn grant_ready_follows_the_grant_secrets_annotations_and_explain_shows_it() {
    use k8s_openapi::api::core::v1::Secret;
    use spear::api::{AuthorizationCodeAuth, GrantSecretRef, HttpAuth};
    let ns = ControlPlane::shared().namespace("ctl-grant").await;
    let servers = ns.api::<McpServer>();
    let auth = HttpAuth {
        issuer: Some("http://127.0.0.1:9".into()),
        authorization_code: Some(AuthorizationCodeAuth {
            token_secret_ref: Some(GrantSecretRef { name: "gh-grant".into() }),
            ..AuthorizationCodeAuth::default()
        }),
        ..HttpAuth::default()
    };
    create(&servers, &McpServer::test("gh").http("http://127.0.0.1:9/mcp").allowing(["*"]).auth(auth)).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("p").servers(["gh"])).await;
    let _controller = Running::start(ns.client.clone(), config(&ns));
    let grant_ready = |reason: &'static str| {
        move |s: &McpServer| server_condition(s, "GrantReady").is_some_and(|c| c.reason == reason)
    };
    let found = wait_for(&servers, "gh", "GrantReady=False, NoGrant", grant_ready("NoGrant")).await;
    let condition = server_condition(&found, "GrantReady").expect("set");
    assert_eq!(condition.status, "False");
    let login = format!("spearlet auth login --server gh -n {}", ns.name);
    assert!(condition.message.contains(&login), "{}", condition.message);

    // Secrets are not watched: a touch of the server stands for the minute's re-check.
    let touch = |n: u32| {
        let servers = servers.clone();
        async move {
            let patch = serde_json::json!({"metadata": {"annotations": {"test/touch": n.to_string()}}});
            servers.patch("gh", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("touch");
        }
    };
    let mut secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "gh-grant", "annotations": {
            "mcp.spear.dev/allowed-servers": "gh",
            "mcp.spear.dev/grant-renewed-at": "2026-11-29T10:00:00Z"}},
        "type": "mcp.spear.dev/oauth-grant",
        "data": {"grant.json": "bm90IHJlYWQ="}
    }))
    .expect("secret");
    let secrets = ns.api::<Secret>();
    secrets.create(&PostParams::default(), &secret).await.expect("the grant Secret");
    touch(1).await;
    let found = wait_for(&servers, "gh", "GrantReady=True", grant_ready("GrantStored")).await;
    let condition = server_condition(&found, "GrantReady").expect("set");
    assert_eq!(condition.status, "True");
    assert!(condition.message.contains("2026-11-29T10:00:00Z"), "{}", condition.message);

    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["explain", "--profile", "p", "-n", &ns.name])
        .env("KUBECONFIG", ControlPlane::shared().kubeconfig_path())
        .output()
        .await
        .expect("spearlet explain");
    let shown = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && shown.contains("GRANTS") && shown.contains("GrantStored"), "{shown}");

    secret.metadata.annotations.get_or_insert_default().insert(
        "mcp.spear.dev/grant-login-required".into(),
        "2026-11-29T11:00:00Z the authorization server refused the grant (invalid_grant)".into(),
    );
    secrets.replace("gh-grant", &PostParams::default(), &secret).await.expect("marked refused");
    touch(2).await;
    let found = wait_for(&servers, "gh", "GrantReady=False, LoginRequired", grant_ready("LoginRequired")).await;
    let condition = server_condition(&found, "GrantReady").expect("set");
    assert!(condition.message.contains("invalid_grant") && condition.message.contains(&login), "{}", condition.message);
}

// === writes ===

/// Counts resourceVersions per object name seen by a watch of `api` (creation included).
fn count_versions<K>(api: Api<K>, token: CancellationToken) -> JoinHandle<BTreeMap<String, BTreeSet<String>>>
where
    K: Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug + Send + 'static,
{
    tokio::spawn(async move {
        let mut seen: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let events = watcher(api, watcher::Config::default()).take_until(async move { token.cancelled().await });
        tokio::pin!(events);
        while let Some(Ok(event)) = events.next().await {
            if let watcher::Event::Apply(obj) | watcher::Event::InitApply(obj) = event {
                seen.entry(obj.name_any()).or_default().insert(obj.resource_version().unwrap_or_default());
            }
        }
        seen
    })
}

#[tokio::test]
async fn each_change_is_written_once_and_spec_is_never_touched() {
    let ns = ControlPlane::shared().namespace("ctl-writes").await;
    let servers = ns.api::<McpServer>();
    let profiles = ns.api::<McpProfile>();
    let stop_counting = CancellationToken::new();
    let server_versions = count_versions(servers.clone(), stop_counting.clone());
    let profile_versions = count_versions(profiles.clone(), stop_counting.clone());
    // Let both watches start before anything is created, so they see every version.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let mut invalid = stdio("bad");
    invalid.spec.stdio.as_mut().expect("stdio").command = "npx -y server".into();
    let created = [create(&servers, &stdio("good")).await, create(&servers, &invalid).await];
    let created_profile = create(&profiles, &McpProfile::test("p").servers(["good", "gone"])).await;
    let controller = Running::start(ns.client.clone(), config(&ns));

    for name in ["good", "bad"] {
        wait_for(&servers, name, "a status at its generation", |s| {
            s.status.as_ref().is_some_and(|st| st.observed_generation == Some(1))
        })
        .await;
    }
    wait_for(&profiles, "p", "a status", |p| p.status.is_some()).await;
    // The counters move just after the API server answered; let them catch up with what we read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let settled_writes =
        (controller.metrics.status_writes("McpServer"), controller.metrics.status_writes("McpProfile"));

    // Quiet period: nothing changes, so nothing is written.
    tokio::time::sleep(QUIET).await;
    stop_counting.cancel();
    let server_versions = server_versions.await.expect("the watch task must not panic");
    let profile_versions = profile_versions.await.expect("the watch task must not panic");
    for (name, versions) in server_versions.iter().chain(&profile_versions) {
        // The creation and exactly one status write.
        assert_eq!(versions.len(), 2, "{name}: resourceVersions seen {versions:?}");
    }
    assert_eq!(server_versions.len() + profile_versions.len(), 3);
    assert_eq!(
        (controller.metrics.status_writes("McpServer"), controller.metrics.status_writes("McpProfile")),
        settled_writes,
        "no status write after the objects settled"
    );

    // Spec untouched, and the operator owns the status only.
    for before in created {
        let after = servers.get(&before.name_any()).await.expect("the server exists");
        assert_eq!(after.spec, before.spec);
        assert_eq!(after.metadata.generation, Some(1));
        assert_owns_status_only(&after.name_any(), after.managed_fields());
    }
    let after = profiles.get("p").await.expect("the profile exists");
    assert_eq!(after.spec, created_profile.spec);
    assert_owns_status_only("p", after.managed_fields());
}

fn assert_owns_status_only(name: &str, fields: &[k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry]) {
    let ours: Vec<_> = fields.iter().filter(|f| f.manager.as_deref() == Some("spear-operator")).collect();
    assert_eq!(ours.len(), 1, "{name}: one managedFields entry of spear-operator: {fields:?}");
    let entry = ours[0];
    assert_eq!(entry.operation.as_deref(), Some("Apply"), "{name}: server-side apply");
    assert_eq!(entry.subresource.as_deref(), Some("status"), "{name}: on the status subresource");
    let owned = entry.fields_v1.as_ref().map(|f| f.0.clone()).unwrap_or_default();
    let top: Vec<&String> = owned.as_object().map(|o| o.keys().collect()).unwrap_or_default();
    assert_eq!(top, ["f:status"], "{name}: only status fields are owned: {owned}");
}

// === RBAC ===

#[tokio::test]
async fn an_injection_enabled_namespace_keeps_the_agent_binding_until_the_label_goes() {
    let ns = ControlPlane::shared().namespace("ctl-rbac").await;
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let label = |value: Option<&str>| serde_json::json!({"metadata": {"labels": {"mcp.spear.dev/injection": value}}});
    namespaces
        .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label(Some("enabled"))))
        .await
        .expect("labelling the namespace");
    let _controller = Running::start(ns.client.clone(), config(&ns));

    let bindings = ns.api::<RoleBinding>();
    let binding = wait_for(&bindings, "spear-mcp-agent", "the agent RoleBinding", |_| true).await;
    assert_eq!(binding.role_ref.kind, "ClusterRole");
    assert_eq!(binding.role_ref.name, "spear-mcp-agent");
    let subjects = binding.subjects.unwrap_or_default();
    assert_eq!(subjects.len(), 1);
    assert_eq!(subjects[0].name, format!("system:serviceaccounts:{}", ns.name));
    // The ClusterRole it names is the chart's; the operator never creates one (see the RBAC test).

    // Deleted by someone: put back.
    let uid = binding.metadata.uid.clone();
    bindings.delete("spear-mcp-agent", &DeleteParams::default()).await.expect("deleting the binding");
    wait_for(&bindings, "spear-mcp-agent", "the binding recreated", |b| b.metadata.uid != uid).await;

    // With it, the operator's own Secret reader binding.
    let reader = wait_for(&bindings, "spear-operator-secret-reader", "the Secret reader RoleBinding", |_| true).await;
    assert_eq!(
        (reader.role_ref.kind.as_str(), reader.role_ref.name.as_str()),
        ("ClusterRole", "spear-operator-secret-reader")
    );

    // The namespace leaves injection: both bindings go.
    namespaces.patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label(None))).await.expect("removing the label");
    for name in ["spear-mcp-agent", "spear-operator-secret-reader"] {
        eventually(&format!("{name} removed"), || async {
            match bindings.get_opt(name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        })
        .await;
    }
}

/// The operator's RBAC from `src/operator/rbac.rs` (what the chart installs) is enough for the
/// controllers, and no more: run as a service account holding exactly those roles, they write
/// status and the agent RoleBinding; the same account cannot create or change a ClusterRole, bind
/// another role, or touch a RoleBinding of another name. Security review N5: it reads a Secret's
/// grant only in an injection-enabled namespace (through the Secret reader RoleBinding it keeps
/// there), and no Secret of a namespace without injection.
#[tokio::test]
async fn the_controllers_run_on_the_operators_rbac_which_grants_no_cluster_role_or_foreign_binding() {
    use k8s_openapi::api::core::v1::{Secret, ServiceAccount};
    use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, Role, RoleRef, Subject};
    use spear::operator::rbac;

    let ns = ControlPlane::shared().namespace("ctl-least").await;
    let admin = ns.client.clone();
    let account = "spear-operator";
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({"metadata": {"name": account}})).expect("a ServiceAccount");
    create(&ns.api::<ServiceAccount>(), &sa).await;
    let subject = Subject {
        kind: "ServiceAccount".into(),
        name: account.into(),
        namespace: Some(ns.name.clone()),
        api_group: None,
    };
    // Cluster-scoped objects get the namespace's unique name; the agent role is shared by all
    // tests (what the chart installs), applied idempotently.
    let apply = PatchParams::apply("spear-test").force();
    let cluster_roles = Api::<ClusterRole>::all(admin.clone());
    let agent_role = rbac::agent_cluster_role();
    cluster_roles.patch("spear-mcp-agent", &apply, &Patch::Apply(&agent_role)).await.expect("the agent role");
    let reader_role = rbac::secret_reader_cluster_role();
    let reader = "spear-operator-secret-reader";
    cluster_roles.patch(reader, &apply, &Patch::Apply(&reader_role)).await.expect("the Secret reader role");
    let mut operator_role = rbac::operator_cluster_role();
    operator_role.metadata.name = Some(format!("spear-test-operator-{}", ns.name));
    create(&cluster_roles, &operator_role).await;
    let cluster_binding = ClusterRoleBinding {
        metadata: kube::core::ObjectMeta { name: operator_role.metadata.name.clone(), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "ClusterRole".into(),
            name: operator_role.metadata.name.clone().expect("named"),
        },
        subjects: Some(vec![subject.clone()]),
    };
    create(&Api::<ClusterRoleBinding>::all(admin.clone()), &cluster_binding).await;
    let own: Role = rbac::operator_role(&ns.name);
    create(&ns.api::<Role>(), &own).await;
    let own_binding = RoleBinding {
        metadata: kube::core::ObjectMeta { name: Some("spear-operator".into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: own.metadata.name.clone().expect("named"),
        },
        subjects: Some(vec![subject]),
    };
    create(&ns.api::<RoleBinding>(), &own_binding).await;

    let mut kubeconfig = ControlPlane::shared().config();
    kubeconfig.auth_info.impersonate = Some(format!("system:serviceaccount:{}:{account}", ns.name));
    let operator = Client::try_from(kubeconfig).expect("an impersonating client");

    // Secrets with a grant, here and in a namespace without injection.
    let secret = |name: &str| -> Secret {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name, "annotations": {"mcp.spear.dev/allowed-servers": "web"}},
            "stringData": {"token": "s3cret"},
        }))
        .expect("a Secret")
    };
    create(&ns.api::<Secret>(), &secret("web-token")).await;
    let plain = ControlPlane::shared().namespace("ctl-least-plain").await;
    create(&plain.api::<Secret>(), &secret("elsewhere")).await;
    let forbidden_read = |result: Result<(), kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    };
    let secrets_here = Api::<Secret>::namespaced(operator.clone(), &ns.name);
    forbidden_read(secrets_here.get_metadata("web-token").await.map(drop), "a Secret before injection is enabled");

    // What the controllers need: status of both kinds and the agent RoleBinding.
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    let label = serde_json::json!({"metadata": {"labels": {"mcp.spear.dev/injection": "enabled"}}});
    namespaces.patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelling the namespace");
    create(&ns.api::<McpServer>(), &stdio("fs")).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["fs"])).await;
    let _controller = Running::start(operator.clone(), config(&ns));
    wait_for(&ns.api::<McpServer>(), "fs", "Accepted=True", |s| server_has(s, "Accepted", "True")).await;
    wait_for(&ns.api::<McpProfile>(), "dev", "ResolvedRefs=True", |p| {
        profile_condition(p, "ResolvedRefs").is_some_and(|c| c.status == "True")
    })
    .await;
    wait_for(&ns.api::<RoleBinding>(), "spear-mcp-agent", "the agent RoleBinding", |_| true).await;

    // The Secret grant check works where injection is on: the operator keeps its reader binding
    // there, and the server's status says the Secret allows it.
    wait_for(&ns.api::<RoleBinding>(), reader, "the Secret reader RoleBinding", |b| {
        b.subjects.iter().flatten().any(|s| s.kind == "ServiceAccount" && s.name == account)
    })
    .await;
    eventually("the operator reads the grant in its enabled namespace", || async {
        secrets_here.get_metadata("web-token").await.map(drop).map_err(|e| e.to_string())
    })
    .await;
    let web =
        McpServer::test("web").http("http://127.0.0.1:9/mcp").secret_header("Authorization", "web-token", "token");
    create(&ns.api::<McpServer>(), &web).await;
    wait_for(&ns.api::<McpServer>(), "web", "ResolvedRefs=True", |s| server_has(s, "ResolvedRefs", "True")).await;
    // And nowhere else: not a Secret of a namespace without injection, nor of kube-system.
    let secrets_elsewhere = Api::<Secret>::namespaced(operator.clone(), &plain.name);
    forbidden_read(secrets_elsewhere.get_metadata("elsewhere").await.map(drop), "a Secret where injection is off");
    let system = Api::<Secret>::namespaced(operator.clone(), "kube-system");
    forbidden_read(system.list_metadata(&ListParams::default()).await.map(drop), "listing kube-system's Secrets");

    // What it must not do, each refused by the API server's authorizer.
    let forbidden = |result: Result<(), kube::Error>, what: &str| match result {
        Err(kube::Error::Api(status)) if status.code == 403 => {}
        other => panic!("{what}: expected 403 Forbidden, got {other:?}"),
    };
    let mut minted = rbac::agent_cluster_role();
    minted.metadata.name = Some(format!("spear-test-minted-{}", ns.name));
    let as_operator = Api::<ClusterRole>::all(operator.clone());
    forbidden(as_operator.create(&PostParams::default(), &minted).await.map(drop), "creating a ClusterRole");
    let mut widened = agent_role.clone();
    widened.rules.get_or_insert_default()[0].resources = Some(vec!["mcpservers".into(), "secrets".into()]);
    forbidden(
        as_operator
            .patch("spear-mcp-agent", &PatchParams::apply("spear-operator").force(), &Patch::Apply(&widened))
            .await
            .map(drop),
        "changing the agents' ClusterRole",
    );
    let mut admin_binding = rbac::agent_role_binding(&ns.name);
    admin_binding.metadata.name = Some("spear-mcp-agent".into());
    admin_binding.role_ref.name = "cluster-admin".into();
    let bindings = Api::<RoleBinding>::namespaced(operator.clone(), &ns.name);
    let mut other = admin_binding.clone();
    other.metadata.name = Some("escalate".into());
    forbidden(bindings.create(&PostParams::default(), &other).await.map(drop), "binding cluster-admin");
    let mut foreign = rbac::agent_role_binding(&ns.name);
    foreign.metadata.name = Some("someone-elses".into());
    create(&ns.api::<RoleBinding>(), &foreign).await;
    forbidden(bindings.delete("someone-elses", &DeleteParams::default()).await.map(drop), "deleting another binding");
    forbidden(bindings.get("someone-elses").await.map(drop), "reading another binding");

    for name in [operator_role.metadata.name.clone(), cluster_binding.metadata.name.clone()].into_iter().flatten() {
        let _ = Api::<ClusterRoleBinding>::all(admin.clone()).delete(&name, &DeleteParams::default()).await;
        let _ = cluster_roles.delete(&name, &DeleteParams::default()).await;
    }
}

// === leader election ===

#[tokio::test]
async fn only_the_leader_reconciles_and_a_standby_takes_over_when_it_stops() {
    let ns = ControlPlane::shared().namespace("ctl-leader").await;
    let elected = |identity: &str| {
        let mut config = config(&ns);
        let mut leader = LeaderConfig::new("spear-operator", ns.name.as_str(), identity);
        // Short terms keep the takeover quick (a standby checks again when the term it saw
        // ends); 4 s of renewal margin keep a loaded CI box from losing the Lease mid-test.
        leader.duration = Duration::from_secs(8);
        leader.grace = Duration::from_secs(4);
        config.leader = Some(leader);
        config.instance = identity.to_string();
        config
    };
    let first = Running::start(ns.client.clone(), elected("first"));
    eventually("the first replica leads", || async {
        if first.metrics.is_leader() { Ok(()) } else { Err("standby".to_string()) }
    })
    .await;
    let second = Running::start(ns.client.clone(), elected("second"));
    eventually("the second replica is ready as a standby", || async {
        if second.metrics.is_ready() { Ok(()) } else { Err("not started".to_string()) }
    })
    .await;

    let servers = ns.api::<McpServer>();
    create(&servers, &stdio("one")).await;
    wait_for(&servers, "one", "Accepted", |s| server_has(s, "Accepted", "True")).await;
    let leases: Api<Lease> = ns.api();
    let holder = |lease: &Lease| lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default();
    assert_eq!(holder(&leases.get("spear-operator").await.expect("the Lease exists")), "first");
    // The counter moves just after the API server answered the write, so it may trail the read.
    eventually("the leader counted its write", || async {
        let writes = first.metrics.status_writes("McpServer");
        if writes >= 1 { Ok(()) } else { Err(format!("{writes} writes")) }
    })
    .await;
    assert!(!second.metrics.is_leader());
    assert_eq!(second.metrics.reconciles("McpServer"), 0, "a standby reconciles nothing");
    assert_eq!(second.metrics.status_writes("McpServer"), 0, "a standby writes nothing");

    // The leader stops (releasing the Lease): the standby takes over and reconciles.
    first.stop().await;
    eventually("the second replica leads", || async {
        if second.metrics.is_leader() { Ok(()) } else { Err("standby".to_string()) }
    })
    .await;
    assert_eq!(holder(&leases.get("spear-operator").await.expect("the Lease exists")), "second");
    create(&servers, &stdio("two")).await;
    wait_for(&servers, "two", "Accepted", |s| server_has(s, "Accepted", "True")).await;
    eventually("the new leader counted its write", || async {
        let writes = second.metrics.status_writes("McpServer");
        if writes >= 1 { Ok(()) } else { Err(format!("{writes} writes")) }
    })
    .await;
    second.stop().await;

    // Both gone: the Lease is free.
    let lease = leases.get("spear-operator").await.expect("the Lease exists");
    assert_eq!(holder(&lease), "", "released at shutdown: {lease:?}");
}

// === the binary ===

/// `spear-operator run` as a process: kills it on drop if it is still running.
struct OperatorProcess(std::process::Child);

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_run_subcommand_leads_serves_health_and_metrics_and_releases_the_lease_on_sigterm() {
    spear::install_crypto_provider();
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("ctl-run").await;
    let port = spear::testing::mcp_servers::free_port();
    let mut operator = OperatorProcess(
        std::process::Command::new(env!("CARGO_BIN_EXE_spear-operator"))
            .args(["run", "--metrics-addr", &format!("127.0.0.1:{port}"), "--lease-name", "op"])
            .args(["--namespace", &ns.name, "--watch-namespace", &ns.name, "--probe-interval-seconds", "30"])
            .args(["--agent-image", "spear.local/spearlet:test", "--spearlet-image", "spear.local/spearlet:test"])
            .args(["--webhook-addr", &format!("127.0.0.1:{}", spear::testing::mcp_servers::free_port())])
            .env("KUBECONFIG", control_plane.kubeconfig_path())
            .env("SPEAR_LOG", "spear=debug,warn")
            .stdin(std::process::Stdio::null())
            .spawn()
            .expect("spear-operator starts"),
    );

    let http = reqwest::Client::new();
    let get = |path: &'static str| {
        let http = http.clone();
        async move {
            let response =
                http.get(format!("http://127.0.0.1:{port}{path}")).send().await.map_err(|e| e.to_string())?;
            let status = response.status();
            let body = response.text().await.map_err(|e| e.to_string())?;
            if status.is_success() { Ok(body) } else { Err(format!("{status}: {body}")) }
        }
    };
    assert_eq!(eventually("/healthz answers", || get("/healthz")).await, "ok\n");
    eventually("/readyz is ready", || get("/readyz")).await;
    eventually("the process leads", || async {
        let metrics = get("/metrics").await?;
        if metrics.contains("spear_operator_leader 1") { Ok(()) } else { Err(metrics) }
    })
    .await;

    let servers = ns.api::<McpServer>();
    create(&servers, &stdio("fs")).await;
    wait_for(&servers, "fs", "Accepted", |s| server_has(s, "Accepted", "True")).await;
    let metrics = eventually("the write is counted", || async {
        let metrics = get("/metrics").await?;
        if metrics.contains("spear_operator_status_write_total{kind=\"McpServer\"} 1") {
            Ok(metrics)
        } else {
            Err(metrics)
        }
    })
    .await;
    assert!(metrics.contains("spear_operator_reconcile_total{kind=\"McpServer\"}"), "{metrics}");

    let lease = ns.api::<Lease>().get("op").await.expect("the process created its Lease");
    let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    assert!(!holder.is_empty(), "the process holds its Lease");

    let pid = operator.0.id().to_string();
    let killed = std::process::Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
    assert!(killed.success());
    let deadline = Instant::now() + SETTLE;
    let status = loop {
        if let Some(status) = operator.0.try_wait().expect("the child can be waited for") {
            break status;
        }
        assert!(Instant::now() < deadline, "spear-operator did not exit within {SETTLE:?} of SIGTERM");
        tokio::time::sleep(POLL).await;
    };
    assert!(status.success(), "a graceful stop exits 0: {status}");
    let lease = ns.api::<Lease>().get("op").await.expect("the Lease stays");
    assert_eq!(lease.spec.and_then(|s| s.holder_identity), None, "released at shutdown");
}
