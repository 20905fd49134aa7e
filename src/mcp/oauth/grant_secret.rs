//! A person's grant kept in a Secret (cluster mode, `authorizationCode.tokenSecretRef`): what the
//! login writes, what an agent reads, claims and writes back, and what the operator's condition
//! says. Pure: the Kubernetes calls are in `mcp::grant_store::secret`.
//!
//! - **The Secret says who may use it**, like any Secret a server references: its annotation
//!   `mcp.spear.dev/allowed-servers` must name the server, checked on every read (so removing
//!   the server from it stops the agents at their next renewal, without a pod restart).
//! - **A login never takes over another Secret.** It creates the Secret (type
//!   `mcp.spear.dev/oauth-grant`, labelled for the server, the annotation naming the server), or
//!   updates one of that type labelled for the same server; anything else is refused, so a
//!   registry author cannot point a person's login at a Secret that holds other data.
//! - **One renewal at a time over all pods.** A refresh token that rotates is spent by its first
//!   use; two pods renewing with it at once would leave one of them (and, with reuse detection,
//!   the grant) refused. An agent first claims the renewal with an annotation written under the
//!   Secret's `resourceVersion` (the API server's compare-and-swap), renews, and writes the
//!   result with the claim removed; the others wait for it and take the access token it wrote. A
//!   claim older than [`CLAIM_TTL`] is abandoned (its pod died mid-renewal) and may be taken.
//! - **Status without data.** The login and the agents record when the grant was renewed and
//!   whether a login is required in annotations, so the operator (which reads Secrets' metadata
//!   only) can show them on the McpServer.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use super::grant::{GrantError, StoredGrant};
use crate::api::keys::{
    ANNOTATION_GRANT_LOGIN_REQUIRED, ANNOTATION_GRANT_RENEWED_AT, ANNOTATION_GRANT_RENEWING, GRANT_SECRET_KEY,
    GRANT_SECRET_TYPE, LABEL_GRANT_FOR,
};
use crate::api::secret_grant::{ANNOTATION_ALLOWED_SERVERS, lists};

/// How long a renewal claim holds: longer than one token request with its timeout, short enough
/// that a pod that died mid-renewal holds the others up only briefly.
pub(crate) const CLAIM_TTL: Duration = Duration::from_secs(30);

/// Annotation values are free text; what an agent records of a refusal is kept short.
const MAX_REASON_CHARS: usize = 256;

/// Why a Secret cannot hold or give `server`'s grant. The text names the Secret and the fix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum GrantSecretError {
    #[error(
        "Secret {secret:?} does not allow McpServer {server:?}: its annotation {ANNOTATION_ALLOWED_SERVERS} must name \
         it (the login sets it when it creates the Secret)"
    )]
    NotPermitted { secret: String, server: String },
    #[error("Secret {secret:?} holds no grant (key {GRANT_SECRET_KEY}): a person runs `spearlet auth login`")]
    Empty { secret: String },
    #[error("Secret {secret:?}: {source}")]
    Invalid { secret: String, source: GrantError },
    #[error(
        "Secret {secret:?} exists and is not McpServer {server:?}'s grant ({why}): the login does not overwrite it; \
         choose another spec.http.auth.authorizationCode.tokenSecretRef.name, or delete that Secret"
    )]
    NotAGrant { secret: String, server: String, why: String },
}

/// `server`'s grant in `secret`, when the Secret allows the server.
pub(crate) fn grant_of(secret: &Secret, server: &str) -> Result<StoredGrant, GrantSecretError> {
    let name = secret.metadata.name.clone().unwrap_or_default();
    let allowed = secret.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_ALLOWED_SERVERS));
    if !allowed.is_some_and(|list| lists(list, server)) {
        return Err(GrantSecretError::NotPermitted { secret: name, server: server.to_string() });
    }
    let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(GRANT_SECRET_KEY)) else {
        return Err(GrantSecretError::Empty { secret: name });
    };
    StoredGrant::parse(&bytes.0).map_err(|source| GrantSecretError::Invalid { secret: name, source })
}

