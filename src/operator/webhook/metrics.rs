//! The webhook's metrics and their label sets. A leaf: it imports nothing of the webhook.

use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdmissionLabels {
    /// `patch`, `skip`, `deny` or `error`.
    decision: &'static str,
    /// The skip reason or error label; empty for patch and deny.
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    /// `Namespace`, `McpProfile` or `McpServer`.
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HandshakeLabels {
    /// `client_certificate` (missing or refused), `timeout` or `other`.
    reason: &'static str,
}

/// Admission metrics: `admission_total{decision,reason}`, `admission_latency_ms`,
/// `rate_limited_total` (requests answered 429 before any parsing),
/// `tls_handshake_failures_total{reason}` and `cache_read_through_total{kind}` (objects a
/// review needed that the caches did not hold yet, read with a GET), `caches_synced` and
/// `certificate_expiry_timestamp_seconds` (the served certificate's not-after).
#[derive(Clone, Debug)]
pub struct WebhookMetrics {
    admissions: Family<AdmissionLabels, Counter>,
    latency_ms: Histogram,
    rate_limited: Counter,
    handshake_failures: Family<HandshakeLabels, Counter>,
    read_through: Family<KindLabels, Counter>,
    caches_synced: Gauge,
    /// The served certificate's not-after, unix seconds (kept by `certs::CertResolver`).
    pub(super) certificate_expiry: Gauge,
}

impl Default for WebhookMetrics {
    fn default() -> Self {
        // 1 ms to ~4 s: a review is a few API reads; past 4 s the API server's timeout is near.
        WebhookMetrics {
            admissions: Family::default(),
            latency_ms: Histogram::new(exponential_buckets(1.0, 2.0, 13)),
            rate_limited: Counter::default(),
            handshake_failures: Family::default(),
            read_through: Family::default(),
            caches_synced: Gauge::default(),
            certificate_expiry: Gauge::default(),
        }
    }
}

impl WebhookMetrics {
    /// Metrics registered on `registry` (give it a `webhook` prefix).
    pub fn register(registry: &mut Registry) -> Self {
        let metrics = WebhookMetrics::default();
        registry.register("admission", "Pod admission reviews by decision", metrics.admissions.clone());
        registry.register("admission_latency_ms", "Time to answer one review", metrics.latency_ms.clone());
        registry.register(
            "rate_limited",
            "Requests answered 429 by the per-source rate limit, before any parsing",
            metrics.rate_limited.clone(),
        );
        registry.register(
            "tls_handshake_failures",
            "TLS handshakes that failed, by reason (client_certificate: missing or refused)",
            metrics.handshake_failures.clone(),
        );
        registry.register(
            "cache_read_through",
            "Objects a review needed that the webhook's caches did not hold (yet), read with a GET",
            metrics.read_through.clone(),
        );
        registry.register(
            "caches_synced",
            "1 once the webhook's caches have listed (reviews answered from memory), 0 before",
            metrics.caches_synced.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "When the webhook's serving certificate expires (its not-after), unix seconds; 0 before the first",
            metrics.certificate_expiry.clone(),
        );
        // Every known series from 0, so a first failure shows in rate() (the alerts read it).
        for reason in ["client_certificate", "timeout", "other"] {
            metrics.handshake_failures.get_or_create_owned(&HandshakeLabels { reason });
        }
        for kind in ["Namespace", "McpProfile", "McpServer"] {
            metrics.read_through.get_or_create_owned(&KindLabels { kind });
        }
        metrics
    }

    pub(crate) fn caches_synced_now(&self) {
        self.caches_synced.set(1);
    }

    /// Whether the webhook's caches have listed.
    pub fn caches_synced(&self) -> bool {
        self.caches_synced.get() == 1
    }

    /// One object of `kind` read through a cache miss.
    pub(crate) fn read_through(&self, kind: &'static str) {
        self.read_through.get_or_create(&KindLabels { kind }).inc();
    }

    /// Objects of `kind` (`Namespace`, `McpProfile`, `McpServer`) read through so far.
    pub fn read_through_count(&self, kind: &'static str) -> u64 {
        self.read_through.get_or_create(&KindLabels { kind }).get()
    }

    /// One request refused by the rate limit.
    pub(crate) fn rate_limited(&self) {
        self.rate_limited.inc();
    }

    /// Requests refused by the rate limit so far.
    pub fn rate_limited_count(&self) -> u64 {
        self.rate_limited.get()
    }

    /// TLS handshakes that failed for `reason` so far (`client_certificate`, `timeout`, `other`).
    pub fn handshake_failures(&self, reason: &'static str) -> u64 {
        self.handshake_failures.get_or_create(&HandshakeLabels { reason }).get()
    }

    pub(super) fn handshake_failed(&self, reason: &'static str) {
        self.handshake_failures.get_or_create(&HandshakeLabels { reason }).inc();
    }

    /// One review answered: `decision` is `skip`, `patch`, `deny` (`Admission::as_str`) or `error`.
    pub(super) fn record(&self, decision: &'static str, reason: &'static str, elapsed: Duration) {
        self.admissions.get_or_create(&AdmissionLabels { decision, reason }).inc();
        self.latency_ms.observe(elapsed.as_secs_f64() * 1000.0);
    }
}
