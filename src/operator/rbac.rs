//! RBAC objects of spear-mcp, as pure constructors: the agent's read-only ClusterRole, the
//! per-namespace RoleBinding the operator keeps, and the operator's own least-privilege roles
//! (the chart renders the same objects; tests keep them honest).
//!
//! ```text
//! ClusterRole spear-mcp-agent (get/list/watch McpServer, McpProfile; create/get/list/watch
//!     McpApproval, never its status; nothing else)
//!     ▲ roleRef
//! RoleBinding spear-mcp-agent in every namespace labelled mcp.spear.dev/injection=enabled
//!     └ subject: Group system:serviceaccounts:<namespace>  (every pod's service account there)
//!
//! ClusterRole spear-operator: read both kinds, write their status, delete McpApprovals (decided
//!     and expired ones; never their status), events, watch namespaces,
//!     create RoleBindings, read and write only those named spear-mcp-agent and
//!     spear-operator-secret-reader, `bind` only the ClusterRoles of those names and `get` the
//!     agent's (the chart installs both; no ClusterRole is ever created or changed by the
//!     operator), its own webhook configuration. No Secrets.
//! ClusterRole spear-operator-secret-reader: get Secrets; never bound cluster-wide
//!     ▲ roleRef
//! RoleBinding spear-operator-secret-reader in every namespace labelled injection=enabled
//!     └ subject: the operator itself (the grant annotations of referenced Secrets)
//! Role spear-operator (its namespace): its leader Lease and its webhook certificate Secret
//! ```
//!
//! Why Secrets per namespace: RBAC's `get` returns a Secret's data, not only the metadata the
//! grant check asks for, and the operator's token is reachable through an open webhook. Bound
//! only where injection is on, it reads no Secret of `kube-system` or of a namespace that does
//! not use spear-mcp. What stays: with `create` on RoleBindings and `bind` on this role, a
//! stolen operator token can bind it elsewhere, which is a write the audit log shows, not a read.
//!
//! The agent runs with the pod's own service account, so the binding names the namespace's
//! service-account group rather than one account: any injected pod there can read the registry
//! of its namespace, and nothing of any other. The agent never reads Secrets; secret values reach
//! it as env vars the kubelet resolves.

use std::collections::BTreeMap;

use k8s_openapi::api::rbac::v1::{ClusterRole, PolicyRule, Role, RoleBinding, RoleRef, Subject};
use kube::core::ObjectMeta;

use crate::api::keys::{
    AGENT_ROLE, FIELD_MANAGER, GROUP, LABEL_MANAGED_BY, LABEL_PART_OF, OPERATOR_LEASE, OPERATOR_ROLE, PART_OF,
    SECRET_READER_ROLE, WEBHOOK_CERT_SECRET, WEBHOOK_CONFIGURATION,
};

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";
/// The core API group.
const CORE: &str = "";

/// Labels of every RBAC object here: managed by the operator (its field manager), part of spear-mcp.
pub(crate) fn labels() -> BTreeMap<String, String> {
    BTreeMap::from([
        (LABEL_MANAGED_BY.to_string(), FIELD_MANAGER.to_string()),
        (LABEL_PART_OF.to_string(), PART_OF.to_string()),
    ])
}

fn rule(group: &str, resources: &[&str], verbs: &[&str]) -> PolicyRule {
    let strings = |items: &[&str]| items.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(strings(resources)),
        verbs: strings(verbs),
        ..PolicyRule::default()
    }
}

fn named(mut rule: PolicyRule, names: &[&str]) -> PolicyRule {
    rule.resource_names = Some(names.iter().map(|s| s.to_string()).collect());
    rule
}

fn meta(name: &str, namespace: Option<&str>) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_string()),
        namespace: namespace.map(str::to_string),
        labels: Some(labels()),
        ..ObjectMeta::default()
    }
}

/// The agent's ClusterRole: read McpServers and McpProfiles, nothing else (no Secrets).
pub fn agent_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(AGENT_ROLE, None),
        rules: Some(vec![
            rule(GROUP, &["mcpservers", "mcpprofiles"], &["get", "list", "watch"]),
            // The kubernetes approver: ask (create) and wait (get/watch); never decide (no status).
            rule(GROUP, &["mcpapprovals"], &["create", "get", "list", "watch"]),
        ]),
        ..ClusterRole::default()
    }
}

