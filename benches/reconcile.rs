//! The operator's McpServer controller at scale, against the test control plane (a real
//! kube-apiserver + etcd): how long 1,000 servers take to be Accepted and how many status
//! writes that costs, against just creating them.
//!
//! ```text
//! baseline    create N stdio McpServers, no controller              ─▶ time (the API server's cost)
//! live        controller running, create N more (own namespace)     ─▶ first create → last Accepted,
//!                                                                      resourceVersion bumps per object,
//!                                                                      bumps in a quiet period after
//! cold start  controller started over the baseline's N              ─▶ start → last Accepted, bumps
//! ```
//!
//! Run with `cargo bench --bench reconcile` (after `hack/control-plane.sh`). Without `--bench`,
//! as `cargo test --all-targets` runs it, it reconciles 20 servers as a smoke test of the harness.
//! stdio servers are never probed, so this measures the controller and the API server alone.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{Api, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use spear::api::McpServer;
use spear::operator::controller::{self, ControllerConfig, Scope};
use spear::testing::control_plane::ControlPlane;
use tokio_util::sync::CancellationToken;

/// Servers per run under `cargo bench` (the issue asks for 1,000).
const SERVERS: usize = 1000;
/// Servers in the smoke run.
const SMOKE_SERVERS: usize = 20;
/// Creates in flight at once: a client's usual parallelism, well under the API server's
/// default max-requests-inflight (400).
const CREATE_CONCURRENCY: usize = 32;
/// Upper bound on one phase before the run is declared broken.
const GIVE_UP: Duration = Duration::from_secs(300);
/// Quiet period after everything settled, during which no write may happen.
const QUIET: Duration = Duration::from_secs(3);

fn count() -> usize {
    if std::env::args().any(|a| a == "--bench") { SERVERS } else { SMOKE_SERVERS }
}

fn server(i: usize) -> McpServer {
    McpServer::test(&format!("server-{i:04}"))
        .stdio("npx", ["-y", "@modelcontextprotocol/server-everything"])
        .image("node:22")
        .allowing(["*"])
}

/// Creates `n` servers in `api`, [`CREATE_CONCURRENCY`] at a time.
async fn create_all(api: &Api<McpServer>, n: usize) -> Duration {
    let started = Instant::now();
    let results: Vec<_> = futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move { api.create(&PostParams::default(), &server(i)).await }
        })
        .buffer_unordered(CREATE_CONCURRENCY)
        .collect()
        .await;
    for result in results {
        result.expect("creating a valid McpServer must succeed");
    }
    started.elapsed()
}

fn accepted(server: &McpServer) -> bool {
    server.status.as_ref().is_some_and(|s| {
        s.observed_generation == server.metadata.generation
            && s.conditions.iter().any(|c| c.type_ == "Accepted" && c.status == "True")
    })
}

/// What a watch of the namespace saw: each object's resourceVersions, and when the last one
/// turned Accepted.
#[derive(Default)]
struct Seen {
    versions: BTreeMap<String, BTreeSet<String>>,
    accepted: BTreeSet<String>,
    all_accepted_at: Option<Instant>,
}

impl Seen {
    /// resourceVersion bumps after the first version seen of each object.
    fn bumps(&self) -> usize {
        self.versions.values().map(|v| v.len().saturating_sub(1)).sum()
    }
}

/// Watches `api` until `stop`, recording versions and acceptance of `n` objects.
fn watch(api: Api<McpServer>, n: usize, stop: CancellationToken) -> tokio::task::JoinHandle<Seen> {
    tokio::spawn(async move {
        let mut seen = Seen::default();
        let events = watcher(api, watcher::Config::default()).take_until(async move { stop.cancelled().await });
        tokio::pin!(events);
        while let Some(event) = events.next().await {
            let Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) = event else { continue };
            let name = obj.name_any();
            seen.versions.entry(name.clone()).or_default().insert(obj.resource_version().unwrap_or_default());
            if accepted(&obj) {
                seen.accepted.insert(name);
                if seen.accepted.len() == n && seen.all_accepted_at.is_none() {
                    seen.all_accepted_at = Some(Instant::now());
                }
            }
        }
        seen
    })
}

