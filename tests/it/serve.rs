//! `spearlet serve` as a user runs it: the real binary in local mode over a registry directory,
//! a real stdio server behind it, and real clients (PyPI `mcp`) in front.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use spear::testing::mcp_servers;

/// A running `spearlet serve`, killed (SIGTERM, then SIGKILL) on drop.
pub struct Served {
    child: Child,
    /// 127.0.0.1 port of chat and /mcp.
    pub http: u16,
    /// 127.0.0.1 port of gRPC.
    pub grpc: u16,
    /// 127.0.0.1 port of the admin server.
    pub admin: u16,
    /// The registry directory (edit it to change the registry).
    pub dir: tempfile::TempDir,
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            terminate(&mut self.child, Duration::from_secs(5));
        }
    }
}

/// A child process terminated (SIGTERM, then SIGKILL) when dropped, also when its test panics:
/// a failed test must not leave an agent and its servers running.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            terminate(&mut self.0, Duration::from_secs(5));
        }
    }
}

impl std::ops::Deref for Reaped {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for Reaped {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

/// `spearlet serve` over `dir` under a 256 MiB data limit (RLIMIT_DATA counts the heap and every
/// writable private mapping: what the agent really holds): the process and its http, grpc and
/// admin ports.
fn serve_under_data_limit(dir: &Path) -> (Reaped, u16, u16, u16) {
    let (http, grpc, admin) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let child = Command::new("prlimit")
        .arg(format!("--data={}", 256u64 << 20))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_spearlet"))
        .args(["serve", "--audit-log", "off", "--registry-dir"])
        .arg(dir)
        .args(["--http-addr", &format!("127.0.0.1:{http}"), "--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .stdin(Stdio::null())
        .spawn()
        .expect("spawn spearlet under prlimit");
    (Reaped(child), http, grpc, admin)
}

pub(crate) fn terminate(child: &mut Child, grace: Duration) -> Option<std::process::ExitStatus> {
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A registry with the Python fixture server as `fx` (all tools but `big` allowed) and a
/// profile `p` that also denies `pid` — so `big` and `pid` are outside what the workload sees.
pub fn fixture_registry(dir: &Path) {
    fixture_registry_of(dir, &mcp_servers::fixture_stdio(&[]));
}

/// [`fixture_registry`] with `fixture` as the server's command.
pub fn fixture_registry_of(dir: &Path, fixture: &mcp_servers::Command) {
    let args: Vec<String> = fixture.args.iter().map(|a| format!("{a:?}")).collect();
    let env: Vec<String> = fixture.env.iter().map(|(k, v)| format!("{{name: {k:?}, value: {v:?}}}")).collect();
    let yaml = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: fx\nspec:\n  transport: stdio\n  \
         stdio:\n    command: {:?}\n    args: [{}]\n    env: [{}]\n  allowedTools: [\"*\"]\n  deniedTools: [big]\n",
        fixture.program.to_string_lossy(),
        args.join(", "),
        env.join(", "),
    );
    std::fs::write(dir.join("fx.yaml"), yaml).expect("write fx.yaml");
    std::fs::write(
        dir.join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx]\n  \
         toolDenylist: [pid]\n",
    )
    .expect("write profile.yaml");
}

/// The audit file's lines (JSON each).
pub(crate) fn audit_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("audit log");
    text.lines().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}"))).collect()
}

/// The audit lines `keep` picks, once there are at least `count` (the sink writes from a task of
/// its own, so a line can land after the answer); panics after 10 s.
pub(crate) fn wait_for_audit(path: &Path, count: usize, keep: impl Fn(&Value) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let lines: Vec<Value> = audit_lines(path).into_iter().filter(|l| keep(l)).collect();
        if lines.len() >= count {
            return lines;
        }
        assert!(Instant::now() < deadline, "{count} audit lines within 10 s, got {lines:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The pids of `parent`'s child processes (`pgrep -P`).
pub(crate) fn child_pids(parent: u32) -> Vec<String> {
    let out = Command::new("pgrep").args(["-P", &parent.to_string()]).output().expect("pgrep");
    String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect()
}

/// Starts `spearlet serve` over `dir` (already filled) with `extra` flags; waits for /readyz and
/// for every server's start to end (ready does not wait for a start past 10 s, which a loaded
/// machine sees; the tests want the tools).
pub fn serve(dir: tempfile::TempDir, extra: &[&str]) -> Served {
    let served = serve_ready(dir, extra);
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(served.admin, "/readyz").is_some_and(|(_, body)| body.contains(": starting (")) {
        assert!(Instant::now() < deadline, "a server still starting after 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    served
}

/// Starts `spearlet serve` over `dir` (already filled) with `extra` flags; waits for /readyz.
pub fn serve_ready(dir: tempfile::TempDir, extra: &[&str]) -> Served {
    let served = spawn_serve(dir, extra);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some((200, _)) = http_get(served.admin, "/readyz") {
            return served;
        }
        assert!(Instant::now() < deadline, "spearlet serve not ready within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Starts `spearlet serve` over `dir` (already filled) with `extra` flags and returns at once.
pub fn spawn_serve(dir: tempfile::TempDir, extra: &[&str]) -> Served {
    spawn_serve_with_stderr(dir, extra, Stdio::inherit())
}

/// [`spawn_serve`] with the agent's stderr going to `stderr`.
pub fn spawn_serve_with_stderr(dir: tempfile::TempDir, extra: &[&str], stderr: Stdio) -> Served {
    spawn_serve_with_env(dir, extra, stderr, &[])
}

/// [`serve`] with `env` set for the agent.
pub fn serve_with_env(dir: tempfile::TempDir, extra: &[&str], env: &[(&str, &str)]) -> Served {
    let served = spawn_serve_with_env(dir, extra, Stdio::inherit(), env);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(served.admin, "/readyz")
        .is_some_and(|(status, body)| status == 200 && !body.contains(": starting ("))
    {
        assert!(Instant::now() < deadline, "spearlet serve not ready with its servers started within 60 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    served
}

/// [`spawn_serve_with_stderr`] with `env` set for the agent.
pub fn spawn_serve_with_env(dir: tempfile::TempDir, extra: &[&str], stderr: Stdio, env: &[(&str, &str)]) -> Served {
    let (http, grpc, admin) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let child = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .envs(env.iter().copied())
        .arg("serve")
        .arg("--registry-dir")
        .arg(dir.path())
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--shutdown-grace-seconds", "3"])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(stderr)
        .spawn()
        .expect("spawn spearlet serve");
    Served { child, http, grpc, admin, dir }
}

/// A plain HTTP/1.1 GET on 127.0.0.1: (status, body).
pub fn http_get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").ok()?;
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    Some((status, body))
}

/// A metric's value in Prometheus text, by its name and labels as written.
pub fn metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok()))
}

/// A metric's value on an agent's admin port (0 when it is absent: a counter not yet counted).
pub fn admin_metric(admin: u16, series: &str) -> f64 {
    http_get(admin, "/metrics").and_then(|(_, body)| metric(&body, series)).unwrap_or_default()
}

/// The structured error (`{"error": {...}}`) of a failed call event of the `mcp` client script.
pub(crate) fn call_error(call: &Value) -> Value {
    assert_eq!(call["is_error"], true, "{call}");
    serde_json::from_str(call["text"].as_str().unwrap_or_default()).expect("the error object")
}

pub(crate) fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers").join(name)
}

/// The next JSON event line of the Python client.
pub(crate) fn next_event(lines: &mut impl Iterator<Item = std::io::Result<String>>) -> Value {
    let line = lines.next().expect("the client printed another line").expect("readable");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("not a JSON event: {line}: {e}"))
}

/// The 2025-11-25 session revision, and the 2026-07-28 stateless one, as `mcp_client.py --mode`.
pub(crate) const LEGACY: &str = "legacy";
pub(crate) const STATELESS: &str = "2026-07-28";

pub(crate) fn start_client(
    served: &Served,
    calls: &[&str],
    wait: bool,
    extra: &[&str],
) -> (Child, std::io::Lines<BufReader<ChildStdout>>) {
    let mut command = Command::new(mcp_servers::python());
    command.arg(script("mcp_client.py")).args(["--url", &format!("http://127.0.0.1:{}/mcp", served.http)]);
    command.args(extra);
    for call in calls {
        command.args(["--call", call]);
    }
    if wait {
        command.arg("--wait-list-changed");
    }
    let mut child = command.stdout(Stdio::piped()).spawn().expect("spawn the Python MCP client");
    let stdout = child.stdout.take().expect("piped stdout");
    (child, BufReader::new(stdout).lines())
}

#[test]
fn the_python_mcp_client_lists_calls_and_hears_list_changed_after_a_registry_edit() {
    python_client_lists_calls_and_hears_a_registry_edit(LEGACY, "2025-11-25");
}

/// The same as a 2026-07-28 client sees it: no session, `server/discover`, per-request `_meta`,
/// results with `resultType`, list results with the agent's caching hints, and the change
/// delivered on a `subscriptions/listen` stream.
#[test]
fn a_stateless_2026_07_28_client_lists_calls_and_hears_a_registry_edit_on_its_listen_stream() {
    python_client_lists_calls_and_hears_a_registry_edit(STATELESS, "2026-07-28");
}

fn python_client_lists_calls_and_hears_a_registry_edit(mode: &str, version: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    let (mut client, mut lines) = start_client(
        &served,
        &[
            r#"mcp__fx__echo={"text": "hello through the agent"}"#,
            r#"mcp__fx__pid={}"#,
            r#"mcp__fx__big={"bytes": 10}"#,
        ],
        true,
        &["--mode", mode],
    );

    let init = next_event(&mut lines);
    assert_eq!((&init["event"], &init["version"]), (&Value::from("initialized"), &Value::from(version)), "{init}");
    let tools = next_event(&mut lines);
    let names: Vec<&str> = tools["names"].as_array().expect("names").iter().filter_map(Value::as_str).collect();
    assert!(names.contains(&"mcp__fx__echo"), "{names:?}");
    if mode == STATELESS {
        // The set is this pod's profile's: private; see doors::mcp::endpoint::LIST_TTL for the 2 s.
        assert_eq!((&tools["ttl_ms"], &tools["cache_scope"]), (&Value::from(2000), &Value::from("private")), "{tools}");
    }
    // Outside the profile (denied by the profile, and by the server): not listed ...
    assert!(!names.contains(&"mcp__fx__pid") && !names.contains(&"mcp__fx__big"), "{names:?}");

    let echo = next_event(&mut lines);
    assert_eq!(echo["is_error"], false, "{echo}");
    assert!(echo["text"].as_str().unwrap_or_default().contains("hello through the agent"), "{echo}");
    // ... and not callable: a structured policy error, not a call to the server.
    for _ in 0..2 {
        let denied = next_event(&mut lines);
        assert_eq!(denied["is_error"], true, "{denied}");
        let error: Value = serde_json::from_str(denied["text"].as_str().unwrap_or_default()).expect("error JSON");
        assert_eq!(error["error"]["code"], "mcp_policy_denied", "{denied}");
    }

    assert_eq!(next_event(&mut lines)["event"], "waiting");
    // The platform team narrows the server: `add_tool` leaves the set.
    let path = served.dir.path().join("fx.yaml");
    let yaml = std::fs::read_to_string(&path)
        .expect("read fx.yaml")
        .replace("deniedTools: [big]", "deniedTools: [big, add_tool]");
    std::fs::write(&path, yaml).expect("edit fx.yaml");

    assert_eq!(next_event(&mut lines)["event"], "list_changed");
    let after = next_event(&mut lines);
    let after: Vec<&str> = after["names"].as_array().expect("names").iter().filter_map(Value::as_str).collect();
    assert!(!after.contains(&"mcp__fx__add_tool") && after.contains(&"mcp__fx__echo"), "{after:?}");
    assert!(names.contains(&"mcp__fx__add_tool"), "add_tool was listed before the edit: {names:?}");
    assert!(client.wait().expect("client exit").success());
}

/// Issue 15: `/mcp` answers `tools/call` on its fast path, which rmcp's session worker (and so
/// its idle timer) never sees. A client (PyPI `mcp`) that initializes, lists once and then only
/// calls tools, every 0.5 s for 10 s with a 3 s idle time, is never told its session is gone (a
/// 404 surfaces as "Session terminated"), and still hears `tools/list_changed` on its GET stream
/// after a registry edit at the end.
#[test]
fn mcp_calls_alone_keep_a_session_alive_and_hearing_list_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--mcp-session-idle-seconds", "3"]);
    let (mut client, mut lines) = start_client(
        &served,
        &[r#"mcp__fx__echo={"text": "busy"}"#],
        true,
        &["--call-every", "0.5", "--call-for", "10"],
    );
    assert_eq!(next_event(&mut lines)["event"], "initialized");
    let names = next_event(&mut lines);
    assert!(!names.to_string().contains("mcp__fx__big"), "big is denied at first: {names}");

    let calls = next_event(&mut lines);
    assert_eq!(calls["event"], "calls", "{calls}");
    assert_eq!(calls["errors"], serde_json::json!([]), "every call answered in one session: {calls}");
    assert!(calls["count"].as_u64().is_some_and(|n| n >= 15), "calls for 10 s: {calls}");

    assert_eq!(next_event(&mut lines)["event"], "waiting");
    // The platform team allows `big` now.
    let path = served.dir.path().join("fx.yaml");
    let yaml = std::fs::read_to_string(&path).expect("read fx.yaml").replace("deniedTools: [big]", "deniedTools: []");
    std::fs::write(&path, yaml).expect("edit fx.yaml");
    assert_eq!(next_event(&mut lines)["event"], "list_changed");
    let after = next_event(&mut lines);
    assert!(after["names"].as_array().is_some_and(|n| n.contains(&Value::from("mcp__fx__big"))), "{after}");
    assert!(client.wait().expect("client exit").success());
}

/// `DELETE` ends a session at once (the agent keeps sessions itself, and must not take the
/// client's `DELETE` for the close rmcp sends when the handshake's worker ends), and ends no other.
#[tokio::test]
async fn a_deleted_mcp_session_is_gone_at_once_and_no_other_is() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let (deleted, kept) = (open_session(&http, served.http, "a").await, open_session(&http, served.http, "b").await);
    let list = |id: u64| serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/list", "params": {}});
    let delete = http
        .delete(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", &deleted)
        .send()
        .await
        .expect("a reply");
    assert!(delete.status().is_success(), "DELETE: {}", delete.status());
    let (status, _, _, body) = mcp_post(&http, served.http, Some(&deleted), None, list(2)).await;
    assert_eq!(status, 404, "the deleted session: {body}");
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "mcp__fx__echo", "arguments": {"text": "x"}}});
    assert_eq!(mcp_post(&http, served.http, Some(&deleted), None, call).await.0, 404, "nor on the fast path");
    let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&kept), None, list(4)).await;
    assert_eq!(status, 200, "the other session: {body}");
    assert!(jsonrpc_message(&content_type, &body)["result"]["tools"].is_array(), "{body}");
}

