//! Tests of the pod mutation: golden patches under `tests/golden/inject/` (rewritten with
//! `SPEAR_BLESS=1 cargo test --lib operator::inject`), then properties the goldens only imply.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{ConfigMapKeySelector, PodSpec};
use kube::core::ObjectMeta;
use serde_json::json;

use super::*;
use crate::api::secret_grant::{
    ANNOTATION_ALLOWED_PROFILES, ANNOTATION_ALLOWED_SERVERS, profile_secret_refs, server_secret_refs,
};

// === fixtures ===

const IMAGE: &str = "ghcr.io/spear-mcp/spearlet:0.1.0";

fn enabled() -> BTreeMap<String, String> {
    BTreeMap::from([(LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string())])
}

fn config(native: bool) -> InjectConfig {
    InjectConfig { native_sidecars: native, ..InjectConfig::new(IMAGE, IMAGE) }
}

fn container(name: &str) -> Container {
    Container { name: name.to_string(), image: Some(format!("example.com/{name}:1")), ..Container::default() }
}

/// A pod in `team-a` with one app container and the given annotations.
fn pod(annotations: &[(&str, &str)]) -> Pod {
    let annotations: BTreeMap<String, String> =
        annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    Pod {
        metadata: ObjectMeta {
            name: Some("app".into()),
            namespace: Some("team-a".into()),
            annotations: (!annotations.is_empty()).then_some(annotations),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec { containers: vec![container("app")], ..PodSpec::default() }),
        ..Pod::default()
    }
}

fn with_profile() -> Pod {
    pod(&[(ANNOTATION_PROFILE, "dev")])
}

fn spec_mut(pod: &mut Pod) -> &mut PodSpec {
    pod.spec.get_or_insert_with(PodSpec::default)
}

/// The stdio server of the goldens: the filesystem server in `node:22-slim`, `read_*` allowed.
fn stdio_server(name: &str) -> McpServer {
    McpServer::test(name)
        .stdio("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data"])
        .image("node:22-slim")
        .allowing(["read_*"])
}

/// The http server of the goldens: one literal header, every tool allowed.
fn http_server(name: &str) -> McpServer {
    McpServer::test(name).http("https://mcp.example.com/mcp").header("X-Tenant", "acme").allowing(["*"])
}

/// The profile `dev` allowing exactly `servers`.
fn profile(servers: &[&McpServer]) -> McpProfile {
    McpProfile::test("dev").servers(servers.iter().filter_map(|s| s.metadata.name.as_deref()))
}

fn secret(name: &str, key: &str) -> SecretKeySelector {
    SecretKeySelector { name: name.into(), key: key.into(), optional: None }
}

fn secret_env(name: &str, secret_name: &str, key: &str) -> EnvVar {
    EnvVar {
        name: name.into(),
        value_from: Some(EnvVarSource { secret_key_ref: Some(secret(secret_name, key)), ..EnvVarSource::default() }),
        ..EnvVar::default()
    }
}

/// The profile `dev` with a stdio server `fs` and an http server `web`.
fn mixed() -> (McpProfile, Vec<McpServer>) {
    let servers = vec![stdio_server("fs"), http_server("web")];
    (profile(&servers.iter().collect::<Vec<_>>()), servers)
}

/// `fs` with a Secret and a ConfigMap env var, `web` with a Secret header, and an upstream key.
fn with_secrets() -> (McpProfile, Vec<McpServer>) {
    let fs = stdio_server("fs")
        .env_var(secret_env("FS_TOKEN", "fs-credentials", "token"))
        .env_var(EnvVar {
            name: "FS_ROOT".into(),
            value_from: Some(EnvVarSource {
                config_map_key_ref: Some(ConfigMapKeySelector {
                    name: "fs-config".into(),
                    key: "root".into(),
                    optional: None,
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        })
        .env("FS_AUTH", "Bearer ${ENV:FS_TOKEN}");
    let web = http_server("web").secret_header("Authorization", "web-credentials", "authorization");
    let profile = profile(&[&fs, &web]).upstream("https://api.openai.com/v1").upstream_key("openai", "api-key");
    (profile, vec![fs, web])
}

/// Grants from every Secret the inputs reference, each allowing everyone: the tests of the
/// grant itself build their own.
fn granted(profile: Option<&McpProfile>, servers: &[McpServer]) -> SecretGrants {
    let mut names: Vec<String> = profile.into_iter().flat_map(profile_secret_refs).map(|r| r.secret).collect();
    names.extend(servers.iter().flat_map(server_secret_refs).map(|r| r.secret));
    SecretGrants::allow_all(names.iter().map(String::as_str))
}

/// The pod key of every case (the webhook draws a random one per pod).
const KEY: &str = "test-key-of-the-pod-0123456789";

fn key() -> ApiKey {
    ApiKey::parse(KEY).expect("a valid key")
}

fn run(pod: &Pod, profile: Option<&McpProfile>, servers: &[McpServer], native: bool) -> Decision {
    run_with(pod, profile, servers, &config(native))
}

/// [`run`] under `config`.
fn run_with(pod: &Pod, profile: Option<&McpProfile>, servers: &[McpServer], config: &InjectConfig) -> Decision {
    match mutate(pod, &enabled(), profile, servers, &granted(profile, servers), config, &key()) {
        Ok(d) => d,
        Err(e) => panic!("mutate failed: {e}"),
    }
}

fn patched(decision: &Decision) -> (&Patch, &Pod, &[String]) {
    match decision {
        Decision::Patch { patch, pod, warnings } => (patch, pod, warnings),
        other => panic!("expected a patch, got {other:?}"),
    }
}

fn denied(decision: &Decision) -> &str {
    match decision {
        Decision::Deny { message } => message,
        other => panic!("expected a denial, got {other:?}"),
    }
}

fn names(containers: Option<&Vec<Container>>) -> Vec<&str> {
    containers.into_iter().flatten().map(|c| c.name.as_str()).collect()
}

fn find<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().expect("an injected pod has a spec");
    spec.containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no container {name}"))
}

fn env_of<'a>(c: &'a Container, name: &str) -> Option<&'a EnvVar> {
    c.env.iter().flatten().find(|e| e.name == name)
}

// === goldens ===

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/inject")
}

/// What a golden file holds: the patch, or the skip reason, or the denial.
fn render(decision: &Decision) -> String {
    let value = match decision {
        Decision::Skip { reason } => json!({ "skip": reason.as_str(), "reason": reason.to_string() }),
        Decision::Deny { message } => json!({ "deny": message }),
        Decision::Patch { patch, .. } => serde_json::to_value(patch).expect("a patch serializes"),
    };
    let mut text = serde_json::to_string_pretty(&value).expect("JSON values serialize");
    text.push('\n');
    text
}

