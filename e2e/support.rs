//! The e2e binary's plumbing: helm, polling, the pod proxy to the app's driver, ephemeral
//! containers, logs. The checks themselves live in `main.rs`.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::core::v1::{EphemeralContainer, Event, Node, Pod};
use kube::api::{Api, LogParams, PostParams};

pub const POLL: Duration = Duration::from_millis(500);

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Counts passed checks and prints each with its time, for the closing table.
pub struct Report {
    pub passed: usize,
    start: Instant,
    last: Instant,
    pub steps: Vec<(String, Duration)>,
}

impl Report {
    pub fn new() -> Self {
        let now = Instant::now();
        Report { passed: 0, start: now, last: now, steps: Vec::new() }
    }

    pub fn ok(&mut self, what: &str) {
        let now = Instant::now();
        let took = now - self.last;
        self.last = now;
        self.passed += 1;
        println!("e2e: ok ({:>6.1} s, at {:>6.1} s): {what}", took.as_secs_f64(), (now - self.start).as_secs_f64());
        self.steps.push((what.to_string(), took));
    }

    /// Prints a figure (measure mode), without counting a check.
    pub fn figure(&self, what: &str) {
        println!("e2e: figure: {what}");
    }
}

// === helm ===

/// `$SPEAR_HELM`, else the pinned helm `hack/helm.sh` builds (or finds in its cache).
pub fn helm() -> Result<PathBuf> {
    if let Some(path) = std::env::var_os("SPEAR_HELM") {
        return Ok(PathBuf::from(path));
    }
    let output = Command::new(repo().join("hack/helm.sh"))
        .output()
        .context("running hack/helm.sh (it builds helm from its Go module; needs go)")?;
    ensure!(output.status.success(), "hack/helm.sh failed:\n{}", String::from_utf8_lossy(&output.stderr));
    Ok(PathBuf::from(String::from_utf8(output.stdout)?.trim()))
}

pub fn helm_run(helm: &Path, args: &[&str]) -> Result<()> {
    let status = Command::new(helm)
        .args(args)
        .current_dir(repo())
        .status()
        .with_context(|| format!("running {}", helm.display()))?;
    ensure!(status.success(), "helm {} failed ({status})", args.join(" "));
    Ok(())
}

/// `--set` arguments for an image reference: `repo:tag`, `repo@sha256:...` or a bare `repo`.
pub fn image_values(prefix: &str, image: &str) -> Vec<String> {
    if let Some((repository, digest)) = image.split_once('@') {
        return vec![format!("{prefix}.repository={repository}"), format!("{prefix}.digest={digest}")];
    }
    // A ':' after the last '/' separates the tag (an earlier one is a registry port).
    match image.rsplit_once(':').filter(|(_, tag)| !tag.contains('/')) {
        Some((repository, tag)) => vec![format!("{prefix}.repository={repository}"), format!("{prefix}.tag={tag}")],
        None => vec![format!("{prefix}.repository={image}")],
    }
}

// === polling ===

/// Polls `check` every [`POLL`] until it returns `Some`, or fails naming `what` and the last
/// state seen.
pub async fn eventually<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> Result<T>
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

// === pods ===

pub fn is_ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// A pod's phase and its containers' waiting reasons, for a timeout message.
pub fn pod_state(pod: &Pod) -> String {
    let status = pod.status.clone().unwrap_or_default();
    let waiting: Vec<String> = status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .filter_map(|c| {
            let state = c.state.as_ref()?;
            if let Some(w) = state.waiting.as_ref() {
                return Some(format!(
                    "{}: {} {}",
                    c.name,
                    w.reason.clone().unwrap_or_default(),
                    w.message.clone().unwrap_or_default()
                ));
            }
            let t = state.terminated.as_ref()?;
            Some(format!("{}: terminated {} ({})", c.name, t.exit_code, t.reason.clone().unwrap_or_default()))
        })
        .collect();
    format!(
        "{} {} [{}]",
        pod.metadata.name.as_deref().unwrap_or("?"),
        status.phase.unwrap_or_default(),
        waiting.join(", ")
    )
}

