//! What a Warmup does on each node, from its spec and its target: pure.
//!
//! Images come from `imagesPreload`; for a `targetModelDeployment`, its `spec.image` is
//! added and its `spec.kernelCache` staged too. They are fixed in `status.images` when the
//! warmup starts, so every node gets the same. The custom pod template is parsed strictly.
//!
//! Not yet: the images a ModelDeployment's provider renders when it names no image (the
//! engine's default image, a preset's image). Providers do not report them; until they do,
//! such a target needs `imagesPreload`.

use kubeairunway_sdk::ModelDeployment;

use super::api::{Warmup, WarmupPhase};
use super::pod::{Actions, parse_template};
use super::reasons;

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
/// Warmup's namespace; `None` when absent or when the target is nodes).
pub fn resolve(warmup: &Warmup, md: Option<&ModelDeployment>) -> Resolved {
    let spec = &warmup.spec;
    let custom = match spec
        .custom_action
        .as_ref()
        .map(|c| parse_template(&c.pod_template))
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
        } else {
            let mut images = spec
                .images_preload
                .as_ref()
                .map(|p| p.items.clone())
                .unwrap_or_default();
            images.extend(md.spec.image.clone());
            images
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
    if unique.is_empty() && kernel_caches.is_empty() && custom.is_none() {
        let name = spec
            .target_model_deployment
            .as_ref()
            .map(|t| t.name.as_str())
            .unwrap_or_default();
        return Resolved::Waiting(
            reasons::NOTHING_TO_WARM,
            format!(
                "nothing to warm: ModelDeployment '{name}' names no image (spec.image) and no kernel cache (spec.kernelCache), and the Warmup sets no imagesPreload, kernelCaches or customAction (the images a provider renders by default are not reported by providers yet)"
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
        custom,
        tolerations,
    }))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::needless_pass_by_value)] // JSON literals built in place
    use super::*;
    use serde_json::json;

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

    #[test]
    fn node_targets_preload_what_they_name() {
        let w = warmup(
            json!({"targetNodes": {"nodeNames": ["a"]},
                   "imagesPreload": {"items": ["b:1", "a:1", "b:1"], "pullSecrets": [{"name": "regcred"}]},
                   "kernelCaches": ["vadd"]}),
            None,
        );
        let Resolved::Ready(a) = resolve(&w, None) else {
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
            matches!(resolve(&w, None), Resolved::Waiting(r, _) if r == reasons::TARGET_NOT_FOUND)
        );
        assert!(
            matches!(resolve(&w, Some(&md(None, None))), Resolved::Waiting(r, m) if r == reasons::NOTHING_TO_WARM && m.contains("spec.image")),
            "a model naming no image or cache, with no action, gives nothing to do"
        );
        let Resolved::Ready(a) = resolve(&w, Some(&md(Some("llama.cpp:b1"), Some("vadd")))) else {
            panic!()
        };
        assert_eq!(a.images, ["llama.cpp:b1"]);
        assert_eq!(a.kernel_caches, ["vadd"]);
        assert_eq!(a.tolerations.len(), 1, "the model's tolerations");
        let with_own = warmup(
            json!({"targetModelDeployment": {"name": "llama"}, "imagesPreload": {"items": ["sidecar:1", "llama.cpp:b1"]}, "kernelCaches": ["vadd"]}),
            None,
        );
        let Resolved::Ready(a) = resolve(&with_own, Some(&md(Some("llama.cpp:b1"), Some("vadd"))))
        else {
            panic!()
        };
        assert_eq!(a.images, ["sidecar:1", "llama.cpp:b1"], "each image once");
        assert_eq!(a.kernel_caches, ["vadd"], "each cache once");
        let running = warmup(
            json!({"targetModelDeployment": {"name": "llama"}}),
            Some("InProgress"),
        );
        let Resolved::Ready(a) = resolve(&running, Some(&md(Some("new:2"), None))) else {
            panic!()
        };
        assert_eq!(a.images, ["frozen:1"], "a running warmup keeps its images");
    }

    #[test]
    fn a_broken_custom_template_is_invalid() {
        let w = warmup(
            json!({"targetNodes": {"nodeNames": ["a"]}, "customAction": {"podTemplate": {"spec": {"containers": [{"name": "c", "imagee": "x"}]}}}}),
            None,
        );
        assert!(matches!(resolve(&w, None), Resolved::Invalid(m) if m.contains("imagee")));
    }
}
