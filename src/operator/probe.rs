//! Probing Streamable HTTP McpServers for their status: `initialize` + `tools/list`, on every
//! spec change and then periodically.
//!
//! ```text
//! McpServer ──target (pure)──▶ ProbeTarget { url, literal headers, withheld header names }
//! McpServer + its status + now ──schedule (pure)──▶ Now | After(d) | Never
//! ProbeTarget ──probe (I/O: mcp::connect, tools/list, close)──▶ status::ProbeOutcome
//! ```
//!
//! The operator never reads Secrets, so a probe sends only literal header values and says which it
//! withheld. Anyone who may write an McpServer chooses the URL, so the prober is not their proxy:
//! only McpServers of probed namespaces (`--probe-namespaces`) are probed, and the addresses
//! actually dialled are checked against `--probe-deny-cidrs`. A failing probe backs off by the
//! status alone, so a new leader continues it. Why: `src/operator/README.md`, "Probes".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::status::{ProbeOutcome, ProbeResult};
use crate::api::conditions::types;
use crate::api::env_ref;
use crate::api::pinning::ToolDigest;
use crate::api::{McpServer, McpServerStatus, Transport};
pub use crate::egress::AddressDenyList;
use crate::egress::{DenyingResolver, literal_ip};
use crate::mcp::config::Endpoint;
use crate::mcp::limits::{self, ListLimits};
use crate::mcp::pool::tool_info;
use crate::mcp::{connect, oauth};
use crate::policy::pin;

/// Largest single message accepted from a probed server (rmcp's own line limit, 16 MiB): a
/// tools/list of a big server fits, a runaway stream does not.
const FRAME_LIMIT: usize = rmcp::transport::async_rw::DEFAULT_MAX_LINE_LENGTH;

/// When, where and how long probes run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeConfig {
    /// Between two successful probes (`--probe-interval-seconds`).
    pub interval: Duration,
    /// The first retry after a failure; later ones double up to `interval`.
    pub min_retry: Duration,
    /// One probe (connect, `initialize`, `tools/list`) must finish within this.
    pub timeout: Duration,
    /// Which namespaces' McpServers are probed (`--probe-namespaces`).
    pub namespaces: ProbeNamespaces,
    /// Addresses never dialled (`--probe-deny-cidrs`).
    pub deny: AddressDenyList,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        // 60 s between probes: status is informative, the agent has its own health tracking.
        // 5 s first retry: a server that is starting up turns Ready quickly. 10 s timeout: the
        // pool's connect timeout, enough for a remote server on a slow link.
        ProbeConfig {
            interval: Duration::from_secs(60),
            min_retry: Duration::from_secs(5),
            timeout: Duration::from_secs(10),
            namespaces: ProbeNamespaces::InjectionEnabled,
            deny: AddressDenyList::default(),
        }
    }
}

/// Which namespaces' McpServers the operator probes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum ProbeNamespaces {
    /// Namespaces labelled `mcp.spear.dev/injection=enabled`: where pods can use the servers.
    #[default]
    InjectionEnabled,
    /// Every namespace in scope.
    All,
    /// None: http servers' `Ready` stays `Unknown`.
    None,
}

/// Status message of a probe refused by the deny list. It names neither the address nor the
/// range: the status is read by the URL's author, and which names resolve where is not theirs
/// to learn through the operator.
const DENIED_MESSAGE: &str = "initialize failed: the server's address is in a range the operator does not probe \
     (--probe-deny-cidrs: loopback and link-local by default); probe it from a pod, or ask the \
     operator's owner to allow the range";

/// Status message of an McpServer outside the probed namespaces.
pub(crate) fn skipped_message(namespace: &str, scope: ProbeNamespaces) -> String {
    match scope {
        ProbeNamespaces::None => "not probed: the operator runs with --probe-namespaces=none".to_string(),
        _ => format!(
            "not probed: namespace {namespace} is not labelled mcp.spear.dev/injection=enabled, and the operator \
             probes only servers that pods can use (--probe-namespaces=injection-enabled)"
        ),
    }
}

/// Whether McpServers of a namespace with `injection_enabled` are probed under `scope`.
pub(crate) fn probes_namespace(scope: ProbeNamespaces, injection_enabled: bool) -> bool {
    match scope {
        ProbeNamespaces::InjectionEnabled => injection_enabled,
        ProbeNamespaces::All => true,
        ProbeNamespaces::None => false,
    }
}

