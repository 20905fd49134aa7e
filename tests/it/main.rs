//! The single integration-test binary (STYLE.md rule 11): one module per area.

mod agent;
mod bridge;
mod chat;
mod cli;
mod control_plane;
mod fixtures;
mod grpc;
mod mcp_servers;
mod pool;
mod registry;
mod serve;
mod static_binary;
mod support;
