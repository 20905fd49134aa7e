//! Rate limits: which buckets a call draws from ([`RateRules`], compiled with the profile) and
//! the buckets themselves ([`Limiter`], one per agent).
//!
//! ```text
//! McpServer.budgets.rateLimit ──────────▶ bucket (server)
//! McpServer.budgets.toolRateLimits[glob] ▶ bucket (server, tool, glob)     all must have a token:
//! McpProfile.rateLimits[glob] ──────────▶ bucket (server, tool, glob)     one call takes one of each
//! ```
//!
//! - Every limit that matches applies, so a profile can only narrow what its servers allow.
//! - All or nothing: a call refused by one bucket takes no token from the others (one lock over
//!   the check and the take). governor's keyed limiters check one key at a time, which would
//!   charge a refused call to the buckets checked before the one that refused it.
//! - GCRA (one instant per bucket): a bucket allows `burst` calls at once and one more every
//!   `60 s / perMinute`; the refusal carries the wait until the next would pass.
//! - A bucket's key holds its limit: a changed limit starts a full bucket. Full buckets are the
//!   same as absent ones and are dropped when the map grows past [`PRUNE_AT`], so memory follows
//!   the tools called lately, not every key ever seen.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::decision::{Layer, PolicyError};
use super::pattern::PatternSet;
use crate::api::{McpProfile, McpServer, RateLimit};

/// Map size past which full buckets are dropped.
const PRUNE_AT: usize = 1024;

/// Which limit a bucket enforces, for the refusal's message.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Scope {
    /// `McpServer.spec.budgets.rateLimit`.
    Server,
    /// `McpServer.spec.budgets.toolRateLimits[pattern]`.
    ServerTool(Arc<str>),
    /// `McpProfile.spec.rateLimits[pattern]`.
    Profile(Arc<str>),
}

/// One bucket: whose, which limit.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct BucketKey {
    pub(crate) scope: Scope,
    pub(crate) server: Arc<str>,
    /// The tool, for per-tool buckets.
    pub(crate) tool: Option<Arc<str>>,
    pub(crate) per_minute: u32,
    pub(crate) burst: u32,
    /// Whose bucket: the gateway's caller; `None` in a pod, whose buckets are all its own.
    pub(crate) caller: Option<Arc<str>>,
}

impl BucketKey {
    /// Where the limit is written, for people: `McpServer 'fs' budgets.rateLimit`.
    pub(crate) fn describe(&self, profile: &str) -> String {
        let limit = format!("{}/min, burst {}", self.per_minute, self.burst);
        match &self.scope {
            Scope::Server => format!("McpServer '{}' budgets.rateLimit ({limit})", self.server),
            Scope::ServerTool(p) => format!("McpServer '{}' budgets.toolRateLimits['{p}'] ({limit})", self.server),
            Scope::Profile(p) => format!("McpProfile '{profile}' rateLimits['{p}'] ({limit})"),
        }
    }
}

#[derive(Debug)]
struct Rule {
    pattern: Arc<str>,
    matcher: PatternSet,
    limit: RateLimit,
}

impl Rule {
    fn compile(limits: &crate::api::rate_limit::RateLimits, layer: Layer) -> Result<Vec<Rule>, PolicyError> {
        limits
            .iter()
            .map(|(pattern, limit)| {
                let matcher = PatternSet::new(std::slice::from_ref(pattern))
                    .map_err(|source| PolicyError::InvalidPattern { layer, source })?;
                Ok(Rule { pattern: pattern.as_str().into(), matcher, limit: *limit })
            })
            .collect()
    }
}

#[derive(Debug, Default)]
struct ServerRules {
    whole: Option<RateLimit>,
    tools: Vec<Rule>,
}

/// The rate limits of one profile and its servers, compiled once per snapshot.
#[derive(Debug, Default)]
pub(crate) struct RateRules {
    servers: HashMap<Arc<str>, ServerRules>,
    profile: Vec<Rule>,
}

