//! `spearlet tools`: a small client of the agent's gRPC door, for people and scripts inside the
//! pod (`kubectl exec … -- /spear/bin/spearlet tools list`).
//!
//! ```text
//! tools list [--server ID] ──McpRegistry.List──▶ servers ──per server: Open, ListTools, Close──▶ table
//! tools call NAME --args JSON ──NAME → server (server/tool, mcp.<server>.<tool>, or List lookup)
//!                             ──Open, CallTool, Close──▶ the tool's text on stdout
//! ```
//!
//! Exit status: 0 on success; 1 when the agent refused (policy, unknown tool or server) or the
//! tool failed (its error on stderr, or its own error text on stdout); 2 on a usage error or
//! when the agent cannot be reached.

use std::process::ExitCode;
use std::time::Duration;

use clap::Subcommand;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use super::agent_args::parse_api_key;
use crate::agent::grpc::pb;
use crate::agent::grpc::pb::mcp_registry_client::McpRegistryClient;
use crate::agent::grpc::pb::mcp_sessions_client::McpSessionsClient;
use crate::api::api_key::ApiKey;
use crate::api::keys::{ENV_API_KEY, ENV_GRPC_ADDR, ENV_TOOLS_ARGS, ENV_TOOLS_SERVER, PORT_GRPC};
use crate::cli::{EXIT_INVALID, block_on, say, tell, usage};
use crate::telemetry::error_chain;

/// How long to wait for the agent to accept the connection: it is on loopback, so a slow
/// connect means it is not there.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Descriptions are cut to this many characters in the table, so one tool stays one line.
const DESCRIPTION_WIDTH: usize = 60;

/// Where the agent's gRPC door is.
#[derive(clap::Args, Debug, Clone)]
pub struct GrpcArgs {
    /// Address of the agent's gRPC door (`host:port`, or an `http://` URL).
    #[arg(long, env = ENV_GRPC_ADDR, default_value_t = format!("127.0.0.1:{PORT_GRPC}"), value_name = "ADDR")]
    grpc_addr: String,
    /// The agent's API key, sent as `authorization: Bearer <key>` (in a pod, the webhook sets the
    /// variable).
    #[arg(long, env = ENV_API_KEY, hide_env_values = true, value_name = "KEY", value_parser = parse_api_key)]
    api_key: Option<ApiKey>,
}

/// `spearlet tools …`: list and call the tools this pod may use, through the agent's gRPC door.
#[derive(Subcommand, Debug)]
pub enum ToolsCommand {
    /// List the tools this pod may use, as a table (NAME, SERVER, TOOL, DESCRIPTION).
    ///
    /// Exit status: 0 on success, 1 when a server cannot be used (or --server names one the
    /// profile does not allow), 2 when the agent cannot be reached.
    List {
        #[command(flatten)]
        grpc: GrpcArgs,
        /// Only this server's tools (an McpServer name).
        #[arg(long, env = ENV_TOOLS_SERVER, value_name = "ID")]
        server: Option<String>,
    },
    /// Call one tool and print its text.
    ///
    /// NAME is `server/tool` (the tool's name on its server), a model-facing name
    /// (`mcp__server__tool`) or the dotted form `mcp.server.tool`. Exit status: 0 on success,
    /// 1 when the call is refused or the tool fails, 2 on a usage error or when the agent
    /// cannot be reached.
    Call {
        #[command(flatten)]
        grpc: GrpcArgs,
        /// The tool to call.
        #[arg(value_name = "NAME")]
        name: String,
        /// The arguments, as a JSON object.
        #[arg(long, env = ENV_TOOLS_ARGS, default_value = "{}", value_name = "JSON")]
        args: String,
    },
}

impl ToolsCommand {
    /// Runs the command to completion on its own single-threaded runtime (call it outside any
    /// Tokio runtime).
    pub fn run(self) -> anyhow::Result<ExitCode> {
        block_on(async {
            let outcome = match self {
                ToolsCommand::List { grpc, server } => list(&grpc, server.as_deref()).await,
                ToolsCommand::Call { grpc, name, args } => call(&grpc, &name, &args).await,
            };
            outcome.map_err(Failure::into_error)
        })
    }
}

// === failures ===

/// Why a command stopped early, and the exit status it maps to.
#[derive(Debug, thiserror::Error)]
enum Failure {
    /// Bad flags or arguments.
    #[error("{0}")]
    Usage(String),
    /// The agent is not reachable at the address.
    #[error(
        "cannot reach the agent's gRPC door at {addr}: {reason} (is spearlet running in this pod? set --grpc-addr or {ENV_GRPC_ADDR})"
    )]
    Connect { addr: String, reason: String },
    /// The agent refused the request (policy, unknown tool or server).
    #[error("{0}")]
    Refused(String),
    /// The request failed in a way the user must fix or retry (bad request, agent error).
    #[error("{0}")]
    Rpc(String),
}

