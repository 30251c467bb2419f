//! The flags of `kaito-provider` (each also an environment variable), here so that the
//! chart tests parse the chart's arguments with them.

use clap::{Parser, ValueEnum};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use crate::{INFERENCE_SET_CRD, KaitoProvider, NodeProvisioning, inference_set_served};

/// Whether replicas other than 1 are served by KAITO's InferenceSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum InferenceSetMode {
    /// Use it when its CRD serves the version this provider renders (checked at start).
    Auto,
    /// Always use it.
    Enabled,
    /// Never: refuse replicas other than 1.
    Disabled,
}

/// How KAITO gets nodes: its `--node-provisioner` (v0.11+) or its
/// `disableNodeAutoProvisioning` feature gate (v0.10).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum NodeProvisioningMode {
    /// KAITO provisions a node per Workspace (its default): every Workspace names an
    /// instance type.
    Auto,
    /// Bring-your-own nodes: no instance type; nodes chosen by `spec.nodeSelector`.
    Byo,
}

/// Flags of `kaito-provider`.
#[derive(Debug, Parser)]
#[command(
    name = "kaito-provider",
    version,
    about = "kubeairunway provider for KAITO"
)]
pub struct Cli {
    /// The SDK runtime's flags.
    #[command(flatten)]
    pub options: kubeairunway_sdk::runtime::Options,
    /// InferenceSet use for replicas other than 1.
    #[arg(long, env = "KAITO_INFERENCE_SET", value_enum, default_value = "auto")]
    pub inference_set: InferenceSetMode,
    /// How KAITO gets nodes: `auto` (KAITO's node auto-provisioning, its default) or
    /// `byo` (KAITO runs with --node-provisioner=byo, or before v0.11 with
    /// --feature-gates=disableNodeAutoProvisioning=true).
    #[arg(
        long,
        env = "KAITO_NODE_PROVISIONING",
        value_enum,
        default_value = "auto"
    )]
    pub node_provisioning: NodeProvisioningMode,
    /// With `auto`: `resource.instanceType` of deployments with GPUs (a GPU SKU KAITO
    /// supports, e.g. Standard_NC24ads_A100_v4).
    #[arg(
        long,
        env = "KAITO_GPU_INSTANCE_TYPE",
        default_value = "",
        alias = "instance-type"
    )]
    pub gpu_instance_type: String,
    /// With `auto`: `resource.instanceType` of CPU-only deployments (e.g. Standard_D8s_v3).
    #[arg(long, env = "KAITO_CPU_INSTANCE_TYPE", default_value = "")]
    pub cpu_instance_type: String,
}

impl Cli {
    /// The provider these flags configure on `client`'s cluster: with `--inference-set=auto`,
    /// whether the installed InferenceSet CRD (one read of it) serves the version rendered.
    pub async fn provider(&self, client: &kube::Client) -> anyhow::Result<KaitoProvider> {
        let inference_set = match self.inference_set {
            InferenceSetMode::Enabled => true,
            InferenceSetMode::Disabled => false,
            InferenceSetMode::Auto => inference_set_served(
                kube::Api::<CustomResourceDefinition>::all(client.clone())
                    .get_opt(INFERENCE_SET_CRD)
                    .await?
                    .as_ref(),
            ),
        };
        tracing::info!(
            inference_set,
            "KAITO InferenceSet for replicas other than 1"
        );
        let nodes = match self.node_provisioning {
            NodeProvisioningMode::Auto => {
                NodeProvisioning::auto(&self.gpu_instance_type, &self.cpu_instance_type)
            }
            NodeProvisioningMode::Byo => NodeProvisioning::Byo,
        };
        tracing::info!(?nodes, "KAITO node provisioning");
        Ok(KaitoProvider {
            inference_set,
            nodes,
        })
    }
}
