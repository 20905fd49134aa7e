//! End-to-end checks against a real cluster (kind, k3d, a cloud cluster), given `KUBECONFIG`.
//!
//! Without `KUBECONFIG` this binary prints that it skipped and exits 0, so `cargo test` stays
//! green on machines without a cluster. How to run it on kind: `e2e/README.md`.
//!
//! ```text
//! helm upgrade --install (charts/spear-mcp, images from SPEAR_E2E_*_IMAGE, --wait)
//!   ├─ CRDs Established · webhook caBundle filled by the operator (self-signed mode)
//!   └─ namespace spear-e2e-* (mcp.spear.dev/injection=enabled)
//!        ├─ examples/registry applied ──▶ every McpServer/McpProfile Accepted=True
//!        ├─ invalid McpServer ──▶ refused by the API server, naming the field
//!        └─ Deployment (mcp.spear.dev/profile: developer) ──▶ pod Ready with spear-init, the
//!           spearlet agent and one bridge sidecar per stdio server; its app container calls
//!           mcp__everything__echo through $SPEAR_MCP_URL and logs the answer
//! ```
//!
//! Only `helm` is shelled out to (built by `hack/helm.sh`, or `$SPEAR_HELM`); everything else
//! goes through the Kubernetes API with `kube`. The test namespace is deleted at the end and the
//! release uninstalled, unless `SPEAR_E2E_KEEP=1` (to look around after a failure).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::admissionregistration::v1::MutatingWebhookConfiguration;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::api::{Api, DeleteParams, ListParams, LogParams, ObjectMeta, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use spear::api::conditions::types::ACCEPTED;
use spear::api::keys::{
    AGENT_CONTAINER, ANNOTATION_PROFILE, ENV_MCP_URL, INIT_CONTAINER, INJECTION_ENABLED, LABEL_INJECTION,
    SIDECAR_PREFIX, WEBHOOK_CONFIGURATION,
};
use spear::api::manifest::{self, Object};
use spear::api::{McpProfile, McpServer, crd};

/// Image of spear-operator (`repository:tag` or `repository@sha256:...`), required.
const ENV_OPERATOR_IMAGE: &str = "SPEAR_E2E_OPERATOR_IMAGE";
/// Image of spearlet (the init container's and the agent's), required.
const ENV_SPEARLET_IMAGE: &str = "SPEAR_E2E_SPEARLET_IMAGE";
/// Image of the app container that calls a tool; it needs `sh` and `curl`.
const ENV_CURL_IMAGE: &str = "SPEAR_E2E_CURL_IMAGE";
const DEFAULT_CURL_IMAGE: &str = "curlimages/curl:8.11.1";
/// `1` keeps the release and the test namespace.
const ENV_KEEP: &str = "SPEAR_E2E_KEEP";

/// Release and namespace of the chart.
const RELEASE: &str = "spear-mcp";
const RELEASE_NAMESPACE: &str = "spear-system";
/// The example profile the test pod uses, and the secret its chat upstream names.
const PROFILE: &str = "developer";
const UPSTREAM_SECRET: &str = "openai";
/// The stdio servers of that profile: one bridge sidecar each.
const STDIO_SERVERS: [&str; 2] = ["everything", "filesystem"];
/// The message the app echoes through the agent, and what server-everything answers.
const ECHO_MESSAGE: &str = "hello from spear e2e";

/// Rollout of the chart: image pulls on a fresh node.
const INSTALL_TIMEOUT: &str = "5m";
/// The operator fills the caBundle once it has issued its certificate.
const CA_BUNDLE_TIMEOUT: Duration = Duration::from_secs(90);
/// Status is written by the elected leader, after its first reconcile.
const STATUS_TIMEOUT: Duration = Duration::from_secs(90);
/// The app pod pulls node:20-alpine and the servers' npm packages (`npx -y`) on first run.
const POD_READY_TIMEOUT: Duration = Duration::from_secs(600);
/// The app retries the call every 5 s for up to 5 minutes (see `app_script`).
const TOOL_CALL_TIMEOUT: Duration = Duration::from_secs(330);
const POLL: Duration = Duration::from_secs(2);

