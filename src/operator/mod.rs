//! `spear-operator`: status for McpServer/McpProfile, the injecting webhook and RBAC.
//!
//! ```text
//!  McpServer / McpProfile ──status::server_status / profile_status (pure)──▶ status (SSA, leader only)
//!  AdmissionReview(Pod) ────inject::mutate (pure)──────────────────────────▶ JSON patch | deny
//!  injection-enabled Namespace ──rbac::agent_role_binding (pure)───────────▶ RoleBinding (SSA)
//! ```
//!
//! The modules here decide; the controller and webhook servers that move objects in and out
//! stay thin and contain no policy. The reasons behind each part: `src/operator/README.md`.
//!
//! - [`inject`]: the pod mutation (volumes, init container, agent, stdio sidecars, env).
//! - [`status`]: conditions and status fields, with stable `lastTransitionTime`s.
//! - [`rbac`]: the agent's and the operator's least-privilege roles and the agent binding.
//! - [`webhook`]: the HTTPS admission server around [`inject::mutate`] (thin I/O), with its
//!   caches, [`certs`](webhook::certs), [`client_auth`](webhook::client_auth) and
//!   [`rate_limit`](webhook::rate_limit).
//! - [`controller`]: the controllers that write status and keep the agent RoleBindings (thin I/O).
//! - [`probe`]: when and how an http McpServer is probed (`initialize` + `tools/list`).
//! - [`leader`]: leader election on a Lease; only the holder runs the controllers.
//! - [`scope`]: which namespaces are watched, and a profile's servers in a store.
//! - [`admin_view`]: the read-only admin page and its JSON (`--admin-view-addr`).
//! - [`run`]: `spear-operator run` as one call: controllers, webhook and admin server together.

pub mod admin_view;
pub mod controller;
pub mod inject;
pub mod leader;
pub mod probe;
pub mod rbac;
pub mod run;
pub mod scope;
pub mod status;
pub mod webhook;
