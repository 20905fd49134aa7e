//! A person's grant read by the agent in a real pod, behind a private CA.
//!
//! ```text
//! CA (rcgen) ──▶ ConfigMap spear-e2e-trust in the release namespace ──▶ chart trustBundle
//!   ├─ e2e-grant-server pod: tests/servers/oauth_server.py over HTTPS (a leaf for its pod IP,
//!   │    issued at start by that CA): authorization code with PKCE, rotating refresh tokens,
//!   │    access tokens of 5 s, and the protected MCP server (`whoami`)
//!   ├─ McpServer grant (authorizationCode.tokenSecretRef e2e-grant)
//!   ├─ e2e-grant-login pod: `spearlet auth login -n NS --no-browser` with e2e/app/login.py as
//!   │    the browser (in the cluster, so the test needs no route to pod addresses) ──▶ Secret
//!   └─ Deployment e2e-grant-app (profile grant; its service account may get and update that
//!        one Secret): the injected agent, trusting the CA only through the operator's bundle,
//!        reads the grant and calls `whoami` as the person; after the access token expires it
//!        renews with the refresh token and writes the rotated one back to the Secret
//! ```

use anyhow::{Context, Result, bail, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use spear::api::keys::{ANNOTATION_GRANT_RENEWED_AT, GRANT_SECRET_KEY, GRANT_SECRET_TYPE};
use spear::api::{McpProfile, McpServer};
use spear::testing::test_ca::TestCa;

use super::support::{Report, eventually, logs, ready_pod, start_oauth_server_pod};
use super::{Driver, Images, POD_READY_TIMEOUT, RELEASE_NAMESPACE, app_deployment_of};

/// The chart's `trustBundle.configMap` in the e2e install.
pub const TRUST_CONFIGMAP: &str = "spear-e2e-trust";
const PORT: u16 = 8091;
const SERVER: &str = "grant";
const GRANT_SECRET: &str = "e2e-grant";
const CA_SECRET: &str = "e2e-grant-ca";
const LOGIN_ACCOUNT: &str = "e2e-login";
/// The access tokens' lifetime (the server's `--token-lifetime 5`): short, so the pod renews
/// within the step.
const TOKEN_LIFETIME_SECONDS: u64 = 5;

/// The private CA of the step, published before the chart is installed so that the operator
/// starts with it (the chart's volume is optional: it would pick it up later, too).
pub async fn publish_trust_bundle(client: &kube::Client, ca: &TestCa) -> Result<()> {
    let apply = PatchParams::apply("spear-e2e").force();
    let namespace: Namespace = serde_json::from_value(json!({"metadata": {"name": RELEASE_NAMESPACE}}))?;
    Api::<Namespace>::all(client.clone())
        .patch(RELEASE_NAMESPACE, &apply, &Patch::Apply(&namespace))
        .await
        .context("the release namespace")?;
    let config_map: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": TRUST_CONFIGMAP},
        "data": {"ca.crt": format!("subject=CN = spear-e2e-private\n{}", ca.cert_pem())},
    }))?;
    Api::<ConfigMap>::namespaced(client.clone(), RELEASE_NAMESPACE)
        .patch(TRUST_CONFIGMAP, &apply, &Patch::Apply(&config_map))
        .await
        .context("the trust bundle ConfigMap")?;
    Ok(())
}

