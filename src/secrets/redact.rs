//! The values the agent holds, found in any of their spellings ([`super::spell`]) by one
//! Aho-Corasick automaton, and replaced by `[redacted: <origin>]`.
//!
//! The automaton reports every occurrence, overlapping ones too (standard semantics, not
//! leftmost): a redaction covers the union of all occurrences, so a value that overlaps another
//! is not left with its tail showing, and [`Redactor::foreign_in`] sees a foreign value even where
//! it overlaps one the server was granted. A union of several occurrences is one marker, naming the
//! value that starts first (the longer one on a tie).

use std::borrow::Cow;
use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::sync::Arc;

use aho_corasick::{AhoCorasick, AhoCorasickKind, MatchKind};
use serde_json::Value;

use super::gate::Gate;
use super::json::{find_in_strings, redact_strings};
use super::spell::spellings;

/// Values (and spellings) shorter than this are not searched: a short value such as `admin` or
/// `true` occurs in ordinary text, and redacting every occurrence would garble output while
/// protecting a value that is guessable anyway.
pub(crate) const MIN_SECRET_BYTES: usize = 8;
/// An origin's longest form in a marker.
pub(crate) const MAX_ORIGIN_CHARS: usize = 128;
/// The shortest tail [`Redactor::redact_cut`] removes: three bytes of a prefix is noise (a tail of
/// ordinary text matches some spelling's first three bytes too often), four is where it stops.
pub(crate) const MIN_CUT_TAIL_BYTES: usize = 4;
/// Spelling bytes up to which the automaton is a DFA: about one state per byte and a row of byte
/// classes per state, so at most a few MiB (a handful of tokens is a few KiB of spellings). Past
/// it (a PEM key's spellings alone are ~100 KiB) the contiguous NFA, at a few bytes per state.
const DFA_MAX_SPELLING_BYTES: usize = 16 * 1024;
/// What a redactor that could not build its automaton says (it then redacts everything).
const UNSEARCHABLE: &str = "secrets could not be searched";

/// One secret value the agent holds.
#[derive(Clone)]
pub(crate) struct Secret {
    pub(crate) value: String,
    /// Where it came from, as the replacement names it: e.g. "header Authorization of github",
    /// "upstream api key", "oauth token of github". [`Redactor::new`] replaces `]` and control
    /// characters with `_` and keeps at most [`MAX_ORIGIN_CHARS`] characters.
    pub(crate) origin: Arc<str>,
    /// The server this value was granted to (its McpServer name); None: granted to no server (the
    /// upstream model key, the agent's own API key).
    pub(crate) granted_to: Option<Arc<str>>,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("value", &format_args!("<{} bytes>", self.value.len()))
            .field("origin", &self.origin)
            .field("granted_to", &self.granted_to)
            .finish()
    }
}

/// A held value's name and grant (its value lives only in the spellings).
struct Held {
    origin: Arc<str>,
    granted_to: Option<Arc<str>>,
}

/// One searched spelling: pattern `i` of the automaton is `spellings[i]`.
struct Spelling {
    text: Box<[u8]>,
    /// The held values spelled this way (two values can share a spelling); never empty.
    owners: Box<[u32]>,
}

enum Search {
    /// No value long enough to search.
    Nothing,
    /// The automaton, and the gate that spares it most texts (None: every text is searched).
    Ready(AhoCorasick, Option<Gate>),
    /// The automaton could not be built (more spelling bytes than it can index): fail closed.
    Unsearchable,
}

/// A replaced range of a text and whose value it held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Span {
    start: usize,
    end: usize,
    owner: u32,
}

/// The held values, ready to search. Immutable once built; share it in an `Arc`.
pub(crate) struct Redactor {
    search: Search,
    spellings: Vec<Spelling>,
    held: Vec<Held>,
    longest: usize,
}

impl fmt::Debug for Redactor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let origins: Vec<&str> = self.held.iter().map(|h| &*h.origin).collect();
        f.debug_struct("Redactor")
            .field("origins", &origins)
            .field("spellings", &self.spellings.len())
            .field("searchable", &!matches!(self.search, Search::Unsearchable))
            .finish()
    }
}

