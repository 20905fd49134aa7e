//! `spearlet auth login` and the agent against an authorization server that is not ours: Ory Hydra,
//! built from its Go module (`hack/hydra.sh`), with its login and consent app and a protected MCP
//! server that checks tokens with Hydra's introspection (`tests/servers/hydra_app.py`, the PyPI
//! `mcp` SDK). Nothing is pre-registered: the login registers a client (RFC 7591), Hydra enforces
//! PKCE, rotates refresh tokens, and revokes them when the person withdraws consent.

use std::io::BufRead as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use spear::testing::mcp_servers;

use crate::oauth::{Killed, server_yaml, start_agent};
use crate::serve::http_get;

const HYDRA_VERSION: &str = "v2.3.0";
const HYDRA_BUILD_REVISION: &str = "b1";

/// `$SPEAR_HYDRA`, else the path `hack/hydra.sh` builds into; panics with what to run.
fn hydra() -> PathBuf {
    let path = std::env::var_os("SPEAR_HYDRA").map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("SPEAR_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(std::env::var_os("HOME").expect("HOME is set")).join(".cache/spear-mcp"));
        cache.join(format!("hydra/{HYDRA_VERSION}-{HYDRA_BUILD_REVISION}/hydra"))
    });
    assert!(path.exists(), "no Hydra at {}: run hack/hydra.sh (or set SPEAR_HYDRA)", path.display());
    path
}

