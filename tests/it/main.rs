//! The single integration-test binary (one link instead of one per file: link time dominates on
//! 2 cores): one module per area.

mod agent;
mod bridge;
mod chart;
mod chat;
mod cli;
mod control_plane;
mod controller;
mod fixtures;
mod grpc;
mod kube_source;
mod mcp_servers;
mod pool;
mod registry;
mod serve;
mod static_binary;
mod support;
mod webhook;
