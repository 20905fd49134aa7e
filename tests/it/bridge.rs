//! `spearlet bridge` as a pod runs it: the real binary, a real child (`cat`, or a small Python
//! line echo that prints its pid), clients on the real Unix socket. Every wait is bounded, so a
//! bug fails the test instead of hanging it.

use std::io::{BufRead, BufReader, ErrorKind, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::Arc;

use parking_lot::Mutex;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Upper bound for anything that should happen "soon" (a reply, a restart, an exit).
const SOON: Duration = Duration::from_secs(15);

/// A line-echo MCP stand-in: prints `pid N` first, logs to stderr, echoes lines as `echo <line>`,
/// exits 3 on `crash`, and says on stderr when SIGTERM reaches it.
const ECHO_PY: &str = r#"
import os, signal, sys
def term(signum, frame):
    sys.stderr.write("child %d got SIGTERM\n" % os.getpid()); sys.stderr.flush(); os._exit(0)
signal.signal(signal.SIGTERM, term)
sys.stderr.write("stderr-noise from %d\n" % os.getpid()); sys.stderr.flush()
sys.stdout.write("pid %d\n" % os.getpid()); sys.stdout.flush()
for line in sys.stdin:
    if line.strip() == "crash":
        sys.stderr.write("crashing on purpose\n"); sys.stderr.flush(); sys.exit(3)
    sys.stderr.write("stderr-noise: got a line\n"); sys.stderr.flush()
    sys.stdout.write("echo " + line); sys.stdout.flush()
"#;

fn echo_child() -> Vec<String> {
    vec!["python3".into(), "-c".into(), ECHO_PY.into()]
}

// === harness ===

/// A running `spearlet bridge`; killed on drop if still running.
pub(crate) struct Bridge {
    process: Child,
    /// The socket path the bridge listens on.
    pub(crate) socket: PathBuf,
    _dir: tempfile::TempDir,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    stdout: Arc<Mutex<Vec<u8>>>,
}

impl Bridge {
    /// Starts the test build of `spearlet bridge` with `child` as the MCP server.
    pub(crate) fn start(child: &[String]) -> Self {
        Self::start_with(Path::new(env!("CARGO_BIN_EXE_spearlet")), &[], child)
    }

    /// Starts `bin bridge --socket <tmp>/s.sock <extra> -- <child>` and waits until it listens.
    pub(crate) fn start_with(bin: &Path, extra: &[&str], child: &[String]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let socket = dir.path().join("s.sock");
        let bridge = Self::spawn(bin, &socket, extra, child, dir);
        // The socket file appears only once it listens (it is renamed into place).
        wait_until("the socket file to appear", || bridge.socket.exists());
        bridge
    }

    fn spawn(bin: &Path, socket: &Path, extra: &[&str], child: &[String], dir: tempfile::TempDir) -> Self {
        let mut process = Command::new(bin)
            .arg("bridge")
            .arg("--socket")
            .arg(socket)
            .args(extra)
            .arg("--")
            .args(child)
            .env("SPEAR_LOG", "spear=debug,warn")
            .env_remove("SPEAR_SERVER_ID")
            .env_remove("SPEAR_BRIDGE_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spearlet must start");
        let stderr = Arc::new(Mutex::new(String::new()));
        let stdout = Arc::new(Mutex::new(Vec::new()));
        let mut err_pipe = BufReader::new(process.stderr.take().expect("piped"));
        let mut out_pipe = process.stdout.take().expect("piped");
        let err_sink = Arc::clone(&stderr);
        let out_sink = Arc::clone(&stdout);
        let readers = vec![
            std::thread::spawn(move || {
                let mut line = String::new();
                while err_pipe.read_line(&mut line).is_ok_and(|n| n > 0) {
                    err_sink.lock().push_str(&line);
                    line.clear();
                }
            }),
            std::thread::spawn(move || {
                let mut buf = Vec::new();
                let _ = out_pipe.read_to_end(&mut buf);
                out_sink.lock().extend(buf);
            }),
        ];
        Self { process, socket: socket.to_path_buf(), _dir: dir, stderr, readers, stdout }
    }

    fn pid(&self) -> u32 {
        self.process.id()
    }

    /// Everything the bridge logged so far.
    pub(crate) fn stderr(&self) -> String {
        self.stderr.lock().clone()
    }

    /// Waits until the log contains `needle`.
    pub(crate) fn wait_for_log(&self, needle: &str) {
        let deadline = Instant::now() + SOON;
        while !self.stderr().contains(needle) {
            assert!(Instant::now() < deadline, "no log line with {needle:?}; log:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Connects a client.
    pub(crate) fn connect(&self) -> Client {
        Client::connect(&self.socket)
    }

    /// Waits for the bridge to exit by itself; returns its status, stdout and stderr.
    pub(crate) fn wait(mut self) -> (ExitStatus, Vec<u8>, String) {
        let deadline = Instant::now() + SOON;
        let status = loop {
            if let Some(status) = self.process.try_wait().expect("try_wait") {
                break status;
            }
            assert!(Instant::now() < deadline, "the bridge did not exit; log:\n{}", self.stderr());
            std::thread::sleep(Duration::from_millis(20));
        };
        for reader in self.readers.drain(..) {
            reader.join().expect("reader thread");
        }
        let stdout = std::mem::take(&mut *self.stdout.lock());
        (status, stdout, self.stderr())
    }

    /// Sends SIGTERM (with the `kill` command) and waits for the exit.
    pub(crate) fn terminate(self) -> (ExitStatus, Vec<u8>, String) {
        let status = Command::new("kill").arg("-TERM").arg(self.pid().to_string()).status().expect("kill runs");
        assert!(status.success(), "kill -TERM failed");
        self.wait()
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// A blocking client with a read timeout on every read.
pub(crate) struct Client {
    stream: UnixStream,
    reader: BufReader<UnixStream>,
}

impl Client {
    fn connect(socket: &Path) -> Self {
        let stream = UnixStream::connect(socket).expect("connect to the bridge socket");
        stream.set_read_timeout(Some(SOON)).expect("read timeout");
        stream.set_write_timeout(Some(SOON)).expect("write timeout");
        let reader = BufReader::new(stream.try_clone().expect("clone"));
        Self { stream, reader }
    }

    /// Reads one line (with its newline); panics on timeout or EOF.
    pub(crate) fn line(&mut self) -> String {
        let mut line = String::new();
        let n = self.reader.read_line(&mut line).expect("a line before the timeout");
        assert!(n > 0, "unexpected EOF");
        line
    }

    /// Writes bytes.
    pub(crate) fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("write to the bridge");
    }

    /// Reads the `pid N` greeting of the echo child.
    fn child_pid(&mut self) -> u32 {
        let line = self.line();
        line.trim().strip_prefix("pid ").and_then(|p| p.parse().ok()).unwrap_or_else(|| panic!("greeting: {line:?}"))
    }

    /// Asserts that the bridge closes the connection (EOF) soon.
    fn expect_eof(&mut self) {
        let mut rest = Vec::new();
        match self.reader.read_to_end(&mut rest) {
            Ok(_) => assert!(rest.is_empty(), "bytes before EOF: {:?}", String::from_utf8_lossy(&rest)),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {}
            Err(e) => panic!("expected EOF, got {e}"),
        }
    }

    /// Asserts that nothing arrives within `quiet`.
    fn expect_silence(&mut self, quiet: Duration) {
        self.stream.set_read_timeout(Some(quiet)).expect("timeout");
        let mut buf = [0u8; 256];
        match self.reader.read(&mut buf) {
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {}
            other => panic!("expected silence, got {other:?} {:?}", String::from_utf8_lossy(&buf)),
        }
        self.stream.set_read_timeout(Some(SOON)).expect("timeout");
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + SOON;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn process_is_gone(pid: u32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
}

/// Deterministic bytes of every value (xorshift), so a shifted or dropped chunk cannot match.
fn payload(len: usize) -> Vec<u8> {
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Sends `len` bytes through a `cat` child and checks they come back identical.
pub(crate) fn assert_relays_byte_exact(bridge: &Bridge, len: usize) {
    let mut client = bridge.connect();
    // No newline: the bridge must not wait for one.
    client.send(b"partial");
    let mut head = [0u8; 7];
    client.reader.read_exact(&mut head).expect("bytes without a newline come back");
    assert_eq!(&head, b"partial");

    let data = Arc::new(payload(len));
    let mut writer = client.stream.try_clone().expect("clone");
    let to_send = Arc::clone(&data);
    let sender = std::thread::spawn(move || {
        // Uneven chunk sizes, so message boundaries never line up with the relay's buffer.
        let mut sent = 0;
        for size in [1usize, 7, 4096, 65_537, 300_000].iter().cycle() {
            if sent == to_send.len() {
                break;
            }
            let end = (sent + size).min(to_send.len());
            writer.write_all(&to_send[sent..end]).expect("write payload");
            sent = end;
        }
    });
    let mut echoed = vec![0u8; len];
    let started = Instant::now();
    client.reader.read_exact(&mut echoed).expect("the whole payload comes back before the timeout");
    sender.join().expect("sender thread");
    assert!(echoed == *data, "the payload came back altered");
    assert!(started.elapsed() < SOON);
}

// === tests ===

#[test]
fn relays_five_mib_byte_exact_in_both_directions() {
    let bridge = Bridge::start(&["cat".to_string()]);
    assert_relays_byte_exact(&bridge, 5 * 1024 * 1024);
    let (status, stdout, _) = bridge.terminate();
    assert_eq!(status.code(), Some(0));
    assert!(stdout.is_empty(), "the bridge wrote to its stdout: {:?}", String::from_utf8_lossy(&stdout));
}

#[test]
fn child_stderr_is_logged_with_the_server_id_and_never_reaches_the_socket() {
    let bridge =
        Bridge::start_with(Path::new(env!("CARGO_BIN_EXE_spearlet")), &["--server-id", "echo-srv"], &echo_child());
    let mut client = bridge.connect();
    client.child_pid();
    client.send(b"hello\n");
    assert_eq!(client.line(), "echo hello\n");
    client.expect_silence(Duration::from_millis(300));
    bridge.wait_for_log("stderr-noise: got a line");
    let log = bridge.stderr();
    let noise = log.lines().find(|l| l.contains("stderr-noise from")).expect("the child's stderr is in the log");
    assert!(noise.contains("server_id=echo-srv"), "tagged with the server id: {noise}");
    drop(client);
    let (status, stdout, _) = bridge.terminate();
    assert_eq!(status.code(), Some(0));
    assert!(stdout.is_empty(), "the bridge wrote to its stdout: {:?}", String::from_utf8_lossy(&stdout));
}

#[test]
fn a_client_that_disconnects_mid_session_gets_a_fresh_child_next_time() {
    let bridge = Bridge::start(&echo_child());
    let mut first = bridge.connect();
    let old = first.child_pid();
    first.send(b"initialize, say\n");
    assert_eq!(first.line(), "echo initialize, say\n");
    drop(first);

    let mut second = bridge.connect();
    let new = second.child_pid();
    assert_ne!(old, new, "a new client never reuses the session of one that left");
    wait_until("the old child to be gone", || process_is_gone(old));
    second.send(b"ping\n");
    assert_eq!(second.line(), "echo ping\n");
}

#[test]
fn a_second_client_is_refused_while_the_first_keeps_its_session() {
    let bridge = Bridge::start(&echo_child());
    let mut first = bridge.connect();
    let pid = first.child_pid();

    let mut second = bridge.connect();
    let reply: serde_json::Value = serde_json::from_str(&second.line()).expect("a JSON-RPC error line");
    assert_eq!(reply["error"]["code"], -32000, "{reply}");
    assert!(reply["error"]["message"].as_str().is_some_and(|m| m.contains("another client")), "{reply}");
    second.expect_eof();
    bridge.wait_for_log("refused a second client");

    first.send(b"still here\n");
    assert_eq!(first.line(), "echo still here\n", "the first session is untouched");
    assert!(!process_is_gone(pid));

    drop(first);
    let mut third = bridge.connect();
    assert_ne!(third.child_pid(), pid, "once the first left, the next client is served by a fresh child");
}

#[test]
fn a_client_that_connects_just_before_the_first_leaves_is_served_not_refused() {
    let bridge = Bridge::start(&echo_child());
    let mut first = bridge.connect();
    let old = first.child_pid();
    // Connected while `first` still is: held (not refused) for a moment, and served by a fresh
    // child once `first` turns out to be gone.
    let mut next = bridge.connect();
    drop(first);
    let new = next.child_pid();
    assert_ne!(old, new);
    next.send(b"hi\n");
    assert_eq!(next.line(), "echo hi\n");
}

#[test]
fn a_crashed_child_is_restarted_and_its_client_disconnected() {
    let bridge = Bridge::start(&echo_child());
    let mut client = bridge.connect();
    let old = client.child_pid();
    client.send(b"crash\n");
    client.expect_eof();
    bridge.wait_for_log("exit status: 3");
    bridge.wait_for_log("restarting");
    assert!(bridge.stderr().contains("crashing on purpose"), "the child's last words are logged");

    let mut again = bridge.connect();
    let new = again.child_pid();
    assert_ne!(old, new, "restarted");
    again.send(b"back\n");
    assert_eq!(again.line(), "echo back\n");
}

#[test]
fn sigterm_reaches_the_child_and_the_bridge_exits_0_and_removes_its_socket() {
    let bridge = Bridge::start(&echo_child());
    let mut client = bridge.connect();
    let pid = client.child_pid();
    let socket = bridge.socket.clone();
    let (status, stdout, log) = bridge.terminate();
    assert_eq!(status.code(), Some(0), "log:\n{log}");
    assert!(log.contains(&format!("child {pid} got SIGTERM")), "the child saw SIGTERM; log:\n{log}");
    assert!(process_is_gone(pid));
    assert!(!socket.exists(), "the socket file is removed");
    assert!(stdout.is_empty(), "the bridge wrote to its stdout: {:?}", String::from_utf8_lossy(&stdout));
    client.expect_eof();
}

#[test]
fn an_unstartable_command_exits_1_at_once_with_the_reason() {
    let dir = tempfile::tempdir().expect("tempdir");
    let not_executable = dir.path().join("server.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").expect("write");
    std::fs::set_permissions(&not_executable, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let cases = [
        ("/nonexistent/mcp-server".to_string(), "No such file or directory"),
        ("spear-no-such-command-on-path".to_string(), "is it installed in this image and on PATH?"),
        (not_executable.display().to_string(), "Permission denied"),
    ];
    for (command, reason) in cases {
        let socket_dir = tempfile::tempdir().expect("tempdir");
        let socket = socket_dir.path().join("s.sock");
        let bin = Path::new(env!("CARGO_BIN_EXE_spearlet"));
        let started = Instant::now();
        let (status, stdout, log) = Bridge::spawn(bin, &socket, &[], std::slice::from_ref(&command), socket_dir).wait();
        assert_eq!(status.code(), Some(1), "{command}: log:\n{log}");
        assert!(started.elapsed() < Duration::from_secs(5), "no retry loop");
        let expected = format!("error: cannot start '{command}': ");
        let line =
            log.lines().find(|l| l.starts_with(&expected)).unwrap_or_else(|| panic!("no {expected:?} in:\n{log}"));
        assert!(line.contains(reason), "{line}");
        assert!(!socket.exists(), "no socket left behind");
        assert!(stdout.is_empty());
    }
}

#[test]
fn a_missing_socket_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("run/s.sock");
    let bin = Path::new(env!("CARGO_BIN_EXE_spearlet"));
    let (status, _, log) = Bridge::spawn(bin, &socket, &[], &["cat".to_string()], dir).wait();
    assert_eq!(status.code(), Some(1));
    assert!(log.contains("error: socket directory") && log.contains("does not exist"), "{log}");
}

#[test]
fn a_stale_socket_file_is_replaced_and_the_socket_is_mode_0660() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("s.sock");
    drop(std::os::unix::net::UnixListener::bind(&socket).expect("a stale socket from an earlier run"));
    let bridge = Bridge::spawn(Path::new(env!("CARGO_BIN_EXE_spearlet")), &socket, &[], &["cat".to_string()], dir);
    bridge.wait_for_log("listening");
    let mode = std::fs::metadata(&socket).expect("socket").permissions().mode() & 0o777;
    assert_eq!(mode, 0o660);
    assert!(bridge.stderr().contains("replaced a stale socket file"));
    assert_relays_byte_exact(&bridge, 1024);
}

#[test]
fn bridge_without_a_command_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["bridge", "--socket", "/tmp/spear-unused.sock"])
        .output()
        .expect("spearlet runs");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(!Path::new("/tmp/spear-unused.sock").exists());
}
