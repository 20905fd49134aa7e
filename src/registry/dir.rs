//! Local mode's registry source: a directory of YAML/JSON manifests, re-read on change.
//!
//! ```text
//! notify watcher (dir, non-recursive) ──relevant event──▶ wake ──debounce──┐
//! poll timer (no watcher) / safety-net timer (with one) ───────────────────┤
//!                                                                          ▼
//!   DirSource::scan (spawn_blocking): list dir ─▶ per candidate file: stat ─▶ read if stat moved
//!        ─▶ hash unchanged? skip : api::manifest::parse ─▶ SourceIndex::apply / fail / delete
//!                                                                          ▼
//!                          SourceIndex::snapshot() ──▶ Publisher::publish (skips no-ops)
//! ```
//!
//! Only the directory's own regular files named `*.yaml`, `*.yml` or `*.json` count. Hidden
//! files, editor backups and temp files, subdirectories and symlinks (never followed, so a
//! link cannot pull in files from elsewhere) are skipped. What a file contributes, and what a
//! broken or deleted file does to the snapshot, is decided by the pure
//! [`SourceIndex`]; this module only moves bytes in and snapshots out.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use notify::event::{AccessKind, AccessMode};
use notify::{EventKind, RecursiveMode, Watcher};
use sha2::{Digest, Sha256};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::Error;
use super::snapshot::{Snapshot, SourceIndex, SourceProblem};
use super::view::{Publisher, RegistryView, WatchTask};
use crate::api::manifest;

/// Rescan period while a notify watcher runs. Some filesystems (network mounts, some container
/// overlays, bind mounts changed from outside a VM) drop or never deliver inotify events; a slow
/// full rescan bounds how stale the registry can get there. Rescans of unchanged files only stat.
const SAFETY_NET_RESCAN: Duration = Duration::from_secs(10);

/// A file's stat is trusted to mean "unchanged" only once its mtime is this much older than the
/// read that recorded it: filesystems with coarse timestamps (1–2 s) can otherwise hide a
/// same-size rewrite within the same tick (git's "racy clean" problem).
const RACY_WINDOW: Duration = Duration::from_secs(2);

/// Files larger than this are refused: manifests are small (the API server caps an object at
/// about 1.5 MiB), and a stray large file must not be read into memory every change.
const MAX_FILE_BYTES: u64 = 8 * 1024 * 1024;

/// How a [`DirWatch`] notices changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DirOptions {
    /// Period of the poll fallback, used when no notify watcher can run (or `force_poll`).
    pub poll_interval: Duration,
    /// Wait after the first event of a burst before rescanning.
    pub debounce: Duration,
    /// Poll even if a notify watcher could run.
    pub force_poll: bool,
}

impl Default for DirOptions {
    fn default() -> Self {
        DirOptions {
            // 1 s: changes show up quickly by hand, and a stat per file per second is cheap.
            poll_interval: Duration::from_secs(1),
            // 50 ms: one editor save is a burst of events (create tmp, write, close, rename,
            // chmod); waiting for the burst to end gives one rescan that sees the final file
            // instead of a half-written one, and stays well under what a person notices.
            debounce: Duration::from_millis(50),
            force_poll: false,
        }
    }
}

/// What a file looked like when it was last read: enough to skip re-reading it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    len: u64,
    modified: Option<SystemTime>,
    /// Inode and ctime (unix): a rename-into-place or a write with a forged mtime still moves them.
    inode: u64,
    changed: (i64, i64),
}

impl Stamp {
    fn of(meta: &fs::Metadata) -> Self {
        #[cfg(unix)]
        let (inode, changed) = {
            use std::os::unix::fs::MetadataExt;
            (meta.ino(), (meta.ctime(), meta.ctime_nsec()))
        };
        #[cfg(not(unix))]
        let (inode, changed) = (0, (0, 0));
        Stamp { len: meta.len(), modified: meta.modified().ok(), inode, changed }
    }
}

/// The last read of one file.
#[derive(Clone, Debug)]
struct FileRecord {
    stamp: Stamp,
    /// Whether `stamp` can be trusted (see [`RACY_WINDOW`]).
    settled: bool,
    hash: Vec<u8>,
}

