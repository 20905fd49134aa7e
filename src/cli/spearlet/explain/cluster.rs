//! Cluster mode of `spearlet explain`: the thin I/O that reads what a pod's agent would read.
//!
//! ```text
//! kubeconfig (--kubeconfig, --context; else $KUBECONFIG / ~/.kube/config; else in-cluster)
//!   --pod NAME ─GET pod─▶ profile annotation, injected?, admin port
//!   list McpProfiles (fieldSelector metadata.name=P) + list McpServers in the namespace
//!     ─▶ registry::snapshot_of_listed (the agent's own reading and validation) ─▶ Snapshot
//!   --connect: port-forward pod:admin port ─HTTP/1 GET /debug/effective─▶ the agent's live set
//! ```
//!
//! Decisions, and why:
//! - **The agent's listing, exactly**: the servers of the namespace and only the named profile,
//!   read as `DynamicObject`s through the same function the agent's watch uses, so an agent in
//!   sync reports the same revision and "pod on X, cluster at Y" means what it says.
//! - **A port-forward, not the API server's pod proxy**: `/debug/effective` answers loopback
//!   callers only (it shows the whole tool set). A port-forward's connection is made inside the
//!   pod's network namespace, to localhost, so the agent sees a loopback peer; the pod proxy
//!   arrives from the API server's address and is refused by design. A port-forward needs
//!   `create` on `pods/portforward`, which is also what `kubectl port-forward` needs, and nothing
//!   in the pod (no `exec`, no shell in the agent's image).
//! - **Every error names the fix**: the verb and resource RBAC refused (with the `kubectl auth
//!   can-i` line to check), the missing annotation or injection, the agent that cannot be
//!   reached and where to look.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use serde_json::{Value, json};

use crate::api::keys;
use crate::api::validate::{is_dns1123_label, is_dns1123_subdomain};
use crate::api::{McpProfile, McpProfileBinding, McpServer, Validate};
use crate::policy::binding::{self, Caller};
use crate::registry::snapshot::Snapshot;
use crate::registry::snapshot_of_listed;

/// How long the agent has to answer through the port-forward.
const AGENT_TIMEOUT: Duration = Duration::from_secs(15);
/// Largest `/debug/effective` answer read (a thousand tools per server fit many times over).
const MAX_ANSWER_BYTES: usize = 16 << 20;

/// The flags that pick a cluster and a namespace, shared by `explain` and `pin`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(in crate::cli::spearlet) struct KubeArgs {
    /// (cluster) The namespace; default: the kubeconfig context's, or the pod's own in a pod.
    #[arg(short = 'n', long, value_name = "NS")]
    pub(in crate::cli::spearlet) namespace: Option<String>,
    /// (cluster) A kubeconfig file; default: $KUBECONFIG, else ~/.kube/config, else in-cluster.
    #[arg(long, value_name = "FILE")]
    pub(in crate::cli::spearlet) kubeconfig: Option<PathBuf>,
    /// (cluster) The kubeconfig context to use; default: its current context.
    #[arg(long, value_name = "NAME")]
    pub(in crate::cli::spearlet) context: Option<String>,
}

impl KubeArgs {
    /// The cluster flags given, as spelled on the command line (to refuse them in local mode).
    pub(in crate::cli::spearlet) fn given(&self) -> Vec<&'static str> {
        let flags = [
            ("--namespace", self.namespace.is_some()),
            ("--kubeconfig", self.kubeconfig.is_some()),
            ("--context", self.context.is_some()),
        ];
        flags.iter().filter(|(_, set)| *set).map(|(flag, _)| *flag).collect()
    }
}

/// What to explain in the cluster.
#[derive(Debug)]
pub(super) enum Subject {
    Profile(String),
    Pod(String),
    /// A gateway caller: its user name and groups (as TokenReview reports them), and the
    /// profile it asks for (`Spear-Profile`), if any.
    Caller {
        user: String,
        groups: Vec<String>,
        requested: Option<String>,
    },
}

/// The cluster-mode flags.
#[derive(Debug)]
pub(super) struct Target {
    pub(super) subject: Subject,
    pub(super) namespace: Option<String>,
    pub(super) kubeconfig: Option<PathBuf>,
    pub(super) context: Option<String>,
}

