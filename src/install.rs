//! Copying the running executable to a path: `spearlet install --to PATH`, the command of the
//! webhook's init container (`operator::inject`).
//!
//! The init container puts the static spearlet into the pod's shared `emptyDir`, from which the
//! agent and every server sidecar run it. Doing the copy in the binary itself is what lets the
//! spearlet image hold no shell and no `cp` (distroless `static`, not `debug`): the image's
//! only executable is `/spearlet`.
//!
//! The copy is atomic and idempotent, because the kubelet runs the init container again when the
//! pod's sandbox is recreated, over a file an earlier run wrote:
//!
//! 1. read `/proc/self/exe` (the file the kernel is executing, whatever path or symlink started
//!    it, and even if that path has since been replaced);
//! 2. write it to a new temporary file in the destination's directory (same file system, so the
//!    rename below cannot cross devices), set mode 0755 (independent of the umask), fsync;
//! 3. rename it over the destination. A reader sees the old file or the whole new one, never a
//!    partial copy; and a destination still being executed is replaced rather than opened for
//!    writing, which `cp` would fail with "Text file busy".
//!
//! [`check_destination`] and [`temp_path`] are pure; [`install_self`] does the I/O.

use std::fs::{self, File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use thiserror::Error;

use crate::api::keys;

/// Mode of the installed file: every container of the pod runs it, under its own uid.
pub(crate) const INSTALLED_MODE: u32 = 0o755;

/// The executable of this process. On Linux this names the running file itself, so a copy is
/// always of the binary that is running, not of whatever now sits at its path.
const SELF_EXE: &str = "/proc/self/exe";

/// What is at the destination path or its directory, as [`check_destination`] needs it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Found {
    Nothing,
    File,
    Directory,
    /// A socket, device or FIFO: never replaced.
    Other,
}

impl Found {
    fn of(path: &Path) -> io::Result<Self> {
        // `metadata` follows symlinks: a destination that is a symlink to a directory is a
        // directory to the user, and a dangling one has no directory to write into.
        match fs::metadata(path) {
            Ok(meta) if meta.is_dir() => Ok(Self::Directory),
            Ok(meta) if meta.is_file() => Ok(Self::File),
            Ok(_) => Ok(Self::Other),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Self::Nothing),
            Err(e) => Err(e),
        }
    }
}

/// Why the executable was not installed.
#[derive(Debug, Error)]
pub(crate) enum InstallError {
    #[error("{} names no file (end the path with the file's name, for example {})", .0.display(), keys::SPEARLET)]
    NoFileName(PathBuf),
    #[error("{} is a directory (give the path of the file to write, for example {})", .0.display(), .0.join("spearlet").display())]
    IsDirectory(PathBuf),
    #[error("{} is not a regular file; refusing to replace it (choose another path)", .0.display())]
    NotAFile(PathBuf),
    #[error("directory {} does not exist (create it, or mount a volume there)", .0.display())]
    NoDirectory(PathBuf),
    #[error("{} is not a directory (the file must go into an existing directory)", .0.display())]
    ParentNotADirectory(PathBuf),
    #[error("reading {}: {source}", .path.display())]
    Inspect { path: PathBuf, source: io::Error },
    #[error("reading the running executable ({SELF_EXE}): {0}")]
    ReadSelf(#[source] io::Error),
    #[error("writing {}: {source}", .path.display())]
    Write { path: PathBuf, source: io::Error },
    #[error("replacing {} with {}: {source}", .to.display(), .from.display())]
    Rename { from: PathBuf, to: PathBuf, source: io::Error },
}

impl InstallError {
    /// The destination was named wrongly (the caller fixes the path): a usage error.
    pub(crate) fn is_usage(&self) -> bool {
        matches!(
            self,
            Self::NoFileName(_)
                | Self::IsDirectory(_)
                | Self::NotAFile(_)
                | Self::NoDirectory(_)
                | Self::ParentNotADirectory(_)
        )
    }
}

/// The directory `destination` goes into (`.` for a bare file name), or why it names no file:
/// a path ending in `/`, `.` or `..`, or the root.
pub(crate) fn parent_dir(destination: &Path) -> Result<&Path, InstallError> {
    // On the bytes, not `components()`: that drops a trailing `.` and `/`, which would turn
    // `/spear/bin/.` or `/spear/bin/` into the file `/spear/bin`.
    let last = destination.as_os_str().as_encoded_bytes().rsplit(|b| *b == b'/').next().unwrap_or_default();
    if matches!(last, b"" | b"." | b"..") {
        return Err(InstallError::NoFileName(destination.to_path_buf()));
    }
    Ok(match destination.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    })
}

