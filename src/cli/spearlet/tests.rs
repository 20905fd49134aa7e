//! The webhook↔agent contract, checked from both ends: the containers the webhook injects are
//! parsed by this binary's own flags, so a renamed flag, variable or default breaks this test
//! instead of a pod.

use std::collections::{BTreeMap, BTreeSet};

use clap::{CommandFactory, Parser};
use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};
use kube::core::ObjectMeta;

use super::Args;
use crate::api::keys;
use crate::api::{McpProfile, McpServer};
use crate::operator::inject::{Decision, InjectConfig, mutate};

/// The pod the webhook admits for profile `dev` with one stdio server `fs` and a chat upstream
/// whose key comes from a Secret.
fn injected_pod() -> Pod {
    let fs = McpServer::test("fs")
        .stdio("npx", ["-y", "@modelcontextprotocol/server-filesystem", "/data"])
        .image("node:22-slim")
        .allowing(["read_*"]);
    let dev = McpProfile::test("dev").servers(["fs"]).upstream("https://llm.example/v1").upstream_key("llm", "key");
    let pod = Pod {
        metadata: ObjectMeta {
            name: Some("app".into()),
            namespace: Some("team-a".into()),
            annotations: Some(BTreeMap::from([(keys::ANNOTATION_PROFILE.to_string(), "dev".to_string())])),
            ..ObjectMeta::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container { name: "app".into(), image: Some("app:1".into()), ..Container::default() }],
            ..PodSpec::default()
        }),
        ..Pod::default()
    };
    let enabled = BTreeMap::from([(keys::LABEL_INJECTION.to_string(), keys::INJECTION_ENABLED.to_string())]);
    let key = crate::api::api_key::ApiKey::random().expect("the OS has randomness");
    match mutate(
        &pod,
        &enabled,
        Some(&dev),
        &[fs],
        &Default::default(),
        &InjectConfig::new("agent:1", "spearlet:1"),
        &key,
    ) {
        Ok(Decision::Patch { pod, .. }) => *pod,
        other => panic!("expected the pod to be injected, got {other:?}"),
    }
}

fn container<'a>(pod: &'a Pod, name: &str) -> &'a Container {
    let spec = pod.spec.as_ref().expect("spec");
    let all = spec.containers.iter().chain(spec.init_containers.iter().flatten());
    all.into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no container {name}"))
}

/// `spearlet <subcommand>`'s flags by the variable each reads.
fn flags_by_env(subcommand: &str) -> BTreeMap<String, String> {
    let command = Args::command();
    let sub = command.find_subcommand(subcommand).unwrap_or_else(|| panic!("no subcommand {subcommand}"));
    sub.get_arguments()
        .filter_map(|arg| Some((arg.get_env()?.to_str()?.to_string(), arg.get_long()?.to_string())))
        .collect()
}

/// `spearlet run` as a parsed command line.
#[derive(Parser)]
struct RunCli {
    #[command(flatten)]
    run: super::RunArgs,
}

#[test]
fn the_injected_agent_container_is_a_valid_spearlet_run() {
    let pod = injected_pod();
    let agent = container(&pod, keys::AGENT_CONTAINER);
    let command = agent.command.clone().expect("command");
    assert_eq!(command, [keys::SPEARLET, "run"], "the agent runs the copied spearlet");

    // Every variable the webhook sets is read by a flag of `spearlet run`, or by the agent
    // itself (the upstream key, the servers' secrets): none is set for nothing.
    let flags = flags_by_env("run");
    let read_directly = BTreeSet::from([keys::ENV_UPSTREAM_API_KEY]);
    let mut argv = vec!["spearlet-run".to_string()];
    for var in agent.env.iter().flatten() {
        if read_directly.contains(var.name.as_str()) {
            continue;
        }
        let flag = flags.get(&var.name).unwrap_or_else(|| {
            panic!("the webhook sets {} but no flag of `spearlet run` reads it (flags: {flags:?})", var.name)
        });
        // The downward API fills `valueFrom` in the pod; a namespace stands in for it here.
        let value = var.value.clone().unwrap_or_else(|| "team-a".to_string());
        argv.push(format!("--{flag}={value}"));
    }
    let parsed = RunCli::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
    let config = parsed.run.config().expect("a valid configuration");
    assert_eq!(config.profile.as_deref(), Some("dev"));
    assert_eq!(config.namespace.as_deref(), Some("team-a"));
    assert_eq!(config.socket_dir, std::path::Path::new(keys::RUN_DIR));
    assert_eq!(config.sidecar_servers, Some(vec!["fs=65600".to_string()]));
    assert_eq!(config.agent.http_addr.port(), keys::PORT_HTTP);
    assert_eq!(config.agent.grpc_addr.port(), keys::PORT_GRPC);
    assert_eq!(config.agent.admin_addr.port(), keys::PORT_ADMIN);
    assert!(config.agent.http_addr.ip().is_loopback() && config.agent.grpc_addr.ip().is_loopback());

    // What the webhook leaves unset, the flags' defaults agree with.
    let defaults = RunCli::try_parse_from(["spearlet-run"]).expect("defaults parse").run.config().expect("config");
    assert_eq!(defaults.socket_dir, config.socket_dir);
    assert_eq!(defaults.agent.http_addr, config.agent.http_addr);
    assert_eq!(defaults.agent.grpc_addr, config.agent.grpc_addr);
    assert_eq!(defaults.agent.admin_addr, config.agent.admin_addr);
}

