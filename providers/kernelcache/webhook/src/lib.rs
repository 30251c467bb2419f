//! The pod-injection webhook: a mutating admission webhook on Pods that carry
//! `kubeairunway.ai/model-deployment` (every serving pod a provider renders). When that
//! ModelDeployment names a KernelCache whose pin is usable, the pod gets the cache
//! ([`inject`]) and an annotation naming it; when a Ready ModelCache of its namespace holds
//! its model (or it names one), the pod mounts that cache's claim read-only
//! ([`model_inject`]).
//!
//! It never refuses a pod, nor makes one that the API server would refuse: everything
//! else (no label, no ModelDeployment, no cache, a cache not verified, a pod using one of
//! our names or mount paths, a namespace whose Pod Security level forbids the volume, a
//! malformed request) is allowed unchanged, and the webhook configuration's
//! `failurePolicy: Ignore` covers the webhook being down. Look-ups come from reflector
//! caches ([`Lookup`]), so admission makes no API round trip.
//!
//! Pod Security: `baseline` and `restricted` forbid hostPath volumes, and so may what the
//! webhook cannot see (cluster-wide Pod Security defaults, OpenShift's SCCs, GKE
//! Autopilot, Kyverno or Gatekeeper policies) in a namespace that enforces no level of its
//! own: a pod mutated into one such a policy refuses would not be created at all. So the
//! cache comes from the node's disk (hostPath) only where that is known to be allowed: a
//! namespace that enforces `privileged`, or one labelled
//! `cache.kubeairunway.ai/host-path: allowed` by its operator, or anywhere its level does
//! not forbid it when the cluster operator says so (`--host-paths=everywhere`). Elsewhere
//! it comes from an image volume when the cluster serves them (`--image-volumes`;
//! `restricted` allows neither), else the pod is left alone (the engine compiles its
//! kernels as usual).

pub mod app;
pub mod inject;
pub mod model_inject;
pub mod warmup;

use std::sync::Arc;

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Namespace;
use kube::ResourceExt;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::core::{DynamicObject, PartialObjectMeta};
use kube::runtime::reflector::{ObjectRef, Store};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::labels::MODEL_DEPLOYMENT;
use serde_json::{Value, json};

use crate::inject::{Mount, Source};
use crate::model_inject::ModelOutcome;
use kubeairunway_kernelcache_api::model::ModelCache;
use kubeairunway_kernelcache_api::names;
use kubeairunway_kernelcache_api::{KernelCache, MountSource};
use kubeairunway_kernelcache_artifact::image::CacheType;

/// The annotation naming the injected cache: `<namespace>/<name>@<digest>`.
pub use kubeairunway_kernelcache_api::names::INJECTED_ANNOTATION;
/// The webhook's path.
pub const PATH: &str = "/mutate-pod";

/// Where the webhook finds ModelDeployments and KernelCaches.
pub trait Lookup: Send + Sync {
    /// The ModelDeployment `namespace/name`.
    fn model_deployment(&self, namespace: &str, name: &str) -> Option<Arc<ModelDeployment>>;
    /// The KernelCache `namespace/name`.
    fn kernel_cache(&self, namespace: &str, name: &str) -> Option<Arc<KernelCache>>;
    /// The labels of the namespace (for its Pod Security level); `None` when unknown.
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>>;
    /// The ModelCaches of `namespace` (none by default).
    fn model_caches(&self, namespace: &str) -> Vec<Arc<ModelCache>> {
        let _ = namespace;
        Vec::new()
    }
}

/// The label of the Pod Security level a namespace enforces.
pub const POD_SECURITY_ENFORCE: &str = "pod-security.kubernetes.io/enforce";
/// The namespace label (value `allowed`) with which its operator lets caches come from
/// the node's disk (hostPath) in a namespace that enforces no Pod Security level.
pub const HOST_PATH_LABEL: &str = "cache.kubeairunway.ai/host-path";

/// Where caches may come from the node's disk (hostPath) when the namespace enforces no
/// Pod Security level.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum HostPaths {
    /// Only in namespaces labelled `cache.kubeairunway.ai/host-path: allowed` (and those
    /// enforcing `privileged`): a namespace's other policies are unknown to the webhook.
    #[default]
    Labelled,
    /// In every namespace whose Pod Security level does not forbid it: for clusters whose
    /// operator knows no other policy refuses hostPath volumes.
    Everywhere,
}

