//! `McpServer`: one MCP server the platform team allows workloads to use.
//!
//! The Rust type is the source of truth: `crds/` is generated from it, and the doc comments
//! below become the `kubectl explain` text. Schema rules (enums, bounds, patterns, CEL) are the
//! ones a real API server enforces by itself; [`super::validate`] adds what a schema cannot say.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{EnvVar, ResourceRequirements, SecretKeySelector};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::schema;

/// Default per-call timeout when `budgets.toolTimeoutMs` is not set.
pub const DEFAULT_TOOL_TIMEOUT_MS: u32 = 30_000;
/// Default startup budget when `budgets.startupTimeoutMs` is not set: spawn, `initialize` and
/// the first `tools/list` together. 120 s because a stdio server started with `npx -y` or `uvx`
/// downloads its package first, which takes tens of seconds on a cold cache or a busy machine.
pub const DEFAULT_STARTUP_TIMEOUT_MS: u32 = 120_000;
/// Default number of concurrent calls to one server.
pub const DEFAULT_MAX_CONCURRENCY: u32 = 8;
/// Default cap on one tool result, in bytes.
pub const DEFAULT_MAX_TOOL_OUTPUT_BYTES: u32 = 65_536;
/// Upper bound on `status.tools`; `status.toolCount` keeps the real count.
pub const MAX_STATUS_TOOLS: usize = 256;

/// McpServer declares one MCP tool server that workloads may use: how to reach it (a stdio
/// command run as a sidecar, or a Streamable HTTP URL), which of its tools are exposed (none
/// unless allowed), and the budgets every call to it gets. `metadata.name` is the server id and
/// must be a DNS-1123 label.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "mcp.spear.dev",
    version = "v1alpha1",
    kind = "McpServer",
    plural = "mcpservers",
    singular = "mcpserver",
    shortname = "mcps",
    category = "spear",
    namespaced,
    status = "McpServerStatus",
    derive = "PartialEq",
    derive = "Default",
    doc = "McpServer declares one MCP tool server that workloads may use. metadata.name is the server id (a DNS-1123 label).",
    validation = Rule::new("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$')")
        .message("metadata.name must be a DNS-1123 label (lowercase letters, digits and '-', at most 63 characters): it is the server id used in tool names"),
    printcolumn = r#"{"name":"Transport","type":"string","jsonPath":".spec.transport"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Tools","type":"integer","jsonPath":".status.toolCount"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[x_kube(
    validation = Rule::new("self.transport != 'stdio' || has(self.stdio)")
        .message("spec.stdio is required when spec.transport is stdio")
        .field_path(".stdio")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.transport != 'stdio' || !has(self.http)")
        .message("spec.http must not be set when spec.transport is stdio")
        .field_path(".http")
        .reason(Reason::FieldValueForbidden),
    validation = Rule::new("self.transport != 'streamableHttp' || has(self.http)")
        .message("spec.http.url is required when spec.transport is streamableHttp")
        .field_path(".http")
        .reason(Reason::FieldValueRequired),
    validation = Rule::new("self.transport != 'streamableHttp' || !has(self.stdio)")
        .message("spec.stdio must not be set when spec.transport is streamableHttp")
        .field_path(".stdio")
        .reason(Reason::FieldValueForbidden)
)]
#[serde(rename_all = "camelCase")]
pub struct McpServerSpec {
    /// Human-readable title shown in status, `explain` output and tool descriptions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub display_name: Option<String>,

    /// Whether the server is in use; default true. `false` takes it out everywhere without
    /// editing any McpProfile: agents list none of its tools, resources or prompts and close their
    /// session to it, pods created meanwhile get no sidecar for it, and `spearlet explain` gives
    /// the reason `disabled`. A stdio server enabled again reaches pods created while it was
    /// disabled only once they are recreated (they have no sidecar for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,

    /// How the agent reaches the server: `stdio` (a command run as a sidecar in Kubernetes, as a
    /// child process in local mode) or `streamableHttp` (an MCP Streamable HTTP endpoint). The
    /// legacy HTTP+SSE transport of MCP 2024-11-05 is not supported: use the server's Streamable
    /// HTTP endpoint, or run a bridge such as `uvx mcp-proxy URL` as a stdio server.
    pub transport: Transport,

