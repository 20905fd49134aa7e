//! `spearlet explain` in cluster mode and `kubectl spear explain` (the same binary invoked as
//! `kubectl-spear`) against the real test control plane: the same decision log as local mode
//! over the same objects, the revision a pod's agent reports for them, a pod's profile and
//! injection read from the pod, and every refusal naming its fix. The control plane has no node,
//! so pods stay Pending: `--connect` is tested for real in the e2e (`e2e/main.rs`), and here only
//! its "agent unreachable" answer.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::PostParams;
use serde_json::{Value, json};
use spear::api::api_key::ApiKey;
use spear::api::keys::{ANNOTATION_PROFILE, INJECTION_ENABLED, LABEL_INJECTION};
use spear::api::{McpProfile, McpServer};
use spear::operator::inject::{self, Decision, InjectConfig};
use spear::registry::{KubeSource, RegistryView};
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use tokio_util::sync::CancellationToken;

/// An http server nobody listens on: explain without --connect never dials it.
const NOBODY: u16 = 9;

/// Runs the spearlet as `name` (a link to it in `dir` when `name` is not `spearlet`) with
/// `args`, the test control plane's kubeconfig in KUBECONFIG unless `env` overrides it.
fn run_as(name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let spearlet = PathBuf::from(env!("CARGO_BIN_EXE_spearlet"));
    let dir = tempfile::tempdir().expect("tempdir");
    let program = if name == "spearlet" {
        spearlet
    } else {
        let link = dir.path().join(name);
        std::os::unix::fs::symlink(&spearlet, &link).expect("link the plugin name to the spearlet");
        link
    };
    let mut command = Command::new(program);
    command.args(args).env("KUBECONFIG", ControlPlane::shared().kubeconfig_path()).env_remove("SPEAR_PROFILE");
    command.env_remove("SPEAR_REGISTRY_DIR");
    for (key, value) in env {
        command.env(key, value);
    }
    command.output().expect("the spearlet must start")
}

fn explain(args: &[&str]) -> Output {
    run_as("spearlet", &[&["explain"], args].concat(), &[])
}

fn kubectl_spear(args: &[&str]) -> Output {
    run_as("kubectl-spear", args, &[])
}

