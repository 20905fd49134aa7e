use super::*;
use crate::testing::fixtures::NO_ARGS;

fn at(second: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(second).expect("a valid timestamp"))
}

/// `at(second)` plus half a second, as a clock reads it.
fn at_fraction(second: i64) -> Time {
    let nanos = second as i128 * 1_000_000_000 + 500_000_000;
    Time(k8s_openapi::jiff::Timestamp::from_nanosecond(nanos).expect("a valid timestamp"))
}

/// A stdio server at generation 1, every tool allowed.
fn stdio(name: &str) -> McpServer {
    McpServer::test(name).stdio("npx", NO_ARGS).allowing(["*"]).generation(1)
}

/// An http server at generation 2 allowing `search*`.
fn http(name: &str) -> McpServer {
    McpServer::test(name).http("https://mcp.example.com/mcp").allowing(["search*"]).generation(2)
}

fn succeeded(second: i64, tools: &[&str]) -> ProbeOutcome {
    ProbeOutcome {
        time: at_fraction(second),
        result: ProbeResult::Succeeded {
            tools: tools.iter().map(|t| t.to_string()).collect(),
            digests: tools.iter().map(|t| (t.to_string(), crate::policy::pin::digest(&ToolInfo::named(t)))).collect(),
            server_info: Some(ServerInfo {
                name: Some("web".into()),
                version: Some("1.2.3".into()),
                instructions: None,
                ..Default::default()
            }),
            cut: None,
        },
    }
}

fn failed(second: i64, error: &str) -> ProbeOutcome {
    ProbeOutcome { time: at(second), result: ProbeResult::Failed { error: error.into() } }
}

fn get<'a>(conditions: &'a [Condition], type_: &str) -> &'a Condition {
    conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_} condition"))
}

/// The status as the API server hands it back: through JSON.
fn stored<T: serde::Serialize + serde::de::DeserializeOwned>(status: &T) -> T {
    serde_json::from_value(serde_json::to_value(status).expect("serializes")).expect("parses")
}

// === McpServer ===

#[test]
fn stdio_server_is_accepted_and_not_probed() {
    let status = server_status(&stdio("fs"), None, at(100));
    assert_eq!(status.observed_generation, Some(1));
    let accepted = get(&status.conditions, types::ACCEPTED);
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("True", reasons::VALID));
    assert_eq!(accepted.observed_generation, Some(1));
    let ready = get(&status.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("Unknown", reasons::RUNS_AS_SIDECAR));
    assert!(status.tools.is_empty() && status.tool_count.is_none() && status.last_probe_time.is_none());
}

#[test]
fn invalid_server_names_the_field_and_the_fix() {
    let mut s = stdio("fs");
    s.spec.allowed_tools = vec!["[a-z]*".into()];
    s.spec.budgets = Some(crate::api::ServerBudgets { max_concurrency: Some(0), ..Default::default() });
    let status = server_status(&s, None, at(100));
    let accepted = get(&status.conditions, types::ACCEPTED);
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", reasons::INVALID));
    assert!(accepted.message.contains("spec.allowedTools[0]: "), "{}", accepted.message);
    assert!(accepted.message.contains("spec.budgets.maxConcurrency: 0 is out of range (use a value from"));
}

#[test]
fn many_problems_are_counted_not_listed() {
    let mut s = stdio("fs");
    s.spec.allowed_tools = (0..8).map(|i| format!("[{i}]")).collect();
    let status = server_status(&s, None, at(100));
    let message = &get(&status.conditions, types::ACCEPTED).message;
    assert!(message.ends_with("; and 3 more"), "{message}");
}

#[test]
fn http_probe_success_fills_the_status() {
    let status = server_status(&http("web"), Some(&succeeded(200, &["search", "fetch", "search"])), at_fraction(201));
    let ready = get(&status.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("True", reasons::PROBE_SUCCEEDED));
    assert_eq!(ready.last_transition_time, at(201), "times are whole seconds");
    assert_eq!(status.tools, ["fetch", "search"]);
    assert_eq!(status.tool_count, Some(2));
    assert_eq!(status.server_info.as_ref().and_then(|i| i.version.as_deref()), Some("1.2.3"));
    assert_eq!(status.last_probe_time, Some(at(200)));
    assert!(status.last_error.is_none());
}

#[test]
fn status_tools_are_capped_and_counted() {
    let tools: Vec<String> = (0..300).map(|i| format!("tool{i:03}")).collect();
    let refs: Vec<&str> = tools.iter().map(String::as_str).collect();
    let status = server_status(&http("web"), Some(&succeeded(200, &refs)), at(201));
    assert_eq!(status.tools.len(), MAX_STATUS_TOOLS);
    assert_eq!(status.tool_count, Some(300));
}

