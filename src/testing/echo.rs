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
pub fn serve_stdio() {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("echo: no runtime");
        return;
    };
    runtime.block_on(async {
        match Echo.serve((tokio::io::stdin(), tokio::io::stdout())).await {
            Ok(service) => {
                let _ = service.waiting().await;
            }
            Err(e) => eprintln!("echo: {e}"),
        }
    });
}

/// Serves [`Echo`] over Streamable HTTP at `/mcp` on `listener` until the process ends.
pub async fn serve_http(listener: tokio::net::TcpListener) -> std::io::Result<()> {
    let config = StreamableHttpServerConfig::default().with_allowed_hosts(["localhost", "127.0.0.1"]);
    let service = StreamableHttpService::new(|| Ok(Echo), Arc::new(LocalSessionManager::default()), config);
    let router = axum::Router::new().nest_service("/mcp", service);
    axum::serve(listener, router).await
}
