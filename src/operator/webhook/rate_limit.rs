//! The webhook's per-source rate limit (`--webhook-rate-limit-per-second`,
//! `--webhook-rate-limit-burst`).
//!
//! ```text
//! request ──ConnectInfo(peer)──▶ source_key(ip) ──▶ token bucket of that source (governor GCRA)
//!                                                     ├─ a token: on to the router (parse, lookup, review)
//!                                                     └─ none: 429 + Retry-After, counted; no body read
//! every RETAIN_INTERVAL: buckets back to full are dropped (memory stays ∝ sources active lately)
//! ```
//!
//! Before anything else: an over-limit request is answered from its peer address alone. Keyed by
//! source (IPv6 by /64) and generous ([`DEFAULT_PER_SECOND`], [`DEFAULT_BURST`]): a throttled API
//! server call is a refused or uninjected pod. Why: `src/operator/README.md`, "Rate limit".

use std::net::{IpAddr, Ipv6Addr};
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};
use tokio_util::sync::CancellationToken;

use super::metrics::WebhookMetrics;

/// Default sustained reviews per second from one source. Every pod CREATE the webhook
/// configuration selects is one call (reinvocation may add a second). Pods are created by
/// kube-controller-manager (ReplicaSets, Jobs, StatefulSets, DaemonSets share one client limited
/// by its `--kube-api-qps`: 20/s by default, 100–300/s in large tuned clusters, and that budget
/// also pays for its status writes and events), by other controllers (client-go's default is
/// 5/s) and by people. 500/s is above all of these together at their tuned values, and about
/// where a single operator replica's CPU would be the limit anyway.
pub const DEFAULT_PER_SECOND: u32 = 500;
/// Default burst from one source: a ReplicaSet or Job sync creates up to 500 pods at once
/// (kube-controller-manager's `burstReplicas`); two such syncs together, with no wait.
pub const DEFAULT_BURST: u32 = 1_000;
/// Pause between two sweeps of refilled buckets.
pub(crate) const RETAIN_INTERVAL: Duration = Duration::from_secs(60);

/// The limit (`--webhook-rate-limit-per-second`, `--webhook-rate-limit-burst`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RateLimit {
    /// Sustained requests per second from one source; 0 turns the limit off.
    pub per_second: u32,
    /// Requests one source may send at once before the sustained rate applies (at least 1).
    pub burst: u32,
}

impl Default for RateLimit {
    fn default() -> Self {
        RateLimit { per_second: DEFAULT_PER_SECOND, burst: DEFAULT_BURST }
    }
}

/// What to do with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admit {
    /// Serve it.
    Allow,
    /// Answer 429; the source has a token again after this many seconds (at least 1).
    Limited { retry_after_secs: u64 },
}

/// The bucket a peer address draws from: IPv4 addresses as they are (IPv4-mapped IPv6 too),
/// IPv6 addresses by their /64 (see the module header).
pub(crate) fn source_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => {
            let prefix = u128::from(v6) & !((1u128 << 64) - 1);
            IpAddr::V6(Ipv6Addr::from(prefix))
        }
    }
}

type Keyed<C> = RateLimiter<IpAddr, DashMapStateStore<IpAddr>, C, NoOpMiddleware<<C as Clock>::Instant>>;

/// One token bucket per source; `None` inside when the limit is off.
pub struct SourceLimiter<C: Clock = DefaultClock> {
    limiter: Option<Keyed<C>>,
}

impl<C: Clock> std::fmt::Debug for SourceLimiter<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SourceLimiter")
            .field("enabled", &self.limiter.is_some())
            .field("sources", &self.sources())
            .finish()
    }
}

impl SourceLimiter {
    /// A limiter on the monotonic clock.
    pub fn new(limit: RateLimit) -> Self {
        SourceLimiter::with_clock(limit, DefaultClock::default())
    }
}

impl<C: Clock> SourceLimiter<C> {
    /// A limiter on `clock` (tests pass governor's `FakeRelativeClock`).
    pub fn with_clock(limit: RateLimit, clock: C) -> Self {
        let limiter = NonZeroU32::new(limit.per_second).map(|rate| {
            let burst = NonZeroU32::new(limit.burst).unwrap_or(NonZeroU32::MIN);
            RateLimiter::new(Quota::per_second(rate).allow_burst(burst), DashMapStateStore::default(), clock)
        });
        SourceLimiter { limiter }
    }

    /// Takes a token from `peer`'s bucket, or says how long until there is one.
    pub fn check(&self, peer: IpAddr) -> Admit {
        let Some(limiter) = &self.limiter else { return Admit::Allow };
        match limiter.check_key(&source_key(peer)) {
            Ok(()) => Admit::Allow,
            Err(not_until) => {
                let wait = not_until.wait_time_from(limiter.clock().now());
                // Whole seconds (the header's unit), rounded up, never 0 ("retry at once").
                let secs = wait.as_secs() + u64::from(wait.subsec_nanos() > 0);
                Admit::Limited { retry_after_secs: secs.max(1) }
            }
        }
    }