pub async fn grant_checks(
    client: &kube::Client,
    images: &Images,
    ca: &TestCa,
    ns: &str,
    report: &mut Report,
) -> Result<()> {
    let post = PostParams::default();
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let ca_secret: Secret = serde_json::from_value(json!({
        "metadata": {"name": CA_SECRET},
        "stringData": {"ca.crt": ca.cert_pem(), "ca.key": ca.key_pem()},
    }))?;
    secrets.create(&post, &ca_secret).await?;

    // The authorization server and the protected MCP server, over HTTPS.
    let args = ["--client-secret", "unused", "--authorization-code", "--token-lifetime", "5", "--tls-ca", "/ca"];
    let args: Vec<String> = args.map(String::from).to_vec();
    let volume = json!({"name": "ca", "secret": {"secretName": CA_SECRET}});
    let ip = start_oauth_server_pod(&pods, "e2e-grant-server", &images.app, (PORT, true), &args, volume).await?;

    let mcp_server: McpServer = serde_json::from_value(json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": SERVER},
        "spec": {"transport": "streamableHttp",
                 "http": {"url": format!("https://{ip}:{PORT}/mcp"),
                          "auth": {"issuer": format!("https://{ip}:{PORT}"),
                                   "authorizationCode": {"clientId": "spear-login", "tokenSecretRef": {"name": GRANT_SECRET}}}},
                 "allowedTools": ["*"]},
    }))?;
    Api::<McpServer>::namespaced(client.clone(), ns).create(&post, &mcp_server).await?;

    login(client, images, ns).await?;
    let stored = secrets.get(GRANT_SECRET).await?;
    ensure!(stored.type_.as_deref() == Some(GRANT_SECRET_TYPE), "the login stored {:?}", stored.type_);
    let first_refresh = refresh_token(&stored)?;
    report.ok("spearlet auth login -n (in a pod, --no-browser) against an HTTPS authorization server: the grant is in its Secret");

    // What docs/auth.md gives the workload's service account: get and update on that Secret.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": "spear-grant-e2e"},
        "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": [GRANT_SECRET], "verbs": ["get", "update"]}],
    }))?;
    Api::<Role>::namespaced(client.clone(), ns).create(&post, &role).await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "spear-grant-e2e"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "spear-grant-e2e"},
        "subjects": [{"kind": "ServiceAccount", "name": "default", "namespace": ns}],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns).create(&post, &binding).await?;
    let profile: McpProfile = serde_json::from_value(json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpProfile", "metadata": {"name": SERVER},
        "spec": {"servers": [SERVER]},
    }))?;
    Api::<McpProfile>::namespaced(client.clone(), ns).create(&post, &profile).await?;
    Api::<Deployment>::namespaced(client.clone(), ns)
        .create(&post, &app_deployment_of("e2e-grant-app", &images.app, SERVER))
        .await?;
    let pod = ready_pod(&pods, "app=e2e-grant-app", POD_READY_TIMEOUT).await?;
    let agent = pod
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .find(|c| c.name == spear::api::keys::AGENT_CONTAINER)
        .context("the pod has the agent")?;
    let given = agent.env.iter().flatten().find(|e| e.name == spear::api::keys::ENV_EXTRA_CA_PEM);
    ensure!(
        given.and_then(|e| e.value.as_deref()).is_some_and(|pem| pem.contains("BEGIN CERTIFICATE")),
        "the agent was not given the operator's trust bundle inline"
    );
    let driver =
        Driver { client: client.clone(), ns: ns.to_string(), pod: pod.metadata.name.clone().context("a name")? };
    let whoami = format!("mcp__{SERVER}__whoami");
    let answer = driver.call(&whoami, &json!({})).await?;
    ensure!(
        answer["is_error"] == false && answer["text"].as_str().is_some_and(|t| t.contains("\"person\"")),
        "the server did not see the person: {answer}"
    );
    report
        .ok("the injected agent reads the grant Secret and calls as the person, over TLS from the chart's trustBundle");

    // The access token lives 5 s: the next call renews with the refresh token, which the server
    // rotates, and the agent writes the new one back.
    tokio::time::sleep(std::time::Duration::from_secs(TOKEN_LIFETIME_SECONDS + 1)).await;
    let answer = driver.call(&whoami, &json!({})).await?;
    ensure!(answer["is_error"] == false, "after the access token expired: {answer}");
    let renewed = eventually("the rotated refresh token in the Secret", std::time::Duration::from_secs(30), || async {
        let secret = secrets.get(GRANT_SECRET).await?;
        let token = refresh_token(&secret)?;
        let at = secret.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_GRANT_RENEWED_AT)).cloned();
        let done = (token != first_refresh && at.is_some()).then_some(());
        Ok((done, format!("renewed-at {at:?}, refresh token changed: {}", token != first_refresh)))
    })
    .await;
    renewed?;
    report.ok("the pod renewed the grant and wrote the rotated refresh token back to the Secret");
    Ok(())
}

