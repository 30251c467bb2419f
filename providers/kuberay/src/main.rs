//! `kuberay-provider`: serves ModelDeployments whose provider is `kuberay` as KubeRay
//! RayServices.

use clap::Parser;
use kubeairunway_kuberay_provider::cli::Cli;

/// jemalloc: why, in `kubeairunway_sdk::process::Allocator`.
#[global_allocator]
static ALLOC: kubeairunway_sdk::process::Allocator = kubeairunway_sdk::process::Allocator;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt =
        kubeairunway_sdk::process::Runtime::start("kuberay-provider", cli.options.process.clone())
            .await?;
    kubeairunway_sdk::runtime::run(cli.provider(), rt, cli.options).await
}