/// One golden case: its input pod and the decision on it.
struct Case {
    name: &'static str,
    input: Pod,
    decision: Decision,
}

fn case(name: &'static str, input: Pod, decision: impl FnOnce(&Pod) -> Decision) -> Case {
    let decision = decision(&input);
    Case { name, input, decision }
}

/// Every golden case.
fn cases() -> Vec<Case> {
    let (mixed_profile, mixed_servers) = mixed();
    let (secret_profile, secret_servers) = with_secrets();
    let mixed = |native: bool| {
        let (profile, servers) = (mixed_profile.clone(), mixed_servers.clone());
        move |p: &Pod| run(p, Some(&profile), &servers, native)
    };
    let classic = run(&with_profile(), Some(&mixed_profile), &mixed_servers, false);
    let (_, injected, _) = patched(&classic);

    // A pod that has everything already: annotations, volumes, init containers, env.
    let mut busy = pod(&[(ANNOTATION_PROFILE, "dev"), ("team", "a")]);
    let spec = spec_mut(&mut busy);
    spec.volumes = Some(vec![empty_dir("data")]);
    spec.init_containers = Some(vec![container("migrate")]);
    spec.containers[0].env = Some(vec![env(ENV_MCP_URL, "http://elsewhere/mcp"), env("LOG", "debug")]);
    spec.containers.push(container("worker"));

    vec![
        case("no_profile_annotation", pod(&[]), mixed(true)),
        case("namespace_not_enabled", with_profile(), |p| {
            mutate(p, &BTreeMap::new(), None, &[], &SecretGrants::default(), &config(true), &key()).expect("decides")
        }),
        case("opt_out", pod(&[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECT, "false")]), mixed(true)),
        case("classic_sidecars", with_profile(), mixed(false)),
        case("native_sidecars", with_profile(), mixed(true)),
        case("already_injected", injected.clone(), mixed(false)),
        case("secret_env", with_profile(), |p| run(p, Some(&secret_profile), &secret_servers, true)),
        case("missing_profile", with_profile(), |p| run(p, None, &[], true)),
        case("existing_lists_native", busy, mixed(true)),
    ]
}

#[test]
fn golden_patches_match() {
    let rendered: Vec<(String, String)> =
        cases().iter().map(|case| (format!("{}.json", case.name), render(&case.decision))).collect();
    let problems = crate::testing::golden::check_dir(&golden_dir(), "json", &rendered);
    assert!(
        problems.is_empty(),
        "injection goldens are stale:\n{}\nrun `SPEAR_BLESS=1 cargo test --lib operator::inject` to rewrite them, review the diff and commit it",
        problems.join("\n")
    );
}

// === properties ===

#[test]
fn patch_applied_to_the_input_yields_the_returned_pod() {
    let mut patches = 0;
    for Case { name, input, decision } in cases() {
        let Decision::Patch { patch, pod: expected, .. } = &decision else { continue };
        // Over the wire: the patch as JSON, parsed back, applied to the pod as JSON.
        let wire: Patch = serde_json::from_str(&serde_json::to_string(patch).expect("serializes")).expect("parses");
        let mut doc = serde_json::to_value(&input).expect("a pod serializes");
        json_patch::patch(&mut doc, &wire.0).unwrap_or_else(|e| panic!("{name}: {e}"));
        let applied: Pod = serde_json::from_value(doc).expect("a patched pod parses");
        assert_eq!(&applied, expected.as_ref(), "{name}");
        patches += 1;
    }
    assert_eq!(patches, 4, "every injecting case is checked");
}

#[test]
fn patch_applies_to_a_pod_that_already_has_every_list() {
    let (profile, servers) = mixed();
    let mut input = pod(&[(ANNOTATION_PROFILE, "dev"), ("team", "a")]);
    let spec = spec_mut(&mut input);
    spec.volumes = Some(vec![empty_dir("data")]);
    spec.init_containers = Some(vec![container("migrate")]);
    spec.containers[0].env = Some(vec![env(ENV_MCP_URL, "http://elsewhere/mcp")]);
    let decision = run(&input, Some(&profile), &servers, true);
    let (patch, out, _) = patched(&decision);
    let mut doc = serde_json::to_value(&input).expect("a pod serializes");
    json_patch::patch(&mut doc, &patch.0).expect("the patch applies");
    assert_eq!(&serde_json::from_value::<Pod>(doc).expect("parses"), out);

    let spec = out.spec.as_ref().expect("spec");
    assert_eq!(names(spec.init_containers.as_ref()), ["spear-init", "mcp-fs", "spearlet", "migrate"]);
    assert_eq!(
        spec.volumes.iter().flatten().map(|v| v.name.as_str()).collect::<Vec<_>>(),
        ["data", "spear-bin", "mcp-tmp-fs", "mcp-sock-fs", "spear-no-token"]
    );
    assert_eq!(out.metadata.annotations.as_ref().and_then(|a| a.get("team")).map(String::as_str), Some("a"));
    // The app's own value wins; the rest is added.
    let app = find(out, "app");
    assert_eq!(env_of(app, ENV_MCP_URL).and_then(|e| e.value.as_deref()), Some("http://elsewhere/mcp"));
    assert_eq!(env_of(app, ENV_CHAT_URL).and_then(|e| e.value.as_deref()), Some("http://127.0.0.1:4040/v1"));
    // Native sidecars run before the pod's init containers, which may therefore use tools.
    assert_eq!(env_of(find(out, "migrate"), ENV_GRPC_ADDR).and_then(|e| e.value.as_deref()), Some("127.0.0.1:4041"));
}

#[test]
fn injecting_twice_changes_nothing() {
    let (profile, servers) = with_secrets();
    for native in [false, true] {
        let first = run(&with_profile(), Some(&profile), &servers, native);
        let (_, once, _) = patched(&first);
        let second = run(once, Some(&profile), &servers, native);
        assert_eq!(second, Decision::Skip { reason: SkipReason::AlreadyInjected }, "native={native}");
    }
}

#[test]
fn the_agent_learns_where_each_delivered_value_was_granted_to_go() {
    let (profile, mut servers) = with_secrets();
    // `plain` gets nothing delivered, so nothing binds it.
    servers.push(http_server("plain"));
    let profile = profile.servers(["plain"]);
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let destinations = env_of(find(out, AGENT_CONTAINER), ENV_GRANTED_DESTINATIONS).and_then(|e| e.value.clone());
    let web = servers.iter().find(|s| s.metadata.name.as_deref() == Some("web")).and_then(|s| s.spec.http.as_ref());
    let expected = format!("web={}", http_destination(web.expect("web is an http server")));
    assert_eq!(destinations, Some(expected));
}

