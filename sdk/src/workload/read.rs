//! What every workload reader reads of a live object: its spec and status as JSON, their
//! counters, its generations, its conditions.

use kube::api::DynamicObject;
use serde_json::Value;

/// A live workload's parts, read leniently: a missing or mistyped field reads as absent.
pub(crate) struct Live<'a> {
    pub(crate) spec: Option<&'a Value>,
    pub(crate) status: Option<&'a Value>,
    /// `metadata.generation`.
    pub(crate) generation: i64,
}

impl<'a> Live<'a> {
    pub(crate) fn of(object: &'a DynamicObject) -> Self {
        Self {
            spec: object.data.get("spec"),
            status: object.data.get("status"),
            generation: object.metadata.generation.unwrap_or(0),
        }
    }

    /// A status counter (0 when absent, as the controllers omit zeros).
    pub(crate) fn count(&self, key: &str) -> i32 {
        int(self.status, key).unwrap_or(0)
    }

    /// `spec.replicas`, 1 when unset (as the API server defaults it).
    pub(crate) fn desired(&self) -> i32 {
        int(self.spec, "replicas").unwrap_or(1)
    }

    /// `status.observedGeneration` (0 when absent).
    pub(crate) fn observed_generation(&self) -> i64 {
        self.status
            .and_then(|s| s.get("observedGeneration"))
            .and_then(Value::as_i64)
            .unwrap_or(0)
    }

    /// Whether the controller has not written a status for the current generation yet.
    pub(crate) fn unobserved(&self) -> bool {
        self.status.is_none() || self.generation > self.observed_generation()
    }

    /// `spec.updateStrategy.type` (`RollingUpdate` when unset, the API server's default).
    pub(crate) fn update_strategy(&self) -> &'a str {
        self.spec
            .and_then(|s| s.pointer("/updateStrategy/type"))
            .and_then(Value::as_str)
            .unwrap_or("RollingUpdate")
    }

    /// The status condition of `type_`.
    pub(crate) fn condition(&self, type_: &str) -> Option<&'a Value> {
        self.status
            .and_then(|s| s.get("conditions"))
            .and_then(Value::as_array)
            .and_then(|c| {
                c.iter()
                    .find(|c| c.get("type").and_then(Value::as_str) == Some(type_))
            })
    }

    /// The condition of `type_` when its status is `True`.
    pub(crate) fn true_condition(&self, type_: &str) -> Option<&'a Value> {
        self.condition(type_)
            .filter(|c| c.get("status").and_then(Value::as_str) == Some("True"))
    }
}

/// An integer field of `value` that fits an `i32`.
pub(crate) fn int(value: Option<&Value>, key: &str) -> Option<i32> {
    value
        .and_then(|v| v.get(key))
        .and_then(Value::as_i64)
        .and_then(|n| i32::try_from(n).ok())
}

/// A string field of a condition (empty when absent).
pub(crate) fn text(condition: &Value, key: &str) -> String {
    condition
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string()
}