#[test]
fn http_probe_failure_reports_the_error() {
    let status = server_status(&http("web"), Some(&failed(300, "connection refused")), at(301));
    let ready = get(&status.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reasons::PROBE_FAILED));
    assert_eq!(ready.message, "connection refused");
    assert_eq!(status.last_error.as_deref(), Some("connection refused"));
    assert_eq!(status.last_probe_time, Some(at(300)));
    assert!(status.tools.is_empty());

    let long = "x".repeat(5000);
    let status = server_status(&http("web"), Some(&failed(300, &long)), at(301));
    let error = status.last_error.unwrap_or_default();
    assert!(error.len() <= MAX_ERROR_BYTES && error.ends_with('…'));
}

#[test]
fn unchanged_server_gives_an_identical_status() {
    let mut s = http("web");
    let probe = succeeded(200, &["search"]);
    let first = server_status(&s, Some(&probe), at_fraction(201));
    s.status = Some(stored(&first));
    let second = server_status(&s, Some(&probe), at(500));
    assert_eq!(Some(&second), s.status.as_ref());
}

#[test]
fn transition_time_moves_only_when_the_status_flips() {
    let mut s = http("web");
    s.status = Some(server_status(&s, Some(&succeeded(200, &["search"])), at(201)));
    // Still True, other tools: the transition time stays.
    let again = server_status(&s, Some(&succeeded(300, &["search", "fetch"])), at(301));
    assert_eq!(get(&again.conditions, types::READY).last_transition_time, at(201));
    // False now: it moves.
    s.status = Some(again);
    let down = server_status(&s, Some(&failed(400, "timeout")), at(401));
    assert_eq!(get(&down.conditions, types::READY).last_transition_time, at(401));
    assert_eq!(get(&down.conditions, types::ACCEPTED).last_transition_time, at(201));
}

#[test]
fn a_reconcile_without_probe_keeps_the_last_probe_until_the_spec_changes() {
    let mut s = http("web");
    s.status = Some(server_status(&s, Some(&succeeded(200, &["search"])), at(201)));
    let kept = server_status(&s, None, at(300));
    assert_eq!(Some(&kept), s.status.as_ref());

    s.metadata.generation = Some(3);
    let pending = server_status(&s, None, at(400));
    let ready = get(&pending.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("Unknown", REASON_PROBE_PENDING));
    assert!(pending.tools.is_empty() && pending.last_probe_time.is_none());
    assert_eq!(pending.observed_generation, Some(3));
}

// === McpProfile ===

/// The profile `dev` in `team-a` at generation 4, allowing `servers`.
fn profile(servers: &[&str]) -> McpProfile {
    McpProfile::test("dev").servers(servers).in_namespace("team-a").generation(4)
}

fn known(entries: &[(&str, &[&str])]) -> BTreeMap<String, Vec<String>> {
    entries.iter().map(|(s, tools)| (s.to_string(), tools.iter().map(|t| t.to_string()).collect())).collect()
}

#[test]
fn profile_with_all_servers_resolves_and_previews_tools() {
    let servers = [http("web"), stdio("fs")];
    let tools = known(&[("web", &["search", "search_news", "delete"])]);
    let status = profile_status(&profile(&["web", "fs"]), &servers, &tools, at(100));
    assert_eq!(status.observed_generation, Some(4));
    assert_eq!(get(&status.conditions, types::ACCEPTED).status, "True");
    let refs = get(&status.conditions, types::RESOLVED_REFS);
    assert_eq!((refs.status.as_str(), refs.reason.as_str()), ("True", reasons::RESOLVED));
    assert_eq!(status.resolved_servers, ["fs", "web"]);
    assert!(status.missing_servers.is_empty());
    // `delete` is not in web's allowedTools; fs's tools are unknown.
    assert_eq!(status.tool_preview, ["mcp__web__search", "mcp__web__search_news"]);
}

#[test]
fn profile_preview_applies_the_profiles_own_lists() {
    let servers = [http("web")];
    let p = profile(&["web"]).tool_denylist(["*news"]).default_servers(NO_ARGS);
    let status = profile_status(&p, &servers, &known(&[("web", &["search", "search_news"])]), at(100));
    // Defaults do not narrow the preview: a request may name any allowed server.
    assert_eq!(status.tool_preview, ["mcp__web__search"]);
}

