//! End-to-end checks in real pods on a real cluster, given `KUBECONFIG`: the local one-node
//! cluster of `hack/e2e.sh` (CI), or kind, k3d, a cloud cluster (`e2e/README.md`).
//!
//! Without `KUBECONFIG` this binary prints that it skipped and exits 0, so `cargo test` stays
//! green on machines without a cluster.
//!
//! ```text
//! the previous release's chart and images (e2e/previous-release) ──▶ a pod injected under it
//! CRDs applied server-side, then helm upgrade --install (charts/spear-mcp, default values but the
//!   images, --wait) ──▶ that pod keeps its agent and serves (skew.rs)
//!   ├─ CRDs Established · caBundle filled · 2 operator replicas Ready, one Lease holder
//!   └─ namespace spear-e2e-* (mcp.spear.dev/injection=enabled)
//!        ├─ e2e-upstream pod (scripted OpenAI upstream: the one test double, for a hosted model)
//!        ├─ examples/registry applied (stdio servers on the local MCP server image) ──▶ Accepted
//!        ├─ invalid McpServer ──▶ refused by the API server, naming the field
//!        ├─ Deployment e2e-app (profile developer) ──▶ injected, Ready; its driver (PyPI mcp and
//!        │    openai clients) lists and calls tools through $SPEAR_MCP_URL, runs a chat tool loop,
//!        │    is refused a tool outside the profile, cannot reach the servers' sockets
//!        ├─ a person's grant (grant.rs): `auth login` in a pod stores it in a Secret, the
//!        │    injected agent reads it over TLS from the chart's trustBundle, renews, writes back
//!        ├─ McpServer edit ──▶ in the pod's tool list (timed) · a new stdio server ──▶ restart required
//!        ├─ a call needing approval waits on its McpApproval ──▶ `kubectl spear approve` ──▶ it runs
//!        ├─ faults: server process killed in its sidecar · agent container stopped ·
//!        │    operator scaled to 0 (annotated pods refused, other namespaces unaffected) and back ·
//!        │    both operator pods deleted (replaced, new leader, injection works)
//!        └─ pod deleted during a tool call ──▶ the call completes, sidecars stop after the app
//! ```
//!
//! The app container runs `e2e/app/driver.py`, which the test drives through the API server's pod
//! proxy: no `exec`, no route into the pod network. Faults inside the pod use ephemeral
//! containers (the app image's python3) that share the target container's PID namespace.
//! `SPEAR_E2E_MEASURE=1` adds the measurements of BENCHMARKS.md ("e2e in real pods").
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "the e2e run reports its steps and figures on stdout")]

mod gateway;
mod grant;
mod measure;
mod skew;
mod support;

use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, Result, bail, ensure};
use futures::{AsyncBufReadExt, TryStreamExt};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, LogParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use serde_json::{Value, json};
use spear::api::conditions::types::ACCEPTED;
use spear::api::keys::{
    AGENT_CONTAINER, ANNOTATION_PROFILE, ENV_MCP_URL, INIT_CONTAINER, INJECTION_ENABLED, LABEL_INJECTION,
    OPERATOR_LEASE, SIDECAR_PREFIX, WEBHOOK_CONFIGURATION,
};
use spear::api::manifest::{self, Object};
use spear::api::{McpProfile, McpServer, crd};
use support::{
    Report, eventually, helm, helm_run, image_values, is_ready, logs, proxy_text, ready_pod, repo, restarts,
    run_ephemeral, start_oauth_server_pod,
};

/// Image of spear-operator (`repository:tag` or `repository@sha256:...`), required.
const ENV_OPERATOR_IMAGE: &str = "SPEAR_E2E_OPERATOR_IMAGE";
/// Image of spearlet (the init container's and the agent's), required.
const ENV_SPEARLET_IMAGE: &str = "SPEAR_E2E_SPEARLET_IMAGE";
/// The app image (`e2e-app` in the Dockerfile: python3, PyPI mcp and openai, e2e/app), required.
const ENV_APP_IMAGE: &str = "SPEAR_E2E_APP_IMAGE";
/// The MCP server image (`mcp-servers` in the Dockerfile): the npm servers preinstalled. When set,
/// the examples' stdio servers run from it instead of `npx -y` in `node:20-alpine` (which
/// downloads the package at start, impossible on a cluster without network).
const ENV_MCP_SERVERS_IMAGE: &str = "SPEAR_E2E_MCP_SERVERS_IMAGE";
/// `1` keeps the release and the test namespaces.
const ENV_KEEP: &str = "SPEAR_E2E_KEEP";
/// `1` adds the measurements (pod start, memory, latency, propagation).
const ENV_MEASURE: &str = "SPEAR_E2E_MEASURE";

/// Release and namespace of the chart.
const RELEASE: &str = "spear-mcp";
const RELEASE_NAMESPACE: &str = "spear-system";
const OPERATOR_DEPLOYMENT: &str = "spear-operator";
/// The example profile the test pod uses, and the secret its chat upstream names.
const PROFILE: &str = "developer";
const UPSTREAM_SECRET: &str = "openai";
/// The stdio servers of that profile: one bridge sidecar each.
const STDIO_SERVERS: [&str; 2] = ["everything", "filesystem"];
/// The app's driver and the scripted upstream listen here (see e2e/app).
const DRIVER_PORT: u16 = 8080;
const UPSTREAM_PORT: u16 = 8000;
const ECHO: &str = "mcp__everything__echo";
const ECHO_MESSAGE: &str = "hello from spear e2e";
/// The tool the edit adds to `everything`'s allowedTools; also the long call of the shutdown check.
const LONG_TOOL: &str = "trigger-long-running-operation";

/// Rollout of the chart.
const INSTALL_TIMEOUT: &str = "5m";
/// The operator fills the caBundle once it has issued its certificate.
const CA_BUNDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Status is written by the elected leader, after its first reconcile.
const STATUS_TIMEOUT: Duration = Duration::from_secs(90);
/// Images are local; the agent's postStart hook allows 120 s for the first tool lists.
const POD_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The edit must reach the running pod within this (issue 14).
const EDIT_VISIBLE_WITHIN: Duration = Duration::from_secs(2);