/// Whether `destination` may be written, given what is there (`at`) and at its directory
/// (`directory`).
pub(crate) fn check_destination(destination: &Path, at: Found, directory: Found) -> Result<(), InstallError> {
    let parent = parent_dir(destination)?;
    match directory {
        Found::Directory => {}
        Found::Nothing => return Err(InstallError::NoDirectory(parent.to_path_buf())),
        Found::File | Found::Other => return Err(InstallError::ParentNotADirectory(parent.to_path_buf())),
    }
    match at {
        Found::Nothing | Found::File => Ok(()),
        Found::Directory => Err(InstallError::IsDirectory(destination.to_path_buf())),
        Found::Other => Err(InstallError::NotAFile(destination.to_path_buf())),
    }
}

/// The temporary file a copy to `destination` is written to: hidden, next to it, and named for
/// the process, so two concurrent installs never write the same file. A container's process is
/// often pid 1 every time, so a leftover of a killed earlier run has the same name; it is
/// removed first.
pub(crate) fn temp_path(destination: &Path, pid: u32) -> Result<PathBuf, InstallError> {
    let parent = parent_dir(destination)?;
    let name = destination.file_name().ok_or_else(|| InstallError::NoFileName(destination.to_path_buf()))?;
    let mut temp = std::ffi::OsString::from(".");
    temp.push(name);
    temp.push(format!(".tmp.{pid}"));
    Ok(parent.join(temp))
}

