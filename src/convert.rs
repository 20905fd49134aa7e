//! Migration from the file-based registry format (one server per TOML or JSON file) to
//! McpServer manifests, so a team moving to spear-mcp keeps its configs. Pure: text in, object
//! out; the CLI does the file I/O.
//!
//! ```text
//! server.toml ──serde (deny_unknown_fields)──▶ LegacyServer ──map──▶ McpServer ──validate()──▶ YAML
//! ```
//!
//! Tool names stay stable across the move: a `server_id` that is not a DNS-1123 label becomes a
//! normalized `metadata.name` and the original id is kept as `toolNamespace`, so model-facing
//! names (`mcp__<id>__<tool>`) do not change.

use std::collections::BTreeMap;
use std::path::Path;

use k8s_openapi::api::core::v1::EnvVar;
use serde::Deserialize;
use thiserror::Error;

use crate::api::validate::is_dns1123_label;
use crate::api::{
    HttpHeader, HttpSpec, McpServer, McpServerSpec, ServerBudgets, StdioSpec, Transport, Validate, ValidationError,
};

/// The input formats.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// TOML (`.toml`).
    Toml,
    /// JSON (`.json`).
    Json,
}

impl Format {
    /// The format a file name implies, if any.
    pub(crate) fn from_path(path: &Path) -> Option<Format> {
        match path.extension()?.to_str()? {
            "toml" => Some(Format::Toml),
            "json" => Some(Format::Json),
            _ => None,
        }
    }
}

/// Why a legacy config could not be converted.
#[derive(Debug, Error)]
pub(crate) enum ConvertError {
    /// The TOML did not parse or had an unknown key (the message names it and its line).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// The JSON did not parse or had an unknown key (the message names it).
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A value has no McpServer equivalent.
    #[error("{key}: {message}")]
    Unsupported {
        /// The legacy key.
        key: &'static str,
        /// What is wrong and what to do.
        message: String,
    },
    /// The converted server does not pass validation.
    #[error("the converted McpServer is invalid: {}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<ValidationError>),
}

