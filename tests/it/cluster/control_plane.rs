//! The test control plane (`spear::testing::control_plane`): the CRDs it installs serve both
//! kinds and enforce the schema and CEL rules as a real cluster does, the examples are valid
//! objects, and no process outlives the test binary.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::fixtures;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Resource, ResourceExt};
use spear::api::manifest::{self, Object};
use spear::api::{McpProfile, McpServer, crd};
use spear::testing::control_plane::ControlPlane;

/// Env var that turns `helper_starts_control_plane_then_aborts` from a no-op into the helper.
const ENV_ABORT_HELPER: &str = "SPEAR_TEST_ABORT_HELPER";
/// The fixture set is meant to cover every rule; fewer files means some went missing.
const MIN_INVALID_FIXTURES: usize = 25;

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The `*.yaml` files of `dir`, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let entries = fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {} must succeed: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .map(|entry| entry.expect("a directory entry must be readable").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "yaml"))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn crds_are_established_and_serve_both_kinds() {
    let control_plane = ControlPlane::shared();
    println!(
        "test control plane started in {:?} (kubeconfig: {})",
        control_plane.startup_time(),
        control_plane.kubeconfig_path().display()
    );
    let ns = control_plane.namespace("crds").await;

    let servers = ns.api::<McpServer>().list(&ListParams::default()).await.expect("McpServers must be listable");
    let profiles = ns.api::<McpProfile>().list(&ListParams::default()).await.expect("McpProfiles must be listable");

    assert!(servers.items.is_empty(), "a fresh namespace holds no McpServer: {:?}", servers.items);
    assert!(profiles.items.is_empty(), "a fresh namespace holds no McpProfile: {:?}", profiles.items);
}

#[tokio::test]
async fn kubeconfig_file_connects_as_admin() {
    let control_plane = ControlPlane::shared();
    let kubeconfig = Kubeconfig::read_from(control_plane.kubeconfig_path()).expect("the kubeconfig file must parse");
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .expect("the kubeconfig file must load as a client config");
    let client = Client::try_from(config).expect("the kubeconfig file must build a client");

    // Listing CRDs is cluster-scoped and needs more than a namespaced role: the user is an admin.
    let crds = Api::<CustomResourceDefinition>::all(client)
        .list_metadata(&ListParams::default())
        .await
        .expect("the kubeconfig's user must be allowed to list CRDs");
    let names: Vec<_> = crds.items.iter().map(ResourceExt::name_any).collect();
    for definition in crd::definitions() {
        assert!(names.contains(&definition.name_any()), "CRD {} must be installed: {names:?}", definition.name_any());
    }
}

#[tokio::test]
async fn server_side_apply_round_trips_a_server() {
    let ns = ControlPlane::shared().namespace("ssa").await;
    let api = ns.api::<McpServer>();
    let server = McpServer::test("filesystem")
        .display_name("Filesystem")
        .stdio("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data"])
        .allowing(["read_*", "list_*"])
        .denying(["read_secret*"]);
    let params = PatchParams::apply("spear-test-ssa");

    let applied = api.patch("filesystem", &params, &Patch::Apply(&server)).await.expect("applying a valid server");
    let read = api.get("filesystem").await.expect("the applied server must be readable");

    assert_eq!(read.spec, server.spec, "the stored spec must equal the applied one (no defaulting, no pruning)");
    let version = read.resource_version().expect("a stored object must have a resourceVersion");
    assert_eq!(applied.resource_version().as_deref(), Some(version.as_str()));
    let appliers: Vec<_> = read
        .managed_fields()
        .iter()
        .filter(|entry| entry.operation.as_deref() == Some("Apply"))
        .map(|entry| entry.manager.clone().unwrap_or_default())
        .collect();
    assert_eq!(appliers, ["spear-test-ssa"], "the applier must own the fields it set");

    // Re-applying the same intent is a no-op: status writers rely on this to skip needless writes.
    let again = api.patch("filesystem", &params, &Patch::Apply(&server)).await.expect("re-applying the same server");
    assert_eq!(again.resource_version(), Some(version), "an identical apply must not write");
}

