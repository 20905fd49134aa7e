//! Shared setup for the agent tests: registries of real servers, a running agent core.

use std::sync::Arc;

use spear::agent::{Agent, AgentOptions, AuditSink};
use spear::api::manifest::Object;
use spear::api::{HttpSpec, McpProfile, McpProfileSpec, McpServer, McpServerSpec, StdioSpec, Transport};
use spear::mcp::{Pool, PoolOptions};
use spear::registry::snapshot::{Entry, Snapshot};
use spear::registry::view::StaticRegistry;
use spear::testing::mcp_servers::Command;
use tokio_util::sync::CancellationToken;

/// An McpServer running `command` over stdio, all tools allowed.
pub fn stdio_server(id: &str, command: &Command) -> McpServer {
    let env = command
        .env
        .iter()
        .map(|(k, v)| k8s_openapi::api::core::v1::EnvVar { name: k.clone(), value: Some(v.clone()), value_from: None })
        .collect();
    McpServer::new(
        id,
        McpServerSpec {
            transport: Transport::Stdio,
            stdio: Some(StdioSpec {
                command: command.program.to_string_lossy().into_owned(),
                args: command.args.clone(),
                env,
                ..Default::default()
            }),
            allowed_tools: vec!["*".into()],
            ..Default::default()
        },
    )
}

/// An McpServer at `http://127.0.0.1:<port>/mcp`, all tools allowed.
pub fn http_server(id: &str, port: u16) -> McpServer {
    McpServer::new(
        id,
        McpServerSpec {
            transport: Transport::StreamableHttp,
            http: Some(HttpSpec { url: format!("http://127.0.0.1:{port}/mcp"), headers: vec![] }),
            allowed_tools: vec!["*".into()],
            ..Default::default()
        },
    )
}

/// An McpProfile allowing `servers`.
pub fn profile(name: &str, servers: &[&str]) -> McpProfile {
    McpProfile::new(
        name,
        McpProfileSpec { servers: servers.iter().map(|s| s.to_string()).collect(), ..Default::default() },
    )
}

/// A snapshot of these objects (local-mode resourceVersions).
pub fn snapshot(objects: Vec<Object>) -> Snapshot {
    Snapshot::build(objects.into_iter().map(|o| Entry::local("test.yaml", 1, o)), Vec::new())
}

/// A running agent core and what stops it.
pub struct TestAgent {
    /// The agent (clone it into the door under test).
    pub agent: Agent,
    /// The registry it serves; `replace` publishes a new snapshot.
    pub registry: Arc<StaticRegistry>,
    /// Cancels the refresh task (closing every session).
    pub cancel: CancellationToken,
}

impl Drop for TestAgent {
    fn drop(&mut self) {
        self.cancel.cancel();
    }
}

/// Starts an agent serving `profile` over `objects`, ready (tools listed) on return. Audit is off.
pub async fn start_agent(objects: Vec<Object>, profile: &str) -> TestAgent {
    let registry = Arc::new(StaticRegistry::new(snapshot(objects)));
    let pool = Pool::with_env(
        PoolOptions { idle_timeout: None, ..PoolOptions::default() },
        Arc::new(|name: &str| std::env::var(name).ok()),
    );
    let mut options = AgentOptions::new(profile);
    options.audit = AuditSink::disabled();
    let agent = Agent::new(options, registry.clone(), pool);
    let cancel = CancellationToken::new();
    tokio::spawn(agent.clone().run(cancel.clone()));
    tokio::time::timeout(std::time::Duration::from_secs(30), agent.ready()).await.expect("agent ready within 30 s");
    TestAgent { agent, registry, cancel }
}
