//! `manifests/install.yaml` against the real test control plane: every object passes a
//! server-side dry run. The chart's rendering itself is checked in `chart.rs` (no API server).

use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, DynamicObject, GroupVersionKind, ObjectMeta, Patch, PatchParams, PostParams};
use kube::discovery::{self, Scope};
use spear::testing::control_plane::ControlPlane;

use crate::chart::{NAMESPACE, objects, repo};

/// Field manager of the dry-run writes.
const FIELD_MANAGER: &str = "spear-test-chart";

/// Every object of `manifests/install.yaml` is accepted by a real API server (schema, defaults,
/// CEL in CRDs and webhook matchConditions, RBAC validation), without being stored.
#[tokio::test]
async fn every_installed_object_passes_a_server_side_dry_run() {
    let install =
        std::fs::read_to_string(repo().join("manifests/install.yaml")).expect("manifests/install.yaml exists");
    let client = ControlPlane::shared().client().await;

    // Namespaced objects name spear-system; the namespace itself is real (creating one is cheap
    // and harmless to other tests), the objects are only dry-run.
    let namespace = Namespace {
        metadata: ObjectMeta { name: Some(NAMESPACE.into()), ..ObjectMeta::default() },
        ..Namespace::default()
    };
    match Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await {
        Ok(_) => {}
        Err(kube::Error::Api(status)) if status.code == 409 => {}
        Err(e) => panic!("creating namespace {NAMESPACE} must work: {e}"),
    }

    let create = PostParams { dry_run: true, field_manager: Some(FIELD_MANAGER.into()) };
    let apply = PatchParams::apply(FIELD_MANAGER).force().dry_run();
    let mut failures = Vec::new();
    let mut checked = 0;
    for value in objects(&install) {
        let object: DynamicObject = serde_json::from_value(value).expect("each object parses as a DynamicObject");
        let types = object.types.clone().expect("each object has apiVersion and kind");
        let name = object.metadata.name.clone().expect("each object has a name");
        let what = format!("{} {name}", types.kind);
        let gvk = GroupVersionKind::try_from(&types).expect("apiVersion parses");
        let (resource, capabilities) = discovery::pinned_kind(&client, &gvk).await.unwrap_or_else(|e| {
            panic!("{what}: the API server does not serve {}/{}: {e}", types.api_version, types.kind)
        });
        let api: Api<DynamicObject> = match capabilities.scope {
            Scope::Namespaced => {
                let ns = object.metadata.namespace.as_deref();
                assert_eq!(ns, Some(NAMESPACE), "{what}: namespaced objects must name their namespace");
                Api::namespaced_with(client.clone(), NAMESPACE, &resource)
            }
            Scope::Cluster => {
                assert!(object.metadata.namespace.is_none(), "{what}: cluster-scoped but names a namespace");
                Api::all_with(client.clone(), &resource)
            }
        };
        // Objects that already exist here (the CRDs the launcher installs, roles another test
        // applied) are checked by a dry-run server-side apply instead, which validates the same.
        let result = match api.create(&create, &object).await {
            Err(kube::Error::Api(status)) if status.code == 409 => {
                api.patch(&name, &apply, &Patch::Apply(&object)).await.map(drop)
            }
            other => other.map(drop),
        };
        if let Err(e) = result {
            failures.push(format!("{what}: {e}"));
        }
        checked += 1;
    }
    assert!(checked >= 10, "install.yaml holds only {checked} objects");
    assert!(failures.is_empty(), "the API server refused objects of manifests/install.yaml:\n{}", failures.join("\n"));
}
