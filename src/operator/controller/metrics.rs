//! The controllers' metrics and their label sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::api::keys::{KIND_PROFILE, KIND_SERVER};
use crate::operator::status::{ProbeOutcome, ProbeResult};

/// Kind label of the namespace controller in metrics and logs.
pub(super) const KIND_NAMESPACE: &str = "Namespace";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    result: String,
}

/// The controllers' metrics. Cheap to clone; clones share the series. `Default` gives metrics
/// registered nowhere (tests read them through the getters).
#[derive(Clone, Debug, Default)]
pub struct ControllerMetrics {
    pub(super) reconciles: Family<KindLabels, Counter>,
    pub(super) errors: Family<KindLabels, Counter>,
    pub(super) status_writes: Family<KindLabels, Counter>,
    pub(super) rbac_writes: Family<KindLabels, Counter>,
    probes: Family<ProbeLabels, Counter>,
    pub(super) leader: Gauge,
    pub(super) ready: Gauge,
}

impl ControllerMetrics {
    /// Metrics registered on `registry` (give it a `spear_operator` prefix; counters get
    /// `_total` on the wire).
    pub(crate) fn register(registry: &mut Registry) -> Self {
        let metrics = ControllerMetrics::default();
        registry.register("reconcile", "Reconciles run, by kind", metrics.reconciles.clone());
        registry.register("reconcile_error", "Reconciles that failed, by kind", metrics.errors.clone());
        registry.register("status_write", "Status writes (server-side apply), by kind", metrics.status_writes.clone());
        registry.register("rbac_write", "RBAC objects applied or deleted, by kind", metrics.rbac_writes.clone());
        registry.register("probe", "Probes of http McpServers, by result", metrics.probes.clone());
        registry.register("leader", "1 while this replica holds the leader Lease", metrics.leader.clone());
        registry.register("ready", "1 while this replica is ready (leader or standby)", metrics.ready.clone());
        // Every known series from 0: a first failure then shows in rate() and increase() (a series
        // born at 1 does not), and dashboards read 0 rather than no data.
        for kind in [KIND_SERVER, KIND_PROFILE, KIND_NAMESPACE] {
            metrics.reconciles.get_or_create_owned(&KindLabels { kind: kind.to_string() });
            metrics.errors.get_or_create_owned(&KindLabels { kind: kind.to_string() });
        }
        metrics.rbac_writes.get_or_create_owned(&KindLabels { kind: "RoleBinding".to_string() });
        for result in ["succeeded", "failed", "skipped"] {
            metrics.probes.get_or_create_owned(&ProbeLabels { result: result.to_string() });
        }
        metrics
    }

    /// Reconciles of `kind` (`McpServer`, `McpProfile`, `Namespace`) so far.
    pub fn reconciles(&self, kind: &str) -> u64 {
        self.reconciles.get_or_create(&KindLabels { kind: kind.to_string() }).get()
    }

    /// Status writes for objects of `kind` so far.
    pub fn status_writes(&self, kind: &str) -> u64 {
        self.status_writes.get_or_create(&KindLabels { kind: kind.to_string() }).get()
    }

    /// Probes with `result` (`succeeded`, `failed`) so far.
    pub fn probes(&self, result: &str) -> u64 {
        self.probes.get_or_create(&ProbeLabels { result: result.to_string() }).get()
    }

    /// Whether this replica leads now (always, without leader election).
    pub fn is_leader(&self) -> bool {
        self.leader.get() == 1
    }

    /// Whether this replica is ready: its election runs (as leader or standby).
    pub fn is_ready(&self) -> bool {
        self.ready.get() == 1
    }

    pub(super) fn count(family: &Family<KindLabels, Counter>, kind: &str) {
        family.get_or_create(&KindLabels { kind: kind.to_string() }).inc();
    }

    pub(super) fn probed(&self, outcome: &ProbeOutcome) {
        let result = match outcome.result {
            ProbeResult::Succeeded { .. } => "succeeded",
            ProbeResult::Failed { .. } => "failed",
            ProbeResult::AuthRequired { .. } => "auth_required",
            ProbeResult::Skipped { .. } => "skipped",
        };
        self.probes.get_or_create(&ProbeLabels { result: result.to_string() }).inc();
    }
}
