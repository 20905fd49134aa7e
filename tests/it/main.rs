//! The single integration-test binary (one link instead of one per file: link time dominates on
//! 2 cores): one module per area.
//!
//! Tests that need the test control plane (kube-apiserver + etcd from `hack/control-plane.sh`) are
//! under `cluster::`; nothing outside it starts one. So:
//! - `cargo test --test it cluster::` runs only the control-plane tests;
//! - `cargo test --test it -- --skip cluster::` runs the rest, without `SPEAR_CONTROL_PLANE_BIN`.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

mod agent;
mod alerts;
mod approval;
mod attacks;
mod bounds;
mod bridge;
mod chart;
mod chat;
mod cli;
mod fixtures;
mod grpc;
mod mcp_servers;
mod oauth;
mod oauth_hydra;
mod oauth_login;
mod pinning;
mod pool;
mod registry;
mod serve;
mod static_binary;
mod support;
mod tracing;
mod trust;

/// The tests against the test control plane ([`spear::testing::control_plane::ControlPlane`]).
mod cluster {
    mod admin_view;
    mod approval;
    mod chart;
    mod control_plane;
    mod controller;
    mod explain;
    mod gateway;
    mod http2;
    mod kube_source;
    mod metrics;
    mod oauth;
    mod oauth_grant;
    mod webhook;
}