fn stdout_json(out: &Output) -> Value {
    assert!(out.status.success(), "explain failed: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&out.stdout)))
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Servers `fs` (read_* allowed), `git` (push denied) and `other` (in no profile); profile `dev`
/// names fs, git and a missing `web`, and denies `read_secret`; profile `ops` exists too.
fn registry() -> (Vec<McpServer>, Vec<McpProfile>) {
    let servers = vec![
        McpServer::test("fs").http_at(NOBODY).allowing(["read_*"]),
        McpServer::test("git").http_at(NOBODY).allowing(["*"]).denying(["push"]),
        McpServer::test("other").http_at(NOBODY).allowing(["*"]),
    ];
    let profiles = vec![
        McpProfile::test("dev").servers(["fs", "git", "web"]).tool_denylist(["read_secret"]),
        McpProfile::test("ops").servers(["other"]),
    ];
    (servers, profiles)
}

async fn create_registry(ns: &TestNamespace) -> (Vec<McpServer>, Vec<McpProfile>) {
    let (servers, profiles) = registry();
    for server in &servers {
        ns.api::<McpServer>().create(&PostParams::default(), server).await.expect("create server");
    }
    for profile in &profiles {
        ns.api::<McpProfile>().create(&PostParams::default(), profile).await.expect("create profile");
    }
    (servers, profiles)
}

/// The same objects as manifests in a directory, for local mode.
fn write_registry(dir: &Path, servers: &[McpServer], profiles: &[McpProfile]) {
    let mut text = String::new();
    for object in servers.iter().map(serde_yaml::to_string).chain(profiles.iter().map(serde_yaml::to_string)) {
        text.push_str("---\n");
        text.push_str(&object.expect("YAML"));
    }
    fs::write(dir.join("registry.yaml"), text).expect("write the registry");
}

#[tokio::test]
async fn cluster_mode_gives_local_modes_decisions_at_the_revision_the_agent_reports() {
    let ns = ControlPlane::shared().namespace("explain-profile").await;
    let (servers, profiles) = create_registry(&ns).await;

    let cluster = stdout_json(&explain(&["-n", &ns.name, "--profile", "dev", "--output", "json"]));
    let dir = tempfile::tempdir().expect("tempdir");
    write_registry(dir.path(), &servers, &profiles);
    let registry_dir = dir.path().to_str().expect("utf-8");
    let local = stdout_json(&explain(&["--registry-dir", registry_dir, "--profile", "dev", "--output", "json"]));
    for key in ["profile", "servers", "excluded", "loopBudgets", "toolsListed", "note"] {
        assert_eq!(cluster[key], local[key], "{key} differs between cluster and local mode");
    }
    let excluded: Vec<(&str, &str)> = cluster["excluded"]
        .as_array()
        .expect("excluded")
        .iter()
        .map(|d| (d["server"].as_str().unwrap_or_default(), d["reason"].as_str().unwrap_or_default()))
        .collect();
    assert!(excluded.contains(&("web", "unknown_server")), "{excluded:?}");
    assert!(excluded.contains(&("other", "not_in_profile")), "{excluded:?}");
    assert_eq!(
        cluster["source"],
        json!({"cluster": {"namespace": ns.name, "context": cluster["source"]["cluster"]["context"]}})
    );

    // The revision is the one the pod's agent computes from its own watch of the same objects.
    let watch = KubeSource::watch(ns.client.clone(), &ns.name, "dev", &CancellationToken::new()).expect("names");
    tokio::time::timeout(Duration::from_secs(60), watch.ready()).await.expect("synced in time").expect("runs");
    assert_eq!(cluster["revision"].as_str(), Some(watch.snapshot().revision().as_str()));

    let table = explain(&["--namespace", &ns.name, "--profile", "dev"]);
    assert!(table.status.success(), "{}", stderr(&table));
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.starts_with(&format!("cluster: namespace {}, context spear-test", ns.name)), "{table}");
    assert!(table.contains("profile dev at registry revision ") && table.contains("unknown_server"), "{table}");

    // A profile that does not exist names the ones that do.
    let missing = explain(&["-n", &ns.name, "--profile", "nope"]);
    assert_eq!(missing.status.code(), Some(1), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("McpProfile nope does not exist") && stderr(&missing).contains("dev, ops"));
}

/// A pod with one app container, annotated with `profile` when given.
fn app_pod(name: &str, profile: Option<&str>) -> Pod {
    let annotations: Vec<(&str, &str)> = profile.map(|p| (ANNOTATION_PROFILE, p)).into_iter().collect();
    let mut pod = spear::testing::fixtures::app_pod(&annotations);
    pod.metadata.annotations = profile.and(pod.metadata.annotations);
    pod.metadata.name = Some(name.into());
    pod
}

#[tokio::test]
async fn kubectl_spear_reads_the_pods_profile_and_injection_and_names_each_fix() {
    let ns = ControlPlane::shared().namespace("explain-pod").await;
    let (servers, profiles) = create_registry(&ns).await;
    let pods = ns.api::<Pod>();
    // The pod exactly as the webhook admits it (the same `mutate`), created directly: the test
    // control plane runs no webhook for this namespace, and no node runs any pod.
    let mut sent = app_pod("app", Some("dev"));
    sent.metadata.namespace = Some(ns.name.clone());
    let enabled = BTreeMap::from([(LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string())]);
    let config = InjectConfig::new("example.com/agent:1", "example.com/spearlet:1");
    let Ok(Decision::Patch { pod: injected, .. }) = inject::mutate(
        &sent,
        &enabled,
        Some(&profiles[0]),
        &servers[..2],
        &Default::default(),
        &config,
        &ApiKey::random().expect("randomness"),
    ) else {
        panic!("a pod naming an existing profile in an enabled namespace must be patched");
    };
    for pod in [*injected, app_pod("plain", Some("dev")), app_pod("bare", None), app_pod("typo", Some("dve"))] {
        pods.create(&PostParams::default(), &pod).await.expect("create pod");
    }

    let app = stdout_json(&kubectl_spear(&["explain", "-n", &ns.name, "--pod", "app", "-o", "json"]));
    assert_eq!(app["profile"], "dev");
    assert_eq!(app["pod"]["injected"], true);
    assert_eq!(app["pod"]["adminPort"], 4042, "the injected agent's admin port");
    assert!(app.get("live").is_none(), "no --connect, no live answer");

    let plain = kubectl_spear(&["explain", "-n", &ns.name, "--pod", "plain"]);
    assert!(plain.status.success(), "{}", stderr(&plain));
    let table = String::from_utf8_lossy(&plain.stdout);
    assert!(table.contains("pod ") && table.contains("/plain: phase Pending, profile dev"), "{table}");
    assert!(table.contains("NOT injected") && table.contains(LABEL_INJECTION), "{table}");

    let refusals: [(&[&str], &str); 5] = [
        (&["--pod", "plain", "--connect"], "has no spearlet agent (it was not injected)"),
        (&["--pod", "app", "--connect"], "cannot reach the agent of pod"),
        (&["--pod", "bare"], "has no mcp.spear.dev/profile annotation"),
        (&["--pod", "typo"], "McpProfile dve does not exist"),
        (&["--pod", "ghost"], "pod ghost not found in namespace"),
    ];
    for (args, expected) in refusals {
        let out = kubectl_spear(&[&["explain", "-n", &ns.name], args].concat());
        assert_eq!(out.status.code(), Some(1), "{args:?}: {}", stderr(&out));
        assert!(stderr(&out).contains(expected), "{args:?}: {}", stderr(&out));
    }
    let unreachable = stderr(&kubectl_spear(&["explain", "-n", &ns.name, "--pod", "app", "--connect"]));
    assert!(unreachable.contains("kubectl logs app"), "the fix names where to look: {unreachable}");
    assert!(unreachable.contains("port-forward refused: 400 pod app does not have a host assigned"), "{unreachable}");
    let typo = stderr(&kubectl_spear(&["explain", "-n", &ns.name, "--pod", "typo"]));
    assert!(typo.contains("pod typo's mcp.spear.dev/profile annotation"), "{typo}");

    // The plugin is explain only; mixing local and cluster flags is a usage error.
    assert_eq!(kubectl_spear(&["serve"]).status.code(), Some(2));
    let mixed = kubectl_spear(&["explain", "--registry-dir", "examples/registry", "--pod", "app"]);
    assert_eq!(mixed.status.code(), Some(2), "{}", stderr(&mixed));
    let connect = explain(&["-n", &ns.name, "--profile", "dev", "--connect"]);
    assert_eq!(connect.status.code(), Some(2), "{}", stderr(&connect));
    assert!(stderr(&connect).contains("pass --pod NAME"), "{}", stderr(&connect));
}

/// A kubeconfig file for service account `namespace/name` (created here, with no RBAC).
async fn service_account_kubeconfig(ns: &TestNamespace, name: &str, dir: &Path) -> PathBuf {
    let yaml = super::kube_source::service_account_kubeconfig_yaml(&ns.client, &ns.name, name).await;
    let path = dir.join("kubeconfig");
    fs::write(&path, yaml).expect("write the kubeconfig");
    path
}

#[tokio::test]
async fn refusals_name_the_verb_and_resource_and_a_missing_config_names_the_flag() {
    let ns = ControlPlane::shared().namespace("explain-rbac").await;
    create_registry(&ns).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let kubeconfig = service_account_kubeconfig(&ns, "nobody", dir.path()).await;
    let kubeconfig = kubeconfig.to_str().expect("utf-8");

    let profile = explain(&["--kubeconfig", kubeconfig, "-n", &ns.name, "--profile", "dev"]);
    assert_eq!(profile.status.code(), Some(1), "{}", stderr(&profile));
    let expected = format!("kubectl auth can-i list mcpprofiles.mcp.spear.dev -n {}", ns.name);
    assert!(stderr(&profile).contains(&expected), "{}", stderr(&profile));
    let pod = explain(&["--kubeconfig", kubeconfig, "-n", &ns.name, "--pod", "app"]);
    assert!(stderr(&pod).contains(&format!("get pods in namespace {}", ns.name)), "{}", stderr(&pod));

    // No kubeconfig anywhere and not in a pod: a usage error naming the flag and variable.
    let home = tempfile::tempdir().expect("tempdir");
    let home = home.path().to_str().expect("utf-8");
    let out = run_as("kubectl-spear", &["explain", "--profile", "dev"], &[("KUBECONFIG", ""), ("HOME", home)]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("pass --kubeconfig FILE or set KUBECONFIG"), "{}", stderr(&out));
    let missing = explain(&["--kubeconfig", "/no/such/kubeconfig", "--profile", "dev"]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("--kubeconfig /no/such/kubeconfig"), "{}", stderr(&missing));
}

/// `kubectl spear pin NAME -n NS`: the namespace's McpServer, listed from this machine as an
/// agent would, printed with a pin for each tool it serves and without what the API server
/// added; a server the namespace does not have is a usage error naming it.
// Multi-threaded: the echo server runs on the test's runtime while the test waits on the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_spear_pin_prints_a_clusters_server_with_its_pins() {
    let ns = ControlPlane::shared().namespace("pin-cli").await;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
    let port = listener.local_addr().expect("a bound listener has an address").port();
    let echo = tokio::spawn(spear::testing::echo::serve_http(listener));
    let server = McpServer::test("echo").http(format!("http://127.0.0.1:{port}/mcp")).allowing(["*"]);
    ns.api::<McpServer>().create(&PostParams::default(), &server).await.expect("create the McpServer");

    let pinned = kubectl_spear(&["pin", "echo", "-n", &ns.name]);
    assert!(pinned.status.success(), "{}", stderr(&pinned));
    let manifest: McpServer = serde_yaml::from_slice(&pinned.stdout).expect("the output is one McpServer");
    let pinning = manifest.spec.pinning.expect("pinning filled");
    assert_eq!(pinning.tools.keys().collect::<Vec<_>>(), ["echo"]);
    assert!(pinning.tools["echo"].starts_with("sha256:") && pinning.tools["echo"].len() == 71);
    assert_eq!(manifest.metadata.namespace.as_deref(), Some(ns.name.as_str()));
    assert!(
        manifest.metadata.uid.is_none() && manifest.metadata.resource_version.is_none() && manifest.status.is_none()
    );
    assert!(manifest.metadata.managed_fields.is_none());

    let missing = kubectl_spear(&["pin", "ghost", "-n", &ns.name]);
    assert_eq!(missing.status.code(), Some(2), "{}", stderr(&missing));
    assert!(stderr(&missing).contains("no valid McpServer named 'ghost'"), "{}", stderr(&missing));
    echo.abort();
}
