//! Propagation of one McpServer edit to many agents' Kubernetes registry sources, and the
//! kube-apiserver's memory while they watch: the cost of one watch per agent, measured against the
//! test control plane, not assumed.
//!
//! ```text
//! N agents = N × KubeSource::watch, each with its own client (spear::kube_client: one HTTP/2
//!            connection for its 2 watches; SPEAR_BENCH_KUBE_CLIENT=http1: kube's own client, a
//!            connection per watch)
//! patch one McpServer ──t0──▶ every source publishes the new resourceVersion ──▶ p50 / p99 / max
//! kube-apiserver RSS (/proc/<pid>/status): before the sources, all synced, peak over the edits
//! then N idle sources with the periodic relist off, then on: kube-apiserver CPU per second
//! ```
//!
//! Run with `cargo bench --bench propagation`: a baseline of 1 source, then 200 and 2,000 sources, in the
//! same process and against the same control plane (started by the bench; run
//! `hack/control-plane.sh` once first). Without `--bench` (as `cargo test --all-targets` runs it)
//! it is a smoke run of 1 and 5 sources and 2 edits. The API server's connections are counted from
//! `/proc/<pid>/net/tcp` (established, to its port) once all sources are synced. To see where the
//! API server's memory goes: `SPEAR_BENCH_SOURCES=2000` runs only those rows (no relist phase),
//! `SPEAR_BENCH_PPROF_DIR=DIR` writes its heap profile (`/debug/pprof/heap?debug=1`, for `go tool
//! pprof`) at each row's sync.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::time::{Duration, Instant};

use futures::future::join_all;
use kube::ResourceExt;
use kube::api::{Patch, PatchParams, PostParams};
use spear::api::{McpProfile, McpServer};
use spear::registry::snapshot::Snapshot;
use spear::registry::{KubeSource, KubeWatch, RegistryView, Relist, WatchOptions};
use spear::testing::control_plane::{ControlPlane, TestNamespace};
use spear::testing::proc_stats::{cpu_time, rss_mib};
use tokio_util::sync::CancellationToken;

/// Agent counts under `cargo bench`: the baseline, then the loads issues 7 and 18 ask for.
const SOURCES: [usize; 3] = [1, 200, 2000];
/// Edits timed per agent count under `cargo bench`.
const EDITS: usize = 10;
/// Pause between edits, so each is measured alone (not queued behind the previous one).
const PAUSE: Duration = Duration::from_millis(500);
/// Upper bound on one edit reaching every source, and on all sources' first sync.
const GIVE_UP: Duration = Duration::from_secs(120);

fn benching() -> bool {
    std::env::args().any(|a| a == "--bench")
}

/// The server `fs` as of edit number `edit`.
fn server(edit: usize) -> McpServer {
    McpServer::test("fs").http("http://127.0.0.1:9/mcp").allowing([format!("tool_{edit}")])
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One row of the report.
struct Row {
    sources: usize,
    sync_all: Duration,
    samples: Vec<Duration>,
    rss_before: f64,
    rss_synced: f64,
    rss_peak: f64,
    /// Established connections to the API server once all synced (the bench's admin client's included).
    connections: usize,
    /// This process's RSS growth per source once all synced, KiB.
    own_kib_per_source: f64,
    /// This process's CPU time per source per edit, during the edits (the sources' decoding and
    /// snapshot building, plus the bench's own waiting).
    own_cpu_per_event: Duration,
}

/// Whether sources use kube's own HTTP/1.1 client (`SPEAR_BENCH_KUBE_CLIENT=http1`) instead of the agent's.
fn kube_http1() -> bool {
    std::env::var("SPEAR_BENCH_KUBE_CLIENT").is_ok_and(|v| v == "http1")
}

/// One agent's client, as `spearlet run` builds it (or kube's own, see `kube_http1`).
fn source_client(control_plane: &ControlPlane) -> kube::Client {
    let config = control_plane.config();
    let client = if kube_http1() { kube::Client::try_from(config) } else { spear::kube_client::client(config) };
    client.expect("the control plane's admin config must build a client")
}

/// Established TCP connections to the API server's port, from the host's `/proc/net/tcp`.
fn apiserver_connections(control_plane: &ControlPlane) -> usize {
    let port = control_plane.config().cluster_url.port_u16().expect("the control plane's URL has a port");
    let local = format!(":{port:04X}");
    let table = std::fs::read_to_string(format!("/proc/{}/net/tcp", control_plane.apiserver_pid())).unwrap_or_default();
    table
        .lines()
        .skip(1)
        .filter(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[1].ends_with(&local) && fields[3] == "01"
        })
        .count()
}

