//! Every metric the chart's alerts and dashboard query is one the binaries export: a real
//! `spearlet serve` (the Python fixture server behind it), a `spearlet run` (in process, pod
//! mode, its profile naming a stdio server it has no sidecar for) and a real `spear-operator run`
//! against the test control plane, scraped after some traffic of each kind the alerts watch
//! (tool calls, a refused call, reconciles, admission reviews, a failed TLS handshake). Names are
//! compared by the exposition's `# TYPE` lines (a family appears once it has a series; the
//! operator starts its known series at 0), under Prometheus's suffix rules: a counter `c` is
//! queried as `c_total`, a histogram `h` as `h_bucket`, `h_sum` and `h_count`, a gauge by its name.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Pod, Secret};
use spear::agent::run_in_pod;
use spear::api::{McpProfile, McpServer};
use spear::operator::webhook::MUTATE_PATH;
use spear::operator::webhook::certs::{SECRET_CA_CERT, SECRET_TLS_CERT, SelfSigned};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers::free_port;
use tokio::io::AsyncWriteExt as _;
use tokio_util::sync::CancellationToken;

use super::kube_source::run_config;
use crate::alerts::{alert_expressions, dashboard_queries, metric_names};
use crate::serve::{fixture_registry, http_get, serve};

/// Longest wait for the operator to reach a state; generous for a loaded 2-core CI box.
const SETTLE: Duration = Duration::from_secs(60);
/// The webhook Service the operator issues its certificate for (its default).
const SERVICE: &str = "spear-operator-webhook";

/// `spear-operator run` as a process, killed on drop.
struct OperatorProcess(Child);

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The metric families an exposition declares (`# TYPE name type`), by name.
fn families(exposition: &str) -> BTreeMap<String, String> {
    exposition
        .lines()
        .filter_map(|line| line.strip_prefix("# TYPE "))
        .filter_map(|rest| rest.split_once(' '))
        .map(|(name, kind)| (name.to_string(), kind.trim().to_string()))
        .collect()
}

/// Whether a query's metric `name` is a series of one of `families`.
fn exported(families: &BTreeMap<String, String>, name: &str) -> bool {
    let of = |family: &str, kinds: &[&str]| families.get(family).is_some_and(|k| kinds.contains(&k.as_str()));
    if of(name, &["gauge", "unknown", "stateset", "info"]) {
        return true;
    }
    if let Some(counter) = name.strip_suffix("_total") {
        return of(counter, &["counter"]);
    }
    ["_bucket", "_sum", "_count"].iter().any(|suffix| name.strip_suffix(suffix).is_some_and(|h| of(h, &["histogram"])))
}

/// The value of the sample `series` (name and labels exactly as exposed), if present.
fn sample(exposition: &str, series: &str) -> Option<f64> {
    exposition.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

async fn get(port: u16, path: &str) -> Result<String, String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let response = reqwest::get(&url).await.map_err(|e| e.to_string())?;
    let status = response.status();
    let body = response.text().await.map_err(|e| e.to_string())?;
    if status.is_success() { Ok(body) } else { Err(format!("{status}: {body}")) }
}