/// The Secret the login writes for `server`'s `grant`: `existing` updated (its other
/// annotations kept), or a new one named `name` in `namespace`.
pub(crate) fn login_secret(
    existing: Option<Secret>,
    name: &str,
    namespace: &str,
    server: &str,
    grant: &StoredGrant,
    now: u64,
) -> Result<Secret, GrantSecretError> {
    let secret = match existing {
        Some(secret) => {
            may_take(&secret, server)?;
            secret
        }
        None => Secret {
            metadata: ObjectMeta {
                name: Some(name.to_string()),
                namespace: Some(namespace.to_string()),
                labels: Some(BTreeMap::from([(LABEL_GRANT_FOR.to_string(), server.to_string())])),
                annotations: Some(BTreeMap::from([(ANNOTATION_ALLOWED_SERVERS.to_string(), server.to_string())])),
                ..ObjectMeta::default()
            },
            type_: Some(GRANT_SECRET_TYPE.to_string()),
            ..Secret::default()
        },
    };
    // `with_grant` also clears a refusal note and a renewal claim: a login replaces both.
    Ok(with_grant(secret, grant, now))
}

/// Whether a login for `server` may write its grant into `secret` (a grant Secret of `server`).
pub(crate) fn may_take(secret: &Secret, server: &str) -> Result<(), GrantSecretError> {
    match not_a_grant_for(secret, server) {
        None => Ok(()),
        Some(why) => Err(GrantSecretError::NotAGrant {
            secret: secret.metadata.name.clone().unwrap_or_default(),
            server: server.to_string(),
            why,
        }),
    }
}

/// Why `secret` is not a grant Secret of `server`, if it is not.
fn not_a_grant_for(secret: &Secret, server: &str) -> Option<String> {
    if secret.type_.as_deref() != Some(GRANT_SECRET_TYPE) {
        return Some(format!("its type is {:?}, not {GRANT_SECRET_TYPE}", secret.type_.as_deref().unwrap_or("Opaque")));
    }
    let label = secret.metadata.labels.as_ref().and_then(|l| l.get(LABEL_GRANT_FOR));
    if label.map(String::as_str) != Some(server) {
        return Some(format!("its label {LABEL_GRANT_FOR} is {:?}", label.map(String::as_str).unwrap_or("")));
    }
    None
}

/// `secret` holding `grant`, renewed at `now`, with no claim and no login required.
pub(crate) fn with_grant(secret: Secret, grant: &StoredGrant, now: u64) -> Secret {
    let mut secret = with_data(secret, grant);
    let annotations = secret.metadata.annotations.get_or_insert_default();
    annotations.insert(ANNOTATION_GRANT_RENEWED_AT.to_string(), rfc3339(now));
    annotations.remove(ANNOTATION_GRANT_RENEWING);
    annotations.remove(ANNOTATION_GRANT_LOGIN_REQUIRED);
    secret
}

/// `secret` holding `grant`, its annotations unchanged (a note in the grant, not a renewal).
pub(crate) fn with_data(mut secret: Secret, grant: &StoredGrant) -> Secret {
    secret.data.get_or_insert_default().insert(GRANT_SECRET_KEY.to_string(), ByteString(grant.to_json()));
    secret.string_data = None;
    secret
}

/// Who holds the renewal of `secret` at `now`, if anyone other than `holder` does.
pub(crate) fn claimed_by_other(secret: &Secret, holder: &str, now: u64) -> Option<String> {
    let claim = secret.metadata.annotations.as_ref()?.get(ANNOTATION_GRANT_RENEWING)?;
    let (by, at) = claim.rsplit_once(' ')?;
    let at: u64 = at.parse().ok()?;
    (by != holder && now < at.saturating_add(CLAIM_TTL.as_secs())).then(|| by.to_string())
}

