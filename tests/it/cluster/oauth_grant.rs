//! A person's grant in a cluster (`authorizationCode.tokenSecretRef`), against the test control
//! plane and the test authorization server (`tests/servers/oauth_server.py
//! --authorization-code`: authlib's authorization code with PKCE and refresh-token rotation):
//! `spearlet auth login -n` stores the grant in the Secret and refuses to take over one that is
//! not a grant; agents (`spearlet run` with a service account's own token) are refused until the
//! account has the Role the docs give, then share the grant, renew it one at a time (one refresh
//! for two pods, no refresh token spent twice) and write the rotated one back; a revoked grant
//! is marked on the Secret, where the operator's condition reads it, and refused with the
//! command to run. No token reaches an agent's log, audit or metrics.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use serde_json::Value;
use spear::api::{McpProfile, McpServer};
use spear::operator::rbac::{agent_cluster_role, agent_role_binding};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers;

use crate::oauth::{Agent, admin, admin_post, server_yaml, start_oauth_server, start_pod_agent};
use crate::oauth_login::consent;

const SERVER: &str = "remote";
const GRANT_SECRET: &str = "remote-grant";

/// `agent`'s call to `remote/whoami` until it says what `done` accepts (a refusal the agent
/// retries, a grant that appears), within 30 s: (success, what it said).
fn call_until(agent: &Agent, done: impl Fn(bool, &str) -> bool) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, said) = agent.call("remote/whoami");
        if done(ok, &said) {
            return (ok, said);
        }
        if Instant::now() > deadline {
            let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
            let tail: Vec<&str> = log
                .lines()
                .filter(|l| !l.contains(" DEBUG ") && !l.contains("offers no tool"))
                .rev()
                .take(30)
                .collect();
            eprintln!("the agent's log, last lines first:\n{}", tail.join("\n"));
            return (ok, said);
        }
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// `spearlet reconnect remote` on `agent`: what a person does after fixing RBAC or logging in,
/// instead of waiting for the agent's retry (its backoff reaches a minute).
fn reconnect(agent: &Agent) {
    let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["reconnect", SERVER, "--admin-addr", &format!("127.0.0.1:{}", agent.admin)])
        .output()
        .expect("spearlet reconnect");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