#[test]
fn a_profile_that_offers_no_tool_says_so_and_why() {
    let offered = |p: &McpProfile, servers: &[McpServer], tools: &BTreeMap<String, Vec<String>>| {
        let status = profile_status(p, servers, tools, at(100));
        let c = get(&status.conditions, types::TOOLS_OFFERED).clone();
        (c.status, c.reason, c.message)
    };
    let web = known(&[("web", &["search"])]);
    let (status, reason, _) = offered(&profile(&["web"]), &[http("web")], &web);
    assert_eq!((status.as_str(), reason.as_str()), ("True", reasons::TOOLS_OFFERED));
    let (status, reason, message) = offered(&profile(&["web"]).default_servers(NO_ARGS), &[http("web")], &web);
    assert_eq!((status.as_str(), reason.as_str()), ("False", reasons::DEFAULT_SERVERS_EMPTY));
    assert!(message.contains("spec.defaultServers is []"), "{message}");
    let (status, reason, _) = offered(&profile(&["web"]).tool_denylist(["*"]), &[http("web")], &web);
    assert_eq!((status.as_str(), reason.as_str()), ("False", reasons::NO_TOOLS_ALLOWED));
    let (status, reason, _) = offered(&profile(&["gone"]), &[http("web")], &web);
    assert_eq!((status.as_str(), reason.as_str()), ("False", reasons::NO_SERVERS));
    let (status, reason, _) = offered(&profile(&["fs"]), &[stdio("fs")], &BTreeMap::new());
    assert_eq!((status.as_str(), reason.as_str()), ("Unknown", reasons::TOOLS_UNKNOWN));
}

#[test]
fn missing_servers_are_listed_and_reported() {
    let status = profile_status(&profile(&["web", "gone", "also-gone"]), &[http("web")], &BTreeMap::new(), at(100));
    let refs = get(&status.conditions, types::RESOLVED_REFS);
    assert_eq!((refs.status.as_str(), refs.reason.as_str()), ("False", reasons::MISSING_SERVERS));
    assert!(refs.message.contains("also-gone, gone") && refs.message.contains("team-a"), "{}", refs.message);
    assert_eq!(status.resolved_servers, ["web"]);
    assert_eq!(status.missing_servers, ["also-gone", "gone"]);
    assert!(status.tool_preview.is_empty());
}

#[test]
fn selector_adds_matching_servers() {
    let labelled = http("search").label("tier", "public");
    let p = profile(&[]).selecting("tier", "public");
    let status = profile_status(&p, &[labelled, http("web")], &known(&[("search", &["search"])]), at(100));
    assert_eq!(status.resolved_servers, ["search"]);
    assert!(status.missing_servers.is_empty());
    assert_eq!(status.tool_preview, ["mcp__search__search"]);
}

#[test]
fn invalid_profile_is_not_accepted() {
    let status = profile_status(&profile(&[]), &[], &BTreeMap::new(), at(100));
    let accepted = get(&status.conditions, types::ACCEPTED);
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", reasons::INVALID));
    assert!(accepted.message.starts_with("spec.servers: the profile allows no server ("), "{}", accepted.message);
}

#[test]
fn unchanged_profile_gives_an_identical_status() {
    let servers = [http("web")];
    let tools = known(&[("web", &["search"])]);
    let mut p = profile(&["web", "gone"]);
    p.status = Some(stored(&profile_status(&p, &servers, &tools, at_fraction(100))));
    let again = profile_status(&p, &servers, &tools, at(900));
    assert_eq!(Some(&again), p.status.as_ref());
    // The missing server appears: ResolvedRefs flips and only its time moves.
    let servers = [http("web"), http("gone")];
    let fixed = profile_status(&p, &servers, &tools, at(1000));
    assert_eq!(get(&fixed.conditions, types::RESOLVED_REFS).last_transition_time, at(1000));
    assert_eq!(get(&fixed.conditions, types::ACCEPTED).last_transition_time, at(100));
}

#[test]
fn truncation_respects_character_boundaries() {
    assert_eq!(truncate("short", 10), "short");
    let cut = truncate("ééééé", 6);
    assert!(cut.len() <= 6 && cut.ends_with('…'), "{cut}");
}

#[test]
fn known_tools_come_from_probed_servers_status() {
    let mut web = http("web");
    web.status = Some(server_status(&web, Some(&succeeded(200, &["search"])), at(201)));
    let mut down = http("down");
    down.status = Some(server_status(&down, Some(&failed(200, "refused")), at(201)));
    let fs = stdio("fs");
    assert_eq!(known_tools(&[web, down, fs]), known(&[("web", &["search"])]));
}

