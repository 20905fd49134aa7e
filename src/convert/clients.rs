//! MCP client configs into McpServers: the `mcpServers` map of Claude Desktop, Claude Code
//! (`.mcp.json`) and Cursor, and the `servers` map (with `inputs`) of VS Code (`.vscode/mcp.json`).
//!
//! An entry with `command` is a stdio server; one with `url` (`serverUrl` in Windsurf) a
//! Streamable HTTP server, unless its `type` says `sse` (refused, [`sse_refusal`]). Variables:
//! - Claude Code's `${VAR}` / `${VAR:-default}` and VS Code's `${env:VAR}` become `${ENV:VAR}`
//!   (`${ENV:VAR:-default}`) in env and header values, the two places spear expands them;
//! - VS Code's `${input:id}` becomes `${ENV:ID}` (the prompt has no equivalent: the agent reads the
//!   environment), a secret when the input is a `password`;
//! - VS Code's predefined variables (`${workspaceFolder}`, `${userHome}`, ...) and any variable
//!   in `command`, `args`, `url` or `cwd` (used as written) are refused naming the field.
//!
//! Client configs commonly hold tokens verbatim (`"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_..."`):
//! such values are replaced, never copied (see the module above). Keys spear has no use for
//! (`timeout`, `autoApprove`, ...) are listed in a note, not refused: clients add their own.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use serde_json::{Map, Value};

use super::{
    ConvertError, Converted, NODE_IMAGE, Options, UV_IMAGE, Values, auth_scheme_prefix, looks_secret, names_for,
    sse_refusal,
};
use crate::api::{HttpHeader, HttpSpec, McpServer, McpServerSpec, StdioSpec, Transport};

/// Keys of an entry that map to a field.
const KNOWN: [&str; 10] =
    ["type", "command", "args", "env", "cwd", "url", "serverUrl", "headers", "disabled", "envFile"];

/// Whose variable syntax a config uses.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `${VAR}`, `${VAR:-default}`.
    Claude,
    /// `${env:VAR}`, `${input:id}`, predefined `${workspaceFolder}`.
    VsCode,
}

/// A VS Code `inputs` entry, by id: whether it is a password.
type Inputs = BTreeMap<String, bool>;

/// Maps every entry of the config; validation is the caller's. All entries or none.
pub(super) fn convert(config: Value, options: &Options) -> Result<Vec<Converted>, ConvertError> {
    let (style, root, servers) = match (config.get("mcpServers"), config.get("servers")) {
        (Some(Value::Object(servers)), _) => (Style::Claude, "mcpServers", servers),
        (None, Some(Value::Object(servers))) => (Style::VsCode, "servers", servers),
        _ => return Err(ConvertError::unsupported("mcpServers", "expected an object of servers by name")),
    };
    let inputs: Inputs = config
        .get("inputs")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|i| {
            Some((i.get("id")?.as_str()?.to_string(), i.get("password").and_then(Value::as_bool) == Some(true)))
        })
        .collect();
    let mut converted = Vec::new();
    let mut refused = Vec::new();
    for (id, entry) in servers {
        match entry.as_object().ok_or_else(|| ConvertError::unsupported(format!("{root}.{id}"), "expected an object")) {
            Ok(entry) => match server(id, entry, &format!("{root}.{id}"), style, &inputs, options) {
                Ok(c) => converted.push(c),
                Err(e) => refused.push(e),
            },
            Err(e) => refused.push(e),
        }
    }
    let mut names = std::collections::BTreeSet::new();
    for c in &converted {
        let name = c.server.metadata.name.clone().unwrap_or_default();
        if !names.insert(name.clone()) {
            refused
                .push(ConvertError::unsupported(root, format!("two servers normalize to the name {name}: rename one")));
        }
    }
    match refused.len() {
        0 if converted.is_empty() => Err(ConvertError::unsupported(root, "no servers")),
        0 => Ok(converted),
        1 => Err(refused.remove(0)),
        _ => Err(ConvertError::Many(refused)),
    }
}