/// A client that loses a request's stream while the request runs gets the rest of it on a `GET`
/// with the `Last-Event-ID` it saw (SEP-1699): the stream's first event primes that id.
#[tokio::test]
async fn a_lost_request_stream_resumes_from_its_last_event_id() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    // A client that can be asked for sampling: its calls go through rmcp, on a stream.
    let session = initialize_session(&http, served.http, "r", serde_json::json!({"sampling": {}})).await;
    let slow = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "mcp__fx__sleep", "arguments": {"ms": 1500}}});
    let mut response = http
        .post(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", &session)
        .body(slow.to_string())
        .send()
        .await
        .expect("a reply");
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let first = response.chunk().await.expect("the stream").expect("a first event");
    let first = String::from_utf8_lossy(&first);
    let last_event_id = first
        .lines()
        .find_map(|line| line.strip_prefix("id:"))
        .map(|id| id.trim().to_string())
        .unwrap_or_else(|| panic!("the first event primes an id: {first:?}"));
    drop(response);
    let resumed = http
        .get(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", &session)
        .header("last-event-id", &last_event_id)
        .send()
        .await
        .expect("a reply");
    assert_eq!(resumed.status(), 200);
    let body = tokio::time::timeout(Duration::from_secs(10), resumed.text()).await.expect("the rest in time");
    let body = body.expect("the resumed stream");
    let reply = jsonrpc_message("text/event-stream", &body);
    assert_eq!(reply["id"], 7, "the call's result, after the lost stream: {body}");
    assert!(body.contains("slept"), "{body}");
}

/// Issue 15: idle expiry still works with fast calls keeping sessions alive. A call in flight
/// for longer than the idle time (3 s) keeps its session; a session whose last call ended more
/// than the idle time ago is gone: the fast path's request (a `tools/call`) and rmcp's (a
/// `tools/list`, the GET stream) are all answered 404, as the protocol prescribes for a
/// terminated session; the client initializes a new session and goes on.
#[tokio::test]
async fn an_unused_mcp_session_expires_with_404_and_the_client_starts_a_new_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--mcp-session-idle-seconds", "3"]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let start_session = || open_session(&http, served.http, "idle");
    let call = |id: u64| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "mcp__fx__echo", "arguments": {"text": "after a pause"}}})
    };
    let session = start_session().await;
    // One call running 4.5 s: the session is in use all that time, and still there after it.
    let slow = serde_json::json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "mcp__fx__sleep", "arguments": {"ms": 4500}}});
    let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, slow).await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"), "{body}");
    assert!(body.contains("slept"), "{body}");
    for id in 3..5 {
        let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, call(id)).await;
        assert_eq!((status, content_type.as_str()), (200, "application/json"), "after the slow call: {body}");
    }

    // Idle for more than 3 s (a session closes 3 s to 3.75 s after its last call ends).
    tokio::time::sleep(Duration::from_secs(5)).await;
    let (status, _, _, body) = mcp_post(&http, served.http, Some(&session), None, call(5)).await;
    assert_eq!(status, 404, "a call in the expired session: {body}");
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 6, "method": "tools/list", "params": {}});
    let (status, _, _, body) = mcp_post(&http, served.http, Some(&session), None, list).await;
    assert_eq!(status, 404, "rmcp's answer in the expired session: {body}");
    let stream = http
        .get(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("accept", "text/event-stream")
        .header("mcp-protocol-version", "2025-06-18")
        .header("mcp-session-id", &session)
        .send()
        .await
        .expect("a reply");
    assert_eq!(stream.status().as_u16(), 404, "the GET stream of the expired session");

    let renewed = start_session().await;
    assert_ne!(renewed, session);
    let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&renewed), None, call(7)).await;
    assert_eq!(status, 200, "{body}");
    let reply = jsonrpc_message(&content_type, &body);
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert!(body.contains("after a pause"), "{body}");
}

#[test]
fn admin_port_reports_readiness_metrics_and_the_effective_set() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    assert_eq!(http_get(served.admin, "/healthz").map(|(s, _)| s), Some(200));
    let (status, metrics) = http_get(served.admin, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    for name in ["mcp_registry_revision 1", "mcp_registry_degraded 0", "mcp_server_connect_total{server_id=\"fx\"} 1"] {
        assert!(metrics.contains(name), "{name} missing in\n{metrics}");
    }
    let (status, body) = http_get(served.admin, "/debug/effective").expect("debug");
    assert_eq!(status, 200, "{body}");
    let explained: Value = serde_json::from_str(&body).expect("JSON");
    assert_eq!(explained["profile"], "p");
    let excluded = explained["excluded"].as_array().expect("excluded");
    assert!(
        excluded.iter().any(|d| d["tool"] == "pid" && d["reason"] == "denied_by:profile"),
        "pid excluded with the profile's reason: {excluded:?}"
    );
    assert!(explained.get("toolSelection").is_none(), "the profile offers every tool");
    assert_eq!(explained["registryProblems"], serde_json::json!([]), "a healthy registry has no problems to report");

    // A request's conversation and max_tools: the selection it would get, with scores.
    let request = r#"{"messages":[{"role":"user","content":"echo this text"}],"max_tools":1}"#;
    let query: String = url::form_urlencoded::Serializer::new(String::new()).append_pair("request", request).finish();
    let (status, body) = http_get(served.admin, &format!("/debug/effective?{query}")).expect("debug");
    assert_eq!(status, 200, "{body}");
    let explained: Value = serde_json::from_str(&body).expect("JSON");
    let best = &explained["toolSelection"]["tools"][0];
    assert_eq!((&best["name"], &best["why"]), (&json!("mcp__fx__echo"), &json!("ranked")), "{explained}");
    assert_eq!(explained["toolSelection"]["offered"], 1);
}

#[test]
fn a_server_disabled_in_its_file_is_taken_out_and_stopped_without_editing_the_profile() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    let (_, body) = http_get(served.admin, "/debug/effective").expect("debug");
    assert!(body.contains("mcp__fx__echo"), "{body}");
    let agent_pid = served.child.id();
    let children = || child_pids(agent_pid);
    let running = children();
    assert!(!running.is_empty(), "the stdio server runs as a child of the agent");

    let fx = served.dir.path().join("fx.yaml");
    let yaml = std::fs::read_to_string(&fx).expect("fx.yaml");
    std::fs::write(&fx, format!("{yaml}  enabled: false\n")).expect("disable fx");
    let deadline = Instant::now() + Duration::from_secs(20);
    let body = loop {
        let (_, body) = http_get(served.admin, "/debug/effective").expect("debug");
        if body.contains("\"disabled\"") {
            break body;
        }
        assert!(Instant::now() < deadline, "fx not disabled within 20 s: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!body.contains("mcp__fx__echo"), "no tool of a disabled server: {body}");
    while running.iter().any(|pid| Path::new(&format!("/proc/{pid}")).exists()) {
        assert!(Instant::now() < deadline, "the disabled server's process still runs");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, ready) = http_get(served.admin, "/readyz").expect("readyz");
    assert!(!ready.contains("fx: starting"), "the disabled server is not started again: {ready}");
}

#[test]
fn spearlet_reconnect_starts_a_server_afresh_and_is_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_string_lossy().into_owned();
    let served = serve(dir, &["--audit-log", &audit_path]);
    let agent_pid = served.child.id();
    let children = || child_pids(agent_pid);
    let before = children();
    assert_eq!(before.len(), 1, "one stdio child: {before:?}");
    let admin = format!("127.0.0.1:{}", served.admin);
    let reconnect = |server: &str| {
        Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["reconnect", server, "--admin-addr", &admin])
            .output()
            .expect("spearlet reconnect runs")
    };
    let out = reconnect("fx");
    assert!(out.status.success(), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("fx: reconnecting"), "{out:?}");
    // The old child goes, a new one is started and listed without any call.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let now = children();
        let listed = http_get(served.admin, "/debug/effective").is_some_and(|(_, b)| b.contains("mcp__fx__echo"));
        if !now.is_empty() && now != before && listed {
            break;
        }
        assert!(Instant::now() < deadline, "no fresh start within 30 s: {before:?} -> {now:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let unknown = reconnect("nope");
    assert!(!unknown.status.success(), "{unknown:?}");
    assert!(String::from_utf8_lossy(&unknown.stderr).contains("404"), "{unknown:?}");
    let reconnects = wait_for_audit(audit.path(), 2, |l| l["kind"] == "reconnect");
    assert_eq!(reconnects.len(), 2, "{reconnects:?}");
    assert_eq!((reconnects[0]["server_id"].as_str(), reconnects[0]["outcome"].as_str()), (Some("fx"), Some("ok")));
    assert_eq!(reconnects[1]["outcome"], "unknown_server");
}