/// `spearlet auth login --server grant -n NS --no-browser` in a pod of its own, with
/// e2e/app/login.py as the browser; fails with the pod's log unless it succeeded.
async fn login(client: &kube::Client, images: &Images, ns: &str) -> Result<()> {
    let post = PostParams::default();
    let account: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": LOGIN_ACCOUNT}}))?;
    Api::<ServiceAccount>::namespaced(client.clone(), ns).create(&post, &account).await?;
    // What a person running the login needs: read the McpServer, write the grant's Secret.
    let role: Role = serde_json::from_value(json!({
        "metadata": {"name": LOGIN_ACCOUNT},
        "rules": [
            {"apiGroups": ["mcp.spear.dev"], "resources": ["mcpservers"], "verbs": ["get"]},
            {"apiGroups": [""], "resources": ["secrets"], "verbs": ["get", "create", "update"]},
        ],
    }))?;
    Api::<Role>::namespaced(client.clone(), ns).create(&post, &role).await?;
    let binding: RoleBinding = serde_json::from_value(json!({
        "metadata": {"name": LOGIN_ACCOUNT},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": LOGIN_ACCOUNT},
        "subjects": [{"kind": "ServiceAccount", "name": LOGIN_ACCOUNT, "namespace": ns}],
    }))?;
    Api::<RoleBinding>::namespaced(client.clone(), ns).create(&post, &binding).await?;

    let bin = "/spear/bin";
    let spearlet = format!("{bin}/spearlet");
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": "e2e-grant-login", "annotations": {"mcp.spear.dev/inject": "false"}},
        "spec": {
            "restartPolicy": "Never",
            "serviceAccountName": LOGIN_ACCOUNT,
            "securityContext": {"runAsNonRoot": true, "runAsUser": 1000},
            "initContainers": [{
                "name": "spearlet", "image": images.spearlet, "imagePullPolicy": "IfNotPresent",
                "command": ["/spearlet", "install", "--to", spearlet],
                "volumeMounts": [{"name": "bin", "mountPath": bin}],
            }],
            "containers": [{
                "name": "login", "image": images.app, "imagePullPolicy": "IfNotPresent",
                "command": ["python3", "/e2e/login.py", "--ca", "/ca/ca.crt", "--",
                            spearlet, "auth", "login", "--server", SERVER, "-n", ns, "--no-browser", "--timeout", "120"],
                "env": [{"name": "SPEAR_EXTRA_CA_FILE", "value": "/ca/ca.crt"}],
                "volumeMounts": [{"name": "bin", "mountPath": bin, "readOnly": true},
                                 {"name": "ca", "mountPath": "/ca", "readOnly": true}],
            }],
            "volumes": [{"name": "bin", "emptyDir": {}},
                        {"name": "ca", "secret": {"secretName": CA_SECRET, "items": [{"key": "ca.crt", "path": "ca.crt"}]}}],
        },
    }))?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    pods.create(&post, &pod).await?;
    let phase = eventually("the login pod to finish", POD_READY_TIMEOUT, || async {
        let pod = pods.get("e2e-grant-login").await?;
        let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
        let done = matches!(phase.as_str(), "Succeeded" | "Failed").then(|| phase.clone());
        Ok((done, format!("phase {phase}")))
    })
    .await?;
    let log = logs(&pods, "e2e-grant-login", "login", false).await.unwrap_or_default();
    if phase != "Succeeded" {
        bail!("the login pod {phase}:\n{log}");
    }
    ensure!(log.contains("browser: the redirect to the login's listener answered 200"), "the login's log:\n{log}");
    Ok(())
}

fn refresh_token(secret: &Secret) -> Result<String> {
    let bytes = &secret.data.as_ref().and_then(|d| d.get(GRANT_SECRET_KEY)).context("the grant key")?.0;
    let grant: Value = serde_json::from_slice(bytes).context("the grant is JSON")?;
    grant["refresh_token"].as_str().map(String::from).context("the grant holds a refresh token")
}
