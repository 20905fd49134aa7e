//! The listening Unix socket: checked directory, stale file replaced, mode 0660, removed on drop.
//!
//! ```text
//!  --socket PATH ──▶ parent dir exists? ──▶ stale socket? remove ──▶ bind ──▶ chmod 0660
//!                                            other file? refuse              │
//!                                                                 Drop: remove PATH if still ours
//! ```

use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

use super::Error;

/// Socket file mode: owner and group may connect, others may not. The agent and the sidecars of a
/// pod share the socket's `emptyDir`; with different UIDs they share a group through the pod's
/// `fsGroup` (the volume is group-owned and setgid), which 0600 would lock out.
pub const SOCKET_MODE: u32 = 0o660;

/// A bound socket that removes its file when dropped.
#[derive(Debug)]
pub(super) struct Listener {
    inner: UnixListener,
    path: PathBuf,
    /// (device, inode) of the file we created: on drop only that file is removed, never a socket
    /// another process has since put at the same path.
    identity: (u64, u64),
}

impl Listener {
    /// Binds `path` after checking its directory and replacing a stale socket file.
    pub(super) fn bind(path: &Path) -> Result<Self, Error> {
        let dir = match path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        match std::fs::metadata(dir) {
            Ok(meta) if meta.is_dir() => {}
            Ok(_) => return Err(Error::SocketDir { dir: dir.to_path_buf(), reason: "is not a directory".into() }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                return Err(Error::SocketDir {
                    dir: dir.to_path_buf(),
                    reason: "does not exist (create it, or mount the shared volume there)".into(),
                });
            }
            Err(e) => return Err(Error::SocketDir { dir: dir.to_path_buf(), reason: e.to_string() }),
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => {
                // Left by an earlier run of this container (the pod's volume outlives it). A live
                // bridge on the same path would be a misconfiguration of the pod; it keeps its
                // open listener, and new clients reach this one.
                std::fs::remove_file(path).map_err(|source| Error::Listen { path: path.to_path_buf(), source })?;
                tracing::info!(path = %path.display(), "removed a stale socket file");
            }
            Ok(meta) => {
                let kind = if meta.is_dir() { "a directory" } else { "not a socket" };
                return Err(Error::SocketPathTaken { path: path.to_path_buf(), kind });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(source) => return Err(Error::Listen { path: path.to_path_buf(), source }),
        }
        let inner = UnixListener::bind(path).map_err(|source| Error::Listen { path: path.to_path_buf(), source })?;
        // From here on the file is ours: `Self`'s drop removes it on every exit path.
        let meta =
            std::fs::symlink_metadata(path).map_err(|source| Error::Listen { path: path.to_path_buf(), source })?;
        let listener = Self { inner, path: path.to_path_buf(), identity: (meta.dev(), meta.ino()) };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
            .map_err(|source| Error::Listen { path: path.to_path_buf(), source })?;
        Ok(listener)
    }

    /// Accepts the next connection (cancel-safe).
    pub(super) async fn accept(&self) -> io::Result<UnixStream> {
        self.inner.accept().await.map(|(stream, _addr)| stream)
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let ours = std::fs::symlink_metadata(&self.path).is_ok_and(|m| (m.dev(), m.ino()) == self.identity);
        if ours && let Err(error) = std::fs::remove_file(&self.path) {
            tracing::warn!(path = %self.path.display(), %error, "cannot remove the socket file");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn binds_with_mode_0660_replaces_a_stale_socket_and_removes_its_file_on_drop() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        drop(std::os::unix::net::UnixListener::bind(&path).expect("stale socket"));
        assert!(path.exists(), "a dropped std listener leaves its file behind");
        let listener = Listener::bind(&path).expect("bind over a stale socket");
        let mode = std::fs::metadata(&path).expect("socket file").permissions().mode();
        assert_eq!(mode & 0o777, SOCKET_MODE);
        drop(listener);
        assert!(!path.exists(), "removed on drop");
    }

    #[tokio::test]
    async fn leaves_a_socket_that_replaced_its_own_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = Listener::bind(&path).expect("bind");
        std::fs::remove_file(&path).expect("remove");
        let _other = std::os::unix::net::UnixListener::bind(&path).expect("another socket at the path");
        drop(listener);
        assert!(path.exists(), "not ours: kept");
    }

    #[tokio::test]
    async fn refuses_a_missing_directory_and_a_path_that_is_not_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope/s.sock");
        let err = Listener::bind(&missing).expect_err("missing dir");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "keep me").expect("write");
        let err = Listener::bind(&file).expect_err("regular file");
        assert!(matches!(err, Error::SocketPathTaken { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&file).expect("still there"), "keep me");
        let err = Listener::bind(&file.join("s.sock")).expect_err("parent is a file");
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }
}