/// `spearlet auth login --server remote -n NS --no-browser`, as the cluster's admin; run as
/// `program` (the spearlet, or a `kubectl-spear` link to it: the kubectl plugin).
fn login(program: &Path, namespace: &str) -> Command {
    let mut command = Command::new(program);
    command
        .args(["auth", "login", "--server", SERVER, "--no-browser", "--timeout", "30", "-n", namespace])
        .env("KUBECONFIG", ControlPlane::shared().kubeconfig_path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

fn refresh_requests(port: u16) -> Vec<Value> {
    let requests = admin(port, "/admin/requests");
    requests.as_array().expect("requests").iter().filter(|r| r["grant_type"] == "refresh_token").cloned().collect()
}

fn grant_of(secret: &Secret) -> Value {
    let bytes = &secret.data.as_ref().and_then(|d| d.get("grant.json")).expect("the grant key").0;
    serde_json::from_slice(bytes).expect("the grant is JSON")
}

#[tokio::test]
async fn a_grant_in_a_secret_is_stored_by_the_login_shared_by_pods_and_renewed_one_at_a_time() {
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("oauth-grant").await;
    let port = mcp_servers::free_port();
    let _server = tokio::task::spawn_blocking(move || {
        start_oauth_server(port, &["--client-secret", "unused", "--authorization-code", "--token-lifetime", "4"])
    })
    .await
    .expect("join");

    let auth = format!(
        "    auth:\n      issuer: http://127.0.0.1:{port}\n      authorizationCode: {{clientId: spear-login, \
         tokenSecretRef: {{name: {GRANT_SECRET}}}}}\n"
    );
    let yaml = server_yaml(SERVER, port, &auth);
    let server: McpServer = serde_yaml::from_str(yaml.trim_end_matches("---\n")).expect("McpServer");
    ns.api::<McpServer>().create(&PostParams::default(), &server).await.expect("create the McpServer");
    ns.api::<McpProfile>().create(&PostParams::default(), &McpProfile::test("p").servers([SERVER])).await.expect("p");

    // The workload's service account reads the registry (the agent role) and no Secret yet.
    let apply = PatchParams::apply("spear-test").force();
    let cluster_roles = Api::<ClusterRole>::all(ns.client.clone());
    let agent_role = agent_cluster_role();
    cluster_roles.patch(&agent_role.name_any(), &apply, &Patch::Apply(&agent_role)).await.expect("agent role");
    ns.api::<RoleBinding>().create(&PostParams::default(), &agent_role_binding(&ns.name)).await.expect("bind");
    let work = tempfile::tempdir().expect("tempdir");
    let kubeconfig = work.path().join("workload.kubeconfig");
    let yaml = super::kube_source::service_account_kubeconfig_yaml(&ns.client, &ns.name, "workload").await;
    std::fs::write(&kubeconfig, yaml).expect("write kubeconfig");

    let (path, namespace) = (kubeconfig.clone(), ns.name.clone());
    let agent_a = tokio::task::spawn_blocking(move || {
        let agent = start_pod_agent(&path, &namespace, "agent-a");
        let (ok, said) = call_until(&agent, |_, said| said.contains("may not get"));
        assert!(!ok && said.contains("kubectl create role"), "without RBAC on the Secret: {said}");
        agent
    })
    .await
    .expect("join");

    // What docs/auth.md says to grant: get and update on that one Secret, by name.
    let role = Role {
        metadata: ObjectMeta { name: Some("spear-grant-remote".into()), ..ObjectMeta::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            resource_names: Some(vec![GRANT_SECRET.into()]),
            verbs: vec!["get".into(), "update".into()],
            ..PolicyRule::default()
        }]),
    };
    ns.api::<Role>().create(&PostParams::default(), &role).await.expect("role");
    let binding = RoleBinding {
        metadata: ObjectMeta { name: Some("spear-grant-remote".into()), ..ObjectMeta::default() },
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "spear-grant-remote".into(),
        },
        subjects: Some(vec![Subject {
            kind: "ServiceAccount".into(),
            name: "workload".into(),
            namespace: Some(ns.name.clone()),
            ..Subject::default()
        }]),
    };
    ns.api::<RoleBinding>().create(&PostParams::default(), &binding).await.expect("binding");
    let hint = format!("spearlet auth login --server remote -n {}", ns.name);
    let agent_a = tokio::task::spawn_blocking({
        let hint = hint.clone();
        move || {
            reconnect(&agent_a);
            let (ok, said) = call_until(&agent_a, |_, said| said.contains("does not exist"));
            assert!(!ok && said.contains(&hint), "before any login: {said}");
            agent_a
        }
    })
    .await
    .expect("join");

    // A Secret of that name that is not a grant is never overwritten by a login.
    let secrets = ns.api::<Secret>();
    let unrelated = Secret {
        metadata: ObjectMeta { name: Some(GRANT_SECRET.into()), ..ObjectMeta::default() },
        data: Some(BTreeMap::from([("password".to_string(), ByteString(b"keep me".to_vec()))])),
        ..Secret::default()
    };
    secrets.create(&PostParams::default(), &unrelated).await.expect("an unrelated Secret");
    // As `kubectl spear auth login`, the plugin.
    let plugin_dir = tempfile::tempdir().expect("tempdir");
    let plugin = plugin_dir.path().join("kubectl-spear");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_spearlet"), &plugin).expect("link the plugin name");
    let namespace = ns.name.clone();
    let out = tokio::task::spawn_blocking(move || login(&plugin, &namespace).output().expect("the login runs"))
        .await
        .expect("join");
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(said.contains("does not overwrite it"), "{said}");
    let kept = secrets.get(GRANT_SECRET).await.expect("still there");
    assert_eq!(kept.data, unrelated.data, "the unrelated Secret is untouched");
    secrets.delete(GRANT_SECRET, &DeleteParams::default()).await.expect("delete");

    // The person's login stores the grant in the Secret.
    let namespace = ns.name.clone();
    let out = tokio::task::spawn_blocking(move || {
        consent(login(Path::new(env!("CARGO_BIN_EXE_spearlet")), &namespace).spawn().expect("the login"), port).1
    })
    .await
    .expect("join");
    let said = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success() && said.contains(&format!("Secret {}/{GRANT_SECRET}", ns.name)), "{said}");
    let stored = secrets.get(GRANT_SECRET).await.expect("the grant Secret");
    assert_eq!(stored.type_.as_deref(), Some("mcp.spear.dev/oauth-grant"));
    assert_eq!(stored.labels().get("mcp.spear.dev/grant-for").map(String::as_str), Some(SERVER));
    assert_eq!(stored.annotations().get("mcp.spear.dev/allowed-servers").map(String::as_str), Some(SERVER));
    assert!(stored.annotations().contains_key("mcp.spear.dev/grant-renewed-at"), "{:?}", stored.annotations());
    let first = grant_of(&stored);
    let first_refresh = first["refresh_token"].as_str().expect("a refresh token").to_string();
    assert!(!said.contains(&first_refresh), "the login printed the refresh token");

    // Two pods share it: both call with the login's access token, then, once it is due, one of
    // them renews and the other takes the token it wrote: one refresh, never the same refresh
    // token twice (the authorization server rotates it: a second use would be refused).
    let (path, namespace) = (kubeconfig.clone(), ns.name.clone());
    let (agent_a, agent_b) = tokio::task::spawn_blocking(move || {
        reconnect(&agent_a);
        let (ok, said) = call_until(&agent_a, |ok, _| ok);
        assert!(ok && said.contains("person"), "after the login: {said}");
        let agent_b = start_pod_agent(&path, &namespace, "agent-b");
        let (ok, said) = call_until(&agent_b, |ok, _| ok);
        assert!(ok && said.contains("person"), "the second pod: {said}");
        assert_eq!(refresh_requests(port), Vec::<Value>::new(), "the login's access token served both");
        std::thread::sleep(Duration::from_millis(4500));
        let (a, b) = std::thread::scope(|s| {
            let a = s.spawn(|| agent_a.call("remote/whoami"));
            let b = s.spawn(|| agent_b.call("remote/whoami"));
            (a.join().expect("a"), b.join().expect("b"))
        });
        assert!(a.0 && b.0, "both pods after expiry: {a:?} {b:?}");
        let refreshed = refresh_requests(port);
        assert_eq!(refreshed.len(), 1, "one renewal for two pods: {refreshed:?}");
        assert_eq!(refreshed[0]["status"], 200, "{refreshed:?}");
        (agent_a, agent_b)
    })
    .await
    .expect("join");
    let renewed = secrets.get(GRANT_SECRET).await.expect("the grant Secret");
    let second_refresh = grant_of(&renewed)["refresh_token"].as_str().expect("a refresh token").to_string();
    assert_ne!(second_refresh, first_refresh, "the rotated refresh token was written back");
    assert!(!renewed.annotations().contains_key("mcp.spear.dev/grant-renewing"), "the claim was released");

    // Revoked: the next renewal is refused, marked on the Secret, and the call names the login.
    let (agent_a, agent_b, everything) = tokio::task::spawn_blocking(move || {
        admin_post(port, "/admin/revoke");
        std::thread::sleep(Duration::from_millis(4500));
        let (ok, said) = agent_a.call("remote/whoami");
        assert!(!ok && said.contains(&hint), "after revocation: {said}");
        // The other pod reads the mark and asks the authorization server nothing.
        let (ok, said) = agent_b.call("remote/whoami");
        assert!(!ok && said.contains(&hint) && said.contains("was refused"), "the other pod: {said}");
        let refused: Vec<Value> = refresh_requests(port).into_iter().filter(|r| r["status"] != 200).collect();
        assert_eq!(refused.len(), 1, "one refused renewal for two pods: {refused:?}");
        let everything = format!("{}{}", agent_a.everything_said(), agent_b.everything_said());
        (agent_a, agent_b, everything)
    })
    .await
    .expect("join");
    let marked = secrets.get(GRANT_SECRET).await.expect("the grant Secret");
    let why = marked.annotations().get("mcp.spear.dev/grant-login-required").cloned().unwrap_or_default();
    assert!(why.contains("invalid_grant"), "{:?}", marked.annotations());
    for token in [&first_refresh, &second_refresh] {
        assert!(!everything.contains(token.as_str()), "a refresh token leaked");
    }
    for token in admin(port, "/admin/tokens")["tokens"].as_array().expect("tokens") {
        assert!(!everything.contains(token.as_str().expect("token")), "an access token leaked");
    }
    drop((agent_a, agent_b));
}
