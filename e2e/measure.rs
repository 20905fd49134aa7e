//! `SPEAR_E2E_MEASURE=1`: the figures of BENCHMARKS.md "e2e in real pods", each against a
//! baseline measured in the same run on the same node.
//!
//! - pod creation to Ready, injected vs the same pod without injection (p50 over 20 each);
//! - the agent container's memory (the kubelet's summary API: cgroup working set) idle and after
//!   10,000 calls;
//! - a tools/call through `/mcp` from the app container vs the same call made directly to the
//!   stdio server over a bridge socket (a pod with a bridge and no agent), p50/p99, both as raw
//!   JSON-RPC so the client's own cost is the same on both paths;
//! - McpServer edit to visible in the pod's tool list (adds and removals, p50 and max).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, LogParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::await_condition;
use serde_json::{Value, json};
use spear::api::McpServer;
use spear::api::keys::{AGENT_CONTAINER, ANNOTATION_PROFILE};

use crate::support::{Report, is_ready, logs, run_ephemeral};
use crate::{Driver, Images, PROFILE};

const PODS_PER_SIDE: usize = 20;
const CALLS: usize = 10_000;
const EDITS: usize = 5;

pub async fn all(
    client: &kube::Client,
    driver: &Driver,
    images: &Images,
    ns: &str,
    plain_ns: &str,
    report: &Report,
) -> Result<()> {
    pod_start(client, images, ns, plain_ns, report).await?;
    memory_and_latency(client, driver, images, plain_ns, report).await?;
    edits(client, driver, ns, report).await
}

fn p50(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

async fn pod_start(client: &kube::Client, images: &Images, ns: &str, plain_ns: &str, report: &Report) -> Result<()> {
    let mut figures = Vec::new();
    let mut breakdown = String::new();
    for (label, namespace, annotated) in [("plain", plain_ns, false), ("injected", ns, true)] {
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        let mut samples = Vec::new();
        for i in 0..PODS_PER_SIDE {
            let name = format!("e2e-start-{label}-{i}");
            let annotations = if annotated { json!({ANNOTATION_PROFILE: PROFILE}) } else { json!({}) };
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": annotations},
                "spec": {
                    "terminationGracePeriodSeconds": 1,
                    "containers": [{
                        "name": "app", "image": images.app, "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "/e2e/driver.py"],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": crate::DRIVER_PORT}, "periodSeconds": 1},
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
                    }],
                },
            }))?;
            let started = Instant::now();
            let created_at = jiff::Timestamp::now();
            pods.create(&PostParams::default(), &pod).await?;
            tokio::time::timeout(
                Duration::from_secs(120),
                await_condition(pods.clone(), &name, |p: Option<&Pod>| p.is_some_and(is_ready)),
            )
            .await
            .with_context(|| format!("{name} not Ready within 120 s"))??;
            samples.push(started.elapsed());
            if annotated && i + 1 == PODS_PER_SIDE {
                breakdown = start_breakdown(&pods, &name, created_at, started.elapsed()).await?;
            }
            pods.delete(&name, &DeleteParams::default()).await?;
        }
        figures.push(p50(samples));
    }
    report.figure(&format!(
        "pod create to Ready, p50 of {PODS_PER_SIDE}: without injection {:.2} s, injected {:.2} s (ratio {:.2})",
        figures[0].as_secs_f64(),
        figures[1].as_secs_f64(),
        figures[1].as_secs_f64() / figures[0].as_secs_f64()
    ));
    report.figure(&format!("the last injected pod's start, from its create (container log timestamps): {breakdown}"));
    Ok(())
}

/// Where an injected pod's start went: when each container's first log line (and the agent's
/// line saying it is ready) was written, in seconds after the create, in the order they came.
async fn start_breakdown(
    pods: &Api<Pod>,
    name: &str,
    created_at: jiff::Timestamp,
    ready_after: Duration,
) -> Result<String> {
    let pod = pods.get(name).await?;
    let spec = pod.spec.context("a pod has a spec")?;
    let mut marks: Vec<(f64, String)> = Vec::new();
    for container in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let params = LogParams { container: Some(container.name.clone()), timestamps: true, ..LogParams::default() };
        let text = pods.logs(name, &params).await.unwrap_or_default();
        let at = |line: &str| {
            let stamp = line.split_once(' ').map_or(line, |(stamp, _)| stamp);
            stamp.parse::<jiff::Timestamp>().ok().map(|t| t.duration_since(created_at).as_secs_f64())
        };
        if let Some(first) = text.lines().next().and_then(at) {
            marks.push((first, format!("{} first line", container.name)));
        }
        if container.name == AGENT_CONTAINER
            && let Some(ready) = text.lines().find(|l| l.contains("first tool list: ready")).and_then(at)
        {
            marks.push((ready, "agent ready".to_string()));
        }
    }
    marks.sort_by(|a, b| a.0.total_cmp(&b.0));
    marks.push((ready_after.as_secs_f64(), "pod Ready seen".to_string()));
    Ok(marks.iter().map(|(at, what)| format!("{what} {at:.2} s")).collect::<Vec<_>>().join(", "))
}

