//! What the pool needs to reach one server, derived from its McpServer. Pure.
//!
//! ```text
//! McpServer + Mode ──ServerConfig::new──▶ ServerConfig { transport (templates unexpanded), budgets,
//!                                                       fingerprint of the connection fields }
//! ServerConfig + env lookup (at connect time) ──resolve──▶ Endpoint (values expanded) | MissingEnv
//! ```
//!
//! `${ENV:...}` references expand from the agent's environment when a session is established,
//! never earlier, and expanded values never reach a log. Secret-backed values
//! (`valueFrom.secretKeyRef`) reach the agent as env vars the webhook sets, named by
//! [`secret_env_var`]; local mode reads the same names, so a developer exports them by hand.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;

use crate::api::env_ref::{self, MissingEnv, Template};
use crate::api::{McpServer, ServerBudgets, Transport};
use crate::registry::snapshot::short_hash;

/// Where stdio servers run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Local mode: as child processes of the agent.
    Local,
    /// Kubernetes: in sidecars, reached through `<socket_dir>/<server>.sock` (the bridge).
    Sidecar {
        /// The shared run directory (`/spear/run`).
        socket_dir: PathBuf,
        /// The stdio servers this pod was given sidecars for (the webhook's
        /// `SPEAR_SIDECAR_SERVERS`); `None` when not known. A stdio server outside it was added
        /// after the pod started and needs a pod restart (sidecars are fixed at admission).
        sidecars: Option<BTreeSet<String>>,
    },
}

/// Variables a stdio child inherits from the agent besides its configured env: enough for
/// `npx`/`uvx`/`python` to work, nothing that could carry the agent's own secrets.
pub(crate) const INHERITED_ENV: &[&str] = &["PATH", "HOME", "USER", "LANG", "LC_ALL", "TMPDIR", "TZ", "NODE_PATH"];

/// The env var that carries a secret-backed value of `server`'s `field` (an env or header name):
/// `SPEAR_SECRET_<SERVER>_<FIELD>`, upper-cased, other characters as `_`.
pub(crate) fn secret_env_var(server: &str, field: &str) -> String {
    let clean = |s: &str| -> String {
        s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect()
    };
    format!("SPEAR_SECRET_{}_{}", clean(server), clean(field))
}

/// A configured value: a template over the agent's environment, or a secret delivered as an env
/// var.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Value {
    /// `value`, possibly with `${ENV:...}` references.
    Template(Template),
    /// `valueFrom`: the agent reads this env var (set by the webhook).
    FromEnv(String),
}

impl Value {
    fn resolve(&self, lookup: &impl Fn(&str) -> Option<String>) -> Result<String, MissingEnv> {
        match self {
            Value::Template(t) => t.expand(lookup),
            Value::FromEnv(name) => lookup(name).ok_or_else(|| MissingEnv { name: name.clone() }),
        }
    }
}

/// How to reach a server, values unexpanded.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TransportConfig {
    /// A child process speaking MCP on stdin/stdout.
    Stdio {
        /// argv[0].
        command: String,
        /// The rest of argv.
        args: Vec<String>,
        /// Configured environment.
        env: Vec<(String, Value)>,
        working_dir: Option<PathBuf>,
    },
    /// The bridge's Unix socket (Kubernetes sidecar).
    Socket {
        /// Socket path.
        path: PathBuf,
    },
    /// A stdio server this pod has no sidecar for: it joined the profile after the pod started.
    MissingSidecar,
    /// Streamable HTTP.
    Http {
        /// Endpoint URL.
        url: String,
        /// Headers.
        headers: Vec<(String, Value)>,
    },
}

/// How to reach a server, values expanded: what a connector uses. Its `Debug` redacts values.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// See [`TransportConfig::Stdio`].
    Stdio {
        /// argv[0].
        command: String,
        /// The rest of argv.
        args: Vec<String>,
        /// The child's whole environment (inherited basics plus configured values).
        env: Vec<(String, String)>,
        working_dir: Option<PathBuf>,
    },
    /// See [`TransportConfig::Socket`].
    Socket {
        /// Socket path.
        path: PathBuf,
    },
    /// See [`TransportConfig::MissingSidecar`].
    MissingSidecar,
    /// See [`TransportConfig::Http`].
    Http {
        url: String,
        /// Headers, expanded.
        headers: Vec<(String, String)>,
    },
}

impl std::fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Env and header values may be secrets: only names are shown.
        match self {
            Endpoint::Stdio { command, args, env, working_dir } => f
                .debug_struct("Stdio")
                .field("command", command)
                .field("args", args)
                .field("env", &env.iter().map(|(k, _)| k).collect::<Vec<_>>())
                .field("working_dir", working_dir)
                .finish(),
            Endpoint::Socket { path } => f.debug_struct("Socket").field("path", path).finish(),
            Endpoint::MissingSidecar => f.write_str("MissingSidecar"),
            Endpoint::Http { url, headers } => f
                .debug_struct("Http")
                .field("url", url)
                .field("headers", &headers.iter().map(|(k, _)| k).collect::<Vec<_>>())
                .finish(),
        }
    }
}

