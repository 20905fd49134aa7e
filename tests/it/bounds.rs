//! Calls within bounds, with the real binaries: `spearlet serve` over the real stdio fixture
//! server, the PyPI `mcp` client on `/mcp` (both revisions), `spearlet tools call` on gRPC, and
//! what the running agent reports in its audit file and on `/metrics`: rate limits, denial
//! reasons, the `effective_set` lines, and egress (a denied address is never dialled).

use std::io::Read as _;
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::serve::{
    LEGACY, STATELESS, admin_metric, audit_lines, call_error, fixture_registry, http_get, next_event, serve,
    start_client,
};

/// The fixture registry with every tool of `fx` limited to 2 calls at once and one a minute, and
/// the profile narrowing `lists` to one call.
fn bounded_registry(dir: &std::path::Path) {
    fixture_registry(dir);
    let fx = std::fs::read_to_string(dir.join("fx.yaml")).expect("fx.yaml");
    let limits = "  budgets:\n    toolRateLimits:\n      \"*\": {perMinute: 1, burst: 2}\n";
    std::fs::write(dir.join("fx.yaml"), format!("{fx}{limits}")).expect("write fx.yaml");
    std::fs::write(
        dir.join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx]\n  \
         toolDenylist: [pid]\n  rateLimits:\n    \"mcp__fx__lists\": {perMinute: 1, burst: 1}\n",
    )
    .expect("write profile.yaml");
}

/// The call events of one `/mcp` client session making `calls`.
fn mcp_calls(served: &crate::serve::Served, calls: &[&str], mode: &str) -> Vec<Value> {
    let (mut client, mut lines) = start_client(served, calls, false, &["--mode", mode]);
    assert_eq!(next_event(&mut lines)["event"], "initialized");
    assert_eq!(next_event(&mut lines)["event"], "tools");
    let events = calls.iter().map(|_| next_event(&mut lines)).collect();
    assert!(client.wait().expect("client exit").success());
    events
}

/// The error object of a failed call event.
fn error_of(call: &Value) -> Value {
    call_error(call)["error"].clone()
}

