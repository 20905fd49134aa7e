//! Attacks from the security review, run against the real agent: each test is named for what it
//! stops, and failed before the fix it guards.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use spear::agent::grpc::pb;
use spear::agent::grpc::pb::mcp_registry_client::McpRegistryClient;

use crate::serve::{fixture_registry, http_get, spawn_serve_with_stderr};

/// One HTTP/1.1 request on 127.0.0.1 with `host` as its Host header: the status, if any answer
/// came within 5 s.
fn request_with_host(port: u16, method: &str, path: &str, host: &str) -> Option<u16> {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(stream, "{method} {path} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    text.split_whitespace().nth(1)?.parse().ok()
}

/// stderr is a pipe nobody reads (a stuck log collector, a terminal on hold): once it is full,
/// every log and audit line would block its writer. The agent keeps answering `/healthz`, the
/// doors and the tool calls, drops what stderr cannot take and counts it; the lines that do
/// arrive are whole.
#[test]
fn a_stalled_stderr_never_stops_healthz_or_the_doors() {
    let scratch = tempfile::tempdir().expect("tempdir");
    let fifo = scratch.path().join("stderr");
    assert!(Command::new("mkfifo").arg(&fifo).status().expect("mkfifo").success());
    // The read end stays open and is never read until the end: writes fill the pipe, then block.
    let mut reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(rustix::fs::OFlags::NONBLOCK.bits() as i32)
        .open(&fifo)
        .expect("open the read end");
    rustix::pipe::fcntl_setpipe_size(&reader, 4096).expect("shrink the pipe to one page");
    let writer = std::fs::OpenOptions::new().write(true).open(&fifo).expect("open the write end");

    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    // Debug logs and the audit on stderr: many small lines, from the runtime and the audit thread.
    let served = spawn_serve_with_stderr(dir, &["--log-level", "spear=debug,info"], Stdio::from(writer));
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(served.admin, "/readyz").map(|(status, _)| status) != Some(200) {
        assert!(Instant::now() < deadline, "not ready within 60 s with a stalled stderr");
        std::thread::sleep(Duration::from_millis(50));
    }

    // Each refused request is an INFO line: a page of pipe is full after a few dozen, and the
    // log queue (8,192 lines) after a few thousand.
    let flood: Vec<_> = (0..4)
        .map(|_| {
            let port = served.http;
            std::thread::spawn(move || {
                for _ in 0..2_500 {
                    let status = request_with_host(port, "POST", "/mcp", "rebind.evil.example");
                    assert_eq!(status, Some(403), "a refused request is still answered");
                }
            })
        })
        .collect();
    for thread in flood {
        thread.join().expect("the flood's requests were all answered");
    }
    let started = Instant::now();
    assert_eq!(http_get(served.admin, "/healthz").map(|(status, _)| status), Some(200), "healthz answers");
    assert!(started.elapsed() < Duration::from_secs(2), "healthz took {:?}", started.elapsed());

    // Audited tool calls through the gRPC-free door (`spearlet tools` speaks gRPC): /mcp.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    runtime.block_on(async {
        spear::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("client");
        let session = crate::serve::open_session(&http, served.http, "stalled").await;
        for id in 2..40 {
            let call = serde_json::json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
                "params": {"name": "mcp__fx__echo", "arguments": {"text": "still here"}}});
            let (status, content_type, _, body) =
                crate::serve::mcp_post(&http, served.http, Some(&session), None, call).await;
            assert_eq!(status, 200, "call {id}: {body}");
            let reply = crate::serve::jsonrpc_message(&content_type, &body);
            assert_eq!(reply["result"]["isError"], false, "call {id}: {reply}");
        }
    });
    let (status, metrics) = http_get(served.admin, "/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    let dropped = metrics
        .lines()
        .find_map(|line| line.strip_prefix("spear_log_dropped_lines_total "))
        .and_then(|n| n.trim().parse::<u64>().ok())
        .unwrap_or_else(|| panic!("no spear_log_dropped_lines_total in\n{metrics}"));
    assert!(dropped > 0, "log lines that stderr could not take are counted");

    // What did reach stderr is whole lines: every audit line parses.
    drop(served);
    let mut text = Vec::new();
    let _ = reader.read_to_end(&mut text);
    let text = String::from_utf8_lossy(&text);
    for line in text.lines().filter(|l| l.starts_with('{')) {
        assert!(serde_json::from_str::<serde_json::Value>(line).is_ok(), "a torn audit line: {line}");
    }
}

