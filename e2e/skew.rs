//! The upgrade the versioning policy supports, in real pods: the previous release's chart and
//! images are installed first (`hack/skew.sh` builds them from the commit `e2e/previous-release`
//! names), a pod is injected by its operator, then the cluster is upgraded the documented way
//! (the CRDs applied server-side, as Helm leaves a chart's `crds/` alone on upgrade; then
//! `helm upgrade` to this tree's chart and images), and that pod, still running the previous
//! agent, must keep serving its tools under the new operator.
//!
//! The pod uses its own namespace and a profile of one stdio server, so the main checks, which
//! count and edit the examples' objects, see none of it.

use std::path::PathBuf;

use anyhow::{Context, Result, ensure};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;
use spear::api::keys::{AGENT_CONTAINER, INIT_CONTAINER};
use spear::api::manifest::{self, Object};
use spear::api::{McpProfile, McpServer};

use crate::support::{Report, eventually, is_ready, ready_pod, repo, restarts};
use crate::{
    Driver, ECHO, ECHO_MESSAGE, POD_READY_TIMEOUT, RELEASE_NAMESPACE, STATUS_TIMEOUT, app_deployment_of,
    create_namespace, install_chart, localize,
};

const PROFILE: &str = "previous";
const APP: &str = "e2e-previous-app";
/// The field manager of the CRD upgrade, as a user's `kubectl apply --server-side` would be.
const FIELD_MANAGER: &str = "spear-e2e-upgrade";

/// The previous release, from `hack/skew.sh`'s exports.
pub struct Previous {
    commit: String,
    operator: String,
    spearlet: String,
    chart: PathBuf,
}

impl Previous {
    /// `None` when `SPEAR_E2E_PREVIOUS_COMMIT` is unset (the upgrade check is then skipped);
    /// the other variables are required with it.
    pub fn from_env() -> Result<Option<Self>> {
        let Ok(commit) = std::env::var("SPEAR_E2E_PREVIOUS_COMMIT") else { return Ok(None) };
        let var = |name: &str| {
            std::env::var(name)
                .with_context(|| format!("{name} must be set with SPEAR_E2E_PREVIOUS_COMMIT (hack/skew.sh)"))
        };
        Ok(Some(Previous {
            commit,
            operator: var("SPEAR_E2E_PREVIOUS_OPERATOR_IMAGE")?,
            spearlet: var("SPEAR_E2E_PREVIOUS_SPEARLET_IMAGE")?,
            chart: PathBuf::from(var("SPEAR_E2E_PREVIOUS_CHART")?),
        }))
    }
}

/// The pod started under the previous release.
pub struct Started {
    ns: String,
    pod: String,
    uid: String,
}

/// Installs the previous release and starts an injected pod under it; returns the pod, and the
/// namespace in `made` (for the cleanup).
pub async fn start_under_previous(
    helm: &std::path::Path,
    client: &kube::Client,
    app_image: &str,
    mcp_servers_image: Option<&str>,
    previous: &Previous,
    made: &mut Vec<String>,
    report: &mut Report,
) -> Result<Started> {
    install_chart(helm, &previous.chart.to_string_lossy(), &previous.operator, &previous.spearlet, &[])?;
    report.ok(&format!("previous release installed ({}: its chart and images)", &previous.commit[..12]));

    let ns = create_namespace(client, "spear-e2e-previous-", true).await?;
    made.push(ns.clone());
    let text = std::fs::read_to_string(repo().join("examples/registry/everything.yaml"))?;
    let mut server = manifest::parse(&text)
        .documents
        .into_iter()
        .find_map(|doc| match doc.object {
            Object::Server(s) if s.metadata.name.as_deref() == Some("everything") => Some(s),
            _ => None,
        })
        .context("examples/registry/everything.yaml defines the McpServer everything")?;
    if let Some(image) = mcp_servers_image {
        localize(&mut server, image);
    }
    Api::<McpServer>::namespaced(client.clone(), &ns).create(&PostParams::default(), &server).await?;
    let profile: McpProfile =
        serde_json::from_value(json!({"metadata": {"name": PROFILE}, "spec": {"servers": ["everything"]}}))?;
    Api::<McpProfile>::namespaced(client.clone(), &ns).create(&PostParams::default(), &profile).await?;
    Api::<Deployment>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &app_deployment_of(APP, app_image, PROFILE))
        .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let pod = ready_pod(&pods, &format!("app={APP}"), POD_READY_TIMEOUT).await?;
    let init_image = init_image(&pod)?;
    ensure!(init_image == previous.spearlet, "the previous operator injected {init_image}, not {}", previous.spearlet);
    let started = Started {
        ns,
        pod: pod.metadata.name.clone().context("a pod has a name")?,
        uid: pod.metadata.uid.clone().context("a pod has a uid")?,
    };
    let echo = driver(client, &started).call(ECHO, &json!({"message": ECHO_MESSAGE})).await?;
    ensure!(echo["is_error"] == false, "echo through the previous agent, before the upgrade: {echo}");
    report.ok("a pod injected by the previous operator is Ready and calls a tool through its agent");
    Ok(started)
}