fn main() -> std::process::ExitCode {
    if std::env::var_os("KUBECONFIG").is_none() {
        println!("e2e: skipped: no KUBECONFIG set (see e2e/README.md for how to run it on kind)");
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

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn keep() -> bool {
    std::env::var_os(ENV_KEEP).is_some_and(|v| v == "1")
}

/// Counts and prints passed checks.
struct Report(usize);

impl Report {
    fn ok(&mut self, what: &str) {
        self.0 += 1;
        println!("e2e: ok: {what}");
    }
}

async fn run() -> Result<usize> {
    let operator_image = std::env::var(ENV_OPERATOR_IMAGE).with_context(|| {
        format!("{ENV_OPERATOR_IMAGE} must name the spear-operator image to install (see e2e/README.md)")
    })?;
    let spearlet_image = std::env::var(ENV_SPEARLET_IMAGE)
        .with_context(|| format!("{ENV_SPEARLET_IMAGE} must name the spearlet image to install (see e2e/README.md)"))?;
    let helm = helm()?;
    let mut report = Report(0);

    // Everything after the install attempt runs in here, so a failure anywhere still uninstalls.
    let result = async {
        install(&helm, &operator_image, &spearlet_image)?;
        report.ok("chart installed and the operator rolled out");
        let client = kube::Client::try_default().await.context("connecting with KUBECONFIG")?;
        cluster_checks(&client, &mut report).await?;
        let namespaces: Api<Namespace> = Api::all(client.clone());
        let ns = namespaces
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        generate_name: Some("spear-e2e-".into()),
                        labels: Some(BTreeMap::from([(LABEL_INJECTION.into(), INJECTION_ENABLED.into())])),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await?
            .metadata
            .name
            .context("namespace has a name")?;
        println!("e2e: working in namespace {ns}");
        let result = namespace_checks(&client, &ns, &mut report).await;
        if keep() {
            println!("e2e: {ENV_KEEP}=1: keeping namespace {ns}");
        } else {
            namespaces.delete(&ns, &DeleteParams::default()).await?;
        }
        result
    }
    .await;

    if keep() {
        println!("e2e: {ENV_KEEP}=1: keeping release {RELEASE} in {RELEASE_NAMESPACE}");
    } else if let Err(e) = helm_run(&helm, &["uninstall", RELEASE, "--namespace", RELEASE_NAMESPACE, "--wait"]) {
        // The checks' outcome matters more than the cleanup's; say what is left behind.
        eprintln!("e2e: warning: uninstalling {RELEASE} failed: {e:#}");
    }
    result.map(|()| report.0)
}

// === helm ===

/// `$SPEAR_HELM`, else the pinned helm `hack/helm.sh` builds (or finds in its cache).
fn helm() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("SPEAR_HELM") {
        return Ok(PathBuf::from(path));
    }
    let output = Command::new(repo().join("hack/helm.sh"))
        .output()
        .context("running hack/helm.sh (it builds helm from its Go module; needs go)")?;
    ensure!(output.status.success(), "hack/helm.sh failed:\n{}", String::from_utf8_lossy(&output.stderr));
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

fn helm_run(helm: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new(helm)
        .args(args)
        .current_dir(repo())
        .status()
        .with_context(|| format!("running {}", helm.display()))?;
    ensure!(status.success(), "helm {} failed ({status})", args.join(" "));
    Ok(())
}

/// `--set` arguments for an image reference: `repo:tag`, `repo@sha256:...` or a bare `repo`.
fn image_values(prefix: &str, image: &str) -> Vec<String> {
    if let Some((repository, digest)) = image.split_once('@') {
        return vec![format!("{prefix}.repository={repository}"), format!("{prefix}.digest={digest}")];
    }
    // A ':' after the last '/' separates the tag (an earlier one is a registry port).
    match image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')) {
        Some((repository, tag)) => vec![format!("{prefix}.repository={repository}"), format!("{prefix}.tag={tag}")],
        None => vec![format!("{prefix}.repository={image}")],
    }
}

fn install(helm: &Path, operator_image: &str, spearlet_image: &str) -> Result<()> {
    let mut args: Vec<String> = [
        "upgrade",
        "--install",
        RELEASE,
        "charts/spear-mcp",
        "--namespace",
        RELEASE_NAMESPACE,
        "--create-namespace",
        "--wait=watcher",
        "--timeout",
        INSTALL_TIMEOUT,
    ]
    .map(String::from)
    .to_vec();
    for value in
        image_values("operator.image", operator_image).into_iter().chain(image_values("spearlet.image", spearlet_image))
    {
        args.extend(["--set".to_string(), value]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    println!("e2e: helm {}", args.join(" "));
    helm_run(helm, &args)
}

// === checks ===

/// Polls `check` every [`POLL`] until it returns `Some`, or fails naming `what` and the last
/// state seen.
async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(Option<T>, String)>>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let (found, state) = check().await?;
        if let Some(value) = found {
            return Ok(value);
        }
        if tokio::time::Instant::now() >= deadline {
            bail!("{what}: not within {timeout:?}; last seen: {state}");
        }
        tokio::time::sleep(POLL).await;
    }
}

async fn cluster_checks(client: &kube::Client, report: &mut Report) -> Result<()> {
    // The chart's crds/ installed both CRDs.
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

    // Self-signed mode: the operator issues its certificate and fills the webhook's caBundle.
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
    report.ok("webhook caBundle filled by the operator");
    Ok(())
}

fn condition_status(conditions: Option<&Vec<Condition>>, kind: &str) -> Option<String> {
    conditions?.iter().find(|c| c.type_ == kind).map(|c| format!("{} ({}: {})", c.status, c.reason, c.message))
}

async fn namespace_checks(client: &kube::Client, ns: &str, report: &mut Report) -> Result<()> {
    // 1. Every example is created and Accepted by the operator.
    let servers: Api<McpServer> = Api::namespaced(client.clone(), ns);
    let profiles: Api<McpProfile> = Api::namespaced(client.clone(), ns);
    let dir = repo().join("examples/registry");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&dir)?.flatten() {
        let path = entry.path();
        if !manifest::is_manifest_file_name(&entry.file_name().to_string_lossy()) {
            continue;
        }
        let parsed = manifest::parse(&std::fs::read_to_string(&path)?);
        ensure!(parsed.is_valid(), "{}: {:?}", path.display(), parsed.problems);
        for doc in parsed.documents {
            match doc.object {
                Object::Server(s) => {
                    names.push(("McpServer", servers.create(&PostParams::default(), &s).await?.metadata.name))
                }
                Object::Profile(p) => {
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
    report.ok("examples accepted (status Accepted=True)");

    // 2. An invalid server is refused by the API server, naming the field.
    let invalid = McpServer::test("broken").allowing(["*"]);
    match servers.create(&PostParams::default(), &invalid).await {
        Ok(_) => bail!("a stdio McpServer without spec.stdio was accepted"),
        Err(e) => ensure!(e.to_string().contains("spec.stdio"), "error does not name spec.stdio: {e}"),
    }
    report.ok("invalid McpServer refused");

    // 3. An annotated Deployment is injected and its pod becomes Ready.
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": UPSTREAM_SECRET},
        "stringData": {"api-key": "not-used-by-the-e2e-test"},
    }))?;
    Api::<Secret>::namespaced(client.clone(), ns).create(&PostParams::default(), &secret).await?;
    let curl_image = std::env::var(ENV_CURL_IMAGE).unwrap_or_else(|_| DEFAULT_CURL_IMAGE.to_string());
    let deployment: Deployment = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "e2e-app"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "e2e-app"}},
            "template": {
                "metadata": {"labels": {"app": "e2e-app"}, "annotations": {ANNOTATION_PROFILE: PROFILE}},
                "spec": {
                    "terminationGracePeriodSeconds": 5,
                    "containers": [{
                        "name": "app",
                        "image": curl_image,
                        "command": ["sh", "-c", app_script()],
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
                    }],
                },
            },
        },
    }))?;
    Api::<Deployment>::namespaced(client.clone(), ns).create(&PostParams::default(), &deployment).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = eventually("the e2e-app pod Ready", POD_READY_TIMEOUT, || async {
        let list = pods.list(&ListParams::default().labels("app=e2e-app")).await?;
        let ready = list.items.iter().find(|p| is_ready(p)).cloned();
        let state = list.items.iter().map(pod_state).collect::<Vec<_>>().join("; ");
        Ok((ready, if state.is_empty() { "no pod".into() } else { state }))
    })
    .await?;
    let spec = pod.spec.clone().context("a pod has a spec")?;
    let all: Vec<&str> =
        spec.init_containers.iter().flatten().chain(spec.containers.iter()).map(|c| c.name.as_str()).collect();
    let mut expected = vec![INIT_CONTAINER.to_string(), AGENT_CONTAINER.to_string()];
    expected.extend(STDIO_SERVERS.iter().map(|s| format!("{SIDECAR_PREFIX}{s}")));
    for name in &expected {
        ensure!(all.contains(&name.as_str()), "the pod lacks container {name}: it has {all:?}");
    }
    let app = spec.containers.iter().find(|c| c.name == "app").context("the app container")?;
    ensure!(
        app.env.iter().flatten().any(|e| e.name == ENV_MCP_URL),
        "the app container lacks {ENV_MCP_URL}: {:?}",
        app.env
    );
    report.ok(&format!("pod injected ({}) and Ready", expected.join(", ")));

    // 4. A tool call from inside the app container, through the agent's /mcp.
    let pod_name = pod.metadata.name.clone().context("a pod has a name")?;
    let params = LogParams { container: Some("app".into()), ..LogParams::default() };
    let result = eventually("the app's tool call", TOOL_CALL_TIMEOUT, || async {
        let logs = pods.logs(&pod_name, &params).await?;
        let result = logs.lines().find(|l| l.starts_with("E2E-RESULT")).map(str::to_string);
        let last = logs.lines().last().unwrap_or("no output yet").to_string();
        Ok((result, last))
    })
    .await?;
    ensure!(result.starts_with("E2E-RESULT ok"), "the tool call failed: {result}");
    report.ok("mcp__everything__echo called from the app container through $SPEAR_MCP_URL");
    Ok(())
}

fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod's phase and its containers' waiting reasons, for a timeout message.
fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let waiting: Vec<String> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| {
            let waiting = c.state.as_ref()?.waiting.as_ref()?;
            Some(format!("{}: {}", c.name, waiting.reason.clone().unwrap_or_default()))
        })
        .collect();
    format!(
        "{} {} [{}]",
        pod.metadata.name.as_deref().unwrap_or("?"),
        status.phase.unwrap_or_default(),
        waiting.join(", ")
    )
}

/// The app container's shell script: an MCP client in curl (initialize, initialized,
/// tools/call), retried until server-everything's echo answers, then idle. The stdio sidecars
/// may still be fetching their npm packages when the agent is ready, hence the retries. The
/// script prints one `E2E-RESULT ok|failed ...` line that the test reads from the logs.
fn app_script() -> String {
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"spear-e2e","version":"0"}}}"#;
    let initialized = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
    let call = format!(
        r#"{{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{{"name":"mcp__everything__echo","arguments":{{"message":"{ECHO_MESSAGE}"}}}}}}"#
    );
    format!(
        r#"
post() {{ curl -sS -m 30 -H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream' "$@" "${ENV_MCP_URL}"; }}
call() {{
  sid=$(post -D - -o /dev/null -d '{initialize}' | tr -d '\r' | sed -n 's/^[Mm][Cc][Pp]-[Ss][Ee][Ss][Ss][Ii][Oo][Nn]-[Ii][Dd]: *//p')
  session="Mcp-Session-Id: $sid"
  [ -n "$sid" ] || session="X-Spear-E2E: stateless"
  post -H "$session" -d '{initialized}' >/dev/null
  post -H "$session" -d '{call}'
}}
i=0
while [ $i -lt 60 ]; do
  i=$((i + 1))
  out=$(call 2>&1 | tr '\n' ' ')
  case "$out" in
    *"Echo: {ECHO_MESSAGE}"*) echo "E2E-RESULT ok $out"; break ;;
  esac
  echo "E2E-ATTEMPT $i: $out"
  [ $i -eq 60 ] && echo "E2E-RESULT failed after $i attempts: $out"
  sleep 5
done
exec sleep 2147483647
"#
    )
}