/// Runs `spearlet` with `args`, stdin from `stdin`, under `prlimit --data=256MiB` (the heap and
/// every writable private mapping): what the command really holds.
fn spearlet_limited(args: &[&std::ffi::OsStr], stdin: Stdio) -> std::process::Output {
    Command::new("prlimit")
        .arg(format!("--data={}", 256u64 << 20))
        .arg("--")
        .arg(env!("CARGO_BIN_EXE_spearlet"))
        .args(args)
        .stdin(stdin)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .expect("spearlet runs under prlimit")
}

/// What a terminal must never receive from text a manifest, a server or a pod chose: ESC (and
/// with it OSC 52, which writes the clipboard), BEL, the 8-bit CSI, and the bidirectional
/// override that reorders what a reviewer reads.
fn assert_terminal_safe(what: &str, bytes: &[u8]) {
    let text = String::from_utf8_lossy(bytes);
    for bad in ['\u{1b}', '\u{7}', '\u{9b}', '\u{202e}'] {
        assert!(!text.contains(bad), "{what} printed U+{:04X}:\n{text}", bad as u32);
    }
}

/// A pull request's manifest whose fields carry escape sequences (a title rewrite, a screen
/// clear, an OSC 52 clipboard write): no command prints them raw, through any door: a file, a
/// directory, stdin, the registry listing, and a top-level `error:` line.
#[test]
fn escape_sequences_in_a_manifest_never_reach_the_terminal() {
    let hostile = "\u{1b}]0;pwned-title\u{7}\u{1b}[2J\u{1b}]52;c;ZWNobyBoaQ==\u{7}\u{9b}31m\u{202e}";
    let dir = tempfile::tempdir().expect("tempdir");
    let manifest = format!(
        "apiVersion: \"{hostile}\"\nkind: McpServer\nmetadata:\n  name: x\n---\napiVersion: mcp.spear.dev/v1alpha1\nkind: \
         McpServer\nmetadata:\n  name: y\nspec:\n  transport: stdio\n  stdio:\n    command: \"{hostile}\"\n  \
         allowedTools: [\"{hostile}\"]\n  \"{hostile}\": 1\n"
    );
    let file = dir.path().join("server.yaml");
    std::fs::write(&file, &manifest).expect("write the manifest");
    let read_manifest = || Stdio::from(std::fs::File::open(&file).expect("open the manifest"));
    let runs: [(&str, Vec<&std::ffi::OsStr>, Stdio); 4] = [
        ("validate FILE", vec!["validate".as_ref(), file.as_os_str()], Stdio::null()),
        ("validate DIR", vec!["validate".as_ref(), dir.path().as_os_str()], Stdio::null()),
        ("validate -", vec!["validate".as_ref(), "-".as_ref()], read_manifest()),
        ("registry", vec!["registry".as_ref(), "--registry-dir".as_ref(), dir.path().as_os_str()], Stdio::null()),
    ];
    for (what, args, stdin) in runs {
        let out = spearlet_limited(&args, stdin);
        assert_eq!(out.status.code(), Some(1), "{what} reports the problems: {out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).contains("\\u{1b}"), "{what} shows the escape as text: {out:?}");
        assert_terminal_safe(what, &out.stdout);
        assert_terminal_safe(what, &out.stderr);
    }
    // A directory named by the attacker, with nothing to read: the usage error names it.
    let named = dir.path().join(format!("docs{hostile}"));
    std::fs::create_dir(&named).expect("mkdir");
    let out = spearlet_limited(&["validate".as_ref(), named.as_os_str()], Stdio::null());
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).starts_with("error: "), "{out:?}");
    assert_terminal_safe("the error line", &out.stderr);
}

