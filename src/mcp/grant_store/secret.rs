//! The grant Secret through the Kubernetes API (cluster mode): `get` and `update` of one Secret by
//! name, the only access to Secrets an agent has (its service account is granted exactly that;
//! docs/auth.md says how). What the documents mean is `oauth::grant_secret`.
//!
//! Refusals name the fix: a missing Secret says to log in, a 403 says which Role and binding the
//! pod's service account lacks.

use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, PostParams};

use crate::mcp::oauth::TokenError;

/// The Secrets of the agent's namespace that hold grants, and who is renewing (the pod).
#[derive(Clone)]
pub(crate) struct GrantSecrets {
    api: Api<Secret>,
    namespace: String,
    /// Names this agent's renewal claims (the pod's name).
    holder: String,
}

impl std::fmt::Debug for GrantSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "GrantSecrets({}, {})", self.namespace, self.holder)
    }
}

/// Why an update did not take.
#[derive(Debug)]
pub(crate) enum UpdateError {
    /// Someone else wrote the Secret since it was read (HTTP 409): read it again.
    Conflict,
    Failed(TokenError),
}

impl GrantSecrets {
    pub(crate) fn new(client: kube::Client, namespace: &str, holder: &str) -> Self {
        GrantSecrets {
            api: Api::namespaced(client, namespace),
            namespace: namespace.to_string(),
            holder: holder.to_string(),
        }
    }

    pub(crate) fn holder(&self) -> &str {
        &self.holder
    }

    pub(crate) fn namespace(&self) -> &str {
        &self.namespace
    }

    /// The Secret `name`, for `server`.
    pub(crate) async fn get(&self, name: &str, server: &str) -> Result<Secret, TokenError> {
        self.api.get(name).await.map_err(|e| self.refusal(e, "get", name, server))
    }

    /// Writes `secret` if nobody wrote it since it was read (its `resourceVersion`).
    pub(crate) async fn update(&self, secret: &Secret, server: &str) -> Result<Secret, UpdateError> {
        let name = secret.metadata.name.clone().unwrap_or_default();
        match self.api.replace(&name, &PostParams::default(), secret).await {
            Ok(written) => Ok(written),
            Err(kube::Error::Api(status)) if status.code == 409 => Err(UpdateError::Conflict),
            Err(e) => Err(UpdateError::Failed(self.refusal(e, "update", &name, server))),
        }
    }

    fn refusal(&self, error: kube::Error, verb: &str, name: &str, server: &str) -> TokenError {
        let namespace = &self.namespace;
        match &error {
            kube::Error::Api(status) if status.code == 404 => TokenError::lasting(format!(
                "the grant Secret {name:?} does not exist in namespace {namespace}: a person runs `spearlet auth login \
                 --server {server} -n {namespace}` to consent"
            )),
            kube::Error::Api(status) if status.code == 403 => TokenError::lasting(format!(
                "the pod's service account may not {verb} the grant Secret {name:?}: grant it get and update on that \
                 Secret by name, e.g. `kubectl create role spear-grant-{server} -n {namespace} --verb=get,update \
                 --resource=secrets --resource-name={name}` and `kubectl create rolebinding spear-grant-{server} -n \
                 {namespace} --role=spear-grant-{server} --serviceaccount={namespace}:<the pod's service account>`"
            )),
            _ => TokenError::transient(format!("{verb} of the grant Secret {name:?}: {error}")),
        }
    }
}
