//! The gRPC door against a running agent core and real MCP servers: sessions, policy, the
//! registry view and its Watch stream, reflection; one test reads the registry from a directory.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use spear::agent::grpc::pb::mcp_registry_client::McpRegistryClient;
use spear::agent::grpc::pb::mcp_sessions_client::McpSessionsClient;
use spear::agent::grpc::{self, GrpcError, pb};
use spear::agent::{Agent, AgentOptions, AuditSink};
use spear::api::manifest::Object;
use spear::api::{McpProfile, McpServer};
use spear::mcp::{Pool, PoolOptions};
use spear::registry::dir::{DirOptions, DirSource};
use spear::registry::view::RegistryView;
use spear::testing::mcp_servers::{self, Command};
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Streaming};

use crate::support::{self, start_agent};

/// How long a test waits for an event it expects.
const EVENT_WAIT: Duration = Duration::from_secs(20);

/// A gRPC door served on a free loopback port; stopped (gracefully) on drop.
struct Door {
    addr: SocketAddr,
    stop: CancellationToken,
    server: Option<JoinHandle<Result<(), GrpcError>>>,
}

impl Door {
    async fn start(agent: Agent) -> Door {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("listener address");
        let stop = CancellationToken::new();
        let limits = spear::http_server::ConnectionLimits::default();
        let server = tokio::spawn(grpc::serve(agent, listener, limits, stop.clone()));
        Door { addr, stop, server: Some(server) }
    }

    async fn channel(&self) -> Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("valid uri")
            .connect()
            .await
            .expect("connect to the gRPC door")
    }

    /// Cancels the door and waits for `serve` to return: open Watch streams must end for it to.
    async fn stop(mut self) {
        self.stop.cancel();
        let server = self.server.take().expect("started");
        let served = tokio::time::timeout(Duration::from_secs(10), server).await.expect("graceful stop within 10 s");
        served.expect("server task").expect("serve ends without error");
    }

    async fn sessions(&self) -> McpSessionsClient<Channel> {
        McpSessionsClient::new(self.channel().await)
    }

    async fn registry(&self) -> McpRegistryClient<Channel> {
        McpRegistryClient::new(self.channel().await)
    }
}

impl Drop for Door {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

fn fixture_objects(profile: McpProfile) -> Vec<Object> {
    let fixture = mcp_servers::fixture_stdio(&[]);
    vec![Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])), Object::Profile(profile)]
}

async fn open(client: &mut McpSessionsClient<Channel>, server: &str) -> pb::OpenReply {
    let request = pb::OpenRequest { server_id: server.into(), ..Default::default() };
    client.open(request).await.expect("open").into_inner()
}

async fn call(client: &mut McpSessionsClient<Channel>, session: &str, tool: &str, args: &str) -> pb::CallToolReply {
    let request = pb::CallToolRequest { session_id: session.into(), tool: tool.into(), args_json: args.into() };
    client.call_tool(request).await.expect("a tool call is a reply, never a gRPC error").into_inner()
}

async fn tool_names(client: &mut McpSessionsClient<Channel>, session: &str) -> Vec<String> {
    let request = pb::ListToolsRequest { session_id: session.into() };
    let reply = client.list_tools(request).await.expect("list tools").into_inner();
    reply.tools.into_iter().map(|t| t.server_tool).collect()
}

fn error_code(reply: &pb::CallToolReply) -> Option<&str> {
    reply.error.as_ref().map(|e| e.code.as_str())
}

