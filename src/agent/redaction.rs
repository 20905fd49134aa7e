//! What leaves through a tool, cleaned before any caller or model sees it: the values the agent
//! holds (`secrets::HeldSecrets`) and what the profile's `outputFilters` detect, in a tool's
//! output (text, structured content, every other block), a resource read, a prompt, and the
//! message of an error (a server's error text is output too).
//!
//! - Text blocks are redacted in place; other blocks (embedded resources, images, links) go
//!   through JSON, so every string they carry is searched, base64 data included.
//! - Cut output (`mcp_output_too_large`) loses any trailing prefix of a held value as well.
//! - A `block` detector's finding refuses the output whole: `mcp_policy_denied`, reason
//!   `secret_in_output`. Held values are always redacted, never blocked: they are known, so the
//!   rest of the output is still of use.
//! - Nothing held and no filter (the default) costs one branch.

use serde_json::Value;

use crate::mcp::{ErrorCode, McpError, ToolOutput};
use crate::secrets::{Detector, OutputFilters, Redactor};

/// The reason of an output a `block` filter refused.
pub(crate) const SECRET_IN_OUTPUT: &str = "secret_in_output";

/// The redactor and filters one output goes through.
pub(crate) struct OutputGuard<'a> {
    pub(crate) held: &'a Redactor,
    pub(crate) filters: &'a OutputFilters,
}

impl OutputGuard<'_> {
    /// Whether there is nothing to look for.
    pub(crate) fn is_off(&self) -> bool {
        self.held.is_empty() && self.filters.is_empty()
    }

    /// A tool's output, in place; `Err` with the refusal when a `block` filter finds something.
    pub(crate) fn tool_output(&self, output: &mut ToolOutput) -> Result<(), McpError> {
        if self.is_off() {
            return Ok(());
        }
        let cut = output.truncated.is_some();
        let result = &mut output.result;
        for block in &mut result.content {
            if let rmcp::model::ContentBlock::Text(text) = block {
                self.text(&mut text.text, cut)?;
                continue;
            }
            let Ok(mut value) = serde_json::to_value(&*block) else { continue };
            if self.value(&mut value)? > 0
                && let Ok(cleaned) = serde_json::from_value(value)
            {
                *block = cleaned;
            }
        }
        if let Some(structured) = &mut result.structured_content {
            self.value(structured)?;
        }
        Ok(())
    }

    /// An error's message, in place (a block finding is redacted too: the call failed already).
    pub(crate) fn error(&self, error: &mut McpError) {
        if self.is_off() {
            return;
        }
        if let std::borrow::Cow::Owned(clean) = self.held.redact(&error.message) {
            error.message = clean;
        }
        for set in [&self.filters.redact, &self.filters.block].into_iter().flatten() {
            if let std::borrow::Cow::Owned(clean) = set.redact(&error.message) {
                error.message = clean;
            }
        }
    }

    /// Every string of `value`, in place; the number of replacements.
    pub(crate) fn value(&self, value: &mut Value) -> Result<usize, McpError> {
        if let Some(block) = &self.filters.block
            && let Some(found) = block.first_in_json(value)
        {
            return Err(blocked(found));
        }
        let mut count = self.held.redact_json(value);
        if let Some(redact) = &self.filters.redact {
            count += redact.redact_json(value);
        }
        Ok(count)
    }

    /// A resource read or a prompt (any result), in place, through JSON; `cut`: its parts were
    /// truncated, so each string loses a trailing prefix of a value too.
    pub(crate) fn item<T: serde::Serialize + serde::de::DeserializeOwned>(
        &self,
        result: &mut T,
        cut: bool,
    ) -> Result<(), McpError> {
        if self.is_off() {
            return Ok(());
        }
        let Ok(mut value) = serde_json::to_value(&*result) else { return Ok(()) };
        let before = value.clone();
        if cut {
            let mut refused = None;
            each_string(&mut value, &mut |s| {
                if refused.is_none() {
                    refused = self.text(s, true).err();
                }
            });
            if let Some(refusal) = refused {
                return Err(refusal);
            }
        } else {
            self.value(&mut value)?;
        }
        if value != before
            && let Ok(cleaned) = serde_json::from_value(value)
        {
            *result = cleaned;
        }
        Ok(())
    }

    /// One text, in place; `cut`: it was truncated, so a trailing prefix of a value goes too.
    pub(crate) fn text(&self, text: &mut String, cut: bool) -> Result<(), McpError> {
        if let Some(block) = &self.filters.block
            && let Some(found) = block.first_in(text)
        {
            return Err(blocked(found));
        }
        let held = if cut { self.held.redact_cut(text) } else { self.held.redact(text) };
        if let std::borrow::Cow::Owned(clean) = held {
            *text = clean;
        }
        if let Some(redact) = &self.filters.redact
            && let std::borrow::Cow::Owned(clean) = redact.redact(text)
        {
            *text = clean;
        }
        Ok(())
    }
}

