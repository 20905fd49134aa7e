//! The HTTP client of the agent's own outbound requests: OAuth (metadata discovery and every
//! token request, whatever the grant) and approval webhooks, and the address policy it dials
//! under. One client per destination it anchors to (an MCP server's URL, a webhook's URL).
//!
//! - **Addresses.** Names are resolved here and addresses the policy refuses are dropped
//!   before a connection is made; a URL whose host is an IP literal is checked before the
//!   request. Refused always: link-local (169.254.0.0/16, fe80::/10, where cloud metadata
//!   endpoints live), the cloud metadata addresses outside it (`fd00:ec2::254`,
//!   `100.100.100.200`), unspecified, multicast and broadcast. Loopback only when the anchor
//!   (the MCP server, the webhook's URL) itself names loopback. Private ranges are allowed (an identity provider at `sso.corp`).
//!   This is rmcp's `new_allowing_private_addresses` policy, which it does not export. On top,
//!   whatever `--egress-deny-cidrs` denies (`crate::egress`: loopback too, in a pod).
//! - **No redirects.** A redirect would carry the credential (or the discovery) elsewhere.
//! - **Bounded.** 30 s per request, 64 KiB of answer.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use super::oauth::TokenError;
use crate::egress::AddressDenyList;

/// A request gets this long to answer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// Bytes read of an answer (metadata documents and token responses are a few KiB).
const MAX_RESPONSE_BYTES: usize = 64 * 1024;

/// Cloud metadata addresses outside the link-local ranges: AWS IMDS over IPv6, Alibaba Cloud.
const METADATA_ADDRESSES: [IpAddr; 2] =
    [IpAddr::V6(Ipv6Addr::new(0xfd00, 0x0ec2, 0, 0, 0, 0, 0, 0x0254)), IpAddr::V4(Ipv4Addr::new(100, 100, 100, 200))];

/// Why the agent does not send an OAuth request to `ip` (see the module header); `None`: it may.
pub(crate) fn address_refusal(ip: IpAddr, loopback_allowed: bool) -> Option<&'static str> {
    let ip = ip.to_canonical();
    if METADATA_ADDRESSES.contains(&ip) {
        return Some("a cloud metadata address");
    }
    match ip {
        IpAddr::V4(v4) if v4.is_link_local() => Some("a link-local address"),
        IpAddr::V6(v6) if (v6.segments()[0] & 0xffc0) == 0xfe80 => Some("a link-local address"),
        IpAddr::V4(v4) if v4.is_broadcast() => Some("the broadcast address"),
        ip if ip.is_unspecified() => Some("the unspecified address"),
        ip if ip.is_multicast() => Some("a multicast address"),
        ip if ip.is_loopback() && !loopback_allowed => {
            Some("a loopback address (allowed only when the configured URL names loopback)")
        }
        _ => None,
    }
}

/// [`address_refusal`], or the egress deny list's.
fn refusal(ip: IpAddr, loopback_allowed: bool, deny: &AddressDenyList) -> Option<&'static str> {
    address_refusal(ip, loopback_allowed).or_else(|| deny.denies(ip).then_some("in --egress-deny-cidrs"))
}

/// Whether `url`'s host is loopback (`localhost` or a loopback literal).
fn is_loopback_url(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => {
            let d = d.trim_end_matches('.').to_ascii_lowercase();
            d == "localhost" || d.ends_with(".localhost")
        }
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// The system resolver (`getaddrinfo`) with the refused addresses removed.
struct PolicyResolver {
    loopback_allowed: bool,
    purpose: &'static str,
    deny: AddressDenyList,
}

impl reqwest::dns::Resolve for PolicyResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let loopback_allowed = self.loopback_allowed;
        let purpose = self.purpose;
        let deny = self.deny.clone();
        let refusal = move |ip: IpAddr| refusal(ip, loopback_allowed, &deny);
        let host = name.as_str().to_string();
        Box::pin(async move {
            let found: Vec<SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let allowed: Vec<SocketAddr> = found.iter().copied().filter(|a| refusal(a.ip()).is_none()).collect();
            if allowed.is_empty() && !found.is_empty() {
                let why = found.first().and_then(|a| refusal(a.ip())).unwrap_or("refused");
                return Err(
                    format!("{host} resolves only to addresses the agent does not send {purpose} to ({why})").into()
                );
            }
            let addrs: reqwest::dns::Addrs = Box::new(allowed.into_iter());
            Ok(addrs)
        })
    }
}