/// Reads events until one at `revision` whose accumulated upserts and deletes satisfy `done`.
async fn wait_for(
    stream: &mut Streaming<pb::WatchEvent>,
    revision: &str,
    done: impl Fn(&BTreeSet<String>, &BTreeSet<String>) -> bool,
) -> Vec<pb::WatchEvent> {
    let mut events = Vec::new();
    let (mut upserts, mut deletes) = (BTreeSet::new(), BTreeSet::new());
    let found = tokio::time::timeout(EVENT_WAIT, async {
        while let Some(event) = stream.next().await {
            let event = event.expect("watch event");
            upserts.extend(event.upserts.iter().map(|s| s.id.clone()));
            deletes.extend(event.deletes.iter().cloned());
            let at = event.registry_revision == revision;
            events.push(event);
            if at && done(&upserts, &deletes) {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(found, Ok(true), "no event at revision {revision} satisfied the test; got {events:#?}");
    events
}

#[tokio::test]
async fn a_session_opens_lists_calls_and_closes_and_is_then_not_found() {
    let t = start_agent(fixture_objects(McpProfile::test("p").servers(["fx"])), "p").await;
    let revision = t.agent.state().snapshot.revision().to_string();
    let door = Door::start(t.agent.clone()).await;
    let mut client = door.sessions().await;

    let opened = open(&mut client, "fx").await;
    assert_eq!((opened.server_id.as_str(), opened.registry_revision.as_str()), ("fx", revision.as_str()));
    assert!(!opened.session_id.is_empty());

    let listed = client
        .list_tools(pb::ListToolsRequest { session_id: opened.session_id.clone() })
        .await
        .expect("list tools")
        .into_inner();
    assert_eq!(listed.registry_revision, revision);
    let echo = listed.tools.iter().find(|t| t.server_tool == "echo").expect("echo is listed");
    assert_eq!(echo.name, "mcp__fx__echo");
    let schema: serde_json::Value = serde_json::from_str(&echo.input_schema_json).expect("schema is JSON");
    assert!(schema["properties"]["text"].is_object(), "{schema}");

    // The server's tool name and the model-facing name both work.
    for name in ["echo", "mcp__fx__echo"] {
        let reply = call(&mut client, &opened.session_id, name, r#"{"text": "hello grpc"}"#).await;
        assert_eq!(reply.status, "ok", "{reply:?}");
        assert!(!reply.is_error && reply.error.is_none(), "{reply:?}");
        assert!(reply.text.contains("hello grpc"), "{}", reply.text);
        assert_eq!(reply.registry_revision, revision);
        assert_eq!((reply.server_id.as_str(), reply.server_tool.as_str()), ("fx", "echo"));
        let content: serde_json::Value = serde_json::from_str(&reply.content_json).expect("content is JSON");
        assert_eq!(content[0]["type"], "text", "{content}");
    }

    client.close(pb::CloseRequest { session_id: opened.session_id.clone() }).await.expect("close");
    let after = client
        .call_tool(pb::CallToolRequest {
            session_id: opened.session_id.clone(),
            tool: "echo".into(),
            args_json: "{}".into(),
        })
        .await
        .expect_err("a closed session is gone");
    assert_eq!(after.code(), Code::NotFound, "{after:?}");
    let listed = client.list_tools(pb::ListToolsRequest { session_id: opened.session_id.clone() }).await;
    assert_eq!(listed.map(|_| ()).map_err(|s| s.code()), Err(Code::NotFound));
    let closed = client.close(pb::CloseRequest { session_id: opened.session_id.clone() }).await;
    assert_eq!(closed.map(|_| ()).map_err(|s| s.code()), Err(Code::NotFound));
    let never = client.list_tools(pb::ListToolsRequest { session_id: "no-such-session".into() }).await;
    assert_eq!(never.map(|_| ()).map_err(|s| s.code()), Err(Code::NotFound));
}

#[tokio::test]
async fn opening_a_server_outside_the_profile_is_permission_denied() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let objects = vec![
        Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
        Object::Server(McpServer::test("hidden").running(&fixture).allowing(["*"])),
        // "ghost" is allowed by the profile but not in the registry.
        Object::Profile(McpProfile::test("p").servers(["fx", "ghost"])),
    ];
    let t = start_agent(objects, "p").await;
    let door = Door::start(t.agent.clone()).await;
    let mut client = door.sessions().await;

    for server in ["hidden", "nope", "ghost"] {
        let denied = client
            .open(pb::OpenRequest { server_id: server.into(), ..Default::default() })
            .await
            .expect_err("not openable");
        assert_eq!(denied.code(), Code::PermissionDenied, "{server}: {denied:?}");
        assert!(denied.message().starts_with("mcp_policy_denied"), "{}", denied.message());
        let code = denied.metadata().get(grpc::ERROR_CODE_METADATA).and_then(|v| v.to_str().ok());
        assert_eq!(code, Some("mcp_policy_denied"));
        assert!(denied.metadata().get(grpc::REVISION_METADATA).is_some(), "revision stamped");
    }
    let empty = client.open(pb::OpenRequest::default()).await.expect_err("server_id is required");
    assert_eq!(empty.code(), Code::InvalidArgument);

    // An agent whose profile does not exist refuses every server.
    let lost = start_agent(fixture_objects(McpProfile::test("p").servers(["fx"])), "missing").await;
    let lost_door = Door::start(lost.agent.clone()).await;
    let denied = lost_door
        .sessions()
        .await
        .open(pb::OpenRequest { server_id: "fx".into(), ..Default::default() })
        .await
        .expect_err("no profile, no sessions");
    assert_eq!(denied.code(), Code::PermissionDenied);
    assert!(denied.message().contains("missing"), "{}", denied.message());
}

#[tokio::test]
async fn a_tool_excluded_by_the_profile_is_neither_listed_nor_callable() {
    let profile = McpProfile::test("p").servers(["fx"]).tool_denylist(["sleep"]);
    let t = start_agent(fixture_objects(profile), "p").await;
    let door = Door::start(t.agent.clone()).await;
    let mut client = door.sessions().await;

    let session = open(&mut client, "fx").await.session_id;
    let names = tool_names(&mut client, &session).await;
    assert!(names.iter().any(|n| n == "echo"), "{names:?}");
    assert!(!names.iter().any(|n| n == "sleep"), "denied by the profile: {names:?}");
    for name in ["sleep", "mcp__fx__sleep"] {
        let reply = call(&mut client, &session, name, r#"{"ms": 1}"#).await;
        assert_eq!(error_code(&reply), Some("mcp_policy_denied"), "{reply:?}");
        assert_eq!(reply.status, "mcp_policy_denied");
        assert!(reply.is_error);
        assert!(reply.text.contains("mcp_policy_denied"), "{}", reply.text);
    }

    // A session can narrow further (never widen).
    let narrowed = client
        .open(pb::OpenRequest {
            server_id: "fx".into(),
            tool_allowlist: vec!["echo".into(), "sleep".into()],
            ..Default::default()
        })
        .await
        .expect("open narrowed")
        .into_inner();
    assert_eq!(tool_names(&mut client, &narrowed.session_id).await, ["echo"]);
    let reply = call(&mut client, &narrowed.session_id, "big", r#"{"bytes": 10}"#).await;
    assert_eq!(error_code(&reply), Some("mcp_policy_denied"), "{reply:?}");

    // Arguments that are not a JSON object are the caller's error, in the reply.
    for args in ["[1, 2]", "{not json", "\"text\""] {
        let reply = call(&mut client, &session, "echo", args).await;
        assert_eq!(error_code(&reply), Some("mcp_invalid_arguments"), "{args}: {reply:?}");
        assert_eq!(reply.error.as_ref().map(|e| e.retryable), Some(false));
    }
}

#[tokio::test]
async fn registry_list_shows_only_the_servers_the_profile_allows() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let objects = vec![
        Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
        Object::Server(McpServer::test("hidden").http_at(mcp_servers::free_port()).allowing(["*"])),
        Object::Profile(McpProfile::test("p").servers(["fx"])),
    ];
    let t = start_agent(objects, "p").await;
    let snapshot = t.agent.state().snapshot.clone();
    let door = Door::start(t.agent.clone()).await;

    let listed = door.registry().await.list(pb::ListRequest {}).await.expect("list").into_inner();
    assert_eq!(listed.registry_revision, snapshot.revision().as_str());
    let ids: Vec<&str> = listed.servers.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(ids, ["fx"], "deny by default: 'hidden' is not in the profile");
    let fx = &listed.servers[0];
    assert_eq!(fx.transport, "stdio");
    assert_eq!(Some(fx.resource_version.as_str()), snapshot.server("fx").map(|s| s.resource_version.as_str()));
    assert!(fx.tools.iter().any(|t| t == "mcp__fx__echo"), "{:?}", fx.tools);
}

#[tokio::test]
async fn a_registry_change_arrives_as_a_watch_event_with_upserts_and_deletes() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let fx = McpServer::test("fx").running(&fixture).allowing(["*"]);
    let t = start_agent(
        vec![Object::Server(fx.clone()), Object::Profile(McpProfile::test("p").servers(["fx", "web"]))],
        "p",
    )
    .await;
    let door = Door::start(t.agent.clone()).await;
    let mut registry = door.registry().await;

    let mut stream =
        registry.watch(pb::WatchRequest { since_revision: String::new() }).await.expect("watch").into_inner();
    let first = tokio::time::timeout(EVENT_WAIT, stream.next()).await.expect("first event").expect("open stream");
    let first = first.expect("event");
    assert_eq!(first.upserts.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["fx"], "the full list first");
    assert!(first.deletes.is_empty());

    // fx changes, web (allowed by the profile) appears.
    let mut edited = fx.clone();
    edited.spec.display_name = Some("Fixture, edited".into());
    let web = McpServer::test("web").http_at(mcp_servers::free_port()).allowing(["*"]);
    let objects = vec![
        Object::Server(edited),
        Object::Server(web),
        Object::Profile(McpProfile::test("p").servers(["fx", "web"])),
    ];
    let changed = support::snapshot(objects.clone());
    let revision = changed.revision().to_string();
    t.registry.replace(changed);
    let events = wait_for(&mut stream, &revision, |up, _| up.contains("fx") && up.contains("web")).await;
    let fx_now = events.iter().flat_map(|e| &e.upserts).rfind(|s| s.id == "fx").expect("fx upserted");
    assert_eq!(fx_now.display_name, "Fixture, edited");

    // web goes away.
    let removed = support::snapshot(vec![objects[0].clone(), objects[2].clone()]);
    let revision = removed.revision().to_string();
    t.registry.replace(removed);
    let events = wait_for(&mut stream, &revision, |_, deleted| deleted.contains("web")).await;
    assert!(events.iter().all(|e| e.deletes.iter().all(|d| d == "web")), "{events:?}");
}

#[tokio::test]
async fn watch_from_an_unknown_revision_is_refused_and_list_then_watch_resyncs() {
    let fixture = mcp_servers::fixture_stdio(&[]);
    let fx = McpServer::test("fx").running(&fixture).allowing(["*"]);
    let profile = McpProfile::test("p").servers(["fx", "web"]);
    let t = start_agent(vec![Object::Server(fx.clone()), Object::Profile(profile.clone())], "p").await;
    let door = Door::start(t.agent.clone()).await;
    let mut registry = door.registry().await;

    let stale = registry
        .watch(pb::WatchRequest { since_revision: "0123456789abcdef".into() })
        .await
        .expect_err("an unknown revision cannot be resumed");
    assert_eq!(stale.code(), Code::FailedPrecondition, "{stale:?}");
    assert!(stale.message().contains("List"), "tells the client to resync: {}", stale.message());

    let listed = registry.list(pb::ListRequest {}).await.expect("list").into_inner();
    let mut stream = registry
        .watch(pb::WatchRequest { since_revision: listed.registry_revision.clone() })
        .await
        .expect("watch from the listed revision")
        .into_inner();
    // Up to date: nothing is sent until something changes.
    let quiet = tokio::time::timeout(Duration::from_millis(300), stream.next()).await;
    assert!(quiet.is_err(), "no event before a change: {quiet:?}");

    let web = McpServer::test("web").http_at(mcp_servers::free_port()).allowing(["*"]);
    let changed = support::snapshot(vec![Object::Server(fx), Object::Server(web), Object::Profile(profile)]);
    let revision = changed.revision().to_string();
    t.registry.replace(changed);
    let events = wait_for(&mut stream, &revision, |up, _| up.contains("web")).await;
    assert!(events.iter().all(|e| e.upserts.iter().all(|s| s.id == "web")), "only the change: {events:?}");

    // A client that saw the listed revision resumes with the diff from it, at once.
    let mut resumed = registry
        .watch(pb::WatchRequest { since_revision: listed.registry_revision.clone() })
        .await
        .expect("a kept revision resumes")
        .into_inner();
    let event = tokio::time::timeout(EVENT_WAIT, resumed.next()).await.expect("diff at once").expect("stream");
    let event = event.expect("event");
    assert_eq!(event.registry_revision, revision);
    assert_eq!(event.upserts.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["web"]);

    // A graceful stop ends the open Watch streams, then `serve` returns.
    door.stop().await;
    let ended = tokio::time::timeout(EVENT_WAIT, resumed.next()).await.expect("the stream ends");
    assert!(!matches!(ended, Some(Ok(_))), "no event after shutdown: {ended:?}");
}

#[tokio::test]
async fn reflection_lists_both_services() {
    use tonic_reflection::pb::v1::ServerReflectionRequest;
    use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
    use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
    use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;

    let t = start_agent(Vec::new(), "p").await;
    let door = Door::start(t.agent.clone()).await;
    let mut client = ServerReflectionClient::new(door.channel().await);
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(MessageRequest::ListServices(String::new())),
    };
    let mut replies =
        client.server_reflection_info(tokio_stream::iter([request])).await.expect("reflection").into_inner();
    let reply = replies.next().await.expect("a reply").expect("reflection reply");
    let Some(MessageResponse::ListServicesResponse(list)) = reply.message_response else {
        panic!("expected a service list, got {reply:?}");
    };
    let names: BTreeSet<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(names.contains("spear.v1.McpSessions") && names.contains("spear.v1.McpRegistry"), "{names:?}");
}

// === registry directory ===

/// `value` as JSON, which is YAML too: paths and arguments then need no YAML quoting.
fn json(value: impl serde::Serialize) -> String {
    serde_json::to_string(&value).expect("serializable")
}

fn server_yaml(fixture: &Command, display_name: &str) -> String {
    let env: Vec<serde_json::Value> =
        fixture.env.iter().map(|(name, value)| serde_json::json!({"name": name, "value": value})).collect();
    format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: fx\nspec:\n  displayName: {}\n  transport: stdio\n  stdio:\n    command: {}\n    args: {}\n    env: {}\n  allowedTools: [\"*\"]\n",
        json(display_name),
        json(fixture.program.to_string_lossy()),
        json(&fixture.args),
        json(&env),
    )
}

#[tokio::test]
async fn an_edit_in_the_registry_directory_arrives_as_a_watch_event() {
    let dir = tempfile::tempdir().expect("temp dir");
    let fixture = mcp_servers::fixture_stdio(&[]);
    std::fs::write(dir.path().join("fx.yaml"), server_yaml(&fixture, "Fixture")).expect("write server");
    std::fs::write(
        dir.path().join("profile.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: p\nspec:\n  servers: [fx]\n",
    )
    .expect("write profile");

    // The agent reads the directory as `spearlet serve --registry-dir` does.
    let watch = DirSource::watch(dir.path(), DirOptions::default()).expect("watch the directory");
    assert!(!watch.snapshot().is_degraded(), "{:?}", watch.snapshot().problems());
    let registry: Arc<dyn RegistryView> = Arc::new(watch);
    let pool = Pool::with_env(
        PoolOptions { idle_timeout: None, ..PoolOptions::default() },
        Arc::new(|name: &str| std::env::var(name).ok()),
    );
    let mut options = AgentOptions::new("p");
    options.audit = AuditSink::disabled();
    let agent = Agent::new(options, registry.clone(), pool);
    let cancel = CancellationToken::new();
    let _stop = cancel.clone().drop_guard();
    tokio::spawn(agent.clone().run(cancel.clone()));
    tokio::time::timeout(Duration::from_secs(30), agent.ready()).await.expect("agent ready");
    let door = Door::start(agent.clone()).await;
    let mut client = door.registry().await;

    let mut stream = client.watch(pb::WatchRequest::default()).await.expect("watch").into_inner();
    let first = tokio::time::timeout(EVENT_WAIT, stream.next()).await.expect("first event").expect("stream");
    let first = first.expect("event");
    let fx = first.upserts.iter().find(|s| s.id == "fx").expect("fx listed");
    assert_eq!(fx.display_name, "Fixture");
    let version = fx.resource_version.clone();

    std::fs::write(dir.path().join("fx.yaml"), server_yaml(&fixture, "Fixture, edited")).expect("edit server");
    let deadline = tokio::time::Instant::now() + EVENT_WAIT;
    let edited = loop {
        let next = tokio::time::timeout_at(deadline, stream.next()).await.expect("an event for the edit");
        let event = next.expect("stream open").expect("event");
        if let Some(fx) = event.upserts.iter().find(|s| s.id == "fx" && s.display_name == "Fixture, edited") {
            break (event.registry_revision.clone(), fx.clone());
        }
    };
    assert_ne!(edited.1.resource_version, version, "the edit moved the resourceVersion");
    assert_eq!(edited.0, registry.snapshot().revision().as_str());
}

// === spearlet tools ===

/// `spearlet tools …` as the binary parses it.
#[derive(clap::Parser, Debug)]
struct ToolsCli {
    #[command(subcommand)]
    command: spear::cli::spearlet::ToolsCommand,
}

/// Runs `spearlet tools <args>` on its own thread (it starts its own runtime) and returns the
/// exit status.
async fn run_tools(args: &[&str]) -> std::process::ExitCode {
    use clap::Parser;
    let argv: Vec<String> = std::iter::once("tools").chain(args.iter().copied()).map(str::to_string).collect();
    let cli = ToolsCli::try_parse_from(argv).expect("valid flags");
    let thread = std::thread::spawn(move || spear::cli::exit(cli.command.run()));
    tokio::task::spawn_blocking(move || thread.join().expect("tools thread")).await.expect("join")
}

#[tokio::test]
async fn the_tools_command_lists_and_calls_through_the_door_with_meaningful_exit_codes() {
    use std::process::ExitCode;
    let fixture = mcp_servers::fixture_stdio(&[]);
    let objects = vec![
        Object::Server(McpServer::test("fx").running(&fixture).allowing(["*"])),
        Object::Server(McpServer::test("hidden").http_at(mcp_servers::free_port()).allowing(["*"])),
        Object::Profile(McpProfile::test("p").servers(["fx"]).tool_denylist(["sleep"])),
    ];
    let t = start_agent(objects, "p").await;
    let door = Door::start(t.agent.clone()).await;
    let addr = door.addr.to_string();
    let at = ["--grpc-addr", addr.as_str()];

    let ok = ExitCode::SUCCESS;
    let (refused, usage) = (ExitCode::from(1), ExitCode::from(2));
    assert_eq!(run_tools(&[&["list"][..], &at].concat()).await, ok);
    assert_eq!(run_tools(&[&["list", "--server", "fx"][..], &at].concat()).await, ok);
    assert_eq!(run_tools(&[&["list", "--server", "hidden"][..], &at].concat()).await, refused);
    for name in ["fx/echo", "mcp__fx__echo", "mcp.fx.echo"] {
        let args = [&["call", name, "--args", r#"{"text": "hi"}"#][..], &at].concat();
        assert_eq!(run_tools(&args).await, ok, "{name}");
    }
    assert_eq!(run_tools(&[&["call", "fx/sleep", "--args", r#"{"ms": 1}"#][..], &at].concat()).await, refused);
    assert_eq!(run_tools(&[&["call", "mcp__fx__sleep"][..], &at].concat()).await, refused);
    assert_eq!(run_tools(&[&["call", "hidden/echo"][..], &at].concat()).await, refused);
    assert_eq!(run_tools(&[&["call", "fx/echo", "--args", "[1]"][..], &at].concat()).await, usage);

    let closed = format!("127.0.0.1:{}", mcp_servers::free_port());
    assert_eq!(run_tools(&["list", "--grpc-addr", &closed]).await, usage, "nobody listens there");
}

#[tokio::test]
async fn a_session_lists_reads_and_gets_resources_and_prompts_through_the_policy() {
    let everything = mcp_servers::everything_stdio();
    let mut server = McpServer::test("everything").running(&everything).allowing(["echo"]);
    server.spec.allowed_resources = vec!["demo://resource/static/document/*".into()];
    server.spec.denied_resources = vec!["*/features.md".into()];
    server.spec.allowed_prompts = vec!["simple-prompt".into(), "args-prompt".into()];
    let mut profile = McpProfile::test("p").servers(["everything"]);
    profile.spec.prompt_denylist = vec!["args-prompt".into()];
    let agent = start_agent(vec![Object::Server(server), Object::Profile(profile)], "p").await;
    let door = Door::start(agent.agent.clone()).await;
    let mut client = door.sessions().await;
    let session = open(&mut client, "everything").await.session_id;

    let listed = client
        .list_resources(pb::ListResourcesRequest { session_id: session.clone() })
        .await
        .expect("list resources")
        .into_inner();
    let own: Vec<&str> = listed.resources.iter().map(|r| r.server_uri.as_str()).collect();
    assert!(own.contains(&"demo://resource/static/document/instructions.md"), "{own:?}");
    assert!(!own.iter().any(|u| u.ends_with("features.md")), "denied by the server: {own:?}");
    assert!(listed.resources.iter().all(|r| r.uri == format!("spear://everything/{}", r.server_uri)));
    assert!(listed.templates.is_empty(), "no template matches allowedResources: {:?}", listed.templates);

    let read = |uri: &str| pb::ReadResourceRequest { session_id: session.clone(), uri: uri.into() };
    // The server's own URI and the agent's name the same resource.
    for uri in [
        "demo://resource/static/document/instructions.md",
        "spear://everything/demo://resource/static/document/instructions.md",
    ] {
        let reply = client.read_resource(read(uri)).await.expect("a read is a reply").into_inner();
        assert_eq!(reply.status, "ok", "{uri}: {reply:?}");
        assert!(reply.contents_json.contains("instructions.md"), "{uri}: {}", reply.contents_json);
    }
    let refused =
        client.read_resource(read("demo://resource/static/document/features.md")).await.expect("reply").into_inner();
    assert_eq!(refused.status, "mcp_policy_denied");
    assert!(refused.error.as_ref().is_some_and(|e| e.message.contains("denied_by:server")), "{refused:?}");

    let prompts =
        client.list_prompts(pb::ListPromptsRequest { session_id: session.clone() }).await.expect("list").into_inner();
    let names: Vec<(&str, &str)> =
        prompts.prompts.iter().map(|p| (p.name.as_str(), p.server_prompt.as_str())).collect();
    assert_eq!(names, [("mcp__everything__simple-prompt", "simple-prompt")]);
    let get = |prompt: &str, args: &str| pb::GetPromptRequest {
        session_id: session.clone(),
        prompt: prompt.into(),
        args_json: args.into(),
    };
    let got = client.get_prompt(get("simple-prompt", "")).await.expect("reply").into_inner();
    assert_eq!(got.status, "ok", "{got:?}");
    assert!(got.messages_json.starts_with('['), "{}", got.messages_json);
    let refused = client.get_prompt(get("args-prompt", r#"{"city": "Oslo"}"#)).await.expect("reply").into_inner();
    assert_eq!(refused.status, "mcp_policy_denied");
    assert!(refused.error.as_ref().is_some_and(|e| e.message.contains("denied_by:profile")), "{refused:?}");
    let bad = client.get_prompt(get("simple-prompt", "[1]")).await.expect("reply").into_inner();
    assert_eq!(bad.status, "mcp_invalid_arguments", "{bad:?}");
}