fn server(
    id: &str,
    entry: &Map<String, Value>,
    key: &str,
    style: Style,
    inputs: &Inputs,
    options: &Options,
) -> Result<Converted, ConvertError> {
    let (name, tool_namespace) = names_for(id, key)?;
    let mut values = Values::new(options, &name);
    let text = |field: &str| -> Result<Option<&str>, ConvertError> {
        match entry.get(field) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(_) => Err(ConvertError::unsupported(format!("{key}.{field}"), "expected a string")),
        }
    };
    let kind = text("type")?;
    let url = text("url")?.or(text("serverUrl")?);
    let command = text("command")?;
    if let Some(file) = text("envFile")? {
        return Err(ConvertError::unsupported(
            format!("{key}.envFile"),
            format!("spear does not read {file}: copy its variables into env"),
        ));
    }
    let (transport, stdio, http) = match (kind, command, url) {
        (Some(kind), _, _) if super::is_sse(kind) => {
            return Err(ConvertError::unsupported(format!("{key}.type"), sse_refusal()));
        }
        (Some("stdio") | None, Some(command), _) => {
            (Transport::Stdio, Some(stdio(entry, command, key, style, inputs, &mut values)?), None)
        }
        (Some("http" | "streamable-http" | "streamableHttp") | None, None, Some(url)) => {
            if kind.is_none() {
                values.notes.push("no type given: taken as Streamable HTTP (an SSE-only server will not start)".into());
            }
            (Transport::StreamableHttp, None, Some(http(entry, url, key, style, inputs, &mut values)?))
        }
        (Some(other), _, _) if !["stdio", "http", "streamable-http", "streamableHttp"].contains(&other) => {
            return Err(ConvertError::unsupported(
                format!("{key}.type"),
                format!("'{other}' is not a transport: use stdio or http"),
            ));
        }
        _ => {
            return Err(ConvertError::unsupported(
                key,
                "give either command (a stdio server) or url (a Streamable HTTP server)",
            ));
        }
    };
    let ignored: Vec<&str> = entry.keys().map(String::as_str).filter(|k| !KNOWN.contains(k)).collect();
    if !ignored.is_empty() {
        values.notes.push(format!("ignored client settings with no McpServer field: {}", ignored.join(", ")));
    }
    let enabled = (entry.get("disabled").and_then(Value::as_bool) == Some(true)).then_some(false);
    let server =
        McpServer::new(&name, McpServerSpec { enabled, transport, stdio, http, tool_namespace, ..Default::default() });
    let mut notes = values.finish();
    notes.push(super::deny_by_default_note());
    Ok(Converted { server, notes })
}

fn strings(entry: &Map<String, Value>, field: &str, key: &str) -> Result<Vec<String>, ConvertError> {
    match entry.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| {
                v.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| ConvertError::unsupported(format!("{key}.{field}[{i}]"), "expected a string"))
            })
            .collect(),
        Some(_) => Err(ConvertError::unsupported(format!("{key}.{field}"), "expected an array of strings")),
    }
}

fn string_map(entry: &Map<String, Value>, field: &str, key: &str) -> Result<Vec<(String, String)>, ConvertError> {
    match entry.get(field) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Object(map)) => map
            .iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.clone(), s.clone())),
                Value::Number(n) => Ok((k.clone(), n.to_string())),
                Value::Bool(b) => Ok((k.clone(), b.to_string())),
                _ => Err(ConvertError::unsupported(format!("{key}.{field}.{k}"), "expected a string")),
            })
            .collect(),
        Some(_) => Err(ConvertError::unsupported(format!("{key}.{field}"), "expected an object of strings")),
    }
}

/// Refuses a variable in a field spear uses as written.
fn literal(text: &str, field: &str) -> Result<(), ConvertError> {
    if let Some(start) = text.find("${") {
        let var: String = text[start..].chars().take_while(|c| *c != '}').chain(std::iter::once('}')).collect();
        return Err(ConvertError::unsupported(
            field,
            format!("{var} would not be expanded (spear uses this field as written): replace it with the value"),
        ));
    }
    Ok(())
}

fn stdio(
    entry: &Map<String, Value>,
    command: &str,
    key: &str,
    style: Style,
    inputs: &Inputs,
    values: &mut Values<'_>,
) -> Result<StdioSpec, ConvertError> {
    literal(command, &format!("{key}.command"))?;
    let args = strings(entry, "args", key)?;
    for (i, arg) in args.iter().enumerate() {
        literal(arg, &format!("{key}.args[{i}]"))?;
    }
    let cwd = match entry.get("cwd") {
        Some(Value::String(cwd)) => {
            literal(cwd, &format!("{key}.cwd"))?;
            Some(cwd.clone())
        }
        _ => None,
    };
    let mut env = Vec::new();
    for (name, value) in string_map(entry, "env", key)? {
        let field = format!("{key}.env.{name}");
        let reference = translate(&value, style, inputs, &field)?;
        if looks_secret(&name, Some(&value)) || reference.password {
            env.push(values.secret_env(&name, reference.single.as_deref()));
        } else {
            env.push(EnvVar { name, value: Some(reference.text), value_from: None });
        }
    }
    let image = match command {
        "npx" | "node" => values.sidecar_image(NODE_IMAGE),
        "uvx" | "uv" => values.sidecar_image(UV_IMAGE),
        _ => {
            values.notes.push(format!("in a cluster set spec.stdio.image to an image that has {command}"));
            None
        }
    };
    Ok(StdioSpec { image, command: command.to_string(), args, env, working_dir: cwd, ..Default::default() })
}

