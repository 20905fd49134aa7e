use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

use super::host_allowed;
use super::model::{self, Health, InjectedPod, InjectedPods, Inputs, Replica};
use super::page;
use crate::api::{McpProfile, McpProfileStatus, McpServer, McpServerStatus};

const NS: &str = "team-a";
const HOSTILE: &str = "<script>document.title='pwned'</script><img src=x onerror=alert(1)>";

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: Time(Timestamp::UNIX_EPOCH),
        observed_generation: Some(1),
    }
}

fn with_status(server: McpServer, status: McpServerStatus) -> Arc<McpServer> {
    let mut server = server.in_namespace(NS).generation(1);
    server.status = Some(McpServerStatus { observed_generation: Some(1), ..status });
    Arc::new(server)
}

/// A probed http server listing `tools`.
fn ready(name: &str, tools: &[&str]) -> Arc<McpServer> {
    let server = McpServer::test(name).http("http://mcp.example:8080/mcp").allowing(["*"]).denying(["delete*"]);
    with_status(
        server,
        McpServerStatus {
            conditions: vec![
                condition("Accepted", "True", "Valid", "valid"),
                condition("Ready", "True", "ProbeSucceeded", "listed"),
            ],
            tools: tools.iter().map(|t| t.to_string()).collect(),
            tool_count: Some(u32::try_from(tools.len()).expect("few tools")),
            ..McpServerStatus::default()
        },
    )
}

/// An http server whose probe failed with `error`.
fn failing(name: &str, display_name: &str, error: &str) -> Arc<McpServer> {
    let server = McpServer::test(name).display_name(display_name).http("http://down.example/mcp").allowing(["*"]);
    with_status(
        server,
        McpServerStatus {
            conditions: vec![
                condition("Accepted", "True", "Valid", "valid"),
                condition("Ready", "False", "ProbeFailed", error),
            ],
            last_error: Some(error.to_string()),
            ..McpServerStatus::default()
        },
    )
}

fn profile(name: &str, servers: &[&str]) -> Arc<McpProfile> {
    let mut profile = McpProfile::test(name).servers(servers.iter().copied()).in_namespace(NS).generation(1);
    profile.status = Some(McpProfileStatus {
        observed_generation: Some(1),
        conditions: vec![condition("Accepted", "True", "Valid", "valid")],
        resolved_servers: servers.iter().map(|s| s.to_string()).collect(),
        ..McpProfileStatus::default()
    });
    Arc::new(profile)
}

fn namespace(name: &str, enabled: bool) -> Arc<Namespace> {
    let labels = enabled.then(|| BTreeMap::from([("mcp.spear.dev/injection".to_string(), "enabled".to_string())]));
    Arc::new(Namespace {
        metadata: ObjectMeta { name: Some(name.into()), labels, ..ObjectMeta::default() },
        ..Namespace::default()
    })
}

fn pod_meta(name: &str, annotations: &[(&str, &str)]) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        ..ObjectMeta::default()
    }
}

fn inputs() -> Inputs {
    Inputs {
        servers: vec![
            ready("github", &["search_issues", "delete_repo"]),
            failing("broken", "Broken", "connection refused"),
        ],
        profiles: vec![profile("developer", &["github", "broken", "gone"])],
        namespaces: vec![namespace(NS, true), namespace("quiet", true), namespace("other", false)],
        pods: vec![InjectedPod {
            namespace: NS.into(),
            name: "app-7d9f".into(),
            profile: "developer".into(),
            created: None,
            terminating: false,
        }],
        replica: Replica { identity: "spear-operator-0".into(), leader: true },
        problems: Vec::new(),
    }
}

#[test]
fn servers_show_health_tool_count_and_the_failing_servers_error() {
    let view = model::build(inputs());
    let names: Vec<&str> = view.namespaces.iter().map(|n| n.name.as_str()).collect();
    assert_eq!(names, ["quiet", NS], "namespaces with objects or injection enabled, by name; 'other' has neither");
    let ns = &view.namespaces[1];
    assert!(ns.injection_enabled);
    let by_name = |name: &str| ns.servers.iter().find(|s| s.name == name).expect("listed");
    let github = by_name("github");
    assert_eq!((github.health, github.tool_count), (Health::Ready, Some(2)));
    let broken = by_name("broken");
    assert_eq!(broken.health, Health::Failing);
    assert_eq!(broken.last_error.as_deref(), Some("connection refused"));
    assert_eq!(ns.pods[0].profile, "developer");
}

#[test]
fn health_follows_the_conditions_of_the_current_generation() {
    let stdio = with_status(
        McpServer::test("fs").stdio("npx", ["x"]).allowing(["*"]),
        McpServerStatus { conditions: vec![condition("Accepted", "True", "Valid", "")], ..McpServerStatus::default() },
    );
    let rejected = with_status(
        McpServer::test("bad").stdio("npx", ["x"]).allowing(["*"]),
        McpServerStatus {
            conditions: vec![condition("Accepted", "False", "Invalid", "spec.stdio.command: a shell line")],
            ..McpServerStatus::default()
        },
    );
    let skipped = with_status(
        McpServer::test("far").http("http://far.example/mcp").allowing(["*"]),
        McpServerStatus {
            conditions: vec![condition("Ready", "Unknown", "ProbeSkipped", "not labelled")],
            ..McpServerStatus::default()
        },
    );
    // Status of generation 1, spec at generation 2: not yet reconciled.
    let mut stale = McpServer::clone(&ready("new", &["a"]));
    stale.metadata.generation = Some(2);
    let view = model::build(Inputs { servers: vec![stdio, rejected, skipped, Arc::new(stale)], ..Inputs::default() });
    let health: BTreeMap<&str, Health> =
        view.namespaces[0].servers.iter().map(|s| (s.name.as_str(), s.health)).collect();
    assert_eq!(
        health,
        BTreeMap::from([
            ("bad", Health::Rejected),
            ("far", Health::NotProbed),
            ("fs", Health::Sidecar),
            ("new", Health::Pending)
        ])
    );
}

