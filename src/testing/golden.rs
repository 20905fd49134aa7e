//! Golden files: checked-in outputs (CRDs, injection patches) that a test compares with what the
//! code renders now, so a change to them is a reviewed diff rather than a surprise. With
//! `SPEAR_BLESS=1` the test rewrites the directory instead of comparing (stale files removed), and
//! the diff is reviewed and committed.

use std::path::Path;

/// The variable that turns a golden comparison into a rewrite.
pub const BLESS_ENV: &str = "SPEAR_BLESS";

fn blessing() -> bool {
    std::env::var_os(BLESS_ENV).is_some_and(|v| v == "1")
}

/// Compares `files` (file name, content) with the `*.{extension}` files of `dir`, or rewrites them
/// under `SPEAR_BLESS=1`. Returns one line per difference (missing, differing with the new
/// content, or stale: a file no entry renders); empty when they match. Panics only on I/O errors,
/// which in a test are the failure.
pub fn check_dir(dir: &Path, extension: &str, files: &[(String, String)]) -> Vec<String> {
    let suffix = format!(".{extension}");
    let stale: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .map(|entry| entry.file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(&suffix) && !files.iter().any(|(f, _)| f == name))
        .collect();
    if blessing() {
        std::fs::create_dir_all(dir).unwrap_or_else(|e| panic!("{} must be creatable: {e}", dir.display()));
        for (file, content) in files {
            let path = dir.join(file);
            std::fs::write(&path, content).unwrap_or_else(|e| panic!("{} must be writable: {e}", path.display()));
        }
        for name in &stale {
            let path = dir.join(name);
            std::fs::remove_file(&path).unwrap_or_else(|e| panic!("{} must be removable: {e}", path.display()));
        }
        return Vec::new();
    }
    let mut problems = Vec::new();
    for (file, content) in files {
        let path = dir.join(file);
        match std::fs::read_to_string(&path) {
            Err(_) => problems.push(format!("{}: missing", path.display())),
            Ok(expected) if &expected != content => {
                problems.push(format!("{}: differs; now:\n{content}", path.display()))
            }
            Ok(_) => {}
        }
    }
    problems.extend(stale.into_iter().map(|name| format!("{name}: nothing renders it any more; delete it")));
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_missing_differing_and_stale_files() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("same.json"), "1\n").expect("write");
        std::fs::write(dir.path().join("changed.json"), "old\n").expect("write");
        std::fs::write(dir.path().join("gone.json"), "x\n").expect("write");
        std::fs::write(dir.path().join("notes.txt"), "not a golden\n").expect("write");
        let files = [
            ("same.json".to_string(), "1\n".to_string()),
            ("changed.json".to_string(), "new\n".to_string()),
            ("new.json".to_string(), "2\n".to_string()),
        ];
        // Only meaningful when the suite is not blessing; under SPEAR_BLESS=1 it rewrites.
        if blessing() {
            return;
        }
        let problems = check_dir(dir.path(), "json", &files);
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert!(problems.iter().any(|p| p.contains("changed.json: differs")));
        assert!(problems.iter().any(|p| p.contains("new.json: missing")));
        assert!(problems.iter().any(|p| p.starts_with("gone.json")));
    }
}
