//! The agent's OAuth client against a real authorization server and protected MCP server
//! (`tests/servers/oauth_server.py`: authlib's authorization server, the PyPI `mcp` SDK's
//! resource-server auth), through a real `spearlet serve`: discovery from the 401 challenge,
//! client credentials with the RFC 8707 resource and narrowed scopes, renewal at expiry, a
//! revoked token replaced, the errors for servers that need a person or need auth, and no secret
//! or token in the agent's log (at debug), audit file, metrics or status.
//!
//! The service-account modes, with tokens from the test control plane, are in
//! `cluster/oauth.rs`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spear::testing::mcp_servers;

use crate::serve::{http_get, metric};

/// A child process, killed on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `tests/servers/oauth_server.py` on `port` with `args`; waits until it listens.
pub fn start_oauth_server(port: u16, args: &[&str]) -> Killed {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/oauth_server.py");
    let child = Command::new(mcp_servers::python())
        .arg(script)
        .args(["--port", &port.to_string()])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("the OAuth test server starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(port, "/.well-known/oauth-authorization-server").is_none() {
        assert!(Instant::now() < deadline, "the OAuth test server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    Killed(child)
}

/// A GET of the test server's admin JSON.
pub fn admin(port: u16, path: &str) -> Value {
    let (status, body) = http_get(port, path).expect("the OAuth test server answers");
    assert_eq!(status, 200, "{path}: {body}");
    serde_json::from_str(&body).expect("JSON")
}

/// A POST to the test server's admin side.
pub fn admin_post(port: u16, path: &str) {
    use std::io::Write as _;
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(stream, "POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        .expect("write");
    let mut text = String::new();
    std::io::Read::read_to_string(&mut stream, &mut text).expect("read");
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
}

/// A running `spearlet serve` whose log (at debug) and audit lines go to files.
pub struct Agent {
    _child: Killed,
    pub grpc: u16,
    pub admin: u16,
    pub log: PathBuf,
    pub audit: PathBuf,
    _dir: tempfile::TempDir,
}

/// `spearlet serve` over the registry `yaml` (profile `p` included), with `env`.
pub fn start_agent(yaml: &str, env: &[(&str, &str)]) -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry).expect("mkdir");
    std::fs::write(registry.join("registry.yaml"), yaml).expect("write registry");
    let mut command = Command::new(env!("CARGO_BIN_EXE_spearlet"));
    command.arg("serve").arg("--registry-dir").arg(&registry).envs(env.iter().copied());
    spawn_agent(command, dir)
}

/// `spearlet run` for profile `p` of `namespace` as pod `pod`, through `kubeconfig` (the pod's
/// service account), with the test's loopback servers allowed.
pub fn start_pod_agent(kubeconfig: &Path, namespace: &str, pod: &str) -> Agent {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut command = Command::new(env!("CARGO_BIN_EXE_spearlet"));
    command
        .arg("run")
        .args(["--namespace", namespace, "--pod-name", pod])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--socket-dir")
        .arg(dir.path())
        .args(["--egress-deny-cidrs", spear::egress::AddressDenyList::AGENT_LOCAL])
        .env_remove("KUBECONFIG");
    spawn_agent(command, dir)
}

/// Starts `command` (serve or run) for profile `p` on free ports, its log (at debug) and audit
/// lines in `dir`; waits until it answers.
fn spawn_agent(mut command: Command, dir: tempfile::TempDir) -> Agent {
    let (http, grpc, admin) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let log = dir.path().join("spearlet.log");
    let audit = dir.path().join("audit.jsonl");
    let child = command
        .args(["--profile", "p"])
        .args(["--http-addr", &format!("127.0.0.1:{http}")])
        .args(["--grpc-addr", &format!("127.0.0.1:{grpc}")])
        .args(["--admin-addr", &format!("127.0.0.1:{admin}")])
        .args(["--log-level", "debug"])
        .arg("--audit-log")
        .arg(&audit)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log file"))
        .spawn()
        .expect("spawn spearlet");
    let agent = Agent { _child: Killed(child), grpc, admin, log, audit, _dir: dir };
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(agent.admin, "/healthz").is_none() {
        assert!(Instant::now() < deadline, "spearlet did not answer within 30 s");
        std::thread::sleep(Duration::from_millis(50));
    }
    agent
}

impl Agent {
    /// `spearlet tools call server/tool`: (success, stdout + stderr).
    pub fn call(&self, tool: &str) -> (bool, String) {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["tools", "call", tool, "--grpc-addr", &format!("127.0.0.1:{}", self.grpc)])
            .output()
            .expect("spearlet tools call");
        let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.success(), said)
    }

    /// Everything the agent wrote or shows: its log, its audit file, /metrics, /readyz and
    /// /debug/effective.
    pub fn everything_said(&self) -> String {
        let mut all = std::fs::read_to_string(&self.log).unwrap_or_default();
        all.push_str(&std::fs::read_to_string(&self.audit).unwrap_or_default());
        for path in ["/metrics", "/readyz", "/debug/effective"] {
            all.push_str(&http_get(self.admin, path).map(|(_, b)| b).unwrap_or_default());
        }
        all
    }
}

