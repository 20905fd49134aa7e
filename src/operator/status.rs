//! Status of McpServer and McpProfile, computed as pure functions (the time is a parameter), so
//! every condition is unit-tested without an API server or a clock.
//!
//! ```text
//! McpServer (spec + previous status) + probe outcome + now ──server_status──▶ McpServerStatus
//!     Accepted ← validate()        Ready ← stdio: Unknown/RunsAsSidecar · http: the probe
//!     ToolsPinned ← http with spec.pinning: the probe's tool digests against the pins
//! McpProfile (spec + previous status) + namespace's McpServers + known tool names + now
//!     ──profile_status──▶ McpProfileStatus
//!     Accepted ← validate()        ResolvedRefs ← spec.servers all exist
//!     resolvedServers, missingServers, toolPreview ← policy::CompiledProfile over a Snapshot
//! ```
//!
//! The previous status comes from the object itself. A condition keeps its `lastTransitionTime`
//! while its `status` stays the same, and every time is cut to whole seconds (what
//! `metav1.Time` keeps on the wire), so reconciling an unchanged object yields a status equal
//! to the stored one and the controller skips the write.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

use crate::api::PinMode;
use crate::api::conditions::{reasons, types};
use crate::api::manifest::Object;
use crate::api::pinning::ToolDigest;
use crate::api::{
    MAX_STATUS_TOOLS, McpProfile, McpProfileStatus, McpServer, McpServerStatus, ServerInfo, Transport, Validate,
    ValidationError,
};
use crate::mcp::oauth::grant_secret::GrantPresence;
use crate::policy::pin;
use crate::policy::{CompiledProfile, RequestScope, ServerTools, ToolInfo, ToolList};
use crate::registry::snapshot::{Entry, Snapshot};

/// Reason of `Ready=Unknown` for an http server not probed yet at this generation.
// Belongs in `api::conditions::reasons`; kept here until that file's owner moves it.
pub(crate) const REASON_PROBE_PENDING: &str = "ProbePending";
/// Problems spelled out in an `Accepted=False` message; the rest are counted.
const MAX_PROBLEMS_IN_MESSAGE: usize = 5;
/// Longest condition message (the `metav1.Condition` schema's limit).
const MAX_MESSAGE_BYTES: usize = 32_768;
/// Longest `lastError`: enough for any transport error, short enough for `kubectl describe`.
const MAX_ERROR_BYTES: usize = 1024;

/// Condition status values.
const TRUE: &str = "True";
const FALSE: &str = "False";
const UNKNOWN: &str = "Unknown";

/// The result of one probe of a Streamable HTTP server (`initialize` + `tools/list`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ProbeOutcome {
    /// When the probe ran.
    pub(crate) time: Time,
    pub(crate) result: ProbeResult,
}

/// What a probe found.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ProbeResult {
    /// The server answered.
    Succeeded {
        /// Tool names from `tools/list` (any order, duplicates allowed).
        tools: Vec<String>,
        /// Each listed tool's pin digest (`policy::pin::digest`), for `ToolsPinned`.
        digests: BTreeMap<String, ToolDigest>,
        /// What `initialize` said.
        server_info: Option<ServerInfo>,
        /// What the list caps cut (`mcp::limits`), if anything.
        cut: Option<String>,
    },
    Failed {
        /// Why. The prober must have removed secret values (header values, URL credentials);
        /// this is written to the status as given.
        error: String,
    },
    /// The server answered 401: it requires authorization, which the operator never holds.
    AuthRequired {
        /// What its challenge asked for (`mcp::oauth::challenge_summary`: no server prose).
        asked: String,
    },
    /// Not probed, by the operator's configuration (`--probe-namespaces`): the earlier results
    /// are dropped, since they may be from before the namespace left the probed ones.
    Skipped {
        /// Why, as written to `Ready`'s message.
        message: String,
    },
}

