//! The directory registry source against real files and a real notify watcher: changes are
//! published within a second, broken files never replace the last good snapshot, ignored files
//! never contribute, and the revision moves iff an object does.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use spear::registry::{DirOptions, DirSource, DirWatch, Error, RegistryView, Snapshot};
use tokio::sync::watch;

/// How long a change may take to show up (the issue's bound).
const PUBLISH_WITHIN: Duration = Duration::from_secs(1);

fn server(name: &str, command: &str) -> String {
    format!(
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: {name}\nspec:\n  transport: stdio\n  stdio:\n    command: {command}\n"
    )
}

fn profile(name: &str) -> String {
    format!("apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata:\n  name: {name}\nspec:\n  servers: [fs]\n")
}

fn command_of(snapshot: &Snapshot, name: &str) -> Option<String> {
    snapshot.server(name).and_then(|s| s.object.spec.stdio.as_ref()).map(|s| s.command.clone())
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("test file must be writable");
    path
}

fn watch_dir(dir: &Path) -> (DirWatch, watch::Receiver<Arc<Snapshot>>) {
    let registry = DirSource::watch(dir, DirOptions::default()).expect("test dir must be watchable");
    let rx = registry.watch();
    (registry, rx)
}

/// Waits (at most [`PUBLISH_WITHIN`]) for a published snapshot that satisfies `done`.
async fn published(
    rx: &mut watch::Receiver<Arc<Snapshot>>,
    what: &str,
    done: impl FnMut(&Arc<Snapshot>) -> bool,
) -> Arc<Snapshot> {
    let outcome = match tokio::time::timeout(PUBLISH_WITHIN, rx.wait_for(done)).await {
        Ok(Ok(snapshot)) => Ok(Arc::clone(&snapshot)),
        Ok(Err(_)) => Err("the registry stopped before publishing"),
        Err(_) => Err("no snapshot within the time bound"),
    };
    outcome.unwrap_or_else(|why| panic!("{why}: {what}; last: {:?}", rx.borrow()))
}

#[tokio::test]
async fn creating_a_file_is_published_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_registry, mut rx) = watch_dir(dir.path());
    assert!(rx.borrow_and_update().servers().is_empty());
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    let snap = published(&mut rx, "create", |s| s.server("fs").is_some()).await;
    assert!(!snap.is_degraded(), "{:?}", snap.problems());
}

#[tokio::test]
async fn modifying_a_file_is_published_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    let (_registry, mut rx) = watch_dir(dir.path());
    let before = rx.borrow_and_update().revision().clone();
    write(dir.path(), "fs.yaml", &server("fs", "python"));
    let snap = published(&mut rx, "modify", |s| command_of(s, "fs").as_deref() == Some("python")).await;
    assert_ne!(snap.revision(), &before);
}

#[tokio::test]
async fn deleting_a_file_is_published_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(dir.path(), "fs.yaml", &format!("{}---\n{}", server("fs", "node"), profile("p")));
    let (_registry, mut rx) = watch_dir(dir.path());
    assert!(rx.borrow_and_update().profile("p").is_some());
    std::fs::remove_file(file).expect("remove");
    let snap = published(&mut rx, "delete", |s| s.servers().is_empty() && s.profiles().is_empty()).await;
    assert_eq!(snap.revision(), Snapshot::default().revision());
}

#[tokio::test]
async fn an_editor_save_by_rename_into_place_is_published_within_a_second() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    let (_registry, mut rx) = watch_dir(dir.path());
    rx.mark_unchanged();
    // What many editors do: write a temp file beside the target, then rename it over the target.
    let tmp = write(dir.path(), ".fs.yaml.tmp", &server("fs", "deno"));
    std::fs::rename(tmp, dir.path().join("fs.yaml")).expect("rename");
    let snap = published(&mut rx, "rename into place", |s| command_of(s, "fs").as_deref() == Some("deno")).await;
    assert!(!snap.is_degraded(), "{:?}", snap.problems());
}