impl Failure {
    /// Maps a gRPC status: refusals exit 1, the rest (transport, bad request) 2.
    fn from_status(what: &str, status: &tonic::Status) -> Self {
        let message = format!("{what}: {}", status.message());
        match status.code() {
            tonic::Code::PermissionDenied
            | tonic::Code::Unauthenticated
            | tonic::Code::NotFound
            | tonic::Code::ResourceExhausted
            | tonic::Code::FailedPrecondition => Failure::Refused(message),
            tonic::Code::Unavailable => {
                Failure::Rpc(format!("{what}: the agent is not available: {}", status.message()))
            }
            _ => Failure::Rpc(message),
        }
    }

    /// Refusals exit 1; the rest (the agent unreachable, a bad request) are usage errors.
    fn into_error(self) -> anyhow::Error {
        match self {
            Failure::Refused(_) => self.into(),
            Failure::Usage(_) | Failure::Connect { .. } | Failure::Rpc(_) => usage(self),
        }
    }
}

// === connection ===

struct Clients {
    sessions: McpSessionsClient<InterceptedService<Channel, Bearer>>,
    registry: McpRegistryClient<InterceptedService<Channel, Bearer>>,
}

/// Sends the API key with every call, when there is one.
#[derive(Clone)]
struct Bearer(Option<MetadataValue<Ascii>>);

impl Interceptor for Bearer {
    fn call(&mut self, mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
        if let Some(value) = &self.0 {
            request.metadata_mut().insert("authorization", value.clone());
        }
        Ok(request)
    }
}

/// `host:port` → `http://host:port`; a URL is kept.
fn endpoint_uri(addr: &str) -> String {
    if addr.starts_with("http://") || addr.starts_with("https://") {
        addr.to_string()
    } else {
        format!("http://{addr}")
    }
}

async fn connect(grpc: &GrpcArgs) -> Result<Clients, Failure> {
    let addr = grpc.grpc_addr.trim();
    let endpoint = Endpoint::from_shared(endpoint_uri(addr))
        .map_err(|e| Failure::Usage(format!("--grpc-addr '{addr}' is not a valid address: {e}")))?
        .connect_timeout(CONNECT_TIMEOUT);
    // The key's alphabet is a header value's: this cannot fail for a parsed key.
    let bearer = match &grpc.api_key {
        Some(key) => Some(
            MetadataValue::try_from(format!("Bearer {}", key.expose()))
                .map_err(|_| Failure::Usage(format!("--api-key (env {ENV_API_KEY}) is not a valid header value")))?,
        ),
        None => None,
    };
    let channel =
        endpoint.connect().await.map_err(|e| Failure::Connect { addr: addr.to_string(), reason: error_chain(&e) })?;
    let bearer = Bearer(bearer);
    Ok(Clients {
        sessions: McpSessionsClient::with_interceptor(channel.clone(), bearer.clone()),
        registry: McpRegistryClient::with_interceptor(channel, bearer),
    })
}

impl Clients {
    async fn servers(&mut self) -> Result<pb::ListReply, Failure> {
        let reply = self.registry.list(pb::ListRequest {}).await;
        reply.map(tonic::Response::into_inner).map_err(|s| Failure::from_status("listing servers", &s))
    }

    async fn open(&mut self, server_id: &str) -> Result<String, Failure> {
        let request = pb::OpenRequest { server_id: server_id.to_string(), ..Default::default() };
        let reply = self.sessions.open(request).await;
        let reply = reply.map_err(|s| Failure::from_status(&format!("opening a session on '{server_id}'"), &s))?;
        Ok(reply.into_inner().session_id)
    }

    /// Best effort: a session left open expires on the agent by itself.
    async fn close(&mut self, session_id: String) {
        if let Err(status) = self.sessions.close(pb::CloseRequest { session_id }).await {
            tracing::debug!(error = %status.message(), "closing the session failed");
        }
    }
}

// === list ===