/// Polls `check` until it answers `Ok`; panics with the last `Err` after [`SETTLE`].
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let deadline = Instant::now() + SETTLE;
    loop {
        match check().await {
            Ok(value) => return value,
            Err(last) if Instant::now() >= deadline => panic!("{what}: not within {SETTLE:?}; last: {last}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_alerts_and_the_dashboard_query_is_exported_by_the_agent_or_the_operator() {
    spear::install_crypto_provider();
    // What the chart ships, first: a broken rule or dashboard fails here before anything starts.
    let mut queries = alert_expressions().into_iter().map(|(n, e)| (format!("alert {n}"), e)).collect::<Vec<_>>();
    queries.extend(dashboard_queries());

    // --- the agent: local mode over the fixture server, a call that works and one refused ---
    let agent = tokio::task::spawn_blocking(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        fixture_registry(dir.path());
        let served = serve(dir, &["--audit-log", "off"]);
        let grpc = format!("127.0.0.1:{}", served.grpc);
        // A listing: the servers offered to a session (mcp_injection_total).
        let listed = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "list", "--grpc-addr", &grpc])
            .output()
            .expect("spearlet tools list runs");
        assert!(listed.status.success(), "{}", String::from_utf8_lossy(&listed.stderr));
        for (tool, args) in [("fx/echo", r#"{"text": "scraped"}"#), ("fx/pid", "{}")] {
            let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
                .args(["tools", "call", tool, "--args", args, "--grpc-addr", &grpc])
                .output()
                .expect("spearlet tools call runs");
            assert!(!out.stdout.is_empty() || !out.stderr.is_empty(), "spearlet tools call {tool} answered nothing");
        }
        served
    })
    .await
    .expect("the agent starts");
    let (status, agent_metrics) = http_get(agent.admin, "/metrics").expect("the agent's /metrics answers");
    assert_eq!(status, 200, "{agent_metrics}");

    // --- the operator: the real binary, leading, with a webhook on a loopback port ---
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("metrics").await;
    let (metrics_port, webhook_port) = (free_port(), free_port());
    let _operator = OperatorProcess(
        Command::new(env!("CARGO_BIN_EXE_spear-operator"))
            .args(["run", "--metrics-addr", &format!("127.0.0.1:{metrics_port}"), "--lease-name", "op"])
            .args(["--namespace", &ns.name, "--watch-namespace", &ns.name, "--probe-interval-seconds", "30"])
            .args(["--agent-image", "spear.local/spearlet:test", "--spearlet-image", "spear.local/spearlet:test"])
            .args(["--webhook-addr", &format!("127.0.0.1:{webhook_port}"), "--webhook-service-name", SERVICE])
            .env("KUBECONFIG", control_plane.kubeconfig_path())
            .stdin(Stdio::null())
            .spawn()
            .expect("spear-operator starts"),
    );
    eventually("the operator leads", || async {
        let metrics = get(metrics_port, "/metrics").await?;
        if metrics.contains("spear_operator_leader 1") { Ok(()) } else { Err(metrics) }
    })
    .await;
    // A reconcile and a status write.
    let server = McpServer::test("scraped").stdio("npx", ["-y", "pkg"]).image("node:22").allowing(["*"]);
    ns.api::<McpServer>().create(&Default::default(), &server).await.expect("create the McpServer");

    // Admission traffic over TLS, trusting the CA the operator keeps in its Secret.
    let secret_name = SelfSigned::new(&ns.name, SERVICE).secret_name;
    let secret = eventually("the webhook's certificate Secret", || async {
        ns.api::<Secret>().get(&secret_name).await.map_err(|e| e.to_string())
    })
    .await;
    let data = secret.data.unwrap_or_default();
    let ca = data.get(SECRET_CA_CERT).expect("the Secret holds ca.crt").0.clone();
    let host = format!("{SERVICE}.{}.svc", ns.name);
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).expect("ca.crt is PEM"))
        .resolve(&host, SocketAddr::from(([127, 0, 0, 1], webhook_port)))
        .build()
        .expect("an HTTPS client");
    let url = format!("https://{host}:{webhook_port}{MUTATE_PATH}");
    let review = spear::testing::fixtures::pod_create_review(
        "0d1e2f30-0000-4000-8000-00000000000a",
        &ns.name,
        "test",
        &Pod {
            metadata: kube::api::ObjectMeta { generate_name: Some("app-".into()), ..Default::default() },
            ..Default::default()
        },
    );
    for (body, expected) in [(review, 200), (b"not a review".to_vec(), 400)] {
        let status = eventually("the webhook answers", || {
            let (client, url, body) = (client.clone(), url.clone(), body.clone());
            async move {
                let response = client
                    .post(&url)
                    .header("content-type", "application/json")
                    .body(body)
                    .send()
                    .await
                    .map_err(|e| format!("{e:?}"))?;
                Ok(response.status().as_u16())
            }
        })
        .await;
        assert_eq!(status, expected);
    }
    // A connection that is not TLS at all: a failed handshake.
    let mut plain = tokio::net::TcpStream::connect(("127.0.0.1", webhook_port)).await.expect("connect");
    plain.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
    drop(plain);

    let operator_metrics = eventually("the traffic is counted", || async {
        let metrics = get(metrics_port, "/metrics").await?;
        let counted = [
            "spear_operator_status_write_total{kind=\"McpServer\"}",
            "spear_operator_webhook_admission_total{decision=\"skip\",reason=\"namespace_not_enabled\"}",
            "spear_operator_webhook_admission_total{decision=\"error\",reason=\"bad_request\"}",
            "spear_operator_webhook_tls_handshake_failures_total{reason=\"other\"}",
        ];
        if counted.iter().all(|series| sample(&metrics, series).is_some_and(|v| v > 0.0)) {
            Ok(metrics)
        } else {
            Err(metrics)
        }
    })
    .await;

    // --- the agent in a pod's mode (`spearlet run`), in process: its profile names a stdio
    // server it has no sidecar for, which only this mode reports (mcp_server_restart_required) ---
    ns.api::<McpServer>()
        .create(
            &Default::default(),
            &McpServer::test("late").stdio("npx", ["-y", "pkg"]).image("node:22").allowing(["*"]),
        )
        .await
        .expect("create the McpServer late");
    ns.api::<McpProfile>()
        .create(&Default::default(), &McpProfile::test("p").servers(["late"]))
        .await
        .expect("create the McpProfile");
    let socket_dir = tempfile::tempdir().expect("socket dir");
    let admin_addr = SocketAddr::from(([127, 0, 0, 1], free_port()));
    // The pod was admitted with no sidecar: `late` joined its profile later.
    let pod_config = run_config(control_plane, &ns.name, socket_dir.path(), admin_addr, Some(Vec::new()));
    let stop_pod_agent = CancellationToken::new();
    let pod_agent = tokio::spawn(run_in_pod(pod_config, stop_pod_agent.clone()));
    let pod_agent_metrics = eventually("the pod agent reports the missing sidecar", || async {
        let metrics = get(admin_addr.port(), "/metrics").await?;
        if sample(&metrics, "mcp_server_restart_required{server_id=\"late\"}") == Some(1.0) {
            Ok(metrics)
        } else {
            Err(metrics)
        }
    })
    .await;
    stop_pod_agent.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(20), pod_agent).await;

    // --- every name of every query is exported by one of them ---
    let mut agent_families = families(&agent_metrics);
    agent_families.extend(families(&pod_agent_metrics));
    let operator_families = families(&operator_metrics);
    let mut missing = BTreeSet::new();
    let mut named = BTreeSet::new();
    for (what, expr) in &queries {
        for name in metric_names(what, expr) {
            if !exported(&agent_families, &name) && !exported(&operator_families, &name) {
                missing.insert(format!("{what}: {name}"));
            }
            named.insert(name);
        }
    }
    assert!(
        missing.is_empty(),
        "queries name metrics neither binary exports:\n{}\nagent families: {agent_families:?}\noperator families: {operator_families:?}",
        missing.into_iter().collect::<Vec<_>>().join("\n")
    );
    // Every documented family is on the dashboard or in an alert (a new metric gets a panel).
    for (family, kind) in agent_families.iter().chain(&operator_families) {
        let queried = match kind.as_str() {
            "counter" => named.contains(&format!("{family}_total")),
            "histogram" => ["_bucket", "_sum", "_count"].iter().any(|s| named.contains(&format!("{family}{s}"))),
            _ => named.contains(family),
        };
        assert!(queried, "{family} ({kind}) is exported but no dashboard panel or alert reads it");
    }

    // The new series carry what the alerts read: the server's state, the certificate's expiry.
    assert_eq!(
        sample(&agent_metrics, "mcp_server_state{server_id=\"fx\",state=\"connected\"}"),
        Some(1.0),
        "{agent_metrics}"
    );
    assert_eq!(
        sample(&agent_metrics, "mcp_server_state{server_id=\"fx\",state=\"down\"}"),
        Some(0.0),
        "{agent_metrics}"
    );
    let served = ns.api::<Secret>().get(&secret_name).await.expect("the Secret").data.unwrap_or_default();
    let leaf_pem = &served.get(SECRET_TLS_CERT).expect("the Secret holds tls.crt").0;
    let (_, pem) = x509_parser::pem::parse_x509_pem(leaf_pem).expect("tls.crt is PEM");
    let leaf = pem.parse_x509().expect("tls.crt is a certificate");
    assert_eq!(
        sample(&operator_metrics, "spear_operator_webhook_certificate_expiry_timestamp_seconds"),
        Some(leaf.validity().not_after.timestamp() as f64),
        "the gauge is the served leaf's not-after:\n{operator_metrics}"
    );
}

#[test]
fn query_names_resolve_to_families_by_prometheus_suffix_rules() {
    let text = "# TYPE c counter\nc_total 1\n# TYPE h histogram\nh_bucket{le=\"1\"} 0\n# TYPE g gauge\ng 1\n";
    let families = families(text);
    for name in ["c_total", "h_bucket", "h_sum", "h_count", "g"] {
        assert!(exported(&families, name), "{name}");
    }
    for name in ["c", "h", "g_total", "h_total", "other"] {
        assert!(!exported(&families, name), "{name}");
    }
    assert_eq!(sample(text, "g"), Some(1.0));
    assert_eq!(sample(text, "h_bucket{le=\"1\"}"), Some(0.0));
    assert_eq!(sample(text, "missing"), None);
}
