//! The gateway's caller decisions (`src/gateway/auth.rs`, `src/policy/binding.rs`,
//! `src/gateway/session_seal.rs`): any `Authorization` bytes, any caller against any bindings
//! with any requested profile, and any session id presented by any caller.
//!
//! Properties:
//! - a bearer token is taken exactly when the header is `bearer` in any case, spaces, then RFC
//!   6750 token characters with at most two `=` of padding, at most 16 KiB; it is the header's tail;
//! - a profile is given only to a caller a subject of one of its bindings names (checked against
//!   an independent reading of the subjects), with exactly those bindings listed; a requested
//!   profile is the one given; without one, the caller is bound to exactly one profile; no
//!   binding, no profile; a refusal names no profile the caller is not bound to, except the one
//!   it asked for;
//! - a sealed session id opens for its caller and profile as the door's id, and never for another
//!   caller or profile, nor with any byte changed.
#![no_main]

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use spear::api::{BindingSubject, McpProfileBinding, McpProfileBindingSpec, ProfileRef, SubjectKind};
use spear::gateway::auth;
use spear::gateway::session_seal::SessionSeal;
use spear::policy::binding::{self, Caller, Refusal};

const PROFILES: [&str; 4] = ["reader", "writer", "admin", "ops"];

#[derive(Arbitrary, Debug)]
struct Subject {
    kind: u8,
    name: String,
    namespace: Option<String>,
}

#[derive(Arbitrary, Debug)]
struct Input {
    authorization: Vec<u8>,
    username: String,
    groups: Vec<String>,
    bindings: Vec<(u8, Vec<Subject>)>,
    requested: Option<u8>,
    other_caller: String,
    session: String,
    flip: (u16, u8),
}

fn kind(k: u8) -> SubjectKind {
    match k % 3 {
        0 => SubjectKind::ServiceAccount,
        1 => SubjectKind::User,
        _ => SubjectKind::Group,
    }
}

/// The subject rule read independently: `system:serviceaccount:<ns>:<name>` spelled out whole.
fn names(subject: &Subject, namespace: &str, caller: &Caller) -> bool {
    match kind(subject.kind) {
        SubjectKind::ServiceAccount => {
            let ns = subject.namespace.as_deref().unwrap_or(namespace);
            !ns.is_empty()
                && !subject.name.is_empty()
                && !subject.name.contains(':')
                && !ns.contains(':')
                && caller.username == format!("system:serviceaccount:{ns}:{}", subject.name)
        }
        SubjectKind::User => caller.username == subject.name,
        SubjectKind::Group => caller.groups.contains(&subject.name),
    }
}

fuzz_target!(|input: Input| {
    // === bearer ===
    let header = &input.authorization;
    let taken = auth::bearer(Some(header));
    let expected = header.len() > 7 && header[..6].eq_ignore_ascii_case(b"bearer") && header[6] == b' ' && {
        let token = header[6..].trim_ascii_start();
        let body = token.iter().rposition(|b| *b != b'=').map_or(0, |i| i + 1);
        body > 0
            && token.len() - body <= 2
            && token.len() <= auth::MAX_TOKEN_BYTES
            && token[..body].iter().all(|b| b.is_ascii_alphanumeric() || b"-._~+/".contains(b))
    };
    assert_eq!(taken.is_ok(), expected, "{header:?}");
    if let Ok(token) = taken {
        assert!(header.ends_with(token.as_bytes()));
        let _ = auth::unverified_expiry(token);
    }

    // === binding decision ===
    let namespace = "team";
    let caller = Caller { username: input.username.clone(), uid: None, groups: input.groups.clone() };
    let bindings: Vec<McpProfileBinding> = input
        .bindings
        .iter()
        .enumerate()
        .map(|(i, (profile, subjects))| {
            let spec = McpProfileBindingSpec {
                profile_ref: ProfileRef { name: PROFILES[usize::from(*profile) % PROFILES.len()].into() },
                subjects: subjects
                    .iter()
                    .map(|s| BindingSubject {
                        kind: kind(s.kind),
                        name: s.name.clone(),
                        namespace: s.namespace.clone(),
                    })
                    .collect(),
            };
            McpProfileBinding::new(&format!("b{i}"), spec)
        })
        .collect();
    let mut bound_to = std::collections::BTreeMap::<&str, Vec<String>>::new();
    for (i, (profile, subjects)) in input.bindings.iter().enumerate() {
        if subjects.iter().any(|s| names(s, namespace, &caller)) {
            bound_to.entry(PROFILES[usize::from(*profile) % PROFILES.len()]).or_default().push(format!("b{i}"));
        }
    }
    for names in bound_to.values_mut() {
        names.sort();
    }
    let requested = input.requested.map(|r| PROFILES[usize::from(r) % PROFILES.len()]);
    match binding::decide(&caller, namespace, &bindings, requested) {
        Ok(bound) => {
            let expected = bound_to.get(bound.profile.as_str()).expect("given a profile it is bound to");
            assert_eq!(&bound.bindings, expected);
            match requested {
                Some(requested) => assert_eq!(bound.profile, requested),
                None => assert_eq!(bound_to.len(), 1),
            }
        }
        Err(refusal) => {
            match &refusal {
                Refusal::NotBound { .. } => assert!(bound_to.is_empty()),
                Refusal::Ambiguous { profiles, .. } => {
                    assert!(requested.is_none() && bound_to.len() > 1);
                    assert_eq!(
                        profiles.iter().map(String::as_str).collect::<Vec<_>>(),
                        bound_to.keys().copied().collect::<Vec<_>>()
                    );
                }
                Refusal::NotBoundTo { requested: asked, .. } => {
                    assert_eq!(Some(asked.as_str()), requested);
                    assert!(!bound_to.is_empty() && !bound_to.contains_key(asked.as_str()));
                }
            }
            // The caller's own name may spell anything; only check profiles it does not carry.
            let message = refusal.to_string();
            for profile in PROFILES {
                if !bound_to.contains_key(profile) && Some(profile) != requested && !caller.username.contains(profile) {
                    assert!(!message.contains(profile), "{message}");
                }
            }
        }
    }

    // === session ids ===
    let seal = SessionSeal::from_bytes([42; 32]);
    let profile = requested.unwrap_or("reader");
    let sealed = seal.seal(&caller.username, profile, &input.session);
    if input.session.is_empty() {
        assert_eq!(seal.open(&caller.username, profile, &sealed), None);
    } else {
        assert_eq!(seal.open(&caller.username, profile, &sealed), Some(input.session.as_str()));
    }
    if input.other_caller != caller.username {
        assert_eq!(seal.open(&input.other_caller, profile, &sealed), None);
    }
    assert_eq!(seal.open(&caller.username, "another-profile", &sealed), None);
    let mut bytes = sealed.clone().into_bytes();
    let at = usize::from(input.flip.0) % bytes.len();
    bytes[at] ^= input.flip.1.max(1);
    if let Ok(changed) = String::from_utf8(bytes) {
        assert_eq!(seal.open(&caller.username, profile, &changed), None, "{changed:?}");
    }
});
