//! Migration into McpServer manifests from the configs teams already have, so moving to spear-mcp
//! keeps them. Pure: text in, objects and notes out; the CLI does the file I/O.
//!
//! ```text
//! *.toml, {"server_id": ..}       ─▶ design.rs    the design's file registry, one server per file
//! {"packages"|"remotes": ..}      ─▶ registry.rs  the official MCP Registry's server.json
//! {"mcpServers"|"servers": ..}    ─▶ clients.rs   Claude Desktop / Claude Code / Cursor / VS Code
//!                                         │
//!                                         ▼
//!                       Converted { McpServer, notes } ──validate()──▶ YAML with the notes on top
//! ```
//!
//! Decisions:
//! - A file converts whole or not at all: every refusal in it is reported and nothing of it is
//!   written, so a directory never holds half of a client config.
//! - A value that is or looks like a secret (declared secret, a credential-shaped name, a value
//!   a secret detector recognizes, `Authorization`) is never copied into a manifest meant for
//!   Git: it becomes `${ENV:NAME}` (local mode) or, with `--secret NAME`, a `secretKeyRef` into that
//!   Secret, and a note says what to set and which grant annotation the Secret needs.
//! - What has no equivalent (legacy SSE, `${workspaceFolder}`, variables in argv) is refused with
//!   the reason and the fix, never dropped silently; what converts with a caveat gets a note.
//! - Tool names stay stable: an id that is not a DNS-1123 label becomes a normalized
//!   `metadata.name` and is kept as `toolNamespace` when it is a valid one.

mod clients;
mod design;
mod registry;

use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};
use serde_json::Value;
use thiserror::Error;

use crate::api::validate::{is_dns1123_label, is_dns1123_subdomain, is_tool_namespace};
use crate::api::{HeaderValueSource, HttpHeader, McpServer, ValidationError};
use crate::secrets::{Detector, DetectorSet};

pub(crate) use registry::Prefer;

/// The input formats, as named in errors and notes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Format {
    /// The design's file registry, TOML.
    DesignToml,
    /// The design's file registry, JSON.
    DesignJson,
    /// The official MCP Registry's `server.json`.
    ServerJson,
    /// A client's `mcpServers` (Claude Desktop, Claude Code, Cursor) or `servers` (VS Code) map.
    ClientConfig,
}

impl Format {
    /// The format of a file from its name and, for JSON, its top-level keys.
    pub(crate) fn detect(file_name: &str, text: &str) -> Result<Format, ConvertError> {
        if file_name.ends_with(".toml") {
            return Ok(Format::DesignToml);
        }
        if !file_name.ends_with(".json") {
            return Err(ConvertError::UnknownFormat(
                "expected a .toml or .json file (a design registry file, a server.json, or a client's mcpServers config)"
                    .into(),
            ));
        }
        let value: Value = serde_json::from_str(text)?;
        let has = |key: &str| value.get(key).is_some();
        Ok(if has("server_id") {
            Format::DesignJson
        } else if has("mcpServers") || value.get("servers").is_some_and(Value::is_object) {
            Format::ClientConfig
        } else if has("packages") || has("remotes") || has("version_detail") {
            Format::ServerJson
        } else {
            return Err(ConvertError::UnknownFormat(
                "no server_id (design registry file), packages or remotes (server.json), mcpServers or servers \
                 (client config) at the top level"
                    .into(),
            ));
        })
    }
}

/// How the conversion treats what the input cannot say.
#[derive(Clone, Debug, Default)]
pub(crate) struct Options {
    /// Secret values become `secretKeyRef`s into this Secret (cluster mode) instead of
    /// `${ENV:NAME}` references (local mode).
    pub secret: Option<String>,
    /// The image entrypoint (argv) of an OCI package, which server.json does not carry.
    pub entrypoint: Option<Vec<String>>,
    /// Which of a server.json's ways to run it to use when it offers both.
    pub prefer: Prefer,
}

/// One converted server and what the person converting it must know.
#[derive(Debug)]
pub(crate) struct Converted {
    pub server: McpServer,
    /// Sentences for the person: values to set, annotations to add, choices made.
    pub notes: Vec<String>,
}

