//! `spearlet reconnect SERVER`: asks a running agent on this machine (or, through `kubectl exec`,
//! in its pod) to start a server afresh: `POST /admin/reconnect?server=SERVER` on its admin port,
//! which answers loopback callers only and writes an audit line.

use std::net::{Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use crate::api::keys;
use crate::cli::{block_on, tell};

/// Start a server afresh in a running agent: its session is closed (a stdio child stopped) and
/// it is started and listed again at once.
#[derive(clap::Args, Debug)]
pub(crate) struct ReconnectArgs {
    /// The McpServer's name.
    server: String,
    /// The agent's admin port (loopback).
    #[arg(long, env = keys::ENV_ADMIN_ADDR, default_value_t = SocketAddr::from((Ipv4Addr::LOCALHOST, keys::PORT_ADMIN)))]
    admin_addr: SocketAddr,
}

/// `addr` as a client on this machine reaches it: a wildcard listen address (`run` binds
/// 0.0.0.0) is reached on loopback.
pub(super) fn local_admin_address(addr: SocketAddr) -> SocketAddr {
    let ip = if addr.ip().is_unspecified() { Ipv4Addr::LOCALHOST.into() } else { addr.ip() };
    SocketAddr::new(ip, addr.port())
}

impl ReconnectArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let address = local_admin_address(self.admin_addr);
        let mut url = reqwest::Url::parse(&format!("http://{address}/admin/reconnect"))?;
        url.query_pairs_mut().append_pair("server", &self.server);
        crate::install_crypto_provider();
        let answer = block_on(async move {
            let sent = async {
                let client = reqwest::Client::builder().timeout(Duration::from_secs(10)).no_proxy().build()?;
                let response = client.post(url).send().await?;
                Ok::<_, reqwest::Error>((response.status(), response.text().await.unwrap_or_default()))
            };
            Ok(sent.await)
        })?;
        match answer {
            Ok((status, body)) if status.is_success() => {
                tell(format_args!("{}", body.trim_end()));
                Ok(ExitCode::SUCCESS)
            }
            Ok((status, body)) => {
                tell(format_args!("error: the agent at {address} answered {status}: {}", body.trim_end()));
                Ok(ExitCode::FAILURE)
            }
            Err(e) => {
                tell(format_args!(
                    "error: no agent answered at {address} ({}): is `spearlet serve` or `run` running there? (--admin-addr)",
                    crate::mcp::plain_error::plain(&e)
                ));
                Ok(ExitCode::FAILURE)
            }
        }
    }
}