/// An McpServer at the test server on `port`, with `auth` (YAML lines under `http:`). Its calls
/// get 5 s: a call to a server that cannot start waits that long for its tools (then says why).
pub fn server_yaml(name: &str, port: u16, auth: &str) -> String {
    format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: streamableHttp\n  \
         http:\n    url: http://127.0.0.1:{port}/mcp\n{auth}  allowedTools: [\"*\"]\n  budgets: {{toolTimeoutMs: 5000}}\n---\n"
    )
}

#[test]
fn client_credentials_discover_renew_replace_a_revoked_token_and_leak_nothing() {
    let secret = format!("cs-{}", uuid::Uuid::new_v4().simple());
    let (port, interactive_port) = (mcp_servers::free_port(), mcp_servers::free_port());
    let _server = start_oauth_server(port, &["--client-secret", &secret, "--token-lifetime", "4"]);
    let _interactive = start_oauth_server(interactive_port, &["--client-secret", &secret, "--interactive-only"]);

    // The authorization server is pinned (`issuer`): here the test server's own.
    let cc = |port: u16| {
        format!(
            "    auth:\n      issuer: http://127.0.0.1:{port}\n      clientCredentials:\n        clientId: spear\n        \
             clientSecret: {{secretKeyRef: {{name: s, key: k}}}}\n      scopes: [mcp:tools, other:scope]\n"
        )
    };
    let mut yaml = server_yaml("remote", port, &cc(port));
    yaml.push_str(&server_yaml("interactive", interactive_port, &cc(interactive_port)));
    yaml.push_str(&server_yaml("plain", port, ""));
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [remote, interactive, plain]\n",
    );
    let agent = start_agent(
        &yaml,
        &[("SPEAR_SECRET_REMOTE_AUTH_CLIENTSECRET", &secret), ("SPEAR_SECRET_INTERACTIVE_AUTH_CLIENTSECRET", &secret)],
    );

    // 401 → discovery → client credentials → the call, with the token's identity.
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok, "{said}");
    assert!(said.contains(r#"\"client_id\": \"spear\""#) || said.contains(r#""client_id": "spear""#), "{said}");
    // The token lives 4 s: renewed at 3.6 s, before the server would refuse it.
    std::thread::sleep(Duration::from_millis(4200));
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok, "after expiry: {said}");
    // Revoked: the server answers 401, the agent gets a new token and the call succeeds.
    admin_post(port, "/admin/revoke");
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok, "after revocation: {said}");

    let requests = admin(port, "/admin/requests");
    let requests = requests.as_array().expect("requests");
    assert!(requests.len() >= 3, "initial, expiry, revoked: {requests:?}");
    for request in requests {
        assert_eq!(request["grant_type"], "client_credentials", "{request}");
        assert_eq!(request["status"], 200, "{request}");
        assert_eq!(request["client_id"], "spear", "{request}");
        // RFC 8707: the MCP server's URL; the server asks mcp:tools, the McpServer allows it
        // (and other:scope, which the server did not ask for).
        assert_eq!(request["resource"], format!("http://127.0.0.1:{port}/mcp"), "{request}");
        assert_eq!(request["scope"], "mcp:tools", "{request}");
    }

    // A server that wants a person, and one whose McpServer has no auth: clear errors, at once
    // (a lasting refusal), not after the tool timeout with the last listing's failure.
    let (ok, said) = agent.call("interactive/whoami");
    assert!(!ok && said.contains("need a person at a browser"), "{said}");
    assert!(said.contains("server 'interactive' cannot be used") && !said.contains("last tools/list failed"), "{said}");
    let (ok, said) = agent.call("plain/whoami");
    assert!(!ok && said.contains("set spec.http.auth"), "{said}");
    assert!(said.contains("server 'plain' cannot be used") && !said.contains("last tools/list failed"), "{said}");

    let metrics = http_get(agent.admin, "/metrics").expect("metrics").1;
    // Renewals at expiry go on while the session lives (its requests keep coming): at least one.
    let fetched = |reason: &str| {
        let series = format!(r#"mcp_auth_token_fetch_total{{server_id="remote",reason="{reason}",outcome="ok"}}"#);
        metric(&metrics, &series).unwrap_or(0.0)
    };
    assert_eq!((fetched("initial"), fetched("rejected")), (1.0, 1.0), "{metrics}");
    assert!(fetched("expiry") >= 1.0, "{metrics}");

    let said = agent.everything_said();
    assert!(said.contains("access token obtained"), "the log is the agent's debug log");
    assert!(!said.contains(&secret), "the client secret leaked");
    let issued = admin(port, "/admin/tokens");
    let tokens = issued["tokens"].as_array().expect("tokens");
    assert!(tokens.len() >= 3, "{tokens:?}");
    for token in tokens {
        let token = token.as_str().expect("token");
        assert!(!said.contains(token), "an access token leaked");
    }
}

