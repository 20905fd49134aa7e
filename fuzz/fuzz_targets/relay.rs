//! What a server sends during a call (`src/mcp/relay.rs`): attribution to calls in flight and the
//! bounds on what is passed on. The input is a server's (and the callers') sequence of events.
//!
//! Properties (the module header's promises):
//! - a message with no token or stream is attributed only when exactly one call is in flight on
//!   the session and that call relays; never with two, never to a call that relays nothing;
//! - progress reaches exactly the call whose request carried the token, under its caller's token;
//! - a log message passed on is at or above the caller's level, its data at most
//!   MAX_LOG_DATA_BYTES (plus the cut marker) serialized; a progress message at most
//!   MAX_PROGRESS_MESSAGE_BYTES; a caller holds at most RELAY_BUFFER messages.
#![no_main]
#![allow(deprecated)] // logging is deprecated by SEP-2577, yet lives in 2025-11-25.

use std::sync::Arc;

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, NumberOrString, ProgressNotificationParam, ProgressToken, RequestId,
};
use spear::mcp::relay::{
    CallGuard, InFlight, MAX_LOG_DATA_BYTES, MAX_PROGRESS_MESSAGE_BYTES, Origin, RELAY_BUFFER, Relay, Relayed, severity,
};
use tokio::sync::mpsc::Receiver;

const LEVELS: [LoggingLevel; 8] = [
    LoggingLevel::Debug,
    LoggingLevel::Info,
    LoggingLevel::Notice,
    LoggingLevel::Warning,
    LoggingLevel::Error,
    LoggingLevel::Critical,
    LoggingLevel::Alert,
    LoggingLevel::Emergency,
];

#[derive(Arbitrary, Debug)]
enum Event {
    /// A call starts: relaying (with a caller log level and whether it asked progress) or not.
    Enter { relays: bool, level: Option<u8>, progress: bool },
    /// The call at this index (modulo) ends.
    Leave(u8),
    /// The server sends a log message with no stream to tell its call.
    Log { level: u8, data: String, json: bool },
    /// The server sends progress for the token of the call at this index, or an unknown one.
    Progress { call: u8, known: bool, message: Option<String> },
}

struct Call {
    token: ProgressToken,
    caller_token: Option<ProgressToken>,
    level: Option<LoggingLevel>,
    receiver: Option<Receiver<Relayed>>,
    _guard: CallGuard,
}

fuzz_target!(|events: Vec<Event>| {
    let calls_in_flight = Arc::new(InFlight::default());
    let mut calls: Vec<Call> = Vec::new();
    let mut next = 0i64;
    for event in events.into_iter().take(64) {
        match event {
            Event::Enter { relays, level, progress } => {
                next += 1;
                let token = ProgressToken(NumberOrString::Number(next));
                let caller_token =
                    progress.then(|| ProgressToken(NumberOrString::String(format!("caller-{next}").into())));
                let level = level.map(|l| LEVELS[usize::from(l) % LEVELS.len()]);
                let (guard, receiver) = if relays {
                    let (relay, receiver) = Relay::channel(caller_token.clone(), level, true, true);
                    (calls_in_flight.enter(RequestId::Number(next), token.clone(), relay), Some(receiver))
                } else {
                    (calls_in_flight.enter_unrelayed(), None)
                };
                calls.push(Call { token, caller_token, level, receiver, _guard: guard });
            }
            Event::Leave(i) if !calls.is_empty() => {
                calls.remove(usize::from(i) % calls.len());
            }
            Event::Leave(_) => {}
            Event::Log { level, data, json } => {
                let level = LEVELS[usize::from(level) % LEVELS.len()];
                let data = if json { serde_json::from_str(&data).unwrap_or(data.into()) } else { data.into() };
                let attributed = calls_in_flight.attribute(Origin::Unknown);
                let only = calls.len() == 1 && calls[0].receiver.is_some();
                assert_eq!(attributed.is_some(), only, "attributed with {} calls in flight", calls.len());
                if let Some(relay) = attributed {
                    relay.log(LoggingMessageNotificationParam::new(level, data));
                }
            }
            Event::Progress { call, known, message } => {
                let token = match (known, calls.is_empty()) {
                    (true, false) => calls[usize::from(call) % calls.len()].token.clone(),
                    _ => ProgressToken(NumberOrString::Number(-1)),
                };
                let found = calls_in_flight.by_progress_token(&token);
                let owner = calls.iter().find(|c| c.token == token);
                assert_eq!(found.is_some(), owner.is_some_and(|c| c.receiver.is_some()), "progress to the wrong call");
                if let Some(relay) = found {
                    let mut params = ProgressNotificationParam::new(token, 1.0);
                    params.message = message;
                    relay.progress(params);
                }
            }
        }
        for call in &mut calls {
            let Some(receiver) = call.receiver.as_mut() else { continue };
            assert!(receiver.len() <= RELAY_BUFFER);
            while let Ok(message) = receiver.try_recv() {
                match message {
                    Relayed::Progress(p) => {
                        assert_eq!(Some(&p.progress_token), call.caller_token.as_ref(), "under the caller's token");
                        assert!(p.message.as_ref().is_none_or(|m| m.len() <= MAX_PROGRESS_MESSAGE_BYTES));
                    }
                    Relayed::Log(l) => {
                        let level = call.level.expect("a caller without a level got a log message");
                        assert!(severity(l.level) >= severity(level), "below the caller's level");
                        let size = serde_json::to_vec(&l.data).map_or(0, |b| b.len());
                        // A cut string keeps its JSON escaping (at most 6 bytes a character).
                        assert!(size <= 6 * MAX_LOG_DATA_BYTES + 64, "log data of {size} bytes passed on");
                    }
                    other => panic!("a request from nowhere: {other:?}"),
                }
            }
        }
    }
});
