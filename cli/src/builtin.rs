//! The built-in serving providers (KAITO, Dynamo, KubeRay), configured as their binaries
//! configure themselves with default flags, so that `up` runs and `render` previews the
//! same providers.

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubeairunway_dynamo_provider::Dynamo;
use kubeairunway_kaito_provider::{INFERENCE_SET_CRD, KaitoProvider, inference_set_served};
use kubeairunway_kuberay_provider::KubeRayProvider;
use kubeairunway_sdk::{InferenceProviderConfig, InferenceProviderConfigStatus, Provider};

/// Names of the built-in serving providers, in name order.
pub const NAMES: [&str; 3] = [
    kubeairunway_dynamo_provider::NAME,
    kubeairunway_kaito_provider::NAME,
    kubeairunway_kuberay_provider::NAME,
];

/// The built-in serving providers.
#[derive(Debug)]
pub struct BuiltIns {
    /// KAITO.
    pub kaito: KaitoProvider,
    /// NVIDIA Dynamo.
    pub dynamo: Dynamo,
    /// KubeRay.
    pub kuberay: KubeRayProvider,
}

impl BuiltIns {
    /// The providers as their binaries start with default flags, where the installed
    /// InferenceSet CRD is `inference_set` (KAITO's `--inference-set auto`).
    pub fn new(inference_set: Option<&CustomResourceDefinition>) -> Self {
        Self {
            kaito: KaitoProvider {
                inference_set: inference_set_served(inference_set),
                instance_type: None,
            },
            dynamo: Dynamo::new(kubeairunway_dynamo_provider::Settings::default()),
            kuberay: KubeRayProvider::default(),
        }
    }

    /// With the InferenceSet CRD of `crds` (given or bundled).
    pub fn for_crds(crds: &crate::crds::UpstreamCrds) -> anyhow::Result<Self> {
        Ok(Self::new(crds.get(INFERENCE_SET_CRD)?.as_ref()))
    }

    /// Every built-in provider, in name order.
    pub fn all(&self) -> [&dyn Provider; 3] {
        [&self.dynamo, &self.kaito, &self.kuberay]
    }

    /// The built-in provider named `name`.
    pub fn get(&self, name: &str) -> Option<&dyn Provider> {
        self.all().into_iter().find(|p| p.name() == name)
    }

    /// Each provider's InferenceProviderConfig as it registers it, ready and with a
    /// heartbeat at `now`: what core selects among when every built-in provider runs.
    pub fn registered(&self, now: Timestamp) -> Vec<Arc<InferenceProviderConfig>> {
        self.all()
            .iter()
            .map(|p| {
                let mut config = InferenceProviderConfig::new(p.name(), p.config());
                config.metadata.generation = Some(1);
                config.status = Some(InferenceProviderConfigStatus {
                    ready: Some(true),
                    version: Some(p.version()),
                    last_heartbeat: Some(Time(now)),
                    ..InferenceProviderConfigStatus::default()
                });
                Arc::new(config)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_match_the_providers() {
        let builtins = BuiltIns::new(None);
        let names: Vec<&str> = builtins.all().iter().map(|p| p.name()).collect();
        assert_eq!(names, NAMES);
        assert!(builtins.get("kuberay").is_some());
        assert!(builtins.get("kernelcache").is_none());
        assert!(!builtins.kaito.inference_set);
    }
}
