//! Pod-injection latency for a pod whose profile has 3 servers (2 stdio sidecars, 1 HTTP):
//!
//! - M: `inject::mutate` alone (the pure decision and patch).
//! - R: the webhook's HTTP handler in-process (`webhook::router` driven by `tower::oneshot`):
//!   JSON parse of the AdmissionReview, lookup (fixed inputs, no API server), mutate, JSON answer.
//! - W vs P: `POST pods` through the test control plane's real kube-apiserver, in a namespace
//!   whose MutatingWebhookConfiguration calls this process's webhook over TLS (W), and in a
//!   namespace without a webhook (P), alternating create by create so drift hits both alike. The
//!   difference is what injection costs a pod create (TLS call, the lookup from the webhook's
//!   caches, the patch and the larger object stored); the ratio is W/P. I, the injected pod
//!   created without a webhook, splits the difference: I - P is the larger object, W - I the
//!   webhook call. The three reads the
//!   webhook made before it had caches are timed apart, for comparison.
//!
//! Run: `cargo bench --bench webhook` (needs the test control plane: `hack/control-plane.sh`).
//! Without `--bench` (under `cargo test --all-targets`) it is a short smoke run of the harness.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use k8s_openapi::api::admissionregistration::v1::{
    MutatingWebhook, MutatingWebhookConfiguration, RuleWithOperations, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::{Namespace, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use prometheus_client::registry::Registry;
use serde_json::json;
use spear::api::api_key::ApiKey;
use spear::api::keys::{ANNOTATION_PROFILE, INJECTION_ENABLED, LABEL_INJECTION};
use spear::api::{McpProfile, McpServer};
use spear::operator::inject::{self, Decision, InjectConfig};
use spear::operator::webhook::certs::{CertSource, SelfSigned};
use spear::operator::webhook::{
    self, Inputs, Lookup, LookupError, MUTATE_PATH, NativeSidecars, WebhookConfig, WebhookMetrics,
};
use spear::testing::bench::{percentile, us};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers::free_port;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;

const IMAGE: &str = "ghcr.io/spear-mcp/spearlet:bench";
const LABEL_BENCH: &str = "spear.test/webhook";

struct Size {
    in_process: usize,
    api_creates: usize,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn enabled() -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string())])
}

fn servers() -> Vec<McpServer> {
    vec![
        McpServer::test("fs")
            .stdio("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data"])
            .image("node:22-slim")
            .allowing(["*"]),
        McpServer::test("git").stdio("uvx", ["mcp-server-git"]).image("python:3.13-slim").allowing(["*"]),
        McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]),
    ]
}

fn profile() -> McpProfile {
    McpProfile::test("dev").servers(["fs", "git", "remote"])
}

fn pod(namespace: Option<&str>) -> Pod {
    let mut pod = spear::testing::fixtures::app_pod(&[(ANNOTATION_PROFILE, "dev")]);
    pod.metadata.generate_name = Some("app-".into());
    pod.metadata.namespace = namespace.map(str::to_string);
    pod
}

/// The lookup with fixed inputs: what the API server would answer, without the API server.
struct Fixed(Inputs);

impl Lookup for Fixed {
    async fn fetch(&self, _namespace: &str, _profile: Option<&str>) -> Result<Inputs, LookupError> {
        Ok(self.0.clone())
    }
}

fn report(title: &str, unit: &str, rows: &mut [(&str, Vec<Duration>)], scale: fn(Duration) -> f64) {
    println!("{title}");
    println!("{:<52} {:>10} {:>10}", "", format!("p50 {unit}"), format!("p99 {unit}"));
    for (name, samples) in rows.iter_mut() {
        samples.sort();
        println!("{name:<52} {:>10.1} {:>10.1}", scale(percentile(samples, 0.5)), scale(percentile(samples, 0.99)));
    }
}

async fn in_process(size: &Size) {
    let config = InjectConfig::new(IMAGE, IMAGE);
    let (pod, profile, servers) = (pod(Some("bench")), profile(), servers());
    let mut mutate = Vec::with_capacity(size.in_process);
    for _ in 0..size.in_process {
        let started = Instant::now();
        // As the webhook does: a key drawn per pod.
        let key = ApiKey::random().expect("the OS has randomness");
        let decision = inject::mutate(&pod, &enabled(), Some(&profile), &servers, &Default::default(), &config, &key)
            .expect("mutate");
        mutate.push(started.elapsed());
        assert!(matches!(decision, Decision::Patch { .. }), "{decision:?}");
    }

    let inputs = Inputs { namespace_labels: enabled(), profile: Some(profile), servers, secrets: Default::default() };
    let router = webhook::router(Fixed(inputs), config, WebhookMetrics::default());
    let review = spear::testing::fixtures::pod_create_review("bench", "bench", "bench", &pod);
    let mut handler = Vec::with_capacity(size.in_process);
    for _ in 0..size.in_process {
        let request = Request::post(MUTATE_PATH)
            .header("content-type", "application/json")
            .body(Body::from(review.clone()))
            .expect("a request builds");
        let started = Instant::now();
        let response = router.clone().oneshot(request).await.expect("the router answers");
        assert_eq!(response.status(), StatusCode::OK);
        let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.expect("a body");
        handler.push(started.elapsed());
        assert!(body.windows(9).any(|w| w == b"JSONPatch"), "{}", String::from_utf8_lossy(&body));
    }
    report(
        &format!("webhook bench, in-process: 3 servers, {} iterations", size.in_process),
        "us",
        &mut [("M  inject::mutate", mutate), ("R  HTTP handler (parse, mutate, answer)", handler)],
        us,
    );
}