#[test]
fn the_pods_key_is_first_in_the_agents_and_the_apps_env_and_in_no_sidecar() {
    let (profile, servers) = with_secrets();
    for native in [false, true] {
        let mut input = with_profile();
        let spec = spec_mut(&mut input);
        spec.init_containers = Some(vec![container("migrate")]);
        spec.containers[0].env = Some(vec![env("OPENAI_API_KEY", "$(SPEAR_API_KEY)")]);
        let decision = run(&input, Some(&profile), &servers, native);
        let (_, out, _) = patched(&decision);
        let spec = out.spec.as_ref().expect("spec");
        for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
            let first = c.env.iter().flatten().next();
            let keyed = c.env.iter().flatten().filter(|e| e.name == ENV_API_KEY).collect::<Vec<_>>();
            // The app's own init containers run before the agent without native sidecars.
            let gets_key = c.name == AGENT_CONTAINER || c.name == "app" || (native && c.name == "migrate");
            if gets_key {
                assert_eq!(
                    first.map(|e| (e.name.as_str(), e.value.as_deref())),
                    Some((ENV_API_KEY, Some(KEY))),
                    "{}",
                    c.name
                );
                assert_eq!(keyed.len(), 1, "{}", c.name);
            } else {
                assert!(keyed.is_empty(), "native={native}: {} must not see the pod's key", c.name);
            }
        }
        // Before the app's own variables, which may therefore refer to it.
        let app: Vec<&str> = find(out, "app").env.iter().flatten().map(|e| e.name.as_str()).collect();
        assert_eq!(app[..2], [ENV_API_KEY, "OPENAI_API_KEY"]);
    }
}

#[test]
fn the_marker_does_not_depend_on_the_pods_key() {
    let (profile, servers) = with_secrets();
    let marker = |key: &ApiKey| {
        let decision = mutate(
            &with_profile(),
            &enabled(),
            Some(&profile),
            &servers,
            &granted(Some(&profile), &servers),
            &config(true),
            key,
        )
        .expect("decides");
        let (_, out, _) = patched(&decision);
        out.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_INJECTED)).cloned().expect("a marker")
    };
    let other = ApiKey::random().expect("the OS has randomness");
    assert_eq!(marker(&key()), marker(&other));
}

#[test]
fn an_app_container_setting_the_key_itself_is_denied() {
    let (profile, servers) = mixed();
    let mut input = with_profile();
    spec_mut(&mut input).containers[0].env = Some(vec![env(ENV_API_KEY, "my-own-key-0123456789")]);
    let message = denied(&run(&input, Some(&profile), &servers, true)).to_string();
    assert!(message.contains("\"app\" sets SPEAR_API_KEY") && message.contains("$(SPEAR_API_KEY)"), "{message}");
}

#[test]
fn gates_skip_in_order() {
    let (profile, servers) = mixed();
    let not_enabled = BTreeMap::from([(LABEL_INJECTION.to_string(), "disabled".to_string())]);
    let d = mutate(
        &with_profile(),
        &not_enabled,
        Some(&profile),
        &servers,
        &SecretGrants::default(),
        &config(true),
        &key(),
    )
    .expect("decides");
    assert_eq!(d, Decision::Skip { reason: SkipReason::NamespaceNotEnabled });
    let opted_out = pod(&[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECT, "False")]);
    assert_eq!(run(&opted_out, Some(&profile), &servers, true), Decision::Skip { reason: SkipReason::OptedOut });
    assert_eq!(
        run(&pod(&[]), Some(&profile), &servers, true),
        Decision::Skip { reason: SkipReason::NoProfileAnnotation }
    );
    let explicit = pod(&[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECT, "true")]);
    patched(&run(&explicit, Some(&profile), &servers, true));
}

#[test]
fn unclear_inject_annotation_is_denied() {
    let p = pod(&[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECT, "no")]);
    let decision = run(&p, None, &[], true);
    assert!(denied(&decision).contains("\"no\""), "{decision:?}");
}

#[test]
fn missing_profile_names_profile_namespace_and_fix() {
    let decision = run(&with_profile(), None, &[], true);
    let message = denied(&decision);
    assert!(message.contains("\"dev\"") && message.contains("team-a"), "{message}");
    assert!(message.contains("kubectl get mcpprofiles -n team-a"), "{message}");
}

#[test]
fn invalid_profile_name_is_denied() {
    let decision = run(&pod(&[(ANNOTATION_PROFILE, "Not A Name")]), None, &[], true);
    assert!(denied(&decision).contains("not a valid McpProfile name"));
}

#[test]
fn a_foreign_spearlet_container_is_a_collision() {
    let (profile, servers) = mixed();
    let mut p = with_profile();
    spec_mut(&mut p).containers.push(container(AGENT_CONTAINER));
    let decision = run(&p, Some(&profile), &servers, true);
    assert!(denied(&decision).contains("already has a container named \"spearlet\""));
}