/// The RoleBinding granting [`agent_cluster_role`] in `namespace` to all its service accounts.
pub fn agent_role_binding(namespace: &str) -> RoleBinding {
    RoleBinding {
        metadata: meta(AGENT_ROLE, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some(RBAC_GROUP.to_string()),
            kind: "ClusterRole".to_string(),
            name: AGENT_ROLE.to_string(),
        },
        subjects: Some(vec![Subject {
            api_group: Some(RBAC_GROUP.to_string()),
            kind: "Group".to_string(),
            name: format!("system:serviceaccounts:{namespace}"),
            namespace: None,
        }]),
    }
}

/// The ClusterRole the operator binds to itself in each injection-enabled namespace: `get` on
/// Secrets, for the grant annotations of the Secrets its objects reference (it asks for metadata
/// only; RBAC cannot say so). Never bound by a ClusterRoleBinding.
pub fn secret_reader_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(SECRET_READER_ROLE, None),
        rules: Some(vec![rule(CORE, &["secrets"], &["get"])]),
        ..ClusterRole::default()
    }
}

/// The RoleBinding granting [`secret_reader_cluster_role`] in `namespace` to the operator,
/// `subject`.
pub fn secret_reader_binding(namespace: &str, subject: Subject) -> RoleBinding {
    RoleBinding {
        metadata: meta(SECRET_READER_ROLE, Some(namespace)),
        role_ref: RoleRef {
            api_group: Some(RBAC_GROUP.to_string()),
            kind: "ClusterRole".to_string(),
            name: SECRET_READER_ROLE.to_string(),
        },
        subjects: Some(vec![subject]),
    }
}

/// The RBAC subject of an authenticated user name: a ServiceAccount for
/// `system:serviceaccount:<namespace>:<name>` (the operator in a cluster), else a User.
pub fn subject_of_user(username: &str) -> Subject {
    let account = username.strip_prefix("system:serviceaccount:").and_then(|rest| rest.split_once(':'));
    match account {
        Some((namespace, name)) if !namespace.is_empty() && !name.is_empty() && !name.contains(':') => Subject {
            kind: "ServiceAccount".to_string(),
            name: name.to_string(),
            namespace: Some(namespace.to_string()),
            api_group: None,
        },
        _ => Subject {
            kind: "User".to_string(),
            name: username.to_string(),
            namespace: None,
            api_group: Some(RBAC_GROUP.to_string()),
        },
    }
}

/// The operator's cluster-wide permissions: what the controller, the webhook and the RoleBinding
/// reconciler need. Writes use server-side apply, which is the `patch` verb. No Secrets: see
/// [`secret_reader_cluster_role`].
pub fn operator_cluster_role() -> ClusterRole {
    let read = ["get", "list", "watch"];
    ClusterRole {
        metadata: meta(OPERATOR_ROLE, None),
        rules: Some(vec![
            // The controller's reflectors, and the webhook's profile and server lookups.
            rule(GROUP, &["mcpservers", "mcpprofiles"], &read),
            rule(GROUP, &["mcpservers/status", "mcpprofiles/status"], &["get", "patch", "update"]),
            // Deletes decided and expired McpApprovals, and holds what it grants the agents (create,
            // get, watch); never writes a decision (no status).
            rule(GROUP, &["mcpapprovals"], &["create", "get", "list", "watch", "delete"]),
            // Condition changes and denied injections are reported as events.
            rule("events.k8s.io", &["events"], &["create", "patch"]),
            // Which namespaces are injection-enabled (RoleBindings; the webhook's defence in depth).
            rule(CORE, &["namespaces"], &read),
            // The agent RoleBindings, all named spear-mcp-agent, and the operator's own Secret
            // reader bindings: reads and writes by those names (list and watch too: the reflector
            // selects `metadata.name`, which the API server authorizes as the name). `create`
            // cannot be limited by name (the object has none yet when it is checked), and `bind`
            // below limits what a created binding may grant.
            rule(RBAC_GROUP, &["rolebindings"], &["create"]),
            named(
                rule(RBAC_GROUP, &["rolebindings"], &["get", "list", "watch", "update", "patch", "delete"]),
                &[AGENT_ROLE, SECRET_READER_ROLE],
            ),
            // Granting a ClusterRole needs `bind` on it (or holding all its permissions); limited
            // to the agent's and the Secret reader, so the operator cannot hand out any other
            // role. It does not hold the Secret reader's `get secrets` cluster-wide: `bind` is
            // what lets it grant that per namespace.
            named(rule(RBAC_GROUP, &["clusterroles"], &["bind"]), &[AGENT_ROLE, SECRET_READER_ROLE]),
            // The agent's ClusterRole comes with the chart; the operator only checks that it is
            // there (a missing one is logged). It never creates or changes a ClusterRole: `create`
            // cannot be limited by name, and would let it mint roles up to its own permissions.
            named(rule(RBAC_GROUP, &["clusterroles"], &["get"]), &[AGENT_ROLE]),
            // The webhook's caBundle, on its own configuration only.
            named(
                rule("admissionregistration.k8s.io", &["mutatingwebhookconfigurations"], &["get", "update", "patch"]),
                &[WEBHOOK_CONFIGURATION],
            ),
        ]),
        ..ClusterRole::default()
    }
}