fn main() -> std::process::ExitCode {
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("e2e: skipped: no KUBECONFIG set (hack/e2e.sh runs it on a local cluster; e2e/README.md)");
        return std::process::ExitCode::SUCCESS;
    }
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("e2e: cannot start a runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run()) {
        Ok(passed) => {
            println!("e2e: {passed} passed, 0 failed");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("e2e: FAILED: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn flag(name: &str) -> bool {
    std::env::var_os(name).is_some_and(|v| v == "1")
}

fn required(name: &str, what: &str) -> Result<String> {
    std::env::var(name)
        .with_context(|| format!("{name} must name {what} (hack/images.sh builds it; see e2e/README.md)"))
}

/// The images under test.
struct Images {
    operator: String,
    spearlet: String,
    app: String,
    mcp_servers: Option<String>,
}

async fn run() -> Result<usize> {
    let images = Images {
        operator: required(ENV_OPERATOR_IMAGE, "the spear-operator image")?,
        spearlet: required(ENV_SPEARLET_IMAGE, "the spearlet image")?,
        app: required(ENV_APP_IMAGE, "the e2e app image")?,
        mcp_servers: std::env::var(ENV_MCP_SERVERS_IMAGE).ok(),
    };
    let previous = skew::Previous::from_env()?;
    let helm = helm()?;
    let mut report = Report::new();
    let mut namespaces_made: Vec<String> = Vec::new();
    // The private CA of the grant step's servers; the chart's trustBundle holds it.
    let private_ca = spear::testing::test_ca::TestCa::new("spear-e2e-private");

    // Everything after the install attempt runs in here, so a failure anywhere still cleans up.
    let client = kube::Client::try_default().await.context("connecting with KUBECONFIG")?;
    let result = async {
        let started = match &previous {
            Some(previous) => Some(
                skew::start_under_previous(
                    &helm,
                    &client,
                    &images.app,
                    images.mcp_servers.as_deref(),
                    previous,
                    &mut namespaces_made,
                    &mut report,
                )
                .await?,
            ),
            None => {
                println!(
                    "e2e: no previous release given (SPEAR_E2E_PREVIOUS_*, hack/skew.sh): the upgrade check is skipped"
                );
                None
            }
        };
        if previous.is_some() {
            skew::upgrade_crds(&client, &mut report).await?;
        }
        grant::publish_trust_bundle(&client, &private_ca).await?;
        install(&helm, &images)?;
        report.ok("chart installed (helm --wait): operator Deployment rolled out");
        cluster_checks(&client, &mut report).await?;
        if let (Some(previous), Some(started)) = (&previous, &started) {
            skew::check_after_upgrade(&client, &images.operator, previous, started, &mut report).await?;
        }
        let ns = create_namespace(&client, "spear-e2e-", true).await?;
        namespaces_made.push(ns.clone());
        println!("e2e: working in namespace {ns}");
        let other = create_namespace(&client, "spear-e2e-plain-", false).await?;
        namespaces_made.push(other.clone());
        namespace_checks(&client, &images, &ns, &other, &private_ca, &mut report).await?;
        let gateway_ns = create_namespace(&client, "spear-e2e-gateway-", false).await?;
        namespaces_made.push(gateway_ns.clone());
        let install_gateway = || {
            let namespace = format!("gateway.namespace={gateway_ns}");
            install_with(&helm, &images, &["gateway.enabled=true", "gateway.replicas=1", &namespace])
        };
        gateway::gateway_checks(&client, &images, &gateway_ns, install_gateway, &mut report).await
    }
    .await;
    if result.is_err() {
        let mut looked_at = vec![RELEASE_NAMESPACE];
        looked_at.extend(namespaces_made.iter().map(String::as_str));
        support::diagnose(&client, &looked_at).await;
    }

    let namespaces: Api<Namespace> = Api::all(client.clone());
    if flag(ENV_KEEP) {
        println!("e2e: {ENV_KEEP}=1: keeping namespaces {namespaces_made:?} and release {RELEASE}");
    } else {
        for ns in &namespaces_made {
            if let Err(e) = namespaces.delete(ns, &DeleteParams::default()).await {
                eprintln!("e2e: warning: deleting namespace {ns}: {e}");
            }
        }
        if let Err(e) = helm_run(&helm, &["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait"]) {
            // The checks' outcome matters more than the cleanup's; say what is left behind.
            eprintln!("e2e: warning: uninstalling {RELEASE} failed: {e:#}");
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
        if let Err(e) = config_maps.delete(grant::TRUST_CONFIGMAP, &DeleteParams::default()).await {
            eprintln!("e2e: warning: deleting ConfigMap {}: {e}", grant::TRUST_CONFIGMAP);
        }
    }
    println!("e2e: steps and their times:");
    for (step, took) in &report.steps {
        println!("e2e:   {:>6.1} s  {step}", took.as_secs_f64());
    }
    result.map(|()| report.passed)
}

/// This tree's chart, with the grant step's private CA as its `trustBundle`.
fn install(helm: &std::path::Path, images: &Images) -> Result<()> {
    install_with(helm, images, &[])
}

/// [`install`] with `extra` values (`--set`).
fn install_with(helm: &std::path::Path, images: &Images, extra: &[&str]) -> Result<()> {
    let trust = format!("trustBundle.configMap={}", grant::TRUST_CONFIGMAP);
    let mut values = vec![trust.as_str()];
    values.extend_from_slice(extra);
    install_chart(helm, "charts/spear-mcp", &images.operator, &images.spearlet, &values)
}

/// `helm upgrade --install` of `chart` with these images, `values` (`--set`) and otherwise
/// default values.
fn install_chart(helm: &std::path::Path, chart: &str, operator: &str, spearlet: &str, values: &[&str]) -> Result<()> {
    let mut args: Vec<String> = [
        "upgrade",
        "--install",
        RELEASE,
        chart,
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait=watcher",
        "--timeout",
        INSTALL_TIMEOUT,
    ]
    .map(String::from)
    .to_vec();
    for value in image_values("operator.image", operator)
        .into_iter()
        .chain(image_values("spearlet.image", spearlet))
        .chain(values.iter().map(|v| (*v).to_string()))
    {
        args.extend(["--set".to_string(), value]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    println!("e2e: helm {}", args.join(" "));
    helm_run(helm, &args)
}

async fn create_namespace(client: &kube::Client, prefix: &str, injection: bool) -> Result<String> {
    let labels = injection.then(|| BTreeMap::from([(LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string())]));
    let namespace = Namespace {
        metadata: ObjectMeta { generate_name: Some(prefix.into()), labels, ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &namespace)
        .await?
        .metadata
        .name
        .context("namespace has a name")
}

// === the cluster-wide parts ===

async fn cluster_checks(client: &kube::Client, report: &mut Report) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for definition in crd::definitions() {
        let name = definition.metadata.name.clone().context("CRD has a name")?;
        tokio::time::timeout(
            Duration::from_secs(30),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .with_context(|| format!("{name} not Established within 30 s"))??;
    }
    report.ok("CRDs established");

    let webhooks: Api<MutatingWebhookConfiguration> = Api::all(client.clone());
    eventually("the operator fills the webhook caBundle", CA_BUNDLE_TIMEOUT, || async {
        let config = webhooks.get(WEBHOOK_CONFIGURATION).await?;
        let filled = config
            .webhooks
            .iter()
            .flatten()
            .all(|w| w.client_config.ca_bundle.as_ref().is_some_and(|b| !b.0.is_empty()));
        Ok((filled.then_some(()), "caBundle empty".to_string()))
    })
    .await?;
    report.ok("webhook caBundle filled by the operator (self-signed mode)");

    operator_ready(client, 2).await?;
    report.ok("operator: 2 replicas Ready, one of them holds the Lease");
    Ok(())
}

/// Waits for `replicas` Ready operator pods and a Lease held by one of them.
async fn operator_ready(client: &kube::Client, replicas: usize) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let leases: Api<Lease> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    eventually("operator pods Ready and one Lease holder", STATUS_TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels("app.kubernetes.io/component=operator")).await?;
        let ready: Vec<String> = list
            .items
            .iter()
            .filter(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name.clone())
            .collect();
        let holder = leases.get_opt(OPERATOR_LEASE).await?.and_then(|l| l.spec?.holder_identity);
        let held = holder.as_ref().is_some_and(|h| ready.iter().any(|p| h.starts_with(p.as_str())));
        let state = format!("ready {ready:?}, lease holder {holder:?}");
        Ok(((ready.len() == replicas && held).then_some(()), state))
    })
    .await
}

fn condition_status(conditions: Option<&Vec<Condition>>, kind: &str) -> Option<String> {
    conditions?.iter().find(|c| c.type_ == kind).map(|c| format!("{} ({}: {})", c.status, c.reason, c.message))
}

// === the namespace: registry, the injected pod, what it can do ===

/// The examples' stdio servers run `npx -y <package>@<version> <args>` in `node:20-alpine`; with
/// the local MCP server image they run the same package, preinstalled, from its `bin`
/// (`mcp-server-<name>`). The filesystem server serves `/` so the e2e can ask it, from inside its
/// sidecar, for the service-account token it must not have.
fn localize(server: &mut McpServer, image: &str) {
    let Some(stdio) = server.spec.stdio.as_mut() else { return };
    if stdio.command != "npx" {
        return;
    }
    let Some(index) = stdio.args.iter().position(|a| a.starts_with("@modelcontextprotocol/server-")) else {
        return;
    };
    let name = stdio.args[index]
        .trim_start_matches("@modelcontextprotocol/")
        .split('@')
        .next()
        .unwrap_or_default()
        .to_string();
    stdio.image = Some(image.to_string());
    stdio.command = format!("mcp-{name}");
    stdio.args = stdio.args[index + 1..].to_vec();
    if name == "server-filesystem" {
        stdio.args = vec!["/".to_string()];
    }
}

async fn namespace_checks(
    client: &kube::Client,
    images: &Images,
    ns: &str,
    other: &str,
    private_ca: &spear::testing::test_ca::TestCa,
    report: &mut Report,
) -> Result<()> {
    let servers: Api<McpServer> = Api::namespaced(client.clone(), ns);
    let profiles: Api<McpProfile> = Api::namespaced(client.clone(), ns);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);

    // The scripted upstream, and the Secret the profile's upstream names (granted to it).
    let api_key = format!("sk-e2e-{}", SystemTime::now().duration_since(UNIX_EPOCH)?.as_nanos());
    let secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": UPSTREAM_SECRET, "annotations": {"mcp.spear.dev/allowed-profiles": PROFILE}},
        "stringData": {"api-key": api_key},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await?;
    let upstream: Pod = serde_json::from_value(json!({
        "metadata": {"name": "e2e-upstream", "labels": {"app": "e2e-upstream"}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [{
                "name": "upstream", "image": images.app, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "/e2e/upstream.py"],
                "env": [{"name": "E2E_EXPECTED_KEY", "value": api_key}],
                "ports": [{"containerPort": UPSTREAM_PORT}],
                "readinessProbe": {"httpGet": {"path": "/healthz", "port": UPSTREAM_PORT}, "periodSeconds": 1},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
            }],
        },
    }))?;
    pods.create(&PostParams::default(), &upstream).await?;
    let upstream = ready_pod(&pods, "app=e2e-upstream", POD_READY_TIMEOUT).await?;
    let upstream_ip = upstream.status.and_then(|s| s.pod_ip).context("the upstream pod has an IP")?;
    report.ok(&format!("scripted upstream pod Ready at {upstream_ip}"));

    // 1. Every example is created and Accepted by the operator.
    let mut names = Vec::new();
    for entry in std::fs::read_dir(repo().join("examples/registry"))?.flatten() {
        let path = entry.path();
        if !manifest::is_manifest_file_name(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let parsed = manifest::parse(&std::fs::read_to_string(&path)?);
        ensure!(parsed.is_valid(), "{}: {:?}", path.display(), parsed.problems);
        for doc in parsed.documents {
            match doc.object {
                Object::Server(mut s) => {
                    if let Some(image) = &images.mcp_servers {
                        localize(&mut s, image);
                    }
                    names.push(("McpServer", servers.create(&PostParams::default(), &s).await?.metadata.name))
                }
                Object::Profile(mut p) => {
                    if let Some(upstream) = p.spec.chat.as_mut().and_then(|c| c.upstream.as_mut()) {
                        upstream.url = format!("http://{upstream_ip}:{UPSTREAM_PORT}/v1");
                    }
                    names.push(("McpProfile", profiles.create(&PostParams::default(), &p).await?.metadata.name))
                }
            }
        }
    }
    for (kind, name) in names {
        let name = name.context("created objects have names")?;
        eventually(&format!("{kind} {name} Accepted=True"), STATUS_TIMEOUT, || async {
            let accepted = match kind {
                "McpServer" => {
                    condition_status(servers.get_status(&name).await?.status.as_ref().map(|s| &s.conditions), ACCEPTED)
                }
                _ => {
                    condition_status(profiles.get_status(&name).await?.status.as_ref().map(|s| &s.conditions), ACCEPTED)
                }
            };
            let state = accepted.clone().unwrap_or_else(|| "no Accepted condition".into());
            Ok((accepted.filter(|s| s.starts_with("True")).map(drop), state))
        })
        .await?;
    }
    report.ok("examples/registry applied: every McpServer and McpProfile Accepted=True");

    // 2. An invalid server is refused by the API server, naming the field.
    let invalid = McpServer::test("broken").allowing(["*"]);
    match servers.create(&PostParams::default(), &invalid).await {
        Ok(_) => bail!("a stdio McpServer without spec.stdio was accepted"),
        Err(e) => ensure!(e.to_string().contains("spec.stdio"), "error does not name spec.stdio: {e}"),
    }
    report.ok("invalid McpServer refused by the API server, naming spec.stdio");

    // 3. An annotated Deployment is injected and its pod becomes Ready.
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments.create(&PostParams::default(), &app_deployment("e2e-app", &images.app)).await?;
    let pod = ready_pod(&pods, "app=e2e-app", POD_READY_TIMEOUT).await?;
    let spec = pod.spec.clone().context("a pod has a spec")?;
    let all: Vec<&str> =
        spec.init_containers.iter().flatten().chain(spec.containers.iter()).map(|c| c.name.as_str()).collect();
    let mut expected = vec![INIT_CONTAINER.to_string(), AGENT_CONTAINER.to_string()];
    expected.extend(STDIO_SERVERS.iter().map(|s| format!("{SIDECAR_PREFIX}{s}")));
    for name in &expected {
        ensure!(all.contains(&name.as_str()), "the pod lacks container {name}: it has {all:?}");
    }
    let app = spec.containers.iter().find(|c| c.name == "app").context("the app container")?;
    ensure!(app.env.iter().flatten().any(|e| e.name == ENV_MCP_URL), "the app container lacks {ENV_MCP_URL}");
    report.ok(&format!("pod injected ({}) and Ready", expected.join(", ")));
    let pod_name = pod.metadata.name.clone().context("a pod has a name")?;

    // 4. From the app container: list, call, a refused tool, a chat tool loop.
    let driver = Driver { client: client.clone(), ns: ns.to_string(), pod: pod_name.clone() };
    let tools = driver.tools().await?;
    for name in [ECHO, "mcp__everything__get-sum", "mcp__filesystem__read_text_file"] {
        ensure!(tools.iter().any(|t| t == name), "{name} not listed to the app: {tools:?}");
    }
    for name in ["mcp__filesystem__move_file", "mcp__everything__trigger-long-running-operation"] {
        ensure!(!tools.iter().any(|t| t == name), "{name} (outside the profile) listed: {tools:?}");
    }
    report.ok(&format!("the app lists {} tools through $SPEAR_MCP_URL (PyPI mcp client)", tools.len()));

    let echo = driver.call(ECHO, &json!({"message": ECHO_MESSAGE})).await?;
    ensure!(
        echo["is_error"] == false && echo["text"].as_str().is_some_and(|t| t.contains(ECHO_MESSAGE)),
        "echo through the agent: {echo}"
    );
    report.ok("mcp__everything__echo called from the app container through $SPEAR_MCP_URL");

    let refused = driver.call("mcp__filesystem__move_file", &json!({"source": "/a", "destination": "/b"})).await?;
    ensure!(refused["is_error"] == true, "a denied tool was called: {refused}");
    report.ok(&format!("a tool outside the profile is refused: {}", refused["text"]));

    let chat = driver.get("/chat", &[("content", ECHO_MESSAGE)]).await?;
    let content = chat["content"].as_str().unwrap_or_default();
    ensure!(content.contains("the tool said") && content.contains(ECHO_MESSAGE), "the chat loop's answer: {chat}");
    let upstream_log = logs(&pods, "e2e-upstream", "upstream", false).await?;
    let rounds = upstream_log.lines().filter(|l| l.starts_with("{\"round\"")).count();
    ensure!(rounds >= 2, "the upstream saw {rounds} rounds:\n{upstream_log}");
    report.ok(&format!(
        "chat door: a tool loop of {rounds} upstream rounds against the in-cluster upstream (PyPI openai client)"
    ));

    // 5. The isolation the security model promises, observed in the pod.
    let probe = driver.get("/probe", &[]).await?;
    ensure!(
        probe["spear_paths"].as_array().is_some_and(Vec::is_empty),
        "the app container sees the agent's or the servers' files: {probe}"
    );
    // The doors are on the pod's loopback, which its MCP server sidecars share: without the
    // pod's key (the app's, never a sidecar's) they answer 401.
    let nokey = driver.get("/nokey", &[]).await?;
    ensure!(nokey == json!({"mcp": 401, "chat": 401}), "the doors answered a caller without the pod's key: {nokey}");
    let token = driver
        .call(
            "mcp__filesystem__read_text_file",
            &json!({"path": "/var/run/secrets/kubernetes.io/serviceaccount/token"}),
        )
        .await?;
    ensure!(
        token["is_error"] == true
            && token["text"].as_str().is_some_and(|t| t.contains("ENOENT") || t.contains("no such file")),
        "the filesystem server's sidecar has a service-account token (or the probe is vacuous): {token}"
    );
    rbac_checks(client, ns, other).await?;
    report.ok("isolation: the app sees no socket; the doors refuse callers without the pod's key; server sidecars have no token; the agent's RBAC reads McpServers in its namespace only");

    // 6. An McpServer edit reaches the running pod without a restart.
    let long_tool = format!("mcp__everything__{LONG_TOOL}");
    let watcher = {
        let driver = driver.clone();
        let long_tool = long_tool.clone();
        tokio::spawn(async move { driver.get("/watch", &[("name", &long_tool), ("timeout", "30")]).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut everything = servers.get("everything").await?;
    everything.spec.allowed_tools.push(LONG_TOOL.to_string());
    let edited_at = Instant::now();
    servers
        .patch(
            "everything",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"allowedTools": everything.spec.allowed_tools}})),
        )
        .await?;
    let seen = watcher.await??;
    let visible = edited_at.elapsed();
    ensure!(seen.get("seen_after_ms").is_some(), "the edit never reached the pod: {seen}");
    ensure!(visible <= EDIT_VISIBLE_WITHIN + Duration::from_secs(1), "edit visible after {visible:?}");
    ensure!(restarts(&pods.get(&pod_name).await?, AGENT_CONTAINER) == 0, "the agent restarted for an edit");
    report.ok(&format!(
        "McpServer edit in the pod's tool list {} ms after the PATCH returned, no restart",
        visible.as_millis()
    ));

    // 6b. `kubectl spear explain --pod --connect`: the real kubectl finds the plugin on PATH and
    // the plugin reaches the agent's loopback-only /debug/effective through a port-forward.
    let explained = kubectl_spear_explain(ns, &pod_name).await?;
    report.ok(&format!(
        "kubectl spear explain --pod --connect: pod on the cluster's revision {}, {} tools live, {} tool-level exclusions",
        explained.0, explained.1, explained.2
    ));

    // 7. A stdio server the profile gains after the pod started needs a restart: metric and log.
    let mut extra = servers.get("everything").await?;
    extra.metadata = ObjectMeta { name: Some("everything-late".into()), ..Default::default() };
    extra.status = None;
    servers.create(&PostParams::default(), &extra).await?;
    profiles
        .patch(
            PROFILE,
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"servers": ["filesystem", "everything", "everything-http", "everything-late"]}}),
            ),
        )
        .await?;
    eventually("mcp_server_restart_required for everything-late", Duration::from_secs(20), || async {
        let metrics = driver.agent_metrics().await?;
        let line = metrics
            .lines()
            .find(|l| l.starts_with("mcp_server_restart_required") && l.contains("everything-late"))
            .map(str::to_string);
        Ok((line.filter(|l| l.ends_with(" 1")), "no such series yet".into()))
    })
    .await?;
    let agent_log = logs(&pods, &pod_name, AGENT_CONTAINER, false).await?;
    ensure!(
        agent_log.lines().any(|l| l.contains("everything-late") && l.contains("restart")),
        "the agent's log does not say everything-late needs a restart"
    );
    report.ok("a new stdio server in the profile: mcp_server_restart_required 1 and a log line");

    if flag(ENV_MEASURE) {
        measure::all(client, &driver, images, ns, other, report).await?;
        report.ok("measurements (SPEAR_E2E_MEASURE=1)");
    }

    // 8. The pod's identity as the credential of a remote server.
    identity_checks(client, images, ns, report).await?;

    // 8a. A person's grant in a Secret, read by the agent over TLS from a private CA.
    grant::grant_checks(client, images, private_ca, ns, report).await?;

    // 8b. A call that waits for a person: an McpApproval decided with `kubectl spear approve`.
    approval_checks(client, &driver, ns, report).await?;

    // 9. Faults in the pod.
    fault_checks(&driver, &pods, images, report).await?;
    operator_outage(client, &images.app, ns, other, report).await?;

    // 10. Pod deletion during a call: the call completes, sidecars stop after the app.
    graceful_delete(&driver, &pods, &long_tool, report).await?;
    Ok(())
}

