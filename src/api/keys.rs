//! Every name that two parts of spear-mcp must agree on: labels, annotations, environment
//! variables, ports, container, volume and role names. The webhook writes pods with these, the
//! agent and the operator read them, the chart and the tests check them; one definition each,
//! so they cannot drift apart. Flags read their variables from here (`env = keys::...`).

pub(crate) const GROUP: &str = "mcp.spear.dev";
pub(crate) const API_VERSION: &str = "mcp.spear.dev/v1alpha1";
pub(crate) const KIND_SERVER: &str = "McpServer";
pub(crate) const KIND_PROFILE: &str = "McpProfile";

/// Namespace label that opts a namespace into injection (value [`INJECTION_ENABLED`]).
pub const LABEL_INJECTION: &str = "mcp.spear.dev/injection";
pub const INJECTION_ENABLED: &str = "enabled";
/// Pod annotation naming the McpProfile the pod uses.
pub const ANNOTATION_PROFILE: &str = "mcp.spear.dev/profile";
/// Pod annotation; `"false"` opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "mcp.spear.dev/inject";
/// Pod annotation the webhook sets on every pod it injects: a hash of what it injected.
pub const ANNOTATION_INJECTED: &str = "mcp.spear.dev/injected";
/// The recommended label saying who manages an object.
pub(crate) const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// The recommended label naming the application an object belongs to (value [`PART_OF`]).
pub(crate) const LABEL_PART_OF: &str = "app.kubernetes.io/part-of";
pub(crate) const PART_OF: &str = "spear-mcp";
/// Field manager of every server-side apply the operator makes, and its `managed-by` label.
pub(crate) const FIELD_MANAGER: &str = "spear-operator";

/// Response header (and gRPC metadata key) naming the registry revision an answer used.
pub(crate) const HEADER_REGISTRY_REVISION: &str = "x-spear-registry-revision";

// Ports of the agent. HTTP and gRPC are loopback only (only the pod itself may use its tools);
// admin listens on all interfaces for the kubelet's probes and scrapers.
pub(crate) const PORT_HTTP: u16 = 4040;
pub(crate) const PORT_GRPC: u16 = 4041;
pub(crate) const PORT_ADMIN: u16 = 4042;
/// The operator's admin server (`/healthz`, `/readyz`, `/metrics`).
pub(crate) const PORT_OPERATOR_METRICS: u16 = 8080;
/// The operator's webhook (HTTPS).
pub(crate) const PORT_WEBHOOK: u16 = 8443;
/// Name of the agent's admin port (at most 15 characters, as Kubernetes requires).
pub(crate) const ADMIN_PORT_NAME: &str = "spear-admin";