/// The status of `server`: `Accepted` from validation and, for an http server, `Ready` and the
/// probe fields from `probe`. Without a probe, the previous probe results are kept while the
/// generation is unchanged (a reconcile that did not probe must not erase them); after a spec
/// change `Ready` is `Unknown` until the next probe, and while the spec is invalid (never probed).
pub(crate) fn server_status(server: &McpServer, probe: Option<&ProbeOutcome>, now: Time) -> McpServerStatus {
    let now = whole_seconds(&now);
    let generation = server.metadata.generation;
    let old = server.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let cond = |type_: &str, status: &str, reason: &str, message: String| {
        condition(old, type_, status, reason, message, generation, &now)
    };

    let mut status = McpServerStatus { observed_generation: generation, ..McpServerStatus::default() };
    let problems = server.validate();
    status.conditions.push(accepted(&problems, old, generation, &now));
    match server.spec.transport {
        _ if !server.spec.is_enabled() => status.conditions.push(cond(
            types::READY,
            FALSE,
            reasons::DISABLED,
            "spec.enabled is false: no agent lists its tools and new pods get no sidecar for it".into(),
        )),
        Transport::Stdio => status.conditions.push(cond(
            types::READY,
            UNKNOWN,
            reasons::RUNS_AS_SIDECAR,
            "stdio servers run as a sidecar in each pod that uses them; the operator does not probe them".into(),
        )),
        Transport::StreamableHttp => probed_fields(&mut status, server, probe, problems.is_empty(), cond),
    }
    status
}

/// `Ready` and the probe fields of an http server, from `probe` or, without one, from the
/// previous status of the same generation. `cond` builds a condition over the previous ones.
fn probed_fields(
    status: &mut McpServerStatus,
    server: &McpServer,
    probe: Option<&ProbeOutcome>,
    valid: bool,
    cond: impl Fn(&str, &str, &str, String) -> Condition,
) {
    match probe {
        Some(ProbeOutcome { time, result: ProbeResult::Succeeded { tools, digests, server_info, cut } }) => {
            let mut names: Vec<String> = tools.iter().collect::<BTreeSet<_>>().into_iter().cloned().collect();
            let count = u32::try_from(names.len()).unwrap_or(u32::MAX);
            names.truncate(MAX_STATUS_TOOLS);
            status.conditions.push(cond(
                types::READY,
                TRUE,
                reasons::PROBE_SUCCEEDED,
                match cut {
                    None => format!("initialize and tools/list succeeded; the server lists {count} tools"),
                    Some(cut) => format!("initialize and tools/list succeeded; {count} tools kept ({cut})"),
                },
            ));
            status.tools = names;
            status.tool_count = Some(count);
            status.server_info = server_info.clone();
            status.last_probe_time = Some(whole_seconds(time));
            if server.spec.pinning.is_some() {
                status.conditions.push(tools_pinned(server, digests, &cond));
            }
        }
        Some(ProbeOutcome { time, result: ProbeResult::Failed { error } }) => {
            let error = truncate(error, MAX_ERROR_BYTES);
            status.conditions.push(cond(types::READY, FALSE, reasons::PROBE_FAILED, error.clone()));
            status.last_probe_time = Some(whole_seconds(time));
            status.last_error = Some(error);
        }
        Some(ProbeOutcome { time, result: ProbeResult::AuthRequired { asked } }) => {
            let (state, message) = auth_required(server, asked);
            status.conditions.push(cond(types::READY, state, reasons::AUTH_REQUIRED, message.clone()));
            status.last_probe_time = Some(whole_seconds(time));
            status.last_error = Some(message);
        }
        Some(ProbeOutcome { result: ProbeResult::Skipped { message }, .. }) => {
            status.conditions.push(cond(types::READY, UNKNOWN, reasons::PROBE_SKIPPED, message.clone()));
        }
        // The controller never probes an invalid spec (its URL may not even be one).
        None if !valid => status.conditions.push(cond(
            types::READY,
            UNKNOWN,
            REASON_PROBE_PENDING,
            "not probed while the spec is invalid; fix the problems the Accepted condition lists".into(),
        )),
        None => match server.status.as_ref().filter(|p| p.observed_generation == server.metadata.generation) {
            Some(p) if p.conditions.iter().any(|c| c.type_ == types::READY) => {
                let probed = |c: &&Condition| c.type_ == types::READY || c.type_ == types::TOOLS_PINNED;
                status.conditions.extend(p.conditions.iter().filter(probed).cloned());
                status.tools = p.tools.clone();
                status.tool_count = p.tool_count;
                status.server_info = p.server_info.clone();
                status.last_probe_time = p.last_probe_time.clone();
                status.last_error = p.last_error.clone();
            }
            _ => status.conditions.push(cond(
                types::READY,
                UNKNOWN,
                REASON_PROBE_PENDING,
                "the server has not been probed at this generation yet".into(),
            )),
        },
    }
}

