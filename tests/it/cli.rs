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

/// Hostile manifests (an alias bomb, nesting thousands deep) are one located problem line and
/// exit 1, in bounded memory and without a crash.
#[test]
fn validate_refuses_an_alias_bomb_and_deep_nesting_with_one_line_each() {
    let mut bomb =
        String::from("apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\na0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        bomb.push_str(&format!("a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"));
    }
    for (text, said) in [(bomb, "aliases count as copies"), ("- ".repeat(7_000), "nest deeper than 64 levels")] {
        let out = spearlet(&["validate", "-"], Some(&text));
        assert_eq!(out.status.code(), Some(1), "{out:?}");
        let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(lines[0].starts_with("<stdin>:") && lines[0].contains(said), "{lines:?}");
    }
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

/// `convert FILE` with the fixture under tests/fixtures/convert: its YAML, checked by `validate`.
fn convert_fixture(file: &str, extra: &[&str]) -> (String, String) {
    let path = format!("tests/fixtures/convert/{file}");
    let mut args = vec!["convert", path.as_str()];
    args.extend_from_slice(extra);
    let out = spearlet(&args, None);
    assert_eq!(out.status.code(), Some(0), "{file}: {out:?}");
    let yaml = stdout(&out);
    let checked = spearlet(&["validate", "-"], Some(&yaml));
    assert_eq!(checked.status.code(), Some(0), "{file}: converted output must validate: {checked:?}\n{yaml}");
    (yaml, String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn convert_reads_the_designs_record_the_registrys_server_json_and_client_configs() {
    let (design, _) = convert_fixture("design-github.toml", &[]);
    assert!(design.contains("create_*: always") && design.contains("name: github-token"), "{design}");
    assert!(!design.contains("toolNamespace"), "mcp.<server_id> is the default naming:\n{design}");

    let (remote, notes) = convert_fixture("server.json", &[]);
    assert!(remote.contains("url: https://weather.example.com/mcp"), "{remote}");
    assert!(remote.contains("value: ${ENV:WEATHER_X_API_KEY}") && notes.contains("WEATHER_X_API_KEY"), "{notes}");
    let (package, _) = convert_fixture("server.json", &["--prefer", "package", "--secret", "weather"]);
    assert!(package.contains("'@example/weather-mcp@1.4.0'") && package.contains("- metric"), "{package}");
    assert!(package.contains("name: weather\n") && package.contains("key: WEATHER_API_KEY"), "{package}");
    assert!(package.contains("value: eu"), "a default is a plain value:\n{package}");

    let (claude, notes) = convert_fixture("claude_desktop_config.json", &[]);
    assert_eq!(claude.matches("kind: McpServer").count(), 3, "{claude}");
    assert!(!claude.contains("ghp_") && !notes.contains("ghp_"), "a token is never copied:\n{claude}\n{notes}");
    assert!(claude.contains("value: Bearer ${ENV:SENTRY_TOKEN}"), "{claude}");

    let (vscode, _) = convert_fixture("mcp.json", &["--secret", "mcp-tokens"]);
    assert!(vscode.contains("name: mcp-tokens") && vscode.contains("command: uvx"), "{vscode}");
}

#[test]
fn convert_refuses_a_legacy_sse_record_with_the_fix() {
    let out = spearlet(&["convert", "tests/fixtures/convert/design-sse.toml"], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert_eq!(stdout(&out), "", "nothing of a refused file is written");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("design-sse.toml: transport:") && err.contains("Streamable HTTP"), "{err}");

    let manifest = "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {name: old}\nspec:\n  \
                    transport: sse\n  http: {url: \"https://legacy.example.com/sse\"}\n";
    let out = spearlet(&["validate", "-"], Some(manifest));
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("spec.transport") && text.contains("HTTP+SSE") && text.contains("mcp-proxy"), "{text}");
}

/// The whole path a team takes: its Claude Desktop config, converted, serves the same server's
/// tools (a real stdio server) once the registry allows them.
#[test]
fn a_converted_client_config_serves_its_tools() {
    let dir = tempfile::tempdir().expect("tempdir");
    let everything = spear::testing::mcp_servers::everything_stdio();
    let config = serde_json::json!({"mcpServers": {"everything": {
        "command": everything.program, "args": everything.args,
        "env": everything.env.iter().cloned().collect::<std::collections::BTreeMap<_, _>>(),
    }}});
    let config_path = dir.path().join("claude_desktop_config.json");
    std::fs::write(&config_path, config.to_string()).expect("config");
    let registry = dir.path().join("registry");
    std::fs::create_dir(&registry).expect("registry dir");
    let registry = registry.to_string_lossy().into_owned();
    let out = spearlet(&["convert", &config_path.to_string_lossy(), "--output-dir", &registry], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");

    let manifest = Path::new(&registry).join("everything.yaml");
    let text = std::fs::read_to_string(&manifest).expect("everything.yaml");
    std::fs::write(&manifest, text.replacen("spec:\n", "spec:\n  allowedTools: [echo, get-sum]\n", 1)).expect("allow");
    let profile =
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {name: dev}\nspec:\n  servers: [everything]\n";
    std::fs::write(Path::new(&registry).join("profile.yaml"), profile).expect("profile");

    let out = spearlet(&["explain", "--registry-dir", &registry, "--profile", "dev", "--connect"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    let row = text.lines().find(|l| l.starts_with("everything ")).unwrap_or_else(|| panic!("{text}"));
    assert!(row.contains("mcp__everything__echo,mcp__everything__get-sum"), "{text}");
}

#[test]
fn registry_prints_the_example_snapshot_with_exit_0() {
    let out = spearlet(&["registry", "--registry-dir", "examples/registry"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.starts_with("registry examples/registry: revision "), "{text}");
    for name in ["filesystem", "everything", "everything-http", "developer", "readonly"] {
        assert!(text.lines().any(|l| l.starts_with(&format!("{name} "))), "{name} missing:\n{text}");
    }
}

#[test]
fn registry_reports_a_degraded_directory_with_exit_1_and_a_missing_one_with_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::copy(repo().join("examples/registry/profiles.yaml"), dir.path().join("profiles.yaml")).expect("copy");
    std::fs::write(
        dir.path().join("broken.yaml"),
        "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {name: x}\nspec: {transport: carrier-pigeon}\n",
    )
    .expect("write");
    let out = spearlet(&["registry", "--registry-dir", dir.path().to_str().expect("utf-8")], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("DEGRADED"), "{text}");
    assert!(text.contains("broken.yaml:4: spec.transport: unknown variant `carrier-pigeon`"), "{text}");
    assert_eq!(spearlet(&["registry", "--registry-dir", "no/such/dir"], None).status.code(), Some(2));
}

#[test]
fn registry_watch_prints_each_new_revision_and_stops_on_sigterm() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("fs.yaml");
    std::fs::copy(repo().join("examples/registry/filesystem.yaml"), &file).expect("copy");
    let mut child = Command::new(env!("CARGO_BIN_EXE_spearlet"))
        .args(["registry", "--watch", "--registry-dir", dir.path().to_str().expect("utf-8")])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spearlet must start");
    // A watchdog, so a missed event fails this test in bounded time instead of hanging CI.
    let pid = child.id().to_string();
    std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_secs(20));
        let _ = Command::new("kill").args(["-KILL", &pid]).status();
    });
    let mut lines = BufReader::new(child.stdout.take().expect("piped")).lines();
    let mut next_line = || lines.next().expect("a line before EOF").expect("utf-8 line");
    while !next_line().starts_with("watching ") {}
    let text = std::fs::read_to_string(&file).expect("read");
    std::fs::write(&file, text.replace("maxConcurrency: 4", "maxConcurrency: 3")).expect("write");
    let change = next_line();
    assert!(change.starts_with("revision ") && change.ends_with(": ~McpServer/filesystem"), "{change}");
    let killed = Command::new("kill").args(["-TERM", &child.id().to_string()]).status().expect("kill runs");
    assert!(killed.success());
    let status = child.wait().expect("exits");
    assert_eq!(status.code(), Some(0), "SIGTERM is a clean stop");
}

#[test]
fn explain_shows_the_effective_servers_and_why_others_are_out() {
    let out = spearlet(&["explain", "--registry-dir", "examples/registry", "--profile", "developer"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.contains("decided on servers and patterns alone"), "says tools were not listed:\n{text}");
    assert!(text.lines().any(|l| l.starts_with("filesystem ") && l.contains("10000")), "{text}");
    assert!(
        text.lines().any(|l| l.contains("everything-http") && l.contains("not_allowed_by:profile_defaults")),
        "{text}"
    );
}

#[test]
fn explain_gives_a_disabled_server_its_reason_and_validate_accepts_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    for file in ["everything.yaml", "filesystem.yaml", "profiles.yaml"] {
        let text = std::fs::read_to_string(repo().join("examples/registry").join(file)).expect("example");
        let text =
            text.replace("  displayName: Filesystem (read-mostly)\n", "  displayName: Filesystem\n  enabled: false\n");
        std::fs::write(dir.path().join(file), text).expect("copy");
    }
    let registry = dir.path().to_string_lossy().into_owned();
    let out = spearlet(&["validate", &registry], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let out = spearlet(&["explain", "--registry-dir", &registry, "--profile", "developer"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let text = stdout(&out);
    assert!(text.lines().any(|l| l.contains("filesystem") && l.contains("disabled")), "{text}");
    assert!(!text.lines().any(|l| l.starts_with("filesystem ") && l.contains("10000")), "{text}");
}

#[test]
fn explain_json_applies_the_request_and_refuses_servers_outside_the_profile() {
    let request = r#"{"server_ids": ["everything-http"], "budgets": {"tool_timeout_ms": 100}}"#;
    let out = spearlet(
        &[
            "explain",
            "--registry-dir",
            "examples/registry",
            "--profile",
            "developer",
            "--request",
            request,
            "--output",
            "json",
        ],
        None,
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON output");
    assert_eq!(json["servers"][0]["id"], "everything-http");
    assert_eq!(json["servers"][0]["budgets"]["toolTimeoutMs"], 100, "a request only tightens");
    assert_eq!(json["toolsListed"], false);

    let refused = spearlet(
        &[
            "explain",
            "--registry-dir",
            "examples/registry",
            "--profile",
            "readonly",
            "--request",
            r#"{"server_ids": ["everything"]}"#,
        ],
        None,
    );
    assert_eq!(refused.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&refused.stderr).contains("mcp_policy_denied"));
}

#[test]
fn explain_connect_lists_tools_and_gives_tool_level_reasons() {
    let fixture = spear::testing::mcp_servers::fixture_stdio(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let args: Vec<String> = fixture.args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        dir.path().join("registry.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: fx}}\nspec:\n  transport: stdio\n  stdio:\n    command: {:?}\n    args: [{}]\n  allowedTools: [\"echo\", \"big\", \"s*\"]\n  deniedTools: [\"sleep\"]\n---\napiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [fx]\n  toolDenylist: [\"big\"]\n",
            fixture.program.display().to_string(),
            args.join(", ")
        ),
    )
    .expect("write");
    let dir_arg = dir.path().to_str().expect("utf-8");
    let out =
        spearlet(&["explain", "--registry-dir", dir_arg, "--profile", "p", "--connect", "--output", "json"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    assert_eq!(json["toolsListed"], true);
    assert_eq!(json["servers"][0]["tools"], serde_json::json!([{"name": "mcp__fx__echo", "tool": "echo"}]));
    let reasons: Vec<String> = json["excluded"]
        .as_array()
        .expect("excluded")
        .iter()
        .map(|d| format!("{}: {}", d["tool"].as_str().unwrap_or("-"), d["reason"].as_str().unwrap_or("-")))
        .collect();
    assert!(reasons.contains(&"big: denied_by:profile".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"sleep: denied_by:server".to_string()), "{reasons:?}");
    assert!(reasons.contains(&"pid: not_allowed_by:server".to_string()), "{reasons:?}");
}

/// `spear-operator inject` (offline) prints exactly the pod `inject::mutate`, the webhook's own
/// function, computes for the same inputs (the cluster tests show the webhook stores what
/// `mutate` computes), so the isolation of the injected sidecars can be read without a cluster.
#[test]
fn operator_inject_prints_the_pod_the_webhook_would_admit() {
    use k8s_openapi::api::core::v1::Pod;
    use spear::api::api_key::ApiKey;
    use spear::api::secret_grant::SecretGrants;
    use spear::operator::inject::{self, Decision, InjectConfig};

    let pod_yaml = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: app\n  namespace: team-a\n  annotations:\n    \
                    mcp.spear.dev/profile: developer\nspec:\n  containers:\n    - name: app\n      image: busybox\n";
    let mut file = tempfile::NamedTempFile::new().expect("temp file");
    file.write_all(pod_yaml.as_bytes()).expect("write pod");
    let image = "registry.example/spearlet:1";
    let out = Command::new(env!("CARGO_BIN_EXE_spear-operator"))
        .args(["inject", "--json", "--agent-image", image, "--spearlet-image", image, "-f"])
        .arg(file.path())
        .arg("--registry-dir")
        .arg(repo().join("examples/registry"))
        .output()
        .expect("spear-operator runs");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let printed: Pod = serde_json::from_slice(&out.stdout).expect("a pod on stdout");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("openai"), "the Secrets that must grant are named: {stderr}");

    let snapshot = spear::registry::dir::DirSource::load(&repo().join("examples/registry")).expect("registry");
    let profile = snapshot.profile("developer").map(|v| (*v.object).clone()).expect("profile");
    let servers: Vec<_> =
        snapshot.servers().values().map(|v| (*v.object).clone()).filter(|s| profile.selects(s)).collect();
    let mut pod: Pod = serde_yaml::from_str(pod_yaml).expect("pod");
    pod.metadata.namespace = Some("team-a".into());
    let labels = [("mcp.spear.dev/injection".to_string(), "enabled".to_string())].into();
    let grants = SecretGrants::allow_all(["openai"]);
    // The key is drawn per pod: the same mutation with the key it printed.
    let key = printed
        .spec
        .iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .flat_map(|c| c.env.iter().flatten())
        .find(|e| e.name == "SPEAR_API_KEY")
        .and_then(|e| ApiKey::parse(e.value.as_deref()?).ok())
        .expect("the pod's API key is injected");
    let Decision::Patch { pod: expected, .. } =
        inject::mutate(&pod, &labels, Some(&profile), &servers, &grants, &InjectConfig::new(image, image), &key)
            .expect("mutate")
    else {
        panic!("the example profile injects")
    };
    assert_eq!(printed, *expected);
    let spec = printed.spec.expect("spec");
    let sidecar_uids: Vec<Option<i64>> = spec
        .init_containers
        .iter()
        .flatten()
        .filter(|c| c.name.starts_with("mcp-"))
        .map(|c| c.security_context.as_ref().and_then(|s| s.run_as_user))
        .collect();
    assert!(sidecar_uids.len() >= 2 && sidecar_uids.windows(2).all(|w| w[0] != w[1]), "{sidecar_uids:?}");

    // A pod the webhook would deny: exit 1 and the reason.
    let shared = pod_yaml.replace("spec:\n", "spec:\n  shareProcessNamespace: true\n");
    file.as_file().set_len(0).expect("truncate");
    std::fs::write(file.path(), shared).expect("rewrite");
    let out = Command::new(env!("CARGO_BIN_EXE_spear-operator"))
        .args(["inject", "-f"])
        .arg(file.path())
        .arg("--registry-dir")
        .arg(repo().join("examples/registry"))
        .output()
        .expect("spear-operator runs");
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("shareProcessNamespace"));
}

/// What the injected init container runs (`/spearlet install --to /spear/bin/spearlet`), with a
/// temp dir as the bin volume: the copy is an executable spearlet, and a second run (a pod
/// restart) replaces it.
#[test]
fn install_copies_the_spearlet_into_a_directory_and_the_copy_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let dest = dir.path().join("spearlet");
    let to = dest.to_str().expect("utf-8 path");
    for run in ["first", "again over the copy"] {
        let out = spearlet(&["install", "--to", to], None);
        assert_eq!(out.status.code(), Some(0), "{run}: {out:?}");
    }
    let names: Vec<_> = std::fs::read_dir(dir.path()).expect("list").map(|e| e.expect("entry").file_name()).collect();
    assert_eq!(names, ["spearlet"], "no temporary file is left behind");

    let copy = Command::new(&dest).arg("--version").output().expect("the copy must start");
    assert_eq!(copy.status.code(), Some(0), "{copy:?}");
    assert_eq!(stdout(&copy), format!("spearlet {}\n", env!("CARGO_PKG_VERSION")));
}

#[test]
fn install_refuses_a_directory_and_a_missing_directory_with_exit_2_naming_the_flag() {
    let dir = tempfile::tempdir().expect("tempdir");
    let as_dir = dir.path().to_str().expect("utf-8 path");
    let missing = dir.path().join("bin/spearlet");
    let missing = missing.to_str().expect("utf-8 path");
    for (to, fix) in [(as_dir, "give the path of the file to write"), (missing, "create it, or mount a volume there")] {
        let out = spearlet(&["install", "--to", to], None);
        assert_eq!(out.status.code(), Some(2), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.starts_with(&format!("error: --to {to}: ")) && err.contains(fix), "{err}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).expect("list").count(), 0, "nothing was written");
}

#[test]
fn explain_request_shows_the_tool_selection_with_scores() {
    let fixture = spear::testing::mcp_servers::fixture_stdio(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let args: Vec<String> = fixture.args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        dir.path().join("registry.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: fx}}\nspec:\n  transport: stdio\n  stdio:\n    command: {:?}\n    args: [{}]\n  allowedTools: [\"*\"]\n---\napiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [fx]\n  chat:\n    toolSelection: {{mode: relevance, maxTools: 3, alwaysInclude: [pid]}}\n",
            fixture.program.display().to_string(),
            args.join(", ")
        ),
    )
    .expect("write");
    let dir_arg = dir.path().to_str().expect("utf-8");
    let request =
        r#"{"messages": [{"role": "user", "content": "sleep for a while, then echo my text"}], "max_tools": 2}"#;
    let explain = |output: &str| {
        spearlet(
            &[
                "explain",
                "--registry-dir",
                dir_arg,
                "--profile",
                "p",
                "--connect",
                "--request",
                request,
                "--output",
                output,
            ],
            None,
        )
    };
    let out = explain("json");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let selection = &json["toolSelection"];
    assert_eq!(selection["maxTools"], 2, "the request's max_tools lowers the profile's 3");
    assert_eq!(selection["findTools"], "mcp__spear__find_tools");
    let tools = selection["tools"].as_array().expect("every tool, scored");
    assert_eq!(tools.len(), selection["of"].as_u64().expect("of") as usize);
    let mut offered: Vec<(&str, &str)> = tools
        .iter()
        .filter(|t| t["offered"] == true)
        .map(|t| (t["name"].as_str().unwrap_or(""), t["why"].as_str().unwrap_or("")))
        .collect();
    offered.sort();
    assert_eq!(
        offered,
        [("mcp__fx__echo", "ranked"), ("mcp__fx__pid", "always_include"), ("mcp__fx__sleep", "ranked")]
    );
    assert!(tools[0]["score"].as_f64().expect("score") > 0.0);
    let tokens = &selection["promptTokens"];
    assert!(tokens["offered"].as_u64() < tokens["all"].as_u64(), "{tokens}");

    let table = stdout(&explain("table"));
    assert!(table.contains("TOOL SELECTION (relevance, maxTools 2): 3 of"), "{table}");
    assert!(table.lines().any(|l| l.contains("mcp__fx__lists") && l.ends_with("not offered")), "{table}");

    let bad =
        spearlet(&["explain", "--registry-dir", dir_arg, "--profile", "p", "--request", r#"{"max_tools": 0}"#], None);
    assert_eq!(bad.status.code(), Some(2), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("max_tools"), "{bad:?}");
}

#[test]
fn explain_connect_decides_each_resource_and_prompt_with_its_reason() {
    let everything = spear::testing::mcp_servers::everything_stdio();
    let dir = tempfile::tempdir().expect("tempdir");
    let args: Vec<String> = everything.args.iter().map(|a| format!("{a:?}")).collect();
    std::fs::write(
        dir.path().join("registry.yaml"),
        format!(
            "apiVersion: mcp.spear.dev/v1alpha1\nkind: McpServer\nmetadata: {{name: everything}}\nspec:\n  transport: stdio\n  stdio:\n    command: {:?}\n    args: [{}]\n  allowedTools: [echo]\n  allowedResources: [\"*/static/*\"]\n  deniedResources: [\"*features.md\"]\n  allowedPrompts: [\"*\"]\n---\napiVersion: mcp.spear.dev/v1alpha1\nkind: McpProfile\nmetadata: {{name: p}}\nspec:\n  servers: [everything]\n  promptDenylist: [args-prompt]\n",
            everything.program.display().to_string(),
            args.join(", ")
        ),
    )
    .expect("write");
    let dir_arg = dir.path().to_str().expect("utf-8");
    let out =
        spearlet(&["explain", "--registry-dir", dir_arg, "--profile", "p", "--connect", "--output", "json"], None);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let json: serde_json::Value = serde_json::from_str(&stdout(&out)).expect("JSON");
    let rows = |key: &str| -> Vec<String> {
        json["items"][key]
            .as_array()
            .expect("rows")
            .iter()
            .map(|r| {
                format!(
                    "{} {} {}",
                    r["kind"].as_str().unwrap_or("-"),
                    r["item"].as_str().unwrap_or("-"),
                    r["reason"].as_str().or(r["id"].as_str()).unwrap_or("-")
                )
            })
            .collect()
    };
    let excluded = rows("excluded");
    assert!(
        excluded.contains(&"resource demo://resource/static/document/features.md denied_by:server".to_string()),
        "{excluded:?}"
    );
    assert!(excluded.contains(&"prompt args-prompt denied_by:profile".to_string()), "{excluded:?}");
    let exposed = rows("exposed");
    assert!(exposed.contains(&"prompt simple-prompt mcp__everything__simple-prompt".to_string()), "{exposed:?}");
    assert!(exposed.iter().any(|r| r.ends_with("spear://everything/demo://resource/static/document/instructions.md")));
    assert_eq!(json["servers"][0]["allowedResources"], serde_json::json!(["*/static/*"]));
}