/// One document under every cap (a 13 kB anchored string aliased 2,500 times, 32.5 MB when
/// expanded) repeated in a 1 MB file: each copy was built before any was read (1.42 GiB). The
/// budget is the file's: one problem, within 256 MiB, from a file, from stdin and from a
/// registry directory.
#[test]
fn a_document_under_the_caps_repeated_in_one_file_stays_within_a_memory_limit() {
    let value = "x".repeat(13_000);
    let aliases = "*v, ".repeat(2_500);
    let document = format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: x}}\nspec:\n  transport: stdio\n  \
         stdio: {{command: &v {value}}}\n  allowedTools: [{aliases}]\n"
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("bomb.yaml");
    std::fs::write(&file, vec![document; 40].join("---\n")).expect("write");
    assert!(std::fs::metadata(&file).expect("size").len() < 1 << 20);
    let from_file = || Stdio::from(std::fs::File::open(&file).expect("open"));
    let runs: [(&str, Vec<&std::ffi::OsStr>, Stdio); 3] = [
        ("validate FILE", vec!["validate".as_ref(), file.as_os_str()], Stdio::null()),
        ("validate -", vec!["validate".as_ref(), "-".as_ref()], from_file()),
        ("registry", vec!["registry".as_ref(), "--registry-dir".as_ref(), dir.path().as_os_str()], Stdio::null()),
    ];
    for (what, args, stdin) in runs {
        let out = spearlet_limited(&args, stdin);
        let text = String::from_utf8_lossy(&out.stdout);
        assert_eq!(out.status.code(), Some(1), "{what} ends with the problem, not killed: {out:?}");
        assert!(text.contains("the file's values exceed"), "{what}: {text}");
    }
}

/// `spearlet validate -` from a source that never ends (`< /dev/zero`): at most one byte past
/// the manifest cap is read, and the size is the problem.
#[test]
fn an_endless_stdin_is_not_read_into_memory() {
    let zero = std::fs::File::open("/dev/zero").expect("/dev/zero");
    let out = spearlet_limited(&["validate".as_ref(), "-".as_ref()], Stdio::from(zero));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("at most 8388608 are read"), "{out:?}");
}

/// HTTP/2 peers that send the preface, answer every PING and never ask anything, on every port
/// of the agent, the gRPC door included: each is closed after the idle timeout (they were held
/// forever, and 20 of them kept `/healthz` from answering; the gRPC door had neither an idle
/// timeout nor a connection cap), and the ports serve again.
#[tokio::test]
async fn idle_http2_connections_cannot_hold_the_ports() {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = crate::serve::serve(
        dir,
        &["--audit-log", "off", "--header-read-timeout-seconds", "1", "--max-connections", "16"],
    );
    let mut idle = Vec::new();
    for port in [served.http, served.admin, served.grpc] {
        for _ in 0..16 {
            let Ok(stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { continue };
            let handshake = hyper::client::conn::http2::handshake::<_, _, axum::body::Body>(
                TokioExecutor::new(),
                TokioIo::new(stream),
            );
            // Over the caps, the agent closes the connection before the handshake completes.
            if let Ok(Ok((sender, connection))) = tokio::time::timeout(Duration::from_secs(2), handshake).await {
                idle.push((port, sender, tokio::spawn(connection)));
            }
        }
    }
    assert!(!idle.is_empty(), "some idle connections were accepted");
    let started = Instant::now();
    for (port, _sender, connection) in idle {
        let closed = tokio::time::timeout(Duration::from_secs(10), connection).await;
        assert!(closed.is_ok(), "port {port}: an idle h2 connection was still open after 10 s");
    }
    assert!(started.elapsed() < Duration::from_secs(10));
    let healthz = tokio::task::spawn_blocking(move || {
        let answered = http_get(served.admin, "/healthz").map(|(status, _)| status);
        (answered, served)
    });
    let (answered, served) = healthz.await.expect("join");
    assert_eq!(answered, Some(200), "healthz answers once the idle peers are gone");
    let mut registry = McpRegistryClient::connect(format!("http://127.0.0.1:{}", served.grpc)).await.expect("gRPC");
    let listed = registry.list(pb::ListRequest::default()).await.expect("the gRPC door answers").into_inner();
    assert!(!listed.registry_revision.is_empty());
}

/// A Watch stream is a request in flight for as long as it is open: quiet for three times the
/// idle timeout, it is neither cut nor its connection closed under it, it still delivers the next
/// registry change, and the same connection takes other calls meanwhile.
#[tokio::test]
async fn a_quiet_grpc_watch_outlives_the_idle_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = crate::serve::serve(dir, &["--audit-log", "off", "--header-read-timeout-seconds", "1"]);
    let channel = tonic::transport::Endpoint::from_shared(format!("http://127.0.0.1:{}", served.grpc))
        .expect("uri")
        .connect()
        .await
        .expect("connect to the gRPC door");
    let mut registry = McpRegistryClient::new(channel);
    let mut watch = registry.watch(pb::WatchRequest::default()).await.expect("watch").into_inner();
    let first = watch.message().await.expect("first event").expect("an event");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let listed = registry.list(pb::ListRequest::default()).await.expect("a call beside the quiet Watch");
    assert_eq!(listed.into_inner().registry_revision, first.registry_revision);
    std::fs::write(
        served.dir.path().join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx]\n  \
         toolDenylist: [pid, echo]\n",
    )
    .expect("edit the profile");
    let next = tokio::time::timeout(Duration::from_secs(20), watch.message()).await;
    let next = next.expect("the change within 20 s").expect("the stream is still open").expect("an event");
    assert_ne!(next.registry_revision, first.registry_revision);
}