#[test]
fn an_invalid_http_server_is_not_probed_and_says_why() {
    let mut server = http("web").http("https://user:pw@mcp.example.com/mcp");
    let status = server_status(&server, None, at(100));
    assert_eq!(get(&status.conditions, types::ACCEPTED).status, "False");
    let ready = get(&status.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("Unknown", REASON_PROBE_PENDING));
    assert!(ready.message.contains("spec is invalid"), "{}", ready.message);
    server.status = Some(stored(&status));
    assert_eq!(Some(&server_status(&server, None, at(200))), server.status.as_ref(), "stable while unchanged");
}

#[test]
fn a_secret_that_does_not_allow_the_server_shows_as_ref_not_permitted() {
    use crate::api::secret_grant::SecretGrants;
    let server = http("web").secret_header("Authorization", "creds", "token");
    let mut status = server_status(&server, None, at(100));
    let refusals = SecretGrants::default().server_refusals(&server);
    fold_secret_refusals(&mut status.conditions, &[], true, &refusals, Some(1), at(100));
    let refs = status.conditions.iter().find(|c| c.type_ == types::RESOLVED_REFS).expect("ResolvedRefs");
    assert_eq!((refs.status.as_str(), refs.reason.as_str()), (FALSE, reasons::REF_NOT_PERMITTED));
    assert!(
        refs.message.contains("\"creds\"") && refs.message.contains("mcp.spear.dev/allowed-servers"),
        "{}",
        refs.message
    );

    let granted = SecretGrants::allow_all(["creds"]).server_refusals(&server);
    let mut status = server_status(&server, None, at(200));
    fold_secret_refusals(&mut status.conditions, &[], true, &granted, Some(1), at(200));
    let refs = status.conditions.iter().find(|c| c.type_ == types::RESOLVED_REFS).expect("ResolvedRefs");
    assert_eq!(refs.status, TRUE);

    // A profile already missing servers keeps that reason and gains the refusal.
    let mut missing = profile_status(&profile(&["gone"]), &[], &BTreeMap::new(), at(100));
    let refusal =
        SecretGrants::default().profile_refusals(&profile(&["gone"]).upstream_key("key", "k")).pop().expect("refused");
    fold_secret_refusals(&mut missing.conditions, &[], true, &[refusal], Some(1), at(100));
    let refs = missing.conditions.iter().find(|c| c.type_ == types::RESOLVED_REFS).expect("ResolvedRefs");
    assert_eq!(refs.reason, reasons::MISSING_SERVERS);
    assert!(refs.message.contains("gone") && refs.message.contains("\"key\""), "{}", refs.message);
}

#[test]
fn a_server_requiring_authorization_is_auth_required_false_without_auth_unknown_with_it() {
    let asked = ProbeOutcome {
        time: at(100),
        result: ProbeResult::AuthRequired { asked: "scopes mcp:tools, protected-resource metadata advertised".into() },
    };
    let bare = server_status(&http("web"), Some(&asked), at(100));
    let ready = get(&bare.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("False", reasons::AUTH_REQUIRED));
    assert!(
        ready.message.contains("scopes mcp:tools") && ready.message.contains("set spec.http.auth"),
        "{}",
        ready.message
    );

    let auth = crate::api::HttpAuth {
        service_account_token: Some(crate::api::ServiceAccountTokenAuth {
            audience: "a".into(),
            expiration_seconds: None,
        }),
        ..Default::default()
    };
    let configured = server_status(&http("web").auth(auth), Some(&asked), at(100));
    let ready = get(&configured.conditions, types::READY);
    assert_eq!((ready.status.as_str(), ready.reason.as_str()), ("Unknown", reasons::AUTH_REQUIRED));
    assert!(ready.message.contains("service-account token"), "{}", ready.message);
    assert_eq!(configured.last_error.as_deref(), Some(ready.message.as_str()));
}