/// The kubernetes approver in a real pod: `echo` of `everything` needs approval and the profile's
/// approver is `kubernetes: {}`; the app's call waits on the McpApproval its agent created (with
/// the agent role's own RBAC) until `kubectl spear approve` decides it (the chart's admission
/// policy checks the decider). Both edits are undone afterwards.
async fn approval_checks(client: &kube::Client, driver: &Driver, ns: &str, report: &mut Report) -> Result<()> {
    let servers: Api<McpServer> = Api::namespaced(client.clone(), ns);
    let profiles: Api<McpProfile> = Api::namespaced(client.clone(), ns);
    let approvals: Api<spear::api::McpApproval> = Api::namespaced(client.clone(), ns);
    let merge = |value: Value| Patch::Merge(value);
    servers
        .patch(
            "everything",
            &PatchParams::default(),
            &merge(json!({"spec": {"approvalPolicy": {"tools": {"echo": "always"}}}})),
        )
        .await?;
    profiles
        .patch(
            PROFILE,
            &PatchParams::default(),
            &merge(json!({"spec": {"approval": {"approvers": [{"kubernetes": {}}]}}})),
        )
        .await?;
    let started = Instant::now();
    // Until the agent has both edits, a call may still run without asking: try again.
    let (name, answer) = eventually("a call waiting on an McpApproval", Duration::from_secs(60), || async {
        let waiting = {
            let driver = driver.clone();
            tokio::spawn(async move { driver.call(ECHO, &json!({"message": "approve me"})).await })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let listed = approvals.list(&ListParams::default()).await?;
            let open = listed.items.iter().find(|a| a.status.as_ref().and_then(|s| s.decision).is_none());
            if let Some(asked) = open {
                let name = asked.metadata.name.clone().context("a name")?;
                kubectl_plugin(&["spear", "approve", &name, "-n", ns, "--reason", "e2e"]).await?;
                let answer = waiting.await??;
                return Ok((Some((name, answer)), "decided".into()));
            }
            if waiting.is_finished() || Instant::now() > deadline {
                waiting.abort();
                return Ok((None, "no McpApproval yet".into()));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    })
    .await?;
    ensure!(
        answer["is_error"] == false && answer["text"].as_str().is_some_and(|t| t.contains("approve me")),
        "the approved call: {answer}"
    );
    let decided = approvals.get(&name).await?;
    let by = decided.status.and_then(|s| s.decided_by).unwrap_or_default();
    ensure!(!by.is_empty(), "the McpApproval names its decider");
    servers.patch("everything", &PatchParams::default(), &merge(json!({"spec": {"approvalPolicy": null}}))).await?;
    profiles.patch(PROFILE, &PatchParams::default(), &merge(json!({"spec": {"approval": null}}))).await?;
    report.ok(&format!(
        "a call waited on McpApproval {name} and ran once `kubectl spear approve` decided it (decidedBy {by}; {:.1} s from the edit)",
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}

/// Runs `kubectl ARGS` (`$SPEAR_CLUSTER_KUBECTL`, else `kubectl`) with a `kubectl-spear` link to
/// the spearlet first on PATH; its stdout.
async fn kubectl_plugin(args: &[&str]) -> Result<String> {
    let kubectl = std::env::var("SPEAR_CLUSTER_KUBECTL").unwrap_or_else(|_| "kubectl".into());
    let plugins = tempfile::tempdir()?;
    std::os::unix::fs::symlink(
        env!("CARGO_BIN_EXE_spearlet"),
        plugins.path().join(spear::cli::spearlet::KUBECTL_PLUGIN),
    )?;
    let path = std::env::join_paths(
        std::iter::once(plugins.path().to_path_buf())
            .chain(std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())),
    )?;
    let out = tokio::process::Command::new(&kubectl).args(args).env("PATH", &path).output().await?;
    ensure!(
        out.status.success(),
        "kubectl {}: exit {:?}: {}",
        args.join(" "),
        out.status.code(),
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `http.auth.serviceAccountToken` in a real pod: a remote MCP server (tests/servers/oauth_server.py
/// in its own pod) that trusts the cluster's issuer, checking tokens against the cluster's JWKS
/// (read here from the API server, given to it in a ConfigMap) and audience. The webhook projects
/// the token, the kubelet mounts it into the agent only, the agent sends it: the server sees the
/// pod's service account.
async fn identity_checks(client: &kube::Client, images: &Images, ns: &str, report: &mut Report) -> Result<()> {
    const PORT: u16 = 8090;
    const AUDIENCE: &str = "spear-e2e-identity";
    let get =
        |path: &str| -> Result<axum::http::Request<Vec<u8>>> { Ok(axum::http::Request::get(path).body(Vec::new())?) };
    let discovery: Value =
        serde_json::from_str(&client.request_text(get("/.well-known/openid-configuration")?).await?)?;
    let issuer = discovery["issuer"].as_str().context("the cluster's OIDC discovery names an issuer")?.to_string();
    let jwks = client.request_text(get("/openid/v1/jwks")?).await?;
    let config_map: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "e2e-jwks"}, "data": {"jwks.json": jwks}}))?;
    Api::<ConfigMap>::namespaced(client.clone(), ns).create(&PostParams::default(), &config_map).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let args = ["--client-secret", "unused", "--jwks", "/jwks/jwks.json", "--sa-issuer", &issuer];
    let mut args: Vec<String> = args.map(String::from).to_vec();
    args.extend(["--sa-direct-audience".to_string(), AUDIENCE.to_string()]);
    let volume = json!({"name": "jwks", "configMap": {"name": "e2e-jwks"}});
    let ip = start_oauth_server_pod(&pods, "e2e-identity", &images.app, (PORT, false), &args, volume).await?;

    let mcp_server: McpServer = serde_json::from_value(json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "identity"},
        "spec": {"transport": "streamableHttp",
                 "http": {"url": format!("http://{ip}:{PORT}/mcp"), "auth": {"serviceAccountToken": {"audience": AUDIENCE}}},
                 "allowedTools": ["*"]},
    }))?;
    Api::<McpServer>::namespaced(client.clone(), ns).create(&PostParams::default(), &mcp_server).await?;
    let profile: McpProfile = serde_json::from_value(json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfile", "metadata": {"name": "identity"},
        "spec": {"servers": ["identity"], "identity": {"servers": ["identity"], "audiences": [AUDIENCE]}},
    }))?;
    Api::<McpProfile>::namespaced(client.clone(), ns).create(&PostParams::default(), &profile).await?;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    deployments.create(&PostParams::default(), &app_deployment_of("e2e-identity-app", &images.app, "identity")).await?;
    let pod = ready_pod(&pods, "app=e2e-identity-app", POD_READY_TIMEOUT).await?;
    let spec = pod.spec.clone().context("a pod has a spec")?;
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let mounted = c.volume_mounts.iter().flatten().any(|m| m.name == "spear-auth-tokens");
        ensure!(mounted == (c.name == AGENT_CONTAINER), "container {} and the token volume: mounted {mounted}", c.name);
    }
    let driver =
        Driver { client: client.clone(), ns: ns.to_string(), pod: pod.metadata.name.clone().context("a name")? };
    let answer = driver.call("mcp__identity__whoami", &json!({})).await?;
    let subject = format!("system:serviceaccount:{ns}:default");
    ensure!(
        answer["is_error"] == false && answer["text"].as_str().is_some_and(|t| t.contains(&subject)),
        "the server did not see the pod's service account: {answer}"
    );
    report.ok(&format!(
        "http.auth.serviceAccountToken: the kubelet's projected token (audience {AUDIENCE}, agent only) reaches a server that checks it against the cluster's JWKS: it sees {subject}"
    ));
    Ok(())
}