#[tokio::test]
async fn examples_are_accepted_by_the_api_server() {
    let dir = manifest_dir().join("examples/registry");
    let files = yaml_files(&dir);
    assert!(!files.is_empty(), "{} must hold the local-mode examples (*.yaml)", dir.display());
    let ns = ControlPlane::shared().namespace("examples").await;

    let mut failures = Vec::new();
    let mut created = 0;
    for file in &files {
        let text = fs::read_to_string(file).unwrap_or_else(|e| panic!("reading {} must succeed: {e}", file.display()));
        let parsed = manifest::parse(&text);
        for problem in &parsed.problems {
            failures.push(format!("{}: {problem}", file.display()));
        }
        for document in parsed.documents {
            let (kind, name) = (document.object.kind(), document.object.name().to_string());
            let result = match document.object {
                Object::Server(mut server) => {
                    server.metadata.namespace = None;
                    ns.api::<McpServer>().create(&PostParams::default(), &server).await.map(drop)
                }
                Object::Profile(mut profile) => {
                    profile.metadata.namespace = None;
                    ns.api::<McpProfile>().create(&PostParams::default(), &profile).await.map(drop)
                }
            };
            match result {
                Ok(()) => created += 1,
                Err(e) => failures.push(format!("{}:{}: {kind} {name} rejected: {e}", file.display(), document.line)),
            }
        }
    }

    assert!(failures.is_empty(), "examples the API server does not accept:\n{}", failures.join("\n"));
    assert!(created > 0, "the examples in {} must contain at least one object", dir.display());
}

/// What a fixture's header says the API server does with it.
#[derive(Debug, PartialEq)]
enum ApiVerdict {
    Rejects,
    Accepts,
}

/// An invalid manifest with its header: `# field: <path>` and `# api: rejects|accepts`.
struct Fixture {
    name: String,
    field: String,
    verdict: ApiVerdict,
    object: serde_json::Value,
}

impl Fixture {
    /// The API-server view of a fixture whose headers `fixtures::invalid_fixtures` has read.
    fn from_file(file: &fixtures::Fixture) -> Result<Fixture, String> {
        let name = file.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let verdict = if file.api_rejects { ApiVerdict::Rejects } else { ApiVerdict::Accepts };
        // The raw document, not the Rust type: the fixture may not even deserialize into it.
        let yaml: serde_yaml::Value =
            serde_yaml::from_str(&file.text).map_err(|e| format!("{name}: not one YAML document: {e}"))?;
        let mut object = serde_json::to_value(yaml).map_err(|e| format!("{name}: not JSON-compatible: {e}"))?;
        if let Some(metadata) = object.get_mut("metadata").and_then(serde_json::Value::as_object_mut) {
            metadata.remove("namespace");
        }
        Ok(Fixture { name, field: file.field.clone(), verdict, object })
    }

    /// The resource the fixture's `kind` names, as the CRD generated from the Rust types serves it.
    fn api_resource(&self) -> Result<ApiResource, String> {
        let kind = self.object.get("kind").and_then(serde_json::Value::as_str).unwrap_or_default();
        let definition = crd::definitions()
            .into_iter()
            .find(|definition| definition.spec.names.kind == kind)
            .ok_or_else(|| format!("{}: kind {kind:?} is not one of our CRDs", self.name))?;
        let version = definition
            .spec
            .versions
            .iter()
            .find(|version| version.storage)
            .map(|version| version.name.clone())
            .ok_or_else(|| format!("{}: CRD {} has no storage version", self.name, definition.name_any()))?;
        let gvk = GroupVersionKind::gvk(&definition.spec.group, &version, kind);
        Ok(ApiResource::from_gvk_with_plural(&gvk, &definition.spec.names.plural))
    }
}

#[tokio::test]
async fn invalid_fixtures_are_rejected_by_the_api_server_naming_the_field() {
    let files = fixtures::invalid_fixtures();
    assert!(
        files.len() >= MIN_INVALID_FIXTURES,
        "tests/fixtures/invalid must hold at least {MIN_INVALID_FIXTURES} fixtures, found {}",
        files.len()
    );
    let ns = ControlPlane::shared().namespace("invalid").await;

    let mut mismatches = Vec::new();
    let mut only_validate = Vec::new();
    for file in &files {
        let read = Fixture::from_file(file).and_then(|fixture| Ok((fixture.api_resource()?, fixture)));
        let (resource, fixture) = match read {
            Ok(read) => read,
            Err(problem) => {
                mismatches.push(problem);
                continue;
            }
        };
        // A raw POST of the fixture's JSON: `Api::create` would need it to be a valid object first.
        let url = DynamicObject::url_path(&resource, Some(&ns.name));
        let body = serde_json::to_vec(&fixture.object).expect("a JSON value must serialize");
        let request = kube::core::Request::new(url)
            .create(&PostParams::default(), body)
            .expect("a create request must build from a JSON body");
        let outcome = ns.client.request::<DynamicObject>(request).await;
        if let Ok(created) = &outcome {
            // Fixtures reuse names: remove what got in so the next one starts clean.
            let api = Api::<DynamicObject>::namespaced_with(ns.client.clone(), &ns.name, &resource);
            api.delete(&created.name_any(), &DeleteParams::default()).await.expect("deleting an accepted fixture");
        }

        let (name, field) = (&fixture.name, &fixture.field);
        match (&fixture.verdict, outcome) {
            (ApiVerdict::Rejects, Ok(_)) => mismatches
                .push(format!("{name}: expected a rejection naming `{field}`, but the API server accepted it")),
            (ApiVerdict::Rejects, Err(error)) => {
                let message = api_message(&error);
                if !message.contains(field.as_str()) {
                    mismatches.push(format!("{name}: rejected, but the message does not name `{field}`: {message}"));
                }
            }
            (ApiVerdict::Accepts, Ok(_)) => only_validate.push(format!("{name} ({field})")),
            (ApiVerdict::Accepts, Err(error)) => mismatches.push(format!(
                "{name}: header says only validate() catches `{field}`, but the API server rejected it: {}",
                api_message(&error)
            )),
        }
    }

    println!("fixtures only validate() catches ({}):", only_validate.len());
    for fixture in &only_validate {
        println!("  {fixture}");
    }
    assert!(
        mismatches.is_empty(),
        "{} of {} fixtures disagree with their header:\n{}",
        mismatches.len(),
        files.len(),
        mismatches.join("\n")
    );
}

