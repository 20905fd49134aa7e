//! The real MCP servers the tests talk to (MCP peers are never doubles), as argvs.
//!
//! ```text
//! hack/mcp-servers.sh ─installs once─▶ ~/.cache/spear-mcp/mcp-servers/<key>/{node,venv}
//!                                               │ ($SPEAR_MCP_SERVERS_DIR, else the same <key>)
//! servers_dir() ◀───────────────────────────────┘
//!   ├─ everything_stdio() / everything_http(port)  node + @modelcontextprotocol/server-everything
//!   ├─ filesystem_stdio(root)                       node + @modelcontextprotocol/server-filesystem
//!   └─ fixture_stdio(flags) / fixture_http(..)      venv python + tests/servers/fixture_server.py
//! ```
//!
//! Each function returns a [`Command`] (program, arguments, extra environment; never a shell) so
//! the caller picks how to spawn it: `std::process`, `tokio::process` or rmcp's child-process
//! transport. Like the control-plane launcher, a missing install panics with what to run.

use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

/// npm `@modelcontextprotocol/server-everything` version; must match `hack/mcp-servers.sh`.
pub const EVERYTHING_VERSION: &str = "2026.8.31";
/// npm `@modelcontextprotocol/server-filesystem` version; must match `hack/mcp-servers.sh`.
pub const FILESYSTEM_VERSION: &str = "2026.8.31";
/// PyPI `mcp` (Python SDK) version in the venv; must match `hack/mcp-servers.sh`.
pub const MCP_VERSION: &str = "2.3.0";
/// PyPI `openai` version in the venv; must match `hack/mcp-servers.sh`.
pub const OPENAI_VERSION: &str = "3.54.0";
/// Layout revision of the install; must match `REVISION` in `hack/mcp-servers.sh`.
pub const REVISION: &str = "r3";
/// Env var naming the install directory, overriding the default cache path.
pub const ENV_DIR: &str = "SPEAR_MCP_SERVERS_DIR";

/// How long one TCP probe of [`wait_for_http`] may take; loopback answers at once.
const CONNECT_PROBE_TIMEOUT: Duration = Duration::from_millis(200);
/// Pause between [`wait_for_http`] probes.
const POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A server's argv and the environment variables it needs on top of the caller's; no shell.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// The executable (an absolute path when it could be resolved).
    pub program: PathBuf,
    /// Its arguments, in order.
    pub args: Vec<String>,
    /// Extra environment variables (for example `PORT` for server-everything's HTTP mode).
    pub env: Vec<(String, String)>,
}

impl Command {
    /// The same server started `seconds` later, through `sh` (which then execs it): a server
    /// that is slow to start, as `npx` is while it downloads its package.
    pub fn delayed(&self, seconds: f64) -> Command {
        let mut args = vec!["-c".to_string(), format!("sleep {seconds}; exec \"$0\" \"$@\"")];
        args.push(self.program.to_string_lossy().into_owned());
        args.extend(self.args.iter().cloned());
        Command { program: PathBuf::from("/bin/sh"), args, env: self.env.clone() }
    }

    /// A `std::process::Command` with the program, arguments and extra environment set
    /// (`tokio::process::Command::from` takes it as is).
    pub fn to_std(&self) -> std::process::Command {
        let mut command = std::process::Command::new(&self.program);
        command.args(&self.args).envs(self.env.iter().map(|(name, value)| (name, value)));
        command
    }
}

/// The install directory: `$SPEAR_MCP_SERVERS_DIR`, else the cache path `hack/mcp-servers.sh`
/// uses for the pinned versions (honouring its `SPEAR_CACHE_DIR`). Panics when it is missing.
pub fn servers_dir() -> PathBuf {
    let dir = match std::env::var_os(ENV_DIR) {
        Some(dir) => PathBuf::from(dir),
        None => {
            let cache = match (std::env::var_os("SPEAR_CACHE_DIR"), std::env::var_os("HOME")) {
                (Some(dir), _) => PathBuf::from(dir),
                (None, Some(home)) => PathBuf::from(home).join(".cache/spear-mcp"),
                (None, None) => panic!("MCP test servers not installed: run hack/mcp-servers.sh (HOME is not set)"),
            };
            cache.join("mcp-servers").join(format!(
                "everything-{EVERYTHING_VERSION}-filesystem-{FILESYSTEM_VERSION}-mcp-{MCP_VERSION}-openai-{OPENAI_VERSION}-{REVISION}"
            ))
        }
    };
    if !dir.join("node").is_dir() || !dir.join("venv").is_dir() {
        panic!("MCP test servers not installed: run hack/mcp-servers.sh (no {})", dir.display());
    }
    dir
}

/// `node` from `PATH` (the npm servers run on it), or the bare name when it is not found.
pub fn node() -> PathBuf {
    std::env::var_os("PATH")
        .iter()
        .flat_map(std::env::split_paths)
        .map(|dir| dir.join("node"))
        .find(|path| path.is_file())
        .unwrap_or_else(|| PathBuf::from("node"))
}

/// The venv's python, which has the `mcp` SDK and `openai`.
pub fn python() -> PathBuf {
    servers_dir().join("venv/bin/python")
}

/// `@modelcontextprotocol/server-everything` over stdio.
pub fn everything_stdio() -> Command {
    node_command("server-everything", &["stdio"], Vec::new())
}