/// `ToolsPinned` from the last probe's digests: which served tools differ from their pins.
fn tools_pinned(
    server: &McpServer,
    digests: &BTreeMap<String, ToolDigest>,
    cond: &impl Fn(&str, &str, &str, String) -> Condition,
) -> Condition {
    let found = pin::findings(&server.spec, digests);
    if found.is_empty() {
        return cond(types::TOOLS_PINNED, TRUE, reasons::PINS_MATCH, "every served tool matches its pin".into());
    }
    let enforced = server.spec.pinning.as_ref().is_none_or(|p| p.mode == PinMode::Enforce);
    let named: Vec<String> = found.iter().take(MAX_PROBLEMS_IN_MESSAGE).map(|(t, r)| format!("{t} ({r})")).collect();
    let more = found.len().saturating_sub(MAX_PROBLEMS_IN_MESSAGE);
    let more = if more > 0 { format!(" and {more} more") } else { String::new() };
    let what = if enforced { "agents withhold them" } else { "agents serve them (pinning.mode warn)" };
    let message = format!(
        "{} tool(s) differ from their pins or have none: {}{more}; {what}. Review them, then run spearlet pin",
        found.len(),
        named.join(", ")
    );
    cond(types::TOOLS_PINNED, FALSE, reasons::PIN_MISMATCH, truncate(&message, MAX_MESSAGE_BYTES))
}

/// `Ready`'s status and message for a server that answered 401 asking for `asked`. The agents
/// authenticate; the operator stops at the server's door. With `http.auth` that is as expected
/// (Unknown: reachable, not checked past the 401); without it the agents are refused too (False).
fn auth_required(server: &McpServer, asked: &str) -> (&'static str, String) {
    match server.spec.http.as_ref().and_then(|h| h.auth.as_ref()) {
        Some(auth) => (
            UNKNOWN,
            format!(
                "the server requires authorization ({asked}); agents authenticate with spec.http.auth \
                 ({}); the operator holds no credentials and does not list its tools",
                auth.mode()
            ),
        ),
        None => (
            FALSE,
            format!(
                "the server requires authorization ({asked}) and spec.http.auth is not set, so agents \
                 are refused too: set spec.http.auth (clientCredentials, serviceAccountToken, \
                 tokenExchange, or authorizationCode for a server that needs a person's consent)"
            ),
        ),
    }
}

/// The status of `profile`, given every McpServer of its namespace and the tool names known per
/// server (from their status); servers without known tools add nothing to `toolPreview`.
pub(crate) fn profile_status(
    profile: &McpProfile,
    servers_in_namespace: &[McpServer],
    known_tools: &BTreeMap<String, Vec<String>>,
    now: Time,
) -> McpProfileStatus {
    let now = whole_seconds(&now);
    let generation = profile.metadata.generation;
    let old = profile.status.as_ref().map(|s| s.conditions.as_slice()).unwrap_or_default();
    let spec = &profile.spec;
    let name = profile.metadata.name.as_deref().unwrap_or_default();

    let present: BTreeSet<&str> = servers_in_namespace.iter().filter_map(|s| s.metadata.name.as_deref()).collect();
    let mut allowed: BTreeSet<&str> = spec.servers.iter().map(String::as_str).collect();
    allowed
        .extend(servers_in_namespace.iter().filter(|s| profile.selects(s)).filter_map(|s| s.metadata.name.as_deref()));
    let resolved: Vec<String> = allowed.iter().filter(|s| present.contains(*s)).map(|s| s.to_string()).collect();
    let missing: Vec<String> = allowed.iter().filter(|s| !present.contains(*s)).map(|s| s.to_string()).collect();

    let resolved_refs = if missing.is_empty() {
        let message = if resolved.is_empty() {
            "spec.servers names no McpServer and spec.serverSelector matches none yet".to_string()
        } else {
            format!("all {} allowed McpServers exist", resolved.len())
        };
        condition(old, types::RESOLVED_REFS, TRUE, reasons::RESOLVED, message, generation, &now)
    } else {
        let namespace = profile.metadata.namespace.as_deref().unwrap_or("this namespace");
        let message = format!(
            "McpServers not found in namespace {namespace}: {}; create them, or remove them from spec.servers",
            missing.join(", ")
        );
        condition(old, types::RESOLVED_REFS, FALSE, reasons::MISSING_SERVERS, message, generation, &now)
    };

    let tool_preview = tool_preview(profile, name, servers_in_namespace, &resolved, known_tools);
    let all_known = resolved.iter().all(|s| known_tools.contains_key(s));
    let (status, reason, message) = if resolved.is_empty() {
        (FALSE, reasons::NO_SERVERS, "no McpServer this profile allows exists: workloads get no tools".to_string())
    } else if spec.default_servers.as_ref().is_some_and(Vec::is_empty) {
        let message = "spec.defaultServers is []: a request that names no server (mcp.server_ids) gets no tools; \
                       list servers there, or remove it to default to every allowed server";
        (FALSE, reasons::DEFAULT_SERVERS_EMPTY, message.to_string())
    } else if !tool_preview.is_empty() {
        (TRUE, reasons::TOOLS_OFFERED, format!("{} tools offered by servers whose tools are known", tool_preview.len()))
    } else if all_known {
        let message = "the allowlists leave no tool of the allowed servers: workloads get no tools; see \
                       `spearlet explain` for why each is left out";
        (FALSE, reasons::NO_TOOLS_ALLOWED, message.to_string())
    } else {
        let message = "no allowed server's tools are known to the operator (stdio servers are listed by agents)";
        (UNKNOWN, reasons::TOOLS_UNKNOWN, message.to_string())
    };
    let offered = condition(old, types::TOOLS_OFFERED, status, reason, message, generation, &now);

    McpProfileStatus {
        observed_generation: generation,
        conditions: vec![accepted(&profile.validate(), old, generation, &now), resolved_refs, offered],
        tool_preview,
        resolved_servers: resolved,
        missing_servers: missing,
    }
}

