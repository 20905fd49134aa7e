//! The design's file registry (one server per TOML or JSON file) into an McpServer.
//!
//! ```text
//! server.toml ──serde (deny_unknown_fields)──▶ DesignServer ──map──▶ McpServer
//! ```
//!
//! Every key of the design's records maps to a field or is refused with the reason:
//! - `version`: 1, the only version there is; anything else is refused.
//! - `tool_namespace`: the design's names are `<namespace>.<tool>` with `mcp.<server_id>` by
//!   default; spear's are `mcp__<toolNamespace>__<tool>`. Empty or `mcp.<server_id>` is the
//!   default (no field); `mcp.<x>` or `<x>` becomes `toolNamespace: x` when it is a valid one.
//! - `approval_policy`: `never` and `always` as they are, server-wide (a string) or per tool (a
//!   table with `default` and `tools`); the design's third mode, `policy` (decided by an external
//!   policy engine), has no equivalent and is refused naming `destructiveHint`, the nearest.
//! - `http.auth_ref`: the credential's name in a secret store; it becomes the `Authorization`
//!   header from that Secret (`name` or `name/key`, key `authorization` by default).
//! - `transport = "http_sse_legacy"`: refused, see [`sse_refusal`].

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, SecretKeySelector};
use serde::Deserialize;

use super::{ConvertError, Converted, is_tool_namespace, names_for, sse_refusal};
use crate::api::validate::is_dns1123_subdomain;
use crate::api::{
    ApprovalMode, ApprovalPolicy, HeaderValueSource, HttpHeader, HttpSpec, McpServer, McpServerSpec, ServerBudgets,
    StdioSpec, Transport,
};

/// The design's registry record, one server per file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct DesignServer {
    #[serde(default)]
    version: Option<u32>,
    server_id: String,
    #[serde(default)]
    display_name: Option<String>,
    /// `enabled = false` keeps the server registered but out of use (`spec.enabled`).
    #[serde(default)]
    enabled: Option<bool>,
    transport: String,
    #[serde(default)]
    tool_namespace: Option<String>,
    #[serde(default)]
    allowed_tools: Vec<String>,
    #[serde(default)]
    denied_tools: Vec<String>,
    #[serde(default)]
    allowed_resources: Vec<String>,
    #[serde(default)]
    denied_resources: Vec<String>,
    #[serde(default)]
    allowed_prompts: Vec<String>,
    #[serde(default)]
    denied_prompts: Vec<String>,
    #[serde(default)]
    approval_policy: Option<DesignApproval>,
    #[serde(default)]
    stdio: Option<DesignStdio>,
    #[serde(default)]
    http: Option<DesignHttp>,
    #[serde(default)]
    budgets: Option<DesignBudgets>,
}

