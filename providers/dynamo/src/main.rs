//! `dynamo-provider`: the Dynamo provider binary.

use std::time::Duration;

use clap::Parser;
use kubeairunway_dynamo_provider::{DEFAULT_DYNAMO_VERSION, Dynamo, Settings};

/// Serves ModelDeployments whose provider is `dynamo` as DynamoGraphDeployments.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(flatten)]
    options: kubeairunway_sdk::runtime::Options,
    /// Tag of the `nvcr.io/nvidia/ai-dynamo/{vllm,sglang,tensorrtllm}-runtime` images.
    #[arg(long, env = "DYNAMO_VERSION", default_value = DEFAULT_DYNAMO_VERSION)]
    dynamo_version: String,
    /// How long Dynamo's `failed` state must last before the ModelDeployment is Failed.
    #[arg(long, env = "FAILED_THRESHOLD", default_value = "5m", value_parser = kubeairunway_sdk::process::parse_duration)]
    failed_threshold: Duration,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("dynamo-provider", args.options.process.clone())
            .await?;
    let provider = Dynamo::new(Settings {
        dynamo_version: args.dynamo_version,
        failed_after: args.failed_threshold,
    });
    kubeairunway_sdk::runtime::run(provider, rt, args.options).await
}