/// The tool names each http server listed at its last successful probe (from its status), as
/// [`profile_status`] takes them. stdio servers are not probed and have none.
pub(crate) fn known_tools(servers: &[McpServer]) -> BTreeMap<String, Vec<String>> {
    servers
        .iter()
        .filter_map(|s| {
            let status = s.status.as_ref().filter(|st| st.tool_count.is_some())?;
            Some((s.metadata.name.clone()?, status.tools.clone()))
        })
        .collect()
}

/// Model-facing names the profile exposes from the servers whose tools are known, sorted, at
/// most [`MAX_STATUS_TOOLS`]. Every allowed server counts, not only `defaultServers`: a request
/// may ask for any of them. Empty when the profile does not compile (its patterns are invalid,
/// which `Accepted` reports).
fn tool_preview(
    profile: &McpProfile,
    name: &str,
    servers: &[McpServer],
    resolved: &[String],
    known_tools: &BTreeMap<String, Vec<String>>,
) -> Vec<String> {
    // The same code path the agent uses, so the preview shows the names a model will see.
    let entries = servers
        .iter()
        .map(|s| Object::Server(s.clone()))
        .chain([Object::Profile(profile.clone())])
        .map(|o| Entry::new("", 0, String::new(), o));
    let snapshot = Snapshot::build(entries, Vec::new());
    let Ok(compiled) = CompiledProfile::compile(&snapshot, name) else { return Vec::new() };
    let parts: BTreeMap<&str, &str> = compiled.servers().collect();
    let tools = |id: &str| match (known_tools.get(id), parts.get(id)) {
        (Some(tools), Some(part)) => {
            ServerTools::Listed(ToolList::new(part, tools.iter().map(|t| ToolInfo::named(t)).collect()).into())
        }
        _ => ServerTools::Unknown,
    };
    let scope = RequestScope { servers: Some(resolved.to_vec()), ..RequestScope::default() };
    let Ok(set) = compiled.effective(tools, Some(&scope), &[]) else { return Vec::new() };
    let mut names: Vec<String> = set.tools().map(|(_, t)| t.name.to_string()).collect();
    names.sort();
    names.dedup();
    names.truncate(MAX_STATUS_TOOLS);
    names
}

