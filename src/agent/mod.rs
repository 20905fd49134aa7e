//! The per-pod agent: one core and its three doors, served by `spearlet serve` (local mode)
//! and `spearlet run` (in a pod). Design notes, and the decisions not to undo, in `README.md`.
//!
//! - [`core`]: registry + pool + profile catalog in step; the one tool-call path (policy,
//!   approval, budgets, audit) every door uses.
//! - [`resources`]: resources, prompts and completions through the same policy and audit.
//! - [`doors`]: chat completions, `/mcp` and gRPC, each over the core.
//! - [`key_guard`]: the doors' API key check (the pod's sidecars share its loopback).
//! - [`admin`]: `/healthz`, `/readyz`, `/metrics`, `/debug/effective` (loopback).
//! - [`audit`]: one JSON line per tool call.
//! - `effective_log`: the `effective_set` audit lines and injection counts, per session.
//! - [`server_state`]: `mcp_server_state`, each server's state read from the pool at scrape time.
//! - [`revision`]: the registry revision every HTTP answer names.
//! - [`serve`]: binding the ports, building the three doors, shutting down in order.
//! - [`run`]: the two entry points (registry from a directory or from the Kubernetes API).

mod admin;
pub(crate) mod approvers;
pub mod audit;
pub mod core;
pub(crate) mod doors;
pub(crate) mod effective_log;
pub(crate) mod http_guard;
mod key_guard;
mod redaction;
mod resources;
mod revision;
pub mod run;
pub mod serve;
mod server_state;

pub use self::audit::{AuditSink, Door};
pub use self::core::{Agent, AgentOptions, AgentState, CallContext, CallerName, ToolCall};
pub use self::doors::{chat, grpc};
pub use self::run::{LocalConfig, PodConfig, RunError, run_in_pod, run_local};
pub use self::serve::{AgentConfig, AuditTarget, PoolLimits};