#[test]
fn sigterm_stops_the_agent_and_reaps_its_servers() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let mut served = serve(dir, &["--audit-log", "off"]);
    let (_, body) = http_get(served.admin, "/debug/effective").expect("debug");
    assert!(body.contains("echo"), "{body}");
    let agent_pid = served.child.id();
    let children = || child_pids(agent_pid);
    let before = children();
    assert!(!before.is_empty(), "the stdio server runs as a child of the agent");
    let status = terminate(&mut served.child, Duration::from_secs(10)).expect("exited on SIGTERM within 10 s");
    assert!(status.success(), "{status:?}");
    for pid in before {
        assert!(!Path::new(&format!("/proc/{pid}")).exists(), "server child {pid} was reaped");
    }
}

#[test]
fn spearlet_tools_lists_and_calls_over_the_grpc_door_of_a_running_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    let addr = format!("127.0.0.1:{}", served.grpc);
    let tools = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_spearlet")).arg("tools").args(args).args(["--grpc-addr", &addr]).output()
    };
    let list = tools(&["list"]).expect("spearlet tools list");
    let listed = String::from_utf8_lossy(&list.stdout);
    assert!(list.status.success(), "{listed}\n{}", String::from_utf8_lossy(&list.stderr));
    assert!(listed.contains("mcp__fx__echo") && !listed.contains("mcp__fx__pid"), "{listed}");

    let call = tools(&["call", "fx/echo", "--args", r#"{"text": "over grpc"}"#]).expect("spearlet tools call");
    assert!(call.status.success(), "{}", String::from_utf8_lossy(&call.stderr));
    assert!(String::from_utf8_lossy(&call.stdout).contains("over grpc"));

    // Outside the profile: refused with the policy code, exit 1.
    let denied = tools(&["call", "fx/pid"]).expect("spearlet tools call");
    assert_eq!(denied.status.code(), Some(1));
    let said = format!("{}{}", String::from_utf8_lossy(&denied.stdout), String::from_utf8_lossy(&denied.stderr));
    assert!(said.contains("mcp_policy_denied"), "{said}");
}

/// A 2026-07-28 server that asks for input (an elicitation, as `InputRequiredResult`) while
/// answering a call: through `/mcp`, a 2026-07-28 client gets the question, answers it, and its
/// answer reaches the server, which completes the call; a 2025-11-25 session client, which has no
/// such round, gets `mcp_approval_required` naming the question.
#[test]
fn a_servers_input_request_reaches_a_2026_client_and_its_answer_reaches_the_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    let ask = r#"mcp__fx__ask={"what": "the transfer"}"#;

    let (mut client, mut lines) = start_client(&served, &[ask], false, &["--mode", STATELESS]);
    assert_eq!(next_event(&mut lines)["event"], "initialized");
    assert_eq!(next_event(&mut lines)["event"], "tools");
    let asked = next_event(&mut lines);
    assert_eq!(
        (&asked["event"], &asked["message"]),
        (&Value::from("elicitation"), &Value::from("Please confirm: the transfer")),
        "{asked}"
    );
    let call = next_event(&mut lines);
    assert_eq!(call["is_error"], false, "{call}");
    let text = call["text"].as_str().unwrap_or_default();
    assert!(text.starts_with("answered: ") && text.contains("\"ok\": true"), "the server got the answer: {call}");
    assert!(client.wait().expect("client exit").success());

    let (mut client, mut lines) = start_client(&served, &[ask], false, &["--mode", LEGACY]);
    assert_eq!(next_event(&mut lines)["event"], "initialized");
    assert_eq!(next_event(&mut lines)["event"], "tools");
    let call = next_event(&mut lines);
    assert_eq!(call["is_error"], true, "{call}");
    let error: Value = serde_json::from_str(call["text"].as_str().unwrap_or_default()).expect("error JSON");
    assert_eq!(error["error"]["code"], "mcp_approval_required", "{call}");
    assert!(error["error"]["message"].as_str().unwrap_or_default().contains("Please confirm: the transfer"), "{call}");
    assert!(client.wait().expect("client exit").success());
}

/// A stdio server that takes 20 s to start (a stand-in for `npx` downloading its package on a
/// cold cache) gets its tools listed with default settings: the agent becomes ready without
/// waiting for it, `/readyz` and `spearlet tools list` say it is starting and for how long, and
/// once it is up its tools are listed, without a restart.
#[test]
fn a_server_slow_to_start_is_reported_as_starting_then_listed_within_its_startup_budget() {
    let dir = tempfile::tempdir().expect("tempdir");
    let fixture = mcp_servers::fixture_stdio(&[]);
    let mut args = vec!["-c".to_string(), "sleep 20; exec \"$0\" \"$@\"".to_string()];
    args.push(fixture.program.to_string_lossy().into_owned());
    args.extend(fixture.args.iter().cloned());
    let slow = mcp_servers::Command { program: "/bin/sh".into(), args, env: fixture.env.clone() };
    fixture_registry_of(dir.path(), &slow);
    let spawned = Instant::now();
    let served = serve_ready(dir, &["--audit-log", "off"]);
    let (status, ready) = http_get(served.admin, "/readyz").expect("readyz");
    assert_eq!(status, 200, "ready without waiting for the slow server: {ready}");
    assert!(ready.contains("fx: starting (sh), ") && ready.contains(" s of 120 s"), "{ready}");

    let addr = format!("127.0.0.1:{}", served.grpc);
    let list = || {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "list", "--grpc-addr", &addr])
            .output()
            .expect("spearlet tools list");
        (String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let (_, said) = list();
    assert!(
        said.contains("fx: starting (sh), ") && said.contains(" s of 120 s"),
        "says why there are no tools: {said}"
    );
    let deadline = spawned + Duration::from_secs(90);
    loop {
        let (listed, said) = list();
        if listed.contains("mcp__fx__echo") {
            assert!(!said.contains("starting"), "{said}");
            break;
        }
        assert!(Instant::now() < deadline, "not listed within 90 s: {listed}{said}");
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(spawned.elapsed() >= Duration::from_secs(20), "listed only once the server was up");
    let (_, ready) = http_get(served.admin, "/readyz").expect("readyz");
    assert!(ready.contains("fx: listed, "), "{ready}");
}

/// The README's first command, as a new user runs it on a machine that never ran `npx` before
/// (an empty npm cache): both example stdio servers download their packages and start within
/// their default startup budget, and `spearlet tools list` lists their tools. The test reaches
/// the npm registry, as the README's command does.
#[test]
fn the_readmes_first_command_lists_the_example_servers_tools_on_an_empty_npm_cache() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    // A new user's home: npm's cache is `$HOME/.npm` (stdio children inherit HOME, and no
    // `npm_config_*` variable, which may carry a registry token).
    let home = tempfile::tempdir().expect("tempdir");
    let (http, grpc, admin) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let started = Instant::now();
    let child = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["serve", "--registry-dir", "examples/registry", "--profile", "developer", "--audit-log", "off"])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .current_dir(repo)
        .env("HOME", home.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn spearlet serve");
    let served = Served { child, http, grpc, admin, dir: tempfile::tempdir().expect("tempdir") };
    let addr = format!("127.0.0.1:{}", served.grpc);
    // Generous: two package downloads on a busy CI machine; each server's own budget is 120 s.
    let deadline = started + Duration::from_secs(240);
    let (mut listed, mut said) = (String::new(), String::new());
    while Instant::now() < deadline {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet")).args(["tools", "list", "--grpc-addr", &addr]).output();
        if let Ok(out) = out {
            listed = String::from_utf8_lossy(&out.stdout).into_owned();
            said = String::from_utf8_lossy(&out.stderr).into_owned();
            if listed.contains("mcp__everything__echo") && listed.contains("mcp__filesystem__read_") {
                break;
            }
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    assert!(
        listed.contains("mcp__everything__echo") && listed.contains("mcp__filesystem__read_"),
        "the example servers' tools were not listed within 240 s on an empty npm cache:\n{listed}{said}"
    );
    eprintln!("first run on an empty npm cache: both example servers listed after {:?}", started.elapsed());
    assert!(home.path().join(".npm/_npx").is_dir(), "npx used the empty cache in the new home");
}

/// One JSON-RPC POST to `/mcp` as a Streamable HTTP client sends it: (status, content type,
/// session id header, body).
pub async fn mcp_post(
    http: &reqwest::Client,
    port: u16,
    session: Option<&str>,
    host: Option<&str>,
    body: Value,
) -> (u16, String, Option<String>, String) {
    let mut request = http
        .post(format!("http://127.0.0.1:{port}/mcp"))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "2025-06-18")
        .body(body.to_string());
    if let Some(session) = session {
        request = request.header("mcp-session-id", session);
    }
    if let Some(host) = host {
        request = request.header("host", host);
    }
    let response = request.send().await.expect("a reply from /mcp");
    let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    let (content_type, session) = (header("content-type").unwrap_or_default(), header("mcp-session-id"));
    let status = response.status().as_u16();
    (status, content_type, session, response.text().await.unwrap_or_default())
}

/// A 2025-06-18 session on `/mcp` at `port` whose client declared `capabilities`, before its
/// `notifications/initialized`: its id.
async fn initialize_session(http: &reqwest::Client, port: u16, client: &str, capabilities: Value) -> String {
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": capabilities, "clientInfo": {"name": client, "version": "1"}}});
    let (status, _, session, body) = mcp_post(http, port, None, None, initialize).await;
    assert_eq!(status, 200, "{body}");
    session.expect("a session id")
}

/// A 2025-06-18 session on `/mcp` at `port`, initialized: its id.
pub async fn open_session(http: &reqwest::Client, port: u16, client: &str) -> String {
    let session = initialize_session(http, port, client, serde_json::json!({})).await;
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(mcp_post(http, port, Some(&session), None, initialized).await.0, 202);
    session
}

/// The JSON-RPC message of a reply, whether sent as JSON or as the data of an SSE event.
pub fn jsonrpc_message(content_type: &str, body: &str) -> Value {
    let text = if content_type.starts_with("text/event-stream") {
        body.lines().filter_map(|l| l.strip_prefix("data:")).map(str::trim).find(|d| d.starts_with('{')).unwrap_or("")
    } else {
        body
    };
    serde_json::from_str(text).unwrap_or_else(|e| panic!("no JSON-RPC message in {body:?}: {e}"))
}

#[tokio::test]
async fn mcp_tools_calls_in_a_session_are_answered_as_json_and_the_rest_by_rmcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let (status, _, session, _) = mcp_post(&http, served.http, None, None, initialize).await;
    assert_eq!(status, 200);
    let session = session.expect("a legacy session id");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    assert_eq!(mcp_post(&http, served.http, Some(&session), None, initialized).await.0, 202);

    let call = |id: u64, name: &str, meta: Option<Value>| {
        let mut params = serde_json::json!({"name": name, "arguments": {"text": "fast"}});
        if let Some(meta) = meta {
            params["_meta"] = meta;
        }
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
    };
    // The hot path: one JSON reply, the same result rmcp would give.
    let (status, content_type, _, body) =
        mcp_post(&http, served.http, Some(&session), None, call(2, "mcp__fx__echo", None)).await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"), "{body}");
    let reply = jsonrpc_message(&content_type, &body);
    assert_eq!(reply["id"], 2, "{reply}");
    assert_eq!(reply["result"]["isError"], false, "{reply}");
    assert!(reply["result"]["content"][0]["text"].as_str().unwrap_or_default().contains("fast"), "{reply}");
    // Policy holds on it: a tool outside the profile is a structured refusal.
    let (_, content_type, _, body) =
        mcp_post(&http, served.http, Some(&session), None, call(3, "mcp__fx__pid", None)).await;
    let refused = jsonrpc_message(&content_type, &body);
    assert_eq!(refused["result"]["isError"], true, "{refused}");
    assert_eq!(refused["result"]["structuredContent"]["error"]["code"], "mcp_policy_denied", "{refused}");
    // With a progress token, as rmcp clients send every call: still the direct JSON reply.
    let with_token = call(4, "mcp__fx__echo", Some(serde_json::json!({"progressToken": 9})));
    let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, with_token).await;
    assert_eq!((status, content_type.as_str()), (200, "application/json"), "{body}");
    assert_eq!(jsonrpc_message(&content_type, &body)["result"]["isError"], false, "{body}");
    // Anything else in the session is rmcp's to answer.
    let list = serde_json::json!({"jsonrpc": "2.0", "id": 7, "method": "tools/list", "params": {}});
    let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, list).await;
    assert_eq!(status, 200, "{body}");
    let tools = jsonrpc_message(&content_type, &body);
    assert!(tools["result"]["tools"].as_array().is_some_and(|t| !t.is_empty()), "{tools}");
    // An unsupported MCP-Protocol-Version is refused as rmcp refuses it (400), fast path or not.
    let unsupported = http
        .post(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("mcp-protocol-version", "1999-01-01")
        .header("mcp-session-id", &session)
        .body(call(8, "mcp__fx__echo", None).to_string())
        .send()
        .await
        .expect("a reply");
    assert_eq!(unsupported.status().as_u16(), 400, "an unsupported protocol version");
    // A session request naming the stateless revision gets rmcp's answer on a call as on a
    // list (it was 200 on the fast path, 400 from rmcp: found by the MCP conformance suite).
    let stateless_on_session = |body: Value| {
        http.post(format!("http://127.0.0.1:{}/mcp", served.http))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .header("mcp-protocol-version", "2026-07-28")
            .header("mcp-session-id", &session)
            .body(body.to_string())
            .send()
    };
    let listed = stateless_on_session(serde_json::json!({"jsonrpc": "2.0", "id": 9, "method": "tools/list"}))
        .await
        .expect("a reply");
    let called = stateless_on_session(call(10, "mcp__fx__echo", None)).await.expect("a reply");
    assert_eq!(listed.status().as_u16(), 400, "rmcp refuses it on a list");
    assert_eq!(called.status().as_u16(), 400, "and the fast path leaves the call to rmcp");
    // Neither an unknown session nor a foreign Host gets past the checks rmcp makes; an unknown
    // session is a 404, as the protocol prescribes.
    let (status, _, _, body) =
        mcp_post(&http, served.http, Some("not-a-session"), None, call(5, "mcp__fx__echo", None)).await;
    assert_eq!(status, 404, "unknown session: {body}");
    let (status, _, _, body) =
        mcp_post(&http, served.http, Some(&session), Some("evil.example"), call(6, "mcp__fx__echo", None)).await;
    assert!((400..500).contains(&status), "foreign Host: {status} {body}");
}