/// Runs `kubectl spear explain -n NS --pod POD --connect -o json` with a `kubectl-spear` link to
/// the spearlet on PATH (`$SPEAR_CLUSTER_KUBECTL`, else `kubectl`), until the pod is on the
/// cluster's revision; checks the live, tool-level answer and the table's revision line. Returns
/// the revision, the number of live tools and of tool-level exclusions.
async fn kubectl_spear_explain(ns: &str, pod: &str) -> Result<(String, usize, usize)> {
    let explained: Value = eventually("the pod on the cluster's revision", Duration::from_secs(20), || async move {
        let text = kubectl_plugin(&["spear", "explain", "-n", ns, "--pod", pod, "--connect", "-o", "json"]).await?;
        let explained: Value = serde_json::from_str(&text).context("kubectl spear explain -o json")?;
        let state = explained["revisions"].to_string();
        Ok((explained["revisions"]["inSync"].as_bool().unwrap_or_default().then_some(explained), state))
    })
    .await?;
    ensure!(
        explained["pod"]["injected"] == true && explained["profile"] == PROFILE,
        "the pod part: {}",
        explained["pod"]
    );
    let live = &explained["live"];
    ensure!(live["toolsListed"] == true, "the agent has its tool lists by now: {live}");
    let tools: Vec<&str> = live["servers"]
        .as_array()
        .into_iter()
        .flatten()
        .flat_map(|s| s["tools"].as_array().into_iter().flatten())
        .filter_map(|t| t["name"].as_str())
        .collect();
    ensure!(tools.contains(&ECHO), "{ECHO} not in the live set: {tools:?}");
    let tool_level: Vec<&Value> =
        live["excluded"].as_array().into_iter().flatten().filter(|d| d["tool"].is_string()).collect();
    ensure!(
        tool_level.iter().any(|d| d["server"] == "filesystem" && d["tool"] == "move_file"),
        "move_file's exclusion is not in the live decision log: {}",
        live["excluded"]
    );
    let revision = explained["revisions"]["cluster"].as_str().unwrap_or_default().to_string();
    let table = kubectl_plugin(&["spear", "explain", "-n", ns, "--pod", pod, "--connect"]).await?;
    ensure!(
        table.contains(&format!("pod on registry revision {revision}, cluster at {revision}: in sync")),
        "the table's revision line:\n{table}"
    );
    Ok((revision, tools.len(), tool_level.len()))
}