/// `approval_policy = "always"`, or `[approval_policy]` with `default` and `tools`.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum DesignApproval {
    Server(String),
    PerTool {
        #[serde(default)]
        default: Option<String>,
        #[serde(default)]
        tools: BTreeMap<String, String>,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DesignStdio {
    command: String,
    #[serde(default)]
    args: Vec<String>,
    /// Literal values, by name.
    #[serde(default)]
    env: BTreeMap<String, String>,
    /// Names passed through from the agent's environment.
    #[serde(default)]
    env_from: Vec<String>,
    #[serde(default)]
    cwd: Option<String>,
    #[serde(default)]
    image: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DesignHttp {
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    #[serde(default)]
    auth_ref: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DesignBudgets {
    #[serde(default)]
    tool_timeout_ms: Option<u32>,
    #[serde(default)]
    max_concurrency: Option<u32>,
    #[serde(default)]
    max_tool_output_bytes: Option<u32>,
}

/// Maps one record; validation is the caller's.
pub(super) fn convert(design: DesignServer) -> Result<Converted, ConvertError> {
    let mut notes = Vec::new();
    if let Some(version) = design.version.filter(|v| *v != 1) {
        return Err(ConvertError::unsupported(
            "version",
            format!("version {version} is unknown; the design's file registry has version 1 only"),
        ));
    }
    let transport = match design.transport.as_str() {
        "stdio" => Transport::Stdio,
        "streamable_http" | "streamableHttp" | "streamable-http" | "http" => Transport::StreamableHttp,
        sse if super::is_sse(sse) => return Err(ConvertError::unsupported("transport", sse_refusal())),
        other => {
            return Err(ConvertError::unsupported(
                "transport",
                format!("'{other}' is not a transport; use stdio or streamable_http"),
            ));
        }
    };
    let (name, mut tool_namespace) = names_for(&design.server_id, "server_id")?;
    if let Some(ns) = &design.tool_namespace {
        tool_namespace = namespace(ns, &design.server_id, &name, &mut notes)?;
    }
    let approval_policy = design.approval_policy.map(approval).transpose()?;
    let stdio = design.stdio.map(stdio_spec).transpose()?;
    let http = design.http.map(|h| http_spec(h, &name, &mut notes)).transpose()?;
    let budgets = design.budgets.map(|b| ServerBudgets {
        tool_timeout_ms: b.tool_timeout_ms,
        max_concurrency: b.max_concurrency,
        max_tool_output_bytes: b.max_tool_output_bytes,
        ..Default::default()
    });
    let server = McpServer::new(
        &name,
        McpServerSpec {
            display_name: design.display_name,
            enabled: design.enabled,
            transport,
            stdio,
            http,
            tool_namespace,
            allowed_tools: design.allowed_tools,
            denied_tools: design.denied_tools,
            allowed_resources: design.allowed_resources,
            denied_resources: design.denied_resources,
            allowed_prompts: design.allowed_prompts,
            denied_prompts: design.denied_prompts,
            approval_policy,
            budgets,
            pinning: None,
        },
    );
    Ok(Converted { server, notes })
}

/// The design's `tool_namespace` as a `toolNamespace` (None: the default, `metadata.name`).
fn namespace(ns: &str, id: &str, name: &str, notes: &mut Vec<String>) -> Result<Option<String>, ConvertError> {
    let bare = ns.strip_prefix("mcp.").unwrap_or(ns);
    if bare.is_empty() || bare == name {
        return Ok(None);
    }
    if bare == id {
        // The id itself: kept when it differs from the normalized name, as for an unset namespace.
        return Ok(names_for(id, "server_id")?.1);
    }
    if !is_tool_namespace(bare) {
        return Err(ConvertError::unsupported(
            "tool_namespace",
            format!(
                "'{ns}' cannot be a tool namespace: spear's tool names are mcp__<namespace>__<tool> with 1 to 32 \
                 letters, digits, '-' or '_' (no '.', no '__'); write one such as '{}'",
                super::normalize_name(bare).replace('-', "_")
            ),
        ));
    }
    notes.push(format!("tool names are mcp__{bare}__<tool> (the design named them {ns}.<tool>)"));
    Ok(Some(bare.to_string()))
}

fn mode(value: &str, key: &str) -> Result<ApprovalMode, ConvertError> {
    match value {
        "never" => Ok(ApprovalMode::Never),
        "always" => Ok(ApprovalMode::Always),
        "destructiveHint" | "destructive_hint" => Ok(ApprovalMode::DestructiveHint),
        "policy" => Err(ConvertError::unsupported(
            key,
            "'policy' (an external policy engine decides) has no equivalent: choose never, always, or \
             destructiveHint (ask unless the tool says it is read-only or not destructive)",
        )),
        other => Err(ConvertError::unsupported(
            key,
            format!("'{other}' is not a mode; use never, always or destructiveHint"),
        )),
    }
}

fn approval(design: DesignApproval) -> Result<ApprovalPolicy, ConvertError> {
    match design {
        DesignApproval::Server(m) => {
            Ok(ApprovalPolicy { default: mode(&m, "approval_policy")?, tools: BTreeMap::new() })
        }
        DesignApproval::PerTool { default, tools } => {
            let default =
                default.as_deref().map(|m| mode(m, "approval_policy.default")).transpose()?.unwrap_or_default();
            let tools = tools
                .into_iter()
                .map(|(tool, m)| Ok((tool.clone(), mode(&m, &format!("approval_policy.tools.{tool}"))?)))
                .collect::<Result<_, ConvertError>>()?;
            Ok(ApprovalPolicy { default, tools })
        }
    }
}

fn http_spec(h: DesignHttp, server: &str, notes: &mut Vec<String>) -> Result<HttpSpec, ConvertError> {
    let mut headers: Vec<HttpHeader> =
        h.headers.into_iter().map(|(name, value)| HttpHeader { name, value: Some(value), value_from: None }).collect();
    if let Some(auth_ref) = h.auth_ref {
        let (secret, key) = auth_ref.split_once('/').unwrap_or((auth_ref.as_str(), "authorization"));
        if !is_dns1123_subdomain(secret) || key.is_empty() {
            return Err(ConvertError::unsupported(
                "http.auth_ref",
                format!(
                    "'{auth_ref}' is not a Secret reference: write NAME or NAME/KEY with NAME a Kubernetes Secret name"
                ),
            ));
        }
        if headers.iter().any(|h| h.name.eq_ignore_ascii_case("authorization")) {
            return Err(ConvertError::unsupported(
                "http.auth_ref",
                "http.headers also sets Authorization; keep one of the two",
            ));
        }
        notes.push(format!(
            "Secret {secret} key {key} must hold the whole Authorization header value (for example 'Bearer <token>') \
             and carry the annotation mcp.spear.dev/allowed-servers: \"{server}\"; in local mode the agent reads it \
             from the environment variable `spearlet explain` names"
        ));
        headers.push(HttpHeader {
            name: "Authorization".into(),
            value: None,
            value_from: Some(HeaderValueSource {
                secret_key_ref: SecretKeySelector { name: secret.to_string(), key: key.to_string(), optional: None },
            }),
        });
    }
    Ok(HttpSpec { url: h.url, headers, auth: None })
}

fn stdio_spec(s: DesignStdio) -> Result<StdioSpec, ConvertError> {
    let mut env: Vec<EnvVar> =
        s.env.into_iter().map(|(name, value)| EnvVar { name, value: Some(value), value_from: None }).collect();
    for name in s.env_from {
        if env.iter().any(|e| e.name == name) {
            return Err(ConvertError::unsupported(
                "stdio.env_from",
                format!("{name} is also set in stdio.env; keep it in one of the two"),
            ));
        }
        // `env_from = ["X"]` passes the agent's X through: `${ENV:X}`.
        env.push(EnvVar { value: Some(format!("${{ENV:{name}}}")), name, value_from: None });
    }
    Ok(StdioSpec {
        image: s.image,
        command: s.command,
        args: s.args,
        env,
        working_dir: s.cwd,
        resources: None,
        mount_service_account_token: false,
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Format, Options};
    use super::*;

    fn toml(text: &str) -> Result<McpServer, ConvertError> {
        Ok(super::super::convert(text, Format::DesignToml, &Options::default())?.remove(0).server)
    }

    fn json(text: &str) -> Result<McpServer, ConvertError> {
        Ok(super::super::convert(text, Format::DesignJson, &Options::default())?.remove(0).server)
    }

    const FS: &str = r#"
server_id = "fs"
display_name = "Filesystem"
transport = "stdio"
allowed_tools = ["read_*", "search_*"]
[stdio]
command = "npx"
args = ["-y", "@modelcontextprotocol/server-filesystem", "./"]
env_from = ["API_TOKEN"]
[budgets]
tool_timeout_ms = 30000
max_concurrency = 8
max_tool_output_bytes = 65536
"#;

    #[test]
    fn the_documented_toml_example_converts() {
        let s = toml(FS).expect("valid");
        assert_eq!(s.metadata.name.as_deref(), Some("fs"));
        let stdio = s.spec.stdio.expect("stdio");
        assert_eq!(stdio.env[0].name, "API_TOKEN");
        assert_eq!(stdio.env[0].value.as_deref(), Some("${ENV:API_TOKEN}"));
        assert_eq!(s.spec.budgets.and_then(|b| b.max_concurrency), Some(8));
    }

    #[test]
    fn resource_and_prompt_lists_convert() {
        let legacy =
            FS.replace("[stdio]", "allowed_resources = [\"file:///srv/*\"]\ndenied_prompts = [\"debug\"]\n[stdio]");
        let s = toml(&legacy).expect("valid");
        assert_eq!(s.spec.allowed_resources, ["file:///srv/*"]);
        assert_eq!(s.spec.denied_prompts, ["debug"]);
        assert!(s.spec.allowed_prompts.is_empty(), "absent stays empty: deny by default");
    }

    #[test]
    fn enabled_false_converts_and_absent_stays_absent() {
        let off = toml(&FS.replace("[stdio]", "enabled = false\n[stdio]")).expect("valid");
        assert_eq!((off.spec.enabled, off.spec.is_enabled()), (Some(false), false));
        assert_eq!(toml(FS).expect("valid").spec.enabled, None);
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let err = toml(&FS.replace("display_name", "title")).expect_err("unknown key");
        assert!(err.to_string().contains("title"), "{err}");
        let err = toml(&FS.replace("env_from", "environment")).expect_err("unknown key");
        assert!(err.to_string().contains("environment"), "{err}");
    }

    #[test]
    fn a_non_dns_id_keeps_its_tool_namespace() {
        let s = toml(&FS.replace("\"fs\"", "\"My_FS\"")).expect("valid");
        assert_eq!(s.metadata.name.as_deref(), Some("my-fs"));
        assert_eq!(s.spec.tool_namespace.as_deref(), Some("My_FS"));
    }

    #[test]
    fn json_http_servers_convert() {
        let s = json(
            r#"{"server_id": "search", "transport": "streamable_http", "allowed_tools": ["*"],
                "http": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${ENV:TOKEN}"}}}"#,
        )
        .expect("valid");
        assert_eq!(s.spec.transport, Transport::StreamableHttp);
        assert_eq!(s.spec.http.expect("http").headers[0].name, "Authorization");
    }

    #[test]
    fn invalid_results_are_refused_with_the_field() {
        let err = toml(&FS.replace("max_concurrency = 8", "max_concurrency = 0")).expect_err("invalid");
        assert!(err.to_string().contains("spec.budgets.maxConcurrency"), "{err}");
    }

    /// A record in the design's own shape, with every key it names.
    const DESIGN: &str = r#"
version = 1
server_id = "github"
display_name = "GitHub"
transport = "streamable_http"
tool_namespace = "mcp.github"
allowed_tools = ["search_*", "create_issue"]
[approval_policy]
default = "never"
tools = { "create_*" = "always" }
[http]
url = "https://mcp.example.com/github"
auth_ref = "github-token"
"#;

    #[test]
    fn the_designs_own_record_converts_key_by_key() {
        let s = toml(DESIGN).expect("valid");
        assert_eq!(s.metadata.name.as_deref(), Some("github"));
        assert_eq!(s.spec.tool_namespace, None, "mcp.<server_id> is the default naming");
        let policy = s.spec.approval_policy.expect("approval");
        assert_eq!((policy.default, policy.tools.get("create_*")), (ApprovalMode::Never, Some(&ApprovalMode::Always)));
        let http = s.spec.http.expect("http");
        let auth = &http.headers[0];
        assert_eq!(auth.name, "Authorization");
        let secret = &auth.value_from.as_ref().expect("from a Secret").secret_key_ref;
        assert_eq!((secret.name.as_str(), secret.key.as_str()), ("github-token", "authorization"));
    }

    #[test]
    fn design_keys_map_or_are_refused_with_the_fix() {
        let ns = |v: &str| toml(&DESIGN.replace("\"mcp.github\"", v));
        assert_eq!(ns("\"\"").expect("empty is the default").spec.tool_namespace, None);
        assert_eq!(ns("\"mcp.gh\"").expect("mcp.<x>").spec.tool_namespace.as_deref(), Some("gh"));
        let err = ns("\"corp.tools.gh\"").expect_err("dots");
        assert!(err.to_string().contains("tool_namespace") && err.to_string().contains("corp_tools_gh"), "{err}");

        let server_wide = DESIGN.replace(
            "[approval_policy]\ndefault = \"never\"\ntools = { \"create_*\" = \"always\" }",
            "approval_policy = \"always\"",
        );
        let policy = toml(&server_wide).expect("valid").spec.approval_policy.expect("approval");
        assert_eq!((policy.default, policy.tools.len()), (ApprovalMode::Always, 0));
        let err = toml(&DESIGN.replace("= \"always\" }", "= \"policy\" }")).expect_err("policy");
        assert!(
            err.to_string().contains("approval_policy.tools.create_*") && err.to_string().contains("destructiveHint"),
            "{err}"
        );

        let err = toml(&DESIGN.replace("version = 1", "version = 2")).expect_err("version");
        assert!(err.to_string().starts_with("version:"), "{err}");
        let err = toml(&DESIGN.replace("streamable_http", "http_sse_legacy")).expect_err("sse");
        assert!(err.to_string().contains("Streamable HTTP") && err.to_string().contains("mcp-proxy"), "{err}");
        let keyed = toml(&DESIGN.replace("\"github-token\"", "\"tokens/github\"")).expect("name/key");
        let selector = &keyed.spec.http.expect("http").headers[0].value_from.clone().expect("secret").secret_key_ref;
        assert_eq!((selector.name.as_str(), selector.key.as_str()), ("tokens", "github"));
        let err = toml(&DESIGN.replace("\"github-token\"", "\"Not A Secret\"")).expect_err("bad ref");
        assert!(err.to_string().contains("http.auth_ref"), "{err}");
    }

    #[test]
    fn the_as_built_note_empty_namespace_converts() {
        // The second seed's example: `tool_namespace = ""` with a stdio server.
        let s = toml(&FS.replace("transport = \"stdio\"", "transport = \"stdio\"\ntool_namespace = \"\"\nversion = 1"))
            .expect("valid");
        assert_eq!(s.spec.tool_namespace, None);
    }
}