fn http(
    entry: &Map<String, Value>,
    url: &str,
    key: &str,
    style: Style,
    inputs: &Inputs,
    values: &mut Values<'_>,
) -> Result<HttpSpec, ConvertError> {
    literal(url, &format!("{key}.url"))?;
    let mut headers = Vec::new();
    for (name, value) in string_map(entry, "headers", key)? {
        let field = format!("{key}.headers.{name}");
        let (prefix, rest) = auth_scheme_prefix(&value);
        let reference = translate(rest, style, inputs, &field)?;
        if looks_secret(&name, Some(&value)) || reference.password {
            headers.push(values.secret_header(&name, prefix, reference.single.as_deref()));
        } else {
            let text = translate(&value, style, inputs, &field)?.text;
            headers.push(HttpHeader { name, value: Some(text), value_from: None });
        }
    }
    Ok(HttpSpec { url: url.to_string(), headers, auth: None })
}

/// A value with the client's references rewritten to spear's.
struct Translated {
    text: String,
    /// The variable when the whole value is one reference (`${GITHUB_TOKEN}`).
    single: Option<String>,
    /// Whether a VS Code password input is referenced.
    password: bool,
}

fn translate(text: &str, style: Style, inputs: &Inputs, field: &str) -> Result<Translated, ConvertError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    let mut vars = Vec::new();
    let mut password = false;
    while let Some(start) = rest.find("${") {
        let Some(len) = rest[start..].find('}') else { break };
        let inner = &rest[start + 2..start + len];
        out.push_str(&rest[..start]);
        let (var, default) = match inner.split_once(":-") {
            Some((var, default)) => (var, Some(default)),
            None => (inner, None),
        };
        let env = match (style, var.split_once(':')) {
            (Style::VsCode, Some(("env", name))) => name.to_string(),
            (Style::VsCode, Some(("input", id))) => {
                let Some(is_password) = inputs.get(id) else {
                    return Err(ConvertError::unsupported(field, format!("${{input:{id}}} is not among the inputs")));
                };
                password |= *is_password;
                id.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
            }
            (Style::Claude, None) if is_env_name(var) => var.to_string(),
            _ => {
                return Err(ConvertError::unsupported(
                    field,
                    format!("${{{inner}}} has no value outside the client: replace it with the value"),
                ));
            }
        };
        match default {
            Some(default) => out.push_str(&format!("${{ENV:{env}:-{default}}}")),
            None => out.push_str(&format!("${{ENV:{env}}}")),
        }
        vars.push(env);
        rest = &rest[start + len + 1..];
    }
    out.push_str(rest);
    let single = (vars.len() == 1 && text.starts_with("${") && text.ends_with('}')).then(|| vars.remove(0));
    Ok(Translated { text: out, single, password })
}

