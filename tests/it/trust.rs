//! `--extra-ca-file`: a remote MCP server and its authorization server behind a private CA
//! (`tests/servers/oauth_server.py --tls-ca`, HTTPS with a certificate that CA issued). Without
//! that CA the agent refuses the server with a TLS error that names the flag; with the wrong CA
//! in the file as well; once the file holds the right one (rewritten in place, as the kubelet
//! rotates a ConfigMap volume) the agent renews its token at the HTTPS token endpoint and calls
//! the tool, without a restart. A file that is no CA bundle stops the start, naming it.

use std::net::TcpStream;
use std::process::Command;
use std::time::{Duration, Instant};

use spear::testing::mcp_servers;
use spear::testing::test_ca::TestCa;

use crate::oauth::{Agent, server_yaml, start_agent};

/// The test server over HTTPS on `port`, its certificate issued by `ca`.
fn start_https_server(port: u16, ca: &TestCa, dir: &std::path::Path) -> crate::oauth::Killed {
    std::fs::write(dir.join("ca.crt"), ca.cert_pem()).expect("write");
    std::fs::write(dir.join("ca.key"), ca.key_pem()).expect("write");
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers/oauth_server.py");
    let child = Command::new(mcp_servers::python())
        .arg(script)
        .args(["--port", &port.to_string(), "--client-secret", "s3cret", "--tls-ca"])
        .arg(dir)
        .args(["--public-url", &format!("https://127.0.0.1:{port}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("the OAuth test server starts");
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "the HTTPS test server did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
    crate::oauth::Killed(child)
}

fn call_until(agent: &Agent, done: impl Fn(bool, &str) -> bool) -> (bool, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (ok, said) = agent.call("remote/whoami");
        if done(ok, &said) || Instant::now() > deadline {
            return (ok, said);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

fn reconnect(agent: &Agent) {
    let out = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["reconnect", "remote", "--admin-addr", &format!("127.0.0.1:{}", agent.admin)])
        .output()
        .expect("spearlet reconnect");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn a_private_ca_in_the_extra_ca_file_is_trusted_for_the_server_and_its_token_endpoint_and_follows_rotation() {
    let work = tempfile::tempdir().expect("tempdir");
    let (private, other) = (TestCa::new("spear-test-private"), TestCa::new("spear-test-other"));
    let port = mcp_servers::free_port();
    let server_dir = work.path().join("server");
    std::fs::create_dir(&server_dir).expect("mkdir");
    let _server = start_https_server(port, &private, &server_dir);

    let auth = format!(
        "    auth:\n      issuer: https://127.0.0.1:{port}\n      clientCredentials:\n        clientId: spear\n        \
         clientSecret: {{secretKeyRef: {{name: s, key: k}}}}\n"
    );
    let mut yaml = server_yaml("remote", port, &auth).replace("url: http://", "url: https://");
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [remote]\n",
    );
    let secret = ("SPEAR_SECRET_REMOTE_AUTH_CLIENTSECRET", "s3cret");

    // The system's roots only: the server's certificate is refused, and the message says how
    // to trust a private CA.
    let agent = start_agent(&yaml, &[secret]);
    let (ok, said) = call_until(&agent, |_, said| said.contains("TLS"));
    assert!(!ok && said.contains("TLS handshake failed") && said.contains("--extra-ca-file"), "{said}");
    drop(agent);

    // Another CA in the file: still refused.
    let bundle = work.path().join("bundle.pem");
    std::fs::write(&bundle, other.cert_pem()).expect("write");
    let bundle_text = bundle.to_str().expect("UTF-8 path");
    let agent = start_agent(&yaml, &[secret, ("SPEAR_EXTRA_CA_FILE", bundle_text)]);
    let (ok, said) = call_until(&agent, |_, said| said.contains("TLS"));
    assert!(!ok && said.contains("UnknownIssuer"), "{said}");

    // The bundle rotates in place to hold both CAs: the next connection trusts it, for the MCP
    // server and for the token endpoint the client credentials go to.
    std::fs::write(&bundle, format!("{}{}", other.cert_pem(), private.cert_pem())).expect("write");
    reconnect(&agent);
    let (ok, said) = call_until(&agent, |ok, _| ok);
    assert!(ok && said.contains("spear"), "with the private CA trusted: {said}");
    let log = std::fs::read_to_string(&agent.log).expect("log");
    assert!(log.contains("--extra-ca-file changed"), "the agent says it read the new bundle");
    assert!(!agent.everything_said().contains("s3cret"), "the client secret leaked");
}

#[test]
fn a_file_that_is_no_ca_bundle_stops_the_start_and_names_the_file() {
    let work = tempfile::tempdir().expect("tempdir");
    let key = work.path().join("key.pem");
    std::fs::write(&key, TestCa::new("oops").key_pem()).expect("write");
    let registry = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/registry");
    for program in ["spearlet", "spear-operator"] {
        let binary =
            if program == "spearlet" { env!("CARGO_BIN_EXE_spearlet") } else { env!("CARGO_BIN_EXE_spear-operator") };
        let mut command = Command::new(binary);
        command.arg("--extra-ca-file").arg(&key);
        if program == "spearlet" {
            command.arg("serve").arg("--registry-dir").arg(&registry);
        } else {
            command.args(["crds"]);
        }
        let out = command.output().expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{program}: {stderr}");
        assert!(
            stderr.contains(&format!("--extra-ca-file {} holds a PRIVATE KEY block", key.display()))
                && !stderr.contains("BEGIN PRIVATE KEY"),
            "{program}: {stderr}"
        );
    }
}
