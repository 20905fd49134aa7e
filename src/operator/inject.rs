//! Pod mutation for the injecting webhook, as a pure function: unit-tested on plain objects,
//! without an API server.
//!
//! ```text
//! Pod + namespace labels + McpProfile + its McpServers + InjectConfig
//!   │
//!   ├─ gate ──▶ Skip  (namespace not enabled · inject: "false" · no profile annotation · already injected)
//!   ├─ check ─▶ Deny  (unknown profile · name, port or env collision · hostNetwork, hostPID,
//!   │                  shareProcessNamespace · bad annotation)
//!   └─ plan ──▶ volumes, init containers, sidecars, env ──ops──▶ json_patch::Patch
//!                                                                 └─apply to the pod──▶ Patch { patch, pod }
//! ```
//!
//! The patch is built operation by operation (not by diffing two pods) so that it inserts at the
//! front of `initContainers` and appends elsewhere, as a reviewer expects to read it, and never
//! rewrites anything the pod already had. The returned pod is that patch applied to the input, so
//! the two can never disagree.
//!
//! What an injected pod looks like, and why (container order, users, sidecar isolation, the
//! marker, argv and env values, Secrets, auth tokens, the copy command): `src/operator/README.md`,
//! "Pod injection".

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation};
use k8s_openapi::api::core::v1::{
    Capabilities, Container, ContainerPort, EmptyDirVolumeSource, EnvVar, EnvVarSource, ExecAction, HTTPGetAction,
    Lifecycle, LifecycleHandler, ObjectFieldSelector, Pod, Probe, ProjectedVolumeSource, ResourceRequirements,
    SeccompProfile, SecretKeySelector, SecurityContext, ServiceAccountTokenProjection, Volume, VolumeMount,
    VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde_json::Value;
use thiserror::Error;

use crate::api::api_key::ApiKey;
use crate::api::env_ref::{self, Segment};
use crate::api::identity::{ForbiddenAudiences, IdentityRefusal};
use crate::api::keys::{
    ADMIN_PORT_NAME, AGENT_CONTAINER, ANNOTATION_INJECT, ANNOTATION_INJECTED, ANNOTATION_PROFILE, AUTH_TOKEN_DIR,
    BIN_DIR, ENV_ADMIN_ADDR, ENV_API_KEY, ENV_CHAT_URL, ENV_EXTRA_CA_PEM, ENV_GRANTED_DESTINATIONS, ENV_GRPC_ADDR,
    ENV_HTTP_ADDR, ENV_MCP_URL, ENV_POD_NAME, ENV_POD_NAMESPACE, ENV_PROFILE, ENV_SECRET_REFS, ENV_SIDECAR_SERVERS,
    ENV_SOCKET_DIR, ENV_UPSTREAM_API_KEY, IMAGE_SPEARLET, INIT_CONTAINER, INJECTION_ENABLED, LABEL_INJECTION,
    PORT_ADMIN, PORT_GRPC, PORT_HTTP, RUN_DIR, SERVICE_ACCOUNT_DIR, SIDECAR_PREFIX, SOCKET_VOLUME_PREFIX, SPEARLET,
    TMP_VOLUME_PREFIX, VOLUME_AUTH_TOKENS, VOLUME_BIN, VOLUME_NO_TOKEN,
};
use crate::api::names::{SOCKET_FILE, http_destination, secret_env_var, secret_ref_id, short_hash};
use crate::api::secret_grant::{Referrer, SecretGrants, SecretRef, grant_secret_ref};
use crate::api::validate::is_dns1123_subdomain;
use crate::api::{McpProfile, McpServer, StdioSpec};

/// Scratch directory of a server sidecar (its own `emptyDir`; the root filesystem is read-only).
pub const SIDECAR_TMP: &str = "/tmp";
/// uid of the agent and the init container, and gid of every injected container (distroless
/// `nonroot`). The server sidecars get uids of their own ([`sidecar_uid`]).
pub(crate) const INJECTED_UID: i64 = 65532;
/// First server sidecar uid.
const SIDECAR_UID_BASE: i64 = 65600;

/// Longest container or volume name (a DNS-1123 label).
const MAX_NAME_LEN: usize = 63;
/// Hex characters of the hash that keeps a shortened sidecar name unique.
const NAME_HASH_LEN: usize = 8;
/// How long the agent may take to be ready: two minutes, long enough for a cold API server
/// watch; after that the kubelet restarts the agent, which is visible, rather than holding the
/// pod forever. As a native sidecar the agent has a postStart hook (`spearlet wait-ready`) that
/// waits that long, so the app starts the moment the first lists are in; as a plain container
/// (no native sidecars, where nothing waits for it) a startup probe on `/startupz` with these
/// figures.
const STARTUP_PERIOD_SECONDS: i32 = 1;
const STARTUP_FAILURE_THRESHOLD: i32 = 120;
/// Readiness every 5 s, liveness every 10 s: the kubelet's usual cadence, cheap for `/healthz`.
const READINESS_PERIOD_SECONDS: i32 = 5;
const LIVENESS_PERIOD_SECONDS: i32 = 10;

// === config ===

/// The agent's ports: 4040 HTTP and 4041 gRPC on loopback (only the pod itself may use its
/// tools), 4042 admin on all interfaces (the kubelet's probes and metrics scrapes reach it).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ports {
    /// Chat completions and `/mcp`, on 127.0.0.1.
    pub http: u16,
    /// gRPC, on 127.0.0.1.
    pub grpc: u16,
    /// `/healthz`, `/readyz`, `/metrics`, on all interfaces.
    pub admin: u16,
}

impl Default for Ports {
    fn default() -> Self {
        Ports { http: PORT_HTTP, grpc: PORT_GRPC, admin: PORT_ADMIN }
    }
}

/// What the webhook injects with, from the operator's flags.
#[derive(Clone, Debug, PartialEq)]
pub struct InjectConfig {
    /// Image of the agent container (it runs the copied `/spear/bin/spearlet`).
    pub agent_image: String,
    /// Image of the init container; holds the static spearlet at `/spearlet` (and needs nothing
    /// else: the spearlet copies itself).
    pub spearlet_image: String,
    /// The API server supports native sidecars (`initContainers` with `restartPolicy: Always`,
    /// Kubernetes 1.29 and later).
    pub native_sidecars: bool,
    pub agent_resources: ResourceRequirements,
    /// Resources of a stdio server sidecar whose McpServer sets none.
    pub sidecar_default_resources: ResourceRequirements,
    pub ports: Ports,
    /// Extra environment of the agent container, after its own (the operator's `OTEL_*` trace
    /// settings, `telemetry::otel::agent_env`); empty adds nothing.
    pub agent_env: Vec<(String, String)>,
    /// Token audiences a profile's `identity.audiences: ["*"]` does not cover
    /// (`--forbidden-token-audiences`, plus the cluster's issuer when the operator learned it).
    pub forbidden_audiences: ForbiddenAudiences,
    /// CA certificates (PEM) the agent trusts beside the system's roots (the operator's
    /// `--extra-ca-file`), given inline so that nothing in the pod's namespace can add to them.
    pub extra_ca_pem: Option<std::sync::Arc<str>>,
}

