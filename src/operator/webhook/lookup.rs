//! What one review reads from the API server ([`Inputs`]), behind the [`Lookup`] trait so the
//! handler runs without one. [`KubeLookup`] reads directly, each read bounded; the webhook's
//! cache answers from memory and reads through it. A leaf: it imports nothing of the webhook.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::Client;
use kube::api::{Api, ListParams};
use thiserror::Error;

use crate::api::keys::{ANNOTATION_INJECT, ANNOTATION_PROFILE};
use crate::api::secret_grant::{SecretGrants, profile_secret_refs, server_secret_refs};
use crate::api::{McpProfile, McpServer};

/// Why one API read failed.
#[derive(Debug, Error)]
pub enum LookupError {
    /// The API server answered with an error.
    #[error("reading {what} failed")]
    Kube {
        /// What was read.
        what: String,
        #[source]
        source: kube::Error,
    },
    /// The API server did not answer in time.
    #[error("reading {what} took longer than {timeout:?}")]
    Timeout {
        /// What was read.
        what: String,
        timeout: Duration,
    },
}

/// What one review needs from the API server.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub namespace_labels: BTreeMap<String, String>,
    /// The profile the pod names, `None` when it does not exist (or none was asked for).
    pub profile: Option<McpProfile>,
    /// McpServers of the namespace, at least those the profile resolves to (empty when no
    /// profile was asked for or it does not exist); `profile_servers` picks the profile's.
    pub servers: Vec<McpServer>,
    /// The annotations of the Secrets the profile and its servers reference (metadata only).
    pub secrets: SecretGrants,
}

/// The webhook's read access to the API server, a trait so the handler can run without one:
/// the Kubernetes implementation is [`KubeLookup`]; tests and benches pass fixed inputs.
pub trait Lookup: Send + Sync + 'static {
    /// The namespace's labels and, when `profile` is given, that McpProfile and the namespace's
    /// McpServers.
    fn fetch(&self, namespace: &str, profile: Option<&str>)
    -> impl Future<Output = Result<Inputs, LookupError>> + Send;
}

/// [`Lookup`] by direct, bounded reads: [`CachedLookup`](super::CachedLookup) falls back to it
/// on a miss and before its stores have listed.
#[derive(Clone)]
pub struct KubeLookup {
    client: Client,
    timeout: Duration,
}

impl KubeLookup {
    /// Reads through `client`, each read bounded by `timeout`.
    pub fn new(client: Client, timeout: Duration) -> Self {
        KubeLookup { client, timeout }
    }

    async fn bounded<T>(
        &self,
        what: impl Fn() -> String,
        read: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, LookupError> {
        match tokio::time::timeout(self.timeout, read).await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(source)) => Err(LookupError::Kube { what: what(), source }),
            Err(_) => Err(LookupError::Timeout { what: what(), timeout: self.timeout }),
        }
    }
}

impl Lookup for KubeLookup {
    async fn fetch(&self, namespace: &str, profile: Option<&str>) -> Result<Inputs, LookupError> {
        let labels = self.namespace_labels(namespace);
        let Some(name) = profile else {
            return Ok(Inputs { namespace_labels: labels.await?, ..Inputs::default() });
        };
        let (namespace_labels, profile) = tokio::try_join!(labels, self.profile(namespace, name))?;
        let (servers, secrets) = match &profile {
            Some(profile) => {
                let servers = self.servers(namespace, profile).await?;
                let secrets = self.secrets(namespace, profile, &servers).await?;
                (servers, secrets)
            }
            None => Default::default(),
        };
        Ok(Inputs { namespace_labels, profile, servers, secrets })
    }
}

impl KubeLookup {
    /// The namespace's labels (metadata GET).
    pub(crate) async fn namespace_labels(&self, namespace: &str) -> Result<BTreeMap<String, String>, LookupError> {
        let namespaces: Api<Namespace> = Api::all(self.client.clone());
        let meta = self.bounded(|| format!("Namespace {namespace}"), namespaces.get_metadata(namespace)).await?;
        Ok(meta.metadata.labels.unwrap_or_default())
    }

    /// The McpProfile, `None` when it does not exist.
    pub(crate) async fn profile(&self, namespace: &str, name: &str) -> Result<Option<McpProfile>, LookupError> {
        let profiles: Api<McpProfile> = Api::namespaced(self.client.clone(), namespace);
        self.bounded(|| format!("McpProfile {namespace}/{name}"), profiles.get_opt(name)).await
    }

    /// The McpServers `profile` may resolve to. Named servers are read with GETs in parallel,
    /// not a LIST: a GET is a quorum read from etcd (about 2 ms), while a consistent LIST is
    /// served from the watch cache only once that cache has caught up with etcd, which right
    /// after other writes (pods being created) took 60-90 ms on the test control plane. A
    /// `serverSelector` needs the LIST; it covers the named servers too.
    pub(crate) async fn servers(&self, namespace: &str, profile: &McpProfile) -> Result<Vec<McpServer>, LookupError> {
        if profile.spec.server_selector.is_some() {
            let api: Api<McpServer> = Api::namespaced(self.client.clone(), namespace);
            let all = ListParams::default();
            return Ok(self.bounded(|| format!("McpServers in {namespace}"), api.list(&all)).await?.items);
        }
        let names: Vec<&str> = profile.spec.servers.iter().map(String::as_str).collect();
        self.servers_named(namespace, &names).await
    }

