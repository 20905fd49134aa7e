//! `spearlet wait-ready`: waits until a running agent on this machine (in a pod: in its own
//! container) is ready. It is the injected agent's `postStart` hook: the kubelet starts the next
//! container (the app) when the hook returns, so the app starts the moment the first tool lists
//! are in, not at the next tick of a startup probe's one-second timer.
//!
//! It asks `/startupz`, which holds each request up to 0.9 s until the agent is ready, so a ready
//! agent is seen within a few milliseconds. Connection errors (the agent not yet listening) are
//! retried every [`RETRY`], as are the quick "not ready" answers of an agent still waiting for its
//! registry. At `--timeout` it fails with the agent's last reason: the kubelet then records a
//! `FailedPostStartHook` event with it and restarts the container, as a startup probe that ran
//! out would have.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use tokio::time::Instant;

use crate::api::keys;
use crate::cli::{block_on, tell};

/// Between attempts that did not end in a hold: short, as the agent binds its port at its start.
const RETRY: Duration = Duration::from_millis(20);
/// One attempt at most: the agent's hold (0.9 s) plus room on a busy node.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Wait until the agent at --admin-addr is ready (its `/startupz` answers 200), at most
/// --timeout seconds. Exit status: 0 when ready, 1 when the time ran out (with the agent's last
/// reason).
#[derive(clap::Args, Debug)]
pub(crate) struct WaitReadyArgs {
    /// The agent's admin port (loopback).
    #[arg(long, env = keys::ENV_ADMIN_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::LOCALHOST, keys::PORT_ADMIN)))]
    admin_addr: SocketAddr,
    /// Seconds to wait before giving up.
    #[arg(long, value_name = "SECONDS", default_value_t = 120)]
    timeout: u64,
}

impl WaitReadyArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let address = super::reconnect::local_admin_address(self.admin_addr);
        let url = reqwest::Url::parse(&format!("http://{address}/startupz"))?;
        let timeout = Duration::from_secs(self.timeout);
        crate::install_crypto_provider();
        let last = block_on(async move {
            let client = reqwest::Client::builder().timeout(ATTEMPT_TIMEOUT).no_proxy().build()?;
            let deadline = Instant::now() + timeout;
            let mut last = String::from("no attempt finished");
            while Instant::now() < deadline {
                match client.get(url.clone()).send().await {
                    Ok(response) if response.status().is_success() => return Ok(None),
                    Ok(response) => {
                        let status = response.status();
                        last = format!("{status}: {}", response.text().await.unwrap_or_default().trim_end());
                        tokio::time::sleep(RETRY).await;
                    }
                    Err(e) => {
                        last = format!("no answer: {}", crate::mcp::plain_error::plain(&e));
                        tokio::time::sleep(RETRY).await;
                    }
                }
            }
            Ok(Some(last))
        })?;
        match last {
            None => Ok(ExitCode::SUCCESS),
            Some(last) => {
                tell(format_args!(
                    "error: the agent at {address} was not ready within {} s; its last answer: {last}",
                    self.timeout
                ));
                Ok(ExitCode::FAILURE)
            }
        }
    }
}
