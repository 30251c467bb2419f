//! `kaito-provider`: serves ModelDeployments with KAITO.

use clap::{Parser, ValueEnum};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kubeairunway_kaito_provider::{INFERENCE_SET_CRD, KaitoProvider, inference_set_served};

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
    /// `resource.instanceType` of every Workspace (the GPU node SKU KAITO provisions);
    /// empty for bring-your-own nodes.
    #[arg(long, env = "KAITO_INSTANCE_TYPE", default_value = "")]
    instance_type: String,
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
    let provider = KaitoProvider {
        inference_set,
        instance_type: Some(args.instance_type).filter(|s| !s.is_empty()),
    };
    kubeairunway_sdk::runtime::run(provider, rt, args.options).await
}