/// Registers the in-process webhook for `namespace` and waits until the API server calls it.
async fn start_webhook(
    client: &kube::Client,
    namespace: &str,
    metrics: WebhookMetrics,
    shutdown: &CancellationToken,
) -> String {
    let name = format!("spear-bench-{namespace}");
    let port = free_port();
    let labels = json!({ "metadata": { "labels": { LABEL_INJECTION: INJECTION_ENABLED, LABEL_BENCH: name } } });
    Api::<Namespace>::all(client.clone())
        .patch(namespace, &PatchParams::default(), &Patch::Merge(&labels))
        .await
        .expect("labelling the namespace");
    let selector = BTreeMap::from([
        (LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string()),
        (LABEL_BENCH.to_string(), name.clone()),
    ]);
    let configuration = MutatingWebhookConfiguration {
        metadata: ObjectMeta { name: Some(name.clone()), ..ObjectMeta::default() },
        webhooks: Some(vec![MutatingWebhook {
            name: "pods.mcp.spear.dev".into(),
            admission_review_versions: vec!["v1".into()],
            client_config: WebhookClientConfig {
                url: Some(format!("https://127.0.0.1:{port}{MUTATE_PATH}")),
                ..WebhookClientConfig::default()
            },
            failure_policy: Some("Fail".into()),
            side_effects: "None".into(),
            timeout_seconds: Some(10),
            namespace_selector: Some(LabelSelector { match_labels: Some(selector), ..LabelSelector::default() }),
            rules: Some(vec![RuleWithOperations {
                api_groups: Some(vec![String::new()]),
                api_versions: Some(vec!["v1".into()]),
                operations: Some(vec!["CREATE".into()]),
                resources: Some(vec!["pods".into()]),
                scope: Some("Namespaced".into()),
            }]),
            ..MutatingWebhook::default()
        }]),
    };
    Api::<MutatingWebhookConfiguration>::all(client.clone())
        .create(&PostParams::default(), &configuration)
        .await
        .expect("creating the webhook configuration");

    let mut certs = SelfSigned::new(namespace, "spear-operator-webhook");
    certs.webhook_config_name = Some(name.clone());
    certs.extra_sans = vec!["127.0.0.1".into()];
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut config =
        WebhookConfig::new(addr, InjectConfig::new(IMAGE, IMAGE), NativeSidecars::Auto, CertSource::SelfSigned(certs));
    config.metrics = metrics;
    tokio::spawn(webhook::serve(client.clone(), config, shutdown.clone()));

    // Until a pod that is injected comes back injected, the configuration is not in effect.
    let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
    let dry_run = PostParams { dry_run: true, ..PostParams::default() };
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(created) = pods.create(&dry_run, &pod(None)).await
            && created.spec.is_some_and(|s| s.init_containers.is_some())
        {
            return name;
        }
        assert!(Instant::now() < deadline, "the API server never called the webhook");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn through_api_server(size: &Size) {
    let control_plane = ControlPlane::shared();
    let injected = control_plane.namespace("bench-webhook").await;
    let plain = control_plane.namespace("bench-plain").await;
    for server in servers() {
        injected.api::<McpServer>().create(&PostParams::default(), &server).await.expect("creating a server");
    }
    injected.api::<McpProfile>().create(&PostParams::default(), &profile()).await.expect("creating the profile");
    let shutdown = CancellationToken::new();
    let mut registry = Registry::default();
    let metrics = WebhookMetrics::register(&mut registry);
    let configuration = start_webhook(&injected.client, &injected.name, metrics.clone(), &shutdown).await;
    // Measure the steady state: reviews answered from the caches (issue 18).
    let deadline = Instant::now() + Duration::from_secs(30);
    while !metrics.caches_synced() {
        assert!(Instant::now() < deadline, "the webhook's caches never listed");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let (with, without) = (injected.api::<Pod>(), plain.api::<Pod>());
    let template = pod(None);
    // Warm both paths (connections, the API server's caches) before measuring.
    for _ in 0..3 {
        with.create(&PostParams::default(), &template).await.expect("a pod create through the webhook");
        without.create(&PostParams::default(), &template).await.expect("a plain pod create");
    }
    // I: the pod as the webhook stores it, created without a webhook: what the larger object
    // alone costs the API server and etcd, so W - I is the webhook call itself.
    let mut injected_pod =
        with.create(&PostParams::default(), &template).await.expect("a pod create through the webhook");
    injected_pod.metadata = ObjectMeta {
        generate_name: injected_pod.metadata.generate_name.clone(),
        annotations: injected_pod.metadata.annotations.clone(),
        ..ObjectMeta::default()
    };
    injected_pod.status = None;
    let bytes = |pod: &Pod| serde_json::to_vec(pod).map_or(0, |v| v.len());
    println!(
        "pod JSON as sent: {} bytes plain, {} bytes injected (P vs I below)",
        bytes(&template),
        bytes(&injected_pod)
    );
    let mut samples = [(); 3].map(|()| Vec::with_capacity(size.api_creates));
    for _ in 0..size.api_creates {
        let started = Instant::now();
        let created = with.create(&PostParams::default(), &template).await.expect("a pod create through the webhook");
        samples[0].push(started.elapsed());
        assert!(created.spec.is_some_and(|s| s.init_containers.is_some()), "the pod was injected");
        let started = Instant::now();
        without.create(&PostParams::default(), &template).await.expect("a plain pod create");
        samples[1].push(started.elapsed());
        let started = Instant::now();
        without.create(&PostParams::default(), &injected_pod).await.expect("an injected pod create");
        samples[2].push(started.elapsed());
    }
    let [mut w, mut p, i] = samples;
    // The webhook's three reads, one at a time from this process, for the breakdown.
    let (mut ns_get, mut profile_get, mut server_list) = (Vec::new(), Vec::new(), Vec::new());
    let namespaces: Api<Namespace> = Api::all(injected.client.clone());
    for _ in 0..size.api_creates {
        let started = Instant::now();
        namespaces.get_metadata(&injected.name).await.expect("reading the namespace");
        ns_get.push(started.elapsed());
        let started = Instant::now();
        injected.api::<McpProfile>().get_opt("dev").await.expect("reading the profile");
        profile_get.push(started.elapsed());
        let started = Instant::now();
        injected.api::<McpServer>().list(&Default::default()).await.expect("listing the servers");
        server_list.push(started.elapsed());
    }
    report(
        "the webhook's reads, sequential, from the bench process",
        "ms",
        &mut [
            ("GET namespace (metadata)", ns_get),
            ("GET McpProfile", profile_get),
            ("LIST McpServers (serverSelector profiles)", server_list),
        ],
        ms,
    );
    w.sort();
    p.sort();
    let (w50, w99, p50, p99) = (percentile(&w, 0.5), percentile(&w, 0.99), percentile(&p, 0.5), percentile(&p, 0.99));
    report(
        &format!("webhook bench, through kube-apiserver: {} pod creates each, alternating", size.api_creates),
        "ms",
        &mut [
            ("W  POST pods, injected by the webhook", w),
            ("P  POST pods, no webhook", p),
            ("I  POST the injected pod, no webhook", i),
        ],
        ms,
    );
    println!(
        "webhook-added: p50 {:+.2} ms (ratio {:.2}), p99 {:+.2} ms (ratio {:.2})",
        ms(w50) - ms(p50),
        w50.as_secs_f64() / p50.as_secs_f64(),
        ms(w99) - ms(p99),
        w99.as_secs_f64() / p99.as_secs_f64(),
    );

    let misses: u64 = ["Namespace", "McpProfile", "McpServer"].iter().map(|k| metrics.read_through_count(k)).sum();
    println!("objects read through a cache miss during the run: {misses}");
    // Where the added time goes: inside the handler (lookup, mutate) vs the rest.
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).expect("metrics encode");
    let value =
        |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.trim().parse::<f64>().ok()).unwrap_or(f64::NAN);
    let (sum, count) = (value("admission_latency_ms_sum "), value("admission_latency_ms_count "));
    println!(
        "inside the webhook handler: mean {:.2} ms over {count} reviews (the rest is TLS, HTTP and the API server)",
        sum / count
    );

    shutdown.cancel();
    let _ = Api::<MutatingWebhookConfiguration>::all(injected.client.clone())
        .delete(&configuration, &DeleteParams::default())
        .await;
}

fn main() {
    spear::install_crypto_provider();
    let bench = std::env::args().any(|a| a == "--bench");
    let size =
        if bench { Size { in_process: 5000, api_creates: 300 } } else { Size { in_process: 20, api_creates: 3 } };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        in_process(&size).await;
        through_api_server(&size).await;
    });
}