/// An answer: its status and (capped) body.
pub(crate) struct Answer {
    pub(crate) status: u16,
    pub(crate) body: Vec<u8>,
    /// Its `WWW-Authenticate` header (the first), when it has one.
    pub(crate) www_authenticate: Option<String>,
    /// Its `Mcp-Session-Id` header, when it has one.
    pub(crate) session_id: Option<String>,
}

/// The outbound HTTP client of one anchor (the address policy depends on its URL).
pub(crate) struct OutboundHttp {
    /// An error from it (the TLS backend could not start) fails each request rather than
    /// falling back to a client without the policy.
    client: crate::trust::TrustingClient,
    loopback_allowed: bool,
    /// What the requests are, for errors ("OAuth requests").
    purpose: &'static str,
    /// `--egress-deny-cidrs`.
    deny: AddressDenyList,
}

impl std::fmt::Debug for OutboundHttp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OutboundHttp").field("purpose", &self.purpose).finish_non_exhaustive()
    }
}

impl OutboundHttp {
    /// The client for OAuth requests on behalf of the MCP server at `server_url`.
    pub(crate) fn new(server_url: &str, deny: &AddressDenyList) -> Self {
        Self::anchored(server_url, "OAuth requests", deny)
    }

    /// The client for `purpose` requests whose address policy anchors to `anchor_url`, never
    /// dialling what `deny` (`--egress-deny-cidrs`) denies either.
    pub(crate) fn anchored(anchor_url: &str, purpose: &'static str, deny: &AddressDenyList) -> Self {
        // Whatever command builds this client (the agent, `auth login`), TLS needs the provider.
        crate::install_crypto_provider();
        let loopback_allowed = url::Url::parse(anchor_url).is_ok_and(|u| is_loopback_url(&u));
        let resolver = Arc::new(PolicyResolver { loopback_allowed, purpose, deny: deny.clone() });
        let no_proxy = !deny.is_empty();
        let client = crate::trust::TrustingClient::new(move |builder| {
            let builder = builder
                .redirect(reqwest::redirect::Policy::none())
                .timeout(REQUEST_TIMEOUT)
                .dns_resolver(resolver.clone());
            if no_proxy { builder.no_proxy() } else { builder }
        });
        OutboundHttp { client, loopback_allowed, purpose, deny: deny.clone() }
    }

    /// The refusal of `url` by the address policy, when its host is an IP literal (a name is
    /// checked when it is resolved). Lasting: the URL comes from configuration or metadata.
    pub(crate) fn check_literal(&self, url: &url::Url) -> Result<(), TokenError> {
        let ip = match url.host() {
            Some(url::Host::Ipv4(ip)) => IpAddr::V4(ip),
            Some(url::Host::Ipv6(ip)) => IpAddr::V6(ip),
            _ => return Ok(()),
        };
        match refusal(ip, self.loopback_allowed, &self.deny) {
            Some(why) => Err(TokenError::lasting(format!(
                "refused to send {} to {}: {why} (the agent never sends its own requests there)",
                self.purpose,
                url.origin().ascii_serialization()
            ))),
            None => Ok(()),
        }
    }

    fn client(&self) -> Result<reqwest::Client, TokenError> {
        self.client
            .get()
            .map_err(|e| TokenError::transient(format!("building the HTTP client for {}: {e}", self.purpose)))
    }

    /// GET `url` as JSON.
    pub(crate) async fn get(&self, url: &url::Url) -> Result<Answer, TokenError> {
        self.check_literal(url)?;
        let request = self.client()?.get(url.clone()).header(reqwest::header::ACCEPT, "application/json");
        self.send(url, request).await
    }

    /// POST the form `form` to the token endpoint `url`, with HTTP Basic client authentication
    /// when `basic` is given.
    pub(crate) async fn post_form(
        &self,
        url: &url::Url,
        form: &[(&str, &str)],
        basic: Option<(&str, &str)>,
    ) -> Result<Answer, TokenError> {
        self.check_literal(url)?;
        let body = url::form_urlencoded::Serializer::new(String::new()).extend_pairs(form).finish();
        let mut request = self
            .client()?
            .post(url.clone())
            .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        if let Some((user, password)) = basic {
            // RFC 6749 section 2.3.1: both form-encoded before the Basic encoding.
            let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
            request = request.basic_auth(enc(user), Some(enc(password)));
        }
        self.send(url, request).await
    }

