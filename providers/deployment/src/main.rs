//! `deployment-provider`: serves ModelDeployments whose provider is `deployment` with a
//! plain Deployment and Service.

use clap::Parser;
use kubeairunway_deployment_provider::cli::Cli;

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = kubeairunway_sdk::process::Runtime::start(
        "deployment-provider",
        cli.options.process.clone(),
    )
    .await?;
    let provider = cli.provider();
    kubeairunway_sdk::runtime::run(provider, rt, cli.options).await
}
