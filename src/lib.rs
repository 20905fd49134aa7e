//! spear-mcp: governed MCP tool servers for Kubernetes workloads.
//!
//! Module map (DESIGN.md "Layout"):
//! - [`api`]: resource types, validation and manifest reading (pure)
//! - [`registry`]: immutable snapshots and the sources that publish them
//! - [`policy`]: tool names, patterns, effective sets, budgets (pure)
//! - [`convert`]: migration from the file-based registry format (pure)
//! - [`cli`]: the binaries' flags and subcommands (thin wiring)
//! - [`telemetry`]: logging shared by both binaries
//! - `testing` (feature `testing`): the test control plane and fixtures

pub mod api;
pub mod cli;
pub mod convert;
pub mod policy;
pub mod registry;
pub mod telemetry;

#[cfg(feature = "testing")]
pub mod testing;
