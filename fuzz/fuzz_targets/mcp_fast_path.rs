//! The `/mcp` fast path (`src/agent/doors/mcp/fast_path.rs`): its reading of a request body and of the
//! headers, and the HTTP door's Host/Origin guard (`src/agent/http_guard.rs`).
//!
//! Input: a JSON-RPC body, then optionally a 0 byte and headers (arbitrary-encoded); without
//! them the headers are a plain client's.
//!
//! Properties (the fast path answers without rmcp, so it must never take what rmcp refuses):
//! - a body the fast path takes as a `tools/call` is a `ClientJsonRpcMessage` for rmcp: a
//!   `tools/call` request with the same id, tool name and arguments;
//! - a 2026-07-28 stateless call the fast path takes is, for rmcp, a `tools/call` with the same
//!   id, name and arguments whose `_meta` names the header's protocol version, sent with
//!   `Mcp-Method: tools/call` and `Mcp-Name` equal to the name, no session, a version rmcp knows
//!   of 2026-07-28 or later, JSON and SSE accepted and a Host rmcp accepts;
//! - headers the fast path takes carry a non-empty session id, a JSON content type, an Accept
//!   with JSON, an `MCP-Protocol-Version` rmcp knows (or none) and a Host rmcp's own DNS-rebinding
//!   check accepts ([`rmcp_host_allowed`], rmcp 3.9's rule);
//! - the door's Host check never allows a well-formed Host rmcp's check refuses (with a
//!   non-empty list);
//! - the guard lets a request through only with an allowed Host (or authority) and no Origin, a
//!   listed one, or one naming that Host itself (same-origin, with a non-empty hosts list).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, GetMeta, JsonRpcMessage, ProtocolVersion};

#[derive(Arbitrary, Debug)]
enum Name {
    ContentType,
    Accept,
    Host,
    Session,
    ProtocolVersion,
    Origin,
    Method,
    ToolName,
    Other(String),
}

#[derive(Arbitrary, Debug)]
struct Headers {
    headers: Vec<(Name, String)>,
    authority: Option<String>,
    hosts: Option<Vec<String>>,
    origins: Vec<String>,
}

fn plain_client() -> Headers {
    Headers {
        headers: vec![
            (Name::ContentType, "application/json".into()),
            (Name::Accept, "application/json, text/event-stream".into()),
            (Name::Host, "127.0.0.1:4040".into()),
            (Name::Session, "s-1".into()),
        ],
        authority: None,
        hosts: None,
        origins: Vec::new(),
    }
}

/// The agent's default `--allowed-host` list.
fn default_hosts() -> Vec<String> {
    ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec()
}

/// rmcp 3.9.0's Host check (`transport/streamable_http_server/tower.rs`: `parse_host_header`,
/// `host_is_allowed`), restated: the Host must parse as a URI authority (else 400), then match an
/// allowed entry by host name, and by port when the entry names one.
fn rmcp_host_allowed(host: &str, allowed: &[String]) -> bool {
    let normalize = |h: &str| h.trim_matches('[').trim_matches(']').to_ascii_lowercase();
    let Ok(authority) = http::uri::Authority::try_from(host) else { return false };
    if allowed.is_empty() {
        return true;
    }
    let (name, port) = (normalize(authority.host()), authority.port_u16());
    allowed.iter().any(|entry| {
        let entry = entry.trim();
        if entry.is_empty() {
            return false;
        }
        let (entry_name, entry_port) = match http::uri::Authority::try_from(entry) {
            Ok(a) => (normalize(a.host()), a.port_u16()),
            Err(_) => (normalize(entry), None),
        };
        entry_name == name && entry_port.is_none_or(|p| port == Some(p))
    })
}

fn header_name(name: &Name) -> Option<HeaderName> {
    Some(match name {
        Name::ContentType => http::header::CONTENT_TYPE,
        Name::Accept => http::header::ACCEPT,
        Name::Host => http::header::HOST,
        Name::Session => HeaderName::from_static("mcp-session-id"),
        Name::ProtocolVersion => HeaderName::from_static("mcp-protocol-version"),
        Name::Origin => http::header::ORIGIN,
        Name::Method => HeaderName::from_static("mcp-method"),
        Name::ToolName => HeaderName::from_static("mcp-name"),
        Name::Other(s) => HeaderName::from_bytes(s.as_bytes()).ok()?,
    })
}

