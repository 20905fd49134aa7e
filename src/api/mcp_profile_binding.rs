//! `McpProfileBinding`: which callers of the gateway (`spearlet gateway`) get which McpProfile,
//! written by the platform team as a RoleBinding is. A per-pod agent never reads it: an injected
//! pod's profile is its annotation.
//!
//! - One profile per binding, any number of subjects; a caller may be bound through several.
//! - A caller bound to several profiles names one with the `Spear-Profile` header; the gateway
//!   never merges profiles (their budgets, approvals, upstreams and rate limits do not merge), the
//!   decision is `policy::binding`.
//! - Subjects are matched exactly, as RBAC does: a ServiceAccount by its user name
//!   `system:serviceaccount:<namespace>:<name>`, a User by name, a Group by membership. No
//!   patterns: `system:serviceaccounts:<namespace>` (a Group) is how to bind a whole namespace.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Subjects in one binding, at most.
pub const MAX_SUBJECTS: usize = 256;

/// McpProfileBinding gives the gateway's callers (ServiceAccounts, users, groups) one McpProfile
/// of this namespace.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[kube(
    group = "mcp.spear.dev",
    version = "v1alpha1",
    kind = "McpProfileBinding",
    plural = "mcpprofilebindings",
    singular = "mcpprofilebinding",
    shortname = "mcppb",
    category = "spear",
    namespaced,
    derive = "PartialEq",
    derive = "Default",
    doc = "McpProfileBinding gives the gateway's callers (ServiceAccounts, users, groups) one McpProfile of this namespace.",
    printcolumn = r#"{"name":"Profile","type":"string","jsonPath":".spec.profileRef.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct McpProfileBindingSpec {
    /// The McpProfile, in this namespace, that the subjects get.
    pub profile_ref: ProfileRef,
    /// Who gets the profile: ServiceAccounts, users and groups as the API server authenticates
    /// them (TokenReview), matched exactly.
    #[schemars(length(min = 1, max = 256))]
    pub subjects: Vec<BindingSubject>,
}

/// A reference to an McpProfile of the binding's namespace.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ProfileRef {
    /// The McpProfile's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
}

/// One caller, or a group of them.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[x_kube(
    validation = Rule::new("self.kind == 'ServiceAccount' || !has(self.__namespace__)")
        .message("namespace is for ServiceAccount subjects only: remove it, or set kind: ServiceAccount")
        .field_path(".namespace")
        .reason(Reason::FieldValueInvalid)
)]
#[serde(rename_all = "camelCase")]
pub struct BindingSubject {
    /// `ServiceAccount`, `User` or `Group`.
    pub kind: SubjectKind,
    /// The ServiceAccount's name, the user name, or the group name, exactly as the API server
    /// reports it.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The ServiceAccount's namespace; absent: the binding's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub namespace: Option<String>,
}

/// The kind of a binding's subject.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum SubjectKind {
    ServiceAccount,
    User,
    Group,
}
