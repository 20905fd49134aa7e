//! MCP client side: one pool of sessions (rmcp) to every server the agent may use.
//!
//! ```text
//! Snapshot ──Pool::apply──▶ per-server Slot (ServerConfig, permits, session, tools cache, health)
//! callers ──call_tool / list_tools──▶ Slot ──connect::connect──▶ stdio child | bridge socket | HTTP
//! ```
//!
//! - [`arguments`] (pure): tool-call arguments from JSON values and text.
//! - [`config`] (pure): McpServer → how to reach it; `${ENV:...}` expanded at connect time.
//! - [`health`] (pure): Connected / Degraded / Down from call outcomes.
//! - [`output`] (pure): the `maxToolOutputBytes` cap with an explicit marker.
//! - [`limits`] (pure): the frame limit and the caps on a server's tool list.
//! - [`error`] (pure): the error codes (`mcp_unavailable`, ...) every door reports.
//! - [`connect`]: establishing one session, a file per transport (`stdio`, `socket`, `http`).
//! - [`pool`]: sessions, budgets, caches, restarts (`slot`, `call`, `resources`).
//! - [`relay`]: what a server sends during a call, to the door of that call.
//! - `token_source`, `discovery`, `outbound_http` (I/O) and `oauth` (pure): outbound auth;
//!   [`login`] and `grant_store` (I/O): a person's consent (`spearlet auth login`) and where its
//!   grant is kept; `tool_schema`: arguments and results checked.
//!
//! Design notes: `src/mcp/README.md`.

pub mod arguments;
pub mod config;
pub mod connect;
pub(crate) mod discovery;
pub mod error;
pub(crate) mod grant_store;
pub mod health;
pub mod limits;
pub(crate) mod login;
pub(crate) mod oauth;
pub(crate) mod outbound_http;
pub mod output;
pub(crate) mod plain_error;
pub mod pool;
pub mod relay;
pub(crate) mod token_source;
pub(crate) mod tool_schema;

pub use error::{ErrorCode, McpError};
pub use pool::{Continuation, Pool, PoolOptions, ServerStatus, ToolOutput};
pub use relay::{Relay, Relayed};
