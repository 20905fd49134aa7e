//! spear-mcp: governed MCP tool servers for Kubernetes workloads.
//!
//! Module map (`docs/architecture.md` follows a tool call through them):
//! - [`api`]: resource types, validation, manifest reading and the shared names (pure)
//! - [`registry`]: immutable snapshots and the sources that publish them
//! - [`policy`]: tool names, patterns, effective sets, budgets, explanations (pure)
//! - [`approval`]: the questions approvers are asked and how their answers are read (pure)
//! - [`mcp`]: the client pool (rmcp sessions, budgets, health)
//! - [`chat`]: the chat completions library (OpenAI types, tool-loop decisions, upstream)
//! - [`agent`]: the per-pod agent: its core, its three doors and admin port, and how it runs
//! - [`gateway`]: the shared agent for callers without an injected one (`spearlet gateway`)
//! - [`bridge`]: the stdio sidecar (a child process served on a Unix socket)
//! - `child`: process groups and bounded stderr for MCP server children (bridge and pool)
//! - `install`: the running executable copied into a pod's volume (the init container's job)
//! - `secrets`: held values redacted in every spelling, credential detectors (pure)
//! - [`operator`]: status, pod injection, RBAC, and the controllers and webhook around them
//! - [`convert`]: migration from the file-based registry format (pure)
//! - [`cli`]: the binaries' flags and subcommands (flags → config → a library call)
//! - [`telemetry`]: logging, metrics and the admin router shared by both binaries
//! - [`http_server`]: the HTTP server loop of both binaries (header timeout, connection cap)
//! - [`trust`]: extra CA certificates every outbound HTTPS client trusts (`--extra-ca-file`)
//! - `testing` (feature `testing`, and unit tests): the test control plane and fixtures
//! - `fuzzing` (feature `fuzzing`): thin wrappers the cargo-fuzz targets in `fuzz/` call

pub mod agent;
pub mod api;
pub mod approval;
pub mod bridge;
pub mod chat;
mod child;
pub mod cli;
pub mod convert;
pub mod egress;
pub mod gateway;
pub mod http_server;
mod install;
pub mod kube_client;
pub mod mcp;
pub mod operator;
pub mod policy;
pub mod registry;
pub mod secrets;
pub mod telemetry;
pub mod trust;

#[cfg(any(test, feature = "testing"))]
pub mod testing;

#[cfg(test)]
mod docs_tests;
#[cfg(test)]
mod layering_tests;

/// Wrappers for the cargo-fuzz targets in `fuzz/` (feature `fuzzing`, off by default).
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;

/// Installs the process-wide rustls crypto provider (ring, as kube uses) if none is installed.
/// Idempotent; the binaries call it first, and the HTTP client pool calls it before building
/// clients, so library users and tests need not remember to.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
