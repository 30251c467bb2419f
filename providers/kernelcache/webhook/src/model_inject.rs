//! Model caches in serving pods: a pod of a ModelDeployment whose model a Ready
//! `ModelCache` of its namespace holds gets that cache's claim (a local PersistentVolume
//! on the nodes where the download is complete, made by the controller) mounted
//! read-only, and the environment that makes Hugging Face libraries read it offline.
//!
//! - **Which cache** ([`choose`]): the one `spec.model.cacheRef` names, else a Ready
//!   ModelCache of `hf://<spec.model.id>` at revision `main` (the revision the engines
//!   load; the first by name when several match). A named cache that does not exist or is
//!   not Ready, or none matching: the pod is left as it is and the engine downloads the
//!   model itself.
//! - **Ready**: `Ready=True` for the current generation, at least one ready node, and the
//!   claim named in the status. The claim's volume requires the ready label, so the
//!   scheduler puts the pod only on a node where the download is complete.
//! - **Each serving container** (`spec.containers`): the claim at
//!   `<HF_HUB_CACHE>/models--{org}--{name}`, read-only, where `HF_HUB_CACHE` is the
//!   container's own value when it sets one, else [`MODEL_MOUNT_ROOT`] (then set);
//!   `HF_HUB_OFFLINE=1` unless the container sets it (a user's value is never replaced).
//! - **Never an invalid pod** ([`patch`]): a pod with a volume named [`VOLUME`] already,
//!   a container mounting something at that path, or setting `HF_HUB_CACHE` from a
//!   reference (its path unknown) is left alone, and why is logged.
//! - **Pod Security**: a `persistentVolumeClaim` volume and a read-only mount are allowed
//!   at every level, `restricted` included; nothing else of the pod changes.

use std::sync::Arc;

use kubeairunway_kernelcache_api::model::{self, Chosen, ModelCache, NotChosen};
use kubeairunway_kernelcache_api::names::{MODEL_MOUNT_ROOT, hub_folder};
use kubeairunway_sdk::ModelDeployment;
use kubeairunway_sdk::labels::MODEL_DEPLOYMENT;
use serde_json::{Value, json};

use crate::inject::append;

/// The annotation naming the mounted model cache: `<namespace>/<name>@<commit>`.
pub const MODEL_INJECTED_ANNOTATION: &str = "cache.kubeairunway.ai/model-cache";
/// The pod's volume of the cache's claim.
pub const VOLUME: &str = "kubeairunway-model-cache";
/// Where Hugging Face libraries look for the hub cache.
pub const HF_HUB_CACHE: &str = "HF_HUB_CACHE";
/// Set to `1`: Hugging Face libraries make no request to the hub.
pub const HF_HUB_OFFLINE: &str = "HF_HUB_OFFLINE";

/// What happened to one pod's model cache (a metrics label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModelOutcome {
    /// The cache was mounted.
    Injected,
    /// Not a serving pod of ours.
    NoLabel,
    /// Its ModelDeployment is not (yet) known.
    NoModelDeployment,
    /// No cache named, and no Ready cache holds the model.
    NoCache,
    /// The named cache does not exist.
    CacheNotFound,
    /// The named cache is not Ready (or its claim not made yet).
    CacheNotReady,
    /// The pod has a model cache already.
    AlreadyInjected,
    /// The pod uses our volume name or mount path: left as it is.
    Conflict,
    /// Not a Pod CREATE, or a request that could not be read.
    Skipped,
}

impl ModelOutcome {
    /// The log value.
    pub fn as_str(self) -> &'static str {
        match self {
            ModelOutcome::Injected => "injected",
            ModelOutcome::NoLabel => "no-label",
            ModelOutcome::NoModelDeployment => "no-model-deployment",
            ModelOutcome::NoCache => "no-cache",
            ModelOutcome::CacheNotFound => "cache-not-found",
            ModelOutcome::CacheNotReady => "cache-not-ready",
            ModelOutcome::AlreadyInjected => "already-injected",
            ModelOutcome::Conflict => "conflict",
            ModelOutcome::Skipped => "skipped",
        }
    }
}

