//! Resource types (`McpServer`, `McpProfile`) and their validation. Pure: no I/O.
//!
//! ```text
//! YAML / API object ──serde──▶ McpServer / McpProfile ──validate()──▶ Vec<ValidationError>
//!                                       │
//!                                       └──crd::render()──▶ crds/*.yaml
//! ```

pub mod conditions;
pub mod crd;
pub mod env_ref;
pub mod keys;
pub mod manifest;
mod mcp_profile;
mod mcp_server;
mod schema;
pub mod validate;

pub use mcp_profile::*;
pub use mcp_server::*;
pub use validate::{Validate, ValidationError};

#[cfg(test)]
mod tests;