fn app_deployment(name: &str, image: &str) -> Deployment {
    app_deployment_of(name, image, PROFILE)
}

/// [`app_deployment`] annotated with `profile`.
fn app_deployment_of(name: &str, image: &str, profile: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}, "annotations": {ANNOTATION_PROFILE: profile}},
                "spec": {
                    "terminationGracePeriodSeconds": 30,
                    "containers": [{
                        "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "/e2e/driver.py"],
                        "ports": [{"containerPort": DRIVER_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": DRIVER_PORT}, "periodSeconds": 1},
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
                    }],
                },
            },
        },
    }))
    .expect("a static Deployment literal deserializes")
}

/// The app's driver (e2e/app/driver.py) in one pod, through the API server's pod proxy.
#[derive(Clone)]
struct Driver {
    client: kube::Client,
    ns: String,
    pod: String,
}

impl Driver {
    async fn get(&self, path: &str, query: &[(&str, &str)]) -> Result<Value> {
        let text = proxy_text(&self.client, &self.ns, &self.pod, DRIVER_PORT, path, query).await?;
        serde_json::from_str(&text).with_context(|| format!("{path} answered no JSON: {text}"))
    }

    async fn tools(&self) -> Result<Vec<String>> {
        let listed = self.get("/tools", &[]).await?;
        Ok(listed["names"].as_array().into_iter().flatten().filter_map(|n| n.as_str().map(String::from)).collect())
    }

