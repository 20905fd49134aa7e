//! A late error answer to rmcp's abandoned `server/discover` probe, dropped.
//!
//! rmcp's `Auto` lifecycle waits 10 s for `server/discover`, then sends `initialize` on the same
//! stream. A 2025 server that is still starting (`npx` or `uvx` downloading) reads both requests
//! once it is up and answers them in order: an error for the method it does not know (the probe's
//! id), then the `initialize` result. rmcp, now waiting for `initialize`, takes the first as an
//! uncorrelated error and fails the start, and every respawn repeats it. The error says nothing
//! rmcp still needs (the fallback has been chosen), so it is dropped here and the start goes on.
//!
//! Only an *error* answer is dropped: a late *result* means the server speaks 2026-07-28, and
//! `Start::establish` starts it again speaking that revision. The probe's id is the id of the
//! first request sent when that request is `server/discover`; it is abandoned once another
//! request follows, and rmcp never reuses an id, so nothing else can carry it.

use std::future::Future;

use rmcp::RoleClient;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage, RequestId, ServerJsonRpcMessage};
use rmcp::transport::Transport;

/// `inner`, with the late error answer to an abandoned `server/discover` probe dropped.
pub(super) struct LateProbeAnswers<T> {
    inner: T,
    probe: Probe,
}

/// Where the `server/discover` probe stands, as seen from the requests sent.
#[derive(Debug, Clone, PartialEq)]
enum Probe {
    /// No request sent yet.
    NotSent,
    /// The first request was the probe, and nothing else has been sent.
    Waiting(RequestId),
    /// Another request followed the probe: an answer with this id is a late one.
    Abandoned(RequestId),
    /// The first request was not a probe (an `initialize` or `server/discover` lifecycle).
    None,
}

impl<T> LateProbeAnswers<T> {
    pub(super) fn new(inner: T) -> Self {
        LateProbeAnswers { inner, probe: Probe::NotSent }
    }

    fn sent(&mut self, message: &ClientJsonRpcMessage) {
        let JsonRpcMessage::Request(request) = message else { return };
        self.probe = match std::mem::replace(&mut self.probe, Probe::None) {
            Probe::NotSent if matches!(request.request, ClientRequest::DiscoverRequest(_)) => {
                Probe::Waiting(request.id.clone())
            }
            Probe::NotSent | Probe::None => Probe::None,
            Probe::Waiting(id) if id == request.id => Probe::Waiting(id),
            Probe::Waiting(id) | Probe::Abandoned(id) => Probe::Abandoned(id),
        };
    }

    /// Whether `message` is the late error answer to the abandoned probe.
    fn is_late_probe_error(&self, message: &ServerJsonRpcMessage) -> bool {
        match (&self.probe, message) {
            (Probe::Abandoned(probe), JsonRpcMessage::Error(error)) => error.id.as_ref() == Some(probe),
            _ => false,
        }
    }
}

impl<T: Transport<RoleClient>> Transport<RoleClient> for LateProbeAnswers<T> {
    type Error = T::Error;

    fn send(&mut self, item: ClientJsonRpcMessage) -> impl Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.sent(&item);
        self.inner.send(item)
    }

    async fn receive(&mut self) -> Option<ServerJsonRpcMessage> {
        loop {
            let message = self.inner.receive().await?;
            if self.is_late_probe_error(&message) {
                tracing::debug!("dropped the late error answer to server/discover: the server speaks 2025");
                continue;
            }
            return Some(message);
        }
    }

    fn close(&mut self) -> impl Future<Output = Result<(), Self::Error>> + Send {
        self.inner.close()
    }
}

#[cfg(test)]
mod tests {
    use rmcp::model::JsonRpcRequest;
    use serde_json::json;

    use super::*;

    fn request(id: i64, method: &str) -> ClientJsonRpcMessage {
        serde_json::from_value(json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params(method)}))
            .unwrap_or_else(|e| panic!("{method}: {e}"))
    }

    fn params(method: &str) -> serde_json::Value {
        match method {
            "initialize" => json!({
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}
            }),
            _ => json!({}),
        }
    }

    fn error(id: i64) -> ServerJsonRpcMessage {
        serde_json::from_value(
            json!({"jsonrpc": "2.0", "id": id, "error": {"code": -32601, "message": "no such method"}}),
        )
        .unwrap_or_else(|e| panic!("{e}"))
    }

    fn after(sent: &[ClientJsonRpcMessage]) -> LateProbeAnswers<()> {
        let mut filter = LateProbeAnswers::new(());
        for message in sent {
            filter.sent(message);
        }
        filter
    }

    #[test]
    fn only_the_abandoned_probes_error_is_late() {
        let discover = request(0, "server/discover");
        let initialize = request(1, "initialize");
        assert!(matches!(&discover, JsonRpcMessage::Request(JsonRpcRequest { .. })), "{discover:?}");
        // Probe sent and waiting: its error is the answer rmcp waits for (a 2025 server on time).
        assert!(!after(std::slice::from_ref(&discover)).is_late_probe_error(&error(0)));
        // Probe abandoned for initialize: its error is late; initialize's own error is not.
        let abandoned = after(&[discover.clone(), initialize.clone()]);
        assert!(abandoned.is_late_probe_error(&error(0)));
        assert!(!abandoned.is_late_probe_error(&error(1)));
        // An initialize lifecycle: no probe, nothing dropped.
        assert!(!after(&[request(0, "initialize"), request(1, "tools/list")]).is_late_probe_error(&error(0)));
        // Later requests keep the probe abandoned.
        assert!(after(&[discover, initialize, request(2, "tools/list")]).is_late_probe_error(&error(0)));
    }
}
