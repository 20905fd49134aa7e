//! Which McpServers and McpProfiles may use a Secret: the Secret says so. Pure.
//!
//! Writing an McpServer must not be the same as reading every Secret of its namespace: a
//! `secretKeyRef` becomes an env var of the pod (the agent's for header values and the upstream
//! key, the sidecar's for stdio env), so whoever writes the reference chooses where the value
//! goes (a URL they control, a server image they built). The Secret's owner therefore grants
//! each use, with annotations on the Secret:
//!
//! ```yaml
//! metadata:
//!   annotations:
//!     mcp.spear.dev/allowed-servers: "github, jira"   # McpServer names of this namespace, or "*"
//!     mcp.spear.dev/allowed-profiles: "developer"     # McpProfile names (chat.upstream.apiKeySecretRef)
//! ```
//!
//! The webhook injects a reference only when the grant holds (otherwise it leaves the variable out
//! and says so in an admission warning), and the operator reports refused references on the
//! referring object's status. A Secret that does not exist grants nothing. Names are compared
//! exactly (they are DNS names, always lower-case).

use std::collections::BTreeMap;
use std::fmt;

use super::{McpProfile, McpServer};

/// Annotation on a Secret: the McpServers (names, comma-separated, or `*`) that may reference it.
pub const ANNOTATION_ALLOWED_SERVERS: &str = "mcp.spear.dev/allowed-servers";
/// Annotation on a Secret: the McpProfiles that may use it as their upstream API key.
pub const ANNOTATION_ALLOWED_PROFILES: &str = "mcp.spear.dev/allowed-profiles";

/// The object that references a Secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Referrer<'a> {
    /// An McpServer (stdio env or http header `valueFrom`).
    Server(&'a str),
    /// An McpProfile (`chat.upstream.apiKeySecretRef`).
    Profile(&'a str),
}

impl Referrer<'_> {
    fn annotation(self) -> &'static str {
        match self {
            Referrer::Server(_) => ANNOTATION_ALLOWED_SERVERS,
            Referrer::Profile(_) => ANNOTATION_ALLOWED_PROFILES,
        }
    }

    fn name(&self) -> &str {
        match self {
            Referrer::Server(name) | Referrer::Profile(name) => name,
        }
    }
}

impl fmt::Display for Referrer<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Referrer::Server(name) => write!(f, "McpServer {name:?}"),
            Referrer::Profile(name) => write!(f, "McpProfile {name:?}"),
        }
    }
}

/// One `secretKeyRef` of an object: the field that holds it and the Secret it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SecretRef {
    /// For example `spec.http.headers[Authorization].valueFrom`.
    pub field: String,
    /// The Secret's name (in the referrer's namespace).
    pub secret: String,
}

/// Every Secret `server` references, in spec order.
pub fn server_secret_refs(server: &McpServer) -> Vec<SecretRef> {
    let mut refs = Vec::new();
    for var in server.spec.stdio.iter().flat_map(|s| &s.env) {
        if let Some(selector) = var.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) {
            let field = format!("spec.stdio.env[{}].valueFrom.secretKeyRef", var.name);
            refs.push(SecretRef { field, secret: selector.name.clone() });
        }
    }
    for header in server.spec.http.iter().flat_map(|h| &h.headers) {
        if let Some(source) = &header.value_from {
            let field = format!("spec.http.headers[{}].valueFrom.secretKeyRef", header.name);
            refs.push(SecretRef { field, secret: source.secret_key_ref.name.clone() });
        }
    }
    for (_, field, selector) in server.spec.http.iter().flat_map(|h| &h.auth).flat_map(|a| a.secret_values()) {
        refs.push(SecretRef { field: field.to_string(), secret: selector.name.clone() });
    }
    refs.extend(grant_secret_ref(server));
    refs
}

