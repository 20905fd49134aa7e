//! Which McpServers may act as the pod's ServiceAccount: the McpProfile says so. Pure.
//!
//! Two things in an McpServer hand the pod's identity to the server's author: a projected token of
//! the pod's ServiceAccount (`spec.http.auth.serviceAccountToken` or `tokenExchange`, sent to the
//! server's URL or its authorization server, with an audience the author writes), and
//! `spec.stdio.mountServiceAccountToken` (the pod's Kubernetes API token in the sidecar that runs
//! the author's image). A token for the API server's audience, or a cloud STS's, lets its holder
//! act as the workload there. So, like a Secret, the identity is granted by someone else than the
//! McpServer's author: the McpProfile's owner (the platform team), in `spec.identity`:
//!
//! ```yaml
//! spec:
//!   identity:
//!     servers: [notes]                          # may receive a projected token...
//!     audiences: [https://notes.example.com]    # ...with one of these audiences
//!     mountServiceAccountToken: [kube-helper]   # sidecars that may mount the API token
//! ```
//!
//! ```text
//! McpServer asks (auth audience, mountServiceAccountToken) ─┐
//! McpProfile.spec.identity grants (servers, audiences)     ─┼─▶ identity_refusals ─▶ webhook: left out + warning
//! operator --forbidden-token-audiences                      ─┘                      status: ResolvedRefs=False
//! ```
//!
//! Forbidden audiences (the Kubernetes API's, well-known cloud STSs', the cluster's issuer) are
//! never covered by `audiences: ["*"]`: the grant must list them literally. Local mode
//! (`spearlet serve`) does not check the grant: there the token files are the ones its user puts in
//! `SPEAR_AUTH_TOKEN_DIR`, and no sidecar exists to mount a token into.

use std::fmt;

use super::{McpProfile, McpServer};

/// Audiences (patterns, `*` any run of characters, compared ignoring ASCII case) whose tokens
/// let their holder act as the workload beyond an MCP server: the Kubernetes API server's (the
/// `kubernetes.default.svc` names, the usual issuer and API audience), AWS STS (IRSA), Azure
/// workload identity, and Google workload identity federation and GKE.
pub const DEFAULT_FORBIDDEN_AUDIENCES: &[&str] = &[
    "https://kubernetes.default.svc*",
    "kubernetes.default.svc*",
    "sts.amazonaws.com",
    "api://AzureADTokenExchange",
    "//iam.googleapis.com/*",
    "*.svc.id.goog",
];

/// The audiences a grant's `*` does not cover (`--forbidden-token-audiences`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForbiddenAudiences {
    patterns: Vec<String>,
}

impl Default for ForbiddenAudiences {
    fn default() -> Self {
        ForbiddenAudiences::new(DEFAULT_FORBIDDEN_AUDIENCES.iter().copied())
    }
}

impl ForbiddenAudiences {
    /// These patterns (blank ones are dropped).
    pub fn new<S: AsRef<str>>(patterns: impl IntoIterator<Item = S>) -> Self {
        let patterns = patterns.into_iter().map(|p| p.as_ref().trim().to_string()).filter(|p| !p.is_empty()).collect();
        ForbiddenAudiences { patterns }
    }

    /// These patterns and `extra` (for example the cluster's issuer, discovered at start).
    pub fn with(mut self, extra: impl Into<String>) -> Self {
        let extra = extra.into();
        if !extra.trim().is_empty() && !self.patterns.contains(&extra) {
            self.patterns.push(extra);
        }
        self
    }

    /// The patterns, in order.
    pub fn patterns(&self) -> &[String] {
        &self.patterns
    }

    /// Whether `audience` matches a pattern.
    pub fn forbids(&self, audience: &str) -> bool {
        let audience = audience.trim().to_ascii_lowercase();
        self.patterns.iter().any(|p| glob(&p.to_ascii_lowercase(), &audience))
    }
}

/// What one McpServer asks of the pod's identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum IdentityUse<'a> {
    /// A projected ServiceAccount token with this audience, for `field`'s auth mode.
    Token { field: &'static str, audience: &'a str },
    /// The Kubernetes API token mounted into its sidecar.
    MountApiToken,
}

/// Everything `server` asks of the pod's identity, in spec order.
pub fn server_identity_uses(server: &McpServer) -> Vec<IdentityUse<'_>> {
    let mut uses = Vec::new();
    if let Some(auth) = server.spec.http.as_ref().and_then(|h| h.auth.as_ref()) {
        if let Some(sa) = &auth.service_account_token {
            uses.push(IdentityUse::Token { field: "spec.http.auth.serviceAccountToken", audience: &sa.audience });
        } else if let Some(te) = &auth.token_exchange {
            uses.push(IdentityUse::Token { field: "spec.http.auth.tokenExchange", audience: &te.audience });
        }
    }
    if server.spec.stdio.as_ref().is_some_and(|s| s.mount_service_account_token) {
        uses.push(IdentityUse::MountApiToken);
    }
    uses
}