/// Errors of cluster mode, each naming its fix.
#[derive(Debug, thiserror::Error)]
pub(in crate::cli::spearlet) enum ClusterError {
    #[error(
        "no Kubernetes configuration: no usable kubeconfig ({kubeconfig}) and not in a pod ({in_cluster}); pass \
         --kubeconfig FILE or set KUBECONFIG"
    )]
    NoConfig { kubeconfig: String, in_cluster: String },
    #[error("{flag}: {source}")]
    Kubeconfig {
        /// The flag whose value failed (`--kubeconfig FILE`, `--context NAME`).
        flag: String,
        #[source]
        source: kube::config::KubeconfigError,
    },
    #[error("cannot build a Kubernetes client from the configuration: {0}")]
    Client(#[source] kube::Error),
    #[error("'{value}' is not a valid {what}: {expected}")]
    InvalidName { value: String, what: &'static str, expected: &'static str },
    #[error(
        "the Kubernetes API refused to let you {verb} {resource} in namespace {namespace} ({message}): ask for a \
         Role that grants {verb} on {resource} there; check with `kubectl auth can-i {verb} {resource} -n {namespace}`"
    )]
    Forbidden { verb: &'static str, resource: String, namespace: String, message: String },
    #[error(
        "the Kubernetes API refused your credentials ({message}): log in again or pass another --kubeconfig/--context"
    )]
    Unauthorized { message: String },
    #[error(
        "the Kubernetes API does not serve {resource}: install the spear-mcp CRDs (the Helm chart, or \
         `spear-operator crds | kubectl apply -f -`)"
    )]
    NoCrds { resource: String },
    #[error(
        "pod {name} not found in namespace {namespace}: check the name and -n/--namespace (`kubectl get pods -n {namespace}`)"
    )]
    PodNotFound { name: String, namespace: String },
    #[error(
        "pod {namespace}/{name} has no {annotation} annotation, so it uses no McpProfile and sees no tools: set \
         `{annotation}: <profile>` in its pod template (then recreate the pod), or pass --profile to explain a profile"
    )]
    NoProfileAnnotation { name: String, namespace: String, annotation: &'static str },
    #[error(
        "McpProfile {profile} does not exist in namespace {namespace} (profiles there: {known}): create it, or fix \
         the name{hint}"
    )]
    ProfileNotFound { profile: String, namespace: String, known: String, hint: String },
    #[error("the gateway refuses {caller}: {reason}\n{log}")]
    CallerRefused { caller: String, reason: String, log: String },
    #[error("pod {namespace}/{name} has no {container} agent (it was not injected), so it sees no tools: {fix}")]
    NotInjected { name: String, namespace: String, container: &'static str, fix: String },
    #[error(
        "cannot reach the agent of pod {namespace}/{name} on its admin port {port} ({detail}): check that the pod is \
         Running and its {container} container ready (`kubectl get pod {name} -n {namespace}`, `kubectl logs \
         {name} -n {namespace} -c {container}`)"
    )]
    AgentUnreachable { name: String, namespace: String, port: u16, container: &'static str, detail: String },
    #[error("the agent of pod {namespace}/{name} answered {status} on /debug/effective: {body}")]
    AgentAnswer { name: String, namespace: String, status: u16, body: String },
    #[error("{what}: {source}")]
    Api {
        what: String,
        #[source]
        source: kube::Error,
    },
}

impl ClusterError {
    /// Whether the user fixes it by changing how the command is called (exit status 2).
    pub(in crate::cli::spearlet) fn is_usage(&self) -> bool {
        matches!(
            self,
            ClusterError::NoConfig { .. } | ClusterError::Kubeconfig { .. } | ClusterError::InvalidName { .. }
        )
    }
}

/// What cluster mode read.
pub(super) struct Found {
    pub(super) namespace: String,
    /// The kubeconfig context used, when a kubeconfig was.
    pub(super) context: Option<String>,
    pub(super) profile: String,
    pub(super) snapshot: Snapshot,
    pub(super) pod: Option<PodInfo>,
    /// The gateway caller's binding decision (with `--subject`).
    pub(super) caller: Option<CallerDecision>,
    /// The pod agent's `/debug/effective` answer (with `--connect`).
    pub(super) live: Option<Value>,
}

