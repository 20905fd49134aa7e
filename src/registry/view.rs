//! The read side of the registry: one small trait that handlers are generic over, and the
//! publisher that sources use to swap snapshots in.
//!
//! ```text
//! source (dir / kube) ──Publisher::publish(snapshot)──▶ watch::Sender<Arc<Snapshot>>
//!                           │ only if revision or problems changed
//!                           ▼
//!          RegistryView::snapshot() (current)   RegistryView::watch() (Receiver, woken on change)
//! ```
//!
//! Publishing is an atomic swap of an `Arc`: readers holding the previous snapshot keep a
//! consistent view until they ask again.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use tokio::sync::watch;
use tokio::task::{JoinError, JoinHandle};
use tokio_util::sync::{CancellationToken, DropGuard};
use tracing::Instrument as _;

use super::snapshot::{Snapshot, SourceProblem};

/// Read access to the registry: the current snapshot, and a receiver woken on every change.
pub trait RegistryView: Send + Sync {
    /// The current snapshot.
    fn snapshot(&self) -> Arc<Snapshot>;
    /// A receiver that sees every snapshot published from now on.
    fn watch(&self) -> watch::Receiver<Arc<Snapshot>>;
}

impl<T: RegistryView + ?Sized> RegistryView for Arc<T> {
    fn snapshot(&self) -> Arc<Snapshot> {
        (**self).snapshot()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        (**self).watch()
    }
}

impl std::fmt::Debug for dyn RegistryView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RegistryView(revision {})", self.snapshot().revision())
    }
}

// === impl WatchTask ===

/// What every source's running watch shares: the task that publishes, the publisher it feeds, and
/// the stop signal, fired when this is dropped.
#[derive(Debug)]
pub(crate) struct WatchTask {
    publisher: Arc<Publisher>,
    task: Option<JoinHandle<()>>,
    _stop: DropGuard,
}

impl WatchTask {
    /// Publishes `initial`, then spawns `run(publisher, stop)` on `runtime` in `span`; `stop` is
    /// cancelled with `shutdown` or when the returned handle is dropped.
    pub(crate) fn spawn<F>(
        runtime: &tokio::runtime::Handle,
        initial: Snapshot,
        shutdown: &CancellationToken,
        span: tracing::Span,
        run: impl FnOnce(Arc<Publisher>, CancellationToken) -> F,
    ) -> Self
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let publisher = Arc::new(Publisher::new(initial));
        let stop = shutdown.child_token();
        let task = runtime.spawn(run(Arc::clone(&publisher), stop.clone()).instrument(span));
        WatchTask { publisher, task: Some(task), _stop: stop.drop_guard() }
    }

    /// A shareable view of the snapshots; it keeps the last snapshot (and stops changing) once the
    /// watch is dropped.
    pub(crate) fn view(&self) -> Arc<dyn RegistryView> {
        self.publisher.clone()
    }

    /// Completes when the task ends (shutdown, or a panic as the error), for a `select!` over
    /// critical tasks. Completes at once if called again after it ended.
    pub(crate) async fn finished(&mut self) -> Result<(), JoinError> {
        let Some(task) = self.task.as_mut() else { return Ok(()) };
        let result = task.await;
        self.task = None;
        result
    }
}

impl RegistryView for WatchTask {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.publisher.snapshot()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.publisher.watch()
    }
}

// === impl Publisher ===

/// Publishes snapshots to subscribers, skipping ones that change nothing they can see.
#[derive(Debug)]
pub struct Publisher {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl Publisher {
    /// A publisher whose first snapshot is `initial` (logged like any published one).
    pub(crate) fn new(initial: Snapshot) -> Self {
        log_published(&initial, &[]);
        Publisher { tx: watch::Sender::new(Arc::new(initial)) }
    }

