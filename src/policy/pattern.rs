//! Tool-name glob patterns: `*` (any run of characters, `/` included) and `?` (one character);
//! every other character is literal. Compiled once; matching a name allocates nothing.
//!
//! Almost every real pattern is a literal name, `prefix*`, `*suffix` or `*`; those are matched
//! with plain string comparisons, which cost a few nanoseconds. Only the rest (a `?`, or `*` in
//! the middle) go through a `globset::GlobSet`, whose per-call setup would dominate otherwise.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::api::validate::check_tool_pattern;

/// A compiled list of patterns. An empty list matches nothing.
#[derive(Clone, Debug)]
pub(crate) struct PatternSet {
    /// One pattern is exactly `*`: every name matches.
    matches_all: bool,
    literals: Vec<Box<str>>,
    prefixes: Vec<Box<str>>,
    suffixes: Vec<Box<str>>,
    /// Everything else; `None` when there is nothing else.
    globs: Option<GlobSet>,
    len: usize,
}

/// A pattern that does not compile (validation refuses these before they get here).
#[derive(Debug, thiserror::Error)]
#[error("tool pattern '{pattern}': {message}")]
pub struct PatternError {
    /// The pattern as written.
    pub(crate) pattern: String,
    /// Why it is refused.
    pub(crate) message: String,
}

/// Escapes everything but `*` and `?`: `[`, `]`, `{`, `}` become one-character classes (and `\`
/// is literal since backslash escapes are off), so every other character matches itself.
fn to_glob(pattern: &str) -> String {
    let mut glob = String::with_capacity(pattern.len() + 4);
    for c in pattern.chars() {
        match c {
            '*' | '?' => glob.push(c),
            '[' | ']' | '{' | '}' => {
                glob.push('[');
                glob.push(c);
                glob.push(']');
            }
            _ => glob.push(c),
        }
    }
    glob
}

impl PatternSet {
    /// Compiles `patterns`; each must pass [`check_tool_pattern`].
    pub(crate) fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        let mut set = PatternSet {
            matches_all: false,
            literals: Vec::new(),
            prefixes: Vec::new(),
            suffixes: Vec::new(),
            globs: None,
            len: patterns.len(),
        };
        let mut builder = GlobSetBuilder::new();
        let mut general = 0;
        for pattern in patterns {
            let pattern = pattern.as_ref();
            check_tool_pattern(pattern)
                .map_err(|(message, _)| PatternError { pattern: pattern.to_string(), message })?;
            let wildcards = pattern.matches(['*', '?']).count();
            if pattern == "*" {
                set.matches_all = true;
            } else if wildcards == 0 {
                set.literals.push(pattern.into());
            } else if wildcards == 1 && pattern.ends_with('*') {
                set.prefixes.push(pattern[..pattern.len() - 1].into());
            } else if wildcards == 1 && pattern.starts_with('*') {
                set.suffixes.push(pattern[1..].into());
            } else {
                let glob = GlobBuilder::new(&to_glob(pattern))
                    .literal_separator(false)
                    .backslash_escape(false)
                    .build()
                    .map_err(|e| PatternError { pattern: pattern.to_string(), message: e.to_string() })?;
                builder.add(glob);
                general += 1;
            }
        }
        if general > 0 {
            set.globs =
                Some(builder.build().map_err(|e| PatternError { pattern: String::new(), message: e.to_string() })?);
        }
        Ok(set)
    }

    /// Whether any pattern matches `name`.
    pub(crate) fn is_match(&self, name: &str) -> bool {
        self.matches_all
            || self.literals.iter().any(|l| **l == *name)
            || self.prefixes.iter().any(|p| name.starts_with(&**p))
            || self.suffixes.iter().any(|s| name.ends_with(&**s))
            || self.globs.as_ref().is_some_and(|g| g.is_match(name))
    }

    /// Whether the set has no pattern (and so matches nothing).
    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(p: &[&str]) -> PatternSet {
        PatternSet::new(p).expect("valid patterns")
    }

    #[test]
    fn star_and_question_mark_are_the_only_wildcards() {
        let s = set(&["read_*", "get_?"]);
        assert!(s.is_match("read_file"));
        assert!(s.is_match("read_"));
        assert!(s.is_match("get_x"));
        assert!(!s.is_match("get_xy"));
        assert!(!s.is_match("write_file"));
    }

    #[test]
    fn star_crosses_slashes_and_dots() {
        assert!(set(&["fs/*"]).is_match("fs/read/file.txt"));
        assert!(set(&["*.read"]).is_match("a.b.read"));
    }

    #[test]
    fn empty_matches_nothing_and_star_matches_everything() {
        assert!(!set(&[]).is_match("anything"));
        assert!(set(&["*"]).is_match(""));
        assert!(set(&["*"]).is_match("ünïcödé"));
    }

    #[test]
    fn other_characters_are_literal() {
        let s = set(&["a.b-c_d!"]);
        assert!(s.is_match("a.b-c_d!"));
        assert!(!s.is_match("aXb-c_d!"));
    }

    #[test]
    fn fast_paths_agree_with_the_general_matcher() {
        // `a*` (prefix), `*b` (suffix), `a*b` and `?` (globset), literals.
        let s = set(&["pre*", "*suf", "mid*dle", "l?t", "exact"]);
        for (name, expected) in [
            ("prefix", true),
            ("pre", true),
            ("xpre", false),
            ("the_suf", true),
            ("sufx", false),
            ("middle", true),
            ("mid_and_dle", true),
            ("midle", false),
            ("lit", true),
            ("liit", false),
            ("exact", true),
            ("exactly", false),
        ] {
            assert_eq!(s.is_match(name), expected, "{name}");
        }
    }

    #[test]
    fn refused_patterns_are_errors() {
        assert!(PatternSet::new(&["read_[ab]"]).is_err());
        assert!(PatternSet::new(&[""]).is_err());
    }
}