fn check_body(body: &[u8]) {
    let Some(call) = spear::fuzzing::fast_path_call(body) else { return };
    let message: ClientJsonRpcMessage = match serde_json::from_slice(body) {
        Ok(m) => m,
        Err(e) => panic!("the fast path takes a body rmcp refuses ({e}): {}", String::from_utf8_lossy(body)),
    };
    let JsonRpcMessage::Request(request) = message else { panic!("rmcp reads {message:?}, not a request") };
    let ClientRequest::CallToolRequest(tools_call) = &request.request else {
        panic!("rmcp reads {:?}, not tools/call", request.request)
    };
    assert_eq!(serde_json::to_value(&request.id).ok(), Some(call.id), "ids differ");
    assert_eq!(tools_call.params.name, call.name.as_str(), "names differ");
    assert_eq!(tools_call.params.arguments, call.arguments, "arguments differ");
}

fn check_stateless(body: &[u8], headers: &HeaderMap, hosts: &[String]) {
    let Some(version) = spear::fuzzing::fast_path_stateless(headers, hosts) else { return };
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    assert!(headers.get("mcp-session-id").is_none(), "a session took the stateless path");
    assert!(version.as_str() >= "2026-07-28" && ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == version));
    let accept: String = headers.get_all("accept").iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(",");
    assert!(accept.contains("application/json") && accept.contains("text/event-stream"), "Accept {accept:?}");
    let host = text("host").expect("the fast path needs a Host");
    assert!(rmcp_host_allowed(host, hosts), "stateless fast path with Host {host:?}, which rmcp refuses");
    let Some(call) = spear::fuzzing::fast_path_stateless_call(body, &version, headers) else { return };
    let message: ClientJsonRpcMessage = serde_json::from_slice(body).expect("rmcp reads what the fast path takes");
    let JsonRpcMessage::Request(request) = message else { panic!("not a request") };
    assert_eq!(request.request.get_meta().protocol_version().map(|v| v.to_string()), Some(version.clone()));
    let ClientRequest::CallToolRequest(tools_call) = &request.request else { panic!("not tools/call") };
    assert_eq!(serde_json::to_value(&request.id).ok(), Some(call.id), "ids differ");
    assert_eq!((tools_call.params.name.as_ref(), &tools_call.params.arguments), (call.name.as_str(), &call.arguments));
    assert_eq!(text("mcp-method"), Some("tools/call"));
    assert_eq!(text("mcp-name"), Some(call.name.as_str()));
}

