//! Gateway mode (`spearlet gateway`): one shared agent, as a Deployment behind a Service, for
//! callers that cannot take an injected one. Callers authenticate with a bearer token (a
//! projected ServiceAccount token for the gateway's audience, checked by TokenReview), get the
//! McpProfile their McpProfileBinding gives them, and reach that profile's `/mcp` door: the
//! per-pod agent's core and door, unchanged. `docs/gateway.md` is the manual.
//!
//! - [`auth`]: the bearer token, the review's answer as a caller, the answer cache (pure).
//! - [`token_review`]: the TokenReview call, bounded.
//! - [`bindings`]: the namespace's McpProfileBindings, watched and validated.
//! - `policy::binding` decides the profile (pure, beside the rest of the policy).
//! - [`session_seal`]: `/mcp` session ids bound to their caller (pure).
//! - [`resource_metadata`]: the RFC 9728 metadata and challenge (pure).
//! - [`profiles`]: one agent per profile served.
//! - [`front`]: the request path through all of the above.
//! - [`run`]: the entry point.

pub mod auth;
pub(crate) mod bindings;
pub(crate) mod front;
pub(crate) mod profiles;
pub mod resource_metadata;
pub mod run;
pub mod session_seal;
pub(crate) mod token_review;

pub use run::{DEFAULT_AUDIENCE, GatewayConfig, run_gateway};