impl Found {
    /// The table's first line: where the registry came from.
    pub(super) fn source_line(&self) -> String {
        let context = self.context.as_deref().map(|c| format!(", context {c}")).unwrap_or_default();
        format!(
            "cluster: namespace {}{context} (McpServers and McpProfile {} from the API server)",
            self.namespace, self.profile
        )
    }

    pub(super) fn source_json(&self) -> Value {
        json!({"cluster": {"namespace": self.namespace, "context": self.context}})
    }
}

/// What a pod says about its MCP setup.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PodInfo {
    name: String,
    namespace: String,
    profile: String,
    injected: bool,
    admin_port: u16,
    phase: Option<String>,
}

impl PodInfo {
    /// Reads the profile annotation, whether the agent was injected and its admin port (pure).
    fn of(pod: &Pod, namespace: &str) -> Result<PodInfo, ClusterError> {
        let name = pod.metadata.name.clone().unwrap_or_default();
        let annotations = pod.metadata.annotations.as_ref();
        let profile = annotations.and_then(|a| a.get(keys::ANNOTATION_PROFILE)).cloned().ok_or_else(|| {
            ClusterError::NoProfileAnnotation {
                name: name.clone(),
                namespace: namespace.to_string(),
                annotation: keys::ANNOTATION_PROFILE,
            }
        })?;
        let spec = pod.spec.as_ref();
        let containers = spec.into_iter().flat_map(|s| s.containers.iter().chain(s.init_containers.iter().flatten()));
        let agent = containers.into_iter().find(|c| c.name == keys::AGENT_CONTAINER);
        let admin_port = agent
            .and_then(|c| c.ports.as_ref())
            .and_then(|ports| ports.iter().find(|p| p.name.as_deref() == Some(keys::ADMIN_PORT_NAME)))
            .and_then(|p| u16::try_from(p.container_port).ok())
            .unwrap_or(keys::PORT_ADMIN);
        let phase = pod.status.as_ref().and_then(|s| s.phase.clone());
        Ok(PodInfo { name, namespace: namespace.to_string(), profile, injected: agent.is_some(), admin_port, phase })
    }

    fn not_injected(&self) -> ClusterError {
        ClusterError::NotInjected {
            name: self.name.clone(),
            namespace: self.namespace.clone(),
            container: keys::AGENT_CONTAINER,
            fix: format!(
                "label its namespace {}={}, make sure it has no {}: \"false\" annotation and that the operator was \
                 running when it was created, then recreate it",
                keys::LABEL_INJECTION,
                keys::INJECTION_ENABLED,
                keys::ANNOTATION_INJECT
            ),
        }
    }

    /// One line for the table.
    pub(super) fn line(&self) -> String {
        let phase = self.phase.as_deref().unwrap_or("unknown");
        let injection = if self.injected {
            format!("injected (agent admin port {})", self.admin_port)
        } else {
            format!("NOT injected: {}", self.not_injected())
        };
        format!(
            "pod {}/{}: phase {phase}, profile {} (its {} annotation), {injection}",
            self.namespace,
            self.name,
            self.profile,
            keys::ANNOTATION_PROFILE
        )
    }

    pub(super) fn json(&self) -> Value {
        json!({
            "name": self.name, "namespace": self.namespace, "phase": self.phase, "profile": self.profile,
            "injected": self.injected, "adminPort": self.admin_port,
            "note": (!self.injected).then(|| self.not_injected().to_string()),
        })
    }
}

