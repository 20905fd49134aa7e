//! The pod's identity as the credential, with real service-account tokens: issued by the test
//! control plane's TokenRequest API (what the kubelet asks for a projected token), verified by
//! the test authorization server and MCP server (`tests/servers/oauth_server.py`) against the
//! control plane's JWKS (`/openid/v1/jwks`), as a remote server trusting the cluster would.
//! `spearlet serve` reads the tokens from `SPEAR_AUTH_TOKEN_DIR` (in a pod: the projected volume
//! the webhook mounts), and a rotated token is read on the next use.

use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{Api, PostParams};
use spear::testing::control_plane::ControlPlane;
use spear::testing::mcp_servers;

use crate::oauth::{admin, admin_post, server_yaml, start_agent, start_oauth_server};

/// The test control plane's `--service-account-issuer`.
const ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

#[tokio::test]
async fn service_account_tokens_are_exchanged_or_sent_and_verified_against_the_cluster_jwks() {
    let ns = ControlPlane::shared().namespace("oauth-sa").await;
    let accounts: Api<ServiceAccount> = ns.api();
    let account = ServiceAccount {
        metadata: kube::core::ObjectMeta { name: Some("workload".into()), ..Default::default() },
        ..Default::default()
    };
    accounts.create(&PostParams::default(), &account).await.expect("create the service account");
    let jwks = ns
        .client
        .request_text(axum::http::Request::get("/openid/v1/jwks").body(Vec::new()).expect("request"))
        .await
        .expect("the control plane serves its JWKS");

    let work = tempfile::tempdir().expect("tempdir");
    let jwks_file = work.path().join("jwks.json");
    std::fs::write(&jwks_file, &jwks).expect("write jwks");
    let tokens = work.path().join("tokens");
    std::fs::create_dir(&tokens).expect("mkdir");

    let port = mcp_servers::free_port();
    let direct_audience = format!("http://127.0.0.1:{port}/mcp");
    let jwks_path = jwks_file.to_string_lossy().into_owned();
    let _server = tokio::task::spawn_blocking(move || {
        start_oauth_server(
            port,
            &[
                "--client-secret",
                "unused",
                "--jwks",
                &jwks_path,
                "--sa-issuer",
                ISSUER,
                "--sa-audience",
                "https://as.test",
                "--sa-direct-audience",
                &format!("http://127.0.0.1:{port}/mcp"),
            ],
        )
    })
    .await
    .expect("join");

    // One token per server, each with its audience: what the webhook's projected volume holds.
    let exchanged = ns.service_account_token("workload", "https://as.test").await;
    let direct = ns.service_account_token("workload", &direct_audience).await;
    std::fs::write(tokens.join("exchanged"), &exchanged).expect("write token");
    std::fs::write(tokens.join("direct"), &direct).expect("write token");
    // A token for another audience is refused by the server: the agent reports it.
    let wrong = ns.service_account_token("workload", "https://elsewhere.test").await;
    std::fs::write(tokens.join("wrong"), &wrong).expect("write token");

    let mut yaml = server_yaml(
        "exchanged",
        port,
        &format!(
            "    auth:\n      issuer: http://127.0.0.1:{port}\n      tokenExchange: {{audience: \"https://as.test\", clientId: spear-exchange}}\n"
        ),
    );
    yaml.push_str(&server_yaml(
        "direct",
        port,
        &format!("    auth:\n      serviceAccountToken: {{audience: \"{direct_audience}\"}}\n"),
    ));
    yaml.push_str(&server_yaml(
        "wrong",
        port,
        "    auth:\n      serviceAccountToken: {audience: \"https://elsewhere.test\"}\n",
    ));
    yaml.push_str(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [exchanged, direct, wrong]\n",
    );
    let token_dir = tokens.to_string_lossy().into_owned();
    let subject = format!("system:serviceaccount:{}:workload", ns.name);
    let agent = tokio::task::spawn_blocking(move || {
        let agent = start_agent(&yaml, &[("SPEAR_AUTH_TOKEN_DIR", &token_dir)]);
        let (ok, said) = agent.call("exchanged/whoami");
        assert!(ok && said.contains(&subject), "token exchange: {said}");
        let (ok, said) = agent.call("direct/whoami");
        assert!(ok && said.contains(&subject), "the service-account token as the bearer: {said}");
        let (ok, said) = agent.call("wrong/whoami");
        assert!(!ok && said.contains("rejected the pod's service-account token"), "{said}");

        let requests = admin(port, "/admin/requests");
        let requests = requests.as_array().expect("requests");
        assert_eq!(requests.len(), 1, "{requests:?}");
        let request = &requests[0];
        assert_eq!(request["grant_type"], "urn:ietf:params:oauth:grant-type:token-exchange", "{request}");
        assert_eq!(request["status"], 200, "{request}");
        assert_eq!(request["subject"], subject.as_str(), "{request}");
        assert_eq!(request["resource"], format!("http://127.0.0.1:{port}/mcp"), "{request}");
        let issued = admin(port, "/admin/tokens");
        assert!(issued["direct_subjects"].as_array().is_some_and(|s| s.iter().any(|x| x == subject.as_str())));
        agent
    })
    .await
    .expect("join");

    // The kubelet rotates the token: the agent reads the file on every exchange. A token the
    // authorization server refuses (another audience) fails the exchange; the next rotation
    // (a good token) works again.
    let new_token = ns.service_account_token("workload", "https://as.test").await;
    assert_ne!(new_token, exchanged);
    let (rotated_file, wrong_again) = (tokens.join("exchanged"), wrong.clone());
    let rotated = new_token.clone();
    let everything = tokio::task::spawn_blocking(move || {
        std::fs::write(&rotated_file, &wrong_again).expect("rotate");
        admin_post(port, "/admin/revoke");
        let (ok, said) = agent.call("exchanged/whoami");
        assert!(!ok && said.contains("invalid_grant"), "a refused subject token: {said}");
        std::fs::write(&rotated_file, &rotated).expect("rotate");
        let (ok, said) = agent.call("exchanged/whoami");
        assert!(ok, "after the next rotation: {said}");
        let requests = admin(port, "/admin/requests");
        let statuses: Vec<i64> =
            requests.as_array().expect("requests").iter().filter_map(|r| r["status"].as_i64()).collect();
        assert_eq!(statuses, [200, 400, 200], "{requests}");
        (agent.everything_said(), admin(port, "/admin/tokens"))
    })
    .await
    .expect("join");
    let (said, issued) = everything;
    for token in [&exchanged, &direct, &wrong, &new_token] {
        assert!(!said.contains(token.as_str()), "a service-account token leaked");
    }
    for token in issued["tokens"].as_array().expect("tokens") {
        assert!(!said.contains(token.as_str().expect("token")), "an access token leaked");
    }
}
