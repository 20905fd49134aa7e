//! Resource types (`McpServer`, `McpProfile`) and their validation. Pure: no I/O.
//!
//! ```text
//! YAML / API object ──serde──▶ McpServer / McpProfile ──validate()──▶ Vec<ValidationError>
//!                                       │
//!                                       └──crd::render()──▶ crds/*.yaml
//! ```
//!
//! - `mcp_server.rs`, `mcp_profile.rs` (re-exported here): the CRD types; their field docs are
//!   what `kubectl explain` prints. `schema.rs`: the schema pieces the derive cannot express.
//! - [`validate`]: every rule, including those a schema cannot state.
//! - [`manifest`]: YAML documents with line numbers, unknown fields refused.
//! - [`env_ref`]: `${ENV:NAME}` / `${ENV:NAME:-default}` templates, and the names they may not read.
//! - [`secret_grant`]: which McpServers and McpProfiles a Secret allows to reference it.
//! - [`mcp_profile_binding`]: which gateway callers get which McpProfile.
//! - [`identity`]: which McpServers an McpProfile allows to act as the pod's ServiceAccount.
//! - [`conditions`]: condition types and reasons of both statuses.
//! - [`crd`]: rendering `crds/*.yaml`.
//! - [`api_key`]: the per-pod key app containers send to the agent's doors.
//! - [`approval`]: who approves a call that needs approval (`McpProfile.spec.approval`);
//!   `mcp_approval.rs`: the `McpApproval` a kubernetes approver answers.
//! - [`pinning`]: pinned tool definitions, their canonical digest and its spelling.
//! - [`rate_limit`]: how often a pod may call a server, a tool, a profile's tools.
//! - [`keys`]: every name two parts must agree on (labels, annotations, env vars, ports, container
//!   and role names): one definition for the webhook, the agent, the operator and the tests.
//! - `names`: the names both sides derive (secret env vars and refs, the socket file, short hashes).

pub mod api_key;
pub mod approval;
pub mod conditions;
pub mod crd;
pub mod env_ref;
pub mod identity;
pub mod keys;
pub mod manifest;
mod mcp_approval;
mod mcp_profile;
pub mod mcp_profile_binding;
mod mcp_server;
pub(crate) mod names;
pub mod pinning;
pub mod rate_limit;
mod schema;
pub mod secret_grant;
pub mod validate;

pub use approval::{Approver, ApproverKind, ProfileApproval, WebhookApprover};
pub use mcp_approval::*;
pub use mcp_profile::*;
pub use mcp_profile_binding::{BindingSubject, McpProfileBinding, McpProfileBindingSpec, ProfileRef, SubjectKind};
pub use mcp_server::*;
pub use pinning::{PinMode, Pinning};
pub use rate_limit::RateLimit;
pub(crate) use validate::{Validate, ValidationError};

#[cfg(test)]
mod tests;
