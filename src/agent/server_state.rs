//! `mcp_server_state{server_id,state}`: where each of the profile's MCP servers stands, read
//! from the pool at scrape time (a collector, not a gauge kept in step: the pool's health
//! changes in a dozen places, and a scrape is the only reader).
//!
//! Decisions, and why:
//! - **One series per state, 1 for the current one** (kube-state-metrics' `phase` habit): an
//!   alert selects the states it means (`state=~"down|starting"`) and a dashboard stacks them,
//!   and every state's series exists so `== 0` reads as "not in it", never as "no data".
//! - **`starting` is its own state.** A start (spawn or connect, `initialize`, the first
//!   `tools/list`) can take its whole `startupTimeoutMs` (a `npx -y` download); a server that
//!   cannot start alternates between `starting` and `down`, so "no working session" is the two
//!   together.
//! - **Only servers the agent has tried.** The pool holds every McpServer of the namespace, the
//!   profile's and others; a server nobody has started says nothing about health, so it has no
//!   series (a fresh health is `down` with no session and no error).
//! - **As last seen.** The pool learns that an idle session died at its next use; the state is
//!   what the last start or call found.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;

use super::core::Agent;
use crate::mcp::health::{Health, HealthState};

/// The metric's name, as documented in docs/operations.md.
pub(crate) const METRIC: &str = "mcp_server_state";

/// Where one server stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ServerState {
    /// A start is in progress.
    Starting,
    /// A session is up and the last call succeeded.
    Connected,
    /// A session is up but calls time out.
    Degraded,
    /// No working session: the start or the session failed.
    Down,
}

impl ServerState {
    pub(crate) const ALL: [ServerState; 4] =
        [ServerState::Starting, ServerState::Connected, ServerState::Degraded, ServerState::Down];

    pub(crate) fn as_str(self) -> &'static str {
        match self {
            ServerState::Starting => "starting",
            ServerState::Connected => "connected",
            ServerState::Degraded => "degraded",
            ServerState::Down => "down",
        }
    }

    /// The state of a server from the pool's view: a start in progress wins (health still says
    /// how the last session ended); `None` for a server never started.
    pub(crate) fn of(starting: bool, health: &Health) -> Option<ServerState> {
        if starting {
            return Some(ServerState::Starting);
        }
        Some(match health.state {
            HealthState::Connected => ServerState::Connected,
            HealthState::Degraded => ServerState::Degraded,
            HealthState::Down if health.sessions == 0 && health.last_error.is_none() => return None,
            HealthState::Down => ServerState::Down,
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    server_id: String,
    state: &'static str,
}

/// Encodes `servers` (id and state) as `mcp_server_state`, every state of every server present.
fn encode(
    servers: impl IntoIterator<Item = (String, ServerState)>,
    mut encoder: DescriptorEncoder<'_>,
) -> std::fmt::Result {
    let family = Family::<StateLabels, Gauge>::default();
    for (server_id, current) in servers {
        for state in ServerState::ALL {
            let labels = StateLabels { server_id: server_id.clone(), state: state.as_str() };
            family.get_or_create(&labels).set(i64::from(state == current));
        }
    }
    let metric = encoder.encode_descriptor(
        METRIC,
        "1 for the state each of the profile's MCP servers is in (starting, connected, degraded, down), 0 for the others",
        None,
        family.metric_type(),
    )?;
    family.encode(metric)
}

/// The collector registered on the agent's metrics registry.
#[derive(Debug)]
pub(crate) struct ServerStateCollector {
    agent: Agent,
}

impl ServerStateCollector {
    pub(crate) fn new(agent: Agent) -> Self {
        ServerStateCollector { agent }
    }
}

impl Collector for ServerStateCollector {
    fn encode(&self, encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        let state = self.agent.state();
        let pool = self.agent.pool();
        let servers = state
            .catalog
            .iter()
            .flat_map(|catalog| catalog.listings())
            .filter_map(|(id, _, _)| {
                let status = pool.status(id)?;
                ServerState::of(status.starting.is_some(), &status.health).map(|s| (id.to_string(), s))
            })
            .collect::<Vec<_>>();
        encode(servers, encoder)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use prometheus_client::registry::Registry;

    use super::*;

    #[test]
    fn a_server_never_started_has_no_state_and_a_start_wins_over_health() {
        let mut health = Health::default();
        assert_eq!(ServerState::of(false, &health), None, "never tried: nothing to say");
        assert_eq!(ServerState::of(true, &health), Some(ServerState::Starting));
        health.down("spawn failed");
        assert_eq!(ServerState::of(false, &health), Some(ServerState::Down));
        assert_eq!(ServerState::of(true, &health), Some(ServerState::Starting), "retrying after a failure");
        health.connected();
        assert_eq!(ServerState::of(false, &health), Some(ServerState::Connected));
        health.call_timed_out(Duration::from_millis(5), 3, "no answer");
        assert_eq!(ServerState::of(false, &health), Some(ServerState::Degraded));
    }

    #[derive(Debug)]
    struct Fixed(Vec<(String, ServerState)>);

    impl Collector for Fixed {
        fn encode(&self, encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
            encode(self.0.clone(), encoder)
        }
    }

    #[test]
    fn every_state_of_every_server_is_a_series_and_only_the_current_one_is_1() {
        let mut registry = Registry::default();
        registry.register_collector(Box::new(Fixed(vec![
            ("fs".to_string(), ServerState::Connected),
            ("gh".to_string(), ServerState::Down),
        ])));
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).expect("encodes");
        assert!(text.contains("# TYPE mcp_server_state gauge"), "{text}");
        for (server, state, value) in [
            ("fs", "connected", 1),
            ("fs", "down", 0),
            ("fs", "starting", 0),
            ("fs", "degraded", 0),
            ("gh", "down", 1),
            ("gh", "connected", 0),
        ] {
            let line = format!("mcp_server_state{{server_id=\"{server}\",state=\"{state}\"}} {value}\n");
            assert!(text.contains(&line), "missing {line} in:\n{text}");
        }
    }
}