#[tokio::test]
async fn a_broken_file_never_replaces_the_last_good_snapshot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = write(dir.path(), "fs.yaml", &server("fs", "node"));
    let (_registry, mut rx) = watch_dir(dir.path());
    let good = rx.borrow_and_update().clone();
    assert!(good.server("fs").is_some() && !good.is_degraded());

    // A YAML syntax error.
    write(dir.path(), "fs.yaml", &server("fs", "node").replace("  name: fs\n", "  name: [fs\n"));
    let snap = published(&mut rx, "syntax error", |s| s.is_degraded()).await;
    assert_eq!(snap.server("fs"), good.server("fs"));
    assert_eq!(snap.revision(), good.revision());
    let problem = &snap.problems()[0];
    assert_eq!(problem.file, file);
    assert!(problem.line >= 4, "{problem}");
    assert_eq!(problem.field, "document");

    // A validation error: the problem names its line and field.
    write(dir.path(), "fs.yaml", &server("fs", "node").replace("command: node", "command: ''"));
    let snap = published(&mut rx, "validation error", |s| s.problems().iter().any(|p| p.field != "document")).await;
    assert_eq!(snap.server("fs"), good.server("fs"));
    assert!(snap.is_degraded());
    let problem = &snap.problems()[0];
    assert_eq!(
        (problem.file.as_path(), problem.line, problem.field.as_str()),
        (file.as_path(), 8, "spec.stdio.command")
    );
    assert!(problem.to_string().starts_with(&format!("{}:8: spec.stdio.command: ", file.display())), "{problem}");

    // Meanwhile another file's change still applies, and the broken one keeps serving.
    write(dir.path(), "git.yaml", &server("git", "git-mcp"));
    let snap = published(&mut rx, "another file", |s| s.server("git").is_some()).await;
    assert!(snap.is_degraded());
    assert_eq!(snap.server("fs"), good.server("fs"));

    // Fixing the file clears degraded.
    write(dir.path(), "fs.yaml", &server("fs", "python"));
    let snap = published(&mut rx, "fixed", |s| !s.is_degraded()).await;
    assert_eq!(command_of(&snap, "fs").as_deref(), Some("python"));
    assert!(snap.server("git").is_some());
}

#[tokio::test]
async fn ignored_files_never_contribute() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_registry, mut rx) = watch_dir(dir.path());
    let outside = tempfile::tempdir().expect("tempdir");
    let target = write(outside.path(), "linked.yaml", &server("linked", "node"));
    std::os::unix::fs::symlink(&target, dir.path().join("linked.yaml")).expect("symlink");
    for (name, id) in [
        (".hidden.yaml", "hidden"),
        ("backup.yaml~", "tilde"),
        ("backup.yaml.bak", "bak"),
        ("merge.yaml.orig", "orig"),
        (".fs.yaml.swp", "swp"),
        ("save.yaml.tmp", "tmp"),
        ("#autosave.yaml#", "autosave"),
        ("notes.txt", "txt"),
    ] {
        write(dir.path(), name, &server(id, "node"));
    }
    std::fs::create_dir(dir.path().join("sub")).expect("mkdir");
    write(&dir.path().join("sub"), "nested.yaml", &server("nested", "node"));
    std::fs::create_dir(dir.path().join("dir.yaml")).expect("mkdir");
    // A change that does count, so we know a scan ran after all the ignored ones.
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    let snap = published(&mut rx, "the one real file", |s| s.server("fs").is_some()).await;
    assert_eq!(snap.servers().keys().collect::<Vec<_>>(), ["fs"]);
    assert!(!snap.is_degraded(), "{:?}", snap.problems());
    let loaded = DirSource::load(dir.path()).expect("load");
    assert_eq!(loaded.servers().keys().collect::<Vec<_>>(), ["fs"]);
}

#[tokio::test]
async fn identical_or_cosmetic_rewrites_keep_the_revision_and_any_field_change_moves_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    let (_registry, mut rx) = watch_dir(dir.path());
    let first = rx.borrow_and_update().clone();

    write(dir.path(), "fs.yaml", &server("fs", "node"));
    write(dir.path(), "fs.yaml", &format!("# the filesystem server\n\n{}\n# end\n", server("fs", "node")));
    // Give the watcher time to rescan (well past the debounce), then check nobody was woken.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!rx.has_changed().expect("registry running"), "a cosmetic rewrite woke subscribers");
    assert_eq!(rx.borrow().revision(), first.revision());

    write(dir.path(), "fs.yaml", &server("fs", "node").replace("spec:\n", "spec:\n  displayName: Files\n"));
    let snap = published(&mut rx, "displayName added", |s| s.revision() != first.revision()).await;
    assert_ne!(snap.server("fs").map(|s| &s.resource_version), first.server("fs").map(|s| &s.resource_version));
}