/// Reads the target's registry (and, with `connect`, the pod agent's live answer to
/// `/debug/effective?request=`).
pub(super) async fn read(target: &Target, connect: bool, request: Option<&str>) -> Result<Found, ClusterError> {
    let (config, context) = client_config(target.kubeconfig.as_deref(), target.context.as_deref()).await?;
    let namespace = target.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    check_name(&namespace, "namespace", "a DNS-1123 label (-n/--namespace)", is_dns1123_label)?;
    let client = Client::try_from(config).map_err(ClusterError::Client)?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &namespace);
    let (profile, pod) = match &target.subject {
        Subject::Profile(profile) => (profile.clone(), None),
        Subject::Pod(name) => {
            check_name(name, "pod name", "a DNS-1123 subdomain (--pod)", is_dns1123_subdomain)?;
            let pod = pods.get_opt(name).await.map_err(|e| api_error(e, "get", "pods", &namespace))?;
            let pod =
                pod.ok_or_else(|| ClusterError::PodNotFound { name: name.clone(), namespace: namespace.clone() })?;
            let info = PodInfo::of(&pod, &namespace)?;
            (info.profile.clone(), Some(info))
        }
        Subject::Caller { .. } => (String::new(), None),
    };
    let caller = match &target.subject {
        Subject::Caller { user, groups, requested } => {
            let caller = Caller { username: user.clone(), uid: None, groups: groups.clone() };
            Some(caller_decision(&client, &namespace, caller, requested.as_deref()).await?)
        }
        _ => None,
    };
    let profile = caller.as_ref().map_or(profile, |c| c.profile.clone());
    // Checked before it goes into a field selector, where a ',' would add a clause.
    check_name(&profile, "McpProfile name", "a DNS-1123 subdomain", is_dns1123_subdomain)?;
    let (profiles_api, servers_api) =
        (resource::<McpProfile>(&client, &namespace), resource::<McpServer>(&client, &namespace));
    let (profiles_name, servers_name) = (plural::<McpProfile>(), plural::<McpServer>());
    let by_name = ListParams::default().fields(&format!("metadata.name={profile}"));
    let profiles = profiles_api.list(&by_name).await.map_err(|e| api_error(e, "list", &profiles_name, &namespace))?;
    if profiles.items.is_empty() {
        let known = match profiles_api.list_metadata(&ListParams::default()).await {
            Ok(all) if all.items.is_empty() => "none".to_string(),
            Ok(all) => all.items.iter().filter_map(|p| p.metadata.name.clone()).collect::<Vec<_>>().join(", "),
            Err(_) => "not listed".to_string(),
        };
        let hint = match &pod {
            Some(pod) => format!(" in pod {}'s {} annotation", pod.name, keys::ANNOTATION_PROFILE),
            None => String::new(),
        };
        return Err(ClusterError::ProfileNotFound { profile, namespace, known, hint });
    }
    let servers =
        servers_api.list(&ListParams::default()).await.map_err(|e| api_error(e, "list", &servers_name, &namespace))?;
    let arcs = |list: kube::core::ObjectList<DynamicObject>| list.items.into_iter().map(Arc::new).collect::<Vec<_>>();
    let snapshot = snapshot_of_listed(&namespace, &arcs(servers), &arcs(profiles));
    let live = match (&pod, connect) {
        (Some(pod), true) if !pod.injected => return Err(pod.not_injected()),
        (Some(pod), true) => Some(debug_effective(&pods, pod, request).await?),
        _ => None,
    };
    Ok(Found { namespace, context, profile, snapshot, pod, caller, live })
}

/// A gateway caller's binding decision: the profile, and the log of every binding of the namespace.
#[derive(Debug)]
pub(super) struct CallerDecision {
    caller: Caller,
    profile: String,
    /// One line per binding: its profile and whether (and by which subject) it names the caller.
    log: Vec<String>,
}

impl CallerDecision {
    pub(super) fn lines(&self) -> Vec<String> {
        let groups = if self.caller.groups.is_empty() { "none".to_string() } else { self.caller.groups.join(", ") };
        let mut lines = vec![format!(
            "gateway caller: {} (groups: {groups}) gets McpProfile {}",
            self.caller.username, self.profile
        )];
        lines.extend(self.log.iter().map(|l| format!("  {l}")));
        lines
    }

    pub(super) fn json(&self) -> Value {
        json!({"user": self.caller.username, "groups": self.caller.groups, "profile": self.profile, "bindings": self.log})
    }
}

