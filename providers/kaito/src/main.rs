//! `kaito-provider`: serves ModelDeployments with KAITO.

use clap::{Parser, ValueEnum};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kubeairunway_kaito_provider::{
    INFERENCE_SET_CRD, KaitoProvider, NodeProvisioning, inference_set_served,
};

/// Whether replicas other than 1 are served by KAITO's InferenceSet.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum InferenceSetMode {
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
enum NodeProvisioningMode {
    /// KAITO provisions a node per Workspace (its default): every Workspace names an
    /// instance type.
    Auto,
    /// Bring-your-own nodes: no instance type; nodes chosen by `spec.nodeSelector`.
    Byo,
}

#[derive(Debug, Parser)]
#[command(
    name = "kaito-provider",
    version,
    about = "kubeairunway provider for KAITO"
)]
struct Args {
    #[command(flatten)]
    options: kubeairunway_sdk::runtime::Options,
    /// InferenceSet use for replicas other than 1.
    #[arg(long, env = "KAITO_INFERENCE_SET", value_enum, default_value = "auto")]
    inference_set: InferenceSetMode,
    /// How KAITO gets nodes: `auto` (KAITO's node auto-provisioning, its default) or
    /// `byo` (KAITO runs with --node-provisioner=byo, or before v0.11 with
    /// --feature-gates=disableNodeAutoProvisioning=true).
    #[arg(
        long,
        env = "KAITO_NODE_PROVISIONING",
        value_enum,
        default_value = "auto"
    )]
    node_provisioning: NodeProvisioningMode,
    /// With `auto`: `resource.instanceType` of deployments with GPUs (a GPU SKU KAITO
    /// supports, e.g. Standard_NC24ads_A100_v4).
    #[arg(
        long,
        env = "KAITO_GPU_INSTANCE_TYPE",
        default_value = "",
        alias = "instance-type"
    )]
    gpu_instance_type: String,
    /// With `auto`: `resource.instanceType` of CPU-only deployments (e.g. Standard_D8s_v3).
    #[arg(long, env = "KAITO_CPU_INSTANCE_TYPE", default_value = "")]
    cpu_instance_type: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("kaito-provider", args.options.process.clone())
            .await?;
    let client = rt.client();
    let inference_set = match args.inference_set {
        InferenceSetMode::Enabled => true,
        InferenceSetMode::Disabled => false,
        InferenceSetMode::Auto => inference_set_served(
            Api::<CustomResourceDefinition>::all(client.clone())
                .get_opt(INFERENCE_SET_CRD)
                .await?
                .as_ref(),
        ),
    };
    tracing::info!(
        inference_set,
        "KAITO InferenceSet for replicas other than 1"
    );
    let nodes = match args.node_provisioning {
        NodeProvisioningMode::Auto => {
            NodeProvisioning::auto(&args.gpu_instance_type, &args.cpu_instance_type)
        }
        NodeProvisioningMode::Byo => NodeProvisioning::Byo,
    };
    tracing::info!(?nodes, "KAITO node provisioning");
    let provider = KaitoProvider {
        inference_set,
        nodes,
    };
    kubeairunway_sdk::runtime::run(provider, rt, args.options).await
}