/// Look-ups in reflector stores.
#[derive(Clone)]
pub struct Stores {
    /// ModelDeployments, every namespace.
    pub model_deployments: Store<kubeairunway_sdk::compact::Compact<ModelDeployment>>,
    /// KernelCaches, every namespace.
    pub kernel_caches: Store<KernelCache>,
    /// ModelCaches, every namespace.
    pub model_caches: Store<ModelCache>,
    /// Namespaces (metadata only).
    pub namespaces: Store<PartialObjectMeta<Namespace>>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Lookup for Stores {
    fn model_deployment(&self, namespace: &str, name: &str) -> Option<Arc<ModelDeployment>> {
        let cached = self
            .model_deployments
            .get(&ObjectRef::new(name).within(namespace))?;
        match cached.object() {
            Ok(md) => Some(Arc::new(md)),
            // Cannot happen: the text was written from a ModelDeployment.
            Err(e) => {
                tracing::error!(error = %e, "a cached ModelDeployment does not read back");
                None
            }
        }
    }
    fn kernel_cache(&self, namespace: &str, name: &str) -> Option<Arc<KernelCache>> {
        self.kernel_caches
            .get(&ObjectRef::new(name).within(namespace))
    }
    fn namespace_labels(&self, namespace: &str) -> Option<BTreeMap<String, String>> {
        self.namespaces
            .get(&ObjectRef::new(namespace))
            .map(|n| n.labels().clone())
    }
    fn model_caches(&self, namespace: &str) -> Vec<Arc<ModelCache>> {
        self.model_caches
            .state()
            .into_iter()
            .filter(|c| c.namespace().as_deref() == Some(namespace))
            .collect()
    }
}

/// What the webhook adds besides the cache itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The agent's cache root on the nodes.
    pub cache_root: String,
    /// The image with `kernelcache-seed`.
    pub seed_image: String,
    /// The cluster serves Kubernetes image volumes (used where hostPath is not allowed).
    pub image_volumes: bool,
    /// Where hostPath is allowed in namespaces that enforce no Pod Security level.
    pub host_paths: HostPaths,
}

/// What happened to one pod (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The cache was added.
    Injected,
    /// Not a serving pod of ours.
    NoLabel,
    /// Its ModelDeployment is not (yet) known.
    NoModelDeployment,
    /// The ModelDeployment names no cache.
    NoCacheRef,
    /// The named cache does not exist.
    CacheNotFound,
    /// The cache's pin has not passed verification (or is not a cache).
    CacheNotUsable,
    /// The pod has the cache already.
    AlreadyInjected,
    /// The pod uses one of our names or mount paths: left as it is.
    Conflict,
    /// The namespace's Pod Security level forbids the volume the cache needs, or hostPath
    /// is not known to be allowed there and the cluster serves no image volumes.
    PodSecurity,
    /// Not a Pod CREATE, or a request that could not be read.
    Skipped,
}

impl Outcome {
    /// The metrics label.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Injected => "injected",
            Outcome::NoLabel => "no-label",
            Outcome::NoModelDeployment => "no-model-deployment",
            Outcome::NoCacheRef => "no-cache-ref",
            Outcome::CacheNotFound => "cache-not-found",
            Outcome::CacheNotUsable => "cache-not-usable",
            Outcome::AlreadyInjected => "already-injected",
            Outcome::Conflict => "conflict",
            Outcome::PodSecurity => "pod-security",
            Outcome::Skipped => "skipped",
        }
    }
}

/// The patch for a pod (as JSON) in `namespace`, or why there is none: which cache the
/// pod's ModelDeployment names, how that cache can be mounted here, then the patch.
pub fn decide(
    pod: &Value,
    namespace: &str,
    lookup: &dyn Lookup,
    settings: &Settings,
) -> Result<Vec<Value>, Outcome> {
    let (cache_name, cache) = named_cache(pod, namespace, lookup)?;
    let labels = lookup.namespace_labels(namespace).unwrap_or_default();
    let planned = plan_mount(&cache, &cache_name, namespace, &labels, settings)?;
    pod_patch(pod, namespace, &planned)
}

/// The KernelCache the pod's ModelDeployment names (its name and the cache), unless the
/// pod is not a serving pod of ours, has a cache already, or the objects are not there.
fn named_cache(
    pod: &Value,
    namespace: &str,
    lookup: &dyn Lookup,
) -> Result<(String, Arc<KernelCache>), Outcome> {
    let md_name = pod["metadata"]["labels"][MODEL_DEPLOYMENT]
        .as_str()
        .ok_or(Outcome::NoLabel)?;
    if pod["metadata"]["annotations"][INJECTED_ANNOTATION].is_string() {
        return Err(Outcome::AlreadyInjected);
    }
    let md = lookup
        .model_deployment(namespace, md_name)
        .ok_or(Outcome::NoModelDeployment)?;
    let cache_name = md
        .spec
        .kernel_cache
        .as_ref()
        .map(|k| k.name.clone())
        .ok_or(Outcome::NoCacheRef)?;
    let cache = lookup
        .kernel_cache(namespace, &cache_name)
        .ok_or(Outcome::CacheNotFound)?;
    Ok((cache_name, cache))
}

