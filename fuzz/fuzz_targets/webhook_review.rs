//! The mutating webhook's review (`src/operator/webhook/mod.rs` `review`, `src/operator/inject.rs`
//! `mutate`) on arbitrary AdmissionReview JSON, with the lookup answering the registry in
//! `examples/registry/` (servers that the input may replace with its own stdio servers).
//!
//! Input: the AdmissionReview body, then optionally a 0 byte and (arbitrary-encoded) the
//! namespace label, native sidecars or not, and replacement servers; without them, an enabled
//! namespace, native sidecars and the example servers.
//!
//! Properties:
//! - the review never panics and fails only for a request without a namespace: every other
//!   failure (`InjectError`: the patch does not apply, the patched pod does not parse) is a bug;
//! - a JSON patch, when returned, is RFC 6902 that applies to the pod as the webhook read it and
//!   to the pod as the request carried it (when it has its `spec.containers` list, as every pod
//!   the API server sends does); the patched pod is a Pod with the agent and the marker, and the
//!   pod's own containers are still there, in order;
//! - injection is idempotent: the patched pod, reviewed again, is admitted unchanged;
//! - a denial is `allowed: false`, 403, with a message.
#![no_main]

use std::collections::BTreeMap;

use arbitrary::{Arbitrary, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use spear::fuzzing::{Review, parse_manifest, webhook_review};

const REGISTRY: &str = spear::fuzzing::EXAMPLE_REGISTRY;
const NAMES: &[&str] = &["filesystem", "everything", "everything-http"];

#[derive(Arbitrary, Debug)]
struct Stdio {
    name: u8,
    image: Option<String>,
    command: String,
    args: Vec<String>,
    env: Vec<(String, Option<String>)>,
}

#[derive(Arbitrary, Debug)]
struct Setup {
    disabled: bool,
    classic: bool,
    servers: Vec<Stdio>,
}

fn setup(rest: Option<&[u8]>) -> Option<Setup> {
    match rest {
        Some(rest) => Setup::arbitrary_take_rest(Unstructured::new(rest)).ok(),
        None => Some(Setup { disabled: false, classic: false, servers: Vec::new() }),
    }
}

fn names(list: Option<&Value>) -> Vec<String> {
    list.and_then(Value::as_array)
        .map(|l| l.iter().filter_map(|c| c.get("name").and_then(Value::as_str)).map(str::to_string).collect())
        .unwrap_or_default()
}

fn review(body: &[u8], labels: &BTreeMap<String, String>, profile: &Value, servers: &[Value], native: bool) -> Review {
    webhook_review(body, labels.clone(), Some(profile.clone()), servers.to_vec(), native)
}

fuzz_target!(|data: &[u8]| {
    let (body, rest) = match data.iter().position(|&b| b == 0) {
        Some(i) => (&data[..i], Some(&data[i + 1..])),
        None => (data, None),
    };
    let Some(setup) = setup(rest) else { return };

    let read = parse_manifest(REGISTRY);
    let profile = read.documents.iter().find(|d| d["metadata"]["name"] == "developer").expect("profile").clone();
    let mut servers: BTreeMap<String, Value> = read
        .documents
        .iter()
        .filter(|d| d["kind"] == "McpServer")
        .map(|d| (d["metadata"]["name"].as_str().unwrap_or_default().to_string(), d.clone()))
        .collect();
    for s in &setup.servers {
        let name = NAMES[usize::from(s.name) % NAMES.len()];
        let env: Vec<Value> = s
            .env
            .iter()
            .map(|(n, v)| match v {
                Some(v) => json!({"name": n, "value": v}),
                None => json!({"name": n, "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}),
            })
            .collect();
        let server = json!({"apiVersion": "mcp.spear.dev/v1alpha1", "kind": "McpServer", "metadata": {"name": name},
            "spec": {"transport": "stdio", "allowedTools": ["*"],
                "stdio": {"image": s.image, "command": s.command, "args": s.args, "env": env}}});
        servers.insert(name.to_string(), server);
    }
    let servers: Vec<Value> = servers.into_values().collect();
    let mut labels = BTreeMap::new();
    if !setup.disabled {
        labels.insert("mcp.spear.dev/injection".to_string(), "enabled".to_string());
    }
    let native = !setup.classic;

    let (response, pod) = match review(body, &labels, &profile, &servers, native) {
        Review::BadRequest => return,
        Review::Error(e) => {
            assert!(e.contains("names no namespace"), "the review failed: {e}");
            return;
        }
        Review::Answer { response, pod } => (response, pod),
    };
    let Some(patch) = &response.patch else {
        if !response.allowed {
            assert_eq!(response.result.code, 403);
            assert!(!response.result.message.is_empty());
        }
        return;
    };
    assert!(response.allowed, "a patch on a denial");
    let patch: json_patch::Patch = serde_json::from_slice(patch).expect("the patch is RFC 6902 JSON");
    let mut patched = pod.expect("a patch for a review without a pod");
    let original = patched.clone();
    json_patch::patch(&mut patched, &patch).expect("the patch applies to the pod the webhook read");

    // The pod as the request carried it (the API server applies the patch to its own JSON).
    let raw: Value = serde_json::from_slice(body).expect("the review parsed");
    let mut raw_pod = raw["request"]["object"].clone();
    if raw_pod["spec"]["containers"].is_array() {
        json_patch::patch(&mut raw_pod, &patch).expect("the patch applies to the pod as sent");
    }

    let annotations = &patched["metadata"]["annotations"];
    assert!(annotations.get("mcp.spear.dev/injected").is_some_and(Value::is_string), "no marker");
    let spec = &patched["spec"];
    let all: Vec<String> = [names(spec.get("containers")), names(spec.get("initContainers"))].concat();
    assert!(all.iter().any(|n| n == "spearlet"), "no agent container");
    let own = names(original["spec"].get("containers"));
    let now = names(spec.get("containers"));
    assert_eq!(&now[..own.len()], &own[..], "the pod's own containers moved");
    let own_init = names(original["spec"].get("initContainers"));
    let now_init = names(spec.get("initContainers"));
    assert_eq!(&now_init[now_init.len() - own_init.len()..], &own_init[..], "the pod's init containers moved");

    // Reviewed again, the injected pod is left alone.
    let mut again: Value = raw.clone();
    again["request"]["object"] = patched;
    let again = serde_json::to_vec(&again).expect("serializes");
    match review(&again, &labels, &profile, &servers, native) {
        Review::Answer { response, .. } => {
            assert!(response.allowed && response.patch.is_none(), "an injected pod is injected again");
        }
        Review::BadRequest => panic!("the patched pod is not a Pod"),
        Review::Error(e) => panic!("the patched pod fails review: {e}"),
    }
});