// === impl DirSource ===

/// A directory of manifests and what was last read from it.
#[derive(Debug)]
pub struct DirSource {
    dir: PathBuf,
    records: BTreeMap<PathBuf, FileRecord>,
    index: SourceIndex,
    /// Whether the last scan could not list the directory.
    dir_missing: bool,
    /// Symlinks already reported, so a poll loop logs each once.
    noted_symlinks: BTreeSet<PathBuf>,
}

impl DirSource {
    /// Opens `dir` and reads it once; a missing, unreadable or non-directory path is an error.
    pub(crate) fn open(dir: &Path) -> Result<Self, Error> {
        let mut source = DirSource::new(dir)?;
        source.scan();
        Ok(source)
    }

    /// Checks that `dir` is a readable directory; reads nothing yet.
    fn new(dir: &Path) -> Result<Self, Error> {
        let meta = fs::metadata(dir).map_err(|source| Error::DirUnreadable { path: dir.to_path_buf(), source })?;
        if !meta.is_dir() {
            return Err(Error::NotADirectory { path: dir.to_path_buf() });
        }
        fs::read_dir(dir).map_err(|source| Error::DirUnreadable { path: dir.to_path_buf(), source })?;
        Ok(DirSource {
            dir: dir.to_path_buf(),
            records: BTreeMap::new(),
            index: SourceIndex::default(),
            dir_missing: false,
            noted_symlinks: BTreeSet::new(),
        })
    }

    /// One synchronous read of `dir` (for one-shot commands): its snapshot, problems included.
    pub fn load(dir: &Path) -> Result<Snapshot, Error> {
        Ok(DirSource::open(dir)?.snapshot())
    }

    /// Watches `dir` until the returned handle is dropped. Needs a Tokio runtime.
    pub fn watch(dir: &Path, options: DirOptions) -> Result<DirWatch, Error> {
        DirSource::watch_until(dir, options, &CancellationToken::new())
    }

    /// Watches `dir` until the handle is dropped or `shutdown` is cancelled. The first snapshot
    /// is read before this returns.
    pub fn watch_until(dir: &Path, options: DirOptions, shutdown: &CancellationToken) -> Result<DirWatch, Error> {
        let runtime =
            tokio::runtime::Handle::try_current().map_err(|_| Error::NoRuntime { path: dir.to_path_buf() })?;
        let mut source = DirSource::new(dir)?;
        // The watcher starts before the first scan, so a change made while (or right after) it
        // runs leaves a wake-up behind instead of being lost.
        let wake = Arc::new(Notify::new());
        let watcher = if options.force_poll { None } else { start_watcher(dir, &wake) };
        let initial = source.scan();
        let span = tracing::info_span!("registry_dir", dir = %dir.display());
        let task = WatchTask::spawn(&runtime, initial, shutdown, span, |publisher, stop| {
            Loop { source, publisher, options, wake, watcher, stop }.run()
        });
        Ok(DirWatch { dir: dir.to_path_buf(), task })
    }