/// The review's traversal table and the other spellings of it, against a server that resolves
/// paths as careless servers do (`tests/servers/path_resolving_server.py`: percent-decoded,
/// backslashes as separators, `..` and `//` resolved by the file system): through every door that
/// names a resource (`/mcp` reads, subscriptions and completions, chat attachments, gRPC reads)
/// each is `unsafe_uri` and never reaches the server, which opens nothing outside the allowed
/// directory or inside the denied one; plain reads still work, and a server's own listing of
/// such a URI (or template) is left out of the lists.
#[tokio::test]
async fn resource_uris_spelled_to_leave_the_patterns_never_reach_the_server() {
    use serde_json::{Value, json};
    use spear::agent::grpc::pb::mcp_sessions_client::McpSessionsClient;

    let scratch = tempfile::tempdir().expect("tempdir");
    let d = scratch.path().canonicalize().expect("the scratch dir's real path");
    let docs = d.join("srv/docs");
    std::fs::create_dir_all(docs.join("private")).expect("mkdir");
    std::fs::write(d.join("secret.txt"), "TOP-SECRET-OUTSIDE-DOCS").expect("write");
    std::fs::write(docs.join("a.md"), "DOCS-A").expect("write");
    std::fs::write(docs.join("private/key.txt"), "PRIVATE-INSIDE-DENIED").expect("write");
    let log = d.join("server.log");
    let root = format!("file://{}", d.display());
    let hostile: Vec<String> = [
        "/srv/docs/../../secret.txt",
        "/srv/docs/%2e%2e/%2e%2e/secret.txt",
        "/srv/docs/%2E%2e/%2e%2E/secret.txt",
        "/srv/docs//private/key.txt",
        "/srv/docs/./private/key.txt",
        "/srv/docs/%70rivate/key.txt",
        "/srv/docs/..%2F..%2Fsecret.txt",
        "/srv/docs/private%2Fkey.txt",
        "/srv/docs/..%5C..%5Csecret.txt",
        "/srv/docs/..\\..\\secret.txt",
        "/srv/docs/private\\key.txt",
        "/srv/docs/%252e%252e/%252e%252e/secret.txt",
        "/srv/docs/%c0%ae%c0%ae/%c0%ae%c0%ae/secret.txt",
        "/srv/docs/a.md?x=../../secret.txt",
        "/srv/docs/a.md#../../secret.txt",
    ]
    .iter()
    .map(|path| format!("{root}{path}"))
    .collect();
    let spelled_file_forms = [
        format!("file://localhost{}/srv/docs/private/key.txt", d.display()),
        format!("FILE://{}/srv/docs/private/key.txt", d.display()),
    ];
    let hostile: Vec<String> = hostile.into_iter().chain(spelled_file_forms).collect();

    let registry = tempfile::tempdir().expect("tempdir");
    let python = spear::testing::mcp_servers::python();
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/path_resolving_server.py");
    let args = [
        script.to_string_lossy().to_string(),
        log.to_string_lossy().to_string(),
        "--list".into(),
        format!("{root}/srv/docs/a.md"),
        "--list".into(),
        format!("{root}/srv/docs/../../secret.txt"),
        "--template".into(),
        format!("{root}/srv/docs/{{name}}"),
        "--template".into(),
        format!("{root}/srv/docs/../{{name}}"),
    ];
    let args: Vec<String> = args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        registry.path().join("files.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: files\nspec:\n  transport: stdio\n  \
             stdio:\n    command: {:?}\n    args: [{}]\n  allowedTools: [\"*\"]\n  allowedResources: [{:?}]\n  \
             deniedResources: [{:?}]\n",
            python.to_string_lossy(),
            args.join(", "),
            format!("{root}/srv/docs/*"),
            format!("{root}/srv/docs/private/*"),
        ),
    )
    .expect("write files.yaml");
    std::fs::write(
        registry.path().join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [files]\n",
    )
    .expect("write profile.yaml");
    let served = crate::serve::serve(registry, &["--audit-log", "off", "--upstream-url", "http://127.0.0.1:9/v1"]);

    spear::install_crypto_provider();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().expect("client");
    let session = crate::serve::open_session(&http, served.http, "traversal").await;
    let mut next_id = 10;
    let mut ask = async |method: &str, params: Value| -> Value {
        next_id += 1;
        let body = json!({"jsonrpc": "2.0", "id": next_id, "method": method, "params": params});
        let (status, content_type, _, text) =
            crate::serve::mcp_post(&http, served.http, Some(&session), None, body).await;
        assert_eq!(status, 200, "{method}: {text}");
        crate::serve::jsonrpc_message(&content_type, &text)
    };
    let id = |uri: &str| format!("spear://files/{uri}");
    let refusal = |reply: &Value| -> String {
        assert_eq!(reply["error"]["data"]["error"]["code"], "mcp_policy_denied", "{reply}");
        reply["error"]["message"].as_str().unwrap_or_default().to_string()
    };

    // The plain spellings: allowed, outside, denied.
    let read = ask("resources/read", json!({"uri": id(&format!("{root}/srv/docs/a.md"))})).await;
    assert_eq!(read["result"]["contents"][0]["text"], "DOCS-A", "{read}");
    let outside = ask("resources/read", json!({"uri": id(&format!("{root}/secret.txt"))})).await;
    assert!(refusal(&outside).contains("not_allowed_by:server"), "{outside}");
    let denied = ask("resources/read", json!({"uri": id(&format!("{root}/srv/docs/private/key.txt"))})).await;
    assert!(refusal(&denied).contains("denied_by:server"), "{denied}");

    // Every hostile spelling, through every /mcp method that names a resource.
    for uri in &hostile {
        for (method, params) in [
            ("resources/read", json!({"uri": id(uri)})),
            ("resources/subscribe", json!({"uri": id(uri)})),
            ("resources/unsubscribe", json!({"uri": id(uri)})),
            (
                "completion/complete",
                json!({"ref": {"type": "ref/resource", "uri": id(uri)}, "argument": {"name": "name", "value": ""}}),
            ),
        ] {
            let reply = ask(method, params).await;
            let message = refusal(&reply);
            assert!(message.contains("unsafe_uri") && message.contains("resources/list"), "{method} {uri}: {reply}");
        }
    }
    // A completion on the plain template reaches the server (so the log below is live).
    let template = id(&format!("{root}/srv/docs/{{name}}"));
    let completed = ask(
        "completion/complete",
        json!({"ref": {"type": "ref/resource", "uri": template}, "argument": {"name": "name", "value": ""}}),
    )
    .await;
    assert!(completed["result"]["completion"].is_object(), "{completed}");

    // The server's own listing of a hostile URI or template is left out.
    let listed = ask("resources/list", json!({})).await;
    let uris: Vec<&str> =
        listed["result"]["resources"].as_array().expect("resources").iter().filter_map(|r| r["uri"].as_str()).collect();
    assert_eq!(uris, [id(&format!("{root}/srv/docs/a.md"))], "{listed}");
    let templates = ask("resources/templates/list", json!({})).await;
    let listed_templates: Vec<&str> = templates["result"]["resourceTemplates"]
        .as_array()
        .expect("templates")
        .iter()
        .filter_map(|t| t["uriTemplate"].as_str())
        .collect();
    assert_eq!(listed_templates, [template.as_str()], "{templates}");

    // Chat attachments: refused before the model is asked (the upstream is a closed port).
    for uri in &hostile {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "summarize"}],
            "mcp": {"resources": [id(uri)]}});
        let response = http
            .post(format!("http://127.0.0.1:{}/v1/chat/completions", served.http))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .await
            .expect("a chat reply");
        assert_eq!(response.status().as_u16(), 403, "{uri}");
        let error: Value = response.json().await.expect("JSON error");
        assert_eq!(error["error"]["code"], "mcp_policy_denied", "{uri}: {error}");
        assert!(error["error"]["message"].as_str().is_some_and(|m| m.contains("unsafe_uri")), "{uri}: {error}");
    }

    // gRPC reads, by the server's URI and by the agent's.
    let mut grpc = McpSessionsClient::connect(format!("http://127.0.0.1:{}", served.grpc)).await.expect("gRPC");
    let opened = grpc
        .open(pb::OpenRequest { server_id: "files".into(), ..Default::default() })
        .await
        .expect("open a session")
        .into_inner();
    for uri in hostile.iter().flat_map(|u| [u.clone(), id(u)]) {
        let reply = grpc
            .read_resource(pb::ReadResourceRequest { session_id: opened.session_id.clone(), uri: uri.clone() })
            .await
            .expect("a read reply")
            .into_inner();
        assert_eq!(reply.status, "mcp_policy_denied", "{uri}: {reply:?}");
        assert!(format!("{:?}", reply.error).contains("unsafe_uri"), "{uri}: {reply:?}");
    }

    // What the server saw: the plain read and the plain completion, nothing hostile, and no
    // file opened outside the allowed directory or inside the denied one.
    let seen = std::fs::read_to_string(&log).expect("the server's log");
    let entries: Vec<Value> = seen.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
    assert!(entries.iter().any(|e| e["method"] == "resources/read"), "the plain read reached the server: {seen}");
    assert!(entries.iter().any(|e| e["method"] == "completion/complete"), "{seen}");
    for entry in &entries {
        let uri = entry["uri"].as_str().unwrap_or_default();
        assert!(!hostile.iter().any(|h| h == uri), "a hostile URI reached the server: {entry}");
        if let Some(opened) = entry["opened"].as_str() {
            let opened = std::path::Path::new(opened);
            assert!(opened.starts_with(&docs) && !opened.starts_with(docs.join("private")), "opened {opened:?}");
        }
    }
    drop(served);
}