    /// Swaps `snapshot` in if its revision or its problems differ from the current one; returns
    /// whether it was published (and subscribers woken).
    pub(crate) fn publish(&self, snapshot: Snapshot) -> bool {
        let mut previous = None;
        let published = self.tx.send_if_modified(|current| {
            if current.revision() == snapshot.revision() && current.problems() == snapshot.problems() {
                return false;
            }
            previous = Some(std::mem::replace(current, Arc::new(snapshot)));
            true
        });
        if let Some(previous) = previous {
            log_published(&self.tx.borrow(), previous.problems());
        }
        published
    }
}

impl RegistryView for Publisher {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }
}

/// `info` for the new snapshot, `warn` for each problem that was not there before.
fn log_published(snapshot: &Snapshot, before: &[SourceProblem]) {
    tracing::info!(
        revision = %snapshot.revision(),
        servers = snapshot.servers().len(),
        profiles = snapshot.profiles().len(),
        degraded = snapshot.is_degraded(),
        "registry snapshot published"
    );
    let before: BTreeSet<&SourceProblem> = before.iter().collect();
    for problem in snapshot.problems().iter().filter(|p| !before.contains(p)) {
        tracing::warn!(
            file = %problem.file.display(),
            line = problem.line,
            field = %problem.field,
            fix = %problem.fix,
            "registry problem: {}",
            problem.message
        );
    }
}

// === impl StaticRegistry ===

/// An in-memory registry for tests: serves what it is given, publishes every replacement.
#[derive(Debug)]
pub struct StaticRegistry {
    tx: watch::Sender<Arc<Snapshot>>,
}

impl StaticRegistry {
    /// A registry serving `snapshot`.
    pub fn new(snapshot: Snapshot) -> Self {
        StaticRegistry { tx: watch::Sender::new(Arc::new(snapshot)) }
    }

    /// Replaces the snapshot and wakes every subscriber, changed or not.
    pub fn replace(&self, snapshot: Snapshot) {
        self.tx.send_replace(Arc::new(snapshot));
    }
}

impl Default for StaticRegistry {
    /// An empty registry.
    fn default() -> Self {
        StaticRegistry::new(Snapshot::default())
    }
}

impl RegistryView for StaticRegistry {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.tx.borrow().clone()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.tx.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::manifest::parse;
    use crate::registry::snapshot::Entry;

    fn snapshot_with(command: &str, problems: Vec<SourceProblem>) -> Snapshot {
        let text = format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: fs\nspec:\n  transport: stdio\n  stdio:\n    command: {command}\n"
        );
        let entries = parse(&text).documents.into_iter().map(|d| Entry::local("a.yaml", d.line, d.object));
        Snapshot::build(entries, problems)
    }

    fn problem() -> SourceProblem {
        SourceProblem { file: "a.yaml".into(), line: 1, field: "document".into(), message: "m".into(), fix: "f".into() }
    }

    #[test]
    fn publisher_wakes_subscribers_only_for_a_new_revision_or_new_problems() {
        let publisher = Publisher::new(snapshot_with("node", vec![]));
        let mut rx = publisher.watch();
        rx.mark_unchanged();
        assert!(!publisher.publish(snapshot_with("node", vec![])));
        assert!(!rx.has_changed().unwrap_or(true));
        assert!(publisher.publish(snapshot_with("node", vec![problem()])));
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        assert!(publisher.snapshot().is_degraded());
        assert!(publisher.publish(snapshot_with("python", vec![problem()])));
        assert!(publisher.publish(snapshot_with("python", vec![])));
        assert!(!publisher.snapshot().is_degraded());
    }

    #[test]
    fn static_registry_serves_and_replaces() {
        let registry = Arc::new(StaticRegistry::default());
        let mut rx = registry.watch();
        assert!(registry.snapshot().servers().is_empty());
        registry.replace(snapshot_with("node", vec![]));
        assert!(rx.has_changed().unwrap_or(false));
        assert!(rx.borrow_and_update().server("fs").is_some());
    }
}