/// The probe's HTTP client: the deny list in the resolver, no redirects, no proxy while the
/// list is non-empty, no idle connections kept (a probe is one exchange per minute).
fn http_client(deny: &AddressDenyList, denied: Arc<AtomicBool>) -> Result<reqwest::Client, String> {
    let mut builder = crate::trust::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .pool_max_idle_per_host(0)
        .dns_resolver(Arc::new(DenyingResolver::flagging(deny.clone(), denied, DENIED_MESSAGE)));
    if !deny.is_empty() {
        builder = builder.no_proxy();
    }
    builder.build().map_err(|e| format!("initialize failed: the HTTP client could not be built: {e}"))
}

/// What a probe connects to. `Debug` shows header names only.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct ProbeTarget {
    /// The MCP endpoint.
    pub(crate) url: String,
    /// Headers sent: those whose configured value is a plain literal.
    pub(crate) headers: Vec<(String, String)>,
    /// Names of headers not sent: from a Secret, or referencing the agent's environment.
    pub(crate) withheld: Vec<String>,
    /// Largest reply accepted: the agent's limit for this server (`mcp::limits::frame_limit`).
    pub(crate) frame_limit: usize,
}

impl std::fmt::Debug for ProbeTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProbeTarget")
            .field("url", &self.url)
            .field("headers", &self.headers.iter().map(|(name, _)| name).collect::<Vec<_>>())
            .field("withheld", &self.withheld)
            .finish()
    }
}

/// The probe target of a Streamable HTTP server; `None` for stdio servers (they run as
/// sidecars and are never probed by the operator) and disabled ones (no traffic to a server
/// taken out of use).
pub(crate) fn target(server: &McpServer) -> Option<ProbeTarget> {
    if server.spec.transport != Transport::StreamableHttp || !server.spec.is_enabled() {
        return None;
    }
    let http = server.spec.http.as_ref()?;
    let frame_limit = limits::frame_limit(server.spec.budgets().max_tool_output_bytes(), FRAME_LIMIT);
    let mut target = ProbeTarget { url: http.url.clone(), headers: Vec::new(), withheld: Vec::new(), frame_limit };
    for header in &http.headers {
        let literal = header
            .value
            .as_deref()
            .and_then(|v| env_ref::parse(v).ok())
            .filter(|t| t.references().next().is_none())
            .and_then(|t| t.expand(|_| None).ok());
        match literal {
            Some(value) => target.headers.push((header.name.clone(), value)),
            None => target.withheld.push(header.name.clone()),
        }
    }
    Some(target)
}

/// When to probe next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Schedule {
    /// Now: never probed at this generation, or the next probe is due.
    Now,
    /// After this long.
    After(Duration),
    /// Not at all: a stdio server, or a spec that failed validation.
    Never,
}

/// When `server` should be probed next, given `status` (its current one, or the one just
/// computed) and whether its spec is `valid`. Pure.
pub(crate) fn schedule(
    server: &McpServer,
    status: Option<&McpServerStatus>,
    valid: bool,
    now: &Time,
    config: &ProbeConfig,
) -> Schedule {
    if server.spec.transport != Transport::StreamableHttp || !server.spec.is_enabled() || !valid {
        return Schedule::Never;
    }
    let Some(status) = status.filter(|s| s.observed_generation == server.metadata.generation) else {
        return Schedule::Now;
    };
    let Some(last) = status.last_probe_time.as_ref() else { return Schedule::Now };
    let delay = if status.last_error.is_some() {
        // Failing since the Ready condition turned (False); each retry waits as long again.
        let since = status
            .conditions
            .iter()
            .find(|c| c.type_ == types::READY)
            .map_or(Duration::ZERO, |c| elapsed(last, &c.last_transition_time));
        since.clamp(config.min_retry, config.interval.max(config.min_retry))
    } else {
        config.interval
    };
    let due = elapsed(now, last);
    if due >= delay { Schedule::Now } else { Schedule::After(delay - due) }
}

/// `to - from`, zero when `to` is earlier.
fn elapsed(to: &Time, from: &Time) -> Duration {
    let nanos = to.0.as_nanosecond().saturating_sub(from.0.as_nanosecond());
    Duration::from_nanos(u64::try_from(nanos).unwrap_or(0))
}

