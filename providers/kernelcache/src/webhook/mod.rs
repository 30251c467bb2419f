//! The pod-injection webhook: a mutating admission webhook on Pods that carry
//! `kubeairunway.ai/model-deployment` (every serving pod a provider renders). When that
//! ModelDeployment names a KernelCache whose pin is usable, the pod gets the cache
//! ([`crate::inject`]) and an annotation naming it.
//!
//! It never refuses a pod: everything else (no label, no ModelDeployment, no cache, a
//! cache not verified, a malformed request) is allowed unchanged, and the webhook
//! configuration's `failurePolicy: Ignore` covers the webhook being down. Look-ups come
//! from reflector caches ([`Lookup`]), so admission makes no API round trip.

pub mod app;

use std::sync::Arc;

use kube::ResourceExt;
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use kube::runtime::reflector::{ObjectRef, Store};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::labels::MODEL_DEPLOYMENT;
use serde_json::{Value, json};

use crate::api::{KernelCache, MountSource};
use crate::image::CacheType;
use crate::inject::{self, Mount, Source};

/// The annotation naming the injected cache: `<namespace>/<name>@<digest>`.
pub const INJECTED_ANNOTATION: &str = "cache.kubeairunway.ai/injected";
/// The webhook's path.
pub const PATH: &str = "/mutate-pod";

/// Where the webhook finds ModelDeployments and KernelCaches.
pub trait Lookup: Send + Sync {
    /// The ModelDeployment `namespace/name`.
    fn model_deployment(&self, namespace: &str, name: &str) -> Option<Arc<ModelDeployment>>;
    /// The KernelCache `namespace/name`.
    fn kernel_cache(&self, namespace: &str, name: &str) -> Option<Arc<KernelCache>>;
}

/// Look-ups in reflector stores.
#[derive(Clone)]
pub struct Stores {
    /// ModelDeployments, every namespace.
    pub model_deployments: Store<ModelDeployment>,
    /// KernelCaches, every namespace.
    pub kernel_caches: Store<KernelCache>,
}

impl std::fmt::Debug for Stores {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stores").finish_non_exhaustive()
    }
}

impl Lookup for Stores {
    fn model_deployment(&self, namespace: &str, name: &str) -> Option<Arc<ModelDeployment>> {
        self.model_deployments
            .get(&ObjectRef::new(name).within(namespace))
    }
    fn kernel_cache(&self, namespace: &str, name: &str) -> Option<Arc<KernelCache>> {
        self.kernel_caches
            .get(&ObjectRef::new(name).within(namespace))
    }
}

/// What the webhook adds besides the cache itself.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The agent's cache root on the nodes.
    pub cache_root: String,
    /// The image with `kernelcache-seed`.
    pub seed_image: String,
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
            Outcome::Skipped => "skipped",
        }
    }
}

/// The patch for a pod (as JSON) in `namespace`, or why there is none.
pub fn decide(
    pod: &Value,
    namespace: &str,
    lookup: &dyn Lookup,
    settings: &Settings,
) -> Result<Vec<Value>, Outcome> {
    let md_name = pod["metadata"]["labels"][MODEL_DEPLOYMENT]
        .as_str()
        .ok_or(Outcome::NoLabel)?;
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
    let status = cache.status.clone().unwrap_or_default();
    let image = status.usable_image().ok_or(Outcome::CacheNotUsable)?;
    let cache_type = match status.cache_type.as_deref() {
        Some("triton") => CacheType::Triton,
        Some("vllm") => CacheType::Vllm,
        _ => return Err(Outcome::CacheNotUsable),
    };
    let digest = status.resolved_digest.clone().unwrap_or_default();
    let mount_spec = cache.spec.mount.clone().unwrap_or_default();
    let source = match mount_spec.source.unwrap_or_default() {
        MountSource::HostPath => Source::HostPath {
            root: settings.cache_root.clone(),
            staged: format!("{namespace}/{cache_name}/{}", digest.replace(':', "-")),
        },
        MountSource::ImageVolume => Source::Image(image.to_string()),
    };
    let mount = Mount {
        name: cache_name.clone(),
        cache_type,
        source,
        path: mount_spec.path,
        seed_image: settings.seed_image.clone(),
    };
    let mut ops = inject::patch(pod, &mount);
    if ops.is_empty() {
        return Err(Outcome::AlreadyInjected);
    }
    let label = inject::ready_label(namespace, &cache_name);
    ops.extend(if mount_spec.require_ready_node {
        inject::node_affinity_patch(pod, &label)
    } else {
        inject::preferred_affinity_patch(pod, &label)
    });
    let value = format!("{namespace}/{cache_name}@{digest}");
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
        return (resp, Outcome::Skipped);
    };
    let resp = AdmissionResponse::from(&request);
    let pod = match (&request.operation, &request.object) {
        (Operation::Create, Some(pod)) if request.kind.kind == "Pod" => pod,
        _ => return (resp, Outcome::Skipped),
    };
    let Ok(pod) = serde_json::to_value(pod) else {
        return (resp, Outcome::Skipped);
    };
    let namespace = request
        .namespace
        .clone()
        .or_else(|| pod["metadata"]["namespace"].as_str().map(str::to_string))
        .unwrap_or_default();
    match decide(&pod, &namespace, lookup, settings) {
        Ok(ops) => match serde_json::from_value::<json_patch::Patch>(Value::Array(ops)) {
            Ok(patch) => match resp.clone().with_patch(patch) {
                Ok(r) => {
                    tracing::info!(namespace, pod = %pod_name(&pod), "kernel cache injected");
                    (r, Outcome::Injected)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "serializing the patch");
                    (resp, Outcome::Skipped)
                }
            },
            Err(e) => {
                tracing::warn!(error = %e, "building the patch");
                (resp, Outcome::Skipped)
            }
        },
        Err(outcome) => (resp, outcome),
    }
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
    use crate::api::{KernelCacheSpec, KernelCacheStatus, MountSpec, Verification};
    use kubeairunway_sdk::api::KernelCacheRef;

    #[derive(Default)]
    struct Fake {
        mds: BTreeMap<String, Arc<ModelDeployment>>,
        caches: BTreeMap<String, Arc<KernelCache>>,
    }

    impl Lookup for Fake {
        fn model_deployment(&self, ns: &str, name: &str) -> Option<Arc<ModelDeployment>> {
            self.mds.get(&format!("{ns}/{name}")).cloned()
        }
        fn kernel_cache(&self, ns: &str, name: &str) -> Option<Arc<KernelCache>> {
            self.caches.get(&format!("{ns}/{name}")).cloned()
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
        }
    }

    fn settings() -> Settings {
        Settings {
            cache_root: "/var/lib/kc".into(),
            seed_image: "seed:1".into(),
        }
    }

    fn pod(label: Option<&str>) -> Value {
        let labels = label.map_or(json!({}), |l| json!({MODEL_DEPLOYMENT: l}));
        json!({"metadata": {"generateName": "llama-", "labels": labels}, "spec": {"containers": [{"name": "vllm", "image": "vllm"}]}})
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
            "/kernel-cache-src/ml/vllm-h100/sha256-ab/io.vllm.cache/torch_compile_cache"
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