/// Reads the namespace's McpProfileBindings and decides as the gateway does (`policy::binding`).
async fn caller_decision(
    client: &Client,
    namespace: &str,
    caller: Caller,
    requested: Option<&str>,
) -> Result<CallerDecision, ClusterError> {
    let api: Api<McpProfileBinding> = Api::namespaced(client.clone(), namespace);
    let listed = api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error(e, "list", &plural::<McpProfileBinding>(), namespace))?;
    let mut valid = Vec::new();
    let mut log = Vec::new();
    for binding in listed.items {
        let name = binding.metadata.name.clone().unwrap_or_default();
        let problems = binding.validate();
        if let Some(problem) = problems.first() {
            log.push(format!("binding {name}: ignored, invalid ({problem})"));
            continue;
        }
        let verdict = match binding::subject_naming(&binding, &caller, namespace) {
            Some(s) => format!("names the caller ({:?} {})", s.kind, s.name),
            None => "does not name the caller".to_string(),
        };
        log.push(format!("binding {name} -> McpProfile {}: {verdict}", binding.spec.profile_ref.name));
        valid.push(binding);
    }
    if log.is_empty() {
        log.push(format!("no McpProfileBinding in namespace {namespace}"));
    }
    match binding::decide(&caller, namespace, &valid, requested) {
        Ok(bound) => Ok(CallerDecision { caller, profile: bound.profile, log }),
        Err(refused) => Err(ClusterError::CallerRefused {
            caller: caller.username,
            reason: refused.to_string(),
            log: log.join("\n"),
        }),
    }
}

/// The client configuration and the context used: `--kubeconfig FILE` (with `--context`), else
/// `$KUBECONFIG` or `~/.kube/config`, else the pod's service account, as kubectl looks.
async fn client_config(
    kubeconfig: Option<&Path>,
    context: Option<&str>,
) -> Result<(kube::Config, Option<String>), ClusterError> {
    let options = KubeConfigOptions { context: context.map(str::to_string), ..KubeConfigOptions::default() };
    let kubeconfig_flag = kubeconfig;
    let kubeconfig = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path)
            .map_err(|source| ClusterError::Kubeconfig { flag: format!("--kubeconfig {}", path.display()), source })?,
        // A KUBECONFIG that is set must be readable, as kubectl requires; only a missing
        // ~/.kube/config falls back to the pod's service account.
        None if std::env::var_os(keys::ENV_KUBECONFIG).is_some_and(|v| !v.is_empty()) => Kubeconfig::read()
            .map_err(|source| ClusterError::Kubeconfig { flag: keys::ENV_KUBECONFIG.to_string(), source })?,
        None => match Kubeconfig::read() {
            Ok(kubeconfig) => kubeconfig,
            Err(no_file) => {
                return match kube::Config::incluster() {
                    Ok(config) => Ok((config, None)),
                    Err(in_cluster) => Err(ClusterError::NoConfig {
                        kubeconfig: format!("~/.kube/config: {no_file}"),
                        in_cluster: in_cluster.to_string(),
                    }),
                };
            }
        },
    };
    let flag = match (context, kubeconfig_flag) {
        (Some(context), _) => format!("--context {context}"),
        (None, Some(path)) => format!("--kubeconfig {}", path.display()),
        (None, None) => "the kubeconfig (KUBECONFIG or ~/.kube/config)".to_string(),
    };
    let context = context.map(str::to_string).or_else(|| kubeconfig.current_context.clone());
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(|source| ClusterError::Kubeconfig { flag, source })?;
    Ok((config, context))
}

/// A client for the cluster `kube` picks, and the namespace (the flag's, else the context's).
pub(in crate::cli::spearlet) async fn client_for(kube: &KubeArgs) -> Result<(Client, String), ClusterError> {
    let (config, _) = client_config(kube.kubeconfig.as_deref(), kube.context.as_deref()).await?;
    let namespace = kube.namespace.clone().unwrap_or_else(|| config.default_namespace.clone());
    check_name(&namespace, "namespace", "a DNS-1123 label (-n/--namespace)", is_dns1123_label)?;
    Ok((Client::try_from(config).map_err(ClusterError::Client)?, namespace))
}

