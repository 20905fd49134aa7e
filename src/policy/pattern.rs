//! Tool-name glob patterns: `*` (any run of characters, `/` included) and `?` (one character);
//! every other character is literal. Compiled once into a `globset::GlobSet`; matching a name
//! allocates nothing.

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::api::validate::check_tool_pattern;

/// A compiled list of patterns. An empty list matches nothing.
#[derive(Clone, Debug)]
pub struct PatternSet {
    set: GlobSet,
    /// One pattern is exactly `*`: every name matches, no automaton needed.
    matches_all: bool,
    len: usize,
}

/// A pattern that does not compile (validation refuses these before they get here).
#[derive(Debug, thiserror::Error)]
#[error("tool pattern '{pattern}': {message}")]
pub struct PatternError {
    /// The pattern as written.
    pub pattern: String,
    /// Why it is refused.
    pub message: String,
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
    pub fn new<S: AsRef<str>>(patterns: &[S]) -> Result<Self, PatternError> {
        let mut builder = GlobSetBuilder::new();
        let mut matches_all = false;
        for pattern in patterns {
            let pattern = pattern.as_ref();
            check_tool_pattern(pattern)
                .map_err(|(message, _)| PatternError { pattern: pattern.to_string(), message })?;
            matches_all |= pattern == "*";
            let glob = GlobBuilder::new(&to_glob(pattern))
                .literal_separator(false)
                .backslash_escape(false)
                .build()
                .map_err(|e| PatternError { pattern: pattern.to_string(), message: e.to_string() })?;
            builder.add(glob);
        }
        let set = builder.build().map_err(|e| PatternError { pattern: String::new(), message: e.to_string() })?;
        Ok(PatternSet { set, matches_all, len: patterns.len() })
    }

    /// Whether any pattern matches `name`.
    pub fn is_match(&self, name: &str) -> bool {
        self.matches_all || (self.len > 0 && self.set.is_match(name))
    }

    /// Whether the set has no pattern (and so matches nothing).
    pub fn is_empty(&self) -> bool {
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
    fn refused_patterns_are_errors() {
        assert!(PatternSet::new(&["read_[ab]"]).is_err());
        assert!(PatternSet::new(&[""]).is_err());
    }
}