#[test]
fn a_rate_limited_tool_is_refused_with_its_wait_on_mcp_and_grpc_counted_and_audited() {
    let dir = tempfile::tempdir().expect("tempdir");
    bounded_registry(dir.path());
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_string_lossy().into_owned();
    let served = serve(dir, &["--audit-log", &audit_path]);
    let echo = r#"mcp__fx__echo={"text": "bounded"}"#;

    // A 2025-11-25 session: the burst of two, then the wait.
    let calls = mcp_calls(&served, &[echo, echo, echo], LEGACY);
    assert!(calls[..2].iter().all(|c| c["is_error"] == false && c["text"] == "bounded"), "{calls:?}");
    let limited = error_of(&calls[2]);
    assert_eq!(limited["code"], "mcp_rate_limited", "{limited}");
    assert_eq!(limited["retryable"], true);
    assert_eq!(limited["reason"], "rate_limited");
    let wait = limited["retry_after_ms"].as_u64().expect("retry_after_ms");
    assert!((1..=60_000).contains(&wait), "{limited}");
    let message = limited["message"].as_str().unwrap_or_default();
    assert!(message.contains("McpServer 'fx' budgets.toolRateLimits['*'] (1/min, burst 2)"), "{message}");

    // The bucket is the pod's: another client, on the other revision, finds it empty too.
    let calls = mcp_calls(&served, &[echo], STATELESS);
    assert_eq!(error_of(&calls[0])["code"], "mcp_rate_limited", "{calls:?}");

    // The profile narrows `lists` to one call; the server's own limit would allow two.
    let lists = "mcp__fx__lists={}";
    let calls = mcp_calls(&served, &[lists, lists], LEGACY);
    assert_eq!(calls[0]["is_error"], false, "{calls:?}");
    let narrowed = error_of(&calls[1]);
    assert!(narrowed["message"].as_str().unwrap_or_default().contains("McpProfile 'p' rateLimits['mcp__fx__lists']"));

    // gRPC: `spearlet tools call` gets the same refusal for `sleep`, after its own burst.
    let addr = format!("127.0.0.1:{}", served.grpc);
    let grpc_call = || {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "call", "fx/sleep", "--args", r#"{"ms": 1}"#, "--grpc-addr", &addr])
            .output()
            .expect("spearlet tools call");
        (out.status.code(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
    };
    assert_eq!(grpc_call().0, Some(0));
    assert_eq!(grpc_call().0, Some(0));
    let (code, said) = grpc_call();
    assert_eq!(code, Some(1), "{said}");
    assert!(said.contains("mcp_rate_limited") && said.contains("retry in"), "{said}");

    // A call the profile denies, for its reason.
    let calls = mcp_calls(&served, &["mcp__fx__pid={}"], LEGACY);
    assert_eq!(error_of(&calls[0])["reason"], "denied_by:profile", "{calls:?}");

    let denied =
        |reason: &str| admin_metric(served.admin, &format!("mcp_denied_total{{server_id=\"fx\",reason=\"{reason}\"}}"));
    assert_eq!(denied("rate_limited"), 4.0);
    assert_eq!(denied("denied_by:profile"), 1.0);
    let errors = admin_metric(
        served.admin,
        "mcp_tool_call_error_total{server_id=\"fx\",tool=\"echo\",code=\"mcp_rate_limited\"}",
    );
    assert_eq!(errors, 2.0);
    assert!(admin_metric(served.admin, "mcp_injection_total{server_id=\"fx\",status=\"offered\"}") >= 4.0);
    assert!(admin_metric(served.admin, "mcp_list_tools_duration_seconds_count{server_id=\"fx\"}") >= 1.0);

    let _ = http_get(served.admin, "/healthz");
    drop(served);
    let lines = audit_lines(audit.path());
    let limited: Vec<&Value> = lines.iter().filter(|l| l["status"] == "mcp_rate_limited").collect();
    assert_eq!(limited.len(), 4, "{lines:?}");
    assert!(limited.iter().all(|l| l["reason"] == "rate_limited"), "{limited:?}");
    let refused = lines.iter().find(|l| l["called_as"] == "mcp__fx__pid").expect("the refused call's line");
    assert_eq!(refused["reason"], "denied_by:profile", "{refused}");
    assert!(
        lines.iter().filter(|l| l["status"] == "ok").all(|l| l.get("reason").is_none()),
        "no reason on a call that ran"
    );

    // The set each session was served: once per session (and per door), with its tools.
    let sets: Vec<&Value> = lines.iter().filter(|l| l["kind"] == "effective_set").collect();
    assert!(sets.len() >= 4, "one per /mcp session and one for the gRPC session: {sets:?}");
    for set in &sets {
        assert_eq!(set["profile"], "p");
        let tools = set["servers"][0]["tools"].as_array().cloned().unwrap_or_default();
        assert!(
            tools.contains(&Value::from("mcp__fx__echo")) && !tools.contains(&Value::from("mcp__fx__pid")),
            "{set}"
        );
        assert_eq!(set["tool_count"].as_u64(), Some(tools.len() as u64));
        assert!(set["digest"].as_str().is_some_and(|d| d.len() == 16), "{set}");
    }
    let digests: std::collections::BTreeSet<&str> = sets.iter().filter_map(|s| s["digest"].as_str()).collect();
    assert_eq!(digests.len(), 1, "the same set everywhere: {sets:?}");
    let sessions = sets.iter().filter(|s| s["door"] == "mcp").filter_map(|s| s["session_id"].as_str());
    let sessions: Vec<&str> = sessions.collect();
    let unique: std::collections::BTreeSet<&&str> = sessions.iter().collect();
    assert_eq!(sessions.len(), unique.len(), "a session's set is logged once: {sets:?}");
}

/// A listener that counts the connections it accepts (and answers none).
fn counting_listener() -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            seen.fetch_add(1, Ordering::SeqCst);
            if let Ok(mut stream) = stream {
                let mut buf = [0u8; 1024];
                let _ = stream.set_read_timeout(Some(Duration::from_millis(200)));
                let _ = stream.read(&mut buf);
            }
        }
    });
    (port, count)
}

