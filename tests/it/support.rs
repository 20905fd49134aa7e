//! Shared setup for the agent tests: registries of real servers, a running agent core (the
//! resources themselves come from the builders in `spear::testing::fixtures`).

use std::sync::Arc;

use spear::agent::{Agent, AgentOptions, AuditSink};
use spear::api::manifest::Object;
use spear::mcp::{Pool, PoolOptions};
use spear::registry::snapshot::{Entry, Snapshot};
use spear::registry::view::StaticRegistry;
use tokio_util::sync::CancellationToken;

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

/// Starts an agent serving `profile` over `objects`, past starting on return (tools listed, or
/// the profile found missing). Audit is off.
pub async fn start_agent(objects: Vec<Object>, profile: &str) -> TestAgent {
    start_agent_audited(objects, profile, AuditSink::disabled()).await
}

/// [`start_agent`] with its audit lines going to `audit`.
pub async fn start_agent_audited(objects: Vec<Object>, profile: &str, audit: AuditSink) -> TestAgent {
    let t = spawn_agent_audited(objects, profile, audit);
    tokio::time::timeout(std::time::Duration::from_secs(30), t.agent.settled()).await.expect("agent settled in 30 s");
    // Ready does not wait for a server still starting after 10 s (a loaded machine); the tests
    // here want its tools, so wait for its start to end too (`/readyz` lists each server).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while t.agent.readiness().is_ok_and(|servers| servers.contains(": starting (")) {
        assert!(std::time::Instant::now() < deadline, "a server still starting after 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    t
}

/// Starts an agent serving `profile` over `objects` and returns at once, before its first state
/// is published (as the doors see it in the moment the process starts). Audit is off.
pub fn spawn_agent(objects: Vec<Object>, profile: &str) -> TestAgent {
    spawn_agent_audited(objects, profile, AuditSink::disabled())
}

fn spawn_agent_audited(objects: Vec<Object>, profile: &str, audit: AuditSink) -> TestAgent {
    let registry = Arc::new(StaticRegistry::new(snapshot(objects)));
    let pool = Pool::with_env(
        PoolOptions { idle_timeout: None, ..PoolOptions::default() },
        Arc::new(|name: &str| std::env::var(name).ok()),
    );
    let mut options = AgentOptions::new(profile);
    options.audit = audit;
    let agent = Agent::new(options, registry.clone(), pool);
    let cancel = CancellationToken::new();
    tokio::spawn(agent.clone().run(cancel.clone()));
    TestAgent { agent, registry, cancel }
}