    /// Forgets the buckets that have refilled.
    pub fn retain_recent(&self) {
        if let Some(limiter) = &self.limiter {
            limiter.retain_recent();
            limiter.shrink_to_fit();
        }
    }

    /// Sources with a bucket now.
    pub fn sources(&self) -> usize {
        self.limiter.as_ref().map_or(0, Keyed::len)
    }
}

// === HTTP ===

/// The limiter and the counter of refused requests, the state of [`limit_sources`].
#[derive(Clone, Debug)]
pub(crate) struct Limiting {
    pub(crate) limiter: Arc<SourceLimiter>,
    pub(crate) metrics: WebhookMetrics,
}

/// Axum middleware: 429 with `Retry-After` when the peer's bucket is empty, before the request
/// reaches any route. A request without a peer address (driven in-process, as the benches do)
/// is not limited: there is no source to key on.
pub(crate) async fn limit_sources(State(limiting): State<Limiting>, request: Request, next: Next) -> Response {
    let peer = request.extensions().get::<ConnectInfo<std::net::SocketAddr>>().map(|c| c.0.ip());
    if let Some(peer) = peer
        && let Admit::Limited { retry_after_secs } = limiting.limiter.check(peer)
    {
        limiting.metrics.rate_limited();
        tracing::debug!(%peer, retry_after_secs, "webhook request over the source's rate limit");
        let mut response =
            (StatusCode::TOO_MANY_REQUESTS, "spear webhook: rate limit exceeded for this source\n").into_response();
        response.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(retry_after_secs));
        return response;
    }
    next.run(request).await
}

/// Sweeps refilled buckets every [`RETAIN_INTERVAL`] until `shutdown`.
pub(crate) async fn sweep(limiter: Arc<SourceLimiter>, shutdown: CancellationToken) {
    loop {
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(RETAIN_INTERVAL) => limiter.retain_recent(),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use governor::clock::FakeRelativeClock;

    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("an IP address")
    }

    #[test]
    fn a_source_gets_its_burst_then_the_sustained_rate() {
        let clock = FakeRelativeClock::default();
        let limiter = SourceLimiter::with_clock(RateLimit { per_second: 2, burst: 3 }, clock.clone());
        let flood = ip("10.1.1.1");
        for _ in 0..3 {
            assert_eq!(limiter.check(flood), Admit::Allow);
        }
        assert_eq!(limiter.check(flood), Admit::Limited { retry_after_secs: 1 }, "half a second, rounded up");
        assert_eq!(limiter.check(ip("10.0.0.10")), Admit::Allow, "another source has its own bucket");
        clock.advance(Duration::from_millis(500));
        assert_eq!(limiter.check(flood), Admit::Allow, "one token back after 1/rate");
        assert!(matches!(limiter.check(flood), Admit::Limited { .. }));
        assert_eq!(limiter.sources(), 2);
        clock.advance(Duration::from_secs(10));
        limiter.retain_recent();
        assert_eq!(limiter.sources(), 0, "refilled buckets are forgotten");
    }

    #[test]
    fn retry_after_is_whole_seconds_until_the_next_token() {
        let clock = FakeRelativeClock::default();
        let limiter = SourceLimiter::with_clock(RateLimit { per_second: 1, burst: 1 }, clock.clone());
        let source = ip("192.0.2.1");
        assert_eq!(limiter.check(source), Admit::Allow);
        assert_eq!(limiter.check(source), Admit::Limited { retry_after_secs: 1 });
        clock.advance(Duration::from_millis(999));
        assert_eq!(limiter.check(source), Admit::Limited { retry_after_secs: 1 }, "never 0");
    }

    #[test]
    fn ipv6_sources_are_keyed_by_their_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(source_key(ip("2001:db8:1:2:aaaa::1")), source_key(ip("2001:db8:1:2:ffff::9")));
        assert_ne!(source_key(ip("2001:db8:1:2::1")), source_key(ip("2001:db8:1:3::1")));
        assert_eq!(source_key(ip("::ffff:10.0.0.1")), IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)));
        let limiter = SourceLimiter::with_clock(RateLimit { per_second: 1, burst: 1 }, FakeRelativeClock::default());
        assert_eq!(limiter.check(ip("2001:db8::1")), Admit::Allow);
        assert!(matches!(limiter.check(ip("2001:db8::2")), Admit::Limited { .. }), "same /64, same bucket");
    }

    #[test]
    fn zero_per_second_turns_the_limit_off() {
        let limiter = SourceLimiter::with_clock(RateLimit { per_second: 0, burst: 1 }, FakeRelativeClock::default());
        for _ in 0..10_000 {
            assert_eq!(limiter.check(ip("10.1.1.1")), Admit::Allow);
        }
        assert_eq!(limiter.sources(), 0);
    }
}
