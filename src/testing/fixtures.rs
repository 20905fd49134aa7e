//! Builders for the resource types, so a test states only the fields it is about:
//!
//! ```text
//! McpServer::test("fs").stdio("npx", ["-y", "pkg"]).image("node:22-slim").allowing(["read_*"])
//! McpServer::test("web").http("https://mcp.example.com/mcp").header("X-Tenant", "acme")
//! McpProfile::test("dev").servers(["fs", "web"]).tool_denylist(["*delete*"]).in_namespace("team-a")
//! ```
//!
//! `test(name)` is `new(name, Default::default())`: a stdio server without `spec.stdio` (invalid
//! until `stdio`/`running`/`http` is called) and a profile that allows nothing. Each method sets
//! one field (list methods append) and returns the object, so the result is the plain resource
//! type: a test can still change any field by hand for the case it is about.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, EnvVar, EnvVarSource, Pod, PodSpec, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::api::{
    ApprovalMode, ApprovalPolicy, ChatSpec, HeaderValueSource, HttpAuth, HttpHeader, IdentityGrant, McpProfile,
    McpProfileSpec, McpServer, McpServerSpec, ProfileBudgets, SecretKeyRef, ServerBudgets, StdioSpec, ToolSelection,
    Transport, UpstreamSpec,
};
use crate::testing::mcp_servers::Command;

/// No arguments, for `.stdio("server", NO_ARGS)` (an empty array literal has no item type).
pub const NO_ARGS: [&str; 0] = [];

fn strings<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> impl Iterator<Item = String> {
    items.into_iter().map(|s| s.as_ref().to_string())
}

/// The metadata setters both kinds share.
macro_rules! metadata_builders {
    ($($kind:ty),*) => {$(
        impl $kind {
            /// Sets `metadata.namespace`.
            pub fn in_namespace(mut self, namespace: &str) -> Self {
                self.metadata.namespace = Some(namespace.to_string());
                self
            }

            /// Adds the label `key: value`.
            pub fn label(mut self, key: &str, value: &str) -> Self {
                self.metadata.labels.get_or_insert_default().insert(key.to_string(), value.to_string());
                self
            }

            /// Sets `metadata.generation`, as the API server would.
            pub fn generation(mut self, generation: i64) -> Self {
                self.metadata.generation = Some(generation);
                self
            }
        }
    )*};
}

metadata_builders!(McpServer, McpProfile);

impl McpServer {
    /// A server named `name` with a default spec (stdio transport, no command, no tool allowed).
    pub fn test(name: &str) -> Self {
        McpServer::new(name, McpServerSpec::default())
    }

    /// Sets `spec.displayName`.
    pub fn display_name(mut self, name: &str) -> Self {
        self.spec.display_name = Some(name.to_string());
        self
    }

    /// Transport `stdio` running `command` with `args` (the rest of `spec.stdio` is kept).
    pub fn stdio<S: AsRef<str>>(mut self, command: &str, args: impl IntoIterator<Item = S>) -> Self {
        self.spec.transport = Transport::Stdio;
        let stdio = self.spec.stdio.get_or_insert_with(StdioSpec::default);
        stdio.command = command.to_string();
        stdio.args = strings(args).collect();
        self
    }

    /// Transport `stdio` running one of the real test servers (`crate::testing::mcp_servers`),
    /// its extra environment as literal `spec.stdio.env` values.
    pub fn running(self, command: &Command) -> Self {
        let server = self.stdio(&command.program.to_string_lossy(), &command.args);
        command.env.iter().fold(server, |server, (name, value)| server.env(name, value))
    }

    /// Sets `spec.stdio.mountServiceAccountToken: true` (the sidecar asks for the pod's API token).
    pub fn mounting_service_account_token(mut self) -> Self {
        self.spec.stdio.get_or_insert_with(StdioSpec::default).mount_service_account_token = true;
        self
    }

