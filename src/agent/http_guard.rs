//! The HTTP door's guard against browsers (port 4040: chat completions and `/mcp`). The door
//! listens on loopback, which keeps other hosts out but not a web page the developer has open:
//! a page may post to `http://127.0.0.1:4040` (a `text/plain` POST needs no CORS preflight), or
//! reach it under its own name by DNS rebinding, and run tools with the developer's model key.
//!
//! Every request on the door is refused with 403 before any handler runs when
//! - its `Host` (the `Host` header, or the URI authority of an HTTP/2 request) is not one of
//!   `--allowed-host` (rebinding: the page's own name arrives as Host), or
//! - it carries an `Origin` that is not one of `--allowed-origin` (none by default): browsers send
//!   `Origin` on cross-origin requests, MCP and OpenAI clients outside a browser do not. An
//!   `Origin` naming the request's own Host (`http://localhost:4040` to `localhost:4040`) is
//!   same-origin and passes, as the MCP spec's DNS-rebinding rule asks: only a page served by
//!   this port could send it, and spearlet serves no pages. It passes only when `--allowed-host`
//!   is a list (an empty list admits any Host, so a rebound page's Host and Origin would agree).
//!
//! The chat door also requires `Content-Type: application/json` (415 otherwise), so a page
//! cannot send the request without a preflight, which nothing here answers.
//!
//! The admin port ([`Allowed::admin`]) has the same guard, and also accepts any IP-literal Host
//! and `localhost`: the kubelet's probes and the scrapers send `Host: <pod IP>:4042`, and a
//! rebound page always sends the DNS name it was loaded from (a page loaded from an IP address
//! reaches that address only), so only DNS names must be in `--allowed-host`.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::uri::Authority;
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

/// The hosts and origins the door accepts.
#[derive(Clone, Debug)]
pub(crate) struct Allowed {
    hosts: Arc<[String]>,
    origins: Arc<[String]>,
    /// Also any IP-literal Host and `localhost` (the admin port).
    literal_hosts: bool,
}

impl Allowed {
    /// The HTTP door's: `hosts` and `origins` only.
    pub(crate) fn new(hosts: Vec<String>, origins: Vec<String>) -> Self {
        Allowed { hosts: hosts.into(), origins: origins.into(), literal_hosts: false }
    }

    /// The admin port's: [`Allowed::new`], and any IP-literal Host or `localhost` (see the module
    /// doc). A DNS name must be one of `hosts`.
    pub(crate) fn admin(hosts: Vec<String>, origins: Vec<String>) -> Self {
        Allowed { literal_hosts: true, ..Allowed::new(hosts, origins) }
    }

    fn host_allowed(&self, host: &str) -> bool {
        host_allowed(host, &self.hosts) || (self.literal_hosts && ip_literal_or_localhost(host))
    }
}

/// Whether `host` (`name` or `name:port`) names an IP address (`10.1.2.3`, `[fd00::1]`) or
/// `localhost`: names no DNS answer chooses.
fn ip_literal_or_localhost(host: &str) -> bool {
    let Ok(authority) = host.parse::<Authority>() else { return false };
    let name = authority.host();
    let bracketed = name.strip_prefix('[').and_then(|n| n.strip_suffix(']'));
    match bracketed {
        Some(v6) => v6.parse::<std::net::Ipv6Addr>().is_ok(),
        None => name.parse::<std::net::Ipv4Addr>().is_ok() || name.eq_ignore_ascii_case("localhost"),
    }
}

/// `host` (`name` or `name:port`, IPv6 in brackets) matches an entry given as a name or as
/// `name:port`; an empty list allows any host, as rmcp does. The rule is rmcp's own (its
/// DNS-rebinding check on `/mcp`), so the two doors agree: the Host must be a URI authority, it
/// matches an entry by name (brackets trimmed at the ends, case-insensitive), and by port when
/// the entry names one. An empty entry (`--allowed-host localhost,`) names no host.
pub(crate) fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let Ok(authority) = host.parse::<Authority>() else { return false };
    if allowed.is_empty() {
        return true;
    }
    let normalize = |h: &str| h.trim_matches('[').trim_matches(']').to_ascii_lowercase();
    let (name, port) = (normalize(authority.host()), authority.port_u16());
    allowed.iter().map(|entry| entry.trim()).filter(|entry| !entry.is_empty()).any(|entry| {
        let (entry_name, entry_port) = match entry.parse::<Authority>() {
            Ok(a) => (normalize(a.host()), a.port_u16()),
            Err(_) => (normalize(entry), None),
        };
        entry_name == name && entry_port.is_none_or(|p| port == Some(p))
    })
}