/// The cache a ModelDeployment's pods mount, among `caches` (those of its namespace):
/// [`model::choose`], its refusals as outcomes.
pub fn choose(md: &ModelDeployment, caches: &[Arc<ModelCache>]) -> Result<Chosen, ModelOutcome> {
    model::choose(&md.spec.model, caches).map_err(|why| match why {
        NotChosen::NotFound(_) => ModelOutcome::CacheNotFound,
        NotChosen::NotReady(_) if md.spec.model.cache_ref.is_some() => ModelOutcome::CacheNotReady,
        NotChosen::NotReady(_) | NotChosen::NoCache => ModelOutcome::NoCache,
    })
}

/// The patch mounting the model cache the pod's ModelDeployment uses, or why there is
/// none; `model_deployment` finds a ModelDeployment of the pod's namespace by name,
/// `caches` gives the namespace's ModelCaches (look-ups in watch caches).
pub fn decide(
    pod: &Value,
    namespace: &str,
    model_deployment: impl FnOnce(&str) -> Option<Arc<ModelDeployment>>,
    caches: impl FnOnce() -> Vec<Arc<ModelCache>>,
) -> Result<Vec<Value>, ModelOutcome> {
    let md_name = pod["metadata"]["labels"][MODEL_DEPLOYMENT]
        .as_str()
        .ok_or(ModelOutcome::NoLabel)?;
    if pod["metadata"]["annotations"][MODEL_INJECTED_ANNOTATION].is_string() {
        return Err(ModelOutcome::AlreadyInjected);
    }
    let md = model_deployment(md_name).ok_or(ModelOutcome::NoModelDeployment)?;
    let chosen = choose(&md, &caches())?;
    patch(pod, namespace, &chosen).map_err(|why| {
        tracing::info!(namespace, cache = %chosen.name, reason = %why, "model cache not mounted");
        ModelOutcome::Conflict
    })
}

/// Where container `c` reads the hub cache: its own literal `HF_HUB_CACHE`, else
/// [`MODEL_MOUNT_ROOT`] (and whether to set it); an error when it sets it from a
/// reference.
fn hub_dir(c: &Value) -> Result<(String, bool), String> {
    let mut env = c["env"].as_array().into_iter().flatten();
    match env.find(|v| v["name"] == HF_HUB_CACHE) {
        Some(v) => v["value"]
            .as_str()
            .filter(|p| p.starts_with('/'))
            .map(|p| (p.trim_end_matches('/').to_string(), false))
            .ok_or_else(|| {
                format!(
                    "container {} sets {HF_HUB_CACHE} to no absolute path",
                    c["name"].as_str().unwrap_or_default()
                )
            }),
        None => Ok((MODEL_MOUNT_ROOT.to_string(), true)),
    }
}