/// Probes `target`: connect and `initialize`, then `tools/list` (all pages), then close, all
/// within `timeout`, never dialling an address `deny` refuses. `now` is recorded as the probe
/// time. Errors never contain header values.
#[tracing::instrument(target = "spear_trace", name = "operator.probe", skip_all, fields(server_id = server_id))]
pub(crate) async fn probe(
    server_id: &str,
    target: &ProbeTarget,
    deny: &AddressDenyList,
    timeout: Duration,
    now: Time,
) -> ProbeOutcome {
    crate::install_crypto_provider();
    let failed = |error: String| ProbeOutcome { time: now.clone(), result: ProbeResult::Failed { error } };
    if literal_ip(&target.url).is_some_and(|ip| deny.denies(ip)) {
        return failed(DENIED_MESSAGE.to_string());
    }
    let denied = Arc::new(AtomicBool::new(false));
    let client = match http_client(deny, denied.clone()) {
        Ok(client) => client,
        Err(error) => return failed(error),
    };
    let challenge = connect::ChallengeSlot::default();
    let result = match tokio::time::timeout(timeout, list(server_id, target, client, timeout, &challenge)).await {
        Ok(Ok((tools, digests, server_info, cut))) => {
            ProbeResult::Succeeded { tools, digests, server_info: Some(server_info), cut }
        }
        Ok(Err(_)) if denied.load(Ordering::Acquire) => ProbeResult::Failed { error: DENIED_MESSAGE.to_string() },
        // A 401 to a probe that withheld a Secret's header is that header's absence (below).
        Ok(Err(_)) if challenge.lock().is_some() && target.withheld.is_empty() => {
            let asked = challenge.lock().as_deref().map(oauth::challenge_summary).unwrap_or_default();
            ProbeResult::AuthRequired { asked }
        }
        Ok(Err(error)) => {
            // The raw error may quote the server's answer (rmcp puts an HTTP error's body in
            // it): logged at debug for the operator's owner, never written to the status.
            tracing::debug!(server_id, %error, "probe failed");
            ProbeResult::Failed { error: explain(failure_message(&error), target) }
        }
        Err(_) => ProbeResult::Failed {
            error: explain(format!("no answer to initialize and tools/list within {} ms", timeout.as_millis()), target),
        },
    };
    ProbeOutcome { time: now, result }
}

async fn list(
    server_id: &str,
    target: &ProbeTarget,
    client: reqwest::Client,
    timeout: Duration,
    challenge: &connect::ChallengeSlot,
) -> Result<(Vec<String>, BTreeMap<String, ToolDigest>, crate::api::ServerInfo, Option<String>), String> {
    let endpoint = Endpoint::Http { url: target.url.clone(), headers: target.headers.clone(), auth: None };
    let id: Arc<str> = Arc::from(server_id);
    let conn = connect::connect(
        &id,
        &endpoint,
        connect::Watchers::default(),
        target.frame_limit,
        timeout,
        connect::probe_lifecycle(),
        connect::HttpParts {
            client: Some(client),
            auth: None,
            challenge: Some(challenge.clone()),
            deny: AddressDenyList::none(),
        },
    )
    .await
    .map_err(|e| e.message)?;
    let listed = conn.list_tools_capped(&ListLimits::default()).await;
    // Close before looking at the answer: the session is not reused, and a server keeps
    // per-session state until told.
    conn.close().await;
    let (tools, cut, _) = listed.map_err(|e| format!("tools/list failed: {e}"))?;
    let cut = (!cut.is_empty()).then(|| cut.to_string());
    let digests = tools.iter().map(|t| (t.name.to_string(), pin::digest(&tool_info(t)))).collect();
    Ok((tools.into_iter().map(|t| t.name.to_string()).collect(), digests, conn.info.clone(), cut))
}