/// Everything the pool keeps about one server.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ServerConfig {
    /// The McpServer's `metadata.name`.
    pub(crate) id: Arc<str>,
    /// How to reach it.
    pub(crate) transport: TransportConfig,
    /// Budgets with defaults applied.
    pub(crate) budgets: ServerBudgets,
    /// Hash of the connection fields: a different fingerprint means the session must restart.
    pub(crate) fingerprint: String,
}

/// Why an McpServer cannot be turned into a config (validation refuses these earlier).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("McpServer {server}: {message}")]
pub struct ConfigError {
    pub(crate) server: String,
    pub(crate) message: String,
}

fn template(server: &str, field: &str, value: &str) -> Result<Value, ConfigError> {
    env_ref::parse(value)
        .map(Value::Template)
        .map_err(|e| ConfigError { server: server.into(), message: format!("{field}: {e}") })
}

impl ServerConfig {
    /// The config of `server` in `mode`.
    pub(crate) fn new(server: &McpServer, mode: &Mode) -> Result<Self, ConfigError> {
        let id = server.metadata.name.clone().unwrap_or_default();
        let spec = &server.spec;
        let err = |message: &str| ConfigError { server: id.clone(), message: message.into() };
        let transport = match (spec.transport, mode) {
            (Transport::Stdio, Mode::Sidecar { sidecars: Some(sidecars), .. }) if !sidecars.contains(&id) => {
                TransportConfig::MissingSidecar
            }
            (Transport::Stdio, Mode::Sidecar { socket_dir, .. }) => {
                TransportConfig::Socket { path: socket_dir.join(format!("{id}.sock")) }
            }
            (Transport::Stdio, Mode::Local) => {
                let stdio = spec.stdio.as_ref().ok_or_else(|| err("spec.stdio is required"))?;
                let mut env = Vec::with_capacity(stdio.env.len());
                for var in &stdio.env {
                    let value = match (&var.value, &var.value_from) {
                        (Some(v), _) => template(&id, &format!("spec.stdio.env[{}]", var.name), v)?,
                        (None, Some(_)) => Value::FromEnv(secret_env_var(&id, &var.name)),
                        (None, None) => Value::Template(Template::default()),
                    };
                    env.push((var.name.clone(), value));
                }
                TransportConfig::Stdio {
                    command: stdio.command.clone(),
                    args: stdio.args.clone(),
                    env,
                    working_dir: stdio.working_dir.as_ref().map(PathBuf::from),
                }
            }
            (Transport::StreamableHttp, _) => {
                let http = spec.http.as_ref().ok_or_else(|| err("spec.http is required"))?;
                let mut headers = Vec::with_capacity(http.headers.len());
                for h in &http.headers {
                    let value = match (&h.value, &h.value_from) {
                        (Some(v), _) => template(&id, &format!("spec.http.headers[{}]", h.name), v)?,
                        (None, _) => Value::FromEnv(secret_env_var(&id, &h.name)),
                    };
                    headers.push((h.name.clone(), value));
                }
                TransportConfig::Http { url: http.url.clone(), headers }
            }
        };
        // The fingerprint covers what a session depends on; allowlists and budgets do not
        // restart anything.
        let mut fields = serde_json::to_vec(&(&spec.transport, &spec.stdio, &spec.http)).unwrap_or_default();
        if let Mode::Sidecar { socket_dir, .. } = mode {
            fields.extend_from_slice(socket_dir.as_os_str().as_encoded_bytes());
        }
        let fingerprint = short_hash(&fields);
        Ok(ServerConfig { id: id.as_str().into(), transport, budgets: spec.budgets(), fingerprint })
    }