impl InjectConfig {
    /// A config with native sidecars, the default ports and the default resources.
    pub fn new(agent_image: impl Into<String>, spearlet_image: impl Into<String>) -> Self {
        InjectConfig {
            agent_image: agent_image.into(),
            spearlet_image: spearlet_image.into(),
            native_sidecars: true,
            agent_resources: default_agent_resources(),
            sidecar_default_resources: default_sidecar_resources(),
            ports: Ports::default(),
            agent_env: Vec::new(),
            forbidden_audiences: ForbiddenAudiences::default(),
            extra_ca_pem: None,
        }
    }
}

fn resources(cpu_request: &str, memory_request: &str, memory_limit: &str) -> ResourceRequirements {
    let q = |s: &str| Quantity(s.to_string());
    ResourceRequirements {
        requests: Some(BTreeMap::from([
            ("cpu".to_string(), q(cpu_request)),
            ("memory".to_string(), q(memory_request)),
        ])),
        // A memory limit bounds a leak; no CPU limit, so a busy agent is throttled by its
        // neighbours' requests rather than by CFS quotas.
        limits: Some(BTreeMap::from([("memory".to_string(), q(memory_limit))])),
        ..ResourceRequirements::default()
    }
}

/// The agent's default resources: a small Rust process holding a few sessions.
pub(crate) fn default_agent_resources() -> ResourceRequirements {
    resources("50m", "64Mi", "256Mi")
}

/// A server sidecar's default resources: room for a Node.js or Python MCP server.
pub(crate) fn default_sidecar_resources() -> ResourceRequirements {
    resources("50m", "128Mi", "512Mi")
}

/// The copy init container's resources: one file copied (`spearlet install`).
fn init_resources() -> ResourceRequirements {
    resources("10m", "16Mi", "64Mi")
}

// === decision ===

/// Why a pod is admitted unchanged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SkipReason {
    /// The namespace lacks `mcp.spear.dev/injection=enabled`.
    NamespaceNotEnabled,
    /// The pod has `mcp.spear.dev/inject: "false"`.
    OptedOut,
    /// The pod has no `mcp.spear.dev/profile` annotation.
    NoProfileAnnotation,
    /// The pod already carries the agent and the injection marker.
    AlreadyInjected,
}

impl SkipReason {
    /// A short, stable label for metrics and structured logs.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            SkipReason::NamespaceNotEnabled => "namespace_not_enabled",
            SkipReason::OptedOut => "opted_out",
            SkipReason::NoProfileAnnotation => "no_profile_annotation",
            SkipReason::AlreadyInjected => "already_injected",
        }
    }
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            SkipReason::NamespaceNotEnabled => "namespace is not labelled mcp.spear.dev/injection=enabled",
            SkipReason::OptedOut => "pod is annotated mcp.spear.dev/inject: \"false\"",
            SkipReason::NoProfileAnnotation => "pod has no mcp.spear.dev/profile annotation",
            SkipReason::AlreadyInjected => "pod is already injected",
        })
    }
}

/// What the webhook answers for one pod.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    /// Admit unchanged.
    Skip { reason: SkipReason },
    /// Admit with this patch.
    Patch {
        /// RFC 6902 operations against the pod as received.
        patch: Patch,
        /// The pod with the patch applied.
        pod: Box<Pod>,
        /// Problems that do not block the pod, for the admission response's `warnings`.
        warnings: Vec<String>,
    },
    /// Refuse the pod.
    Deny {
        /// What is wrong and how to fix it.
        message: String,
    },
}

