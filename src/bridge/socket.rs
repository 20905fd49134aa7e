//! The listening Unix socket: checked directory, stale file replaced, mode 0660, removed on drop.
//!
//! ```text
//!  --socket DIR/NAME ──▶ DIR exists? ──▶ NAME a socket (stale)? replaced below; other file? refuse
//!        ──▶ bind + listen DIR/.NAME~ ──▶ chmod 0660 ──▶ rename to DIR/NAME
//!                                                        Drop: remove DIR/NAME if still ours
//! ```
//!
//! Binding under a staging name and renaming makes the socket appear at its path only once it
//! listens with its final mode: a client that waits for the file (the agent, tests) never meets
//! the instant between bind(2) and listen(2) (connection refused) or before the chmod.

use std::ffi::OsString;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use tokio::net::{UnixListener, UnixStream};

use super::Error;

/// Socket file mode: owner and group may connect, others may not. The sidecar (its own uid) and
/// the agent (uid 65532) share gid 65532, which 0600 would lock out; who may actually talk is
/// checked with `SO_PEERCRED` (`--peer-uid`).
pub(crate) const SOCKET_MODE: u32 = 0o660;

/// A bound socket that removes its file when dropped.
#[derive(Debug)]
pub(super) struct Listener {
    inner: UnixListener,
    path: PathBuf,
    /// (device, inode) of the file we created: on drop only that file is removed, never a socket
    /// another process has since put at the same path.
    identity: (u64, u64),
    /// The only uid allowed to connect (the agent's), checked with `SO_PEERCRED`; `None`: any.
    peer_uid: Option<u32>,
}

impl Listener {
    /// Binds `path` after checking its directory and replacing a stale socket file.
    pub(super) fn bind(path: &Path, peer_uid: Option<u32>) -> Result<Self, Error> {
        let listen_error = |source| Error::Listen { path: path.to_path_buf(), source };
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
        // A socket left by an earlier run of this container (the pod's volume outlives it) is
        // replaced by the rename below. A live bridge on the same path would be a misconfigured
        // pod; it keeps its open listener, and new clients reach this one.
        let stale = match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_socket() => true,
            Ok(meta) => {
                let kind = if meta.is_dir() { "a directory" } else { "not a socket" };
                return Err(Error::SocketPathTaken { path: path.to_path_buf(), kind });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => false,
            Err(source) => return Err(listen_error(source)),
        };
        let Some(name) = path.file_name() else {
            return Err(listen_error(io::Error::new(io::ErrorKind::InvalidInput, "the path has no file name")));
        };
        // Two bytes longer than the final name: the 108-byte socket path limit is rarely the
        // difference, and a too-long path is reported against the path the operator gave.
        let mut staging_name = OsString::from(".");
        staging_name.push(name);
        staging_name.push("~");
        let staging = dir.join(staging_name);
        match std::fs::symlink_metadata(&staging) {
            Ok(meta) if meta.file_type().is_socket() => std::fs::remove_file(&staging).map_err(listen_error)?,
            _ => {}
        }
        let inner = UnixListener::bind(&staging).map_err(listen_error)?;
        // From here on the file is ours: `Self`'s drop removes it on every exit path.
        let meta = std::fs::symlink_metadata(&staging).map_err(listen_error)?;
        let mut listener = Self { inner, path: staging.clone(), identity: (meta.dev(), meta.ino()), peer_uid };
        std::fs::set_permissions(&staging, std::fs::Permissions::from_mode(SOCKET_MODE)).map_err(listen_error)?;
        std::fs::rename(&staging, path).map_err(listen_error)?;
        listener.path = path.to_path_buf();
        if stale {
            tracing::info!(path = %path.display(), "replaced a stale socket file");
        }
        Ok(listener)
    }

    /// Accepts the next connection from the allowed uid (cancel-safe): a connection from any
    /// other process (another server's sidecar, with its own uid) is closed and logged.
    pub(super) async fn accept(&self) -> io::Result<UnixStream> {
        loop {
            let (stream, _addr) = self.inner.accept().await?;
            let Some(allowed) = self.peer_uid else { return Ok(stream) };
            match stream.peer_cred() {
                Ok(cred) if cred.uid() == allowed => return Ok(stream),
                Ok(cred) => tracing::warn!(uid = cred.uid(), allowed, "refused a client that is not the agent"),
                Err(error) => tracing::warn!(%error, "refused a client whose credentials cannot be read"),
            }
        }
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
        let listener = Listener::bind(&path, None).expect("bind over a stale socket");
        let mode = std::fs::metadata(&path).expect("socket file").permissions().mode();
        assert_eq!(mode & 0o777, SOCKET_MODE);
        let _client = std::os::unix::net::UnixStream::connect(&path).expect("listening as soon as the file is there");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("dir").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["s.sock"], "no staging file is left");
        drop(listener);
        assert!(!path.exists(), "removed on drop");
    }

    #[tokio::test]
    async fn leaves_a_socket_that_replaced_its_own_in_place() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("s.sock");
        let listener = Listener::bind(&path, None).expect("bind");
        std::fs::remove_file(&path).expect("remove");
        let _other = std::os::unix::net::UnixListener::bind(&path).expect("another socket at the path");
        drop(listener);
        assert!(path.exists(), "not ours: kept");
    }

    #[tokio::test]
    async fn refuses_a_missing_directory_and_a_path_that_is_not_a_socket() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("nope/s.sock");
        let err = Listener::bind(&missing, None).expect_err("missing dir");
        assert!(err.to_string().contains("does not exist"), "{err}");
        let file = dir.path().join("file");
        std::fs::write(&file, "keep me").expect("write");
        let err = Listener::bind(&file, None).expect_err("regular file");
        assert!(matches!(err, Error::SocketPathTaken { .. }), "{err}");
        assert_eq!(std::fs::read_to_string(&file).expect("still there"), "keep me");
        let err = Listener::bind(&file.join("s.sock"), None).expect_err("parent is a file");
        assert!(err.to_string().contains("is not a directory"), "{err}");
    }
}
