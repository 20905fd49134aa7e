//! `/mcp`, the aggregated Streamable HTTP MCP server: rmcp's service over the agent's own
//! sessions, with a fast path in front.
//!
//! ```text
//! POST /mcp ──fast_path::handle──┬─ a plain tools/call rmcp would accept ──▶ McpEndpoint::call
//!                                │     └─ the session marked in use (sessions::SessionTable)
//!                                └─ anything else ──▶ rmcp StreamableHttpService
//!                                       └─ sessions::AgentSessions ──▶ McpEndpoint (per request)
//! ```
//!
//! - [`endpoint`]: the `ServerHandler` rmcp runs per request, the notifier, and the router.
//! - [`fast_path`]: `tools/call` answered without crossing rmcp.
//! - [`sessions`]: the 2025-era sessions, a small record each; the one place that depends on how
//!   rmcp drives its `SessionManager` trait.

pub(crate) mod endpoint;
pub(crate) mod fast_path;
pub(crate) mod sessions;

pub(crate) use self::endpoint::McpEndpoint;