/// `secret` claimed for renewal by `holder` at `now`.
pub(crate) fn claimed(mut secret: Secret, holder: &str, now: u64) -> Secret {
    secret
        .metadata
        .annotations
        .get_or_insert_default()
        .insert(ANNOTATION_GRANT_RENEWING.to_string(), format!("{holder} {now}"));
    secret
}

/// `secret` marked as needing a login (`reason`, shortened), its claim released.
pub(crate) fn login_required(mut secret: Secret, reason: &str, now: u64) -> Secret {
    let reason: String = reason.chars().filter(|c| !c.is_control()).take(MAX_REASON_CHARS).collect();
    let annotations = secret.metadata.annotations.get_or_insert_default();
    annotations.remove(ANNOTATION_GRANT_RENEWING);
    annotations.insert(ANNOTATION_GRANT_LOGIN_REQUIRED.to_string(), format!("{} {reason}", rfc3339(now)));
    secret
}

/// Why an agent recorded that `secret`'s grant needs a person, if it did: agents stop renewing
/// until a login replaces it, instead of spending requests on a grant known to be refused.
pub(crate) fn refused(secret: &Secret) -> Option<&str> {
    secret.metadata.annotations.as_ref()?.get(ANNOTATION_GRANT_LOGIN_REQUIRED).map(String::as_str)
}

/// What a grant Secret's metadata says, for the McpServer's condition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum GrantPresence {
    /// The Secret does not exist (or the operator cannot read it).
    Missing,
    /// An agent recorded that the authorization server refused the grant.
    LoginRequired(String),
    /// Stored; renewed (or logged in) at the time given, if recorded.
    Stored { renewed_at: Option<String> },
}

/// See [`GrantPresence`]; `annotations` `None` when the Secret does not exist.
pub(crate) fn presence(annotations: Option<&BTreeMap<String, String>>) -> GrantPresence {
    let Some(annotations) = annotations else { return GrantPresence::Missing };
    if let Some(reason) = annotations.get(ANNOTATION_GRANT_LOGIN_REQUIRED) {
        return GrantPresence::LoginRequired(reason.clone());
    }
    GrantPresence::Stored { renewed_at: annotations.get(ANNOTATION_GRANT_RENEWED_AT).cloned() }
}

