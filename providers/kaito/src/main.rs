//! `kaito-provider`: serves ModelDeployments with KAITO.

use clap::Parser;
use kubeairunway_kaito_provider::cli::Cli;

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("kaito-provider", args.options.process.clone())
            .await?;
    let provider = args.provider(&rt.client()).await?;
    kubeairunway_sdk::runtime::run(provider, rt, args.options).await
}
