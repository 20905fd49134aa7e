//! Every string of a JSON value, object keys included, walked with an explicit stack: a value
//! built in code has no depth limit, and recursion on it could overflow the stack.

use serde_json::{Map, Value};

/// Replaces each string (and key) `redact` rewrites; returns the sum of the counts it reports.
/// A rewritten key that collides with another key gets ` (2)`, ` (3)`... appended, so no entry
/// is lost.
pub(super) fn redact_strings(value: &mut Value, redact: &dyn Fn(&str) -> Option<(String, usize)>) -> usize {
    let mut count = 0;
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) => {
                if let Some((redacted, n)) = redact(s) {
                    *s = redacted;
                    count += n;
                }
            }
            Value::Array(items) => stack.extend(items.iter_mut()),
            Value::Object(map) => {
                count += redact_keys(map, redact);
                stack.extend(map.values_mut());
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    count
}

fn redact_keys(map: &mut Map<String, Value>, redact: &dyn Fn(&str) -> Option<(String, usize)>) -> usize {
    // Keys rarely hold anything: look first, rebuild only when one must change.
    let rewritten: Vec<(String, (String, usize))> =
        map.keys().filter_map(|key| redact(key).map(|r| (key.clone(), r))).collect();
    if rewritten.is_empty() {
        return 0;
    }
    let mut count = 0;
    for (key, (redacted, n)) in rewritten {
        count += n;
        let Some(entry) = map.remove(&key) else { continue };
        let mut free = redacted.clone();
        let mut suffix = 2;
        while map.contains_key(&free) {
            free = format!("{redacted} ({suffix})");
            suffix += 1;
        }
        map.insert(free, entry);
    }
    count
}

/// The first answer `find` gives for a string or key of `value` (keys of an object before its
/// values).
pub(super) fn find_in_strings<'v, T>(value: &'v Value, find: &dyn Fn(&'v str) -> Option<T>) -> Option<T> {
    let mut stack = vec![value];
    while let Some(value) = stack.pop() {
        match value {
            Value::String(s) => {
                if let Some(found) = find(s) {
                    return Some(found);
                }
            }
            Value::Array(items) => stack.extend(items.iter().rev()),
            Value::Object(map) => {
                if let Some(found) = map.keys().find_map(|key| find(key)) {
                    return Some(found);
                }
                stack.extend(map.values().rev());
            }
            Value::Null | Value::Bool(_) | Value::Number(_) => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn upper(s: &str) -> Option<(String, usize)> {
        s.contains("x").then(|| (s.replace('x', "X"), s.matches('x').count()))
    }

    #[test]
    fn reaches_nested_keys_and_values_and_counts() {
        let mut value = json!({"ax": [{"b": "xx"}, "y", 1, null], "c": {"dx": {"e": "x"}}});
        assert_eq!(redact_strings(&mut value, &upper), 5);
        assert_eq!(value, json!({"aX": [{"b": "XX"}, "y", 1, null], "c": {"dX": {"e": "X"}}}));
    }

    #[test]
    fn a_colliding_rewritten_key_keeps_its_entry() {
        let mut value = json!({"aX": 1, "ax": 2});
        assert_eq!(redact_strings(&mut value, &upper), 1);
        assert_eq!(value, json!({"aX": 1, "aX (2)": 2}));
    }

    #[test]
    fn finds_in_keys_and_deep_values_without_recursing() {
        let mut deep = json!("found");
        for _ in 0..100_000 {
            deep = Value::Array(vec![deep]);
        }
        let find = |s: &str| (s == "found").then_some(());
        assert_eq!(find_in_strings(&deep, &find), Some(()));
        assert_eq!(find_in_strings(&json!({"found": 1}), &find), Some(()));
        assert_eq!(find_in_strings(&json!({"a": [1, "b"]}), &find), None);
        // Dropping a deep value recurses in serde_json itself: leave it to leak in the test.
        std::mem::forget(deep);
    }
}
