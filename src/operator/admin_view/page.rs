//! The admin view as one HTML page (pure): [`render`] turns an [`AdminView`] into markup.
//!
//! Every value reaches the page through maud's `(...)` interpolation, which HTML-escapes it:
//! names, display names, errors and tool names come from whoever may write an McpServer and from
//! the MCP servers themselves, so none is ever written as markup. The page has no script at all
//! and its style is a separate file ([`STYLESHEET`]), so the Content-Security-Policy
//! ([`CONTENT_SECURITY_POLICY`]) can forbid every inline script and style; it refreshes itself
//! with a `<meta http-equiv="refresh">`.

use maud::{DOCTYPE, Markup, html};
use serde_json::Value;

use super::model::{AdminView, ConditionView, Health, InjectedPod, NamespaceView, ProfileRow, ServerRow};

/// Path of the stylesheet (the CSP allows styles from this origin only).
pub const STYLESHEET_PATH: &str = "/admin.css";
/// Path of the JSON form of the same view.
pub const JSON_PATH: &str = "/view.json";
/// Seconds between the page's own reloads.
const REFRESH_SECONDS: u32 = 15;

/// Nothing but this origin's stylesheet: no script, no frame, no form, no other origin.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; style-src 'self'; img-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// The page's style: system fonts only (no web font, no CDN).
pub const STYLESHEET: &str = include_str!("admin.css");

/// The page for `view`.
pub fn render(view: &AdminView) -> String {
    let servers: usize = view.namespaces.iter().map(|n| n.servers.len()).sum();
    let profiles: usize = view.namespaces.iter().map(|n| n.profiles.len()).sum();
    let pods: usize = view.namespaces.iter().map(|n| n.pods.len()).sum();
    let role = if view.replica.leader { "leader" } else { "standby" };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta http-equiv="refresh" content=(REFRESH_SECONDS);
                title { "spear-mcp admin view" }
                link rel="stylesheet" href=(STYLESHEET_PATH);
            }
            body {
                header {
                    h1 { "spear-mcp" span.sub { "admin view" } }
                    p.meta {
                        "Read-only. Served by " code { (view.replica.identity) } " (" (role) "); "
                        (count(servers, "McpServer")) ", " (count(profiles, "McpProfile")) ", "
                        (count(pods, "injected pod")) ". "
                        "Reloads every " (REFRESH_SECONDS) " s. " a href=(JSON_PATH) { "JSON" }
                    }
                }
                @if !view.problems.is_empty() {
                    section.problems {
                        h2 { "Not up to date" }
                        ul { @for problem in &view.problems { li { (problem) } } }
                    }
                }
                @if view.namespaces.is_empty() {
                    p.empty { "No McpServer, McpProfile or injection-enabled namespace yet." }
                }
                nav.toc {
                    @for ns in &view.namespaces {
                        a href={ "#ns-" (ns.name) } { (ns.name) }
                    }
                }
                @for ns in &view.namespaces { (namespace(ns)) }
            }
        }
    }
    .into_string()
}

/// `1 McpServer`, `2 McpServers`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 { format!("1 {noun}") } else { format!("{n} {noun}s") }
}

fn namespace(ns: &NamespaceView) -> Markup {
    html! {
        section.namespace id={ "ns-" (ns.name) } {
            h2 {
                "Namespace " code { (ns.name) }
                @if ns.injection_enabled { span.badge.ok { "injection enabled" } }
                @else { span.badge.muted { "injection not enabled" } }
            }
            h3 { "McpServers" }
            @if ns.servers.is_empty() { p.empty { "None." } } @else { (servers(&ns.servers)) }
            h3 { "McpProfiles" }
            @if ns.profiles.is_empty() { p.empty { "None." } }
            @for profile in &ns.profiles { (profile_card(profile)) }
            h3 { "Injected pods" }
            @if ns.pods.is_empty() { p.empty { "None." } } @else { (pods(&ns.pods)) }
        }
    }
}

fn health_class(health: Health) -> &'static str {
    match health {
        Health::Ready => "badge ok",
        Health::Failing | Health::Rejected => "badge bad",
        Health::Pending => "badge warn",
        Health::Sidecar | Health::NotProbed => "badge muted",
    }
}

fn condition_cell(condition: Option<&ConditionView>) -> Markup {
    html! {
        @match condition {
            None => span.muted { "–" },
            Some(c) => {
                @let class = match c.status.as_str() { "True" => "badge ok", "False" => "badge bad", _ => "badge muted" };
                span class=(class) title=(c.message) { (c.status) }
                " " span.reason { (c.reason) }
            }
        }
    }
}