/// The API server's own message (it names the field), without the client's wrapping.
fn api_message(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => status.message.clone(),
        other => other.to_string(),
    }
}

/// Whether `pid` is still a live process: gone, or a zombie someone else must reap, is not.
fn is_running(pid: u32) -> bool {
    let Ok(stat) = fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The fields after the command name (which may contain spaces) start with state and ppid.
    let mut fields = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or_default().split_whitespace();
    let state = fields.next();
    let parent = fields.next().and_then(|ppid| ppid.parse::<u32>().ok());
    !(state == Some("Z") && parent != Some(std::process::id()))
}

#[test]
fn no_process_is_left_behind() {
    let exe = std::env::current_exe().expect("the test binary must know its own path");
    let output = Command::new(exe)
        .args([
            "--exact",
            "cluster::control_plane::helper_starts_control_plane_then_aborts",
            "--ignored",
            "--nocapture",
        ])
        .args(["--test-threads=1"])
        .env(ENV_ABORT_HELPER, "1")
        .stdin(Stdio::null())
        .output()
        .expect("re-running the test binary must succeed");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report =
        || format!("helper {}\nstdout:\n{stdout}\nstderr:\n{}", output.status, String::from_utf8_lossy(&output.stderr));
    // libtest prints `test <name> ... ` without a newline before the helper's first line.
    let value = |key: &str| {
        stdout
            .lines()
            .find_map(|line| line.split_once(key).map(|(_, value)| value))
            .unwrap_or_else(|| panic!("no {key} line; {}", report()))
    };
    let pids: Vec<u32> = ["etcd-pid=", "apiserver-pid="]
        .map(|key| value(key).parse().unwrap_or_else(|e| panic!("bad {key} line ({e}); {}", report())))
        .into();
    let dirs: Vec<PathBuf> = ["etcd-dir=", "apiserver-dir="].map(|key| PathBuf::from(value(key))).into();
    assert!(!output.status.success(), "the helper must have aborted; {}", report());

    // The processes notice the closed stdin pipe at once; 10 s leaves room for a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(10);
    while pids.iter().any(|&pid| is_running(pid)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let running: Vec<_> = pids.iter().filter(|&&pid| is_running(pid)).collect();
    assert!(running.is_empty(), "processes left behind by an aborted test binary: {running:?}; {}", report());
    let kept: Vec<_> = dirs.iter().filter(|dir| dir.exists()).collect();
    assert!(kept.is_empty(), "directories left behind (keys, etcd data): {kept:?}");
}

#[test]
#[ignore = "run by no_process_is_left_behind"]
fn helper_starts_control_plane_then_aborts() {
    if std::env::var_os(ENV_ABORT_HELPER).is_none() {
        return;
    }
    let control_plane = ControlPlane::shared();
    let dir = |log: &Path| log.parent().map(|dir| dir.display().to_string()).unwrap_or_default();
    println!("etcd-pid={}", control_plane.etcd_pid());
    println!("apiserver-pid={}", control_plane.apiserver_pid());
    println!("etcd-dir={}", dir(control_plane.etcd_log()));
    println!("apiserver-dir={}", dir(control_plane.apiserver_log()));
    std::io::stdout().flush().expect("stdout must flush before the abort");
    // No unwinding, no destructors, no atexit: the harshest way a test binary can end.
    std::process::abort();
}
