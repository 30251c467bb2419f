//! `spec.model.storage`: each volume becomes a PersistentVolumeClaim volume of every Ray
//! pod (head and workers), mounted into the Ray container, because Ray Serve LLM loads
//! the model on each worker node and the head's dashboard reads the same config
//! (KubeRay passes the pod templates through unchanged; its own volumes are listed in
//! [`RESERVED_NAMES`]). Claims, paths, `readOnly` and the cache variables are the SDK's
//! rules ([`kubeairunway_sdk::storage`], with vLLM's variables from
//! [`kubeairunway_sdk::engine::VLLM`]). `/dev/shm` is KubeRay's own (see
//! [`RESERVED_PATHS`]), so the SDK's [`kubeairunway_sdk::engine::shm_volume`] is not
//! added.
//!
//! Nothing creates claims for a KubeRay deployment: `size`, `storageClassName` and
//! `accessMode` are reported as ignored, and the claim must exist.

use kubeairunway_sdk::Warning;
use kubeairunway_sdk::api::ModelDeployment;
use kubeairunway_sdk::storage::{self, Reserved};

pub use kubeairunway_sdk::storage::{
    COMPILATION_CACHE_PATH, MODEL_CACHE_PATH, env_for, pod_volumes, volume_mounts,
};

/// Volume names KubeRay gives its own volumes in Ray pods: `shared-mem` and `ray-logs`
/// (`ray-operator/controllers/ray/common/pod.go:26-31@v1.7.0`, `:25-26@v1.3.0`),
/// `ray-tls`, `ray-token`, `gcs-storage` (`utils/constant.go:168,202,207@v1.7.0`). A
/// volume of ours with such a name would be mounted where KubeRay mounts its own
/// (`addEmptyDir` reuses a volume of that name, `pod.go:1548-1569@v1.7.0`).
pub const RESERVED_NAMES: [&str; 5] = [
    "shared-mem",
    "ray-logs",
    "ray-tls",
    "ray-token",
    "gcs-storage",
];
/// Paths KubeRay mounts its own volumes at: the object store's `/dev/shm` (which it then
/// leaves out) and the logs' `/tmp/ray` (`pod.go:26-31@v1.7.0`).
pub const RESERVED_PATHS: [&str; 2] = ["/dev/shm", "/tmp/ray"];

/// Volumes that cannot be mounted, with the user-facing reason.
pub fn check(md: &ModelDeployment) -> Result<(), String> {
    storage::check(
        md,
        &Reserved {
            by: "KubeRay",
            pods: "Ray pods",
            names: &RESERVED_NAMES,
            paths: &RESERVED_PATHS,
        },
    )
}

/// The claim settings nobody acts on for KubeRay.
pub fn warnings(md: &ModelDeployment) -> Vec<Warning> {
    storage::unmanaged_claim_warnings(md, "the KubeRay provider")
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;
    use serde_json::{Value, json};

    fn md(volumes: &Value) -> ModelDeployment {
        ModelDeploymentBuilder::new("llm")
            .spec(|s| {
                s.model.storage =
                    Some(serde_json::from_value(json!({ "volumes": volumes })).unwrap());
            })
            .build()
    }

    #[test]
    fn volumes_mount_at_their_purpose_and_set_the_cache_variables() {
        let md = md(&json!([
            {"name": "weights", "claimName": "hf-cache", "purpose": "modelCache"},
            {"name": "compile", "claimName": "vllm-cache", "purpose": "compilationCache", "readOnly": true},
            {"name": "data", "claimName": "data", "mountPath": "/data"},
        ]));
        assert_eq!(check(&md), Ok(()));
        assert_eq!(
            pod_volumes(&md),
            [
                json!({"name": "weights", "persistentVolumeClaim": {"claimName": "hf-cache"}}),
                json!({"name": "compile", "persistentVolumeClaim": {"claimName": "vllm-cache", "readOnly": true}}),
                json!({"name": "data", "persistentVolumeClaim": {"claimName": "data"}}),
            ]
        );
        assert_eq!(
            volume_mounts(&md),
            [
                json!({"name": "weights", "mountPath": "/model-cache"}),
                json!({"name": "compile", "mountPath": "/compilation-cache", "readOnly": true}),
                json!({"name": "data", "mountPath": "/data"}),
            ]
        );
        assert_eq!(
            env_for(&md, kubeairunway_sdk::engine::VLLM.cache_variables),
            [
                json!({"name": "HF_HOME", "value": "/model-cache"}),
                json!({"name": "VLLM_CACHE_ROOT", "value": "/compilation-cache"}),
            ]
        );
        assert!(warnings(&md).is_empty());
    }

    #[test]
    fn the_users_cache_variables_win() {
        let mut md = md(&json!([{"name": "weights", "claimName": "c", "purpose": "modelCache"}]));
        md.spec.env = Some(vec![k8s_openapi::api::core::v1::EnvVar {
            name: "HF_HOME".into(),
            value: Some("/somewhere".into()),
            value_from: None,
        }]);
        assert!(env_for(&md, kubeairunway_sdk::engine::VLLM.cache_variables).is_empty());
    }

    #[test]
    fn claims_to_create_are_named_and_their_settings_reported_as_ignored() {
        let md = md(
            &json!([{"name": "weights", "purpose": "modelCache", "size": "100Gi",
                            "storageClassName": "fast", "accessMode": "ReadWriteMany"}]),
        );
        assert_eq!(check(&md), Ok(()));
        assert_eq!(
            pod_volumes(&md)[0]["persistentVolumeClaim"]["claimName"],
            "llm-weights"
        );
        let fields: Vec<_> = warnings(&md)
            .into_iter()
            .map(|w| w.ignored_field.unwrap())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.model.storage.volumes[weights].size",
                "spec.model.storage.volumes[weights].storageClassName",
                "spec.model.storage.volumes[weights].accessMode",
            ]
        );
    }

    #[test]
    fn volumes_that_cannot_be_mounted_are_refused() {
        for (volumes, expected) in [
            (
                json!([{"name": "x", "claimName": "c"}]),
                "mountPath is required for purpose custom",
            ),
            (
                json!([{"name": "x", "claimName": "c", "mountPath": "data"}]),
                "must be an absolute path",
            ),
            (
                json!([{"name": "shared-mem", "claimName": "c", "purpose": "modelCache"}]),
                "KubeRay uses the volume name",
            ),
            (
                json!([{"name": "x", "claimName": "c", "mountPath": "/dev/shm/"}]),
                "where KubeRay mounts its own volume",
            ),
            (
                json!([{"name": "x", "claimName": "c", "purpose": "modelCache"},
                    {"name": "y", "claimName": "d", "mountPath": "/model-cache"}]),
                "is used by another volume",
            ),
            (
                json!([{"name": "x", "purpose": "modelCache"}]),
                "claimName is required",
            ),
        ] {
            let refused = check(&md(&volumes)).unwrap_err();
            assert!(refused.contains(expected), "{volumes}: {refused}");
        }
    }
}