/// An `Origin` is allowed only when listed exactly (scheme, host and port; case-insensitive).
fn origin_allowed(origin: &str, allowed: &[String]) -> bool {
    allowed.iter().any(|entry| entry.trim_end_matches('/').eq_ignore_ascii_case(origin.trim_end_matches('/')))
}

/// An `Origin` (`scheme://authority`, http or https, no path) that names `host`, the request's
/// own Host, which the allowed-hosts list has already accepted.
pub(crate) fn same_origin(origin: &str, host: &str) -> bool {
    let Ok(uri) = origin.parse::<axum::http::Uri>() else { return false };
    let web_scheme =
        uri.scheme_str().is_some_and(|s| s.eq_ignore_ascii_case("http") || s.eq_ignore_ascii_case("https"));
    let bare = uri.path_and_query().is_none_or(|p| p.as_str() == "/");
    web_scheme && bare && uri.authority().is_some_and(|a| a.as_str().eq_ignore_ascii_case(host))
}

/// Why a request is refused, if it is.
pub(crate) fn refusal(request: &Request, allowed: &Allowed) -> Option<String> {
    // A Host header that is not text is refused, not replaced by the URI's authority: rmcp
    // checks the header, and the guard must never be looser (found by fuzz target mcp_fast_path).
    let host = match request.headers().get(header::HOST) {
        Some(value) => match value.to_str() {
            Ok(text) => Some(text.to_string()),
            Err(_) => return Some("the Host header is not text".to_string()),
        },
        None => request.uri().authority().map(|a| a.to_string()),
    };
    match &host {
        Some(host) if allowed.host_allowed(host) => {}
        Some(host) => {
            return Some(format!(
                "Host '{}' is not allowed on this port (add it with --allowed-host if it is yours)",
                host.chars().take(100).collect::<String>()
            ));
        }
        None if allowed.hosts.is_empty() => {}
        None => return Some("a Host header is required".to_string()),
    }
    if let Some(origin) = request.headers().get(header::ORIGIN) {
        let origin = origin.to_str().unwrap_or("(not text)");
        // `host` is here only if the list accepted it; with an empty list it proves nothing.
        let own_host = host.as_deref().filter(|_| !allowed.hosts.is_empty());
        if !origin_allowed(origin, &allowed.origins) && !own_host.is_some_and(|h| same_origin(origin, h)) {
            return Some(format!(
                "requests from web pages (Origin '{}') are refused (allow one with --allowed-origin)",
                origin.chars().take(100).collect::<String>()
            ));
        }
    }
    None
}