/// The CRDs of this tree, applied server-side before `helm upgrade` (which leaves `crds/` alone).
pub async fn upgrade_crds(client: &kube::Client, report: &mut Report) -> Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut names = Vec::new();
    let dir = repo().join("charts/spear-mcp/crds");
    let mut files: Vec<_> = std::fs::read_dir(&dir)?.flatten().map(|e| e.path()).collect();
    files.sort();
    for path in files {
        let crd: CustomResourceDefinition = serde_yaml::from_str(&std::fs::read_to_string(&path)?)
            .with_context(|| format!("{} is a CustomResourceDefinition", path.display()))?;
        let name = crd.metadata.name.clone().context("a CRD has a name")?;
        crds.patch(&name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&crd)).await?;
        names.push(name);
    }
    report.ok(&format!("upgrade: this tree's CRDs applied server-side ({})", names.join(", ")));
    Ok(())
}

/// After the upgrade: the same pod, never restarted, still runs the previous agent and serves.
pub async fn check_after_upgrade(
    client: &kube::Client,
    operator_image: &str,
    previous: &Previous,
    started: &Started,
    report: &mut Report,
) -> Result<()> {
    // The previous operator's pods are gone (not only the new ones Ready), so what answers below
    // is the previous agent under the new operator alone.
    let operators: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NAMESPACE);
    eventually("only operator pods of the tree under test", STATUS_TIMEOUT, || async {
        let list = operators.list(&ListParams::default().labels("app.kubernetes.io/component=operator")).await?;
        let images: Vec<String> = list
            .items
            .iter()
            .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter().filter_map(|c| c.image.clone())))
            .collect();
        let done = !images.is_empty() && images.iter().all(|i| i == operator_image);
        Ok((done.then_some(()), format!("operator pods run {images:?}")))
    })
    .await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), &started.ns);
    let pod = pods.get(&started.pod).await?;
    ensure!(pod.metadata.uid.as_deref() == Some(started.uid.as_str()), "the previous release's pod was replaced");
    ensure!(is_ready(&pod), "the previous release's pod is not Ready after the upgrade");
    ensure!(init_image(&pod)? == previous.spearlet, "the pod's agent is no longer the previous one");
    ensure!(restarts(&pod, AGENT_CONTAINER) == 0, "the previous agent restarted during the upgrade");
    let driver = driver(client, started);
    let tools = driver.tools().await?;
    ensure!(tools.iter().any(|t| t == ECHO), "{ECHO} not listed by the previous agent after the upgrade: {tools:?}");
    let echo = driver.call(ECHO, &json!({"message": ECHO_MESSAGE})).await?;
    ensure!(
        echo["is_error"] == false && echo["text"].as_str().is_some_and(|t| t.contains(ECHO_MESSAGE)),
        "echo through the previous agent after the upgrade: {echo}"
    );
    report.ok(&format!(
        "upgrade: the pod injected by the previous release ({}) keeps its agent and serves {} tools under the new operator",
        &previous.commit[..12],
        tools.len()
    ));
    Ok(())
}

fn init_image(pod: &Pod) -> Result<String> {
    pod.spec
        .as_ref()
        .and_then(|s| s.init_containers.as_ref())
        .and_then(|c| c.iter().find(|c| c.name == INIT_CONTAINER))
        .and_then(|c| c.image.clone())
        .context("the pod has the spearlet init container")
}

fn driver(client: &kube::Client, started: &Started) -> Driver {
    Driver { client: client.clone(), ns: started.ns.clone(), pod: started.pod.clone() }
}
