//! The upstream model API: where a request goes (pure resolution) and one POST to it.
//!
//! ```text
//! --upstream-url ─┐ else profile spec.chat.upstream.url ──▶ POST {url}/chat/completions
//! --upstream-api-key-env ─┐ else $SPEAR_UPSTREAM_API_KEY ─┐ else the caller's Authorization
//! request model ─┐ else profile spec.chat.upstream.model  ─┴──▶ Target
//! ```
//!
//! In Kubernetes mode the webhook sets `SPEAR_UPSTREAM_API_KEY` on the agent container from the
//! profile's `chat.upstream.apiKeySecretRef` (a `secretKeyRef` env var: the agent never reads
//! Secrets); in local mode it is set by whoever starts `spearlet serve`. The key is never logged:
//! [`Credential`] and [`UpstreamOverride`] redact it in `Debug`.

use std::fmt;
use std::time::Duration;

use axum::body::Bytes;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};

use super::error::ChatError;
use super::types::{ChatCompletion, ChatRequest};
use crate::api::UpstreamSpec;
use crate::egress::AddressDenyList;

/// Upstream settings from the agent's flags; each wins over the profile's.
#[derive(Clone, Default)]
pub struct UpstreamOverride {
    /// Base URL (`--upstream-url`), for example `https://api.openai.com/v1`.
    pub url: Option<String>,
    /// The API key (read from the env var `--upstream-api-key-env` names).
    pub api_key: Option<String>,
    /// That env var's name: no `${ENV:...}` template may read it.
    pub api_key_env: Option<String>,
}

impl fmt::Debug for UpstreamOverride {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("UpstreamOverride")
            .field("url", &self.url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .finish()
    }
}

impl UpstreamOverride {
    /// From the flags: the URL, and the name of the env var holding the key (read now; unset
    /// or empty means no override).
    pub(crate) fn from_flags(url: Option<String>, api_key_env: Option<&str>) -> Self {
        UpstreamOverride {
            url,
            api_key: api_key_env.and_then(non_empty_env),
            api_key_env: api_key_env.map(str::to_string),
        }
    }
}

/// The value of env var `name`, unless unset or empty.
pub(crate) fn non_empty_env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Time limits of upstream requests.
#[derive(Clone, Copy, Debug)]
pub struct UpstreamTimeouts {
    /// TCP + TLS connect.
    pub(crate) connect: Duration,
    /// One whole completion request (a model can think for minutes).
    pub(crate) request: Duration,
}

impl Default for UpstreamTimeouts {
    fn default() -> Self {
        // 600 s is the OpenAI SDKs' own default request timeout: the agent should not give up
        // before the caller's client does. 10 s to connect covers a cold TLS handshake.
        UpstreamTimeouts { connect: Duration::from_secs(10), request: Duration::from_secs(600) }
    }
}

/// What authenticates the agent upstream.
#[derive(Clone, PartialEq, Eq)]
pub(crate) enum Credential {
    /// A configured API key, sent as `Bearer`.
    ApiKey(String),
    /// The caller's own `Authorization` header, forwarded as is.
    Caller(HeaderValue),
    None,
}

impl fmt::Debug for Credential {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Credential::ApiKey(_) => "ApiKey(<redacted>)",
            Credential::Caller(_) => "Caller(<redacted>)",
            Credential::None => "None",
        })
    }
}

impl Credential {
    /// The `Authorization` header value, if any.
    fn header(&self) -> Option<HeaderValue> {
        match self {
            Credential::ApiKey(key) => {
                let mut value = HeaderValue::from_str(&format!("Bearer {key}")).ok()?;
                value.set_sensitive(true);
                Some(value)
            }
            Credential::Caller(value) => Some(value.clone()),
            Credential::None => None,
        }
    }
}

/// Where one request goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Target {
    /// `{base}/chat/completions`.
    pub(crate) url: String,
    pub(crate) credential: Credential,
    /// The model to use when the request names none.
    pub(crate) default_model: Option<String>,
}

/// Resolves the upstream of one request: flags, then the profile (`spec.chat.upstream`), then
/// (for the key) the caller's `Authorization` header. Pure.
pub(crate) fn resolve(
    overrides: &UpstreamOverride,
    env_api_key: Option<&str>,
    profile: Option<&UpstreamSpec>,
    profile_name: &str,
    caller: &HeaderMap,
) -> Result<Target, ChatError> {
    let base = overrides
        .url
        .as_deref()
        .or(profile.map(|p| p.url.as_str()))
        .filter(|u| !u.is_empty())
        .ok_or_else(|| ChatError::NoUpstream { profile: profile_name.to_string() })?;
    let credential = match (overrides.api_key.as_deref(), env_api_key, caller.get(header::AUTHORIZATION)) {
        (Some(key), _, _) | (None, Some(key), _) => Credential::ApiKey(key.to_string()),
        (None, None, Some(value)) => Credential::Caller(value.clone()),
        (None, None, None) => Credential::None,
    };
    Ok(Target { url: completions_url(base), credential, default_model: profile.and_then(|p| p.model.clone()) })
}