// The injected pod.
pub const AGENT_CONTAINER: &str = "spearlet";
/// The init container that copies the static spearlet into [`BIN_DIR`].
pub const INIT_CONTAINER: &str = "spear-init";
/// Prefix of the stdio server sidecars' names (`mcp-<server>`).
pub const SIDECAR_PREFIX: &str = "mcp-";
/// Prefix of the stdio server sidecars' scratch volumes (`mcp-tmp-<server>`).
pub(crate) const TMP_VOLUME_PREFIX: &str = "mcp-tmp-";
/// Volume holding the static spearlet, mounted at [`BIN_DIR`].
pub(crate) const VOLUME_BIN: &str = "spear-bin";
/// Prefix of each stdio server's socket volume (`mcp-sock-<server>`), mounted at
/// `<RUN_DIR>/<server>`: writable in that server's sidecar, read-only in the agent.
pub(crate) const SOCKET_VOLUME_PREFIX: &str = "mcp-sock-";
/// An empty volume mounted over the service-account token path of server sidecars.
pub(crate) const VOLUME_NO_TOKEN: &str = "spear-no-token";
/// The projected volume of the service-account tokens `http.auth` needs (one per server, each
/// with that server's audience), mounted into the agent only.
pub(crate) const VOLUME_AUTH_TOKENS: &str = "spear-auth-tokens";
/// Where the agent finds them: `<AUTH_TOKEN_DIR>/<server>`. Local mode reads
/// `SPEAR_AUTH_TOKEN_DIR` instead.
pub const AUTH_TOKEN_DIR: &str = "/var/run/secrets/mcp.spear.dev/tokens";
/// Overrides [`AUTH_TOKEN_DIR`] (local mode: a directory of token files named by server).
pub const ENV_AUTH_TOKEN_DIR: &str = "SPEAR_AUTH_TOKEN_DIR";
/// Local mode: the directory of the grants `spearlet auth login` stores (`<dir>/<server>.json`);
/// default `$XDG_STATE_HOME/spear-mcp/grants` (`~/.local/state/spear-mcp/grants`).
pub const ENV_GRANT_DIR: &str = "SPEAR_GRANT_DIR";
/// `--extra-ca-file` of spearlet and spear-operator: CA certificates (PEM) trusted beside the
/// system's roots for outbound HTTPS.
pub const ENV_EXTRA_CA_FILE: &str = "SPEAR_EXTRA_CA_FILE";
/// The operator's trust bundle (PEM), written into the agent container at injection.
pub const ENV_EXTRA_CA_PEM: &str = "SPEAR_EXTRA_CA_PEM";
/// Cluster mode: the type of the Secret holding a person's grant (`tokenSecretRef`).
pub const GRANT_SECRET_TYPE: &str = "mcp.spear.dev/oauth-grant";
/// The grant Secret's key holding the grant document.
pub const GRANT_SECRET_KEY: &str = "grant.json";
/// Label on a grant Secret: the McpServer whose grant it holds.
pub const LABEL_GRANT_FOR: &str = "mcp.spear.dev/grant-for";
/// Annotation on a grant Secret: when a person logged in or an agent last renewed the grant
/// (RFC 3339); what the operator's condition shows, without reading the data.
pub const ANNOTATION_GRANT_RENEWED_AT: &str = "mcp.spear.dev/grant-renewed-at";
/// Annotation on a grant Secret: set by an agent when the authorization server refused the
/// grant (revoked or expired), with why; removed by the next login.
pub const ANNOTATION_GRANT_LOGIN_REQUIRED: &str = "mcp.spear.dev/grant-login-required";
/// Annotation on a grant Secret: `<holder> <unix seconds>`, the agent renewing it now (others
/// wait for its result instead of spending the refresh token too).
pub const ANNOTATION_GRANT_RENEWING: &str = "mcp.spear.dev/grant-renewing";
/// Where the kubelet mounts a container's service-account token.
pub(crate) const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
pub const BIN_DIR: &str = "/spear/bin";
/// The bridge of server `s` listens on `<RUN_DIR>/<s>/mcp.sock`; the agent's default socket dir.
pub const RUN_DIR: &str = "/spear/run";
/// The spearlet every injected container runs.
pub(crate) const SPEARLET: &str = "/spear/bin/spearlet";
/// Where the spearlet image holds the static binary; the init container runs it to install
/// itself at [`SPEARLET`] (the image holds nothing else to run: no shell, no `cp`).
pub const IMAGE_SPEARLET: &str = "/spearlet";

// RBAC and the operator's own objects.
/// The agent's ClusterRole, and the RoleBinding to it in each injection-enabled namespace.
pub const AGENT_ROLE: &str = "spear-mcp-agent";
/// The operator's ClusterRole, and its Role in its own namespace.
pub const OPERATOR_ROLE: &str = "spear-operator";
/// The ClusterRole that reads Secrets (`get`), never bound cluster-wide: the operator binds it
/// to itself, with a RoleBinding of the same name, in each injection-enabled namespace.
pub const SECRET_READER_ROLE: &str = "spear-operator-secret-reader";
/// The operator's leader-election Lease.
pub const OPERATOR_LEASE: &str = "spear-operator";
/// The Secret holding the webhook's serving certificate.
pub(crate) const WEBHOOK_CERT_SECRET: &str = "spear-operator-webhook-tls";
/// The MutatingWebhookConfiguration whose `caBundle` the operator keeps current.
pub const WEBHOOK_CONFIGURATION: &str = "spear-mcp-injector";
/// The webhook's Service; its certificate is issued for `<service>.<namespace>.svc`.
pub(crate) const WEBHOOK_SERVICE: &str = "spear-operator-webhook";