    /// The command to run for a stdio server. Required when transport is stdio.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdio: Option<StdioSpec>,

    /// The endpoint of a Streamable HTTP server. Required when transport is streamableHttp.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpSpec>,

    /// Overrides the server part of model-facing tool names (`mcp__<toolNamespace>__<tool>`).
    /// Defaults to `metadata.name`. Letters, digits, '-' and '_', without '__', not starting or
    /// ending with '_' (so the part boundary in tool names is never ambiguous).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 32), regex(pattern = r"^[A-Za-z0-9-]([A-Za-z0-9_-]*[A-Za-z0-9-])?$"))]
    #[x_kube(validation = Rule::new("!self.contains('__')").message("toolNamespace must not contain '__' (it separates the parts of tool names)"))]
    pub tool_namespace: Option<String>,

    /// Glob patterns (`*` any run of characters, `?` one character, everything else literal) of
    /// the tools exposed. Empty means no tool is exposed: deny by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub allowed_tools: Vec<String>,

    /// Glob patterns of tools never exposed, whatever any allowlist says (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub denied_tools: Vec<String>,

    /// Glob patterns of the resource URIs exposed (`*` matches any run of characters, `/`
    /// included: `file:///srv/docs/*`). Empty means no resource is exposed: deny by default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 1024)))]
    pub allowed_resources: Vec<String>,

    /// Glob patterns of resource URIs never exposed (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 1024)))]
    pub denied_resources: Vec<String>,

    /// Glob patterns of the prompt names exposed. Empty means no prompt is exposed: deny by
    /// default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub allowed_prompts: Vec<String>,

    /// Glob patterns of prompt names never exposed (a final veto).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), inner(length(min = 1, max = 256)))]
    pub denied_prompts: Vec<String>,

    /// Whether a call needs human approval. Without an approver configured, a call that needs
    /// approval is denied with `mcp_approval_required`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub approval_policy: Option<ApprovalPolicy>,

    /// Limits applied to every call to this server. A profile can tighten them, never loosen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub budgets: Option<ServerBudgets>,

    /// Pins each tool to the definition a person reviewed (`spearlet pin` writes it): a tool
    /// the server changes or adds later is withheld (`enforce`) or flagged (`warn`) until pinned
    /// again. Without it, tools are served as the server lists them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pinning: Option<super::Pinning>,
}

/// Why the legacy HTTP+SSE transport is refused ([`LEGACY_SSE_FIX`] says what to do instead);
/// `validate`, the agent's registry and `spearlet convert` all say it this way.
pub const LEGACY_SSE_REASON: &str = "the legacy HTTP+SSE transport (MCP 2024-11-05) is not supported: the MCP \
     client spear uses (rmcp) has no client for it, and Streamable HTTP replaced it in MCP 2025-03-26";
/// What to do with a server that speaks only HTTP+SSE.
pub const LEGACY_SSE_FIX: &str = "use the server's Streamable HTTP endpoint (transport: streamableHttp; often the \
     same host with /mcp instead of /sse), or run a bridge such as `uvx mcp-proxy URL` as a stdio server (its own \
     connections then bypass the agent's egress deny list)";

/// How the agent talks to the server.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
pub enum Transport {
    /// Newline-delimited JSON-RPC over a child process's stdin/stdout.
    #[default]
    #[serde(rename = "stdio")]
    Stdio,
    /// MCP Streamable HTTP.
    #[serde(rename = "streamableHttp")]
    StreamableHttp,
}

/// The two spellings, and a refusal with the reason for any spelling of the legacy SSE transport
/// (`sse`, `SSE`, `http_sse_legacy`, `httpSse`, ...), which a derive would only call unknown.
impl<'de> Deserialize<'de> for Transport {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        match text.as_ref() {
            "stdio" => Ok(Transport::Stdio),
            "streamableHttp" => Ok(Transport::StreamableHttp),
            other if other.to_ascii_lowercase().contains("sse") => {
                Err(serde::de::Error::custom(format_args!("`{other}`: {LEGACY_SSE_REASON}")))
            }
            other => Err(serde::de::Error::unknown_variant(other, &["stdio", "streamableHttp"])),
        }
    }
}

