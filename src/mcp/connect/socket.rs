//! A server behind its `spearlet bridge` sidecar: a Unix socket, answered only by the
//! sidecar's uid when the pod says which one that is.

use std::path::Path;

use rmcp::ClientLifecycleMode;

use super::{Service, Start, unavailable};
use crate::mcp::error::McpError;

/// Connects to the bridge at `path`, checks its peer is `peer_uid` when given, and speaks
/// `lifecycle` over the stream (the read half behind the frame guard).
pub(super) async fn open(
    start: &Start<'_>,
    path: &Path,
    peer_uid: Option<u32>,
    lifecycle: ClientLifecycleMode,
) -> Result<Service, McpError> {
    let stream = tokio::net::UnixStream::connect(path)
        .await
        .map_err(|e| unavailable(format!("cannot connect to the bridge at {}: {e}", display(path))))?;
    // Only the server's own sidecar (its uid) may answer for it.
    if let Some(expected) = peer_uid {
        let uid = stream
            .peer_cred()
            .map(|c| c.uid())
            .map_err(|e| unavailable(format!("cannot read the credentials of the bridge at {}: {e}", display(path))))?;
        if uid != expected {
            return Err(unavailable(format!(
                "the socket at {} is served by uid {uid}, not by the server's sidecar (uid {expected}); refusing to talk to it",
                display(path)
            )));
        }
    }
    let (read, write) = stream.into_split();
    start.handshake((start.guard(read), write), lifecycle).await
}

fn display(path: &Path) -> String {
    path.display().to_string()
}
