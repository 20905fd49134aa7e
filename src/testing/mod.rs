//! Test helpers (feature `testing`), shared by the integration tests and benches so each test
//! proves its point against real components instead of doubles: a double only proves what its
//! author believed.
//!
//! - [`control_plane`]: a real kube-apiserver + etcd per test binary, one namespace per test.
//! - [`mcp_servers`]: the argvs of the real MCP servers `hack/mcp-servers.sh` installs.
//! - [`echo`]: a trivial rmcp echo server, for benches that need a server of negligible cost.

pub mod control_plane;
pub mod echo;
pub mod golden;
pub mod mcp_servers;