impl Transport {
    /// The spelling used in manifests.
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Stdio => "stdio",
            Transport::StreamableHttp => "streamableHttp",
        }
    }
}

/// A stdio server: an argv run without a shell.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StdioSpec {
    /// Container image of the sidecar that runs the command in Kubernetes (the agent's bridge is
    /// copied into it). Required in Kubernetes mode, ignored in local mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub image: Option<String>,

    /// The executable (`argv[0]`). Never run through a shell: no globbing, pipes or `$VAR`.
    #[schemars(length(min = 1, max = 4096))]
    pub command: String,

    /// Arguments passed to the command, one item per argv entry.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(max = 4096)))]
    pub args: Vec<String>,

    /// Environment of the server process, as in a container; names may not start with `SPEAR_`.
    /// `value` may reference `${ENV:NAME}` or `${ENV:NAME:-default}`: in a pod a variable defined
    /// before it in this list, in local mode the agent's environment, never `SPEAR_*`,
    /// `POD_NAME`, `POD_NAMESPACE` or `KUBECONFIG`; `$${` writes a literal `${`. Secret- and
    /// ConfigMap-backed values are set on the sidecar by the webhook; a Secret must allow this
    /// server in its `mcp.spear.dev/allowed-servers` annotation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128), schema_with = "schema::env_list")]
    pub env: Vec<EnvVar>,

    /// Working directory of the server process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 4096))]
    pub working_dir: Option<String>,

    /// Compute resources of the sidecar, as in a container.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,

    /// Mount the pod's service-account token into the sidecar (default false: the server cannot
    /// call the Kubernetes API as the pod). Set it only for a server that needs the API.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub mount_service_account_token: bool,
}

/// A Streamable HTTP server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HttpSpec {
    /// The MCP endpoint, an absolute `http://` or `https://` URL.
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub url: String,

    /// Headers sent with every request (for example `Authorization`). Names are unique.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"])
    )]
    pub headers: Vec<HttpHeader>,

    /// How the agent authenticates to the server: the MCP authorization flow for a client with
    /// no human at hand (OAuth 2.1 client credentials), the pod's own service-account token
    /// (sent as is or exchanged), or a grant a person consented to once (authorization code
    /// with PKCE, `spearlet auth login`). Unset: no authentication beyond `headers`; a server
    /// that then answers 401 is reported as `AuthRequired`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<HttpAuth>,
}

/// How the agent obtains the bearer token it sends to a Streamable HTTP server. Exactly one
/// mode is set. Tokens are cached per server until shortly before they expire and fetched again
/// (single-flight) on expiry or when the server rejects one (a 401 is retried once).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("[has(self.clientCredentials), has(self.serviceAccountToken), has(self.tokenExchange), has(self.authorizationCode)].exists_one(x, x)")
        .message("set exactly one of clientCredentials, serviceAccountToken, tokenExchange and authorizationCode"),
    validation = Rule::new("!has(self.authorizationCode) || has(self.issuer)")
        .message("authorizationCode needs issuer: the refresh token a person's consent produced goes only to the authorization server it names")
        .field_path(".issuer")
        .reason(Reason::FieldValueRequired)
)]
#[serde(rename_all = "camelCase")]
pub struct HttpAuth {
    /// The authorization server the agent trusts with this server's credential: its issuer
    /// identifier (RFC 8414), an `https://` URL (`http://` only on loopback). The agent reads
    /// the authorization server's metadata from this issuer, never from an address the MCP
    /// server gives; a server whose protected-resource metadata (RFC 9728) names another
    /// authorization server, or metadata whose `issuer` differs, is refused until this field
    /// or the server changes: the MCP server is trusted with nothing, so it does not choose
    /// where the client secret or the pod's token goes.
    ///
    /// Required with `clientCredentials.clientSecret`, `tokenExchange` (both grants) and
    /// `authorizationCode` (a stored grant is used only with the issuer it came from).
    /// For `tokenExchange` it defaults to `audience` when the audience is itself an `https://`
    /// URL (the token then goes only to the party it is minted for). Optional with
    /// `clientCredentials.privateKey` (the signed assertion is bound to the issuer it is sent
    /// to, so it is useless elsewhere), and checked when set. Not used by `serviceAccountToken`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https?://"))]
    pub issuer: Option<String>,