/// The file-based registry format, one server per file.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyServer {
    server_id: String,
    #[serde(default)]
    display_name: Option<String>,
    /// `enabled = false` keeps the server registered but out of use (`spec.enabled`).
    #[serde(default)]
    enabled: Option<bool>,
    transport: String,
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
    stdio: Option<LegacyStdio>,
    #[serde(default)]
    http: Option<LegacyHttp>,
    #[serde(default)]
    budgets: Option<LegacyBudgets>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyStdio {
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
struct LegacyHttp {
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct LegacyBudgets {
    #[serde(default)]
    tool_timeout_ms: Option<u32>,
    #[serde(default)]
    max_concurrency: Option<u32>,
    #[serde(default)]
    max_tool_output_bytes: Option<u32>,
}

/// Converts one legacy server config into a validated McpServer.
pub(crate) fn convert(text: &str, format: Format) -> Result<McpServer, ConvertError> {
    let legacy: LegacyServer = match format {
        Format::Toml => toml::from_str(text)?,
        Format::Json => serde_json::from_str(text)?,
    };
    let server = to_mcp_server(legacy)?;
    let problems = server.validate();
    if problems.is_empty() { Ok(server) } else { Err(ConvertError::Invalid(problems)) }
}

/// Lowercases and replaces every character a DNS-1123 label does not allow with '-'.
fn normalize_name(id: &str) -> String {
    let mapped: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let trimmed = mapped.trim_matches('-');
    trimmed.chars().take(63).collect::<String>().trim_end_matches('-').to_string()
}

fn to_mcp_server(legacy: LegacyServer) -> Result<McpServer, ConvertError> {
    let transport = match legacy.transport.as_str() {
        "stdio" => Transport::Stdio,
        "streamable_http" | "streamableHttp" | "streamable-http" | "http" => Transport::StreamableHttp,
        other => {
            return Err(ConvertError::Unsupported {
                key: "transport",
                message: format!(
                    "'{other}' is not supported; use stdio or streamable_http (SSE-only servers are not supported)"
                ),
            });
        }
    };
    let (name, tool_namespace) = if is_dns1123_label(&legacy.server_id) {
        (legacy.server_id.clone(), None)
    } else {
        let name = normalize_name(&legacy.server_id);
        if name.is_empty() {
            return Err(ConvertError::Unsupported {
                key: "server_id",
                message: format!("'{}' has no letters or digits to build a resource name from", legacy.server_id),
            });
        }
        // Keep the old id in tool names when it is a valid namespace, so callers see no rename.
        (name, Some(legacy.server_id.clone()))
    };

    let stdio = legacy.stdio.map(stdio_spec).transpose()?;
    let http = legacy.http.map(|h| HttpSpec {
        url: h.url,
        headers: h
            .headers
            .into_iter()
            .map(|(name, value)| HttpHeader { name, value: Some(value), value_from: None })
            .collect(),
        auth: None,
    });
    let budgets = legacy.budgets.map(|b| ServerBudgets {
        tool_timeout_ms: b.tool_timeout_ms,
        max_concurrency: b.max_concurrency,
        max_tool_output_bytes: b.max_tool_output_bytes,
        ..Default::default()
    });
    Ok(McpServer::new(
        &name,
        McpServerSpec {
            display_name: legacy.display_name,
            enabled: legacy.enabled,
            transport,
            stdio,
            http,
            tool_namespace,
            allowed_tools: legacy.allowed_tools,
            denied_tools: legacy.denied_tools,
            allowed_resources: legacy.allowed_resources,
            denied_resources: legacy.denied_resources,
            allowed_prompts: legacy.allowed_prompts,
            denied_prompts: legacy.denied_prompts,
            approval_policy: None,
            budgets,
            pinning: None,
        },
    ))
}

fn stdio_spec(s: LegacyStdio) -> Result<StdioSpec, ConvertError> {
    let mut env: Vec<EnvVar> =
        s.env.into_iter().map(|(name, value)| EnvVar { name, value: Some(value), value_from: None }).collect();
    for name in s.env_from {
        if env.iter().any(|e| e.name == name) {
            return Err(ConvertError::Unsupported {
                key: "stdio.env_from",
                message: format!("{name} is also set in stdio.env; keep it in one of the two"),
            });
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

/// Renders a server as a YAML document with a header naming where it came from.
pub(crate) fn to_yaml(server: &McpServer, origin: &str) -> Result<String, serde_yaml::Error> {
    Ok(format!("# Converted by `spearlet convert` from {origin}\n{}", serde_yaml::to_string(server)?))
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let s = convert(FS, Format::Toml).expect("valid");
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
        let s = convert(&legacy, Format::Toml).expect("valid");
        assert_eq!(s.spec.allowed_resources, ["file:///srv/*"]);
        assert_eq!(s.spec.denied_prompts, ["debug"]);
        assert!(s.spec.allowed_prompts.is_empty(), "absent stays empty: deny by default");
    }

    #[test]
    fn enabled_false_converts_and_absent_stays_absent() {
        let off = convert(&FS.replace("[stdio]", "enabled = false\n[stdio]"), Format::Toml).expect("valid");
        assert_eq!((off.spec.enabled, off.spec.is_enabled()), (Some(false), false));
        assert_eq!(convert(FS, Format::Toml).expect("valid").spec.enabled, None);
    }

    #[test]
    fn unknown_keys_are_errors_naming_the_key() {
        let err = convert(&FS.replace("display_name", "title"), Format::Toml).expect_err("unknown key");
        assert!(err.to_string().contains("title"), "{err}");
        let err = convert(&FS.replace("env_from", "environment"), Format::Toml).expect_err("unknown key");
        assert!(err.to_string().contains("environment"), "{err}");
    }

    #[test]
    fn a_non_dns_id_keeps_its_tool_namespace() {
        let s = convert(&FS.replace("\"fs\"", "\"My_FS\""), Format::Toml).expect("valid");
        assert_eq!(s.metadata.name.as_deref(), Some("my-fs"));
        assert_eq!(s.spec.tool_namespace.as_deref(), Some("My_FS"));
    }

    #[test]
    fn json_http_servers_convert() {
        let s = convert(
            r#"{"server_id": "search", "transport": "streamable_http", "allowed_tools": ["*"],
                "http": {"url": "https://mcp.example.com/mcp", "headers": {"Authorization": "Bearer ${ENV:TOKEN}"}}}"#,
            Format::Json,
        )
        .expect("valid");
        assert_eq!(s.spec.transport, Transport::StreamableHttp);
        assert_eq!(s.spec.http.expect("http").headers[0].name, "Authorization");
    }

    #[test]
    fn invalid_results_are_refused_with_the_field() {
        let err =
            convert(&FS.replace("max_concurrency = 8", "max_concurrency = 0"), Format::Toml).expect_err("invalid");
        assert!(err.to_string().contains("spec.budgets.maxConcurrency"), "{err}");
    }
}
