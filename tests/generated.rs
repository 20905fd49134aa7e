//! Generated files stay in sync with the Rust types (a stale copy would ship a schema the code
//! does not match): `crds/` is rendered from `McpServer`/`McpProfile`. Run `SPEAR_BLESS=1 cargo test --test generated` to rewrite them.
#![allow(clippy::too_many_lines, reason = "a test or a bench is one scenario, read top to bottom")]
#![allow(clippy::disallowed_macros, reason = "tests and benches print their figures and diagnostics")]

use std::path::PathBuf;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn crds_directory_matches_the_rust_types() {
    let rendered = spear::api::crd::render().expect("CRDs must render to YAML");
    let stale = spear::testing::golden::check_dir(&repo().join("crds"), "yaml", &rendered);
    assert!(
        stale.is_empty(),
        "crds/ is stale:\n{}\nrun `SPEAR_BLESS=1 cargo test --test generated` (or `spear-operator crds --output-dir crds`) and commit the result",
        stale.join("\n")
    );
}

#[test]
fn crds_are_structural() {
    // Structural: every property typed, no preserve-unknown-fields below spec/status; the API
    // server would refuse the CRD (or prune silently) otherwise.
    fn walk(path: &str, schema: &serde_json::Value, problems: &mut Vec<String>) {
        let Some(obj) = schema.as_object() else { return };
        let int_or_string = obj.get("x-kubernetes-int-or-string") == Some(&serde_json::Value::Bool(true));
        if !obj.contains_key("type") && !int_or_string {
            problems.push(format!("{path}: no type"));
        }
        if obj.contains_key("x-kubernetes-preserve-unknown-fields") {
            problems.push(format!("{path}: preserves unknown fields"));
        }
        for key in ["anyOf", "oneOf", "allOf"] {
            if obj.contains_key(key) && !int_or_string {
                problems.push(format!("{path}: uses {key}"));
            }
        }
        if let Some(props) = obj.get("properties").and_then(|p| p.as_object()) {
            for (name, sub) in props {
                walk(&format!("{path}.{name}"), sub, problems);
            }
        }
        if let Some(items) = obj.get("items") {
            walk(&format!("{path}[]"), items, problems);
        }
        if let Some(extra) = obj.get("additionalProperties").filter(|v| v.is_object()) {
            walk(&format!("{path}{{}}"), extra, problems);
        }
    }
    for crd in spear::api::crd::definitions() {
        let mut problems = Vec::new();
        for version in &crd.spec.versions {
            let schema = version.schema.as_ref().and_then(|s| s.open_api_v3_schema.as_ref()).expect("CRD has a schema");
            let json = serde_json::to_value(schema).expect("schema serializes");
            walk(&crd.spec.names.kind, &json, &mut problems);
            // A binding has no status, as an RBAC RoleBinding has none: nothing observes it but
            // the gateway, which logs what it ignores.
            let has_status = version.subresources.as_ref().and_then(|s| s.status.as_ref()).is_some();
            assert_eq!(
                has_status,
                crd.spec.names.kind != "McpProfileBinding",
                "{}: status subresource",
                crd.spec.names.kind
            );
        }
        assert!(problems.is_empty(), "{} is not structural: {problems:#?}", crd.spec.names.kind);
    }
}