fn wait_for(port: u16, path: &str, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while http_get(port, path).is_none_or(|(status, _)| status != 200) {
        assert!(Instant::now() < deadline, "{what} did not answer {path} on {port}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A request to Hydra's admin API on `port`, with a JSON `body`: (status, body).
fn hydra_admin(port: u16, method: &str, path: &str, body: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )
    .expect("write");
    let mut text = String::new();
    stream.read_to_string(&mut text).expect("read");
    let status = text.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    (status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn app_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/hydra_app.py")
}

/// `spearlet auth login --server SERVER --no-browser` on the registry at `registry`, storing in
/// `grants`.
fn login_command(server: &str, registry: &Path, grants: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_spearlet"));
    command
        .args(["auth", "login", "--server", server, "--no-browser", "--timeout", "60", "--registry-dir"])
        .arg(registry)
        .arg("--grant-dir")
        .arg(grants)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// The person's part of a running `spearlet auth login --no-browser`: the URL it prints, followed
/// by a browser (Hydra, its login and consent app, back to the login's listener). The login's
/// output.
fn browse(mut login: std::process::Child) -> std::process::Output {
    let mut line = String::new();
    std::io::BufReader::new(login.stdout.take().expect("stdout")).read_line(&mut line).expect("the URL line");
    let authorize = match url::Url::parse(line.trim()) {
        Ok(url) => url,
        Err(e) => {
            let out = login.wait_with_output().expect("the login ends");
            panic!("no authorization URL ({e}): {line:?} {}", String::from_utf8_lossy(&out.stderr))
        }
    };
    let param = |k: &str| authorize.query_pairs().find(|(key, _)| key == k).map(|(_, v)| v.into_owned());
    assert_eq!(param("code_challenge_method").as_deref(), Some("S256"), "{authorize}");
    let browsed = Command::new(mcp_servers::python()).arg(app_script()).arg("browse").arg(line.trim()).output();
    let browsed = browsed.expect("the browser runs");
    assert!(browsed.status.success(), "{}", String::from_utf8_lossy(&browsed.stderr));
    login.wait_with_output().expect("the login ends")
}

#[test]
fn a_login_at_hydra_registers_its_client_and_the_agent_renews_rotates_and_is_refused_once_revoked() {
    let (public, admin, app) = (mcp_servers::free_port(), mcp_servers::free_port(), mcp_servers::free_port());
    let work = tempfile::tempdir().expect("tempdir");
    let _hydra = Killed(
        Command::new(hydra())
            .args(["serve", "all", "--dev"])
            .env("DSN", "memory")
            .env("SECRETS_SYSTEM", "spear-test-secret-of-at-least-32-characters")
            .env("URLS_SELF_ISSUER", format!("http://127.0.0.1:{public}"))
            .env("URLS_LOGIN", format!("http://127.0.0.1:{app}/login"))
            .env("URLS_CONSENT", format!("http://127.0.0.1:{app}/consent"))
            .env("SERVE_PUBLIC_HOST", "127.0.0.1")
            .env("SERVE_PUBLIC_PORT", public.to_string())
            .env("SERVE_ADMIN_HOST", "127.0.0.1")
            .env("SERVE_ADMIN_PORT", admin.to_string())
            .env("OIDC_DYNAMIC_CLIENT_REGISTRATION_ENABLED", "true")
            // Hydra serves registration without naming it in its discovery document unless told.
            .env(
                "WEBFINGER_OIDC_DISCOVERY_CLIENT_REGISTRATION_URL",
                format!("http://127.0.0.1:{public}/oauth2/register"),
            )
            .env("OAUTH2_PKCE_ENFORCED", "true")
            .env("STRATEGIES_ACCESS_TOKEN", "opaque")
            .env("TTL_ACCESS_TOKEN", "4s")
            .env("LOG_LEVEL", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.path().join("hydra.log")).expect("log"))
            .spawn()
            .expect("hydra starts"),
    );
    wait_for(public, "/health/ready", "Hydra");
    let _app = Killed(
        Command::new(mcp_servers::python())
            .arg(app_script())
            .args(["serve", "--port", &app.to_string()])
            .args(["--hydra-public", &format!("http://127.0.0.1:{public}")])
            .args(["--hydra-admin", &format!("http://127.0.0.1:{admin}")])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("the app starts"),
    );
    wait_for(app, "/healthz", "the login and consent app");

    // `remote`: no client configured, the login registers one. `confidential`: a client registered
    // at Hydra beforehand with a secret (client_secret_basic) and a fixed redirect URI.
    let redirect_port = mcp_servers::free_port();
    let client_secret = format!("cs-{}", uuid::Uuid::new_v4().simple());
    let client = serde_json::json!({
        "client_id": "spear-confidential", "client_secret": client_secret,
        "grant_types": ["authorization_code", "refresh_token"], "response_types": ["code"],
        "redirect_uris": [format!("http://127.0.0.1:{redirect_port}/callback")],
        "token_endpoint_auth_method": "client_secret_basic", "scope": "mcp:tools offline_access",
    });
    let (status, body) = hydra_admin(admin, "POST", "/admin/clients", &client.to_string());
    assert_eq!(status, 201, "{body}");
    let issuer = format!("    auth:\n      issuer: http://127.0.0.1:{public}\n");
    let mut yaml = server_yaml("remote", app, &format!("{issuer}      authorizationCode: {{}}\n"));
    yaml.push_str(&server_yaml(
        "confidential",
        app,
        &format!(
            "{issuer}      authorizationCode: {{clientId: spear-confidential, clientSecret: {{secretKeyRef: {{name: s, key: k}}}}}}\n"
        ),
    ));
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [remote, confidential]\n",
    );
    let secret_env = ("SPEAR_SECRET_CONFIDENTIAL_AUTH_CLIENTSECRET", client_secret.as_str());
    let registry = work.path().join("registry");
    std::fs::create_dir(&registry).expect("mkdir");
    std::fs::write(registry.join("registry.yaml"), &yaml).expect("write");
    let grants = work.path().join("grants");
    let out = browse(login_command("remote", &registry, &grants).spawn().expect("spearlet auth login"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("logged in to remote"), "{said}");

    let file = grants.join("remote.json");
    let read_grant = || -> Value { serde_json::from_slice(&std::fs::read(&file).expect("read")).expect("JSON") };
    let first = read_grant();
    assert_eq!(first["client"]["registration"], "dynamic", "{first}");
    assert_eq!(first["issuer"], format!("http://127.0.0.1:{public}"));
    let first_refresh = first["refresh_token"].as_str().expect("Hydra issued a refresh token").to_string();
    let client_id = first["client"]["client_id"].as_str().expect("a client id").to_string();
    let (status, registered) = hydra_admin(admin, "GET", &format!("/admin/clients/{client_id}"), "");
    assert_eq!(status, 200, "the client is registered at Hydra: {registered}");

    // The agent calls as the person, and renews once the 4 s token is due: Hydra rotates the
    // refresh token, and the new one is written back.
    // The confidential client's login: its secret from the environment, as local mode reads it.
    let mut login = login_command("confidential", &registry, &grants);
    login.args(["--redirect-port", &redirect_port.to_string()]).env(secret_env.0, secret_env.1);
    let out = browse(login.spawn().expect("spearlet auth login"));
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && said.contains("logged in to confidential"), "{said}");
    let confidential: Value =
        serde_json::from_slice(&std::fs::read(grants.join("confidential.json")).expect("read")).expect("JSON");
    assert_eq!(confidential["client"]["auth_method"], "client_secret_basic", "{confidential}");
    let confidential_refresh = confidential["refresh_token"].as_str().expect("a refresh token").to_string();

    let grant_dir = grants.to_str().expect("utf-8 path");
    let agent = start_agent(&yaml, &[("SPEAR_GRANT_DIR", grant_dir), secret_env]);
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok && said.contains("person"), "{said}");
    std::thread::sleep(Duration::from_millis(4500));
    let (ok, said) = agent.call("remote/whoami");
    assert!(ok && said.contains("person"), "after expiry: {said}");
    let second_refresh = read_grant()["refresh_token"].as_str().expect("a refresh token").to_string();
    assert_ne!(second_refresh, first_refresh, "Hydra rotated the refresh token and it was written back");
    // The confidential client renews with its secret (HTTP Basic at Hydra's token endpoint).
    let (ok, said) = agent.call("confidential/whoami");
    assert!(ok && said.contains("spear-confidential"), "{said}");
    let renewed: Value =
        serde_json::from_slice(&std::fs::read(grants.join("confidential.json")).expect("read")).expect("JSON");
    assert_ne!(renewed["refresh_token"].as_str(), Some(confidential_refresh.as_str()), "rotated with the secret");

    // The person withdraws consent at Hydra: its tokens are revoked, and the agent's next renewal
    // is the lasting refusal that names the login.
    let (status, body) = hydra_admin(
        admin,
        "DELETE",
        &format!("/admin/oauth2/auth/sessions/consent?subject=person&client={client_id}"),
        "",
    );
    assert_eq!(status, 204, "{body}");
    std::thread::sleep(Duration::from_millis(4500));
    let (ok, said) = agent.call("remote/whoami");
    assert!(!ok && said.contains("spearlet auth login --server remote"), "after revocation: {said}");

    let everything = agent.everything_said();
    for token in [&first_refresh, &second_refresh, &confidential_refresh, &client_secret] {
        assert!(!everything.contains(token.as_str()), "a refresh token or the client secret leaked");
    }
}
