//! The agent's doors, each a thin shell over [`super::core::Agent`]: it reads a request, asks
//! the core (policy, budgets, audit live there), and shapes the reply.
//!
//! | door | port | sessions |
//! |---|---|---|
//! | [`chat`]: `POST /v1/chat/completions` | 4040 | none: one request, one tool loop |
//! | [`mcp`]: `/mcp`, Streamable HTTP MCP | 4040 | rmcp's, kept alive by the fast path |
//! | [`grpc`]: `McpSessions`, `McpRegistry` | 4041 | the door's own table |

pub mod chat;
pub mod grpc;
pub(crate) mod mcp;