/// Folds the Secret references of an object (see `api::secret_grant`), and for a profile the
/// identity its servers ask for (`api::identity`), into its `ResolvedRefs` condition: nothing when
/// it references no Secret and asks for no identity; `ResolvedRefs=False`, `RefNotPermitted` when
/// a grant is missing, its message naming the Secret or server and the fix (appended to a
/// `ResolvedRefs=False` already there).
pub(crate) fn fold_secret_refusals<R: std::fmt::Display>(
    status_conditions: &mut Vec<Condition>,
    old: &[Condition],
    references_secrets: bool,
    refusals: &[R],
    generation: Option<i64>,
    now: Time,
) {
    if !references_secrets {
        return;
    }
    let now = whole_seconds(&now);
    let refused = refusals.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ");
    let existing = status_conditions.iter_mut().find(|c| c.type_ == types::RESOLVED_REFS);
    match existing {
        Some(c) if c.status == FALSE && !refusals.is_empty() => {
            c.message = truncate(&format!("{}; {refused}", c.message), MAX_MESSAGE_BYTES);
        }
        Some(c) if !refusals.is_empty() => {
            *c = condition(old, types::RESOLVED_REFS, FALSE, reasons::REF_NOT_PERMITTED, refused, generation, &now);
        }
        Some(_) => {}
        None => status_conditions.push(if refusals.is_empty() {
            let message = "every referenced Secret allows this object".to_string();
            condition(old, types::RESOLVED_REFS, TRUE, reasons::RESOLVED, message, generation, &now)
        } else {
            condition(old, types::RESOLVED_REFS, FALSE, reasons::REF_NOT_PERMITTED, refused, generation, &now)
        }),
    }
}

/// `GrantReady` for a server whose grant lives in a Secret (`authorizationCode.tokenSecretRef`),
/// from what the Secret's annotations say (`presence`); nothing for other servers.
pub(crate) fn fold_grant(
    status_conditions: &mut Vec<Condition>,
    old: &[Condition],
    server: &McpServer,
    presence: GrantPresence,
    now: Time,
) {
    let Some(reference) = crate::api::secret_grant::grant_secret_ref(server) else { return };
    let (name, namespace) = (server.metadata.name.as_deref().unwrap_or_default(), server.metadata.namespace.as_deref());
    let login = format!("run `spearlet auth login --server {name} -n {}`", namespace.unwrap_or("<namespace>"));
    let secret = &reference.secret;
    let (status, reason, message) = match presence {
        GrantPresence::Missing => {
            (FALSE, reasons::NO_GRANT, format!("no grant is stored (Secret {secret:?} does not exist): {login}"))
        }
        GrantPresence::LoginRequired(why) => (
            FALSE,
            reasons::LOGIN_REQUIRED,
            format!("an agent found the grant in Secret {secret:?} refused ({why}): {login}"),
        ),
        GrantPresence::Stored { renewed_at } => (
            TRUE,
            reasons::GRANT_STORED,
            match renewed_at {
                Some(at) => format!("a person's grant is stored in Secret {secret:?}, last renewed {at}"),
                None => format!("a grant is stored in Secret {secret:?}"),
            },
        ),
    };
    let generation = server.metadata.generation;
    status_conditions.retain(|c| c.type_ != types::GRANT_READY);
    status_conditions.push(condition(
        old,
        types::GRANT_READY,
        status,
        reason,
        message,
        generation,
        &whole_seconds(&now),
    ));
}

/// `Accepted` from validation problems: the first few as `field: message (fix)`.
fn accepted(problems: &[ValidationError], old: &[Condition], generation: Option<i64>, now: &Time) -> Condition {
    if problems.is_empty() {
        return condition(old, types::ACCEPTED, TRUE, reasons::VALID, "the spec is valid".into(), generation, now);
    }
    let mut message =
        problems.iter().take(MAX_PROBLEMS_IN_MESSAGE).map(ToString::to_string).collect::<Vec<_>>().join("; ");
    if problems.len() > MAX_PROBLEMS_IN_MESSAGE {
        message.push_str(&format!("; and {} more", problems.len() - MAX_PROBLEMS_IN_MESSAGE));
    }
    condition(old, types::ACCEPTED, FALSE, reasons::INVALID, message, generation, now)
}

/// A condition that keeps the previous `lastTransitionTime` while its status is unchanged.
fn condition(
    old: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    generation: Option<i64>,
    now: &Time,
) -> Condition {
    let last_transition_time = old
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| now.clone(), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_string(),
        status: status.to_string(),
        reason: reason.to_string(),
        message: truncate(&message, MAX_MESSAGE_BYTES),
        observed_generation: generation,
        last_transition_time,
    }
}

/// `t` without its fraction of a second, as it reads back from the API server.
fn whole_seconds(t: &Time) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(t.0.as_second()).unwrap_or(t.0))
}

/// `s` cut to at most `max` bytes on a character boundary, with `…` when cut.
fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    const ELLIPSIS: char = '…';
    let end = s.floor_char_boundary(max.saturating_sub(ELLIPSIS.len_utf8()));
    format!("{}{ELLIPSIS}", &s[..end])
}

#[cfg(test)]
mod tests;