/// The agent as a client meets it in its first seconds: a stdio server that takes 2 s to start,
/// a /mcp client and a gRPC client calling an allowed tool in a tight loop from the moment the
/// process starts. Neither is ever told `mcp_policy_denied`; both succeed once the server is up;
/// `/readyz` says why it is not ready meanwhile; the refusal of a tool outside the profile is
/// counted in `/metrics`.
#[tokio::test]
async fn clients_calling_from_the_first_moment_are_never_denied_an_allowed_tool() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry_of(dir.path(), &mcp_servers::fixture_stdio(&[]).delayed(2.0));
    let served = spawn_serve(dir, &["--audit-log", "off"]);
    let started = Instant::now();
    let deadline = started + Duration::from_secs(60);

    // gRPC, from a thread: `spearlet tools call` until it succeeds, every answer kept.
    let addr = format!("127.0.0.1:{}", served.grpc);
    let grpc = std::thread::spawn(move || {
        let mut answers = Vec::new();
        loop {
            let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
                .args(["tools", "call", "fx/echo", "--args", r#"{"text": "grpc early"}"#, "--grpc-addr", &addr])
                .output()
                .expect("spearlet tools call");
            let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
            let ok = out.status.success();
            answers.push(said);
            if ok || Instant::now() > deadline {
                return (ok, answers);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });

    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    // Until the port is bound, nothing answers; /readyz answers 503 with the reason meanwhile.
    let (status, body) = loop {
        if let Some(answer) = http_get(served.admin, "/readyz") {
            break answer;
        }
        assert!(Instant::now() < deadline, "admin port never answered");
        std::thread::sleep(Duration::from_millis(10));
    };
    assert_eq!(status, 503, "not ready while the server starts: {body}");
    assert!(body.contains("listing"), "{body}");

    let session = open_session(&http, served.http, "early").await;
    let mut refusals = Vec::new();
    for id in 2.. {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "mcp__fx__echo", "arguments": {"text": "mcp early"}}});
        let (status, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, call).await;
        assert_eq!(status, 200, "{body}");
        let reply = jsonrpc_message(&content_type, &body);
        if reply["result"]["isError"] == false {
            assert!(body.contains("mcp early"), "{body}");
            break;
        }
        let error = &reply["result"]["structuredContent"]["error"];
        assert_eq!(error["code"], "mcp_unavailable", "an allowed tool is never denied: {reply}");
        assert_eq!(error["retryable"], true, "{reply}");
        refusals.push(reply);
        assert!(Instant::now() < deadline, "no success within 60 s: {refusals:?}");
    }
    let (ok, answers) = grpc.join().expect("gRPC client thread");
    assert!(ok, "the gRPC client succeeded: {answers:?}");
    assert!(answers.iter().all(|a| !a.contains("mcp_policy_denied")), "{answers:?}");
    assert!(answers.last().is_some_and(|a| a.contains("grpc early")), "{answers:?}");

    let (status, body) = http_get(served.admin, "/readyz").expect("readyz");
    assert_eq!(status, 200, "ready once the server listed: {body}");
    // A tool outside the profile is refused by policy, and the refusal is counted.
    let call = serde_json::json!({"jsonrpc": "2.0", "id": 1000, "method": "tools/call",
        "params": {"name": "mcp__fx__pid", "arguments": {}}});
    let (_, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, call).await;
    let refused = jsonrpc_message(&content_type, &body);
    assert_eq!(refused["result"]["structuredContent"]["error"]["code"], "mcp_policy_denied", "{refused}");
    let (_, metrics) = http_get(served.admin, "/metrics").expect("metrics");
    let counted = r#"mcp_tool_call_error_total{server_id="fx",tool="",code="mcp_policy_denied"} 1"#;
    assert!(metrics.contains(counted), "{counted} missing in\n{metrics}");
}

/// `--profile` naming a profile the registry does not have: `/readyz` stays 503 and says so.
#[test]
fn a_missing_profile_keeps_readyz_unready_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = spawn_serve(dir, &["--audit-log", "off", "--profile", "nope"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    // Long enough for a profile that existed to have been served: the fixture lists in ~1 s.
    while Instant::now() < deadline && seen.len() < 40 {
        if let Some(answer) = http_get(served.admin, "/readyz") {
            seen.push(answer);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(!seen.is_empty(), "the admin port answered");
    for (status, body) in &seen {
        assert_eq!(*status, 503, "{body}");
    }
    let (_, body) = seen.last().expect("an answer");
    assert!(body.contains("McpProfile 'nope' does not exist"), "{body}");
}

/// The attack: a web page open in the developer's browser drives the chat loop (and so the
/// tools, with the developer's model key) by posting `text/plain` (no preflight), from its own
/// origin, or under its own name by DNS rebinding. Each is refused before the upstream is asked;
/// a plain client still gets through to it.
#[tokio::test]
async fn web_pages_cannot_drive_the_chat_door_or_mcp() {
    let upstream = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stand-in upstream");
    upstream.set_nonblocking(true).expect("nonblocking");
    let upstream_url = format!("http://{}/v1", upstream.local_addr().expect("addr"));
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--upstream-url", &upstream_url]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let chat = format!("http://127.0.0.1:{}/v1/chat/completions", served.http);
    let body = r#"{"model": "m", "messages": [{"role": "user", "content": "run a tool"}]}"#;
    let post = |content_type: &'static str, host: Option<&'static str>, origin: Option<&'static str>| {
        let mut request = http.post(&chat).header("content-type", content_type).body(body);
        if let Some(host) = host {
            request = request.header("host", host);
        }
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(status(post("text/plain", None, None).await.expect("reply")), 415, "a simple cross-site POST");
    assert_eq!(status(post("application/json", None, Some("https://evil.example")).await.expect("reply")), 403);
    assert_eq!(status(post("application/json", Some("evil.example:4040"), None).await.expect("reply")), 403);
    assert!(
        matches!(upstream.accept(), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
        "no refused request reached the upstream"
    );

    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "page", "version": "1"}}});
    let from_page = http
        .post(format!("http://127.0.0.1:{}/mcp", served.http))
        .header("accept", "application/json, text/event-stream")
        .header("content-type", "application/json")
        .header("origin", "https://evil.example")
        .body(initialize.to_string())
        .send()
        .await
        .expect("reply");
    assert_eq!(from_page.status().as_u16(), 403, "/mcp from a web page, with a valid Host");
    let admin = |origin: Option<&'static str>| {
        let mut request = http.get(format!("http://127.0.0.1:{}/metrics", served.admin));
        if let Some(origin) = origin {
            request = request.header("origin", origin);
        }
        request.send()
    };
    assert_eq!(admin(Some("https://evil.example")).await.expect("reply").status().as_u16(), 403, "admin from a page");
    assert_eq!(admin(None).await.expect("reply").status().as_u16(), 200, "a scraper");

    // A plain client (no Origin, JSON, loopback Host) reaches the upstream.
    let plain = tokio::spawn(post("application/json; charset=utf-8", None, None));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match upstream.accept() {
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("a plain client's request never reached the upstream: {e}"),
        }
    }
    plain.abort();
}

