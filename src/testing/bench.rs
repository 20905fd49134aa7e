//! What the benches share: percentiles of sorted samples, an agent over a fixed registry, and
//! the `main` of a bench binary that is also its own echo server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::agent::{Agent, AgentOptions, AuditSink};
use crate::api::manifest::Object;
use crate::mcp::{Pool, PoolOptions};
use crate::registry::snapshot::{Entry, Snapshot};
use crate::registry::view::StaticRegistry;

/// The sample at quantile `p` (0..=1) of `sorted`, by nearest rank on `len - 1`.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// Microseconds, for the tables.
pub fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// The environment the agent's pool resolves `${ENV:...}` and Secret values from.
pub type Env = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;

/// An agent over `objects` (a static registry), its audit off and its servers never idled out,
/// running until the returned token is cancelled; waits until its first lists are in.
pub async fn static_agent(objects: Vec<Object>, env: Env, mut options: AgentOptions) -> (Agent, CancellationToken) {
    let snapshot = Snapshot::build(objects.into_iter().map(|o| Entry::local("bench.yaml", 1, o)), Vec::new());
    let pool = Pool::with_env(PoolOptions { idle_timeout: None, ..PoolOptions::default() }, env);
    options.audit = AuditSink::disabled();
    let agent = Agent::new(options, Arc::new(StaticRegistry::new(snapshot)), pool);
    let cancel = CancellationToken::new();
    tokio::spawn(agent.clone().run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(60), agent.settled()).await.expect("agent settled in 60 s");
    (agent, cancel)
}

/// The process environment, as [`static_agent`] takes it.
pub fn process_env() -> Env {
    Arc::new(|name: &str| std::env::var(name).ok())
}

/// Run with `--serve-echo-http PORT`, a bench binary is the Streamable HTTP echo server its bench
/// spawns ([`super::echo::serve_http`] on 127.0.0.1:PORT, until killed): serves and returns true.
/// Otherwise returns false at once.
pub fn serve_echo_http_if_asked() -> bool {
    let args: Vec<String> = std::env::args().collect();
    let Some(port) = args.iter().position(|a| a == "--serve-echo-http").and_then(|i| args.get(i + 1)) else {
        return false;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a runtime");
    runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().expect("a port")))
            .await
            .expect("the echo port is free");
        super::echo::serve_http(listener).await.expect("serving echo over HTTP");
    });
    true
}

/// A bench binary's `main`: run with `--serve-echo` it is the echo server its bench spawns
/// ([`super::echo`]); otherwise `run(full)` on a two-thread runtime, `full` under `cargo bench`
/// (`--bench`) and false for the smoke run `cargo test --all-targets` makes.
pub fn main_serving_echo<F: Future<Output = ()>>(run: impl FnOnce(bool) -> F) {
    if std::env::args().any(|a| a == "--serve-echo") {
        super::echo::serve_stdio(super::echo::StdioMode::Reactor);
        return;
    }
    crate::install_crypto_provider();
    let full = std::env::args().any(|a| a == "--bench");
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("a runtime");
    runtime.block_on(run(full));
}
