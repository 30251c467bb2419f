//! `spec.model.storage`: each volume becomes a PersistentVolumeClaim volume of every Ray
//! pod (head and workers), mounted into the Ray container, because Ray Serve LLM loads
//! the model on each worker node and the head's dashboard reads the same config
//! (KubeRay passes the pod templates through unchanged; its own volumes are listed in
//! [`RESERVED_NAMES`]).
//!
//! - claim: `claimName`, else `<name>-<volume>` (the name the API gives a claim created
//!   for a `size`);
//! - path: `mountPath`, else `/model-cache` (`modelCache`) or `/compilation-cache`
//!   (`compilationCache`); `custom` needs one;
//! - `readOnly` on the volume and the mount;
//! - the first `modelCache` volume is `HF_HOME` (where Hugging Face downloads go), the
//!   first `compilationCache` one `VLLM_CACHE_ROOT` (vLLM's compile caches), unless
//!   `spec.env` sets them.
//!
//! Nothing creates claims for a KubeRay deployment: `size`, `storageClassName` and
//! `accessMode` are reported as ignored, and the claim must exist.

use kube::ResourceExt;
use kubeairunway_sdk::Warning;
use kubeairunway_sdk::api::{ModelDeployment, StorageVolume, VolumePurpose};
use serde_json::{Value, json};

/// Mount path of a `modelCache` volume without one.
pub const MODEL_CACHE_PATH: &str = "/model-cache";
/// Mount path of a `compilationCache` volume without one.
pub const COMPILATION_CACHE_PATH: &str = "/compilation-cache";
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

fn volumes(md: &ModelDeployment) -> &[StorageVolume] {
    md.spec
        .model
        .storage
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
}

fn mount_path(v: &StorageVolume) -> Option<&str> {
    v.mount_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .or(match v.purpose {
            VolumePurpose::ModelCache => Some(MODEL_CACHE_PATH),
            VolumePurpose::CompilationCache => Some(COMPILATION_CACHE_PATH),
            VolumePurpose::Custom => None,
        })
}

fn claim_name(md: &ModelDeployment, v: &StorageVolume) -> String {
    v.claim_name
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| format!("{}-{}", md.name_any(), v.name))
}

/// Volumes that cannot be mounted, with the user-facing reason.
pub fn check(md: &ModelDeployment) -> Result<(), String> {
    let mut paths: Vec<&str> = Vec::new();
    for v in volumes(md) {
        let at = format!("spec.model.storage.volumes[{}]", v.name);
        let Some(path) = mount_path(v) else {
            return Err(format!("{at}.mountPath is required for purpose custom"));
        };
        if !path.starts_with('/') {
            return Err(format!("{at}.mountPath {path:?} must be an absolute path"));
        }
        if RESERVED_NAMES.contains(&v.name.as_str()) {
            return Err(format!(
                "{at}: KubeRay uses the volume name {:?} in Ray pods itself; choose another name",
                v.name
            ));
        }
        let path = path.trim_end_matches('/');
        if RESERVED_PATHS.contains(&path) {
            return Err(format!(
                "{at}.mountPath {path:?} is where KubeRay mounts its own volume in Ray pods; choose another path"
            ));
        }
        if paths.contains(&path) {
            return Err(format!("{at}.mountPath {path:?} is used by another volume"));
        }
        paths.push(path);
        if v.claim_name.as_deref().is_none_or(str::is_empty) && v.size.is_none() {
            return Err(format!(
                "{at}.claimName is required (the PersistentVolumeClaim to mount)"
            ));
        }
    }
    Ok(())
}

/// The pod's volumes.
pub fn pod_volumes(md: &ModelDeployment) -> Vec<Value> {
    volumes(md)
        .iter()
        .map(|v| {
            let mut claim = json!({"claimName": claim_name(md, v)});
            if v.read_only {
                claim["readOnly"] = json!(true);
            }
            json!({"name": v.name, "persistentVolumeClaim": claim})
        })
        .collect()
}

/// The Ray container's mounts.
pub fn volume_mounts(md: &ModelDeployment) -> Vec<Value> {
    volumes(md)
        .iter()
        .filter_map(|v| {
            let mut mount = json!({"name": v.name, "mountPath": mount_path(v)?});
            if v.read_only {
                mount["readOnly"] = json!(true);
            }
            Some(mount)
        })
        .collect()
}

/// `HF_HOME` and `VLLM_CACHE_ROOT` for the first volume of each purpose, unless
/// `spec.env` sets them.
pub fn env(md: &ModelDeployment) -> Vec<Value> {
    let user_sets = |name: &str| md.spec.env.iter().flatten().any(|e| e.name == name);
    [
        (VolumePurpose::ModelCache, "HF_HOME"),
        (VolumePurpose::CompilationCache, "VLLM_CACHE_ROOT"),
    ]
    .into_iter()
    .filter(|(_, name)| !user_sets(name))
    .filter_map(|(purpose, name)| {
        let v = volumes(md).iter().find(|v| v.purpose == purpose)?;
        Some(json!({"name": name, "value": mount_path(v)?}))
    })
    .collect()
}

/// The claim settings nobody acts on for KubeRay.
pub fn warnings(md: &ModelDeployment) -> Vec<Warning> {
    let mut out = Vec::new();
    for v in volumes(md) {
        let at = format!("spec.model.storage.volumes[{}]", v.name);
        let claim = claim_name(md, v);
        let why = format!(
            "the KubeRay provider mounts existing PersistentVolumeClaims and creates none; create the claim {claim:?}"
        );
        if v.size.is_some() {
            out.push(Warning::unsupported_field(&format!("{at}.size"), &why));
        }
        if v.storage_class_name.is_some() {
            out.push(Warning::unsupported_field(
                &format!("{at}.storageClassName"),
                &why,
            ));
        }
        if v.access_mode.is_some() {
            out.push(Warning::unsupported_field(
                &format!("{at}.accessMode"),
                &why,
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;

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
            env(&md),
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
        assert!(env(&md).is_empty());
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