/// The agent container's working set and RSS from the kubelet's summary API.
async fn agent_memory(client: &kube::Client, node: &str, ns: &str, pod: &str) -> Result<(u64, u64)> {
    let summary: Value = serde_json::from_str(
        &client
            .request_text(hyper::Request::get(format!("/api/v1/nodes/{node}/proxy/stats/summary")).body(Vec::new())?)
            .await?,
    )?;
    let container = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["podRef"]["name"] == pod && p["podRef"]["namespace"] == ns)
        .and_then(|p| p["containers"].as_array()?.iter().find(|c| c["name"] == AGENT_CONTAINER).cloned())
        .with_context(|| format!("no stats for {ns}/{pod}/{AGENT_CONTAINER} in the kubelet's summary"))?;
    let memory = &container["memory"];
    Ok((memory["workingSetBytes"].as_u64().unwrap_or(0), memory["rssBytes"].as_u64().unwrap_or(0)))
}

/// The agent process's own RSS split (anonymous, file, shmem), read by an ephemeral container in
/// its PID namespace. The cgroup's figure leaves out the binary's file pages: the init container
/// wrote that file, so its page cache is charged to the init container's (gone) cgroup.
async fn agent_process_memory(pods: &Api<Pod>, driver: &Driver, images: &Images, name: &str) -> Result<String> {
    let script = "import re; s = open('/proc/1/status').read(); \
        print(', '.join(f'{k} {int(v) / 1024:.1f} MiB' for k, v in re.findall(r'^(VmRSS|RssAnon|RssFile):\\s+(\\d+)', s, re.M)))";
    let out =
        run_ephemeral(pods, &driver.pod, AGENT_CONTAINER, name, &images.app, 65532, &["python3", "-c", script]).await?;
    Ok(out.trim().to_string())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

async fn memory_and_latency(
    client: &kube::Client,
    driver: &Driver,
    images: &Images,
    plain_ns: &str,
    report: &Report,
) -> Result<()> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &driver.ns);
    let node = pods.get(&driver.pod).await?.spec.and_then(|s| s.node_name).context("the app pod has a node")?;
    let (idle_ws, idle_rss) = agent_memory(client, &node, &driver.ns, &driver.pod).await?;
    let idle_process = agent_process_memory(&pods, driver, images, "e2e-rss-idle").await?;

    let args = json!({"message": "bench"}).to_string();
    let n = CALLS.to_string();
    let through: Value = driver.get("/rawbench", &[("name", crate::ECHO), ("args", &args), ("n", &n)]).await?;
    // The summary API's figures are refreshed every 10 s or so (cadvisor housekeeping).
    tokio::time::sleep(Duration::from_secs(15)).await;
    let (busy_ws, busy_rss) = agent_memory(client, &node, &driver.ns, &driver.pod).await?;
    let busy_process = agent_process_memory(&pods, driver, images, "e2e-rss-busy").await?;
    report.figure(&format!(
        "agent container memory (cgroup, kubelet summary): idle working set {:.1} MiB (RSS {:.1}), after {CALLS} calls {:.1} MiB (RSS {:.1})",
        mib(idle_ws),
        mib(idle_rss),
        mib(busy_ws),
        mib(busy_rss)
    ));
    report.figure(&format!(
        "agent process (/proc/1/status in its container): idle {idle_process}; after {CALLS} calls {busy_process}"
    ));

    let direct = direct_bench(client, images, plain_ns, &args).await?;
    let ratio = |key: &str| through[key].as_f64().unwrap_or(0.0) / direct[key].as_f64().unwrap_or(1.0);
    report.figure(&format!(
        "tools/call echo, {CALLS} sequential: through /mcp from the app p50 {} us p99 {} us; direct over the bridge socket p50 {} us p99 {} us (ratio p50 {:.2}, p99 {:.2})",
        through["p50_us"],
        through["p99_us"],
        direct["p50_us"],
        direct["p99_us"],
        ratio("p50_us"),
        ratio("p99_us")
    ));
    Ok(())
}

