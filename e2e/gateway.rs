//! Gateway mode in real pods (README step 9): the chart's `gateway.enabled` in a namespace of its
//! own, callers in plain pods (no injection) with projected ServiceAccount tokens of the gateway's
//! audience, an MCP server in a pod (`tests/servers/fixture_server.py`, Streamable HTTP).
//!
//! This node has no DNS and no ClusterIP routing (`hack/cluster.sh`): the callers reach the
//! gateway at its pod's IP and port, the port its Service targets, and the McpServer names the
//! server pod's IP.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::api::{Api, PostParams};
use serde_json::json;
use spear::api::{McpProfile, McpProfileBinding, McpServer};

use crate::support::{Report, eventually, ready_pod};
use crate::{DRIVER_PORT, Driver, Images, POD_READY_TIMEOUT};

const AUDIENCE: &str = "spear-mcp-gateway";
const SERVER_PORT: u16 = 8931;
const TOKEN_DIR: &str = "/var/run/secrets/spear-gateway";

/// Runs the gateway step in `ns` (a namespace without injection), the chart upgraded to run the
/// gateway there by `install_gateway`.
pub(crate) async fn gateway_checks(
    client: &kube::Client,
    images: &Images,
    ns: &str,
    install_gateway: impl FnOnce() -> Result<()>,
    report: &mut Report,
) -> Result<()> {
    install_gateway()?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let gateway = ready_pod(&pods, "app.kubernetes.io/component=gateway", POD_READY_TIMEOUT).await?;
    let gateway_ip = gateway.status.and_then(|s| s.pod_ip).context("the gateway pod has an IP")?;
    report.ok(&format!("gateway.enabled: spearlet gateway Ready in {ns} (helm upgrade --wait)"));

    let server_ip = start_fixture_server(&pods, &images.app).await?;
    let server: McpServer = serde_json::from_value(json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": "fixture"},
        "spec": {"transport": "streamableHttp", "http": {"url": format!("http://{server_ip}:{SERVER_PORT}/mcp")},
                 "allowedTools": ["echo", "pid"]},
    }))?;
    Api::<McpServer>::namespaced(client.clone(), ns).create(&PostParams::default(), &server).await?;
    let profiles: Api<McpProfile> = Api::namespaced(client.clone(), ns);
    for (name, tool) in [("reader", "echo"), ("writer", "pid")] {
        let profile: McpProfile = serde_json::from_value(json!({
            "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfile", "metadata": {"name": name},
            "spec": {"servers": ["fixture"], "toolAllowlist": [tool]},
        }))?;
        profiles.create(&PostParams::default(), &profile).await?;
    }
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let bindings: Api<McpProfileBinding> = Api::namespaced(client.clone(), ns);
    for (account, profile) in [("reader-app", "reader"), ("writer-app", "writer")] {
        let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": account}}))?;
        accounts.create(&PostParams::default(), &sa).await?;
        let binding: McpProfileBinding = serde_json::from_value(json!({
            "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfileBinding", "metadata": {"name": account},
            "spec": {"profileRef": {"name": profile}, "subjects": [{"kind": "ServiceAccount", "name": account}]},
        }))?;
        bindings.create(&PostParams::default(), &binding).await?;
    }

    let url = format!("http://{gateway_ip}:4040/mcp");
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let mut drivers = Vec::new();
    for account in ["reader-app", "writer-app"] {
        deployments.create(&PostParams::default(), &caller_deployment(account, &images.app, &url)).await?;
        let pod = ready_pod(&pods, &format!("app={account}"), POD_READY_TIMEOUT).await?;
        ensure!(pod.spec.as_ref().is_some_and(|s| s.containers.len() == 1), "a plain pod: nothing injected");
        drivers.push(Driver { client: client.clone(), ns: ns.to_string(), pod: pod.metadata.name.context("a name")? });
    }
    let (reader, writer) = (&drivers[0], &drivers[1]);

    // Each caller sees its binding's tools; the first list may wait for the server's first list.
    let listed = eventually("the reader's tools through the gateway", Duration::from_secs(30), || async {
        Ok(match reader.tools().await {
            Ok(tools) if tools == ["mcp__fixture__echo"] => (Some(tools), String::new()),
            Ok(tools) => (None, format!("{tools:?}")),
            Err(e) => (None, format!("{e:#}")),
        })
    })
    .await?;
    let answer = reader.call("mcp__fixture__echo", &json!({"text": "through the gateway"})).await?;
    ensure!(answer["is_error"] == false, "the reader's echo: {answer}");
    report.ok(&format!(
        "a plain pod with its projected token (audience {AUDIENCE}) lists only its binding's tools through the gateway Service's port ({listed:?}) and calls one"
    ));
    let tools = writer.tools().await?;
    ensure!(tools == ["mcp__fixture__pid"], "the writer's tools: {tools:?}");
    let refused = writer.call("mcp__fixture__echo", &json!({"text": "not mine"})).await?;
    ensure!(refused["is_error"] == true, "a tool outside the writer's binding ran: {refused}");
    report.ok("a pod of another ServiceAccount sees its own binding's tools and is refused the reader's tool");

    // No token: 401 with the RFC 9728 challenge; the PyPI mcp SDK's discovery finds the metadata.
    let found = reader.get("/discover", &[]).await?;
    let metadata_url = format!("http://{gateway_ip}:4040/.well-known/oauth-protected-resource/mcp");
    ensure!(found["status"] == 401, "without a token: {found}");
    ensure!(found["challenge"].as_str().is_some_and(|c| c.contains(&metadata_url)), "the challenge: {found}");
    ensure!(found["resource"] == url.as_str() && found["resource_allowed"] == true, "the metadata: {found}");
    ensure!(found["authorization_servers"].as_array().is_some_and(|a| !a.is_empty()), "no issuer: {found}");
    report.ok(&format!(
        "without a token: 401 with the challenge; the PyPI mcp SDK discovers the protected-resource metadata (issuer {})",
        found["authorization_servers"][0]
    ));
    Ok(())
}

