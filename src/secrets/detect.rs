//! Detectors for secrets the agent does not hold: well-known credential shapes found by regular
//! expression, replaced by `[redacted: detector <name>]`.
//!
//! Each pattern is anchored on the format's fixed prefix and starts at an ASCII word boundary, so
//! `xAKIA…` or `task-…` in ordinary text does not fire. There is no boundary at the end: a
//! longer run is still a finding (its known prefix is redacted), which keeps redaction one pass.
//! The one context a finding depends on is the character before it; once a finding becomes a
//! marker (ending in `]`), text right after it may start a finding its original neighbour hid, so
//! [`DetectorSet::redact`] also tries each detector anchored at the end of every replaced range,
//! and its output has no finding left.
//!
//! The `regex` crate matches in linear time; its compiled size and lazy-DFA cache are capped
//! ([`SIZE_LIMIT`]). The patterns are constants, compiled once per process; a test compiles them.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::{Regex, RegexBuilder, RegexSet, RegexSetBuilder};
use serde_json::Value;

use super::json::{find_in_strings, redact_strings};
pub use crate::api::Detector;

/// Compiled-program and lazy-DFA cache limit of each regex and of a set.
const SIZE_LIMIT: usize = 2 * 1024 * 1024;

impl Detector {
    pub const ALL: [Detector; 9] = [
        Detector::PrivateKey,
        Detector::AwsAccessKey,
        Detector::GcpApiKey,
        Detector::GithubToken,
        Detector::GitlabToken,
        Detector::SlackToken,
        Detector::StripeKey,
        Detector::OpenaiKey,
        Detector::Jwt,
    ];

    /// The camelCase wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Detector::PrivateKey => "privateKey",
            Detector::AwsAccessKey => "awsAccessKey",
            Detector::GcpApiKey => "gcpApiKey",
            Detector::GithubToken => "githubToken",
            Detector::GitlabToken => "gitlabToken",
            Detector::SlackToken => "slackToken",
            Detector::StripeKey => "stripeKey",
            Detector::OpenaiKey => "openaiKey",
            Detector::Jwt => "jwt",
        }
    }

    /// The pattern, without the leading word boundary ([`Detector::bounded`] says whether it has
    /// one).
    fn pattern(self) -> &'static str {
        match self {
            // RFC 7468 section 2 (textual encoding: `-----BEGIN <label>-----`), labels such as
            // `PRIVATE KEY`, `RSA PRIVATE KEY`, `EC PRIVATE KEY`, `ENCRYPTED PRIVATE KEY`,
            // `OPENSSH PRIVATE KEY`; RFC 4880 section 6.2 (`PGP PRIVATE KEY BLOCK`). To the END
            // line, or to the end of the text when it was cut.
            Detector::PrivateKey => {
                r"-----BEGIN[A-Z0-9 ]* PRIVATE KEY(?: BLOCK)?-----(?s:.*?)(?:-----END[A-Z0-9 ]* PRIVATE KEY(?: BLOCK)?-----|\z)"
            }
            // AWS IAM user guide, "IAM identifiers", unique identifier prefixes: AKIA access key,
            // ASIA temporary (STS) access key, ABIA STS service bearer token, ACCA
            // context-specific credential; 20 characters, uppercase letters and digits.
            Detector::AwsAccessKey => r"(?:AKIA|ASIA|ABIA|ACCA)[A-Z0-9]{16}",
            // Google Cloud, "Manage API keys": keys are `AIza` and 35 URL-safe characters.
            Detector::GcpApiKey => r"AIza[0-9A-Za-z_-]{35}",
            // GitHub blog, "Behind GitHub's new authentication token formats" (2021): `ghp_`
            // personal, `gho_` OAuth, `ghu_` user-to-server, `ghs_` server-to-server, `ghr_`
            // refresh, then base62 (36 characters today, up to 255 allowed); `github_pat_` is the
            // fine-grained personal access token (GitHub docs, 2022).
            Detector::GithubToken => r"(?:gh[pousr]_[A-Za-z0-9]{36,255}|github_pat_[A-Za-z0-9_]{22,255})",
            // GitLab docs, "Token overview: token prefixes": personal (`glpat-`), OAuth
            // application secret (`gloas-`), deploy (`gldt-`), runner (`glrt-`), CI/CD job
            // (`glcbt-`), pipeline trigger (`glptt-`), feed (`glft-`), incoming mail (`glimt-`),
            // agent (`glagent-`), SCIM (`glsoat-`), feature flags client (`glffct-`) tokens.
            Detector::GitlabToken => r"gl(?:pat|oas|dt|rt|cbt|ptt|ft|imt|agent|soat|ffct)-[0-9A-Za-z_-]{20,}",
            // Slack API docs, "Token types": bot `xoxb-`, user `xoxp-`, app-level refresh and
            // legacy workspace `xoxa-`/`xoxr-`/`xoxs-`.
            Detector::SlackToken => r"xox[baprs]-[0-9A-Za-z-]{10,}",
            // Stripe docs, "API keys": secret `sk_live_`/`sk_test_`, restricted `rk_…`.
            Detector::StripeKey => r"[sr]k_(?:live|test)_[0-9A-Za-z]{16,}",
            // OpenAI API reference, "Authentication": `sk-`, project keys `sk-proj-`, service
            // accounts `sk-svcacct-`, admin keys `sk-admin-` (a hyphen: Stripe's `sk_` never
            // overlaps). A finding must hold a digit ([`Detector::plausible`]).
            Detector::OpenaiKey => r"sk-(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{20,}",
            // RFC 7519 / RFC 7515 compact serialization: three base64url parts joined by dots;
            // `eyJ` is the base64url of `{"`, so header and payload are both JSON objects.
            Detector::Jwt => r"eyJ[A-Za-z0-9_-]{5,}\.eyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{10,}",
        }
    }

    /// Whether the pattern must start at an ASCII word boundary (every prefix but the PEM line,
    /// which starts with `-`, begins with a word character).
    fn bounded(self) -> bool {
        self != Detector::PrivateKey
    }

    /// A check the pattern cannot express: an OpenAI key is random base62, so a run with no digit
    /// at all (`sk-learn-style-estimators-explained`) is prose.
    fn plausible(self, found: &str) -> bool {
        match self {
            Detector::OpenaiKey => found.bytes().any(|b| b.is_ascii_digit()),
            _ => true,
        }
    }

    /// The pattern as searched: from a word boundary where the format has one.
    fn searched(self) -> String {
        if self.bounded() { format!(r"(?-u:\b)(?:{})", self.pattern()) } else { self.pattern().to_string() }
    }
}

