//! A local stdio server: its argv spawned (never a shell) with only the configured environment,
//! in a process group of its own so a stop reaches its children too; stdout behind the frame
//! guard, stderr copied to the log line by line.

use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;

use rmcp::ClientLifecycleMode;
use tokio::process::Command;
use tracing::Instrument;

use super::{Service, Start, unavailable};
use crate::child::GroupGuard;
use crate::mcp::error::McpError;

/// Longest stderr line forwarded to the log; the rest is cut (a server dumping a huge line
/// must not flood the log pipeline).
const MAX_STDERR_LINE: usize = 4096;

/// Spawns `command` with `args` and `env` (in `working_dir`) and speaks `lifecycle` over its
/// stdio; the guard stops the child's whole group when the session, or the start, is dropped.
pub(super) async fn open(
    start: &Start<'_>,
    command: &str,
    args: &[String],
    env: &[(String, String)],
    working_dir: Option<&Path>,
    lifecycle: ClientLifecycleMode,
) -> Result<(Service, GroupGuard), McpError> {
    let mut cmd = Command::new(command);
    cmd.args(args)
        .env_clear()
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        // Its own process group (id = its pid), so a stop reaches its children too.
        .process_group(0);
    if let Some(dir) = working_dir {
        cmd.current_dir(dir);
    }
    let child = cmd.spawn().map_err(|e| unavailable(format!("cannot start '{command}': {e}")))?;
    // From here on, giving up (an error, the budget running out, the start being
    // cancelled) stops the whole group.
    let mut child = GroupGuard::new(child);
    let pipes = child.child_mut().map(|c| (c.stdin.take(), c.stdout.take(), c.stderr.take()));
    let Some((Some(stdin), Some(stdout), stderr)) = pipes else {
        return Err(unavailable("the child's stdio pipes are missing"));
    };
    if let Some(stderr) = stderr {
        forward_stderr(start.server_id.clone(), stderr);
    }
    let service = start.handshake((start.guard(stdout), stdin), lifecycle).await?;
    Ok((service, child))
}

/// Copies a child's stderr into the log, one line per event, tagged with the server id; a line
/// past [`MAX_STDERR_LINE`] comes in pieces, invalid UTF-8 is replaced and does not stop the
/// reader.
fn forward_stderr(server_id: Arc<str>, stderr: tokio::process::ChildStderr) {
    let span = tracing::info_span!("mcp_stderr", server_id = %server_id);
    tokio::spawn(
        crate::child::for_each_line(stderr, MAX_STDERR_LINE, |line| {
            tracing::info!(target: "spear::mcp::stderr", "{line}");
        })
        .instrument(span),
    );
}
