//! `${ENV:NAME}` / `${ENV:NAME:-default}` references in env values and header values.
//!
//! Parsed once (at validation, and again when the client pool connects) into a [`Template`];
//! expansion reads the agent's environment through a lookup function so that this module stays
//! pure and tests never touch the process environment. `$${` writes a literal `${`; any other
//! `$` is literal.
//!
//! **Reserved names.** A template is written by a registry author, who must not read the agent's
//! own configuration and credentials through it (a header `${ENV:SPEAR_UPSTREAM_API_KEY}` on a
//! server whose URL the author controls would send them the model key). [`is_reserved`] names
//! what no template may reference: validation refuses it, and the pool's lookup never reads it.

use thiserror::Error;

/// A string split into literal text and environment references.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Template {
    segments: Vec<Segment>,
}

/// One piece of a [`Template`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Segment {
    /// Text copied as is.
    Literal(String),
    /// `${ENV:name}` or `${ENV:name:-default}`.
    Env {
        name: String,
        /// Value used when the variable is unset.
        default: Option<String>,
    },
}

/// Why a string is not a valid template. Offsets are byte offsets into the input.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub(crate) enum EnvRefError {
    /// `${` without a closing `}`.
    #[error("reference at offset {offset} is not closed with '}}'")]
    Unterminated {
        /// Where the reference starts.
        offset: usize,
    },
    /// `${SOMETHING}` where only `${ENV:...}` is known.
    #[error(
        "unknown reference '${{{found}}}' at offset {offset}; only ${{ENV:NAME}} and ${{ENV:NAME:-default}} are supported"
    )]
    UnknownKind {
        /// Where the reference starts.
        offset: usize,
        /// The text between the braces.
        found: String,
    },
    /// The variable name is not `[A-Za-z_][A-Za-z0-9_]*`.
    #[error("'{name}' at offset {offset} is not a valid environment variable name")]
    InvalidName {
        /// Where the reference starts.
        offset: usize,
        /// The name as written.
        name: String,
    },
}

/// A referenced variable is unset and has no default.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("environment variable {name} is not set and the reference has no default")]
pub(crate) struct MissingEnv {
    /// The variable's name (never its value).
    pub(crate) name: String,
}

const PREFIX: &str = "ENV:";

/// Parses `input` into a template.
pub(crate) fn parse(input: &str) -> Result<Template, EnvRefError> {
    let mut segments = Vec::new();
    let mut literal = String::new();
    let mut rest = input;
    let mut offset = 0;
    while let Some(pos) = rest.find('$') {
        literal.push_str(&rest[..pos]);
        let after = &rest[pos..];
        if let Some(tail) = after.strip_prefix("$${") {
            literal.push_str("${");
            offset += pos + 3;
            rest = tail;
        } else if after.starts_with("${") {
            let start = offset + pos;
            let close = after.find('}').ok_or(EnvRefError::Unterminated { offset: start })?;
            let body = &after[2..close];
            let Some(spec) = body.strip_prefix(PREFIX) else {
                return Err(EnvRefError::UnknownKind { offset: start, found: body.to_string() });
            };
            let (name, default) = match spec.split_once(":-") {
                Some((name, default)) => (name, Some(default.to_string())),
                None => (spec, None),
            };
            if !is_env_name(name) {
                return Err(EnvRefError::InvalidName { offset: start, name: name.to_string() });
            }
            if !literal.is_empty() {
                segments.push(Segment::Literal(std::mem::take(&mut literal)));
            }
            segments.push(Segment::Env { name: name.to_string(), default });
            offset += pos + close + 1;
            rest = &after[close + 1..];
        } else {
            literal.push('$');
            offset += pos + 1;
            rest = &after[1..];
        }
    }
    literal.push_str(rest);
    if !literal.is_empty() {
        segments.push(Segment::Literal(literal));
    }
    Ok(Template { segments })
}

/// Whether `name` is a portable environment variable name.
pub(crate) fn is_env_name(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c == '_' || c.is_ascii_alphabetic())
        && chars.all(|c| c == '_' || c.is_ascii_alphanumeric())
}

