//! The official MCP Registry's `server.json` into an McpServer.
//!
//! Both published spellings are read: camelCase (schemas 2025-09-29 and later: `registryType`,
//! `environmentVariables`, `remotes[].type`) and snake_case (2025-07-09: `registry_type`,
//! `environment_variables`, `remotes[].transport_type`). Unknown keys are ignored: the format
//! carries metadata (`repository`, `_meta`, `icons`) that a manifest has no place for.
//!
//! One server.json offers several ways to run one server; one is chosen:
//! - `remotes` first (no sidecar, nothing to download), the first `streamable-http` one; `sse`
//!   remotes are refused ([`sse_refusal`]). `--prefer package` picks a package first.
//! - `packages`: `npm` runs as `npx -y <id>@<version>`, `pypi` as `uvx <id>==<version>` (or the
//!   package's `runtimeHint`), with `runtimeArguments` before the package and
//!   `packageArguments` after it, in the `node:22-alpine` and `ghcr.io/astral-sh/uv:python3.12-alpine` images in
//!   a cluster (noted: change them freely). `oci` runs its image, whose entrypoint server.json
//!   does not carry: it converts with `--entrypoint`. `nuget` and `mcpb` are refused (no
//!   runtime image spear can name).
//! - Arguments and headers may hold `{variable}`s: a default fills one; a secret one or one
//!   without a default becomes a `${ENV:...}` reference where spear expands them (env values,
//!   header values) and is refused in argv, where nothing is expanded.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::EnvVar;
use serde::Deserialize;

use super::{ConvertError, Converted, NODE_IMAGE, Options, UV_IMAGE, Values, env_name, normalize_name, sse_refusal};
use crate::api::{HttpHeader, HttpSpec, McpServer, McpServerSpec, StdioSpec, Transport};

