//! `spear-operator`: status for McpServer/McpProfile, the injecting webhook and RBAC.
//!
//! ```text
//!  McpServer / McpProfile ──status::server_status / profile_status (pure)──▶ status (SSA, leader only)
//!  AdmissionReview(Pod) ────inject::mutate (pure)──────────────────────────▶ JSON patch | deny
//!  injection-enabled Namespace ──rbac::agent_role_binding (pure)───────────▶ RoleBinding (SSA)
//! ```
//!
//! The modules here decide; the controller and webhook servers that move objects in and out
//! stay thin and contain no policy (STYLE.md rule 1).
//!
//! - [`inject`]: the pod mutation (volumes, init container, agent, stdio sidecars, env).
//! - [`status`]: conditions and status fields, with stable `lastTransitionTime`s.
//! - [`rbac`]: the agent's and the operator's least-privilege roles and the agent binding.

pub mod inject;
pub mod rbac;
pub mod status;