/// A failure that is a bug, not a property of the pod: the webhook answers with an error (and
/// the webhook's failure policy decides).
#[derive(Debug, Error)]
pub enum InjectError {
    /// The caller looked up a different profile than the pod names.
    #[error("the pod names McpProfile '{annotation}' but the webhook passed '{given}': the profile lookup is wrong")]
    ProfileMismatch {
        /// The pod's `mcp.spear.dev/profile`.
        annotation: String,
        /// The profile passed in.
        given: String,
    },
    /// The pod cannot be turned into JSON.
    #[error("cannot serialize the pod as JSON")]
    Serialize(#[source] serde_json::Error),
    /// The patch does not apply to the pod it was built for.
    #[error("the injection patch does not apply to the pod it was built for (a webhook bug)")]
    Apply(#[source] json_patch::PatchError),
    /// The patched pod is no longer a Pod.
    #[error("the injected pod does not parse as a Pod (a webhook bug)")]
    Deserialize(#[source] serde_json::Error),
}

fn deny(message: impl Into<String>) -> Result<Decision, InjectError> {
    Ok(Decision::Deny { message: message.into() })
}

// === mutate ===

/// Decides what to do with `pod`: skip it, refuse it, or inject the agent and the sidecars of
/// `profile`'s stdio `servers` (the McpServers the profile resolves to; the order does not
/// matter). `profile` is the McpProfile the pod's annotation names, `None` when it does not
/// exist. `pod.metadata.namespace` should be set (the webhook copies it from the request): the
/// messages name it. `api_key` is this pod's own (`api::api_key`), drawn by the caller.
pub fn mutate(
    pod: &Pod,
    namespace_labels: &BTreeMap<String, String>,
    profile: Option<&McpProfile>,
    servers: &[McpServer],
    secrets: &SecretGrants,
    config: &InjectConfig,
    api_key: &ApiKey,
) -> Result<Decision, InjectError> {
    // Checked again here although the webhook's namespaceSelector filters already: a
    // misconfigured webhook must not inject everywhere.
    if namespace_labels.get(LABEL_INJECTION).map(String::as_str) != Some(INJECTION_ENABLED) {
        return Ok(Decision::Skip { reason: SkipReason::NamespaceNotEnabled });
    }
    let annotation = |key: &str| pod.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str);
    match annotation(ANNOTATION_INJECT) {
        Some(v) if v.eq_ignore_ascii_case("false") => return Ok(Decision::Skip { reason: SkipReason::OptedOut }),
        Some(v) if v.eq_ignore_ascii_case("true") => {}
        // "no", "off", "0"…: the intent is unclear, and guessing either way surprises someone.
        Some(other) => {
            return deny(format!(
                "annotation {ANNOTATION_INJECT} is {other:?}: set it to \"false\" to opt the pod out of injection, or remove it"
            ));
        }
        None => {}
    }
    let Some(profile_name) = annotation(ANNOTATION_PROFILE) else {
        return Ok(Decision::Skip { reason: SkipReason::NoProfileAnnotation });
    };
    let namespace = pod.metadata.namespace.as_deref().unwrap_or("<unknown>");
    let Some(spec) = pod.spec.as_ref() else {
        return deny("the pod has no spec");
    };

    let own_init = spec.init_containers.as_deref().unwrap_or_default();
    let has_agent = spec.containers.iter().chain(own_init).any(|c| c.name == AGENT_CONTAINER);
    if has_agent && annotation(ANNOTATION_INJECTED).is_some() {
        return Ok(Decision::Skip { reason: SkipReason::AlreadyInjected });
    }
    if has_agent {
        return deny(format!(
            "the pod already has a container named {AGENT_CONTAINER:?} but no {ANNOTATION_INJECTED} annotation, so it was not injected by spear: rename that container, or set {ANNOTATION_INJECT}: \"false\""
        ));
    }
    if let Some(message) = invalid_profile_annotation(profile_name, namespace) {
        return deny(message);
    }
    let Some(profile) = profile else {
        return deny(format!(
            "McpProfile {profile_name:?} does not exist in namespace {namespace}: create it (kubectl get mcpprofiles -n {namespace} lists the existing ones), fix the {ANNOTATION_PROFILE} annotation, or set {ANNOTATION_INJECT}: \"false\""
        ));
    };
    let given = profile.metadata.name.as_deref().unwrap_or_default();
    if given != profile_name {
        return Err(InjectError::ProfileMismatch { annotation: profile_name.to_string(), given: given.to_string() });
    }
    if spec.share_process_namespace == Some(true) {
        return deny(format!(
            "the pod sets shareProcessNamespace, so every MCP server sidecar could see the agent's process and its environment (the model key and other servers' secrets) through /proc: remove shareProcessNamespace, or set {ANNOTATION_INJECT}: \"false\""
        ));
    }
    if spec.host_pid == Some(true) {
        return deny(format!(
            "the pod sets hostPID, so its containers share the node's process namespace and could read the agent's environment (the model key and other servers' secrets) and the sidecars' through /proc: remove hostPID, or set {ANNOTATION_INJECT}: \"false\""
        ));
    }
    if spec.host_network == Some(true) {
        return deny(format!(
            "the pod uses hostNetwork, so the agent's loopback ports would be open to every process on the node: remove hostNetwork, or set {ANNOTATION_INJECT}: \"false\""
        ));
    }

    let plan = match Plan::build(profile_name, profile, servers, secrets, config, api_key) {
        Ok(plan) => plan,
        Err(message) => return deny(message),
    };
    if let Some(message) = plan.conflicts(pod, config.ports) {
        return deny(message);
    }
    let patch = plan.patch(pod)?;
    let mut doc = serde_json::to_value(pod).map_err(InjectError::Serialize)?;
    json_patch::patch(&mut doc, &patch.0).map_err(InjectError::Apply)?;
    let patched: Pod = serde_json::from_value(doc).map_err(InjectError::Deserialize)?;
    Ok(Decision::Patch { patch, pod: Box::new(patched), warnings: plan.warnings })
}

/// The Deny message for a `mcp.spear.dev/profile` annotation that cannot name an McpProfile (not
/// a DNS-1123 subdomain of at most 253 characters); `None` when it can. The webhook checks it
/// before it reads anything, so a caller's text never reaches an API path.
pub fn invalid_profile_annotation(profile_name: &str, namespace: &str) -> Option<String> {
    if is_dns1123_subdomain(profile_name) {
        return None;
    }
    let shown: String = profile_name.chars().take(MAX_SHOWN_ANNOTATION).collect();
    let cut = if shown.len() < profile_name.len() { "…" } else { "" };
    Some(format!(
        "annotation {ANNOTATION_PROFILE} is {shown:?}{cut}, which is not a valid McpProfile name (a DNS-1123 subdomain: lower-case letters, digits, '-' and '.', at most 253 characters): use the metadata.name of an McpProfile in namespace {namespace}"
    ))
}

/// Characters of an invalid annotation quoted back in a denial.
const MAX_SHOWN_ANNOTATION: usize = 64;

// === impl Plan ===

/// Everything one pod gets, before it becomes patch operations.
#[derive(Debug)]
struct Plan {
    volumes: Vec<Volume>,
    /// Inserted at the front of `initContainers`, in this order.
    init_containers: Vec<Container>,
    /// Appended to `containers`.
    containers: Vec<Container>,
    /// Set on the pod's own containers (and, with native sidecars, its init containers).
    app_env: Vec<EnvVar>,
    /// `SPEAR_API_KEY`, first in the agent's and the pod's own containers' env (so that theirs can
    /// refer to it as `$(SPEAR_API_KEY)`); per pod, so not part of the marker hash.
    api_key: EnvVar,
    app_init_env: bool,
    warnings: Vec<String>,
}

impl Plan {
    /// The plan, or a Deny message.
    fn build(
        profile_name: &str,
        profile: &McpProfile,
        servers: &[McpServer],
        secrets: &SecretGrants,
        config: &InjectConfig,
        api_key: &ApiKey,
    ) -> Result<Self, String> {
        let mut warnings = Vec::new();
        // Sorted and deduplicated by name: the result must not depend on list order, or the
        // marker hash (and the pod) would change with it.
        let servers: BTreeMap<&str, &McpServer> =
            servers.iter().map(|s| (s.metadata.name.as_deref().unwrap_or_default(), s)).collect();

        let mut volumes = vec![empty_dir(VOLUME_BIN)];
        let mut sidecars = Sidecars::default();
        let mut agent_secrets = AgentSecrets::default();
        let mut auth_tokens = Vec::new();
        for (&name, server) in &servers {
            // The pod's identity goes only where the profile grants it (`api::identity`): a
            // refused token is left out, a refused API-token mount stays masked.
            let refused = profile.identity_refusals(server, &config.forbidden_audiences);
            let token_granted = !refused.iter().any(IdentityRefusal::is_token);
            let mount_granted = !refused.iter().any(|r| !r.is_token());
            for refusal in &refused {
                warnings.push(if refusal.is_token() {
                    format!("{refusal}; the token was not injected")
                } else {
                    refusal.to_string()
                });
            }
            if let Some(stdio) = &server.spec.stdio {
                let mut stdio = stdio.clone();
                stdio.mount_service_account_token &= mount_granted;
                if !sidecars.add(name, &stdio, &mut volumes, secrets, config, &mut warnings) {
                    continue;
                }
            }
            let refs_before = agent_secrets.refs.len();
            agent_secrets.add_server(name, server, secrets, &mut warnings)?;
            let token = if token_granted { auth_token(name, server) } else { None };
            // What was granted is bound to where it was granted to go.
            if let Some(http) = &server.spec.http
                && (agent_secrets.refs.len() > refs_before || token.is_some())
            {
                agent_secrets.destinations.push(format!("{name}={}", http_destination(http)));
            }
            auth_tokens.extend(token);
        }
        // One projected volume, one token per server (its own audience), mounted into the agent
        // only: no sidecar, and not the app, sees a token meant for a remote server. The mount
        // is the boundary, not the mode: the kubelet writes the files as root (it gives them to
        // a container's uid only when every container of the pod runs as that one uid), so
        // they are world-readable, as the kubelet's own default (0644) is, minus writes.
        if !auth_tokens.is_empty() {
            volumes.push(Volume {
                name: VOLUME_AUTH_TOKENS.to_string(),
                projected: Some(ProjectedVolumeSource { sources: Some(auth_tokens), default_mode: Some(0o444) }),
                ..Volume::default()
            });
        }
        agent_secrets.add_profile_secrets(profile_name, profile, secrets, &mut warnings)?;

        let Sidecars { containers: sidecars, servers: sidecar_servers } = sidecars;
        if sidecars.iter().any(|c| c.volume_mounts.iter().flatten().any(|m| m.name == VOLUME_NO_TOKEN)) {
            volumes.push(empty_dir(VOLUME_NO_TOKEN));
        }
        let AgentSecrets { env: secret_env, refs: secret_refs, destinations } = agent_secrets;
        let secret_env = secret_env.into_iter().map(|(name, (_, selector))| EnvVar {
            name,
            value_from: Some(EnvVarSource { secret_key_ref: Some(selector), ..EnvVarSource::default() }),
            ..EnvVar::default()
        });
        let api_key = env(ENV_API_KEY, api_key.expose());
        let delivered = Delivered { secret_refs: &secret_refs, destinations: &destinations };
        let mut agent = agent_container(profile_name, &sidecar_servers, delivered, secret_env.collect(), config);
        agent.env.get_or_insert_default().insert(0, api_key.clone());
        if volumes.iter().any(|v| v.name == VOLUME_AUTH_TOKENS) {
            agent.volume_mounts.get_or_insert_default().push(mount(VOLUME_AUTH_TOKENS, AUTH_TOKEN_DIR, true));
        }

        let mut init_containers = vec![init_container(config)];
        let mut containers = Vec::new();
        if config.native_sidecars {
            for mut c in sidecars.into_iter().chain([agent]) {
                c.restart_policy = Some("Always".to_string());
                init_containers.push(c);
            }
        } else {
            containers.extend(sidecars);
            containers.push(agent);
        }
        let ports = config.ports;
        let app_env = vec![
            env(ENV_MCP_URL, format!("http://127.0.0.1:{}/mcp", ports.http)),
            env(ENV_CHAT_URL, format!("http://127.0.0.1:{}/v1", ports.http)),
            env(ENV_GRPC_ADDR, format!("127.0.0.1:{}", ports.grpc)),
        ];
        Ok(Plan {
            volumes,
            init_containers,
            containers,
            app_env,
            api_key,
            app_init_env: config.native_sidecars,
            warnings,
        })
    }

    /// A Deny message when the pod already uses a name or port the plan needs.
    fn conflicts(&self, pod: &Pod, ports: Ports) -> Option<String> {
        let spec = pod.spec.as_ref()?;
        let own: Vec<&Container> = spec.containers.iter().chain(spec.init_containers.iter().flatten()).collect();
        let ours = self.init_containers.iter().chain(&self.containers);
        if let Some(c) = ours.clone().find(|c| own.iter().any(|o| o.name == c.name)) {
            return Some(format!(
                "the pod already has a container named {:?}, which spear needs for its injected containers: rename it, or set {ANNOTATION_INJECT}: \"false\"",
                c.name
            ));
        }
        // Its own value would not be this pod's key, and every call to the agent would be refused.
        let own_init = spec.init_containers.iter().flatten().filter(|_| self.app_init_env);
        if let Some(c) =
            spec.containers.iter().chain(own_init).find(|c| c.env.iter().flatten().any(|e| e.name == ENV_API_KEY))
        {
            return Some(format!(
                "container {:?} sets {ENV_API_KEY}, which spear sets to the pod's own key for the agent: remove it from the container's env (refer to it as $({ENV_API_KEY}) instead), or set {ANNOTATION_INJECT}: \"false\"",
                c.name
            ));
        }
        let volumes = spec.volumes.as_deref().unwrap_or_default();
        if let Some(v) = self.volumes.iter().find(|v| volumes.iter().any(|o| o.name == v.name)) {
            return Some(format!(
                "the pod already has a volume named {:?}, which spear needs for its injected containers: rename it, or set {ANNOTATION_INJECT}: \"false\"",
                v.name
            ));
        }
        let taken = [ports.http, ports.grpc, ports.admin];
        for c in &own {
            for p in c.ports.iter().flatten() {
                if u16::try_from(p.container_port).is_ok_and(|n| taken.contains(&n)) {
                    return Some(format!(
                        "container {:?} declares port {}, which the injected agent listens on (ports {}, {} and {} are taken): use another port, or set {ANNOTATION_INJECT}: \"false\"",
                        c.name, p.container_port, ports.http, ports.grpc, ports.admin
                    ));
                }
            }
        }
        None
    }

    /// The patch against `pod` (whose spec exists).
    fn patch(&self, pod: &Pod) -> Result<Patch, InjectError> {
        let mut ops = Vec::new();
        let hash = self.hash()?;
        match &pod.metadata.annotations {
            None => add(&mut ops, &["metadata", "annotations"], serde_json::json!({ ANNOTATION_INJECTED: hash })),
            Some(_) => add(&mut ops, &["metadata", "annotations", ANNOTATION_INJECTED], Value::String(hash)),
        }
        let spec = pod.spec.as_ref();
        let volumes = spec.and_then(|s| s.volumes.as_ref()).map(Vec::len);
        extend(&mut ops, &["spec", "volumes"], volumes, false, to_values(&self.volumes)?);
        let init = spec.and_then(|s| s.init_containers.as_ref());
        extend(&mut ops, &["spec", "initContainers"], init.map(Vec::len), true, to_values(&self.init_containers)?);
        let containers = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
        extend(&mut ops, &["spec", "containers"], Some(containers.len()), false, to_values(&self.containers)?);
        // A projected service-account token needs the pod's service account named: the API
        // server's ServiceAccount admission plugin names `default` when the pod does not, but
        // it may be off (or run after this webhook on some distributions), and the pod is then
        // refused ("must not be specified when serviceAccountName is not set").
        let names_account = spec.is_some_and(|s| s.service_account_name.is_some() || s.service_account.is_some());
        if !names_account && self.volumes.iter().any(|v| v.name == VOLUME_AUTH_TOKENS) {
            add(&mut ops, &["spec", "serviceAccountName"], Value::String("default".into()));
        }

        // The pod's own containers keep their indexes: injected init containers went in front
        // of its init containers, so theirs moved by that many.
        for (i, c) in containers.iter().enumerate() {
            self.app_env_ops(&mut ops, "containers", i, c)?;
        }
        if self.app_init_env {
            for (i, c) in init.into_iter().flatten().enumerate() {
                self.app_env_ops(&mut ops, "initContainers", i + self.init_containers.len(), c)?;
            }
        }
        Ok(Patch(ops))
    }

    /// Puts the pod's key first in `c`'s env and adds the app env vars `c` does not set itself
    /// (its own value wins).
    fn app_env_ops(
        &self,
        ops: &mut Vec<PatchOperation>,
        list: &str,
        index: usize,
        c: &Container,
    ) -> Result<(), InjectError> {
        let existing = c.env.as_deref().unwrap_or_default();
        let missing: Vec<&EnvVar> =
            self.app_env.iter().filter(|e| !existing.iter().any(|x| x.name == e.name)).collect();
        let index = index.to_string();
        let path = ["spec", list, &index, "env"];
        let key = to_values(std::slice::from_ref(&self.api_key))?;
        match c.env {
            // No env yet: one list, the key first.
            None => extend(ops, &path, None, false, key.into_iter().chain(to_values(&missing)?).collect()),
            Some(_) => {
                extend(ops, &path, Some(existing.len()), true, key);
                extend(ops, &path, Some(existing.len() + 1), false, to_values(&missing)?);
            }
        }
        Ok(())
    }

    /// The marker's value: a hash of everything injected but the pod's own key, so a pod shows
    /// which injection it got.
    fn hash(&self) -> Result<String, InjectError> {
        let keyless = |list: &[Container]| -> Vec<Container> {
            let mut list = list.to_vec();
            for c in &mut list {
                c.env.iter_mut().for_each(|env| env.retain(|e| e.name != ENV_API_KEY));
            }
            list
        };
        let (init_containers, containers) = (keyless(&self.init_containers), keyless(&self.containers));
        let injected = (&self.volumes, &init_containers, &containers, &self.app_env, self.app_init_env);
        let bytes = serde_json::to_vec(&injected).map_err(InjectError::Serialize)?;
        Ok(short_hash(&bytes))
    }
}

// === impl Sidecars ===

/// The stdio servers' bridge sidecars, in server-name order.
#[derive(Default)]
struct Sidecars<'a> {
    containers: Vec<Container>,
    /// (server, its sidecar's uid, its socket volume)
    servers: Vec<(&'a str, i64, String)>,
}

impl<'a> Sidecars<'a> {
    /// Adds the sidecar of stdio server `name` and its two volumes; `false` (with a warning) when
    /// the server has no image, and then nothing of it is injected.
    fn add(
        &mut self,
        name: &'a str,
        stdio: &StdioSpec,
        volumes: &mut Vec<Volume>,
        secrets: &SecretGrants,
        config: &InjectConfig,
        warnings: &mut Vec<String>,
    ) -> bool {
        let Some(image) = stdio.image.as_deref().filter(|i| !i.is_empty()) else {
            warnings.push(format!(
                "McpServer {name:?} has no spec.stdio.image, so it cannot run as a sidecar and was not injected: set spec.stdio.image"
            ));
            return false;
        };
        let tmp = dns_label(TMP_VOLUME_PREFIX, name);
        let sock = dns_label(SOCKET_VOLUME_PREFIX, name);
        volumes.push(empty_dir(&tmp));
        volumes.push(empty_dir(&sock));
        let uid = sidecar_uid(self.servers.len());
        let stdio = granted_env(name, stdio, secrets, warnings);
        let sidecar_volumes = SidecarVolumes { tmp: &tmp, sock: &sock };
        self.containers.push(bridge_container(name, image, &stdio, sidecar_volumes, uid, config, warnings));
        self.servers.push((name, uid, sock));
        true
    }
}

// === impl AgentSecrets ===

/// The Secret-backed values delivered to the agent: env var → (who needs it, the Secret key),
/// the `<server>/<field>` ids of `SPEAR_SECRET_REFS`, and the `<server>=<destination>` entries of
/// `SPEAR_GRANTED_DESTINATIONS`.
#[derive(Default)]
struct AgentSecrets {
    env: BTreeMap<String, (String, SecretKeySelector)>,
    refs: Vec<String>,
    destinations: Vec<String>,
}

impl AgentSecrets {
    /// Adds `server`'s header and `http.auth` Secret values that their Secrets grant it; a
    /// refused one is left out with a warning. A Deny message on a colliding env var.
    fn add_server(
        &mut self,
        name: &str,
        server: &McpServer,
        secrets: &SecretGrants,
        warnings: &mut Vec<String>,
    ) -> Result<(), String> {
        for header in server.spec.http.iter().flat_map(|h| &h.headers) {
            let Some(source) = &header.value_from else {
                warn_unread_template(name, &header.name, header.value.as_deref(), warnings);
                continue;
            };
            let reference = SecretRef {
                field: format!("spec.http.headers[{}].valueFrom.secretKeyRef", header.name),
                secret: source.secret_key_ref.name.clone(),
            };
            if let Err(refusal) = secrets.check(Referrer::Server(name), &reference) {
                warnings.push(format!("{refusal}; the header was not injected"));
                continue;
            }
            self.refs.push(secret_ref_id(name, &header.name));
            let var = secret_env_var(name, &header.name);
            let owner = format!("McpServer {name:?} header {:?}", header.name);
            insert_secret(&mut self.env, var, owner, source.secret_key_ref.clone())?;
        }
        let auth = server.spec.http.as_ref().and_then(|h| h.auth.as_ref());
        for (field_id, field, selector) in auth.iter().flat_map(|a| a.secret_values()) {
            let reference = SecretRef { field: field.to_string(), secret: selector.name.clone() };
            if let Err(refusal) = secrets.check(Referrer::Server(name), &reference) {
                warnings.push(format!("{refusal}; it was not injected"));
                continue;
            }
            self.refs.push(secret_ref_id(name, field_id));
            let owner = format!("McpServer {name:?} {field}");
            insert_secret(&mut self.env, secret_env_var(name, field_id), owner, selector.clone())?;
        }
        // The agent reads the grant Secret itself (and checks the grant again on every read);
        // said here so the pod's creator learns it now, not at the first call.
        if let Some(reference) = grant_secret_ref(server)
            && let Err(refusal) = secrets.check(Referrer::Server(name), &reference)
        {
            warnings.push(format!("{refusal}; the agent refuses the server until it does"));
        }
        Ok(())
    }

    /// Adds the profile's upstream API key and approval webhooks' signing keys, each when its
    /// Secret grants the profile (else a warning).
    fn add_profile_secrets(
        &mut self,
        profile_name: &str,
        profile: &McpProfile,
        secrets: &SecretGrants,
        warnings: &mut Vec<String>,
    ) -> Result<(), String> {
        let upstream_key =
            profile.spec.chat.as_ref().and_then(|c| c.upstream.as_ref()).and_then(|u| u.api_key_secret_ref.as_ref());
        if let Some(refusal) = secrets.profile_field_refusal(profile, "spec.chat.upstream.apiKeySecretRef") {
            warnings.push(format!("{refusal}; the upstream API key was not injected"));
        } else if let Some(key) = upstream_key {
            let selector = SecretKeySelector { name: key.name.clone(), key: key.key.clone(), optional: None };
            let owner = format!("McpProfile {profile_name:?} chat.upstream.apiKeySecretRef");
            insert_secret(&mut self.env, ENV_UPSTREAM_API_KEY.to_string(), owner, selector)?;
        }
        let approvers = profile.spec.approval.iter().flat_map(|a| a.approvers.iter().enumerate());
        for (i, webhook) in approvers.filter_map(|(i, a)| Some((i, a.webhook.as_ref()?))) {
            let Some(key) = &webhook.signing_secret_ref else { continue };
            let field = format!("spec.approval.approvers[{i}].webhook.signingSecretRef");
            if let Some(refusal) = secrets.profile_field_refusal(profile, &field) {
                warnings.push(format!("{refusal}; the approval webhook's signing key was not injected"));
                continue;
            }
            let selector = SecretKeySelector { name: key.name.clone(), key: key.key.clone(), optional: None };
            let owner = format!("McpProfile {profile_name:?} approval.approvers[{i}].webhook.signingSecretRef");
            let env = crate::api::names::approval_key_env_var(&key.name, &key.key);
            insert_secret(&mut self.env, env, owner, selector)?;
        }
        Ok(())
    }
}

/// The projected service-account token `server`'s `http.auth` needs, with its audience, at
/// `<AUTH_TOKEN_DIR>/<name>`; `None` when its mode uses no token of the pod.
fn auth_token(name: &str, server: &McpServer) -> Option<VolumeProjection> {
    let auth = server.spec.http.as_ref().and_then(|h| h.auth.as_ref())?;
    let (audience, seconds) = auth.service_account_token()?;
    Some(VolumeProjection {
        service_account_token: Some(ServiceAccountTokenProjection {
            audience: Some(audience.to_string()),
            expiration_seconds: Some(seconds),
            path: name.to_string(),
        }),
        ..VolumeProjection::default()
    })
}

/// Records `selector` under `var`; two different Secret keys on one var would hand one server
/// another's credential, so that is refused.
fn insert_secret(
    env: &mut BTreeMap<String, (String, SecretKeySelector)>,
    var: String,
    owner: String,
    selector: SecretKeySelector,
) -> Result<(), String> {
    match env.get(&var) {
        Some((first, existing)) if *existing != selector => Err(format!(
            "{first} and {owner} both need the agent env var {var} but name different Secret keys: rename one of the servers or headers so their SPEAR_SECRET_ names differ"
        )),
        Some(_) => Ok(()),
        None => {
            env.insert(var, (owner, selector));
            Ok(())
        }
    }
}

fn to_values<T: serde::Serialize>(items: &[T]) -> Result<Vec<Value>, InjectError> {
    items.iter().map(|i| serde_json::to_value(i).map_err(InjectError::Serialize)).collect()
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn add(ops: &mut Vec<PatchOperation>, path: &[&str], value: Value) {
    ops.push(PatchOperation::Add(AddOperation { path: pointer(path), value }));
}

/// Adds `items` to the list at `path`, which has `len` items (`None`: absent, so the whole list
/// is added, the parent being there). At the front: `add` at 0, 1, … inserts before the old
/// items in order; otherwise `-` appends.
fn extend(ops: &mut Vec<PatchOperation>, path: &[&str], len: Option<usize>, front: bool, items: Vec<Value>) {
    if items.is_empty() {
        return;
    }
    if len.is_none() {
        add(ops, path, Value::Array(items));
        return;
    }
    for (i, item) in items.into_iter().enumerate() {
        let index = if front { i.to_string() } else { "-".to_string() };
        let mut tokens = path.to_vec();
        tokens.push(&index);
        add(ops, &tokens, item);
    }
}

// === containers ===

fn empty_dir(name: &str) -> Volume {
    Volume { name: name.to_string(), empty_dir: Some(EmptyDirVolumeSource::default()), ..Volume::default() }
}

fn env(name: &str, value: impl Into<String>) -> EnvVar {
    EnvVar { name: name.to_string(), value: Some(value.into()), ..EnvVar::default() }
}

fn field_env(name: &str, field_path: &str) -> EnvVar {
    let field_ref = ObjectFieldSelector { field_path: field_path.to_string(), ..ObjectFieldSelector::default() };
    EnvVar {
        name: name.to_string(),
        value_from: Some(EnvVarSource { field_ref: Some(field_ref), ..EnvVarSource::default() }),
        ..EnvVar::default()
    }
}

fn mount(name: &str, path: &str, read_only: bool) -> VolumeMount {
    VolumeMount {
        name: name.to_string(),
        mount_path: path.to_string(),
        read_only: read_only.then_some(true),
        ..VolumeMount::default()
    }
}

/// The restricted Pod Security Standard, and a fixed uid (see the module header).
fn security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities { drop: Some(vec!["ALL".to_string()]), ..Capabilities::default() }),
        read_only_root_filesystem: Some(true),
        run_as_non_root: Some(true),
        run_as_user: Some(INJECTED_UID),
        run_as_group: Some(INJECTED_UID),
        seccomp_profile: Some(SeccompProfile { type_: "RuntimeDefault".to_string(), ..SeccompProfile::default() }),
        ..SecurityContext::default()
    }
}