    /// The named McpServers that exist (GETs in parallel).
    pub(crate) async fn servers_named(&self, namespace: &str, names: &[&str]) -> Result<Vec<McpServer>, LookupError> {
        let api: Api<McpServer> = Api::namespaced(self.client.clone(), namespace);
        let reads = names.iter().map(|name| {
            let api = api.clone();
            async move { self.bounded(|| format!("McpServer {namespace}/{name}"), api.get_opt(name)).await }
        });
        Ok(futures::future::try_join_all(reads).await?.into_iter().flatten().collect())
    }

    /// The annotations of every Secret `profile` and the servers it selects among `servers`
    /// reference: metadata GETs in parallel (never the data, which the operator does not need).
    pub(crate) async fn secrets(
        &self,
        namespace: &str,
        profile: &McpProfile,
        servers: &[McpServer],
    ) -> Result<SecretGrants, LookupError> {
        let mut names: BTreeSet<String> = profile_secret_refs(profile).into_iter().map(|r| r.secret).collect();
        for server in servers.iter().filter(|s| profile.selects(s) && s.spec.is_enabled()) {
            names.extend(server_secret_refs(server).into_iter().map(|r| r.secret));
        }
        let mut grants = SecretGrants::default();
        if names.is_empty() {
            return Ok(grants);
        }
        let api: Api<Secret> = Api::namespaced(self.client.clone(), namespace);
        let reads = names.into_iter().map(|name| {
            let api = api.clone();
            async move {
                let meta = self.bounded(|| format!("Secret {namespace}/{name}"), api.get_metadata_opt(&name)).await?;
                Ok::<_, LookupError>((name, meta.map(|m| m.metadata.annotations.unwrap_or_default())))
            }
        });
        for (name, annotations) in futures::future::try_join_all(reads).await? {
            grants.insert(name, annotations);
        }
        Ok(grants)
    }
}

/// The McpServers `profile` resolves to among `servers`: those named in `spec.servers` plus
/// those `spec.serverSelector` matches, less the disabled ones (no sidecar, no Secret needed).
/// Named servers that do not exist are simply absent (the profile's status reports them).
pub(crate) fn profile_servers(profile: &McpProfile, servers: Vec<McpServer>) -> Vec<McpServer> {
    servers.into_iter().filter(|s| profile.selects(s) && s.spec.is_enabled()).collect()
}

/// The profile a pod asks for, unless it opted out (then nothing beyond the namespace is read).
pub(crate) fn wanted_profile(pod: &Pod) -> Option<&str> {
    let annotations = pod.metadata.annotations.as_ref()?;
    if annotations.get(ANNOTATION_INJECT).is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return None;
    }
    annotations.get(ANNOTATION_PROFILE).map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn profile_servers_are_the_named_plus_the_selected() {
        let profile = McpProfile::test("dev").servers(["a", "gone"]).selecting("team", "x");
        let all = vec![
            McpServer::test("a"),
            McpServer::test("b").label("team", "x"),
            McpServer::test("c").label("team", "y"),
        ];
        let names: Vec<_> = profile_servers(&profile, all).into_iter().filter_map(|s| s.metadata.name).collect();
        assert_eq!(names, ["a", "b"]);
    }

    #[test]
    fn a_disabled_server_gets_no_sidecar() {
        let profile = McpProfile::test("dev").servers(["a", "b"]);
        let mut off = McpServer::test("b");
        off.spec.enabled = Some(false);
        let names: Vec<_> = profile_servers(&profile, vec![McpServer::test("a"), off])
            .into_iter()
            .filter_map(|s| s.metadata.name)
            .collect();
        assert_eq!(names, ["a"]);
    }

    #[test]
    fn without_a_selector_only_named_servers() {
        let profile = McpProfile::test("dev").servers(["b"]);
        let all = vec![McpServer::test("a"), McpServer::test("b").label("team", "x")];
        let names: Vec<_> = profile_servers(&profile, all).into_iter().filter_map(|s| s.metadata.name).collect();
        assert_eq!(names, ["b"]);
    }

    #[test]
    fn opted_out_pods_need_no_profile() {
        let mut pod = Pod::default();
        assert_eq!(wanted_profile(&pod), None);
        pod.metadata.annotations = Some(BTreeMap::from([(ANNOTATION_PROFILE.to_string(), "dev".to_string())]));
        assert_eq!(wanted_profile(&pod), Some("dev"));
        pod.metadata.annotations.get_or_insert_default().insert(ANNOTATION_INJECT.to_string(), "False".to_string());
        assert_eq!(wanted_profile(&pod), None);
    }
}