/// Copies the running executable to `destination` atomically, with mode 0755, replacing a file
/// already there. Returns the number of bytes written.
pub(crate) fn install_self(destination: &Path) -> Result<u64, InstallError> {
    let parent = parent_dir(destination)?;
    let inspect = |path: &Path| Found::of(path).map_err(|source| InstallError::Inspect { path: path.into(), source });
    check_destination(destination, inspect(destination)?, inspect(parent)?)?;

    let mut source = File::open(SELF_EXE).map_err(InstallError::ReadSelf)?;
    let temp = temp_path(destination, std::process::id())?;
    let write_err = |source| InstallError::Write { path: temp.clone(), source };
    match fs::remove_file(&temp) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(write_err(e)),
        _ => {}
    }
    // `create_new` (O_EXCL) never follows a symlink planted at the temporary name.
    let mut out = OpenOptions::new().write(true).create_new(true).mode(0o700).open(&temp).map_err(write_err)?;
    let written = (|| {
        let written = io::copy(&mut source, &mut out)?;
        // Explicitly, since `mode` above is filtered through the umask.
        out.set_permissions(fs::Permissions::from_mode(INSTALLED_MODE))?;
        out.sync_all()?;
        Ok(written)
    })()
    .map_err(write_err);
    drop(out);
    let renamed = written.and_then(|written| {
        fs::rename(&temp, destination).map(|()| written).map_err(|source| InstallError::Rename {
            from: temp.clone(),
            to: destination.to_path_buf(),
            source,
        })
    });
    if renamed.is_err() {
        // Best effort: the error being returned is the one that matters.
        let _ = fs::remove_file(&temp);
    }
    let written = renamed?;
    // Make the rename itself durable. The volume is an emptyDir that does not outlive the pod,
    // so a failure here costs nothing the next run would not redo: ignored.
    if let Ok(dir) = File::open(parent) {
        let _ = dir.sync_all();
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    use super::*;

    #[test]
    fn a_destination_must_name_a_file() {
        for bad in ["/", "/spear/bin/", "/spear/bin/.", "/spear/bin/..", "", "."] {
            let err = parent_dir(Path::new(bad)).expect_err(bad);
            assert!(matches!(err, InstallError::NoFileName(_)) && err.is_usage(), "{bad}: {err}");
        }
        assert_eq!(parent_dir(Path::new("/spear/bin/spearlet")).expect("ok"), Path::new("/spear/bin"));
        assert_eq!(parent_dir(Path::new("spearlet")).expect("ok"), Path::new("."));
        assert_eq!(parent_dir(Path::new("/spearlet")).expect("ok"), Path::new("/"));
    }

    #[test]
    fn a_file_or_nothing_in_an_existing_directory_may_be_written() {
        let dest = Path::new("/spear/bin/spearlet");
        assert!(check_destination(dest, Found::Nothing, Found::Directory).is_ok());
        assert!(check_destination(dest, Found::File, Found::Directory).is_ok(), "a rerun replaces its own copy");
    }

    #[test]
    fn a_directory_or_a_missing_parent_is_refused_with_the_fix() {
        let dest = Path::new("/spear/bin");
        let err = check_destination(dest, Found::Directory, Found::Directory).expect_err("a directory");
        assert!(err.is_usage());
        assert_eq!(
            err.to_string(),
            "/spear/bin is a directory (give the path of the file to write, for example /spear/bin/spearlet)"
        );

        let dest = Path::new("/spear/bin/spearlet");
        let err = check_destination(dest, Found::Nothing, Found::Nothing).expect_err("no parent");
        assert!(err.is_usage());
        assert_eq!(err.to_string(), "directory /spear/bin does not exist (create it, or mount a volume there)");
        let err = check_destination(dest, Found::Nothing, Found::File).expect_err("parent is a file");
        assert!(matches!(err, InstallError::ParentNotADirectory(_)) && err.is_usage(), "{err}");
        let err = check_destination(dest, Found::Other, Found::Directory).expect_err("a FIFO");
        assert!(matches!(err, InstallError::NotAFile(_)) && err.is_usage(), "{err}");
    }

    #[test]
    fn the_temporary_file_is_hidden_next_to_the_destination() {
        let temp = temp_path(Path::new("/spear/bin/spearlet"), 1).expect("ok");
        assert_eq!(temp, Path::new("/spear/bin/.spearlet.tmp.1"));
        assert_eq!(temp_path(Path::new("spearlet"), 7).expect("ok"), Path::new("./.spearlet.tmp.7"));
    }

    /// The test binary copies itself: twice (the second run replaces the first copy), over a
    /// leftover temporary file of a killed earlier run, leaving only the executable behind.
    #[test]
    fn install_self_copies_this_executable_atomically_and_again_over_its_copy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let dest = dir.path().join("spearlet");
        let size = fs::metadata(SELF_EXE).expect("own executable").len();
        assert_eq!(install_self(&dest).expect("first install"), size);
        fs::write(temp_path(&dest, std::process::id()).expect("temp"), b"partial").expect("a leftover");
        assert_eq!(install_self(&dest).expect("second install"), size);

        let meta = fs::metadata(&dest).expect("installed");
        assert_eq!(meta.len(), size);
        assert_eq!(meta.permissions().mode() & 0o777, INSTALLED_MODE);
        let names: Vec<_> = fs::read_dir(dir.path()).expect("list").map(|e| e.expect("entry").file_name()).collect();
        assert_eq!(names, ["spearlet"], "no temporary file is left behind");
    }

    #[test]
    fn install_self_refuses_a_directory_and_a_missing_parent_before_writing() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(matches!(install_self(dir.path()), Err(InstallError::IsDirectory(_))));
        let missing = dir.path().join("no/such/dir/spearlet");
        assert!(matches!(install_self(&missing), Err(InstallError::NoDirectory(_))));
        assert_eq!(fs::read_dir(dir.path()).expect("list").count(), 0, "nothing was written");
    }
}
