//! Which McpProfile a gateway caller gets: its identity (as the API server or the issuer
//! authenticated it) against the namespace's McpProfileBindings, and the profile it asked for.
//! Pure; `gateway` feeds it and turns a refusal into a 403.
//!
//! - **Exact matches, as RBAC.** A ServiceAccount subject is the user name
//!   `system:serviceaccount:<namespace>:<name>`, a User its name, a Group membership. No patterns.
//! - **One profile per request, never a union.** Two profiles' budgets, approvals, upstreams and
//!   rate limits do not merge into one sound policy, so a caller bound to several must name one
//!   (`Spear-Profile`); without it the request is refused with the choices. A caller bound to one
//!   gets it, and naming another is refused.
//! - **Deny by default.** No binding, no profile: 403 with the reason (never the list of other
//!   callers' profiles).
//! - Bindings that fail validation are left out by the caller of [`decide`] (`gateway`), so a
//!   malformed binding grants nothing.

use std::collections::BTreeMap;
use std::fmt;

use crate::api::{BindingSubject, McpProfileBinding, SubjectKind};

/// The prefix of a ServiceAccount's user name.
const SERVICE_ACCOUNT_PREFIX: &str = "system:serviceaccount:";

/// An authenticated caller.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Caller {
    /// The user name (`system:serviceaccount:<ns>:<name>` for a ServiceAccount).
    pub username: String,
    /// The user's uid when the authenticator reports one (a ServiceAccount's object uid).
    pub uid: Option<String>,
    pub groups: Vec<String>,
}

impl Caller {
    /// `(namespace, name)` when the caller is a ServiceAccount.
    pub fn service_account(&self) -> Option<(&str, &str)> {
        let rest = self.username.strip_prefix(SERVICE_ACCOUNT_PREFIX)?;
        rest.split_once(':').filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains(':'))
    }

    /// Whether `subject` of a binding in `namespace` names this caller.
    fn matches(&self, namespace: &str, kind: SubjectKind, name: &str, subject_namespace: Option<&str>) -> bool {
        match kind {
            SubjectKind::ServiceAccount => {
                self.service_account() == Some((subject_namespace.unwrap_or(namespace), name))
            }
            SubjectKind::User => self.username == name,
            SubjectKind::Group => self.groups.iter().any(|g| g == name),
        }
    }
}

impl fmt::Display for Caller {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.username)
    }
}

/// The profile a request gets, and the bindings that give it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Bound {
    pub profile: String,
    /// The bindings that name the caller for this profile, sorted.
    pub bindings: Vec<String>,
}

/// Why a caller gets no profile.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    #[error(
        "{caller} is bound to no McpProfile in namespace {namespace}: ask the platform team for an McpProfileBinding"
    )]
    NotBound { caller: String, namespace: String },
    #[error(
        "{caller} is bound to several McpProfiles ({}): name one with the Spear-Profile header",
        profiles.join(", ")
    )]
    Ambiguous { caller: String, profiles: Vec<String> },
    #[error("{caller} is not bound to McpProfile {requested:?}: use one of the caller's profiles ({})", bound.join(", "))]
    NotBoundTo { caller: String, requested: String, bound: Vec<String> },
}

/// The first subject of `binding` (in `namespace`) that names `caller`, if any: one line of the
/// decision log `explain --subject` prints.
pub fn subject_naming<'a>(
    binding: &'a McpProfileBinding,
    caller: &Caller,
    namespace: &str,
) -> Option<&'a BindingSubject> {
    binding.spec.subjects.iter().find(|s| caller.matches(namespace, s.kind, &s.name, s.namespace.as_deref()))
}

/// The profiles `caller` is bound to in `namespace` by `bindings` (validated ones), each with the
/// bindings that give it.
pub fn profiles_of<'a>(
    caller: &Caller,
    namespace: &str,
    bindings: impl IntoIterator<Item = &'a McpProfileBinding>,
) -> BTreeMap<String, Vec<String>> {
    let mut profiles: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for binding in bindings {
        if subject_naming(binding, caller, namespace).is_some() {
            let name = binding.metadata.name.clone().unwrap_or_default();
            profiles.entry(binding.spec.profile_ref.name.clone()).or_default().push(name);
        }
    }
    for names in profiles.values_mut() {
        names.sort();
    }
    profiles
}