fn rfc3339(unix: u64) -> String {
    jiff::Timestamp::from_second(i64::try_from(unix).unwrap_or(i64::MAX))
        .unwrap_or(jiff::Timestamp::UNIX_EPOCH)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::oauth::grant::tests::sample;

    fn created() -> Secret {
        login_secret(None, "gh-grant", "team-a", "github", &sample(), 1_000).expect("new")
    }

    #[test]
    fn a_new_grant_secret_is_typed_labelled_and_allows_only_its_server() {
        let secret = created();
        assert_eq!(secret.type_.as_deref(), Some(GRANT_SECRET_TYPE));
        assert_eq!(secret.metadata.namespace.as_deref(), Some("team-a"));
        let labels = secret.metadata.labels.as_ref().expect("labels");
        assert_eq!(labels.get(LABEL_GRANT_FOR).map(String::as_str), Some("github"));
        let annotations = secret.metadata.annotations.as_ref().expect("annotations");
        assert_eq!(annotations.get(ANNOTATION_ALLOWED_SERVERS).map(String::as_str), Some("github"));
        assert_eq!(annotations.get(ANNOTATION_GRANT_RENEWED_AT).map(String::as_str), Some("1970-01-01T00:16:40Z"));
        assert_eq!(grant_of(&secret, "github").expect("read back"), sample());
        assert!(matches!(grant_of(&secret, "jira"), Err(GrantSecretError::NotPermitted { .. })));
    }

    #[test]
    fn a_login_updates_its_servers_grant_secret_and_refuses_any_other() {
        let mut marked = login_required(created(), "invalid_grant", 2_000);
        marked.metadata.annotations.get_or_insert_default().insert("owner-note".into(), "kept".into());
        let mut newer = sample();
        newer.refresh_token = Some("fresh".into());
        let updated = login_secret(Some(marked), "gh-grant", "team-a", "github", &newer, 3_000).expect("update");
        assert_eq!(grant_of(&updated, "github").expect("read").refresh_token.as_deref(), Some("fresh"));
        let annotations = updated.metadata.annotations.as_ref().expect("annotations");
        assert!(!annotations.contains_key(ANNOTATION_GRANT_LOGIN_REQUIRED), "the login clears the refusal");
        assert_eq!(annotations.get("owner-note").map(String::as_str), Some("kept"));

        // Another server's grant, an Opaque Secret with the server's label, a Secret of the
        // type without a label: never overwritten.
        let mut opaque = created();
        opaque.type_ = Some("Opaque".into());
        let mut unlabelled = created();
        unlabelled.metadata.labels = None;
        for (other, server) in [(created(), "jira"), (opaque, "github"), (unlabelled, "github")] {
            let refused = login_secret(Some(other), "gh-grant", "team-a", server, &sample(), 3_000);
            assert!(matches!(refused, Err(GrantSecretError::NotAGrant { .. })), "{server}: {refused:?}");
        }
    }

    #[test]
    fn reading_needs_the_annotation_and_the_key() {
        let mut secret = created();
        secret.metadata.annotations.get_or_insert_default().insert(ANNOTATION_ALLOWED_SERVERS.into(), "jira, *".into());
        assert!(grant_of(&secret, "github").is_ok(), "\"*\" allows every server");
        secret.metadata.annotations.get_or_insert_default().insert(ANNOTATION_ALLOWED_SERVERS.into(), "git".into());
        assert!(matches!(grant_of(&secret, "github"), Err(GrantSecretError::NotPermitted { .. })));
        secret.metadata.annotations = None;
        assert!(matches!(grant_of(&secret, "github"), Err(GrantSecretError::NotPermitted { .. })));
        let mut empty = created();
        empty.data = None;
        assert!(matches!(grant_of(&empty, "github"), Err(GrantSecretError::Empty { .. })));
        let mut corrupt = created();
        corrupt.data.get_or_insert_default().insert(GRANT_SECRET_KEY.into(), ByteString(b"{nope".to_vec()));
        assert!(matches!(grant_of(&corrupt, "github"), Err(GrantSecretError::Invalid { .. })));
    }

    #[test]
    fn a_claim_holds_others_off_until_it_is_released_or_stale() {
        let secret = claimed(created(), "pod-a", 100);
        assert_eq!(claimed_by_other(&secret, "pod-b", 100).as_deref(), Some("pod-a"));
        assert_eq!(claimed_by_other(&secret, "pod-a", 100), None, "one's own claim");
        assert_eq!(claimed_by_other(&secret, "pod-b", 100 + CLAIM_TTL.as_secs()), None, "stale");
        let renewed = with_grant(secret, &sample(), 105);
        assert_eq!(claimed_by_other(&renewed, "pod-b", 105), None, "released with the result");
        let refused = login_required(claimed(created(), "pod-a", 100), "invalid_grant", 101);
        assert_eq!(claimed_by_other(&refused, "pod-b", 101), None, "released with the refusal");
    }

    #[test]
    fn presence_comes_from_annotations_only() {
        assert_eq!(presence(None), GrantPresence::Missing);
        let secret = created();
        assert_eq!(
            presence(secret.metadata.annotations.as_ref()),
            GrantPresence::Stored { renewed_at: Some("1970-01-01T00:16:40Z".into()) }
        );
        let reason = format!("invalid_grant\n{}", "x".repeat(1_000));
        let refused = login_required(secret, &reason, 2_000);
        let GrantPresence::LoginRequired(why) = presence(refused.metadata.annotations.as_ref()) else {
            panic!("login required")
        };
        assert!(why.starts_with("1970-01-01T00:33:20Z invalid_grant") && !why.contains('\n'), "{why}");
        assert!(why.chars().count() <= MAX_REASON_CHARS + 21, "{why}");
    }
}