/// One detector's compiled regexes.
struct Compiled {
    /// Anywhere in a text, from a word boundary.
    found: Regex,
    /// At the start of a text, boundary or not (text right after a marker).
    at_start: Regex,
}

fn regex(pattern: &str) -> Regex {
    RegexBuilder::new(pattern)
        .size_limit(SIZE_LIMIT)
        .dfa_size_limit(SIZE_LIMIT)
        .build()
        // A constant pattern compiles or never does; `detectors_compile` proves it does.
        .expect("a detector pattern compiles")
}

static COMPILED: LazyLock<[Compiled; 9]> = LazyLock::new(|| {
    Detector::ALL.map(|d| Compiled { found: regex(&d.searched()), at_start: regex(&format!("^(?:{})", d.pattern())) })
});

fn compiled(detector: Detector) -> &'static Compiled {
    &COMPILED[detector as usize]
}

/// The first plausible finding of `detector` in `text` at or after `from`.
fn find_from(detector: Detector, text: &str, mut from: usize) -> Option<(usize, usize)> {
    let regex = &compiled(detector).found;
    while let Some(m) = regex.find_at(text, from) {
        if detector.plausible(m.as_str()) {
            return Some((m.start(), m.end()));
        }
        // Every part of an implausible run is implausible too: go on after it.
        from = m.end();
    }
    None
}

/// A replaced range and the detector named in its marker.
#[derive(Clone, Copy, Debug)]
struct Finding {
    start: usize,
    end: usize,
    detector: Detector,
}

/// A chosen list of detectors, compiled. Immutable; share it in an `Arc`.
#[derive(Clone, Debug, Default)]
pub(crate) struct DetectorSet {
    /// In [`Detector::ALL`] order, each once.
    detectors: Vec<Detector>,
    /// All of them at once, for the question "anything?" (one scan); None when empty.
    any: Option<RegexSet>,
}