/// Which way to run a server.json server when it offers both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Prefer {
    /// Its remote endpoint.
    #[default]
    Remote,
    /// A package, run as a stdio server.
    Package,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub(super) struct ServerJson {
    name: String,
    #[serde(default)]
    title: Option<String>,
    #[serde(default)]
    description: Option<String>,
    #[serde(default)]
    packages: Vec<Package>,
    #[serde(default)]
    remotes: Vec<Remote>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Package {
    #[serde(alias = "registry_type", alias = "registry_name")]
    registry_type: String,
    #[serde(default, alias = "registry_base_url")]
    registry_base_url: Option<String>,
    identifier: String,
    #[serde(default)]
    version: Option<String>,
    #[serde(default, alias = "runtime_hint")]
    runtime_hint: Option<String>,
    #[serde(default)]
    transport: Option<PackageTransport>,
    #[serde(default, alias = "runtime_arguments")]
    runtime_arguments: Vec<Argument>,
    #[serde(default, alias = "package_arguments")]
    package_arguments: Vec<Argument>,
    #[serde(default, alias = "environment_variables")]
    environment_variables: Vec<Input>,
}

#[derive(Debug, Deserialize)]
struct PackageTransport {
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Remote {
    #[serde(rename = "type", alias = "transport_type")]
    kind: String,
    url: String,
    #[serde(default)]
    headers: Vec<Input>,
}

/// A named value: an environment variable, a header, or a `{variable}` of either.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Input {
    #[serde(default)]
    name: String,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    default: Option<String>,
    #[serde(default, alias = "is_required")]
    is_required: bool,
    #[serde(default, alias = "is_secret")]
    is_secret: bool,
    #[serde(default)]
    variables: BTreeMap<String, Input>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Argument {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    value: Option<String>,
    #[serde(default)]
    default: Option<String>,
    #[serde(default, alias = "value_hint")]
    value_hint: Option<String>,
    #[serde(default, alias = "is_required")]
    is_required: bool,
    #[serde(default)]
    variables: BTreeMap<String, Input>,
}

/// Maps one server.json; validation is the caller's.
pub(super) fn convert(json: ServerJson, options: &Options) -> Result<Converted, ConvertError> {
    // `io.github.owner/weather` → `weather`: the part after the namespace is the server's name.
    let short = json.name.rsplit('/').next().unwrap_or(&json.name);
    let name = normalize_name(short);
    if name.is_empty() {
        return Err(ConvertError::unsupported(
            "name",
            format!("'{}' has no letters or digits to name a resource", json.name),
        ));
    }
    let mut values = Values::new(options, &name);
    let remote = json.remotes.iter().position(|r| r.kind == "streamable-http" || r.kind == "streamable_http");
    let package = (!json.packages.is_empty()).then_some(0);
    let use_remote = match (remote, package, options.prefer) {
        (Some(_), Some(_), Prefer::Package) => false,
        (Some(_), _, _) => true,
        (None, Some(_), _) => false,
        (None, None, _) if !json.remotes.is_empty() => {
            let kind = &json.remotes[0].kind;
            let reason = if super::is_sse(kind) {
                sse_refusal()
            } else {
                format!("remote type '{kind}' is not one spear runs: it connects to streamable-http remotes")
            };
            return Err(ConvertError::unsupported("remotes[0].type", reason));
        }
        (None, None, _) => {
            return Err(ConvertError::unsupported("packages", "neither packages nor remotes: nothing to run"));
        }
    };
    let (transport, stdio, http) = if let Some(index) = remote.filter(|_| use_remote) {
        if package.is_some() {
            values
                .notes
                .push("chose the remote endpoint; convert with --prefer package to run the package instead".into());
        }
        (Transport::StreamableHttp, None, Some(remote_spec(&json.remotes[index], index, &mut values)?))
    } else {
        if remote.is_some() {
            values.notes.push("chose packages[0]; convert without --prefer package to use the remote endpoint".into());
        }
        (Transport::Stdio, Some(package_spec(&json.packages[0], options, &mut values)?), None)
    };
    let display_name = json.title.or(json.description.filter(|d| d.chars().count() <= 64));
    let server = McpServer::new(&name, McpServerSpec { display_name, transport, stdio, http, ..Default::default() });
    let mut notes = values.finish();
    notes.push(super::deny_by_default_note());
    Ok(Converted { server, notes })
}

fn remote_spec(remote: &Remote, index: usize, values: &mut Values<'_>) -> Result<HttpSpec, ConvertError> {
    if remote.url.contains('{') {
        return Err(ConvertError::unsupported(
            format!("remotes[{index}].url"),
            "the URL has {variables}; spec.http.url is used as written: replace them with the values",
        ));
    }
    let mut headers = Vec::new();
    for (i, header) in remote.headers.iter().enumerate() {
        let key = format!("remotes[{index}].headers[{i}]");
        if let Some(h) = header_value(header, &key, values)? {
            headers.push(h);
        }
    }
    Ok(HttpSpec { url: remote.url.clone(), headers, auth: None })
}

/// A header from its description: a secret from the environment or a Secret, a value or default
/// with its variables filled, or nothing for an optional header nobody set.
fn header_value(input: &Input, key: &str, values: &mut Values<'_>) -> Result<Option<HttpHeader>, ConvertError> {
    let text = input.value.as_deref().or(input.default.as_deref());
    let secret_variable = input.variables.values().any(|v| v.is_secret);
    if input.is_secret || secret_variable || text.is_none() && super::looks_secret(&input.name, None) {
        let prefix = text.map_or("", |t| super::auth_scheme_prefix(t).0);
        return Ok(Some(values.secret_header(&input.name, prefix, None)));
    }
    let Some(text) = text else {
        if input.is_required {
            let var = env_name(&values.server, &input.name);
            values.env_vars.push(var.clone());
            return Ok(Some(HttpHeader {
                name: input.name.clone(),
                value: Some(format!("${{ENV:{var}}}")),
                value_from: None,
            }));
        }
        values.notes.push(format!("{key} ({}) is optional and has no default: left out", input.name));
        return Ok(None);
    };
    let value = fill(text, &input.variables, key, &mut |var| {
        let env = env_name(&values.server, var);
        values.env_vars.push(env.clone());
        Ok(format!("${{ENV:{env}}}"))
    })?;
    Ok(Some(HttpHeader { name: input.name.clone(), value: Some(value), value_from: None }))
}

/// Replaces each `{variable}` in `text` by its default, or by what `unset` makes of a variable
/// without one (a reference, or a refusal where nothing is expanded).
fn fill(
    text: &str,
    variables: &BTreeMap<String, Input>,
    key: &str,
    unset: &mut dyn FnMut(&str) -> Result<String, ConvertError>,
) -> Result<String, ConvertError> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(open) = rest.find('{') {
        let Some(close) = rest[open..].find('}') else { break };
        let var = &rest[open + 1..open + close];
        out.push_str(&rest[..open]);
        match variables.get(var) {
            Some(Input { default: Some(default), is_secret: false, .. }) => out.push_str(default),
            Some(_) => out.push_str(&unset(var)?),
            None => {
                return Err(ConvertError::unsupported(key, format!("{{{var}}} is not among the declared variables")));
            }
        }
        rest = &rest[open + close + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

fn package_spec(package: &Package, options: &Options, values: &mut Values<'_>) -> Result<StdioSpec, ConvertError> {
    let key = format!("packages[0] ({} {})", package.registry_type, package.identifier);
    if let Some(t) = package.transport.as_ref().filter(|t| t.kind != "stdio") {
        return Err(ConvertError::unsupported(
            format!("{key}.transport"),
            format!(
                "a package serving {} runs a server the agent would have to reach over the network; run it yourself \
                 and register its URL (transport streamableHttp), or use a package that speaks stdio",
                t.kind
            ),
        ));
    }
    let version = package.version.as_deref().filter(|v| !v.is_empty() && *v != "latest");
    let runtime_args = arguments(&package.runtime_arguments, &format!("{key}.runtimeArguments"))?;
    let package_args = arguments(&package.package_arguments, &format!("{key}.packageArguments"))?;
    let (image, command, mut args) = match package.registry_type.as_str() {
        "npm" => {
            let runtime = package.runtime_hint.clone().unwrap_or_else(|| "npx".into());
            let mut args = runtime_args;
            if runtime == "npx" && !args.iter().any(|a| a == "-y" || a == "--yes") {
                args.insert(0, "-y".into());
            }
            args.push(version.map_or_else(|| package.identifier.clone(), |v| format!("{}@{v}", package.identifier)));
            (values.sidecar_image(NODE_IMAGE), runtime, args)
        }
        "pypi" => {
            let runtime = package.runtime_hint.clone().unwrap_or_else(|| "uvx".into());
            let mut args = runtime_args;
            args.push(version.map_or_else(|| package.identifier.clone(), |v| format!("{}=={v}", package.identifier)));
            (values.sidecar_image(UV_IMAGE), runtime, args)
        }
        "oci" => {
            let reference = oci_reference(package, version);
            let Some(entrypoint) = options.entrypoint.as_ref().filter(|e| !e.is_empty()) else {
                return Err(ConvertError::unsupported(
                    key,
                    format!(
                        "spear runs a stdio server's command inside its image, and server.json does not carry the \
                         image's entrypoint: convert with --entrypoint '[\"...\"]' (docker inspect --format \
                         '{{{{json .Config.Entrypoint}}}}' {reference})"
                    ),
                ));
            };
            if !runtime_args.is_empty() {
                values.notes.push(format!(
                    "the docker runtime arguments ({}) have no equivalent: a sidecar's mounts and network are the pod's",
                    runtime_args.join(" ")
                ));
            }
            (Some(reference), entrypoint[0].clone(), entrypoint[1..].to_vec())
        }
        other => {
            return Err(ConvertError::unsupported(
                key,
                format!(
                    "{other} packages are not converted: write spec.stdio (an image with the runtime, the command and args) by hand"
                ),
            ));
        }
    };
    args.extend(package_args);
    let mut env = Vec::new();
    for (i, var) in package.environment_variables.iter().enumerate() {
        if let Some(e) = env_var(var, &format!("{key}.environmentVariables[{i}]"), values)? {
            env.push(e);
        }
    }
    Ok(StdioSpec { image, command, args, env, ..Default::default() })
}

/// `docker.io/mcp/filesystem:1.0.2` from the package's registry, identifier and version.
fn oci_reference(package: &Package, version: Option<&str>) -> String {
    let host = package
        .registry_base_url
        .as_deref()
        .map(|u| u.trim_start_matches("https://").trim_start_matches("http://").trim_end_matches('/'))
        .filter(|h| !h.is_empty());
    let has_host = package.identifier.split('/').next().is_some_and(|first| first.contains('.') || first.contains(':'));
    let base = match host {
        Some(host) if !has_host => format!("{host}/{}", package.identifier),
        _ => package.identifier.clone(),
    };
    let tagged = base.rsplit('/').next().is_some_and(|last| last.contains(':') || last.contains('@'));
    match version {
        Some(v) if !tagged => format!("{base}:{v}"),
        _ => base,
    }
}

/// The argv of positional and named arguments: a value or default, variables filled from their
/// defaults; an optional one without either is left out; a required one without is refused.
fn arguments(list: &[Argument], key: &str) -> Result<Vec<String>, ConvertError> {
    let mut argv = Vec::new();
    for (i, arg) in list.iter().enumerate() {
        let key = format!("{key}[{i}]");
        let value = match arg.value.as_deref().or(arg.default.as_deref()) {
            Some(text) => Some(fill(text, &arg.variables, &key, &mut |var| {
                Err(ConvertError::unsupported(
                    key.clone(),
                    format!(
                        "{{{var}}} has no default and argv is not expanded: give it a default in server.json, or add the argument to spec.stdio.args after converting"
                    ),
                ))
            })?),
            None => None,
        };
        match (arg.kind.as_str(), value) {
            ("named", value) => {
                let Some(flag) = &arg.name else {
                    return Err(ConvertError::unsupported(key, "a named argument without a name"));
                };
                match value {
                    Some(v) => argv.extend([flag.clone(), v]),
                    None if arg.is_required => argv.push(flag.clone()),
                    None => {}
                }
            }
            ("positional", Some(v)) => argv.push(v),
            ("positional", None) if arg.is_required => {
                let hint = arg.value_hint.as_deref().unwrap_or("value");
                return Err(ConvertError::unsupported(
                    key,
                    format!(
                        "the required argument <{hint}> has no value or default: give it one in server.json, or add it to spec.stdio.args after converting"
                    ),
                ));
            }
            ("positional", None) => {}
            (other, _) => return Err(ConvertError::unsupported(key, format!("argument type '{other}' is unknown"))),
        }
    }
    Ok(argv)
}

fn env_var(input: &Input, key: &str, values: &mut Values<'_>) -> Result<Option<EnvVar>, ConvertError> {
    if input.is_secret || super::looks_secret(&input.name, input.value.as_deref().or(input.default.as_deref())) {
        return Ok(Some(values.secret_env(&input.name, None)));
    }
    let text = input.value.as_deref().or(input.default.as_deref());
    let value = match text {
        Some(text) => fill(text, &input.variables, key, &mut |var| {
            let env = env_name(&values.server, var);
            values.env_vars.push(env.clone());
            Ok(format!("${{ENV:{env}}}"))
        })?,
        None if input.is_required => {
            values.env_vars.push(input.name.clone());
            format!("${{ENV:{}}}", input.name)
        }
        None => {
            values.notes.push(format!("{key} ({}) is optional and has no default: left out", input.name));
            return Ok(None);
        }
    };
    Ok(Some(EnvVar { name: input.name.clone(), value: Some(value), value_from: None }))
}

#[cfg(test)]
mod tests {
    use super::super::{Format, convert as convert_file};
    use super::*;

    fn one(text: &str, options: &Options) -> Converted {
        let mut all = convert_file(text, Format::ServerJson, options).expect("converts");
        assert_eq!(all.len(), 1);
        all.remove(0)
    }

    /// The registry's published npm example (2025-12-11 schema, camelCase).
    const BRAVE: &str = r#"{
      "$schema": "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json",
      "name": "io.github.modelcontextprotocol/brave-search",
      "title": "Brave Search",
      "description": "MCP server for Brave Search API integration",
      "version": "1.0.2",
      "packages": [{
        "registryType": "npm",
        "registryBaseUrl": "https://registry.npmjs.org",
        "identifier": "@modelcontextprotocol/server-brave-search",
        "version": "1.0.2",
        "transport": {"type": "stdio"},
        "environmentVariables": [
          {"name": "BRAVE_API_KEY", "description": "Brave Search API Key", "isRequired": true, "isSecret": true},
          {"name": "LOG_LEVEL", "description": "Logging level", "default": "info"},
          {"name": "REGION", "description": "optional"}
        ]
      }]
    }"#;

    #[test]
    fn an_npm_package_runs_with_npx_and_its_secret_stays_out() {
        let c = one(BRAVE, &Options::default());
        let s = &c.server;
        assert_eq!(s.metadata.name.as_deref(), Some("brave-search"));
        assert_eq!(s.spec.display_name.as_deref(), Some("Brave Search"));
        let stdio = s.spec.stdio.as_ref().expect("stdio");
        assert_eq!(
            (stdio.command.as_str(), stdio.args.as_slice()),
            ("npx", &["-y".to_string(), "@modelcontextprotocol/server-brave-search@1.0.2".to_string()][..])
        );
        assert_eq!(stdio.image.as_deref(), Some(NODE_IMAGE));
        let env: Vec<(&str, Option<&str>)> = stdio.env.iter().map(|e| (e.name.as_str(), e.value.as_deref())).collect();
        assert_eq!(env, [("BRAVE_API_KEY", Some("${ENV:BRAVE_API_KEY}")), ("LOG_LEVEL", Some("info"))]);
        assert!(c.notes.iter().any(|n| n.contains("set BRAVE_API_KEY")), "{:?}", c.notes);
        assert!(c.notes.iter().any(|n| n.contains("REGION") && n.contains("left out")), "{:?}", c.notes);
    }

    #[test]
    fn with_a_secret_name_secrets_are_secret_key_refs_and_the_grant_is_noted() {
        let options = Options { secret: Some("brave".into()), ..Default::default() };
        let c = one(BRAVE, &options);
        let key = c.server.spec.stdio.as_ref().expect("stdio").env[0].value_from.clone().expect("from a Secret");
        let selector = key.secret_key_ref.expect("secretKeyRef");
        assert_eq!((selector.name.as_str(), selector.key.as_str()), ("brave", "BRAVE_API_KEY"));
        assert!(c.notes.iter().any(|n| n.contains("mcp.spear.dev/allowed-servers: \"brave-search\"")), "{:?}", c.notes);
    }

    /// The 2025-07-09 spelling (snake_case), a PyPI package with a runtime hint and a remote.
    const WEATHER: &str = r#"{
      "name": "io.github.example/weather-mcp",
      "version_detail": {"version": "0.5.0"},
      "packages": [{
        "registry_type": "pypi", "identifier": "weather-mcp-server", "version": "0.5.0", "runtime_hint": "uvx",
        "package_arguments": [
          {"type": "named", "name": "--units", "default": "celsius"},
          {"type": "positional", "value_hint": "city", "default": "{city}", "variables": {"city": {"default": "Oslo"}}}
        ],
        "environment_variables": [{"name": "WEATHER_API_KEY", "is_required": true, "is_secret": true}]
      }],
      "remotes": [
        {"transport_type": "sse", "url": "https://weather.example.com/sse"},
        {"transport_type": "streamable-http", "url": "https://weather.example.com/mcp",
         "headers": [{"name": "Authorization", "value": "Bearer {token}", "is_required": true,
                      "variables": {"token": {"is_secret": true}}},
                     {"name": "X-Region", "default": "eu-west-1"}]}
      ]
    }"#;

    #[test]
    fn a_remote_is_chosen_first_and_a_package_on_request() {
        let c = one(WEATHER, &Options::default());
        let http = c.server.spec.http.as_ref().expect("http");
        assert_eq!(http.url, "https://weather.example.com/mcp");
        let headers: Vec<(&str, Option<&str>)> =
            http.headers.iter().map(|h| (h.name.as_str(), h.value.as_deref())).collect();
        assert_eq!(
            headers,
            [("Authorization", Some("Bearer ${ENV:WEATHER_MCP_TOKEN}")), ("X-Region", Some("eu-west-1"))]
        );

        let c = one(WEATHER, &Options { prefer: Prefer::Package, ..Default::default() });
        let stdio = c.server.spec.stdio.as_ref().expect("stdio");
        assert_eq!(stdio.command, "uvx");
        assert_eq!(stdio.args, ["weather-mcp-server==0.5.0", "--units", "celsius", "Oslo"]);
        assert!(c.notes.iter().any(|n| n.contains("--prefer")), "{:?}", c.notes);
    }

    #[test]
    fn an_sse_only_server_and_a_required_argument_without_value_are_refused() {
        let sse = r#"{"name": "a/b", "remotes": [{"type": "sse", "url": "https://x.example.com/sse"}]}"#;
        let err = convert_file(sse, Format::ServerJson, &Options::default()).expect_err("sse");
        assert!(err.to_string().contains("remotes[0].type") && err.to_string().contains("Streamable HTTP"), "{err}");

        let filesystem = r#"{"name": "io.github.modelcontextprotocol/filesystem", "packages": [{"registryType": "npm",
          "identifier": "@modelcontextprotocol/server-filesystem", "version": "1.0.2",
          "packageArguments": [{"type": "positional", "valueHint": "target_dir", "isRequired": true}]}]}"#;
        let err = convert_file(filesystem, Format::ServerJson, &Options::default()).expect_err("no value");
        assert!(err.to_string().contains("packageArguments[0]") && err.to_string().contains("<target_dir>"), "{err}");
    }

    #[test]
    fn an_oci_package_needs_its_entrypoint() {
        let oci = r#"{"name": "io.github.example/database-manager", "packages": [{"registryType": "oci",
          "registryBaseUrl": "https://docker.io", "identifier": "example/database-manager-mcp", "version": "3.1.0",
          "runtimeArguments": [{"type": "named", "name": "--network", "value": "host"}],
          "packageArguments": [{"type": "named", "name": "--host", "default": "localhost"}],
          "environmentVariables": [{"name": "DB_PASSWORD", "isRequired": true, "isSecret": true}]}]}"#;
        let err = convert_file(oci, Format::ServerJson, &Options::default()).expect_err("no entrypoint");
        assert!(
            err.to_string().contains("--entrypoint")
                && err.to_string().contains("docker.io/example/database-manager-mcp:3.1.0"),
            "{err}"
        );
        let options = Options { entrypoint: Some(vec!["node".into(), "/app/index.js".into()]), ..Default::default() };
        let c = one(oci, &options);
        let stdio = c.server.spec.stdio.as_ref().expect("stdio");
        assert_eq!(stdio.image.as_deref(), Some("docker.io/example/database-manager-mcp:3.1.0"));
        assert_eq!(
            (stdio.command.as_str(), stdio.args.as_slice()),
            ("node", &["/app/index.js".to_string(), "--host".into(), "localhost".into()][..])
        );
        assert!(c.notes.iter().any(|n| n.contains("--network host")), "{:?}", c.notes);
    }
}