    /// Expands every value with `lookup` (the agent's environment). The first unset variable
    /// without a default makes the server unavailable (`env_missing`).
    pub(crate) fn resolve(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<Endpoint, MissingEnv> {
        Ok(match &self.transport {
            TransportConfig::Stdio { command, args, env, working_dir } => {
                let mut resolved: Vec<(String, String)> =
                    INHERITED_ENV.iter().filter_map(|k| lookup(k).map(|v| (k.to_string(), v))).collect();
                for (name, value) in env {
                    let value = value.resolve(&lookup)?;
                    resolved.retain(|(k, _)| k != name);
                    resolved.push((name.clone(), value));
                }
                Endpoint::Stdio {
                    command: command.clone(),
                    args: args.clone(),
                    env: resolved,
                    working_dir: working_dir.clone(),
                }
            }
            TransportConfig::Socket { path } => Endpoint::Socket { path: path.clone() },
            TransportConfig::MissingSidecar => Endpoint::MissingSidecar,
            TransportConfig::Http { url, headers } => Endpoint::Http {
                url: url.clone(),
                headers: headers
                    .iter()
                    .map(|(name, value)| Ok((name.clone(), value.resolve(&lookup)?)))
                    .collect::<Result<_, MissingEnv>>()?,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{EnvVar, EnvVarSource, SecretKeySelector};

    use super::*;
    use crate::api::HttpHeader;

    fn stdio() -> McpServer {
        McpServer::test("fs").stdio("npx", ["-y"])
    }

    fn env(name: &str) -> Option<String> {
        match name {
            "PATH" => Some("/bin".into()),
            "TOKEN" => Some("s3cret".into()),
            "SPEAR_SECRET_FS_DB" => Some("from-secret".into()),
            _ => None,
        }
    }

    #[test]
    fn stdio_env_expands_over_inherited_basics() {
        let server = stdio().env("API", "${ENV:TOKEN}").env("MODE", "${ENV:MODE:-fast}").env_var(EnvVar {
            name: "DB".into(),
            value: None,
            value_from: Some(EnvVarSource { secret_key_ref: Some(SecretKeySelector::default()), ..Default::default() }),
        });
        let config = ServerConfig::new(&server, &Mode::Local).expect("config");
        let Endpoint::Stdio { env: resolved, .. } = config.resolve(env).expect("resolved") else { panic!("stdio") };
        let pairs: Vec<(&str, &str)> = resolved.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(pairs, [("PATH", "/bin"), ("API", "s3cret"), ("MODE", "fast"), ("DB", "from-secret")]);
    }

    #[test]
    fn a_missing_variable_names_it_and_debug_never_shows_values() {
        let server = stdio().env("X", "${ENV:NOPE}");
        let config = ServerConfig::new(&server, &Mode::Local).expect("config");
        assert_eq!(config.resolve(env).expect_err("missing").name, "NOPE");
        let ok = ServerConfig::new(&stdio().env("A", "${ENV:TOKEN}"), &Mode::Local)
            .expect("config")
            .resolve(env)
            .expect("resolved");
        assert!(!format!("{ok:?}").contains("s3cret"));
    }

    #[test]
    fn sidecar_mode_reaches_stdio_servers_through_the_bridge_socket() {
        let mode = Mode::Sidecar { socket_dir: "/spear/run".into(), sidecars: None };
        let config = ServerConfig::new(&stdio(), &mode).expect("config");
        assert_eq!(config.transport, TransportConfig::Socket { path: "/spear/run/fs.sock".into() });
        let with_sidecar = Mode::Sidecar { socket_dir: "/spear/run".into(), sidecars: Some(["fs".to_string()].into()) };
        let config = ServerConfig::new(&stdio(), &with_sidecar).expect("config");
        assert_eq!(config.transport, TransportConfig::Socket { path: "/spear/run/fs.sock".into() });
    }

    #[test]
    fn stdio_server_without_a_sidecar_in_this_pod_is_marked_missing() {
        let mode = Mode::Sidecar { socket_dir: "/spear/run".into(), sidecars: Some(["other".to_string()].into()) };
        let config = ServerConfig::new(&stdio(), &mode).expect("config");
        assert_eq!(config.transport, TransportConfig::MissingSidecar);
        assert_eq!(format!("{:?}", config.resolve(|_| None).expect("nothing to resolve")), "MissingSidecar");
    }

    #[test]
    fn headers_expand_and_secrets_come_from_webhook_env_vars() {
        // No literal value: the agent reads it from the env var the webhook sets.
        let server = McpServer::test("web").http("http://127.0.0.1:1/mcp").http_header(HttpHeader {
            name: "Authorization".into(),
            value: None,
            value_from: None,
        });
        let config = ServerConfig::new(&server, &Mode::Local).expect("config");
        let missing = config.resolve(env).expect_err("secret env unset");
        assert_eq!(missing.name, "SPEAR_SECRET_WEB_AUTHORIZATION");
    }

    #[test]
    fn fingerprint_moves_with_connection_fields_only() {
        let a = ServerConfig::new(&stdio(), &Mode::Local).expect("config");
        let mut changed = stdio();
        changed.spec.allowed_tools = vec!["*".into()];
        assert_eq!(ServerConfig::new(&changed, &Mode::Local).expect("config").fingerprint, a.fingerprint);
        changed.spec.stdio.as_mut().expect("stdio").args.push("--verbose".into());
        assert_ne!(ServerConfig::new(&changed, &Mode::Local).expect("config").fingerprint, a.fingerprint);
    }
}