/// Why a config could not be converted.
#[derive(Debug, Error)]
pub(crate) enum ConvertError {
    /// The file is none of the formats.
    #[error("{0}")]
    UnknownFormat(String),
    /// The TOML did not parse or had an unknown key (the message names it and its line).
    #[error("{0}")]
    Toml(#[from] toml::de::Error),
    /// The JSON did not parse or had an unknown key (the message names it).
    #[error("{0}")]
    Json(#[from] serde_json::Error),
    /// A value has no McpServer equivalent.
    #[error("{key}: {message}")]
    Unsupported {
        /// Where in the input, for example `mcpServers.github.args[2]`.
        key: String,
        /// What is wrong and what to do.
        message: String,
    },
    /// A converted server does not pass validation.
    #[error("{name}: the converted McpServer is invalid: {}", .problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))]
    Invalid {
        /// The server's `metadata.name`.
        name: String,
        /// What validation found.
        problems: Vec<ValidationError>,
    },
    /// Several servers of one file did not convert.
    #[error("{}", .0.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n"))]
    Many(Vec<ConvertError>),
}

impl ConvertError {
    fn unsupported(key: impl Into<String>, message: impl Into<String>) -> Self {
        ConvertError::Unsupported { key: key.into(), message: message.into() }
    }
}

/// Why the legacy HTTP+SSE transport is refused, and what to do instead.
fn sse_refusal() -> String {
    format!("{}; {}", crate::api::LEGACY_SSE_REASON, crate::api::LEGACY_SSE_FIX)
}

/// Any spelling of the legacy SSE transport (`sse`, `SSE`, `http_sse_legacy`, ...).
fn is_sse(transport: &str) -> bool {
    transport.to_ascii_lowercase().contains("sse")
}

/// Converts one file's text into validated McpServers, all or none.
pub(crate) fn convert(text: &str, format: Format, options: &Options) -> Result<Vec<Converted>, ConvertError> {
    let converted = match format {
        Format::DesignToml => vec![design::convert(toml::from_str(text)?)?],
        Format::DesignJson => vec![design::convert(serde_json::from_str(text)?)?],
        Format::ServerJson => vec![registry::convert(serde_json::from_str(text)?, options)?],
        Format::ClientConfig => clients::convert(serde_json::from_str(text)?, options)?,
    };
    let mut refused = Vec::new();
    for c in &converted {
        let problems = crate::api::Validate::validate(&c.server);
        if !problems.is_empty() {
            refused.push(ConvertError::Invalid { name: c.server.metadata.name.clone().unwrap_or_default(), problems });
        }
    }
    match refused.len() {
        0 => Ok(converted),
        1 => Err(refused.remove(0)),
        _ => Err(ConvertError::Many(refused)),
    }
}

/// Renders a server as a YAML document: a header naming where it came from, the notes as
/// comments, then the object.
pub(crate) fn to_yaml(converted: &Converted, origin: &str) -> Result<String, serde_yaml::Error> {
    let mut text = format!("# Converted by `spearlet convert` from {}\n", comment(origin));
    for note in &converted.notes {
        text.push_str("# note: ");
        text.push_str(&comment(note));
        text.push('\n');
    }
    text.push_str(&serde_yaml::to_string(&converted.server)?);
    Ok(text)
}

/// Text fit for one YAML comment line: notes and file names carry text from the input, and a
/// line break in them (YAML reads `\r`, NEL, LS and PS as breaks too) would end the comment and
/// let that text become keys of the manifest.
fn comment(text: &str) -> String {
    text.chars().map(|c| if c.is_control() || matches!(c, '\u{2028}' | '\u{2029}') { ' ' } else { c }).collect()
}

/// A resource name and a tool namespace for a server known as `id` elsewhere: the id itself when
/// it is a DNS-1123 label; otherwise a normalized name, with the id kept as the tool namespace
/// when it is a valid one (so model-facing names do not change).
fn names_for(id: &str, key: &str) -> Result<(String, Option<String>), ConvertError> {
    if is_dns1123_label(id) {
        return Ok((id.to_string(), None));
    }
    let name = normalize_name(id);
    if name.is_empty() {
        return Err(ConvertError::unsupported(
            key,
            format!("'{id}' has no letters or digits to build a resource name from"),
        ));
    }
    Ok((name, is_tool_namespace(id).then(|| id.to_string())))
}

/// Lowercases and replaces every character a DNS-1123 label does not allow with '-'.
fn normalize_name(id: &str) -> String {
    let mapped: String =
        id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let mut collapsed = String::with_capacity(mapped.len());
    for c in mapped.chars() {
        if !(c == '-' && collapsed.ends_with('-')) {
            collapsed.push(c);
        }
    }
    let trimmed = collapsed.trim_matches('-');
    trimmed.chars().take(63).collect::<String>().trim_end_matches('-').to_string()
}

/// Image for npm packages in a cluster (the sidecar needs `npx`).
const NODE_IMAGE: &str = "node:22-alpine";
/// Image for PyPI packages in a cluster (the sidecar needs `uvx`).
const UV_IMAGE: &str = "ghcr.io/astral-sh/uv:python3.12-alpine";

/// Formats other than the design's name no tools: the server starts with none exposed.
fn deny_by_default_note() -> String {
    "no tool is exposed until spec.allowedTools names them (deny by default): to review what the server offers, \
     allow [\"*\"] in a local registry and run `spearlet explain --registry-dir DIR --profile P --connect`"
        .to_string()
}

/// An environment variable name for a value of `server` called `what`: `GITHUB_TOKEN`.
fn env_name(server: &str, what: &str) -> String {
    let raw = format!("{server}_{what}");
    let name: String =
        raw.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    // `SPEAR_*` is the agent's own; a server called spear-... would otherwise be refused.
    if name.starts_with("SPEAR_") { format!("MCP_{name}") } else { name }
}

/// Whether a variable or header called `name` with `value` holds a credential: by its name, or
/// by a known credential shape in the value.
fn looks_secret(name: &str, value: Option<&str>) -> bool {
    let upper = name.to_ascii_uppercase();
    let by_name = ["TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "PRIVATE_KEY", "CREDENTIAL", "AUTH"]
        .iter()
        .any(|w| upper.contains(w))
        || upper.ends_with("_KEY")
        || upper == "KEY"
        || upper.contains("-KEY");
    by_name || value.is_some_and(|v| detected(v).is_some())
}

/// The credential shape a secret detector finds in `value`, if any.
fn detected(value: &str) -> Option<Detector> {
    static ALL: std::sync::LazyLock<DetectorSet> = std::sync::LazyLock::new(|| DetectorSet::new(&Detector::ALL));
    ALL.first_in(value)
}

/// Makes the environment variable and header values of one server, keeping secrets out of the
/// manifest, and collects the notes that say what to set.
struct Values<'a> {
    options: &'a Options,
    server: String,
    notes: Vec<String>,
    /// Secret keys referenced (for the grant note, once).
    secret_keys: Vec<String>,
    /// Agent environment variables referenced (for the local-mode note, once).
    env_vars: Vec<String>,
}

impl<'a> Values<'a> {
    fn new(options: &'a Options, server: &str) -> Self {
        Values { options, server: server.to_string(), notes: Vec::new(), secret_keys: Vec::new(), env_vars: Vec::new() }
    }

    /// A stdio env var whose value is secret; without `--secret` it reads the agent's `var` (its
    /// own name by default).
    fn secret_env(&mut self, name: &str, var: Option<&str>) -> EnvVar {
        match &self.options.secret {
            Some(secret) => {
                self.secret_keys.push(name.to_string());
                EnvVar {
                    name: name.to_string(),
                    value: None,
                    value_from: Some(EnvVarSource {
                        secret_key_ref: Some(SecretKeySelector {
                            name: secret.clone(),
                            key: name.to_string(),
                            optional: None,
                        }),
                        ..Default::default()
                    }),
                }
            }
            None => {
                let var = var.unwrap_or(name);
                self.env_vars.push(var.to_string());
                EnvVar { name: name.to_string(), value: Some(format!("${{ENV:{var}}}")), value_from: None }
            }
        }
    }

    /// A header whose value holds a secret; `prefix` (such as `Bearer `) stays literal when the
    /// value comes from the agent's environment variable `var` (one named for the server and
    /// header by default).
    fn secret_header(&mut self, header: &str, prefix: &str, var: Option<&str>) -> HttpHeader {
        match &self.options.secret {
            Some(secret) => {
                let key = secret_key_for(header);
                self.notes.push(format!(
                    "Secret {secret} key {key} must hold the whole {header} header value{}",
                    if prefix.is_empty() { String::new() } else { format!(" ('{prefix}<value>')") }
                ));
                self.secret_keys.push(key.clone());
                HttpHeader {
                    name: header.to_string(),
                    value: None,
                    value_from: Some(HeaderValueSource {
                        secret_key_ref: SecretKeySelector { name: secret.clone(), key, optional: None },
                    }),
                }
            }
            None => {
                let var = var.map_or_else(
                    || {
                        env_name(
                            &self.server,
                            if header.eq_ignore_ascii_case("authorization") { "token" } else { header },
                        )
                    },
                    str::to_string,
                );
                self.env_vars.push(var.clone());
                HttpHeader {
                    name: header.to_string(),
                    value: Some(format!("{prefix}${{ENV:{var}}}")),
                    value_from: None,
                }
            }
        }
    }

    /// `image` as the sidecar's, with the note that it is a choice.
    fn sidecar_image(&mut self, image: &str) -> Option<String> {
        self.notes.push(format!("in a cluster the sidecar image is {image}: change spec.stdio.image freely"));
        Some(image.to_string())
    }

    /// The notes, with the summary of what to set last.
    fn finish(mut self) -> Vec<String> {
        let mut seen = std::collections::BTreeSet::new();
        self.env_vars.retain(|v| seen.insert(v.clone()));
        seen.clear();
        self.secret_keys.retain(|k| seen.insert(k.clone()));
        if !self.env_vars.is_empty() {
            self.notes.push(format!(
                "secret values were not copied: set {} in the agent's environment (local mode), or convert with \
                 --secret NAME for a cluster",
                self.env_vars.join(", ")
            ));
        }
        if let Some(secret) = &self.options.secret
            && !self.secret_keys.is_empty()
        {
            self.notes.push(format!(
                "create Secret {secret} with keys {} and the annotation mcp.spear.dev/allowed-servers: \"{}\" \
                 (the agent and the webhook use a Secret only where it grants the server)",
                self.secret_keys.join(", "),
                self.server
            ));
        }
        self.notes
    }
}

/// A Secret key for a header's value (`[-._a-zA-Z0-9]`, lower-case).
fn secret_key_for(header: &str) -> String {
    header.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c.to_ascii_lowercase() } else { '-' }).collect()
}