/// The audit file holds what the workload called (and, with --audit-arguments, the arguments):
/// it is created readable by the agent's user only.
#[test]
fn the_audit_file_is_created_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let log = tempfile::tempdir().expect("log dir");
    let path = log.path().join("audit.jsonl");
    let served = serve(dir, &["--audit-log", path.to_str().expect("utf-8 path")]);
    let mode = std::fs::metadata(&path).expect("the audit file exists").permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "{mode:o}");
    drop(served);
}

/// `npx`/`uvx` run the real server as a grandchild: stopping the agent must stop it too (it used
/// to kill only the direct child, leaking the rest). The server also writes invalid UTF-8 to
/// stderr first, which used to end the reader (and close the pipe); its calls keep working.
#[tokio::test]
async fn stopping_the_agent_stops_the_servers_grandchildren_and_bad_stderr_stops_nothing() {
    let fixture = mcp_servers::fixture_stdio(&["--stderr-chatter"]);
    let marker = format!("1000.{}", std::process::id());
    let mut args = vec![
        "-c".to_string(),
        format!("sleep {marker} & printf '\\377\\376 not utf-8\\n' >&2; exec \"$0\" \"$@\""),
        fixture.program.to_string_lossy().into_owned(),
    ];
    args.extend(fixture.args.iter().cloned());
    let wrapped = mcp_servers::Command { program: "/bin/sh".into(), args, env: fixture.env.clone() };
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry_of(dir.path(), &wrapped);
    let mut served = serve(dir, &["--audit-log", "off"]);

    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}});
    let (_, _, session, _) = mcp_post(&http, served.http, None, None, initialize).await;
    let session = session.expect("a session");
    for id in 2..5 {
        let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": "mcp__fx__echo", "arguments": {"text": "still here"}}});
        let (_, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, call).await;
        assert_eq!(jsonrpc_message(&content_type, &body)["result"]["isError"], false, "call {id}: {body}");
    }

    let grandchild = || {
        let out = Command::new("pgrep").args(["-f", &format!("sleep {marker}")]).output().expect("pgrep");
        String::from_utf8_lossy(&out.stdout).split_whitespace().map(str::to_string).collect::<Vec<_>>()
    };
    let before = grandchild();
    assert_eq!(before.len(), 1, "the server's own child runs: {before:?}");
    let status = terminate(&mut served.child, Duration::from_secs(10)).expect("exited on SIGTERM within 10 s");
    assert!(status.success(), "{status:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !grandchild().is_empty() {
        assert!(Instant::now() < deadline, "the grandchild {before:?} outlived the agent");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Issue 13 finding 7: slowloris. Clients that open connections to every port of the agent and
/// send request heads a byte at a time (or nothing) fill the connection cap; the agent closes
/// them after the header timeout, and `/healthz`, `/mcp` and the admin port answer again.
#[test]
fn slow_clients_are_cut_off_and_never_stop_the_doors_or_healthz() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--header-read-timeout-seconds", "1", "--max-connections", "16"]);
    let mut slow = Vec::new();
    for port in [served.http, served.admin] {
        for _ in 0..16 {
            let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
            stream.write_all(b"GET /healthz HTTP/1.1\r\nHo").expect("partial head");
            slow.push(stream);
        }
    }
    // Every slow connection is closed by the agent (EOF, an error answer or a reset) soon after
    // the 1 s header timeout; none is held until the client gives up.
    let started = Instant::now();
    for stream in &mut slow {
        stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
        let mut buf = [0u8; 256];
        match std::io::Read::read(stream, &mut buf) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("a slow client was not cut off: {e}"),
        }
    }
    assert!(started.elapsed() < Duration::from_secs(8), "cut off after {:?}", started.elapsed());
    assert_eq!(http_get(served.admin, "/healthz").map(|(s, _)| s), Some(200));
    assert_eq!(http_get(served.http, "/mcp").map(|(s, _)| s != 0), Some(true), "the HTTP door answers");
}

/// Issue 13 finding 4: four hostile servers (an endless tools/list, two 15 MiB replies, a reply
/// line that never ends) at once cannot run the agent out of memory: under a 256 MiB data limit
/// the agent answers each with a structured error, keeps its other server working, and cuts the
/// flooded list to its caps, which `/debug/effective` reports.
#[tokio::test]
async fn hostile_servers_cannot_run_the_agent_out_of_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let python = mcp_servers::python();
    let hostile = script("hostile_server.py");
    let mut names = vec!["fx".to_string()];
    for (name, mode) in
        [("flood", "--flood-list"), ("huge1", "--huge-reply"), ("huge2", "--huge-reply"), ("endless", "--endless-line")]
    {
        let yaml = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: stdio\n  \
             stdio:\n    command: {:?}\n    args: [{:?}, {mode:?}]\n  allowedTools: [\"*\"]\n",
            python.to_string_lossy(),
            hostile.to_string_lossy(),
        );
        std::fs::write(dir.path().join(format!("{name}.yaml")), yaml).expect("write server");
        names.push(name.to_string());
    }
    std::fs::write(
        dir.path().join("profile.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [{}]\n",
            names.join(", ")
        ),
    )
    .expect("write profile");
    let (mut child, http, _grpc, admin) = serve_under_data_limit(dir.path());
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(admin, "/readyz").map(|(s, _)| s) != Some(200) {
        assert!(child.try_wait().expect("wait").is_none(), "the agent died while starting");
        assert!(Instant::now() < deadline, "not ready within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    spear::install_crypto_provider();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let (_, _, session, _) = mcp_post(&client, http, None, None, initialize).await;
    let session = session.expect("session");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    mcp_post(&client, http, Some(&session), None, initialized).await;
    let call = |id: u64, name: &str| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {"text": "still here"}}})
    };
    let blasts = ["mcp__huge1__blast", "mcp__huge2__blast", "mcp__endless__blast", "mcp__huge1__blast"];
    let replies = futures::future::join_all(
        blasts
            .iter()
            .enumerate()
            .map(|(i, name)| mcp_post(&client, http, Some(&session), None, call(10 + i as u64, name))),
    )
    .await;
    for ((status, content_type, _, body), name) in replies.iter().zip(blasts) {
        assert_eq!(*status, 200, "{name}: {body}");
        let reply = jsonrpc_message(content_type, body);
        assert_eq!(reply["result"]["isError"], true, "{name}: {reply}");
        assert!(reply.to_string().contains("mcp_output_too_large"), "{name}: {reply}");
    }
    assert!(child.try_wait().expect("wait").is_none(), "the agent survived");
    let (_, content_type, _, body) = mcp_post(&client, http, Some(&session), None, call(20, "mcp__fx__echo")).await;
    let reply = jsonrpc_message(&content_type, &body);
    assert_eq!(reply["result"]["isError"], false, "the other server still works: {reply}");
    assert_eq!(http_get(admin, "/healthz").map(|(s, _)| s), Some(200));

    let (_, body) = http_get(admin, "/debug/effective").expect("debug");
    let explained: Value = serde_json::from_str(&body).expect("JSON");
    let flood = explained["servers"].as_array().expect("servers").iter().find(|s| s["id"] == "flood").cloned();
    let flood = flood.expect("flood in the effective set");
    let cut = flood["listCut"].as_str().unwrap_or_default();
    assert!(cut.contains("over the cap") && cut.contains("descriptions were shortened"), "{flood}");
    assert!(flood["tools"].as_array().map_or(0, Vec::len) <= 1000, "at most the tool cap");

    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let peak = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap_or_default().to_string();
    eprintln!("agent peak RSS with four hostile servers: {peak}");
    terminate(&mut child, Duration::from_secs(5));
}

/// Tool lists that cost the agent far more memory than their bytes, and a schema costly to
/// compile, from three hostile servers at once under the same 256 MiB data limit
/// (`hostile_server.py`): 100 pages of ~0.96 MB of small JSON values in an input schema
/// (`--amp-list`, ~30× that once parsed), the same in output schemas (`--out-schema-big`), and
/// an output schema of 2,000 costly patterns (`--regex-schema`). Each page is admitted and
/// dropped as it arrives, the oversized tools are left out and reported, the pattern-heavy
/// schema is not compiled (its results pass unchecked), and `/healthz` answers at once
/// throughout.
#[tokio::test]
async fn tool_lists_of_small_values_and_costly_output_schemas_cannot_run_the_agent_out_of_memory() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let python = mcp_servers::python();
    let hostile = script("hostile_server.py");
    let mut names = vec!["fx".to_string()];
    for (name, mode) in [("amp", "--amp-list"), ("outbig", "--out-schema-big"), ("regex", "--regex-schema")] {
        let yaml = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: stdio\n  \
             stdio:\n    command: {:?}\n    args: [{:?}, {mode:?}]\n  allowedTools: [\"*\"]\n",
            python.to_string_lossy(),
            hostile.to_string_lossy(),
        );
        std::fs::write(dir.path().join(format!("{name}.yaml")), yaml).expect("write server");
        names.push(name.to_string());
    }
    std::fs::write(
        dir.path().join("profile.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [{}]\n",
            names.join(", ")
        ),
    )
    .expect("write profile");
    let (mut child, http, _grpc, admin) = serve_under_data_limit(dir.path());
    // /healthz answers at once while the lists arrive (the ports are bound first).
    let healthz = |admin: u16| {
        let started = Instant::now();
        let status = http_get(admin, "/healthz").map(|(s, _)| s);
        (status, started.elapsed())
    };
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut slowest = Duration::ZERO;
    while http_get(admin, "/readyz").map(|(s, _)| s) != Some(200) {
        assert!(child.try_wait().expect("wait").is_none(), "the agent died while listing");
        assert!(Instant::now() < deadline, "not ready within 90 s");
        if let (Some(200), took) = healthz(admin) {
            slowest = slowest.max(took);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    spear::install_crypto_provider();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().expect("client");
    let initialize = serde_json::json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}});
    let (_, _, session, _) = mcp_post(&client, http, None, None, initialize).await;
    let session = session.expect("session");
    let initialized = serde_json::json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
    mcp_post(&client, http, Some(&session), None, initialized).await;
    let call = |id: u64, name: &str| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": {"text": "still here"}}})
    };
    // The pattern-heavy schema is over the cap: not compiled, the result passes unchecked.
    for id in 10..13 {
        let (_, content_type, _, body) =
            mcp_post(&client, http, Some(&session), None, call(id, "mcp__regex__match")).await;
        let reply = jsonrpc_message(&content_type, &body);
        assert_ne!(reply["result"]["isError"], true, "{reply}");
        assert_eq!(reply["result"]["structuredContent"]["s"], "zI", "{reply}");
        let (status, took) = healthz(admin);
        assert_eq!(status, Some(200));
        slowest = slowest.max(took);
    }
    assert!(slowest < Duration::from_secs(1), "/healthz took {slowest:?}");
    assert!(child.try_wait().expect("wait").is_none(), "the agent survived");
    let (_, content_type, _, body) = mcp_post(&client, http, Some(&session), None, call(20, "mcp__fx__echo")).await;
    let reply = jsonrpc_message(&content_type, &body);
    assert_eq!(reply["result"]["isError"], false, "the other server still works: {reply}");

    // 100 pages of ~1 MB each take a while on a loaded machine: wait until both amplifying
    // servers are listed (their cut reported), the agent alive and /healthz answering.
    let deadline = Instant::now() + Duration::from_secs(120);
    let explained = loop {
        let (_, body) = http_get(admin, "/debug/effective").expect("debug");
        let explained: Value = serde_json::from_str(&body).expect("JSON");
        let cut = |id: &str| {
            explained["servers"].as_array().is_some_and(|a| a.iter().any(|s| s["id"] == id && s["listCut"].is_string()))
        };
        if cut("amp") && cut("outbig") {
            break explained;
        }
        assert!(child.try_wait().expect("wait").is_none(), "the agent died while listing");
        assert!(Instant::now() < deadline, "amp and outbig not listed within 120 s: {body}");
        assert_eq!(healthz(admin).0, Some(200), "/healthz while listing");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let server = |id: &str| {
        explained["servers"].as_array().expect("servers").iter().find(|s| s["id"] == id).cloned().expect("listed")
    };
    for id in ["amp", "outbig"] {
        let listed = server(id);
        let cut = listed["listCut"].as_str().unwrap_or_default();
        assert!(cut.contains("left out for their size") && cut.contains("size cap"), "{listed}");
        assert_eq!(listed["tools"].as_array().map_or(0, Vec::len), 0, "{listed}");
    }
    assert_eq!(server("regex")["tools"].as_array().map_or(0, Vec::len), 1);

    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let peak = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap_or_default().to_string();
    eprintln!("agent peak RSS with three amplifying servers: {peak}");
    terminate(&mut child, Duration::from_secs(5));
}