fn http_probe(path: &str, port: u16, period: i32, failure_threshold: Option<i32>) -> Probe {
    Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_string()),
            port: IntOrString::Int(i32::from(port)),
            ..HTTPGetAction::default()
        }),
        period_seconds: Some(period),
        failure_threshold,
        ..Probe::default()
    }
}

/// `spearlet wait-ready` as the agent's postStart hook, bounded as the startup probe is.
fn wait_ready_hook(admin_port: u16) -> Lifecycle {
    let command = [
        SPEARLET.to_string(),
        "wait-ready".to_string(),
        "--admin-addr".to_string(),
        format!("127.0.0.1:{admin_port}"),
        "--timeout".to_string(),
        (STARTUP_PERIOD_SECONDS * STARTUP_FAILURE_THRESHOLD).to_string(),
    ];
    Lifecycle {
        post_start: Some(LifecycleHandler {
            exec: Some(ExecAction { command: Some(command.to_vec()) }),
            ..LifecycleHandler::default()
        }),
        ..Lifecycle::default()
    }
}

fn init_container(config: &InjectConfig) -> Container {
    Container {
        name: INIT_CONTAINER.to_string(),
        image: Some(config.spearlet_image.clone()),
        // The binary copies itself: the image needs no `cp` and no shell.
        command: Some(
            [IMAGE_SPEARLET, "install", "--to", SPEARLET].into_iter().map(str::to_string).collect::<Vec<_>>(),
        ),
        resources: Some(init_resources()),
        security_context: Some(security_context()),
        volume_mounts: Some(vec![mount(VOLUME_BIN, BIN_DIR, false)]),
        ..Container::default()
    }
}

