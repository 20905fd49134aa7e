//! spear-mcp: governed MCP tool servers for Kubernetes workloads.
//!
//! Module map (DESIGN.md "Layout"):
//! - [`api`]: resource types, validation and manifest reading (pure)
//! - [`registry`]: immutable snapshots and the sources that publish them
//! - [`policy`]: tool names, patterns, effective sets, budgets (pure)
//! - [`mcp`]: the client pool (rmcp sessions, budgets, health)
//! - [`bridge`]: the stdio sidecar (a child process served on a Unix socket)
//! - [`chat`]: `POST /v1/chat/completions` (OpenAI types, upstream client, the tool-call loop)
//! - [`operator`]: status computation, pod injection and RBAC of `spear-operator` (pure)
//! - [`convert`]: migration from the file-based registry format (pure)
//! - [`cli`]: the binaries' flags and subcommands (thin wiring)
//! - [`telemetry`]: logging shared by both binaries
//! - `testing` (feature `testing`): the test control plane and fixtures

pub mod agent;
pub mod api;
pub mod bridge;
pub mod chat;
pub mod cli;
pub mod convert;
pub mod mcp;
pub mod operator;
pub mod policy;
pub mod registry;
pub mod telemetry;

#[cfg(feature = "testing")]
pub mod testing;

/// Installs the process-wide rustls crypto provider (ring, as kube uses) if none is installed.
/// Idempotent; the binaries call it first, and the HTTP client pool calls it before building
/// clients, so library users and tests need not remember to.
pub fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