/// Name of the ClusterRole (and its binding) the chart adds when it enables the admin view.
pub const ADMIN_VIEW_ROLE: &str = "spear-operator-admin-view";

/// What the admin view needs beyond [`operator_cluster_role`]: `list` and `watch` on pods, to
/// list the pods the webhook injected (it asks for their metadata only and keeps only those). A
/// role of its own, bound only when the view is on (the chart's `adminView.enabled`), because
/// `list` on pods can read every pod's spec: the operator should not hold it for a page nobody
/// turned on. Read-only: no verb that writes.
pub fn admin_view_cluster_role() -> ClusterRole {
    ClusterRole {
        metadata: meta(ADMIN_VIEW_ROLE, None),
        rules: Some(vec![rule(CORE, &["pods"], &["list", "watch"])]),
        ..ClusterRole::default()
    }
}

/// The operator's permissions in its own namespace: its leader Lease and its certificate
/// Secret. `create` cannot be limited by name (the object has none yet when it is checked), so
/// it is a rule of its own; reading and updating are limited to the two names.
pub fn operator_role(namespace: &str) -> Role {
    Role {
        metadata: meta(OPERATOR_ROLE, Some(namespace)),
        rules: Some(vec![
            rule("coordination.k8s.io", &["leases"], &["create"]),
            // Leader election writes the Lease with server-side apply and strategic merge
            // patches (kube-lease-manager): `patch`.
            named(rule("coordination.k8s.io", &["leases"], &["get", "update", "patch"]), &[OPERATOR_LEASE]),
            rule(CORE, &["secrets"], &["create"]),
            named(rule(CORE, &["secrets"], &["get", "update"]), &[WEBHOOK_CERT_SECRET]),
        ]),
    }
}