/// A cache mount planned for a pod: what to mount, whether the pod must land on a node
/// with the cache ready, and the digest pinned.
struct PlannedMount {
    mount: Mount,
    require_ready_node: bool,
    digest: String,
}

/// Whether a cache may come from the node's disk in a namespace with `labels`.
fn host_path_allowed(labels: &BTreeMap<String, String>, settings: &Settings) -> bool {
    match labels.get(POD_SECURITY_ENFORCE).map(String::as_str) {
        Some("privileged") => true,
        Some(_) => false,
        None => {
            settings.host_paths == HostPaths::Everywhere
                || labels.get(HOST_PATH_LABEL).map(String::as_str) == Some("allowed")
        }
    }
}

/// How `cache` is mounted in a namespace with `labels` (its Pod Security level and our
/// hostPath opt-in): refused when its pin is not usable or no source the cache can come
/// from is allowed there.
fn plan_mount(
    cache: &KernelCache,
    cache_name: &str,
    namespace: &str,
    labels: &BTreeMap<String, String>,
    settings: &Settings,
) -> Result<PlannedMount, Outcome> {
    let status = cache.status.clone().unwrap_or_default();
    let image = status.usable_image().ok_or(Outcome::CacheNotUsable)?;
    let cache_type = match status.cache_type.as_deref() {
        Some("triton") => CacheType::Triton,
        Some("vllm") => CacheType::Vllm,
        _ => return Err(Outcome::CacheNotUsable),
    };
    let digest = status.resolved_digest.clone().unwrap_or_default();
    let mount_spec = cache.spec.mount.clone().unwrap_or_default();
    let level = labels.get(POD_SECURITY_ENFORCE).map(String::as_str);
    let host_path = host_path_allowed(labels, settings);
    let source = match (mount_spec.source.unwrap_or_default(), level) {
        (_, Some("restricted")) => return Err(Outcome::PodSecurity),
        (MountSource::HostPath, _) if !host_path && !settings.image_volumes => {
            return Err(Outcome::PodSecurity);
        }
        (MountSource::HostPath, _) if !host_path => Source::Image(image.to_string()),
        (MountSource::ImageVolume, _) => Source::Image(image.to_string()),
        (MountSource::HostPath, _) => Source::HostPath {
            dir: format!(
                "{}/{namespace}/{cache_name}",
                settings.cache_root.trim_end_matches('/')
            ),
            digest: digest.replace(':', "-"),
        },
    };
    let mount = Mount {
        name: cache_name.to_string(),
        cache_type,
        source,
        path: mount_spec.path,
        seed_image: settings.seed_image.clone(),
        size_bytes: status.size_bytes.and_then(|b| u64::try_from(b).ok()),
    };
    Ok(PlannedMount {
        mount,
        require_ready_node: mount_spec.require_ready_node,
        digest,
    })
}

/// The JSON patch that gives `pod` the planned cache: the volumes and mounts, the node
/// affinity to nodes with the cache ready, and the annotation naming the cache. None
/// when the pod already uses one of our names or paths, or needs nothing.
fn pod_patch(pod: &Value, namespace: &str, planned: &PlannedMount) -> Result<Vec<Value>, Outcome> {
    let cache_name = &planned.mount.name;
    if let Some(why) = inject::conflicts(pod, &planned.mount) {
        tracing::info!(namespace, reason = %why, "kernel cache not injected");
        return Err(Outcome::Conflict);
    }
    let mut ops = inject::patch(pod, &planned.mount);
    if ops.is_empty() {
        return Err(Outcome::Skipped);
    }
    let label = names::ready_label(namespace, cache_name);
    ops.extend(if planned.require_ready_node {
        inject::node_affinity_patch(pod, &label)
    } else {
        inject::preferred_affinity_patch(pod, &label)
    });
    let value = format!("{namespace}/{cache_name}@{}", planned.digest);
    if pod["metadata"]["annotations"].is_object() {
        ops.push(json!({"op": "add", "path": format!("/metadata/annotations/{}", INJECTED_ANNOTATION.replace('~', "~0").replace('/', "~1")), "value": value}));
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {INJECTED_ANNOTATION: value}}));
    }
    Ok(ops)
}

/// Answer a request body: always allowed; with a patch when the pod gets a cache.
pub fn review(
    body: &[u8],
    lookup: &dyn Lookup,
    settings: &Settings,
) -> (AdmissionResponse, Outcome) {
    let (resp, outcome, _) = review_all(body, lookup, settings);
    (resp, outcome)
}

