//! Names shared by the operator, the webhook, the agent and the tests: labels, annotations,
//! environment variables and ports (DESIGN.md "Pods"). One place, so they never drift apart.

/// API group of both resources.
pub const GROUP: &str = "mcp.spear.dev";
/// API version of both resources.
pub const VERSION: &str = "v1alpha1";
/// `apiVersion` value written in manifests.
pub const API_VERSION: &str = "mcp.spear.dev/v1alpha1";
/// Kind of the server resource.
pub const KIND_SERVER: &str = "McpServer";
/// Kind of the profile resource.
pub const KIND_PROFILE: &str = "McpProfile";

/// Namespace label that opts a namespace into injection (value [`INJECTION_ENABLED`]).
pub const LABEL_INJECTION: &str = "mcp.spear.dev/injection";
/// Value of [`LABEL_INJECTION`] that enables injection.
pub const INJECTION_ENABLED: &str = "enabled";
/// Pod annotation naming the McpProfile the pod uses.
pub const ANNOTATION_PROFILE: &str = "mcp.spear.dev/profile";
/// Pod annotation; `"false"` opts a pod out of injection.
pub const ANNOTATION_INJECT: &str = "mcp.spear.dev/inject";

/// Env var given to app containers: the aggregated MCP endpoint.
pub const ENV_MCP_URL: &str = "SPEAR_MCP_URL";
/// Env var given to app containers: the OpenAI-compatible base URL.
pub const ENV_CHAT_URL: &str = "SPEAR_CHAT_URL";
/// Env var given to app containers: the gRPC address.
pub const ENV_GRPC_ADDR: &str = "SPEAR_GRPC_ADDR";

/// Response header (and gRPC metadata key) naming the registry revision an answer used.
pub const HEADER_REGISTRY_REVISION: &str = "x-spear-registry-revision";
/// Env var the agent reads the chat upstream's API key from (the webhook sets it from the
/// profile's `chat.upstream.apiKeySecretRef`; in local mode, export it).
pub const ENV_UPSTREAM_API_KEY: &str = "SPEAR_UPSTREAM_API_KEY";

/// Agent HTTP port (chat completions and `/mcp`), loopback only.
pub const PORT_HTTP: u16 = 4040;
/// Agent gRPC port, loopback only.
pub const PORT_GRPC: u16 = 4041;
/// Agent admin port (`/healthz`, `/readyz`, `/metrics`), all interfaces.
pub const PORT_ADMIN: u16 = 4042;

/// Field manager used for every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "spear-operator";
