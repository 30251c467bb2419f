//! `dynamo-provider`: the Dynamo provider binary.

use clap::Parser;
use kubeairunway_dynamo_provider::cli::Cli;
use kubeairunway_dynamo_provider::{Dynamo, Settings};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("dynamo-provider", args.options.process.clone())
            .await?;
    let provider = Dynamo::new(Settings {
        dynamo_version: args.dynamo_version,
        failed_after: args.failed_threshold,
    });
    kubeairunway_sdk::runtime::run(provider, rt, args.options).await
}