/// Whether the stored `current` binding grants what `desired` grants and carries its labels,
/// so the controller can skip the write. Other labels and annotations may be added by others.
pub(crate) fn binding_is_current(current: &RoleBinding, desired: &RoleBinding) -> bool {
    let labels = current.metadata.labels.clone().unwrap_or_default();
    current.role_ref == desired.role_ref
        && current.subjects == desired.subjects
        && desired.metadata.labels.iter().flatten().all(|(k, v)| labels.get(k) == Some(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_rules() -> Vec<(&'static str, PolicyRule)> {
        let mut rules = Vec::new();
        for (who, role) in [
            ("agent", agent_cluster_role()),
            ("operator", operator_cluster_role()),
            ("secret-reader", secret_reader_cluster_role()),
        ] {
            rules.extend(role.rules.unwrap_or_default().into_iter().map(|r| (who, r)));
        }
        rules.extend(operator_role("spear-system").rules.unwrap_or_default().into_iter().map(|r| ("operator-ns", r)));
        rules
    }

    #[test]
    fn no_rule_uses_a_wildcard() {
        for (who, r) in all_rules() {
            let lists =
                [r.verbs.clone(), r.resources.clone().unwrap_or_default(), r.api_groups.clone().unwrap_or_default()];
            assert!(lists.iter().flatten().all(|s| !s.contains('*')), "{who}: wildcard in {r:?}");
            assert!(r.non_resource_urls.is_none(), "{who}: non-resource URLs in {r:?}");
            assert!(!r.resources.unwrap_or_default().is_empty(), "{who}: a rule without resources");
        }
    }

    #[test]
    fn agent_reads_the_registry_and_may_ask_approvals_but_never_decide_them() {
        let rules = agent_cluster_role().rules.unwrap_or_default();
        assert_eq!(rules.len(), 2);
        assert!(rules.iter().all(|r| r.api_groups.as_deref() == Some(&["mcp.spear.dev".to_string()][..])));
        assert_eq!(rules[0].resources.as_deref(), Some(&["mcpservers".to_string(), "mcpprofiles".to_string()][..]));
        assert_eq!(rules[0].verbs, ["get", "list", "watch"]);
        assert_eq!(rules[1].resources.as_deref(), Some(&["mcpapprovals".to_string()][..]), "no status subresource");
        assert_eq!(rules[1].verbs, ["create", "get", "list", "watch"], "no update, patch or delete");
    }

    #[test]
    fn the_admin_view_only_lists_and_watches_pods_and_the_operator_does_not_without_it() {
        let rules = admin_view_cluster_role().rules.unwrap_or_default();
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].resources.as_deref(), Some(&["pods".to_string()][..]));
        assert_eq!(rules[0].verbs, ["list", "watch"]);
        let operator = operator_cluster_role().rules.unwrap_or_default();
        assert!(operator.iter().all(|r| !r.resources.iter().flatten().any(|res| res == "pods")));
    }

    #[test]
    fn agent_cannot_touch_secrets() {
        let rules = agent_cluster_role().rules.unwrap_or_default();
        assert!(rules.iter().all(|r| !r.resources.iter().flatten().any(|res| res.starts_with("secrets"))));
    }

    fn grants_secrets(role: &ClusterRole) -> bool {
        role.rules.iter().flatten().any(|r| r.resources.iter().flatten().any(|res| res.starts_with("secrets")))
    }

    /// Security review N5: `get` on Secrets returns their data, so no ClusterRole a
    /// ClusterRoleBinding gives the operator may grant Secrets; the Secret reader (bound per
    /// injection-enabled namespace) only `get`s.
    #[test]
    fn no_cluster_role_bound_cluster_wide_lets_the_operator_read_secrets() {
        // Bound by ClusterRoleBindings (the chart's operator binding; the admin view's when on).
        for role in [operator_cluster_role(), admin_view_cluster_role()] {
            assert!(!grants_secrets(&role), "{:?} grants secrets cluster-wide", role.metadata.name);
        }
        let reader = secret_reader_cluster_role().rules.unwrap_or_default();
        assert_eq!(reader.len(), 1);
        assert_eq!(
            (reader[0].resources.as_deref(), reader[0].verbs.as_slice()),
            (Some(&["secrets".to_string()][..]), &["get".to_string()][..])
        );
        let binding =
            secret_reader_binding("team-a", subject_of_user("system:serviceaccount:spear-system:spear-operator"));
        assert_eq!(binding.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(
            (binding.role_ref.kind.as_str(), binding.role_ref.name.as_str()),
            ("ClusterRole", SECRET_READER_ROLE)
        );
    }

    #[test]
    fn the_operators_user_name_becomes_its_service_account_subject() {
        let sa = subject_of_user("system:serviceaccount:spear-system:spear-operator");
        assert_eq!(
            (sa.kind.as_str(), sa.name.as_str(), sa.namespace.as_deref()),
            ("ServiceAccount", "spear-operator", Some("spear-system"))
        );
        assert_eq!(sa.api_group, None);
        for user in ["admin", "system:serviceaccount:broken", "system:serviceaccount::x", "system:serviceaccount:a:b:c"]
        {
            let subject = subject_of_user(user);
            assert_eq!((subject.kind.as_str(), subject.name.as_str()), ("User", user));
        }
    }

    #[test]
    fn operator_writes_only_its_own_secrets_in_its_namespace() {
        let own = operator_role("spear-system");
        assert_eq!(own.metadata.namespace.as_deref(), Some("spear-system"));
        for r in own.rules.unwrap_or_default().iter().filter(|r| r.resources.iter().flatten().any(|s| s == "secrets")) {
            if r.verbs != ["create"] {
                assert_eq!(r.resource_names.as_deref(), Some(&[WEBHOOK_CERT_SECRET.to_string()][..]), "{r:?}");
            }
            assert!(!r.verbs.iter().any(|v| v == "list" || v == "watch" || v == "delete"), "{r:?}");
        }
    }

    #[test]
    fn operator_may_bind_only_the_agent_role() {
        let rules = operator_cluster_role().rules.unwrap_or_default();
        let binds: Vec<_> = rules.iter().filter(|r| r.verbs.iter().any(|v| v == "bind" || v == "escalate")).collect();
        assert_eq!(binds.len(), 1);
        assert_eq!(binds[0].verbs, ["bind"]);
        let names = [AGENT_ROLE.to_string(), SECRET_READER_ROLE.to_string()];
        assert_eq!(binds[0].resource_names.as_deref(), Some(&names[..]));
        // The operator itself holds every permission it grants (so `bind` is belt and braces).
        for granted in agent_cluster_role().rules.unwrap_or_default() {
            for res in granted.resources.iter().flatten() {
                assert!(
                    rules.iter().any(|r| r.api_groups == granted.api_groups
                        && r.resources.iter().flatten().any(|x| x == res)
                        && granted.verbs.iter().all(|v| r.verbs.contains(v))),
                    "operator lacks {res}"
                );
            }
        }
    }

    #[test]
    fn binding_grants_the_agent_role_to_the_namespaces_service_accounts() {
        let binding = agent_role_binding("team-a");
        assert_eq!(binding.metadata.name.as_deref(), Some(AGENT_ROLE));
        assert_eq!(binding.metadata.namespace.as_deref(), Some("team-a"));
        assert_eq!(binding.role_ref.kind, "ClusterRole");
        assert_eq!(binding.role_ref.name, AGENT_ROLE);
        assert_eq!(binding.role_ref.api_group.as_deref(), Some("rbac.authorization.k8s.io"));
        let subjects = binding.subjects.unwrap_or_default();
        assert_eq!(subjects.len(), 1);
        assert_eq!(subjects[0].kind, "Group");
        assert_eq!(subjects[0].name, "system:serviceaccounts:team-a");
        assert_eq!(subjects[0].api_group.as_deref(), Some("rbac.authorization.k8s.io"));
    }

    #[test]
    fn every_object_is_labelled_as_managed_by_the_operator() {
        let metas = [
            agent_cluster_role().metadata,
            operator_cluster_role().metadata,
            secret_reader_cluster_role().metadata,
            secret_reader_binding("x", subject_of_user("admin")).metadata,
            agent_role_binding("x").metadata,
            operator_role("x").metadata,
        ];
        for m in metas {
            let labels = m.labels.unwrap_or_default();
            assert_eq!(labels.get(LABEL_MANAGED_BY).map(String::as_str), Some("spear-operator"), "{:?}", m.name);
            assert_eq!(labels.get(LABEL_PART_OF).map(String::as_str), Some("spear-mcp"));
        }
    }

    #[test]
    fn a_binding_is_current_when_its_grant_and_labels_match() {
        let desired = agent_role_binding("team-a");
        let mut current = desired.clone();
        current.metadata.labels.get_or_insert_default().insert("extra".into(), "kept".into());
        current.metadata.resource_version = Some("7".into());
        assert!(binding_is_current(&current, &desired), "extra labels and server-set fields do not matter");

        let mut other_subject = current.clone();
        other_subject.subjects.get_or_insert_default()[0].name = "system:serviceaccounts:team-b".into();
        assert!(!binding_is_current(&other_subject, &desired));
        let mut other_role = current.clone();
        other_role.role_ref.name = "admin".into();
        assert!(!binding_is_current(&other_role, &desired));
        let mut unlabelled = current;
        unlabelled.metadata.labels = None;
        assert!(!binding_is_current(&unlabelled, &desired));
    }

    #[test]
    fn the_operator_never_creates_or_changes_a_cluster_role_and_touches_bindings_by_name() {
        let rules = operator_cluster_role().rules.unwrap_or_default();
        let ours = [AGENT_ROLE.to_string(), SECRET_READER_ROLE.to_string()];
        for r in rules.iter().filter(|r| r.resources.iter().flatten().any(|s| s == "clusterroles")) {
            assert!(r.verbs.iter().all(|v| v == "get" || v == "bind"), "{r:?}");
            let names = r.resource_names.as_deref().unwrap_or_default();
            assert!(!names.is_empty() && names.iter().all(|n| ours.contains(n)), "{r:?}");
        }
        for r in rules.iter().filter(|r| r.resources.iter().flatten().any(|s| s == "rolebindings")) {
            if r.verbs != ["create"] {
                assert_eq!(r.resource_names.as_deref(), Some(&ours[..]), "{r:?}");
            }
        }
    }

    #[test]
    fn webhook_configuration_access_is_by_name() {
        let rules = operator_cluster_role().rules.unwrap_or_default();
        let webhook: Vec<_> = rules
            .iter()
            .filter(|r| r.resources.iter().flatten().any(|s| s == "mutatingwebhookconfigurations"))
            .collect();
        assert_eq!(webhook.len(), 1);
        assert_eq!(webhook[0].resource_names.as_deref(), Some(&[WEBHOOK_CONFIGURATION.to_string()][..]));
    }
}
