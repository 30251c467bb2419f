//! `spec.model.storage` on Dynamo: which claim each volume mounts, where, and on which
//! components; what a DynamoGraphDeployment version can and cannot do with it
//! (docs/upstream.md#dynamo-storage).
//!
//! - PVC volumes in the pod template work in both versions: the operator merges our pod
//!   spec and main container over its own, which have no volumes. Model caches go on the
//!   frontend and the workers with `HF_HOME` at the first one, as Dynamo's examples do.
//! - A compilation cache is Dynamo's own setting, which also sets the backend's cache
//!   variable (`VLLM_CACHE_ROOT` for vLLM): v1alpha1 `volumeMounts[]{name: <claim>,
//!   mountPoint, useAsCompilationCache: true}`, v1beta1 `compilationCache{pvcName,
//!   mountPath}`; one per component, always writable.
//! - Only v1alpha1 can create a claim, through `spec.pvcs[]{name, create: true, size,
//!   storageClass, volumeAccessMode}`, whose webhook requires all three. Existing claims
//!   are listed with `create: false`, so that a missing one fails the graph with its name.
//!   v1beta1 has no `pvcs`.

use kubeairunway_sdk::api::{StorageVolume, VolumePurpose};
use kubeairunway_sdk::storage as sdk_storage;
use kubeairunway_sdk::{ModelDeployment, RenderError, Warning};
use serde_json::Value;

/// The SDK's default mount paths of a model and a compilation cache (the ModelDeployment
/// CRD's `mountPath` description), as every provider mounts them.
pub use kubeairunway_sdk::storage::{COMPILATION_CACHE_PATH, MODEL_CACHE_PATH};
/// Access mode of a created claim when none is given.
pub const DEFAULT_ACCESS_MODE: &str = "ReadWriteMany";

/// A claim Dynamo is asked to create (v1alpha1 only).
#[derive(Clone, Debug, PartialEq)]
pub struct NewClaim {
    /// Requested size.
    pub size: String,
    /// StorageClass; `None` is the cluster default, which Dynamo cannot ask for.
    pub storage_class: Option<String>,
    /// Access mode, when set.
    pub access_mode: Option<String>,
}

impl NewClaim {
    /// The access mode, `ReadWriteMany` unless set.
    pub fn access_mode(&self) -> &str {
        self.access_mode.as_deref().unwrap_or(DEFAULT_ACCESS_MODE)
    }
}

/// One volume of `spec.model.storage`, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Volume {
    /// The volume's name in the ModelDeployment (and in the pod).
    pub name: String,
    /// The claim it mounts.
    pub claim: String,
    /// Where.
    pub path: String,
    /// Read-only.
    pub read_only: bool,
    /// What it holds.
    pub purpose: VolumePurpose,
    /// Whether the user named the claim (else it is `<md>-<volume>`, to be created).
    pub claim_given: bool,
    /// Asked to be created (`size` set).
    pub create: Option<NewClaim>,
}

impl Volume {
    /// Mounted on the frontend too: a model cache (the frontend reads the model's
    /// tokenizer and configuration from the same `HF_HOME`).
    pub fn on_frontend(&self) -> bool {
        self.purpose == VolumePurpose::ModelCache
    }

    fn field(&self, sub: &str) -> String {
        format!("spec.model.storage.volumes[{}].{sub}", self.name)
    }
}

/// The volume the Dynamo operator gives every component for `/dev/shm`, and where: an
/// 8Gi memory-backed `emptyDir` (`KubeValueNameSharedMemory`,
/// `DefaultSharedMemoryMountPath` in `deploy/operator/internal/consts/consts.go@0367e404`;
/// "Shared Memory" in `deploy/operator/docs/footer.md@20612125`).
pub const OPERATOR_SHM: (&str, &str) = ("shared-memory", "/dev/shm");

/// The volumes of `md`, in the order given. A custom volume without `mountPath` or a
/// volume with neither `claimName` nor `size` cannot be mounted: an error naming it; so
/// can a volume the pod could not hold, by the SDK's rules ([`sdk_storage::check`]): a
/// relative path, two volumes at one path, or the operator's own shared-memory volume
/// name or path ([`OPERATOR_SHM`]).
pub fn volumes(md: &ModelDeployment) -> Result<Vec<Volume>, RenderError> {
    let md_name = md.metadata.name.clone().unwrap_or_default();
    let resolved = md
        .spec
        .model
        .storage
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| resolve(&md_name, v))
        .collect::<Result<Vec<_>, _>>()?;
    sdk_storage::check(
        md,
        &sdk_storage::Reserved {
            by: "the Dynamo operator",
            pods: "Dynamo's pods",
            names: &[OPERATOR_SHM.0],
            paths: &[OPERATOR_SHM.1],
        },
    )
    .map_err(RenderError)?;
    Ok(resolved)
}

