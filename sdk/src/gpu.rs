//! The GPUs of one serving replica, for every provider that puts GPUs into a pod's
//! resources or its upstream's config: one home for which spec field a role's GPUs come
//! from and which extended resource they are.
//!
//! - A role's GPUs: `resources.gpu` when serving aggregated, `scaling.prefill.gpu` and
//!   `scaling.decode.gpu` when disaggregated (the API's rule: the CRD refuses
//!   `resources.gpu` together with the roles' own). Absent counts as 0.
//! - The resource: `gpu.type` (`nvidia.com/gpu` by default; AMD and Intel name their own,
//!   `amd.com/gpu`, `gpu.intel.com/i915`), and the default when it is empty: the CRD
//!   accepts `type: ""`, which as a resource name the API server would refuse.
//!
//! Used by [`crate::engine::gpu_resources`] (the operator-free provider's pods), the
//! Dynamo provider (worker resources of both DynamoGraphDeployment versions), the KubeRay
//! provider (`num-gpus` and the worker group's limits), the KAITO provider (llama.cpp
//! template resources, and the vLLM preset's GPU-type warning) and the kernel-cache
//! warm-up (which nodes can hold a deployment's pods). How each puts them in its format
//! (a string or an integer quantity, requests as well as limits, Dynamo v1alpha1's own
//! `gpu`/`gpuType`) is the provider's.

use crate::api::{DEFAULT_GPU_TYPE, GpuSpec, ModelDeploymentSpec, ServingMode};

/// A serving role: what one kind of replica does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Prefill and decode in one replica (`serving.mode: aggregated`).
    Aggregated,
    /// Prefill replicas (`serving.mode: disaggregated`).
    Prefill,
    /// Decode replicas (`serving.mode: disaggregated`).
    Decode,
}

impl Role {
    /// The roles of a serving mode: aggregated, or prefill then decode.
    pub fn of(mode: ServingMode) -> &'static [Role] {
        match mode {
            ServingMode::Aggregated => &[Role::Aggregated],
            ServingMode::Disaggregated => &[Role::Prefill, Role::Decode],
        }
    }

    /// `aggregated`, `prefill` or `decode`.
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Aggregated => "aggregated",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// The GPUs of one replica.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Gpus {
    /// How many (0: none).
    pub count: i32,
    /// The extended resource they are (`nvidia.com/gpu`).
    pub resource: String,
}

impl Gpus {
    /// No GPUs.
    pub fn none() -> Self {
        Self {
            count: 0,
            resource: DEFAULT_GPU_TYPE.to_string(),
        }
    }
}

/// The extended resource of `gpu`: its `type`, or `nvidia.com/gpu` when that is empty.
pub fn resource_name(gpu: &GpuSpec) -> &str {
    if gpu.type_.is_empty() {
        DEFAULT_GPU_TYPE
    } else {
        &gpu.type_
    }
}

/// The GPU spec of one replica of `role`: `resources.gpu` (aggregated) or the role's own
/// `scaling.<role>.gpu`.
pub fn spec_of(spec: &ModelDeploymentSpec, role: Role) -> Option<&GpuSpec> {
    match role {
        Role::Aggregated => spec.resources.as_ref().and_then(|r| r.gpu.as_ref()),
        Role::Prefill => spec.scaling.prefill.as_ref().and_then(|c| c.gpu.as_ref()),
        Role::Decode => spec.scaling.decode.as_ref().and_then(|c| c.gpu.as_ref()),
    }
}

/// The GPUs of one replica of `role` (count 0 when the spec gives none).
pub fn per_replica(spec: &ModelDeploymentSpec, role: Role) -> Gpus {
    spec_of(spec, role).map_or_else(Gpus::none, |g| Gpus {
        count: g.count,
        resource: resource_name(g).to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(value: serde_json::Value) -> ModelDeploymentSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn aggregated_gpus_come_from_resources() {
        let s = spec(json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 2, "type": "amd.com/gpu"}}}));
        assert_eq!(Role::of(s.serving.mode), [Role::Aggregated]);
        assert_eq!(
            per_replica(&s, Role::Aggregated),
            Gpus {
                count: 2,
                resource: "amd.com/gpu".into()
            }
        );
        assert_eq!(per_replica(&s, Role::Prefill), Gpus::none());
    }

    #[test]
    fn disaggregated_roles_have_their_own_gpus() {
        let s = spec(json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "serving": {"mode": "disaggregated"},
            "scaling": {"prefill": {"gpu": {"count": 1}}, "decode": {"gpu": {"count": 4, "type": "gpu.intel.com/i915"}}}}));
        assert_eq!(Role::of(s.serving.mode), [Role::Prefill, Role::Decode]);
        let got: Vec<_> = Role::of(s.serving.mode)
            .iter()
            .map(|r| (r.as_str(), per_replica(&s, *r)))
            .collect();
        assert_eq!(
            got,
            [
                (
                    "prefill",
                    Gpus {
                        count: 1,
                        resource: "nvidia.com/gpu".into()
                    }
                ),
                (
                    "decode",
                    Gpus {
                        count: 4,
                        resource: "gpu.intel.com/i915".into()
                    }
                ),
            ]
        );
    }

    /// The CRD accepts `type: ""`; an empty resource name would make the pod invalid.
    #[test]
    fn an_empty_type_is_the_default_resource() {
        let s = spec(json!({"model": {"id": "a/b"}, "engine": {"type": "vllm"},
            "resources": {"gpu": {"count": 1, "type": ""}}}));
        assert_eq!(per_replica(&s, Role::Aggregated).resource, "nvidia.com/gpu");
        assert_eq!(
            per_replica(&spec(json!({"model": {}, "engine": {}})), Role::Aggregated),
            Gpus::none()
        );
    }
}