#[tokio::test]
async fn the_poll_fallback_also_picks_up_changes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let options = DirOptions { poll_interval: Duration::from_millis(100), force_poll: true, ..DirOptions::default() };
    let registry = DirSource::watch(dir.path(), options).expect("watch");
    let mut rx = registry.watch();
    write(dir.path(), "fs.yaml", &server("fs", "node"));
    published(&mut rx, "poll: create", |s| s.server("fs").is_some()).await;
    write(dir.path(), "fs.yaml", &server("fs", "python"));
    published(&mut rx, "poll: modify", |s| command_of(s, "fs").as_deref() == Some("python")).await;
    std::fs::remove_file(dir.path().join("fs.yaml")).expect("remove");
    published(&mut rx, "poll: delete", |s| s.servers().is_empty()).await;
}

#[tokio::test]
async fn duplicate_names_across_files_are_reported() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = write(dir.path(), "a.yaml", &server("fs", "node"));
    let (_registry, mut rx) = watch_dir(dir.path());
    let second = write(dir.path(), "b.yaml", &format!("{}---\n{}", profile("p"), server("fs", "python")));
    let snap = published(&mut rx, "duplicate", |s| s.is_degraded()).await;
    assert_eq!(command_of(&snap, "fs").as_deref(), Some("node"), "the first file by path wins");
    assert!(snap.profile("p").is_some(), "the rest of the second file still applies");
    let problem = &snap.problems()[0];
    assert_eq!((problem.file.as_path(), problem.line, problem.field.as_str()), (second.as_path(), 8, "metadata.name"));
    assert!(problem.message.contains(&format!("{}:1", first.display())), "{problem}");
}

#[tokio::test]
async fn a_missing_directory_is_an_error_naming_the_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope");
    let error = DirSource::load(&missing).expect_err("a missing directory");
    assert!(matches!(&error, Error::DirUnreadable { path, .. } if *path == missing), "{error:?}");
    assert!(error.to_string().contains(&missing.display().to_string()));
    let file = write(dir.path(), "fs.yaml", &server("fs", "node"));
    let error = DirSource::watch(&file, DirOptions::default()).expect_err("a file is not a directory");
    assert!(matches!(error, Error::NotADirectory { .. }), "{error:?}");
}

#[tokio::test]
async fn a_directory_that_disappears_keeps_the_last_snapshot_degraded_until_it_returns() {
    let parent = tempfile::tempdir().expect("tempdir");
    let dir = parent.path().join("registry");
    std::fs::create_dir(&dir).expect("mkdir");
    write(&dir, "fs.yaml", &server("fs", "node"));
    let options = DirOptions { poll_interval: Duration::from_millis(100), ..DirOptions::default() };
    let registry = DirSource::watch(&dir, options).expect("watch");
    let mut rx = registry.watch();
    let good = rx.borrow_and_update().clone();
    std::fs::remove_dir_all(&dir).expect("rm -r");
    let snap = published(&mut rx, "directory gone", |s| s.is_degraded()).await;
    assert_eq!(snap.revision(), good.revision());
    assert_eq!(snap.problems()[0].field, "directory");
    std::fs::create_dir(&dir).expect("mkdir again");
    write(&dir, "git.yaml", &server("git", "git-mcp"));
    let snap = published(&mut rx, "directory back", |s| !s.is_degraded()).await;
    assert_eq!(snap.servers().keys().collect::<Vec<_>>(), ["git"]);
    // The new directory is watched again: with a watcher the loop only rescans every 10 s, so a
    // change seen within a second came through the re-created watcher.
    write(&dir, "fs.yaml", &server("fs", "deno"));
    published(&mut rx, "change in the recreated directory", |s| s.server("fs").is_some()).await;
}

#[tokio::test]
async fn dropping_the_watch_stops_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (registry, mut rx) = watch_dir(dir.path());
    drop(registry);
    let closed = tokio::time::timeout(PUBLISH_WITHIN, async { while rx.changed().await.is_ok() {} }).await;
    assert!(closed.is_ok(), "the watch task must stop when its handle is dropped");
}

#[tokio::test]
async fn cancelling_the_shutdown_token_ends_the_watch() {
    let dir = tempfile::tempdir().expect("tempdir");
    let shutdown = tokio_util::sync::CancellationToken::new();
    let mut registry = DirSource::watch_until(dir.path(), DirOptions::default(), &shutdown).expect("watch");
    shutdown.cancel();
    let finished = tokio::time::timeout(PUBLISH_WITHIN, registry.finished()).await;
    assert!(matches!(finished, Ok(Ok(()))), "{finished:?}");
    // The handle keeps serving the last snapshot after the task ended.
    assert!(registry.snapshot().servers().is_empty());
}
