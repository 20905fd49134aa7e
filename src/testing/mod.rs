//! Test helpers (feature `testing`, and in the crate's own unit tests), shared by the tests so each
//! test proves its point against real components instead of doubles (DESIGN.md "Testing").
//!
//! - [`control_plane`]: a real kube-apiserver + etcd per test binary, one namespace per test.
//! - [`fixtures`]: builders for `McpServer` and `McpProfile` (`McpServer::test("fs").stdio(..)`).

pub mod control_plane;
pub mod echo;
pub mod fixtures;
pub mod mcp_servers;
