//! The secret values one agent holds, as they come and go: the pool adds a server's values when
//! it resolves its configuration and its tokens when it gets them, the agent adds its own keys.
//! Readers take the current [`Redactor`] (one `Arc` clone); a change rebuilds it.
//!
//! - Bounded: [`MAX_PER_ORIGIN`] values per origin (a token refreshed hourly keeps its last few:
//!   an old one may still be valid, and still must not leave) and [`MAX_VALUES`] in all, the
//!   oldest going first.
//! - A value already held under the same grant is not added again, so a reconnect rebuilds
//!   nothing.

use std::sync::Arc;

use parking_lot::{Mutex, RwLock};

use super::{MIN_SECRET_BYTES, Redactor, Secret};

/// Values kept per origin.
const MAX_PER_ORIGIN: usize = 4;
/// Values kept in all.
const MAX_VALUES: usize = 4096;

/// See the module header.
#[derive(Default)]
pub struct HeldSecrets {
    values: Mutex<Vec<Secret>>,
    redactor: RwLock<Arc<Redactor>>,
}

impl std::fmt::Debug for HeldSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldSecrets").field("values", &self.values.lock().len()).finish()
    }
}

impl HeldSecrets {
    /// Holds `value`, from `origin`, granted to `server` (`None`: to no server). Values shorter
    /// than [`MIN_SECRET_BYTES`] are not searched and not kept.
    pub(crate) fn hold(&self, origin: &str, value: &str, server: Option<&str>) {
        self.hold_all([(origin.to_string(), value.to_string())], server);
    }

    /// [`Self::hold`] for several values of one grant, rebuilding once.
    pub(crate) fn hold_all(&self, values: impl IntoIterator<Item = (String, String)>, server: Option<&str>) {
        let mut held = self.values.lock();
        let mut changed = false;
        for (origin, value) in values {
            if value.len() < MIN_SECRET_BYTES
                || held.iter().any(|s| s.value == value && s.granted_to.as_deref() == server && *s.origin == *origin)
            {
                continue;
            }
            let same_origin: Vec<usize> =
                held.iter().enumerate().filter(|(_, s)| *s.origin == *origin).map(|(i, _)| i).collect();
            if same_origin.len() >= MAX_PER_ORIGIN {
                held.remove(same_origin[0]);
            }
            if held.len() >= MAX_VALUES {
                held.remove(0);
            }
            held.push(Secret { value, origin: origin.into(), granted_to: server.map(Arc::from) });
            changed = true;
        }
        if changed {
            let redactor = Arc::new(Redactor::new(held.iter().cloned()));
            *self.redactor.write() = redactor;
        }
    }

    /// The redactor over every value held now.
    pub(crate) fn redactor(&self) -> Arc<Redactor> {
        self.redactor.read().clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_held_once_bounded_per_origin_and_short_ones_ignored() {
        let held = HeldSecrets::default();
        assert!(held.redactor().is_empty());
        held.hold("upstream api key", "sk-abcdefghijklmnop", None);
        held.hold("upstream api key", "sk-abcdefghijklmnop", None);
        held.hold("short", "abc", None);
        let r = held.redactor();
        assert_eq!(r.redact("key sk-abcdefghijklmnop here"), "key [redacted: upstream api key] here");
        assert_eq!(held.values.lock().len(), 1);
        for i in 0..6 {
            held.hold("access token of web", &format!("token-number-{i:04}"), Some("web"));
        }
        let r = held.redactor();
        assert_eq!(held.values.lock().len(), 1 + MAX_PER_ORIGIN);
        assert_eq!(r.redact("token-number-0000"), "token-number-0000", "the oldest token went");
        assert_eq!(r.redact("token-number-0005"), "[redacted: access token of web]");
        assert_eq!(r.foreign_in("token-number-0005", "web"), None, "granted to web");
        assert_eq!(r.foreign_in("token-number-0005", "fs"), Some("access token of web"));
    }
}
