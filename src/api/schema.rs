//! Hand-shaped schema pieces the derive cannot express: list-maps over k8s-openapi types.

use k8s_openapi::api::core::v1::EnvVar;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde_json::json;

/// `status.conditions`: a list-map keyed by `type`, so server-side apply merges by condition type.
pub(crate) fn conditions(generator: &mut SchemaGenerator) -> Schema {
    let mut schema = Vec::<Condition>::json_schema(generator);
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["type"]));
    schema
}

/// `stdio.env`: container-style env vars, unique by name, each with a value or a source.
pub(crate) fn env_list(generator: &mut SchemaGenerator) -> Schema {
    let mut item = EnvVar::json_schema(generator);
    item.insert(
        "x-kubernetes-validations".into(),
        json!([{
            "rule": "!(has(self.value) && has(self.valueFrom))",
            "message": "set at most one of value and valueFrom",
        }]),
    );
    let mut schema = Vec::<EnvVar>::json_schema(generator);
    schema.insert("items".into(), item.to_value());
    schema.insert("maxItems".into(), json!(128));
    schema.insert("x-kubernetes-list-type".into(), json!("map"));
    schema.insert("x-kubernetes-list-map-keys".into(), json!(["name"]));
    schema
}