async fn list(grpc: &GrpcArgs, only: Option<&str>) -> Result<ExitCode, Failure> {
    let mut clients = connect(grpc).await?;
    let listed = clients.servers().await?;
    let servers: Vec<&pb::Server> = listed.servers.iter().filter(|s| only.is_none_or(|o| s.id == o)).collect();
    if let Some(only) = only
        && servers.is_empty()
    {
        return Err(Failure::Refused(format!(
            "server '{only}' is not available to this workload (registry revision {})",
            listed.registry_revision
        )));
    }
    let mut rows = vec![["NAME".to_string(), "SERVER".to_string(), "TOOL".to_string(), "DESCRIPTION".to_string()]];
    let mut failed = false;
    let mut why_empty = Vec::new();
    for server in servers {
        let tools = match server_tools(&mut clients, &server.id).await {
            Ok(tools) => tools,
            Err(failure @ Failure::Refused(_)) => {
                // One unusable server should not hide the others' tools.
                tell(format_args!("error: {failure}"));
                failed = true;
                continue;
            }
            Err(failure) => return Err(failure),
        };
        if tools.is_empty() {
            why_empty.extend(no_tools_reason(server, std::time::SystemTime::now()));
        }
        for tool in tools {
            rows.push([tool.name, server.id.clone(), tool.server_tool, first_line(&tool.description)]);
        }
    }
    say(&table(&rows));
    for line in &why_empty {
        tell(format_args!("{line}"));
    }
    if rows.len() == 1 {
        tell(format_args!("no tools are available to this workload (registry revision {})", listed.registry_revision));
    }
    Ok(if failed { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS })
}

async fn server_tools(clients: &mut Clients, server_id: &str) -> Result<Vec<pb::Tool>, Failure> {
    let session_id = clients.open(server_id).await?;
    let listed = clients.sessions.list_tools(pb::ListToolsRequest { session_id: session_id.clone() }).await;
    clients.close(session_id).await;
    let listed = listed.map_err(|s| Failure::from_status(&format!("listing the tools of '{server_id}'"), &s))?;
    Ok(listed.into_inner().tools)
}

/// Why `server` shows no tools, from the state the agent reports: "filesystem: starting (npx),
/// 14 s of 120 s". `None` for an agent too old to report a state.
fn no_tools_reason(server: &pb::Server, now: std::time::SystemTime) -> Option<String> {
    let (id, detail) = (&server.id, &server.state_detail);
    let why = match server.state.as_str() {
        "starting" => {
            let since = std::time::UNIX_EPOCH
                + Duration::from_millis(u64::try_from(server.starting_since_unix_ms).unwrap_or(0));
            let elapsed = now.duration_since(since).unwrap_or_default().as_secs();
            format!("starting ({detail}), {elapsed} s of {} s", server.startup_budget_ms / 1000)
        }
        "list_failed" => format!("tools/list failed: {detail}"),
        "env_missing" => format!("needs the variable {detail}, which is not set in the agent's environment"),
        "deny_all" => "its allowedTools is empty, so none of its tools is exposed".to_string(),
        "not_listed" => "its tools are not listed yet".to_string(),
        "listed" => {
            "no tool of it passes the server's and the profile's patterns (`spearlet explain` says why)".to_string()
        }
        _ => return None,
    };
    Some(format!("{id}: {why}"))
}

/// The description's first line, cut to [`DESCRIPTION_WIDTH`] characters.
fn first_line(description: &str) -> String {
    let line = description.lines().next().unwrap_or_default().trim();
    if line.chars().count() <= DESCRIPTION_WIDTH {
        return line.to_string();
    }
    let cut: String = line.chars().take(DESCRIPTION_WIDTH - 1).collect();
    format!("{cut}…")
}

/// Left-aligned columns separated by two spaces; the last column is not padded.
fn table(rows: &[[String; 4]]) -> String {
    let mut widths = [0usize; 4];
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[i] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

// === call ===

/// Where a name points: the server to open and the name to call there.
#[derive(Debug, PartialEq, Eq)]
enum Target<'a> {
    /// The server is known from the name itself.
    Server { server: &'a str, tool: &'a str },
    /// A model-facing name: the server is looked up in the registry.
    Lookup(&'a str),
}

fn target(name: &str) -> Target<'_> {
    // The dotted form: `mcp.<server id>.<tool>`; ids are DNS labels, so the first dot ends it.
    if let Some((server, _)) = name.strip_prefix("mcp.").and_then(|rest| rest.split_once('.')) {
        return Target::Server { server, tool: name };
    }
    // Model-facing names never contain '/', so `server/tool` is unambiguous.
    match name.split_once('/') {
        Some((server, tool)) => Target::Server { server, tool },
        None => Target::Lookup(name),
    }
}