/// Why an identity use is not honoured: names the server, the profile and the fix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IdentityRefusal {
    /// The asking field of the McpServer.
    pub field: String,
    message: String,
}

impl fmt::Display for IdentityRefusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl IdentityRefusal {
    /// Whether the refused use is a projected token (else the API token mount).
    pub fn is_token(&self) -> bool {
        self.field != MOUNT_FIELD
    }
}

const MOUNT_FIELD: &str = "spec.stdio.mountServiceAccountToken";

impl McpProfile {
    /// Every use of the pod's identity by `server` that this profile's `spec.identity` does not
    /// grant, or that asks for a forbidden audience the grant does not list literally.
    pub fn identity_refusals(&self, server: &McpServer, forbidden: &ForbiddenAudiences) -> Vec<IdentityRefusal> {
        let profile = self.metadata.name.as_deref().unwrap_or_default();
        let name = server.metadata.name.as_deref().unwrap_or_default();
        let grant = self.spec.identity.as_ref();
        let servers = grant.map(|g| g.servers.as_slice()).unwrap_or_default();
        let audiences = grant.map(|g| g.audiences.as_slice()).unwrap_or_default();
        let mounts = grant.map(|g| g.mount_service_account_token.as_slice()).unwrap_or_default();
        let mut refusals = Vec::new();
        for used in server_identity_uses(server) {
            let (field, message) = match used {
                IdentityUse::Token { field, audience } => {
                    let listed = audiences.iter().any(|a| a == audience);
                    let message = if !names(servers, name) {
                        format!(
                            "McpServer {name:?} {field} asks for a token of the pod's ServiceAccount (audience {audience:?}), which McpProfile {profile:?} does not grant it: the profile's owner adds {name:?} to spec.identity.servers and {audience:?} to spec.identity.audiences"
                        )
                    } else if forbidden.forbids(audience) && !listed {
                        format!(
                            "McpServer {name:?} {field} asks for a token of the pod's ServiceAccount with audience {audience:?}, which is the Kubernetes API's or a cloud STS's (forbidden token audiences): its holder would act as the workload there; McpProfile {profile:?} must list it literally in spec.identity.audiences (\"*\" does not cover it) if the server really needs it"
                        )
                    } else if !listed && !audiences.iter().any(|a| a == "*") {
                        format!(
                            "McpServer {name:?} {field} asks for a token of the pod's ServiceAccount with audience {audience:?}, which McpProfile {profile:?} does not allow: the profile's owner adds {audience:?} to spec.identity.audiences"
                        )
                    } else {
                        continue;
                    };
                    (field, message)
                }
                IdentityUse::MountApiToken if !names(mounts, name) => (
                    MOUNT_FIELD,
                    format!(
                        "McpServer {name:?} sets {MOUNT_FIELD}, which McpProfile {profile:?} does not grant it, so its sidecar runs without the pod's Kubernetes API token: the profile's owner adds {name:?} to spec.identity.mountServiceAccountToken"
                    ),
                ),
                IdentityUse::MountApiToken => continue,
            };
            refusals.push(IdentityRefusal { field: field.to_string(), message });
        }
        refusals
    }
}