/// Remote servers whose URLs reach a denied range, by a name and by literal spellings: none is
/// dialled, and each reports why. The same URLs reach the listener with the list emptied, so
/// the test would see a connection if one were made.
#[test]
fn a_server_url_in_a_denied_range_is_never_dialled_by_name_or_literal() {
    let (port, connections) = counting_listener();
    let urls = [
        ("by-name", format!("http://localhost:{port}/mcp")),
        ("literal", format!("http://127.0.0.1:{port}/mcp")),
        ("decimal", format!("http://2130706433:{port}/mcp")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}/mcp")),
    ];
    let registry = |dir: &std::path::Path| {
        let names: Vec<&str> = urls.iter().map(|(name, _)| *name).collect();
        for (name, url) in &urls {
            let yaml = format!(
                "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  \
                 transport: streamableHttp\n  http:\n    url: {url:?}\n  allowedTools: [\"*\"]\n"
            );
            std::fs::write(dir.join(format!("{name}.yaml")), yaml).expect("write server");
        }
        let profile = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [{}]\n",
            names.join(", ")
        );
        std::fs::write(dir.join("profile.yaml"), profile).expect("write profile");
    };

    let dir = tempfile::tempdir().expect("tempdir");
    registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--egress-deny-cidrs", "127.0.0.0/8,::1/128"]);
    let deadline = Instant::now() + Duration::from_secs(30);
    let explained = loop {
        let (_, body) = http_get(served.admin, "/readyz").expect("/readyz");
        let refused = |name: &str| {
            body.lines().any(|l| l.starts_with(&format!("{name}: ")) && l.contains("the agent does not connect to"))
        };
        if urls.iter().all(|(name, _)| refused(name)) {
            break body;
        }
        assert!(Instant::now() < deadline, "no refusal reported: {body}");
        std::thread::sleep(Duration::from_millis(100));
    };
    // A call is refused at once (only a configuration change ends a denial), and dials nothing.
    let asked = Instant::now();
    let calls = mcp_calls(&served, &["mcp__by-name__anything={}", "mcp__literal__anything={}"], LEGACY);
    for call in &calls {
        let error = error_of(call);
        assert_eq!((&error["code"], &error["retryable"]), (&Value::from("mcp_unavailable"), &Value::Bool(false)));
        assert!(error["message"].as_str().unwrap_or_default().contains("does not connect to"), "{error}");
    }
    assert!(asked.elapsed() < Duration::from_secs(20), "refused without waiting for the tool timeout");
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(connections.load(Ordering::SeqCst), 0, "a denied address was dialled: {explained}");
    drop(served);

    // The control: the same URLs without the list are dialled.
    let dir = tempfile::tempdir().expect("tempdir");
    registry(dir.path());
    let served = serve(dir, &["--audit-log", "off", "--egress-deny-cidrs", ""]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while connections.load(Ordering::SeqCst) < urls.len() {
        assert!(Instant::now() < deadline, "the control never connected");
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(served);
}

/// What a real stdio server is given and echoes: `fx` gets a token from a Secret (`valueFrom`,
/// which local mode reads from `SPEAR_SECRET_FX_FX_TOKEN`), returns it from its `env` tool and
/// prints each call's arguments on its stderr; `fx2` was given nothing. The caller sees the
/// token redacted; a call that pastes it (verbatim, base64, hex) into `fx2`'s arguments is
/// refused before it is sent, on `/mcp` (both revisions) and gRPC; the audit file (arguments
/// included) and the agent's log hold no spelling of it, nor its first bytes.
#[test]
fn a_secret_a_server_echoes_is_redacted_and_pasted_into_another_servers_call_is_refused() {
    const TOKEN: &str = "ghp_K7v2LxQ9mZ4tR8wY1nB6cD3fH5jS0aP";
    let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, TOKEN);
    let hex: String = TOKEN.bytes().map(|b| format!("{b:02x}")).collect();
    let fixture = spear::testing::mcp_servers::fixture_stdio(&["--stderr-chatter"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let args: Vec<String> = fixture.args.iter().map(|a| format!("{a:?}")).collect();
    for (name, env) in [("fx", "[{name: FX_TOKEN, valueFrom: {secretKeyRef: {name: gh, key: token}}}]"), ("fx2", "[]")]
    {
        let yaml = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: stdio\n  \
             stdio:\n    command: {:?}\n    args: [{}]\n    env: {env}\n  allowedTools: [\"*\"]\n",
            fixture.program.to_string_lossy(),
            args.join(", "),
        );
        std::fs::write(dir.path().join(format!("{name}.yaml")), yaml).expect("write server");
    }
    std::fs::write(
        dir.path().join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx, fx2]\n",
    )
    .expect("write profile");
    let audit = tempfile::NamedTempFile::new().expect("audit file");
    let audit_path = audit.path().to_string_lossy().into_owned();
    let log = tempfile::NamedTempFile::new().expect("log file");
    let stderr = std::process::Stdio::from(log.reopen().expect("log file"));
    let extra = ["--audit-log", &audit_path, "--audit-arguments", "--log-level", "spear=debug,warn"];
    let served = crate::serve::spawn_serve_with_env(dir, &extra, stderr, &[("SPEAR_SECRET_FX_FX_TOKEN", TOKEN)]);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !http_get(served.admin, "/readyz").is_some_and(|(s, b)| s == 200 && !b.contains(": starting (")) {
        assert!(Instant::now() < deadline, "not ready");
        std::thread::sleep(Duration::from_millis(50));
    }

    let echo_fx2 = |text: &str| format!(r#"mcp__fx2__echo={{"text": "{text}"}}"#);
    let calls = [
        r#"mcp__fx__env={"name": "FX_TOKEN"}"#.to_string(),
        format!(r#"mcp__fx__echo={{"text": "mine: {TOKEN}"}}"#),
        echo_fx2(TOKEN),
        echo_fx2(&b64),
        echo_fx2(&hex),
        echo_fx2(&format!("see {}", &TOKEN[..10])),
    ];
    let calls: Vec<&str> = calls.iter().map(String::as_str).collect();
    for mode in [LEGACY, STATELESS] {
        let events = mcp_calls(&served, &calls, mode);
        let texts: Vec<String> = events.iter().map(|e| e["text"].as_str().unwrap_or_default().to_string()).collect();
        // The server's own secret, from its own tool: redacted for the caller.
        assert_eq!(texts[0], "[redacted: env FX_TOKEN of fx]", "{mode}");
        // Sent to the server it belongs to (allowed), and redacted on the way back.
        assert_eq!(texts[1], "mine: [redacted: env FX_TOKEN of fx]", "{mode}");
        for (i, spelling) in ["verbatim", "base64", "hex"].iter().enumerate() {
            let error = error_of(&events[2 + i]);
            assert_eq!(error["reason"], "secret_in_arguments", "{mode} {spelling}: {error}");
            assert_eq!(error["code"], "mcp_policy_denied");
            let message = error["message"].as_str().unwrap_or_default();
            assert!(message.contains("[redacted: env FX_TOKEN of fx]") && message.contains("'fx2'"), "{message}");
        }
        // A prefix is not the value: short of MIN_SECRET_BYTES of it, nothing is held.
        assert_eq!(events[5]["is_error"], false, "{mode}: {:?}", events[5]);
        for text in &texts {
            assert!(!text.contains(TOKEN) && !text.contains(&b64) && !text.contains(&hex), "{mode}: {text}");
        }
    }
    // The gRPC door: the same redaction and the same refusal.
    let grpc = |tool: &str, text: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "call", tool, "--args", &format!(r#"{{"text": "{text}"}}"#)])
            .args(["--grpc-addr", &format!("127.0.0.1:{}", served.grpc)])
            .output()
            .expect("spawn spearlet tools call");
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };
    let mine = grpc("fx/echo", &format!("mine: {TOKEN}"));
    assert!(mine.contains("mine: [redacted: env FX_TOKEN of fx]") && !mine.contains(TOKEN), "{mine}");
    let pasted = grpc("fx2/echo", &b64);
    assert!(pasted.contains("secret_in_arguments") && !pasted.contains(&b64), "{pasted}");
    let denied = admin_metric(served.admin, "mcp_denied_total{server_id=\"fx2\",reason=\"secret_in_arguments\"}");
    assert_eq!(denied, 7.0);
    drop(served);

    let audit_text = std::fs::read_to_string(audit.path()).expect("audit");
    let log_text = std::fs::read_to_string(log.path()).expect("log");
    assert!(log_text.contains("fixture: call echo"), "the server's stderr is logged: {log_text}");
    for (what, text) in [("audit", &audit_text), ("log", &log_text)] {
        for spelling in [TOKEN, &b64, &hex, &TOKEN[..12]] {
            assert!(!text.contains(spelling), "{what} holds {spelling}:\n{text}");
        }
    }
    let refused = audit_lines(audit.path()).into_iter().filter(|l| l["reason"] == "secret_in_arguments").count();
    assert_eq!(refused, 7);
}