/// A registry dir with server-everything over stdio as McpServer `everything` (`server` adds to
/// its spec) and the McpProfile `p` over it (`profile` adds to its spec).
fn everything_registry(dir: &Path, server: &str, profile: &str) {
    let everything = mcp_servers::everything_stdio();
    let args: Vec<String> = everything.args.iter().map(|a| format!("{a:?}")).collect();
    let yaml = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: everything}}\nspec:\n  \
         transport: stdio\n  stdio:\n    command: {:?}\n    args: [{}]\n  {server}\n---\n\
         apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  \
         servers: [everything]\n  {profile}\n",
        everything.program.to_string_lossy(),
        args.join(", ")
    );
    std::fs::write(dir.join("registry.yaml"), yaml).expect("write the registry");
}

/// server-everything's resources and prompts through `/mcp` with the PyPI `mcp` client: listed
/// under `spear://` URIs and `mcp__` names, read and got through every policy layer, refused
/// with the layer's reason (and the URI in `data.uri`, SEP-2164), cut at the server's output
/// budget, audited. Its tools keep their title, annotations and output schema.
#[test]
fn resources_and_prompts_are_listed_read_and_refused_through_every_layer() {
    let dir = tempfile::tempdir().expect("tempdir");
    everything_registry(
        dir.path(),
        "allowedTools: [echo, get-structured-content]\n  \
         allowedResources: [\"demo://resource/static/document/*\", \"demo://resource/dynamic/text/*\"]\n  \
         deniedResources: [\"*/features.md\"]\n  allowedPrompts: [simple-prompt, args-prompt, completable-prompt]\n  \
         budgets: {maxToolOutputBytes: 200}",
        "resourceDenylist: [\"*/startup.md\"]\n  promptDenylist: [args-prompt]",
    );
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_str().expect("utf-8").to_string();
    let served = serve(dir, &["--audit-log", &audit_path]);
    let doc = |name: &str| format!("spear://everything/demo://resource/static/document/{name}");
    let output = Command::new(mcp_servers::python())
        .arg(script("mcp_items_client.py"))
        .args(["--url", &format!("http://127.0.0.1:{}/mcp", served.http)])
        .args(["--read", &doc("instructions.md"), "--read", &doc("features.md"), "--read", &doc("startup.md")])
        .args(["--read", "spear://everything/demo://resource/dynamic/text/7"])
        .args(["--read", "spear://everything/demo://resource/dynamic/blob/7", "--read", "demo://resource/static/x"])
        .args(["--get", "mcp__everything__simple-prompt", "--get", "mcp__everything__args-prompt={\"city\": \"Oslo\"}"])
        .args(["--get", "mcp__everything__resource-prompt"])
        .args(["--complete", "mcp__everything__completable-prompt:department=E"])
        .args(["--complete", "mcp__everything__args-prompt:city=O"])
        .output()
        .expect("run the Python MCP client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "client failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    let got: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));

    assert_eq!(got["capabilities"], json!({"resources": true, "prompts": true, "completions": true}));
    let resources: Vec<&str> =
        got["resources"].as_array().expect("resources").iter().filter_map(Value::as_str).collect();
    assert!(resources.contains(&doc("instructions.md").as_str()), "{resources:?}");
    assert!(!resources.iter().any(|r| r.ends_with("features.md")), "denied by the server: {resources:?}");
    assert!(!resources.iter().any(|r| r.ends_with("startup.md")), "denied by the profile: {resources:?}");
    assert_eq!(resources.first(), Some(&"spear://groups"), "the agent's own tool groups come first");
    assert!(resources[1..].iter().all(|r| r.starts_with("spear://everything/")), "{resources:?}");
    assert_eq!(got["templates"], json!(["spear://everything/demo://resource/dynamic/text/{resourceId}"]));
    assert_eq!(
        got["prompts"],
        json!(["mcp__everything__simple-prompt", "mcp__everything__completable-prompt"]),
        "args-prompt is denied by the profile"
    );
    // Completions go to the server that owns the prompt, under the prompt's own name, and only
    // for a prompt the workload may get.
    let completions = &got["completions"];
    assert_eq!(completions["mcp__everything__completable-prompt:department=E"]["ok"], json!(["Engineering"]));
    let refused = &completions["mcp__everything__args-prompt:city=O"]["error"];
    assert_eq!(refused["data"]["error"]["code"], "mcp_policy_denied", "{refused}");

    let reads = &got["reads"];
    let instructions = reads[doc("instructions.md")]["ok"].as_array().expect("read instructions.md");
    assert!(
        instructions.last().and_then(Value::as_str).is_some_and(|m| m.contains("mcp_output_too_large")),
        "cut at maxToolOutputBytes with a marker: {instructions:?}"
    );
    for (uri, reason) in [
        (doc("features.md"), "denied_by:server"),
        (doc("startup.md"), "denied_by:profile"),
        ("spear://everything/demo://resource/dynamic/blob/7".to_string(), "not_allowed_by:server"),
    ] {
        let error = &reads[&uri]["error"];
        assert_eq!(error["code"], -32602, "{uri}: {error}");
        assert_eq!(error["data"]["uri"], uri.as_str(), "SEP-2164: the failed read names its URI");
        assert_eq!(error["data"]["error"]["code"], "mcp_policy_denied", "{uri}: {error}");
        assert!(error["message"].as_str().is_some_and(|m| m.contains(reason)), "{uri}: {error}");
    }
    assert!(reads["spear://everything/demo://resource/dynamic/text/7"]["ok"].is_array(), "{reads}");
    assert_eq!(reads["demo://resource/static/x"]["error"]["data"]["error"]["code"], "mcp_invalid_arguments");

    // What the server lists beyond name, description and schema passes under the namespaced name.
    let weather = &got["tools"]["mcp__everything__get-structured-content"];
    assert_eq!(weather["title"], "Get Structured Content Tool", "{weather}");
    assert_eq!(weather["annotations"]["readOnlyHint"], true, "{weather}");
    assert_eq!(weather["annotations"]["destructiveHint"], false, "{weather}");
    assert!(weather["outputSchema"]["properties"]["temperature"].is_object(), "{weather}");
    let echo = &got["tools"]["mcp__everything__echo"];
    assert!(echo.get("outputSchema").is_none(), "a tool without one gets none: {echo}");

    let gets = &got["gets"];
    assert!(gets["mcp__everything__simple-prompt"]["ok"].is_array(), "{gets}");
    for name in ["mcp__everything__args-prompt", "mcp__everything__resource-prompt"] {
        assert_eq!(gets[name]["error"]["data"]["error"]["code"], "mcp_policy_denied", "{name}: {gets}");
    }

    drop(served);
    let lines: Vec<Value> = std::fs::read_to_string(&audit_path)
        .expect("audit log")
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    let line =
        |asked: &str| lines.iter().find(|l| l["called_as"] == asked).unwrap_or_else(|| panic!("{asked}: {lines:?}"));
    let read = line(&doc("instructions.md"));
    assert_eq!(
        (&read["kind"], &read["status"], &read["server_id"]),
        (&json!("resource"), &json!("mcp_output_too_large"), &json!("everything")),
        "cut at the 200-byte budget, as a tool call's status says"
    );
    assert!(read["output_bytes"].as_u64().is_some_and(|b| b > 200), "the size before the cap: {read}");
    assert_eq!(read["tool_name"], "demo://resource/static/document/instructions.md");
    assert_eq!(line(&doc("features.md"))["status"], "mcp_policy_denied");
    assert_eq!(line("mcp__everything__simple-prompt")["kind"], "prompt");
    assert_eq!(line("mcp__everything__args-prompt")["status"], "mcp_policy_denied");
}

