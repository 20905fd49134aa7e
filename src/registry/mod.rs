//! Registry: what exists now, as immutable snapshots published by a source.
//!
//! ```text
//! directory of YAML ──dir::DirSource (notify + poll)──┐
//! kube reflectors (profile + namespace's servers) ────┤ SourceIndex / Snapshot::build (pure)
//!                                                     ▼
//!                               view::Publisher (atomic swap, watch channel)
//!                                                     ▼
//!                         RegistryView::snapshot() / ::watch()  ──▶ agent doors, CLI, tests
//! ```
//!
//! [`snapshot`] is pure (no I/O); [`view`] is the trait handlers are generic over; [`dir`] is
//! the thin I/O shell that turns a directory into snapshots; [`kube`] does the same for the
//! Kubernetes API (the pod's McpProfile and its namespace's McpServers, through reflectors);
//! [`describe`] renders a snapshot for people (pure).

use std::path::PathBuf;

pub mod describe;
pub mod dir;
pub mod kube;
pub mod snapshot;
pub mod view;

pub use self::kube::{KubeSource, KubeWatch, Relist, WatchOptions, snapshot_of_listed};
pub use dir::{DirOptions, DirSource, DirWatch};
pub use snapshot::{Entry, Item, Revision, Snapshot, SourceIndex, SourceProblem, Versioned, content_version};
pub use view::{Publisher, RegistryView, StaticRegistry};

/// Errors of the registry's sources.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The registry directory cannot be listed (missing, unreadable).
    #[error(
        "cannot read the registry directory {}: check that it exists and is readable by this user, or pass another --registry-dir",
        path.display()
    )]
    DirUnreadable {
        path: PathBuf,
        /// Why it cannot be read.
        #[source]
        source: std::io::Error,
    },
    /// The registry path exists but is not a directory.
    #[error("the registry path {} is not a directory: pass a directory of YAML manifests to --registry-dir", path.display())]
    NotADirectory {
        /// The path.
        path: PathBuf,
    },
    /// Watching needs a Tokio runtime to run its task on.
    #[error("watching the registry directory {} needs a Tokio runtime: call DirSource::watch from async code", path.display())]
    NoRuntime {
        /// The directory.
        path: PathBuf,
    },
    /// The task watching a directory panicked.
    #[error("the task watching the registry directory {} stopped unexpectedly: the registry is no longer updated", path.display())]
    TaskFailed {
        path: PathBuf,
        #[source]
        source: tokio::task::JoinError,
    },
}