fn resolve(md_name: &str, v: &StorageVolume) -> Result<Volume, RenderError> {
    let field = |sub: &str| format!("spec.model.storage.volumes[{}].{sub}", v.name);
    let path = sdk_storage::mount_path(v)
        .ok_or_else(|| {
            RenderError(format!(
                "{} is required when purpose is custom",
                field("mountPath")
            ))
        })?
        .to_string();
    let given = v.claim_name.clone().filter(|c| !c.is_empty());
    let create = v.size.as_ref().map(|size| NewClaim {
        size: size.0.clone(),
        storage_class: v.storage_class_name.clone(),
        access_mode: v.access_mode.and_then(|m| {
            serde_json::to_value(m)
                .ok()
                .and_then(|v| v.as_str().map(str::to_string))
        }),
    });
    let claim = match (&given, &create) {
        (Some(c), _) => c.clone(),
        (None, Some(_)) => format!("{md_name}-{}", v.name),
        (None, None) => {
            return Err(RenderError(format!(
                "{} is required when size is not set",
                field("claimName")
            )));
        }
    };
    Ok(Volume {
        name: v.name.clone(),
        claim,
        path,
        read_only: v.read_only,
        purpose: v.purpose,
        claim_given: given.is_some(),
        create,
    })
}

/// The storage a DynamoGraphDeployment version renders.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Plan {
    /// PVC volumes mounted on the main container (of the frontend when
    /// [`Volume::on_frontend`], of every worker).
    pub mounts: Vec<Volume>,
    /// The compilation cache of the workers.
    pub compilation_cache: Option<Volume>,
    /// Claims to declare at the top (v1alpha1 `spec.pvcs`), with those to create.
    pub claims: Vec<Volume>,
    /// `HF_HOME`: the first model cache's path.
    pub hf_home: Option<String>,
}

/// What `version` makes of `volumes`, and a warning for each setting it cannot honour.
pub fn plan(volumes: &[Volume], version: &str) -> (Plan, Vec<Warning>) {
    let mut plan = Plan::default();
    let mut warnings = Vec::new();
    for v in volumes {
        let mut v = v.clone();
        if let Some(new) = v.create.clone() {
            let why = match (version, &new.storage_class) {
                ("v1alpha1", Some(_)) => None,
                ("v1alpha1", None) => Some(
                    "Dynamo creates a claim only with an explicit storageClassName (spec.pvcs[].storageClass is required when create is true)",
                ),
                _ => Some(
                    "Dynamo's v1beta1 API creates no PersistentVolumeClaims (it has no spec.pvcs); create the claim and set claimName",
                ),
            };
            if let Some(why) = why {
                for sub in ["size", "storageClassName", "accessMode"] {
                    let set = match sub {
                        "size" => true,
                        "storageClassName" => new.storage_class.is_some(),
                        _ => new.access_mode.is_some(),
                    };
                    if set {
                        warnings.push(Warning::unsupported_field(&v.field(sub), why));
                    }
                }
                v.create = None;
                if !v.claim_given {
                    // Nothing would create the claim: mounting it would leave the pods
                    // pending forever.
                    continue;
                }
            }
        }
        if v.purpose == VolumePurpose::CompilationCache {
            if plan.compilation_cache.is_none() {
                if v.read_only {
                    warnings.push(Warning::unsupported_field(
                        &v.field("readOnly"),
                        "Dynamo mounts a compilation cache writable",
                    ));
                    v.read_only = false;
                }
                plan.compilation_cache = Some(v.clone());
                plan.claims.push(v);
                continue;
            }
            warnings.push(Warning::unsupported_field(
                &v.field("purpose"),
                "Dynamo sets up one compilation cache per component; this volume is mounted as a plain volume",
            ));
        }
        if v.purpose == VolumePurpose::ModelCache && plan.hf_home.is_none() {
            plan.hf_home = Some(v.path.clone());
        }
        plan.claims.push(v.clone());
        plan.mounts.push(v);
    }
    (plan, warnings)
}

/// The pod volume of `v`: its claim.
pub fn pod_volume(v: &Volume) -> Value {
    sdk_storage::claim_volume(&v.name, &v.claim, v.read_only)
}

/// The container mount of `v`.
pub fn container_mount(v: &Volume) -> Value {
    sdk_storage::mount(&v.name, &v.path, v.read_only)
}

#[cfg(test)]
mod tests {
    use super::*;
    use kubeairunway_sdk::testing::ModelDeploymentBuilder;
    use serde_json::json;

    fn md(volumes: &serde_json::Value) -> ModelDeployment {
        ModelDeploymentBuilder::new("m")
            .spec(|s| {
                s.model.storage = serde_json::from_value(json!({"volumes": volumes})).unwrap();
            })
            .build()
    }