fn servers(rows: &[ServerRow]) -> Markup {
    html! {
        table.servers {
            thead { tr {
                th { "Server" } th { "Transport" } th { "Health" } th { "Accepted" } th { "Ready" }
                th.num { "Tools" } th { "Last error" }
            } }
            tbody {
                @for s in rows {
                    tr class={ "server health-" (s.health.label().replace(' ', "-")) } {
                        td {
                            code.name { (s.name) }
                            @if let Some(display) = &s.display_name { div.sub { (display) } }
                            @if let Some(info) = &s.server_info { div.sub { (info) } }
                        }
                        td { (s.transport) }
                        td { span class=(health_class(s.health)) { (s.health.label()) } }
                        td { (condition_cell(s.accepted.as_ref())) }
                        td {
                            (condition_cell(s.ready.as_ref()))
                            @if let Some(grant) = &s.grant { div.sub { "grant " (condition_cell(Some(grant))) } }
                        }
                        td.num title=(s.tools.join(", ")) {
                            @match s.tool_count { Some(n) => (n), None => span.muted { "–" } }
                        }
                        td.error {
                            @if let Some(error) = &s.last_error { pre { (error) } }
                            @else if let Some(message) = s.accepted.as_ref().filter(|c| c.status == "False").map(|c| &c.message) {
                                pre { (message) }
                            }
                            @if let Some(grant) = s.grant.as_ref().filter(|c| c.status == "False") { pre { (grant.message) } }
                            @if let Some(time) = &s.last_probe_time { div.sub { "probed " (time) } }
                        }
                    }
                }
            }
        }
    }
}

fn names(items: &[String], class: &str) -> Markup {
    html! {
        @if items.is_empty() { span.muted { "none" } }
        @for item in items { code class=(class) { (item) } " " }
    }
}

fn profile_card(p: &ProfileRow) -> Markup {
    html! {
        div.profile {
            h4 { code { (p.name) } }
            div.conditions {
                span.label { "Accepted" } (condition_cell(p.accepted.as_ref()))
                span.label { "ResolvedRefs" } (condition_cell(p.resolved_refs.as_ref()))
            }
            @for c in [&p.accepted, &p.resolved_refs].into_iter().flatten().filter(|c| c.status != "True") {
                p.error { (c.message) }
            }
            dl {
                dt { "Resolved servers" } dd { (names(&p.resolved_servers, "chip")) }
                @if !p.missing_servers.is_empty() {
                    dt { "Missing servers" } dd { (names(&p.missing_servers, "chip bad")) }
                }
                dt { "Tool preview" } dd { (names(&p.tool_preview, "chip")) }
            }
            details open {
                summary { "Decision log (spearlet explain)" }
                @match &p.explain {
                    Ok(explained) => (explain(explained)),
                    Err(error) => p.error { "Cannot explain: " (error) },
                }
            }
        }
    }
}

fn text(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value.as_array().map(|items| items.iter().map(text).collect()).unwrap_or_default()
}

/// `explain_json`'s document as tables: what is exposed, then every exclusion with its reason.
fn explain(explained: &Value) -> Markup {
    let servers = explained["servers"].as_array().map(Vec::as_slice).unwrap_or_default();
    let excluded = explained["excluded"].as_array().map(Vec::as_slice).unwrap_or_default();
    html! {
        p.sub { "Registry revision " code { (text(&explained["revision"])) } }
        @if let Some(note) = explained["note"].as_str() { p.note { "Note: " (note) } }
        table.explain {
            thead { tr { th { "Server" } th { "Name part" } th { "Tools (or, not listed, the server's patterns)" } } }
            tbody {
                @for s in servers {
                    tr {
                        td { code { (text(&s["id"])) } }
                        td { code { (text(&s["namePart"])) } }
                        td {
                            @if let Some(tools) = s["tools"].as_array() {
                                @let tool_names: Vec<String> = tools.iter().map(|t| text(&t["name"])).collect();
                                (names(&tool_names, "chip"))
                            }
                            @else {
                                span.label { "allowed " } (strings(&s["allowedTools"]).join(", "))
                                @let denied = strings(&s["deniedTools"]);
                                @if !denied.is_empty() { span.label { " · denied " } (denied.join(", ")) }
                            }
                        }
                    }
                }
            }
        }
        @let not_in_profile = explained["notInProfile"].as_u64().and_then(|n| usize::try_from(n).ok()).unwrap_or_default();
        @if not_in_profile > 0 {
            p.sub {
                (count(not_in_profile, "other McpServer")) " of the namespace "
                (if not_in_profile == 1 { "is" } else { "are" }) " not in this profile (" code { "not_in_profile" } ")."
            }
        }
        @if !excluded.is_empty() {
            table.explain {
                thead { tr { th { "Excluded" } th { "Reason" } th { "Detail" } } }
                tbody {
                    @for d in excluded {
                        tr {
                            td { code { (text(&d["server"])) @if let Some(tool) = d["tool"].as_str() { "/" (tool) } } }
                            td { code.reason { (text(&d["reason"])) } }
                            td { (text(&d["detail"])) }
                        }
                    }
                }
            }
        }
    }
}

fn pods(rows: &[InjectedPod]) -> Markup {
    html! {
        table.pods {
            thead { tr { th { "Pod" } th { "Profile" } th { "Created" } } }
            tbody {
                @for pod in rows {
                    tr {
                        td { code { (pod.name) } @if pod.terminating { " " span.badge.muted { "terminating" } } }
                        td { code { (pod.profile) } }
                        td { (pod.created.as_deref().unwrap_or("–")) }
                    }
                }
            }
        }
    }
}