/// The one McpServer `name` of a namespace (default: the kubeconfig context's) as a snapshot,
/// read and validated as the agent reads it, for `spearlet pin` and `auth login`: (the client,
/// the namespace, the snapshot).
pub(in crate::cli::spearlet) async fn read_server(
    name: &str,
    kube: &KubeArgs,
) -> Result<(Client, String, Snapshot), ClusterError> {
    let (client, namespace) = client_for(kube).await?;
    // Checked before it goes into a field selector, where a ',' would add a clause.
    check_name(name, "McpServer name", "a DNS-1123 label", is_dns1123_label)?;
    let by_name = ListParams::default().fields(&format!("metadata.name={name}"));
    let servers = resource::<McpServer>(&client, &namespace)
        .list(&by_name)
        .await
        .map_err(|e| api_error(e, "list", &plural::<McpServer>(), &namespace))?;
    let servers: Vec<_> = servers.items.into_iter().map(Arc::new).collect();
    let snapshot = snapshot_of_listed(&namespace, &servers, &[]);
    Ok((client, namespace, snapshot))
}

fn check_name(
    value: &str,
    what: &'static str,
    expected: &'static str,
    valid: fn(&str) -> bool,
) -> Result<(), ClusterError> {
    if valid(value) { Ok(()) } else { Err(ClusterError::InvalidName { value: value.to_string(), what, expected }) }
}

/// `Api<DynamicObject>` for `K`: objects are read one by one, as the agent reads them.
fn resource<K>(client: &Client, namespace: &str) -> Api<DynamicObject>
where
    K: kube::Resource<DynamicType = ()>,
{
    Api::namespaced_with(client.clone(), namespace, &ApiResource::erase::<K>(&()))
}

/// `mcpservers.mcp.spear.dev`, as RBAC and `kubectl auth can-i` name a resource.
fn plural<K: kube::Resource<DynamicType = ()>>() -> String {
    let resource = ApiResource::erase::<K>(&());
    format!("{}.{}", resource.plural, resource.group)
}

/// An API error as the fix it needs.
pub(in crate::cli::spearlet) fn api_error(
    error: kube::Error,
    verb: &'static str,
    resource: &str,
    namespace: &str,
) -> ClusterError {
    if let kube::Error::Api(status) = &error {
        match status.code {
            401 => return ClusterError::Unauthorized { message: status.message.clone() },
            403 => {
                return ClusterError::Forbidden {
                    verb,
                    resource: resource.to_string(),
                    namespace: namespace.to_string(),
                    message: status.message.clone(),
                };
            }
            404 if resource.contains('.') => return ClusterError::NoCrds { resource: resource.to_string() },
            _ => {}
        }
    }
    ClusterError::Api { what: format!("{verb} {resource} in namespace {namespace}"), source: error }
}