/// The restart count of container `name` (init or regular).
pub fn restarts(pod: &Pod, name: &str) -> i32 {
    let status = pod.status.clone().unwrap_or_default();
    status
        .init_container_statuses
        .iter()
        .flatten()
        .chain(status.container_statuses.iter().flatten())
        .find(|c| c.name == name)
        .map_or(0, |c| c.restart_count)
}

/// Waits for a Ready pod with `selector`, returning it.
pub async fn ready_pod(pods: &Api<Pod>, selector: &str, timeout: Duration) -> Result<Pod> {
    eventually(&format!("a Ready pod with {selector}"), timeout, || async {
        let list = pods.list(&kube::api::ListParams::default().labels(selector)).await?;
        let ready = list.items.iter().find(|p| is_ready(p) && p.metadata.deletion_timestamp.is_none()).cloned();
        let state = list.items.iter().map(pod_state).collect::<Vec<_>>().join("; ");
        Ok((ready, if state.is_empty() { "no pod".into() } else { state }))
    })
    .await
}

/// A container's logs (`previous` for the last terminated instance).
pub async fn logs(pods: &Api<Pod>, pod: &str, container: &str, previous: bool) -> Result<String> {
    let params = LogParams { container: Some(container.into()), previous, ..LogParams::default() };
    pods.logs(pod, &params).await.with_context(|| format!("logs of {pod}/{container}"))
}

/// What a failed run prints before it cleans up: the nodes' conditions that are not as a healthy
/// node has them (DiskPressure on a full build disk made pods unschedulable once, with nothing
/// in the log but helm's timeout), every pod's state and the newest Warning events of
/// `namespaces`. Best effort: a read that fails is said and skipped.
pub async fn diagnose(client: &kube::Client, namespaces: &[&str]) {
    println!("e2e: diagnosis of the failure:");
    match Api::<Node>::all(client.clone()).list(&kube::api::ListParams::default()).await {
        Ok(nodes) => {
            for node in nodes {
                let name = node.metadata.name.unwrap_or_default();
                let conditions = node.status.and_then(|s| s.conditions).unwrap_or_default();
                let unhealthy: Vec<String> = conditions
                    .iter()
                    .filter(|c| (c.type_ == "Ready") != (c.status == "True"))
                    .map(|c| format!("{}={} ({})", c.type_, c.status, c.message.clone().unwrap_or_default()))
                    .collect();
                let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
                let taints: Vec<String> = taints.iter().map(|t| format!("{}:{}", t.key, t.effect)).collect();
                println!("e2e:   node {name}: conditions off {unhealthy:?}, taints {taints:?}");
            }
        }
        Err(e) => println!("e2e:   nodes: cannot list: {e}"),
    }
    for ns in namespaces {
        match Api::<Pod>::namespaced(client.clone(), ns).list(&kube::api::ListParams::default()).await {
            Ok(pods) if pods.items.is_empty() => println!("e2e:   {ns}: no pods"),
            Ok(pods) => pods.items.iter().for_each(|p| println!("e2e:   {ns}: pod {}", pod_state(p))),
            Err(e) => println!("e2e:   {ns}: cannot list pods: {e}"),
        }
        let warnings = kube::api::ListParams::default().fields("type=Warning");
        match Api::<Event>::namespaced(client.clone(), ns).list(&warnings).await {
            Ok(events) => {
                let mut events = events.items;
                events.sort_by_key(|e| e.last_timestamp.clone().map(|t| t.0));
                for event in events.iter().rev().take(DIAGNOSIS_EVENTS) {
                    println!(
                        "e2e:   {ns}: event {} {}: {} (x{})",
                        event.involved_object.name.as_deref().unwrap_or("?"),
                        event.reason.as_deref().unwrap_or(""),
                        event.message.as_deref().unwrap_or(""),
                        event.count.unwrap_or(1)
                    );
                }
            }
            Err(e) => println!("e2e:   {ns}: cannot list events: {e}"),
        }
    }
}

/// Enough to see a repeating cause without burying the log.
const DIAGNOSIS_EVENTS: usize = 15;