#[test]
fn a_copied_marker_without_the_agent_is_injected_anyway() {
    let (profile, servers) = mixed();
    let p = pod(&[(ANNOTATION_PROFILE, "dev"), (ANNOTATION_INJECTED, "0123456789abcdef")]);
    let decision = run(&p, Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let marker = out.metadata.annotations.as_ref().and_then(|a| a.get(ANNOTATION_INJECTED));
    assert_ne!(marker.map(String::as_str), Some("0123456789abcdef"));
    find(out, AGENT_CONTAINER);
}

#[test]
fn sidecar_and_volume_name_collisions_are_denied() {
    let (profile, servers) = mixed();
    let mut p = with_profile();
    spec_mut(&mut p).containers.push(container("mcp-fs"));
    assert!(denied(&run(&p, Some(&profile), &servers, true)).contains("\"mcp-fs\""));

    let mut p = with_profile();
    spec_mut(&mut p).volumes = Some(vec![empty_dir(VOLUME_BIN)]);
    assert!(denied(&run(&p, Some(&profile), &servers, true)).contains("volume named \"spear-bin\""));
}

#[test]
fn agent_ports_in_use_and_host_network_are_denied() {
    let (profile, servers) = mixed();
    let mut p = with_profile();
    spec_mut(&mut p).containers[0].ports =
        Some(vec![ContainerPort { container_port: 4040, ..ContainerPort::default() }]);
    assert!(denied(&run(&p, Some(&profile), &servers, true)).contains("declares port 4040"));

    let mut p = with_profile();
    spec_mut(&mut p).host_network = Some(true);
    assert!(denied(&run(&p, Some(&profile), &servers, true)).contains("hostNetwork"));
}

#[test]
fn native_sidecars_order_and_restart_policy() {
    let (profile, servers) = mixed();
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let spec = out.spec.as_ref().expect("spec");
    assert_eq!(names(spec.init_containers.as_ref()), ["spear-init", "mcp-fs", "spearlet"]);
    assert_eq!(names(Some(&spec.containers)), ["app"]);
    for c in spec.init_containers.iter().flatten() {
        let expected = (c.name != INIT_CONTAINER).then_some("Always");
        assert_eq!(c.restart_policy.as_deref(), expected, "{}", c.name);
    }
}

#[test]
fn classic_sidecars_are_appended_after_the_app() {
    let (profile, servers) = mixed();
    let decision = run(&with_profile(), Some(&profile), &servers, false);
    let (_, out, _) = patched(&decision);
    let spec = out.spec.as_ref().expect("spec");
    assert_eq!(names(spec.init_containers.as_ref()), ["spear-init"]);
    assert_eq!(names(Some(&spec.containers)), ["app", "mcp-fs", "spearlet"]);
    assert!(spec.containers.iter().all(|c| c.restart_policy.is_none()));
}

#[test]
fn bridge_runs_the_servers_argv_through_the_copied_spearlet() {
    let (profile, servers) = mixed();
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let bridge = find(out, "mcp-fs");
    assert_eq!(bridge.image.as_deref(), Some("node:22-slim"));
    assert_eq!(bridge.command.as_deref(), Some(&[SPEARLET.to_string()][..]));
    let args: Vec<&str> = bridge.args.iter().flatten().map(String::as_str).collect();
    assert_eq!(
        args,
        [
            "bridge",
            "--socket",
            "/spear/run/fs/mcp.sock",
            "--server-id",
            "fs",
            "--peer-uid",
            "65532",
            "--",
            "npx",
            "-y",
            "@modelcontextprotocol/server-filesystem",
            "/data"
        ]
    );
    let mounts: Vec<(&str, &str, Option<bool>)> =
        bridge.volume_mounts.iter().flatten().map(|m| (m.name.as_str(), m.mount_path.as_str(), m.read_only)).collect();
    assert_eq!(
        mounts,
        [
            ("spear-bin", "/spear/bin", Some(true)),
            ("mcp-sock-fs", "/spear/run/fs", None),
            ("mcp-tmp-fs", "/tmp", None),
            ("spear-no-token", "/var/run/secrets/kubernetes.io/serviceaccount", Some(true))
        ]
    );
    assert_eq!(env_of(bridge, "HOME").and_then(|e| e.value.as_deref()), Some("/tmp"));
    assert_eq!(bridge.resources.as_ref(), Some(&default_sidecar_resources()));
    // The http server gets no sidecar.
    assert!(out.spec.iter().flat_map(|s| s.init_containers.iter().flatten()).all(|c| c.name != "mcp-web"));
}

#[test]
fn agent_gets_profile_namespace_ports_and_probes() {
    let (profile, servers) = mixed();
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let agent = find(out, AGENT_CONTAINER);
    assert_eq!(agent.command.as_deref(), Some(&[SPEARLET.to_string(), "run".to_string()][..]));
    assert_eq!(env_of(agent, ENV_PROFILE).and_then(|e| e.value.as_deref()), Some("dev"));
    let namespace =
        env_of(agent, ENV_POD_NAMESPACE).and_then(|e| e.value_from.as_ref()).and_then(|v| v.field_ref.as_ref());
    assert_eq!(namespace.map(|f| f.field_path.as_str()), Some("metadata.namespace"));
    assert_eq!(env_of(agent, ENV_SOCKET_DIR).and_then(|e| e.value.as_deref()), Some(RUN_DIR));
    assert_eq!(env_of(agent, ENV_HTTP_ADDR).and_then(|e| e.value.as_deref()), Some("127.0.0.1:4040"));
    let path = |p: Option<&Probe>| p.and_then(|p| p.http_get.as_ref()).and_then(|h| h.path.clone());
    assert_eq!(path(agent.readiness_probe.as_ref()).as_deref(), Some("/readyz"));
    assert_eq!(path(agent.liveness_probe.as_ref()).as_deref(), Some("/healthz"));
    // A native sidecar: the app starts when the hook returns, the moment the agent is ready.
    assert!(agent.startup_probe.is_none(), "the hook, not a probe ticking each second, holds the app back");
    let hook = agent.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()).and_then(|h| h.exec.as_ref());
    let hook = hook.and_then(|e| e.command.clone()).unwrap_or_default();
    assert_eq!(hook, [SPEARLET, "wait-ready", "--admin-addr", "127.0.0.1:4042", "--timeout", "120"]);
    assert_eq!(agent.resources.as_ref(), Some(&default_agent_resources()));

    // A plain container: nothing waits for it, so a startup probe keeps liveness off while it starts.
    let decision = run(&with_profile(), Some(&profile), &servers, false);
    let (_, out, _) = patched(&decision);
    let agent = find(out, AGENT_CONTAINER);
    assert!(agent.lifecycle.is_none());
    assert_eq!(path(agent.startup_probe.as_ref()).as_deref(), Some("/startupz"));
}

#[test]
fn every_injected_container_is_locked_down() {
    let (profile, servers) = with_secrets();
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    for (name, uid) in [(INIT_CONTAINER, INJECTED_UID), ("mcp-fs", sidecar_uid(0)), (AGENT_CONTAINER, INJECTED_UID)] {
        let sc = find(out, name).security_context.clone().expect("a security context");
        assert_eq!(sc.run_as_non_root, Some(true), "{name}");
        assert_eq!(sc.run_as_user, Some(uid), "{name}");
        assert_eq!(sc.run_as_group, Some(INJECTED_UID), "{name}: the shared group reaches the 0660 socket");
        assert_eq!(sc.allow_privilege_escalation, Some(false), "{name}");
        assert_eq!(sc.read_only_root_filesystem, Some(true), "{name}");
        assert_eq!(sc.capabilities.and_then(|c| c.drop), Some(vec!["ALL".to_string()]), "{name}");
        assert_eq!(sc.seccomp_profile.map(|s| s.type_).as_deref(), Some("RuntimeDefault"), "{name}");
        assert!(find(out, name).resources.as_ref().and_then(|r| r.requests.as_ref()).is_some(), "{name}");
    }
    // The app container is left as it was, apart from its env.
    assert!(find(out, "app").security_context.is_none());
}

