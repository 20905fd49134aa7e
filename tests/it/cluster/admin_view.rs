//! The operator's admin view (`spear_operator::admin_view`) against the real test control plane,
//! read by a real browser: headless Chromium (Debian's package, `hack/chromium.sh`) loads the
//! page the view serves over the example registry, the operator's own controller writes the
//! status it shows, and the test keeps a screenshot.
//!
//! The browser runs with a proxy at a closed loopback port (`--proxy-server`), so anything it
//! would fetch from another host fails; the page needs nothing but its own origin.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::Value;
use spear::api::{McpProfile, McpServer};
use spear::operator::admin_view::{self, AdminViewConfig, DEFAULT_ALLOWED_HOSTS};
use spear::operator::controller::{self, ControllerConfig, ControllerMetrics};
use spear::operator::probe::{AddressDenyList, ProbeConfig, ProbeNamespaces};
use spear::operator::scope::Scope;
use spear::registry::dir::DirSource;
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use tokio_util::sync::CancellationToken;

/// Longest wait for the controller and the view to settle; generous for a loaded 2-core box.
const SETTLE: Duration = Duration::from_secs(60);
/// Longest a browser run may take.
const BROWSER_TIMEOUT: Duration = Duration::from_secs(90);
/// The failing server's display name: markup an McpServer author could write.
const HOSTILE_NAME: &str = "<script>document.title='pwned'</script>Broken <b>server</b>";

/// Debian's chromium (`SPEAR_CHROMIUM`, which hack/test.sh sets from hack/chromium.sh).
fn chromium() -> PathBuf {
    let path = std::env::var_os("SPEAR_CHROMIUM").map_or_else(|| PathBuf::from("/usr/bin/chromium"), PathBuf::from);
    assert!(
        path.is_file(),
        "no chromium at {}: run hack/chromium.sh (installs Debian's chromium package)",
        path.display()
    );
    path
}

/// Where test artifacts go: `$CARGO_TARGET_DIR/test-artifacts` (the target dir this binary
/// was built in when the variable is unset).
fn artifacts_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| {
        let exe = std::env::current_exe().expect("the test binary has a path");
        // <target>/debug/deps/it-<hash>
        exe.ancestors().nth(3).expect("the test binary lives in <target>/<profile>/deps").to_path_buf()
    });
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("creating the test-artifacts directory");
    dir
}

/// Runs headless Chromium with `args` after the common ones; its stdout.
async fn browser(args: &[String], profile_dir: &Path) -> String {
    let mut command = tokio::process::Command::new(chromium());
    command
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-default-apps",
            "--disable-extensions",
            "--disable-sync",
            "--disable-domain-reliability",
            "--hide-scrollbars",
            // Loopback is never proxied; anything else goes to a closed port and fails.
            "--proxy-server=http://127.0.0.1:9",
        ])
        .arg(format!("--user-data-dir={}", profile_dir.display()))
        .args(args)
        .kill_on_drop(true);
    let output = tokio::time::timeout(BROWSER_TIMEOUT, command.output())
        .await
        .expect("chromium must finish within the timeout")
        .expect("chromium must start");
    assert!(output.status.success(), "chromium failed: {}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8(output.stdout).expect("chromium prints UTF-8")
}

/// The example registry (examples/registry), as objects to create in `ns`.
fn example_registry() -> (Vec<McpServer>, Vec<McpProfile>) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/registry");
    let snapshot = DirSource::load(&dir).expect("the example registry loads");
    let servers = snapshot.servers().values().map(|v| McpServer::clone(&v.object)).collect();
    let profiles = snapshot.profiles().values().map(|v| McpProfile::clone(&v.object)).collect();
    (servers, profiles)
}

async fn create<K>(api: &Api<K>, object: &K)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), object)
        .await
        .unwrap_or_else(|e| panic!("creating {} failed: {e}", object.name_any()));
}

fn pod(name: &str, annotations: &[(&str, &str)]) -> Pod {
    let mut pod = spear::testing::fixtures::app_pod(annotations);
    pod.metadata.name = Some(name.into());
    pod
}

/// Applies the example registry, a server that fails, and two pods (one as the webhook marks an
/// injected pod, one plain) in `ns`.
async fn apply_objects(ns: &TestNamespace, failing_port: u16) {
    let namespaces: Api<Namespace> = Api::all(ns.client.clone());
    let label = serde_json::json!({"metadata": {"labels": {"mcp.spear.dev/injection": "enabled"}}});
    namespaces.patch(&ns.name, &PatchParams::default(), &Patch::Merge(&label)).await.expect("labelling the namespace");
    let (servers, profiles) = example_registry();
    let server_api = ns.api::<McpServer>();
    for server in &servers {
        create(&server_api, server).await;
    }
    let broken = McpServer::test("broken").display_name(HOSTILE_NAME).http_at(failing_port).allowing(["*"]);
    create(&server_api, &broken).await;
    let profile_api = ns.api::<McpProfile>();
    for profile in &profiles {
        create(&profile_api, profile).await;
    }
    let pods = ns.api::<Pod>();
    // What the webhook writes on a pod it injects (inject::mutate); the webhook itself has its
    // own tests (cluster::webhook).
    create(&pods, &pod("app-injected", &[("mcp.spear.dev/profile", "developer"), ("mcp.spear.dev/injected", "h")]))
        .await;
    create(&pods, &pod("app-plain", &[])).await;
}

