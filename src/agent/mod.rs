//! `spearlet serve`: the per-pod agent's doors over one shared core.
//!
//! - [`core`]: registry + pool + profile catalog in step; the one tool-call path (policy,
//!   approval, budgets, audit) every door uses.
//! - [`audit`]: one JSON line per tool call.

pub mod audit;
pub mod core;

pub use self::audit::{AuditSink, Door};
pub use self::core::{Agent, AgentOptions, AgentState, CallContext, ToolCall};