    async fn call(&self, name: &str, args: &Value) -> Result<Value> {
        self.get("/call", &[("name", name), ("args", &args.to_string())]).await
    }

    /// The agent's Prometheus text, from its admin port.
    async fn agent_metrics(&self) -> Result<String> {
        proxy_text(&self.client, &self.ns, &self.pod, spear::operator::inject::Ports::default().admin, "/metrics", &[])
            .await
    }
}

/// The agent's ServiceAccount (the pod's `default`) may read McpServers in its namespace only.
async fn rbac_checks(client: &kube::Client, ns: &str, other: &str) -> Result<()> {
    let reviews: Api<SubjectAccessReview> = Api::all(client.clone());
    let user = format!("system:serviceaccount:{ns}:default");
    let cases = [
        (ns, "mcp.spear.dev", "mcpservers", "list", true),
        (ns, "mcp.spear.dev", "mcpprofiles", "watch", true),
        (ns, "mcp.spear.dev", "mcpservers", "update", false),
        (ns, "", "secrets", "get", false),
        (ns, "", "pods", "list", false),
        (other, "mcp.spear.dev", "mcpservers", "list", false),
    ];
    for (namespace, group, resource, verb, expected) in cases {
        let review: SubjectAccessReview = serde_json::from_value(json!({
            "spec": {
                "user": user,
                "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{ns}"), "system:authenticated"],
                "resourceAttributes": {"namespace": namespace, "group": group, "resource": resource, "verb": verb},
            }
        }))?;
        let allowed = reviews.create(&PostParams::default(), &review).await?.status.is_some_and(|s| s.allowed);
        ensure!(
            allowed == expected,
            "{user} {verb} {group}/{resource} in {namespace}: allowed={allowed}, expected {expected}"
        );
    }
    Ok(())
}