/// DNS rebinding against the admin port: a page that rebinds its own name to the agent makes
/// same-origin GETs (no `Origin`) with its name as Host. They read `/debug/effective` (the whole
/// tool set) and `/metrics` before; now every admin path refuses a DNS name that is not in
/// `--allowed-host`, while the Hosts probes and scrapers send (the pod's IP, any IP literal,
/// `localhost`) are answered.
#[test]
fn the_admin_port_refuses_a_rebound_host_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = crate::serve::serve_ready(dir, &["--audit-log", "off"]);
    let port = served.admin;
    for path in ["/debug/effective", "/metrics", "/healthz", "/readyz"] {
        for host in [format!("rebind.evil.example:{port}"), "rebind.evil.example".to_string()] {
            assert_eq!(request_with_host(port, "GET", path, &host), Some(403), "{path} with Host {host}");
        }
    }
    for path in ["/debug/effective", "/metrics", "/healthz"] {
        for host in [format!("127.0.0.1:{port}"), format!("10.244.1.17:{port}"), format!("[::1]:{port}")] {
            assert_eq!(request_with_host(port, "GET", path, &host), Some(200), "{path} with Host {host}");
        }
        assert_eq!(request_with_host(port, "GET", path, &format!("localhost:{port}")), Some(200), "{path}");
    }
    // A name of its own is answered once listed (it is then also accepted on port 4040).
    drop(served);
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = crate::serve::serve_ready(dir, &["--audit-log", "off", "--allowed-host", "agent.example,localhost"]);
    let port = served.admin;
    assert_eq!(request_with_host(port, "GET", "/metrics", &format!("agent.example:{port}")), Some(200));
    assert_eq!(request_with_host(port, "GET", "/metrics", &format!("rebind.evil.example:{port}")), Some(403));
}