/// The JSON patch: the claim's volume, each container's read-only mount and environment
/// ([`container_ops`]), the annotation naming the cache. An error (the pod is left
/// alone) when a name or path of ours is taken or a container has no containers.
pub fn patch(pod: &Value, namespace: &str, chosen: &Chosen) -> Result<Vec<Value>, String> {
    let spec = &pod["spec"];
    if spec["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|v| v["name"] == VOLUME)
    {
        return Err(format!("the pod already has a volume named {VOLUME}"));
    }
    let containers = spec["containers"]
        .as_array()
        .filter(|c| !c.is_empty())
        .ok_or("the pod has no containers")?;
    let mut ops = Vec::new();
    let volume = json!({"name": VOLUME, "persistentVolumeClaim": {"claimName": chosen.claim, "readOnly": true}});
    append(&mut ops, spec, "volumes", "/spec", vec![volume]);
    for (i, c) in containers.iter().enumerate() {
        container_ops(&mut ops, i, c, chosen)?;
    }
    let value = format!("{namespace}/{}@{}", chosen.name, chosen.commit);
    if pod["metadata"]["annotations"].is_object() {
        let key = MODEL_INJECTED_ANNOTATION
            .replace('~', "~0")
            .replace('/', "~1");
        ops.push(
            json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": value}),
        );
    } else {
        ops.push(json!({"op": "add", "path": "/metadata/annotations", "value": {MODEL_INJECTED_ANNOTATION: value}}));
    }
    Ok(ops)
}

/// Container `i` mounts the claim read-only at `<its hub cache>/<folder>` and gets
/// `HF_HUB_CACHE` and `HF_HUB_OFFLINE=1` where it does not set them; an error when it
/// mounts something there already.
fn container_ops(ops: &mut Vec<Value>, i: usize, c: &Value, chosen: &Chosen) -> Result<(), String> {
    let (dir, set_dir) = hub_dir(c)?;
    let mount_path = format!("{dir}/{}", hub_folder(&chosen.repo));
    let name = c["name"].as_str().unwrap_or_default();
    for m in c["volumeMounts"].as_array().into_iter().flatten() {
        if m["mountPath"].as_str().map(|p| p.trim_end_matches('/')) == Some(mount_path.as_str()) {
            return Err(format!(
                "container {name} already mounts {} at {mount_path}",
                m["name"].as_str().unwrap_or_default()
            ));
        }
    }
    let path = format!("/spec/containers/{i}");
    let mount = json!({"name": VOLUME, "mountPath": mount_path, "readOnly": true});
    append(ops, c, "volumeMounts", &path, vec![mount]);
    let has = |n: &str| {
        c["env"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|v| v["name"] == n)
    };
    let mut env = Vec::new();
    if set_dir {
        env.push(json!({"name": HF_HUB_CACHE, "value": dir}));
    }
    if !has(HF_HUB_OFFLINE) {
        env.push(json!({"name": HF_HUB_OFFLINE, "value": "1"}));
    }
    if !env.is_empty() {
        append(ops, c, "env", &path, env);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
    use kubeairunway_kernelcache_api::model::{ModelCacheSpec, ModelCacheStatus};
    use kubeairunway_sdk::api::{ModelCacheRef, ModelSource};

    fn cache(name: &str, source: &str, ready_nodes: i32) -> Arc<ModelCache> {
        let mut c = ModelCache::new(
            name,
            ModelCacheSpec {
                source: source.into(),
                ..ModelCacheSpec::default()
            },
        );
        c.metadata.generation = Some(1);
        c.status = Some(ModelCacheStatus {
            ready_nodes,
            resolved_commit: Some("abc".into()),
            claim_name: Some(format!("modelcache-{name}")),
            observed_generation: Some(1),
            conditions: vec![Condition {
                type_: model::conditions::READY.into(),
                status: if ready_nodes > 0 { "True" } else { "False" }.into(),
                reason: "Ready".into(),
                message: String::new(),
                last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
                ),
                observed_generation: Some(1),
            }],
            ..ModelCacheStatus::default()
        });
        Arc::new(c)
    }

    fn md(id: &str, named: Option<&str>) -> ModelDeployment {
        let mut md = ModelDeployment::new(
            "llama",
            serde_json::from_value(json!({"model": {"id": id}})).unwrap(),
        );
        md.spec.model.cache_ref = named.map(|n| ModelCacheRef { name: n.into() });
        md
    }

    fn pod(containers: &Value) -> Value {
        json!({"metadata": {"labels": {MODEL_DEPLOYMENT: "llama"}}, "spec": {"containers": containers.clone()}})
    }

    fn apply(pod: &Value, ops: Vec<Value>) -> Value {
        let mut p = pod.clone();
        json_patch::patch(
            &mut p,
            &serde_json::from_value::<json_patch::Patch>(Value::Array(ops)).unwrap(),
        )
        .unwrap();
        p
    }

    /// The rule is `model::choose`'s (tested there); the webhook maps its refusals to
    /// outcomes: a cache holding the model but not Ready is no cache for a pod that names
    /// none, and not ready for one that names it.
    #[test]
    fn the_rules_refusals_become_the_webhooks_outcomes() {
        let caches = vec![
            cache("b-qwen", "hf://Qwen/Qwen3", 1),
            cache("a-llama", "hf://meta/llama", 0),
        ];
        let chosen = choose(&md("Qwen/Qwen3", None), &caches).unwrap();
        assert_eq!(
            (chosen.name.as_str(), chosen.claim.as_str()),
            ("b-qwen", "modelcache-b-qwen")
        );
        assert_eq!(
            choose(&md("meta/llama", None), &caches),
            Err(ModelOutcome::NoCache)
        );
        assert_eq!(
            choose(&md("meta/llama", Some("a-llama")), &caches),
            Err(ModelOutcome::CacheNotReady)
        );
        assert_eq!(
            choose(&md("Qwen/Qwen3", Some("nope")), &caches),
            Err(ModelOutcome::CacheNotFound)
        );
        assert_eq!(
            choose(&md("x/y", None), &caches),
            Err(ModelOutcome::NoCache)
        );
        let mut custom = md("Qwen/Qwen3", None);
        custom.spec.model.source = ModelSource::Custom;
        assert_eq!(choose(&custom, &caches), Err(ModelOutcome::NoCache));
    }

    fn chosen() -> Chosen {
        Chosen {
            name: "qwen".into(),
            claim: "modelcache-qwen".into(),
            repo: "Qwen/Qwen3".into(),
            commit: "abc".into(),
            ready_nodes: 1,
        }
    }

    #[test]
    fn every_container_gets_the_claim_read_only_and_the_environment_it_lacks() {
        let p = pod(&json!([
            {"name": "a", "image": "vllm"},
            {"name": "b", "image": "vllm", "env": [
                {"name": "HF_HUB_CACHE", "value": "/data/hub/"},
                {"name": "HF_HUB_OFFLINE", "value": "0"},
            ], "volumeMounts": [{"name": "data", "mountPath": "/data"}]},
        ]));
        let out = apply(&p, patch(&p, "ml", &chosen()).unwrap());
        let spec = &out["spec"];
        assert_eq!(
            spec["volumes"],
            json!([{"name": VOLUME, "persistentVolumeClaim": {"claimName": "modelcache-qwen", "readOnly": true}}])
        );
        let a = &spec["containers"][0];
        assert_eq!(
            a["volumeMounts"],
            json!([{"name": VOLUME, "mountPath": "/models/hf/models--Qwen--Qwen3", "readOnly": true}])
        );
        assert_eq!(
            a["env"],
            json!([{"name": "HF_HUB_CACHE", "value": "/models/hf"}, {"name": "HF_HUB_OFFLINE", "value": "1"}])
        );
        let b = &spec["containers"][1];
        assert_eq!(
            b["volumeMounts"][1]["mountPath"],
            "/data/hub/models--Qwen--Qwen3"
        );
        assert_eq!(b["env"][0]["value"], "/data/hub/", "the user's values stay");
        assert_eq!(b["env"][1]["value"], "0");
        assert_eq!(b["env"].as_array().unwrap().len(), 2);
        assert_eq!(
            out["metadata"]["annotations"][MODEL_INJECTED_ANNOTATION],
            "ml/qwen@abc"
        );
    }

    #[test]
    fn a_pod_using_our_name_or_path_is_left_alone() {
        let taken = json!({"metadata": {}, "spec": {"volumes": [{"name": VOLUME, "emptyDir": {}}], "containers": [{"name": "a"}]}});
        assert!(patch(&taken, "ml", &chosen()).is_err());
        let mounted = pod(
            &json!([{"name": "a", "volumeMounts": [{"name": "x", "mountPath": "/models/hf/models--Qwen--Qwen3/"}]}]),
        );
        assert!(patch(&mounted, "ml", &chosen()).is_err());
        let referenced = pod(
            &json!([{"name": "a", "env": [{"name": "HF_HUB_CACHE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}]),
        );
        assert!(patch(&referenced, "ml", &chosen()).is_err());
        assert!(patch(&pod(&json!([])), "ml", &chosen()).is_err());
    }
}