// === the app's driver, through the API server's pod proxy ===

/// GET `path?query` on `pod:port` through the API server's pod proxy.
pub async fn proxy_text(
    client: &kube::Client,
    ns: &str,
    pod: &str,
    port: u16,
    path: &str,
    query: &[(&str, &str)],
) -> Result<String> {
    let mut uri = format!("/api/v1/namespaces/{ns}/pods/{pod}:{port}/proxy{path}");
    if !query.is_empty() {
        let encoded = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(query).finish();
        uri = format!("{uri}?{encoded}");
    }
    let request = hyper::Request::get(&uri).body(Vec::new())?;
    client.request_text(request).await.with_context(|| format!("GET {uri}"))
}

// === ephemeral containers ===

/// Runs `command` in an ephemeral container of `pod` that shares `target`'s process namespace,
/// as `uid`, and returns its output once it exited. The e2e images have no shell; the app image
/// has python3, which is all these probes need.
pub async fn run_ephemeral(
    pods: &Api<Pod>,
    pod: &str,
    target: &str,
    name: &str,
    image: &str,
    uid: i64,
    command: &[&str],
) -> Result<String> {
    let mut current = pods.get_ephemeral_containers(pod).await?;
    let ephemeral: EphemeralContainer = serde_json::from_value(serde_json::json!({
        "targetContainerName": target,
        "name": name,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": command,
        "securityContext": {
            "runAsUser": uid, "runAsGroup": 65532, "runAsNonRoot": true,
            "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true,
            "capabilities": {"drop": ["ALL"]},
        },
    }))?;
    let spec = current.spec.as_mut().context("a pod has a spec")?;
    spec.ephemeral_containers.get_or_insert_with(Vec::new).push(ephemeral);
    pods.replace_ephemeral_containers(pod, &PostParams::default(), &current)
        .await
        .with_context(|| format!("adding ephemeral container {name} to {pod}"))?;
    eventually(&format!("ephemeral container {name} in {pod} exits"), Duration::from_secs(60), || async {
        let p = pods.get(pod).await?;
        let status = p.status.unwrap_or_default();
        let state =
            status.ephemeral_container_statuses.iter().flatten().find(|c| c.name == name).and_then(|c| c.state.clone());
        let done = state.as_ref().and_then(|s| s.terminated.clone());
        Ok((done.map(drop), format!("{state:?}")))
    })
    .await?;
    logs(pods, pod, name, false).await
}

/// `tests/servers/oauth_server.py` (in the app image) in a pod of its own, labelled `app=NAME`,
/// serving on `port` with `args` after the common ones, `volume` (a pod volume, JSON) mounted at
/// `/{volume's name}`; over HTTPS when `https` (its `args` then name the CA). Returns its IP once Ready.
pub async fn start_oauth_server_pod(
    pods: &Api<Pod>,
    name: &str,
    image: &str,
    (port, https): (u16, bool),
    args: &[String],
    volume: serde_json::Value,
) -> Result<String> {
    let scheme = if https { "HTTPS" } else { "HTTP" };
    let volume_name = volume["name"].as_str().context("the volume has a name")?.to_string();
    let mut command: Vec<String> =
        ["python3", "/e2e/oauth_server.py", "--host", "0.0.0.0", "--port"].map(String::from).to_vec();
    command.push(port.to_string());
    command.extend(["--public-url".to_string(), format!("{}://$(POD_IP):{port}", scheme.to_lowercase())]);
    command.extend(args.iter().cloned());
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "server", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": command,
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"containerPort": port}],
                "readinessProbe": {"httpGet": {"path": "/.well-known/oauth-authorization-server", "port": port, "scheme": scheme}, "periodSeconds": 1},
                "volumeMounts": [{"name": volume_name, "mountPath": format!("/{volume_name}"), "readOnly": true}],
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
            }],
            "volumes": [volume],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let ready = ready_pod(pods, &format!("app={name}"), Duration::from_secs(180)).await?;
    ready.status.and_then(|s| s.pod_ip).with_context(|| format!("{name} has an IP"))
}
