//! Leader election on a `coordination.k8s.io/v1` Lease, so that of several operator replicas
//! exactly one runs the controllers (the webhook and `/readyz` serve on every replica).
//!
//! ```text
//! Elector::start ──kube-lease-manager task: get/create the Lease, acquire, renew (SSA)──▶ watch<bool>
//!   controller::run: acquired() ─▶ controllers run ─▶ lost() | shutdown ─▶ controllers drain
//!                    release() ─▶ the task clears holderIdentity
//! ```
//!
//! Why a crate: `kube-lease-manager` is maintained, supports kube 5 / k8s-openapi 0.29, and
//! writes the Lease with server-side apply under one field manager per identity, so two
//! replicas acquiring a free Lease at once conflict instead of both winning. A holder renews
//! `grace` before its term ends; a standby sleeps until the term it last saw ends, then takes a
//! released or expired Lease. So a standby leads at most one term after the holder stopped,
//! released or not; releasing at shutdown keeps that bound even when the holder's last renewal
//! was recent.
//!
//! What a brief overlap would do: a holder cut off from the API server keeps `true` until its
//! next renewal fails, and a standby may already lead by then. Every write of the controllers
//! is a server-side apply under the one field manager `spear-operator`, computed from the
//! objects alone, so two replicas writing at once write the same thing; the overlap costs
//! duplicate work, not wrong state.

use std::time::Duration;

use kube::Client;
use kube_lease_manager::{LeaseCreateMode, LeaseManager, LeaseManagerBuilder, LeaseManagerError, LeaseParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::api::keys::FIELD_MANAGER;

/// Default term of a Lease: a standby takes over at most this long after the holder died
/// (client-go's default `LeaseDuration`).
pub(crate) const DEFAULT_LEASE_DURATION: Duration = Duration::from_secs(15);
/// Default margin: the holder renews this long before its term ends (so every 10 s by default).
pub(crate) const DEFAULT_LEASE_GRACE: Duration = Duration::from_secs(5);
/// How long a release may take at shutdown before the process goes anyway (the Lease then
/// expires by itself).
const RELEASE_TIMEOUT: Duration = Duration::from_secs(5);

/// Which Lease to hold, as whom, for how long.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeaderConfig {
    /// Name of the Lease (`--lease-name`).
    pub(crate) lease_name: String,
    /// Namespace of the Lease: the operator's own.
    pub(crate) namespace: String,
    /// Who this replica is, as written to `spec.holderIdentity`; unique per process.
    pub(crate) identity: String,
    /// How long a term lasts without renewal (whole seconds, at least 2).
    pub duration: Duration,
    /// How long before the term ends the holder renews (whole seconds, at least 1, below
    /// `duration`).
    pub grace: Duration,
}

impl LeaderConfig {
    /// A config with the default term and grace.
    pub fn new(lease_name: impl Into<String>, namespace: impl Into<String>, identity: impl Into<String>) -> Self {
        LeaderConfig {
            lease_name: lease_name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            duration: DEFAULT_LEASE_DURATION,
            grace: DEFAULT_LEASE_GRACE,
        }
    }

    /// The lease manager's parameters; refuses what the crate would panic on.
    fn params(&self) -> Result<LeaseParams, LeaderError> {
        let (duration, grace) = (self.duration.as_secs(), self.grace.as_secs());
        if grace == 0 || grace >= duration {
            return Err(LeaderError::Config {
                message: format!(
                    "the renewal margin ({grace} s) must be at least 1 s and below the lease duration ({duration} s)"
                ),
            });
        }
        if self.identity.is_empty() {
            return Err(LeaderError::Config { message: "the identity must not be empty".into() });
        }
        // One field manager per replica: that is what makes a simultaneous acquire conflict.
        Ok(LeaseParams::new(self.identity.clone(), duration, grace)
            .with_field_manager(format!("{FIELD_MANAGER}-lease-{}", self.identity)))
    }
}

/// This process's identity in leader election: the pod name (`POD_NAME`, else `HOSTNAME`)
/// and a random suffix, so a restarted pod with the same name is a new candidate (client-go
/// does the same).
pub(crate) fn default_identity() -> String {
    let host = std::env::var(crate::api::keys::ENV_POD_NAME)
        .or_else(|_| std::env::var("HOSTNAME"))
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "spear-operator".to_string());
    identity_for(&host, &uuid::Uuid::new_v4().simple().to_string())
}

/// `<host>_<first 8 characters of suffix>`.
fn identity_for(host: &str, suffix: &str) -> String {
    let short: String = suffix.chars().take(8).collect();
    format!("{host}_{short}")
}