    /// The snapshot of what was last read.
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.index.snapshot()
    }

    /// Re-reads the directory: files whose stat moved are read, and parsed if their content
    /// changed; files gone are forgotten. Blocking I/O.
    pub(crate) fn scan(&mut self) -> Snapshot {
        let listing = match fs::read_dir(&self.dir) {
            Ok(listing) => listing,
            Err(e) => {
                // Keep every file's objects: the last good snapshot keeps serving, degraded.
                self.dir_missing = true;
                self.index.set_source_problems(vec![SourceProblem {
                    file: self.dir.clone(),
                    line: 0,
                    field: "directory".into(),
                    message: format!("cannot list the registry directory: {e}"),
                    fix: "restore the directory (or its permissions); the last good registry keeps serving until then"
                        .into(),
                }]);
                return self.snapshot();
            }
        };
        self.dir_missing = false;
        self.index.set_source_problems(Vec::new());
        let mut present = BTreeSet::new();
        for entry in listing.flatten() {
            let path = entry.path();
            let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                tracing::trace!(path = %path.display(), "skipping a file whose name is not UTF-8");
                continue;
            };
            if !manifest::is_manifest_file_name(&name) {
                tracing::trace!(file = %name, "skipping a file that is not a manifest");
                continue;
            }
            // symlink_metadata: a symlink is reported as one, never followed.
            let Ok(meta) = fs::symlink_metadata(&path) else { continue };
            if meta.file_type().is_symlink() {
                if self.noted_symlinks.insert(path.clone()) {
                    tracing::debug!(file = %name, "skipping a symlink: symlinks are not followed");
                }
                continue;
            }
            if !meta.is_file() {
                continue;
            }
            if self.read_file(&path, &meta) {
                present.insert(path);
            }
        }
        let gone: Vec<PathBuf> = self.index.files().filter(|f| !present.contains(*f)).map(Path::to_path_buf).collect();
        for file in gone {
            tracing::debug!(file = %file.display(), "file removed from the registry");
            self.index.delete(&file);
            self.records.remove(&file);
        }
        self.noted_symlinks.retain(|p| p.is_symlink());
        self.snapshot()
    }

    /// Reads `path` if its stat moved; returns whether the file still exists.
    fn read_file(&mut self, path: &Path, meta: &fs::Metadata) -> bool {
        let stamp = Stamp::of(meta);
        if self.records.get(path).is_some_and(|r| r.settled && r.stamp == stamp) {
            return true;
        }
        let fail = |field: &str, message: String, fix: &str| SourceProblem {
            file: path.to_path_buf(),
            line: 0,
            field: field.into(),
            message,
            fix: fix.into(),
        };
        if meta.len() > MAX_FILE_BYTES {
            self.records.remove(path);
            let message =
                format!("the file is {} bytes, more than the {MAX_FILE_BYTES} a manifest file may have", meta.len());
            self.index.fail(path, fail("file", message, "split it into smaller files or move it out of the directory"));
            return true;
        }
        let read_at = SystemTime::now();
        // Read with the cap too: the file may have grown since its metadata was taken.
        let read = fs::File::open(path).and_then(|file| {
            let mut bytes = Vec::new();
            io::Read::read_to_end(&mut io::Read::take(file, MAX_FILE_BYTES + 1), &mut bytes).map(|_| bytes)
        });
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return false,
            Err(e) => {
                self.records.remove(path);
                let problem = fail("file", format!("cannot read the file: {e}"), "check the file's permissions");
                self.index.fail(path, problem);
                return true;
            }
        };
        let hash = Sha256::digest(&bytes).to_vec();
        let settled = stamp.modified.is_some_and(|m| m + RACY_WINDOW <= read_at);
        let unchanged = self.records.get(path).is_some_and(|r| r.hash == hash);
        self.records.insert(path.to_path_buf(), FileRecord { stamp, settled, hash });
        if unchanged {
            return true;
        }
        match String::from_utf8(bytes) {
            Ok(text) => {
                tracing::debug!(file = %path.display(), "reading changed file");
                self.index.apply(path, manifest::parse(&text));
            }
            Err(e) => {
                let problem = fail("document", format!("the file is not UTF-8 text: {e}"), "save the file as UTF-8");
                self.index.fail(path, problem);
            }
        }
        true
    }
}

// === impl DirWatch ===

/// A running directory watch; serves its snapshots, and stops when dropped.
#[derive(Debug)]
pub struct DirWatch {
    dir: PathBuf,
    task: WatchTask,
}

impl DirWatch {
    /// Completes when the watch task ends (shutdown, or a panic, reported as an error), for a
    /// `select!` over critical tasks. Completes at once if called again after it ended.
    pub async fn finished(&mut self) -> Result<(), Error> {
        self.task.finished().await.map_err(|source| Error::TaskFailed { path: self.dir.clone(), source })
    }
}

impl RegistryView for DirWatch {
    fn snapshot(&self) -> Arc<Snapshot> {
        self.task.snapshot()
    }

    fn watch(&self) -> watch::Receiver<Arc<Snapshot>> {
        self.task.watch()
    }
}

/// The watch loop's state: wait for a change signal, rescan, publish.
struct Loop {
    source: DirSource,
    publisher: Arc<Publisher>,
    options: DirOptions,
    wake: Arc<Notify>,
    watcher: Option<notify::RecommendedWatcher>,
    stop: CancellationToken,
}

