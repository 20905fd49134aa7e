//! `spearlet auth login` and the agent's use of the grant it stores, against a real authorization
//! server (`tests/servers/oauth_server.py --authorization-code`: authlib's authorization-code
//! grant with PKCE, its refresh-token grant with rotation, the PyPI `mcp` SDK as the protected
//! server): the login with `--no-browser` (the test follows the printed URL as the person's
//! browser would), the grant file, the agent's calls with the stored access token, a renewal with
//! the refresh token at expiry (rotated and written back), and after revocation the lasting
//! refusal that names the login; no token in the agent's log, audit or metrics.

use std::io::{BufRead as _, Read as _, Write as _};
use std::os::unix::fs::PermissionsExt as _;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use serde_json::Value;
use spear::testing::mcp_servers;

use crate::oauth::{admin, admin_post, server_yaml, start_agent, start_oauth_server};
use crate::serve::http_get;

/// A GET on loopback `port`: (status, its `Location` header).
fn get_redirect(port: u16, path: &str) -> (u16, Option<String>) {
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    stream.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    write!(stream, "GET {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n").expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let location = text
        .lines()
        .take_while(|l| !l.is_empty())
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("location")))
        .map(|(_, v)| v.trim().to_string());
    (status, location)
}

fn path_of(url: &url::Url) -> String {
    url[url::Position::BeforePath..].to_string()
}

/// The person's part of a running `spearlet auth login --no-browser`: the URL it prints on one
/// line, followed as their browser would (the test authorization server at `port` approves at
/// once, and redirects to the login's loopback listener). (The URL, the login's output.)
pub(crate) fn consent(mut login: Child, port: u16) -> (url::Url, Output) {
    let mut line = String::new();
    std::io::BufReader::new(login.stdout.take().expect("stdout")).read_line(&mut line).expect("the URL line");
    let authorize = match url::Url::parse(line.trim()) {
        Ok(url) => url,
        Err(e) => {
            let out = login.wait_with_output().expect("the login ends");
            panic!(
                "the printed line is not the authorization URL ({e}): {line:?} {}",
                String::from_utf8_lossy(&out.stderr)
            )
        }
    };
    let (status, location) = get_redirect(port, &path_of(&authorize));
    assert_eq!(status, 302, "the authorization server approves at once");
    let callback = url::Url::parse(&location.expect("a redirect")).expect("the redirect URI");
    assert_eq!(callback.host_str(), Some("127.0.0.1"), "{callback}");
    let (status, _) = http_get(callback.port().expect("a port"), &path_of(&callback)).expect("the listener answers");
    assert_eq!(status, 200);
    (authorize, login.wait_with_output().expect("the login ends"))
}

#[test]
fn a_persons_grant_is_stored_used_rotated_and_refused_once_revoked() {
    let port = mcp_servers::free_port();
    let _server =
        start_oauth_server(port, &["--client-secret", "unused", "--authorization-code", "--token-lifetime", "3"]);
    let auth = format!(
        "    auth:\n      issuer: http://127.0.0.1:{port}\n      authorizationCode: {{clientId: spear-login}}\n"
    );
    let mut yaml = server_yaml("remote", port, &auth);
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [remote]\n",
    );
    let work = tempfile::tempdir().expect("tempdir");
    let registry = work.path().join("registry");
    std::fs::create_dir(&registry).expect("mkdir");
    std::fs::write(registry.join("registry.yaml"), &yaml).expect("write");
    let grants = work.path().join("grants");

    // The person's part: the URL printed on one line, followed by their browser.
    let login = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["auth", "login", "--server", "remote", "--no-browser", "--timeout", "30", "--registry-dir"])
        .arg(&registry)
        .arg("--grant-dir")
        .arg(&grants)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spearlet auth login");
    let (authorize, out) = consent(login, port);
    let query: Vec<(String, String)> = authorize.query_pairs().map(|(k, v)| (k.into(), v.into())).collect();
    let param = |k: &str| query.iter().find(|(key, _)| key == k).map(|(_, v)| v.clone());
    assert_eq!(param("code_challenge_method").as_deref(), Some("S256"), "{authorize}");
    assert_eq!(param("resource"), Some(format!("http://127.0.0.1:{port}/mcp")), "{authorize}");
    assert_eq!(param("scope").as_deref(), Some("mcp:tools"), "what the server's metadata asks for");
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("logged in to remote"), "{said}");

    let file = grants.join("remote.json");
    assert_eq!(std::fs::metadata(&file).expect("the grant").permissions().mode() & 0o777, 0o600);
    let read_grant = || -> Value { serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON") };
    let first = read_grant();
    let first_refresh = first["refresh_token"].as_str().expect("a refresh token").to_string();
    assert!(!said.contains(&first_refresh), "the login printed the refresh token");

    // explain says whether someone must log in, never the token.
    let explain = |grant_dir: &std::path::Path| {
        let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
            .args(["explain", "--profile", "p", "--registry-dir"])
            .arg(&registry)
            .env("SPEAR_GRANT_DIR", grant_dir)
            .output()
            .expect("spearlet explain");
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let shown = explain(&grants);
    assert!(shown.contains("GRANTS") && shown.contains("grant stored"), "{shown}");
    assert!(!shown.contains(&first_refresh), "{shown}");
    let shown = explain(&work.path().join("none"));
    assert!(shown.contains("no grant stored: run `spearlet auth login --server remote`"), "{shown}");

    // The agent uses the stored access token, then the refresh token once it expires (3 s).
    let grant_dir = grants.to_str().expect("utf-8 path");
    let agent = start_agent(&yaml, &[("SPEAR_GRANT_DIR", grant_dir)]);
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok && said.contains("person"), "{said}");
    std::thread::sleep(Duration::from_millis(3500));
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok && said.contains("person"), "after expiry: {said}");
    let requests = admin(port, "/admin/requests");
    let refreshed = requests
        .as_array()
        .expect("requests")
        .iter()
        .filter(|r| r["grant_type"] == "refresh_token" && r["status"] == 200)
        .count();
    assert!(refreshed >= 1, "{requests}");
    let rotated = read_grant();
    let second_refresh = rotated["refresh_token"].as_str().expect("a refresh token").to_string();
    assert_ne!(second_refresh, first_refresh, "the rotated refresh token was written back");
    assert_eq!(rotated["issuer"], first["issuer"]);

    // Revoked at the authorization server: a lasting refusal that says what to run.
    admin_post(port, "/admin/revoke");
    std::thread::sleep(Duration::from_millis(3500));
    let (ok, said) = agent.call("remote/whoami");
    assert!(!ok && said.contains("spearlet auth login --server remote"), "{said}");

    let everything = agent.everything_said();
    for token in [&first_refresh, &second_refresh] {
        assert!(!everything.contains(token.as_str()), "a refresh token leaked");
    }
    for token in admin(port, "/admin/tokens")["tokens"].as_array().expect("tokens") {
        assert!(!everything.contains(token.as_str().expect("token")), "an access token leaked");
    }
}