    /// OAuth 2.1 client credentials grant at the authorization server `issuer` names, with the
    /// server's URL as the RFC 8707 resource indicator.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_credentials: Option<ClientCredentialsAuth>,

    /// Send the pod's projected service-account token (audience `audience`) as the bearer
    /// token, for servers that trust the cluster's issuer (they validate it with the cluster's
    /// OIDC discovery document and JWKS). The webhook mounts the token into the agent only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<ServiceAccountTokenAuth>,

    /// Exchange the pod's projected service-account token for an access token at the
    /// authorization server `issuer` names: RFC 8693 token exchange, or the RFC 7523 JWT-bearer
    /// grant (workload identity federation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_exchange: Option<TokenExchangeAuth>,

    /// OAuth 2.1 authorization code with PKCE at the authorization server `issuer` names: a
    /// person runs `spearlet auth login --server NAME` once and consents in a browser; the
    /// grant (refresh token, registered client, issuer) is stored and the agent renews access
    /// tokens from it without a person. For the public remote servers that only offer this
    /// flow. The grant lives in a 0600 file per server in local mode, and in the Secret
    /// `tokenSecretRef` names in a cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorization_code: Option<AuthorizationCodeAuth>,

    /// The scopes the agent may request. The agent requests what the server asks for (its
    /// `WWW-Authenticate` scope, else its metadata's `scopes_supported`) narrowed to this list;
    /// when the server asks for nothing, this list. Empty: whatever the server asks for.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), extend("x-kubernetes-list-type" = "set"))]
    pub scopes: Vec<String>,
}

/// An OAuth client registered at the authorization server (pre-registration): its id, and a
/// client secret or a private key to authenticate with.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("has(self.clientSecret) != has(self.privateKey)")
        .message("set exactly one of clientSecret and privateKey")
)]
#[serde(rename_all = "camelCase")]
pub struct ClientCredentialsAuth {
    /// The client id.
    #[schemars(length(min = 1, max = 1024))]
    pub client_id: String,

    /// The client secret, from a Secret key (delivered like header `valueFrom`: only when the
    /// Secret allows this server). Sent with `client_secret_basic` when that is the only method
    /// the authorization server advertises, else `client_secret_post`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<HeaderValueSource>,

    /// A PEM private key (PKCS#8 RSA or EC), from a Secret key: the agent authenticates with a
    /// signed JWT assertion (`private_key_jwt`, RFC 7523).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<PrivateKeySource>,
}

/// The client of the authorization-code flow, and where its grant is kept. The client is
/// pre-registered (`clientId`, with `clientSecret` for a confidential client), identified by a
/// client ID metadata document (`clientIdMetadataUrl`, used where the authorization server
/// advertises `client_id_metadata_document_supported`), or, with neither, registered at login
/// by dynamic client registration (RFC 7591) where the authorization server offers it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("!(has(self.clientId) && has(self.clientIdMetadataUrl))")
        .message("set at most one of clientId and clientIdMetadataUrl"),
    validation = Rule::new("!has(self.clientSecret) || has(self.clientId)")
        .message("clientSecret belongs to a pre-registered client: set clientId too")
)]
#[serde(rename_all = "camelCase")]
pub struct AuthorizationCodeAuth {
    /// A client registered at the authorization server beforehand (with a loopback redirect
    /// URI, `http://127.0.0.1/callback` with any port, as RFC 8252 section 7.3 describes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub client_id: Option<String>,

    /// The pre-registered client's secret (a confidential client), from a Secret key the Secret
    /// grants to this server. Sent with the token endpoint authentication method the
    /// authorization server advertises (`client_secret_basic` first).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<HeaderValueSource>,

    /// An `https://` URL serving this client's metadata document (the MCP client ID metadata
    /// document): used as the client id where the authorization server supports it; elsewhere
    /// the login falls back to dynamic registration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 2048), regex(pattern = r"^https://"))]
    pub client_id_metadata_url: Option<String>,