/// [`review`], with what happened to the pod's model cache too (a metrics label).
pub fn review_all(
    body: &[u8],
    lookup: &dyn Lookup,
    settings: &Settings,
) -> (AdmissionResponse, Outcome, ModelOutcome) {
    let skipped = |resp| (resp, Outcome::Skipped, ModelOutcome::Skipped);
    let raw: Option<Value> = serde_json::from_slice(body).ok();
    let request: Option<AdmissionRequest<DynamicObject>> = raw
        .clone()
        .and_then(|v| serde_json::from_value::<AdmissionReview<DynamicObject>>(v).ok())
        .and_then(|r| r.try_into().ok());
    let Some(request) = request else {
        // Unreadable: allow (the pod is not ours to refuse), keeping the uid if any.
        let mut resp = AdmissionResponse::invalid("malformed AdmissionReview");
        resp.allowed = true;
        if let Some(uid) = raw
            .as_ref()
            .and_then(|v| v.pointer("/request/uid"))
            .and_then(Value::as_str)
        {
            uid.clone_into(&mut resp.uid);
        }
        return skipped(resp);
    };
    let resp = AdmissionResponse::from(&request);
    let pod = match (&request.operation, &request.object) {
        (Operation::Create, Some(pod)) if request.kind.kind == "Pod" => pod,
        _ => return skipped(resp),
    };
    let Ok(pod) = serde_json::to_value(pod) else {
        return skipped(resp);
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod["metadata"]["namespace"].as_str().map(str::to_string))
        .unwrap_or_default();
    let (ops, outcome, model) = both_patches(&pod, &namespace, lookup, settings);
    if ops.is_empty() {
        return (resp, outcome, model);
    }
    match serde_json::from_value::<json_patch::Patch>(Value::Array(ops)) {
        Ok(patch) => match resp.clone().with_patch(patch) {
            Ok(r) => (r, outcome, model),
            Err(e) => {
                tracing::warn!(error = %e, "serializing the patch");
                skipped(resp)
            }
        },
        Err(e) => {
            tracing::warn!(error = %e, "building the patch");
            skipped(resp)
        }
    }
}

/// The kernel cache's patch ([`decide`]) and then the model cache's
/// ([`model_inject::decide`]), the second computed on the pod the first made (JSON patch
/// operations apply in order), and what happened to each.
fn both_patches(
    pod: &Value,
    namespace: &str,
    lookup: &dyn Lookup,
    settings: &Settings,
) -> (Vec<Value>, Outcome, ModelOutcome) {
    let (mut ops, outcome) = match decide(pod, namespace, lookup, settings) {
        Ok(ops) => {
            tracing::info!(namespace, pod = %pod_name(pod), "kernel cache injected");
            (ops, Outcome::Injected)
        }
        Err(outcome) => (Vec::new(), outcome),
    };
    let mut patched = pod.clone();
    if !ops.is_empty() {
        let applied = serde_json::from_value::<json_patch::Patch>(Value::Array(ops.clone()))
            .map_err(|e| e.to_string())
            .and_then(|p| json_patch::patch(&mut patched, &p).map_err(|e| e.to_string()));
        if let Err(e) = applied {
            tracing::warn!(error = %e, "applying the kernel-cache patch");
            return (Vec::new(), Outcome::Skipped, ModelOutcome::Skipped);
        }
    }
    let model = model_inject::decide(
        &patched,
        namespace,
        |name| lookup.model_deployment(namespace, name),
        || lookup.model_caches(namespace),
    );
    let model = match model {
        Ok(model_ops) => {
            tracing::info!(namespace, pod = %pod_name(pod), "model cache mounted");
            ops.extend(model_ops);
            ModelOutcome::Injected
        }
        Err(o) => {
            tracing::debug!(namespace, outcome = o.as_str(), "no model cache");
            o
        }
    };
    (ops, outcome, model)
}

