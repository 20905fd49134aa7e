//! Policy: which tools a workload sees, under which names, with which budgets. Pure: no I/O.
//!
//! ```text
//! Snapshot ──CompiledProfile::compile(profile)──▶ CompiledProfile (patterns compiled once)
//!    tool lists (pool cache) + RequestScope + caller tool names ──effective()──▶ EffectiveSet
//!        servers, tools (model-facing names), RouteTable, budgets, decision log
//! ```
//!
//! - [`pattern`]: `*`/`?` globs compiled once, allocation-free matching.
//! - [`name`]: `mcp__<server>__<tool>` names and the route table back to (server, tool).
//! - [`decision`]: the words the files share (layers, reasons, decisions, errors, exposed tools).
//! - [`effective`]: the layered intersection and the decision log.
//! - [`budget`]: composition where every layer only tightens.
//! - [`explain`]: the effective set as JSON with the reason for every exclusion.
//! - [`approval`]: per-tool approval mode, most specific pattern first.
//! - `pin`: each listed tool against its pin (`McpServer.spec.pinning`), at list time.
//! - [`items`]: which resources and prompts a workload may read and get, and their identifiers.
//! - `resource_uri`: the spellings of a resource URI the policy decides on (no `..`, `//`, `%2e`).
//! - [`rank`]: BM25F relevance of tools to a conversation, for `chat.toolSelection: relevance`,
//!   and the catalog's index of it.
//! - [`select`]: which tools a chat round offers under `relevance`, and the `find_tools` built-in.
//! - [`binding`]: which McpProfile a gateway caller gets (McpProfileBindings, exact matches).
//! - `rate_limit`: which token buckets a call draws from, and the buckets.

pub(crate) mod approval;
pub mod binding;
pub mod budget;
mod decision;
pub mod effective;
pub mod explain;
pub mod groups;
pub mod items;
pub mod name;
pub mod pattern;
pub(crate) mod pin;
pub mod rank;
pub(crate) mod rate_limit;
mod resource_uri;
pub mod select;

pub use decision::{Decision, EffectiveTool, Layer, PolicyError, Reason, Starting, ToolInfo};
pub use effective::{CompiledProfile, EffectiveServer, EffectiveSet, RequestScope, ServerTools, ToolList};