#[test]
fn the_injected_bridge_sidecar_is_a_valid_spearlet_bridge() {
    let pod = injected_pod();
    let sidecar = container(&pod, &format!("{}fs", keys::SIDECAR_PREFIX));
    let argv: Vec<String> = sidecar.command.iter().flatten().chain(sidecar.args.iter().flatten()).cloned().collect();
    assert_eq!(argv.first().map(String::as_str), Some(keys::SPEARLET));
    let flags = flags_by_env("bridge");
    for var in
        sidecar.env.iter().flatten().filter(|v| v.name.starts_with("SPEAR_") && !v.name.starts_with("SPEAR_SECRET_"))
    {
        assert!(
            flags.contains_key(&var.name),
            "the sidecar gets {} but `spearlet bridge` reads no such flag",
            var.name
        );
    }
    let parsed = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
    let super::Command::Bridge(bridge) = parsed.command else { panic!("{argv:?} is not `spearlet bridge`") };
    assert_eq!(bridge.socket, std::path::Path::new(&format!("{}/fs/mcp.sock", keys::RUN_DIR)));
    assert_eq!(bridge.peer_uid, Some(65532), "only the agent may connect");
    assert_eq!(bridge.server_id.as_deref(), Some("fs"));
    assert_eq!(bridge.command.first().map(String::as_str), Some("npx"));
}

/// The init container runs the image's own binary and nothing else (the spearlet image has no
/// `cp` and no shell), and installs it where every other injected container runs it.
#[test]
fn the_injected_init_container_is_a_valid_spearlet_install() {
    let pod = injected_pod();
    let init = container(&pod, keys::INIT_CONTAINER);
    let argv: Vec<String> = init.command.iter().flatten().chain(init.args.iter().flatten()).cloned().collect();
    assert_eq!(argv.first().map(String::as_str), Some(keys::IMAGE_SPEARLET), "the image's only executable");
    let parsed = Args::try_parse_from(&argv).unwrap_or_else(|e| panic!("{argv:?} does not parse: {e}"));
    let super::Command::Install(install) = parsed.command else { panic!("{argv:?} is not `spearlet install`") };
    assert_eq!(install.to, std::path::Path::new(keys::SPEARLET));
    assert!(init.env.iter().flatten().all(|v| flags_by_env("install").contains_key(&v.name)), "{:?}", init.env);

    // The file lands in the bin volume, mounted writable here, and the others run that file.
    let bin = std::path::Path::new(keys::BIN_DIR);
    assert_eq!(install.to.parent(), Some(bin));
    let mount = init.volume_mounts.iter().flatten().find(|m| m.mount_path == keys::BIN_DIR).expect("the bin volume");
    assert_ne!(mount.read_only, Some(true));
    for name in [keys::AGENT_CONTAINER, &format!("{}fs", keys::SIDECAR_PREFIX)] {
        let runs = container(&pod, name).command.as_ref().and_then(|c| c.first()).cloned();
        assert_eq!(runs.as_deref().map(std::path::Path::new), Some(install.to.as_path()), "{name}");
    }
}

#[test]
fn local_mode_keeps_the_admin_port_on_loopback_and_a_pod_opens_it() {
    #[derive(Parser)]
    struct ServeCli {
        #[command(flatten)]
        serve: super::ServeArgs,
    }
    let serve = ServeCli::try_parse_from(["spearlet-serve", "--registry-dir", "r"]).expect("parses");
    let local = serve.serve.config().expect("config");
    assert!(local.agent.admin_addr.ip().is_loopback(), "{}", local.agent.admin_addr);
    assert_eq!(local.agent.admin_addr.port(), keys::PORT_ADMIN);
    let pod = RunCli::try_parse_from(["spearlet-run"]).expect("parses").run.config().expect("config");
    assert!(pod.agent.admin_addr.ip().is_unspecified(), "{}", pod.agent.admin_addr);
}

#[test]
fn the_mcp_session_idle_time_defaults_to_five_minutes_and_refuses_0_or_over_a_day() {
    #[derive(Parser)]
    struct ServeCli {
        #[command(flatten)]
        serve: super::ServeArgs,
    }
    let parse = |idle: Option<&str>| {
        let mut argv = vec!["spearlet-serve".to_string(), "--registry-dir".into(), "r".into()];
        argv.extend(idle.map(|idle| format!("--mcp-session-idle-seconds={idle}")));
        ServeCli::try_parse_from(argv).map(|cli| cli.serve.config().expect("config").agent.mcp_session_idle)
    };
    assert_eq!(parse(None).expect("the default"), std::time::Duration::from_secs(300));
    assert_eq!(parse(Some("3")).expect("3 s"), std::time::Duration::from_secs(3));
    assert_eq!(parse(Some("86400")).expect("a day"), std::time::Duration::from_secs(86_400));
    for bad in ["0", "86401", "-1", "5m"] {
        let error = parse(Some(bad)).expect_err(bad).to_string();
        assert!(error.contains("--mcp-session-idle-seconds"), "{bad}: {error}");
    }
    let pod = RunCli::try_parse_from(["spearlet-run", "--mcp-session-idle-seconds", "60"]).expect("parses");
    assert_eq!(pod.run.config().expect("config").agent.mcp_session_idle, std::time::Duration::from_secs(60));
    assert_eq!(
        flags_by_env("run").get(keys::ENV_MCP_SESSION_IDLE_SECONDS).map(String::as_str),
        Some("mcp-session-idle-seconds")
    );
}