/// Starts `count` sources (each with its own client), waits for all to sync, then times `edits`
/// edits of the server `fs` to every source.
async fn measure(control_plane: &ControlPlane, ns: &TestNamespace, count: usize, edits: usize) -> Row {
    let pid = control_plane.apiserver_pid();
    let rss_before = rss_mib(pid);
    let own_before = rss_mib(std::process::id());
    let begun = Instant::now();
    let mut sources: Vec<KubeWatch> = Vec::with_capacity(count);
    let shutdown = CancellationToken::new();
    for _ in 0..count {
        let client = source_client(control_plane);
        sources.push(KubeSource::watch(client, &ns.name, "p", &shutdown).expect("valid names"));
    }
    let synced = tokio::time::timeout(GIVE_UP, join_all(sources.iter().map(KubeWatch::ready))).await;
    let failures = synced.expect("every source must sync in time").into_iter().filter(Result::is_err).count();
    assert_eq!(failures, 0, "every source must sync");
    let sync_all = begun.elapsed();
    let rss_synced = rss_mib(pid);
    let connections = apiserver_connections(control_plane);
    if let Ok(dir) = std::env::var("SPEAR_BENCH_PPROF_DIR") {
        let request = http::Request::get("/debug/pprof/heap?debug=1").body(Vec::new()).expect("a valid request");
        let profile = ns.client.request_text(request).await.expect("the API server's heap profile (--profiling)");
        let client = if kube_http1() { "http1" } else { "h2" };
        let path = std::path::Path::new(&dir).join(format!("heap-{client}-{count}.txt"));
        std::fs::write(&path, profile).expect("write the heap profile");
    }
    let own_kib_per_source = (rss_mib(std::process::id()) - own_before) * 1024.0 / count as f64;
    let mut rss_peak = rss_synced;
    let mut own_cpu = Duration::ZERO;

    let api = ns.api::<McpServer>();
    let mut samples = Vec::with_capacity(count * edits);
    for edit in 0..edits {
        tokio::time::sleep(PAUSE).await;
        let mut receivers: Vec<_> = sources.iter().map(RegistryView::watch).collect();
        let cpu0 = cpu_time(std::process::id());
        let t0 = Instant::now();
        let patched = api
            .patch("fs", &PatchParams::apply("spear-bench").force(), &Patch::Apply(&server(1000 * count + edit)))
            .await
            .expect("the edit must apply");
        let version = patched.resource_version();
        let seen = |s: &Snapshot| s.server("fs").map(|v| v.resource_version.clone()) == version;
        let arrivals =
            join_all(receivers.iter_mut().map(|rx| async move {
                rx.wait_for(|s| seen(s)).await.map(|_| t0.elapsed()).expect("a source stopped")
            }));
        samples.extend(tokio::time::timeout(GIVE_UP, arrivals).await.expect("every source must see the edit"));
        own_cpu += cpu_time(std::process::id()).saturating_sub(cpu0);
        rss_peak = rss_peak.max(rss_mib(pid));
    }
    shutdown.cancel();
    drop(sources);
    samples.sort();
    let own_cpu_per_event = own_cpu / (count * edits) as u32;
    Row {
        sources: count,
        sync_all,
        samples,
        rss_before,
        rss_synced,
        rss_peak,
        connections,
        own_kib_per_source,
        own_cpu_per_event,
    }
}

/// The API server's cost of `count` idle sources watching with `options`: its CPU (cores, averaged
/// over `window` once all synced) and RSS at the end. With the periodic relist on, each source
/// lists both kinds again every 30-120 s; off, the watches alone.
async fn idle_cost(
    control_plane: &ControlPlane,
    ns: &TestNamespace,
    count: usize,
    options: WatchOptions,
    window: Duration,
) -> (f64, f64) {
    let pid = control_plane.apiserver_pid();
    let shutdown = CancellationToken::new();
    let mut sources: Vec<KubeWatch> = Vec::with_capacity(count);
    for _ in 0..count {
        let client = source_client(control_plane);
        sources.push(KubeSource::watch_with(client, &ns.name, "p", &shutdown, options).expect("valid names"));
    }
    let synced = tokio::time::timeout(GIVE_UP, join_all(sources.iter().map(KubeWatch::ready))).await;
    assert!(synced.expect("every source must sync in time").iter().all(Result::is_ok), "every source must sync");
    let cpu0 = cpu_time(pid);
    tokio::time::sleep(window).await;
    let cores = cpu_time(pid).saturating_sub(cpu0).as_secs_f64() / window.as_secs_f64();
    let rss = rss_mib(pid);
    shutdown.cancel();
    drop(sources);
    // Let the API server close the watches before the next measurement.
    tokio::time::sleep(Duration::from_secs(2)).await;
    (cores, rss)
}