/// What the agent is told about the values delivered to it.
struct Delivered<'a> {
    secret_refs: &'a [String],
    destinations: &'a [String],
}

fn agent_container(
    profile: &str,
    sidecar_servers: &[(&str, i64, String)],
    delivered: Delivered<'_>,
    secret_env: Vec<EnvVar>,
    config: &InjectConfig,
) -> Container {
    let ports = config.ports;
    let mut env = vec![
        env(ENV_PROFILE, profile),
        field_env(ENV_POD_NAMESPACE, "metadata.namespace"),
        // Approval webhooks are told which pod asks.
        field_env(ENV_POD_NAME, "metadata.name"),
        env(ENV_SOCKET_DIR, RUN_DIR),
        env(
            ENV_SIDECAR_SERVERS,
            sidecar_servers.iter().map(|(name, uid, _)| format!("{name}={uid}")).collect::<Vec<_>>().join(","),
        ),
        env(ENV_SECRET_REFS, delivered.secret_refs.join(",")),
        env(ENV_GRANTED_DESTINATIONS, delivered.destinations.join(",")),
        env(ENV_HTTP_ADDR, format!("127.0.0.1:{}", ports.http)),
        env(ENV_GRPC_ADDR, format!("127.0.0.1:{}", ports.grpc)),
        env(ENV_ADMIN_ADDR, format!("0.0.0.0:{}", ports.admin)),
    ];
    env.extend(secret_env);
    env.extend(config.agent_env.iter().map(|(name, value)| self::env(name, value)));
    if let Some(pem) = &config.extra_ca_pem {
        env.push(self::env(ENV_EXTRA_CA_PEM, &**pem));
    }
    Container {
        name: AGENT_CONTAINER.to_string(),
        image: Some(config.agent_image.clone()),
        command: Some(vec![SPEARLET.to_string(), "run".to_string()]),
        env: Some(env),
        // Only the admin port is declared: the other two listen on loopback, unreachable from
        // outside the pod, and declaring them would suggest otherwise.
        ports: Some(vec![ContainerPort {
            name: Some(ADMIN_PORT_NAME.to_string()),
            container_port: i32::from(ports.admin),
            protocol: Some("TCP".to_string()),
            ..ContainerPort::default()
        }]),
        // A native sidecar holds the app back until it has started: with the hook, that is the
        // moment the agent is ready; with a startup probe, the probe's next tick after it.
        lifecycle: config.native_sidecars.then(|| wait_ready_hook(ports.admin)),
        startup_probe: (!config.native_sidecars)
            .then(|| http_probe("/startupz", ports.admin, STARTUP_PERIOD_SECONDS, Some(STARTUP_FAILURE_THRESHOLD))),
        readiness_probe: Some(http_probe("/readyz", ports.admin, READINESS_PERIOD_SECONDS, None)),
        liveness_probe: Some(http_probe("/healthz", ports.admin, LIVENESS_PERIOD_SECONDS, None)),
        resources: Some(config.agent_resources.clone()),
        security_context: Some(security_context()),
        // Each server's socket directory, read-only: connect(2) works on a socket in a read-only
        // mount (the flag covers creating files), and the agent cannot replace a socket.
        volume_mounts: Some(
            std::iter::once(mount(VOLUME_BIN, BIN_DIR, true))
                .chain(sidecar_servers.iter().map(|(name, _, sock)| mount(sock, &format!("{RUN_DIR}/{name}"), true)))
                .collect(),
        ),
        ..Container::default()
    }
}

