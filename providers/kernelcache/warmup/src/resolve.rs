//! What a Warmup does on each node, from its spec and its target: pure.
//!
//! Images come from `imagesPreload`; for a `targetModelDeployment`, its image
//! (`spec.engine.image`, or `spec.image`) is added, its `spec.kernelCache` staged too and
//! the ModelCache its pods mount downloaded too. A `targetModelDeployment` without
//! `imagesPreload` preloads the images its provider renders for it, as the provider
//! runtime reports them (`status.provider.images` for the current generation); the
//! warmup waits until they are reported. Images are fixed in `status.images` when the
//! warmup starts, so every node gets the same. The custom pod template is parsed strictly.

use std::borrow::Borrow;

use kubeairunway_kernelcache_api::model::{self, ModelCache, NotChosen};
use kubeairunway_sdk::ModelDeployment;

use super::pod::{Actions, parse_template};
use super::policy::Policy;
use kubeairunway_sdk::api::warmup::reasons;
use kubeairunway_sdk::api::{Warmup, WarmupPhase};

/// Whether a Warmup can run, and what it does.
#[derive(Clone, Debug, PartialEq)]
pub enum Resolved {
    /// Run with these actions.
    Ready(Box<Actions>),
    /// Not yet: `(reason, message)`.
    Waiting(&'static str, String),
    /// Never: the spec cannot run.
    Invalid(String),
}

/// The actions of `warmup`, whose target ModelDeployment is `md` (looked up in the
/// Warmup's namespace; `None` when absent or when the target is nodes), its custom
/// action held to `policy`; `model_caches` are the ModelCaches of the Warmup's namespace
/// (the one `md`'s pods mount is waited for).
pub fn resolve<C: Borrow<ModelCache>>(
    warmup: &Warmup,
    md: Option<&ModelDeployment>,
    policy: &Policy,
    model_caches: &[C],
) -> Resolved {
    let spec = &warmup.spec;
    let custom = match spec
        .custom_action
        .as_ref()
        .map(|c| parse_template(&c.pod_template, policy))
    {
        None => None,
        Some(Ok(t)) => Some(t),
        Some(Err(e)) => return Resolved::Invalid(e),
    };
    let mut tolerations = spec.tolerations.clone().unwrap_or_default();
    let status = warmup.status.clone().unwrap_or_default();
    let started = status.phase == Some(WarmupPhase::InProgress);
    let images = if let Some(target) = &spec.target_model_deployment {
        let Some(md) = md else {
            return Resolved::Waiting(
                reasons::TARGET_NOT_FOUND,
                format!("there is no ModelDeployment '{}'", target.name),
            );
        };
        tolerations.extend(md.spec.tolerations.clone().unwrap_or_default());
        if started {
            status.images.clone()
        } else if let Some(preload) = &spec.images_preload {
            let mut images = preload.items.clone();
            images.extend(md.spec.effective_image().map(str::to_string));
            images
        } else if let Some(images) = reported_images(md) {
            images
        } else {
            return Resolved::Waiting(
                reasons::IMAGES_NOT_REPORTED,
                format!(
                    "waiting for the provider of ModelDeployment '{}' to report the images it renders for generation {} (status.provider.images), to preload them; set imagesPreload to name them instead",
                    target.name,
                    md.metadata.generation.unwrap_or_default()
                ),
            );
        }
    } else {
        spec.images_preload
            .as_ref()
            .map(|p| p.items.clone())
            .unwrap_or_default()
    };
    let mut unique = Vec::with_capacity(images.len());
    for image in images {
        if !unique.contains(&image) {
            unique.push(image);
        }
    }
    let mut kernel_caches = spec.kernel_caches.clone().unwrap_or_default();
    if let Some(cache) = md.and_then(|m| m.spec.kernel_cache.as_ref())
        && !kernel_caches.contains(&cache.name)
    {
        kernel_caches.push(cache.name.clone());
    }
    let mut models = spec.model_caches.clone().unwrap_or_default();
    if let Some(cache) = md.and_then(|m| mounted_model_cache(m, model_caches))
        && !models.contains(&cache)
    {
        models.push(cache);
    }
    if unique.is_empty() && kernel_caches.is_empty() && models.is_empty() && custom.is_none() {
        let name = spec
            .target_model_deployment
            .as_ref()
            .map(|t| t.name.as_str())
            .unwrap_or_default();
        return Resolved::Waiting(
            reasons::NOTHING_TO_WARM,
            format!(
                "nothing to warm: the provider of ModelDeployment '{name}' renders no image (its upstream operator picks it), the ModelDeployment names no kernel cache (spec.kernelCache) and no ModelCache holds its model, and the Warmup sets no imagesPreload, kernelCaches, modelCaches or customAction"
            ),
        );
    }
    Resolved::Ready(Box::new(Actions {
        images: unique,
        pull_secrets: spec
            .images_preload
            .as_ref()
            .map(|p| p.pull_secrets.clone())
            .unwrap_or_default(),
        kernel_caches,
        model_caches: models,
        custom,
        tolerations,
    }))
}

/// The ModelCache `md`'s pods mount, or would once it is Ready (`model::choose`, the pod
/// webhook's rule): the one it names (waited for if it does not exist yet), else the
/// Ready one holding its model, else the first holding it.
fn mounted_model_cache<C: Borrow<ModelCache>>(
    md: &ModelDeployment,
    caches: &[C],
) -> Option<String> {
    match model::choose(&md.spec.model, caches) {
        Ok(chosen) => Some(chosen.name),
        Err(NotChosen::NotFound(name) | NotChosen::NotReady(name)) => Some(name),
        Err(NotChosen::NoCache) => None,
    }
}

/// The images `md`'s provider reports for its current generation (`None`: not reported
/// for it yet).
fn reported_images(md: &ModelDeployment) -> Option<Vec<String>> {
    let status = md.status.as_ref()?;
    if status.observed_generation != md.metadata.generation {
        return None;
    }
    status.provider.as_ref()?.images.clone()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use serde_json::json;

    /// No ModelCache in the namespace.
    const NONE: &[ModelCache] = &[];

    fn warmup(spec: serde_json::Value, phase: Option<&str>) -> Warmup {
        let mut w: Warmup = serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "Warmup",
            "metadata": {"name": "w", "namespace": "ml"}, "spec": spec,
        }))
        .unwrap();
        if let Some(p) = phase {
            w.status =
                Some(serde_json::from_value(json!({"phase": p, "images": ["frozen:1"]})).unwrap());
        }
        w
    }

    fn md(image: Option<&str>, cache: Option<&str>) -> ModelDeployment {
        let mut v = json!({
            "apiVersion": "kubeairunway.ai/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "ml", "generation": 2},
            "spec": {"model": {"id": "a/b"}, "engine": {"type": "llamacpp"},
                     "tolerations": [{"key": "gpu", "operator": "Exists"}]},
        });
        if let Some(i) = image {
            v["spec"]["image"] = json!(i);
        }
        if let Some(c) = cache {
            v["spec"]["kernelCache"] = json!({"name": c});
        }
        serde_json::from_value(v).unwrap()
    }

    /// `md` as its provider reports the `images` it renders for `generation`.
    fn reported(mut md: ModelDeployment, generation: i64, images: &[&str]) -> ModelDeployment {
        md.status = Some(
            serde_json::from_value(json!({
                "observedGeneration": generation,
                "provider": {"name": "p", "images": images},
            }))
            .unwrap(),
        );
        md
    }

    fn model_cache(name: &str, source: &str, ready: bool) -> ModelCache {
        let status = if ready {
            json!({"observedGeneration": 1, "readyNodes": 1, "claimName": "c", "resolvedCommit": "abc",
                   "conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                   "lastTransitionTime": "2026-01-01T00:00:00Z"}]})
        } else {
            json!({})
        };
        serde_json::from_value(json!({
            "apiVersion": "cache.kubeairunway.ai/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": name, "namespace": "ml", "generation": 1},
            "spec": {"source": source}, "status": status,
        }))
        .unwrap()
    }

    /// A target ModelDeployment's model cache is waited for: the one its pods mount (the
    /// Ready one holding its model), else the one it names or the first holding its model;
    /// with the Warmup's own, each once.
    #[test]
    fn the_target_model_deployments_model_cache_is_waited_for() {
        let w = warmup(
            json!({"targetModelDeployment": {"name": "llama"}, "imagesPreload": {"items": ["x:1"]},
                   "modelCaches": ["own", "b-ready"]}),
            None,
        );
        let target = md(None, None);
        let caches = [
            model_cache("a-pending", "hf://a/b", false),
            model_cache("b-ready", "hf://a/b", true),
            model_cache("other", "hf://c/d", true),
        ];
        let Resolved::Ready(a) = resolve(&w, Some(&target), &Policy::default(), &caches) else {
            panic!()
        };
        assert_eq!(a.model_caches, ["own", "b-ready"], "each cache once");
        let only_pending = [model_cache("a-pending", "hf://a/b", false)];
        let Resolved::Ready(a) = resolve(&w, Some(&target), &Policy::default(), &only_pending)
        else {
            panic!()
        };
        assert_eq!(a.model_caches, ["own", "b-ready", "a-pending"]);
        let mut named = target.clone();
        named.spec.model.cache_ref = Some(kubeairunway_sdk::api::ModelCacheRef {
            name: "later".into(),
        });
        let Resolved::Ready(a) = resolve(&w, Some(&named), &Policy::default(), &caches) else {
            panic!()
        };
        assert_eq!(
            a.model_caches,
            ["own", "b-ready", "later"],
            "waited for until it exists"
        );
        // Nothing else to warm but the model's cache: enough to run.
        let bare = warmup(json!({"targetModelDeployment": {"name": "llama"}}), None);
        let rendered_nothing = reported(md(None, None), 2, &[]);
        let Resolved::Ready(a) =
            resolve(&bare, Some(&rendered_nothing), &Policy::default(), &caches)
        else {
            panic!()
        };
        assert_eq!(
            (a.images.len(), a.model_caches.as_slice()),
            (0, ["b-ready".to_string()].as_slice())
        );
    }

    #[test]
    fn node_targets_preload_what_they_name() {
        let w = warmup(
            json!({"targetNodes": {"nodeNames": ["a"]},
                   "imagesPreload": {"items": ["b:1", "a:1", "b:1"], "pullSecrets": [{"name": "regcred"}]},
                   "kernelCaches": ["vadd"]}),
            None,
        );
        let Resolved::Ready(a) = resolve(&w, None, &Policy::default(), NONE) else {
            panic!()
        };
        assert_eq!(a.images, ["b:1", "a:1"]);
        assert_eq!(a.pull_secrets[0].name, "regcred");
        assert_eq!(a.kernel_caches, ["vadd"]);
        assert!(a.custom.is_none());
    }

    #[test]
    fn a_model_target_preloads_its_image_and_stages_its_cache_fixed_at_the_start() {
        let w = warmup(json!({"targetModelDeployment": {"name": "llama"}}), None);
        assert!(
            matches!(resolve(&w, None, &Policy::default(), NONE), Resolved::Waiting(r, _) if r == reasons::TARGET_NOT_FOUND)
        );
        assert!(
            matches!(resolve(&w, Some(&md(Some("llama.cpp:b1"), None)), &Policy::default(), NONE), Resolved::Waiting(r, m) if r == reasons::IMAGES_NOT_REPORTED && m.contains("generation 2")),
            "without imagesPreload, the images the provider renders are waited for"
        );
        let stale = reported(md(Some("llama.cpp:b1"), None), 1, &["old:1"]);
        assert!(
            matches!(resolve(&w, Some(&stale), &Policy::default(), NONE), Resolved::Waiting(r, _) if r == reasons::IMAGES_NOT_REPORTED),
            "images reported for an older generation are not the model's"
        );
        let nothing = reported(md(None, None), 2, &[]);
        assert!(
            matches!(resolve(&w, Some(&nothing), &Policy::default(), NONE), Resolved::Waiting(r, m) if r == reasons::NOTHING_TO_WARM && m.contains("renders no image")),
            "a provider rendering no image, no cache, no action: nothing to do"
        );
        let rendered = reported(
            md(Some("llama.cpp:b1"), Some("vadd")),
            2,
            &["busybox:1", "llama.cpp:b1"],
        );
        let Resolved::Ready(a) = resolve(&w, Some(&rendered), &Policy::default(), NONE) else {
            panic!()
        };
        assert_eq!(
            a.images,
            ["busybox:1", "llama.cpp:b1"],
            "what the provider renders"
        );
        assert_eq!(a.kernel_caches, ["vadd"]);
        assert_eq!(a.tolerations.len(), 1, "the model's tolerations");
        let with_own = warmup(
            json!({"targetModelDeployment": {"name": "llama"}, "imagesPreload": {"items": ["sidecar:1", "llama.cpp:b1"]}, "kernelCaches": ["vadd"]}),
            None,
        );
        let Resolved::Ready(a) = resolve(
            &with_own,
            Some(&md(Some("llama.cpp:b1"), Some("vadd"))),
            &Policy::default(),
            NONE,
        ) else {
            panic!()
        };
        assert_eq!(a.images, ["sidecar:1", "llama.cpp:b1"], "each image once");
        assert_eq!(a.kernel_caches, ["vadd"], "each cache once");
        let running = warmup(
            json!({"targetModelDeployment": {"name": "llama"}}),
            Some("InProgress"),
        );
        let Resolved::Ready(a) = resolve(
            &running,
            Some(&md(Some("new:2"), None)),
            &Policy::default(),
            NONE,
        ) else {
            panic!()
        };
        assert_eq!(a.images, ["frozen:1"], "a running warmup keeps its images");
    }

    #[test]
    fn the_provider_runtime_reads_this_kind_for_spec_warmup() {
        use kube::Resource;
        use kubeairunway_sdk::api::DeploymentWarmup;
        assert_eq!(Warmup::group(&()), DeploymentWarmup::GROUP);
        assert_eq!(Warmup::version(&()), DeploymentWarmup::VERSION);
        assert_eq!(Warmup::kind(&()), DeploymentWarmup::KIND);
        assert_eq!(Warmup::plural(&()), DeploymentWarmup::PLURAL);
    }

    #[test]
    fn a_broken_custom_template_is_invalid() {
        let w = warmup(
            json!({"targetNodes": {"nodeNames": ["a"]}, "customAction": {"podTemplate": {"spec": {"containers": [{"name": "c", "imagee": "x"}]}}}}),
            None,
        );
        assert!(
            matches!(resolve(&w, None, &Policy::default(), NONE), Resolved::Invalid(m) if m.contains("imagee"))
        );
    }
}
