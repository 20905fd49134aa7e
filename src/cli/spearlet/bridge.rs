//! `spearlet bridge --socket PATH -- CMD ARGS...`: the stdio sidecar.

use std::path::PathBuf;
use std::process::ExitCode;

use crate::api::keys;
use crate::bridge::BridgeConfig;
use crate::cli::{run_until_signal, usage};

/// Serve a stdio MCP server on a Unix socket (the pod sidecar): `bridge --socket PATH -- CMD ARGS...`.
///
/// Runs CMD (argv, never a shell) as a child and relays its stdin/stdout byte for byte to one
/// client on the socket. A second client is refused while one is connected; a client that
/// leaves gets its child replaced; a child that exits is restarted with backoff. Its stderr
/// goes to the log; nothing is written to stdout. Exit status: 0 after SIGTERM/SIGINT (the
/// child is stopped first and the socket removed), 1 when CMD cannot start or the socket
/// cannot be served, 2 on a usage error.
#[derive(clap::Args, Debug)]
pub(crate) struct BridgeArgs {
    /// Unix socket to listen on; its directory must exist, a stale socket file is replaced.
    #[arg(long, env = keys::ENV_BRIDGE_SOCKET, value_name = "PATH")]
    pub(super) socket: PathBuf,
    /// Server id shown in log lines (defaults to the command's file name).
    #[arg(long, env = keys::ENV_SERVER_ID, value_name = "ID")]
    pub(super) server_id: Option<String>,
    /// The only uid allowed to connect (the agent's; the webhook sets it): a client whose
    /// `SO_PEERCRED` uid differs is refused. Unset: any client that can reach the socket.
    #[arg(long, env = keys::ENV_BRIDGE_PEER_UID, value_name = "UID")]
    pub(super) peer_uid: Option<u32>,
    /// The MCP server's command and arguments, after `--`.
    #[arg(last = true, required = true, value_name = "CMD ARGS")]
    pub(super) command: Vec<String>,
}

impl BridgeArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let Some((command, args)) = self.command.split_first() else {
            return Err(usage("bridge needs a command after `--`"));
        };
        let mut config = BridgeConfig::new(self.socket, command.clone(), args.to_vec());
        config.server_id = self.server_id;
        config.peer_uid = self.peer_uid;
        // One thread is plenty for one child and one client, and keeps the sidecar small.
        run_until_signal(1, |cancel| async move { Ok(crate::bridge::run(config, cancel).await?) })?;
        Ok(ExitCode::SUCCESS)
    }
}