/// The middleware: refuse, or pass the request on.
pub(crate) async fn guard(State(allowed): State<Allowed>, request: Request, next: Next) -> Response {
    match refusal(&request, &allowed) {
        None => next.run(request).await,
        Some(reason) => {
            tracing::info!(%reason, path = %request.uri().path(), "request refused by the browser guard");
            (StatusCode::FORBIDDEN, format!("{reason}\n")).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;

    fn request(host: Option<&str>, origin: Option<&str>) -> Request {
        let mut builder = Request::builder().uri("/v1/chat/completions");
        if let Some(host) = host {
            builder = builder.header(header::HOST, host);
        }
        if let Some(origin) = origin {
            builder = builder.header(header::ORIGIN, origin);
        }
        builder.body(Body::empty()).expect("request")
    }

    fn allowed(origins: &[&str]) -> Allowed {
        let hosts = ["localhost", "127.0.0.1", "::1"].map(String::from).to_vec();
        Allowed::new(hosts, origins.iter().map(|o| o.to_string()).collect())
    }

    #[test]
    fn hosts_match_by_name_or_name_and_port() {
        let allowed = ["localhost".to_string(), "::1".to_string(), "api.example:8080".to_string()];
        assert!(host_allowed("localhost", &allowed));
        assert!(host_allowed("LOCALHOST:4040", &allowed));
        assert!(host_allowed("[::1]:4040", &allowed));
        assert!(host_allowed("api.example:8080", &allowed));
        assert!(!host_allowed("api.example:9090", &allowed));
        assert!(!host_allowed("localhost.evil:4040", &allowed));
        assert!(host_allowed("anything", &[]));
    }

    /// Found by fuzzing (`fuzz/fuzz_targets/mcp_fast_path.rs`): an empty entry, as a trailing
    /// comma in `SPEAR_ALLOWED_HOSTS` leaves, allowed a Host with an empty name (`:4040`), which
    /// rmcp refuses.
    #[test]
    fn an_empty_entry_allows_no_host() {
        let allowed = ["localhost".to_string(), String::new()];
        for host in [":", ":4040", "", "[]:4040"] {
            assert!(!host_allowed(host, &allowed), "{host:?}");
        }
        assert!(host_allowed("localhost:4040", &allowed));
    }

    #[test]
    fn rebinding_and_web_pages_are_refused_plain_clients_pass() {
        let a = allowed(&[]);
        assert_eq!(refusal(&request(Some("127.0.0.1:4040"), None), &a), None, "a plain client");
        assert!(refusal(&request(Some("evil.example:4040"), None), &a).is_some_and(|r| r.contains("--allowed-host")));
        assert!(refusal(&request(None, None), &a).is_some(), "no Host at all");
        let page = refusal(&request(Some("127.0.0.1:4040"), Some("https://evil.example")), &a);
        assert!(page.is_some_and(|r| r.contains("--allowed-origin")), "a page on another site");
        assert!(refusal(&request(Some("localhost"), Some("null")), &a).is_some(), "a sandboxed page");
        let a = allowed(&["http://localhost:3000"]);
        assert_eq!(refusal(&request(Some("localhost:4040"), Some("http://LOCALHOST:3000")), &a), None);
        assert!(refusal(&request(Some("localhost:4040"), Some("http://localhost:3001")), &a).is_some());
    }

    /// The admin port: probes and scrapers by IP (any address, any port) and `localhost` pass,
    /// DNS names only when listed; a rebound page's name is refused with or without `Origin`,
    /// and so are names that only look like an address.
    #[test]
    fn the_admin_port_accepts_ip_literals_and_localhost_and_listed_names_only() {
        let admin = Allowed::admin(vec!["localhost".into(), "agent.example".into()], Vec::new());
        for host in [
            "10.244.1.17:4042",
            "10.244.1.17",
            "127.0.0.1:4042",
            "[fd00:10:244::17]:4042",
            "[::1]:4042",
            "localhost:4042",
            "LOCALHOST",
            "agent.example:4042",
        ] {
            assert_eq!(refusal(&request(Some(host), None), &admin), None, "{host}");
        }
        for host in [
            "rebind.evil.example:4042",
            "10.244.1.17.nip.io:4042",
            "127.0.0.1.evil.example",
            "localhost.evil.example:4042",
            "localhost.:4042",
            "127.1:4042",
            "[fd00::1",
            "fd00::1",
        ] {
            let refused = refusal(&request(Some(host), None), &admin);
            assert!(refused.as_deref().is_some_and(|r| r.contains("--allowed-host")), "{host}: {refused:?}");
        }
        assert!(refusal(&request(None, None), &admin).is_some(), "no Host at all");
        let page = refusal(&request(Some("10.244.1.17:4042"), Some("https://evil.example")), &admin);
        assert!(page.is_some_and(|r| r.contains("--allowed-origin")), "a page on another site");
        // The HTTP door keeps its list only.
        let door = Allowed::new(vec!["localhost".into()], Vec::new());
        assert!(refusal(&request(Some("10.244.1.17:4040"), None), &door).is_some());
    }

    /// The MCP conformance suite's DNS-rebinding scenario: a same-origin request passes, a page on
    /// another port, host or scheme does not, nor one that rebinds its own name to loopback.
    #[test]
    fn a_same_origin_request_passes_other_pages_do_not() {
        let a = allowed(&[]);
        for (host, origin) in
            [("localhost:4040", "http://localhost:4040"), ("127.0.0.1:4040", "https://127.0.0.1:4040/")]
        {
            assert_eq!(refusal(&request(Some(host), Some(origin)), &a), None, "{origin} to {host}");
        }
        for (host, origin) in [
            ("localhost:4040", "http://localhost:3000"),
            ("localhost:4040", "http://localhost"),
            ("localhost:4040", "http://localhost:4040.evil.example"),
            ("localhost:4040", "ftp://localhost:4040"),
            ("localhost:4040", "http://localhost:4040/page"),
            ("localhost:4040", "localhost:4040"),
            ("evil.example:4040", "http://evil.example:4040"),
        ] {
            assert!(refusal(&request(Some(host), Some(origin)), &a).is_some(), "{origin} to {host}");
        }
        // An empty hosts list admits any Host, so Host and Origin agreeing proves nothing.
        let open = Allowed::new(Vec::new(), Vec::new());
        assert!(refusal(&request(Some("evil.example:4040"), Some("http://evil.example:4040")), &open).is_some());
    }
}
