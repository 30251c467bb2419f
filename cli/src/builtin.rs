//! The built-in serving providers (KAITO, Dynamo, KubeRay and the Deployment provider,
//! which needs no operator), configured by the same flags
//! (names, defaults, environment variables) as their own binaries, so that `up` runs and
//! `render` previews the providers a cluster runs.

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubeairunway_deployment_provider::DeploymentProvider;
use kubeairunway_dynamo_provider::Dynamo;
use kubeairunway_kaito_provider::{INFERENCE_SET_CRD, KaitoProvider};
use kubeairunway_kuberay_provider::KubeRayProvider;
use kubeairunway_sdk::{InferenceProviderConfig, InferenceProviderConfigStatus, Provider};

pub use kubeairunway_kaito_provider::cli::{InferenceSetMode, NodeProvisioningMode};

/// Names of the built-in serving providers, in name order.
pub const NAMES: [&str; 4] = [
    kubeairunway_deployment_provider::NAME,
    kubeairunway_dynamo_provider::NAME,
    kubeairunway_kaito_provider::NAME,
    kubeairunway_kuberay_provider::NAME,
];

/// The built-in providers' settings: each provider binary's own flags (its crate's
/// `cli::Flags`, with the same names, defaults and environment variables), flattened.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct ProviderFlags {
    /// KAITO's.
    #[command(flatten)]
    pub kaito: kubeairunway_kaito_provider::cli::Flags,
    /// Dynamo's.
    #[command(flatten)]
    pub dynamo: kubeairunway_dynamo_provider::cli::Flags,
    /// KubeRay's.
    #[command(flatten)]
    pub kuberay: kubeairunway_kuberay_provider::cli::Flags,
    /// The Deployment provider's.
    #[command(flatten)]
    pub deployment: kubeairunway_deployment_provider::cli::Flags,
}

/// The built-in serving providers.
#[derive(Debug)]
pub struct BuiltIns {
    /// KAITO.
    pub kaito: KaitoProvider,
    /// NVIDIA Dynamo.
    pub dynamo: Dynamo,
    /// KubeRay.
    pub kuberay: KubeRayProvider,
    /// The Deployment provider (no operator).
    pub deployment: DeploymentProvider,
}

impl BuiltIns {
    /// The providers as their binaries configure themselves with `flags`, where the
    /// installed InferenceSet CRD is `inference_set` and KAITO's node provisioning is
    /// `nodes` unless a flag says otherwise.
    pub fn new(
        flags: &ProviderFlags,
        inference_set: Option<&CustomResourceDefinition>,
        nodes: NodeProvisioningMode,
    ) -> Self {
        Self {
            kaito: flags.kaito.provider(inference_set, nodes),
            dynamo: flags.dynamo.provider(),
            kuberay: flags.kuberay.provider(),
            deployment: flags.deployment.provider(),
        }
    }

    /// With default flags: for what does not depend on them (registrations, installation
    /// hints).
    pub fn defaults() -> Self {
        Self::new(&ProviderFlags::default(), None, NodeProvisioningMode::Auto)
    }

    /// For previews: with the InferenceSet CRD of `crds` (given or bundled), and
    /// bring-your-own nodes unless `--node-provisioning` says otherwise.
    pub fn for_crds(
        flags: &ProviderFlags,
        crds: &crate::crds::UpstreamCrds,
    ) -> anyhow::Result<Self> {
        Ok(Self::new(
            flags,
            crds.get(INFERENCE_SET_CRD)?.as_ref(),
            NodeProvisioningMode::Byo,
        ))
    }

    /// Every built-in provider, in name order.
    pub fn all(&self) -> [&dyn Provider; 4] {
        [&self.deployment, &self.dynamo, &self.kaito, &self.kuberay]
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
    use clap::Parser;
    use kubeairunway_kaito_provider::NodeProvisioning;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        flags: ProviderFlags,
    }

    #[test]
    fn names_match_the_providers() {
        let builtins = BuiltIns::defaults();
        let names: Vec<&str> = builtins.all().iter().map(|p| p.name()).collect();
        assert_eq!(names, NAMES);
        assert!(builtins.get("kuberay").is_some());
        assert!(builtins.get("deployment").is_some());
        assert!(builtins.get("kernelcache").is_none());
        assert!(!builtins.kaito.inference_set);
    }

    #[test]
    fn flags_configure_the_providers_as_their_binaries_do() {
        let flags = Cli::try_parse_from([
            "x",
            "--node-provisioning=auto",
            "--gpu-instance-type=Standard_NC24ads_A100_v4",
            "--inference-set=enabled",
            "--ray-version=2.49.0",
            "--sglang-image=lmsysorg/sglang:v0.5.5",
        ])
        .unwrap()
        .flags;
        let b = BuiltIns::new(&flags, None, NodeProvisioningMode::Byo);
        assert_eq!(
            b.kaito.nodes,
            NodeProvisioning::auto("Standard_NC24ads_A100_v4", "")
        );
        assert!(b.kaito.inference_set);
        assert_eq!(b.kuberay.ray_version, "2.49.0");
        let flags = Cli::try_parse_from(["x", "--failed-threshold=2m"])
            .unwrap()
            .flags;
        assert_eq!(
            format!(
                "{:?}",
                BuiltIns::new(&flags, None, NodeProvisioningMode::Byo).dynamo
            ),
            format!(
                "{:?}",
                kubeairunway_dynamo_provider::Dynamo::new(kubeairunway_dynamo_provider::Settings {
                    failed_after: std::time::Duration::from_secs(120),
                    ..Default::default()
                })
            ),
            "every flag of a provider binary is the CLI's"
        );
        assert_eq!(
            b.deployment.images.sglang.as_deref(),
            Some("lmsysorg/sglang:v0.5.5")
        );
        let defaults = Cli::try_parse_from(["x"]).unwrap().flags;
        assert_eq!(
            BuiltIns::new(&defaults, None, NodeProvisioningMode::Byo)
                .kaito
                .nodes,
            NodeProvisioning::Byo
        );
        assert_eq!(
            format!("{defaults:?}"),
            format!("{:?}", ProviderFlags::default()),
            "Default is the flags' defaults"
        );
    }
}
