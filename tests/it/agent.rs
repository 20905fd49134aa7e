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
    CallContext::new(Door::Grpc, "test", None)
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

fn code(call: &spear::agent::ToolCall) -> Option<ErrorCode> {
    call.result.as_ref().err().map(|e| e.code)
}

/// From the moment the agent starts, a call to an allowed tool of a server that is still
/// starting waits for its list and succeeds; a server that lists first is served without
/// waiting for the slow one; a name excluded by policy is refused only once the list is known.
#[tokio::test]
async fn calls_made_while_servers_start_wait_for_their_lists_instead_of_being_denied() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let t = crate::support::spawn_agent(
        vec![
            Object::Server(McpServer::test("slow").running(&fixture.delayed(4.0)).allowing(["*"]).denying(["pid"])),
            Object::Server(McpServer::test("fast").running(&fixture).allowing(["*"])),
            Object::Profile(McpProfile::test("p").servers(["slow", "fast"])),
        ],
        "p",
    );
    // The door computes its set before the first state is published: no tool is known yet.
    let set = t.agent.effective(None, &[]).expect("effective set");
    assert!(set.route("mcp__fast__echo").is_none() && set.route("mcp__slow__echo").is_none());
    let args = || json!({"text": "early"}).as_object().cloned();

    let fast = t.agent.call_tool(&set, "mcp__fast__echo", Ok(args()), ctx()).await;
    assert_eq!(fast.status(), "ok", "{:?}", fast.result);
    assert!(!t.agent.is_ready(), "served before the slow server listed: no wait for the slowest server");

    let slow = t.agent.call_tool(&set, "mcp__slow__echo", Ok(args()), ctx()).await;
    assert_eq!(slow.status(), "ok", "{:?}", slow.result);
    assert!(slow.model_text().contains("early"));
    // Excluded by the server's deniedTools: a policy refusal, decided once the list is known.
    let denied = t.agent.call_tool(&set, "mcp__slow__pid", Ok(None), ctx()).await;
    assert_eq!(code(&denied), Some(ErrorCode::McpPolicyDenied), "{:?}", denied.result);
    assert_eq!(denied.server_id, None, "never routed to a server");
}

/// A server that does not list within the call's budget is unavailable and retryable, with its
/// state in the message; never a policy denial.
#[tokio::test]
async fn a_call_whose_server_is_still_starting_after_its_budget_is_unavailable_and_retryable() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let budgets = spear::api::ServerBudgets { tool_timeout_ms: Some(300), ..Default::default() };
    let t = crate::support::spawn_agent(
        vec![
            Object::Server(McpServer::test("slow").running(&fixture.delayed(5.0)).allowing(["*"]).budgets(budgets)),
            Object::Profile(McpProfile::test("p").servers(["slow"])),
        ],
        "p",
    );
    let set = t.agent.effective(None, &[]).expect("effective set");
    for name in ["mcp__slow__echo", "mcp.slow.echo"] {
        let call = t.agent.call_tool(&set, name, Ok(None), ctx()).await;
        let error = call.result.as_ref().expect_err("not listed within 300 ms");
        assert_eq!(error.code, ErrorCode::McpUnavailable, "{error:?}");
        assert!(error.retryable, "{error:?}");
        assert!(error.message.contains("'slow'") && error.message.contains("not listed yet"), "{}", error.message);
        assert!(call.latency >= std::time::Duration::from_millis(300), "waited its budget: {:?}", call.latency);
    }
    assert!(!t.agent.is_ready());
    let why = t.agent.readiness().expect_err("not ready while its server lists for the first time");
    assert!(why.contains("listing"), "{why}");
}

/// A server that sends `notifications/tools/list_changed` in a storm (about 300 in 3 s, nothing
/// changed) is re-listed at most once a second, not once per notification; a real change right
/// after the storm still shows within that second.
#[tokio::test]
async fn a_list_changed_storm_costs_one_relist_a_second_and_a_real_change_still_shows() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let budgets = spear::api::ServerBudgets { tool_timeout_ms: Some(20_000), ..Default::default() };
    let t = start_agent(
        vec![
            Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"]).budgets(budgets)),
            Object::Profile(McpProfile::test("p").servers(["fx"])),
        ],
        "p",
    )
    .await;
    let set = t.agent.effective(None, &[]).expect("effective set");
    let lists = || async {
        let call = t.agent.call_tool(&set, "mcp__fx__lists", Ok(None), ctx()).await;
        assert_eq!(call.status(), "ok", "{:?}", call.result);
        call.model_text().trim().parse::<u32>().expect("a count")
    };
    let before = lists().await;
    let storm = t
        .agent
        .call_tool(
            &set,
            "mcp__fx__flood_list_changed",
            Ok(json!({"ms": 3000, "every": 10}).as_object().cloned()),
            ctx(),
        )
        .await;
    assert_eq!(storm.status(), "ok", "{:?}", storm.result);
    let sent: u32 = storm.model_text().trim().trim_start_matches("sent ").parse().expect("a count");
    assert!(sent >= 100, "the storm sent {sent} notifications");
    // Let the last re-list of the storm run.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    let relists = lists().await - before;
    assert!(relists <= 6, "{sent} notifications over 3 s caused {relists} tools/list requests");

    let added =
        t.agent.call_tool(&set, "mcp__fx__add_tool", Ok(json!({"name": "late"}).as_object().cloned()), ctx()).await;
    assert_eq!(added.status(), "ok", "{:?}", added.result);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(3);
    loop {
        let now = t.agent.effective(None, &[]).expect("effective set");
        if now.route("mcp__fx__late").is_some() {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the tool added after the storm never showed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}