/// `@modelcontextprotocol/server-everything` over Streamable HTTP at `http://127.0.0.1:{port}/mcp`
/// (its CLI takes the transport as an argument and the port from `PORT`; it binds all interfaces).
pub fn everything_http(port: u16) -> Command {
    node_command("server-everything", &["streamableHttp"], vec![("PORT".to_owned(), port.to_string())])
}

/// `@modelcontextprotocol/server-filesystem` over stdio, allowed to access `root` only.
pub fn filesystem_stdio(root: &Path) -> Command {
    node_command("server-filesystem", &[&root.to_string_lossy()], Vec::new())
}

/// `tests/servers/fixture_server.py` over stdio, with fault flags such as `--garbage-stdout`.
pub fn fixture_stdio(flags: &[&str]) -> Command {
    fixture(&["--transport", "stdio"], flags)
}

/// `tests/servers/fixture_server.py` over Streamable HTTP at `http://127.0.0.1:{port}/mcp`.
pub fn fixture_http(port: u16, flags: &[&str]) -> Command {
    fixture(&["--transport", "http", "--host", "127.0.0.1", "--port", &port.to_string()], flags)
}

/// `tests/servers/traced_server.py` (OpenTelemetry-instrumented, one `echo` tool) over Streamable
/// HTTP at `http://127.0.0.1:{port}/mcp`, exporting its spans over OTLP/HTTP to `otlp_http`
/// (a collector's `http://127.0.0.1:<port>`).
pub fn traced_http(port: u16, otlp_http: &str) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/traced_server.py");
    let args = vec![script.to_string_lossy().into_owned(), "--port".to_owned(), port.to_string()];
    let env = vec![("OTEL_EXPORTER_OTLP_ENDPOINT".to_owned(), otlp_http.to_owned())];
    Command { program: python(), args, env }
}

/// A loopback port that was free a moment ago, for a child process to bind.
///
/// Picked below the kernel's ephemeral range (`ip_local_port_range`), where port-0 binds and
/// outgoing connections never land, so the many client sockets of tests running in parallel
/// cannot take it between this check and the child's bind; a process-wide cursor starting at a
/// per-process offset keeps two calls from handing out the same port.
pub fn free_port() -> u16 {
    const LOWEST: u32 = 10_000;
    /// (ports below the ephemeral range to pick from, the cursor over them), set up once.
    static PICKER: OnceLock<(u32, AtomicU32)> = OnceLock::new();
    let (span, cursor) = PICKER.get_or_init(|| {
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
            .unwrap_or(32_768);
        let span = ephemeral_low.saturating_sub(LOWEST).max(1);
        let seed =
            std::hash::BuildHasher::hash_one(&std::collections::hash_map::RandomState::new(), std::process::id());
        (span, AtomicU32::new((seed % u64::from(span)) as u32))
    });
    if *span >= 1_000 {
        for _ in 0..*span {
            let port = LOWEST + cursor.fetch_add(1, Ordering::Relaxed) % span;
            if let Ok(port) = u16::try_from(port)
                && TcpListener::bind((Ipv4Addr::LOCALHOST, port)).is_ok()
            {
                return port;
            }
        }
    }
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .and_then(|listener| listener.local_addr())
        .expect("binding 127.0.0.1:0 must succeed")
        .port()
}

/// Polls until `127.0.0.1:{port}` accepts TCP connections; false if `timeout` passes first.
pub async fn wait_for_http(port: u16, timeout: Duration) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let deadline = Instant::now() + timeout;
    loop {
        // A blocking connect is fine here: on loopback it is accepted or refused at once.
        if TcpStream::connect_timeout(&addr, CONNECT_PROBE_TIMEOUT).is_ok() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(POLL_INTERVAL).await;
    }
}

/// `node <entry point of @modelcontextprotocol/{package}> args...`.
fn node_command(package: &str, args: &[&str], env: Vec<(String, String)>) -> Command {
    let mut argv = vec![npm_entry_point(package).to_string_lossy().into_owned()];
    argv.extend(args.iter().map(|arg| (*arg).to_owned()));
    Command { program: node(), args: argv, env }
}

/// The JS file named by the installed package's `package.json` `bin` (a string or a map).
fn npm_entry_point(package: &str) -> PathBuf {
    let dir = servers_dir().join("node/node_modules/@modelcontextprotocol").join(package);
    let manifest = dir.join("package.json");
    let text = std::fs::read_to_string(&manifest).unwrap_or_else(|e| {
        panic!("MCP test servers not installed: run hack/mcp-servers.sh ({}: {e})", manifest.display())
    });
    let json: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} must be JSON: {e}", manifest.display()));
    let bin = match &json["bin"] {
        serde_json::Value::String(path) => Some(path.as_str()),
        serde_json::Value::Object(map) => map.values().find_map(|path| path.as_str()),
        _ => None,
    };
    let bin = bin.unwrap_or_else(|| panic!("{} must name a `bin` entry point", manifest.display()));
    dir.join(bin)
}

/// `python tests/servers/fixture_server.py transport_args... flags...`.
fn fixture(transport_args: &[&str], flags: &[&str]) -> Command {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/fixture_server.py");
    let mut args = vec![script.to_string_lossy().into_owned()];
    args.extend(transport_args.iter().chain(flags).map(|arg| (*arg).to_owned()));
    Command { program: python(), args, env: Vec::new() }
}
