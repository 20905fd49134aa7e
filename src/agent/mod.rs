//! The per-pod agent: one core and its three doors, served by `spearlet serve` (local mode)
//! and `spearlet run` (in a pod).
//!
//! - [`core`]: registry + pool + profile catalog in step; the one tool-call path (policy,
//!   approval, budgets, audit) every door uses.
//! - [`chat`]: `POST /v1/chat/completions`, the tool-call loop over the `crate::chat` library.
//! - [`mcp_endpoint`] and [`mcp_fast_path`]: `/mcp`, the aggregated Streamable HTTP MCP server;
//!   [`mcp_keep_alive`] keeps its sessions alive while fast calls use them.
//! - [`grpc`]: the gRPC door (tool sessions, registry List/Watch, reflection).
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/debug/effective` (loopback).
//! - [`audit`]: one JSON line per tool call.
//! - [`server_state`]: `mcp_server_state`, each server's state read from the pool at scrape time.
//! - [`serve`]: binding the ports, building the three doors, shutting down in order.
//! - [`run`]: the two entry points (registry from a directory or from the Kubernetes API).

pub mod admin;
pub mod audit;
pub mod chat;
pub mod core;
pub mod grpc;
pub(crate) mod http_guard;
mod items;
pub mod mcp_endpoint;
pub mod mcp_fast_path;
pub(crate) mod mcp_keep_alive;
pub mod run;
pub mod serve;
mod server_state;

pub use self::audit::{AuditSink, Door};
pub use self::core::{Agent, AgentOptions, AgentState, CallContext, ToolCall};
pub use self::run::{LocalConfig, PodConfig, RunError, run_in_pod, run_local};
pub use self::serve::{AgentConfig, AuditTarget};