impl Default for Redactor {
    fn default() -> Self {
        Self::empty()
    }
}

/// `]` and control characters replaced with `_`, at most [`MAX_ORIGIN_CHARS`] characters: the
/// marker stays one bracketed, one-line phrase.
pub(crate) fn sanitize_origin(origin: &str) -> Arc<str> {
    let sanitized: String =
        origin.chars().take(MAX_ORIGIN_CHARS).map(|c| if c == ']' || c.is_control() { '_' } else { c }).collect();
    sanitized.into()
}

impl Redactor {
    pub(crate) fn new(secrets: impl IntoIterator<Item = Secret>) -> Self {
        let mut held = Vec::new();
        let mut spellings: Vec<Spelling> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        for secret in secrets {
            if secret.value.len() < MIN_SECRET_BYTES {
                continue;
            }
            let Ok(owner) = u32::try_from(held.len()) else { break };
            held.push(Held { origin: sanitize_origin(&secret.origin), granted_to: secret.granted_to });
            for spelling in spellings_of(&secret.value) {
                match index.get(&spelling) {
                    Some(&i) => {
                        let owners = &mut spellings[i].owners;
                        if !owners.contains(&owner) {
                            *owners = owners.iter().copied().chain([owner]).collect();
                        }
                    }
                    None => {
                        index.insert(spelling.clone(), spellings.len());
                        spellings.push(Spelling { text: spelling.into_bytes().into(), owners: Box::new([owner]) });
                    }
                }
            }
        }
        let longest = spellings.iter().map(|s| s.text.len()).max().unwrap_or(0);
        let search = if spellings.is_empty() { Search::Nothing } else { build(&spellings) };
        Redactor { search, spellings, held, longest }
    }

    pub(crate) fn empty() -> Self {
        Redactor { search: Search::Nothing, spellings: Vec::new(), held: Vec::new(), longest: 0 }
    }

    /// True when nothing is searched (no value of at least [`MIN_SECRET_BYTES`]).
    pub(crate) fn is_empty(&self) -> bool {
        matches!(self.search, Search::Nothing)
    }

