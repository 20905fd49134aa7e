//! Change-to-snapshot latency of the directory registry, against the raw notify event latency.
//!
//! ```text
//! write file ──t0──▶ bare notify watcher reports an event            (raw notify, the baseline)
//! write file ──t0──▶ DirWatch publishes the new revision (notify)     (debounce + scan + publish)
//! write file ──t0──▶ DirWatch publishes the new revision (poll, 1 s)  (up to one poll period)
//! ```
//!
//! Run with `cargo bench --bench dir_latency`. Each mode times [`SAMPLES`] writes in its own
//! temp directory and prints the median and p90, with the ratio of each median to raw notify's.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::path::Path;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use spear::registry::{DirOptions, DirSource, RegistryView};

/// Writes timed per mode (the issue asks for 20).
const SAMPLES: usize = 20;

/// Writes per mode: [`SAMPLES`] under `cargo bench`; two under `cargo test --all-targets`,
/// which runs this binary without `--bench` as a smoke test of the harness.
fn sample_count() -> usize {
    if std::env::args().any(|a| a == "--bench") { SAMPLES } else { 2 }
}
/// Upper bound on one change's latency before the run is declared broken.
const GIVE_UP: Duration = Duration::from_secs(5);

fn manifest(i: usize) -> String {
    format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: fs\nspec:\n  transport: stdio\n  stdio:\n    command: node-{i}\n"
    )
}

/// A pause between writes that varies, so poll mode is sampled at different phases of its period.
fn pause(i: usize) -> Duration {
    Duration::from_millis(100 + (i as u64 * 173) % 900)
}

/// Time from a write until a bare notify watcher on the same directory reports a change event
/// (opens and reads, which the registry ignores too, do not count).
fn raw_notify(dir: &Path) -> Vec<Duration> {
    let (tx, rx) = mpsc::channel();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let change = event.is_ok_and(|e| {
            !matches!(e.kind, EventKind::Access(_)) || e.kind == EventKind::Access(AccessKind::Close(AccessMode::Write))
        });
        if change {
            let _ = tx.send(Instant::now());
        }
    })
    .expect("a notify watcher must start");
    watcher.watch(dir, RecursiveMode::NonRecursive).expect("the bench dir must be watchable");
    let mut samples = Vec::with_capacity(sample_count());
    for i in 0..sample_count() {
        std::thread::sleep(pause(i));
        while rx.try_recv().is_ok() {}
        let t0 = Instant::now();
        std::fs::write(dir.join("fs.yaml"), manifest(i)).expect("write");
        let seen = rx.recv_timeout(GIVE_UP).expect("notify must report the write");
        samples.push(seen.saturating_duration_since(t0));
    }
    samples
}

/// Time from a write until the registry publishes a snapshot with a new revision.
async fn registry(dir: &Path, options: DirOptions) -> Vec<Duration> {
    let registry = DirSource::watch(dir, options).expect("the bench dir must be watchable");
    let mut rx = registry.watch();
    let mut samples = Vec::with_capacity(sample_count());
    for i in 0..sample_count() {
        tokio::time::sleep(pause(i)).await;
        let before = rx.borrow_and_update().revision().clone();
        let t0 = Instant::now();
        std::fs::write(dir.join("fs.yaml"), manifest(1000 + i)).expect("write");
        tokio::time::timeout(GIVE_UP, rx.wait_for(|s| *s.revision() != before))
            .await
            .expect("the registry must publish the change in time")
            .expect("the registry must keep running");
        samples.push(t0.elapsed());
    }
    samples
}

/// (median, p90) of `samples`.
fn summary(mut samples: Vec<Duration>) -> (Duration, Duration) {
    samples.sort();
    let n = samples.len();
    let median = (samples[(n - 1) / 2] + samples[n / 2]) / 2;
    let p90 = samples[(n * 9).div_ceil(10) - 1];
    (median, p90)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() {
    let fresh = || tempfile::tempdir().expect("a temp dir");
    let raw_dir = fresh();
    let raw = summary(raw_notify(raw_dir.path()));
    let notify_dir = fresh();
    let notify = summary(registry(notify_dir.path(), DirOptions::default()).await);
    let no_debounce_dir = fresh();
    let no_debounce = summary(
        registry(no_debounce_dir.path(), DirOptions { debounce: Duration::ZERO, ..DirOptions::default() }).await,
    );
    let poll_dir = fresh();
    let poll = summary(registry(poll_dir.path(), DirOptions { force_poll: true, ..DirOptions::default() }).await);

    println!("dir_latency: {} writes per mode, change → event / new snapshot", sample_count());
    println!("{:<34} {:>12} {:>12} {:>16}", "mode", "median ms", "p90 ms", "median / raw");
    for (mode, (median, p90)) in [
        ("raw notify event (baseline)", raw),
        ("registry, notify (debounce 50 ms)", notify),
        ("registry, notify (debounce 0)", no_debounce),
        ("registry, poll (1 s)", poll),
    ] {
        let ratio = median.as_secs_f64() / raw.0.as_secs_f64().max(1e-9);
        println!("{mode:<34} {:>12.3} {:>12.3} {:>15.1}x", ms(median), ms(p90), ratio);
    }
}