/// The Secret holding a person's grant for `server` (`authorizationCode.tokenSecretRef`): read
/// and written by the pods' agents themselves, never delivered by the webhook.
pub fn grant_secret_ref(server: &McpServer) -> Option<SecretRef> {
    let auth = server.spec.http.as_ref()?.auth.as_ref()?;
    let name = &auth.authorization_code.as_ref()?.token_secret_ref.as_ref()?.name;
    Some(SecretRef { field: "spec.http.auth.authorizationCode.tokenSecretRef".into(), secret: name.clone() })
}

/// The Secrets `profile` references: its upstream API key and its webhook approvers' signing keys.
pub fn profile_secret_refs(profile: &McpProfile) -> Vec<SecretRef> {
    let upstream = profile.spec.chat.as_ref().and_then(|c| c.upstream.as_ref());
    let upstream = upstream
        .and_then(|u| u.api_key_secret_ref.as_ref())
        .map(|key| SecretRef { field: "spec.chat.upstream.apiKeySecretRef".into(), secret: key.name.clone() });
    let approvers = profile.spec.approval.iter().flat_map(|a| a.approvers.iter().enumerate());
    let signing = approvers.filter_map(|(i, approver)| {
        let secret = approver.webhook.as_ref()?.signing_secret_ref.as_ref()?;
        Some(SecretRef {
            field: format!("spec.approval.approvers[{i}].webhook.signingSecretRef"),
            secret: secret.name.clone(),
        })
    });
    upstream.into_iter().chain(signing).collect()
}

/// The annotations of the Secrets some objects reference, by Secret name; `None` for a Secret
/// that does not exist. What the webhook and the operator read (metadata only, never data).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SecretGrants {
    secrets: BTreeMap<String, Option<BTreeMap<String, String>>>,
}

/// Why a reference is not honoured. Its text names the Secret, the referrer and the fix; never
/// a value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Refusal {
    /// The referring field.
    pub field: String,
    /// The Secret.
    pub secret: String,
    message: String,
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl SecretGrants {
    /// A Secret's annotations (`None`: it does not exist).
    pub fn insert(&mut self, secret: impl Into<String>, annotations: Option<BTreeMap<String, String>>) {
        self.secrets.insert(secret.into(), annotations);
    }

    /// The annotations of `secret`; `None` when it does not exist (or was not read).
    pub fn annotations(&self, secret: &str) -> Option<&BTreeMap<String, String>> {
        self.secrets.get(secret)?.as_ref()
    }

    /// Grants from Secrets that all allow everything: what local mode and tests without an API
    /// server mean.
    pub fn allow_all<'a>(secrets: impl IntoIterator<Item = &'a str>) -> Self {
        let all = BTreeMap::from([
            (ANNOTATION_ALLOWED_SERVERS.to_string(), "*".to_string()),
            (ANNOTATION_ALLOWED_PROFILES.to_string(), "*".to_string()),
        ]);
        SecretGrants { secrets: secrets.into_iter().map(|s| (s.to_string(), Some(all.clone()))).collect() }
    }

    /// Whether `referrer` may use the Secret `reference` names; a Secret not read counts as absent.
    pub fn check(&self, referrer: Referrer<'_>, reference: &SecretRef) -> Result<(), Refusal> {
        let refuse = |message: String| {
            Err(Refusal { field: reference.field.clone(), secret: reference.secret.clone(), message })
        };
        let secret = &reference.secret;
        let field = &reference.field;
        let Some(Some(annotations)) = self.secrets.get(secret) else {
            return refuse(format!(
                "{referrer} {field} names Secret {secret:?}, which does not exist in its namespace: create it, with the annotation {}: \"{}\"",
                referrer.annotation(),
                referrer.name()
            ));
        };
        if annotations.get(referrer.annotation()).is_some_and(|list| lists(list, referrer.name())) {
            return Ok(());
        }
        refuse(format!(
            "{referrer} {field} names Secret {secret:?}, which does not allow it: the Secret's owner adds {:?} to its annotation {} (comma-separated names, or \"*\")",
            referrer.name(),
            referrer.annotation()
        ))
    }

    /// Every refused reference of `server`.
    pub fn server_refusals(&self, server: &McpServer) -> Vec<Refusal> {
        let name = server.metadata.name.as_deref().unwrap_or_default();
        server_secret_refs(server).iter().filter_map(|r| self.check(Referrer::Server(name), r).err()).collect()
    }

    /// Every refused reference of `profile`.
    pub fn profile_refusals(&self, profile: &McpProfile) -> Vec<Refusal> {
        let name = profile.metadata.name.as_deref().unwrap_or_default();
        profile_secret_refs(profile).iter().filter_map(|r| self.check(Referrer::Profile(name), r).err()).collect()
    }

    /// The refusal of the reference at `field` of `profile`, if it is refused.
    pub fn profile_field_refusal(&self, profile: &McpProfile, field: &str) -> Option<Refusal> {
        let name = profile.metadata.name.as_deref().unwrap_or_default();
        let refs = profile_secret_refs(profile);
        let r = refs.iter().find(|r| r.field == field)?;
        self.check(Referrer::Profile(name), r).err()
    }
}