/// Kills the server process inside its sidecar (the bridge restarts it) and stops the agent
/// container (the kubelet restarts it); tools work again after each.
async fn fault_checks(driver: &Driver, pods: &Api<Pod>, images: &Images, report: &mut Report) -> Result<()> {
    let sidecar = format!("{SIDECAR_PREFIX}everything");
    let uid = sidecar_uid(&pods.get(&driver.pod).await?, &sidecar)?;
    let out = run_ephemeral(
        pods,
        &driver.pod,
        &sidecar,
        "e2e-kill-server",
        &images.app,
        uid,
        &["python3", "-c", KILL_SERVER_SCRIPT],
    )
    .await?;
    ensure!(out.contains("killed"), "no server process found in {sidecar}: {out}");
    let started = Instant::now();
    let echo = eventually("echo after the server was killed", Duration::from_secs(30), || async {
        let r = driver.call(ECHO, &json!({"message": ECHO_MESSAGE})).await?;
        Ok(((r["is_error"] == false).then_some(()), r.to_string()))
    })
    .await;
    echo?;
    ensure!(
        restarts(&pods.get(&driver.pod).await?, &sidecar) == 0,
        "the sidecar container restarted; the bridge should have"
    );
    report.ok(&format!(
        "server process killed in its sidecar ({}): echo works again after {} ms, container not restarted",
        out.trim(),
        started.elapsed().as_millis()
    ));

    let before = restarts(&pods.get(&driver.pod).await?, AGENT_CONTAINER);
    let out = run_ephemeral(
        pods,
        &driver.pod,
        AGENT_CONTAINER,
        "e2e-stop-agent",
        &images.app,
        65532,
        &["python3", "-c", "import os, signal; os.kill(1, signal.SIGTERM); print('sent SIGTERM to the agent')"],
    )
    .await?;
    let started = Instant::now();
    eventually("the agent restarted and Ready", Duration::from_secs(120), || async {
        let pod = pods.get(&driver.pod).await?;
        let restarted = restarts(&pod, AGENT_CONTAINER) > before && is_ready(&pod);
        Ok((restarted.then_some(()), support::pod_state(&pod)))
    })
    .await?;
    let tools = eventually("tools back after the agent restart", Duration::from_secs(60), || async {
        let tools = driver.tools().await.unwrap_or_default();
        Ok((tools.iter().any(|t| t == ECHO).then_some(tools.len()), format!("{} tools", tools.len())))
    })
    .await?;
    report.ok(&format!(
        "agent container stopped ({}): restarted by the kubelet, {tools} tools back after {} ms",
        out.trim(),
        started.elapsed().as_millis()
    ));
    Ok(())
}

/// Finds the server's node process (not the bridge, PID 1) and SIGKILLs it.
const KILL_SERVER_SCRIPT: &str = r#"
import os, signal
for pid in os.listdir('/proc'):
    if not pid.isdigit() or int(pid) in (1, os.getpid()):
        continue
    try:
        cmd = open(f'/proc/{pid}/cmdline', 'rb').read().replace(b'\0', b' ').decode()
    except OSError:
        continue
    if 'server-everything' in cmd:
        os.kill(int(pid), signal.SIGKILL)
        print(f'killed pid {pid}: {cmd.strip()}')
"#;

fn sidecar_uid(pod: &Pod, container: &str) -> Result<i64> {
    let spec = pod.spec.as_ref().context("a pod has a spec")?;
    spec.init_containers
        .iter()
        .flatten()
        .chain(spec.containers.iter())
        .find(|c| c.name == container)
        .and_then(|c| c.security_context.as_ref()?.run_as_user)
        .with_context(|| format!("{container} has no runAsUser"))
}