#[test]
fn explain_says_how_each_server_authenticates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut yaml = server_yaml(
        "remote",
        1,
        "    auth:\n      clientCredentials: {clientId: a, privateKey: {secretKeyRef: {name: s, key: k}}}\n",
    );
    yaml.push_str(&server_yaml(
        "cluster",
        2,
        "    auth:\n      issuer: https://sso.example.com\n      tokenExchange: {audience: sso, grant: jwtBearer}\n",
    ));
    yaml.push_str(&server_yaml("open", 3, ""));
    yaml.push_str("apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [remote, cluster, open]\n");
    std::fs::write(dir.path().join("registry.yaml"), yaml).expect("write");
    let explain = |format: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["explain", "--profile", "p", "--output", format, "--registry-dir"])
            .arg(dir.path())
            .output()
            .expect("spearlet explain");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let table = explain("table");
    assert!(table.contains("AUTH\n"), "{table}");
    assert!(table.contains("oauth client credentials (private_key_jwt)"), "{table}");
    assert!(table.contains("service-account token, jwt-bearer grant"), "{table}");
    let json: Value = serde_json::from_str(&explain("json")).expect("JSON");
    let auth: Vec<(String, Value)> = json["servers"]
        .as_array()
        .expect("servers")
        .iter()
        .map(|s| (s["id"].as_str().unwrap_or_default().to_string(), s["auth"].clone()))
        .collect();
    assert!(auth.contains(&("open".to_string(), Value::Null)), "{auth:?}");
    assert!(
        auth.contains(&("cluster".to_string(), Value::from("service-account token, jwt-bearer grant"))),
        "{auth:?}"
    );
}

