//! Attacks from the security review, run against the real agent: each test is named for what it
//! stops, and failed before the fix it guards.

use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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
/// of the agent: each is closed after the idle timeout (they were held forever, and 20 of them
/// kept `/healthz` from answering), and the ports serve again.
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
    for port in [served.http, served.admin] {
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
    let (answered, _served) = healthz.await.expect("join");
    assert_eq!(answered, Some(200), "healthz answers once the idle peers are gone");
}