/// A pod with the everything server behind a bridge (as the webhook would inject it) and a
/// client of the bridge socket in place of the agent: e2e/app/direct.py.
async fn direct_bench(client: &kube::Client, images: &Images, ns: &str, args: &str) -> Result<Value> {
    let servers_image = images.mcp_servers.clone().context("measure mode needs SPEAR_E2E_MCP_SERVERS_IMAGE")?;
    let restricted = json!({
        "allowPrivilegeEscalation": false, "readOnlyRootFilesystem": true, "runAsNonRoot": true,
        "capabilities": {"drop": ["ALL"]}, "runAsGroup": 65532,
    });
    let with_user = |uid: i64| {
        let mut context = restricted.clone();
        context["runAsUser"] = json!(uid);
        context
    };
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "e2e-direct"},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": false,
            "volumes": [{"name": "bin", "emptyDir": {}}, {"name": "sock", "emptyDir": {}}, {"name": "tmp", "emptyDir": {}}],
            "initContainers": [
                {
                    "name": "install", "image": images.spearlet, "imagePullPolicy": "IfNotPresent",
                    "command": ["/spearlet", "install", "--to", "/spear/bin/spearlet"],
                    "volumeMounts": [{"name": "bin", "mountPath": "/spear/bin"}],
                    "securityContext": with_user(65532),
                },
                {
                    "name": "bridge", "image": servers_image, "imagePullPolicy": "IfNotPresent", "restartPolicy": "Always",
                    "command": ["/spear/bin/spearlet", "bridge", "--socket", "/spear/run/everything/mcp.sock",
                                "--server-id", "everything", "--peer-uid", "65532", "--", "mcp-server-everything", "stdio"],
                    "env": [{"name": "HOME", "value": "/tmp"}],
                    "volumeMounts": [
                        {"name": "bin", "mountPath": "/spear/bin", "readOnly": true},
                        {"name": "sock", "mountPath": "/spear/run/everything"},
                        {"name": "tmp", "mountPath": "/tmp"},
                    ],
                    "securityContext": with_user(65600),
                },
            ],
            "containers": [{
                "name": "client", "image": images.app, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "/e2e/direct.py", "/spear/run/everything/mcp.sock", CALLS.to_string(), "echo", args],
                "volumeMounts": [{"name": "sock", "mountPath": "/spear/run/everything", "readOnly": true}],
                "securityContext": with_user(65532),
            }],
            "securityContext": {"fsGroup": 65532},
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&PostParams::default(), &pod).await?;
    let done = |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref()?.phase.clone()).is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    };
    tokio::time::timeout(Duration::from_secs(300), await_condition(pods.clone(), "e2e-direct", done))
        .await
        .context("the direct bench pod did not finish within 300 s")??;
    let output = logs(&pods, "e2e-direct", "client", false).await?;
    let line = output.lines().last().unwrap_or_default();
    let figure: Value = serde_json::from_str(line).with_context(|| format!("the direct bench failed:\n{output}"))?;
    pods.delete("e2e-direct", &DeleteParams::default()).await?;
    Ok(figure)
}

/// Adds and removes a tool from `everything`'s allowedTools EDITS times each; the driver polls
/// the pod's tool list every 20 ms, so each figure is within about 20 ms plus one list call.
async fn edits(client: &kube::Client, driver: &Driver, ns: &str, report: &Report) -> Result<()> {
    let servers: Api<McpServer> = Api::namespaced(client.clone(), ns);
    let tool = "get-tiny-image";
    let name = format!("mcp__everything__{tool}");
    let mut samples = Vec::new();
    for round in 0..EDITS * 2 {
        let adding = round % 2 == 1;
        let mut allowed = servers.get("everything").await?.spec.allowed_tools;
        allowed.retain(|t| t != tool);
        if adding {
            allowed.push(tool.to_string());
        }
        let watcher = {
            let driver = driver.clone();
            let name = name.clone();
            let absent = if adding { "0" } else { "1" };
            tokio::spawn(async move {
                driver.get("/watch", &[("name", &name), ("timeout", "20"), ("absent", absent)]).await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        servers
            .patch("everything", &PatchParams::default(), &Patch::Merge(json!({"spec": {"allowedTools": allowed}})))
            .await?;
        let seen = watcher.await??;
        ensure!(seen.get("seen_after_ms").is_some(), "edit {round} never visible: {seen}");
        samples.push(started.elapsed());
    }
    let max = samples.iter().max().copied().unwrap_or_default();
    report.figure(&format!(
        "McpServer edit to visible in the pod's tool list ({} adds and removals): p50 {} ms, max {} ms",
        samples.len(),
        p50(samples).as_millis(),
        max.as_millis()
    ));
    Ok(())
}