#[test]
fn secrets_go_to_the_container_that_needs_them() {
    let (profile, servers) = with_secrets();
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, warnings) = patched(&decision);
    assert!(warnings.is_empty(), "{warnings:?}");
    let secret_of = |c: &Container, var: &str| {
        env_of(c, var).and_then(|e| e.value_from.clone()).and_then(|v| v.secret_key_ref).map(|s| (s.name, s.key))
    };
    let agent = find(out, AGENT_CONTAINER);
    let pair = |a: &str, b: &str| Some((a.to_string(), b.to_string()));
    assert_eq!(secret_of(agent, "SPEAR_SECRET_WEB_AUTHORIZATION"), pair("web-credentials", "authorization"));
    assert_eq!(secret_of(agent, ENV_UPSTREAM_API_KEY), pair("openai", "api-key"));
    // Literal headers stay in the McpServer, read by the agent from the registry.
    assert!(env_of(agent, "SPEAR_SECRET_WEB_X_TENANT").is_none());
    assert!(env_of(agent, "FS_TOKEN").is_none());

    let bridge = find(out, "mcp-fs");
    assert_eq!(secret_of(bridge, "FS_TOKEN"), pair("fs-credentials", "token"));
    let root = env_of(bridge, "FS_ROOT").and_then(|e| e.value_from.clone()).and_then(|v| v.config_map_key_ref);
    assert_eq!(root.map(|r| r.name).as_deref(), Some("fs-config"));
    // A reference to a variable defined before it becomes the kubelet's $(VAR).
    assert_eq!(env_of(bridge, "FS_AUTH").and_then(|e| e.value.as_deref()), Some("Bearer $(FS_TOKEN)"));
    // No Secret reaches the app container.
    assert!(find(out, "app").env.iter().flatten().all(|e| e.value_from.is_none()));
}

#[test]
fn env_templates_and_argv_survive_the_kubelets_expansion() {
    let fs = stdio_server("fs")
        .stdio("npx", ["--price=$5", "$(HOME)"])
        .env("CACHE", "${ENV:HOME}/cache")
        .env("PRICE", "$5 and $${ENV:X} and ${ENV:UNSET:-fallback}")
        .env("TOKEN", "${ENV:GITHUB_TOKEN}");
    let profile = profile(&[&fs]);
    let decision = run(&with_profile(), Some(&profile), &[fs], true);
    let (_, out, warnings) = patched(&decision);
    let bridge = find(out, "mcp-fs");
    let args = bridge.args.clone().unwrap_or_default();
    assert_eq!(&args[args.len() - 2..], ["--price=$$5", "$$(HOME)"]);
    let value = |name: &str| env_of(bridge, name).and_then(|e| e.value.clone());
    assert_eq!(value("CACHE").as_deref(), Some("$(HOME)/cache"));
    assert_eq!(value("PRICE").as_deref(), Some("$$5 and $${ENV:X} and fallback"));
    assert_eq!(value("TOKEN").as_deref(), Some("$(GITHUB_TOKEN)"));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("GITHUB_TOKEN") && warnings[0].contains("spec.stdio.env[2].value"), "{warnings:?}");
}

#[test]
fn conflicting_secret_env_vars_are_denied() {
    // `a-b` + header `c` and `a` + header `b-c` both map to SPEAR_SECRET_A_B_C.
    let server = |name: &str| McpServer::test(name).http("https://mcp.example.com/mcp").allowing(["*"]);
    let one = server("a-b").secret_header("c", "one", "k");
    let two = server("a").secret_header("b-c", "two", "k");
    let profile = profile(&[&one, &two]);
    let decision = run(&with_profile(), Some(&profile), &[one, two], true);
    assert!(denied(&decision).contains("SPEAR_SECRET_A_B_C"));
}

#[test]
fn stdio_server_without_image_is_left_out_with_a_warning() {
    let mut fs = stdio_server("fs");
    if let Some(stdio) = fs.spec.stdio.as_mut() {
        stdio.image = None;
    }
    let profile = profile(&[&fs]);
    let decision = run(&with_profile(), Some(&profile), &[fs], true);
    let (_, out, warnings) = patched(&decision);
    assert_eq!(names(out.spec.as_ref().and_then(|s| s.init_containers.as_ref())), ["spear-init", "spearlet"]);
    assert!(warnings.iter().any(|w| w.contains("spec.stdio.image")), "{warnings:?}");
}

#[test]
fn long_server_names_give_unique_valid_container_names() {
    let a = "a".repeat(63);
    let b = format!("{}b", "a".repeat(62));
    let (na, nb) = (dns_label(SIDECAR_PREFIX, &a), dns_label(SIDECAR_PREFIX, &b));
    assert!(na.len() <= 63 && nb.len() <= 63);
    assert_ne!(na, nb);
    assert!(na.starts_with("mcp-aaa") && !na.contains("--"));
    assert_eq!(dns_label(SIDECAR_PREFIX, "fs"), "mcp-fs");
}

#[test]
fn ports_are_configurable() {
    let (profile, servers) = mixed();
    let config = InjectConfig { ports: Ports { http: 5050, grpc: 5051, admin: 5052 }, ..config(true) };
    let decision = run_with(&with_profile(), Some(&profile), &servers, &config);
    let (_, out, _) = patched(&decision);
    let app = find(out, "app");
    assert_eq!(env_of(app, ENV_MCP_URL).and_then(|e| e.value.as_deref()), Some("http://127.0.0.1:5050/mcp"));
    assert_eq!(env_of(app, ENV_GRPC_ADDR).and_then(|e| e.value.as_deref()), Some("127.0.0.1:5051"));
    let agent = find(out, AGENT_CONTAINER);
    assert_eq!(agent.ports.iter().flatten().map(|p| p.container_port).collect::<Vec<_>>(), [5052]);
}

#[test]
fn result_does_not_depend_on_server_order() {
    let (profile, mut servers) = mixed();
    let first = run(&with_profile(), Some(&profile), &servers, true);
    servers.reverse();
    assert_eq!(run(&with_profile(), Some(&profile), &servers, true), first);
}

#[test]
fn a_profile_other_than_the_annotated_one_is_an_error() {
    let (mut profile, servers) = mixed();
    profile.metadata.name = Some("other".into());
    let result = mutate(
        &with_profile(),
        &enabled(),
        Some(&profile),
        &servers,
        &granted(Some(&profile), &servers),
        &config(true),
        &key(),
    );
    assert!(matches!(result, Err(InjectError::ProfileMismatch { .. })), "{result:?}");
}