/// `tests/servers/fixture_server.py` over Streamable HTTP in a pod of its own; its IP.
async fn start_fixture_server(pods: &Api<Pod>, image: &str) -> Result<String> {
    let name = "e2e-gateway-server";
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "automountServiceAccountToken": false,
            "containers": [{
                "name": "server", "image": image, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "/e2e/fixture_server.py", "--transport", "http", "--host", "0.0.0.0",
                            "--port", SERVER_PORT.to_string()],
                "ports": [{"containerPort": SERVER_PORT}],
                "readinessProbe": {"tcpSocket": {"port": SERVER_PORT}, "periodSeconds": 1},
                "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
            }],
        },
    }))?;
    pods.create(&PostParams::default(), &pod).await?;
    let ready = ready_pod(pods, &format!("app={name}"), Duration::from_secs(180)).await?;
    ready.status.and_then(|s| s.pod_ip).context("the server pod has an IP")
}

/// A caller: the e2e driver in a plain pod of ServiceAccount `account`, with a projected token of
/// the gateway's audience (what any workload mounts to call the gateway).
fn caller_deployment(account: &str, image: &str, url: &str) -> Deployment {
    serde_json::from_value(json!({
        "metadata": {"name": account},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": account}},
            "template": {
                "metadata": {"labels": {"app": account}},
                "spec": {
                    "serviceAccountName": account,
                    "automountServiceAccountToken": false,
                    "containers": [{
                        "name": "app", "image": image, "imagePullPolicy": "IfNotPresent",
                        "command": ["python3", "/e2e/driver.py"],
                        "env": [{"name": "SPEAR_MCP_URL", "value": url},
                                {"name": "E2E_TOKEN_FILE", "value": format!("{TOKEN_DIR}/token")}],
                        "ports": [{"containerPort": DRIVER_PORT}],
                        "readinessProbe": {"httpGet": {"path": "/healthz", "port": DRIVER_PORT}, "periodSeconds": 1},
                        "volumeMounts": [{"name": "gateway-token", "mountPath": TOKEN_DIR, "readOnly": true}],
                        "securityContext": {"runAsNonRoot": true, "runAsUser": 1000, "allowPrivilegeEscalation": false},
                    }],
                    "volumes": [{"name": "gateway-token", "projected": {"sources": [
                        {"serviceAccountToken": {"audience": AUDIENCE, "expirationSeconds": 3600, "path": "token"}}]}}],
                },
            },
        },
    }))
    .expect("a static Deployment literal deserializes")
}
