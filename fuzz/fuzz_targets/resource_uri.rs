//! The resource-URI decision (`src/policy/resource_uri.rs` through `src/policy/items.rs`) as the
//! doors make it: a client's `spear://<server>/<uri>` parsed, then decided. Registry: server
//! `files` exposes `file:///D/srv/docs/*` but not `file:///D/srv/docs/private/*`; server `any`
//! exposes every URI but `file:///secret/*`.
//!
//! Input: text (the bytes, lossily), asked as a URI of `files`, of `any`, and as a whole client
//! URI.
//!
//! Properties of every allowed URI:
//! - it is decided on exactly the string the server receives: the client's URI is
//!   `spear://<server>/` followed by it, byte for byte;
//! - it has a scheme, no segment of dots (`.`, `..`, also ended by `;`, `?`, `#`, `&`, `=`, `,`)
//!   and no `//` after the authority, no backslash or control character, and every `%` starts an
//!   escape of two hex digits that is not an unreserved character, `/` or `\`;
//! - what a server that resolves paths opens for it (the path, percent-decoded, `\` as `/`, then
//!   `.`, `..` and empty segments resolved, as `tests/servers/path_resolving_server.py` does) is
//!   what the patterns matched: for `files`, in `/D/srv/docs` and not in `/D/srv/docs/private/`;
//!   for a `file:` URI of `any`, not in `/secret/`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spear::fuzzing::Effective;

const REGISTRY: &str = r#"
apiVersion: mcp.spear.dev/v1alpha1
kind: McpServer
metadata: {name: files}
spec:
  transport: stdio
  stdio: {command: server}
  allowedTools: ["*"]
  allowedResources: ["file:///D/srv/docs/*"]
  deniedResources: ["file:///D/srv/docs/private/*"]
---
apiVersion: mcp.spear.dev/v1alpha1
kind: McpServer
metadata: {name: any}
spec:
  transport: stdio
  stdio: {command: server}
  allowedTools: ["*"]
  allowedResources: ["*"]
  deniedResources: ["file:///secret/*"]
---
apiVersion: mcp.spear.dev/v1alpha1
kind: McpProfile
metadata: {name: p}
spec:
  servers: [files, any]
"#;

fn effective() -> &'static Effective {
    static SET: OnceLock<Effective> = OnceLock::new();
    SET.get_or_init(|| {
        let tools = [("files", "read"), ("any", "read")]
            .into_iter()
            .map(|(server, tool)| (server.to_string(), vec![tool.to_string()]))
            .collect();
        Effective::new(REGISTRY, "p", &tools, None, &[]).expect("the registry compiles")
    })
}

/// (scheme, authority, path, rest from `?` or `#`), split as RFC 3986 appendix B does.
fn split(uri: &str) -> Option<(&str, Option<&str>, &str, &str)> {
    let colon = uri.find(':')?;
    let scheme = &uri[..colon];
    if scheme.is_empty() || scheme.contains(['/', '?', '#']) {
        return None;
    }
    let rest = &uri[colon + 1..];
    let (authority, rest) = match rest.strip_prefix("//") {
        Some(hier) => {
            let end = hier.find(['/', '?', '#']).unwrap_or(hier.len());
            (Some(&hier[..end]), &hier[end..])
        }
        None => (None, rest),
    };
    let end = rest.find(['?', '#']).unwrap_or(rest.len());
    Some((scheme, authority, &rest[..end], &rest[end..]))
}

fn hex(byte: u8) -> Option<u8> {
    (byte as char).to_digit(16).map(|d| d as u8)
}

/// The path a careless server opens for `path`: percent-decoded, `\` as `/`, then resolved.
fn resolve(path: &str) -> String {
    let bytes = path.as_bytes();
    let mut decoded = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let (Some(h), Some(l)) = (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            decoded.push(h * 16 + l);
            i += 3;
            continue;
        }
        decoded.push(bytes[i]);
        i += 1;
    }
    let text = String::from_utf8_lossy(&decoded).replace('\\', "/");
    let mut segments: Vec<&str> = Vec::new();
    for segment in text.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                segments.pop();
            }
            other => segments.push(other),
        }
    }
    format!("/{}", segments.join("/"))
}

/// The spelling properties of an allowed URI (see the header).
fn assert_plain(uri: &str) {
    let (scheme, _, path, tail) = split(uri).unwrap_or_else(|| panic!("allowed without a scheme: {uri:?}"));
    assert!(scheme.bytes().next().is_some_and(|b| b.is_ascii_lowercase()), "scheme of {uri:?}");
    assert!(!uri.contains('\\') && !uri.chars().any(|c| c.is_control()), "allowed {uri:?}");
    let after = format!("{path}{tail}");
    assert!(!after.contains("//"), "allowed an empty segment: {uri:?}");
    for segment in after.split(['/', ';', '?', '#', '&', '=', ',']) {
        assert!(segment.is_empty() || !segment.bytes().all(|b| b == b'.'), "allowed a dot segment: {uri:?}");
    }
    let bytes = uri.as_bytes();
    for (i, _) in uri.match_indices('%') {
        let (Some(h), Some(l)) = (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        else {
            panic!("allowed a bare '%': {uri:?}");
        };
        let value = h * 16 + l;
        let plain = value.is_ascii_alphanumeric() || matches!(value, b'-' | b'.' | b'_' | b'~' | b'/' | b'\\');
        assert!(!plain, "allowed an encoded {:?}: {uri:?}", value as char);
    }
}

fn check(server: &str, id: &str) {
    let Ok((decided_server, uri)) = effective().decide_resource(id) else { return };
    assert_eq!(format!("spear://{decided_server}/{uri}"), id, "decided on another string than the one sent");
    assert_eq!(decided_server, server);
    assert_plain(&uri);
    let Some((scheme, _, path, _)) = split(&uri) else { return };
    let opened = resolve(path);
    match server {
        "files" => {
            let inside = opened == "/D/srv/docs" || opened.starts_with("/D/srv/docs/");
            assert!(inside && !opened.starts_with("/D/srv/docs/private/"), "{uri:?} opens {opened:?}");
        }
        _ if scheme == "file" => assert!(!opened.starts_with("/secret/"), "{uri:?} opens {opened:?}"),
        _ => {}
    }
}

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    check("files", &format!("spear://files/{text}"));
    check("any", &format!("spear://any/{text}"));
    if let Some(rest) = text.strip_prefix("spear://") {
        let server = rest.split('/').next().unwrap_or_default();
        check(server, &text);
    }
});