/// With no operator pod, annotated pods in enabled namespaces are refused (failurePolicy Fail)
/// with a message naming the webhook; pods elsewhere are created; injection resumes after.
async fn operator_outage(
    client: &kube::Client,
    app_image: &str,
    ns: &str,
    other: &str,
    report: &mut Report,
) -> Result<()> {
    scale_operator(client, 0).await?;
    let operator_pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    eventually("operator pods gone", Duration::from_secs(60), || async {
        let n = operator_pods
            .list(&ListParams::default().labels("app.kubernetes.io/component=operator"))
            .await?
            .items
            .len();
        Ok(((n == 0).then_some(()), format!("{n} pods")))
    })
    .await?;
    let annotated = |name: &str| -> Result<Pod> {
        Ok(serde_json::from_value(json!({
            "metadata": {"name": name, "annotations": {ANNOTATION_PROFILE: PROFILE}},
            "spec": {"containers": [{"name": "app", "image": app_image, "command": ["python3", "-c", "import time; time.sleep(3600)"]}]},
        }))?)
    };
    let refused =
        Api::<Pod>::namespaced(client.clone(), ns).create(&PostParams::default(), &annotated("e2e-outage")?).await;
    let message = match refused {
        Ok(_) => bail!("an annotated pod was created in an enabled namespace with no operator running"),
        Err(kube::Error::Api(status)) => status.message,
        Err(e) => bail!("creating the annotated pod failed otherwise than by a refusal: {e}"),
    };
    ensure!(message.contains("inject.mcp.spear.dev"), "the refusal does not name the webhook: {message}");
    Api::<Pod>::namespaced(client.clone(), other)
        .create(&PostParams::default(), &annotated("e2e-outage")?)
        .await
        .context("a pod in a namespace without injection must not depend on the operator")?;
    report.ok(&format!("operator scaled to 0: annotated pod refused ({message}); other namespace unaffected"));

    scale_operator(client, 2).await?;
    operator_ready(client, 2).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let created = eventually("injection resumes", Duration::from_secs(60), || async {
        match pods.create(&PostParams::default(), &annotated("e2e-resumed")?).await {
            Ok(pod) => Ok((Some(pod), "created".into())),
            Err(e) => Ok((None, e.to_string())),
        }
    })
    .await?;
    let injected =
        created.spec.iter().flat_map(|s| s.init_containers.iter().flatten()).any(|c| c.name == AGENT_CONTAINER);
    ensure!(injected, "the pod created after the operator returned was not injected");
    report.ok("operator back (2 replicas, one leader): injection resumes");

    // Both operator pods deleted at once: the Deployment replaces them, one of the new pods takes
    // the Lease (the old holder's expires), and injection works again.
    let started = Instant::now();
    operator_pods
        .delete_collection(
            &DeleteParams::default(),
            &ListParams::default().labels("app.kubernetes.io/component=operator"),
        )
        .await?;
    operator_ready(client, 2).await?;
    let after = pods.create(&PostParams::default(), &annotated("e2e-after-delete")?).await?;
    let injected =
        after.spec.iter().flat_map(|s| s.init_containers.iter().flatten()).any(|c| c.name == AGENT_CONTAINER);
    ensure!(injected, "the pod created after both operator pods were replaced was not injected");
    report.ok(&format!(
        "both operator pods deleted: replaced, a new Lease holder and injection after {} ms",
        started.elapsed().as_millis()
    ));
    Ok(())
}

async fn scale_operator(client: &kube::Client, replicas: i32) -> Result<()> {
    let operators: Api<Deployment> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    let patch = Patch::Merge(json!({"spec": {"replicas": replicas}}));
    operators.patch(OPERATOR_DEPLOYMENT, &PatchParams::default(), &patch).await?;
    Ok(())
}

/// Deletes the app pod while a 3-second tool call is in flight: the call's answer arrives, the
/// app stops before the sidecars, and the agent logs no error.
async fn graceful_delete(driver: &Driver, pods: &Api<Pod>, long_tool: &str, report: &mut Report) -> Result<()> {
    let call = {
        let driver = driver.clone();
        let long_tool = long_tool.to_string();
        tokio::spawn(async move { driver.call(&long_tool, &json!({"duration": 3, "steps": 3})).await })
    };
    // The agent's log, followed until its container stops: the lines of the shutdown included.
    let follower = {
        let params = LogParams { container: Some(AGENT_CONTAINER.into()), follow: true, ..LogParams::default() };
        let stream = pods.log_stream(&driver.pod, &params).await?;
        tokio::spawn(async move {
            let mut text = String::new();
            let mut lines = stream.lines();
            while let Some(line) = lines.try_next().await? {
                text.push_str(&line);
                text.push('\n');
            }
            anyhow::Ok(text)
        })
    };
    tokio::time::sleep(Duration::from_millis(1000)).await;
    pods.delete(&driver.pod, &DeleteParams::default()).await?;
    let answer = call.await??;
    ensure!(answer["is_error"] == false, "the in-flight call failed during shutdown: {answer}");
    // Watch the terminating pod's statuses until it is gone, keeping the last seen.
    let mut last: Option<Pod> = None;
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        match pods.get_opt(&driver.pod).await? {
            Some(p) => last = Some(p),
            None => break,
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let agent_log = follower.await??;
    ensure!(
        agent_log.contains("shutting down") && agent_log.contains("spearlet stopped"),
        "the agent's log of the shutdown was not captured (or it did not stop in order):\n{agent_log}"
    );
    let errors: Vec<&str> =
        agent_log.lines().filter(|l| l.contains("ERROR") || l.contains("\"level\":\"error\"")).collect();
    ensure!(errors.is_empty(), "the agent logged errors while the pod stopped:\n{}", errors.join("\n"));
    let order = last.as_ref().map(termination_order).unwrap_or_default();
    if let Some((app_done, _)) = order.iter().find(|(_, name)| name == "app") {
        let early: Vec<&String> =
            order.iter().filter(|(done, name)| name != "app" && done < app_done).map(|(_, name)| name).collect();
        ensure!(early.is_empty(), "{early:?} stopped before the app: {order:?}");
    }
    report.ok(&format!(
        "pod deleted during a 3 s call: the call completed, stop order {order:?}, no error in the agent's log"
    ));
    Ok(())
}

/// (finishedAt, container) of every terminated container but the init copy, in order.
fn termination_order(pod: &Pod) -> Vec<(String, String)> {
    let status = pod.status.clone().unwrap_or_default();
    let mut finished: Vec<(String, String)> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter(|c| c.name != INIT_CONTAINER)
        .filter_map(|c| {
            let t = c.state.as_ref()?.terminated.as_ref()?;
            Some((t.finished_at.as_ref()?.0.to_string(), c.name.clone()))
        })
        .collect();
    finished.sort();
    finished
}