/// The profile `caller` gets for one request: the one it is bound to, or the one it names
/// (`requested`, the `Spear-Profile` header) among several.
pub fn decide<'a>(
    caller: &Caller,
    namespace: &str,
    bindings: impl IntoIterator<Item = &'a McpProfileBinding>,
    requested: Option<&str>,
) -> Result<Bound, Refusal> {
    let mut profiles = profiles_of(caller, namespace, bindings);
    let who = || caller.username.clone();
    if profiles.is_empty() {
        return Err(Refusal::NotBound { caller: who(), namespace: namespace.to_string() });
    }
    let chosen = match requested {
        Some(requested) => match profiles.remove_entry(requested) {
            Some(found) => found,
            None => {
                return Err(Refusal::NotBoundTo {
                    caller: who(),
                    requested: requested.to_string(),
                    bound: profiles.into_keys().collect(),
                });
            }
        },
        None if profiles.len() == 1 => profiles.pop_first().unwrap_or_default(),
        None => return Err(Refusal::Ambiguous { caller: who(), profiles: profiles.into_keys().collect() }),
    };
    Ok(Bound { profile: chosen.0, bindings: chosen.1 })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::{BindingSubject, McpProfileBindingSpec, ProfileRef};

    fn binding(name: &str, profile: &str, subjects: &[(SubjectKind, &str, Option<&str>)]) -> McpProfileBinding {
        let spec = McpProfileBindingSpec {
            profile_ref: ProfileRef { name: profile.into() },
            subjects: subjects
                .iter()
                .map(|(kind, name, ns)| BindingSubject {
                    kind: *kind,
                    name: (*name).into(),
                    namespace: ns.map(Into::into),
                })
                .collect(),
        };
        let mut b = McpProfileBinding::new(name, spec);
        b.metadata.namespace = Some("team".into());
        b
    }

    fn sa(ns: &str, name: &str) -> Caller {
        Caller {
            username: format!("system:serviceaccount:{ns}:{name}"),
            uid: None,
            groups: vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")],
        }
    }

    use SubjectKind::{Group, ServiceAccount, User};

    #[test]
    fn a_service_account_is_matched_in_the_bindings_namespace_unless_one_is_named() {
        let bindings = [
            binding("b1", "reader", &[(ServiceAccount, "app", None)]),
            binding("b2", "writer", &[(ServiceAccount, "app", Some("other"))]),
        ];
        let here = decide(&sa("team", "app"), "team", &bindings, None).expect("bound");
        assert_eq!(here, Bound { profile: "reader".into(), bindings: vec!["b1".into()] });
        let there = decide(&sa("other", "app"), "team", &bindings, None).expect("bound");
        assert_eq!(there.profile, "writer");
        assert!(matches!(decide(&sa("third", "app"), "team", &bindings, None), Err(Refusal::NotBound { .. })));
    }

    #[test]
    fn names_are_exact_not_prefixes_or_patterns() {
        let bindings = [binding("b", "reader", &[(ServiceAccount, "app", None), (User, "alice", None)])];
        for caller in [
            sa("team", "app2"),
            sa("team", "ap"),
            Caller { username: "system:serviceaccount:team:app:x".into(), uid: None, groups: vec![] },
            Caller { username: "Alice".into(), uid: None, groups: vec![] },
            Caller { username: "alice ".into(), uid: None, groups: vec![] },
            // A user may not pose as a ServiceAccount through a group of that name.
            Caller { username: "mallory".into(), uid: None, groups: vec!["system:serviceaccount:team:app".into()] },
        ] {
            assert!(decide(&caller, "team", &bindings, None).is_err(), "{caller:?} must not match");
        }
    }

    #[test]
    fn a_group_binds_its_members() {
        let bindings = [binding("ns", "reader", &[(Group, "system:serviceaccounts:team", None)])];
        assert_eq!(decide(&sa("team", "any"), "team", &bindings, None).expect("bound").profile, "reader");
        assert!(decide(&sa("else", "any"), "team", &bindings, None).is_err());
    }

    #[test]
    fn several_profiles_need_a_choice_and_the_choice_must_be_bound() {
        let bindings = [
            binding("r", "reader", &[(ServiceAccount, "app", None)]),
            binding("w", "writer", &[(Group, "system:serviceaccounts:team", None)]),
            binding("x", "admin", &[(User, "root", None)]),
        ];
        let caller = sa("team", "app");
        match decide(&caller, "team", &bindings, None) {
            Err(Refusal::Ambiguous { profiles, .. }) => assert_eq!(profiles, ["reader", "writer"]),
            other => panic!("{other:?}"),
        }
        assert_eq!(decide(&caller, "team", &bindings, Some("writer")).expect("chosen").profile, "writer");
        match decide(&caller, "team", &bindings, Some("admin")) {
            Err(Refusal::NotBoundTo { bound, .. }) => assert_eq!(bound, ["reader", "writer"]),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn one_profile_bound_twice_lists_both_bindings() {
        let bindings =
            [binding("b2", "reader", &[(User, "alice", None)]), binding("b1", "reader", &[(Group, "devs", None)])];
        let caller = Caller { username: "alice".into(), uid: None, groups: vec!["devs".into()] };
        let bound = decide(&caller, "team", &bindings, Some("reader")).expect("bound");
        assert_eq!(bound.bindings, ["b1", "b2"]);
    }

    #[test]
    fn a_refusal_never_names_profiles_the_caller_is_not_bound_to() {
        let bindings = [binding("x", "admin", &[(User, "root", None)])];
        let refusal = decide(&sa("team", "app"), "team", &bindings, Some("admin")).expect_err("not bound");
        assert!(!refusal.to_string().contains("root"), "{refusal}");
        let refusal = decide(&sa("team", "app"), "team", &bindings, None).expect_err("not bound");
        assert!(!refusal.to_string().contains("admin"), "{refusal}");
    }
}
