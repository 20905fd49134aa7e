//! `spearlet serve`: the per-pod agent's doors over one shared core.
//!
//! - [`core`]: registry + pool + profile catalog in step; the one tool-call path (policy,
//!   approval, budgets, audit) every door uses.
//! - [`audit`]: one JSON line per tool call.
//! - [`grpc`]: the gRPC door (tool sessions, registry List/Watch, reflection) on 127.0.0.1:4041.
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/debug/effective` (loopback).
//! - [`serve`]: binding the ports, running the doors, shutting down in order.
//! - [`mcp_endpoint`]: `/mcp`, the aggregated Streamable HTTP MCP server.

pub mod admin;
pub mod audit;
pub mod core;
pub mod grpc;
pub mod mcp_endpoint;
pub mod mcp_fast_path;
pub mod serve;

pub use self::audit::{AuditSink, Door};
pub use self::core::{Agent, AgentOptions, AgentState, CallContext, ToolCall};
