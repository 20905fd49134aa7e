//! `/mcp`, the aggregated Streamable HTTP MCP server: rmcp's service with a fast path in front.
//!
//! ```text
//! POST /mcp ──fast_path::handle──┬─ a plain tools/call rmcp would accept ──▶ McpEndpoint::call
//!                                │     └─ keep_alive: the session's activity reported to rmcp
//!                                └─ anything else ──▶ rmcp StreamableHttpService ──▶ McpEndpoint
//! ```
//!
//! - [`endpoint`]: the `ServerHandler` every session runs, and the router.
//! - [`fast_path`]: `tools/call` answered without crossing rmcp's session worker.
//! - [`keep_alive`]: the one place that depends on rmcp's session internals.

pub(crate) mod endpoint;
pub(crate) mod fast_path;
pub(crate) mod keep_alive;

pub(crate) use self::endpoint::McpEndpoint;
