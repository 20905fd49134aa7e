//! Every invalid manifest under `tests/fixtures/invalid/` is refused by local validation (the
//! same `parse` + `validate()` that local mode, `spearlet validate` and the operator use), with
//! a problem naming the field its `# field:` header gives. The API-server half of the same
//! fixtures is in `cluster/control_plane.rs`.

use std::path::PathBuf;

use spear::api::manifest;

/// A fixture file and the header lines that say what it must fail on.
pub struct Fixture {
    /// Where the fixture is.
    pub path: PathBuf,
    pub text: String,
    pub field: String,
    pub api_rejects: bool,
}

/// Reads every fixture, checking the headers are present.
pub fn invalid_fixtures() -> Vec<Fixture> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("tests/fixtures/invalid must exist")
        .map(|e| e.expect("readable dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).expect("fixture must be readable");
            let header = |key: &str| {
                text.lines()
                    .find_map(|l| l.strip_prefix(&format!("# {key}: ")))
                    .unwrap_or_else(|| panic!("{} has no '# {key}:' header", path.display()))
                    .trim()
                    .to_string()
            };
            let field = header("field");
            let api_rejects = match header("api").as_str() {
                "rejects" => true,
                "accepts" => false,
                other => panic!("{}: '# api: {other}' must be rejects or accepts", path.display()),
            };
            Fixture { path, text, field, api_rejects }
        })
        .collect()
}

#[test]
fn there_are_at_least_25_invalid_fixtures_of_both_layers() {
    let all = invalid_fixtures();
    assert!(all.len() >= 25, "only {} fixtures", all.len());
    // Both kinds must exist: rules the API server enforces, and rules only validate() can check.
    assert!(all.iter().any(|f| f.api_rejects) && all.iter().any(|f| !f.api_rejects));
}

#[test]
fn every_invalid_fixture_is_refused_locally_naming_its_field() {
    let mut failures = Vec::new();
    for fixture in invalid_fixtures() {
        let parsed = manifest::parse(&fixture.text);
        let name = fixture.path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !parsed.documents.is_empty() {
            failures.push(format!("{name}: yielded an object although it is invalid"));
        }
        let hit = parsed.problems.iter().find(|p| p.field.starts_with(&fixture.field));
        match hit {
            Some(p) if !p.message.is_empty() && !p.fix.is_empty() && p.line > 0 => {}
            Some(p) => failures.push(format!("{name}: problem lacks message, fix or line: {p:?}")),
            None => failures.push(format!("{name}: no problem names {}; got {:?}", fixture.field, parsed.problems)),
        }
    }
    assert!(failures.is_empty(), "fixtures not refused as expected:\n{}", failures.join("\n"));
}