// Environment the webhook gives the agent container (read by `spearlet run`'s flags).
pub(crate) const ENV_PROFILE: &str = "SPEAR_PROFILE";
/// The pod's namespace (downward API): where the agent watches its registry. The operator reads
/// it too, for its own namespace.
pub(crate) const ENV_POD_NAMESPACE: &str = "POD_NAMESPACE";
pub(crate) const ENV_SOCKET_DIR: &str = "SPEAR_SOCKET_DIR";
/// The stdio servers given sidecars, comma-separated; a stdio server the profile gains later has
/// none, and the agent reports that it needs a pod restart.
pub const ENV_SIDECAR_SERVERS: &str = "SPEAR_SIDECAR_SERVERS";
/// The secret-backed header values delivered to the agent, `<server>/<header>`, comma-separated:
/// the agent reads `SPEAR_SECRET_*` only for these (see `mcp::config::Mode::Sidecar`).
pub(crate) const ENV_SECRET_REFS: &str = "SPEAR_SECRET_REFS";
/// Where each Streamable HTTP server's delivered values (Secret values, tokens) were granted to
/// go, `<server>=<names::http_destination>`, comma-separated: the agent sends nothing to a server
/// whose live spec no longer hashes the same.
pub(crate) const ENV_GRANTED_DESTINATIONS: &str = "SPEAR_GRANTED_DESTINATIONS";
pub(crate) const ENV_HTTP_ADDR: &str = "SPEAR_HTTP_ADDR";
pub(crate) const ENV_ADMIN_ADDR: &str = "SPEAR_ADMIN_ADDR";
/// `--egress-deny-cidrs` of spearlet.
pub(crate) const ENV_EGRESS_DENY_CIDRS: &str = "SPEAR_EGRESS_DENY_CIDRS";
/// spearlet's pool limits: `--tools-ttl-seconds`, `--max-concurrent-calls`,
/// `--max-stdio-children`, `--server-idle-seconds`.
pub(crate) const ENV_TOOLS_TTL_SECONDS: &str = "SPEAR_TOOLS_TTL_SECONDS";
pub(crate) const ENV_MAX_CONCURRENT_CALLS: &str = "SPEAR_MAX_CONCURRENT_CALLS";
pub(crate) const ENV_MAX_STDIO_CHILDREN: &str = "SPEAR_MAX_STDIO_CHILDREN";
pub(crate) const ENV_SERVER_IDLE_SECONDS: &str = "SPEAR_SERVER_IDLE_SECONDS";
/// spearlet's `--check-arguments`.
pub(crate) const ENV_CHECK_ARGUMENTS: &str = "SPEAR_CHECK_ARGUMENTS";
/// The chat upstream's API key (from the profile's `chat.upstream.apiKeySecretRef`; in local
/// mode, export it).
pub(crate) const ENV_UPSTREAM_API_KEY: &str = "SPEAR_UPSTREAM_API_KEY";

// Environment the webhook gives app containers.
/// The pod's API key (`api_key`): on the agent and the app containers, first in their env.
pub const ENV_API_KEY: &str = "SPEAR_API_KEY";
/// The aggregated MCP endpoint.
pub const ENV_MCP_URL: &str = "SPEAR_MCP_URL";
/// The OpenAI-compatible base URL.
pub(crate) const ENV_CHAT_URL: &str = "SPEAR_CHAT_URL";
/// The agent's gRPC address; `spearlet tools` reads it too.
pub const ENV_GRPC_ADDR: &str = "SPEAR_GRPC_ADDR";