async fn call(grpc: &GrpcArgs, name: &str, args: &str) -> Result<ExitCode, Failure> {
    match serde_json::from_str::<serde_json::Value>(args) {
        Ok(serde_json::Value::Object(_)) => {}
        Ok(_) => return Err(Failure::Usage(format!("--args must be a JSON object, got {args}"))),
        Err(e) => return Err(Failure::Usage(format!("--args is not valid JSON: {e}"))),
    }
    let mut clients = connect(grpc).await?;
    let (server, tool) = match target(name) {
        Target::Server { server, tool } if !server.is_empty() && !tool.is_empty() => {
            (server.to_string(), tool.to_string())
        }
        Target::Server { .. } => return Err(Failure::Usage(format!("'{name}' is not SERVER/TOOL"))),
        Target::Lookup(tool) => {
            let listed = clients.servers().await?;
            match listed.servers.iter().find(|s| s.tools.iter().any(|t| t == tool)) {
                Some(server) => (server.id.clone(), tool.to_string()),
                None => {
                    return Err(Failure::Refused(format!(
                        "tool '{name}' is not available to this workload (registry revision {}); `spearlet tools list` shows what is",
                        listed.registry_revision
                    )));
                }
            }
        }
    };
    let session_id = clients.open(&server).await?;
    let request = pb::CallToolRequest { session_id: session_id.clone(), tool, args_json: args.to_string() };
    let reply = clients.sessions.call_tool(request).await;
    clients.close(session_id).await;
    let reply = reply.map_err(|s| Failure::from_status(&format!("calling '{name}'"), &s))?.into_inner();
    Ok(print_reply(&reply))
}

/// Prints a call's outcome and returns its exit status.
fn print_reply(reply: &pb::CallToolReply) -> ExitCode {
    if let Some(error) = &reply.error {
        // The reason and the wait, when the agent gave them: what a script branches on.
        let reason = if error.reason.is_empty() { String::new() } else { format!(" (reason {})", error.reason) };
        let wait = match error.retry_after_ms {
            Some(ms) => format!("; retry after {ms} ms"),
            None => String::new(),
        };
        tell(format_args!("error: {}{reason}: {}{wait}", error.code, error.message));
        return ExitCode::from(EXIT_INVALID);
    }
    say(&format!("{}\n", reply.text));
    if reply.truncated {
        tell(format_args!("warning: the output was truncated to the output budget (mcp_output_too_large)"));
    }
    if reply.is_error { ExitCode::from(EXIT_INVALID) } else { ExitCode::SUCCESS }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_without_tools_says_why() {
        let since = std::time::UNIX_EPOCH + Duration::from_secs(1_000_000);
        let starting = pb::Server {
            id: "filesystem".into(),
            state: "starting".into(),
            state_detail: "npx".into(),
            starting_since_unix_ms: 1_000_000_000,
            startup_budget_ms: 120_000,
            ..Default::default()
        };
        let now = since + Duration::from_millis(14_500);
        assert_eq!(no_tools_reason(&starting, now).as_deref(), Some("filesystem: starting (npx), 14 s of 120 s"));
        let failed = pb::Server {
            id: "web".into(),
            state: "list_failed".into(),
            state_detail: "no answer within 30000 ms".into(),
            ..Default::default()
        };
        assert_eq!(no_tools_reason(&failed, now).as_deref(), Some("web: tools/list failed: no answer within 30000 ms"));
        let old_agent = pb::Server { id: "web".into(), ..Default::default() };
        assert_eq!(no_tools_reason(&old_agent, now), None);
    }

    #[test]
    fn names_point_at_a_server_or_need_a_lookup() {
        assert_eq!(target("fx/echo"), Target::Server { server: "fx", tool: "echo" });
        assert_eq!(target("mcp.fx.read.file"), Target::Server { server: "fx", tool: "mcp.fx.read.file" });
        assert_eq!(target("mcp__fx__echo"), Target::Lookup("mcp__fx__echo"));
    }

    #[test]
    fn addresses_get_a_scheme_when_they_have_none() {
        assert_eq!(endpoint_uri("127.0.0.1:4041"), "http://127.0.0.1:4041");
        assert_eq!(endpoint_uri("http://[::1]:4041"), "http://[::1]:4041");
    }

    #[test]
    fn the_table_aligns_columns_and_cuts_descriptions() {
        let rows = [
            ["NAME".to_string(), "SERVER".into(), "TOOL".into(), "DESCRIPTION".into()],
            ["mcp__fx__echo".to_string(), "fx".into(), "echo".into(), first_line("Echoes.\nMore.")],
        ];
        assert_eq!(table(&rows), "NAME           SERVER  TOOL  DESCRIPTION\nmcp__fx__echo  fx      echo  Echoes.\n");
        assert_eq!(first_line(&"x".repeat(100)).chars().count(), DESCRIPTION_WIDTH);
    }

    #[test]
    fn refusals_exit_1_and_transport_failures_exit_2() {
        let denied = Failure::from_status("x", &tonic::Status::permission_denied("no"));
        assert!(matches!(denied, Failure::Refused(_)));
        let down = Failure::from_status("x", &tonic::Status::unavailable("down"));
        assert!(matches!(down, Failure::Rpc(_)));
    }
}