    /// The Secret of this namespace that holds the grant in a cluster (key `grant.json`):
    /// `spearlet auth login --server NAME -n NAMESPACE` creates or updates it, and the pods'
    /// agents read it and write renewed tokens back, so their service account needs `get` and
    /// `update` on this Secret by name. Like any Secret, it is used only when its annotation
    /// `mcp.spear.dev/allowed-servers` names this server. Required for pods; local mode keeps
    /// the grant in a file instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<GrantSecretRef>,
}

/// The Secret holding a person's grant.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GrantSecretRef {
    /// The Secret's name, in the McpServer's namespace.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

/// A private key for `private_key_jwt`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PrivateKeySource {
    /// A key of a Secret in the server's namespace holding the PEM key.
    pub secret_key_ref: SecretKeySelector,

    /// The JWS algorithm of the assertion (default `ES256`).
    #[serde(default)]
    pub algorithm: JwtAlgorithm,
}

/// A JWS algorithm for client assertions.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
pub enum JwtAlgorithm {
    #[default]
    ES256,
    ES384,
    RS256,
    RS384,
    RS512,
}

/// The pod's projected service-account token as the credential.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceAccountTokenAuth {
    /// The token's audience (`aud`): the identifier the receiving server (or, for
    /// `tokenExchange`, its authorization server) expects. One token per server.
    #[schemars(length(min = 1, max = 1024))]
    pub audience: String,

    /// Requested lifetime of the token; the kubelet rotates it at 80 % of that. Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 86400))]
    pub expiration_seconds: Option<i64>,
}

/// Token exchange with the pod's service-account token as the subject (or assertion).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TokenExchangeAuth {
    /// The audience of the service-account token: the authorization server's identifier.
    #[schemars(length(min = 1, max = 1024))]
    pub audience: String,

    /// `tokenExchange` (RFC 8693, default) or `jwtBearer` (RFC 7523 JWT-bearer grant, as in
    /// the MCP workload identity federation extension).
    #[serde(default)]
    pub grant: TokenGrant,

    /// A client id to send with the request, when the authorization server wants one (no
    /// client secret: the service-account token is the credential).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 1024))]
    pub client_id: Option<String>,

    /// Requested lifetime of the service-account token (see `serviceAccountToken`). Default 3600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 600, max = 86400))]
    pub expiration_seconds: Option<i64>,
}

/// The grant a token exchange uses.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum TokenGrant {
    #[default]
    TokenExchange,
    JwtBearer,
}

/// Default lifetime requested for a projected service-account token.
pub const DEFAULT_SA_TOKEN_SECONDS: i64 = 3600;

/// Which auth secrets a server has, as (field id, `spec` path, selector). The field id names the
/// value in `SPEAR_SECRET_REFS` and its env var; it holds `:`, which no header name can.
impl HttpAuth {
    pub fn secret_values(&self) -> Vec<(&'static str, &'static str, &SecretKeySelector)> {
        let mut out = Vec::new();
        if let Some(secret) = self.authorization_code.as_ref().and_then(|ac| ac.client_secret.as_ref()) {
            out.push((
                AUTH_CLIENT_SECRET,
                "spec.http.auth.authorizationCode.clientSecret.secretKeyRef",
                &secret.secret_key_ref,
            ));
        }
        if let Some(cc) = &self.client_credentials {
            if let Some(secret) = &cc.client_secret {
                out.push((
                    AUTH_CLIENT_SECRET,
                    "spec.http.auth.clientCredentials.clientSecret.secretKeyRef",
                    &secret.secret_key_ref,
                ));
            }
            if let Some(key) = &cc.private_key {
                out.push((
                    AUTH_PRIVATE_KEY,
                    "spec.http.auth.clientCredentials.privateKey.secretKeyRef",
                    &key.secret_key_ref,
                ));
            }
        }
        out
    }