    /// Every occurrence of a held value, in any of its spellings, replaced by
    /// `[redacted: <origin>]`. Borrowed when nothing matched: one scan, no allocation.
    pub(crate) fn redact<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_counted(text, false).0
    }

    /// As [`Redactor::redact`], for text that was cut (truncated output): a tail of at least
    /// [`MIN_CUT_TAIL_BYTES`] that is a proper prefix of a spelling is redacted too, so no prefix
    /// of a value survives the cut.
    pub(crate) fn redact_cut<'a>(&self, text: &'a str) -> Cow<'a, str> {
        self.redact_counted(text, true).0
    }

    /// Redacts every string in a JSON value (object keys too), in place; returns how many
    /// replacements were made.
    pub(crate) fn redact_json(&self, value: &mut Value) -> usize {
        redact_strings(value, &|s| match self.redact_counted(s, false) {
            (Cow::Owned(redacted), n) => Some((redacted, n)),
            (Cow::Borrowed(_), _) => None,
        })
    }

    /// The origin of a held value found in `text` that is not granted to `server` (any
    /// spelling), the first to end; None if none. An occurrence inside occurrences of values the
    /// server was granted is not foreign: the server already has those bytes.
    pub(crate) fn foreign_in(&self, text: &str, server: &str) -> Option<&str> {
        let ac = match &self.search {
            Search::Nothing => return None,
            Search::Unsearchable => return (!text.is_empty()).then_some(UNSEARCHABLE),
            Search::Ready(ac, gate) if gate.as_ref().is_none_or(|g| g.may_match(text.as_bytes())) => ac,
            Search::Ready(..) => return None,
        };
        // Granted occurrences merged into disjoint ranges (touching ones too); foreign ones wait
        // until no later granted occurrence can cover them: one that ends more than `longest`
        // bytes after a foreign occurrence starts after it.
        let mut granted: Vec<(usize, usize)> = Vec::new();
        let mut pending: VecDeque<Span> = VecDeque::new();
        let covered = |granted: &[(usize, usize)], f: &Span| {
            let n = granted.partition_point(|g| g.0 <= f.start);
            n > 0 && granted[n - 1].1 >= f.end
        };
        for m in ac.find_overlapping_iter(text) {
            while let Some(f) = pending.front().filter(|f| f.end + self.longest < m.end()) {
                if !covered(&granted, f) {
                    return Some(&self.held[f.owner as usize].origin);
                }
                pending.pop_front();
            }
            let owners = &self.spellings[m.pattern().as_usize()].owners;
            if owners.iter().any(|&o| self.held[o as usize].granted_to.as_deref() == Some(server)) {
                let (mut start, mut end) = (m.start(), m.end());
                while let Some(&(s, e)) = granted.last().filter(|g| g.1 >= start) {
                    (start, end) = (start.min(s), end.max(e));
                    granted.pop();
                }
                granted.push((start, end));
            } else {
                pending.push_back(Span { start: m.start(), end: m.end(), owner: owners[0] });
            }
        }
        pending.iter().find(|f| !covered(&granted, f)).map(|f| &*self.held[f.owner as usize].origin)
    }

    /// Whether some value held was not granted to `server`: without one, nothing in a call's
    /// arguments can be foreign, and [`Redactor::foreign_in`] need not look (ask once per call).
    pub(crate) fn holds_foreign_to(&self, server: &str) -> bool {
        self.held.iter().any(|h| h.granted_to.as_deref() != Some(server))
    }

    /// [`Redactor::foreign_in`] over every string (and key) of a JSON value.
    pub(crate) fn foreign_in_json(&self, value: &Value, server: &str) -> Option<&str> {
        find_in_strings(value, &|s| self.foreign_in(s, server))
    }

    fn redact_counted<'a>(&self, text: &'a str, cut: bool) -> (Cow<'a, str>, usize) {
        let (ac, gate) = match &self.search {
            Search::Nothing => return (Cow::Borrowed(text), 0),
            Search::Unsearchable if text.is_empty() => return (Cow::Borrowed(text), 0),
            Search::Unsearchable => return (Cow::Owned(format!("[redacted: {UNSEARCHABLE}]")), 1),
            Search::Ready(ac, gate) => (ac, gate),
        };
        let mut spans = Vec::new();
        if gate.as_ref().is_none_or(|g| g.may_match(text.as_bytes())) {
            for m in ac.find_overlapping_iter(text) {
                let owner = self.spellings[m.pattern().as_usize()].owners[0];
                push_merged(&mut spans, text, Span { start: m.start(), end: m.end(), owner });
            }
        }
        if cut && let Some(tail) = self.cut_tail(text.as_bytes()) {
            push_merged(&mut spans, text, tail);
        }
        if spans.is_empty() {
            return (Cow::Borrowed(text), 0);
        }
        (Cow::Owned(self.replace(text, &spans)), spans.len())
    }

    /// The longest tail of `text` of at least [`MIN_CUT_TAIL_BYTES`] that is a proper prefix of a
    /// spelling.
    fn cut_tail(&self, text: &[u8]) -> Option<Span> {
        let mut best: Option<(usize, u32)> = None;
        let mut failure = Vec::new();
        for spelling in &self.spellings {
            let most = (spelling.text.len() - 1).min(text.len());
            if most < MIN_CUT_TAIL_BYTES || best.is_some_and(|(len, _)| most <= len) {
                continue;
            }
            let len = overlap(text, &spelling.text, &mut failure);
            if len >= MIN_CUT_TAIL_BYTES && best.is_none_or(|(b, _)| len > b) {
                best = Some((len, spelling.owners[0]));
            }
        }
        best.map(|(len, owner)| Span { start: text.len() - len, end: text.len(), owner })
    }

    fn replace(&self, text: &str, spans: &[Span]) -> String {
        let markers: usize = spans.iter().map(|s| self.held[s.owner as usize].origin.len() + 13).sum();
        let mut out = String::with_capacity(text.len() + markers);
        let mut last = 0;
        for span in spans {
            out.push_str(text.get(last..span.start).unwrap_or_default());
            out.push_str("[redacted: ");
            out.push_str(&self.held[span.owner as usize].origin);
            out.push(']');
            last = span.end;
        }
        out.push_str(text.get(last..).unwrap_or_default());
        out
    }
}