    /// Sets `spec.stdio.image`, the sidecar's image.
    pub fn image(mut self, image: &str) -> Self {
        self.spec.stdio.get_or_insert_with(StdioSpec::default).image = Some(image.to_string());
        self
    }

    /// Adds a literal `spec.stdio.env` entry (`${ENV:NAME}` references allowed).
    pub fn env(self, name: &str, value: &str) -> Self {
        self.env_var(EnvVar { name: name.to_string(), value: Some(value.to_string()), value_from: None })
    }

    /// Adds any `spec.stdio.env` entry (for example one from a Secret or a ConfigMap).
    pub fn env_var(mut self, var: EnvVar) -> Self {
        self.spec.stdio.get_or_insert_with(StdioSpec::default).env.push(var);
        self
    }

    /// Adds a `spec.stdio.env` entry from the key `key` of the Secret `secret`.
    pub fn secret_env(self, name: &str, secret: &str, key: &str) -> Self {
        let secret_key_ref = SecretKeySelector { name: secret.to_string(), key: key.to_string(), optional: None };
        let value_from = EnvVarSource { secret_key_ref: Some(secret_key_ref), ..EnvVarSource::default() };
        self.env_var(EnvVar { name: name.to_string(), value: None, value_from: Some(value_from) })
    }

    /// Transport `streamableHttp` at `url` (headers already added are kept).
    pub fn http(mut self, url: impl Into<String>) -> Self {
        self.spec.transport = Transport::StreamableHttp;
        self.spec.http.get_or_insert_default().url = url.into();
        self
    }

    /// Transport `streamableHttp` at `http://127.0.0.1:{port}/mcp`, where the test servers listen.
    pub fn http_at(self, port: u16) -> Self {
        self.http(format!("http://127.0.0.1:{port}/mcp"))
    }

    /// Sets `spec.http.auth`.
    pub fn auth(mut self, auth: HttpAuth) -> Self {
        self.spec.http.get_or_insert_default().auth = Some(auth);
        self
    }

    /// Adds a header with a literal value.
    pub fn header(self, name: &str, value: &str) -> Self {
        self.http_header(HttpHeader { name: name.to_string(), value: Some(value.to_string()), value_from: None })
    }

    /// Adds a header whose value is the key `key` of the Secret `secret`.
    pub fn secret_header(self, name: &str, secret: &str, key: &str) -> Self {
        let secret_key_ref = SecretKeySelector { name: secret.to_string(), key: key.to_string(), optional: None };
        self.http_header(HttpHeader {
            name: name.to_string(),
            value: None,
            value_from: Some(HeaderValueSource { secret_key_ref }),
        })
    }

    /// Adds any header, as given (also ones validation refuses).
    pub fn http_header(mut self, header: HttpHeader) -> Self {
        self.spec.http.get_or_insert_default().headers.push(header);
        self
    }

    /// Adds patterns to `spec.allowedTools`.
    pub fn allowing<S: AsRef<str>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.spec.allowed_tools.extend(strings(patterns));
        self
    }

    /// Adds patterns to `spec.deniedTools`.
    pub fn denying<S: AsRef<str>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.spec.denied_tools.extend(strings(patterns));
        self
    }

    /// Sets `spec.toolNamespace`.
    pub fn tool_namespace(mut self, namespace: &str) -> Self {
        self.spec.tool_namespace = Some(namespace.to_string());
        self
    }

    /// Sets `spec.approvalPolicy`: `default`, and a mode per tool pattern.
    pub fn approval<'a>(
        mut self,
        default: ApprovalMode,
        tools: impl IntoIterator<Item = (&'a str, ApprovalMode)>,
    ) -> Self {
        let tools = tools.into_iter().map(|(pattern, mode)| (pattern.to_string(), mode)).collect();
        self.spec.approval_policy = Some(ApprovalPolicy { default, tools });
        self
    }

    /// Sets `spec.pinning`: `mode` and a pin per (tool name, pin).
    pub fn pinning<'a>(mut self, mode: crate::api::PinMode, pins: impl IntoIterator<Item = (&'a str, String)>) -> Self {
        let tools = pins.into_iter().map(|(tool, pin)| (tool.to_string(), pin)).collect();
        self.spec.pinning = Some(crate::api::Pinning { mode, tools });
        self
    }

    /// Sets `spec.budgets`.
    pub fn budgets(mut self, budgets: ServerBudgets) -> Self {
        self.spec.budgets = Some(budgets);
        self
    }
}