#[test]
fn references_their_secret_does_not_grant_are_left_out_with_a_warning() {
    let (profile, servers) = with_secrets();
    let mut grants = SecretGrants::default();
    // web-credentials grants another server; fs-secret and openai do not exist.
    grants.insert("web-credentials", Some([(ANNOTATION_ALLOWED_SERVERS.to_string(), "other".to_string())].into()));
    let decision =
        mutate(&with_profile(), &enabled(), Some(&profile), &servers, &grants, &config(true), &key()).expect("decides");
    let (_, pod, warnings) = patched(&decision);
    let spec = pod.spec.as_ref().expect("spec");
    let secret_vars: Vec<&str> = spec
        .init_containers
        .iter()
        .flatten()
        .flat_map(|c| c.env.iter().flatten())
        .filter(|e| e.value_from.as_ref().is_some_and(|v| v.secret_key_ref.is_some()))
        .map(|e| e.name.as_str())
        .collect();
    assert!(secret_vars.is_empty(), "{secret_vars:?}");
    let refused: Vec<&String> = warnings.iter().filter(|w| w.contains("not injected")).collect();
    assert_eq!(refused.len(), server_secret_refs(&servers[0]).len() + 2, "{warnings:#?}");
    assert!(refused.iter().any(|w| w.contains("McpServer \"web\"") && w.contains(ANNOTATION_ALLOWED_SERVERS)));
    assert!(refused.iter().any(|w| w.contains("McpProfile") && w.contains("upstream API key")));
}

/// A person's grant Secret (`authorizationCode.tokenSecretRef`) is read by the agent itself, so
/// nothing is injected for it; one that does not allow the server is said at admission.
#[test]
fn a_grant_secret_that_does_not_allow_its_server_is_said_at_admission() {
    let mut server = http_server("gh");
    server.spec.http.as_mut().expect("http").auth = Some(
        serde_json::from_value(json!({"issuer": "https://as.example",
            "authorizationCode": {"tokenSecretRef": {"name": "gh-grant"}}}))
        .expect("auth"),
    );
    let profile = profile(&[&server]);
    let servers = vec![server];
    let warned = |grants: &SecretGrants| {
        let decision = mutate(&with_profile(), &enabled(), Some(&profile), &servers, grants, &config(true), &key())
            .expect("decides");
        let (_, pod, warnings) = patched(&decision);
        let env =
            pod.spec.as_ref().expect("spec").init_containers.iter().flatten().flat_map(|c| c.env.iter().flatten());
        assert!(env.filter(|e| e.value_from.is_some()).all(|e| !e.name.contains("GRANT")), "nothing injected for it");
        warnings.iter().filter(|w| w.contains("gh-grant")).cloned().collect::<Vec<_>>()
    };
    let warnings = warned(&SecretGrants::default());
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("does not exist") && warnings[0].contains("agent refuses the server"), "{warnings:?}");
    let mut other = SecretGrants::default();
    other.insert("gh-grant", Some([(ANNOTATION_ALLOWED_SERVERS.to_string(), "jira".to_string())].into()));
    assert!(warned(&other)[0].contains(ANNOTATION_ALLOWED_SERVERS));
    assert!(warned(&SecretGrants::allow_all(["gh-grant"])).is_empty());
}

/// An approval webhook's signing key reaches the agent (and only the agent) when its Secret
/// grants the profile; a Secret that does not is left out with a warning naming the annotation.
#[test]
fn an_approval_webhooks_signing_key_reaches_the_agent_only_when_its_secret_grants_the_profile() {
    let server = http_server("web");
    let mut profile = profile(&[&server]);
    profile.spec.approval = Some(
        serde_json::from_value(json!({"approvers": [
            {"webhook": {"url": "https://approver.example/", "signingSecretRef": {"name": "approver-key", "key": "hmac"}}},
        ]}))
        .expect("approval"),
    );
    let servers = [server];
    let inject = |grants: &SecretGrants| {
        mutate(&with_profile(), &enabled(), Some(&profile), &servers, grants, &config(true), &key()).expect("decides")
    };
    let granted = inject(&granted(Some(&profile), &servers));
    let (_, pod, warnings) = patched(&granted);
    let var = env_of(find(pod, AGENT_CONTAINER), "SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC").expect("the key's env var");
    let selector = var.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).expect("from the Secret");
    assert_eq!((selector.name.as_str(), selector.key.as_str()), ("approver-key", "hmac"));
    assert!(warnings.is_empty(), "{warnings:?}");
    let elsewhere = pod.spec.iter().flat_map(|s| s.containers.iter()).filter(|c| c.name != AGENT_CONTAINER);
    assert!(elsewhere.clone().all(|c| env_of(c, "SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC").is_none()));

    let mut others = SecretGrants::default();
    others.insert("approver-key", Some([(ANNOTATION_ALLOWED_PROFILES.to_string(), "someone-else".to_string())].into()));
    let refused = inject(&others);
    let (_, pod, warnings) = patched(&refused);
    assert!(env_of(find(pod, AGENT_CONTAINER), "SPEAR_APPROVAL_KEY_APPROVER_KEY_HMAC").is_none());
    assert!(
        warnings.iter().any(|w| w.contains("signing key was not injected") && w.contains(ANNOTATION_ALLOWED_PROFILES)),
        "{warnings:?}"
    );
}

#[test]
fn a_header_template_without_default_is_flagged_because_the_pod_agent_reads_no_env() {
    let server = http_server("web").header("X-Token", "${ENV:TOKEN}").header("X-Region", "${ENV:REGION:-eu}");
    let profile = profile(&[&server]);
    let decision = run(&with_profile(), Some(&profile), &[server], true);
    let (_, _, warnings) = patched(&decision);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(warnings[0].contains("${ENV:TOKEN}") && warnings[0].contains("valueFrom.secretKeyRef"), "{}", warnings[0]);
}