impl DetectorSet {
    pub(crate) fn new(detectors: &[Detector]) -> Self {
        let detectors: Vec<Detector> = Detector::ALL.into_iter().filter(|d| detectors.contains(d)).collect();
        let any = (!detectors.is_empty()).then(|| {
            RegexSetBuilder::new(detectors.iter().map(|d| d.searched()))
                .size_limit(SIZE_LIMIT)
                .dfa_size_limit(SIZE_LIMIT)
                .build()
                // A subset of the constant patterns, each smaller than the whole set
                // `detectors_compile` builds.
                .expect("a set of detector patterns compiles")
        });
        DetectorSet { detectors, any }
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.detectors.is_empty()
    }

    /// The first detector (in [`Detector::ALL`] order) that finds something in `text`.
    pub(crate) fn first_in(&self, text: &str) -> Option<Detector> {
        let any = self.any.as_ref()?;
        if !any.is_match(text) {
            return None;
        }
        let matched = any.matches(text);
        matched.iter().map(|i| self.detectors[i]).find(|&d| find_from(d, text, 0).is_some())
    }

    /// Every finding replaced by `[redacted: detector <name>]`; Borrowed when nothing found.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_counted(text).0
    }

    /// Redacts every string in a JSON value (object keys too), in place; returns how many
    /// replacements were made.
    pub(crate) fn redact_json(&self, value: &mut Value) -> usize {
        redact_strings(value, &|s| match self.redact_counted(s) {
            (Cow::Owned(redacted), n) => Some((redacted, n)),
            (Cow::Borrowed(_), _) => None,
        })
    }

    /// [`DetectorSet::first_in`] over every string (and key) of a JSON value.
    pub(crate) fn first_in_json(&self, value: &Value) -> Option<Detector> {
        find_in_strings(value, &|s| self.first_in(s))
    }

    fn redact_counted<'a>(&self, text: &'a str) -> (Cow<'a, str>, usize) {
        let Some(any) = &self.any else { return (Cow::Borrowed(text), 0) };
        if !any.is_match(text) {
            return (Cow::Borrowed(text), 0);
        }
        let mut found = Vec::new();
        for &detector in &self.detectors {
            let mut from = 0;
            while let Some((start, end)) = find_from(detector, text, from) {
                found.push(Finding { start, end, detector });
                from = end;
            }
        }
        if found.is_empty() {
            return (Cow::Borrowed(text), 0);
        }
        // Earliest first, the longest of those first: it names the merged range.
        found.sort_unstable_by_key(|f| (f.start, std::cmp::Reverse(f.end)));
        let merged = self.merge(text, &found);
        let mut out = String::with_capacity(text.len() + 32 * merged.len());
        let mut last = 0;
        for f in &merged {
            out.push_str(text.get(last..f.start).unwrap_or_default());
            out.push_str("[redacted: detector ");
            out.push_str(f.detector.as_str());
            out.push(']');
            last = f.end;
        }
        out.push_str(text.get(last..).unwrap_or_default());
        let count = merged.len();
        (Cow::Owned(out), count)
    }

    /// Overlapping findings as one range each, each range extended by findings that start right
    /// where it ends (see the module doc).
    fn merge(&self, text: &str, sorted: &[Finding]) -> Vec<Finding> {
        let mut merged: Vec<Finding> = Vec::new();
        let mut next = 0;
        while let Some(&first) = sorted.get(next) {
            let mut range = first;
            next += 1;
            loop {
                while let Some(f) = sorted.get(next).filter(|f| f.start < range.end) {
                    range.end = range.end.max(f.end);
                    next += 1;
                }
                match self.longest_at(text, range.end) {
                    Some(end) if end > range.end => range.end = end,
                    _ => break,
                }
            }
            merged.push(range);
        }
        merged
    }

    /// The end of the longest plausible finding that starts exactly at `at`, boundary or not.
    fn longest_at(&self, text: &str, at: usize) -> Option<usize> {
        let rest = text.get(at..).filter(|rest| !rest.is_empty())?;
        self.detectors
            .iter()
            .filter_map(|&d| compiled(d).at_start.find(rest).filter(|m| d.plausible(m.as_str())).map(|m| at + m.end()))
            .max()
    }
}

#[cfg(test)]
mod tests;