impl McpProfile {
    /// A profile named `name` with a default spec (no server allowed: invalid until
    /// `servers` or a selector is set).
    pub fn test(name: &str) -> Self {
        McpProfile::new(name, McpProfileSpec::default())
    }

    /// Adds names to `spec.servers`.
    pub fn servers<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.spec.servers.extend(strings(names));
        self
    }

    /// Adds `key: value` to `spec.serverSelector.matchLabels`.
    pub fn selecting(mut self, key: &str, value: &str) -> Self {
        let selector = self.spec.server_selector.get_or_insert_with(LabelSelector::default);
        selector.match_labels.get_or_insert_with(BTreeMap::new).insert(key.to_string(), value.to_string());
        self
    }

    /// Sets `spec.serverSelector` as given (`LabelSelector::default()` selects every server).
    pub fn server_selector(mut self, selector: LabelSelector) -> Self {
        self.spec.server_selector = Some(selector);
        self
    }

    /// Sets `spec.defaultServers` (an empty list means none unless a request asks).
    pub fn default_servers<S: AsRef<str>>(mut self, names: impl IntoIterator<Item = S>) -> Self {
        self.spec.default_servers = Some(strings(names).collect());
        self
    }

    /// Sets `spec.toolAllowlist` (an empty list exposes no tool).
    pub fn tool_allowlist<S: AsRef<str>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.spec.tool_allowlist = Some(strings(patterns).collect());
        self
    }

    /// Adds patterns to `spec.toolDenylist`.
    pub fn tool_denylist<S: AsRef<str>>(mut self, patterns: impl IntoIterator<Item = S>) -> Self {
        self.spec.tool_denylist.extend(strings(patterns));
        self
    }

    /// Sets `spec.budgets`.
    pub fn budgets(mut self, budgets: ProfileBudgets) -> Self {
        self.spec.budgets = Some(budgets);
        self
    }

    /// Sets `spec.chat.upstream.url` (the rest of the upstream is kept).
    pub fn upstream(mut self, url: impl Into<String>) -> Self {
        self.upstream_spec().url = url.into();
        self
    }

    fn upstream_spec(&mut self) -> &mut UpstreamSpec {
        self.spec.chat.get_or_insert_with(ChatSpec::default).upstream.get_or_insert_with(UpstreamSpec::default)
    }

    /// Sets `spec.chat.toolSelection`.
    pub fn tool_selection(mut self, selection: ToolSelection) -> Self {
        self.spec.chat.get_or_insert_with(ChatSpec::default).tool_selection = Some(selection);
        self
    }

    /// Sets `spec.chat.upstream.apiKeySecretRef` to the key `key` of the Secret `secret`.
    pub fn upstream_key(mut self, secret: &str, key: &str) -> Self {
        self.upstream_spec().api_key_secret_ref = Some(SecretKeyRef { name: secret.to_string(), key: key.to_string() });
        self
    }

    /// Adds `servers` and `audiences` to `spec.identity`: those servers may receive a projected
    /// token of the pod's ServiceAccount with those audiences.
    pub fn granting_tokens<S: AsRef<str>, A: AsRef<str>>(
        mut self,
        servers: impl IntoIterator<Item = S>,
        audiences: impl IntoIterator<Item = A>,
    ) -> Self {
        let identity = self.spec.identity.get_or_insert_with(IdentityGrant::default);
        identity.servers.extend(strings(servers));
        identity.audiences.extend(strings(audiences));
        self
    }

    /// Adds `servers` to `spec.identity.mountServiceAccountToken`.
    pub fn granting_token_mount<S: AsRef<str>>(mut self, servers: impl IntoIterator<Item = S>) -> Self {
        let identity = self.spec.identity.get_or_insert_with(IdentityGrant::default);
        identity.mount_service_account_token.extend(strings(servers));
        self
    }

    /// Sets `spec.chat.upstream.model`.
    pub fn upstream_model(mut self, model: &str) -> Self {
        self.upstream_spec().model = Some(model.to_string());
        self
    }
}

