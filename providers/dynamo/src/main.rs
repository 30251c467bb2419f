//! `dynamo-provider`: the Dynamo provider binary.

use clap::Parser;
use kubeairunway_dynamo_provider::cli::Cli;

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("dynamo-provider", args.options.process.clone())
            .await?;
    kubeairunway_sdk::runtime::run(args.provider(), rt, args.options).await
}