/// `{base}/chat/completions`, with one `/` between.
pub(crate) fn completions_url(base: &str) -> String {
    format!("{}/chat/completions", base.trim_end_matches('/'))
}

/// Why an upstream request did not yield a completion.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// The HTTP client could not be built (TLS setup).
    #[error("building the upstream HTTP client: {message}")]
    Client { message: String },
    /// No answer: connection refused, DNS, TLS, timeout.
    #[error("upstream {url} unreachable: {source}")]
    Unreachable {
        url: String,
        /// The transport error (without the URL, given once above).
        #[source]
        source: reqwest::Error,
    },
    /// The upstream answered with an error status; passed back to the caller as it came.
    #[error("upstream answered {status}")]
    Status {
        /// Its status.
        status: StatusCode,
        /// Its body.
        body: Bytes,
        /// Its content type.
        content_type: Option<HeaderValue>,
    },
    /// The upstream URL names an address `--egress-deny-cidrs` denies.
    #[error("upstream {url} is an address the agent does not connect to (--egress-deny-cidrs)")]
    Denied { url: String },
    /// The upstream answered 2xx with something that is not a chat completion.
    #[error("upstream {url} answered with something that is not a chat completion: {message}")]
    InvalidResponse {
        url: String,
        /// The parse error.
        message: String,
    },
}

/// Largest upstream answer read (a chat completion is kilobytes; 16 MiB leaves room for long
/// outputs and many choices): a hostile or broken upstream must not fill the agent's memory.
const MAX_RESPONSE_BYTES: usize = 16 << 20;

/// The HTTP client for upstream requests.
#[derive(Clone, Debug)]
pub(crate) struct Upstream {
    client: std::sync::Arc<crate::trust::TrustingClient>,
    /// `--egress-deny-cidrs`, for URLs that name an address.
    deny: AddressDenyList,
}

/// The resolver's error for an upstream whose name resolves only into denied ranges.
const DENIED_BY_NAME: &str = "the upstream's name resolves only to addresses the agent does not connect to \
     (--egress-deny-cidrs: link-local, cloud metadata and 0.0.0.0/8 always, loopback in a pod)";

impl Upstream {
    /// A client with these time limits.
    pub(crate) fn new(timeouts: UpstreamTimeouts, deny: &AddressDenyList) -> Result<Self, UpstreamError> {
        // reqwest is built with rustls and no provider (rmcp's feature): install ring first.
        crate::install_crypto_provider();
        let policy = deny.clone();
        let client = crate::trust::TrustingClient::new(move |builder| {
            let builder = builder
                .connect_timeout(timeouts.connect)
                .timeout(timeouts.request)
                // No redirects: the request carries the model key, and a POST API has no reason to
                // move; a 3xx goes back to the caller like any other upstream status.
                .redirect(reqwest::redirect::Policy::none());
            policy.apply(builder, DENIED_BY_NAME)
        });
        client.get().map_err(|message| UpstreamError::Client { message })?;
        Ok(Upstream { client: std::sync::Arc::new(client), deny: deny.clone() })
    }

