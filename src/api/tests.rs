//! Every field of both resources survives YAML both ways: serde_yaml (what `convert` and `crds`
//! write) and the manifest reader (what local mode and `spearlet validate` read).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, EnvVar, EnvVarSource, ResourceRequirements, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, LabelSelectorRequirement, Time};
use k8s_openapi::jiff::Timestamp;

use super::manifest::{self, Object};
use super::*;

fn time(s: &str) -> Time {
    Time(s.parse::<Timestamp>().expect("valid timestamp"))
}

fn condition(type_: &str, status: &str) -> Condition {
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: "Valid".into(),
        message: "ok".into(),
        observed_generation: Some(3),
        last_transition_time: time("2026-11-22T00:00:00Z"),
    }
}

/// An McpServer with every field set.
fn full_server() -> McpServer {
    let mut server = McpServer::new(
        "fs",
        McpServerSpec {
            display_name: Some("Filesystem".into()),
            enabled: Some(true),
            transport: Transport::Stdio,
            stdio: Some(StdioSpec {
                image: Some("node:20-alpine".into()),
                command: "npx".into(),
                args: vec!["-y".into(), "@modelcontextprotocol/server-filesystem".into(), ".".into()],
                env: vec![
                    EnvVar { name: "PLAIN".into(), value: Some("${ENV:HOME:-/root}".into()), value_from: None },
                    EnvVar {
                        name: "TOKEN".into(),
                        value: None,
                        value_from: Some(EnvVarSource {
                            secret_key_ref: Some(SecretKeySelector {
                                name: "fs".into(),
                                key: "token".into(),
                                optional: None,
                            }),
                            ..Default::default()
                        }),
                    },
                    EnvVar {
                        name: "MODE".into(),
                        value: None,
                        value_from: Some(EnvVarSource {
                            config_map_key_ref: Some(ConfigMapKeySelector {
                                name: "fs".into(),
                                key: "mode".into(),
                                optional: Some(true),
                            }),
                            ..Default::default()
                        }),
                    },
                ],
                working_dir: Some("/data".into()),
                resources: Some(ResourceRequirements {
                    requests: Some(BTreeMap::from([("cpu".into(), Quantity("50m".into()))])),
                    limits: Some(BTreeMap::from([("memory".into(), Quantity("256Mi".into()))])),
                    ..Default::default()
                }),
                mount_service_account_token: true,
            }),
            http: None,
            tool_namespace: Some("files".into()),
            allowed_tools: vec!["read_*".into(), "list_?".into()],
            denied_tools: vec!["write_*".into()],
            allowed_resources: vec!["file:///srv/docs/*".into()],
            denied_resources: vec!["*/secret*".into()],
            allowed_prompts: vec!["*".into()],
            denied_prompts: vec!["debug_*".into()],
            approval_policy: Some(ApprovalPolicy {
                default: ApprovalMode::Always,
                tools: BTreeMap::from([("read_*".into(), ApprovalMode::Never)]),
            }),
            budgets: Some(ServerBudgets {
                tool_timeout_ms: Some(1000),
                max_concurrency: Some(2),
                max_tool_output_bytes: Some(4096),
                startup_timeout_ms: Some(60_000),
                rate_limit: Some(crate::api::RateLimit { per_minute: 600, burst: Some(20) }),
                tool_rate_limits: BTreeMap::from([(
                    "write_*".into(),
                    crate::api::RateLimit { per_minute: 6, burst: None },
                )]),
            }),
            pinning: Some(crate::api::Pinning {
                mode: crate::api::PinMode::Warn,
                tools: BTreeMap::from([("read_file".into(), format!("sha256:{}", "0f".repeat(32)))]),
            }),
        },
    );
    server.status = Some(McpServerStatus {
        observed_generation: Some(3),
        conditions: vec![condition("Accepted", "True"), condition("Ready", "Unknown")],
        tools: vec!["read_file".into()],
        tool_count: Some(1),
        server_info: Some(ServerInfo {
            name: Some("secure-filesystem-server".into()),
            version: Some("0.2.0".into()),
            instructions: Some("Use read_file.".into()),
            ..Default::default()
        }),
        last_probe_time: Some(time("2026-11-22T01:02:03Z")),
        last_error: Some("none".into()),
    });
    server
}

fn full_http_server() -> McpServer {
    McpServer::new(
        "web",
        McpServerSpec {
            transport: Transport::StreamableHttp,
            http: Some(HttpSpec {
                url: "https://mcp.example.com/mcp".into(),
                headers: vec![
                    HttpHeader { name: "X-Region".into(), value: Some("${ENV:REGION:-eu}".into()), value_from: None },
                    HttpHeader {
                        name: "X-Api-Key".into(),
                        value: None,
                        value_from: Some(HeaderValueSource {
                            secret_key_ref: SecretKeySelector {
                                name: "web".into(),
                                key: "auth".into(),
                                optional: None,
                            },
                        }),
                    },
                ],
                auth: Some(HttpAuth {
                    client_credentials: Some(ClientCredentialsAuth {
                        client_id: "spear".into(),
                        client_secret: None,
                        private_key: Some(PrivateKeySource {
                            secret_key_ref: SecretKeySelector {
                                name: "web".into(),
                                key: "key.pem".into(),
                                optional: None,
                            },
                            algorithm: JwtAlgorithm::RS256,
                        }),
                    }),
                    scopes: vec!["mcp:read".into()],
                    ..Default::default()
                }),
            }),
            allowed_tools: vec!["*".into()],
            ..Default::default()
        },
    )
}