/// Polls until every server in `api` is Accepted.
async fn wait_all_accepted(api: &Api<McpServer>, n: usize) {
    let deadline = Instant::now() + GIVE_UP;
    loop {
        let list = api.list(&Default::default()).await.expect("listing servers");
        if list.items.iter().filter(|s| accepted(s)).count() == n {
            return;
        }
        assert!(Instant::now() < deadline, "not all {n} servers were Accepted within {GIVE_UP:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn start_controller(
    client: Client,
    namespace: &str,
) -> (CancellationToken, tokio::task::JoinHandle<()>, ControllerConfig) {
    let config = ControllerConfig::new(Scope::Namespace(namespace.to_string()));
    let token = CancellationToken::new();
    let task = tokio::spawn({
        let (config, token) = (config.clone(), token.clone());
        async move { controller::run(client, config, token).await.expect("the controller runs until cancelled") }
    });
    (token, task, config)
}

fn per_second(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64().max(f64::EPSILON)
}

fn main() {
    let n = count();
    let control_plane = ControlPlane::shared();
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime must build");
    runtime.block_on(async move {
        println!("reconcile: {n} stdio McpServers against the test control plane (kube-apiserver + etcd, loopback)");

        // Warm-up, untimed: the first requests pay for TLS, discovery and the API server's
        // first use of the CRD (schema and CEL compilation), which no phase should carry.
        let warm_ns = control_plane.namespace("bench-warm").await;
        create_all(&warm_ns.api::<McpServer>(), CREATE_CONCURRENCY).await;

        // Baseline: creation alone.
        let cold_ns = control_plane.namespace("bench-cold").await;
        let cold = cold_ns.api::<McpServer>();
        let created = create_all(&cold, n).await;
        println!("  baseline   create only                   {:>8.2} s  ({:.0} objects/s)", created.as_secs_f64(), per_second(n, created));

        // Live: the controller runs while the servers are created.
        let live_ns = control_plane.namespace("bench-live").await;
        let live = live_ns.api::<McpServer>();
        let stop_watch = CancellationToken::new();
        let watching = watch(live.clone(), n, stop_watch.clone());
        let (token, task, config) = start_controller(live_ns.client.clone(), &live_ns.name);
        // Let the watch and the controller list the empty namespace first.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let first_create = Instant::now();
        let creating = create_all(&live, n).await;
        wait_all_accepted(&live, n).await;
        // The counter moves just after the API server answered the last write.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let settled_writes = config.metrics.status_writes("McpServer");
        tokio::time::sleep(QUIET).await;
        stop_watch.cancel();
        let seen = watching.await.expect("the watch task must not panic");
        let done = seen.all_accepted_at.expect("the watch saw every server Accepted").duration_since(first_create);
        let quiet_writes = config.metrics.status_writes("McpServer") - settled_writes;
        println!(
            "  live       first create → all Accepted   {:>8.2} s  ({:.0} objects/s; creating alone took {:.2} s)",
            done.as_secs_f64(),
            per_second(n, done),
            creating.as_secs_f64()
        );
        println!(
            "  live       status writes                 {:>8}    ({:.2} resourceVersion bumps per object; {} API writes; {} in the {} s quiet period)",
            seen.bumps(),
            seen.bumps() as f64 / n as f64,
            settled_writes,
            quiet_writes,
            QUIET.as_secs()
        );
        token.cancel();
        let _ = task.await;

        // Cold start: a controller over servers that exist already.
        let stop_watch = CancellationToken::new();
        let watching = watch(cold.clone(), n, stop_watch.clone());
        tokio::time::sleep(Duration::from_millis(500)).await;
        let started = Instant::now();
        let (token, task, config) = start_controller(cold_ns.client.clone(), &cold_ns.name);
        wait_all_accepted(&cold, n).await;
        tokio::time::sleep(QUIET).await;
        stop_watch.cancel();
        let seen = watching.await.expect("the watch task must not panic");
        let done = seen.all_accepted_at.expect("the watch saw every server Accepted").duration_since(started);
        println!(
            "  cold start controller start → all Accepted {:>6.2} s  ({:.0} objects/s; {} resourceVersion bumps, {} API writes)",
            done.as_secs_f64(),
            per_second(n, done),
            seen.bumps(),
            config.metrics.status_writes("McpServer")
        );
        token.cancel();
        let _ = task.await;
    });
}