/// Whether the comma-separated `list` names `name` or is `*`.
pub(crate) fn lists(list: &str, name: &str) -> bool {
    list.split(',').map(str::trim).any(|item| item == "*" || item == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn annotated(key: &str, value: &str) -> Option<BTreeMap<String, String>> {
        Some(BTreeMap::from([(key.to_string(), value.to_string())]))
    }

    fn header_server(name: &str, secret: &str) -> McpServer {
        McpServer::test(name).http("https://mcp.example.com/mcp").secret_header("Authorization", secret, "token")
    }

    #[test]
    fn a_secret_grants_the_servers_it_names_and_no_other() {
        let mut grants = SecretGrants::default();
        grants.insert("gh", annotated(ANNOTATION_ALLOWED_SERVERS, "jira, github"));
        assert!(grants.server_refusals(&header_server("github", "gh")).is_empty());
        let refused = grants.server_refusals(&header_server("evil", "gh"));
        assert_eq!(refused.len(), 1);
        let text = refused[0].to_string();
        assert!(text.contains("McpServer \"evil\"") && text.contains(ANNOTATION_ALLOWED_SERVERS), "{text}");
        assert!(text.contains("spec.http.headers[Authorization]"), "{text}");
    }

    #[test]
    fn unannotated_missing_and_profile_only_secrets_grant_no_server() {
        let mut grants = SecretGrants::default();
        grants.insert("plain", Some(BTreeMap::new()));
        grants.insert("for-profiles", annotated(ANNOTATION_ALLOWED_PROFILES, "*"));
        for secret in ["plain", "for-profiles", "absent"] {
            assert_eq!(grants.server_refusals(&header_server("github", secret)).len(), 1, "{secret}");
        }
        assert!(grants.server_refusals(&header_server("github", "absent"))[0].to_string().contains("does not exist"));
    }

    #[test]
    fn a_star_grants_every_server_but_a_prefix_is_not_a_pattern() {
        let mut grants = SecretGrants::default();
        grants.insert("all", annotated(ANNOTATION_ALLOWED_SERVERS, "*"));
        grants.insert("prefix", annotated(ANNOTATION_ALLOWED_SERVERS, "git"));
        assert!(grants.server_refusals(&header_server("anything", "all")).is_empty());
        assert_eq!(grants.server_refusals(&header_server("github", "prefix")).len(), 1);
    }

    #[test]
    fn stdio_env_references_are_checked_too() {
        let server = McpServer::test("fs").stdio("npx", ["-y"]).secret_env("TOKEN", "fs-token", "t");
        assert_eq!(server_secret_refs(&server)[0].field, "spec.stdio.env[TOKEN].valueFrom.secretKeyRef");
        assert_eq!(SecretGrants::default().server_refusals(&server).len(), 1);
        assert!(SecretGrants::allow_all(["fs-token"]).server_refusals(&server).is_empty());
    }
}