    /// POSTs `body` to `target` and reads the completion.
    pub(crate) async fn complete(&self, target: &Target, body: &ChatRequest) -> Result<ChatCompletion, UpstreamError> {
        if self.deny.denies_literal(&target.url) {
            return Err(UpstreamError::Denied { url: target.url.clone() });
        }
        // Serializing these types cannot fail (string keys, no non-finite floats from JSON input).
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        let client = self.client.get().map_err(|message| UpstreamError::Client { message })?;
        let mut request = client
            .post(&target.url)
            .header(header::CONTENT_TYPE, "application/json")
            .header(header::ACCEPT, "application/json")
            .body(bytes);
        if let Some(auth) = target.credential.header() {
            request = request.header(header::AUTHORIZATION, auth);
        }
        let unreachable = |source: reqwest::Error| {
            // The resolver refusing every address of the name: the deny list, not the network.
            if crate::telemetry::error_chain(&source).contains(crate::egress::DENIED) {
                return UpstreamError::Denied { url: target.url.clone() };
            }
            UpstreamError::Unreachable { url: target.url.clone(), source: source.without_url() }
        };
        let mut response = request.send().await.map_err(unreachable)?;
        let status = response.status();
        let content_type = response.headers().get(header::CONTENT_TYPE).cloned();
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(unreachable)? {
            if body.len() + chunk.len() > MAX_RESPONSE_BYTES {
                return Err(UpstreamError::InvalidResponse {
                    url: target.url.clone(),
                    message: format!("the answer is larger than {MAX_RESPONSE_BYTES} bytes"),
                });
            }
            body.extend_from_slice(&chunk);
        }
        let body = Bytes::from(body);
        if !status.is_success() {
            tracing::info!(url = %target.url, %status, "upstream answered with an error; passed back to the caller");
            return Err(UpstreamError::Status { status, body, content_type });
        }
        serde_json::from_slice(&body)
            .map_err(|e| UpstreamError::InvalidResponse { url: target.url.clone(), message: e.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(url: &str, model: Option<&str>) -> UpstreamSpec {
        UpstreamSpec { url: url.into(), api_key_secret_ref: None, model: model.map(str::to_string) }
    }

    fn caller(auth: &str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::AUTHORIZATION, HeaderValue::from_str(auth).expect("valid header"));
        headers
    }

    #[test]
    fn the_flag_url_wins_over_the_profile_and_the_path_is_appended_once() {
        let over = UpstreamOverride { url: Some("http://flag/v1/".into()), api_key: None, api_key_env: None };
        let profile = spec("https://api.openai.com/v1", Some("gpt"));
        let t = resolve(&over, None, Some(&profile), "p", &HeaderMap::new()).expect("resolves");
        assert_eq!(t.url, "http://flag/v1/chat/completions");
        assert_eq!(t.default_model.as_deref(), Some("gpt"));
        let t = resolve(&UpstreamOverride::default(), None, Some(&profile), "p", &HeaderMap::new()).expect("ok");
        assert_eq!(t.url, "https://api.openai.com/v1/chat/completions");
    }

    #[test]
    fn no_url_anywhere_is_no_upstream() {
        let e = resolve(&UpstreamOverride::default(), Some("k"), None, "p", &HeaderMap::new()).expect_err("none");
        assert!(matches!(e, ChatError::NoUpstream { .. }));
    }

    #[test]
    fn key_precedence_is_flag_then_env_then_caller() {
        let profile = spec("http://u", None);
        let over = UpstreamOverride { url: None, api_key: Some("flag".into()), api_key_env: None };
        let t = resolve(&over, Some("env"), Some(&profile), "p", &caller("Bearer c")).expect("ok");
        assert_eq!(t.credential, Credential::ApiKey("flag".into()));
        let t =
            resolve(&UpstreamOverride::default(), Some("env"), Some(&profile), "p", &caller("Bearer c")).expect("ok");
        assert_eq!(t.credential, Credential::ApiKey("env".into()));
        let t = resolve(&UpstreamOverride::default(), None, Some(&profile), "p", &caller("Bearer c")).expect("ok");
        assert_eq!(t.credential, Credential::Caller(HeaderValue::from_static("Bearer c")));
        assert_eq!(t.credential.header(), Some(HeaderValue::from_static("Bearer c")));
        let t = resolve(&UpstreamOverride::default(), None, Some(&profile), "p", &HeaderMap::new()).expect("ok");
        assert_eq!(t.credential, Credential::None);
    }

    #[test]
    fn keys_never_show_in_debug_output() {
        let over = UpstreamOverride { url: None, api_key: Some("sk-secret".into()), api_key_env: None };
        assert!(!format!("{over:?}").contains("sk-secret"));
        assert!(!format!("{:?}", Credential::ApiKey("sk-secret".into())).contains("sk-secret"));
        let target =
            Target { url: "u".into(), credential: Credential::ApiKey("sk-secret".into()), default_model: None };
        assert!(!format!("{target:?}").contains("sk-secret"));
    }

    /// The model key is never sent where the deny list says not to: a literal address, and a
    /// name that resolves only into a denied range, are both `upstream_denied`, nothing dialled.
    #[tokio::test]
    async fn an_upstream_in_a_denied_range_is_never_dialled() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("addr").port();
        let deny: AddressDenyList = "127.0.0.0/8,::1/128".parse().expect("valid");
        let upstream = Upstream::new(UpstreamTimeouts::default(), &deny).expect("client");
        let body: ChatRequest = serde_json::from_value(serde_json::json!({"messages": []})).expect("request");
        for url in [
            format!("http://127.0.0.1:{port}/v1/chat/completions"),
            format!("http://localhost:{port}/v1/chat/completions"),
        ] {
            let target =
                Target { url: url.clone(), credential: Credential::ApiKey("sk-secret".into()), default_model: None };
            let error = upstream.complete(&target, &body).await.expect_err("denied");
            assert!(matches!(error, UpstreamError::Denied { .. }), "{url}: {error}");
        }
        assert!(listener.accept().is_err(), "no connection reached the listener");
    }
}
