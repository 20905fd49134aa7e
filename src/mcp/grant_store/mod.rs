//! Where a stored grant (`oauth::grant`) lives. In a cluster: a Secret (`secret`). In local mode:
//! one JSON file per server, `<dir>/<server>.json`, the directory `SPEAR_GRANT_DIR` or
//! `$XDG_STATE_HOME/spear-mcp/grants` (`~/.local/state/spear-mcp/grants`), as follows.
//!
//! - **Owner only.** The directory is created 0700 and each file written 0600: a refresh token
//!   is the person's consent, usable by whoever reads it.
//! - **Atomic.** A write goes to a temporary file in the same directory, is synced, then renamed
//!   over the old one: the agent renewing a token and a person logging in again never leave a
//!   torn document, and a crash leaves the old grant or the new one.
//! - **Bounded reads** (`oauth::grant::MAX_GRANT_BYTES`); a server name is a DNS label, so it
//!   cannot climb out of the directory (checked again here).

pub(crate) mod secret;

use std::io::Write as _;
use std::os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _};
use std::path::{Path, PathBuf};

use super::oauth::grant::{GrantError, MAX_GRANT_BYTES, StoredGrant};
use crate::api::keys::ENV_GRANT_DIR;

/// Why a grant file could not be read or written.
#[derive(Debug, thiserror::Error)]
pub(crate) enum GrantStoreError {
    #[error("no grant stored at {path}")]
    Missing { path: PathBuf },
    #[error("reading the grant at {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("the grant at {path}: {source}")]
    Invalid { path: PathBuf, source: GrantError },
    #[error("writing the grant to {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("{0:?} is not a server name that can name a grant file")]
    BadName(String),
    #[error(
        "no directory for grants: set {ENV_GRANT_DIR} (or XDG_STATE_HOME or HOME) to where `spearlet auth login` \
         may store them"
    )]
    NoDirectory,
}

/// The grant directory from the environment (`lookup` reads a variable).
pub(crate) fn grant_dir(lookup: impl Fn(&str) -> Option<String>) -> Result<PathBuf, GrantStoreError> {
    let set = |name: &str| lookup(name).filter(|v| !v.is_empty());
    if let Some(dir) = set(ENV_GRANT_DIR) {
        return Ok(PathBuf::from(dir));
    }
    let state = set("XDG_STATE_HOME")
        .map(PathBuf::from)
        .or_else(|| set("HOME").map(|home| Path::new(&home).join(".local/state")))
        .ok_or(GrantStoreError::NoDirectory)?;
    Ok(state.join("spear-mcp/grants"))
}

/// The file of `server`'s grant in `dir`.
pub(crate) fn grant_path(dir: &Path, server: &str) -> Result<PathBuf, GrantStoreError> {
    let label = !server.is_empty()
        && server.len() <= 253
        && server.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && !server.starts_with('.');
    if !label {
        return Err(GrantStoreError::BadName(server.to_string()));
    }
    Ok(dir.join(format!("{server}.json")))
}

/// Reads the grant at `path`.
pub(crate) fn read(path: &Path) -> Result<StoredGrant, GrantStoreError> {
    use std::io::Read as _;
    let file = std::fs::File::open(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::NotFound => GrantStoreError::Missing { path: path.to_path_buf() },
        _ => GrantStoreError::Read { path: path.to_path_buf(), source },
    })?;
    let mut bytes = Vec::new();
    file.take(MAX_GRANT_BYTES as u64 + 1)
        .read_to_end(&mut bytes)
        .map_err(|source| GrantStoreError::Read { path: path.to_path_buf(), source })?;
    StoredGrant::parse(&bytes).map_err(|source| GrantStoreError::Invalid { path: path.to_path_buf(), source })
}

/// Writes `grant` to `path` (see the module header).
pub(crate) fn write(path: &Path, grant: &StoredGrant) -> Result<(), GrantStoreError> {
    let failed = |source: std::io::Error| GrantStoreError::Write { path: path.to_path_buf(), source };
    let dir = path.parent().ok_or_else(|| failed(std::io::Error::other("the path has no directory")))?;
    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(failed)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("grant");
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = (|| {
        let mut file = std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
        file.write_all(&grant.to_json())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(failed)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn grant() -> StoredGrant {
        crate::mcp::oauth::grant::tests::sample()
    }

    #[test]
    fn the_directory_comes_from_the_environment() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |name: &str| pairs.iter().find(|(k, _)| *k == name).map(|(_, v)| v.to_string())
        };
        assert_eq!(grant_dir(env(&[(ENV_GRANT_DIR, "/g"), ("HOME", "/h")])).expect("dir"), PathBuf::from("/g"));
        assert_eq!(
            grant_dir(env(&[("XDG_STATE_HOME", "/s"), ("HOME", "/h")])).expect("dir"),
            PathBuf::from("/s/spear-mcp/grants")
        );
        assert_eq!(grant_dir(env(&[("HOME", "/h")])).expect("dir"), PathBuf::from("/h/.local/state/spear-mcp/grants"));
        assert!(matches!(grant_dir(env(&[])), Err(GrantStoreError::NoDirectory)));
        for bad in ["", "../x", "a/b", ".hidden", "UPPER"] {
            assert!(grant_path(Path::new("/g"), bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn grants_are_written_whole_and_for_the_owner_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = grant_path(&dir.path().join("grants"), "github").expect("path");
        assert!(matches!(read(&path), Err(GrantStoreError::Missing { .. })));
        write(&path, &grant()).expect("write");
        let mode = |p: &Path| std::fs::metadata(p).expect("metadata").permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().expect("dir")), 0o700);
        let mut rotated = grant();
        rotated.refresh_token = Some("r2".into());
        write(&path, &rotated).expect("rewrite");
        assert_eq!(read(&path).expect("read").refresh_token.as_deref(), Some("r2"));
        let leftovers = std::fs::read_dir(path.parent().expect("dir")).expect("list").count();
        assert_eq!(leftovers, 1, "no temporary file is left behind");
        std::fs::write(&path, b"{not json").expect("corrupt");
        assert!(matches!(read(&path), Err(GrantStoreError::Invalid { .. })));
    }
}