// The other flags' variables (every flag reads one; see `--help`).
pub(crate) const ENV_LOG: &str = "SPEAR_LOG";
pub(crate) const ENV_LOG_FORMAT: &str = "SPEAR_LOG_FORMAT";
pub(crate) const ENV_KUBECONFIG: &str = "KUBECONFIG";
pub(crate) const ENV_REGISTRY_DIR: &str = "SPEAR_REGISTRY_DIR";
pub(crate) const ENV_REGISTRY_WATCH: &str = "SPEAR_REGISTRY_WATCH";
pub(crate) const ENV_UPSTREAM_URL: &str = "SPEAR_UPSTREAM_URL";
pub(crate) const ENV_UPSTREAM_API_KEY_ENV: &str = "SPEAR_UPSTREAM_API_KEY_ENV";
pub(crate) const ENV_AUDIT_LOG: &str = "SPEAR_AUDIT_LOG";
pub(crate) const ENV_AUDIT_ARGUMENTS: &str = "SPEAR_AUDIT_ARGUMENTS";
pub(crate) const ENV_SHUTDOWN_GRACE_SECONDS: &str = "SPEAR_SHUTDOWN_GRACE_SECONDS";
pub(crate) const ENV_WORKER_THREADS: &str = "SPEAR_WORKER_THREADS";
pub(crate) const ENV_ALLOWED_HOSTS: &str = "SPEAR_ALLOWED_HOSTS";
pub(crate) const ENV_ALLOWED_ORIGINS: &str = "SPEAR_ALLOWED_ORIGINS";
pub(crate) const ENV_HEADER_READ_TIMEOUT_SECONDS: &str = "SPEAR_HEADER_READ_TIMEOUT_SECONDS";
pub(crate) const ENV_MAX_CONNECTIONS: &str = "SPEAR_MAX_CONNECTIONS";
pub(crate) const ENV_MCP_SESSION_IDLE_SECONDS: &str = "SPEAR_MCP_SESSION_IDLE_SECONDS";
pub(crate) const ENV_TOOLS_SERVER: &str = "SPEAR_TOOLS_SERVER";
pub(crate) const ENV_TOOLS_ARGS: &str = "SPEAR_TOOLS_ARGS";
pub(crate) const ENV_EXPLAIN_REQUEST: &str = "SPEAR_EXPLAIN_REQUEST";
pub(crate) const ENV_EXPLAIN_CONNECT: &str = "SPEAR_EXPLAIN_CONNECT";
pub(crate) const ENV_OUTPUT: &str = "SPEAR_OUTPUT";
pub(crate) const ENV_CONVERT_OUTPUT_DIR: &str = "SPEAR_CONVERT_OUTPUT_DIR";
pub(crate) const ENV_CONVERT_NAMESPACE: &str = "SPEAR_CONVERT_NAMESPACE";
pub(crate) const ENV_BRIDGE_SOCKET: &str = "SPEAR_BRIDGE_SOCKET";
pub(crate) const ENV_SERVER_ID: &str = "SPEAR_SERVER_ID";
pub(crate) const ENV_BRIDGE_PEER_UID: &str = "SPEAR_BRIDGE_PEER_UID";
pub(crate) const ENV_INSTALL_TO: &str = "SPEAR_INSTALL_TO";
// spear-operator's (the chart sets them).
/// The pod's name (downward API): the operator's leader-election identity; the agent's name in
/// approval requests.
pub(crate) const ENV_POD_NAME: &str = "POD_NAME";
pub(crate) const ENV_NAMESPACE: &str = "SPEAR_NAMESPACE";
pub(crate) const ENV_WATCH_NAMESPACE: &str = "SPEAR_WATCH_NAMESPACE";
pub(crate) const ENV_METRICS_ADDR: &str = "SPEAR_METRICS_ADDR";
pub(crate) const ENV_LEADER_ELECTION: &str = "SPEAR_LEADER_ELECTION";
pub(crate) const ENV_LEASE_NAME: &str = "SPEAR_LEASE_NAME";
pub(crate) const ENV_PROBE_INTERVAL_SECONDS: &str = "SPEAR_PROBE_INTERVAL_SECONDS";
pub(crate) const ENV_PROBE_NAMESPACES: &str = "SPEAR_PROBE_NAMESPACES";
pub(crate) const ENV_PROBE_DENY_CIDRS: &str = "SPEAR_PROBE_DENY_CIDRS";
/// `spear-operator run --agent-egress-deny-cidrs`.
pub(crate) const ENV_AGENT_EGRESS_DENY_CIDRS: &str = "SPEAR_AGENT_EGRESS_DENY_CIDRS";
/// `spear-operator run --agent-tools-ttl-seconds` and `--agent-max-concurrent-calls`.
pub(crate) const ENV_AGENT_TOOLS_TTL_SECONDS: &str = "SPEAR_AGENT_TOOLS_TTL_SECONDS";
pub(crate) const ENV_AGENT_MAX_CONCURRENT_CALLS: &str = "SPEAR_AGENT_MAX_CONCURRENT_CALLS";
/// `spear-operator run --forbidden-token-audiences`.
pub(crate) const ENV_FORBIDDEN_TOKEN_AUDIENCES: &str = "SPEAR_FORBIDDEN_TOKEN_AUDIENCES";
pub(crate) const ENV_WEBHOOK_ADDR: &str = "SPEAR_WEBHOOK_ADDR";
pub(crate) const ENV_WEBHOOK_CONFIG_NAME: &str = "SPEAR_WEBHOOK_CONFIG_NAME";
pub(crate) const ENV_WEBHOOK_SERVICE_NAME: &str = "SPEAR_WEBHOOK_SERVICE_NAME";
pub(crate) const ENV_CERT_MODE: &str = "SPEAR_CERT_MODE";
pub(crate) const ENV_CERT_DIR: &str = "SPEAR_CERT_DIR";
pub(crate) const ENV_WEBHOOK_CLIENT_CA_FILE: &str = "SPEAR_WEBHOOK_CLIENT_CA_FILE";
pub(crate) const ENV_WEBHOOK_CLIENT_NAMES: &str = "SPEAR_WEBHOOK_CLIENT_NAMES";
pub(crate) const ENV_WEBHOOK_RATE_LIMIT_PER_SECOND: &str = "SPEAR_WEBHOOK_RATE_LIMIT_PER_SECOND";
pub(crate) const ENV_WEBHOOK_RATE_LIMIT_BURST: &str = "SPEAR_WEBHOOK_RATE_LIMIT_BURST";
/// `spear-operator run --admin-view-addr`: where the read-only admin view listens (unset: off).
pub(crate) const ENV_ADMIN_VIEW_ADDR: &str = "SPEAR_ADMIN_VIEW_ADDR";
/// `spear-operator run --admin-view-allowed-hosts`: the `Host` names the admin view answers.
pub(crate) const ENV_ADMIN_VIEW_ALLOWED_HOSTS: &str = "SPEAR_ADMIN_VIEW_ALLOWED_HOSTS";
pub(crate) const ENV_AGENT_IMAGE: &str = "SPEAR_AGENT_IMAGE";
pub(crate) const ENV_SPEARLET_IMAGE: &str = "SPEAR_SPEARLET_IMAGE";
pub(crate) const ENV_NATIVE_SIDECARS: &str = "SPEAR_NATIVE_SIDECARS";
pub(crate) const ENV_CRDS_OUTPUT_DIR: &str = "SPEAR_CRDS_OUTPUT_DIR";