/// The pod agent's `/debug/effective` (with `?request=`), through a port-forward to its admin
/// port: one HTTP/1 request on the forwarded stream.
async fn debug_effective(pods: &Api<Pod>, pod: &PodInfo, request: Option<&str>) -> Result<Value, ClusterError> {
    let unreachable = |detail: String| ClusterError::AgentUnreachable {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        port: pod.admin_port,
        container: keys::AGENT_CONTAINER,
        detail,
    };
    let mut forwarder = pods.portforward(&pod.name, &[pod.admin_port]).await.map_err(|e| match &e {
        kube::Error::Api(status) if status.code == 403 => api_error(e, "create", "pods/portforward", &pod.namespace),
        kube::Error::Api(status) => unreachable(format!("port-forward refused: {} {}", status.code, status.message)),
        _ => unreachable(format!("port-forward: {}", crate::telemetry::error_chain(&e))),
    })?;
    let stream =
        forwarder.take_stream(pod.admin_port).ok_or_else(|| unreachable("port-forward gave no stream".into()))?;
    let port_error = forwarder.take_error(pod.admin_port);
    let path = match request {
        Some(request) => {
            format!(
                "/debug/effective?request={}",
                url::form_urlencoded::byte_serialize(request.as_bytes()).collect::<String>()
            )
        }
        None => "/debug/effective".to_string(),
    };
    let exchange = async {
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, connection) =
            hyper::client::conn::http1::handshake::<_, String>(io).await.map_err(|e| unreachable(e.to_string()))?;
        let connection = tokio::spawn(connection);
        let request = hyper::Request::get(path)
            .header(hyper::header::HOST, "localhost")
            .body(String::new())
            .map_err(|e| unreachable(e.to_string()))?;
        let response = sender.send_request(request).await.map_err(|e| unreachable(e.to_string()))?;
        let status = response.status();
        let body = axum::body::to_bytes(axum::body::Body::new(response.into_body()), MAX_ANSWER_BYTES)
            .await
            .map_err(|e| unreachable(format!("reading the answer: {e}")))?;
        connection.abort();
        Ok::<_, ClusterError>((status, body))
    };
    let port_failed = async {
        match port_error {
            Some(error) => match error.await {
                Some(message) => message,
                // The error channel closed without an error: only the exchange can finish now.
                None => std::future::pending().await,
            },
            None => std::future::pending().await,
        }
    };
    let answered = tokio::select! {
        answered = tokio::time::timeout(AGENT_TIMEOUT, exchange) => answered,
        message = port_failed => return Err(unreachable(message)),
    };
    forwarder.abort();
    let (status, body) =
        answered.map_err(|_| unreachable(format!("no answer within {} s", AGENT_TIMEOUT.as_secs())))??;
    if !status.is_success() {
        return Err(ClusterError::AgentAnswer {
            name: pod.name.clone(),
            namespace: pod.namespace.clone(),
            status: status.as_u16(),
            body: String::from_utf8_lossy(&body).trim().to_string(),
        });
    }
    serde_json::from_slice(&body).map_err(|e| unreachable(format!("the answer is not JSON: {e}")))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::{Container, ContainerPort, PodSpec};
    use kube::core::ObjectMeta;

    use super::*;

    fn pod(annotations: &[(&str, &str)], containers: Vec<Container>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some("app".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { containers, ..PodSpec::default() }),
            ..Pod::default()
        }
    }

    fn container(name: &str, ports: Option<Vec<ContainerPort>>) -> Container {
        Container { name: name.into(), ports, ..Container::default() }
    }

    #[test]
    fn a_pod_names_its_profile_injection_and_admin_port() {
        let port =
            ContainerPort { name: Some(keys::ADMIN_PORT_NAME.into()), container_port: 9042, ..Default::default() };
        let injected = pod(
            &[(keys::ANNOTATION_PROFILE, "dev")],
            vec![container("app", None), container(keys::AGENT_CONTAINER, Some(vec![port]))],
        );
        let info = PodInfo::of(&injected, "ns").expect("annotated");
        assert_eq!((info.profile.as_str(), info.injected, info.admin_port), ("dev", true, 9042));
        assert!(info.line().contains("injected (agent admin port 9042)"), "{}", info.line());

        let plain = PodInfo::of(&pod(&[(keys::ANNOTATION_PROFILE, "dev")], vec![container("app", None)]), "ns")
            .expect("annotated");
        assert!(!plain.injected && plain.admin_port == keys::PORT_ADMIN);
        assert!(
            plain.line().contains("NOT injected") && plain.line().contains(keys::LABEL_INJECTION),
            "{}",
            plain.line()
        );
        assert_eq!(plain.json()["injected"], false);
    }

    #[test]
    fn a_pod_without_the_annotation_is_an_error_naming_it() {
        let error = PodInfo::of(&pod(&[], vec![container("app", None)]), "ns").expect_err("no annotation");
        assert!(error.to_string().contains(keys::ANNOTATION_PROFILE), "{error}");
    }

    #[test]
    fn forbidden_names_the_verb_resource_and_the_check() {
        let status = kube::core::Status::failure("mcpservers is forbidden", "Forbidden").with_code(403).boxed();
        let error = api_error(kube::Error::Api(status), "list", "mcpservers.mcp.spear.dev", "team-a");
        let text = error.to_string();
        assert!(text.contains("list mcpservers.mcp.spear.dev in namespace team-a"), "{text}");
        assert!(text.contains("kubectl auth can-i list mcpservers.mcp.spear.dev -n team-a"), "{text}");
        assert_eq!(plural::<McpServer>(), "mcpservers.mcp.spear.dev");
    }
}