/// The volumes one server sidecar owns.
struct SidecarVolumes<'a> {
    /// `/tmp` and `HOME`.
    tmp: &'a str,
    /// Its socket directory.
    sock: &'a str,
}

/// The uid of the `index`-th server sidecar of a pod (in server-name order): distinct from the
/// agent's and from each other's, so no sidecar can pose as another (`SO_PEERCRED`) or reach
/// another's files. Above 65534 (`nobody`) so as not to share a uid with an image's own user.
pub(crate) fn sidecar_uid(index: usize) -> i64 {
    SIDECAR_UID_BASE + i64::try_from(index).unwrap_or(i64::MAX - SIDECAR_UID_BASE)
}

fn bridge_container(
    server: &str,
    image: &str,
    stdio: &StdioSpec,
    volumes: SidecarVolumes<'_>,
    uid: i64,
    config: &InjectConfig,
    warnings: &mut Vec<String>,
) -> Container {
    let mut args = vec![
        "bridge".to_string(),
        "--socket".to_string(),
        format!("{RUN_DIR}/{server}/{SOCKET_FILE}"),
        "--server-id".to_string(),
        server.to_string(),
        "--peer-uid".to_string(),
        INJECTED_UID.to_string(),
        "--".to_string(),
    ];
    args.push(escape_dollars(&stdio.command));
    args.extend(stdio.args.iter().map(|a| escape_dollars(a)));

    let mut env = Vec::new();
    for name in ["HOME", "TMPDIR"] {
        if !stdio.env.iter().any(|e| e.name == name) {
            env.push(self::env(name, SIDECAR_TMP));
        }
    }
    for (i, var) in stdio.env.iter().enumerate() {
        let mut var = var.clone();
        if let Some(value) = &var.value {
            let defined: BTreeSet<&str> = env.iter().map(|e: &EnvVar| e.name.as_str()).collect();
            let field = format!("spec.stdio.env[{i}].value");
            var.value = Some(kubelet_value(server, &field, value, &defined, warnings));
        }
        env.push(var);
    }

    Container {
        name: dns_label(SIDECAR_PREFIX, server),
        image: Some(image.to_string()),
        command: Some(vec![SPEARLET.to_string()]),
        args: Some(args),
        working_dir: stdio.working_dir.clone(),
        env: Some(env),
        resources: Some(stdio.resources.clone().unwrap_or_else(|| config.sidecar_default_resources.clone())),
        security_context: Some(SecurityContext { run_as_user: Some(uid), ..security_context() }),
        volume_mounts: Some({
            let mut mounts = vec![
                mount(VOLUME_BIN, BIN_DIR, true),
                mount(volumes.sock, &format!("{RUN_DIR}/{server}"), false),
                mount(volumes.tmp, SIDECAR_TMP, false),
            ];
            // An empty directory over the token path: the service-account admission plugin then
            // mounts no token there, and the server cannot call the API as the pod.
            if !stdio.mount_service_account_token {
                mounts.push(mount(VOLUME_NO_TOKEN, SERVICE_ACCOUNT_DIR, true));
            }
            mounts
        }),
        ..Container::default()
    }
}