fn spellings_of(value: &str) -> impl Iterator<Item = String> {
    spellings(value).into_iter().filter(|s| s.len() >= MIN_SECRET_BYTES)
}

/// The spellings a value is searched in (none when it is too short), verbatim first.
#[cfg(feature = "fuzzing")]
pub(crate) fn searched_spellings(value: &str) -> Vec<String> {
    if value.len() < MIN_SECRET_BYTES { Vec::new() } else { spellings_of(value).collect() }
}

/// The automaton and its gate ([`Gate`]).
///
/// - A DFA while the spellings are at most [`DFA_MAX_SPELLING_BYTES`]: on ordinary output (words,
///   numbers, base64-looking runs) it scans about 1.6 times as fast as the contiguous NFA, and a
///   pod's few held values make a table of a few hundred KiB at most; past that (a PEM key's
///   spellings are ~100 KiB, its DFA ~10 MB) the NFA bounds memory.
/// - No prefilter: on that output the crate's prefilter finds a candidate at nearly every
///   position and made the scan four times slower (110 vs 500 MB/s, 1 KiB of the bench's
///   filler); the gate does the skipping instead.
fn build(spellings: &[Spelling]) -> Search {
    let patterns = spellings.iter().map(|s| &s.text);
    let bytes: usize = spellings.iter().map(|s| s.text.len()).sum();
    let kind =
        Some(if bytes <= DFA_MAX_SPELLING_BYTES { AhoCorasickKind::DFA } else { AhoCorasickKind::ContiguousNFA });
    match AhoCorasick::builder().match_kind(MatchKind::Standard).kind(kind).prefilter(false).build(patterns) {
        Ok(ac) => Search::Ready(ac, Gate::new(spellings.iter().map(|s| &*s.text))),
        Err(_) => Search::Unsearchable,
    }
}

/// Adds `new` (ending at or after every span so far) to the sorted, disjoint `spans`, merging
/// it with those it overlaps. Widened to character boundaries (a valid UTF-8 spelling found in
/// valid UTF-8 text starts and ends on one anyway; widening only redacts more).
fn push_merged(spans: &mut Vec<Span>, text: &str, mut new: Span) {
    while !text.is_char_boundary(new.start) {
        new.start -= 1;
    }
    while !text.is_char_boundary(new.end) {
        new.end += 1;
    }
    while let Some(&top) = spans.last().filter(|top| top.end > new.start) {
        if top.start < new.start || (top.start == new.start && top.end > new.end) {
            new.owner = top.owner;
        }
        new.start = new.start.min(top.start);
        new.end = new.end.max(top.end);
        spans.pop();
    }
    spans.push(new);
}

/// The length of the longest suffix of `text` that is a proper prefix of `pattern` (Knuth-Morris-
/// Pratt over the last `pattern.len() - 1` bytes: linear, whatever the pattern repeats).
fn overlap(text: &[u8], pattern: &[u8], failure: &mut Vec<usize>) -> usize {
    let window = &text[text.len().saturating_sub(pattern.len().saturating_sub(1))..];
    // Cheap refusal first: the prefix must start with the pattern's first byte.
    let Some(&first) = pattern.first() else { return 0 };
    let latest = window.len().saturating_sub(MIN_CUT_TAIL_BYTES - 1);
    if !window[..latest].contains(&first) {
        return 0;
    }
    failure.clear();
    failure.push(0);
    let mut k = 0;
    for &b in &pattern[1..] {
        while k > 0 && pattern[k] != b {
            k = failure[k - 1];
        }
        if pattern[k] == b {
            k += 1;
        }
        failure.push(k);
    }
    let mut q = 0;
    for &b in window {
        if q == pattern.len() {
            q = failure[q - 1];
        }
        while q > 0 && pattern[q] != b {
            q = failure[q - 1];
        }
        if pattern[q] == b {
            q += 1;
        }
    }
    if q == pattern.len() { failure[q - 1] } else { q }
}

#[cfg(test)]
mod tests;