fn check_headers(spec: &Headers, body: &[u8]) {
    let mut headers = HeaderMap::new();
    for (name, value) in &spec.headers {
        let (Some(name), Ok(value)) = (header_name(name), HeaderValue::from_str(value)) else { continue };
        headers.append(name, value);
    }
    let hosts = spec.hosts.clone().unwrap_or_else(default_hosts);
    let text = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    check_stateless(body, &headers, &hosts);

    // The door's own check (also the chat door's, where rmcp is not involved) is at least as
    // strict as rmcp's for every Host that is a URI authority; a malformed one rmcp answers 400.
    for (_, value) in &spec.headers {
        let well_formed = http::uri::Authority::try_from(value.as_str()).is_ok();
        if well_formed && !hosts.is_empty() && spear::fuzzing::host_allowed(value, &hosts) {
            assert!(rmcp_host_allowed(value, &hosts), "Host {value:?} passes the door, rmcp refuses it ({hosts:?})");
        }
    }

    if let Some(session) = spear::fuzzing::fast_path_session(&headers, &hosts) {
        assert!(!session.is_empty());
        assert_eq!(text("mcp-session-id"), Some(session.as_str()));
        assert!(text("content-type").is_some_and(|v| v.starts_with("application/json")));
        let accept: String =
            headers.get_all("accept").iter().filter_map(|v| v.to_str().ok()).collect::<Vec<_>>().join(",");
        assert!(accept.contains("application/json") && accept.contains("text/event-stream"), "Accept {accept:?}");
        let host = text("host").expect("the fast path needs a Host");
        assert!(rmcp_host_allowed(host, &hosts), "fast path with Host {host:?}, which rmcp refuses ({hosts:?})");
        if let Some(version) = headers.get("mcp-protocol-version") {
            let version = version.to_str().expect("a known version is text");
            assert!(ProtocolVersion::KNOWN_VERSIONS.iter().any(|k| k.as_str() == version));
        }
    }

    let refusal =
        spear::fuzzing::guard_refusal(headers.clone(), spec.authority.as_deref(), hosts.clone(), spec.origins.clone());
    if refusal.is_none() {
        match headers.get(http::header::HOST) {
            // With an empty list any Host passes, even one that is not text.
            Some(host) if !hosts.is_empty() => {
                let host = host.to_str().expect("an allowed Host is text");
                assert!(spear::fuzzing::host_allowed(host, &hosts), "Host {host:?} passed");
            }
            Some(_) => {}
            None => {
                if let Some(authority) = spec.authority.as_deref().filter(|_| !hosts.is_empty()) {
                    // Only a URI that parses carries the authority; without it the guard needs an empty list.
                    if format!("http://{authority}/mcp").parse::<http::Uri>().is_ok() {
                        let uri: http::Uri = format!("http://{authority}/mcp").parse().expect("parsed");
                        let seen = uri.authority().map(|a| a.to_string()).unwrap_or_default();
                        assert!(spear::fuzzing::host_allowed(&seen, &hosts), "authority {seen:?} passed");
                    }
                }
            }
        }
        if let Some(origin) = headers.get(http::header::ORIGIN) {
            let origin = origin.to_str().expect("an allowed Origin is text");
            let trim = |s: &str| s.trim_end_matches('/').to_ascii_lowercase();
            let listed = spec.origins.iter().any(|o| trim(o) == trim(origin));
            // Same-origin: `scheme://` + the request's own Host (the header, else the URI
            // authority), which the (non-empty) list accepted.
            let authority = spec
                .authority
                .as_deref()
                .and_then(|a| format!("http://{a}/mcp").parse::<http::Uri>().ok())
                .and_then(|uri| uri.authority().map(|a| a.to_string()));
            let own = match headers.get(http::header::HOST) {
                Some(host) => host.to_str().ok().map(str::to_string),
                None => authority,
            }
            .filter(|_| !hosts.is_empty());
            let same_origin = own.is_some_and(|host| {
                let host = host.to_ascii_lowercase();
                let origin = trim(origin);
                (origin == format!("http://{host}") || origin == format!("https://{host}"))
                    && spear::fuzzing::host_allowed(&host, &hosts)
            });
            assert!(listed || same_origin, "Origin {origin:?} passed");
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (body, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    check_body(body);
    let headers = match rest {
        Some(rest) => match Headers::arbitrary_take_rest(Unstructured::new(rest)) {
            Ok(h) => h,
            Err(_) => return,
        },
        None => {
            // A body alone is also tried as a plain 2026-07-28 stateless client sends it, its
            // Mcp-Name taken from the body, so body-only inputs reach the stateless reading.
            let name = spear::fuzzing::fast_path_call(body).map(|c| c.name).unwrap_or_default();
            let mut stateless = plain_client();
            stateless.headers.retain(|(n, _)| !matches!(n, Name::Session));
            stateless.headers.push((Name::ProtocolVersion, "2026-07-28".into()));
            stateless.headers.push((Name::Method, "tools/call".into()));
            stateless.headers.push((Name::ToolName, name));
            check_headers(&stateless, body);
            plain_client()
        }
    };
    if std::env::var_os("FUZZ_DEBUG").is_some() {
        eprintln!("{headers:#?}");
    }
    check_headers(&headers, body);
});