/// A stand-in chat upstream (the hosted model API cannot run here) on a loopback port: answers
/// every request with one final completion and records each request's head.
fn recording_upstream() -> (String, std::sync::Arc<parking_lot::Mutex<Vec<String>>>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind the stand-in upstream");
    let url = format!("http://{}/v1", listener.local_addr().expect("addr"));
    let heads = std::sync::Arc::new(parking_lot::Mutex::new(Vec::new()));
    let recorded = heads.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut reader = std::io::BufReader::new(stream.try_clone().expect("clone"));
            let (mut head, mut length) = (String::new(), 0usize);
            loop {
                let mut line = String::new();
                if std::io::BufRead::read_line(&mut reader, &mut line).unwrap_or(0) == 0 || line == "\r\n" {
                    break;
                }
                if let Some(n) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = n.trim().parse().unwrap_or(0);
                }
                head.push_str(&line);
            }
            let mut body = vec![0; length];
            let _ = reader.read_exact(&mut body);
            recorded.lock().push(head);
            let answer = r#"{"id":"c","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"done"},"finish_reason":"stop"}]}"#;
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{answer}",
                answer.len()
            );
        }
    });
    (url, heads)
}

/// The pod's MCP server sidecars share its loopback: with the pod's key set, none of the doors
/// (`/mcp`, chat completions, gRPC) answers a caller without it, whatever it sends instead; the
/// app's own clients (PyPI `openai`, rmcp, `spearlet tools`) get through with it, and the key
/// goes no further than the agent (the chat upstream never sees it).
#[tokio::test]
async fn a_caller_without_the_pods_key_reaches_no_door_and_the_key_goes_no_further() {
    use rmcp::ServiceExt as _;
    use rmcp::transport::StreamableHttpClientTransport;
    use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;

    const KEY: &str = "pods-key_0123456789-abcdefghij";
    spear::install_crypto_provider();
    let (upstream_url, upstream_heads) = recording_upstream();
    let dir = tempfile::tempdir().expect("tempdir");
    fixture_registry(dir.path());
    let served = crate::serve::serve(dir, &["--audit-log", "off", "--upstream-url", &upstream_url, "--api-key", KEY]);
    let mcp = format!("http://127.0.0.1:{}/mcp", served.http);
    let chat = format!("http://127.0.0.1:{}/v1/chat/completions", served.http);

    let http = reqwest::Client::new();
    let initialize = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"sidecar","version":"1"}}}"#;
    let completion = r#"{"model":"m","messages":[{"role":"user","content":"call every tool"}]}"#;
    let wrong = [
        None,
        Some(KEY.to_string()),
        Some(format!("Basic {KEY}")),
        Some(format!("Bearer {KEY}x")),
        Some(format!("Bearer {}", &KEY[..KEY.len() - 1])),
        Some(format!("Bearer {}", KEY.to_ascii_uppercase())),
        Some("Bearer ".to_string()),
    ];
    for (door, body) in [(&mcp, initialize), (&chat, completion)] {
        for authorization in &wrong {
            let mut request = http
                .post(door)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(body);
            if let Some(value) = authorization {
                request = request.header("authorization", value);
            }
            let response = request.send().await.expect("the door answers");
            assert_eq!(response.status().as_u16(), 401, "{door} with {authorization:?}");
            assert!(response.headers().get("www-authenticate").is_some(), "{door}: a challenge");
            let text = response.text().await.expect("a body");
            assert!(text.contains("invalid_api_key") && !text.contains(KEY), "{door}: {text}");
        }
    }
    let transport = StreamableHttpClientTransport::from_uri(mcp.clone());
    assert!(().serve(transport).await.is_err(), "an rmcp client without the key gets no session");

    let mut registry = McpRegistryClient::connect(format!("http://127.0.0.1:{}", served.grpc)).await.expect("gRPC");
    let refused = registry.list(pb::ListRequest::default()).await.expect_err("gRPC without the key");
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let mut request = tonic::Request::new(pb::ListRequest::default());
    request.metadata_mut().insert("authorization", "Bearer not-the-pods-key-0123456789".parse().expect("ascii"));
    assert_eq!(registry.list(request).await.expect_err("a wrong key").code(), tonic::Code::Unauthenticated);
    assert!(upstream_heads.lock().is_empty(), "no refused request reached the upstream");

    // The app's clients, with the key.
    let config = StreamableHttpClientTransportConfig::with_uri(mcp.clone()).auth_header(KEY);
    let client = ().serve(StreamableHttpClientTransport::from_config(config)).await.expect("a session with the key");
    let tools = client.list_all_tools().await.expect("tools");
    assert!(tools.iter().any(|t| t.name == "mcp__fx__echo"), "{tools:?}");
    let _ = client.cancel().await;
    let tools_cli = |key: Option<&str>| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_spearlet"));
        command
            .args(["tools", "list", "--grpc-addr", &format!("127.0.0.1:{}", served.grpc)])
            .env_remove("SPEAR_API_KEY");
        if let Some(key) = key {
            command.env("SPEAR_API_KEY", key);
        }
        command.output().expect("spearlet tools runs")
    };
    let without = tools_cli(None);
    let stderr = String::from_utf8_lossy(&without.stderr);
    assert_eq!(without.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("SPEAR_API_KEY"), "the refusal says what to send: {stderr}");
    let with = tools_cli(Some(KEY));
    assert!(with.status.success(), "{}", String::from_utf8_lossy(&with.stderr));
    assert!(String::from_utf8_lossy(&with.stdout).contains("mcp__fx__echo"));

    let sdk = "import openai, sys\nclient = openai.OpenAI(base_url=sys.argv[1], api_key=sys.argv[2], max_retries=0)\n\
               print(client.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}]).choices[0].message.content)";
    let base = format!("http://127.0.0.1:{}/v1", served.http);
    let run_sdk = |key: &str| {
        Command::new(spear::testing::mcp_servers::python()).args(["-c", sdk, &base, key]).output().expect("python runs")
    };
    let refused = run_sdk("sk-the-callers-own-key-0123");
    assert!(!refused.status.success(), "the OpenAI SDK with another key is refused");
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("AuthenticationError"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let answered = run_sdk(KEY);
    assert!(answered.status.success(), "{}", String::from_utf8_lossy(&answered.stderr));
    assert_eq!(String::from_utf8_lossy(&answered.stdout).trim(), "done");
    let heads = upstream_heads.lock().clone();
    assert_eq!(heads.len(), 1, "{heads:?}");
    assert!(!heads[0].contains(KEY), "the pod's key reached the upstream: {}", heads[0]);
    assert!(!heads[0].to_ascii_lowercase().contains("authorization"), "no key configured: none sent: {}", heads[0]);
}
