//! `spec.model.storage` for providers that render pods: each volume becomes a
//! PersistentVolumeClaim volume of the serving pods, mounted into the serving container.
//!
//! - claim: `claimName`, else `<name>-<volume>` (the name the API gives a claim created
//!   for a `size`);
//! - path: `mountPath`, else [`MODEL_CACHE_PATH`] (`modelCache`) or
//!   [`COMPILATION_CACHE_PATH`] (`compilationCache`); `custom` needs one;
//! - `readOnly` on the volume and the mount;
//! - the first volume of a purpose is pointed at by the engine's cache variable, unless
//!   `spec.env` sets it ([`env_for`] with [`crate::engine::Flags::cache_variables`]; for
//!   vLLM, [`env()`]: the first `modelCache` volume is `HF_HOME`, where Hugging Face
//!   downloads go, the first `compilationCache` one `VLLM_CACHE_ROOT`, vLLM's compile
//!   caches).
//!
//! A provider that creates no claims reports `size`, `storageClassName` and `accessMode`
//! as ignored ([`unmanaged_claim_warnings`]); the claim must exist.
//!
//! Used by [`crate::engine::container`] (the operator-free provider) and the KubeRay
//! provider (every Ray pod, with KubeRay's own volume names and paths reserved). The
//! Dynamo provider takes the defaults ([`mount_path`], [`claim_name`]) and the volume and
//! mount shapes ([`claim_volume`], [`mount`]) but places volumes per component and
//! leaves the compilation cache to its operator; the KAITO provider's llama.cpp template
//! keeps rules of its own (see its `render` module).

use k8s_openapi::api::core::v1::EnvVar;
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::api::{ModelDeployment, StorageVolume, VolumePurpose};
use crate::provider::Warning;

/// Mount path of a `modelCache` volume without one.
pub const MODEL_CACHE_PATH: &str = "/model-cache";
/// Mount path of a `compilationCache` volume without one.
pub const COMPILATION_CACHE_PATH: &str = "/compilation-cache";

/// Volume names and mount paths the upstream (or the provider) uses in the serving pods
/// itself, which a storage volume must not take.
#[derive(Clone, Copy, Debug)]
pub struct Reserved<'a> {
    /// Who uses them, for messages: `"KubeRay"`.
    pub by: &'a str,
    /// The pods, for messages: `"Ray pods"`.
    pub pods: &'a str,
    /// Volume names.
    pub names: &'a [&'a str],
    /// Mount paths (without a trailing `/`).
    pub paths: &'a [&'a str],
}

/// The storage volumes of `md`.
pub fn volumes(md: &ModelDeployment) -> &[StorageVolume] {
    md.spec
        .model
        .storage
        .as_ref()
        .and_then(|s| s.volumes.as_deref())
        .unwrap_or_default()
}

/// Where `v` is mounted: its `mountPath`, else the default of its purpose.
pub fn mount_path(v: &StorageVolume) -> Option<&str> {
    v.mount_path
        .as_deref()
        .filter(|p| !p.is_empty())
        .or(match v.purpose {
            VolumePurpose::ModelCache => Some(MODEL_CACHE_PATH),
            VolumePurpose::CompilationCache => Some(COMPILATION_CACHE_PATH),
            VolumePurpose::Custom => None,
        })
}

/// The claim `v` mounts.
pub fn claim_name(md: &ModelDeployment, v: &StorageVolume) -> String {
    v.claim_name
        .clone()
        .filter(|c| !c.is_empty())
        .unwrap_or_else(|| format!("{}-{}", md.name_any(), v.name))
}

/// Volumes that cannot be mounted, with the user-facing reason: no path for a `custom`
/// volume, a relative path, a name or path in `reserved`, two volumes at one path, no
/// claim to mount.
pub fn check(md: &ModelDeployment, reserved: &Reserved<'_>) -> Result<(), String> {
    let mut paths: Vec<&str> = Vec::new();
    for v in volumes(md) {
        let at = format!("spec.model.storage.volumes[{}]", v.name);
        let Some(path) = mount_path(v) else {
            return Err(format!("{at}.mountPath is required for purpose custom"));
        };
        if !path.starts_with('/') {
            return Err(format!("{at}.mountPath {path:?} must be an absolute path"));
        }
        if reserved.names.contains(&v.name.as_str()) {
            return Err(format!(
                "{at}: {} uses the volume name {:?} in {} itself; choose another name",
                reserved.by, v.name, reserved.pods
            ));
        }
        let path = path.trim_end_matches('/');
        if reserved.paths.contains(&path) {
            return Err(format!(
                "{at}.mountPath {path:?} is where {} mounts its own volume in {}; choose another path",
                reserved.by, reserved.pods
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
        .map(|v| claim_volume(&v.name, &claim_name(md, v), v.read_only))
        .collect()
}

/// The serving container's mounts.
pub fn volume_mounts(md: &ModelDeployment) -> Vec<Value> {
    volumes(md)
        .iter()
        .filter_map(|v| Some(mount(&v.name, mount_path(v)?, v.read_only)))
        .collect()
}

/// The pod volume `name` of the PersistentVolumeClaim `claim` (`readOnly` only when set).
pub fn claim_volume(name: &str, claim: &str, read_only: bool) -> Value {
    let mut source = json!({"claimName": claim});
    if read_only {
        source["readOnly"] = json!(true);
    }
    json!({"name": name, "persistentVolumeClaim": source})
}

/// The container mount of the volume `name` at `path` (`readOnly` only when set).
pub fn mount(name: &str, path: &str, read_only: bool) -> Value {
    let mut mount = json!({"name": name, "mountPath": path});
    if read_only {
        mount["readOnly"] = json!(true);
    }
    mount
}

/// For each `(purpose, variable)`, the variable set to the mount path of the first
/// volume of that purpose, unless `spec.env` sets it.
pub fn env_for(md: &ModelDeployment, variables: &[(VolumePurpose, &str)]) -> Vec<Value> {
    let user_sets = |name: &str| {
        md.spec
            .env
            .iter()
            .flatten()
            .any(|e: &EnvVar| e.name == name)
    };
    variables
        .iter()
        .filter(|(_, name)| !user_sets(name))
        .filter_map(|(purpose, name)| {
            let v = volumes(md).iter().find(|v| v.purpose == *purpose)?;
            Some(json!({"name": name, "value": mount_path(v)?}))
        })
        .collect()
}

/// The claim settings nobody acts on when `provider` (`"the KubeRay provider"`) creates
/// no claims.
pub fn unmanaged_claim_warnings(md: &ModelDeployment, provider: &str) -> Vec<Warning> {
    let mut out = Vec::new();
    for v in volumes(md) {
        let at = format!("spec.model.storage.volumes[{}]", v.name);
        let claim = claim_name(md, v);
        let why = format!(
            "{provider} mounts existing PersistentVolumeClaims and creates none; create the claim {claim:?}"
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