    /// The service-account token this mode needs, as (audience, lifetime in seconds).
    pub fn service_account_token(&self) -> Option<(&str, i64)> {
        if let Some(sa) = &self.service_account_token {
            return Some((&sa.audience, sa.expiration_seconds.unwrap_or(DEFAULT_SA_TOKEN_SECONDS)));
        }
        let te = self.token_exchange.as_ref()?;
        Some((&te.audience, te.expiration_seconds.unwrap_or(DEFAULT_SA_TOKEN_SECONDS)))
    }

    /// The authorization server this configuration trusts: `issuer`, else, for `tokenExchange`,
    /// its `audience` when that is an `https://` URL (see `issuer`).
    pub fn pinned_issuer(&self) -> Option<&str> {
        if let Some(issuer) = self.issuer.as_deref() {
            return Some(issuer);
        }
        let te = self.token_exchange.as_ref()?;
        te.audience.starts_with("https://").then_some(te.audience.as_str())
    }

    /// Whether this mode sends a credential that is good elsewhere (a client secret, the pod's
    /// token) to an authorization server, so the server must be pinned by `issuer`.
    pub fn needs_issuer(&self) -> bool {
        self.token_exchange.is_some()
            || self.authorization_code.is_some()
            || self.client_credentials.as_ref().is_some_and(|cc| cc.private_key.is_none())
    }

    /// The mode's name, for `explain` and status lines.
    pub fn mode(&self) -> &'static str {
        if self.authorization_code.is_some() {
            return "oauth authorization code (a person's stored grant)";
        }
        match (&self.client_credentials, &self.service_account_token, &self.token_exchange) {
            (Some(cc), _, _) if cc.private_key.is_some() => "oauth client credentials (private_key_jwt)",
            (Some(_), _, _) => "oauth client credentials (client secret)",
            (_, Some(_), _) => "service-account token",
            (_, _, Some(te)) if te.grant == TokenGrant::JwtBearer => "service-account token, jwt-bearer grant",
            _ => "service-account token, token exchange",
        }
    }
}

/// Field id of `auth.clientCredentials.clientSecret`.
pub const AUTH_CLIENT_SECRET: &str = "auth:clientSecret";
/// Field id of `auth.clientCredentials.privateKey`.
pub const AUTH_PRIVATE_KEY: &str = "auth:privateKey";

/// One HTTP header: a literal value (which may use `${ENV:NAME}` references) or a Secret key.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, KubeSchema)]
#[x_kube(
    validation = Rule::new("has(self.value) != has(self.valueFrom)")
        .message("set exactly one of value and valueFrom")
)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Header name (an HTTP token, for example `Authorization`).
    #[schemars(length(min = 1, max = 256), regex(pattern = r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$"))]
    pub name: String,

    /// Literal value. `${ENV:NAME}` / `${ENV:NAME:-default}` read the agent's environment in
    /// local mode only (never `SPEAR_*`); in a pod only the default applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8192))]
    pub value: Option<String>,

    /// Value from a Secret key. The webhook sets it as an env var on the agent when the Secret
    /// allows this server (annotation `mcp.spear.dev/allowed-servers`); the agent never reads
    /// Secrets itself.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value_from: Option<HeaderValueSource>,
}

/// Where a header value comes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HeaderValueSource {
    /// A key of a Secret in the server's namespace.
    pub secret_key_ref: SecretKeySelector,
}

/// Whether calls need a human approval.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ApprovalPolicy {
    /// Mode for tools no pattern in `tools` matches. Defaults to `never`.
    #[serde(default)]
    pub default: ApprovalMode,

    /// Per-tool modes keyed by glob pattern; the most specific matching pattern wins (an exact
    /// name beats any pattern; otherwise the pattern with more literal characters).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 128))]
    pub tools: BTreeMap<String, ApprovalMode>,
}

/// Approval mode of a tool.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema, Default)]
#[serde(rename_all = "camelCase")]
pub enum ApprovalMode {
    /// Calls run without approval.
    #[default]
    Never,
    /// Every call needs approval.
    Always,
    /// A call needs approval unless the tool's own annotations say it changes nothing
    /// (`readOnlyHint: true`) or nothing irreversibly (`destructiveHint: false`); a tool without
    /// annotations needs approval (MCP's defaults: not read-only, destructive). The annotations
    /// are the server's claims: use `always` for a server you do not trust to make them honestly.
    DestructiveHint,
}