    /// POST the token request `form` to `url` as the client `client_id`, authenticated by
    /// `method` with `secret` (RFC 6749 section 2.3.1; a public client, or one without its
    /// secret, sends only its id).
    pub(crate) async fn post_form_as_client(
        &self,
        url: &url::Url,
        form: &[(&str, &str)],
        client_id: &str,
        secret: Option<&str>,
        method: super::oauth::grant::ClientAuthMethod,
    ) -> Result<Answer, TokenError> {
        use super::oauth::grant::ClientAuthMethod;
        let mut form = form.to_vec();
        match (method, secret) {
            (ClientAuthMethod::ClientSecretBasic, Some(secret)) => {
                return self.post_form(url, &form, Some((client_id, secret))).await;
            }
            (ClientAuthMethod::ClientSecretPost, Some(secret)) => {
                form.extend([("client_id", client_id), ("client_secret", secret)]);
            }
            _ => form.push(("client_id", client_id)),
        }
        self.post_form(url, &form, None).await
    }

    /// POST the JSON `body` to `url` with `headers`, within `timeout`; the answer is read up to
    /// `max_bytes` (a longer one is an error).
    pub(crate) async fn post_json(
        &self,
        url: &url::Url,
        body: Vec<u8>,
        headers: &[(&'static str, String)],
        timeout: Duration,
    ) -> Result<Answer, TokenError> {
        self.check_literal(url)?;
        let mut request = self
            .client()?
            .post(url.clone())
            .timeout(timeout)
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .header(reqwest::header::ACCEPT, "application/json")
            .body(body);
        for (name, value) in headers {
            request = request.header(*name, value);
        }
        self.send(url, request).await
    }

    async fn send(&self, url: &url::Url, request: reqwest::RequestBuilder) -> Result<Answer, TokenError> {
        let mut response = request.send().await.map_err(|e| {
            TokenError::transient(format!("the request to {url} failed: {}", crate::telemetry::error_chain(&e)))
        })?;
        let status = response.status().as_u16();
        let header = |name: &str| response.headers().get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
        let www_authenticate = header("www-authenticate");
        let session_id = header("mcp-session-id");
        let mut body = Vec::new();
        while let Some(chunk) =
            response.chunk().await.map_err(|e| TokenError::transient(format!("reading the answer of {url}: {e}")))?
        {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(TokenError::transient(format!(
                    "the answer of {url} is larger than {MAX_RESPONSE_BYTES} bytes"
                )));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(Answer { status, body, www_authenticate, session_id })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn metadata_and_link_local_addresses_are_refused_private_ones_allowed() {
        for refused in
            ["169.254.169.254", "fe80::1", "fd00:ec2::254", "100.100.100.200", "::ffff:169.254.169.254", "0.0.0.0"]
        {
            assert!(address_refusal(ip(refused), true).is_some(), "{refused}");
        }
        for allowed in ["10.0.0.9", "192.168.1.1", "fd12::1", "203.0.113.7", "2001:db8::1"] {
            assert_eq!(address_refusal(ip(allowed), false), None, "{allowed}");
        }
        assert!(address_refusal(ip("127.0.0.1"), false).is_some());
        assert_eq!(address_refusal(ip("127.0.0.1"), true), None);
        assert!(address_refusal(ip("::ffff:127.0.0.1"), false).is_some());
    }

    #[tokio::test]
    async fn a_token_endpoint_at_a_metadata_address_is_refused_without_a_connection() {
        let http = OutboundHttp::new("http://127.0.0.1:1/mcp", &AddressDenyList::none());
        let url = url::Url::parse("http://169.254.169.254/latest/token").expect("url");
        let refused = http.post_form(&url, &[("grant_type", "client_credentials")], None).await;
        let error = refused.err().expect("refused");
        assert!(error.lasting && error.message.contains("link-local"), "{error:?}");
        let url = url::Url::parse("https://[fd00:ec2::254]/token").expect("url");
        let error = http.get(&url).await.err().expect("refused");
        assert!(error.message.contains("metadata"), "{error:?}");
        // A name resolving to loopback, for a server that is not on loopback.
        let remote = OutboundHttp::new("https://mcp.example.com/mcp", &AddressDenyList::none());
        // A range the deny list adds, in a name's addresses and in a literal.
        let denied = OutboundHttp::new("http://127.0.0.1:1/mcp", &"127.0.0.0/8".parse().expect("valid"));
        let url = url::Url::parse("http://127.0.0.1:1/token").expect("url");
        let error = denied.get(&url).await.err().expect("refused");
        assert!(error.message.contains("--egress-deny-cidrs"), "{error:?}");
        let url = url::Url::parse("http://localhost:1/token").expect("url");
        let error = denied.get(&url).await.err().expect("refused");
        assert!(error.message.contains("--egress-deny-cidrs"), "{error:?}");
        let url = url::Url::parse("http://localhost:1/token").expect("url");
        let error = remote.get(&url).await.err().expect("refused");
        assert!(error.message.contains("does not send OAuth requests"), "{error:?}");
    }
}