impl RateRules {
    /// Compiles the limits of `profile` and of `servers` (the ones it allows).
    pub(crate) fn compile<'a>(
        profile: &McpProfile,
        servers: impl Iterator<Item = (&'a str, &'a McpServer)>,
    ) -> Result<Self, PolicyError> {
        let mut rules =
            RateRules { profile: Rule::compile(&profile.spec.rate_limits, Layer::Profile)?, ..Default::default() };
        for (id, server) in servers {
            let Some(budgets) = &server.spec.budgets else { continue };
            let tools = Rule::compile(&budgets.tool_rate_limits, Layer::Server)?;
            if budgets.rate_limit.is_some() || !tools.is_empty() {
                rules.servers.insert(id.into(), ServerRules { whole: budgets.rate_limit, tools });
            }
        }
        Ok(rules)
    }

    /// Whether no call is limited at all (the hot path skips the limiter).
    pub(crate) fn is_empty(&self) -> bool {
        self.servers.is_empty() && self.profile.is_empty()
    }

    /// The buckets a call of `tool` on `server`, exposed as `model_name`, draws from: `caller`'s
    /// own in the gateway (each caller is limited as a pod is), the agent's in a pod (`None`).
    pub(crate) fn buckets(
        &self,
        server: &Arc<str>,
        tool: &Arc<str>,
        model_name: &str,
        caller: Option<&str>,
    ) -> Vec<BucketKey> {
        let mut out = Vec::new();
        let caller: Option<Arc<str>> = caller.map(Into::into);
        let key = |scope, tool: Option<&Arc<str>>, limit: &RateLimit| BucketKey {
            scope,
            server: server.clone(),
            tool: tool.cloned(),
            per_minute: limit.per_minute,
            burst: limit.burst(),
            caller: caller.clone(),
        };
        if let Some(rules) = self.servers.get(server) {
            if let Some(limit) = &rules.whole {
                out.push(key(Scope::Server, None, limit));
            }
            for rule in rules.tools.iter().filter(|r| r.matcher.is_match(tool)) {
                out.push(key(Scope::ServerTool(rule.pattern.clone()), Some(tool), &rule.limit));
            }
        }
        if !self.profile.is_empty() {
            let qualified = format!("{server}/{tool}");
            for rule in &self.profile {
                let m = &rule.matcher;
                if m.is_match(tool) || m.is_match(&qualified) || m.is_match(model_name) {
                    out.push(key(Scope::Profile(rule.pattern.clone()), Some(tool), &rule.limit));
                }
            }
        }
        out
    }
}

/// A call over a limit: which one, and when a call would pass again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Limited {
    pub(crate) bucket: BucketKey,
    pub(crate) retry_after: Duration,
}

/// The agent's buckets. One lock: a check over a handful of buckets takes well under a
/// microsecond, far below what contention on it could cost.
#[derive(Debug, Default)]
pub(crate) struct Limiter {
    /// Theoretical arrival time of each bucket (GCRA): the bucket is full when it is not after now.
    buckets: Mutex<HashMap<BucketKey, Instant>>,
}

/// Time between two tokens of a limit.
fn interval(key: &BucketKey) -> Duration {
    Duration::from_secs(60) / key.per_minute.max(1)
}