/// Whether a Secret name is usable (`--secret`).
pub(crate) fn is_secret_name(name: &str) -> bool {
    is_dns1123_subdomain(name)
}

/// Splits `Bearer <token>` into the scheme prefix (with its space) and the rest.
fn auth_scheme_prefix(value: &str) -> (&str, &str) {
    match value.split_once(' ') {
        Some((scheme, rest))
            if !rest.is_empty() && ["bearer", "basic", "token"].contains(&scheme.to_ascii_lowercase().as_str()) =>
        {
            (&value[..scheme.len() + 1], rest)
        }
        _ => ("", value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_are_told_apart_by_name_and_keys() {
        assert_eq!(Format::detect("a.toml", "").expect("toml"), Format::DesignToml);
        assert_eq!(Format::detect("a.json", r#"{"server_id": "x"}"#).expect("design"), Format::DesignJson);
        assert_eq!(Format::detect("a.json", r#"{"mcpServers": {}}"#).expect("claude"), Format::ClientConfig);
        assert_eq!(Format::detect("mcp.json", r#"{"servers": {}}"#).expect("vscode"), Format::ClientConfig);
        assert_eq!(
            Format::detect("server.json", r#"{"name": "a/b", "remotes": []}"#).expect("reg"),
            Format::ServerJson
        );
        let err = Format::detect("a.json", r#"{"name": "x"}"#).expect_err("none");
        assert!(err.to_string().contains("mcpServers"), "{err}");
        assert!(Format::detect("a.yaml", "").is_err());
    }

    #[test]
    fn names_normalize_and_keep_a_valid_namespace() {
        assert_eq!(names_for("github", "k").expect("ok"), ("github".into(), None));
        assert_eq!(names_for("My_FS", "k").expect("ok"), ("my-fs".into(), Some("My_FS".into())));
        assert_eq!(names_for("io.github.x/weather", "k").expect("ok"), ("io-github-x-weather".into(), None));
        assert!(names_for("__", "k").is_err());
    }

    #[test]
    fn credentials_are_recognized_by_name_or_shape() {
        assert!(looks_secret("GITHUB_PERSONAL_ACCESS_TOKEN", None));
        assert!(looks_secret("BRAVE_API_KEY", None));
        assert!(looks_secret("X-Api-Key", None));
        assert!(looks_secret("Authorization", None));
        assert!(looks_secret("CONFIG", Some("ghp_0123456789abcdefghijABCDEFGHIJ012345")));
        assert!(!looks_secret("LOG_LEVEL", Some("debug")));
        assert!(!looks_secret("KEYBOARD_LAYOUT", Some("us")));
    }

    #[test]
    fn env_names_are_upper_snake_and_never_spear() {
        assert_eq!(env_name("github", "token"), "GITHUB_TOKEN");
        assert_eq!(env_name("my-api", "X-Api-Key"), "MY_API_X_API_KEY");
        assert_eq!(env_name("spear-docs", "token"), "MCP_SPEAR_DOCS_TOKEN");
    }

    #[test]
    fn notes_and_file_names_cannot_end_their_comment() {
        let config = r#"{"mcpServers": {"x": {"command": "x"}}}"#;
        let server = convert(config, Format::ClientConfig, &Options::default()).expect("valid").remove(0).server;
        let notes =
            ["a\rspec: {enabled: false}", "b\u{2028}kind: McpProfile", "c\u{85}d\ne"].map(String::from).to_vec();
        let yaml = to_yaml(&Converted { server, notes }, "f\rmetadata: {name: y}").expect("yaml");
        let read = crate::api::manifest::parse(&yaml);
        assert!(read.is_valid(), "{yaml}");
        let back: McpServer = serde_yaml::from_str(&yaml).expect("one object");
        assert_eq!((back.metadata.name.as_deref(), back.spec.enabled), (Some("x"), None), "{yaml}");
    }
}