/// `stdio` without the `secretKeyRef` env entries whose Secret does not allow `server` (each one
/// reported in `warnings`).
fn granted_env(server: &str, stdio: &StdioSpec, secrets: &SecretGrants, warnings: &mut Vec<String>) -> StdioSpec {
    let mut stdio = stdio.clone();
    stdio.env.retain(|var| {
        let Some(selector) = var.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()) else { return true };
        let reference = SecretRef {
            field: format!("spec.stdio.env[{}].valueFrom.secretKeyRef", var.name),
            secret: selector.name.clone(),
        };
        match secrets.check(Referrer::Server(server), &reference) {
            Ok(()) => true,
            Err(refusal) => {
                warnings.push(format!("{refusal}; the variable was not injected"));
                false
            }
        }
    });
    stdio
}

/// Warns about a literal header value with `${ENV:NAME}` references: in a pod the agent reads no
/// environment for them (see `mcp::config`), so only their defaults apply.
fn warn_unread_template(server: &str, header: &str, value: Option<&str>, warnings: &mut Vec<String>) {
    let Some(Ok(template)) = value.map(env_ref::parse) else { return };
    let unread: Vec<&str> = template
        .segments()
        .iter()
        .filter_map(|s| match s {
            Segment::Env { name, default: None } => Some(name.as_str()),
            _ => None,
        })
        .collect();
    if !unread.is_empty() {
        warnings.push(format!(
            "McpServer {server:?} header {header:?} references {} without a default, but in a pod the agent reads no environment for header values, so the server will be unavailable: take the value from a Secret (valueFrom.secretKeyRef) instead",
            unread.iter().map(|n| format!("${{ENV:{n}}}")).collect::<Vec<_>>().join(", ")
        ));
    }
}