fn pod_name(pod: &Value) -> String {
    serde_json::from_value::<DynamicObject>(pod.clone())
        .map(|p| p.name_any())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use kubeairunway_kernelcache_api::{
        KernelCacheSpec, KernelCacheStatus, MountSpec, Verification,
    };
    use kubeairunway_sdk::api::KernelCacheRef;

    #[derive(Default)]
    struct Fake {
        mds: BTreeMap<String, Arc<ModelDeployment>>,
        caches: BTreeMap<String, Arc<KernelCache>>,
        levels: BTreeMap<String, &'static str>,
        /// Namespaces labelled `cache.kubeairunway.ai/host-path: allowed`.
        host_path: Vec<&'static str>,
        /// ModelCaches of every namespace.
        models: Vec<Arc<ModelCache>>,
    }

    impl Lookup for Fake {
        fn model_deployment(&self, ns: &str, name: &str) -> Option<Arc<ModelDeployment>> {
            self.mds.get(&format!("{ns}/{name}")).cloned()
        }
        fn kernel_cache(&self, ns: &str, name: &str) -> Option<Arc<KernelCache>> {
            self.caches.get(&format!("{ns}/{name}")).cloned()
        }
        fn namespace_labels(&self, ns: &str) -> Option<BTreeMap<String, String>> {
            let mut labels = BTreeMap::new();
            if let Some(l) = self.levels.get(ns) {
                labels.insert(POD_SECURITY_ENFORCE.to_string(), (*l).to_string());
            }
            if self.host_path.contains(&ns) {
                labels.insert(HOST_PATH_LABEL.to_string(), "allowed".to_string());
            }
            Some(labels)
        }
        fn model_caches(&self, ns: &str) -> Vec<Arc<ModelCache>> {
            self.models
                .iter()
                .filter(|c| c.namespace().as_deref() == Some(ns))
                .cloned()
                .collect()
        }
    }

    fn fake(cache: Option<&str>, verified: bool, mount: Option<MountSpec>) -> Fake {
        let mut md = ModelDeployment::new(
            "llama",
            serde_json::from_value(json!({"model": {"id": "m"}})).unwrap(),
        );
        md.spec.kernel_cache = cache.map(|c| KernelCacheRef { name: c.into() });
        let mut kc = KernelCache::new(
            "vllm-h100",
            KernelCacheSpec {
                image: "r/c:1".into(),
                mount,
                ..KernelCacheSpec::default()
            },
        );
        kc.status = Some(KernelCacheStatus {
            resolved_digest: Some("sha256:ab".into()),
            pinned_image: Some("r/c@sha256:ab".into()),
            cache_type: Some("vllm".into()),
            verification: Some(Verification {
                verified,
                ..Verification::default()
            }),
            ..KernelCacheStatus::default()
        });
        Fake {
            mds: [("ml/llama".to_string(), Arc::new(md))].into(),
            caches: [("ml/vllm-h100".to_string(), Arc::new(kc))].into(),
            levels: BTreeMap::new(),
            host_path: vec!["ml"],
            models: Vec::new(),
        }
    }

    /// A Ready ModelCache `qwen` of `hf://m/m` in `ml`.
    fn ready_model_cache() -> Arc<ModelCache> {
        use kubeairunway_kernelcache_api::model::{ModelCacheSpec, ModelCacheStatus, conditions};
        let mut c = ModelCache::new(
            "qwen",
            ModelCacheSpec {
                source: "hf://m/m".into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.namespace = Some("ml".into());
        c.status = Some(ModelCacheStatus {
            ready_nodes: 1,
            claim_name: Some("modelcache-qwen".into()),
            resolved_commit: Some("abc".into()),
            conditions: vec![k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition {
                type_: conditions::READY.into(),
                status: "True".into(),
                reason: "Ready".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: None,
            }],
            ..ModelCacheStatus::default()
        });
        Arc::new(c)
    }

    /// A kernel cache and a model cache in one pod: one patch with both, valid applied in
    /// order; a model cache alone still patches a pod whose kernel cache is refused.
    #[test]
    fn kernel_and_model_caches_combine_in_one_valid_patch() {
        let mut f = fake(Some("vllm-h100"), true, None);
        f.models.push(ready_model_cache());
        let mut md = (*f.mds["ml/llama"]).clone();
        md.spec.model.id = Some("m/m".into());
        f.mds.insert("ml/llama".into(), Arc::new(md));
        let body = serde_json::to_vec(&json!({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                        "resource": {"group": "", "version": "v1", "resource": "pods"},
                        "namespace": "ml", "operation": "CREATE", "userInfo": {},
                        "object": pod(Some("llama"))}
        }))
        .unwrap();
        let patched = |f: &Fake| {
            let (resp, outcome, model) = review_all(&body, f, &settings());
            assert_eq!(model, ModelOutcome::Injected);
            let mut p = pod(Some("llama"));
            let patch: json_patch::Patch =
                serde_json::from_slice(resp.patch.as_deref().unwrap()).unwrap();
            json_patch::patch(&mut p, &patch).unwrap();
            (p, outcome)
        };
        let (p, outcome) = patched(&f);
        assert_eq!(outcome, Outcome::Injected);
        let volumes: Vec<&str> = p["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v["name"].as_str().unwrap())
            .collect();
        assert_eq!(volumes.len(), 3, "{volumes:?}");
        assert!(volumes.contains(&model_inject::VOLUME));
        assert!(p["metadata"]["annotations"][INJECTED_ANNOTATION].is_string());
        assert!(p["metadata"]["annotations"][model_inject::MODEL_INJECTED_ANNOTATION].is_string());
        f.levels.insert("ml".into(), "restricted");
        let (p, outcome) = patched(&f);
        assert_eq!(outcome, Outcome::PodSecurity);
        assert_eq!(p["spec"]["volumes"][0]["name"], model_inject::VOLUME);
        assert!(p["spec"]["initContainers"].is_null());
    }

    fn settings() -> Settings {
        Settings {
            cache_root: "/var/lib/kc".into(),
            image_volumes: false,
            seed_image: "seed:1".into(),
            host_paths: HostPaths::Labelled,
        }
    }

    /// A namespace that enforces no Pod Security level may still refuse hostPath volumes
    /// (cluster-wide defaults, SCCs, policy engines): the cache comes from the node's disk
    /// only where that is known to be allowed, else from an image volume, else not at all,
    /// so the mutation never makes a pod its namespace refuses.
    #[test]
    fn host_paths_only_where_known_to_be_allowed() {
        let mut f = fake(Some("vllm-h100"), true, None);
        f.host_path.clear();
        let source = |f: &Fake, s: &Settings| {
            decide(&pod(Some("llama")), "ml", f, s).map(|ops| {
                let volumes = ops.iter().find(|o| o["path"] == "/spec/volumes").unwrap();
                let source = &volumes["value"][0];
                if source.get("hostPath").is_some() {
                    "hostPath"
                } else {
                    "image"
                }
            })
        };
        assert_eq!(
            source(&f, &settings()),
            Err(Outcome::PodSecurity),
            "unknown"
        );
        let images = Settings {
            image_volumes: true,
            ..settings()
        };
        assert_eq!(source(&f, &images), Ok("image"));
        let everywhere = Settings {
            host_paths: HostPaths::Everywhere,
            ..settings()
        };
        assert_eq!(source(&f, &everywhere), Ok("hostPath"));
        f.host_path.push("ml");
        assert_eq!(
            source(&f, &settings()),
            Ok("hostPath"),
            "labelled by its operator"
        );
        f.levels.insert("ml".into(), "baseline");
        assert_eq!(
            source(&f, &everywhere),
            Err(Outcome::PodSecurity),
            "the level wins"
        );
        assert_eq!(source(&f, &images), Ok("image"));
        f.host_path.clear();
        f.levels.insert("ml".into(), "privileged");
        assert_eq!(
            source(&f, &settings()),
            Ok("hostPath"),
            "privileged allows it"
        );
    }

    fn pod(label: Option<&str>) -> Value {
        let labels = label.map_or(json!({}), |l| json!({MODEL_DEPLOYMENT: l}));
        json!({"metadata": {"generateName": "llama-", "labels": labels}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}})
    }

    #[test]
    fn pod_security_levels_that_forbid_host_paths_get_image_volumes_or_nothing() {
        let mut f = fake(Some("vllm-h100"), true, None);
        f.levels.insert("ml".into(), "baseline");
        let s = settings();
        assert_eq!(
            decide(&pod(Some("llama")), "ml", &f, &s),
            Err(Outcome::PodSecurity)
        );
        let with_images = Settings {
            image_volumes: true,
            ..settings()
        };
        let ops = decide(&pod(Some("llama")), "ml", &f, &with_images).unwrap();
        let volume = ops.iter().find(|o| o["path"] == "/spec/volumes").unwrap();
        assert_eq!(volume["value"][0]["image"]["reference"], "r/c@sha256:ab");
        assert!(volume["value"][0].get("hostPath").is_none());
        f.levels.insert("ml".into(), "restricted");
        assert_eq!(
            decide(&pod(Some("llama")), "ml", &f, &with_images),
            Err(Outcome::PodSecurity)
        );
        f.levels.insert("ml".into(), "privileged");
        assert!(decide(&pod(Some("llama")), "ml", &f, &s).is_ok());
    }

    #[test]
    fn decisions() {
        let s = settings();
        let f = fake(Some("vllm-h100"), true, None);
        let ops = decide(&pod(Some("llama")), "ml", &f, &s).unwrap();
        let mut patched = pod(Some("llama"));
        json_patch::patch(
            &mut patched,
            &serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).unwrap(),
        )
        .unwrap();
        assert_eq!(
            patched["metadata"]["annotations"][INJECTED_ANNOTATION],
            "ml/vllm-h100@sha256:ab"
        );
        assert_eq!(
            patched["spec"]["initContainers"][0]["command"][2],
            "/kernel-cache-src/sha256-ab/io.vllm.cache/torch_compile_cache"
        );
        // Only this cache's directory of the node, never the whole root.
        assert_eq!(
            patched["spec"]["volumes"][0]["hostPath"]["path"],
            "/var/lib/kc/ml/vllm-h100"
        );
        assert!(patched["spec"]["affinity"]["nodeAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"].is_array());
        assert_eq!(
            decide(&patched, "ml", &f, &s),
            Err(Outcome::AlreadyInjected)
        );

        assert_eq!(decide(&pod(None), "ml", &f, &s), Err(Outcome::NoLabel));
        assert_eq!(
            decide(&pod(Some("other")), "ml", &f, &s),
            Err(Outcome::NoModelDeployment)
        );
        assert_eq!(
            decide(&pod(Some("llama")), "other-ns", &f, &s),
            Err(Outcome::NoModelDeployment)
        );
        let f = fake(None, true, None);
        assert_eq!(
            decide(&pod(Some("llama")), "ml", &f, &s),
            Err(Outcome::NoCacheRef)
        );
        let f = fake(Some("missing"), true, None);
        assert_eq!(
            decide(&pod(Some("llama")), "ml", &f, &s),
            Err(Outcome::CacheNotFound)
        );
        let f = fake(Some("vllm-h100"), false, None);
        assert_eq!(
            decide(&pod(Some("llama")), "ml", &f, &s),
            Err(Outcome::CacheNotUsable)
        );

        let f = fake(
            Some("vllm-h100"),
            true,
            Some(MountSpec {
                source: Some(MountSource::ImageVolume),
                require_ready_node: true,
                ..MountSpec::default()
            }),
        );
        let ops = decide(&pod(Some("llama")), "ml", &f, &s).unwrap();
        let text = serde_json::to_string(&ops).unwrap();
        assert!(text.contains(r#""reference":"r/c@sha256:ab""#), "{text}");
        assert!(
            text.contains("requiredDuringSchedulingIgnoredDuringExecution"),
            "{text}"
        );
    }

    #[test]
    fn malformed_and_foreign_requests_are_allowed_unchanged() {
        let f = fake(Some("vllm-h100"), true, None);
        for body in [&b"not json"[..], br#"{"kind":"AdmissionReview"}"#, br#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u1"}}"#] {
            let (resp, outcome) = review(body, &f, &settings());
            assert!(resp.allowed);
            assert!(resp.patch.is_none());
            assert_eq!(outcome, Outcome::Skipped);
        }
    }
}

/// The property target for the pod webhook's input: whatever pod (volumes, init
/// containers, containers with mounts and environment, annotations, drawn from names and
/// paths that collide with ours) or request bytes arrive, the answer allows the pod, and
/// a patch applies cleanly and leaves a pod the API server would accept: volume and init
/// container names unique, no two mounts of a container at one path. Cases:
/// `PROPTEST_CASES`.
#[cfg(test)]
mod properties {
    use std::collections::{BTreeMap, BTreeSet};

    use proptest::prelude::*;
    use serde_json::{Value, json};

    use super::*;
    use kubeairunway_kernelcache_api::{KernelCacheSpec, KernelCacheStatus, Verification};
    use kubeairunway_sdk::api::KernelCacheRef;

    struct One {
        md: Arc<ModelDeployment>,
        cache: Arc<KernelCache>,
    }

    impl Lookup for One {
        fn model_deployment(&self, _: &str, name: &str) -> Option<Arc<ModelDeployment>> {
            (name == "llama").then(|| Arc::clone(&self.md))
        }
        fn kernel_cache(&self, _: &str, name: &str) -> Option<Arc<KernelCache>> {
            (name == "c").then(|| Arc::clone(&self.cache))
        }
        fn namespace_labels(&self, _: &str) -> Option<BTreeMap<String, String>> {
            None
        }
    }

    fn lookup(cache_type: &str) -> One {
        let mut md: ModelDeployment = serde_json::from_value(json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "ml"},
            "spec": {"model": {"id": "m"}, "engine": {"type": "vllm"}},
        }))
        .unwrap();
        md.spec.kernel_cache = Some(KernelCacheRef { name: "c".into() });
        let mut cache = KernelCache::new(
            "c",
            KernelCacheSpec {
                image: "r/c:1".into(),
                ..KernelCacheSpec::default()
            },
        );
        cache.status = Some(KernelCacheStatus {
            resolved_digest: Some("sha256:ab".into()),
            pinned_image: Some("r/c@sha256:ab".into()),
            cache_type: Some(cache_type.into()),
            verification: Some(Verification {
                verified: true,
                ..Verification::default()
            }),
            ..KernelCacheStatus::default()
        });
        One {
            md: Arc::new(md),
            cache: Arc::new(cache),
        }
    }

    fn name() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("kernel-cache-c".to_string()),
            Just("kernel-cache-c-src".to_string()),
            Just(inject::SEED_CONTAINER.to_string()),
            Just("data".to_string()),
            Just("x".to_string()),
        ]
    }

    fn path() -> impl Strategy<Value = String> {
        prop_oneof![
            Just("/root/.cache/vllm/torch_compile_cache".to_string()),
            Just("/root/.cache/vllm/torch_compile_cache/".to_string()),
            Just("/var/cache/kubeairunway/kernels/c".to_string()),
            Just("/cache/torch_compile_cache".to_string()),
            Just("/data".to_string()),
        ]
    }

    fn container() -> impl Strategy<Value = Value> {
        (
            name(),
            proptest::collection::vec((name(), path()), 0..3),
            proptest::option::of(prop_oneof![Just("/cache"), Just("/root/.cache/vllm")]),
            any::<bool>(),
        )
            .prop_map(|(n, mounts, root, triton_env)| {
                let mut c = json!({"name": n, "image": "i"});
                if !mounts.is_empty() {
                    c["volumeMounts"] = mounts
                        .into_iter()
                        .map(|(name, path)| json!({"name": name, "mountPath": path}))
                        .collect();
                }
                let mut env = Vec::new();
                if let Some(root) = root {
                    env.push(json!({"name": "VLLM_CACHE_ROOT", "value": root}));
                }
                if triton_env {
                    env.push(json!({"name": "TRITON_CACHE_DIR", "value": "/old"}));
                }
                if !env.is_empty() {
                    c["env"] = Value::Array(env);
                }
                c
            })
    }

    fn pod() -> impl Strategy<Value = Value> {
        (
            proptest::option::of(proptest::collection::vec(name(), 0..3)),
            proptest::option::of(proptest::collection::vec(name(), 0..2)),
            proptest::collection::vec(container(), 0..3),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(volumes, inits, containers, annotated, affinity)| {
                let mut spec = json!({"containers": containers});
                if let Some(v) = volumes {
                    spec["volumes"] = v
                        .into_iter()
                        .map(|n| json!({"name": n, "emptyDir": {}}))
                        .collect();
                }
                if let Some(i) = inits {
                    spec["initContainers"] = i
                        .into_iter()
                        .map(|n| json!({"name": n, "image": "i"}))
                        .collect();
                }
                if affinity {
                    spec["affinity"] = json!({"nodeAffinity": {}});
                }
                let mut metadata = json!({"name": "p", "labels": {MODEL_DEPLOYMENT: "llama"}});
                if annotated {
                    metadata["annotations"] = json!({"a": "b"});
                }
                json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec})
            })
    }

    fn unique<'a>(items: impl Iterator<Item = &'a Value>, key: &str) -> bool {
        let names: Vec<String> = items
            .filter_map(|i| i[key].as_str().map(|s| s.trim_end_matches('/').to_string()))
            .collect();
        names.len() == names.iter().collect::<BTreeSet<_>>().len()
    }

    fn valid_after(before: &Value, patched: &Value) -> Result<(), String> {
        let spec = &patched["spec"];
        let was_valid = |v: &Value| {
            unique(
                v["spec"]["volumes"].as_array().into_iter().flatten(),
                "name",
            ) && unique(
                v["spec"]["initContainers"].as_array().into_iter().flatten(),
                "name",
            ) && v["spec"]["containers"]
                .as_array()
                .into_iter()
                .flatten()
                .all(|c| {
                    unique(
                        c["volumeMounts"].as_array().into_iter().flatten(),
                        "mountPath",
                    )
                })
        };
        if was_valid(before) && !was_valid(patched) {
            return Err(format!("a valid pod became invalid: {spec}"));
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn any_pod_is_allowed_and_stays_valid(pod in pod(), triton in any::<bool>()) {
            let lookup = lookup(if triton { "triton" } else { "vllm" });
            let settings = Settings {
                cache_root: "/var/lib/kc".into(),
                seed_image: "seed".into(),
                image_volumes: false,
                host_paths: HostPaths::Everywhere,
            };
            let review_body = serde_json::to_vec(&json!({
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "namespace": "ml", "operation": "CREATE",
                    "userInfo": {"username": "u"}, "object": pod,
                },
            })).unwrap();
            let (response, _) = review(&review_body, &lookup, &settings);
            prop_assert!(response.allowed);
            if let Ok(ops) = decide(&pod, "ml", &lookup, &settings) {
                let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops)).unwrap();
                let mut patched = pod.clone();
                json_patch::patch(&mut patched, &patch).map_err(|e| TestCaseError::fail(e.to_string()))?;
                valid_after(&pod, &patched).map_err(TestCaseError::fail)?;
            }
        }

        #[test]
        fn any_bytes_are_allowed(body in proptest::collection::vec(any::<u8>(), 0..256)) {
            let lookup = lookup("vllm");
            let settings = Settings {
                cache_root: "/r".into(),
                seed_image: "s".into(),
                image_volumes: true,
                host_paths: HostPaths::Labelled,
            };
            prop_assert!(review(&body, &lookup, &settings).0.allowed);
        }
    }
}