    #[test]
    fn paths_and_claims_default_as_the_api_documents() {
        let v = volumes(&md(&json!([
            {"name": "weights", "claimName": "pvc-a", "purpose": "modelCache"},
            {"name": "cc", "size": "10Gi", "purpose": "compilationCache"},
            {"name": "extra", "claimName": "pvc-b", "mountPath": "/data", "readOnly": true},
        ])))
        .unwrap();
        let got: Vec<_> = v
            .iter()
            .map(|v| (v.claim.as_str(), v.path.as_str(), v.read_only))
            .collect();
        assert_eq!(
            got,
            [
                ("pvc-a", "/model-cache", false),
                ("m-cc", "/compilation-cache", false),
                ("pvc-b", "/data", true)
            ]
        );
        assert_eq!(v[1].create.as_ref().unwrap().access_mode(), "ReadWriteMany");
    }

    #[test]
    fn unmountable_volumes_are_errors_naming_the_field() {
        let err = volumes(&md(&json!([{"name": "x", "claimName": "c"}]))).unwrap_err();
        assert_eq!(
            err.0,
            "spec.model.storage.volumes[x].mountPath is required when purpose is custom"
        );
        let err = volumes(&md(&json!([{"name": "y", "purpose": "modelCache"}]))).unwrap_err();
        assert_eq!(
            err.0,
            "spec.model.storage.volumes[y].claimName is required when size is not set"
        );
    }

    /// Pods Kubernetes would refuse (two mounts at one path, a relative path, a second
    /// `/dev/shm` or `shared-memory` beside the operator's) are refused when rendering.
    #[test]
    fn volumes_the_pods_could_not_hold_are_errors() {
        for (given, expected) in [
            (
                json!([{"name": "x", "claimName": "c", "mountPath": "/dev/shm"}]),
                "where the Dynamo operator mounts its own volume",
            ),
            (
                json!([{"name": "shared-memory", "claimName": "c", "purpose": "modelCache"}]),
                "the Dynamo operator uses the volume name",
            ),
            (
                json!([{"name": "x", "claimName": "c", "mountPath": "data"}]),
                "must be an absolute path",
            ),
            (
                json!([{"name": "x", "claimName": "c", "purpose": "modelCache"},
                    {"name": "y", "claimName": "d", "mountPath": "/model-cache/"}]),
                "is used by another volume",
            ),
        ] {
            let err = volumes(&md(&given)).unwrap_err().0;
            assert!(err.contains(expected), "{given}: {err}");
        }
    }

    #[test]
    fn claims_are_created_only_where_dynamo_can() {
        let v = volumes(&md(&json!([
            {"name": "a", "size": "1Gi", "storageClassName": "fast", "accessMode": "ReadWriteMany", "purpose": "modelCache"},
            {"name": "b", "size": "1Gi", "purpose": "custom", "mountPath": "/b"},
            {"name": "c", "size": "1Gi", "claimName": "mine", "accessMode": "ReadWriteOnce", "purpose": "custom", "mountPath": "/c"},
        ])))
        .unwrap();
        let (alpha, warnings) = plan(&v, "v1alpha1");
        assert_eq!(
            alpha
                .mounts
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
            ["a", "c"]
        );
        assert!(alpha.mounts[0].create.is_some() && alpha.mounts[1].create.is_none());
        let fields: Vec<_> = warnings
            .iter()
            .map(|w| w.ignored_field.clone().unwrap())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.model.storage.volumes[b].size",
                "spec.model.storage.volumes[c].size",
                "spec.model.storage.volumes[c].accessMode",
            ]
        );
        let (beta, warnings) = plan(&v, "v1beta1");
        assert_eq!(
            beta.mounts
                .iter()
                .map(|v| v.name.as_str())
                .collect::<Vec<_>>(),
            ["c"]
        );
        assert_eq!(
            warnings.len(),
            6,
            "an explicit default access mode is named too"
        );
        assert!(
            warnings[0]
                .message
                .contains("creates no PersistentVolumeClaims"),
            "{}",
            warnings[0].message
        );
    }

    #[test]
    fn one_writable_compilation_cache_and_hf_home_from_the_model_cache() {
        let v = volumes(&md(&json!([
            {"name": "cc1", "claimName": "c1", "purpose": "compilationCache", "readOnly": true},
            // A second one at the same default path would be a second mount there.
            {"name": "cc2", "claimName": "c2", "purpose": "compilationCache", "mountPath": "/cc2"},
            {"name": "w", "claimName": "w", "purpose": "modelCache", "mountPath": "/models"},
        ])))
        .unwrap();
        let (p, warnings) = plan(&v, "v1beta1");
        let cc = p.compilation_cache.unwrap();
        assert_eq!((cc.claim.as_str(), cc.read_only), ("c1", false));
        assert_eq!(
            p.mounts.iter().map(|v| v.name.as_str()).collect::<Vec<_>>(),
            ["cc2", "w"]
        );
        assert_eq!(p.hf_home.as_deref(), Some("/models"));
        let fields: Vec<_> = warnings
            .iter()
            .map(|w| w.ignored_field.clone().unwrap())
            .collect();
        assert_eq!(
            fields,
            [
                "spec.model.storage.volumes[cc1].readOnly",
                "spec.model.storage.volumes[cc2].purpose"
            ]
        );
    }
}
