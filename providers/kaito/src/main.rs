//! `kaito-provider`: serves ModelDeployments with KAITO.

use clap::Parser;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kubeairunway_kaito_provider::cli::{Cli, InferenceSetMode, NodeProvisioningMode};
use kubeairunway_kaito_provider::{
    INFERENCE_SET_CRD, KaitoProvider, NodeProvisioning, inference_set_served,
};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
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