impl Loop {
    async fn run(self) {
        let Loop { mut source, publisher, options, wake, mut watcher, stop } = self;
        loop {
            let watching = watcher.is_some() && !source.dir_missing;
            let period = if watching { SAFETY_NET_RESCAN } else { options.poll_interval };
            tokio::select! {
                () = stop.cancelled() => break,
                () = wake.notified() => {
                    tokio::select! {
                        () = stop.cancelled() => break,
                        () = tokio::time::sleep(options.debounce) => {}
                    }
                }
                () = tokio::time::sleep(period) => {}
            }
            let was_missing = source.dir_missing;
            let scanned = tokio::task::spawn_blocking(move || {
                let snapshot = source.scan();
                (source, snapshot)
            })
            .await;
            let snapshot;
            (source, snapshot) = match scanned {
                Ok(done) => done,
                Err(error) => {
                    tracing::error!(%error, "registry directory scan failed; the registry is no longer updated");
                    return;
                }
            };
            publisher.publish(snapshot);
            // A directory removed and recreated is a new inode: the old watch saw its last event.
            if was_missing && !source.dir_missing && !options.force_poll {
                watcher = start_watcher(&source.dir, &wake);
            }
        }
        tracing::debug!("registry directory watch stopped");
    }
}

/// A notify watcher on `dir` (non-recursive) that wakes the loop; `None` (poll fallback) if the
/// platform or its limits (for example inotify instances) do not allow one.
fn start_watcher(dir: &Path, wake: &Arc<Notify>) -> Option<notify::RecommendedWatcher> {
    let wake = Arc::clone(wake);
    let watched = dir.to_path_buf();
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(event) if !is_relevant(&event, &watched) => {}
        Ok(_) => wake.notify_one(),
        Err(error) => {
            tracing::debug!(%error, "file watcher error; rescanning");
            wake.notify_one();
        }
    };
    let started = notify::recommended_watcher(handler).and_then(|mut w| {
        w.watch(dir, RecursiveMode::NonRecursive)?;
        Ok(w)
    });
    match started {
        Ok(watcher) => Some(watcher),
        Err(error) => {
            tracing::warn!(%error, "cannot watch the registry directory for changes; polling instead");
            None
        }
    }
}

/// Whether an event may change what the registry reads. Opens and reads are not (the scan's own
/// reads would wake it again); events only about ignored names (editor swap files) are not;
/// events on the directory itself (deleted, moved) are.
fn is_relevant(event: &notify::Event, dir: &Path) -> bool {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return false,
        _ => {}
    }
    event.need_rescan()
        || event.paths.is_empty()
        || event
            .paths
            .iter()
            .any(|p| p == dir || p.file_name().and_then(|n| n.to_str()).is_none_or(manifest::is_manifest_file_name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_and_reads_are_not_relevant_but_writes_and_renames_are() {
        let event = |kind, path: &str| notify::Event::new(kind).add_path(PathBuf::from(path));
        let is_relevant = |event: &notify::Event| is_relevant(event, Path::new("/d"));
        assert!(!is_relevant(&event(EventKind::Access(AccessKind::Open(AccessMode::Any)), "/d/a.yaml")));
        assert!(!is_relevant(&event(EventKind::Access(AccessKind::Close(AccessMode::Read)), "/d/a.yaml")));
        assert!(is_relevant(&event(EventKind::Access(AccessKind::Close(AccessMode::Write)), "/d/a.yaml")));
        assert!(is_relevant(&event(EventKind::Create(notify::event::CreateKind::File), "/d/a.yml")));
        assert!(!is_relevant(&event(EventKind::Create(notify::event::CreateKind::File), "/d/.a.yaml.swp")));
        let rename =
            notify::Event::new(EventKind::Modify(notify::event::ModifyKind::Name(notify::event::RenameMode::Both)))
                .add_path(PathBuf::from("/d/a.yaml.tmp"))
                .add_path(PathBuf::from("/d/a.yaml"));
        assert!(is_relevant(&rename));
        assert!(is_relevant(&event(EventKind::Remove(notify::event::RemoveKind::Folder), "/d")));
    }
}