/// What a failed probe writes to the status: a fixed message per kind of failure, with the HTTP
/// status code when there is one, never the text of the server's answer. The status is read by
/// everyone who may read the McpServer, and the answer is the server's (or whatever the URL
/// points at) to choose: echoing it would make the operator a window onto any URL it can reach.
pub(crate) fn failure_message(raw: &str) -> String {
    let stage = if raw.starts_with("tools/list") { "tools/list" } else { "initialize" };
    if let Some(code) = http_status(raw) {
        return format!("{stage} failed: the server answered HTTP {code}");
    }
    let lower = raw.to_ascii_lowercase();
    let kind = if lower.contains("frame limit")
        || lower.contains("exceeded the maximum size")
        || lower.contains("too large")
    {
        "the server's answer exceeded the size limit"
    } else if lower.contains("connection refused")
        || lower.contains("cannot resolve")
        || lower.contains("closed the connection")
        || lower.contains("tls handshake")
        || lower.contains("error sending request")
        || lower.contains("dns")
        || lower.contains("connect")
    {
        "the server could not be reached"
    } else if lower.contains("content type")
        || lower.contains("deserialize")
        || lower.contains("parse")
        || lower.contains("expected")
    {
        "the answer is not MCP (Streamable HTTP JSON-RPC)"
    } else if lower.contains("timed out") || lower.contains("timeout") || lower.contains("no answer in time") {
        "the server did not answer in time"
    } else {
        "the MCP exchange failed"
    };
    format!("{stage} failed: {kind}")
}

/// The HTTP status code an rmcp error names (`HTTP 401`, `HTTP 503: ...`), if any.
fn http_status(raw: &str) -> Option<u16> {
    raw.match_indices("HTTP ").find_map(|(at, _)| {
        let digits = raw.get(at + 5..at + 8)?;
        let code: u16 = digits.parse().ok()?;
        (100..600).contains(&code).then_some(code)
    })
}