/// `s` with every `$` doubled: the kubelet turns `$$` into `$` and expands nothing else, so the
/// process sees `s` exactly.
pub(crate) fn escape_dollars(s: &str) -> String {
    s.replace('$', "$$")
}

/// An `${ENV:...}` template rewritten for the kubelet's `$(VAR)` expansion (see the module
/// header). `defined` are the variables set before this one on the same container.
pub(crate) fn kubelet_value(
    server: &str,
    field: &str,
    value: &str,
    defined: &BTreeSet<&str>,
    warnings: &mut Vec<String>,
) -> String {
    let template = match env_ref::parse(value) {
        Ok(t) => t,
        Err(e) => {
            // Validation refuses this (Accepted=False); passed on literally so the server sees
            // what the manifest says.
            warnings.push(format!("McpServer {server:?} {field}: {e}; passed on literally"));
            return escape_dollars(value);
        }
    };
    let mut out = String::new();
    for segment in template.segments() {
        match segment {
            Segment::Literal(text) => out.push_str(&escape_dollars(text)),
            Segment::Env { name, .. } if defined.contains(name.as_str()) => out.push_str(&format!("$({name})")),
            Segment::Env { default: Some(default), .. } => out.push_str(&escape_dollars(default)),
            Segment::Env { name, default: None } => {
                warnings.push(format!(
                    "McpServer {server:?} {field} references ${{ENV:{name}}}, which is not set before it on the sidecar: define {name} earlier in spec.stdio.env (for example from a Secret), or give a default (${{ENV:{name}:-value}})"
                ));
                out.push_str(&format!("$({name})"));
            }
        }
    }
    out
}

/// `prefix + name`, shortened to a DNS-1123 label with a hash of `name` that keeps it unique.
fn dns_label(prefix: &str, name: &str) -> String {
    let full = format!("{prefix}{name}");
    if full.len() <= MAX_NAME_LEN {
        return full;
    }
    let hash = short_hash(name.as_bytes());
    let keep = MAX_NAME_LEN - prefix.len() - 1 - NAME_HASH_LEN;
    let head: String = name.chars().take(keep).collect();
    format!("{prefix}{}-{}", head.trim_end_matches('-'), &hash[..NAME_HASH_LEN.min(hash.len())])
}

#[cfg(test)]
mod tests;
