//! Comparisons of what is rendered with what is live (pure): whether an object is as
//! last applied, whether it drifted and where, whether it must be created anew.

use kube::ResourceExt;
use kube::api::DynamicObject;
use serde_json::Value;

use crate::labels;

/// Whether `live` is the object as we rendered it last time we applied it.
pub(crate) fn same_rendering(rendered: &DynamicObject, live: &DynamicObject) -> bool {
    let hash = |o: &DynamicObject| o.annotations().get(labels::RENDERED_HASH).cloned();
    hash(rendered).is_some() && hash(rendered) == hash(live)
}

/// Why the live primary object must be deleted and created anew, if it must: an identity
/// field of the ModelDeployment changed, or a value its upstream declares immutable. A
/// live object without the annotation (made by an older provider) is left alone.
pub(crate) fn recreate_reason(
    live: &DynamicObject,
    rendered: &DynamicObject,
) -> Option<&'static str> {
    let differs = |key: &str| {
        let live = live.annotations().get(key)?;
        (rendered.annotations().get(key) != Some(live)).then_some(())
    };
    if differs(labels::IDENTITY).is_some() {
        return Some("an identity field changed");
    }
    if differs(labels::IMMUTABLE_HASH).is_some() {
        return Some("a field the upstream cannot update changed");
    }
    None
}

/// Paths whose live value differs from what we render (metadata and status aside).
pub(crate) fn drifted_paths(rendered: &DynamicObject, live: &DynamicObject) -> Vec<String> {
    match (serde_json::to_value(rendered), serde_json::to_value(live)) {
        (Ok(r), Ok(l)) => drifted_value_paths(&r, &l),
        _ => Vec::new(),
    }
}

pub(crate) fn drifted_value_paths(rendered: &Value, live: &Value) -> Vec<String> {
    fn walk(path: &str, want: &Value, have: Option<&Value>, out: &mut Vec<String>) {
        match (want, have) {
            (Value::Object(w), Some(Value::Object(h))) => {
                for (k, v) in w {
                    if path.is_empty()
                        && (k == "metadata" || k == "status" || k == "apiVersion" || k == "kind")
                    {
                        continue;
                    }
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(&p, v, h.get(k), out);
                }
            }
            (Value::Array(w), Some(Value::Array(h))) if w.len() == h.len() => {
                for (i, (a, b)) in w.iter().zip(h).enumerate() {
                    walk(&format!("{path}[{i}]"), a, Some(b), out);
                }
            }
            (Value::Number(a), Some(Value::Number(b))) if a.as_f64() == b.as_f64() => {}
            (w, Some(h)) if w == h => {}
            _ => out.push(path.to_string()),
        }
    }
    let mut out = Vec::new();
    walk("", rendered, Some(live), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn drift_is_a_changed_value_we_set() {
        let rendered = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                              "spec": {"replicas": 2, "containers": [{"name": "c", "args": ["--a"]}]}});
        let same_plus_defaults = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a", "uid": "x"},
                                        "spec": {"replicas": 2.0, "extra": true, "containers": [{"name": "c", "args": ["--a"], "image": "i"}]},
                                        "status": {"ready": true}});
        assert!(drifted_value_paths(&rendered, &same_plus_defaults).is_empty());
        let edited = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"},
                            "spec": {"replicas": 5, "containers": [{"name": "c", "args": ["--b"]}]}});
        assert_eq!(
            drifted_value_paths(&rendered, &edited),
            ["spec.containers[0].args[0]", "spec.replicas"]
        );
        let removed = json!({"apiVersion": "v", "kind": "K", "metadata": {"name": "a"}, "spec": {"replicas": 2}});
        assert_eq!(
            drifted_value_paths(&rendered, &removed),
            ["spec.containers"]
        );
    }
}