impl Limiter {
    /// Takes one token from each of `keys`, or none when one has none: then the bucket that
    /// waits longest, and how long.
    pub(crate) fn take(&self, keys: &[BucketKey], now: Instant) -> Result<(), Limited> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut buckets = self.buckets.lock();
        let mut worst: Option<Limited> = None;
        for key in keys {
            let tat = buckets.get(key).copied().unwrap_or(now).max(now);
            let tolerance = interval(key) * (key.burst - 1);
            // Allowed when tat - tolerance <= now.
            let allowed_at = tat.checked_sub(tolerance).unwrap_or(now);
            if allowed_at > now {
                let retry_after = allowed_at - now;
                if worst.as_ref().is_none_or(|w| retry_after > w.retry_after) {
                    worst = Some(Limited { bucket: key.clone(), retry_after });
                }
            }
        }
        if let Some(limited) = worst {
            return Err(limited);
        }
        for key in keys {
            let tat = buckets.get(key).copied().unwrap_or(now).max(now);
            buckets.insert(key.clone(), tat + interval(key));
        }
        if buckets.len() > PRUNE_AT {
            buckets.retain(|_, tat| *tat > now);
        }
        Ok(())
    }

    /// Buckets held (tests and the bench).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.buckets.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::api::{McpProfileSpec, McpServerSpec, ServerBudgets};

    fn limit(per_minute: u32, burst: u32) -> RateLimit {
        RateLimit { per_minute, burst: Some(burst) }
    }

    fn rules(server: Option<RateLimit>, tools: &[(&str, RateLimit)], profile: &[(&str, RateLimit)]) -> RateRules {
        let budgets = ServerBudgets {
            rate_limit: server,
            tool_rate_limits: tools.iter().map(|(p, l)| (p.to_string(), *l)).collect(),
            ..Default::default()
        };
        let fs = McpServer::new("fs", McpServerSpec { budgets: Some(budgets), ..Default::default() });
        let web = McpServer::new("web", McpServerSpec::default());
        let p = McpProfile::new(
            "dev",
            McpProfileSpec {
                rate_limits: profile.iter().map(|(p, l)| (p.to_string(), *l)).collect::<BTreeMap<_, _>>(),
                ..Default::default()
            },
        );
        RateRules::compile(&p, [("fs", &fs), ("web", &web)].into_iter()).expect("compiles")
    }

    fn keys(rules: &RateRules, server: &str, tool: &str) -> Vec<BucketKey> {
        let model = format!("mcp__{server}__{tool}");
        rules.buckets(&server.into(), &tool.into(), &model, None)
    }

    #[test]
    fn each_gateway_caller_has_its_own_buckets() {
        let r = rules(Some(limit(60, 1)), &[], &[("write", limit(60, 1))]);
        let limiter = Limiter::default();
        let t0 = Instant::now();
        let of = |caller| r.buckets(&"fs".into(), &"write".into(), "mcp__fs__write", caller);
        limiter.take(&of(Some("system:serviceaccount:a:app")), t0).expect("a's first call");
        limiter.take(&of(Some("system:serviceaccount:a:app")), t0).expect_err("a's buckets are empty");
        limiter.take(&of(Some("system:serviceaccount:b:app")), t0).expect("b is not slowed by a");
        limiter.take(&of(None), t0).expect("a pod's buckets are apart from every caller's");
    }

    #[test]
    fn a_burst_passes_then_one_call_per_interval_with_the_wait_named() {
        let r = rules(Some(limit(60, 3)), &[], &[]);
        let limiter = Limiter::default();
        let k = keys(&r, "fs", "read");
        let t0 = Instant::now();
        for _ in 0..3 {
            limiter.take(&k, t0).expect("within the burst");
        }
        let refused = limiter.take(&k, t0).expect_err("burst used up");
        assert_eq!(refused.retry_after, Duration::from_secs(1), "one token a second at 60/min");
        assert_eq!(refused.bucket.scope, Scope::Server);
        limiter.take(&k, t0 + Duration::from_millis(999)).expect_err("not yet");
        limiter.take(&k, t0 + Duration::from_secs(1)).expect("a token after the interval");
        limiter.take(&k, t0 + Duration::from_secs(1)).expect_err("only one");
        // A quiet spell refills to the burst, never beyond.
        let later = t0 + Duration::from_secs(600);
        for _ in 0..3 {
            limiter.take(&k, later).expect("refilled");
        }
        limiter.take(&k, later).expect_err("never more than the burst");
    }

    #[test]
    fn the_server_limit_is_shared_by_its_tools_and_tool_limits_are_per_tool() {
        let r = rules(Some(limit(60, 3)), &[("write_*", limit(60, 1))], &[]);
        let limiter = Limiter::default();
        let t0 = Instant::now();
        limiter.take(&keys(&r, "fs", "write_a"), t0).expect("first write");
        limiter.take(&keys(&r, "fs", "write_b"), t0).expect("another tool has its own bucket");
        let refused = limiter.take(&keys(&r, "fs", "write_a"), t0).expect_err("write_a's bucket is empty");
        assert_eq!(refused.bucket.scope, Scope::ServerTool("write_*".into()));
        limiter.take(&keys(&r, "fs", "read"), t0).expect("third call of the server");
        let refused = limiter.take(&keys(&r, "fs", "read"), t0).expect_err("server bucket empty");
        assert_eq!(refused.bucket.scope, Scope::Server);
        assert!(keys(&r, "web", "x").is_empty(), "a server without limits");
    }

    #[test]
    fn a_refused_call_takes_no_token_from_the_other_buckets() {
        let r = rules(Some(limit(60, 2)), &[("write", limit(60, 1))], &[]);
        let limiter = Limiter::default();
        let t0 = Instant::now();
        limiter.take(&keys(&r, "fs", "write"), t0).expect("first");
        for _ in 0..5 {
            limiter.take(&keys(&r, "fs", "write"), t0).expect_err("the tool bucket is empty");
        }
        limiter.take(&keys(&r, "fs", "read"), t0).expect("the server bucket still has its second token");
    }

    #[test]
    fn a_profile_limit_narrows_and_matches_every_spelling_of_a_tool() {
        let wide = limit(600, 100);
        let r = rules(Some(wide), &[], &[("mcp__fs__write*", limit(60, 1))]);
        assert_eq!(keys(&r, "fs", "write").len(), 2, "server and profile limits both apply");
        assert_eq!(keys(&r, "fs", "read").len(), 1);
        for pattern in ["write", "fs/write", "mcp__fs__*", "*"] {
            let r = rules(None, &[], &[(pattern, limit(60, 1))]);
            assert_eq!(keys(&r, "fs", "write").len(), 1, "{pattern}");
        }
        let r = rules(None, &[], &[("web/*", limit(60, 1))]);
        assert!(keys(&r, "fs", "write").is_empty(), "another server's pattern");
        let limiter = Limiter::default();
        let r = rules(Some(wide), &[], &[("write", limit(60, 1))]);
        let t0 = Instant::now();
        limiter.take(&keys(&r, "fs", "write"), t0).expect("first");
        let refused = limiter.take(&keys(&r, "fs", "write"), t0).expect_err("the profile's bucket");
        assert_eq!(refused.bucket.describe("dev"), "McpProfile 'dev' rateLimits['write'] (60/min, burst 1)");
    }

    #[test]
    fn a_changed_limit_starts_a_full_bucket_and_full_buckets_are_pruned() {
        let limiter = Limiter::default();
        let t0 = Instant::now();
        let k = keys(&rules(Some(limit(60, 1)), &[], &[]), "fs", "t");
        limiter.take(&k, t0).expect("first");
        limiter.take(&k, t0).expect_err("empty");
        let changed = keys(&rules(Some(limit(120, 1)), &[], &[]), "fs", "t");
        limiter.take(&changed, t0).expect("a new limit, a new bucket");
        let many = rules(None, &[("*", limit(60, 1))], &[]);
        for i in 0..(PRUNE_AT + 10) {
            limiter.take(&keys(&many, "fs", &format!("tool{i}")), t0).expect("own bucket");
        }
        assert!(limiter.len() > PRUNE_AT);
        limiter.take(&keys(&many, "fs", "late"), t0 + Duration::from_secs(2)).expect("own bucket");
        assert_eq!(limiter.len(), 1, "every bucket refilled by then is dropped");
    }

    #[test]
    fn the_largest_limits_do_not_overflow() {
        let r = rules(
            Some(limit(crate::api::rate_limit::MAX_PER_MINUTE, crate::api::rate_limit::MAX_PER_MINUTE)),
            &[],
            &[],
        );
        let limiter = Limiter::default();
        let t0 = Instant::now();
        for _ in 0..1000 {
            limiter.take(&keys(&r, "fs", "t"), t0).expect("a huge burst");
        }
        let slow = rules(Some(limit(1, 1)), &[], &[]);
        limiter.take(&keys(&slow, "fs", "t"), t0).expect("first");
        let refused = limiter.take(&keys(&slow, "fs", "t"), t0).expect_err("one a minute");
        assert_eq!(refused.retry_after, Duration::from_secs(60));
    }
}