/// Variables the agent and the operator read themselves: every `SPEAR_*` (flags, the upstream
/// key, the secret-backed values of *other* servers), the downward-API names the webhook sets,
/// and `KUBECONFIG`. No template may reference them.
pub(crate) fn is_reserved(name: &str) -> bool {
    use crate::api::keys::{ENV_KUBECONFIG, ENV_POD_NAME, ENV_POD_NAMESPACE};
    name.starts_with(RESERVED_PREFIX) || [ENV_POD_NAMESPACE, ENV_POD_NAME, ENV_KUBECONFIG].contains(&name)
}

/// Prefix of every variable spear-mcp itself reads.
pub(crate) const RESERVED_PREFIX: &str = "SPEAR_";

impl Template {
    /// The segments in order.
    pub(crate) fn segments(&self) -> &[Segment] {
        &self.segments
    }

    /// Names of the variables referenced, in order of appearance.
    pub(crate) fn references(&self) -> impl Iterator<Item = &str> {
        self.segments.iter().filter_map(|s| match s {
            Segment::Env { name, .. } => Some(name.as_str()),
            Segment::Literal(_) => None,
        })
    }

    /// Expands every reference with `lookup`; the first unset variable without default fails.
    pub(crate) fn expand(&self, lookup: impl Fn(&str) -> Option<String>) -> Result<String, MissingEnv> {
        let mut out = String::new();
        for segment in &self.segments {
            match segment {
                Segment::Literal(text) => out.push_str(text),
                Segment::Env { name, default } => match (lookup(name), default) {
                    (Some(value), _) => out.push_str(&value),
                    (None, Some(default)) => out.push_str(default),
                    (None, None) => return Err(MissingEnv { name: name.clone() }),
                },
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(name: &str) -> Option<String> {
        (name == "TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn plain_text_is_one_literal() {
        let t = parse("hello $world $").expect("valid");
        assert_eq!(t.segments(), &[Segment::Literal("hello $world $".into())]);
        assert_eq!(t.expand(env).expect("no refs"), "hello $world $");
    }

    #[test]
    fn references_expand_with_and_without_defaults() {
        let t = parse("Bearer ${ENV:TOKEN} ${ENV:REGION:-eu}").expect("valid");
        assert_eq!(t.references().collect::<Vec<_>>(), ["TOKEN", "REGION"]);
        assert_eq!(t.expand(env).expect("set"), "Bearer s3cret eu");
    }

    #[test]
    fn empty_default_is_allowed() {
        assert_eq!(parse("${ENV:X:-}").expect("valid").expand(env).expect("default"), "");
    }

    #[test]
    fn missing_variable_without_default_names_the_variable() {
        let err = parse("${ENV:NOPE}").expect("valid").expand(env).expect_err("unset");
        assert_eq!(err.name, "NOPE");
    }

    #[test]
    fn double_dollar_escapes_a_reference() {
        let t = parse("$${ENV:TOKEN}").expect("valid");
        assert_eq!(t.expand(env).expect("literal"), "${ENV:TOKEN}");
        assert_eq!(t.references().count(), 0);
    }

    #[test]
    fn the_agents_own_variables_are_reserved() {
        for name in
            ["SPEAR_UPSTREAM_API_KEY", "SPEAR_SECRET_GITHUB_AUTHORIZATION", "SPEAR_X", "POD_NAMESPACE", "KUBECONFIG"]
        {
            assert!(is_reserved(name), "{name}");
        }
        for name in ["TOKEN", "spear_x", "MY_SPEAR_TOKEN", "HOME"] {
            assert!(!is_reserved(name), "{name}");
        }
    }

    #[test]
    fn malformed_references_are_errors() {
        assert_eq!(parse("a ${ENV:X").expect_err("open"), EnvRefError::Unterminated { offset: 2 });
        assert!(matches!(parse("${HOME}"), Err(EnvRefError::UnknownKind { found, .. }) if found == "HOME"));
        assert!(matches!(parse("${ENV:1X}"), Err(EnvRefError::InvalidName { name, .. }) if name == "1X"));
        assert!(matches!(parse("${ENV:}"), Err(EnvRefError::InvalidName { .. })));
    }
}
