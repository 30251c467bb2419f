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

/// Paths whose live value differs from what we render (metadata and status aside): a
/// field we manage that holds another value, as server-side apply sees it. A rendered
/// zero value (`false`, `0`, `""`, `[]`, `{}`, `null`, or an object of only those) that the
/// live object lacks is no drift: the API server omits such values for Go's `omitempty`
/// fields (a Service's `publishNotReadyAddresses: false`), and reporting them would patch
/// the object again at every reconcile.
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
            (w, None) if is_zero(w) => {}
            _ => out.push(path.to_string()),
        }
    }
    let mut out = Vec::new();
    walk("", rendered, Some(live), &mut out);
    out
}

/// Whether `value` is what Go's `encoding/json` leaves out of an `omitempty` field: `false`,
/// `0`, `""`, an empty list or object, `null`; and an object of nothing but such values.
fn is_zero(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_zero),
    }
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

    /// A provider that renders default values (a Service's `publishNotReadyAddresses:
    /// false`, `0`, `""`, `[]`) converges: the API server leaves them out, and that is no
    /// drift. A real edit of a field we set still is.
    #[test]
    fn rendered_zero_values_the_server_omits_are_no_drift() {
        let rendered = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"publishNotReadyAddresses": false, "sessionAffinityConfig": {"clientIP": {"timeoutSeconds": 0}},
                     "externalName": "", "externalIPs": [], "selector": {}, "type": "ClusterIP",
                     "ports": [{"name": "http", "port": 80, "nodePort": 0}]}});
        let live = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"type": "ClusterIP", "clusterIP": "10.0.0.7",
                     "ports": [{"name": "http", "port": 80, "protocol": "TCP", "targetPort": 80}]}});
        assert!(
            drifted_value_paths(&rendered, &live).is_empty(),
            "{:?}",
            drifted_value_paths(&rendered, &live)
        );
        let edited = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
            "spec": {"type": "ClusterIP", "publishNotReadyAddresses": true,
                     "ports": [{"name": "http", "port": 80}]}});
        assert_eq!(
            drifted_value_paths(&rendered, &edited),
            ["spec.publishNotReadyAddresses"]
        );
        let gone =
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}});
        assert_eq!(
            drifted_value_paths(&rendered, &gone),
            ["spec.ports", "spec.type"]
        );
    }
}