/// The attack of `tests/servers/foreign_authorization_server.py`: a protected server whose
/// metadata names another authorization server. With the authorization server pinned
/// (`auth.issuer`, here a real one), the client secret and the pod's token (RFC 8693 and the
/// JWT-bearer grant) never reach the foreign one; the agent asks it nothing at all, and the
/// refusal is lasting (each call fails at once, naming the field to fix), with discovery done
/// once per server however often the server answers 401.
#[test]
fn a_server_naming_a_foreign_authorization_server_gets_no_credential() {
    let secret = format!("cs-{}", uuid::Uuid::new_v4().simple());
    let sa_token = format!("FAKE-PROJECTED-SA-TOKEN-{}", uuid::Uuid::new_v4().simple());
    let (pinned_port, mcp_port, foreign_port) =
        (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let _pinned = start_oauth_server(pinned_port, &["--client-secret", &secret]);

    let work = tempfile::tempdir().expect("tempdir");
    let log = work.path().join("hostile.jsonl");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/foreign_authorization_server.py");
    let _hostile = Killed(
        Command::new(mcp_servers::python())
            .arg(script)
            .args(["--mcp-port", &mcp_port.to_string(), "--as-port", &foreign_port.to_string()])
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the hostile server starts"),
    );
    let deadline = Instant::now() + Duration::from_secs(30);
    while http_get(mcp_port, "/ready").is_none() || http_get(foreign_port, "/ready").is_none() {
        assert!(Instant::now() < deadline, "the hostile server did not listen");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&log, "").expect("clear the readiness probes from the log");

    let tokens = work.path().join("tokens");
    std::fs::create_dir(&tokens).expect("mkdir");
    for name in ["exchange", "jwt"] {
        std::fs::write(tokens.join(name), &sa_token).expect("write token");
    }
    let issuer = format!("      issuer: http://127.0.0.1:{pinned_port}\n");
    let mut yaml = server_yaml(
        "secret",
        mcp_port,
        &format!(
            "    auth:\n{issuer}      clientCredentials:\n        clientId: spear\n        clientSecret: {{secretKeyRef: {{name: s, key: k}}}}\n"
        ),
    );
    yaml.push_str(&server_yaml(
        "exchange",
        mcp_port,
        &format!("    auth:\n{issuer}      tokenExchange: {{audience: \"https://sso.corp.example\"}}\n"),
    ));
    yaml.push_str(&server_yaml(
        "jwt",
        mcp_port,
        &format!(
            "    auth:\n{issuer}      tokenExchange: {{audience: \"https://sso.corp.example\", grant: jwtBearer}}\n"
        ),
    ));
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [secret, exchange, jwt]\n",
    );
    let token_dir = tokens.to_string_lossy().into_owned();
    let agent =
        start_agent(&yaml, &[("SPEAR_SECRET_SECRET_AUTH_CLIENTSECRET", &secret), ("SPEAR_AUTH_TOKEN_DIR", &token_dir)]);

    for server in ["secret", "exchange", "jwt"] {
        for attempt in 0..3 {
            let started = Instant::now();
            let (ok, said) = agent.call(&format!("{server}/whoami"));
            assert!(!ok, "{server}: {said}");
            assert!(
                said.contains(&format!("server '{server}' cannot be used"))
                    && said.contains("names the authorization server")
                    && said.contains("spec.http.auth.issuer"),
                "{server} (attempt {attempt}): {said}"
            );
            assert!(started.elapsed() < Duration::from_secs(4), "a lasting refusal answers at once: {said}");
        }
    }

    let logged = std::fs::read_to_string(&log).expect("the hostile server's log");
    let entries: Vec<Value> = logged.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let foreign: Vec<&Value> = entries.iter().filter(|e| e["side"] == "as").collect();
    assert!(foreign.is_empty(), "requests reached the foreign authorization server: {foreign:?}");
    assert!(!logged.contains(&secret) && !logged.contains(&sa_token), "a credential reached the hostile server");
    // Discovery once per server: the 401s after it do not make the agent look again.
    let discoveries =
        entries.iter().filter(|e| e["path"].as_str().is_some_and(|p| p.contains("oauth-protected-resource"))).count();
    assert!(discoveries <= 3, "{discoveries} metadata reads for 3 servers: {logged}");
    // The pinned authorization server was not asked for a token either: the server is refused.
    let requests = admin(pinned_port, "/admin/requests");
    assert_eq!(requests.as_array().map(Vec::len), Some(0), "{requests}");
    let said = agent.everything_said();
    assert!(!said.contains(&secret) && !said.contains(&sa_token), "a credential leaked into the agent's output");
}