#[test]
fn a_profile_carries_spearlet_explains_decision_log_over_the_probed_tool_names() {
    let mut inputs = inputs();
    inputs.servers.push(ready("unrelated", &["x"]));
    let view = model::build(inputs);
    let developer = &view.namespaces[1].profiles[0];
    let explained = developer.explain.as_ref().expect("the profile compiles");
    let excluded = explained["excluded"].as_array().expect("a decision log");
    let reasons: Vec<String> = excluded
        .iter()
        .map(|d| {
            format!(
                "{}/{}: {}",
                d["server"].as_str().unwrap_or_default(),
                d["tool"].as_str().unwrap_or("-"),
                d["reason"].as_str().unwrap_or_default()
            )
        })
        .collect();
    assert!(reasons.contains(&"github/delete_repo: denied_by:server".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"gone/-: unknown_server".to_string()), "{reasons:?}");
    // The namespace's other servers are counted, not listed.
    assert!(!reasons.iter().any(|r| r.ends_with("not_in_profile")), "{reasons:?}");
    assert_eq!(explained["notInProfile"], 1);
    let github =
        explained["servers"].as_array().expect("servers").iter().find(|s| s["id"] == "github").expect("github");
    assert_eq!(github["tools"][0]["name"], "mcp__github__search_issues");
    assert_eq!(explained["toolsListed"], false, "broken has no tool list, so the log says it decided on patterns");
}

#[test]
fn a_profile_that_does_not_compile_says_why() {
    let mut broken = McpProfile::clone(&profile("bad", &["github"]));
    broken.spec.tool_allowlist = Some(vec!["[".into()]);
    let view = model::build(Inputs {
        servers: vec![ready("github", &["a"])],
        profiles: vec![Arc::new(broken)],
        ..Inputs::default()
    });
    let error = view.namespaces[0].profiles[0].explain.as_ref().expect_err("invalid patterns");
    assert!(error.contains("bad"), "{error}");
}

#[test]
fn every_untrusted_value_is_escaped_and_the_page_has_no_script() {
    let mut inputs = inputs();
    inputs.servers.push(failing("evil", HOSTILE, HOSTILE));
    // A tool name is whatever the MCP server lists.
    inputs.servers.push(ready("lister", &["ok", HOSTILE]));
    inputs.problems.push(format!("McpServer: the watch is failing ({HOSTILE})"));
    let html = page::render(&model::build(inputs));
    assert!(!html.to_ascii_lowercase().contains("<script"), "no script element, escaped or not:\n{html}");
    assert!(!html.contains("<img"), "no markup from a value");
    assert!(html.contains("&lt;script&gt;document.title="), "the value is shown as text");
    assert!(html.contains("connection refused"), "the failing server's error is on the page");
    assert!(html.contains(r#"<link rel="stylesheet" href="/admin.css">"#));
    assert!(!html.contains("style="), "no inline style (the CSP forbids it)");
}

#[test]
fn the_policy_allows_no_script_and_no_other_origin() {
    let csp = page::CONTENT_SECURITY_POLICY;
    assert!(csp.starts_with("default-src 'none';"), "{csp}");
    assert!(!csp.contains("script-src") && !csp.contains("unsafe"), "{csp}");
    assert!(csp.contains("frame-ancestors 'none'") && csp.contains("form-action 'none'"), "{csp}");
    assert!(!page::STYLESHEET.contains("@import") && !page::STYLESHEET.contains("url("), "no external font or image");
}

#[test]
fn injected_pods_keep_only_what_the_webhook_injected() {
    let injected = [("mcp.spear.dev/injected", "h1"), ("mcp.spear.dev/profile", "developer")];
    let mut pods = InjectedPods::default();
    pods.init();
    pods.init_apply(&pod_meta("a", &injected));
    pods.init_apply(&pod_meta("plain", &[("other", "x")]));
    assert!(!pods.is_listed() && pods.pods().is_empty(), "nothing until the list is complete");
    pods.init_done();
    assert_eq!(pods.pods().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["a"]);
    pods.apply(&pod_meta("b", &injected));
    // The annotation gone (a pod is never un-injected, but a replaced object may lack it).
    pods.apply(&pod_meta("a", &[]));
    pods.apply(&pod_meta("plain2", &[]));
    assert_eq!(pods.pods().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["b"]);
    pods.delete(&pod_meta("b", &injected));
    assert!(pods.pods().is_empty());
    // A re-list replaces the set once complete.
    pods.apply(&pod_meta("c", &injected));
    pods.init();
    pods.init_apply(&pod_meta("d", &injected));
    assert_eq!(pods.pods().len(), 1, "the old set serves during the re-list");
    pods.init_done();
    assert_eq!(pods.pods().iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["d"]);
}

#[test]
fn hosts_are_matched_without_port_and_case() {
    let allowed: Vec<String> = super::DEFAULT_ALLOWED_HOSTS.iter().map(|h| h.to_string()).collect();
    for host in ["localhost", "LOCALHOST:8090", "127.0.0.1:8090", "[::1]:8090", "::1"] {
        assert!(host_allowed(host, &allowed), "{host}");
    }
    for host in ["evil.example", "evil.example:8090", "127.0.0.1.evil.example", "", "[::2]:1", "localhost.evil"] {
        assert!(!host_allowed(host, &allowed), "{host}");
    }
    let service = vec!["spear-operator-admin-view.spear-system.svc".to_string()];
    assert!(host_allowed("spear-operator-admin-view.spear-system.svc:8090", &service));
}