/// Calls `f` on every string of `value`, object keys aside.
fn each_string(value: &mut Value, f: &mut impl FnMut(&mut String)) {
    match value {
        Value::String(s) => f(s),
        Value::Array(items) => items.iter_mut().for_each(|v| each_string(v, f)),
        Value::Object(map) => map.values_mut().for_each(|v| each_string(v, f)),
        _ => {}
    }
}

/// The refusal of an output a `block` filter found `detector` in.
fn blocked(detector: Detector) -> McpError {
    McpError::denied(
        ErrorCode::McpPolicyDenied,
        SECRET_IN_OUTPUT,
        format!(
            "the output was withheld: it holds what looks like a credential (detector {}, the McpProfile's \
             outputFilters); the server should not return it",
            detector.as_str()
        ),
    )
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rmcp::model::{CallToolResult, ContentBlock};

    use super::*;
    use crate::api::{FilterAction, OutputFilter};
    use crate::secrets::Secret;

    const TOKEN: &str = "ghs_exampletokenvalue000111";

    fn held() -> Redactor {
        Redactor::new([Secret {
            value: TOKEN.into(),
            origin: "header Authorization of github".into(),
            granted_to: Some(Arc::from("github")),
        }])
    }

    fn output(blocks: Vec<ContentBlock>, structured: Option<Value>) -> ToolOutput {
        let mut result = CallToolResult::success(blocks);
        result.structured_content = structured;
        ToolOutput { result, truncated: None, bytes: 0, latency: std::time::Duration::ZERO, input_required: None }
    }

    #[test]
    fn a_held_value_is_redacted_in_every_block_and_in_structured_content() {
        let held = held();
        let filters = OutputFilters::default();
        let guard = OutputGuard { held: &held, filters: &filters };
        let b64 = base64::Engine::encode(&base64::engine::general_purpose::STANDARD, format!("token={TOKEN}"));
        let mut out = output(
            vec![
                ContentBlock::text(format!("the token is {TOKEN}")),
                ContentBlock::embedded_text("file:///cfg", format!("auth: {TOKEN}")),
                ContentBlock::image(b64, "image/png"),
            ],
            Some(serde_json::json!({"nested": {"token": TOKEN}})),
        );
        guard.tool_output(&mut out).expect("redacted, not blocked");
        let all = serde_json::to_string(&out.result).expect("serializes");
        assert!(!all.contains(TOKEN) && !all.contains("ZXhhbXBsZXRva2Vu"), "{all}");
        assert!(all.contains("[redacted: header Authorization of github]"), "{all}");
    }

    #[test]
    fn cut_output_loses_a_trailing_prefix_and_errors_are_redacted() {
        let held = held();
        let filters = OutputFilters::default();
        let guard = OutputGuard { held: &held, filters: &filters };
        let mut text = format!("...{}", &TOKEN[..10]);
        guard.text(&mut text, true).expect("no block");
        assert!(!text.contains(&TOKEN[..6]), "{text}");
        let mut error = McpError::new(ErrorCode::McpUnavailable, format!("server said: bad token {TOKEN}"));
        guard.error(&mut error);
        assert!(!error.message.contains(TOKEN), "{}", error.message);
    }

    #[test]
    fn filters_redact_or_block_what_the_agent_does_not_hold() {
        let held = Redactor::empty();
        let aws = "AKIAIOSFODNN7EXAMPLE";
        let redacting =
            OutputFilters::new(&[OutputFilter { detector: Detector::AwsAccessKey, action: FilterAction::Redact }]);
        let guard = OutputGuard { held: &held, filters: &redacting };
        let mut out = output(vec![ContentBlock::text(format!("key {aws}"))], None);
        guard.tool_output(&mut out).expect("redacted");
        let text = &out.result.content[0].as_text().expect("text").text;
        assert!(!text.contains(aws) && text.contains("awsAccessKey"), "{text}");

        let blocking =
            OutputFilters::new(&[OutputFilter { detector: Detector::AwsAccessKey, action: FilterAction::Block }]);
        let guard = OutputGuard { held: &held, filters: &blocking };
        let mut out = output(vec![ContentBlock::text("fine")], Some(serde_json::json!({"k": aws})));
        let refused = guard.tool_output(&mut out).expect_err("blocked");
        assert_eq!((refused.code, refused.reason), (ErrorCode::McpPolicyDenied, Some(SECRET_IN_OUTPUT)));
        assert!(!refused.message.contains(aws));
    }

    #[test]
    fn nothing_held_and_no_filter_changes_nothing() {
        let held = Redactor::empty();
        let filters = OutputFilters::default();
        let guard = OutputGuard { held: &held, filters: &filters };
        assert!(guard.is_off());
        let mut out = output(vec![ContentBlock::text(TOKEN)], None);
        guard.tool_output(&mut out).expect("nothing to do");
        assert_eq!(out.result.content[0].as_text().expect("text").text, TOKEN);
    }
}
