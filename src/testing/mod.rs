//! Test helpers (feature `testing`, and in the crate's own unit tests), shared by the tests and
//! benches so each test proves its point against real components instead of doubles: a double only
//! proves what its author believed.
//!
//! - [`control_plane`]: a real kube-apiserver + etcd per test binary, one namespace per test.
//! - [`mcp_servers`]: the argvs of the real MCP servers `hack/mcp-servers.sh` installs.
//! - [`echo`]: a trivial rmcp echo server, for benches that need a server of negligible cost.
//! - [`fixtures`]: builders for `McpServer` and `McpProfile` (`McpServer::test("fs").stdio(..)`).
//! - [`golden`]: golden-file comparison, rewritten under `SPEAR_BLESS=1`.
//! - [`bench`]: percentiles, an agent over a fixed registry, a bench's `main`.
//! - [`proc_stats`]: a process's resident memory and CPU time from `/proc`, for the benches.
//! - [`test_ca`]: a private CA that issues server certificates, for HTTPS test servers.

pub mod bench;
pub mod control_plane;
pub mod echo;
pub mod fixtures;
pub mod golden;
pub mod mcp_servers;
pub mod proc_stats;
pub mod test_ca;