/// Polls the view's JSON until `ok` holds for it.
async fn wait_for_view(http: &reqwest::Client, url: &str, what: &str, ok: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + SETTLE;
    loop {
        let last = match http.get(url).send().await {
            Ok(response) => response.text().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Ok(view) = last.as_deref().map(serde_json::from_str::<Value>) {
            match view {
                Ok(view) if ok(&view) => return view,
                _ if Instant::now() >= deadline => {
                    panic!("the view did not show {what} within {SETTLE:?}; last: {last:?}")
                }
                _ => {}
            }
        } else if Instant::now() >= deadline {
            panic!("the view did not answer within {SETTLE:?}: {last:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn server<'a>(view: &'a Value, namespace: &str, name: &str) -> Option<&'a Value> {
    let ns = view["namespaces"].as_array()?.iter().find(|n| n["name"] == namespace)?;
    ns["servers"].as_array()?.iter().find(|s| s["name"] == name)
}

#[tokio::test]
async fn chromium_shows_the_example_registry_and_a_failing_servers_error_and_keeps_a_screenshot() {
    let ns = ControlPlane::shared().namespace("admin-view").await;
    let failing_port = spear::testing::mcp_servers::free_port();
    apply_objects(&ns, failing_port).await;

    let stop = CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    let scope = Scope::Namespace(ns.name.clone());
    let mut controller_config = ControllerConfig::new(scope.clone());
    // The failing server is on loopback, which the default deny list never dials.
    controller_config.probe = ProbeConfig {
        min_retry: Duration::from_secs(1),
        timeout: Duration::from_secs(5),
        namespaces: ProbeNamespaces::All,
        deny: AddressDenyList::none(),
        ..ProbeConfig::default()
    };
    let metrics: ControllerMetrics = controller_config.metrics.clone();
    tokio::spawn(controller::run(ns.client.clone(), controller_config, stop.clone()));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0");
    let addr = listener.local_addr().expect("a bound listener has an address");
    let view_config = AdminViewConfig {
        addr,
        allowed_hosts: DEFAULT_ALLOWED_HOSTS.iter().map(|h| h.to_string()).collect(),
        scope,
        identity: "spear-operator-test".into(),
        leader: metrics,
    };
    tokio::spawn(admin_view::serve_on(listener, ns.client.clone(), view_config, stop.clone()));

    let base = format!("http://127.0.0.1:{}", addr.port());
    let http = reqwest::Client::new();
    let view = wait_for_view(
        &http,
        &format!("{base}/view.json"),
        "the failing server's error and the profiles' status",
        |view| {
            let failing = server(view, &ns.name, "broken")
                .is_some_and(|s| s["health"] == "failing" && s["lastError"].is_string());
            let profiles = view["namespaces"][0]["profiles"]
                .as_array()
                .is_some_and(|p| p.len() == 2 && p.iter().all(|p| p["accepted"]["status"] == "True"));
            let pods = view["namespaces"][0]["pods"].as_array().is_some_and(|p| p.len() == 1);
            failing && profiles && pods && view["problems"].as_array().is_some_and(Vec::is_empty)
        },
    )
    .await;
    let error = server(&view, &ns.name, "broken").and_then(|s| s["lastError"].as_str()).expect("lastError").to_string();
    for name in ["everything", "everything-http", "filesystem"] {
        assert!(server(&view, &ns.name, name).is_some(), "{name} is in the view: {view}");
    }
    assert_eq!(server(&view, &ns.name, "filesystem").map(|s| s["health"].clone()), Some(Value::from("sidecar")));
    assert_eq!(view["namespaces"][0]["pods"][0]["name"], "app-injected");
    assert_eq!(view["namespaces"][0]["pods"][0]["profile"], "developer");

    // The page's headers: a policy with no script, and only GET.
    let response = http.get(format!("{base}/")).send().await.expect("GET /");
    let csp = response.headers().get("content-security-policy").and_then(|v| v.to_str().ok()).unwrap_or_default();
    assert!(csp.starts_with("default-src 'none'") && !csp.contains("script"), "{csp}");
    let post = http.post(format!("{base}/")).send().await.expect("POST /");
    assert_eq!(post.status(), 405, "the view has no write action");
    let rebound =
        http.get(format!("{base}/")).header("host", "evil.example").send().await.expect("GET with a foreign Host");
    assert_eq!(rebound.status(), 421, "a Host outside --admin-view-allowed-hosts is refused (DNS rebinding)");

    // The browser: the DOM after loading, then a screenshot.
    let profile_dir = tempfile::tempdir().expect("a browser profile directory");
    let dom = browser(&["--dump-dom".into(), format!("{base}/")], profile_dir.path()).await;
    assert!(dom.contains("<title>spear-mcp admin view</title>"), "the hostile display name ran no script:\n{dom}");
    for name in ["everything", "everything-http", "filesystem", "broken", "developer", "readonly", "app-injected"] {
        assert!(dom.contains(&format!(">{name}<")), "the page shows {name}:\n{dom}");
    }
    assert!(!dom.contains("app-plain"), "a pod the webhook did not inject is not listed");
    let shown_error = error.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    assert!(dom.contains(&shown_error), "the failing server's error ({error}) is on the page:\n{dom}");
    assert!(dom.contains("&lt;script&gt;document.title="), "the display name is shown as text");
    assert!(!dom.contains("<b>server</b>"), "no markup from a value");
    assert!(dom.contains("failing"), "the failing server's health");

    let screenshot = artifacts_dir().join("admin-view.png");
    let _ = std::fs::remove_file(&screenshot);
    browser(
        &[format!("--screenshot={}", screenshot.display()), "--window-size=1440,1700".into(), format!("{base}/")],
        profile_dir.path(),
    )
    .await;
    let png = std::fs::read(&screenshot).expect("chromium wrote the screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000, "a real PNG ({} bytes)", png.len());
    println!("admin view screenshot: {}", screenshot.display());
}
