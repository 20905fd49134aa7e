//! The `spearlet` command line as a CI pipeline uses it: exit codes and output format of
//! `validate`, and `convert` whose output `validate` accepts.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn spearlet(args: &[&str], stdin: Option<&str>) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spearlet must start");
    let mut input = child.stdin.take().expect("stdin is piped");
    input.write_all(stdin.unwrap_or_default().as_bytes()).expect("stdin is writable");
    drop(input);
    child.wait_with_output().expect("spearlet must finish")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn validate_accepts_the_examples_with_exit_0() {
    let out = spearlet(&["validate", "examples/registry"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert_eq!(stdout(&out), "", "a valid run prints no problem lines");
}

#[test]
fn validate_prints_one_located_line_per_problem_and_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = dir.path().join("bad.yaml");
    std::fs::write(
        &bad,
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata:\n  name: fs\nspec:\n  transport: stdio\n  stdio:\n    command: ''\n  budgets:\n    maxConcurrency: 0\n",
    )
    .expect("write");
    let out = spearlet(&["validate", bad.to_str().expect("utf-8 path"), "examples/registry/profiles.yaml"], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    let path = bad.display();
    assert_eq!(
        lines,
        [
            format!("{path}:8: spec.stdio.command: command is empty (set the executable to run, for example npx)"),
            format!("{path}:10: spec.budgets.maxConcurrency: 0 is out of range (use a value from 1 to 1024)"),
        ]
    );
}

#[test]
fn validate_reads_stdin_for_dash() {
    let text =
        std::fs::read_to_string(repo().join("tests/fixtures/invalid/03-transport-unknown.yaml")).expect("fixture");
    let out = spearlet(&["validate", "-"], Some(&text));
    assert_eq!(out.status.code(), Some(1));
    assert!(stdout(&out).starts_with("<stdin>:9: spec.transport: unknown variant `grpc`"), "{}", stdout(&out));
}

#[test]
fn validate_usage_errors_exit_2() {
    assert_eq!(spearlet(&["validate"], None).status.code(), Some(2), "no path");
    assert_eq!(spearlet(&["validate", "does/not/exist.yaml"], None).status.code(), Some(2), "missing path");
    let empty = tempfile::tempdir().expect("tempdir");
    let out = spearlet(&["validate", empty.path().to_str().expect("utf-8")], None);
    assert_eq!(out.status.code(), Some(2), "a directory without manifests");
    assert!(String::from_utf8_lossy(&out.stderr).contains("no *.yaml"));
}

#[test]
fn convert_output_passes_validate() {
    let inputs = ["filesystem.toml", "search.json", "Git_Tools.toml"];
    let paths: Vec<String> = inputs.iter().map(|f| format!("tests/fixtures/convert/{f}")).collect();
    let mut args = vec!["convert"];
    args.extend(paths.iter().map(String::as_str));
    let out = spearlet(&args, None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let yaml = stdout(&out);
    assert_eq!(yaml.matches("kind: McpServer").count(), 3, "{yaml}");
    assert!(yaml.contains("value: ${ENV:API_TOKEN}"), "env_from becomes a reference:\n{yaml}");
    assert!(yaml.contains("name: git-tools") && yaml.contains("toolNamespace: Git_Tools"), "{yaml}");

    let checked = spearlet(&["validate", "-"], Some(&yaml));
    assert_eq!(checked.status.code(), Some(0), "converted output must validate: {checked:?}");
}

#[test]
fn convert_writes_files_into_an_output_dir() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = spearlet(
        &["convert", "tests/fixtures/convert/search.json", "--output-dir", dir.path().to_str().expect("utf-8")],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let written = Path::new(dir.path()).join("search.yaml");
    let text = std::fs::read_to_string(&written).expect("search.yaml written");
    assert!(spear::api::manifest::parse(&text).is_valid());
}

#[test]
fn convert_refuses_unknown_keys_naming_them() {
    let out = spearlet(&["convert", "tests/fixtures/convert/unknown-key.toml"], None);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("unknown-key.toml") && err.contains("shell"), "{err}");
}
