//! The built-in serving providers (KAITO, Dynamo, KubeRay and the Deployment provider,
//! which needs no operator), configured by the same flags
//! (names, defaults, environment variables) as their own binaries, so that `up` runs and
//! `render` previews the providers a cluster runs.

use std::sync::Arc;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kubeairunway_deployment_provider::{
    DEFAULT_LLAMACPP_GPU_IMAGE, DEFAULT_LLAMACPP_IMAGE, DEFAULT_VLLM_IMAGE, DeploymentProvider,
    Images,
};
use kubeairunway_dynamo_provider::{DEFAULT_DYNAMO_VERSION, Dynamo};
use kubeairunway_kaito_provider::{
    INFERENCE_SET_CRD, KaitoProvider, NodeProvisioning, inference_set_served,
};
use kubeairunway_kuberay_provider::{DEFAULT_RAY_IMAGE, DEFAULT_RAY_VERSION, KubeRayProvider};
use kubeairunway_sdk::{InferenceProviderConfig, InferenceProviderConfigStatus, Provider};

/// Names of the built-in serving providers, in name order.
pub const NAMES: [&str; 4] = [
    kubeairunway_deployment_provider::NAME,
    kubeairunway_dynamo_provider::NAME,
    kubeairunway_kaito_provider::NAME,
    kubeairunway_kuberay_provider::NAME,
];

/// KAITO's `--inference-set`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum InferenceSetMode {
    /// When the InferenceSet CRD serves the version the provider renders.
    Auto,
    /// Always.
    Enabled,
    /// Never: replicas other than 1 are refused.
    Disabled,
}

/// KAITO's `--node-provisioning`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum NodeProvisioningMode {
    /// KAITO provisions a node per Workspace: Workspaces name an instance type.
    Auto,
    /// Bring-your-own nodes: no instance type.
    Byo,
}

/// The built-in providers' settings: the flags of their binaries, with the same names,
/// defaults and environment variables.
#[derive(Clone, Debug, clap::Args)]
#[command(next_help_heading = "Built-in providers (their binaries' flags)")]
pub struct ProviderFlags {
    /// KAITO: use its InferenceSet for replicas other than 1.
    #[arg(long, env = "KAITO_INFERENCE_SET", value_enum, default_value = "auto")]
    pub inference_set: InferenceSetMode,
    /// KAITO: how it gets nodes. Default: `byo` for `render` and on the local API server
    /// (nothing provisions nodes there), `auto` (the kaito-provider's default) on a cluster.
    #[arg(long, env = "KAITO_NODE_PROVISIONING", value_enum)]
    pub node_provisioning: Option<NodeProvisioningMode>,
    /// KAITO with `auto`: `resource.instanceType` of deployments with GPUs.
    #[arg(long, env = "KAITO_GPU_INSTANCE_TYPE", default_value = "")]
    pub gpu_instance_type: String,
    /// KAITO with `auto`: `resource.instanceType` of CPU-only deployments.
    #[arg(long, env = "KAITO_CPU_INSTANCE_TYPE", default_value = "")]
    pub cpu_instance_type: String,
    /// Dynamo: tag of the `nvcr.io/nvidia/ai-dynamo/*-runtime` images.
    #[arg(long, env = "DYNAMO_VERSION", default_value = DEFAULT_DYNAMO_VERSION)]
    pub dynamo_version: String,
    /// KubeRay: Ray version, the tag of the Ray LLM image.
    #[arg(long, env = "RAY_VERSION", default_value = DEFAULT_RAY_VERSION)]
    pub ray_version: String,
    /// KubeRay: repository of the Ray LLM image.
    #[arg(long, env = "RAY_IMAGE", default_value = DEFAULT_RAY_IMAGE)]
    pub ray_image: String,
    /// Deployment provider: the vLLM image unless spec.image is set.
    #[arg(long, env = "VLLM_IMAGE", default_value = DEFAULT_VLLM_IMAGE)]
    pub vllm_image: String,
    /// Deployment provider: the SGLang image unless spec.image is set (empty: required).
    #[arg(long, env = "SGLANG_IMAGE", default_value = "")]
    pub sglang_image: String,
    /// Deployment provider: the llama.cpp image of CPU-only replicas.
    #[arg(long, env = "LLAMACPP_IMAGE", default_value = DEFAULT_LLAMACPP_IMAGE)]
    pub llamacpp_image: String,
    /// Deployment provider: the llama.cpp image of replicas with GPUs.
    #[arg(long, env = "LLAMACPP_GPU_IMAGE", default_value = DEFAULT_LLAMACPP_GPU_IMAGE)]
    pub llamacpp_gpu_image: String,
}

impl Default for ProviderFlags {
    fn default() -> Self {
        Self {
            inference_set: InferenceSetMode::Auto,
            node_provisioning: None,
            gpu_instance_type: String::new(),
            cpu_instance_type: String::new(),
            dynamo_version: DEFAULT_DYNAMO_VERSION.to_string(),
            ray_version: DEFAULT_RAY_VERSION.to_string(),
            ray_image: DEFAULT_RAY_IMAGE.to_string(),
            vllm_image: DEFAULT_VLLM_IMAGE.to_string(),
            sglang_image: String::new(),
            llamacpp_image: DEFAULT_LLAMACPP_IMAGE.to_string(),
            llamacpp_gpu_image: DEFAULT_LLAMACPP_GPU_IMAGE.to_string(),
        }
    }
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
        let nodes = match flags.node_provisioning.unwrap_or(nodes) {
            NodeProvisioningMode::Auto => {
                NodeProvisioning::auto(&flags.gpu_instance_type, &flags.cpu_instance_type)
            }
            NodeProvisioningMode::Byo => NodeProvisioning::Byo,
        };
        Self {
            kaito: KaitoProvider {
                inference_set: match flags.inference_set {
                    InferenceSetMode::Auto => inference_set_served(inference_set),
                    InferenceSetMode::Enabled => true,
                    InferenceSetMode::Disabled => false,
                },
                nodes,
            },
            dynamo: Dynamo::new(kubeairunway_dynamo_provider::Settings {
                dynamo_version: flags.dynamo_version.clone(),
                ..kubeairunway_dynamo_provider::Settings::default()
            }),
            kuberay: KubeRayProvider::new(flags.ray_image.clone(), flags.ray_version.clone()),
            deployment: deployment_provider(flags),
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

/// The Deployment provider as `deployment-provider` configures itself with the same flags.
fn deployment_provider(flags: &ProviderFlags) -> DeploymentProvider {
    DeploymentProvider {
        images: Images::new(
            &flags.vllm_image,
            &flags.sglang_image,
            &flags.llamacpp_image,
            &flags.llamacpp_gpu_image,
        ),
        ..DeploymentProvider::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

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