/// A probed server with `spec.pinning`: `ToolsPinned` names the served tools that differ from
/// their pins or have none (a tool `allowedTools` does not serve is not named), and a reconcile
/// without a probe keeps it.
#[test]
fn tools_pinned_names_the_served_tools_that_differ_from_their_pins() {
    use crate::api::PinMode;
    use crate::api::pinning::format_digest;
    fn pin(name: &'static str, description: Option<&str>) -> (&'static str, String) {
        let tool = ToolInfo { description: description.map(Into::into), ..ToolInfo::named(name) };
        (name, format_digest(&crate::policy::pin::digest(&tool)))
    }
    let pins = [pin("search", None), pin("search_news", Some("reviewed"))];
    let mut server = http("web").pinning(PinMode::Enforce, pins.clone());
    let probe = succeeded(100, &["search", "search_news", "search_all", "delete"]);
    let status = server_status(&server, Some(&probe), at(100));
    let pinned = get(&status.conditions, types::TOOLS_PINNED);
    assert_eq!((pinned.status.as_str(), pinned.reason.as_str()), (FALSE, reasons::PIN_MISMATCH));
    assert!(pinned.message.contains("search_news (pin_mismatch)"), "{}", pinned.message);
    assert!(pinned.message.contains("search_all (not_pinned)"), "{}", pinned.message);
    assert!(
        !pinned.message.contains("delete") && pinned.message.contains("agents withhold them"),
        "{}",
        pinned.message
    );

    server.status = Some(stored(&status));
    let again = server_status(&server, None, at(200));
    assert_eq!(get(&again.conditions, types::TOOLS_PINNED), pinned, "kept without a probe");

    let matching = http("web").pinning(PinMode::Warn, [pin("search", None)]);
    let status = server_status(&matching, Some(&succeeded(100, &["search"])), at(100));
    assert_eq!(get(&status.conditions, types::TOOLS_PINNED).status, TRUE);

    let unpinned = server_status(&http("web"), Some(&succeeded(100, &["search"])), at(100));
    assert!(unpinned.conditions.iter().all(|c| c.type_ != types::TOOLS_PINNED));
}

#[test]
fn grant_ready_says_whether_a_person_must_log_in_from_the_secrets_annotations_only() {
    use crate::mcp::oauth::grant_secret::{self, GrantPresence};
    let mut server: McpServer = serde_json::from_value(serde_json::json!({
        "apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer",
        "metadata": {"name": "github", "namespace": "team-a", "generation": 3},
        "spec": {"transport": "streamableHttp", "http": {"url": "https://mcp.example.com/mcp", "auth": {
            "issuer": "https://as.example.com",
            "authorizationCode": {"tokenSecretRef": {"name": "gh-grant"}}}}}
    }))
    .expect("server");
    let grant_of = |status: &McpServerStatus| status.conditions.iter().find(|c| c.type_ == types::GRANT_READY).cloned();

    let mut status = server_status(&server, None, at(100));
    fold_grant(&mut status.conditions, &[], &server, GrantPresence::Missing, at(100));
    let missing = grant_of(&status).expect("GrantReady");
    assert_eq!((missing.status.as_str(), missing.reason.as_str()), (FALSE, reasons::NO_GRANT));
    assert!(missing.message.contains("spearlet auth login --server github -n team-a"), "{}", missing.message);
    assert_eq!(missing.observed_generation, Some(3));

    // Stored, then refused by the authorization server as an agent recorded it.
    let secret = grant_secret::login_secret(
        None,
        "gh-grant",
        "team-a",
        "github",
        &crate::mcp::oauth::grant::tests::sample(),
        1_000,
    )
    .expect("secret");
    let old = status.conditions.clone();
    let mut status = server_status(&server, None, at(200));
    fold_grant(
        &mut status.conditions,
        &old,
        &server,
        grant_secret::presence(secret.metadata.annotations.as_ref()),
        at(200),
    );
    let stored = grant_of(&status).expect("GrantReady");
    assert_eq!((stored.status.as_str(), stored.reason.as_str()), (TRUE, reasons::GRANT_STORED));
    assert!(stored.message.contains("last renewed 1970-01-01T00:16:40Z"), "{}", stored.message);
    let refused =
        grant_secret::login_required(secret, "the authorization server refused the grant (invalid_grant)", 2_000);
    let old = status.conditions.clone();
    let mut status = server_status(&server, None, at(300));
    fold_grant(
        &mut status.conditions,
        &old,
        &server,
        grant_secret::presence(refused.metadata.annotations.as_ref()),
        at(300),
    );
    let login = grant_of(&status).expect("GrantReady");
    assert_eq!((login.status.as_str(), login.reason.as_str()), (FALSE, reasons::LOGIN_REQUIRED));
    assert!(
        login.message.contains("invalid_grant") && login.message.contains("spearlet auth login"),
        "{}",
        login.message
    );
    assert_eq!(login.last_transition_time, at(300), "a new status is a transition");
    let token = crate::mcp::oauth::grant::tests::sample().refresh_token.expect("token");
    assert!(status.conditions.iter().all(|c| !c.message.contains(&token)), "never a token");

    // Servers without a grant Secret get no such condition.
    server
        .spec
        .http
        .as_mut()
        .and_then(|h| h.auth.as_mut())
        .and_then(|a| a.authorization_code.as_mut())
        .expect("ac")
        .token_secret_ref = None;
    let mut status = server_status(&server, None, at(400));
    fold_grant(&mut status.conditions, &[], &server, GrantPresence::Missing, at(400));
    assert!(grant_of(&status).is_none());
}
