//! Transport failures told as a person reads them: what failed, where, and the likely fix.
//!
//! rmcp's errors print the transport's Rust type ("Send message error Transport
//! [rmcp::transport::worker::WorkerTransport<...>] error: Client error: error sending request
//! for url (...)"), and that text reached `/readyz`, `tools list`, `explain` and status. Here an
//! error's whole source chain is read for the cause a person can act on (a refused connection, a
//! name that does not resolve, a TLS failure, a timeout, a closed connection) and the URL it
//! concerned; the full chain goes to the debug log only. Anything not recognised is the deepest
//! cause's own text, never a type name.

use std::error::Error;

use rmcp::transport::streamable_http_client::StreamableHttpError;

/// `error` told plainly: the cause, the URL when one is known, and a hint.
pub(crate) fn plain(error: &(dyn Error + 'static)) -> String {
    tracing::debug!(error = %chain(error), "transport error");
    let mut url = None;
    let mut deepest: &(dyn Error + 'static) = error;
    let mut cause = None;
    let mut denied = None;
    let mut link = Some(error);
    while let Some(current) = link {
        let text = current.to_string();
        // The deepest link that holds it is the refusal's own text.
        if text.contains(crate::egress::DENIED) {
            denied = Some(text.clone());
        }
        if let Some(http) = current.downcast_ref::<reqwest::Error>() {
            url = url.or_else(|| http.url().map(|u| u.as_str().to_string()));
            if http.is_timeout() {
                cause = cause.or(Some(Cause::TimedOut));
            }
        }
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            cause = Cause::of_io(io.kind()).or(cause);
        }
        cause = Cause::of_text(&text).or(cause);
        deepest = current;
        link = cause_of(current);
    }
    let at = url.as_deref().map(|u| format!(" at {u}")).unwrap_or_default();
    // The agent's own refusal (`crate::egress`) says what it is: the resolver refusing is not a
    // name that does not resolve.
    if let Some(denial) = denied {
        return format!("{denial}{at}");
    }
    match cause {
        Some(Cause::Refused) => format!("connection refused{at}: is the server running and listening there?"),
        Some(Cause::TimedOut) => format!("no answer in time{at}: is the address reachable from here?"),
        Some(Cause::Closed) => format!("the server closed the connection{at}: see the server's log"),
        Some(Cause::UnknownHost) => format!("cannot resolve the host{at}: check the host name in http.url"),
        Some(Cause::Tls) => {
            let text = without_type_names(&deepest.to_string());
            // The one TLS failure with a fix on this side: a private CA the process does not trust.
            let fix = if text.contains("UnknownIssuer") {
                "the certificate's CA is not trusted here: a private CA goes in --extra-ca-file \
                 (SPEAR_EXTRA_CA_FILE; in a cluster, the chart's trustBundle)"
            } else {
                "check the URL's scheme and the server's certificate"
            };
            format!("TLS handshake failed{at} ({text}): {fix}")
        }
        None => format!("{}{at}", without_type_names(&deepest.to_string())),
    }
}

/// The kinds of failure a person can act on.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Cause {
    Refused,
    TimedOut,
    Closed,
    UnknownHost,
    Tls,
}

impl Cause {
    fn of_io(kind: std::io::ErrorKind) -> Option<Cause> {
        use std::io::ErrorKind::*;
        match kind {
            ConnectionRefused => Some(Cause::Refused),
            TimedOut => Some(Cause::TimedOut),
            ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => Some(Cause::Closed),
            _ => None,
        }
    }

    /// Causes that hyper and rustls give only as text.
    fn of_text(text: &str) -> Option<Cause> {
        let text = text.to_ascii_lowercase();
        if text.contains("dns error") || text.contains("failed to lookup address") {
            Some(Cause::UnknownHost)
        } else if text.contains("certificate") || text.contains("tls handshake") || text.contains("invalid peer") {
            Some(Cause::Tls)
        } else {
            None
        }
    }
}

/// rmcp's `Transport [<type>] error: ` prefixes taken out of `text`.
fn without_type_names(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("Transport [") {
        out.push_str(&rest[..start]);
        let after = &rest[start..];
        match after.find("] error: ") {
            Some(end) => rest = &after[end + "] error: ".len()..],
            None => {
                rest = after;
                break;
            }
        }
    }
    out.push_str(rest);
    out
}

/// The error behind `error`: its source, or the client's error inside rmcp's HTTP error (which
/// does not give it as a source).
fn cause_of<'a>(error: &'a (dyn Error + 'static)) -> Option<&'a (dyn Error + 'static)> {
    match error.downcast_ref::<StreamableHttpError<reqwest::Error>>() {
        Some(StreamableHttpError::Client(inner)) => Some(inner),
        _ => error.source(),
    }
}

/// Every link of `error`'s source chain, for the debug log.
fn chain(error: &(dyn Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut link = cause_of(error);
    while let Some(current) = link {
        text.push_str(": ");
        text.push_str(&current.to_string());
        link = cause_of(current);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("Transport [rmcp::transport::worker::WorkerTransport<X<Y>>] error: Client error")]
    struct Wrapped(#[source] std::io::Error);

    #[test]
    fn a_refused_connection_says_so_without_type_names() {
        let error = Wrapped(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let text = plain(&error);
        assert_eq!(text, "connection refused: is the server running and listening there?");
    }

    #[test]
    fn unknown_causes_are_the_deepest_text_without_type_names() {
        #[derive(Debug, thiserror::Error)]
        #[error("Send message error Transport [a::B<c::D>] error: unexpected content type text/html")]
        struct Odd;
        assert_eq!(plain(&Odd), "Send message error unexpected content type text/html");
        assert_eq!(without_type_names("Transport [x] error: a; Transport [y] error: b"), "a; b");
        assert_eq!(without_type_names("Transport [unclosed"), "Transport [unclosed");
    }

    #[tokio::test]
    async fn a_real_refused_request_names_the_url_and_the_fix() {
        crate::install_crypto_provider();
        let client = reqwest::Client::new();
        let closed = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
        let port = closed.map(|a| a.port()).unwrap_or(1);
        let url = format!("http://127.0.0.1:{port}/mcp");
        let refused = client.get(&url).send().await.expect_err("nothing listens there");
        assert_eq!(plain(&refused), format!("connection refused at {url}: is the server running and listening there?"));
    }

    #[test]
    fn resolver_and_tls_failures_are_read_from_their_text() {
        assert_eq!(Cause::of_text("dns error: failed to lookup address information"), Some(Cause::UnknownHost));
        assert_eq!(Cause::of_text("invalid peer certificate: UnknownIssuer"), Some(Cause::Tls));
        assert_eq!(Cause::of_text("unexpected content type"), None);
    }
}
