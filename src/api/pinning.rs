//! Pinned tool definitions (`McpServer.spec.pinning`): the digest of each tool as a person
//! reviewed it, so a server that rewrites a tool after review (a description turned into an
//! instruction to the model, a new tool, a widened schema: a "rug pull") is withheld until
//! someone pins it again. `spearlet pin` writes the pins; the agent checks them every time it
//! lists, so calls pay nothing.
//!
//! The digest is SHA-256 over the RFC 8785 (JCS) form of one JSON object with the tool's `name`,
//! `title`, `description`, `inputSchema`, `outputSchema` and `annotations` as the server lists
//! them, absent fields left out; written `sha256:` and 64 lowercase hex digits. JCS, not a form
//! of our own, so key order, whitespace and number spelling never change a digest and any JCS
//! implementation reproduces one. `icons` and `_meta` are not covered: the model never reads them.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};

/// Pins every served tool of this server to the definition a person reviewed.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Pinning {
    /// `enforce` (the default): a tool whose listed definition differs from its pin, or that has
    /// no pin, is withheld from every door. `warn`: it is served, and flagged the same way (log,
    /// metric, `spearlet explain`).
    #[serde(default)]
    pub mode: PinMode,

    /// The pinned digest per tool name, `sha256:<64 lowercase hex>`, as `spearlet pin` prints it.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 1024))]
    pub tools: BTreeMap<String, String>,
}

/// What happens to a tool that does not match its pin.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum PinMode {
    /// Withheld from listing and calls.
    #[default]
    Enforce,
    /// Served, and flagged.
    Warn,
}

/// Most pins in one McpServer (the schema's `maxProperties`).
pub(crate) const MAX_PINS: usize = 1024;

/// The fields of a tool a pin covers, as the server lists them.
#[derive(Serialize, Debug)]
#[serde(rename_all = "camelCase")]
pub struct PinnedFields<'a> {
    pub name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub title: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<&'a str>,
    pub input_schema: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output_schema: Option<&'a Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub annotations: Option<&'a Value>,
}

/// A tool's digest, the bytes behind `sha256:<hex>`.
pub type ToolDigest = [u8; 32];

impl PinnedFields<'_> {
    /// The digest of these fields (see the module header).
    pub fn digest(&self) -> ToolDigest {
        // JCS fails only on numbers JSON cannot write (NaN, infinities), which a parsed
        // `Value` never holds; such a tool would then digest as its name alone and match no pin.
        let canonical = serde_json_canonicalizer::to_vec(self).unwrap_or_else(|_| self.name.as_bytes().to_vec());
        Sha256::digest(&canonical).into()
    }
}

/// `sha256:<64 lowercase hex>`.
pub fn format_digest(digest: &ToolDigest) -> String {
    let mut out = String::with_capacity(71);
    out.push_str("sha256:");
    for byte in digest {
        out.push_str(&format!("{byte:02x}"));
    }
    out
}

/// The bytes of a pin written `sha256:<64 lowercase hex>`; `None` for any other spelling.
pub fn parse_digest(pin: &str) -> Option<ToolDigest> {
    let hex = pin.strip_prefix("sha256:")?;
    if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
        return None;
    }
    let mut digest = [0u8; 32];
    for (i, byte) in digest.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).ok()?;
    }
    Some(digest)
}

/// Every problem of `pinning`: (field, message, fix).
pub(crate) fn problems(pinning: &Pinning) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    if pinning.tools.len() > MAX_PINS {
        out.push((
            "spec.pinning.tools".to_string(),
            format!("has {} pins", pinning.tools.len()),
            format!("pin at most {MAX_PINS} tools; narrow allowedTools and pin what it allows"),
        ));
    }
    for (tool, pin) in &pinning.tools {
        let field = format!("spec.pinning.tools[{tool}]");
        if tool.is_empty() || tool.len() > 128 {
            out.push((field.clone(), "is not a tool name".into(), "use the tool's name as its server lists it".into()));
        }
        if parse_digest(pin).is_none() {
            out.push((
                field,
                "is not a digest written sha256:<64 lowercase hex digits>".into(),
                "copy the pins spearlet pin prints; do not edit them by hand".into(),
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn fields<'a>(name: &'a str, description: Option<&'a str>, schema: &'a Value) -> PinnedFields<'a> {
        PinnedFields { name, title: None, description, input_schema: schema, output_schema: None, annotations: None }
    }

    /// The digest is JCS, reproducible outside the agent: this is `printf '%s'
    /// '{"description":"Reads","inputSchema":{"type":"object"},"name":"read"}' | sha256sum`.
    #[test]
    fn the_digest_is_sha256_of_the_jcs_form() {
        let schema = json!({"type": "object"});
        let digest = format_digest(&fields("read", Some("Reads"), &schema).digest());
        let canonical = br#"{"description":"Reads","inputSchema":{"type":"object"},"name":"read"}"#;
        let expected = format_digest(&Sha256::digest(canonical).into());
        assert_eq!(digest, expected);
        assert_eq!(parse_digest(&digest).map(|d| format_digest(&d)), Some(digest));
    }

    #[test]
    fn key_order_and_number_spelling_do_not_change_a_digest() {
        let a: Value = serde_json::from_str(r#"{"type":"object","properties":{"n":{"maximum":1.0,"type":"number"}}}"#)
            .expect("JSON");
        let b: Value =
            serde_json::from_str(r#"{ "properties": {"n": {"type": "number", "maximum": 1}}, "type": "object" }"#)
                .expect("JSON");
        assert_eq!(fields("t", None, &a).digest(), fields("t", None, &b).digest());
    }

    #[test]
    fn every_covered_field_changes_the_digest() {
        let schema = json!({"type": "object"});
        let other = json!({"type": "object", "required": ["x"]});
        let title = json!("T");
        let annotations = json!({"readOnlyHint": true});
        let base = fields("t", Some("d"), &schema);
        let variants = [
            fields("u", Some("d"), &schema),
            fields("t", Some("d "), &schema),
            fields("t", None, &schema),
            fields("t", Some("d"), &other),
            PinnedFields { title: Some(&title), ..fields("t", Some("d"), &schema) },
            PinnedFields { output_schema: Some(&schema), ..fields("t", Some("d"), &schema) },
            PinnedFields { annotations: Some(&annotations), ..fields("t", Some("d"), &schema) },
        ];
        for variant in variants {
            assert_ne!(base.digest(), variant.digest(), "{variant:?}");
        }
    }

    #[test]
    fn only_the_printed_spelling_of_a_digest_is_a_pin() {
        let good = format!("sha256:{}", "ab".repeat(32));
        assert!(parse_digest(&good).is_some());
        for bad in [
            "ab".repeat(32),
            format!("sha256:{}", "AB".repeat(32)),
            format!("sha256:{}", "ab".repeat(31)),
            format!("sha256:{}", "ab".repeat(33)),
            format!("SHA256:{}", "ab".repeat(32)),
            format!("sha256:{}g", "ab".repeat(31) + "a"),
            format!("sha256:+{}", "a".repeat(63)),
        ] {
            assert_eq!(parse_digest(&bad), None, "{bad}");
        }
        let pinning = Pinning { mode: PinMode::Enforce, tools: [("read".to_string(), "sha1:00".to_string())].into() };
        let found = problems(&pinning);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].0, "spec.pinning.tools[read]");
    }
}
