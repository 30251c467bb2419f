//! The KAITO provider: a ModelDeployment becomes a `kaito.sh/v1beta1` Workspace (one
//! replica) or a `kaito.sh/v1alpha1` InferenceSet (more replicas, when enabled), and the
//! Workspace's status becomes ours.
//!
//! - [`render`]: the translation (Workspace, InferenceSet, inference-config ConfigMap, the
//!   InferenceSet's Service).
//! - [`status`]: KAITO's real status values read as ours.
//! - `provider.overrides`: KAITO has no typed settings of its own; every key is merged
//!   into the Workspace by the runtime (`kubeairunway_sdk::overrides`), e.g.
//!   `resource.count`.
//! - [`nodes`]: how KAITO gets its nodes (node auto-provisioning or bring-your-own), which
//!   decides `resource.instanceType`.
//! - [`immutable`]: the rendered fields KAITO's webhook refuses to update.
//!
//! Everything here is pure; `kubeairunway_sdk::runtime` does the I/O.

pub mod cli;
pub mod immutable;
pub mod nodes;
pub mod render;
pub mod settings;
pub mod status;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::core::GroupVersionKind;
use kube::discovery::ApiResource;
use kubeairunway_sdk::api::{
    Capabilities, EngineCapability, EngineType, GatewayCapabilities, InferenceProviderConfigSpec,
    Installation, ModelDeployment, SelectionRule, ServingMode,
};
use kubeairunway_sdk::{
    Incompatible, Live, Observed, Provider, RenderError, Rendered, ServingPods, UpstreamApi,
    UpstreamRef,
};

pub use nodes::NodeProvisioning;
pub use settings::{GROUP, INFERENCE_SET_CRD, KaitoProvider, NAME};

/// Whether an installed InferenceSet CRD serves the version this provider renders: what
/// `--inference-set auto` decides at start.
pub fn inference_set_served(crd: Option<&CustomResourceDefinition>) -> bool {
    crd.is_some_and(|crd| {
        crd.spec
            .versions
            .iter()
            .any(|v| v.served && v.name == render::INFERENCE_SET_VERSION)
    })
}

impl Provider for KaitoProvider {
    fn name(&self) -> &str {
        NAME
    }

    fn version(&self) -> String {
        env!("CARGO_PKG_VERSION").to_string()
    }

    fn config(&self) -> InferenceProviderConfigSpec {
        InferenceProviderConfigSpec {
            // What `render` serves: a Workspace (or InferenceSet) with KAITO's vLLM
            // runtime, GPUs only; or its llama.cpp template, on CPUs or GPUs, which
            // names the served model itself (`model.servedName` is ignored).
            capabilities: Some(Capabilities::serving([
                EngineCapability::gpu_only(EngineType::Vllm)
                    .serving_modes([ServingMode::Aggregated])
                    .native_api_formats(),
                EngineCapability::new(EngineType::Llamacpp)
                    .serving_modes([ServingMode::Aggregated])
                    .native_api_formats()
                    .gpu(true)
                    .cpu(true)
                    .gateway(GatewayCapabilities {
                        ignores_served_name: true,
                        ..GatewayCapabilities::default()
                    }),
            ])),
            selection_rules: vec![
                // `has()` guards only its last step, so each step is guarded in turn.
                SelectionRule {
                    condition: "!has(spec.resources) || !has(spec.resources.gpu) || spec.resources.gpu.count == 0".into(),
                    priority: 100,
                },
                SelectionRule {
                    condition: "spec.engine.type == 'llamacpp'".into(),
                    priority: 100,
                },
            ],
            documentation: Some("https://github.com/kaito-project/kaito".into()),
            installation: Some(Installation {
                description: Some(
                    "KAITO's workspace operator (v0.10 or newer), then the kaito-provider chart. \
                     With KAITO's node auto-provisioning (its default) set the chart's \
                     nodeProvisioning.gpuInstanceType (and cpuInstanceType for CPU-only models) \
                     to instance types KAITO supports; with bring-your-own nodes (KAITO \
                     --node-provisioner=byo, or --feature-gates=disableNodeAutoProvisioning=true \
                     before v0.11) set nodeProvisioning.mode=byo and give GPU models a \
                     spec.nodeSelector matching GPU nodes labelled by NVIDIA GPU Feature Discovery"
                        .into(),
                ),
                default_namespace: Some("kaito-workspace".into()),
                ..Installation::default()
            }),
        }
    }

