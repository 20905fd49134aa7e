//! The caller approver's question: one elicitation form naming the server, the tool, its
//! annotations and the arguments, with one boolean field `approve`. The same form goes to a
//! 2025-11-25 session (`elicitation/create`) and, as an input request, to a 2026-07-28 caller.
//!
//! Only `accept` with `approve: true` (the JSON boolean) allows. The field has no default: a
//! client that fills defaults in (SEP-1034) must not turn an untouched form into a yes.

use rmcp::model::{ElicitRequestParams, ElicitResult, ElicitationAction, ElicitationSchema};
use serde_json::Value;

use super::{Subject, Verdict, clean_reason};

/// Longest rendering of the arguments or annotations in the form's message, in characters.
const MAX_SHOWN_CHARS: usize = 2048;

/// The form asking the caller to approve `subject`.
pub fn question(subject: &Subject<'_>) -> ElicitRequestParams {
    let shown = |value: Option<Value>| -> String {
        let text = value.map(|v| v.to_string()).unwrap_or_else(|| "none".to_string());
        let mut cut: String = text.chars().take(MAX_SHOWN_CHARS).collect();
        if cut.len() < text.len() {
            cut.push_str(" ... (cut)");
        }
        cut
    };
    let arguments = shown(subject.arguments.map(|a| Value::Object(a.clone())));
    let annotations = shown(subject.annotations.cloned());
    let message = format!(
        "Approve the call of tool '{}' on MCP server '{}' (called as '{}')?\nAnnotations (the server's own claims): \
         {annotations}\nArguments: {arguments}",
        subject.tool, subject.server, subject.name
    );
    let description =
        format!("true runs '{}' on '{}' with these arguments; anything else denies it", subject.tool, subject.server);
    let requested_schema = ElicitationSchema::builder()
        .required_bool_with("approve", |b| b.title("Approve this call").description(description))
        .build_unchecked();
    ElicitRequestParams::FormElicitationParams { meta: None, message, requested_schema }
}

/// What the caller's answer decides.
pub fn read_answer(answer: &ElicitResult) -> Verdict {
    match answer.action {
        ElicitationAction::Accept => {
            let approve = answer.content.as_ref().and_then(|c| c.get("approve"));
            match approve {
                Some(Value::Bool(true)) => Verdict::allow("the caller approved"),
                Some(Value::Bool(false)) => Verdict::deny("the caller did not approve"),
                _ => Verdict::deny("the caller's answer has no approve: true"),
            }
        }
        ElicitationAction::Decline => Verdict::deny("the caller declined"),
        ElicitationAction::Cancel => Verdict::deny("the caller cancelled"),
        _ => Verdict::deny("the caller's answer is neither accept, decline nor cancel"),
    }
}

/// What an input-round answer (untrusted JSON) decides: an `ElicitResult`, read as above.
pub fn read_input_response(answer: Option<&Value>) -> Verdict {
    let Some(answer) = answer else { return Verdict::deny("the caller's answer to the approval question is missing") };
    match serde_json::from_value::<ElicitResult>(answer.clone()) {
        Ok(answer) => read_answer(&answer),
        Err(e) => Verdict::deny(clean_reason(&format!("the caller's answer is not an elicitation result: {e}"))),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Map, json};

    use super::*;

    fn subject(arguments: &Map<String, Value>) -> Subject<'_> {
        Subject {
            profile: "dev",
            server: "files",
            tool: "delete",
            name: "files__delete",
            annotations: None,
            arguments: Some(arguments),
            revision: "1",
        }
    }

    #[test]
    fn the_form_names_the_call_and_asks_one_required_boolean_without_a_default() {
        let arguments = json!({"path": "/etc/passwd"}).as_object().cloned().expect("object");
        let params = serde_json::to_value(question(&subject(&arguments))).expect("json");
        let message = params["message"].as_str().expect("message");
        assert!(message.contains("'delete'") && message.contains("'files'") && message.contains("/etc/passwd"));
        assert_eq!(params["requestedSchema"]["properties"]["approve"]["type"], "boolean");
        assert_eq!(params["requestedSchema"]["required"], json!(["approve"]));
        assert!(params["requestedSchema"]["properties"]["approve"].get("default").is_none());
    }

    #[test]
    fn huge_arguments_are_cut_in_the_message() {
        let arguments = json!({"blob": "x".repeat(100_000)}).as_object().cloned().expect("object");
        let params = serde_json::to_value(question(&subject(&arguments))).expect("json");
        assert!(params["message"].as_str().expect("message").len() < 4096);
    }

    #[test]
    fn only_accept_with_approve_true_allows() {
        let read = |v: Value| read_input_response(Some(&v)).decision;
        use super::super::Decision::{Allow, Deny};
        assert_eq!(read(json!({"action": "accept", "content": {"approve": true}})), Allow);
        assert_eq!(read(json!({"action": "accept", "content": {"approve": false}})), Deny);
        assert_eq!(read(json!({"action": "accept", "content": {"approve": "true"}})), Deny);
        assert_eq!(read(json!({"action": "accept", "content": {}})), Deny);
        assert_eq!(read(json!({"action": "accept"})), Deny);
        assert_eq!(read(json!({"action": "decline", "content": {"approve": true}})), Deny);
        assert_eq!(read(json!({"action": "cancel"})), Deny);
        assert_eq!(read(json!("yes")), Deny);
        assert_eq!(read_input_response(None).decision, Deny);
    }
}
