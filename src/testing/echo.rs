//! A trivial rmcp echo server (one tool, `echo{text}`), for benchmarks that need a server whose
//! own cost is negligible: over stdio (a re-run of the bench binary) or Streamable HTTP.

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool,
};
use rmcp::service::RequestContext;
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::tower::{StreamableHttpServerConfig, StreamableHttpService};
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};
use serde_json::json;

/// The echo server: `echo{text}` returns its text.
#[derive(Clone, Copy, Debug, Default)]
pub struct Echo;

impl ServerHandler for Echo {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        let schema = json!({"type": "object", "properties": {"text": {"type": "string"}}});
        let schema = schema.as_object().cloned().unwrap_or_default();
        Ok(ListToolsResult::with_all_items(vec![Tool::new("echo", "Returns its text.", Arc::new(schema))]))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        _context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        let text = request.arguments.as_ref().and_then(|a| a.get("text")).and_then(|t| t.as_str()).unwrap_or_default();
        Ok(CallToolResult::success(vec![ContentBlock::text(text.to_string())]).into())
    }
}

/// Serves [`Echo`] on stdin/stdout until the client leaves (a current-thread runtime).
///
/// When stdin and stdout are pipes (as a parent that spawns it sets them up), they are read and
/// written non-blocking through the runtime's reactor. Tokio's `stdin()`/`stdout()` hand every
/// read and write to a blocking thread instead, which costs this fixture several futex handoffs
/// per call, about as much CPU as the agent spends per call, and would put tokio's blocking pool
/// rather than the agent into the benches' figures. Anything else (a terminal) falls back to
/// tokio's blocking stdio, which [`StdioMode::TokioBlocking`] also asks for: how servers on rmcp's
/// `transport::stdio()` read, measured beside the fast fixture.
#[allow(clippy::disallowed_macros, reason = "a fixture server without a log subscriber: stderr is its log")]
pub fn serve_stdio(mode: StdioMode) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("echo: no runtime");
        return;
    };
    runtime.block_on(async {
        let pipes = if mode == StdioMode::Reactor { stdio_pipes() } else { None };
        let served = match pipes {
            Some((stdin, stdout)) => Echo.serve((stdin, stdout)).await,
            None => Echo.serve((tokio::io::stdin(), tokio::io::stdout())).await,
        };
        match served {
            Ok(service) => {
                let _ = service.waiting().await;
            }
            Err(e) => eprintln!("echo: {e}"),
        }
    });
}

/// How [`serve_stdio`] reads and writes its stdio.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StdioMode {
    /// Non-blocking through the runtime's reactor when both are pipes.
    Reactor,
    /// Tokio's `stdin()`/`stdout()`: each read and write on a blocking thread.
    TokioBlocking,
}

/// Stdin and stdout as non-blocking pipe ends, if both are pipes.
fn stdio_pipes() -> Option<(tokio::net::unix::pipe::Receiver, tokio::net::unix::pipe::Sender)> {
    use std::os::fd::AsFd;
    let stdin = std::io::stdin().as_fd().try_clone_to_owned().ok()?;
    let stdout = std::io::stdout().as_fd().try_clone_to_owned().ok()?;
    let receiver = tokio::net::unix::pipe::Receiver::from_owned_fd(stdin).ok()?;
    let sender = tokio::net::unix::pipe::Sender::from_owned_fd(stdout).ok()?;
    Some((receiver, sender))
}

/// Serves [`Echo`] over Streamable HTTP at `/mcp` on `listener` until the process ends.
pub async fn serve_http(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(["localhost", "127.0.0.1"]);
    let service = StreamableHttpService::new(|| Ok(Echo), Arc::new(LocalSessionManager::default()), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router).await
}
