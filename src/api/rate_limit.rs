//! How often a workload may call (`McpServer.spec.budgets.rateLimit` and `toolRateLimits`,
//! `McpProfile.spec.rateLimits`). Token buckets, kept by each pod's agent: a limit bounds one
//! pod's calls, not the sum over pods (a shared budget needs a shared store; the agent has none).
//!
//! Every limit that matches a call applies, so a profile's limit can only narrow a server's.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Most calls per minute a limit may allow (about 16,000 a second).
pub const MAX_PER_MINUTE: u32 = 1_000_000;
/// Most glob keys in one `toolRateLimits` or `rateLimits` map.
pub const MAX_RATE_LIMIT_PATTERNS: usize = 64;

/// A token bucket: `perMinute` calls a minute, up to `burst` at once.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RateLimit {
    /// Calls a minute, sustained (1 to 1000000). Past the limit a call ends with
    /// `mcp_rate_limited` and `retry_after_ms`, the wait until it would be allowed.
    #[schemars(range(min = 1, max = 1_000_000))]
    pub per_minute: u32,

    /// Calls allowed at once after a quiet spell (default: `perMinute`, a minute's worth; at
    /// least 1, at most 1000000).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1_000_000))]
    pub burst: Option<u32>,
}

impl RateLimit {
    /// The burst in force, with the default applied.
    pub fn burst(&self) -> u32 {
        self.burst.unwrap_or(self.per_minute).max(1)
    }
}

/// Rate limits keyed by tool pattern.
pub type RateLimits = BTreeMap<String, RateLimit>;

/// `(field, message, fix)` for each problem of one limit.
pub(crate) fn problems(field: &str, limit: &RateLimit) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let fix = format!("use a value from 1 to {MAX_PER_MINUTE}");
    if !(1..=MAX_PER_MINUTE).contains(&limit.per_minute) {
        out.push((format!("{field}.perMinute"), format!("{} is out of range", limit.per_minute), fix.clone()));
    }
    if let Some(burst) = limit.burst.filter(|b| !(1..=MAX_PER_MINUTE).contains(b)) {
        out.push((format!("{field}.burst"), format!("{burst} is out of range"), fix));
    }
    out
}