/// Each sidecar has its own uid, its own socket directory (read-only for the
/// agent, absent from every other sidecar) and no service-account token unless it asks.
#[test]
fn sidecars_are_isolated_from_each_other_and_from_the_api() {
    let with_token = {
        let mut s = stdio_server("kube");
        s.spec.stdio.as_mut().expect("stdio").mount_service_account_token = true;
        s
    };
    let servers = vec![stdio_server("fs"), stdio_server("git"), with_token];
    let profile = profile(&servers.iter().collect::<Vec<_>>()).granting_token_mount(["kube"]);
    let decision = run(&with_profile(), Some(&profile), &servers, true);
    let (_, out, _) = patched(&decision);
    let mounts = |c: &Container| -> Vec<(String, String, bool)> {
        c.volume_mounts
            .iter()
            .flatten()
            .map(|m| (m.name.clone(), m.mount_path.clone(), m.read_only == Some(true)))
            .collect()
    };
    let uids: Vec<Option<i64>> = ["mcp-fs", "mcp-git", "mcp-kube"]
        .iter()
        .map(|n| find(out, n).security_context.as_ref().and_then(|s| s.run_as_user))
        .collect();
    assert_eq!(uids, [Some(sidecar_uid(0)), Some(sidecar_uid(1)), Some(sidecar_uid(2))]);
    assert!(uids.iter().all(|u| *u != Some(INJECTED_UID)));

    let fs = mounts(find(out, "mcp-fs"));
    assert!(fs.contains(&("mcp-sock-fs".into(), "/spear/run/fs".into(), false)), "{fs:?}");
    assert!(!fs.iter().any(|(name, _, _)| name == "mcp-sock-git"), "no sidecar sees another's socket: {fs:?}");
    assert!(fs.contains(&(VOLUME_NO_TOKEN.into(), SERVICE_ACCOUNT_DIR.into(), true)), "token masked: {fs:?}");
    let kube = mounts(find(out, "mcp-kube"));
    assert!(!kube.iter().any(|(_, path, _)| path == SERVICE_ACCOUNT_DIR), "asked for the token: {kube:?}");

    let agent = mounts(find(out, AGENT_CONTAINER));
    for server in ["fs", "git", "kube"] {
        assert!(agent.contains(&(format!("mcp-sock-{server}"), format!("/spear/run/{server}"), true)), "{agent:?}");
    }
    let sidecar_env = find(out, AGENT_CONTAINER).env.iter().flatten().find(|e| e.name == ENV_SIDECAR_SERVERS).cloned();
    assert_eq!(sidecar_env.and_then(|e| e.value).as_deref(), Some("fs=65600,git=65601,kube=65602"));
}

#[test]
fn a_pod_sharing_its_process_namespace_is_denied() {
    let (profile, servers) = mixed();
    let mut p = with_profile();
    spec_mut(&mut p).share_process_namespace = Some(true);
    assert!(denied(&run(&p, Some(&profile), &servers, true)).contains("shareProcessNamespace"));
}

#[test]
fn auth_secrets_reach_the_agent_and_service_account_tokens_only_the_agent() {
    use crate::api::{ClientCredentialsAuth, HeaderValueSource, HttpAuth, ServiceAccountTokenAuth};
    let secret_key_ref = SecretKeySelector { name: "remote-client".into(), key: "secret".into(), optional: None };
    let cc = HttpAuth {
        issuer: Some("https://sso.example.com".into()),
        client_credentials: Some(ClientCredentialsAuth {
            client_id: "agent".into(),
            client_secret: Some(HeaderValueSource { secret_key_ref }),
            private_key: None,
        }),
        ..HttpAuth::default()
    };
    let sa = HttpAuth {
        service_account_token: Some(ServiceAccountTokenAuth {
            audience: "https://tools.example.com".into(),
            expiration_seconds: None,
        }),
        ..HttpAuth::default()
    };
    let remote = McpServer::test("remote").http("https://mcp.example.com/mcp").allowing(["*"]).auth(cc);
    let cluster = McpServer::test("cluster").http("https://tools.example.com/mcp").allowing(["*"]).auth(sa);
    let fs = stdio_server("fs");
    let profile = profile(&[&remote, &cluster, &fs]).granting_tokens(["cluster"], ["https://tools.example.com"]);
    let decision = run(&with_profile(), Some(&profile), &[remote, cluster, fs], true);
    let (_, out, warnings) = patched(&decision);
    assert!(warnings.is_empty(), "{warnings:?}");
    let spec = out.spec.as_ref().expect("spec");
    let containers: Vec<&Container> = spec.init_containers.iter().flatten().chain(spec.containers.iter()).collect();
    let agent = containers.iter().find(|c| c.name == AGENT_CONTAINER).expect("agent");
    let secret = env_of(agent, "SPEAR_SECRET_REMOTE_AUTH_CLIENTSECRET").expect("client secret env");
    let from = secret.value_from.as_ref().and_then(|v| v.secret_key_ref.as_ref()).expect("secretKeyRef");
    assert_eq!((from.name.as_str(), from.key.as_str()), ("remote-client", "secret"));
    assert_eq!(env_of(agent, ENV_SECRET_REFS).and_then(|e| e.value.as_deref()), Some("remote/auth:clientSecret"));
    // The projection needs a named service account; the pod named none: `default`, as the API
    // server's ServiceAccount admission would.
    assert_eq!(spec.service_account_name.as_deref(), Some("default"));
    let volume = spec.volumes.iter().flatten().find(|v| v.name == VOLUME_AUTH_TOKENS).expect("token volume");
    let sources = volume.projected.as_ref().and_then(|p| p.sources.as_ref()).expect("sources");
    let tokens: Vec<_> = sources.iter().filter_map(|s| s.service_account_token.as_ref()).collect();
    assert_eq!(tokens.len(), 1);
    assert_eq!(
        (tokens[0].audience.as_deref(), tokens[0].path.as_str()),
        (Some("https://tools.example.com"), "cluster")
    );
    for c in &containers {
        let mounted = c.volume_mounts.iter().flatten().any(|m| m.name == VOLUME_AUTH_TOKENS);
        assert_eq!(mounted, c.name == AGENT_CONTAINER, "container {} and the token volume", c.name);
    }
}

#[test]
fn a_pod_sharing_the_nodes_process_namespace_is_denied() {
    let (profile, servers) = mixed();
    let mut p = with_profile();
    spec_mut(&mut p).host_pid = Some(true);
    let message = denied(&run(&p, Some(&profile), &servers, true)).to_string();
    assert!(message.contains("hostPID") && message.contains(ANNOTATION_INJECT), "{message}");
}

#[test]
fn a_profile_annotation_that_is_no_object_name_is_denied_naming_the_rule() {
    let long = "a".repeat(254);
    for bad in ["../../secrets", "Dev", "dev/x", "a..b", long.as_str()] {
        let message = invalid_profile_annotation(bad, "team-a").expect("refused");
        assert!(message.contains("DNS-1123") && message.contains("team-a"), "{message}");
        assert!(message.len() < 400, "the caller's text is cut: {message}");
    }
    assert_eq!(invalid_profile_annotation("dev.v2", "team-a"), None);
}