/// The rows' table.
fn print_rows(rows: &[Row], edits: usize) {
    println!(
        "propagation: patch one McpServer → new snapshot in every agent source ({edits} edits per row; kube-apiserver \
         {}; client: {})",
        spear::testing::control_plane::K8S_VERSION,
        if kube_http1() { "kube's own, HTTP/1.1" } else { "spear::kube_client, HTTP/2" }
    );
    println!(
        "{:>7} {:>7} {:>6} {:>11} {:>8} {:>8} {:>8} {:>8}   {:>22} {:>7} {:>11} {:>11}",
        "sources",
        "watches",
        "conns",
        "sync all s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "samples",
        "apiserver RSS MiB b/s/p",
        "growth",
        "KiB/source",
        "µs/event"
    );
    for row in rows {
        let max = row.samples.last().copied().unwrap_or_default();
        println!(
            "{:>7} {:>7} {:>6} {:>11.2} {:>8.1} {:>8.1} {:>8.1} {:>8}   {:>6.0} / {:>5.0} / {:>5.0} {:>6.0}% {:>11.1} {:>11.0}",
            row.sources,
            2 * row.sources,
            row.connections,
            row.sync_all.as_secs_f64(),
            ms(percentile(&row.samples, 0.50)),
            ms(percentile(&row.samples, 0.99)),
            ms(max),
            row.samples.len(),
            row.rss_before,
            row.rss_synced,
            row.rss_peak,
            (row.rss_peak / row.rss_before - 1.0) * 100.0,
            row.own_kib_per_source,
            row.own_cpu_per_event.as_secs_f64() * 1e6,
        );
    }
    println!(
        "(RSS b/s/p: before the sources start / all synced / peak during the edits; growth: peak over before; \
         KiB/source and µs/event: this process, i.e. the agents' sources, per source and per source per edit)"
    );
}

#[tokio::main]
async fn main() {
    spear::install_crypto_provider();
    let only: Option<Vec<usize>> = std::env::var("SPEAR_BENCH_SOURCES").ok().map(|list| {
        list.split(',')
            .map(|n| n.trim().parse().expect("SPEAR_BENCH_SOURCES: a comma-separated list of counts"))
            .collect()
    });
    let (counts, edits) = match (&only, benching()) {
        (Some(counts), _) => (counts.clone(), EDITS),
        (None, true) => (SOURCES.to_vec(), EDITS),
        (None, false) => (vec![1, 5], 2),
    };
    let control_plane = ControlPlane::shared();
    let ns = control_plane.namespace("bench-propagation").await;
    ns.api::<McpServer>().create(&PostParams::default(), &server(0)).await.expect("create fs");
    ns.api::<McpProfile>()
        .create(&PostParams::default(), &McpProfile::test("p").servers(["fs"]))
        .await
        .expect("create p");
    // Let the API server settle after start and CRD install before the first memory sample.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut rows = Vec::new();
    for count in counts {
        rows.push(measure(control_plane, &ns, count, edits).await);
    }
    if only.is_some() {
        print_rows(&rows, edits);
        return;
    }
    // The periodic relist's price, at the largest count: one window with it off, one with it on
    // (twice the longest period under `--bench`, so every source relists at least once).
    let (relist_count, relist, off_window, on_window) = if benching() {
        (*SOURCES.last().expect("counts"), Relist::DEFAULT, Duration::from_secs(60), 2 * Relist::DEFAULT.max)
    } else {
        let fast = Relist { min: Duration::from_millis(200), max: Duration::from_millis(400) };
        (5, fast, Duration::from_secs(1), Duration::from_secs(2))
    };
    let off = idle_cost(control_plane, &ns, relist_count, WatchOptions { relist: None }, off_window).await;
    let on = idle_cost(control_plane, &ns, relist_count, WatchOptions { relist: Some(relist) }, on_window).await;

    print_rows(&rows, edits);
    let relists_per_s = 2.0 * relist_count as f64 / ((relist.min + relist.max).as_secs_f64() / 2.0);
    println!(
        "periodic relist, {relist_count} idle sources: kube-apiserver CPU {:.3} cores with it off ({} s), {:.3} with \
         it on every {}-{} s ({} s; about {relists_per_s:.0} lists/s): +{:.3} cores, {:.0} µs of API server CPU per \
         relist; RSS {:.0} / {:.0} MiB",
        off.0,
        off_window.as_secs(),
        on.0,
        relist.min.as_secs_f64(),
        relist.max.as_secs_f64(),
        on_window.as_secs(),
        on.0 - off.0,
        (on.0 - off.0).max(0.0) / relists_per_s * 1e6,
        off.1,
        on.1,
    );
}
