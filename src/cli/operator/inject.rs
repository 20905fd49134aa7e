//! `spear-operator inject -f POD.yaml --registry-dir DIR`: the pod the webhook would admit,
//! computed offline (like `linkerd inject`) by the same `inject::mutate` the webhook runs.
//!
//! Offline there is no namespace to read and no Secret: the namespace is taken as
//! injection-enabled, and every Secret the profile and its servers reference as granting them
//! (the Secrets that must carry the grant are listed on stderr). Everything else (profile lookup,
//! server selection, denials, warnings) is the webhook's own code path.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context as _;
use k8s_openapi::api::core::v1::Pod;

use crate::api::api_key::ApiKey;
use crate::api::keys::{self, INJECTION_ENABLED, LABEL_INJECTION};
use crate::api::secret_grant::{SecretGrants, profile_secret_refs, server_secret_refs};
use crate::api::{McpProfile, McpServer};
use crate::cli::{emit, tell};
use crate::operator::inject::{self, Decision, InjectConfig};
use crate::operator::webhook::profile_servers;
use crate::registry::dir::DirSource;

/// Print the pod the webhook would admit (offline): `inject -f POD.yaml --registry-dir DIR`.
///
/// Exit status: 0 with the pod on stdout (injected, or unchanged when the webhook would skip it,
/// the reason on stderr), 1 when the webhook would deny it (the reason on stderr), 2 on a usage
/// error.
#[derive(clap::Args, Debug)]
pub(crate) struct InjectArgs {
    /// The pod manifest, YAML or JSON (`-` reads stdin).
    #[arg(short = 'f', long = "filename", value_name = "FILE")]
    file: PathBuf,
    /// Directory of McpServer and McpProfile manifests (as `spearlet serve --registry-dir`).
    #[arg(long, env = keys::ENV_REGISTRY_DIR, value_name = "DIR")]
    registry_dir: PathBuf,
    /// Namespace the pod is created in (default: its `metadata.namespace`, else `default`).
    #[arg(long, short = 'n')]
    namespace: Option<String>,
    /// Image of the injected agent container.
    #[arg(long, env = keys::ENV_AGENT_IMAGE, default_value = "ghcr.io/spear-dev/spearlet:0.1.0")]
    agent_image: String,
    /// Image of the init container that copies the static spearlet into the pod.
    #[arg(long, env = keys::ENV_SPEARLET_IMAGE, default_value = "ghcr.io/spear-dev/spearlet:0.1.0")]
    spearlet_image: String,
    /// Inject stdio sidecars as classic containers rather than native sidecars (Kubernetes < 1.29).
    #[arg(long)]
    classic_sidecars: bool,
    /// Print JSON instead of YAML.
    #[arg(long)]
    json: bool,
}

impl InjectArgs {
    pub(crate) fn run(self) -> anyhow::Result<ExitCode> {
        let text = if self.file.as_os_str() == "-" {
            let mut text = String::new();
            std::io::stdin().read_to_string(&mut text).context("reading the pod from stdin")?;
            text
        } else {
            std::fs::read_to_string(&self.file).with_context(|| format!("reading {}", self.file.display()))?
        };
        let mut pod: Pod =
            serde_yaml::from_str(&text).with_context(|| format!("{}: not a Pod manifest", self.file.display()))?;
        let namespace =
            self.namespace.or_else(|| pod.metadata.namespace.clone()).unwrap_or_else(|| "default".to_string());
        pod.metadata.namespace = Some(namespace.clone());

        let snapshot = DirSource::load(&self.registry_dir)
            .with_context(|| format!("--registry-dir {}", self.registry_dir.display()))?;
        for problem in snapshot.problems() {
            tell(format_args!("registry: {problem}"));
        }
        let wanted = pod.metadata.annotations.as_ref().and_then(|a| a.get(keys::ANNOTATION_PROFILE));
        let profile: Option<McpProfile> = wanted.and_then(|name| snapshot.profile(name)).map(|v| (*v.object).clone());
        let servers: Vec<McpServer> = snapshot.servers().values().map(|v| (*v.object).clone()).collect();
        let servers = match &profile {
            Some(profile) => profile_servers(profile, servers),
            None => Vec::new(),
        };
        let mut referenced: Vec<String> = profile.iter().flat_map(profile_secret_refs).map(|r| r.secret).collect();
        referenced.extend(servers.iter().flat_map(server_secret_refs).map(|r| r.secret));
        referenced.sort();
        referenced.dedup();
        if !referenced.is_empty() {
            tell(format_args!(
                "note: offline, Secrets are taken to grant their use; in the cluster these must name the servers (and profile) in their {} / {} annotations: {}",
                crate::api::secret_grant::ANNOTATION_ALLOWED_SERVERS,
                crate::api::secret_grant::ANNOTATION_ALLOWED_PROFILES,
                referenced.join(", ")
            ));
        }
        let grants = SecretGrants::allow_all(referenced.iter().map(String::as_str));
        let labels = BTreeMap::from([(LABEL_INJECTION.to_string(), INJECTION_ENABLED.to_string())]);
        let mut config = InjectConfig::new(self.agent_image, self.spearlet_image);
        config.extra_ca_pem = crate::trust::pem();
        config.native_sidecars = !self.classic_sidecars;

        // Each run draws a new key: a pod applied from this output carries it in its spec.
        let api_key = ApiKey::random().map_err(|e| anyhow::anyhow!("drawing the pod's API key from the OS: {e}"))?;
        let decision = inject::mutate(&pod, &labels, profile.as_ref(), &servers, &grants, &config, &api_key)?;
        let out = match decision {
            Decision::Deny { message } => {
                tell(format_args!("denied: {message}"));
                return Ok(ExitCode::from(1));
            }
            Decision::Skip { reason } => {
                tell(format_args!("not injected: {reason}"));
                pod
            }
            Decision::Patch { pod, warnings, .. } => {
                for warning in warnings {
                    tell(format_args!("warning: {warning}"));
                }
                *pod
            }
        };
        if self.json {
            emit(&format!("{}\n", serde_json::to_string_pretty(&out)?));
        } else {
            emit(&serde_yaml::to_string(&out)?);
        }
        Ok(ExitCode::SUCCESS)
    }
}
