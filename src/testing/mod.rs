//! Test helpers (feature `testing`), shared by the integration tests so each test proves its point
//! against real components instead of doubles: a double only proves what its author believed.
//!
//! - [`control_plane`]: a real kube-apiserver + etcd per test binary, one namespace per test.

pub mod control_plane;
pub mod echo;
pub mod mcp_servers;