/// The error, plus which headers were withheld when some were (the likely cause).
fn explain(error: String, target: &ProbeTarget) -> String {
    if target.withheld.is_empty() {
        return error;
    }
    format!(
        "{error} (probed without header{} {}: their values come from Secrets or the agent's environment, which the operator does not read)",
        if target.withheld.len() == 1 { "" } else { "s" },
        target.withheld.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::SecretKeySelector;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::{HeaderValueSource, HttpHeader};
    use crate::testing::fixtures::NO_ARGS;

    fn at(second: i64) -> Time {
        Time(Timestamp::from_second(second).expect("a small second count is a valid timestamp"))
    }

    /// `web` at generation 2 with these headers; nothing listens at its URL.
    fn http(headers: Vec<HttpHeader>) -> McpServer {
        let server = McpServer::test("web").http("http://127.0.0.1:1/mcp").generation(2);
        headers.into_iter().fold(server, McpServer::http_header)
    }

    fn header(name: &str, value: Option<&str>, secret: bool) -> HttpHeader {
        HttpHeader {
            name: name.into(),
            value: value.map(str::to_string),
            value_from: secret.then(|| HeaderValueSource { secret_key_ref: SecretKeySelector::default() }),
        }
    }

    fn probed(generation: i64, last: i64, failing_since: Option<i64>) -> McpServerStatus {
        McpServerStatus {
            observed_generation: Some(generation),
            last_probe_time: Some(at(last)),
            last_error: failing_since.map(|_| "refused".to_string()),
            conditions: vec![Condition {
                type_: types::READY.into(),
                status: if failing_since.is_some() { "False" } else { "True" }.into(),
                last_transition_time: at(failing_since.unwrap_or(0)),
                reason: String::new(),
                message: String::new(),
                observed_generation: Some(generation),
            }],
            ..Default::default()
        }
    }

    const CONFIG: ProbeConfig = ProbeConfig {
        interval: Duration::from_secs(60),
        min_retry: Duration::from_secs(5),
        timeout: Duration::ZERO,
        namespaces: ProbeNamespaces::All,
        deny: AddressDenyList::none(),
    };

    #[test]
    fn only_literal_headers_are_sent_and_the_rest_are_named() {
        let server = http(vec![
            header("X-Team", Some("search"), false),
            header("X-Dollar", Some("$${literal}"), false),
            header("Authorization", None, true),
            header("X-Key", Some("Bearer ${ENV:KEY:-none}"), false),
        ]);
        let target = target(&server).expect("an http server has a target");
        assert_eq!(
            target.headers,
            [("X-Team".to_string(), "search".to_string()), ("X-Dollar".into(), "${literal}".into())]
        );
        assert_eq!(target.withheld, ["Authorization", "X-Key"]);
        assert!(!format!("{target:?}").contains("search"), "Debug shows names only: {target:?}");
    }

    #[test]
    fn stdio_servers_have_no_target_and_are_never_probed() {
        let server = McpServer::test("fs").stdio("x", NO_ARGS);
        assert_eq!(target(&server), None);
        assert_eq!(schedule(&server, None, true, &at(100), &CONFIG), Schedule::Never);
    }

    #[test]
    fn a_disabled_server_is_never_probed() {
        let mut server = http(vec![]);
        assert!(target(&server).is_some());
        server.spec.enabled = Some(false);
        assert_eq!(target(&server), None);
        assert_eq!(schedule(&server, None, true, &at(100), &CONFIG), Schedule::Never);
    }

    #[test]
    fn an_invalid_spec_is_never_probed() {
        assert_eq!(schedule(&http(vec![]), None, false, &at(100), &CONFIG), Schedule::Never);
    }

    #[test]
    fn a_new_generation_or_no_probe_yet_probes_now() {
        let server = http(vec![]);
        assert_eq!(schedule(&server, None, true, &at(100), &CONFIG), Schedule::Now);
        assert_eq!(schedule(&server, Some(&probed(1, 99, None)), true, &at(100), &CONFIG), Schedule::Now);
        let mut never = probed(2, 0, None);
        never.last_probe_time = None;
        assert_eq!(schedule(&server, Some(&never), true, &at(100), &CONFIG), Schedule::Now);
    }

    #[test]
    fn a_success_is_probed_again_after_the_interval() {
        let server = http(vec![]);
        let status = probed(2, 100, None);
        assert_eq!(schedule(&server, Some(&status), true, &at(100), &CONFIG), Schedule::After(Duration::from_secs(60)));
        assert_eq!(schedule(&server, Some(&status), true, &at(130), &CONFIG), Schedule::After(Duration::from_secs(30)));
        assert_eq!(schedule(&server, Some(&status), true, &at(160), &CONFIG), Schedule::Now);
    }

    #[test]
    fn failures_back_off_doubling_from_min_retry_up_to_the_interval() {
        let server = http(vec![]);
        let next = |last: i64, since: i64| match schedule(
            &server,
            Some(&probed(2, last, Some(since))),
            true,
            &at(last),
            &CONFIG,
        ) {
            Schedule::After(d) => d.as_secs(),
            other => panic!("expected a delay, got {other:?}"),
        };
        assert_eq!(next(100, 100), 5, "first retry after min_retry");
        assert_eq!(next(105, 100), 5);
        assert_eq!(next(110, 100), 10);
        assert_eq!(next(120, 100), 20);
        assert_eq!(next(140, 100), 40);
        assert_eq!(next(180, 100), 60, "capped at the interval");
        assert_eq!(next(1000, 100), 60);
    }

    /// Whatever the probed URL answers never reaches the status, only a fixed message and the
    /// status code.
    #[test]
    fn a_failure_message_carries_the_status_code_never_the_answer() {
        let body = "HTTP 403: {\"secret\": \"internal metadata s3cr3t\"}";
        assert_eq!(
            failure_message(&format!("initialize failed: {body}")),
            "initialize failed: the server answered HTTP 403"
        );
        for raw in [
            "initialize failed: Transport [rmcp::transport::worker] error: Client error: error sending request for url (http://10.0.0.1/mcp): s3cr3t",
            "initialize failed: Unexpected content type: Some(\"text/html; s3cr3t\")",
            "tools/list failed: Deserialize error: expected value at line 1 column 1 s3cr3t",
            "anything at all: s3cr3t",
        ] {
            let message = failure_message(raw);
            assert!(!message.contains("s3cr3t") && !message.contains("10.0.0.1"), "{raw} -> {message}");
        }
        assert!(failure_message("tools/list failed: oops").starts_with("tools/list failed"));
        // The pool's plain transport errors keep their kind.
        for (raw, kind) in [
            ("initialize failed: connection refused at http://10.0.0.1/mcp: is the server running", "reached"),
            ("initialize failed: cannot resolve the host at http://x.invalid/mcp: check", "reached"),
            ("initialize failed: TLS handshake failed at https://10.0.0.1/mcp (bad cert): check", "reached"),
            ("initialize failed: no answer in time at http://10.0.0.1/mcp: is the address", "in time"),
        ] {
            let message = failure_message(raw);
            assert!(message.ends_with(kind) && !message.contains("10.0.0.1"), "{raw} -> {message}");
        }
    }

    #[test]
    fn a_failure_names_the_withheld_headers() {
        let target =
            ProbeTarget { url: String::new(), headers: vec![], withheld: vec!["Authorization".into()], frame_limit: 1 };
        let message = explain("HTTP 401".into(), &target);
        assert!(message.starts_with("HTTP 401 (probed without header Authorization:"), "{message}");
        let none = ProbeTarget { withheld: vec![], ..target };
        assert_eq!(explain("HTTP 401".into(), &none), "HTTP 401");
    }

    #[test]
    fn the_default_deny_list_covers_loopback_link_local_and_this_host_in_every_spelling() {
        let deny = AddressDenyList::default();
        for denied in
            ["127.0.0.1", "127.255.0.9", "::1", "169.254.169.254", "fe80::1", "0.0.0.0", "::", "::ffff:127.0.0.1"]
        {
            assert!(deny.denies(denied.parse().expect("an address")), "{denied} must be denied");
        }
        for allowed in ["10.0.0.1", "192.168.1.10", "8.8.8.8", "2001:db8::1", "::ffff:10.0.0.1", "169.255.0.1"] {
            assert!(!deny.denies(allowed.parse().expect("an address")), "{allowed} must be allowed");
        }
    }

    #[test]
    fn the_default_deny_list_covers_cloud_metadata_endpoints_outside_link_local() {
        let deny = AddressDenyList::default();
        // AWS IMDS over IPv6 (in fc00::/7, otherwise allowed) and Alibaba Cloud's metadata (in
        // 100.64.0.0/10, otherwise allowed), in their other spellings too.
        for denied in ["fd00:ec2::254", "fd00:0ec2:0:0:0:0:0:0254", "100.100.100.200", "::ffff:100.100.100.200"] {
            assert!(deny.denies(denied.parse().expect("an address")), "{denied} must be denied");
        }
        for allowed in ["fd00:ec2::253", "fd12::1", "100.100.100.201", "100.64.0.1"] {
            assert!(!deny.denies(allowed.parse().expect("an address")), "{allowed} must be allowed");
        }
    }

    #[test]
    fn the_deny_list_flag_takes_cidrs_or_addresses_and_empty_allows_all() {
        let list: AddressDenyList = " 10.0.0.0/8 , 192.168.1.5,, fd00::/8 ".parse().expect("valid");
        assert!(list.denies("10.1.2.3".parse().expect("an address")));
        assert!(list.denies("192.168.1.5".parse().expect("an address")));
        assert!(!list.denies("192.168.1.6".parse().expect("an address")));
        assert!(list.denies("fd12::1".parse().expect("an address")));
        // A host part in a CIDR is forgiven (the range it names is meant).
        let list: AddressDenyList = "10.1.2.3/8".parse().expect("valid");
        assert!(list.denies("10.200.0.1".parse().expect("an address")));
        assert!("".parse::<AddressDenyList>().expect("empty").is_empty());
        let error = "10.0.0.0/8,metadata.internal".parse::<AddressDenyList>().expect_err("a name is not a range");
        let message = error.to_string();
        assert!(message.contains("'metadata.internal' is not an address range"), "{message}");
        assert!(message.contains("empty value"), "{message}");
    }

    #[test]
    fn literal_addresses_are_found_in_urls_and_names_are_left_to_the_resolver() {
        assert_eq!(literal_ip("http://127.0.0.1:80/mcp"), Some("127.0.0.1".parse().expect("an address")));
        assert_eq!(literal_ip("http://[::ffff:169.254.169.254]/mcp"), Some("::ffff:a9fe:a9fe".parse().expect("v6")));
        // The URL parser normalises the forms libc would accept as IPv4.
        assert_eq!(literal_ip("http://2130706433/mcp"), Some("127.0.0.1".parse().expect("an address")));
        assert_eq!(literal_ip("http://0x7f.1/mcp"), Some("127.0.0.1".parse().expect("an address")));
        assert_eq!(literal_ip("http://localhost:8080/mcp"), None);
    }

    #[test]
    fn only_the_configured_namespaces_are_probed() {
        assert!(probes_namespace(ProbeNamespaces::InjectionEnabled, true));
        assert!(!probes_namespace(ProbeNamespaces::InjectionEnabled, false));
        assert!(probes_namespace(ProbeNamespaces::All, false));
        assert!(!probes_namespace(ProbeNamespaces::None, true));
        let message = skipped_message("team-a", ProbeNamespaces::InjectionEnabled);
        assert!(message.contains("namespace team-a is not labelled mcp.spear.dev/injection=enabled"), "{message}");
    }

    /// A listener that counts the connections it accepts (and answers none).
    async fn counting_listener(addr: &str) -> (std::net::SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let listener = tokio::net::TcpListener::bind(addr).await.expect("bind");
        let local = listener.local_addr().expect("address");
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((_stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
            }
        });
        (local, accepted)
    }

    fn plain(url: String) -> ProbeTarget {
        ProbeTarget { url, headers: vec![], withheld: vec![], frame_limit: 1 << 20 }
    }

    #[tokio::test]
    async fn a_probe_never_dials_a_denied_address_by_literal_name_or_mapped_spelling() {
        let (addr, accepted) = counting_listener("127.0.0.1:0").await;
        let port = addr.port();
        let deny = AddressDenyList::default();
        for url in [
            format!("http://127.0.0.1:{port}/mcp"),
            format!("http://localhost:{port}/mcp"),
            format!("http://[::ffff:127.0.0.1]:{port}/mcp"),
            format!("http://2130706433:{port}/mcp"),
        ] {
            let outcome = probe("web", &plain(url.clone()), &deny, Duration::from_secs(5), at(1)).await;
            let ProbeResult::Failed { error } = outcome.result else { panic!("{url}: {outcome:?}") };
            assert_eq!(error, DENIED_MESSAGE, "{url}");
            assert!(!error.contains(&port.to_string()), "{url}: the message must not echo the address");
        }
        assert_eq!(accepted.load(Ordering::SeqCst), 0, "no connection may reach a denied address");
        // The same listener is dialled once the range is allowed: the refusal above was the list's.
        let outcome = probe(
            "web",
            &plain(format!("http://127.0.0.1:{port}/mcp")),
            &AddressDenyList::none(),
            Duration::from_millis(500),
            at(1),
        )
        .await;
        assert!(matches!(outcome.result, ProbeResult::Failed { .. }), "{outcome:?}");
        assert_eq!(accepted.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_server_demanding_authorization_is_reported_as_such_without_its_prose() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Bearer error=\"invalid_token\", error_description=\"call +1 555 now\", scope=\"mcp:tools\", resource_metadata=\"http://x/.well-known/oauth-protected-resource\"\r\ncontent-length: 0\r\n\r\n",
                    )
                    .await;
            }
        });
        let outcome =
            probe("web", &plain(format!("http://{addr}/mcp")), &AddressDenyList::none(), Duration::from_secs(5), at(1))
                .await;
        let ProbeResult::AuthRequired { asked } = outcome.result else { panic!("{outcome:?}") };
        assert_eq!(asked, "scopes mcp:tools, protected-resource metadata advertised, error invalid_token");
        // With a withheld Secret header, the 401 is that header's absence: a plain failure.
        let withheld = ProbeTarget { withheld: vec!["Authorization".into()], ..plain(format!("http://{addr}/mcp")) };
        let outcome = probe("web", &withheld, &AddressDenyList::none(), Duration::from_secs(5), at(1)).await;
        assert!(matches!(outcome.result, ProbeResult::Failed { .. }), "{outcome:?}");
    }

    #[tokio::test]
    async fn a_probe_does_not_follow_a_redirect_into_a_denied_range() {
        // An allowed address (the list denies another range) answering 307 to the metadata address.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("address");
        let redirects = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = redirects.clone();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut stream, _)) = listener.accept().await {
                count.fetch_add(1, Ordering::SeqCst);
                let mut buf = [0u8; 4096];
                let _ = stream.read(&mut buf).await;
                let _ = stream
                    .write_all(
                        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://169.254.169.254/mcp\r\ncontent-length: 0\r\n\r\n",
                    )
                    .await;
            }
        });
        let deny: AddressDenyList = "169.254.0.0/16".parse().expect("valid");
        let outcome = probe("web", &plain(format!("http://{addr}/mcp")), &deny, Duration::from_secs(5), at(1)).await;
        let ProbeResult::Failed { error } = outcome.result else { panic!("{outcome:?}") };
        assert!(error.contains("HTTP 307"), "a redirect is an answer, not a hop: {error}");
        assert_eq!(redirects.load(Ordering::SeqCst), 1, "one request: the redirect was not followed");
    }
}