    fn upstream(&self) -> UpstreamRef {
        UpstreamRef::new(GROUP, "Workspace", "workspaces", &["v1beta1"])
    }

    /// What KAITO refuses beyond its capabilities (engines vLLM and llama.cpp, aggregated
    /// mode, CPU or GPU: the runtime checks those): a name that is not a DNS-1123 label,
    /// more than one replica without InferenceSet, and GPU nodes it cannot provision.
    fn check(&self, md: &ModelDeployment) -> Result<(), Incompatible> {
        check_name(md)?;
        let replicas = md.spec.scaling.replicas;
        if replicas != 1 && !self.inference_set {
            return Err(Incompatible(format!(
                "scaling.replicas is {replicas}: a KAITO Workspace serves exactly one replica \
                 (resource.count is GPU nodes of one instance, not replicas); more need KAITO's \
                 InferenceSet ({INFERENCE_SET_CRD}), which is not installed or not enabled \
                 (--inference-set)"
            )));
        }
        self.nodes.instance_type(md).map_err(Incompatible)?;
        Ok(())
    }

    fn render(
        &self,
        md: &ModelDeployment,
        upstream: &UpstreamApi,
    ) -> Result<Rendered, RenderError> {
        render::render(self, md, upstream)
    }

    fn observe(&self, md: &ModelDeployment, live: &Live) -> Observed {
        status::observe(md, live.primary())
    }

    /// The pods KAITO's Service in front of them selects ([`render::serving_pods`]).
    fn serving_pods(&self, md: &ModelDeployment) -> ServingPods {
        render::serving_pods(self, md)
    }

    /// What KAITO's webhook refuses to update, cited in [`immutable`].
    fn immutable_fields(&self, kind: &str) -> &'static [&'static str] {
        immutable::fields(kind)
    }

    /// A replica count change swaps the Workspace for an InferenceSet (and back), with the
    /// InferenceSet's Service; the inference-config ConfigMap goes when the engine changes
    /// to llama.cpp: the objects left behind are pruned.
    fn owned_kinds(&self) -> Vec<ApiResource> {
        let inference_set = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk(GROUP, render::INFERENCE_SET_VERSION, "InferenceSet"),
            "inferencesets",
        );
        let config_map = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "ConfigMap"),
            "configmaps",
        );
        let service = ApiResource::from_gvk_with_plural(
            &GroupVersionKind::gvk("", "v1", "Service"),
            "services",
        );
        vec![inference_set, config_map, service]
    }
}

/// KAITO's webhooks refuse a Workspace or InferenceSet whose name is not a DNS-1123
/// label (`validation.IsDNS1123Label(w.Name)`, api/v1beta1/workspace_validation.go:70 and
/// api/v1alpha1/inferenceset_validation.go:38@v0.12.0; the same at v0.10.0), a stricter
/// rule than a ModelDeployment's name (a DNS subdomain, dots allowed).
fn check_name(md: &ModelDeployment) -> Result<(), Incompatible> {
    let name = kube::ResourceExt::name_any(md);
    let label = !name.is_empty()
        && name.len() <= 63
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if label {
        Ok(())
    } else {
        Err(Incompatible(format!(
            "KAITO names its Workspace after the ModelDeployment and requires a DNS-1123 label \
             (at most 63 characters: lowercase letters, digits and '-'); {name:?} is not one"
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn crd(versions: &[(&str, bool)]) -> CustomResourceDefinition {
        let versions: Vec<_> = versions
            .iter()
            .map(|(name, served)| serde_json::json!({"name": name, "served": served, "storage": false}))
            .collect();
        serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": INFERENCE_SET_CRD},
            "spec": {"group": GROUP, "scope": "Namespaced",
                     "names": {"plural": "inferencesets", "kind": "InferenceSet"}, "versions": versions},
        }))
        .unwrap()
    }

    #[test]
    fn inference_set_is_used_only_when_its_crd_serves_our_version() {
        assert!(!inference_set_served(None));
        assert!(inference_set_served(Some(&crd(&[
            ("v1alpha1", true),
            ("v1beta1", true)
        ]))));
        assert!(!inference_set_served(Some(&crd(&[
            ("v1alpha1", false),
            ("v1beta1", true)
        ]))));
    }
}