/// Whether `list` names `name` or holds `*`.
fn names(list: &[String], name: &str) -> bool {
    list.iter().any(|item| item == "*" || item == name)
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters (none included).
fn glob(pattern: &str, text: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = text.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HttpAuth, IdentityGrant, ServiceAccountTokenAuth, TokenExchangeAuth};

    fn token_server(name: &str, audience: &str) -> McpServer {
        let auth = HttpAuth {
            service_account_token: Some(ServiceAccountTokenAuth {
                audience: audience.into(),
                expiration_seconds: None,
            }),
            ..HttpAuth::default()
        };
        McpServer::test(name).http("https://attacker.example/mcp").auth(auth)
    }

    fn exchange_server(name: &str, audience: &str) -> McpServer {
        let auth = HttpAuth {
            token_exchange: Some(TokenExchangeAuth { audience: audience.into(), ..TokenExchangeAuth::default() }),
            ..HttpAuth::default()
        };
        McpServer::test(name).http("https://attacker.example/mcp").auth(auth)
    }

    fn mounting(name: &str) -> McpServer {
        let mut server = McpServer::test(name).stdio("kubectl-mcp", ["serve"]).image("example.com/kube:1");
        server.spec.stdio.as_mut().expect("stdio").mount_service_account_token = true;
        server
    }

    fn granting(servers: &[&str], audiences: &[&str], mounts: &[&str]) -> McpProfile {
        let mut profile = McpProfile::test("dev").servers(["notes"]);
        let owned = |list: &[&str]| list.iter().map(|s| s.to_string()).collect();
        profile.spec.identity = Some(IdentityGrant {
            servers: owned(servers),
            audiences: owned(audiences),
            mount_service_account_token: owned(mounts),
        });
        profile
    }

    #[test]
    fn a_server_author_gets_no_token_of_the_pods_service_account_without_a_profile_grant() {
        let forbidden = ForbiddenAudiences::default();
        let profile = McpProfile::test("dev").servers(["notes"]);
        for server in
            [token_server("notes", "https://notes.example.com"), exchange_server("notes", "https://as.example")]
        {
            let refused = profile.identity_refusals(&server, &forbidden);
            assert_eq!(refused.len(), 1, "{refused:?}");
            let text = refused[0].to_string();
            assert!(text.contains("spec.identity.servers") && text.contains("McpProfile \"dev\""), "{text}");
            assert!(refused[0].is_token());
        }
        // Granted to another server, or for another audience: still refused.
        assert_eq!(
            granting(&["other"], &["*"], &[])
                .identity_refusals(&token_server("notes", "https://notes.example.com"), &forbidden)
                .len(),
            1
        );
        let refused = granting(&["notes"], &["https://other.example"], &[])
            .identity_refusals(&token_server("notes", "https://notes.example.com"), &forbidden);
        assert!(refused[0].to_string().contains("spec.identity.audiences"), "{}", refused[0]);
        // Granted: server and audience listed, or the audience by `*`.
        for grant in [granting(&["notes"], &["https://notes.example.com"], &[]), granting(&["*"], &["*"], &[])] {
            assert!(
                grant.identity_refusals(&token_server("notes", "https://notes.example.com"), &forbidden).is_empty()
            );
        }
    }

    #[test]
    fn a_star_grant_never_covers_the_api_servers_or_a_cloud_sts_audience() {
        let forbidden = ForbiddenAudiences::default().with("https://issuer.example.com/cluster-1");
        let star = granting(&["*"], &["*"], &[]);
        for audience in [
            "https://kubernetes.default.svc",
            "https://kubernetes.default.svc.cluster.local",
            "HTTPS://Kubernetes.Default.Svc.cluster.local",
            "kubernetes.default.svc",
            "sts.amazonaws.com",
            "api://AzureADTokenExchange",
            "//iam.googleapis.com/projects/1/locations/global/workloadIdentityPools/p/providers/x",
            "my-project.svc.id.goog",
            "https://issuer.example.com/cluster-1",
        ] {
            let refused = star.identity_refusals(&token_server("notes", audience), &forbidden);
            assert_eq!(refused.len(), 1, "{audience}");
            assert!(refused[0].to_string().contains("literally"), "{}", refused[0]);
            // Listed literally: the platform team meant it.
            let literal = granting(&["notes"], &[audience], &[]);
            assert!(literal.identity_refusals(&token_server("notes", audience), &forbidden).is_empty(), "{audience}");
        }
        assert!(
            star.identity_refusals(&token_server("notes", "https://kubernetes.example.com"), &forbidden).is_empty()
        );
    }

    #[test]
    fn mounting_the_api_token_needs_its_own_grant() {
        let forbidden = ForbiddenAudiences::default();
        let refused = granting(&["kube"], &["*"], &[]).identity_refusals(&mounting("kube"), &forbidden);
        assert_eq!(refused.len(), 1);
        assert!(!refused[0].is_token());
        assert!(refused[0].to_string().contains("spec.identity.mountServiceAccountToken"), "{}", refused[0]);
        assert!(granting(&[], &[], &["kube"]).identity_refusals(&mounting("kube"), &forbidden).is_empty());
        assert!(granting(&[], &[], &["*"]).identity_refusals(&mounting("kube"), &forbidden).is_empty());
    }

    #[test]
    fn globs_match_runs_of_characters() {
        assert!(glob("a*", "a") && glob("a*", "abc") && glob("*b", "ab") && glob("a*c*e", "abcde"));
        assert!(!glob("a*", "ba") && !glob("*b", "bc") && !glob("abc", "abcd") && !glob("a*aa", "aa"));
        assert!(glob("*", "") && glob("", ""));
    }
}