/// An McpProfile with every field set.
fn full_profile() -> McpProfile {
    let mut profile = McpProfile::new(
        "dev",
        McpProfileSpec {
            servers: vec!["fs".into(), "web".into()],
            server_selector: Some(LabelSelector {
                match_labels: Some(BTreeMap::from([("tier".into(), "local".into())])),
                match_expressions: Some(vec![LabelSelectorRequirement {
                    key: "team".into(),
                    operator: "In".into(),
                    values: Some(vec!["a".into()]),
                }]),
            }),
            default_servers: Some(vec!["fs".into()]),
            tool_allowlist: Some(vec!["read_*".into()]),
            tool_denylist: vec!["*delete*".into()],
            resource_allowlist: Some(vec!["file:///srv/docs/public/*".into()]),
            resource_denylist: vec!["*.key".into()],
            prompt_allowlist: Some(vec!["fs/summarize".into()]),
            prompt_denylist: vec!["*admin*".into()],
            budgets: Some(ProfileBudgets {
                max_iterations: Some(4),
                max_total_tool_calls: Some(16),
                max_tool_output_bytes: Some(1024),
                tool_timeout_ms: Some(500),
            }),
            rate_limits: BTreeMap::from([(
                "mcp__fs__*".into(),
                crate::api::RateLimit { per_minute: 60, burst: Some(5) },
            )]),
            output_filters: vec![
                crate::api::OutputFilter {
                    detector: crate::api::Detector::Jwt,
                    action: crate::api::FilterAction::Block,
                },
                crate::api::OutputFilter {
                    detector: crate::api::Detector::AwsAccessKey,
                    action: crate::api::FilterAction::Redact,
                },
            ],
            chat: Some(ChatSpec {
                upstream: Some(UpstreamSpec {
                    url: "https://api.openai.com/v1".into(),
                    api_key_secret_ref: Some(SecretKeyRef { name: "openai".into(), key: "api-key".into() }),
                    model: Some("gpt-4o-mini".into()),
                }),
                tool_selection: Some(ToolSelection {
                    mode: ToolSelectionMode::Relevance,
                    max_tools: Some(12),
                    always_include: vec!["fs/read_*".into()],
                }),
            }),
            tool_choice: Some(ToolChoice::Required),
            identity: Some(IdentityGrant {
                servers: vec!["web".into()],
                audiences: vec!["https://web.example.com".into()],
                mount_service_account_token: vec!["fs".into()],
            }),
            approval: Some(crate::api::ProfileApproval {
                timeout_seconds: Some(30),
                approvers: vec![
                    crate::api::Approver { caller: Some(Default::default()), ..Default::default() },
                    crate::api::Approver {
                        webhook: Some(crate::api::WebhookApprover {
                            url: "https://approver.example/approve".into(),
                            signing_secret_ref: Some(SecretKeyRef { name: "approver-key".into(), key: "hmac".into() }),
                            include_arguments: true,
                        }),
                        ..Default::default()
                    },
                ],
            }),
        },
    );
    profile.status = Some(McpProfileStatus {
        observed_generation: Some(1),
        conditions: vec![condition("Accepted", "True"), condition("ResolvedRefs", "False")],
        resolved_servers: vec!["fs".into()],
        missing_servers: vec!["web".into()],
        tool_preview: vec!["mcp__files__read_file".into()],
    });
    profile
}

#[test]
fn every_field_round_trips_through_yaml() {
    for server in [full_server(), full_http_server()] {
        let yaml = serde_yaml::to_string(&server).expect("serializes");
        let back: McpServer = serde_yaml::from_str(&yaml).expect("deserializes");
        assert_eq!(back, server, "{yaml}");
    }
    let yaml = serde_yaml::to_string(&full_profile()).expect("serializes");
    let back: McpProfile = serde_yaml::from_str(&yaml).expect("deserializes");
    assert_eq!(back, full_profile(), "{yaml}");
}

#[test]
fn every_spec_field_round_trips_through_the_manifest_reader() {
    // The reader ignores status (the operator owns it), so compare specs.
    let servers = [full_server(), full_http_server()];
    let mut text = String::new();
    for s in &servers {
        text.push_str(&format!("---\n{}", serde_yaml::to_string(s).expect("serializes")));
    }
    text.push_str(&format!("---\n{}", serde_yaml::to_string(&full_profile()).expect("serializes")));
    let parsed = manifest::parse(&text);
    assert_eq!(parsed.problems, vec![], "{text}");
    let specs: Vec<_> = parsed.documents.iter().map(|d| d.object.clone()).collect();
    match &specs[..] {
        [Object::Server(a), Object::Server(b), Object::Profile(p)] => {
            assert_eq!(a.spec, servers[0].spec);
            assert_eq!(b.spec, servers[1].spec);
            assert_eq!(p.spec, full_profile().spec);
        }
        other => panic!("unexpected documents: {other:?}"),
    }
}

#[test]
fn fully_populated_objects_are_valid() {
    assert_eq!(full_server().validate(), vec![]);
    assert_eq!(full_http_server().validate(), vec![]);
    assert_eq!(full_profile().validate(), vec![]);
}

#[test]
fn budgets_default_as_designed() {
    let b = McpServerSpec::default().budgets();
    assert_eq!((b.tool_timeout_ms, b.max_concurrency, b.max_tool_output_bytes), (Some(30_000), Some(8), Some(65_536)));
    let p = ProfileBudgets::default();
    assert_eq!((p.max_iterations(), p.max_total_tool_calls()), (8, 32));
}