/// A profile whose servers offer only tools (the fixture) declares resources for the agent's own
/// tool groups (`spear://groups`: the set's tools by server, for a client that browses by server)
/// and nothing else: a client asking for prompts or completions anyway gets -32601, not an empty
/// list.
#[test]
fn capabilities_are_only_what_the_servers_and_the_policy_offer_and_the_tool_groups() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry_of(dir.path(), &mcp_servers::fixture_stdio(&[]));
    let served = serve(dir, &[]);
    let output = Command::new(mcp_servers::python())
        .arg(script("mcp_items_client.py"))
        .args(["--url", &format!("http://127.0.0.1:{}/mcp", served.http)])
        .args(["--get", "mcp__fx__anything", "--complete", "mcp__fx__anything:x=y", "--read", "spear://groups"])
        .output()
        .expect("run the Python MCP client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "client failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    let got: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(got["capabilities"], json!({"resources": true, "prompts": false, "completions": false}));
    assert_eq!((&got["resources"], &got["templates"]), (&json!(["spear://groups"]), &json!([])));
    let read = got["reads"]["spear://groups"]["ok"][0].as_str().unwrap_or_else(|| panic!("{}", got["reads"]));
    let groups: Value = serde_json::from_str(read).expect("the groups are JSON");
    let [group] = groups["groups"].as_array().expect("groups").as_slice() else { panic!("one group: {groups}") };
    assert_eq!(group["id"], "fx", "{group}");
    let tools: Vec<&str> = group["tools"].as_array().expect("tools").iter().filter_map(Value::as_str).collect();
    assert!(tools.contains(&"mcp__fx__echo"), "{tools:?}");
    assert!(!tools.contains(&"mcp__fx__big") && !tools.contains(&"mcp__fx__pid"), "only exposed tools: {tools:?}");
    for (what, answer) in [
        ("prompts/list", &got["prompts"]),
        ("prompts/get", &got["gets"]["mcp__fx__anything"]),
        ("completion/complete", &got["completions"]["mcp__fx__anything:x=y"]),
    ] {
        assert_eq!(answer["error"]["code"], -32601, "{what}: {answer}");
    }
}

/// A tool with an outputSchema whose structuredContent does not fit `maxToolOutputBytes` is a
/// structured `mcp_output_too_large` error, not a result whose structured part was dropped
/// (server-everything's `get-structured-content`); a tool without one is cut with a marker.
#[tokio::test]
async fn structured_output_that_does_not_fit_is_an_error_not_a_broken_result() {
    let dir = tempfile::tempdir().expect("tempdir");
    everything_registry(
        dir.path(),
        "allowedTools: [echo, get-structured-content]\n  budgets: {maxToolOutputBytes: 24}",
        "",
    );
    let served = serve(dir, &["--audit-log", "off"]);
    spear::install_crypto_provider();
    let http = reqwest::Client::new();
    let session = open_session(&http, served.http, "structured").await;
    let call = |id: u64, name: &str, arguments: Value| {
        serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
            "params": {"name": name, "arguments": arguments}})
    };
    let weather = call(2, "mcp__everything__get-structured-content", json!({"location": "Chicago"}));
    let (_, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, weather).await;
    let reply = jsonrpc_message(&content_type, &body);
    assert_eq!(reply["result"]["isError"], true, "{reply}");
    assert_eq!(reply["result"]["structuredContent"]["error"]["code"], "mcp_output_too_large", "{reply}");
    let message = reply["result"]["structuredContent"]["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("outputSchema"), "{message}");

    let echo = call(3, "mcp__everything__echo", json!({"message": "a message longer than twenty-four bytes"}));
    let (_, content_type, _, body) = mcp_post(&http, served.http, Some(&session), None, echo).await;
    let reply = jsonrpc_message(&content_type, &body);
    assert_ne!(reply["result"]["isError"], true, "a tool without an outputSchema is cut: {reply}");
    assert!(body.contains("mcp_output_too_large"), "with the marker: {reply}");
}

/// A registry edit that may change which resources and prompts a client sees reaches a
/// 2025-11-25 session client as `resources/list_changed` and `prompts/list_changed`, and the
/// next listing follows the edit.
#[test]
fn a_registry_edit_reaches_mcp_clients_as_resource_and_prompt_list_changed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let everything = mcp_servers::everything_stdio();
    let args: Vec<String> = everything.args.iter().map(|a| format!("{a:?}")).collect();
    let registry = |denied: &str| {
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: everything}}\nspec:\n  \
             transport: stdio\n  stdio:\n    command: {:?}\n    args: [{}]\n  allowedTools: [echo, get-structured-content]\n  \
             allowedResources: [\"*/static/*\"]\n  deniedResources: [{denied}]\n  allowedPrompts: [\"*\"]\n---\n\
             apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [everything]\n",
            everything.program.to_string_lossy(),
            args.join(", ")
        )
    };
    std::fs::write(dir.path().join("registry.yaml"), registry("\"*/features.md\"")).expect("write the registry");
    let served = serve(dir, &["--audit-log", "off"]);
    let mut child = Command::new(mcp_servers::python())
        .arg(script("mcp_items_client.py"))
        .args(["--url", &format!("http://127.0.0.1:{}/mcp", served.http), "--wait-items-changed"])
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn the Python MCP client");
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let mut next = || -> Value {
        let line = lines.next().expect("a line from the client").expect("readable");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"))
    };
    assert_eq!(next()["event"], "waiting");
    std::fs::write(served.dir.path().join("registry.yaml"), registry("\"*/features.md\", \"*/instructions.md\""))
        .expect("edit the registry");
    let changed = next();
    assert_eq!(changed["event"], "items_changed", "{changed}");
    assert_eq!(changed["kinds"], json!(["prompts", "resources"]));
    let resources = changed["resources"].as_array().expect("resources");
    assert!(!resources.is_empty());
    assert!(!resources.iter().any(|r| r.as_str().is_some_and(|r| r.ends_with("instructions.md"))), "{resources:?}");
    assert!(child.wait().expect("client exit").success());
}

/// A registry of server-everything (`everything`, 2025-11-25 over stdio) and the conformance
/// fixture (`conf`, 2026-07-28 over stdio), all tools allowed, each with its `extra` spec line,
/// and profile `p` using both.
fn everything_and_fixture_registry(dir: &Path, everything_extra: &str, conf_extra: &str) {
    let everything = mcp_servers::everything_stdio();
    let yaml = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: everything}}\nspec:\n  \
         transport: stdio\n  stdio:\n    command: {}\n    args: {}\n  allowedTools: [\"*\"]\n  {everything_extra}\n---\n\
         apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: conf}}\nspec:\n  \
         transport: stdio\n  stdio:\n    command: {}\n    args: [{}]\n  allowedTools: [\"*\"]\n  {conf_extra}\n---\n\
         apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  \
         servers: [everything, conf]\n  defaultServers: [everything, conf]\n",
        json!(everything.program.to_string_lossy()),
        json!(everything.args),
        json!(mcp_servers::python().to_string_lossy()),
        json!(script("conformance_fixture.py").to_string_lossy()),
    );
    std::fs::write(dir.join("registry.yaml"), yaml).expect("write the registry");
}

/// Runs `tests/servers/mcp_relay_client.py` against `served`'s `/mcp` with `options` and one
/// `--call` per entry of `calls`; its JSON report.
fn relay_client(served: &Served, options: &[&str], calls: &[&str]) -> Value {
    let mut client = Command::new(mcp_servers::python());
    client.arg(script("mcp_relay_client.py")).args(["--url", &format!("http://127.0.0.1:{}/mcp", served.http)]);
    client.args(options);
    for call in calls {
        client.args(["--call", call]);
    }
    let output = client.output().expect("run the Python MCP client");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(output.status.success(), "client failed: {}\n{stdout}", String::from_utf8_lossy(&output.stderr));
    serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

/// What servers send during a call reaches the `/mcp` client that made it (PyPI `mcp`, a
/// 2025-11-25 session declaring sampling and elicitation), from a 2025 server over its session
/// (server-everything: progress, sampling, elicitation requests) and from a 2026-07-28 server
/// (the conformance fixture: log messages asked for per request; its input rounds bridged to
/// the session's requests); resource subscriptions reach either server (resources/subscribe on
/// the 2025 one, `subscriptions/listen` on the other).
#[test]
fn a_servers_progress_logs_and_requests_reach_the_caller_of_the_call() {
    let dir = tempfile::tempdir().expect("tempdir");
    everything_and_fixture_registry(dir.path(), "allowedResources: [\"*\"]", "allowedResources: [\"*\"]");
    let served = serve(dir, &["--audit-log", "off"]);
    let calls = [
        r#"mcp__everything__trigger-long-running-operation={"duration": 1, "steps": 3}"#,
        r#"mcp__everything__trigger-sampling-request={"prompt": "capital of France?", "maxTokens": 20}"#,
        "mcp__everything__trigger-elicitation-request",
        "mcp__conf__test_tool_with_logging",
        r#"mcp__conf__test_sampling={"prompt": "capital of Peru?"}"#,
        r#"mcp__conf__test_elicitation={"message": "Please provide your details"}"#,
    ];
    let subscriptions = [
        "--subscribe",
        "spear://everything/demo://resource/static/document/instructions.md",
        "--subscribe",
        "spear://conf/test://watched-resource",
    ];
    let got = relay_client(&served, &[&["--log-level", "info"][..], &subscriptions].concat(), &calls);
    assert!(got["capabilities"]["logging"].is_object(), "both servers log: {}", got["capabilities"]);
    assert_eq!(got["capabilities"]["resources"]["subscribe"], true, "{}", got["capabilities"]);
    for (uri, error) in got["subscribe"].as_object().expect("subscriptions") {
        assert!(error.is_null(), "subscribing to {uri}: {error}");
    }
    let call = |i: usize| &got["calls"][calls[i]];
    let texts = |i: usize| call(i)["texts"].to_string();

    let progress: Vec<f64> =
        call(0)["progress"].as_array().expect("progress").iter().filter_map(|p| p["progress"].as_f64()).collect();
    assert_eq!(progress, [1.0, 2.0, 3.0], "progress under the caller's token, in order: {}", call(0));

    assert_eq!(
        call(1)["asked"],
        json!([{"sampling": "Resource trigger-sampling-request context: capital of France?"}])
    );
    assert!(texts(1).contains("sampled: Resource trigger-sampling-request"), "the server got the answer: {}", call(1));
    assert_eq!(call(2)["asked"].as_array().map(Vec::len), Some(1), "{}", call(2));
    assert!(texts(2).contains("Ada") && texts(2).contains("ada@example.org"), "{}", call(2));

    let logs: Vec<&str> = call(3)["logs"].as_array().expect("logs").iter().filter_map(|l| l["data"].as_str()).collect();
    assert_eq!(logs, ["tool execution started", "tool execution processing", "tool execution completed"]);
    // A 2026-07-28 server asks with InputRequiredResult; the agent asks this 2025 caller as a
    // 2025 server would, and sends the call again with the answer.
    assert_eq!(call(4)["asked"], json!([{"sampling": "capital of Peru?"}]), "{}", call(4));
    assert!(texts(4).contains("LLM response: sampled: capital of Peru?"), "{}", call(4));
    assert!(texts(5).contains("action=accept") && texts(5).contains("Ada"), "{}", call(5));
    for i in 0..calls.len() {
        if i != 3 {
            assert_eq!(call(i)["logs"], json!([]), "no other call's log lines: {}", call(i));
        }
    }
}

/// `approvalPolicy: destructiveHint`: server-everything's `echo` says it is read-only and runs;
/// the conformance fixture's tools make no claim, so they need approval (none is configured:
/// `mcp_approval_required`), as does one listed `always` whatever it claims.
#[test]
fn approval_follows_destructive_hint_and_never_loosens_always() {
    let dir = tempfile::tempdir().expect("tempdir");
    everything_and_fixture_registry(
        dir.path(),
        "approvalPolicy: {default: destructiveHint, tools: {get-sum: always}}",
        "approvalPolicy: {default: destructiveHint}",
    );
    let served = serve(dir, &["--audit-log", "off"]);
    let calls = [
        r#"mcp__everything__echo={"message": "hi"}"#,
        r#"mcp__everything__get-sum={"a": 1, "b": 2}"#,
        "mcp__conf__test_simple_text",
    ];
    let got = relay_client(&served, &[], &calls);
    let call = |i: usize| &got["calls"][calls[i]];
    assert_eq!(call(0)["isError"], false, "echo claims readOnlyHint: {}", call(0));
    assert!(call(0)["texts"].to_string().contains("hi"), "{}", call(0));
    for (i, why) in [(1, "(approvalPolicy)"), (2, "destructiveHint")] {
        assert_eq!(call(i)["isError"], true, "{}", call(i));
        let text = call(i)["texts"].to_string();
        assert!(text.contains("mcp_approval_required") && text.contains(why), "{}", call(i));
    }
}

/// A server whose answers break the outputSchema it lists: the conforming answer passes, the
/// other two reach the caller as errors naming the violation (`mcp_unavailable`), never as
/// results that seem to conform.
#[test]
fn structured_output_that_breaks_its_output_schema_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: liar}}\nspec:\n  transport: stdio\n  \
         stdio:\n    command: {}\n    args: [{}, \"--lying-output\"]\n  allowedTools: [\"*\"]\n---\n\
         apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [liar]\n",
        json!(mcp_servers::python().to_string_lossy()),
        json!(script("hostile_server.py").to_string_lossy()),
    );
    std::fs::write(dir.path().join("registry.yaml"), yaml).expect("write the registry");
    let served = serve(dir, &["--audit-log", "off"]);
    let calls = [
        r#"mcp__liar__weather={"answer": "good"}"#,
        r#"mcp__liar__weather={"answer": "bad"}"#,
        r#"mcp__liar__weather={"answer": "none"}"#,
    ];
    let got = relay_client(&served, &[], &calls);
    let call = |i: usize| &got["calls"][calls[i]];
    assert_eq!(call(0)["isError"], false, "{}", call(0));
    for (i, what) in [(1, "/temperature"), (2, "no structuredContent")] {
        assert_eq!(call(i)["isError"], true, "{}", call(i));
        let text = call(i)["texts"].to_string();
        assert!(text.contains("broke its own outputSchema") && text.contains(what), "{}", call(i));
        assert!(text.contains("mcp_unavailable"), "{}", call(i));
    }
}