/// Why leader election failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The configuration is unusable.
    #[error("leader election: {message}")]
    Config {
        /// What is wrong.
        message: String,
    },
    /// The Lease could not be read or created (RBAC: get and create on leases).
    #[error(
        "leader election: preparing Lease {namespace}/{name} failed (the operator needs get, create and patch on it): {source}"
    )]
    Start {
        namespace: String,
        name: String,
        /// The API error (boxed: it is large, and errors are the rare path).
        #[source]
        source: Box<LeaseManagerError>,
    },
    /// The election task ended: this replica no longer knows whether it leads.
    #[error("leader election on Lease {namespace}/{name} stopped: {reason}")]
    Stopped {
        namespace: String,
        name: String,
        /// Why, as far as known.
        reason: String,
    },
}

/// A running election: whether this replica holds the Lease, as it changes.
pub(crate) struct Elector {
    leading: watch::Receiver<bool>,
    task: JoinHandle<Result<LeaseManager, LeaseManagerError>>,
    config: LeaderConfig,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector").field("config", &self.config).field("leading", &*self.leading.borrow()).finish()
    }
}

impl Elector {
    /// Creates the Lease when missing and starts competing for it in a background task.
    pub(crate) async fn start(client: Client, config: LeaderConfig) -> Result<Self, LeaderError> {
        let params = config.params()?;
        let manager = LeaseManagerBuilder::new(client, &config.lease_name)
            .with_namespace(&config.namespace)
            .with_parameters(params)
            .with_create_mode(LeaseCreateMode::AutoCreate)
            .build()
            .await
            .map_err(|source| LeaderError::Start {
                namespace: config.namespace.clone(),
                name: config.lease_name.clone(),
                source: Box::new(source),
            })?;
        let (leading, task) = manager.watch().await;
        tracing::info!(lease = %config.lease_name, namespace = %config.namespace, identity = %config.identity, "leader election started");
        Ok(Elector { leading, task, config })
    }

    /// The identity this replica competes as.
    pub(crate) fn identity(&self) -> &str {
        &self.config.identity
    }

    /// Resolves once this replica holds the Lease (at once if it does).
    pub(crate) async fn acquired(&mut self) -> Result<(), LeaderError> {
        self.wait_for(true).await
    }

    /// Resolves once this replica no longer holds the Lease (at once if it does not).
    pub(crate) async fn lost(&mut self) -> Result<(), LeaderError> {
        self.wait_for(false).await
    }

    async fn wait_for(&mut self, leading: bool) -> Result<(), LeaderError> {
        let ended = self.leading.wait_for(|l| *l == leading).await.is_err();
        if ended {
            // The sender lives in the task: it ended (an error it could not recover from, or a panic).
            return Err(self.stopped("the election task ended"));
        }
        Ok(())
    }

    fn stopped(&self, reason: impl Into<String>) -> LeaderError {
        LeaderError::Stopped {
            namespace: self.config.namespace.clone(),
            name: self.config.lease_name.clone(),
            reason: reason.into(),
        }
    }

    /// Stops competing and gives the Lease up if held, so a standby takes it at its next check
    /// (within one term). Bounded by a timeout: shutdown never hangs on the API server.
    pub(crate) async fn release(self) {
        let Elector { leading, task, config } = self;
        // Dropping the last receiver is the task's signal to release and return.
        drop(leading);
        match tokio::time::timeout(RELEASE_TIMEOUT, task).await {
            Ok(Ok(Ok(_))) => tracing::info!(lease = %config.lease_name, identity = %config.identity, "lease released"),
            Ok(Ok(Err(error))) => {
                tracing::warn!(%error, lease = %config.lease_name, "releasing the lease failed; it expires by itself")
            }
            Ok(Err(error)) => tracing::warn!(%error, lease = %config.lease_name, "the election task failed"),
            Err(_) => tracing::warn!(lease = %config.lease_name, "releasing the lease timed out; it expires by itself"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_the_host_and_a_short_suffix() {
        assert_eq!(identity_for("spear-operator-7d9f", "0123456789abcdef"), "spear-operator-7d9f_01234567");
        assert_ne!(default_identity(), default_identity(), "two processes never share an identity");
    }

    #[test]
    fn a_grace_that_is_not_below_the_duration_is_refused_instead_of_panicking() {
        let mut config = LeaderConfig::new("lease", "ns", "me");
        config.grace = config.duration;
        assert!(matches!(config.params(), Err(LeaderError::Config { .. })));
        config.grace = Duration::from_millis(500);
        assert!(matches!(config.params(), Err(LeaderError::Config { .. })), "sub-second grace rounds to 0");
        config.grace = DEFAULT_LEASE_GRACE;
        assert!(config.params().is_ok());
        config.identity.clear();
        assert!(matches!(config.params(), Err(LeaderError::Config { .. })));
    }
}