fn is_env_name(s: &str) -> bool {
    s.bytes().next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

#[cfg(test)]
mod tests {
    use super::super::{Format, convert as convert_file};
    use super::*;

    fn all(text: &str, options: &Options) -> Vec<Converted> {
        convert_file(text, Format::ClientConfig, options).expect("converts")
    }

    /// Claude Desktop's documented shape, with a token pasted verbatim as people do.
    const CLAUDE: &str = r#"{"mcpServers": {
      "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/Users/me/Desktop"]},
      "github": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-github"],
                 "env": {"GITHUB_PERSONAL_ACCESS_TOKEN": "ghp_0123456789abcdefghijABCDEFGHIJ012345", "LOG": "${LOG_LEVEL:-info}"}},
      "Linear Remote": {"type": "http", "url": "https://mcp.linear.app/mcp",
                        "headers": {"Authorization": "Bearer ${LINEAR_TOKEN}"}, "timeout": 30000}
    }}"#;

    #[test]
    fn a_claude_config_converts_every_server_and_copies_no_token() {
        let converted = all(CLAUDE, &Options::default());
        let by_name = |n: &str| converted.iter().find(|c| c.server.metadata.name.as_deref() == Some(n)).expect(n);
        let fs = by_name("filesystem").server.spec.stdio.clone().expect("stdio");
        assert_eq!((fs.command.as_str(), fs.args.len(), fs.image.as_deref()), ("npx", 3, Some(NODE_IMAGE)));

        let github = by_name("github");
        let env: Vec<(&str, Option<&str>)> = github
            .server
            .spec
            .stdio
            .as_ref()
            .expect("stdio")
            .env
            .iter()
            .map(|e| (e.name.as_str(), e.value.as_deref()))
            .collect();
        assert_eq!(
            env,
            [
                ("GITHUB_PERSONAL_ACCESS_TOKEN", Some("${ENV:GITHUB_PERSONAL_ACCESS_TOKEN}")),
                ("LOG", Some("${ENV:LOG_LEVEL:-info}"))
            ]
        );
        let yaml = super::super::to_yaml(github, "claude.json").expect("yaml");
        assert!(!yaml.contains("ghp_"), "the token must not reach the manifest:\n{yaml}");

        let linear = by_name("linear-remote");
        let http = linear.server.spec.http.as_ref().expect("http");
        assert_eq!(http.headers[0].value.as_deref(), Some("Bearer ${ENV:LINEAR_TOKEN}"));
        assert!(linear.notes.iter().any(|n| n.contains("timeout")), "{:?}", linear.notes);
    }

    #[test]
    fn a_vscode_config_maps_inputs_and_env_and_refuses_its_own_variables() {
        let vscode = r#"{"inputs": [{"type": "promptString", "id": "gh-token", "description": "GitHub PAT", "password": true}],
          "servers": {"github": {"type": "http", "url": "https://api.githubcopilot.com/mcp/",
                                 "headers": {"Authorization": "Bearer ${input:gh-token}"}},
                      "fetch": {"type": "stdio", "command": "uvx", "args": ["mcp-server-fetch"], "env": {"HOME_DIR": "${env:HOME}"}}}}"#;
        let options = Options { secret: Some("mcp-tokens".into()), ..Default::default() };
        let converted = all(vscode, &options);
        let github = converted.iter().find(|c| c.server.metadata.name.as_deref() == Some("github")).expect("github");
        let header = &github.server.spec.http.as_ref().expect("http").headers[0];
        let selector = &header.value_from.as_ref().expect("a password input is a Secret").secret_key_ref;
        assert_eq!((selector.name.as_str(), selector.key.as_str()), ("mcp-tokens", "authorization"));
        let fetch = converted.iter().find(|c| c.server.metadata.name.as_deref() == Some("fetch")).expect("fetch");
        assert_eq!(fetch.server.spec.stdio.as_ref().expect("stdio").env[0].value.as_deref(), Some("${ENV:HOME}"));

        let folder = vscode.replace("mcp-server-fetch", "${workspaceFolder}");
        let err = convert_file(&folder, Format::ClientConfig, &options).expect_err("predefined");
        assert!(
            err.to_string().contains("servers.fetch.args[0]") && err.to_string().contains("${workspaceFolder}"),
            "{err}"
        );
    }

    #[test]
    fn sse_entries_and_bad_entries_fail_the_whole_file() {
        let mixed = r#"{"mcpServers": {"ok": {"command": "uvx", "args": ["x"]},
          "old": {"type": "sse", "url": "https://x.example.com/sse"}, "none": {"args": []}}}"#;
        let err = convert_file(mixed, Format::ClientConfig, &Options::default()).expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("mcpServers.old.type") && text.contains("Streamable HTTP"), "{text}");
        assert!(text.contains("mcpServers.none") && text.contains("command"), "{text}");
        let home = r#"{"mcpServers": {"fs": {"command": "npx", "args": ["${HOME}/docs"]}}}"#;
        let err = convert_file(home, Format::ClientConfig, &Options::default()).expect_err("argv");
        assert!(err.to_string().contains("mcpServers.fs.args[0]"), "{err}");
    }

    #[test]
    fn disabled_entries_convert_disabled() {
        let cline = r#"{"mcpServers": {"fs": {"command": "npx", "args": ["x"], "disabled": true, "autoApprove": []}}}"#;
        let c = all(cline, &Options::default());
        assert_eq!(c[0].server.spec.enabled, Some(false));
    }
}