/// The attack the relay's attribution stops: with a call of one `/mcp` session in flight on a
/// stdio server, another session's call makes that server ask for input. Nothing on the wire
/// says which call asked, so neither caller is asked: the first session, whose client would
/// accept anything, never sees the other's elicitation or sampling request; the server is told
/// declined, and refused (-1).
#[test]
fn a_servers_request_is_never_put_to_another_callers_session() {
    let dir = tempfile::tempdir().expect("tempdir");
    everything_registry(dir.path(), "allowedTools: [\"*\"]", "");
    let served = serve(dir, &["--audit-log", "off"]);
    let during = ["--during", r#"mcp__everything__trigger-long-running-operation={"duration": 4, "steps": 8}"#];
    let calls = [
        "mcp__everything__trigger-elicitation-request",
        r#"mcp__everything__trigger-sampling-request={"prompt": "x", "maxTokens": 5}"#,
    ];
    let got = relay_client(&served, &during, &calls);
    let during = &got["during"];
    assert_eq!(during["first_asked"], json!([]), "the session in flight was asked another's question: {during}");
    let second = during["second"].as_object().expect("the second session's calls");
    let [elicited, sampled] = [0, 1].map(|i| second.values().nth(i).expect("two calls").clone());
    assert_eq!(elicited["asked"], json!([]), "{elicited}");
    assert!(elicited["texts"].to_string().contains("decline"), "the server was told declined: {elicited}");
    assert!(sampled["texts"].to_string().contains("sampling refused by spearlet"), "{sampled}");
}

/// `spearlet serve` over the fixture server recording what it hears (`--record`) and writing an
/// audit log: the server, the record file and the audit file.
fn serve_recording_fixture() -> (Served, tempfile::NamedTempFile, tempfile::NamedTempFile) {
    let record = tempfile::NamedTempFile::new().expect("record file");
    let record_path = record.path().to_string_lossy().into_owned();
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry_of(dir.path(), &mcp_servers::fixture_stdio(&["--record", &record_path]));
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_string_lossy().into_owned();
    (serve(dir, &["--audit-log", &audit_path]), record, audit)
}

/// Waits up to 10 s for the fixture's record file to hold `text`.
async fn wait_for_record(path: &Path, text: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read_to_string(path).unwrap_or_default().contains(text) {
        assert!(Instant::now() < deadline, "the server never recorded '{text}'");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A session caller that gives up on a call sends `notifications/cancelled` (as its own POST,
/// the call's still open): the agent stops the call, answers and audits it as `mcp_cancelled`,
/// and tells the server, which stops its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_mcp_caller_cancels_is_audited_and_cancelled_at_the_server() {
    spear::install_crypto_provider();
    let (served, record, audit) = serve_recording_fixture();
    let http = reqwest::Client::new();
    let session = open_session(&http, served.http, "canceller").await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "mcp__fx__sleep", "arguments": {"ms": 30_000}}});
    let (port, client, id) = (served.http, http.clone(), session.clone());
    let pending = tokio::spawn(async move { mcp_post(&client, port, Some(&id), None, call).await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let cancel =
        json!({"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7, "reason": "gave up"}});
    assert_eq!(mcp_post(&http, served.http, Some(&session), None, cancel).await.0, 202);
    let (status, _, _, body) = tokio::time::timeout(Duration::from_secs(10), pending)
        .await
        .expect("the call ends at once, not after 30 s")
        .expect("the call task");
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("mcp_cancelled"), "{body}");

    wait_for_record(record.path(), "cancelled sleep 30000").await;
    let line = wait_for_audit(audit.path(), 1, |l| l["tool_name"] == "sleep").remove(0);
    assert_eq!((line["status"].as_str(), line["server_id"].as_str()), (Some("mcp_cancelled"), Some("fx")), "{line}");
}

/// A gRPC caller that gives up (its call dropped: the stream is reset; or its `grpc-timeout`
/// passes): the agent ends the call as `mcp_cancelled`, audits it, and tells the server, which
/// stops its work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_the_grpc_caller_abandons_is_audited_and_cancelled_at_the_server() {
    use spear::agent::grpc::pb;
    use spear::agent::grpc::pb::mcp_sessions_client::McpSessionsClient;
    let (served, record, audit) = serve_recording_fixture();
    let mut client = McpSessionsClient::connect(format!("http://127.0.0.1:{}", served.grpc)).await.expect("connect");
    let session = client
        .open(pb::OpenRequest { server_id: "fx".into(), ..Default::default() })
        .await
        .expect("open")
        .into_inner()
        .session_id;
    let sleep = |ms: u32| pb::CallToolRequest {
        session_id: session.clone(),
        tool: "sleep".into(),
        args_json: format!(r#"{{"ms": {ms}}}"#),
    };

    // Dropped by the caller after a second.
    let mut dropping = client.clone();
    let abandoned = tokio::time::timeout(Duration::from_secs(1), dropping.call_tool(sleep(30_000))).await;
    assert!(abandoned.is_err(), "the call must still be running: {abandoned:?}");
    // A deadline the caller set: tonic's server ends the handler when it passes.
    let mut request = tonic::Request::new(sleep(20_000));
    request.set_timeout(Duration::from_millis(1500));
    let timed_out = tokio::time::timeout(Duration::from_secs(10), client.call_tool(request))
        .await
        .expect("the deadline ends the call, not the server");
    assert_eq!(timed_out.map(|_| ()).map_err(|s| s.code()), Err(tonic::Code::Cancelled));

    for ms in [30_000, 20_000] {
        wait_for_record(record.path(), &format!("cancelled sleep {ms}")).await;
    }
    let lines = wait_for_audit(audit.path(), 2, |l| l["tool_name"] == "sleep");
    for line in lines {
        assert_eq!((line["status"].as_str(), line["door"].as_str()), (Some("mcp_cancelled"), Some("grpc")), "{line}");
    }
}

/// Every caller in a pod comes from 127.0.0.1, so the per-source share of a port must not cap an
/// app: 100 rmcp Streamable HTTP sessions, each with its own connection pool (a connection for
/// requests and the session's GET stream: about 200 connections, past a quarter of the default
/// 512), all open and all call through one agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_app_with_many_sessions_is_not_capped_at_one_sources_share() {
    use rmcp::ServiceExt;
    use rmcp::model::CallToolRequestParams;
    use rmcp::transport::StreamableHttpClientTransport;

    spear::install_crypto_provider();
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = serve(dir, &["--audit-log", "off"]);
    let url = format!("http://127.0.0.1:{}/mcp", served.http);
    let mut clients = Vec::new();
    for i in 0..100 {
        let transport = StreamableHttpClientTransport::from_uri(url.clone());
        match tokio::time::timeout(Duration::from_secs(20), ().serve(transport)).await {
            Ok(client) => clients.push(client.expect("a session")),
            Err(_) => panic!("session {i} within 20 s"),
        }
    }
    let calls = clients.iter().map(|client| {
        let params = CallToolRequestParams::new("mcp__fx__echo")
            .with_arguments(json!({"text": "hi"}).as_object().cloned().unwrap_or_default());
        tokio::time::timeout(Duration::from_secs(20), client.call_tool(params))
    });
    for (i, answer) in futures::future::join_all(calls).await.into_iter().enumerate() {
        let result = answer.unwrap_or_else(|_| panic!("call {i} within 20 s")).expect("the call");
        assert_ne!(result.is_error, Some(true), "call {i}: {result:?}");
    }
    for client in clients {
        let _ = client.cancel().await;
    }
    drop(served);
}

/// `/startupz`, which the injected agent's postStart hook (`spearlet wait-ready`) asks: not ready
/// while the first lists are missing (its 503 says why, after holding the request for them),
/// ready with `/readyz`'s body once they are in. (A pod's start is measured by
/// `SPEAR_E2E_MEASURE=1 hack/e2e.sh`.)
#[test]
fn startupz_answers_as_readyz_once_the_first_lists_are_in() {
    let (dir, gates) = (tempfile::tempdir().expect("tempdir"), tempfile::tempdir().expect("tempdir"));
    let gate = gates.path().join("release-the-server");
    let gate_arg = gate.to_string_lossy().into_owned();
    fixture_registry_of(dir.path(), &mcp_servers::fixture_stdio(&["--wait-for", &gate_arg]));
    let served = spawn_serve(dir, &["--audit-log", "off"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(served.admin, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "spearlet serve did not answer");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = http_get(served.admin, "/startupz").expect("/startupz");
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: listing the profile's servers' tools for the first time"), "{body}");

    std::fs::write(&gate, "").expect("release the server");
    while http_get(served.admin, "/readyz").is_none_or(|(status, _)| status != 200) {
        assert!(Instant::now() < deadline, "not ready within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (status, body) = http_get(served.admin, "/startupz").expect("/startupz");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ready\n") && body.contains("fx: listed"), "{body}");
}