/// The `admission.k8s.io/v1` AdmissionReview the API server sends for creating `pod` in
/// `namespace` as `username`, as JSON bytes (what a webhook reads from the wire).
pub fn pod_create_review(uid: &str, namespace: &str, username: &str, pod: &Pod) -> Vec<u8> {
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": { "group": "", "version": "v1", "kind": "Pod" },
            "resource": { "group": "", "version": "v1", "resource": "pods" },
            "namespace": namespace,
            "operation": "CREATE",
            "userInfo": { "username": username },
            "object": pod,
        },
    });
    serde_json::to_vec(&review).expect("a JSON value serializes")
}

/// A workload pod as the webhook sees it: one `app` container (`example.com/app:1`) and
/// `annotations` (the profile annotation, usually). No name: set `metadata.name` or
/// `generate_name` for the case at hand.
pub fn app_pod(annotations: &[(&str, &str)]) -> Pod {
    Pod {
        metadata: ObjectMeta {
            annotations: Some(annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "app".into(),
                image: Some("example.com/app:1".into()),
                ..Container::default()
            }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HttpSpec, UpstreamSpec};

    #[test]
    fn builders_set_exactly_the_fields_they_name() {
        let server = McpServer::test("fs")
            .image("node:22-slim")
            .stdio("npx", ["-y", "pkg"])
            .env("A", "1")
            .allowing(["read_*"])
            .allowing(["list_*"])
            .denying(["read_secret*"])
            .in_namespace("team-a")
            .label("tier", "local");
        let mut expected = McpServer::new(
            "fs",
            McpServerSpec {
                transport: Transport::Stdio,
                stdio: Some(StdioSpec {
                    image: Some("node:22-slim".into()),
                    command: "npx".into(),
                    args: vec!["-y".into(), "pkg".into()],
                    env: vec![EnvVar { name: "A".into(), value: Some("1".into()), value_from: None }],
                    ..StdioSpec::default()
                }),
                allowed_tools: vec!["read_*".into(), "list_*".into()],
                denied_tools: vec!["read_secret*".into()],
                ..McpServerSpec::default()
            },
        );
        expected.metadata.namespace = Some("team-a".into());
        expected.metadata.labels = Some(BTreeMap::from([("tier".into(), "local".into())]));
        assert_eq!(server, expected);

        let web = McpServer::test("web").header("X-Tenant", "acme").http("https://mcp.example.com/mcp");
        assert_eq!(web.spec.transport, Transport::StreamableHttp);
        assert_eq!(
            web.spec.http,
            Some(HttpSpec {
                url: "https://mcp.example.com/mcp".into(),
                headers: vec![HttpHeader { name: "X-Tenant".into(), value: Some("acme".into()), value_from: None }],
                auth: None,
            })
        );

        let profile = McpProfile::test("dev").servers(["fs"]).upstream_key("llm", "key").upstream("https://llm/v1");
        let mut expected = McpProfile::new("dev", McpProfileSpec { servers: vec!["fs".into()], ..Default::default() });
        expected.spec.chat = Some(ChatSpec {
            upstream: Some(UpstreamSpec {
                url: "https://llm/v1".into(),
                api_key_secret_ref: Some(SecretKeyRef { name: "llm".into(), key: "key".into() }),
                model: None,
            }),
            tool_selection: None,
        });
        assert_eq!(profile, expected);
    }
}