/// The token volume's (audience, file) pairs of an injected pod.
fn projected_tokens(pod: &Pod) -> Vec<(String, String)> {
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let volume = volumes.into_iter().flatten().find(|v| v.name == VOLUME_AUTH_TOKENS);
    let sources = volume.and_then(|v| v.projected.as_ref()).and_then(|p| p.sources.as_ref());
    sources
        .into_iter()
        .flatten()
        .filter_map(|s| s.service_account_token.as_ref())
        .map(|t| (t.audience.clone().unwrap_or_default(), t.path.clone()))
        .collect()
}

/// Security review N1: an McpServer author who writes `serviceAccountToken` or `tokenExchange`
/// with the Kubernetes API's or a cloud STS's audience (or any audience) gets no token of the
/// pod's ServiceAccount unless the profile grants it, and a `*` grant never covers those.
#[test]
fn an_mcp_server_author_gets_no_service_account_token_the_profile_does_not_grant() {
    use crate::api::{HttpAuth, ServiceAccountTokenAuth, TokenExchangeAuth};
    let token = |name: &str, audience: &str| {
        let auth = HttpAuth {
            service_account_token: Some(ServiceAccountTokenAuth {
                audience: audience.into(),
                expiration_seconds: None,
            }),
            ..HttpAuth::default()
        };
        McpServer::test(name).http("https://attacker.example/mcp").allowing(["*"]).auth(auth)
    };
    let exchange = |name: &str, audience: &str| {
        let auth = HttpAuth {
            token_exchange: Some(TokenExchangeAuth { audience: audience.into(), ..TokenExchangeAuth::default() }),
            ..HttpAuth::default()
        };
        McpServer::test(name).http("https://attacker.example/mcp").allowing(["*"]).auth(auth)
    };
    let servers = vec![
        token("notes", "https://kubernetes.default.svc.cluster.local"),
        exchange("cloud", "sts.amazonaws.com"),
        token("tools", "https://tools.example.com"),
    ];

    // No grant: no token at all, one warning per server, naming the fix.
    let ungranted = profile(&servers.iter().collect::<Vec<_>>());
    let decision = run(&with_profile(), Some(&ungranted), &servers, true);
    let (_, out, warnings) = patched(&decision);
    assert_eq!(projected_tokens(out), vec![], "{warnings:?}");
    assert_eq!(warnings.iter().filter(|w| w.contains("spec.identity.servers")).count(), 3, "{warnings:#?}");
    assert!(out.spec.as_ref().is_some_and(|s| s.service_account_name.is_none()), "no token, no account named");

    // Every server and any audience granted: the API server's and the STS's are still refused.
    let star = ungranted.clone().granting_tokens(["*"], ["*"]);
    let decision = run(&with_profile(), Some(&star), &servers, true);
    let (_, out, warnings) = patched(&decision);
    assert_eq!(projected_tokens(out), [("https://tools.example.com".to_string(), "tools".to_string())]);
    let refused: Vec<&String> = warnings.iter().filter(|w| w.contains("literally")).collect();
    assert_eq!(refused.len(), 2, "{warnings:#?}");
    assert!(refused.iter().all(|w| w.contains("the token was not injected")), "{refused:#?}");

    // Listed literally by the profile's owner: injected.
    let literal = ungranted.granting_tokens(["cloud"], ["sts.amazonaws.com"]);
    let decision = run(&with_profile(), Some(&literal), &servers, true);
    assert!(projected_tokens(patched(&decision).1).contains(&("sts.amazonaws.com".to_string(), "cloud".to_string())));
}

/// Security review N1 (and F9): `stdio.mountServiceAccountToken: true` is the McpServer
/// author's choice; without the profile's grant the sidecar keeps the empty directory over the
/// token path.
#[test]
fn an_mcp_server_author_cannot_unmask_the_pods_api_token_in_their_sidecar() {
    let helper = stdio_server("helper").mounting_service_account_token();
    let servers = vec![helper];
    let ungranted = profile(&servers.iter().collect::<Vec<_>>());
    let masked = |c: &Container| {
        c.volume_mounts.iter().flatten().any(|m| m.name == VOLUME_NO_TOKEN && m.mount_path == SERVICE_ACCOUNT_DIR)
    };
    let decision = run(&with_profile(), Some(&ungranted), &servers, true);
    let (_, out, warnings) = patched(&decision);
    assert!(masked(find(out, "mcp-helper")), "the token path stays masked");
    assert!(
        warnings.iter().any(|w| w.contains("spec.identity.mountServiceAccountToken") && w.contains("\"helper\"")),
        "{warnings:#?}"
    );
    // A grant for another server, or for tokens only, does not unmask it either.
    for grant in [ungranted.clone().granting_token_mount(["other"]), ungranted.clone().granting_tokens(["*"], ["*"])] {
        assert!(masked(find(patched(&run(&with_profile(), Some(&grant), &servers, true)).1, "mcp-helper")));
    }
    let granted = ungranted.granting_token_mount(["helper"]);
    let decision = run(&with_profile(), Some(&granted), &servers, true);
    let (_, out, warnings) = patched(&decision);
    assert!(!masked(find(out, "mcp-helper")) && warnings.is_empty(), "{warnings:?}");
}

#[test]
fn the_operators_trust_bundle_goes_inline_to_the_agent_only() {
    let (profile, servers) = mixed();
    let pem = crate::testing::test_ca::TestCa::new("private").cert_pem();
    let mut config = config(true);
    config.extra_ca_pem = Some(std::sync::Arc::from(pem.as_str()));
    let decision = run_with(&with_profile(), Some(&profile), &servers, &config);
    let (_, out, _) = patched(&decision);
    let spec = out.spec.as_ref().expect("spec");
    for c in spec.init_containers.iter().flatten().chain(&spec.containers) {
        let given = env_of(c, crate::api::keys::ENV_EXTRA_CA_PEM).and_then(|e| e.value.as_deref());
        // A value, never a reference to a ConfigMap the namespace could edit, and no volume.
        assert_eq!(given, (c.name == AGENT_CONTAINER).then_some(pem.as_str()), "container {}", c.name);
    }
    // Without a bundle, nothing is added (the goldens hold the rest of the pod).
    let without = run(&with_profile(), Some(&profile), &servers, true);
    let (_, plain, _) = patched(&without);
    assert!(env_of(find(plain, AGENT_CONTAINER), crate::api::keys::ENV_EXTRA_CA_PEM).is_none());
}
