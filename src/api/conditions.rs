//! Condition types and reasons written to `status.conditions`, as constants so the controller,
//! local mode and tests agree on spelling.

/// Condition types.
pub mod types {
    /// The spec passed validation.
    pub const ACCEPTED: &str = "Accepted";
    /// The server answered `initialize` and `tools/list` at the last probe.
    pub(crate) const READY: &str = "Ready";
    /// Every tool the server serves matches its pin (`spec.pinning`), as of the last probe; set
    /// only for probed servers with `spec.pinning`.
    pub(crate) const TOOLS_PINNED: &str = "ToolsPinned";
    /// Every server a profile names exists, and every Secret an object references allows it.
    pub(crate) const RESOLVED_REFS: &str = "ResolvedRefs";
    /// A profile offers tools: `False` when it cannot (no server, `defaultServers: []`, or the
    /// allowlists leave nothing of servers whose tools are known), `Unknown` when no server's
    /// tools are known to the operator (stdio servers are listed by agents only).
    pub(crate) const TOOLS_OFFERED: &str = "ToolsOffered";
    /// A person's grant for the server is stored in its `authorizationCode.tokenSecretRef`
    /// Secret and not known to be refused; set only for such servers, from the Secret's
    /// annotations (the operator never reads its data).
    pub(crate) const GRANT_READY: &str = "GrantReady";
}

/// Condition reasons (CamelCase, as Kubernetes API conventions ask).
pub mod reasons {
    /// Spec is valid.
    pub(crate) const VALID: &str = "Valid";
    /// Spec failed validation; the message names the field.
    pub(crate) const INVALID: &str = "Invalid";
    /// stdio servers run as sidecars and are not probed by the operator.
    pub(crate) const RUNS_AS_SIDECAR: &str = "RunsAsSidecar";
    /// `spec.enabled` is false.
    pub(crate) const DISABLED: &str = "Disabled";
    /// The probe succeeded.
    pub(crate) const PROBE_SUCCEEDED: &str = "ProbeSucceeded";
    /// The probe failed; `lastError` says why.
    pub(crate) const PROBE_FAILED: &str = "ProbeFailed";
    /// The server answered the probe with 401: it requires authorization (the message says what
    /// it asked for and whether `spec.http.auth` is set).
    pub(crate) const AUTH_REQUIRED: &str = "AuthRequired";
    /// The operator does not probe this server (`--probe-namespaces`); the message says why.
    pub(crate) const PROBE_SKIPPED: &str = "ProbeSkipped";
    /// Every served tool matches its pin.
    pub(crate) const PINS_MATCH: &str = "PinsMatch";
    /// Some served tools differ from their pins or have none; the message names them.
    pub(crate) const PIN_MISMATCH: &str = "PinMismatch";
    /// All referenced servers exist.
    pub(crate) const RESOLVED: &str = "Resolved";
    /// Some referenced servers are missing; `missingServers` lists them.
    pub(crate) const MISSING_SERVERS: &str = "MissingServers";
    /// A referenced Secret does not allow the object (`mcp.spear.dev/allowed-servers` or
    /// `allowed-profiles`), or a profile's `spec.identity` does not grant a server the pod's
    /// ServiceAccount identity it asks for; the message names it. The Gateway API's reason for a
    /// missing grant.
    pub(crate) const REF_NOT_PERMITTED: &str = "RefNotPermitted";
    /// A person's grant is stored (the message says when it was last renewed).
    pub(crate) const GRANT_STORED: &str = "GrantStored";
    /// The grant Secret does not exist: nobody has logged in yet.
    pub(crate) const NO_GRANT: &str = "NoGrant";
    /// An agent found the grant refused (revoked or expired): a person must log in again.
    pub(crate) const LOGIN_REQUIRED: &str = "LoginRequired";
    /// The profile offers tools of servers whose tools are known.
    pub(crate) const TOOLS_OFFERED: &str = "ToolsOffered";
    /// The profile allows no McpServer that exists.
    pub(crate) const NO_SERVERS: &str = "NoServers";
    /// `spec.defaultServers` is the empty list: a request that names no server gets no tools.
    pub(crate) const DEFAULT_SERVERS_EMPTY: &str = "DefaultServersEmpty";
    /// Every allowed server's tools are known and the allowlists leave none of them.
    pub(crate) const NO_TOOLS_ALLOWED: &str = "NoToolsAllowed";
    /// No allowed server's tools are known to the operator.
    pub(crate) const TOOLS_UNKNOWN: &str = "ToolsUnknown";
}
