//! The agent core against real servers: the catalog follows the registry, calls go through
//! policy, approval and budgets.

use serde_json::json;
use spear::agent::{CallContext, Door};
use spear::api::manifest::Object;
use spear::api::{McpProfile, McpServer};
use spear::mcp::ErrorCode;
use spear::testing::mcp_servers;

use crate::support::start_agent;

fn ctx() -> CallContext<'static> {
    CallContext { door: Door::Grpc, request_id: "test", session_id: None }
}

#[tokio::test]
async fn calls_route_through_the_profile_and_unknown_names_are_denied() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let t = start_agent(
        vec![
            Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
            Object::Profile(McpProfile::test("p").servers(["fx"])),
        ],
        "p",
    )
    .await;
    let set = t.agent.effective(None, &[]).expect("effective set");
    assert!(set.route("mcp__fx__echo").is_some(), "echo exposed");
    let args = json!({"text": "hi"}).as_object().cloned();
    let call = t.agent.call_tool(&set, "mcp__fx__echo", Ok(args), ctx()).await;
    assert_eq!(call.status(), "ok", "{:?}", call.result);
    assert!(call.model_text().contains("hi"), "{}", call.model_text());
    assert_eq!(call.server_id.as_deref(), Some("fx"));

    let denied = t.agent.call_tool(&set, "mcp__other__echo", Ok(None), ctx()).await;
    assert_eq!(denied.result.as_ref().map_err(|e| e.code).err(), Some(ErrorCode::McpPolicyDenied));
    let invalid = t.agent.call_tool(&set, "mcp__fx__echo", Err("expected value at line 1".into()), ctx()).await;
    assert_eq!(invalid.result.as_ref().map_err(|e| e.code).err(), Some(ErrorCode::McpInvalidArguments));
    assert!(invalid.model_text().contains("mcp_invalid_arguments"), "{}", invalid.model_text());
}
