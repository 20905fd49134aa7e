//! The chat completions library: OpenAI-compatible types, the tool-call loop's decisions, SSE
//! framing, and where a request goes upstream. No door and no agent in here: the door that
//! serves `POST /v1/chat/completions` over the agent core is `crate::agent::doors::chat`, which
//! drives these pieces.
//!
//! - [`types`]: request and response types that keep every field they do not know.
//! - [`tool_loop`]: the loop's decisions (pure).
//! - [`upstream`]: where a request goes (flags > profile > caller), and the HTTP client.
//! - [`stream`]: a final answer as `chat.completion.chunk` SSE events.
//! - [`error`]: failures of the request itself, and their HTTP mapping.

pub mod error;
pub(crate) mod stream;
pub(crate) mod tool_loop;
pub(crate) mod types;
pub mod upstream;

pub use self::error::ChatError;
pub use self::upstream::{UpstreamError, UpstreamOverride, UpstreamTimeouts};
