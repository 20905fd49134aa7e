//! Test helpers (feature `testing`), shared by the integration tests so each test proves its point
//! against real components instead of doubles (DESIGN.md "Testing").
//!
//! - [`control_plane`]: a real kube-apiserver + etcd per test binary, one namespace per test.

pub mod control_plane;
pub mod echo;
pub mod golden;
pub mod mcp_servers;