/// Per-call limits of a server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerBudgets {
    /// Time limit of one tool call in milliseconds (default 30000, at most one hour).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 3_600_000))]
    pub tool_timeout_ms: Option<u32>,

    /// Calls to this server running at once per agent; more wait (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_concurrency: Option<u32>,

    /// Largest tool result passed on, in bytes; longer output is truncated with a marker and
    /// `mcp_output_too_large` (default 65536, at most 16 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16_777_216))]
    pub max_tool_output_bytes: Option<u32>,

    /// Time allowed for the server to start, in milliseconds: spawning it (a stdio command such
    /// as `npx -y`, which may download its package first) or connecting, `initialize`, and the
    /// first `tools/list`, together (default 120000, 1000 to 900000). Past it the server's
    /// process group is stopped (SIGTERM, then SIGKILL) and the start is retried later. Calls
    /// keep `toolTimeoutMs`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1000, max = 900_000))]
    pub startup_timeout_ms: Option<u32>,

    /// Calls to this server, all tools together, per pod: a token bucket. Past it a call ends
    /// with `mcp_rate_limited` (retryable, with `retry_after_ms`). Absent: no limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_limit: Option<super::rate_limit::RateLimit>,

    /// Calls per tool, per pod: each tool a pattern (a tool name glob, `*` and `?`) matches
    /// gets its own bucket with that limit; every matching pattern applies. At most 64.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub tool_rate_limits: super::rate_limit::RateLimits,
}

impl ServerBudgets {
    /// The timeout in force, with the default applied.
    pub fn tool_timeout_ms(&self) -> u32 {
        self.tool_timeout_ms.unwrap_or(DEFAULT_TOOL_TIMEOUT_MS)
    }
    /// The concurrency limit in force, with the default applied.
    pub fn max_concurrency(&self) -> u32 {
        self.max_concurrency.unwrap_or(DEFAULT_MAX_CONCURRENCY)
    }
    /// The output cap in force, with the default applied.
    pub fn max_tool_output_bytes(&self) -> u32 {
        self.max_tool_output_bytes.unwrap_or(DEFAULT_MAX_TOOL_OUTPUT_BYTES)
    }
    /// The startup budget in force, with the default applied.
    pub fn startup_timeout_ms(&self) -> u32 {
        self.startup_timeout_ms.unwrap_or(DEFAULT_STARTUP_TIMEOUT_MS)
    }
}

/// Observed state of an McpServer, written by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct McpServerStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,

    /// `Accepted` (the spec is valid) and `Ready` (the last probe succeeded; `Unknown` with
    /// reason `RunsAsSidecar` for stdio servers).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "schema::conditions")]
    pub conditions: Vec<Condition>,

    /// Tool names the server listed at the last probe (at most 256; see `toolCount`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub tools: Vec<String>,

    /// Number of tools the server listed at the last probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_count: Option<u32>,

    /// What the server said about itself in `initialize`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_info: Option<ServerInfo>,

    /// When the operator last probed the server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_probe_time: Option<Time>,

    /// The last probe's error, if it failed (never contains secret values).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// The `initialize` answer of a server.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServerInfo {
    /// Server implementation name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Server implementation version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The title the server gives itself (untrusted text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    /// What the server says it is (untrusted text); agents show it with the server's tool group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Usage instructions the server gives to clients (untrusted text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instructions: Option<String>,
}

impl McpServerSpec {
    /// False only when `spec.enabled` is `false`.
    pub fn is_enabled(&self) -> bool {
        self.enabled != Some(false)
    }

    /// Budgets with defaults applied where unset.
    pub fn budgets(&self) -> ServerBudgets {
        let b = self.budgets.clone().unwrap_or_default();
        ServerBudgets {
            tool_timeout_ms: Some(b.tool_timeout_ms()),
            max_concurrency: Some(b.max_concurrency()),
            max_tool_output_bytes: Some(b.max_tool_output_bytes()),
            startup_timeout_ms: Some(b.startup_timeout_ms()),
            rate_limit: b.rate_limit,
            tool_rate_limits: b.tool_rate_limits,
        }
    }
}
